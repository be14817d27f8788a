//! The PROXY protocol (docs/guides/haproxy.md) over real sockets: a listed load balancer's header (v1 and
//! v2, IPv4 and IPv6 clients) names the client that the allow list, the per-client connection
//! cap and the `Received:` line see; a missing, malformed, oversized or late header, and a PROXY
//! header from an address not in the list, close the connection with a warning in the log; and
//! HAProxy from Debian in front of the built relay, both `send-proxy` and `send-proxy-v2`.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::http::{get, sample};
use common::process::{serve_args, RelayProcess};
use common::{eventually, message, Answer, Client, TestRelay};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const LIMIT: Duration = Duration::from_secs(20);
const RCPT: &str = "rcpt@example.com";
const FROM: &str = "app@example.com";

// ---------------------------------------------------------------------------------------------
// Headers, written here from the spec rather than with the relay's parser
// ---------------------------------------------------------------------------------------------

const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

fn v1(client: &str, port: u16) -> Vec<u8> {
    let ip: IpAddr = client.parse().unwrap();
    match ip {
        IpAddr::V4(_) => format!("PROXY TCP4 {ip} 127.0.0.1 {port} 25\r\n"),
        IpAddr::V6(_) => format!("PROXY TCP6 {ip} ::1 {port} 25\r\n"),
    }
    .into_bytes()
}

fn v2_raw(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
    let mut h = V2_SIGNATURE.to_vec();
    h.push(ver_cmd);
    h.push(fam);
    h.extend_from_slice(&(body.len() as u16).to_be_bytes());
    h.extend_from_slice(body);
    h
}

/// A v2 PROXY command for a TCP client, with a TLV (PP2_TYPE_AUTHORITY) after the addresses
/// as HAProxy may send.
fn v2(client: &str, port: u16) -> Vec<u8> {
    let ip: IpAddr = client.parse().unwrap();
    let (fam, mut body) = match ip {
        IpAddr::V4(v4) => (0x11, [v4.octets(), [127, 0, 0, 1]].concat()),
        IpAddr::V6(v6) => (
            0x21,
            [v6.octets(), std::net::Ipv6Addr::LOCALHOST.octets()].concat(),
        ),
    };
    body.extend_from_slice(&port.to_be_bytes());
    body.extend_from_slice(&25u16.to_be_bytes());
    body.extend_from_slice(&[0x02, 0x00, 0x0b]);
    body.extend_from_slice(b"relay.local");
    v2_raw(0x21, fam, &body)
}

/// A connection that starts with `header`, and the greeting (`None`: closed instead).
async fn via_proxy(addr: SocketAddr, header: &[u8]) -> (Client, Option<Answer>) {
    Client::on_stream(TcpStream::connect(addr).await.unwrap(), header).await
}

/// The relay's trace line for a client at `ip`, as RFC 5321 address literals write it.
fn received_from(ip: &str) -> String {
    let ip: IpAddr = ip.parse().unwrap();
    let literal = match ip {
        IpAddr::V4(_) => ip.to_string(),
        IpAddr::V6(_) => format!("IPv6:{ip}"),
    };
    format!("Received: from client.test ([{literal}])\r\n")
}

