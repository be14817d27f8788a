//! The SMTP load generator, and the sink's HTTP API as the bench reads it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sessions {
    /// A new connection (greeting, EHLO, QUIT) per message.
    NewPerMessage,
    /// C long sessions, each sending its share of the messages.
    Reused,
}

#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub messages: usize,
    pub concurrency: usize,
    pub size: usize,
    pub sessions: Sessions,
}

#[derive(Debug)]
pub struct Measured {
    pub per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub elapsed: Duration,
    /// Messages accepted by each of the servers the load was spread over, in their order.
    pub per_server: Vec<usize>,
}

pub fn message(run: &str, n: usize, size: usize) -> Vec<u8> {
    let mut m = format!(
        "From: Bench <bench@example.com>\r\nTo: rcpt@example.com\r\n\
         Message-ID: <{run}-{n}@bench.example.com>\r\n\
         X-Bird-Idempotency-Key: {run}-{n}\r\nSubject: bench {n}\r\n\r\n"
    )
    .into_bytes();
    let line = b"The quick brown fox jumps over the lazy dog, again and again and again.\r\n";
    while m.len() + line.len() <= size {
        m.extend_from_slice(line);
    }
    while m.len() + 2 < size {
        m.push(b'x');
    }
    m.extend_from_slice(b"\r\n");
    m
}

struct Conn {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    line: String,
}

impl Conn {
    async fn open(addr: SocketAddr) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (r, w) = stream.into_split();
        let mut c = Conn {
            reader: BufReader::new(r),
            writer: w,
            line: String::new(),
        };
        c.expect(220).await?;
        c.writer.write_all(b"EHLO load.test\r\n").await?;
        c.expect(250).await?;
        Ok(c)
    }

    /// Reads a whole (multi-line) reply and checks its code.
    async fn expect(&mut self, code: u16) -> anyhow::Result<()> {
        loop {
            self.line.clear();
            if self.reader.read_line(&mut self.line).await? == 0 {
                bail!("connection closed");
            }
            if self.line.as_bytes().get(3) != Some(&b'-') {
                break;
            }
        }
        if !self.line.starts_with(&code.to_string()) {
            bail!("expected {code}, got {:?}", self.line.trim_end());
        }
        Ok(())
    }

    /// One transaction; returns the time from the final dot to its 250.
    async fn send(&mut self, body: &[u8]) -> anyhow::Result<Duration> {
        self.writer
            .write_all(b"MAIL FROM:<bench@example.com>\r\n")
            .await?;
        self.expect(250).await?;
        self.writer
            .write_all(b"RCPT TO:<rcpt@example.com>\r\n")
            .await?;
        self.expect(250).await?;
        self.writer.write_all(b"DATA\r\n").await?;
        self.expect(354).await?;
        self.writer.write_all(body).await?;
        let dot = Instant::now();
        self.writer.write_all(b".\r\n").await?;
        self.expect(250).await?;
        Ok(dot.elapsed())
    }

    async fn quit(mut self) -> anyhow::Result<()> {
        self.writer.write_all(b"QUIT\r\n").await?;
        let _ = self.reader.read_to_end(&mut Vec::new()).await;
        Ok(())
    }
}

/// Runs `load` against `addrs`, client i always talking to `addrs[i % len]` (round-robin
/// over the clients); every message must get a 250.
pub async fn run(addrs: &[SocketAddr], load: Load, run_id: &str) -> anyhow::Result<Measured> {
    // Messages are built before the clock starts; none of them is stuffed (no line starts
    // with a dot), so the bytes are sent as they are.
    let bodies: Vec<Vec<u8>> = (0..load.messages)
        .map(|n| message(run_id, n, load.size))
        .collect();
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..load.concurrency {
        let (bodies, next) = (bodies.clone(), next.clone());
        let server = client % addrs.len();
        let addr = addrs[server];
        tasks.push((
            server,
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut conn: Option<Conn> = None;
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= bodies.len() {
                        break;
                    }
                    let mut c = match conn.take() {
                        Some(c) => c,
                        None => Conn::open(addr).await?,
                    };
                    latencies.push(c.send(&bodies[n]).await?);
                    match load.sessions {
                        Sessions::Reused => conn = Some(c),
                        Sessions::NewPerMessage => c.quit().await?,
                    }
                }
                if let Some(c) = conn {
                    c.quit().await?;
                }
                anyhow::Ok(latencies)
            }),
        ));
    }
    let mut latencies = Vec::with_capacity(load.messages);
    let mut per_server = vec![0; addrs.len()];
    for (server, t) in tasks {
        let done = t.await??;
        per_server[server] += done.len();
        latencies.extend(done);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
    Ok(Measured {
        per_second: load.messages as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        elapsed,
        per_server,
    })
}

async fn sink_request(api: SocketAddr, request: &str) -> anyhow::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(api).await?;
    stream
        .write_all(format!("{request} HTTP/1.0\r\nHost: sink\r\n\r\n").as_bytes())
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    Ok(response)
}

async fn sink_json(api: SocketAddr, path: &str) -> anyhow::Result<serde_json::Value> {
    let response = sink_request(api, &format!("GET {path}")).await?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("HTTP response without a body")?;
    Ok(serde_json::from_slice(&response[split + 4..])?)
}

/// Empties the sink, so that every measured run starts from the same state: a sink that
/// holds earlier runs' messages (100 KB ones among them) is slower, and it is the ceiling.
pub async fn reset_sink(api: SocketAddr) -> anyhow::Result<()> {
    let response = sink_request(api, "POST /reset").await?;
    if !response.starts_with(b"HTTP/1.1 204") && !response.starts_with(b"HTTP/1.0 204") {
        bail!("sink reset refused");
    }
    Ok(())
}

/// The sink's message count, from `/counts` (polled while the relay delivers, so it must be
/// cheap: `/stats` would serialize every key).
pub async fn sink_messages(api: SocketAddr) -> anyhow::Result<usize> {
    sink_json(api, "/counts").await?["messages"]
        .as_u64()
        .map(|n| n as usize)
        .context("counts without messages")
}

/// Waits until the sink holds `count` messages; returns when it did.
pub async fn wait_for_sink(api: SocketAddr, count: usize, what: &str) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(1200);
    while sink_messages(api).await? < count {
        if Instant::now() > deadline {
            bail!("{what}: the sink never got {count} messages");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Instant::now())
}

/// What the sink's per-key ledger (`/stats`) says of the keys it saw.
#[derive(Debug)]
pub struct KeysSeen {
    pub keys: usize,
    /// Keys that reached the sink's final dot more than once (sent again by the relay).
    pub sent_again: usize,
}

pub async fn sink_keys(api: SocketAddr) -> anyhow::Result<KeysSeen> {
    let stats = sink_json(api, "/stats").await?;
    let keys = stats["keys"].as_object().context("stats without keys")?;
    let sent_again = keys
        .values()
        .filter(|k| k["transactions"].as_u64().unwrap_or(0) > 1)
        .count();
    Ok(KeysSeen {
        keys: keys.len(),
        sent_again,
    })
}
