//! Test harness: a relay on port 0 with a fresh store, and a small SMTP client that speaks over
//! a real socket and hands back every reply line.
//!
//! The store is a temporary SQLite file, or, with `IDEMRELAY_TEST_BACKEND=postgres`, a fresh
//! schema in the Postgres database named by `IDEMRELAY_TEST_POSTGRES`: the shared suites
//! (intake, delivery, hostile input) run unchanged on either backend.
#![allow(dead_code)]

pub mod backend;
pub mod http;
pub mod process;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use idemrelay::app::Relay;
use idemrelay::config::Settings;
use idemrelay::store::{Store, StoredMessage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An SMTP reply as received: code and text lines (without the code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub code: u16,
    pub lines: Vec<String>,
}

impl Answer {
    /// The last line as the server wrote it: `250 2.0.0 ...`.
    pub fn line(&self) -> String {
        format!(
            "{} {}",
            self.code,
            self.lines.last().cloned().unwrap_or_default()
        )
    }

    /// The queue id from `250 2.0.0 OK queued as <id>[ ...]`.
    pub fn queue_id(&self) -> Option<String> {
        let line = self.lines.last()?;
        let rest = line.strip_prefix("2.0.0 OK queued as ")?;
        Some(rest.split(' ').next()?.to_string())
    }
}

pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

pub const TIMEOUT: Duration = Duration::from_secs(20);

impl Client {
    pub async fn connect(addr: SocketAddr) -> (Client, Answer) {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let mut client = Client {
            stream,
            buf: Vec::new(),
        };
        let greeting = client.read_answer().await.expect("greeting");
        (client, greeting)
    }

    /// Over a stream the caller opened: writes `first` (a PROXY header, say), then reads the
    /// greeting; `None` when the server closed the connection instead.
    pub async fn on_stream(mut stream: TcpStream, first: &[u8]) -> (Client, Option<Answer>) {
        stream.write_all(first).await.expect("write");
        let mut client = Client {
            stream,
            buf: Vec::new(),
        };
        let greeting = client.read_answer().await;
        (client, greeting)
    }

    /// Connects and says EHLO; panics unless both succeed.
    pub async fn ready(addr: SocketAddr) -> Client {
        let (mut client, greeting) = Client::connect(addr).await;
        assert_eq!(greeting.code, 220, "{greeting:?}");
        let ehlo = client.cmd("EHLO client.test").await;
        assert_eq!(ehlo.code, 250, "{ehlo:?}");
        client
    }

    /// The client's own port, which the relay's log lines name.
    pub fn local_port(&self) -> u16 {
        self.stream.local_addr().expect("local address").port()
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Reads one reply; `None` when the server closed the connection first.
    pub async fn read_answer(&mut self) -> Option<Answer> {
        let mut lines = Vec::new();
        loop {
            while let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let text = String::from_utf8_lossy(&line[..line.len() - 2]).to_string();
                let code: u16 = text.get(..3)?.parse().ok()?;
                let more = text.as_bytes().get(3) == Some(&b'-');
                lines.push(text.get(4..).unwrap_or("").to_string());
                if !more {
                    return Some(Answer { code, lines });
                }
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(TIMEOUT, self.stream.read(&mut chunk))
                .await
                .expect("server did not answer in time")
                .ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// True once the server has closed the connection (EOF with nothing more to read).
    pub async fn is_closed(&mut self) -> bool {
        let mut chunk = [0u8; 64];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut chunk)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    pub async fn cmd(&mut self, line: &str) -> Answer {
        self.send(format!("{line}\r\n").as_bytes()).await;
        self.read_answer().await.expect("connection closed")
    }

    /// DATA with dot-stuffing; `message` must already use CRLF.
    pub async fn data(&mut self, message: &[u8]) -> Answer {
        let go = self.cmd("DATA").await;
        assert_eq!(go.code, 354, "{go:?}");
        self.send(&dot_stuff(message)).await;
        self.read_answer()
            .await
            .expect("connection closed after DATA")
    }

    /// MAIL, RCPT..., DATA on an open session; returns the answer to the final dot.
    pub async fn submit(&mut self, from: &str, to: &[&str], message: &[u8]) -> Answer {
        let mail = self.cmd(&format!("MAIL FROM:<{from}>")).await;
        assert_eq!(mail.code, 250, "{mail:?}");
        for rcpt in to {
            let r = self.cmd(&format!("RCPT TO:<{rcpt}>")).await;
            assert_eq!(r.code, 250, "{r:?}");
        }
        self.data(message).await
    }

    pub async fn quit(mut self) {
        let _ = self.cmd("QUIT").await;
    }

    /// One whole submission on a new connection, as a client that copes with a relay going
    /// away: `None` when the connection failed or closed before the reply to the final dot,
    /// otherwise the first reply that was not positive, or the reply to the dot.
    pub async fn try_submit(
        addr: SocketAddr,
        from: &str,
        to: &[&str],
        message: &[u8],
    ) -> Option<Answer> {
        let stream = TcpStream::connect(addr).await.ok()?;
        let mut c = Client {
            stream,
            buf: Vec::new(),
        };
        let greeting = c.read_answer().await?;
        if greeting.code != 220 {
            return Some(greeting);
        }
        let mut steps = vec![
            "EHLO client.test".to_string(),
            format!("MAIL FROM:<{from}>"),
        ];
        steps.extend(to.iter().map(|r| format!("RCPT TO:<{r}>")));
        steps.push("DATA".into());
        for step in steps {
            c.stream
                .write_all(format!("{step}\r\n").as_bytes())
                .await
                .ok()?;
            let answer = c.read_answer().await?;
            if answer.code >= 400 {
                return Some(answer);
            }
        }
        c.stream.write_all(&dot_stuff(message)).await.ok()?;
        let answer = c.read_answer().await?;
        let _ = c.stream.write_all(b"QUIT\r\n").await;
        Some(answer)
    }
}

/// Dot-stuffs a CRLF message and appends the terminator (adding a final CRLF if missing).
/// `AUTH PLAIN` with the credentials in its initial response.
pub fn auth_plain(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let response =
        base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{password}"));
    format!("AUTH PLAIN {response}")
}

pub fn dot_stuff(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 8);
    let mut at_line_start = true;
    for &b in message {
        if at_line_start && b == b'.' {
            out.push(b'.');
        }
        out.push(b);
        at_line_start = b == b'\n';
    }
    if !message.is_empty() && !message.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

/// Converts lone LF to CRLF (corpus files are stored with LF).
pub fn to_crlf(bytes: &[u8]) -> Vec<u8> {
    idemrelay::cli::to_crlf(bytes)
}

/// A small valid message; `key` adds the idempotency header.
pub fn message(key: Option<&str>, subject: &str, body: &str) -> Vec<u8> {
    let mut m = String::from("From: Sender <sender@example.com>\r\nTo: rcpt@example.com\r\n");
    if let Some(k) = key {
        m.push_str(&format!("X-Bird-Idempotency-Key: {k}\r\n"));
    }
    m.push_str(&format!("Subject: {subject}\r\n\r\n{body}\r\n"));
    m.into_bytes()
}

pub fn corpus_dir() -> PathBuf {
    std::env::var_os("IDEMRELAY_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus"))
}

/// Every corpus message, as (name, CRLF bytes).
pub fn corpus() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for group in ["rfc", "thirdparty", "malformed"] {
        let dir = corpus_dir().join("eml").join(group);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()))
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "eml"))
            .collect();
        entries.sort();
        for path in entries {
            let name = format!("{group}/{}", path.file_name().unwrap().to_string_lossy());
            out.push((name, to_crlf(&std::fs::read(&path).unwrap())));
        }
    }
    out
}