/// A relay whose plain listener takes PROXY headers from loopback (the test is the proxy),
/// and lets only documentation networks submit: loopback itself may not.
async fn proxied_relay(tune: impl FnOnce(&mut idemrelay::config::Settings)) -> TestRelay {
    TestRelay::start_with(|s| {
        s.proxy_protocol_from = vec!["127.0.0.1/32".parse().unwrap()];
        s.allow_networks = vec![
            "192.0.2.0/24".parse().unwrap(),
            "2001:db8:1::/48".parse().unwrap(),
        ];
        tune(s);
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// The real client counts
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_header_names_the_client_for_the_allow_list_and_the_received_line() {
    let relay = proxied_relay(|_| {}).await;
    let inside = [
        ("v1 TCP4", v1("192.0.2.10", 40001), "192.0.2.10"),
        ("v1 TCP6", v1("2001:db8:1::10", 40002), "2001:db8:1::10"),
        ("v2 TCP4", v2("192.0.2.11", 40003), "192.0.2.11"),
        ("v2 TCP6", v2("2001:db8:1::11", 40004), "2001:db8:1::11"),
    ];
    for (i, (what, header, client)) in inside.iter().enumerate() {
        let (mut c, greeting) = via_proxy(relay.addr, header).await;
        assert_eq!(greeting.map(|g| g.code), Some(220), "{what}");
        assert_eq!(c.cmd("EHLO client.test").await.code, 250, "{what}");
        let msg = message(Some(&format!("proxied-{i}")), what, "hello");
        let answer = c.submit(FROM, &[RCPT], &msg).await;
        assert_eq!(answer.code, 250, "{what}: {answer:?}");
        let stored = relay.stored(&answer.queue_id().unwrap()).await;
        let content = String::from_utf8_lossy(stored.content.as_ref().unwrap()).to_string();
        assert!(
            content.starts_with(&received_from(client)),
            "{what}: {content}"
        );
        c.quit().await;
    }
    // Outside the allow list, although the connection itself comes from loopback.
    let outside = [
        ("v1 TCP4", v1("198.51.100.7", 40005)),
        ("v1 TCP6", v1("2001:db8:2::7", 40006)),
        ("v2 TCP4", v2("198.51.100.8", 40007)),
        ("v2 TCP6", v2("2001:db8:2::8", 40008)),
    ];
    for (what, header) in outside {
        let (mut c, greeting) = via_proxy(relay.addr, &header).await;
        assert_eq!(greeting.map(|g| g.code), Some(220), "{what}");
        assert_eq!(c.cmd("EHLO client.test").await.code, 250, "{what}");
        let mail = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
        assert_eq!(mail.line(), "530 5.7.0 Authentication required", "{what}");
        c.quit().await;
    }
    assert_eq!(relay.count("messages").await, 4);
}

/// v1 `UNKNOWN` and v2 `LOCAL` (a proxy's health check): the connection's own address stands.
#[tokio::test]
async fn unknown_and_local_leave_the_connection_address() {
    let relay = proxied_relay(|s| s.allow_networks = vec!["127.0.0.1/32".parse().unwrap()]).await;
    let local_with_addresses = {
        let mut h = v2("192.0.2.10", 1);
        h[12] = 0x20;
        h
    };
    for (what, header) in [
        ("v1 UNKNOWN", b"PROXY UNKNOWN\r\n".to_vec()),
        ("v2 LOCAL", v2_raw(0x20, 0x00, &[])),
        ("v2 LOCAL with an address block", local_with_addresses),
    ] {
        let (mut c, greeting) = via_proxy(relay.addr, &header).await;
        assert_eq!(greeting.map(|g| g.code), Some(220), "{what}");
        assert_eq!(c.cmd("EHLO client.test").await.code, 250, "{what}");
        let msg = message(None, what, "health");
        let answer = c.submit(FROM, &[RCPT], &msg).await;
        assert_eq!(answer.code, 250, "{what}: {answer:?}");
        let stored = relay.stored(&answer.queue_id().unwrap()).await;
        let content = String::from_utf8_lossy(stored.content.as_ref().unwrap()).to_string();
        assert!(
            content.starts_with(&received_from("127.0.0.1")),
            "{what}: {content}"
        );
        c.quit().await;
    }
}

/// The per-client cap counts the client the header names, not the proxy: two clients behind
/// one proxy are capped apart, and neither a refused nor a closed connection keeps its slot.
#[tokio::test]
async fn the_per_client_cap_counts_the_real_client() {
    let relay = proxied_relay(|s| s.max_connections_per_ip = 2).await;
    let mut open = Vec::new();
    for client in ["192.0.2.1", "192.0.2.1", "192.0.2.2", "192.0.2.2"] {
        let (c, greeting) = via_proxy(relay.addr, &v1(client, 1)).await;
        assert_eq!(greeting.map(|g| g.code), Some(220), "{client}");
        open.push(c);
    }
    for header in [v1("192.0.2.1", 2), v2("192.0.2.2", 2)] {
        let (mut c, greeting) = via_proxy(relay.addr, &header).await;
        assert_eq!(
            greeting.map(|g| g.line()).as_deref(),
            Some("421 4.7.0 Too many connections; try again later")
        );
        assert!(c.is_closed().await);
    }
    // Another client behind the same proxy is not held back by the first two.
    let (c, greeting) = via_proxy(relay.addr, &v2("192.0.2.3", 1)).await;
    assert_eq!(greeting.map(|g| g.code), Some(220));
    open.push(c);
    // Connections that never name a client give back their global slot too.
    for bad in [&b"PROXY TCP4 nonsense\r\n"[..], b"EHLO x\r\n"] {
        let (mut c, greeting) = via_proxy(relay.addr, bad).await;
        assert!(greeting.is_none(), "{greeting:?}");
        assert!(c.is_closed().await);
    }
    // A slot is free again once its connection has ended.
    open.remove(0).quit().await;
    let (c, greeting) = eventually(LIMIT, "192.0.2.1 admitted again", || async {
        let (c, greeting) = via_proxy(relay.addr, &v1("192.0.2.1", 3)).await;
        (greeting.as_ref().map(|g| g.code) == Some(220)).then_some((c, greeting))
    })
    .await;
    assert_eq!(greeting.unwrap().code, 220);
    open.push(c);
    for c in open {
        c.quit().await;
    }
    eventually(LIMIT, "no open connections", || async {
        let page = get(relay.admin(), "/metrics", None).await.body;
        (sample(&page, "idemrelay_connections_open") == Some(0.0)).then_some(())
    })
    .await;
}

/// AUTH failures count per real client: one client behind the proxy locked out for a user
/// name leaves another client behind the same proxy free to log in as that user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failures_count_against_the_real_client() {
    const LOCKED_OUT: &str = "421 4.7.0 Too many authentication failures; closing connection";
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    idemrelay::auth::Users::add_user(&users, "alice", "correct horse", "tenant-alice", &[])
        .unwrap();
    let relay = proxied_relay(|s| {
        s.users_file = Some(users);
        s.auth_failure_delay = Duration::from_millis(10);
        s.max_auth_failures = 5;
        s.max_auth_failures_per_user = 2;
        s.max_auth_failures_per_ip = 2;
    })
    .await;
    let login = |password: &str| common::auth_plain("alice", password);
    // Cleartext AUTH is offered to allow-listed clients, which the header's client is.
    let (mut c, _) = via_proxy(relay.addr, &v1("192.0.2.1", 1)).await;
    assert_eq!(c.cmd("EHLO client.test").await.code, 250);
    for _ in 0..2 {
        assert_eq!(c.cmd(&login("wrong")).await.code, 535);
    }
    assert_eq!(c.cmd(&login("correct horse")).await.line(), LOCKED_OUT);
    let (mut c, _) = via_proxy(relay.addr, &v2("192.0.2.1", 2)).await;
    assert_eq!(c.cmd("EHLO client.test").await.code, 250);
    assert_eq!(c.cmd(&login("correct horse")).await.line(), LOCKED_OUT);
    // Another client, through the same proxy.
    let (mut c, _) = via_proxy(relay.addr, &v1("192.0.2.2", 3)).await;
    assert_eq!(c.cmd("EHLO client.test").await.code, 250);
    assert_eq!(
        c.cmd(&login("correct horse")).await.line(),
        "235 2.7.0 Authentication successful"
    );
    c.quit().await;
}

// ---------------------------------------------------------------------------------------------
// TLS listeners: the header comes first, and exactly the header is taken
// ---------------------------------------------------------------------------------------------

/// One whole reply (its last line), read a byte at a time so nothing past it is taken.
async fn reply<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let n = tokio::time::timeout(LIMIT, stream.read(&mut byte))
            .await
            .expect("reply in time")
            .unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.push(byte[0]);
        if got.ends_with(b"\r\n") {
            let text = String::from_utf8_lossy(&got).to_string();
            let last = text.trim_end().rsplit("\r\n").next().unwrap().to_string();
            if last.as_bytes().get(3) == Some(&b' ') {
                return last;
            }
        }
    }
}

