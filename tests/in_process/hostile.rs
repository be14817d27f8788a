//! Hostile clients over real sockets (docs/guides/tls-auth-relay.md, "Limits"): each defence gets the bytes an
//! attacker or a broken client would send, and the test checks the exact reply (against the
//! constants in `crates/model/src/reply.rs`), what happens to the connection afterwards (closed when
//! the contract says so; otherwise the same session still answers NOOP and can still submit a
//! valid message), and that nothing was stored.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::{message, Answer, Client, TestRelay};
use idemrelay::reply::Reply;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

// ---------------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------------

const FROM: &str = "sender@example.com";
const RCPT: &str = "rcpt@example.com";

/// Asserts that `answer` is exactly `expected` (one line), and that the constant still carries
/// the code and enhanced code the contract names.
fn assert_reply(answer: &Answer, expected: &Reply, code_and_enhanced: &str) {
    let want = expected.line();
    assert!(
        want.starts_with(&format!("{code_and_enhanced} ")),
        "reply constant {want:?} no longer starts with {code_and_enhanced:?}"
    );
    assert_eq!(answer.lines.len(), 1, "{answer:?}");
    assert_eq!(answer.line(), want);
}

/// Reads the next reply and checks it.
async fn expect(c: &mut Client, expected: &Reply, code_and_enhanced: &str) {
    let answer = c
        .read_answer()
        .await
        .unwrap_or_else(|| panic!("connection closed before {code_and_enhanced}"));
    assert_reply(&answer, expected, code_and_enhanced);
}

/// Reads the next reply, checks it, and checks that the server then closed the connection
/// without saying anything more.
async fn expect_close(c: &mut Client, expected: &Reply, code_and_enhanced: &str) {
    expect(c, expected, code_and_enhanced).await;
    assert!(
        c.is_closed().await,
        "connection still open (or more bytes) after {code_and_enhanced}"
    );
}

/// The session is still in step: NOOP gets 250, and a valid message is accepted on it.
async fn still_usable(relay: &TestRelay, c: &mut Client, key: &str) {
    let noop = c.cmd("NOOP").await;
    assert_reply(&noop, &Reply::ok(), "250 2.0.0");
    let before = relay.count("messages").await;
    let answer = c
        .submit(
            FROM,
            &[RCPT],
            &message(Some(key), "fine", "a valid message"),
        )
        .await;
    let id = answer.queue_id().unwrap_or_else(|| panic!("{answer:?}"));
    assert_eq!(answer.line(), Reply::queued(&id).line());
    assert_eq!(relay.count("messages").await, before + 1);
}

async fn mail_rcpt(c: &mut Client) {
    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    let a = c.cmd(&format!("RCPT TO:<{RCPT}>")).await;
    assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
}

/// MAIL, RCPT and DATA, up to the 354.
async fn open_data(c: &mut Client) {
    mail_rcpt(c).await;
    let go = c.cmd("DATA").await;
    assert_eq!(go.code, 354, "{go:?}");
}

const VALID_HEADERS: &[u8] = b"From: Sender <sender@example.com>\r\nSubject: hostile\r\n\r\n";

/// A socket without the harness's conveniences: for talking before the greeting, binding
/// another loopback source address, and trickling bytes while watching for a reply.
struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
}

const RAW_WAIT: Duration = Duration::from_secs(5);

impl Raw {
    async fn connect_from(src: IpAddr, addr: SocketAddr) -> Raw {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(src, 0)).unwrap();
        let stream = socket.connect(addr).await.expect("connect");
        Raw {
            stream,
            buf: Vec::new(),
        }
    }

    async fn connect(addr: SocketAddr) -> Raw {
        Raw::connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr).await
    }

    /// One line without CRLF; `None` at EOF. Cancel-safe (bytes read stay in `buf`).
    async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..pos + 2).collect();
                return Some(String::from_utf8_lossy(&line[..pos]).into_owned());
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    async fn line_in_time(&mut self) -> Option<String> {
        tokio::time::timeout(RAW_WAIT, self.line())
            .await
            .expect("server did not answer in time")
    }

    /// Everything until EOF.
    async fn rest(&mut self) -> Vec<u8> {
        let mut all = std::mem::take(&mut self.buf);
        let read = async {
            let mut chunk = [0u8; 4096];
            loop {
                match self.stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => all.extend_from_slice(&chunk[..n]),
                }
            }
        };
        tokio::time::timeout(RAW_WAIT, read)
            .await
            .expect("server did not close in time");
        all
    }

    /// Writes, ignoring errors (the server may already have closed).
    async fn send(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
    }
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A connection that got its greeting and holds a slot.
async fn held(src: IpAddr, addr: SocketAddr) -> Raw {
    let mut raw = Raw::connect_from(src, addr).await;
    let greeting = raw.line_in_time().await.expect("greeting");
    assert!(greeting.starts_with("220 "), "{greeting:?}");
    raw
}

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

