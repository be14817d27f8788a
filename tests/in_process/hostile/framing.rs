//! Bare CR and bare LF, smuggling sequences, early talkers, and lines over their length limits.

use super::*;

#[tokio::test]
async fn bare_line_endings_in_commands_get_521_and_close() {
    let relay = TestRelay::start().await;
    let cases: &[&[u8]] = &[
        b"NOOP\n",
        b"NOOP\nNOOP\r\n",
        b"NO\rOP\r\n",
        b"NOOP\r\r\n",
        b"\n",
        b"\r\r\n",
        b"MAIL FROM:<sender@example.com>\n",
        b"RSET\rMAIL FROM:<evil@example.com>\r\n",
        b"HELO a\r\n\n",
    ];
    for &case in cases {
        let mut c = Client::ready(relay.addr).await;
        c.send(case).await;
        if case.starts_with(b"HELO a\r\n") {
            let helo = c.read_answer().await.unwrap();
            assert_eq!(helo.code, 250, "{helo:?}");
        }
        expect_close(&mut c, &Reply::bare_line_ending(), "521 5.5.2").await;
    }
    // A CR at the end of one read and a non-LF at the start of the next is still bare.
    let mut c = Client::ready(relay.addr).await;
    c.send(b"NOOP\r").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.send(b"X\r\n").await;
    expect_close(&mut c, &Reply::bare_line_ending(), "521 5.5.2").await;
    // A bare LF inside an over-long line that is being discarded.
    let mut c = Client::ready(relay.addr).await;
    let mut long = b"NOOP ".to_vec();
    long.extend(std::iter::repeat_n(b'x', 5000));
    c.send(&long).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.send(b"xx\nNOOP\r\n").await;
    expect_close(&mut c, &Reply::bare_line_ending(), "521 5.5.2").await;
    // Before EHLO, too.
    let (mut c, greeting) = Client::connect(relay.addr).await;
    assert_eq!(greeting.code, 220);
    c.send(b"EHLO c\n").await;
    expect_close(&mut c, &Reply::bare_line_ending(), "521 5.5.2").await;
    assert_eq!(relay.count("messages").await, 0);
    // Each one counted as what it looks like: 9 cases and 3 more sessions.
    assert_refusals(&relay, "commands", &[("smuggling", 12.0), ("limits", 0.0)]).await;
}

/// The smuggling sequences: a second, smuggled transaction follows the fake terminator, and a
/// real terminator ends the payload. Nothing of it may be stored.
#[tokio::test]
async fn smuggling_sequences_in_data_get_521_and_close() {
    let relay = TestRelay::start().await;
    let fake_ends: &[&[u8]] = &[
        b"\n.\n",
        b"\n.\r\n",
        b"\r\n.\n",
        b"\r.\r",
        b"\r\n.\r\r\n",
        b"\r\n.\r",
        b"\r\n\n.\r\n",
        b"\n",
        b"\r",
    ];
    for &fake in fake_ends {
        let mut c = Client::ready(relay.addr).await;
        open_data(&mut c).await;
        let mut payload = VALID_HEADERS.to_vec();
        payload.extend_from_slice(b"legit body");
        payload.extend_from_slice(fake);
        payload.extend_from_slice(
            b"MAIL FROM:<evil@example.com>\r\nRCPT TO:<victim@example.com>\r\nDATA\r\n\
              From: evil@example.com\r\nX-Bird-Idempotency-Key: smuggled\r\n\r\nsmuggled\r\n.\r\n",
        );
        payload.extend_from_slice(b"NOOP\r\n");
        c.send(&payload).await;
        expect_close(&mut c, &Reply::bare_line_ending(), "521 5.5.2").await;
    }
    // In the header section, split across reads, and in a BDAT chunk.
    let mut c = Client::ready(relay.addr).await;
    open_data(&mut c).await;
    c.send(b"From: a@example.com\r\nSubject: x\r").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.send(b"y\r\n\r\nbody\r\n.\r\n").await;
    expect_close(&mut c, &Reply::bare_line_ending(), "521 5.5.2").await;

    let mut c = Client::ready(relay.addr).await;
    mail_rcpt(&mut c).await;
    let chunk = b"From: a@example.com\r\n\r\nbody\n.\nmore\r\n";
    c.send(format!("BDAT {} LAST\r\n", chunk.len()).as_bytes())
        .await;
    c.send(chunk).await;
    expect_close(&mut c, &Reply::bare_line_ending(), "521 5.5.2").await;

    // BDAT LAST ending in a lone CR.
    let mut c = Client::ready(relay.addr).await;
    mail_rcpt(&mut c).await;
    let chunk = b"From: a@example.com\r\n\r\nbody\r";
    c.send(format!("BDAT {} LAST\r\n", chunk.len()).as_bytes())
        .await;
    c.send(chunk).await;
    expect_close(&mut c, &Reply::bare_line_ending(), "521 5.5.2").await;

    assert_eq!(relay.count("messages").await, 0);
}