async fn say<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, line: &str) -> String {
    stream
        .write_all(format!("{line}\r\n").as_bytes())
        .await
        .unwrap();
    reply(stream).await
}

async fn submit_over<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, key: &str) -> String {
    assert!(say(stream, "EHLO client.test").await.starts_with("250 "));
    assert!(say(stream, &format!("MAIL FROM:<{FROM}>"))
        .await
        .starts_with("250 "));
    assert!(say(stream, &format!("RCPT TO:<{RCPT}>"))
        .await
        .starts_with("250 "));
    assert!(say(stream, "DATA").await.starts_with("354 "));
    stream
        .write_all(&common::dot_stuff(&message(Some(key), "tls", "hello")))
        .await
        .unwrap();
    let done = reply(stream).await;
    assert!(done.starts_with("250 "), "{done}");
    done.strip_prefix("250 2.0.0 OK queued as ")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listeners_read_the_header_before_starttls_and_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = idemrelay::smtp::tls::generate_self_signed(
        &dir.path().join("certs"),
        &["localhost".into()],
    )
    .unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.submission_listen = vec!["127.0.0.1:0".parse().unwrap()];
    settings.submissions_listen = vec!["127.0.0.1:0".parse().unwrap()];
    settings.tls_cert = Some(cert.clone());
    settings.tls_key = Some(key);
    settings.submission_greet_delay = Duration::ZERO;
    settings.submission_proxy_protocol_from = vec!["127.0.0.1/32".parse().unwrap()];
    settings.submission_allow_networks = vec!["192.0.2.0/24".parse().unwrap()];
    let relay = TestRelay::start_in(dir, settings).await;
    let addrs = relay.relay.local_addrs().to_vec();
    let (plain, submission, submissions) = (addrs[0], addrs[1], addrs[2]);
    let tls = common::connector_trusting(&cert);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();

    // Implicit TLS: the header, then at once the ClientHello (they may share a segment).
    let mut tcp = TcpStream::connect(submissions).await.unwrap();
    tcp.write_all(&v2("192.0.2.20", 5000)).await.unwrap();
    let mut stream = tls.connect(name.clone(), tcp).await.expect("handshake");
    assert!(reply(&mut stream).await.starts_with("220 "));
    let id = submit_over(&mut stream, "proxied-465").await;
    let content = relay.stored(&id).await.content.unwrap();
    assert!(content.starts_with(received_from("192.0.2.20").as_bytes()));
    assert!(String::from_utf8_lossy(&content).contains("with ESMTPS"));

    // STARTTLS: the header, the plain greeting, then the upgrade.
    let mut tcp = TcpStream::connect(submission).await.unwrap();
    tcp.write_all(&v1("192.0.2.21", 5001)).await.unwrap();
    assert!(reply(&mut tcp).await.starts_with("220 "));
    assert!(say(&mut tcp, "EHLO client.test").await.starts_with("250 "));
    assert!(say(&mut tcp, "STARTTLS").await.starts_with("220 "));
    let mut stream = tls.connect(name.clone(), tcp).await.expect("handshake");
    let id = submit_over(&mut stream, "proxied-587").await;
    let content = relay.stored(&id).await.content.unwrap();
    assert!(content.starts_with(received_from("192.0.2.21").as_bytes()));

    // The lists are per listener kind: loopback is a proxy for the TLS listeners only, so on
    // the plain one its header is refused (and the plain listener still serves loopback).
    let (mut c, greeting) = via_proxy(plain, &v1("192.0.2.22", 5002)).await;
    if greeting.is_some() {
        assert!(c.read_answer().await.is_none());
    }
    let mut c = Client::ready(plain).await;
    let answer = c.submit(FROM, &[RCPT], &message(None, "plain", "x")).await;
    assert_eq!(answer.code, 250);
    let content = relay
        .stored(&answer.queue_id().unwrap())
        .await
        .content
        .unwrap();
    assert!(content.starts_with(received_from("127.0.0.1").as_bytes()));
}

