//! The relay's human log, as the built binary writes it to a pipe, under what an
//! unauthenticated client and an operator can put into it: values that hold line breaks and
//! escape sequences stay on their record's line, escaped; a huge value is cut; a flood of
//! refused requests writes a bounded number of lines.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::http::{send, Body};
use common::process::{serve_args, RelayProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "log-test-admin-token-0123";
const SOURCES: &str = r#"webhook_listen = "127.0.0.1:0"
[webhooks.upstream]
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
[webhooks.upstream.fields]
event_type = "/type"
event_time = "/timestamp"
key = "/idempotency_key"
upstream_id = "/message_id"
recipient = "/rcpt_to"
[webhooks.upstream.types]
accepted = ["delivery"]
bounced = ["bounce"]
"#;
/// What a forged record would begin with: a timestamp the relay's own never has (they carry
/// fractions of a second).
const FORGED_TIME: &str = "2026-12-04T00:00:00Z";

async fn relay(dir: &tempfile::TempDir) -> RelayProcess {
    let config = dir.path().join("relay.toml");
    std::fs::write(&config, SOURCES).unwrap();
    let config = config.display().to_string();
    let args = serve_args(&dir.path().join("relay.db"), &["--config", config.as_str()]);
    RelayProcess::spawn_with_env(&args, &[("IDEMRELAY_ADMIN_TOKEN", TOKEN.to_string())])
        .ready()
        .await
}

/// A request whose declared body is too large: refused before anything is read, so the
/// path is all that reaches the log.
async fn too_large(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 2000000\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Waits until the log holds `count` lines containing `what`.
async fn wait_for(relay: &RelayProcess, what: &str, count: usize) -> String {
    for _ in 0..200 {
        let log = relay.log();
        if log.lines().filter(|l| l.contains(what)).count() >= count {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never {count} lines with {what:?}:\n{}", relay.log());
}

fn no_forged_records(log: &str) {
    for line in log.lines() {
        assert!(
            !line.starts_with(FORGED_TIME) && !line.starts_with("INFO"),
            "a forged record: {line:?}\n{log}"
        );
        assert!(!line.contains('\x1b'), "a raw ESC: {line:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_from_clients_and_operators_cannot_forge_records() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&dir).await;
    let webhooks = relay.webhooks();
    let forged = format!(
        "/webhooks/nosuch%0A{FORGED_TIME}%20INFO%20idemrelay::webhook:%20resolved%20delivered%0D%1B[2K"
    );
    let answer = too_large(webhooks, &forged).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let signed_nothing = send(
        webhooks,
        "POST",
        &forged,
        &[("Content-Type", "application/json")],
        Body::Bytes(b"{}"),
    )
    .await;
    assert_eq!(signed_nothing.status, 401, "{signed_nothing:?}");
    // An operator's reason, through the admin API.
    let bearer = format!("Bearer {TOKEN}");
    let reason = format!("hold\n{FORGED_TIME} INFO idemrelay::operator: forged\r\x1b[31mred");
    let body = serde_json::json!({ "reason": reason }).to_string();
    let paused = send(
        relay.admin(),
        "POST",
        "/api/v1/queue/pause",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", bearer.as_str()),
        ],
        Body::Bytes(body.as_bytes()),
    )
    .await;
    assert_eq!(paused.status, 200, "{paused:?}");

    wait_for(&relay, "operator action", 1).await;
    let log = wait_for(&relay, "webhook refused", 2).await;
    no_forged_records(&log);
    // Each value stays on its record's line, escaped, and still says what it held.
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("webhook refused"))
        .collect();
    assert_eq!(refused.len(), 2, "{log}");
    for line in refused {
        assert!(
            line.contains(r"nosuch\n2026-12-04T00:00:00Z INFO"),
            "{line}"
        );
    }
    let action = log.lines().find(|l| l.contains("operator action")).unwrap();
    assert!(
        action.contains(
            r#"reason="hold\n2026-12-04T00:00:00Z INFO idemrelay::operator: forged\r\u{1b}[31mred""#
        ),
        "{action}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_value_is_cut_and_a_flood_of_refusals_writes_few_lines() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&dir).await;
    let webhooks = relay.webhooks();
    // 12 KiB: near the longest request head the listener takes (16 KiB; 431 beyond), and
    // far over what one value may take in the log.
    let huge = format!("/webhooks/{}", "n".repeat(12 * 1024));
    let answer = too_large(webhooks, &huge).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let log = wait_for(&relay, "webhook refused", 1).await;
    let line = log.lines().find(|l| l.contains("webhook refused")).unwrap();
    assert!(line.len() < 1024, "{} bytes: {line}", line.len());
    assert!(
        line.contains("12288 bytes"),
        "the cut says how long it was: {line}"
    );

    // A thousand unsigned requests on one keep-alive connection.
    let mut stream = TcpStream::connect(webhooks).await.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let one = format!(
        "POST /webhooks/upstream HTTP/1.1\r\nHost: {webhooks}\r\nwebhook-id: msg_1\r\nwebhook-timestamp: {now}\r\nwebhook-signature: v1,AAAA\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    const FLOOD: usize = 1000;
    let (mut reader, mut writer) = stream.split();
    let write = async {
        for _ in 0..FLOOD {
            writer.write_all(one.as_bytes()).await.unwrap();
        }
    };
    let read = async {
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while String::from_utf8_lossy(&seen)
            .matches("HTTP/1.1 401")
            .count()
            < FLOOD
        {
            let n = tokio::time::timeout(Duration::from_secs(30), reader.read(&mut buf))
                .await
                .expect("answers keep coming")
                .unwrap();
            assert!(n > 0, "the connection closed early");
            seen.extend_from_slice(&buf[..n]);
        }
    };
    tokio::join!(write, read);
    let flood_lines = relay
        .log()
        .lines()
        .filter(|l| l.contains("webhook refused"))
        .count()
        - 1;
    assert!(
        flood_lines <= 50,
        "{flood_lines} lines for {FLOOD} refusals:\n{}",
        relay.log()
    );
    // Once the flood is over, a line says how many were left out.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _ = send(
        webhooks,
        "POST",
        "/webhooks/upstream",
        &[
            ("webhook-id", "msg_2"),
            ("webhook-timestamp", &now.to_string()),
        ],
        Body::Bytes(b"{}"),
    )
    .await;
    let log = wait_for(&relay, "suppressed", 1).await;
    let said = log.lines().find(|l| l.contains("suppressed")).unwrap();
    assert!(said.contains("suppressed="), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_api_without_a_token_is_a_warning_at_start_even_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let args = serve_args(&dir.path().join("relay.db"), &[]);
    let relay = RelayProcess::spawn(&args).ready().await;
    let log = relay.log();
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("the admin API has no admin_token"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        warning.contains("operator actions are refused"),
        "{warning}"
    );
    drop(relay);
    let with_token = serve_args(&dir.path().join("relay.db"), &[]);
    let quiet =
        RelayProcess::spawn_with_env(&with_token, &[("IDEMRELAY_ADMIN_TOKEN", TOKEN.to_string())]);
    let quiet = quiet.ready().await;
    assert!(
        !quiet.log().contains("has no admin_token"),
        "{}",
        quiet.log()
    );
}
