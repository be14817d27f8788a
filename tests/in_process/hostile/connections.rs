//! The connection caps, the deadlines (read, session, minimum rate), and the open-relay guard.

use super::*;

/// A connection refused by a cap: exactly one `421 4.7.0` line, then EOF.
async fn refused_by_cap(src: IpAddr, addr: SocketAddr) {
    let mut raw = Raw::connect_from(src, addr).await;
    let got = raw.rest().await;
    let want = Reply::too_many_connections();
    assert!(want.line().starts_with("421 4.7.0 "));
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want.to_bytes())
    );
}

/// Polls until a new connection from `src` is greeted (slots are released when the server's
/// connection task ends, just after it closes the socket).
async fn greeted_again(src: IpAddr, addr: SocketAddr) -> Raw {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut raw = Raw::connect_from(src, addr).await;
        let first = raw.line_in_time().await.unwrap_or_default();
        if first.starts_with("220 ") {
            return raw;
        }
        assert_eq!(first, Reply::too_many_connections().line());
        assert!(
            Instant::now() < deadline,
            "the slot of a closed connection was never released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_per_ip_cap_refuses_with_421_and_releases_slots() {
    let relay = TestRelay::start_with(|s| {
        s.max_connections_per_ip = 2;
        s.max_connections = 100;
    })
    .await;
    let one = loopback(1);
    let a = held(one, relay.addr).await;
    let mut b = held(one, relay.addr).await;
    refused_by_cap(one, relay.addr).await;
    // Another address is not affected by this one's cap.
    let mut other = held(loopback(2), relay.addr).await;
    other.send(b"NOOP\r\n").await;
    assert_eq!(other.line_in_time().await.unwrap(), Reply::ok().line());
    // The held connections are unharmed.
    b.send(b"NOOP\r\n").await;
    assert_eq!(b.line_in_time().await.unwrap(), Reply::ok().line());

    // A client that just disconnects gives its slot back.
    drop(a);
    let mut c = greeted_again(one, relay.addr).await;
    refused_by_cap(one, relay.addr).await;
    // So does one the server closes (QUIT) ...
    c.send(b"QUIT\r\n").await;
    assert_eq!(c.line_in_time().await.unwrap(), Reply::bye().line());
    assert!(c.rest().await.is_empty());
    let mut d = greeted_again(one, relay.addr).await;
    // ... or throws out (bare LF).
    d.send(b"NOOP\n").await;
    assert_eq!(
        d.line_in_time().await.unwrap(),
        Reply::bare_line_ending().line()
    );
    assert!(d.rest().await.is_empty());
    let mut e = greeted_again(one, relay.addr).await;
    // And a connection refused by the cap does not take a slot itself.
    refused_by_cap(one, relay.addr).await;
    refused_by_cap(one, relay.addr).await;
    drop(b);
    let _f = greeted_again(one, relay.addr).await;
    e.send(b"NOOP\r\n").await;
    assert_eq!(e.line_in_time().await.unwrap(), Reply::ok().line());
    assert_eq!(relay.count("messages").await, 0);
}

#[tokio::test]
async fn the_global_cap_refuses_with_421_and_releases_slots() {
    let relay = TestRelay::start_with(|s| {
        s.max_connections = 2;
        s.max_connections_per_ip = 100;
    })
    .await;
    let a = held(loopback(1), relay.addr).await;
    let _b = held(loopback(2), relay.addr).await;
    refused_by_cap(loopback(3), relay.addr).await;
    refused_by_cap(loopback(1), relay.addr).await;
    drop(a);
    let _c = greeted_again(loopback(3), relay.addr).await;
    refused_by_cap(loopback(4), relay.addr).await;
    assert_eq!(relay.count("messages").await, 0);
    assert_refusals(&relay, "connections", &[("caps", 3.0), ("store", 0.0)]).await;
}

// ---------------------------------------------------------------------------------------------
// deadlines
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_silent_client_gets_421_after_the_read_timeout() {
    let relay = TestRelay::start_with(|s| s.read_timeout = Duration::from_secs(1)).await;
    // Activity resets the read deadline: it is per read, not per session (1.6 s of NOOPs).
    let mut c = Client::ready(relay.addr).await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_reply(&c.cmd("NOOP").await, &Reply::ok(), "250 2.0.0");
    }
    let idle = Instant::now();
    expect_close(&mut c, &Reply::timeout(), "421 4.4.2").await;
    assert!(idle.elapsed() >= Duration::from_millis(950), "{idle:?}");

    // Stalling in the middle of a message: 421, and nothing is stored.
    let mut c = Client::ready(relay.addr).await;
    open_data(&mut c).await;
    c.send(VALID_HEADERS).await;
    c.send(b"half a body that never ends").await;
    expect_close(&mut c, &Reply::timeout(), "421 4.4.2").await;
    assert_eq!(relay.count("messages").await, 0);
}