/// A relay on 127.0.0.1:0 with its own SQLite file.
pub struct TestRelay {
    pub relay: Relay,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub settings: Settings,
}

pub fn test_settings(dir: &std::path::Path) -> Settings {
    Settings {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        store: idemrelay::config::SecretUrl(format!("sqlite://{}", dir.join("relay.db").display())),
        hostname: "relay.test".into(),
        admin: idemrelay::config::AdminListen(Some("127.0.0.1:0".parse().unwrap())),
        // The suites act through the admin API without a token, as an operator who opted in
        // on loopback would; admin::cross_site tests the default (refused).
        admin_allow_changes_without_token: true,
        ..Settings::default()
    }
}

impl TestRelay {
    pub async fn start() -> TestRelay {
        TestRelay::start_with(|_| {}).await
    }

    pub async fn start_with(tune: impl FnOnce(&mut Settings)) -> TestRelay {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = test_settings(dir.path());
        settings.store = backend::store_url(dir.path()).await;
        tune(&mut settings);
        TestRelay::start_in(dir, settings).await
    }

    pub async fn start_in(dir: tempfile::TempDir, settings: Settings) -> TestRelay {
        let relay = Relay::start(&settings).await.expect("relay starts");
        let addr = relay.local_addrs()[0];
        TestRelay {
            relay,
            addr,
            dir,
            settings,
        }
    }

