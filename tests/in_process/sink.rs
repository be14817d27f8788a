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

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod binary;
mod http_api;
mod smtp;
mod tls;
mod webhook_posts;

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

// --- base64, HTTP and JSON, which several subjects use -----------------------------------

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

/// The ids of a `/messages` answer, in order.
fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

// --- the webhook receiver ---------------------------------------------------------------
//
// A small webhook receiver in the test: it records every request, answers 500 to the first
// posts of each webhook-id when told to, and checks signatures with its own code (ring's HMAC
// over `id.timestamp.body`, as Standard Webhooks define it).

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

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