#[tokio::test]
async fn the_whole_session_is_cut_off_at_the_session_timeout() {
    let relay = TestRelay::start_with(|s| {
        s.session_timeout = Duration::from_secs(1);
        s.read_timeout = Duration::from_secs(5);
    })
    .await;
    let started = Instant::now();
    let mut raw = Raw::connect(relay.addr).await;
    assert!(raw.line_in_time().await.unwrap().starts_with("220 "));
    let mut oks = 0;
    let last = loop {
        raw.send(b"NOOP\r\n").await;
        match tokio::time::timeout(Duration::from_millis(100), raw.line()).await {
            Ok(Some(line)) if line == Reply::ok().line() => {
                oks += 1;
                // Wait out the rest of the 100 ms tick before the next NOOP.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Some(line)) => break line,
            Ok(None) => panic!("closed without a reply"),
            Err(_) => {}
        }
        assert!(started.elapsed() < Duration::from_secs(4), "never cut off");
    };
    assert_eq!(last, Reply::session_too_long().line());
    assert!(last.starts_with("421 4.4.2 "));
    assert!(raw.rest().await.is_empty(), "nothing after the 421");
    let took = started.elapsed();
    assert!(oks >= 3, "NOOPs were answered before the deadline ({oks})");
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(relay.count("messages").await, 0);
}

/// A raw connection that has just been told 354.
async fn raw_in_data(relay: &TestRelay) -> Raw {
    let mut raw = Raw::connect(relay.addr).await;
    assert!(raw.line_in_time().await.unwrap().starts_with("220 "));
    raw.send(
        format!("HELO slow.test\r\nMAIL FROM:<{FROM}>\r\nRCPT TO:<{RCPT}>\r\nDATA\r\n").as_bytes(),
    )
    .await;
    let mut replies = Vec::new();
    while replies.len() < 4 {
        replies.push(raw.line_in_time().await.expect("reply"));
    }
    assert!(replies[3].starts_with("354 "), "{replies:?}");
    raw
}

/// A client that pipelines NOOPs as fast as it can (reading every reply, so no write ever
/// blocks) must still be cut off when the session time is up.
#[tokio::test]
async fn the_session_timeout_holds_against_a_pipelining_flood() {
    let relay = TestRelay::start_with(|s| {
        s.session_timeout = Duration::from_millis(500);
        s.read_timeout = Duration::from_secs(5);
    })
    .await;
    let mut raw = Raw::connect(relay.addr).await;
    assert!(raw.line_in_time().await.unwrap().starts_with("220 "));
    let started = Instant::now();
    let (mut rd, mut wr) = raw.stream.into_split();
    let writer = tokio::spawn(async move {
        let burst = b"NOOP\r\n".repeat(1000);
        while wr.write_all(&burst).await.is_ok() {}
    });
    let want = Reply::session_too_long().to_bytes();
    let mut tail: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match rd.read(&mut chunk).await {
                Ok(0) => break true,
                // The server closes with our NOOPs still unread, so its kernel may answer
                // with a reset that drops the last replies in flight.
                Err(_) => break false,
                Ok(n) => {
                    tail.extend_from_slice(&chunk[..n]);
                    let keep = tail.len().saturating_sub(want.len());
                    tail.drain(..keep);
                }
            }
        }
    })
    .await;
    writer.abort();
    let clean_close = ended.unwrap_or_else(|_| {
        panic!(
            "still served after {:?} against a 500 ms session limit",
            started.elapsed()
        )
    });
    if clean_close {
        assert_eq!(
            String::from_utf8_lossy(&tail),
            String::from_utf8_lossy(&want)
        );
    }
}