// ---------------------------------------------------------------------------------------------
// bare CR / bare LF: 521 5.5.2 and close
// ---------------------------------------------------------------------------------------------

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

/// The relay's refusal counters (`idemrelay_smtp_{kind}_refused_total`) have these values.
async fn assert_refusals(relay: &TestRelay, kind: &str, expected: &[(&str, f64)]) {
    let page = common::http::get(relay.admin(), "/metrics", None)
        .await
        .body;
    for (reason, value) in expected {
        let series = format!("idemrelay_smtp_{kind}_refused_total{{reason=\"{reason}\"}}");
        assert_eq!(
            common::http::sample(&page, &series),
            Some(*value),
            "{series} in:\n{page}"
        );
    }
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

// ---------------------------------------------------------------------------------------------
// size
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// connection caps
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// what black-box fuzzing found
// ---------------------------------------------------------------------------------------------

const MIB: u64 = 1024 * 1024;
/// argon2id's working memory with the default parameters (m = 19456 KiB), as `user add` uses.
const ARGON2_MEMORY: u64 = 19 * MIB;

/// One connection from `src` that fails AUTH `times` times (alternating a known user with
/// unknown names, which cost the same work), each answered 535.
async fn fail_auth(addr: SocketAddr, src: IpAddr, names: &[String]) {
    let mut raw = held(src, addr).await;
    raw.send(b"EHLO client.test\r\n").await;
    while let Some(line) = raw.line_in_time().await {
        if line.starts_with("250 ") {
            break;
        }
        assert!(line.starts_with("250-"), "{line:?}");
    }
    for name in names {
        raw.send(format!("{}\r\n", common::auth_plain(name, "wrong password")).as_bytes())
            .await;
        let line = tokio::time::timeout(Duration::from_secs(120), raw.line())
            .await
            .expect("AUTH answered in time")
            .expect("AUTH answered");
        assert_eq!(line, Reply::auth_failed().line());
    }
    raw.send(b"QUIT\r\n").await;
}

/// The built relay with one default-cost argon2id user; AUTH on the plain listener (allowed
/// for loopback), a short failure delay, and room for 5 failures per connection (the 6th
/// would close it).
async fn relay_with_a_user(dir: &std::path::Path) -> common::process::RelayProcess {
    let users = dir.join("users.toml");
    idemrelay::auth::Users::add_user(&users, "alice", "correct horse", "alice", &[]).unwrap();
    let config = dir.join("relay.toml");
    std::fs::write(
        &config,
        "auth_failure_delay = \"10ms\"\nmax_auth_failures = 6\n",
    )
    .unwrap();
    let mut args = common::process::serve_args(&dir.join("relay.db"), &[]);
    args.extend([
        "--users-file".into(),
        users.display().to_string(),
        "--config".into(),
        config.display().to_string(),
    ]);
    common::process::RelayProcess::spawn(&args).ready().await
}

/// Each failed password check used to leave its 19 MiB argon2 block with the allocator:
/// 20 failures took the relay from 15 to 357 MB. Now the blocks are a fixed pool, one per
/// concurrent check: 20 failures from 4 parallel clients cost at most `min(4, CPUs)` blocks
/// over the baseline (plus a margin for sockets and buffers), and 20 more cost nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_auth_leaves_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay_with_a_user(dir.path()).await;
    let addr = relay.addr;
    let baseline = relay.rss();
    let parallel = 4u8;
    let slots = (parallel as u64).min(std::thread::available_parallelism().unwrap().get() as u64);
    let bound = baseline + slots * ARGON2_MEMORY + 16 * MIB;
    let mut after = Vec::new();
    for round in 0..2u8 {
        let clients: Vec<_> = (0..parallel)
            .map(|i| {
                // Distinct sources keep each under the per-client throttles.
                let src = loopback(10 + round * parallel + i);
                let names: Vec<String> = (0..5)
                    .map(|n| {
                        if n % 2 == 0 {
                            "alice".to_string()
                        } else {
                            format!("nobody{round}-{i}-{n}")
                        }
                    })
                    .collect();
                tokio::spawn(async move { fail_auth(addr, src, &names).await })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        after.push(relay.rss());
    }
    eprintln!(
        "RSS: baseline {} MiB, after 20 failed AUTHs {} MiB, after 40 {} MiB (bound {} MiB)",
        baseline / MIB,
        after[0] / MIB,
        after[1] / MIB,
        bound / MIB
    );
    assert!(
        after[0] <= bound,
        "20 failed AUTHs: RSS {} MiB over the bound {} MiB",
        after[0] / MIB,
        bound / MIB
    );
    assert!(
        after[1] <= after[0] + 4 * MIB,
        "20 more failed AUTHs grew RSS from {} to {} MiB",
        after[0] / MIB,
        after[1] / MIB
    );
    assert_eq!(
        relay.log().matches("authentication failed").count(),
        40,
        "{}",
        relay.log()
    );
}

/// AUTH as an operator reads it: a failed AUTH is a refusal (counted, and logged with the
/// client), and a submission after AUTH names its user on the submission line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failures_are_counted_and_the_submission_line_names_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay_with_a_user(dir.path()).await;
    let mut c = Client::ready(relay.addr).await;
    let failed = c.cmd(&common::auth_plain("alice", "wrong password")).await;
    assert_reply(&failed, &Reply::auth_failed(), "535 5.7.8");
    let ok = c.cmd(&common::auth_plain("alice", "correct horse")).await;
    assert_eq!(ok.code, 235, "{ok:?}");
    let id = c
        .submit(
            "sender@example.com",
            &["rcpt@example.com"],
            &message(Some("auth-log-1"), "s", "b"),
        )
        .await
        .queue_id()
        .expect("queued");
    c.quit().await;
    let log = common::eventually(Duration::from_secs(10), "the submission line", || {
        let log = relay.log();
        let found = log.contains(&format!("id={id} "));
        async move { found.then_some(log) }
    })
    .await;
    let submission = log
        .lines()
        .find(|l| l.contains(&format!("id={id} ")) && l.contains("submission"))
        .unwrap();
    for field in [
        "user=alice",
        "scope=alice",
        "client=127.0.0.1",
        "helo=client.test",
    ] {
        assert!(submission.contains(field), "{field} missing: {submission}");
    }
    assert!(
        log.lines().any(|l| l.contains("command refused")
            && l.contains("reason=auth")
            && l.contains("reply=\"535 5.7.8")),
        "{log}"
    );
    assert!(!log.contains("wrong password") && !log.contains("correct horse"));
    let page = common::http::get(relay.admin(), "/metrics", None)
        .await
        .body;
    assert_eq!(
        common::http::sample(
            &page,
            "idemrelay_smtp_commands_refused_total{reason=\"auth\"}"
        ),
        Some(1.0),
        "{page}"
    );
}

/// A large message's buffers are given back once it is committed, while its connection is
/// still open: 3 idle connections that each sent 24 MB used to hold 15 → 100+ MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_leave_nothing_behind_on_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let args = common::process::serve_args(&dir.path().join("relay.db"), &[]);
    let relay = common::process::RelayProcess::spawn(&args).ready().await;
    let baseline = relay.rss();
    let mut body = VALID_HEADERS.to_vec();
    let line = [b'x'; 98];
    while body.len() < 24_000_000 {
        body.extend_from_slice(&line);
        body.extend_from_slice(b"\r\n");
    }
    let mut open = Vec::new();
    let mut seen = Vec::new();
    for i in 0..3 {
        let mut c = Client::ready(relay.addr).await;
        mail_rcpt(&mut c).await;
        let mut message = format!("X-Bird-Idempotency-Key: big-{i}\r\n").into_bytes();
        message.extend_from_slice(&body);
        let answer = c.data(&message).await;
        assert!(answer.queue_id().is_some(), "{answer:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        seen.push(relay.rss());
        open.push(c);
    }
    eprintln!(
        "RSS: baseline {} MiB, after each 24 MB message on its still open connection {:?} MiB",
        baseline / MIB,
        seen.iter().map(|r| r / MIB).collect::<Vec<_>>()
    );
    let bound = baseline + 16 * MIB;
    assert!(
        seen.iter().all(|&r| r <= bound),
        "RSS over {} MiB: {:?} MiB",
        bound / MIB,
        seen.iter().map(|r| r / MIB).collect::<Vec<_>>()
    );
    for c in open {
        c.quit().await;
    }
}

/// A reply that must carry this code and enhanced code (for the replies of the input rules).
fn assert_code(answer: &Answer, code_and_enhanced: &str) {
    assert_eq!(answer.lines.len(), 1, "{answer:?}");
    assert!(
        answer.line().starts_with(&format!("{code_and_enhanced} ")),
        "{answer:?} is not {code_and_enhanced}"
    );
}

#[tokio::test]
async fn invalid_addresses_are_refused_and_valid_ones_stored_as_sent() {
    let relay = TestRelay::start_with(|s| s.max_errors = 100).await;
    let mut c = Client::ready(relay.addr).await;
    for from in [
        "app@",
        "app@\"\"\"\"\"\"",
        "\"\"",
        "@example.com",
        "app",
        "a..b@example.com",
        "app@example..com",
        "app@-example.com",
        "app@exa_mple.com",
        "app@[192.0.2.300]",
        "app@[IPv6:nonsense]",
        "app@example.com.",
        "app @example.com",
        "postmaster",
    ] {
        let a = c.cmd(&format!("MAIL FROM:<{from}>")).await;
        assert_reply(&a, &Reply::bad_sender_address(), "501 5.1.7");
    }
    // 8-bit bytes that are not UTF-8 are not an address either, even under SMTPUTF8.
    c.send(b"MAIL FROM:<j\xf6rg@example.com> SMTPUTF8\r\n")
        .await;
    expect(&mut c, &Reply::bad_sender_address(), "501 5.1.7").await;

    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    for rcpt in [
        "user@",
        "",
        "\"\"",
        "postmaster",
        "user@exam ple.com",
        "@x:user@",
    ] {
        let a = c.cmd(&format!("RCPT TO:<{rcpt}>")).await;
        assert_reply(&a, &Reply::bad_recipient_address(), "553 5.1.3");
    }
    assert_reply(&c.cmd("RSET").await, &Reply::reset_ok(), "250 2.0.0");

    // Unusual but valid: accepted, and stored exactly as sent (a source route is dropped,
    // as RFC 5321 tells servers to do).
    let from = "\"john q. public\"@example.com";
    let rcpts = [
        "\"a@b\"@example.com",
        "user@[192.0.2.1]",
        "user@[IPv6:2001:db8::1]",
        "Mixed.Case+tag@Example.COM",
        "x@y",
    ];
    let a = c.cmd(&format!("MAIL FROM:<{from}>")).await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    for rcpt in rcpts {
        let a = c.cmd(&format!("RCPT TO:<{rcpt}>")).await;
        assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    }
    let a = c
        .cmd("RCPT TO:<@relay.example,@other.example:routed@example.com>")
        .await;
    assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    let answer = c.data(&message(Some("addr-1"), "addresses", "b")).await;
    let stored = relay.stored(&answer.queue_id().unwrap()).await;
    assert_eq!(stored.mail_from, from);
    let mut want: Vec<&str> = rcpts.to_vec();
    want.push("routed@example.com");
    assert_eq!(stored.rcpt_to, want);

    // The null sender is only `<>`.
    let a = c.cmd("MAIL FROM:<>").await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    let a = c.cmd(&format!("RCPT TO:<{RCPT}>")).await;
    assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    let answer = c.data(&message(Some("addr-2"), "bounce", "b")).await;
    assert_eq!(
        relay.stored(&answer.queue_id().unwrap()).await.mail_from,
        ""
    );

    // UTF-8 needs SMTPUTF8, and then is kept as sent.
    let a = c.cmd("MAIL FROM:<jörg@bücher.example>").await;
    assert_reply(&a, &Reply::non_ascii_address(), "553 5.6.7");
    let a = c.cmd("MAIL FROM:<jörg@bücher.example> SMTPUTF8").await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    let a = c.cmd("RCPT TO:<δοκιμή@παράδειγμα.δοκιμή>").await;
    assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    let a = c.cmd("RCPT TO:<user@bücher.>").await;
    assert_reply(&a, &Reply::bad_recipient_address(), "553 5.1.3");
    let answer = c.data(&message(Some("addr-3"), "utf8", "b")).await;
    let stored = relay.stored(&answer.queue_id().unwrap()).await;
    assert_eq!(stored.mail_from, "jörg@bücher.example");
    assert_eq!(stored.rcpt_to, vec!["δοκιμή@παράδειγμα.δοκιμή"]);
    assert_eq!(relay.count("messages").await, 3);
    still_usable(&relay, &mut c, "addr-after").await;
}

#[tokio::test]
async fn helo_names_must_be_domains_or_address_literals() {
    let relay = TestRelay::start().await;
    let (mut c, greeting) = Client::connect(relay.addr).await;
    assert_eq!(greeting.code, 220);
    for helo in [
        &b"EHLO h\xc3\xa9llo.example\r\n"[..],
        b"EHLO h\xffst\r\n",
        b"HELO b\xfccher.example\r\n",
        b"EHLO host..example\r\n",
        b"EHLO -host\r\n",
        b"EHLO [192.0.2.256]\r\n",
        b"EHLO <host>\r\n",
        b"EHLO \"host\"\r\n",
    ] {
        c.send(helo).await;
        let a = c.read_answer().await.expect("answer");
        assert_code(&a, "501 5.5.2");
    }
    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::need_helo(), "503 5.5.1");
    for good in [
        "HELO [192.0.2.1]",
        "EHLO [IPv6:::1]",
        "EHLO DESKTOP-42_B.corp.example",
    ] {
        let a = c.cmd(good).await;
        assert_eq!(a.code, 250, "{good}: {a:?}");
    }
    let answer = c
        .submit(FROM, &[RCPT], &message(Some("helo-1"), "helo", "b"))
        .await;
    let stored = relay.stored(&answer.queue_id().unwrap()).await;
    let content = String::from_utf8(stored.content.unwrap()).unwrap();
    assert!(
        content.starts_with("Received: from DESKTOP-42_B.corp.example "),
        "{content}"
    );
}

