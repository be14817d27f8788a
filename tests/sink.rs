//! The test upstream (`idemrelay sink`) over real sockets: byte-exact acceptance, the
//! idempotency answers, every fault kind, the down modes, STARTTLS/implicit TLS with AUTH, the
//! HTTP API and the maildir output. The SMTP and HTTP clients are deliberately minimal and
//! local to this file.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemrelay::sink::{Down, FaultRule, Outcome, Phase, Sink, SinkConfig, SinkHandle};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(10);

// --- a minimal SMTP client ---------------------------------------------------------------

struct Client<S> {
    stream: S,
    buf: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply {
    code: u16,
    /// The text of the last line, after the code and separator.
    text: String,
    lines: Vec<String>,
}

impl Reply {
    fn line(&self) -> String {
        format!("{} {}", self.code, self.text)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    fn new(stream: S) -> Self {
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// One reply (all its lines), or `None` when the server closed the connection first.
    async fn reply(&mut self) -> Option<Reply> {
        let mut lines = Vec::new();
        loop {
            while let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8(self.buf.drain(..end + 2).collect()).unwrap();
                let line = line.trim_end_matches("\r\n").to_string();
                let last = line.as_bytes().get(3) != Some(&b'-');
                lines.push(line.clone());
                if last {
                    return Some(Reply {
                        code: line[..3].parse().unwrap(),
                        text: line.get(4..).unwrap_or("").to_string(),
                        lines,
                    });
                }
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(WAIT, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return None,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Err(_) => panic!("no reply within {WAIT:?}"),
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
        self.stream.flush().await.unwrap();
    }

    async fn cmd(&mut self, line: &str) -> Reply {
        self.send(format!("{line}\r\n").as_bytes()).await;
        self.reply()
            .await
            .unwrap_or_else(|| panic!("connection closed after {line}"))
    }

    async fn expect(&mut self, line: &str, code: u16) -> Reply {
        let reply = self.cmd(line).await;
        assert_eq!(reply.code, code, "{line} -> {reply:?}");
        reply
    }

    /// MAIL, RCPT..., DATA and the message, one command at a time; the reply to the final
    /// dot, or `None` when the connection was closed instead.
    async fn submit(&mut self, from: &str, to: &[&str], message: &[u8]) -> Option<Reply> {
        self.expect(&format!("MAIL FROM:<{from}>"), 250).await;
        for rcpt in to {
            self.expect(&format!("RCPT TO:<{rcpt}>"), 250).await;
        }
        self.expect("DATA", 354).await;
        self.send(&dot_stuff(message)).await;
        self.reply().await
    }

    /// A server that closed the connection: EOF (or reset) on read.
    async fn assert_closed(&mut self) {
        assert_eq!(
            self.reply().await,
            None,
            "expected the connection to be closed"
        );
    }
}

async fn connect(addr: SocketAddr) -> Client<TcpStream> {
    let mut client = Client::new(TcpStream::connect(addr).await.unwrap());
    let greeting = client.reply().await.expect("greeting");
    assert_eq!(greeting.code, 220, "{greeting:?}");
    client
}

async fn session(addr: SocketAddr) -> Client<TcpStream> {
    let mut client = connect(addr).await;
    client.expect("EHLO client.test", 250).await;
    client
}

fn dot_stuff(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at_line_start = true;
    for &b in message {
        if at_line_start && b == b'.' {
            out.push(b'.');
        }
        out.push(b);
        at_line_start = b == b'\n';
    }
    if !message.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

fn message(key: Option<&str>, body: &str) -> Vec<u8> {
    let mut m = String::from("From: app@example.com\r\nTo: user@example.com\r\nSubject: test\r\n");
    if let Some(key) = key {
        m.push_str(&format!("X-Bird-Idempotency-Key: {key}\r\n"));
    }
    m.push_str("\r\n");
    m.push_str(body);
    m.push_str("\r\n");
    m.into_bytes()
}

fn id_of(reply: &Reply) -> String {
    assert_eq!(reply.code, 250, "{reply:?}");
    reply.text.split_whitespace().nth(2).unwrap().to_string()
}

async fn start(config: SinkConfig) -> SinkHandle {
    Sink::start(config).await.unwrap()
}

// --- acceptance and bytes ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_bytes_exactly_several_per_connection_and_writes_maildir() {
    let dir = tempfile::tempdir().unwrap();
    let maildir = dir.path().join("mail");
    let sink = start(SinkConfig {
        maildir: Some(maildir.clone()),
        ..SinkConfig::default()
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;

    // Leading dots, a lone dot, a line of dots, and 8-bit bytes that are not UTF-8.
    let mut tricky = b"From: a@example.com\r\nSubject: dots\r\n\r\n.leading dot\r\n.\r\n..\r\n\
        ...three\r\nnot. a dot\r\n"
        .to_vec();
    tricky.extend_from_slice(b"caf\xe9 \xff\xfe 8-bit\r\n. \r\n");
    let first = c
        .submit(
            "a@example.com",
            &["b@example.com", "c@example.com"],
            &tricky,
        )
        .await
        .unwrap();
    let first_id = id_of(&first);
    assert_eq!(first.line(), format!("250 2.0.0 OK {first_id}"));

    // Pipelined: the whole transaction in one write, replies in order.
    let plain = message(None, "second message");
    let mut batch =
        b"MAIL FROM:<a@example.com> BODY=8BITMIME\r\nRCPT TO:<d@example.com>\r\nDATA\r\n".to_vec();
    batch.extend_from_slice(&dot_stuff(&plain));
    c.send(&batch).await;
    let codes: Vec<u16> = [
        c.reply().await.unwrap(),
        c.reply().await.unwrap(),
        c.reply().await.unwrap(),
        c.reply().await.unwrap(),
    ]
    .iter()
    .map(|r| r.code)
    .collect();
    assert_eq!(codes, vec![250, 250, 354, 250]);

    // No key: the same message is accepted again, every time.
    let again = c
        .submit("a@example.com", &["d@example.com"], &plain)
        .await
        .unwrap();
    assert_eq!(again.code, 250);
    c.expect("RSET", 250).await;
    c.expect("NOOP", 250).await;
    c.expect("QUIT", 221).await;

    let messages = sink.messages();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[0].id, first_id);
    assert_eq!(messages[0].bytes, tricky);
    assert_eq!(messages[0].rcpt_to, vec!["b@example.com", "c@example.com"]);
    assert_eq!(
        messages[0].blake3,
        blake3::hash(&tricky).to_hex().to_string()
    );
    assert!(!messages[0].eightbitmime);
    assert!(messages[1].eightbitmime);
    assert_eq!(messages[1].bytes, plain);
    assert_eq!(messages[2].bytes, plain);
    assert_ne!(messages[1].id, messages[2].id);
    assert_eq!(messages[0].key, None);

    let stats = sink.stats();
    assert_eq!(
        (stats.messages, stats.transactions, stats.connections),
        (3, 3, 1)
    );
    assert!(stats.keys.is_empty());

    // Maildir: one file per accepted message, exactly the bytes, no temporary files left.
    let mut names: Vec<String> = std::fs::read_dir(&maildir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut expected: Vec<String> = messages.iter().map(|m| format!("{}.eml", m.id)).collect();
    expected.sort();
    assert_eq!(names, expected);
    for m in &messages {
        let on_disk = std::fs::read(maildir.join(format!("{}.eml", m.id))).unwrap();
        assert_eq!(on_disk, m.bytes);
    }
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_what_a_strict_upstream_refuses() {
    let sink = start(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    c.expect("DATA", 503).await;
    c.expect("RCPT TO:<x@example.com>", 503).await;

    let mut long = message(None, "");
    long.extend(std::iter::repeat_n(b'x', 999));
    long.extend_from_slice(b"\r\n");
    let reply = c
        .submit("a@example.com", &["b@example.com"], &long)
        .await
        .unwrap();
    assert_eq!(reply.code, 550, "{reply:?}");

    let invalid_key = message(Some(""), "empty key");
    let reply = c
        .submit("a@example.com", &["b@example.com"], &invalid_key)
        .await
        .unwrap();
    assert_eq!(reply.code, 554);
    assert!(reply.text.contains("E01001"), "{reply:?}");

    // Bare LF inside DATA: refused and the connection closed, never a transaction.
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<b@example.com>", 250).await;
    c.expect("DATA", 354).await;
    c.send(b"Subject: x\r\n\r\nsmuggle\n.\r\n").await;
    let reply = c.reply().await.unwrap();
    assert_eq!(reply.code, 521);
    c.assert_closed().await;

    assert!(sink.messages().is_empty());
    let outcomes: Vec<Outcome> = sink.transactions().iter().map(|t| t.outcome).collect();
    assert_eq!(outcomes, vec![Outcome::Rejected, Outcome::InvalidKey]);
    sink.shutdown().await;
}

// --- idempotency ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_the_same_key_is_counted_once() {
    let sink = start(SinkConfig::default()).await;
    let msg = message(Some("order-1"), "hello");
    let mut c = session(sink.smtp_addr()).await;
    let first = c
        .submit("a@example.com", &["b@example.com", "c@example.com"], &msg)
        .await
        .unwrap();
    let id = id_of(&first);

    // Same connection, then a fresh one with the recipients in the other order.
    let second = c
        .submit("a@example.com", &["b@example.com", "c@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(
        second.line(),
        format!("250 2.0.0 OK {id} (idempotent replay)")
    );
    let mut c2 = session(sink.smtp_addr()).await;
    let third = c2
        .submit("a@example.com", &["c@example.com", "b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(
        third.line(),
        format!("250 2.0.0 OK {id} (idempotent replay)")
    );

    assert_eq!(sink.messages().len(), 1);
    let txns = sink.transactions();
    assert_eq!(txns.len(), 3);
    assert_eq!(
        txns.iter().map(|t| t.outcome).collect::<Vec<_>>(),
        vec![Outcome::Accepted, Outcome::Replayed, Outcome::Replayed]
    );
    assert!(txns
        .iter()
        .all(|t| t.bytes == msg && t.message_id.as_deref() == Some(&id)));
    assert_eq!(txns[1].reply.as_deref(), Some(second.line().as_str()));
    let stats = sink.stats();
    let k = &stats.keys["order-1"];
    assert_eq!((k.accepted, k.replayed, k.transactions), (1, 2, 3));
    assert_eq!((stats.messages, stats.transactions), (1, 3));
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_different_bytes_or_envelope_is_e01005() {
    let sink = start(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    let first = c
        .submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some("k-5"), "one"),
        )
        .await
        .unwrap();
    assert_eq!(first.code, 250);
    let changed_byte = c
        .submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some("k-5"), "One"),
        )
        .await
        .unwrap();
    assert_eq!(changed_byte.code, 554);
    assert!(changed_byte.text.starts_with("5.6.0 "), "{changed_byte:?}");
    assert!(changed_byte.text.contains("E01005"), "{changed_byte:?}");
    let other_rcpt = c
        .submit(
            "a@example.com",
            &["z@example.com"],
            &message(Some("k-5"), "one"),
        )
        .await
        .unwrap();
    assert!(other_rcpt.text.contains("E01005"), "{other_rcpt:?}");

    assert_eq!(sink.messages().len(), 1);
    let k = &sink.stats().keys["k-5"];
    assert_eq!((k.accepted, k.conflicts, k.transactions), (1, 2, 3));
    assert_eq!(sink.transactions()[1].outcome, Outcome::KeyReuse);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_window_the_key_is_a_new_operation() {
    let sink = start(SinkConfig {
        window: Duration::from_millis(300),
        ..SinkConfig::default()
    })
    .await;
    let msg = message(Some("short-lived"), "x");
    let mut c = session(sink.smtp_addr()).await;
    let first = id_of(
        &c.submit("a@example.com", &["b@example.com"], &msg)
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = id_of(
        &c.submit("a@example.com", &["b@example.com"], &msg)
            .await
            .unwrap(),
    );
    assert_ne!(first, second);
    assert_eq!(sink.messages().len(), 2);
    assert_eq!(sink.stats().keys["short-lived"].accepted, 2);
    sink.shutdown().await;
}

// --- faults -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_faults_at_every_phase() {
    let sink = start(SinkConfig::default()).await;
    let rules = [
        "phase=connect,action=reply,code=421,times=1",
        "phase=ehlo,action=reply,code=550,times=1",
        "phase=mail,action=reply,code=451,times=1,text=4.3.0 try later",
        "phase=rcpt,action=reply,code=550,rcpt=BAD@",
        "phase=data,action=reply,code=452,times=1",
        "phase=dot,action=reply,code=550,times=1,text=5.7.1 no, thank you",
    ];
    sink.set_faults(rules.iter().map(|r| r.parse().unwrap()).collect())
        .unwrap();

    let mut refused = Client::new(TcpStream::connect(sink.smtp_addr()).await.unwrap());
    let greeting = refused.reply().await.unwrap();
    assert_eq!(greeting.line(), "421 4.0.0 sink fault at connect");
    refused.assert_closed().await;

    let mut c = connect(sink.smtp_addr()).await;
    c.expect("EHLO client.test", 550).await;
    c.expect("EHLO client.test", 250).await;
    let mail = c.expect("MAIL FROM:<a@example.com>", 451).await;
    assert_eq!(mail.text, "4.3.0 try later");
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<bad@example.com>", 550).await;
    c.expect("RCPT TO:<good@example.com>", 250).await;
    c.expect("DATA", 452).await;
    c.expect("DATA", 354).await;
    let msg = message(Some("faulted"), "body");
    c.send(&dot_stuff(&msg)).await;
    let dot = c.reply().await.unwrap();
    assert_eq!(dot.line(), "550 5.7.1 no, thank you");

    // Nothing was committed: the retry is a first acceptance, not a replay.
    let retry = c
        .submit("a@example.com", &["good@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(retry.line(), format!("250 2.0.0 OK {}", id_of(&retry)));
    assert_eq!(sink.messages().len(), 1);
    let txns = sink.transactions();
    assert_eq!(txns[0].outcome, Outcome::Faulted);
    assert_eq!(txns[0].reply.as_deref(), Some("550 5.7.1 no, thank you"));
    assert_eq!(txns[0].bytes, msg);
    assert!(txns[0].fault.as_deref().unwrap().contains("action=reply"));
    assert_eq!(txns[1].outcome, Outcome::Accepted);
    let fired: Vec<u32> = sink.faults().iter().map(|s| s.fired).collect();
    assert_eq!(fired, vec![1, 1, 1, 1, 1, 1]);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_after_dot_commits_then_the_retry_replays() {
    let sink = start(SinkConfig {
        faults: vec!["phase=dot,action=drop,times=1,key=lost".parse().unwrap()],
        ..SinkConfig::default()
    })
    .await;
    let msg = message(Some("reply-lost-1"), "RFC 1047");
    let mut c = session(sink.smtp_addr()).await;
    assert_eq!(
        c.submit("a@example.com", &["b@example.com"], &msg).await,
        None
    );

    let messages = sink.messages();
    assert_eq!(messages.len(), 1, "the dropped message was committed");
    let txns = sink.transactions();
    assert_eq!(txns[0].outcome, Outcome::Accepted);
    assert_eq!(txns[0].reply, None);

    let mut c2 = session(sink.smtp_addr()).await;
    let retry = c2
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(
        retry.line(),
        format!("250 2.0.0 OK {} (idempotent replay)", messages[0].id)
    );
    let k = &sink.stats().keys["reply-lost-1"];
    assert_eq!((k.accepted, k.replayed, k.transactions), (1, 1, 2));
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_faults_accept_nothing() {
    let sink = start(SinkConfig {
        faults: vec![
            FaultRule::disconnect(Phase::Connect).with_times(1),
            FaultRule::disconnect(Phase::Rcpt).with_times(1),
            FaultRule::disconnect(Phase::Dot).with_times(1),
        ],
        ..SinkConfig::default()
    })
    .await;
    let mut no_greeting = Client::new(TcpStream::connect(sink.smtp_addr()).await.unwrap());
    no_greeting.assert_closed().await;

    let mut c = session(sink.smtp_addr()).await;
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.send(b"RCPT TO:<b@example.com>\r\n").await;
    c.assert_closed().await;

    let msg = message(Some("cut"), "x");
    let mut c = session(sink.smtp_addr()).await;
    assert_eq!(
        c.submit("a@example.com", &["b@example.com"], &msg).await,
        None
    );
    assert!(sink.messages().is_empty());
    let txns = sink.transactions();
    assert_eq!(
        (txns[0].outcome, txns[0].reply.as_deref()),
        (Outcome::Faulted, None)
    );

    let mut c = session(sink.smtp_addr()).await;
    let retry = c
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert!(!retry.text.contains("replay"), "{retry:?}");
    assert_eq!(sink.messages().len(), 1);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_reply_commits_first_and_holds_the_key_until_answered() {
    let delay = Duration::from_secs(3);
    let sink = start(SinkConfig {
        faults: vec![
            FaultRule::delay(Phase::Ehlo, Duration::from_millis(200)).with_times(1),
            FaultRule::delay(Phase::Dot, delay).with_times(1),
        ],
        ..SinkConfig::default()
    })
    .await;
    let addr = sink.smtp_addr();
    let msg = message(Some("slow-1"), "take your time");

    let mut a = connect(addr).await;
    let started = Instant::now();
    a.expect("EHLO client.test", 250).await;
    assert!(started.elapsed() >= Duration::from_millis(200));

    let msg_a = msg.clone();
    let slow = tokio::spawn(async move {
        let started = Instant::now();
        let reply = a.submit("a@example.com", &["b@example.com"], &msg_a).await;
        (reply, started.elapsed())
    });
    // The message counts as accepted while its reply is held back...
    let messages = sink.wait_for_messages(1, WAIT).await.unwrap();
    // ...and a retry meanwhile is told the first is still running (E01004).
    let mut b = session(addr).await;
    let busy = b
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(busy.code, 451, "{busy:?}");
    assert!(busy.text.contains("E01004"), "{busy:?}");

    let (reply, took) = slow.await.unwrap();
    let reply = reply.unwrap();
    assert!(took >= delay, "{took:?}");
    assert_eq!(reply.line(), format!("250 2.0.0 OK {}", messages[0].id));

    let replay = b
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert!(replay.text.ends_with("(idempotent replay)"), "{replay:?}");
    let k = &sink.stats().keys["slow-1"];
    assert_eq!(
        (k.accepted, k.in_progress, k.replayed, k.transactions),
        (1, 1, 1, 3)
    );
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_during_a_delay_still_had_its_message_accepted() {
    let sink = start(SinkConfig {
        faults: vec![FaultRule::delay(Phase::Dot, Duration::from_millis(500)).with_times(1)],
        ..SinkConfig::default()
    })
    .await;
    let msg = message(Some("timeout-1"), "x");
    let mut a = session(sink.smtp_addr()).await;
    a.expect("MAIL FROM:<a@example.com>", 250).await;
    a.expect("RCPT TO:<b@example.com>", 250).await;
    a.expect("DATA", 354).await;
    a.send(&dot_stuff(&msg)).await;
    let messages = sink.wait_for_messages(1, WAIT).await.unwrap();
    drop(a); // the relay's final-dot timeout fired

    let mut b = session(sink.smtp_addr()).await;
    let deadline = Instant::now() + WAIT;
    let reply = loop {
        let reply = b
            .submit("a@example.com", &["b@example.com"], &msg)
            .await
            .unwrap();
        if reply.code != 451 || Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        reply.line(),
        format!("250 2.0.0 OK {} (idempotent replay)", messages[0].id)
    );
    assert_eq!(sink.messages().len(), 1);
    sink.shutdown().await;
}

// --- down modes -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_modes_refuse_or_greet_421_and_come_back_on_the_same_port() {
    let sink = start(SinkConfig::default()).await;
    let addr = sink.smtp_addr();

    let mut open = session(addr).await;
    sink.pause(Down::Refuse).await.unwrap();
    open.assert_closed().await;
    let err = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);

    sink.resume().await.unwrap();
    let mut c = session(addr).await;
    let reply = c
        .submit("a@example.com", &["b@example.com"], &message(None, "back"))
        .await
        .unwrap();
    assert_eq!(reply.code, 250);

    sink.pause(Down::Greet421).await.unwrap();
    let reply = c.reply().await.unwrap();
    assert_eq!(reply.code, 421);
    assert!(reply.text.starts_with("4.3.2 "), "{reply:?}");
    c.assert_closed().await;
    let mut refused = Client::new(TcpStream::connect(addr).await.unwrap());
    let greeting = refused.reply().await.unwrap();
    assert_eq!(greeting.code, 421);
    assert!(greeting.text.starts_with("4.3.2 "));
    refused.assert_closed().await;

    // From Greet421 straight to Refuse and back.
    sink.pause(Down::Refuse).await.unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
    sink.resume().await.unwrap();
    session(addr).await.expect("QUIT", 221).await;
    assert_eq!(sink.messages().len(), 1);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_connections_and_the_port() {
    let sink = start(SinkConfig::default()).await;
    let addr = sink.smtp_addr();
    let mut c = session(addr).await;
    sink.shutdown().await;
    let bye = c.reply().await.unwrap();
    assert_eq!(bye.code, 421);
    c.assert_closed().await;
    assert!(TcpStream::connect(addr).await.is_err());
    // A second shutdown is harmless.
    sink.shutdown().await;
}

// --- TLS and AUTH -----------------------------------------------------------------------

struct Tls {
    _dir: tempfile::TempDir,
    paths: (std::path::PathBuf, std::path::PathBuf),
    connector: tokio_rustls::TlsConnector,
}

fn tls_setup() -> Tls {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    Tls {
        _dir: dir,
        paths: (cert, key),
        connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
    }
}

fn localhost() -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from("localhost").unwrap()
}

fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let mut n = [0u8; 3];
        n[..chunk.len()].copy_from_slice(chunk);
        let n = u32::from(n[0]) << 16 | u32::from(n[1]) << 8 | u32::from(n[2]);
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                A[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

fn has_line(reply: &Reply, want: &str) -> bool {
    reply.lines.iter().any(|l| &l[4..] == want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_then_auth_plain_and_login() {
    let tls = tls_setup();
    let sink = start(SinkConfig {
        tls: Some(tls.paths.clone()),
        require_auth: Some(("relay".into(), "s3cret".into())),
        ..SinkConfig::default()
    })
    .await;

    let mut plain = connect(sink.smtp_addr()).await;
    let ehlo = plain.expect("EHLO client.test", 250).await;
    assert!(has_line(&ehlo, "STARTTLS"), "{ehlo:?}");
    assert!(has_line(&ehlo, "AUTH PLAIN LOGIN"), "{ehlo:?}");
    for ext in ["PIPELINING", "8BITMIME", "SMTPUTF8", "ENHANCEDSTATUSCODES"] {
        assert!(has_line(&ehlo, ext), "{ext} missing from {ehlo:?}");
    }
    plain.expect("MAIL FROM:<a@example.com>", 530).await;
    // A command pipelined behind STARTTLS in plaintext must be thrown away: were it run
    // inside the TLS session, its reply (503, no EHLO yet) would come first and be read below
    // as the answer to EHLO.
    plain
        .send(b"STARTTLS\r\nMAIL FROM:<injected@example.com>\r\n")
        .await;
    assert_eq!(plain.reply().await.unwrap().code, 220);
    let stream = tls
        .connector
        .connect(localhost(), plain.stream)
        .await
        .unwrap();
    let mut c = Client::new(stream);
    let ehlo = c.expect("EHLO client.test", 250).await;
    assert!(!has_line(&ehlo, "STARTTLS"), "{ehlo:?}");
    c.expect("NOOP", 250).await;

    let wrong = c
        .cmd(&format!("AUTH PLAIN {}", b64(b"\0relay\0wrong")))
        .await;
    assert_eq!(wrong.line(), "535 5.7.8 Authentication credentials invalid");
    c.expect(&format!("AUTH PLAIN {}", b64(b"\0relay\0s3cret")), 235)
        .await;
    c.expect("AUTH PLAIN", 503).await;
    let msg = message(Some("tls-1"), "over TLS");
    let reply = c
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(reply.code, 250);
    c.expect("QUIT", 221).await;

    // AUTH LOGIN, in its two-step form, and PLAIN with the response on its own line.
    let mut plain = session(sink.smtp_addr()).await;
    plain.expect("STARTTLS", 220).await;
    let mut c = Client::new(
        tls.connector
            .connect(localhost(), plain.stream)
            .await
            .unwrap(),
    );
    c.expect("EHLO client.test", 250).await;
    assert_eq!(c.cmd("AUTH LOGIN").await.line(), "334 VXNlcm5hbWU6");
    assert_eq!(c.cmd(&b64(b"relay")).await.line(), "334 UGFzc3dvcmQ6");
    c.expect(&b64(b"nope"), 535).await;
    assert_eq!(c.cmd("AUTH PLAIN").await.code, 334);
    c.expect("*", 501).await;
    assert_eq!(
        c.cmd(&format!("AUTH LOGIN {}", b64(b"relay"))).await.code,
        334
    );
    c.expect(&b64(b"s3cret"), 235).await;

    let messages = sink.messages();
    assert_eq!(messages.len(), 1);
    assert!(messages[0].tls);
    assert_eq!(messages[0].auth_user.as_deref(), Some("relay"));
    assert_eq!(messages[0].bytes, msg);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implicit_tls() {
    let tls = tls_setup();
    let sink = start(SinkConfig {
        tls: Some(tls.paths.clone()),
        implicit_tls: true,
        ..SinkConfig::default()
    })
    .await;
    let tcp = TcpStream::connect(sink.smtp_addr()).await.unwrap();
    let mut c = Client::new(tls.connector.connect(localhost(), tcp).await.unwrap());
    assert_eq!(c.reply().await.unwrap().code, 220);
    let ehlo = c.expect("EHLO client.test", 250).await;
    assert!(!has_line(&ehlo, "STARTTLS"), "{ehlo:?}");
    c.expect("STARTTLS", 502).await;
    let reply = c
        .submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some("smtps"), "x"),
        )
        .await
        .unwrap();
    assert_eq!(reply.code, 250);
    assert!(sink.messages()[0].tls);
    sink.shutdown().await;
}

// --- HTTP API ---------------------------------------------------------------------------

/// One HTTP/1.1 request over a fresh connection; the status and the body.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: sink\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut response))
        .await
        .unwrap()
        .unwrap();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = String::from_utf8(response[..split].to_vec()).unwrap();
    let status = head[9..12].parse().unwrap();
    let body = response[split + 4..].to_vec();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    (status, body)
}

async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, "").await;
    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_reports_what_the_handle_reports() {
    let sink = start(SinkConfig {
        api: Some("127.0.0.1:0".parse().unwrap()),
        ..SinkConfig::default()
    })
    .await;
    let api = sink.api_addr().unwrap();
    let mut c = session(sink.smtp_addr()).await;
    let text = message(Some("api-1"), "plain text");
    c.submit("a@example.com", &["b@example.com"], &text)
        .await
        .unwrap();
    c.submit("a@example.com", &["b@example.com"], &text)
        .await
        .unwrap();
    let mut binary = message(None, "");
    binary.extend_from_slice(b"\xff\xfe binary\r\n");
    c.submit("a@example.com", &["c@example.com"], &binary)
        .await
        .unwrap();

    let listed = get_json(api, "/messages").await;
    let messages = sink.messages();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), messages.len());
    for (json, m) in listed.iter().zip(&messages) {
        assert_eq!(json["id"], m.id.as_str());
        assert_eq!(json["key"], serde_json::json!(m.key));
        assert_eq!(json["mail_from"], m.mail_from.as_str());
        assert_eq!(json["rcpt_to"], serde_json::json!(m.rcpt_to));
        assert_eq!(json["size"], m.bytes.len());
        assert_eq!(json["received_at"], m.received_at_ms);
        assert_eq!(json["blake3"], m.blake3.as_str());
        match std::str::from_utf8(&m.bytes) {
            Ok(body) => assert_eq!(json["body"], body),
            Err(_) => assert!(json.get("body").is_none()),
        }
        let (status, raw) = http(api, "GET", &format!("/messages/{}/raw", m.id), "").await;
        assert_eq!((status, raw), (200, m.bytes.clone()));
    }
    let filtered = get_json(api, "/messages?key=api-1").await;
    assert_eq!(filtered.as_array().unwrap().len(), 1);

    let stats = get_json(api, "/stats").await;
    assert_eq!(stats, serde_json::to_value(sink.stats()).unwrap());
    assert_eq!(stats["keys"]["api-1"]["accepted"], 1);
    assert_eq!(stats["keys"]["api-1"]["replayed"], 1);
    assert_eq!(stats["keys"]["api-1"]["transactions"], 2);
    assert_eq!(stats["messages"], 2);
    assert_eq!(stats["transactions"], 3);
    let counts = get_json(api, "/counts").await;
    assert_eq!(
        (
            &counts["messages"],
            &counts["transactions"],
            &counts["connections"]
        ),
        (
            &stats["messages"],
            &stats["transactions"],
            &stats["connections"]
        )
    );
    assert!(counts.get("keys").is_none());

    let txns = get_json(api, "/transactions").await;
    let outcomes: Vec<&str> = txns
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["accepted", "replayed", "accepted"]);

    // Faults: set over HTTP (both forms), see them fire over SMTP, then remove them.
    let (status, body) = http(
        api,
        "POST",
        "/faults",
        r#"[{"phase":"rcpt","action":"reply","code":451,"times":1},"phase=dot,action=drop,times=1"]"#,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(sink.faults().len(), 2);
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<b@example.com>", 451).await;
    c.expect("RSET", 250).await;
    let (status, _) = http(
        api,
        "POST",
        "/faults",
        r#"[{"phase":"rcpt","action":"drop"}]"#,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(sink.faults().len(), 2, "a refused update changes nothing");
    let faults = get_json(api, "/faults").await;
    assert_eq!(faults[0]["fired"], 1);
    assert_eq!(faults[1]["action"], "drop");
    let (status, _) = http(api, "DELETE", "/faults", "").await;
    assert_eq!(status, 204);
    assert!(sink.faults().is_empty());

    // Down and back up through the API.
    let (status, _) = http(api, "POST", "/pause?mode=refuse", "").await;
    assert_eq!(status, 204);
    assert!(TcpStream::connect(sink.smtp_addr()).await.is_err());
    let (status, _) = http(api, "POST", "/resume", "").await;
    assert_eq!(status, 204);

    let (status, _) = http(api, "POST", "/reset", "").await;
    assert_eq!(status, 204);
    assert!(sink.messages().is_empty());
    assert_eq!(get_json(api, "/messages").await, serde_json::json!([]));
    assert_eq!(get_json(api, "/stats").await["transactions"], 0);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maildir_that_cannot_be_written_refuses_instead_of_lying() {
    let dir = tempfile::tempdir().unwrap();
    let maildir = dir.path().join("mail");
    let sink = start(SinkConfig {
        maildir: Some(maildir.clone()),
        ..SinkConfig::default()
    })
    .await;
    // Replace the directory by a file: every write fails.
    std::fs::remove_dir(&maildir).unwrap();
    std::fs::write(&maildir, b"not a directory").unwrap();
    let msg = message(Some("disk-1"), "x");
    let mut c = session(sink.smtp_addr()).await;
    let reply = c
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(reply.code, 451, "{reply:?}");
    assert!(sink.messages().is_empty());

    // Once storage works again the key is free: a first acceptance, not a replay.
    std::fs::remove_file(&maildir).unwrap();
    std::fs::create_dir(&maildir).unwrap();
    let reply = c
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(reply.line(), format!("250 2.0.0 OK {}", id_of(&reply)));
    sink.shutdown().await;
}
