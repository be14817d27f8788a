//! The HTTP listeners (admin, webhooks) as an internet client meets them: a partial head and an
//! idle keep-alive connection are closed after the header timeout, connections beyond the cap
//! are refused at once while SMTP keeps greeting, shutdown does not wait for a slow client;
//! `/readyz` tells a stranger only whether the relay is ready, and probes the store at most
//! once a second however often it is asked; answers are neither cached nor sniffed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use idemrelay::config::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::backend::WriteLock;
use crate::common::http::{get, request};
use crate::common::{Client, TestRelay};

/// A listener for upstream events with no sources: enough to reach its HTTP layer.
fn with_webhook_listener(s: &mut Settings) {
    s.webhook_listen = Some("127.0.0.1:0".parse().unwrap());
}

/// Reads until the peer closes (or resets); returns what arrived, or None if it stayed open
/// for `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + within;
    loop {
        let mut buf = [0u8; 4096];
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(seen),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// A connection that has sent half a request head.
async fn partial_head(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: relay.test\r\nX-Slow: ")
        .await
        .unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_head_is_closed_after_the_header_timeout_on_each_listener() {
    let relay = TestRelay::start_with(|s| {
        with_webhook_listener(s);
        s.http_header_timeout = Duration::from_secs(1);
    })
    .await;
    let webhooks = relay.relay.webhook_addr().unwrap();
    for addr in [relay.admin(), webhooks] {
        let started = Instant::now();
        let mut stream = partial_head(addr).await;
        let closed = closed_within(&mut stream, Duration::from_secs(4)).await;
        assert!(
            closed.is_some(),
            "{addr}: a partial head still open after 4 s"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{addr}: closed before the timeout"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    let relay = TestRelay::start_with(|s| s.http_header_timeout = Duration::from_secs(1)).await;
    let mut stream = TcpStream::connect(relay.admin()).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: relay.test\r\n\r\n")
        .await
        .unwrap();
    // The answer arrives and the connection stays open for the next request...
    let mut answer = Vec::new();
    while !String::from_utf8_lossy(&answer).contains("\"ok\"") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "closed before answering");
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    // ... but not forever.
    let closed = closed_within(&mut stream, Duration::from_secs(4)).await;
    assert_eq!(
        closed.as_deref(),
        Some(&b""[..]),
        "an idle keep-alive connection still open after 4 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_cap_connections_are_refused_at_once_and_smtp_keeps_greeting() {
    const CAP: usize = 4;
    let relay = TestRelay::start_with(|s| {
        with_webhook_listener(s);
        s.http_max_connections = CAP;
        s.http_header_timeout = Duration::from_secs(30);
    })
    .await;
    let webhooks = relay.relay.webhook_addr().unwrap();
    for addr in [webhooks, relay.admin()] {
        let mut held = Vec::new();
        for _ in 0..CAP {
            held.push(partial_head(addr).await);
        }
        // Let the listener take them all before the extra ones knock.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for extra in 0..2 * CAP {
            let mut stream = partial_head(addr).await;
            let answer = closed_within(&mut stream, Duration::from_secs(2))
                .await
                .unwrap_or_else(|| panic!("{addr}: extra connection {extra} still open after 2 s"));
            let answer = String::from_utf8_lossy(&answer);
            assert!(
                answer.is_empty() || answer.starts_with("HTTP/1.1 503"),
                "{addr}: {answer}"
            );
        }
        // The held connections are still served.
        let (mut client, greeting) = Client::connect(relay.addr).await;
        assert_eq!(
            greeting.code, 220,
            "SMTP greets beside a full HTTP listener"
        );
        assert_eq!(client.cmd("NOOP").await.code, 250);
        for stream in &mut held {
            stream.write_all(b"x\r\n\r\n").await.unwrap();
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("a held connection is answered")
                .unwrap();
            assert!(
                buf[..n].starts_with(b"HTTP/1.1 "),
                "{}",
                String::from_utf8_lossy(&buf[..n])
            );
        }
        drop(held);
        // Their places are free again.
        crate::common::eventually(Duration::from_secs(5), "a free place", || async {
            let mut stream = TcpStream::connect(addr).await.ok()?;
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let answer = closed_within(&mut stream, Duration::from_secs(2)).await?;
            // The webhook listener has no /healthz: any answer but the refusal will do.
            (answer.starts_with(b"HTTP/1.1 ") && !answer.starts_with(b"HTTP/1.1 503")).then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_slow_or_idle_client() {
    let relay = TestRelay::start_with(|s| {
        with_webhook_listener(s);
        s.http_header_timeout = Duration::from_secs(60);
    })
    .await;
    let webhooks = relay.relay.webhook_addr().unwrap();
    let mut slow = vec![
        partial_head(relay.admin()).await,
        partial_head(webhooks).await,
    ];
    // And one idle after its answer (keep-alive).
    let mut idle = TcpStream::connect(relay.admin()).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: relay.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    slow.push(idle);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), relay.relay.shutdown())
        .await
        .expect("shutdown waited on slow HTTP clients");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "shutdown took {:?}",
        started.elapsed()
    );
    for stream in &mut slow {
        assert!(closed_within(stream, Duration::from_secs(2))
            .await
            .is_some());
    }
}

const TOKEN: &str = "a-long-enough-admin-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_without_the_token_says_ready_in_a_word_and_shows_no_pause_reason() {
    // With an upstream, so that there is a delivery whose pause could be shown.
    let sink = crate::common::start_sink().await;
    let relay = crate::common::relay_for(&sink, |s| {
        s.admin_token = Some(idemrelay::config::Secret(TOKEN.into()));
    })
    .await;
    relay
        .store()
        .pause("call Jane about the Acme outage", false)
        .await
        .unwrap();
    let open = get(relay.admin(), "/readyz", None).await;
    assert_eq!(open.status, 200, "{}", open.body);
    assert!(!open.body.contains("Jane"), "{}", open.body);
    assert!(!open.body.contains("paused"), "{}", open.body);
    assert_eq!(
        open.json(),
        serde_json::json!({ "ready": true, "status": "ready" })
    );
    // A wrong token is no token.
    let wrong = get(relay.admin(), "/readyz", Some("not-the-token-at-all")).await;
    assert!(!wrong.body.contains("Jane"), "{}", wrong.body);
    // The operator sees why.
    let detailed = get(relay.admin(), "/readyz", Some(TOKEN)).await.json();
    assert_eq!(detailed["ready"], true, "{detailed}");
    assert_eq!(detailed["store"], "writable", "{detailed}");
    assert_eq!(
        detailed["delivery"]["paused_reason"], "call Jane about the Acme outage",
        "{detailed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_probes_the_store_at_most_once_a_second() {
    let relay = TestRelay::start_with(|s| s.store_busy_timeout = Duration::from_millis(200)).await;
    let admin = relay.admin();
    assert_eq!(get(admin, "/readyz", None).await.status, 200);
    // With another writer holding the lock a probe would fail: answers that stay 200 within
    // the second after the first probe were given without probing.
    let lock = WriteLock::hold(relay.settings.store.expose()).await;
    let mut answered = 0;
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        let ready = get(admin, "/readyz", None).await;
        assert_eq!(ready.status, 200, "probed again: {}", ready.body);
        answered += 1;
    }
    assert!(answered > 5, "{answered}");
    // A second later the store is probed again and found locked.
    crate::common::eventually(Duration::from_secs(5), "a new probe", || async {
        let ready = get(admin, "/readyz", None).await;
        (ready.status == 503).then_some(())
    })
    .await;
    let ready = get(admin, "/readyz", None).await.json();
    assert_eq!(ready["ready"], false, "{ready}");
    assert_eq!(ready["status"], "store_not_writable", "{ready}");
    lock.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_metrics_and_webhook_answers_are_not_cached_or_sniffed() {
    let relay = TestRelay::start_with(with_webhook_listener).await;
    let webhooks = relay.relay.webhook_addr().unwrap();
    let answers = [
        get(relay.admin(), "/metrics", None).await,
        get(relay.admin(), "/api/v1/queue/status", None).await,
        get(relay.admin(), "/readyz", None).await,
        get(relay.admin(), "/nothing-here", None).await,
        request(webhooks, "POST", "/webhooks/nosuch", None).await,
    ];
    for answer in answers {
        assert_eq!(
            answer.header("x-content-type-options"),
            Some("nosniff"),
            "{answer:?}"
        );
        assert_eq!(
            answer.header("cache-control"),
            Some("no-store"),
            "{answer:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_beyond_16_kib_is_refused_on_each_listener() {
    let relay = TestRelay::start_with(with_webhook_listener).await;
    let webhooks = relay.relay.webhook_addr().unwrap();
    for addr in [relay.admin(), webhooks] {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "GET /healthz HTTP/1.1\r\nHost: relay.test\r\nX-Big: {}\r\n\r\n",
            "a".repeat(64 * 1024)
        );
        // The server may close while this is still being written.
        let _ = stream.write_all(head.as_bytes()).await;
        let answer = closed_within(&mut stream, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("{addr}: a 64 KiB head left the connection open"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{addr}: {answer}"
        );
    }
}

/// A request being answered when shutdown begins (here: its body still arriving, on the sink's
/// API, which shares the listeners' serving) is answered, not cut with the idle ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_a_request_in_flight_is_answered() {
    let sink = idemrelay_sink::Sink::start(idemrelay_sink::SinkConfig {
        api: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = sink.api_addr().unwrap();
    let mut stream = TcpStream::connect(api).await.unwrap();
    stream
        .write_all(b"POST /faults HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopping = tokio::spawn({
        let sink = sink.clone();
        async move { sink.shutdown().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    stream.write_all(b"]").await.unwrap();
    let answer = closed_within(&mut stream, Duration::from_secs(5))
        .await
        .expect("the connection closed after its answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 "), "{answer:?}");
    assert!(!answer.starts_with("HTTP/1.1 503"), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("the sink stopped")
        .unwrap();
}