// ---------------------------------------------------------------------------------------------
// Refusals, as the built binary logs them
// ---------------------------------------------------------------------------------------------

/// Waits for the relay's warning about the connection from local port `port`.
async fn warned(relay: &RelayProcess, port: u16, reason: &str) -> String {
    let peer = format!("peer=127.0.0.1:{port} ");
    eventually(
        LIMIT,
        &format!("a warning for {peer}: {reason}"),
        || async {
            relay.log().lines().find_map(|line| {
                (line.contains(" WARN ")
                    && line.contains("connection closed: PROXY protocol")
                    && line.contains(&peer)
                    && line.contains(reason))
                .then(|| line.to_string())
            })
        },
    )
    .await
}

/// Closed without a greeting, after `first` (and, with `half_close`, the end of our writes).
async fn closed_without_greeting(addr: SocketAddr, first: &[u8], half_close: bool) -> u16 {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    tcp.write_all(first).await.unwrap();
    if half_close {
        tcp.shutdown().await.unwrap();
    }
    let mut got = Vec::new();
    let read = tokio::time::timeout(LIMIT, tcp.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "still open after {LIMIT:?}");
    assert!(
        got.is_empty(),
        "{first:?}: {:?}",
        String::from_utf8_lossy(&got)
    );
    port
}

