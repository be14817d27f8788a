//! The size and recipient limits, the message content that is refused, and the error count.

use super::*;

#[tokio::test]
async fn size_over_the_limit_gets_552_at_mail_and_after_the_body() {
    let relay = TestRelay::start_with(|s| s.max_message_size = 1000).await;
    let mut c = Client::ready(relay.addr).await;
    let ehlo = c.cmd("EHLO again.test").await;
    assert!(ehlo.lines.iter().any(|l| l == "SIZE 1000"), "{ehlo:?}");

    // Declared too big at MAIL: refused before any body, no transaction opened.
    let a = c.cmd(&format!("MAIL FROM:<{FROM}> SIZE=1001")).await;
    assert_reply(&a, &Reply::message_too_big(), "552 5.3.4");
    let a = c
        .cmd(&format!(
            "MAIL FROM:<{FROM}> SIZE=99999999999999999999999999"
        ))
        .await;
    assert_reply(&a, &Reply::message_too_big(), "552 5.3.4");
    let a = c.cmd(&format!("RCPT TO:<{RCPT}>")).await;
    assert_reply(&a, &Reply::need_mail(), "503 5.5.1");
    // SIZE equal to the limit is fine.
    let a = c.cmd(&format!("MAIL FROM:<{FROM}> SIZE=1000")).await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    assert_reply(&c.cmd("RSET").await, &Reply::reset_ok(), "250 2.0.0");

    // Undeclared and too big: the body is read to its end and discarded, then 552. The
    // terminator is sent separately, so an early reply would show up as a desync below.
    open_data(&mut c).await;
    let mut big = VALID_HEADERS.to_vec();
    for i in 0..100 {
        big.extend_from_slice(format!("line {i:04} of an oversized body\r\n").as_bytes());
    }
    big.extend_from_slice(b"NOOP\r\nMAIL FROM:<smuggled@example.com>\r\n");
    c.send(&big).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.send(b".\r\n").await;
    expect(&mut c, &Reply::message_too_big(), "552 5.3.4").await;
    assert_eq!(relay.count("messages").await, 0);
    still_usable(&relay, &mut c, "size-after-data").await;

    // BDAT: a non-last chunk that overflows fails the transaction (RFC 3030) ...
    mail_rcpt(&mut c).await;
    let chunk = big.clone();
    c.send(format!("BDAT {}\r\n", chunk.len()).as_bytes()).await;
    c.send(&chunk).await;
    expect(&mut c, &Reply::message_too_big(), "552 5.3.4").await;
    // ... and a LAST chunk that overflows is read to its end and refused.
    mail_rcpt(&mut c).await;
    c.send(format!("BDAT {} LAST\r\n", chunk.len()).as_bytes())
        .await;
    c.send(&chunk).await;
    expect(&mut c, &Reply::message_too_big(), "552 5.3.4").await;
    assert_eq!(relay.count("messages").await, 1);
    still_usable(&relay, &mut c, "size-after-bdat").await;
    assert_eq!(relay.count("messages").await, 2);
}

// ---------------------------------------------------------------------------------------------
// recipients
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn recipients_over_the_limit_get_452_without_ending_the_session() {
    // max_errors = 1: were 452 counted as a client error, the session would end.
    let relay = TestRelay::start_with(|s| {
        s.max_recipients = 2;
        s.max_errors = 1;
    })
    .await;
    let mut c = Client::ready(relay.addr).await;
    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_eq!(a.code, 250);
    for i in 0..2 {
        let a = c.cmd(&format!("RCPT TO:<r{i}@example.com>")).await;
        assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    }
    for i in 2..10 {
        let a = c.cmd(&format!("RCPT TO:<r{i}@example.com>")).await;
        assert_reply(&a, &Reply::too_many_recipients(), "452 4.5.3");
    }
    // A repeat of an accepted recipient is still fine.
    let a = c.cmd("RCPT TO:<r1@example.com>").await;
    assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    assert_reply(&c.cmd("NOOP").await, &Reply::ok(), "250 2.0.0");
    let answer = c
        .data(&message(Some("rcpt-limit"), "two of ten", "body"))
        .await;
    let id = answer.queue_id().unwrap_or_else(|| panic!("{answer:?}"));
    assert_eq!(
        relay.stored(&id).await.rcpt_to,
        vec!["r0@example.com", "r1@example.com"]
    );
    still_usable(&relay, &mut c, "rcpt-limit-after").await;
    assert_eq!(relay.count("messages").await, 2);
}

