//! Load benchmark: an SMTP load generator against the relay and, in the same run, against a
//! plain SMTP sink (`idemrelay sink`, in memory, no fsync) as the ceiling.
//!
//! `cargo bench --bench relay_load` (add `-- --quick` for a short run). Both servers run as
//! release-built child processes; the generator runs on one thread of this process. The relay
//! uses SQLite with `synchronous=FULL` in `target/bench-tmp` (a real disk, never tmpfs, so that
//! every commit is an fsync), or with `--store postgres://USER@HOST/DB` a fresh schema in that
//! database for each relay started (`synchronous_commit=on`, as the relay always sets it). It prints, per scenario, accepted messages/s and the latency from
//! the final dot to the 250 (p50/p99), the relay/sink ratio against the targets of issue 7,
//! and the relay's peak RSS.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sqlx::{Connection, Executor};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_idemrelay");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sessions {
    /// A new connection (greeting, EHLO, QUIT) per message.
    NewPerMessage,
    /// C long sessions, each sending its share of the messages.
    Reused,
}

#[derive(Clone, Copy, Debug)]
struct Load {
    messages: usize,
    concurrency: usize,
    size: usize,
    sessions: Sessions,
}

#[derive(Debug)]
struct Measured {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    elapsed: Duration,
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// A child server, killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// User plus system CPU time the server has used so far.
    fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // The kernel reports in USER_HZ, 100 on Linux.
        Some(Duration::from_millis(ticks * 10))
    }
}