#[tokio::test]
async fn a_listed_proxy_must_send_a_whole_valid_header() {
    let dir = tempfile::tempdir().unwrap();
    let args = serve_args(
        &dir.path().join("relay.db"),
        &["--read-timeout", "2s", "--allow-network", "192.0.2.0/24"],
    );
    // The list from the environment, comma-separated, as a container would set it.
    let relay = RelayProcess::spawn_with_env(
        &args,
        &[(
            "IDEMRELAY_PROXY_PROTOCOL_FROM",
            "10.9.8.0/24,127.0.0.1/32".to_string(),
        )],
    )
    .ready()
    .await;
    let mut oversized_v2 = v2_raw(0x21, 0x11, &[]);
    oversized_v2[14..16].copy_from_slice(&4000u16.to_be_bytes());
    let mut oversized_v1 = b"PROXY UNKNOWN ".to_vec();
    oversized_v1.resize(200, b'f');
    let cases: Vec<(&str, Vec<u8>, bool, &str)> = vec![
        (
            "SMTP where the header should be",
            b"EHLO client.test\r\n".to_vec(),
            false,
            "no PROXY header",
        ),
        (
            "a TLS ClientHello where the header should be",
            b"\x16\x03\x01\x00\xa5\x01".to_vec(),
            false,
            "no PROXY header",
        ),
        (
            "nothing at all",
            Vec::new(),
            false,
            "no complete PROXY header within 2s",
        ),
        (
            "half a header, then silence",
            b"PROXY TCP4 192.0.2.1 ".to_vec(),
            false,
            "no complete PROXY header within 2s",
        ),
        (
            "half a header, then the end",
            b"PROXY TCP4 192.0.2.1 ".to_vec(),
            true,
            "closed before the end of its PROXY header",
        ),
        (
            "an invalid v1 address",
            b"PROXY TCP4 192.0.2.300 127.0.0.1 1 25\r\n".to_vec(),
            false,
            "malformed PROXY header",
        ),
        (
            "a bare LF ending v1",
            b"PROXY TCP4 192.0.2.3 127.0.0.1 1 25\n".to_vec(),
            false,
            "malformed PROXY header",
        ),
        (
            "v2 with command 2",
            v2_raw(0x22, 0x11, &[0; 12]),
            false,
            "malformed PROXY header",
        ),
        (
            "v2 too short for its addresses",
            v2_raw(0x21, 0x21, &[0; 12]),
            false,
            "malformed PROXY header",
        ),
        (
            "v1 without CRLF in 107 bytes",
            oversized_v1,
            false,
            "PROXY v1 header longer than 107 bytes",
        ),
        (
            "v2 announcing 4016 bytes",
            oversized_v2,
            false,
            "PROXY v2 header of 4016 bytes (more than 2048)",
        ),
    ];
    let started = Instant::now();
    let checks = cases.into_iter().map(|(what, bytes, half_close, reason)| {
        let relay = &relay;
        async move {
            let port = closed_without_greeting(relay.addr, &bytes, half_close).await;
            let line = warned(relay, port, reason).await;
            eprintln!("{what}: {line}");
        }
    });
    futures_join_all(checks).await;
    // The 2 s wait is the read timeout's (below the 10 s cap), not more.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    // The same relay serves a well-formed header.
    let (mut c, greeting) = via_proxy(relay.addr, &v1("192.0.2.9", 1)).await;
    assert_eq!(greeting.map(|g| g.code), Some(220));
    assert_eq!(c.cmd("EHLO client.test").await.code, 250);
    let answer = c.submit(FROM, &[RCPT], &message(None, "ok", "x")).await;
    assert_eq!(answer.code, 250, "{answer:?}\n{}", relay.log());
    c.quit().await;
}

