//! The relay at its descriptor limit: idle HTTP connections cannot take the descriptors SMTP
//! needs. The limit is per process, so this runs the built binary under `prlimit`.

use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::process::{serve_args, RelayProcess, BIN};
use crate::common::Client;

/// The open-files limit the relay runs with, and how many idle connections the admin listener
/// is offered: more than the process could hold.
const NOFILE: usize = 400;
const OFFERED: usize = 420;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http_connections_beyond_the_descriptor_limit_leave_smtp_greeting() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--nofile={NOFILE}:{NOFILE}")).arg(BIN);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("IDEMRELAY_") {
            cmd.env_remove(name);
        }
    }
    let relay = RelayProcess::spawn_command(cmd, &serve_args(&dir.path().join("relay.db"), &[]))
        .ready()
        .await;
    let admin = relay.admin();

    // Each sends half a request head and waits, as a slowloris client would.
    let mut held = Vec::new();
    for _ in 0..OFFERED {
        let Ok(mut stream) = TcpStream::connect(admin).await else {
            continue;
        };
        let _ = stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: relay.test\r\nX-Slow: ")
            .await;
        held.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The admin listener kept at most a quarter of the limit and closed the rest at once.
    let mut open = 0;
    for stream in &mut held {
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(20), stream.read(&mut buf)).await {
            Err(_) => open += 1,
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(n)) => assert!(
                buf[..n].starts_with(b"HTTP/1.1 503"),
                "{}",
                String::from_utf8_lossy(&buf[..n])
            ),
        }
    }
    assert!(open <= NOFILE / 4, "{open} idle HTTP connections held");

    // SMTP still greets and takes a command, with the idle connections still there.
    let (mut client, greeting) =
        tokio::time::timeout(Duration::from_secs(5), Client::connect(relay.addr))
            .await
            .expect("SMTP greets within 5 s");
    assert_eq!(greeting.code, 220, "{}", relay.log());
    assert_eq!(client.cmd("EHLO client.test").await.code, 250);
    client.quit().await;
    let log = relay.kill();
    assert!(!log.contains("Too many open files"), "{log}");
    drop(held);
}