// ---------------------------------------------------------------------------------------------
// message content
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn nul_in_data_gets_554_and_stores_nothing() {
    let relay = TestRelay::start().await;
    let mut c = Client::ready(relay.addr).await;
    for body in [
        &b"From: a@example.com\r\nSubject: nul\r\n\r\nbefore\0after\r\n"[..],
        b"From: a@example.com\r\nSubject: nul\0in header\r\n\r\nbody\r\n",
        b"\0",
    ] {
        mail_rcpt(&mut c).await;
        let answer = c.data(body).await;
        assert_reply(&answer, &Reply::nul_in_data(), "554 5.6.0");
    }
    // With BDAT as well.
    mail_rcpt(&mut c).await;
    let chunk = b"From: a@example.com\r\n\r\nx\0y\r\n";
    c.send(format!("BDAT {} LAST\r\n", chunk.len()).as_bytes())
        .await;
    c.send(chunk).await;
    expect(&mut c, &Reply::nul_in_data(), "554 5.6.0").await;
    assert_eq!(relay.count("messages").await, 0);
    still_usable(&relay, &mut c, "nul-after").await;
}

#[tokio::test]
async fn a_message_without_a_header_section_gets_550_and_stores_nothing() {
    let relay = TestRelay::start().await;
    let mut c = Client::ready(relay.addr).await;
    for body in [
        &b"just some text, no header at all\r\n"[..],
        b"\r\nFrom: a@example.com\r\n\r\nthe header comes after an empty line\r\n",
        b" From: a@example.com\r\n\r\nfolded first line\r\n",
        b"Not a header: because of the space\r\n\r\n",
        b"",
    ] {
        mail_rcpt(&mut c).await;
        let answer = c.data(body).await;
        assert_reply(&answer, &Reply::no_header_section(), "550 5.6.0");
    }
    assert_eq!(relay.count("messages").await, 0);
    still_usable(&relay, &mut c, "no-header-after").await;
}

#[tokio::test]
async fn control_characters_in_names_and_addresses_get_501() {
    let relay = TestRelay::start().await;
    let (mut c, greeting) = Client::connect(relay.addr).await;
    assert_eq!(greeting.code, 220);
    for helo in [
        "HELO a\x01b",
        "EHLO a\x7fb",
        "EHLO bad\x1bname",
        "HELO x\x08",
    ] {
        let a = c.cmd(helo).await;
        assert_reply(&a, &Reply::bad_characters(), "501 5.5.2");
    }
    // The session has no HELO yet: MAIL still needs one.
    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::need_helo(), "503 5.5.1");
    let a = c.cmd("EHLO good.test").await;
    assert_eq!(a.code, 250);
    // Whether smtp-proto would call the address a syntax error or not (a C0 control in an
    // unquoted local part), the answer is the control-character one.
    for from in [
        "MAIL FROM:<a\x7f@example.com>",
        "MAIL FROM:<\"a\x1b\"@example.com>",
        "MAIL FROM:<a@exam\x7fple.com>",
        "MAIL FROM:<a\x01b@example.com>",
        "MAIL FROM:<a\0b@example.com>",
    ] {
        let a = c.cmd(from).await;
        assert_reply(&a, &Reply::bad_characters(), "501 5.5.2");
    }
    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    for rcpt in [
        "RCPT TO:<r@exa\x7fmple.com>",
        "RCPT TO:<\"r\x1b\"@example.com>",
        "RCPT TO:<r\x01@example.com>",
        "RCPT TO:<r\x1f@example.com>",
    ] {
        let a = c.cmd(rcpt).await;
        assert_reply(&a, &Reply::bad_characters(), "501 5.5.2");
    }
    assert_reply(&c.cmd("RSET").await, &Reply::reset_ok(), "250 2.0.0");
    assert_eq!(relay.count("messages").await, 0);
    still_usable(&relay, &mut c, "ctl-after").await;
}

/// A client that keeps sending garbage is thrown out after `max_errors`, pipelined or not.
#[tokio::test]
async fn too_many_errors_get_421_and_close() {
    let relay = TestRelay::start_with(|s| s.max_errors = 3).await;
    let mut c = Client::ready(relay.addr).await;
    for _ in 0..3 {
        assert_reply(
            &c.cmd("XYZZY").await,
            &Reply::unknown_command(),
            "500 5.5.1",
        );
    }
    c.send(b"RCPT TO:<a@example.com>\r\nNOOP\r\nNOOP\r\n").await;
    expect_close(&mut c, &Reply::too_many_errors(), "421 4.7.0").await;
    assert_eq!(relay.count("messages").await, 0);
    // Syntax errors are not refusals; the session cut for them is.
    assert_refusals(&relay, "commands", &[("limits", 1.0), ("smuggling", 0.0)]).await;
}
