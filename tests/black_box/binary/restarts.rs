//! Restarts and signals: replays after a restart or SIGKILL, and SIGTERM's grace.

use super::*;

/// Polls until a TCP connect to `addr` is refused. A connect racing the shutdown may still
/// succeed, or be reset when the closing listener drops its backlog, so neither is a failure
/// once; a listener that keeps accepting is.
async fn assert_refuses_connections(addr: SocketAddr, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match tokio::net::TcpStream::connect(addr).await {
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => return,
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => assert!(
                Instant::now() < deadline,
                "{addr} still resets connections {within:?} after SIGTERM"
            ),
            Err(err) => panic!("connect to {addr} failed unexpectedly: {err}"),
            Ok(_) => assert!(
                Instant::now() < deadline,
                "{addr} still accepts connections {within:?} after SIGTERM"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

enum Stop {
    /// Graceful: the supervisor's normal stop.
    Term,
    /// A crash or OOM kill: nothing runs after the signal.
    Kill,
}

async fn restart_replays_after(stop: Stop) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let msg = message(Some("restart-key"), "before restart", "accepted once");

    let mut relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let first = client
        .submit("sender@example.com", &["rcpt@example.com"], &msg)
        .await;
    let id = first
        .queue_id()
        .unwrap_or_else(|| panic!("not accepted: {first:?}"));
    assert_eq!(first.line(), queued_line(&id));

    match stop {
        Stop::Term => {
            client.quit().await;
            relay.signal("TERM");
            let status = relay.wait_exit(QUICK_EXIT).await;
            assert!(status.success(), "{status}; stderr:\n{}", relay.log());
        }
        Stop::Kill => {
            // The session stays open: the 250 alone must be enough for the record to survive.
            relay.signal("KILL");
            let status = relay.wait_exit(QUICK_EXIT).await;
            assert_eq!(status.signal(), Some(9), "{status}");
            drop(client);
        }
    }

    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let again = client
        .submit("sender@example.com", &["rcpt@example.com"], &msg)
        .await;
    assert_eq!(again.line(), replay_line(&id), "stderr:\n{}", relay.log());

    let changed = message(Some("restart-key"), "before restart", "a different body");
    let reuse = client
        .submit("sender@example.com", &["rcpt@example.com"], &changed)
        .await;
    assert_eq!(reuse.line(), KEY_REUSE_LINE);
    client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replays_a_key_accepted_before() {
    restart_replays_after(Stop::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_sigkill_replays_a_key_accepted_before() {
    restart_replays_after(Stop::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_message_in_progress_finish() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let grace = Duration::from_secs(10);
    let mut relay = start_relay(&db, &["--shutdown-grace", "10s"]);
    let addr = relay.addr;

    let mut idle = Client::ready(addr).await;
    let mut busy = Client::ready(addr).await;
    let msg = message(
        Some("in-flight-key"),
        "finishes during shutdown",
        "first line\r\n.leading dot\r\nlast line",
    );
    assert_eq!(busy.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
    assert_eq!(busy.cmd("RCPT TO:<rcpt@example.com>").await.code, 250);
    assert_eq!(busy.cmd("DATA").await.code, 354);
    let wire = dot_stuff(&msg);
    // Cut inside the dot-stuffed line, so the relay holds whole lines and a partial one.
    let cut = wire
        .windows(7)
        .position(|w| w == b"leading")
        .expect("cut point");
    busy.send(&wire[..cut]).await;

    relay.signal("TERM");

    let bye = idle.read_answer().await.expect("idle session gets a reply");
    assert!(bye.line().starts_with("421 4.3.0 "), "{bye:?}");
    assert!(idle.is_closed().await, "idle session left open");

    // Still inside the grace period with `busy` mid-message: no new sessions.
    assert_refuses_connections(addr, QUICK_EXIT).await;

    busy.send(&wire[cut..]).await;
    let done = busy.read_answer().await.expect("reply to the final dot");
    let id = done
        .queue_id()
        .unwrap_or_else(|| panic!("message in progress was not accepted: {done:?}"));
    assert_eq!(done.line(), queued_line(&id));
    let bye = busy.read_answer().await.expect("421 after the message");
    assert!(bye.line().starts_with("421 4.3.0 "), "{bye:?}");
    assert!(
        busy.is_closed().await,
        "session left open after its message"
    );

    // Exiting once the last session ends, not when the grace period runs out.
    let closed_at = Instant::now();
    let status = relay.wait_exit(grace).await;
    assert!(status.success(), "{status}; stderr:\n{}", relay.log());
    assert!(
        closed_at.elapsed() < QUICK_EXIT,
        "exit took {:?} after the last session ended",
        closed_at.elapsed()
    );
    assert_refuses_connections(addr, Duration::ZERO).await;

    // The 250 given during shutdown was a commit like any other.
    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let again = client
        .submit("sender@example.com", &["rcpt@example.com"], &msg)
        .await;
    assert_eq!(again.line(), replay_line(&id));
    client.quit().await;
}

/// A supervisor may stop the relay the moment it reports readiness; that stop must be as
/// graceful as any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_ready_is_graceful() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..20 {
        let mut relay = start_relay(&dir.path().join("relay.db"), &[]);
        relay.signal("TERM");
        let status = relay.wait_exit(QUICK_EXIT).await;
        assert!(status.success(), "round {round}: {status}");
    }
}
