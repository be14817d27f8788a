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

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod connections;
mod found_by_fuzzing;
mod framing;
mod limits;

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
