//! The test upstream (`idemrelay sink`) over real sockets: byte-exact acceptance, the
//! idempotency answers, every fault kind, the down modes, STARTTLS/implicit TLS with AUTH, the
//! HTTP API and the maildir output. The SMTP and HTTP clients are deliberately minimal and
//! local to this file.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemrelay_sink::{
    AttemptOutcome, DotDecision, Down, EventType, FaultRule, FaultStage, RetryPolicy, Sink,
    SinkConfig, SinkHandle, WebhookAttempt, WebhookConfig,
};
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

/// A sink with its HTTP API on an ephemeral port, and the API's address.
async fn start_with_api(config: SinkConfig) -> (SinkHandle, SocketAddr) {
    let sink = start(SinkConfig {
        api: Some("127.0.0.1:0".parse().unwrap()),
        ..config
    })
    .await;
    let api = sink.api_addr().unwrap();
    (sink, api)
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
    let outcomes: Vec<DotDecision> = sink.transactions().iter().map(|t| t.outcome).collect();
    assert_eq!(
        outcomes,
        vec![DotDecision::Rejected, DotDecision::InvalidKey]
    );
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
        vec![
            DotDecision::Accepted,
            DotDecision::Replayed,
            DotDecision::Replayed
        ]
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
    assert_eq!(sink.transactions()[1].outcome, DotDecision::KeyReuse);
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
    assert_eq!(txns[0].outcome, DotDecision::Faulted);
    assert_eq!(txns[0].reply.as_deref(), Some("550 5.7.1 no, thank you"));
    assert_eq!(txns[0].bytes, msg);
    assert!(txns[0].fault.as_deref().unwrap().contains("action=reply"));
    assert_eq!(txns[1].outcome, DotDecision::Accepted);
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
    assert_eq!(txns[0].outcome, DotDecision::Accepted);
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
            FaultRule::disconnect(FaultStage::Connect).with_times(1),
            FaultRule::disconnect(FaultStage::Rcpt).with_times(1),
            FaultRule::disconnect(FaultStage::Dot).with_times(1),
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
        (DotDecision::Faulted, None)
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
            FaultRule::delay(FaultStage::Ehlo, Duration::from_millis(200)).with_times(1),
            FaultRule::delay(FaultStage::Dot, delay).with_times(1),
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
        faults: vec![FaultRule::delay(FaultStage::Dot, Duration::from_millis(500)).with_times(1)],
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

/// Unix milliseconds as the API writes times: RFC 3339, UTC, milliseconds.
fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, "").await;
    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_reports_what_the_handle_reports() {
    let (sink, api) = start_with_api(SinkConfig::default()).await;
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
        assert_eq!(json["received_at_ms"], m.received_at_ms);
        assert_eq!(json["received_at"], rfc3339(m.received_at_ms));
        assert_eq!(json["blake3"], m.blake3.as_str());
        // A list leaves the bytes out; they are one request away.
        assert!(json.get("body").is_none(), "{json}");
        let raw_path = format!("/messages/{}/raw", m.id);
        assert_eq!(json["raw"], raw_path.as_str());
        let (status, raw) = http(api, "GET", &raw_path, "").await;
        assert_eq!((status, raw), (200, m.bytes.clone()));
        // The message by id: the same fields, and the bytes as `body` when they are UTF-8.
        let one = get_json(api, &format!("/messages/{}", m.id)).await;
        for field in [
            "id",
            "key",
            "rcpt_to",
            "size",
            "blake3",
            "received_at",
            "raw",
        ] {
            assert_eq!(one[field], json[field], "{field}");
        }
        match std::str::from_utf8(&m.bytes) {
            Ok(body) => assert_eq!(one["body"], body),
            Err(_) => assert!(one.get("body").is_none()),
        }
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
    for (json, t) in txns.as_array().unwrap().iter().zip(sink.transactions()) {
        assert_eq!(json["received_at"], rfc3339(t.received_at_ms));
    }

    // Faults: added over HTTP (both forms), see them fire over SMTP, then remove them.
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

/// The ids of a `/messages` answer, in order.
fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

/// A status and a JSON `{"error": ...}` body that says something.
async fn json_error(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, response) = http(addr, method, path, body).await;
    let json: Value = serde_json::from_slice(&response).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: {status} with a body that is not JSON ({e}): {}",
            String::from_utf8_lossy(&response)
        )
    });
    let error = json["error"].as_str().unwrap_or_else(|| panic!("{json}"));
    assert!(!error.is_empty());
    (status, error.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_finds_messages_by_key_recipient_and_text_and_refuses_unknown_filters() {
    let (sink, api) = start_with_api(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    let invoice = "From: app@example.com\r\nSubject: Invoice 42\r\n\
                   X-Bird-Idempotency-Key: inv-42\r\n\r\nPlease pay by Friday.\r\n";
    // The subject as an encoded word and the body in base64: searched decoded.
    let greeting = "From: app@example.com\r\nSubject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\n\
                    MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
                    Content-Transfer-Encoding: base64\r\n\r\naGVsbG8gd29ybGQ=\r\n";
    let inv = id_of(
        &c.submit(
            "a@example.com",
            &["Bob@Example.com", "carol@example.org"],
            invoice.as_bytes(),
        )
        .await
        .unwrap(),
    );
    let greet = id_of(
        &c.submit("a@example.com", &["dave@example.net"], greeting.as_bytes())
            .await
            .unwrap(),
    );

    let all = get_json(api, "/messages").await;
    assert_eq!(ids(&all), [inv.clone(), greet.clone()]);
    assert_eq!(all[0]["subject"], "Invoice 42");
    assert_eq!(all[1]["subject"], "Grüße");
    let cases: &[(&str, &[&String])] = &[
        ("key=inv-42", &[&inv]),
        ("key=inv", &[]),
        ("rcpt=bob%40example.COM", &[&inv]),
        ("rcpt=example.", &[&inv, &greet]),
        ("rcpt=nobody", &[]),
        ("text=invoice", &[&inv]),
        ("text=PAY%20BY", &[&inv]),
        ("text=gr%C3%BC%C3%9Fe", &[&greet]),
        ("text=hello%20world", &[&greet]),
        ("key=inv-42&text=hello", &[]),
        ("rcpt=dave&text=world", &[&greet]),
    ];
    for (query, want) in cases {
        let got = get_json(api, &format!("/messages?{query}")).await;
        let want: Vec<String> = want.iter().map(|id| id.to_string()).collect();
        assert_eq!(ids(&got), want, "?{query}");
    }

    // A filter the sink does not know is refused, never ignored.
    for query in ["recipient=bob", "to=bob", "key=a&key=b"] {
        let (status, error) = json_error(api, "GET", &format!("/messages?{query}"), "").await;
        assert_eq!(status, 400, "?{query}: {error}");
    }
    let (_, error) = json_error(api, "GET", "/messages?recipient=bob", "").await;
    assert!(
        error.contains("recipient") && error.contains("rcpt"),
        "{error}"
    );
    let (status, _) = json_error(api, "GET", "/transactions?rcpt=bob", "").await;
    assert_eq!(status, 400);
    let (status, _) = json_error(api, "GET", "/webhooks?text=x", "").await;
    assert_eq!(status, 400);

    // Unknown ids and paths: 404 with a JSON body.
    let (status, error) = json_error(api, "GET", "/messages/S999", "").await;
    assert_eq!(status, 404);
    assert!(error.contains("S999"), "{error}");
    let (status, _) = json_error(api, "GET", "/messages/S999/raw", "").await;
    assert_eq!(status, 404);
    let (status, _) = json_error(api, "GET", "/nothing/here", "").await;
    assert_eq!(status, 404);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_post_adds_fault_rules_and_put_replaces_them() {
    let (sink, api) = start_with_api(SinkConfig {
        faults: vec!["phase=mail,action=reply,code=451,times=1".parse().unwrap()],
        ..SinkConfig::default()
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;
    c.expect("MAIL FROM:<a@example.com>", 451).await;

    // POST adds after the active rules, whose fire counts go on.
    let (status, body) = http(
        api,
        "POST",
        "/faults",
        r#"["phase=rcpt,action=reply,code=452,times=1"]"#,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let rules: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(rules.as_array().unwrap().len(), 2);
    assert_eq!(
        (&rules[0]["phase"], &rules[0]["fired"]),
        (&"mail".into(), &1.into())
    );
    assert_eq!(
        (&rules[1]["phase"], &rules[1]["fired"]),
        (&"rcpt".into(), &0.into())
    );
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<b@example.com>", 452).await;
    c.expect("RSET", 250).await;

    // A bad rule in a POST adds nothing, not even the good one before it.
    let (status, error) = json_error(
        api,
        "POST",
        "/faults",
        r#"["phase=data,action=disconnect", {"phase":"rcpt","action":"drop"}]"#,
    )
    .await;
    assert_eq!(status, 400);
    assert!(error.starts_with("rule 1:"), "{error}");
    assert_eq!(sink.faults().len(), 2);

    // PUT replaces them all, counts starting over.
    let (status, body) = http(
        api,
        "PUT",
        "/faults",
        r#"[{"phase":"data","action":"reply","code":554,"text":"5.7.1 no"}]"#,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let faults = get_json(api, "/faults").await;
    assert_eq!(faults.as_array().unwrap().len(), 1);
    assert_eq!(
        (&faults[0]["phase"], &faults[0]["fired"]),
        (&"data".into(), &0.into())
    );
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<b@example.com>", 250).await;
    c.expect("DATA", 554).await;
    sink.shutdown().await;
}

/// The sink's API has no authentication, so a web page in the tester's browser must not drive
/// it: a form or `no-cors` fetch from another origin is refused (nothing reset, no rule
/// added), and so is a request naming a host in someone's DNS (rebinding). curl-like clients,
/// which send no Origin, pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_refuses_other_sites_and_rebinding() {
    let (sink, api) = start_with_api(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    c.submit(
        "a@example.com",
        &["b@example.com"],
        &message(Some("x-1"), "x"),
    )
    .await
    .unwrap();
    let send = |method: &'static str,
                path: &'static str,
                headers: Vec<(&'static str, String)>,
                body: &'static str| async move {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        crate::common::http::send(
            api,
            method,
            path,
            &headers,
            crate::common::http::Body::Bytes(body.as_bytes()),
        )
        .await
    };
    let evil = || ("Origin", "http://evil.example".to_string());
    let form = (
        "Content-Type",
        "application/x-www-form-urlencoded".to_string(),
    );
    let reset = send(
        "POST",
        "/reset",
        vec![
            evil(),
            form.clone(),
            ("Sec-Fetch-Site", "cross-site".into()),
        ],
        "",
    )
    .await;
    assert_eq!(reset.status, 403, "{}", reset.body);
    let rule = send(
        "POST",
        "/faults",
        vec![evil(), ("Content-Type", "text/plain".into())],
        r#"[{"phase":"dot","action":"drop"}]"#,
    )
    .await;
    assert_eq!(rule.status, 403, "{}", rule.body);
    let rebound = send(
        "GET",
        "/messages",
        vec![("Host", "rebind.attacker.example:80".into())],
        "",
    )
    .await;
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert_eq!(sink.messages().len(), 1, "the reset went through");
    assert!(sink.faults().is_empty(), "the rule was added");
    // The sink's own page and local tools still work.
    let own = send(
        "POST",
        "/reset",
        vec![
            ("Origin", format!("http://{api}")),
            ("Sec-Fetch-Site", "same-origin".into()),
        ],
        "",
    )
    .await;
    assert_eq!(own.status, 204, "{}", own.body);
    assert_eq!(http(api, "GET", "/messages", "").await.0, 200);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reset_also_empties_the_maildir() {
    let dir = tempfile::tempdir().unwrap();
    let maildir = dir.path().join("mail");
    let (sink, api) = start_with_api(SinkConfig {
        maildir: Some(maildir.clone()),
        ..SinkConfig::default()
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;
    for key in ["m-1", "m-2"] {
        c.submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some(key), key),
        )
        .await
        .unwrap();
    }
    // Files the sink did not write stay, messages included: a reset is one HTTP request and
    // the directory may be anyone's.
    std::fs::write(maildir.join("notes.txt"), "kept").unwrap();
    std::fs::write(maildir.join("someone-elses.eml"), "kept").unwrap();
    let eml = |dir: &std::path::Path| -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "eml")
            })
            .count()
    };
    assert_eq!(eml(&maildir), 3);

    let (status, _) = http(api, "POST", "/reset", "").await;
    assert_eq!(status, 204);
    assert_eq!(eml(&maildir), 1);
    assert!(maildir.join("notes.txt").exists());
    assert!(maildir.join("someone-elses.eml").exists());
    assert_eq!(get_json(api, "/messages").await, serde_json::json!([]));

    // The sink goes on writing there after a reset.
    let id = id_of(
        &c.submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some("m-3"), "x"),
        )
        .await
        .unwrap(),
    );
    assert!(maildir.join(format!("{id}.eml")).exists());
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

// --- webhooks ---------------------------------------------------------------------------
//
// A small webhook receiver in the test: it records every request, answers 500 to the first
// posts of each webhook-id when told to, and checks signatures with its own code (ring's HMAC
// over `id.timestamp.body`, as Standard Webhooks define it).

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OTHER_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

#[derive(Debug, Clone)]
struct Hook {
    path: String,
    webhook_id: String,
    timestamp: String,
    signature: String,
    content_type: String,
    body: Vec<u8>,
    at: Instant,
    answered: u16,
}

impl Hook {
    fn events(&self) -> Vec<Value> {
        match serde_json::from_slice(&self.body).unwrap() {
            Value::Array(events) => events,
            other => panic!("expected a JSON array, got {other}"),
        }
    }

    fn event_type(&self) -> String {
        self.webhook_id.rsplit('_').next().unwrap().to_string()
    }
}

/// True when one `v1,` entry of the signature header is the HMAC of `id.timestamp.body`
/// under `secret`.
fn signature_verifies(secret: &str, hook: &Hook) -> bool {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let mut signed = format!("{}.{}.", hook.webhook_id, hook.timestamp).into_bytes();
    signed.extend_from_slice(&hook.body);
    hook.signature
        .split(' ')
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .any(|sig| {
            b64.decode(sig)
                .is_ok_and(|tag| ring::hmac::verify(&key, &signed, &tag).is_ok())
        })
}

#[derive(Default)]
struct ReceiverState {
    hooks: std::sync::Mutex<Vec<Hook>>,
    /// The first this-many posts of each webhook-id get 500.
    fail_first: std::sync::atomic::AtomicU32,
}

#[derive(Clone)]
struct Receiver {
    addr: SocketAddr,
    state: Arc<ReceiverState>,
}

impl Receiver {
    async fn start() -> Receiver {
        use axum::extract::State;
        use axum::http::{HeaderMap, StatusCode, Uri};
        let state = Arc::new(ReceiverState::default());
        async fn receive(
            State(state): State<Arc<ReceiverState>>,
            uri: Uri,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> StatusCode {
            let header = |name: &str| {
                headers
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default()
            };
            let mut hooks = state.hooks.lock().unwrap();
            let webhook_id = header("webhook-id");
            let earlier = hooks.iter().filter(|h| h.webhook_id == webhook_id).count();
            let fail_first = state.fail_first.load(std::sync::atomic::Ordering::SeqCst);
            let answered = if (earlier as u32) < fail_first {
                500
            } else {
                200
            };
            hooks.push(Hook {
                path: uri.path().to_string(),
                webhook_id,
                timestamp: header("webhook-timestamp"),
                signature: header("webhook-signature"),
                content_type: header("content-type"),
                body: body.to_vec(),
                at: Instant::now(),
                answered,
            });
            StatusCode::from_u16(answered).unwrap()
        }
        let router = axum::Router::new()
            .fallback(axum::routing::post(receive))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Receiver { addr, state }
    }

    fn url(&self) -> url::Url {
        format!("http://{}/webhooks/upstream", self.addr)
            .parse()
            .unwrap()
    }

    fn fail_first(&self, n: u32) {
        self.state
            .fail_first
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    fn hooks(&self) -> Vec<Hook> {
        self.state.hooks.lock().unwrap().clone()
    }

    /// Waits for at least `n` requests; returns them all.
    async fn wait_for(&self, n: usize) -> Vec<Hook> {
        let deadline = Instant::now() + WAIT;
        loop {
            let hooks = self.hooks();
            if hooks.len() >= n {
                return hooks;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} webhook requests, got {}: {hooks:#?}",
                hooks.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The requests about the sink message `id`, in arrival order.
    fn hooks_for(&self, id: &str) -> Vec<Hook> {
        let prefix = format!("msg_{id}_");
        self.hooks()
            .into_iter()
            .filter(|h| h.webhook_id.starts_with(&prefix))
            .collect()
    }
}

fn webhook_sink(receiver: &Receiver, tune: impl FnOnce(&mut WebhookConfig)) -> SinkConfig {
    let mut webhook = WebhookConfig::new(receiver.url(), vec![SECRET.parse().unwrap()]);
    webhook.retry = RetryPolicy {
        first: Duration::from_millis(30),
        max_delay: Duration::from_millis(200),
        max_attempts: 5,
        deadline: Duration::from_secs(10),
    };
    tune(&mut webhook);
    SinkConfig {
        webhook: Some(webhook),
        ..SinkConfig::default()
    }
}

fn message_with_id(key: Option<&str>, message_id: Option<&str>, body: &str) -> Vec<u8> {
    let mut m = String::from("From: app@example.com\r\nTo: user@example.com\r\nSubject: hooks\r\n");
    if let Some(id) = message_id {
        m.push_str(&format!("Message-ID: {id}\r\n"));
    }
    if let Some(key) = key {
        m.push_str(&format!("X-Bird-Idempotency-Key: {key}\r\n"));
    }
    m.push_str("\r\n");
    m.push_str(body);
    m.push_str("\r\n");
    m.into_bytes()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn event_time(event: &Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(event["timestamp"].as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_send_injection_then_delivery_per_recipient_signed() {
    let receiver = Receiver::start().await;
    let sink = start(webhook_sink(&receiver, |_| {})).await;
    let mut c = session(sink.smtp_addr()).await;
    let msg = message_with_id(Some("wh-order-1"), Some("<order-1@shop.example>"), "hello");
    let rcpts = ["first@example.net", "second@example.org"];
    let accepted_at = std::time::SystemTime::now();
    let reply = c.submit("app@example.com", &rcpts, &msg).await.unwrap();
    let id = id_of(&reply);

    let hooks = receiver.wait_for(2).await;
    assert_eq!(hooks.len(), 2, "{hooks:#?}");
    let (injection, delivery) = (&hooks[0], &hooks[1]);
    assert_eq!(injection.webhook_id, format!("msg_{id}_injection"));
    assert_eq!(delivery.webhook_id, format!("msg_{id}_delivery"));
    for hook in &hooks {
        assert_eq!(hook.path, "/webhooks/upstream");
        assert_eq!(hook.content_type, "application/json");
        assert!(signature_verifies(SECRET, hook), "{hook:?}");
        assert!(!signature_verifies(OTHER_SECRET, hook), "{hook:?}");
        let ts: i64 = hook.timestamp.parse().unwrap();
        assert!((ts - unix_now()).abs() <= 5, "webhook-timestamp {ts}");
        // A byte changed anywhere breaks the signature.
        let mut tampered = hook.clone();
        tampered.body[3] ^= 1;
        assert!(!signature_verifies(SECRET, &tampered));
        let mut replayed = hook.clone();
        replayed.timestamp = (ts + 1).to_string();
        assert!(!signature_verifies(SECRET, &replayed));
    }
    // The delivery comes a moment (200 ms by default) after the injection.
    let gap = delivery.at - injection.at;
    assert!(gap >= Duration::from_millis(150), "{gap:?}");

    for (hook, event_type) in [(injection, "injection"), (delivery, "delivery")] {
        let events = hook.events();
        let to: Vec<&str> = events
            .iter()
            .map(|e| e["rcpt_to"].as_str().unwrap())
            .collect();
        assert_eq!(to, rcpts, "one event per recipient, in RCPT order");
        for event in &events {
            let keys: Vec<&str> = event
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            let mut want = vec![
                "headers",
                "idempotency_key",
                "message_id",
                "rcpt_to",
                "timestamp",
                "type",
            ];
            want.sort();
            assert_eq!(keys, want, "{event}");
            assert_eq!(event["type"], event_type);
            assert_eq!(event["idempotency_key"], "wh-order-1");
            assert_eq!(event["message_id"], id.as_str());
            assert_eq!(event["headers"]["message-id"], "<order-1@shop.example>");
        }
    }
    let injected_at = event_time(&injection.events()[0]);
    let delivered_at = event_time(&delivery.events()[0]);
    assert_eq!(
        delivered_at.duration_since(injected_at).unwrap(),
        Duration::from_millis(200)
    );
    let skew = injected_at
        .duration_since(accepted_at)
        .unwrap_or_else(|e| e.duration());
    assert!(skew < Duration::from_secs(2), "{skew:?}");

    // A replay is not a new message: no new events. A message without key or Message-ID
    // gets nulls.
    let replay = c.submit("app@example.com", &rcpts, &msg).await.unwrap();
    assert!(replay.text.ends_with("(idempotent replay)"), "{replay:?}");
    let plain = c
        .submit(
            "app@example.com",
            &["x@example.net"],
            &message(None, "no key"),
        )
        .await
        .unwrap();
    let plain_id = id_of(&plain);
    let hooks = receiver.wait_for(4).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(receiver.hooks().len(), 4, "{hooks:#?}");
    let plain_hooks = receiver.hooks_for(&plain_id);
    assert_eq!(plain_hooks.len(), 2);
    let event = &plain_hooks[0].events()[0];
    assert_eq!(event["idempotency_key"], Value::Null);
    assert_eq!(event["headers"]["message-id"], Value::Null);

    let attempts = sink.webhooks();
    assert_eq!(attempts.len(), 4);
    assert!(attempts.iter().all(|a| a.status == Some(200)
        && a.outcome == AttemptOutcome::Delivered
        && a.attempt == 1));
    assert_eq!(attempts[0].key.as_deref(), Some("wh-order-1"));
    assert_eq!(attempts[0].events, 2);
    let stats = sink
        .wait_until(WAIT, |s| s.webhooks.pending == 0)
        .await
        .unwrap();
    assert_eq!(
        (
            stats.webhooks.batches,
            stats.webhooks.attempts,
            stats.webhooks.delivered,
            stats.webhooks.failed,
            stats.webhooks.dropped
        ),
        (4, 4, 4, 0, 0)
    );
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_retry_after_500_with_the_same_id_and_body() {
    let receiver = Receiver::start().await;
    receiver.fail_first(2);
    let sink = start(webhook_sink(&receiver, |_| {})).await;
    let mut c = session(sink.smtp_addr()).await;
    let reply = c
        .submit(
            "app@example.com",
            &["a@example.net"],
            &message(Some("wh-retry"), "x"),
        )
        .await
        .unwrap();
    let id = id_of(&reply);
    receiver.wait_for(6).await;
    sink.wait_until(WAIT, |s| s.webhooks.pending == 0)
        .await
        .unwrap();
    for event_type in ["injection", "delivery"] {
        let posts: Vec<Hook> = receiver
            .hooks_for(&id)
            .into_iter()
            .filter(|h| h.event_type() == event_type)
            .collect();
        let answers: Vec<u16> = posts.iter().map(|h| h.answered).collect();
        assert_eq!(answers, [500, 500, 200], "{event_type}");
        for post in &posts {
            assert_eq!(post.webhook_id, posts[0].webhook_id);
            assert_eq!(post.body, posts[0].body);
            assert!(signature_verifies(SECRET, post));
        }
        // Backoff: the retries do not come at once.
        assert!(posts[2].at - posts[0].at >= Duration::from_millis(30));
        let attempts: Vec<(u32, Option<u16>, AttemptOutcome)> = sink
            .webhooks()
            .into_iter()
            .filter(|a| a.event_type.as_str() == event_type)
            .map(|a| (a.attempt, a.status, a.outcome))
            .collect();
        assert_eq!(
            attempts,
            [
                (1, Some(500), AttemptOutcome::Retrying),
                (2, Some(500), AttemptOutcome::Retrying),
                (3, Some(200), AttemptOutcome::Delivered),
            ]
        );
    }
    let stats = sink.stats().webhooks;
    assert_eq!((stats.attempts, stats.delivered, stats.failed), (6, 2, 0));
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_give_up_after_their_attempts_and_never_delay_smtp() {
    // Nothing listens here: every post fails to connect.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url: url::Url = format!("http://{}/hook", dead.local_addr().unwrap())
        .parse()
        .unwrap();
    drop(dead);
    let receiver = Receiver::start().await;
    let sink = start(webhook_sink(&receiver, |w| {
        w.url = dead_url;
        w.retry.max_attempts = 3;
        w.delivery_delay = Duration::from_millis(50);
    }))
    .await;
    let mut c = session(sink.smtp_addr()).await;
    c.submit(
        "app@example.com",
        &["a@example.net"],
        &message(Some("wh-dead"), "x"),
    )
    .await
    .unwrap();
    let stats = sink
        .wait_until(WAIT, |s| s.webhooks.failed == 2 && s.webhooks.pending == 0)
        .await
        .unwrap();
    assert_eq!(stats.webhooks.attempts, 6);
    let attempts = sink.webhooks();
    for event_type in [EventType::Injection, EventType::Delivery] {
        let mine: Vec<&WebhookAttempt> = attempts
            .iter()
            .filter(|a| a.event_type == event_type)
            .collect();
        let outcomes: Vec<AttemptOutcome> = mine.iter().map(|a| a.outcome).collect();
        assert_eq!(
            outcomes,
            [
                AttemptOutcome::Retrying,
                AttemptOutcome::Retrying,
                AttemptOutcome::GaveUp
            ]
        );
        for a in mine {
            assert_eq!(a.status, None);
            assert!(a.error.as_deref().unwrap().starts_with("connect"), "{a:?}");
        }
    }

    // A receiver that accepts the connection and never answers: the dot is still answered
    // at once, since posting happens beside the SMTP session.
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_url: url::Url = format!("http://{}/hook", hang.local_addr().unwrap())
        .parse()
        .unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = hang.accept().await {
            open.push(stream);
        }
    });
    let slow = start(webhook_sink(&receiver, |w| {
        w.url = hang_url;
        w.delivery_delay = Duration::ZERO;
    }))
    .await;
    let mut c = session(slow.smtp_addr()).await;
    for i in 0..5 {
        let started = Instant::now();
        let reply = c
            .submit(
                "app@example.com",
                &["a@example.net"],
                &message(Some(&format!("wh-hang-{i}")), "x"),
            )
            .await
            .unwrap();
        assert_eq!(reply.code, 250);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    slow.wait_until(WAIT, |s| s.webhooks.pending == 10)
        .await
        .unwrap();
    assert!(slow.webhooks().is_empty(), "nothing has answered yet");
    slow.shutdown().await;
    held.abort();
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_fault_rules_duplicate_reorder_late_and_lose_ack() {
    let receiver = Receiver::start().await;
    let sink = start(SinkConfig {
        faults: vec![
            "phase=webhook,action=duplicate,times=1,key=dup"
                .parse()
                .unwrap(),
            "phase=webhook,action=reorder,key=reo".parse().unwrap(),
            "phase=webhook,action=late,ms=700,times=1,key=late"
                .parse()
                .unwrap(),
            "phase=webhook,action=lose_ack,times=1,key=lose"
                .parse()
                .unwrap(),
        ],
        ..webhook_sink(&receiver, |_| {})
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;
    let mut ids = std::collections::BTreeMap::new();
    let mut accepted = std::collections::BTreeMap::new();
    for key in ["dup-1", "reo-1", "late-1", "lose-1", "plain-1"] {
        accepted.insert(key, Instant::now());
        let reply = c
            .submit(
                "app@example.com",
                &["a@example.net"],
                &message(Some(key), key),
            )
            .await
            .unwrap();
        ids.insert(key, id_of(&reply));
    }
    // dup and lose: injection twice, delivery once; the others two each.
    receiver.wait_for(12).await;
    sink.wait_until(WAIT, |s| s.webhooks.pending == 0)
        .await
        .unwrap();
    let types = |key: &str| -> Vec<String> {
        receiver
            .hooks_for(&ids[key])
            .iter()
            .map(Hook::event_type)
            .collect()
    };
    assert_eq!(types("dup-1"), ["injection", "injection", "delivery"]);
    assert_eq!(types("reo-1"), ["delivery", "injection"]);
    assert_eq!(types("late-1"), ["delivery", "injection"]);
    assert_eq!(types("lose-1"), ["injection", "injection", "delivery"]);
    assert_eq!(types("plain-1"), ["injection", "delivery"]);
    assert_eq!(receiver.hooks().len(), 12);

    // The same batch twice is the same request, byte for byte, under the same id.
    for key in ["dup-1", "lose-1"] {
        let hooks = receiver.hooks_for(&ids[key]);
        assert_eq!(hooks[0].webhook_id, hooks[1].webhook_id);
        assert_eq!(hooks[0].body, hooks[1].body);
        assert!(hooks.iter().all(|h| signature_verifies(SECRET, h)));
    }
    let late = receiver.hooks_for(&ids["late-1"]);
    let held = late[1].at - accepted["late-1"];
    assert!(held >= Duration::from_millis(700), "{held:?}");

    let attempts_of = |key: &str| -> Vec<(String, u32, u32, AttemptOutcome)> {
        sink.webhooks()
            .into_iter()
            .filter(|a| a.message_id == ids[key])
            .map(|a| {
                (
                    a.event_type.as_str().to_string(),
                    a.copy,
                    a.attempt,
                    a.outcome,
                )
            })
            .collect()
    };
    use AttemptOutcome::{AckLost, Delivered};
    assert_eq!(
        attempts_of("dup-1"),
        [
            ("injection".into(), 1, 1, Delivered),
            ("injection".into(), 2, 1, Delivered),
            ("delivery".into(), 1, 1, Delivered),
        ]
    );
    assert_eq!(
        attempts_of("lose-1"),
        [
            ("injection".into(), 1, 1, AckLost),
            ("injection".into(), 1, 2, Delivered),
            ("delivery".into(), 1, 1, Delivered),
        ]
    );
    let lost = sink
        .webhooks()
        .into_iter()
        .find(|a| a.outcome == AckLost)
        .unwrap();
    assert_eq!(lost.status, Some(200));
    assert_eq!(
        lost.fault.as_deref(),
        Some("phase=webhook,action=lose_ack,times=1,key=lose")
    );
    let fired: Vec<u32> = sink.faults().iter().map(|r| r.fired).collect();
    assert_eq!(
        fired,
        [1, 1, 1, 1],
        "reorder fires on injection batches only"
    );
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_bounce_matching_recipients_and_follow_a_dropped_reply() {
    let receiver = Receiver::start().await;
    let sink = start(SinkConfig {
        faults: vec![FaultRule::drop_after_dot().with_times(1)],
        ..webhook_sink(&receiver, |w| w.bounce = vec!["unknown@".into()])
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;
    let msg = message_with_id(Some("wh-bounce"), Some("<b@shop.example>"), "x");
    let rcpts = ["ok@example.net", "Unknown@example.net"];
    // The reply to the dot is lost, but the message was committed: its events still come.
    assert_eq!(c.submit("app@example.com", &rcpts, &msg).await, None);
    let id = sink.wait_for_messages(1, WAIT).await.unwrap()[0].id.clone();
    receiver.wait_for(3).await;
    sink.wait_until(WAIT, |s| s.webhooks.pending == 0)
        .await
        .unwrap();
    let mut hooks = receiver.hooks_for(&id);
    // Delivery and bounce are due at the same moment, and race.
    hooks[1..].sort_by_key(Hook::event_type);
    let types: Vec<String> = hooks.iter().map(Hook::event_type).collect();
    assert_eq!(types, ["injection", "bounce", "delivery"]);
    assert_eq!(hooks[0].events().len(), 2);
    let delivered = hooks[2].events();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0]["rcpt_to"], "ok@example.net");
    let bounced = hooks[1].events();
    assert_eq!(bounced.len(), 1);
    assert_eq!(bounced[0]["type"], "bounce");
    assert_eq!(bounced[0]["rcpt_to"], "Unknown@example.net");
    assert_eq!(bounced[0]["reason"], "5.1.1 user unknown");
    assert_eq!(bounced[0]["idempotency_key"], "wh-bounce");
    assert_eq!(bounced[0]["headers"]["message-id"], "<b@shop.example>");
    assert_eq!(bounced[0]["timestamp"], delivered[0]["timestamp"]);
    assert!(hooks.iter().all(|h| signature_verifies(SECRET, h)));
    // The client's retry is a replay: no second set of events.
    let mut c = session(sink.smtp_addr()).await;
    let replay = c.submit("app@example.com", &rcpts, &msg).await.unwrap();
    assert_eq!(id_of(&replay), id);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(receiver.hooks().len(), 3);
    sink.shutdown().await;
}

/// The built binary as a child process, killed when dropped.
struct SinkProcess {
    child: std::process::Child,
    smtp: SocketAddr,
    api: SocketAddr,
}

impl Drop for SinkProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_sink_binary(args: &[&str], env: &[(&str, &str)]) -> SinkProcess {
    use std::io::BufRead;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idemrelay"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("IDEMRELAY_") {
            cmd.env_remove(name);
        }
    }
    let mut child = cmd
        .arg("sink")
        .args(["--listen", "127.0.0.1:0", "--api", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // `sink smtp=ADDR api=ADDR`
    let field = |name: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .parse()
            .unwrap()
    };
    SinkProcess {
        smtp: field("smtp="),
        api: field("api="),
        child,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_posts_webhooks_from_its_flags_and_lists_the_posts_over_http() {
    let receiver = Receiver::start().await;
    receiver.fail_first(1);
    let url = receiver.url().to_string();
    let sink = spawn_sink_binary(
        &[
            "--webhook",
            &url,
            "--webhook-backoff",
            "20ms",
            "--webhook-delivery-delay",
            "100ms",
            "--webhook-bounce",
            "nobody@",
            "--fault",
            "phase=webhook,action=duplicate,times=1",
        ],
        // The secret from the environment, where `ps` does not show it.
        &[("IDEMRELAY_SINK_WEBHOOK_SECRET", SECRET)],
    );
    let mut c = session(sink.smtp).await;
    let reply = c
        .submit(
            "app@example.com",
            &["a@example.net", "nobody@example.net"],
            &message(Some("wh-bin"), "x"),
        )
        .await
        .unwrap();
    let id = id_of(&reply);
    // injection: 500 then 200, duplicate: 200; delivery: 500, 200; bounce: 500, 200.
    receiver.wait_for(7).await;
    let deadline = Instant::now() + WAIT;
    let stats = loop {
        let stats = get_json(sink.api, "/stats").await;
        if stats["webhooks"]["pending"] == 0 || Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        stats["webhooks"],
        serde_json::json!({"batches": 3, "attempts": 7, "delivered": 4, "failed": 0,
                           "dropped": 0, "pending": 0})
    );
    assert!(receiver
        .hooks()
        .iter()
        .all(|h| signature_verifies(SECRET, h)));
    let posts = get_json(sink.api, "/webhooks?key=wh-bin").await;
    let posts = posts.as_array().unwrap();
    assert_eq!(posts.len(), 7);
    let first = &posts[0];
    assert_eq!(first["seq"], 1);
    assert_eq!(first["webhook_id"], format!("msg_{id}_injection"));
    assert_eq!(first["type"], "injection");
    assert_eq!(first["message_id"], id.as_str());
    assert_eq!(first["events"], 2);
    assert_eq!(first["copy"], 1);
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["status"], 500);
    assert_eq!(first["outcome"], "retrying");
    assert_eq!(first["fault"], "phase=webhook,action=duplicate,times=1");
    assert!(first["webhook_timestamp"].as_i64().unwrap() > 0);
    let sent_at = first["sent_at_ms"].as_u64().unwrap();
    assert!(sent_at > 0);
    assert_eq!(first["sent_at"], rfc3339(sent_at));
    let copies: Vec<(&str, u64, u64)> = posts
        .iter()
        .filter(|p| p["outcome"] == "delivered")
        .map(|p| {
            (
                p["type"].as_str().unwrap(),
                p["copy"].as_u64().unwrap(),
                p["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut copies = copies;
    copies.sort();
    assert_eq!(
        copies,
        [
            ("bounce", 1, 2),
            ("delivery", 1, 2),
            ("injection", 1, 2),
            ("injection", 2, 1)
        ]
    );
    assert_eq!(
        get_json(sink.api, &format!("/webhooks?id={id}")).await,
        Value::Array(posts.clone())
    );
    assert_eq!(
        get_json(sink.api, "/webhooks?key=other").await,
        serde_json::json!([])
    );
    let (status, _) = http(sink.api, "POST", "/reset", "").await;
    assert_eq!(status, 204);
    assert_eq!(get_json(sink.api, "/webhooks").await, serde_json::json!([]));
}