async fn wait_for_greeting(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(stream) = TcpStream::connect(addr).await {
            let mut lines = BufReader::new(stream);
            let mut greeting = String::new();
            if lines.read_line(&mut greeting).await.is_ok() && greeting.starts_with("220") {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("no greeting from {addr}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_sink(api: SocketAddr) -> anyhow::Result<Server> {
    let addr = free_port();
    let child = Command::new(BIN)
        .args([
            "sink",
            "--listen",
            &addr.to_string(),
            "--api",
            &api.to_string(),
        ])
        .env("IDEMRELAY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn idemrelay sink")?;
    let server = Server { child, addr };
    wait_for_greeting(addr).await?;
    Ok(server)
}

/// Where each relay the bench starts keeps its records.
#[derive(Clone, Debug)]
enum StoreKind {
    /// A new SQLite file in the bench directory.
    Sqlite,
    /// A new schema in this Postgres database.
    Postgres(String),
}

/// The prefix of the schemas the bench makes, so that a later run can drop them.
const BENCH_SCHEMA_PREFIX: &str = "relay_bench_";

impl StoreKind {
    /// The `--store` URL of a new, empty store for the relay listening on `port`.
    async fn fresh(&self, dir: &Path, port: u16) -> anyhow::Result<String> {
        match self {
            StoreKind::Sqlite => Ok(format!(
                "sqlite://{}",
                dir.join(format!("relay-{port}.db")).display()
            )),
            StoreKind::Postgres(base) => {
                let schema = format!("{BENCH_SCHEMA_PREFIX}{port}_{}", fastrand::u32(..));
                let mut conn = sqlx::PgConnection::connect(base)
                    .await
                    .with_context(|| format!("connect to {base}"))?;
                conn.execute(format!("CREATE SCHEMA {schema}").as_str())
                    .await?;
                conn.close().await?;
                let sep = if base.contains('?') { '&' } else { '?' };
                Ok(format!("{base}{sep}options[search_path]={schema}"))
            }
        }
    }

    /// Drops the schemas of earlier runs (each holds thousands of records).
    async fn clean(&self) -> anyhow::Result<()> {
        let StoreKind::Postgres(base) = self else {
            return Ok(());
        };
        let mut conn = sqlx::PgConnection::connect(base)
            .await
            .with_context(|| format!("connect to {base}"))?;
        let old: Vec<String> = sqlx::query_scalar(
            "SELECT nspname::TEXT FROM pg_namespace WHERE starts_with(nspname, $1)",
        )
        .bind(BENCH_SCHEMA_PREFIX)
        .fetch_all(&mut conn)
        .await?;
        for schema in old {
            conn.execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
                .await?;
        }
        conn.close().await?;
        Ok(())
    }
}

/// Where the relays of a run keep their logs and records.
struct Relays<'a> {
    dir: &'a Path,
    store: &'a StoreKind,
}

/// The relay as an operator would run it: default settings (info logs included, written to a
/// file), a fresh store, optionally forwarding to `upstream`.
async fn start_relay(
    dir: &Path,
    store: &StoreKind,
    upstream: Option<SocketAddr>,
) -> anyhow::Result<Server> {
    let addr = free_port();
    let store_url = store.fresh(dir, addr.port()).await?;
    let log = std::fs::File::create(dir.join(format!("relay-{}.log", addr.port())))?;
    // BENCH_RELAY_BIN: another build of the relay (say main's, copied aside) measured against
    // the same sink, for a before/after in one run.
    let bin = std::env::var_os("BENCH_RELAY_BIN").unwrap_or_else(|| BIN.into());
    let mut cmd = Command::new(bin);
    cmd.args([
        "serve",
        "--listen",
        &addr.to_string(),
        "--hostname",
        "bench.test",
    ])
    .args(["--admin", "127.0.0.1:0"])
    .args(["--store", &store_url]);
    if let Some(up) = upstream {
        // An upstream that takes all it gets: no rate cap (the default, 50/s, protects a
        // real account), more connections, and a scan that does not idle.
        let config = dir.join("fast-upstream.toml");
        std::fs::write(
            &config,
            format!(
                "[delivery]\nconnections = {}\nrate = 1000000.0\nburst = 1000.0\nscan_interval = \"50ms\"\n",
                std::env::var("BENCH_CONNECTIONS").unwrap_or_else(|_| "32".into())
            ),
        )?;
        cmd.args(["--upstream", &format!("smtp://{up}?tls=none")])
            .args(["--config", &config.display().to_string()]);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("spawn idemrelay serve")?;
    let server = Server { child, addr };
    wait_for_greeting(addr).await?;
    if let (Some(records), StoreKind::Postgres(_)) = (relays_backlog(), store) {
        fill_backlog(&store_url, records).await?;
    }
    Ok(server)
}

/// `--backlog N`, read once in `main`.
static BACKLOG: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

fn relays_backlog() -> Option<u64> {
    BACKLOG.get().copied().flatten()
}

/// Fills a relay's fresh Postgres store with `records` records as intake would leave them
/// (half queued with their jobs, half delivered; keys, recipients and ~1.1 KB bodies of the
/// usual shapes; no body checksum, which SQL cannot compute: such a row is taken as written
/// before checksums were kept), in bulk SQL: the counting triggers are off while it runs, and the tables
/// are analyzed after, as autovacuum would soon do.
async fn fill_backlog(store_url: &str, records: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut conn = sqlx::PgConnection::connect(store_url).await?;
    conn.execute("ALTER TABLE messages DISABLE TRIGGER USER")
        .await?;
    sqlx::query(
        "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
            rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at,
            finished_at, content_hash, part, message_fp, upstream_key, header_message_id)
         SELECT 'B' || lpad(g::TEXT, 23, '0'), 'default',
            'order-' || g || '-' || left(md5(g::TEXT), 16), 'header', sha256(g::TEXT::BYTEA),
            'app@example.com', 'user' || (g % 1000) || '@example.com', '7BIT', false, 1100,
            convert_to('Subject: backlog ' || g || E'\r\n\r\n'
                || repeat(md5(g::TEXT) || md5(g::TEXT) || E'\r\n', 16), 'UTF8'),
            CASE WHEN g % 2 = 0 THEN 'queued' ELSE 'delivered' END,
            '250 2.0.0 OK queued as B' || g, idemrelay_now_ms() - 3600000 + g / 1000,
            CASE WHEN g % 2 = 1 THEN idemrelay_now_ms() END, NULL, 1,
            sha256(('m' || g)::BYTEA), 'order-' || g || '-' || left(md5(g::TEXT), 16),
            g || '@app.example.com'
         FROM generate_series(1, $1) g",
    )
    .bind(i64::try_from(records)?)
    .execute(&mut conn)
    .await?;
    // Due now: with an upstream (`--only e2e`) the relay delivers the backlog first, so the
    // end-to-end figure is then the claim and delivery rate over a deep queue.
    conn.execute(
        "INSERT INTO delivery_jobs (message_id, scope, due_at)
            SELECT id, scope, accepted_at FROM messages WHERE state = 'queued';
         INSERT INTO scope_turns (scope, turn) VALUES ('default', 0) ON CONFLICT DO NOTHING;
         ALTER TABLE messages ENABLE TRIGGER USER;
         ANALYZE messages;
         ANALYZE delivery_jobs;",
    )
    .await?;
    conn.close().await?;
    println!(
        "  (store filled with {records} records in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn message(run: &str, n: usize, size: usize) -> Vec<u8> {
    let mut m = format!(
        "From: Bench <bench@example.com>\r\nTo: rcpt@example.com\r\n\
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

/// Runs `load` against `addr`; every message must get a 250.
async fn run(addr: SocketAddr, load: Load, run_id: &str) -> anyhow::Result<Measured> {
    // Messages are built before the clock starts; none of them is stuffed (no line starts
    // with a dot), so the bytes are sent as they are.
    let bodies: Vec<Vec<u8>> = (0..load.messages)
        .map(|n| message(run_id, n, load.size))
        .collect();
    let bodies = std::sync::Arc::new(bodies);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..load.concurrency {
        let (bodies, next) = (bodies.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut conn: Option<Conn> = None;
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
        }));
    }
    let mut latencies = Vec::with_capacity(load.messages);
    for t in tasks {
        latencies.extend(t.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
    Ok(Measured {
        per_second: load.messages as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        elapsed,
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

/// Empties the sink, so that every measured run starts from the same state: a sink that
/// holds earlier runs' messages (100 KB ones among them) is slower, and it is the ceiling.
async fn reset_sink(api: SocketAddr) -> anyhow::Result<()> {
    let response = sink_request(api, "POST /reset").await?;
    if !response.starts_with(b"HTTP/1.1 204") && !response.starts_with(b"HTTP/1.0 204") {
        bail!("sink reset refused");
    }
    Ok(())
}

/// The sink's message count, from `/counts` (polled while the relay delivers, so it must be
/// cheap: `/stats` would serialize every key).
async fn sink_messages(api: SocketAddr) -> anyhow::Result<usize> {
    let response = sink_request(api, "GET /counts").await?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("HTTP response without a body")?;
    let stats: serde_json::Value = serde_json::from_slice(&response[split + 4..])?;
    stats["messages"]
        .as_u64()
        .map(|n| n as usize)
        .context("stats without messages")
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

struct Report {
    failures: Vec<String>,
}

impl Report {
    fn ratio(&mut self, what: &str, relay: f64, sink: f64, target: f64, higher_is_better: bool) {
        let ratio = relay / sink;
        let ok = if higher_is_better {
            ratio >= target
        } else {
            ratio <= target
        };
        let sign = if higher_is_better { ">=" } else { "<=" };
        println!(
            "  => {what}: relay/sink = {ratio:.2} (target {sign} {target:.2}) {}",
            if ok { "PASS" } else { "MISS" }
        );
        if !ok {
            self.failures.push(format!("{what}: {ratio:.2}"));
        }
    }
}

fn line(name: &str, m: &Measured) {
    println!(
        "  {name:<5} {:>8.0} msg/s   p50 {:>9}   p99 {:>9}   ({:.2} s)",
        m.per_second,
        ms(m.p50),
        ms(m.p99),
        m.elapsed.as_secs_f64()
    );
}

/// The median of each figure over the rounds.
fn median(runs: &[Measured]) -> Measured {
    fn mid<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
        v.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
        v[v.len() / 2]
    }
    Measured {
        per_second: mid(runs.iter().map(|m| m.per_second).collect()),
        p50: mid(runs.iter().map(|m| m.p50).collect()),
        p99: mid(runs.iter().map(|m| m.p99).collect()),
        elapsed: mid(runs.iter().map(|m| m.elapsed).collect()),
    }
}

/// Sink and relay in turn, `rounds` times (a fresh relay each round), so that both see the
/// machine in the same state; returns the medians and the relay's highest peak RSS.
async fn compare(
    title: &str,
    sink: SocketAddr,
    api: SocketAddr,
    relays: &Relays<'_>,
    load: Load,
    tag: &str,
    rounds: usize,
) -> anyhow::Result<(Measured, Measured, Option<u64>)> {
    println!(
        "{title}: {} messages of {} B, C={}, {:?}, {rounds} rounds",
        load.messages, load.size, load.concurrency, load.sessions
    );
    let (mut at_sink, mut at_relay, mut rss) = (Vec::new(), Vec::new(), None);
    for round in 0..rounds {
        reset_sink(api).await?;
        let measured = run(sink, load, &format!("{tag}-sink-{round}")).await?;
        line("sink", &measured);
        at_sink.push(measured);
        let relay = start_relay(relays.dir, relays.store, None).await?;
        let measured = run(relay.addr, load, &format!("{tag}-relay-{round}")).await?;
        line("relay", &measured);
        at_relay.push(measured);
        rss = rss.max(relay.peak_rss_kib());
    }
    let (at_sink, at_relay) = (median(&at_sink), median(&at_relay));
    if rounds > 1 {
        line("sink~", &at_sink);
        line("relay~", &at_relay);
    }
    if let Some(kib) = rss {
        println!("  relay peak RSS {:.1} MB", kib as f64 / 1024.0);
    }
    Ok((at_sink, at_relay, rss))
}

fn bench_dir() -> anyhow::Result<PathBuf> {
    // BENCH_DIR elsewhere (a tmpfs, say) shows what the disk costs; the targets are for a
    // real disk.
    let dir = std::env::var_os("BENCH_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-tmp"),
        |d| PathBuf::from(d).join("idemrelay-bench"),
    );
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn bench(quick: bool, only: Option<&str>, store: StoreKind) -> anyhow::Result<Vec<String>> {
    let wanted = |name: &str| only.is_none_or(|o| o == name);
    let scale = |n: usize| if quick { n / 4 } else { n };
    let rounds = if quick { 1 } else { 3 };
    let dir = bench_dir()?;
    store.clean().await?;
    // Issue 17's targets for Postgres; SQLite's are issue 7's.
    let (c50_target, c1_target) = match store {
        StoreKind::Sqlite => (0.50, 1.6),
        StoreKind::Postgres(_) => (0.50, 2.0),
    };
    println!("store: {store:?}");
    let relays = Relays {
        dir: &dir,
        store: &store,
    };
    let api = free_port();
    let sink = start_sink(api).await?;
    let mut report = Report {
        failures: Vec::new(),
    };
    // Warm-up: connections, page cache, the binary.
    let warm = Load {
        messages: 200,
        concurrency: 10,
        size: 1024,
        sessions: Sessions::NewPerMessage,
    };
    run(sink.addr, warm, "warm").await?;

    let c50 = Load {
        messages: scale(4000),
        concurrency: 50,
        size: 1024,
        sessions: Sessions::NewPerMessage,
    };
    if wanted("c50") {
        let (s, r, rss) =
            compare("1 KB, C=50", sink.addr, api, &relays, c50, "c50", rounds).await?;
        report.ratio(
            "1 KB C=50 throughput",
            r.per_second,
            s.per_second,
            c50_target,
            true,
        );
        match rss {
            Some(kib) if kib <= 64 * 1024 => println!("  => relay peak RSS <= 64 MB PASS"),
            Some(kib) => {
                println!("  => relay peak RSS <= 64 MB MISS");
                report.failures.push(format!("RSS {kib} KiB"));
            }
            None => println!("  => relay peak RSS not readable"),
        }
    }

    if wanted("reuse") {
        let reused = Load {
            sessions: Sessions::Reused,
            ..c50
        };
        let (s, r, _) = compare(
            "1 KB, C=50",
            sink.addr,
            api,
            &relays,
            reused,
            "reuse",
            rounds,
        )
        .await?;
        println!(
            "  => reused sessions (no target): relay/sink = {:.2}",
            r.per_second / s.per_second
        );
    }

    if wanted("c1") {
        let c1 = Load {
            messages: scale(1000),
            concurrency: 1,
            ..c50
        };
        let (s, r, _) = compare("1 KB, C=1", sink.addr, api, &relays, c1, "c1", rounds).await?;
        // One client, one message after another: the mean time per message is the whole
        // transaction (connect, greeting, EHLO, MAIL, RCPT, DATA, dot, QUIT) as the client sees it.
        report.ratio(
            "1 KB C=1 per-message time (connect to QUIT)",
            1.0 / r.per_second,
            1.0 / s.per_second,
            c1_target,
            false,
        );
        println!(
            "  => 1 KB C=1 dot-to-250 p50 (no target of its own): relay/sink = {:.2}",
            r.p50.as_secs_f64() / s.p50.as_secs_f64()
        );
    }

    if wanted("big") {
        let big = Load {
            messages: scale(1000),
            size: 100 * 1024,
            ..c50
        };
        let (s, r, _) =
            compare("100 KB, C=50", sink.addr, api, &relays, big, "big", rounds).await?;
        report.ratio(
            "100 KB C=50 throughput",
            r.per_second,
            s.per_second,
            0.60,
            true,
        );
    }
    if !wanted("e2e") {
        return Ok(report.failures);
    }

    // End to end: submitted to the relay, delivered to the sink; the clock stops when the
    // sink holds all of them.
    println!(
        "end to end: {} messages of 1024 B, C=50, new connection per message, relay -> sink",
        c50.messages
    );
    // Each round: the sink alone (the reference), then a fresh relay forwarding to it.
    let (mut direct, mut delivered, mut rss) = (Vec::new(), Vec::new(), None);
    for round in 0..rounds {
        reset_sink(api).await?;
        let measured = run(sink.addr, c50, &format!("e2e-sink-{round}")).await?;
        line("sink", &measured);
        direct.push(measured.per_second);
        let relay = start_relay(&dir, &store, Some(sink.addr)).await?;
        reset_sink(api).await?;
        let started = Instant::now();
        let submitted = run(relay.addr, c50, &format!("e2e-{round}")).await?;
        line("relay", &submitted);
        let deadline = Instant::now() + Duration::from_secs(600);
        while sink_messages(api).await? < c50.messages {
            if Instant::now() > deadline {
                bail!("end to end: not all delivered");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let e2e = started.elapsed();
        let rate = c50.messages as f64 / e2e.as_secs_f64();
        let cpu = relay.cpu_time().map_or("?".into(), |t| {
            format!("{:.0} µs", t.as_secs_f64() * 1e6 / c50.messages as f64)
        });
        println!(
            "  all {} at the sink after {:.2} s: {rate:.0} msg/s end to end; relay CPU {cpu} per message",
            c50.messages,
            e2e.as_secs_f64()
        );
        delivered.push(rate);
        rss = rss.max(relay.peak_rss_kib());
    }
    let mid = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
        v[v.len() / 2]
    };
    let (direct, delivered) = (mid(direct), mid(delivered));
    println!("  medians: sink {direct:.0} msg/s, end to end {delivered:.0} msg/s");
    report.ratio("end to end C=50", delivered, direct, 0.30, true);
    if let Some(kib) = rss {
        println!("  relay peak RSS {:.1} MB", kib as f64 / 1024.0);
    }
    Ok(report.failures)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    // One thread: the generator must not take both cores from the servers it measures.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // `--only c50|reuse|c1|big|e2e` runs one scenario.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    // `--store postgres://USER@HOST/DB`: each relay gets a fresh schema in that database.
    let store = match args
        .iter()
        .position(|a| a == "--store")
        .and_then(|i| args.get(i + 1))
    {
        None => StoreKind::Sqlite,
        Some(url) if url.starts_with("postgres") => StoreKind::Postgres(url.clone()),
        Some(other) => bail!("--store {other}: expected a postgres:// URL (SQLite is the default)"),
    };
    // `--backlog N` (Postgres): every relay's store holds N records before the load starts.
    let backlog = match args.iter().position(|a| a == "--backlog") {
        None => None,
        Some(i) => Some(
            args.get(i + 1)
                .and_then(|n| n.parse::<u64>().ok())
                .context("--backlog N: a number of records")?,
        ),
    };
    if backlog.is_some() && !matches!(store, StoreKind::Postgres(_)) {
        bail!("--backlog needs --store postgres://...");
    }
    BACKLOG.set(backlog).expect("set once");
    let failures = rt.block_on(bench(quick, only, store))?;
    if failures.is_empty() {
        println!("all targets met");
    } else {
        println!("targets missed: {}", failures.join("; "));
    }
    Ok(())
}