/// Slowloris: a message trickled in at 10 bytes/s against a 1000 bytes/s minimum.
#[tokio::test]
async fn a_message_trickled_below_the_minimum_rate_gets_421_and_is_not_stored() {
    let relay = TestRelay::start_with(|s| {
        s.min_data_rate = 1000;
        s.data_rate_grace = Duration::from_millis(500);
        s.read_timeout = Duration::from_secs(5);
    })
    .await;
    let mut raw = raw_in_data(&relay).await;
    let started = Instant::now();
    // A complete, valid message, one byte every 100 ms; it would take seconds to finish.
    let mut body = VALID_HEADERS.to_vec();
    body.extend_from_slice(b"slow body\r\n.\r\n");
    let mut cut = None;
    for &byte in &body {
        raw.send(&[byte]).await;
        if let Ok(line) = tokio::time::timeout(Duration::from_millis(100), raw.line()).await {
            cut = Some(line.expect("a reply before the close"));
            break;
        }
    }
    let took = started.elapsed();
    let line = cut.expect("the trickled message was never cut off");
    assert_eq!(line, Reply::too_slow().line());
    assert!(line.starts_with("421 4.4.2 "));
    assert!(raw.rest().await.is_empty());
    assert!(
        took >= Duration::from_millis(450),
        "cut before the grace: {took:?}"
    );
    assert_eq!(relay.count("messages").await, 0);
}

/// The rate is enforced from the end of the grace period, not from the first whole second:
/// 1000 bytes/s required, 200 ms grace, 20 bytes/s sent. By 600 ms the client is far below
/// the minimum (12 bytes of the 600 due).
#[tokio::test]
async fn the_minimum_rate_applies_right_after_the_grace_period() {
    let relay = TestRelay::start_with(|s| {
        s.min_data_rate = 1000;
        s.data_rate_grace = Duration::from_millis(200);
        s.read_timeout = Duration::from_secs(5);
    })
    .await;
    let mut raw = raw_in_data(&relay).await;
    let started = Instant::now();
    let mut cut = None;
    for &byte in VALID_HEADERS.iter().cycle().take(60) {
        raw.send(&[byte]).await;
        if let Ok(line) = tokio::time::timeout(Duration::from_millis(50), raw.line()).await {
            cut = Some((line, started.elapsed()));
            break;
        }
    }
    let (line, at) = cut.expect("the trickled message was never cut off");
    assert_eq!(line.as_deref(), Some(Reply::too_slow().line().as_str()));
    // Cut by about 300 ms; one enforced only from the first whole second would cut at 1 s.
    assert!(at < Duration::from_millis(950), "cut off only after {at:?}");
    assert_eq!(relay.count("messages").await, 0);
}

// ---------------------------------------------------------------------------------------------
// open relay
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_client_outside_the_allow_list_cannot_submit_without_auth() {
    let relay = TestRelay::start_with(|s| {
        s.allow_networks = vec!["10.0.0.0/8".parse().unwrap()];
    })
    .await;
    let mut c = Client::ready(relay.addr).await;
    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::auth_required(), "530 5.7.0");
    let a = c.cmd("MAIL FROM:<>").await;
    assert_reply(&a, &Reply::auth_required(), "530 5.7.0");
    let a = c.cmd("RCPT TO:<victim@example.net>").await;
    assert_reply(&a, &Reply::need_mail(), "503 5.5.1");
    let a = c.cmd("DATA").await;
    assert_reply(&a, &Reply::need_mail(), "503 5.5.1");
    // BDAT without a transaction: the chunk is read and refused, not taken as commands.
    let chunk = b"From: a@example.com\r\n\r\nrelay me\r\nMAIL FROM:<x@y>\r\n";
    c.send(format!("BDAT {} LAST\r\n", chunk.len()).as_bytes())
        .await;
    c.send(chunk).await;
    expect(&mut c, &Reply::need_mail(), "503 5.5.1").await;
    // AUTH is not configured at all on this relay.
    let a = c.cmd("AUTH PLAIN AGEAYg==").await;
    assert_eq!(a.code, 502, "{a:?}");
    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::auth_required(), "530 5.7.0");
    assert_reply(&c.cmd("NOOP").await, &Reply::ok(), "250 2.0.0");
    c.quit().await;
    assert_eq!(relay.count("messages").await, 0);
}