#[tokio::test]
async fn mail_parameters_duplicates_and_size() {
    let relay = TestRelay::start_with(|s| s.max_message_size = 1000).await;
    let mut c = Client::ready(relay.addr).await;
    for params in [
        "SIZE=10 SIZE=10",
        "SIZE=10 size=20",
        "BODY=8BITMIME BODY=8BITMIME",
        "BODY=7BIT BODY=8BITMIME",
        "SMTPUTF8 SMTPUTF8",
        "RET=FULL RET=HDRS",
    ] {
        let a = c.cmd(&format!("MAIL FROM:<{FROM}> {params}")).await;
        assert_code(&a, "501 5.5.4");
    }
    // One rule for too big: any all-digit SIZE over the limit, however long, is 552; a value
    // that is not a number is a syntax error.
    for size in [
        "1001",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999",
    ] {
        let a = c.cmd(&format!("MAIL FROM:<{FROM}> SIZE={size}")).await;
        assert_reply(&a, &Reply::message_too_big(), "552 5.3.4");
    }
    for size in ["", "1x", "-1", "0x10"] {
        let a = c.cmd(&format!("MAIL FROM:<{FROM}> SIZE={size}")).await;
        assert_code(&a, "501 5.5.4");
    }
    let a = c
        .cmd(&format!(
            "MAIL FROM:<{FROM}> SIZE=1000 BODY=8BITMIME SMTPUTF8"
        ))
        .await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    let a = c
        .cmd(&format!("RCPT TO:<{RCPT}> NOTIFY=NEVER NOTIFY=NEVER"))
        .await;
    assert_code(&a, "501 5.5.4");
    // DSN's NOTIFY is taken (tests/in_process/delivery_requests.rs); a parameter the relay
    // lacks is still 555.
    let a = c.cmd(&format!("RCPT TO:<{RCPT}> MT-PRIORITY=1")).await;
    assert_code(&a, "555 5.5.4");
    assert_reply(&c.cmd("RSET").await, &Reply::reset_ok(), "250 2.0.0");
    assert_eq!(relay.count("messages").await, 0);
    still_usable(&relay, &mut c, "params-after").await;
}

/// Keys that could look like another key to a person: bidi controls, zero-width and other
/// format characters, line and paragraph separators, the BOM.
#[tokio::test]
async fn keys_with_invisible_characters_get_e01001() {
    let relay = TestRelay::start().await;
    let mut c = Client::ready(relay.addr).await;
    for invisible in [
        '\u{202e}', '\u{200b}', '\u{2028}', '\u{2029}', '\u{feff}', '\u{2066}', '\u{00ad}',
    ] {
        mail_rcpt(&mut c).await;
        let key = format!("order-{invisible}42");
        let answer = c.data(&message(Some(&key), "invisible", "b")).await;
        assert_reply(&answer, &Reply::key_invalid(), "554 5.6.0");
    }
    assert_eq!(relay.count("messages").await, 0);
    // Visible non-ASCII is still a key.
    still_usable(&relay, &mut c, "заказ-42-✓").await;
}