/// Runs the futures together (the project has no `futures` dependency).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    // Polled in turn by one task: each is mostly waiting on its socket.
    let mut pending: Vec<_> = set.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for slot in pending.iter_mut() {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_pending() {
                    done = false;
                } else {
                    *slot = None;
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// From an address outside the list, a PROXY header could name any client it likes: it is
/// never believed, and the connection is closed, wherever the header comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_header_from_an_unlisted_address_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = idemrelay::smtp::tls::generate_self_signed(
        &dir.path().join("certs"),
        &["localhost".into()],
    )
    .unwrap();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let args = serve_args(
        &dir.path().join("relay.db"),
        &[
            "--proxy-protocol-from",
            "10.9.8.0/24",
            "--proxy-protocol-from",
            "2001:db8:9::/48",
            "--submissions-listen",
            "127.0.0.1:0",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    let relay = RelayProcess::spawn(&args).ready().await;
    let submissions = eventually(LIMIT, "the implicit-TLS listener's address", || async {
        relay.log().lines().find_map(|line| {
            line.contains("(ImplicitTls)")
                .then(|| common::process::listening_addr(line))
                .flatten()
        })
    })
    .await;
    const UNLISTED: &str =
        "PROXY header from an address not in this listener's proxy_protocol_from";

    // After the greeting, as the first thing the client says.
    for header in [v1("192.0.2.1", 1), v2("2001:db8::1", 1)] {
        let (mut c, greeting) = via_proxy(relay.addr, b"").await;
        assert_eq!(greeting.map(|g| g.code), Some(220));
        let port = c.local_port();
        c.send(&header).await;
        assert!(
            c.read_answer().await.is_none(),
            "answered instead of closing"
        );
        warned(&relay, port, UNLISTED).await;
    }
    // Right at the connect, racing the greeting: closed either way.
    let mut tcp = TcpStream::connect(relay.addr).await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    tcp.write_all(&v1("192.0.2.1", 2)).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(LIMIT, tcp.read_to_end(&mut got))
        .await
        .expect("closed");
    let got = String::from_utf8_lossy(&got);
    assert!(got.is_empty() || got.starts_with("220 "), "{got}");
    assert!(!got.contains("\r\n5") && !got.contains("\r\n2"), "{got}");
    warned(&relay, port, UNLISTED).await;
    // On implicit TLS, instead of the ClientHello.
    let port = closed_without_greeting(submissions, &v2("192.0.2.1", 3), false).await;
    warned(&relay, port, UNLISTED).await;

    // Plain SMTP from the same address is served as before.
    let mut c = Client::ready(relay.addr).await;
    let answer = c.submit(FROM, &[RCPT], &message(None, "s", "x")).await;
    assert_eq!(answer.code, 250);
}

// ---------------------------------------------------------------------------------------------
// HAProxy in front
// ---------------------------------------------------------------------------------------------

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client from 127.0.0.2 (loopback, but not the proxy's own address), over HAProxy with
/// `send-proxy` and with `send-proxy-v2`: the relay takes loopback's 127.0.0.1 as the proxy,
/// lets only 127.0.0.2 submit, and must name 127.0.0.2 in the Received line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_in_front_with_send_proxy_and_send_proxy_v2() {
    const NAME: &str = "haproxy_in_front_with_send_proxy_and_send_proxy_v2";
    if Command::new("haproxy").arg("-v").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{NAME}: haproxy is required in CI (apt-get install -y haproxy)"
        );
        eprintln!("SKIPPED {NAME}: haproxy is not installed (apt-get install -y haproxy)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = serve_args(
        &dir.path().join("relay.db"),
        &[
            "--proxy-protocol-from",
            "127.0.0.1/32",
            "--allow-network",
            "127.0.0.2/32",
        ],
    );
    let relay = RelayProcess::spawn(&args).ready().await;
    let (v1_port, v2_port) = (free_port(), free_port());
    let config = dir.path().join("haproxy.cfg");
    let relay_addr = relay.addr;
    std::fs::write(
        &config,
        format!(
            "global\n  maxconn 100\n\
             defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
             frontend smtp_v1\n  bind 127.0.0.1:{v1_port}\n  default_backend relay_v1\n\
             frontend smtp_v2\n  bind 127.0.0.1:{v2_port}\n  default_backend relay_v2\n\
             backend relay_v1\n  server relay {relay_addr} send-proxy\n\
             backend relay_v2\n  server relay {relay_addr} send-proxy-v2\n"
        ),
    )
    .unwrap();
    let _haproxy = Haproxy(
        Command::new("haproxy")
            .arg("-f")
            .arg(&config)
            .arg("-db")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy"),
    );
    for (what, port) in [("send-proxy", v1_port), ("send-proxy-v2", v2_port)] {
        let front = SocketAddr::from(([127, 0, 0, 1], port));
        let mut c = eventually(LIMIT, "haproxy listening", || async {
            let socket = TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let stream = socket.connect(front).await.ok()?;
            match Client::on_stream(stream, b"").await {
                (c, Some(greeting)) if greeting.code == 220 => Some(c),
                _ => None,
            }
        })
        .await;
        assert_eq!(c.cmd("EHLO client.test").await.code, 250);
        let msg = message(Some(&format!("haproxy-{what}")), what, "through HAProxy");
        let answer = c.submit(FROM, &[RCPT], &msg).await;
        assert_eq!(answer.code, 250, "{what}: {answer:?}\n{}", relay.log());
        c.quit().await;
        let id = answer.queue_id().unwrap();
        let store = idemrelay::store::open(
            &common::process::store_url(&dir.path().join("relay.db")),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        let stored = store.message(&id).await.unwrap().unwrap();
        let content = String::from_utf8_lossy(stored.content.as_ref().unwrap()).to_string();
        assert!(
            content.starts_with(&received_from("127.0.0.2")),
            "{what}: {content}"
        );
    }
    // Straight to the relay, 127.0.0.1 is the proxy and must send a header.
    let port = closed_without_greeting(relay.addr, b"EHLO client.test\r\n", false).await;
    warned(&relay, port, "no PROXY header").await;
}