    pub fn store(&self) -> &std::sync::Arc<dyn Store> {
        self.relay.intake().store()
    }

    /// The admin API's address (test settings run it on port 0).
    pub fn admin(&self) -> SocketAddr {
        self.relay.admin_addr().expect("admin API runs")
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("relay.db")
    }

    pub async fn stored(&self, id: &str) -> StoredMessage {
        self.store()
            .message(id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no record {id}"))
    }

    /// Number of rows in a table, read through a separate connection.
    pub async fn count(&self, table: &str) -> i64 {
        backend::count(self.settings.store.expose(), table).await
    }
}

/// Polls `check` until it returns Some, or panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Delivery settings that make a test run in seconds: short backoff, quick scans, tight
/// upstream deadlines.
pub fn fast_delivery(settings: &mut Settings, upstream: SocketAddr) {
    settings.upstream = Some(idemrelay::config::SecretUrl(format!(
        "smtp://{upstream}?tls=none"
    )));
    let d = &mut settings.delivery;
    d.retry_base = Duration::from_millis(50);
    d.retry_cap = Duration::from_millis(200);
    d.scan_interval = Duration::from_millis(50);
    d.pause_probe_interval = Duration::from_millis(200);
    d.breaker_cooldown = Duration::from_millis(100);
    d.breaker_threshold = 1000;
    d.connections = 2;
    let t = &mut d.timeouts;
    t.connect = Duration::from_secs(2);
    t.greeting = Duration::from_secs(2);
    t.mail = Duration::from_secs(2);
    t.rcpt = Duration::from_secs(2);
    t.data = Duration::from_secs(2);
    // Tests that want UNKNOWN set a shorter one; here a slow machine must not produce one.
    t.dot = Duration::from_secs(3);
}

/// An in-process `idemrelay sink` on 127.0.0.1:0.
pub async fn start_sink() -> idemrelay_sink::SinkHandle {
    idemrelay_sink::Sink::start(idemrelay_sink::SinkConfig::default())
        .await
        .expect("sink")
}

/// A sink whose upstream defers every recipient (`451 4.3.0`) until its faults are cleared.
pub async fn start_deferring_sink() -> idemrelay_sink::SinkHandle {
    let sink = start_sink().await;
    sink.set_faults(vec![idemrelay_sink::FaultRule::reply(
        idemrelay_sink::FaultStage::Rcpt,
        451,
        "4.3.0 try again later",
    )])
    .unwrap();
    sink
}

/// A relay delivering to `sink` with `fast_delivery` settings, then `tune`.
pub async fn relay_for(
    sink: &idemrelay_sink::SinkHandle,
    tune: impl FnOnce(&mut Settings),
) -> TestRelay {
    let addr = sink.smtp_addr();
    TestRelay::start_with(|s| {
        fast_delivery(s, addr);
        tune(s);
    })
    .await
}

/// A sink whose every final reply comes later than the relay waits, and a relay with a short
/// upstream window: each attempt ends UNKNOWN, and a message is soon parked `unresolved`.
pub async fn relay_whose_attempts_end_unknown() -> (idemrelay_sink::SinkHandle, TestRelay) {
    let sink = start_sink().await;
    sink.set_faults(vec![idemrelay_sink::FaultRule::delay(
        idemrelay_sink::FaultStage::Dot,
        HELD_DOT_REPLY,
    )])
    .unwrap();
    let relay = relay_for(&sink, |s| {
        // A second for a reply that should come at once: a loaded machine does not turn a
        // retry's replay into one more UNKNOWN.
        s.delivery.timeouts.dot = Duration::from_secs(1);
        s.delivery.upstream_window = UNKNOWN_WINDOW;
        s.delivery.window_margin = UNKNOWN_WINDOW_MARGIN;
    })
    .await;
    (sink, relay)
}

/// The upstream window of `relay_whose_attempts_end_unknown`, and its margin: no attempt
/// starts once the first is older than the difference (3 s).
pub const UNKNOWN_WINDOW: Duration = Duration::from_secs(4);
pub const UNKNOWN_WINDOW_MARGIN: Duration = Duration::from_secs(1);

/// How long the sink of `relay_whose_attempts_end_unknown` holds each reply to the final dot:
/// longer than the relay keeps trying, so every attempt ends UNKNOWN.
pub const HELD_DOT_REPLY: Duration = Duration::from_secs(5);

/// Wall-clock milliseconds since the epoch, the clock the ledger's timestamps use.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Waits until the sink of `relay_whose_attempts_end_unknown` has sent (or given up) every
/// reply it held for `id`'s attempts. Until then it answers the key with E01004 "in progress",
/// and a retry's fresh window could run out on those answers on a loaded machine.
pub async fn wait_out_held_replies(relay: &TestRelay, id: &str) {
    let last_dot = relay
        .store()
        .attempts(id)
        .await
        .unwrap()
        .iter()
        .filter_map(|a| a.finished_at_ms)
        .max()
        .expect("a finished attempt");
    // The sink reads each dot before the relay gives up waiting for its reply, unless the
    // machine is so loaded that the sink is late by more than the slack.
    let released = last_dot + HELD_DOT_REPLY.as_millis() as i64 + 1000;
    let now = now_ms();
    if released > now {
        tokio::time::sleep(Duration::from_millis((released - now) as u64)).await;
    }
}

/// One submission on a fresh connection; panics unless it is queued, returns the queue id.
pub async fn submit(relay: &TestRelay, from: &str, to: &[&str], msg: &[u8]) -> String {
    let mut c = Client::ready(relay.addr).await;
    let answer = c.submit(from, to, msg).await;
    c.quit().await;
    answer
        .queue_id()
        .unwrap_or_else(|| panic!("not accepted: {answer:?}"))
}

/// Waits (up to 20 s) for a record to reach `state`.
pub async fn wait_state(relay: &TestRelay, id: &str, state: idemrelay::store::State) {
    eventually(
        Duration::from_secs(20),
        &format!("{id} to become {state:?}"),
        || async { (relay.stored(id).await.state == state).then_some(()) },
    )
    .await;
}

/// A TLS client that trusts exactly the certificate in `cert` (PEM).
pub fn connector_trusting(cert: &std::path::Path) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls::pki_types::CertificateDer::pem_file_iter(cert).unwrap() {
        roots.add(der.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}