// ---------------------------------------------------------------------------------------------
// early talkers
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn early_talkers_get_554_and_no_greeting() {
    let relay = TestRelay::start_with(|s| s.greet_delay = Duration::from_millis(300)).await;
    let mut raw = Raw::connect(relay.addr).await;
    raw.send(b"EHLO spambot\r\nMAIL FROM:<a@example.com>\r\n")
        .await;
    let got = raw.rest().await;
    let want = Reply::early_talker();
    assert!(want.line().starts_with("554 5.5.0 "));
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want.to_bytes()),
        "exactly the refusal, no greeting, then close"
    );

    assert_eq!(relay.count("messages").await, 0);
    // The refused connection held no slot and broke nothing: the next client is served.
    let (mut c, greeting) = Client::connect(relay.addr).await;
    assert_eq!(greeting.code, 220, "{greeting:?}");
    let ehlo = c.cmd("EHLO patient.test").await;
    assert_eq!(ehlo.code, 250);
    still_usable(&relay, &mut c, "early-talker-after").await;
}

/// The greet delay is a real wait: a client that talks 100 ms into a 1 s delay is an early
/// talker, and a patient client is greeted only once the delay is over.
#[tokio::test]
async fn the_greet_delay_catches_a_client_that_talks_during_it() {
    let relay = TestRelay::start_with(|s| s.greet_delay = Duration::from_secs(1)).await;
    let mut raw = Raw::connect(relay.addr).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    raw.send(b"EHLO spambot\r\n").await;
    let first = raw.line_in_time().await;
    assert_eq!(first, Some(Reply::early_talker().line()));
    assert!(raw.rest().await.is_empty());

    let started = Instant::now();
    let (_c, greeting) = Client::connect(relay.addr).await;
    assert_eq!(greeting.code, 220, "{greeting:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "greeted after {:?}",
        started.elapsed()
    );
    assert_eq!(relay.count("messages").await, 0);
}

// ---------------------------------------------------------------------------------------------
// line lengths
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn command_lines_over_2048_octets_get_500_and_the_session_goes_on() {
    let relay = TestRelay::start().await;
    let mut c = Client::ready(relay.addr).await;
    // 2048 octets including CRLF is allowed; 2049 is not.
    let at_limit = format!("NOOP {}", "x".repeat(2048 - 7));
    assert_eq!(at_limit.len() + 2, 2048);
    assert_reply(&c.cmd(&at_limit).await, &Reply::ok(), "250 2.0.0");
    let over = format!("NOOP {}", "x".repeat(2048 - 6));
    assert_reply(&c.cmd(&over).await, &Reply::line_too_long(), "500 5.5.2");
    // A very long line, sent in pieces, is discarded to its end and answered once.
    let huge = format!("MAIL FROM:<{}@example.com>\r\n", "y".repeat(200_000));
    for piece in huge.as_bytes().chunks(7000) {
        c.send(piece).await;
    }
    expect(&mut c, &Reply::line_too_long(), "500 5.5.2").await;
    // In the middle of a transaction: the transaction survives.
    mail_rcpt(&mut c).await;
    assert_reply(
        &c.cmd(&format!("RCPT TO:<{}@example.com>", "z".repeat(3000)))
            .await,
        &Reply::line_too_long(),
        "500 5.5.2",
    );
    let answer = c
        .data(&message(Some("long-cmd-1"), "after long line", "body"))
        .await;
    assert!(answer.queue_id().is_some(), "{answer:?}");
    assert_eq!(relay.count("messages").await, 1);
    still_usable(&relay, &mut c, "long-cmd-2").await;
}

#[tokio::test]
async fn data_lines_over_998_octets_get_550_and_store_nothing() {
    let relay = TestRelay::start().await;
    let mut c = Client::ready(relay.addr).await;
    for (i, long_line) in [
        "x".repeat(999),
        "x".repeat(5000),
        // The transparency dot counts: 1 + 998 octets as sent.
        format!(".{}", "x".repeat(998)),
    ]
    .iter()
    .enumerate()
    {
        open_data(&mut c).await;
        let mut sent = format!("From: a@example.com\r\nX-Case: {i}\r\n\r\n").into_bytes();
        // As sent on the wire (already stuffed), then a valid line and the terminator.
        sent.extend_from_slice(long_line.as_bytes());
        sent.extend_from_slice(b"\r\nshort line\r\n.\r\n");
        c.send(&sent).await;
        expect(&mut c, &Reply::data_line_too_long(), "550 5.6.0").await;
    }
    assert_eq!(relay.count("messages").await, 0);
    // Exactly 998 octets is a valid line.
    let mut ok = message(Some("line-998"), "limit", &"y".repeat(998));
    ok.extend_from_slice(b"tail\r\n");
    mail_rcpt(&mut c).await;
    let answer = c.data(&ok).await;
    assert!(answer.queue_id().is_some(), "{answer:?}");
    still_usable(&relay, &mut c, "line-998-after").await;
    assert_eq!(relay.count("messages").await, 2);
}
