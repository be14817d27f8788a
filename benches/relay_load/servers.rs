//! The processes the bench measures (the sink and relays, release builds run as children) and
//! the stores the relays keep their records in.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sqlx::{Connection, Executor};
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpStream;

use crate::backlog;

pub const BIN: &str = env!("CARGO_BIN_EXE_idemrelay");

pub fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// A child server, killed when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// The process id of the server's child (with a wrapper, the wrapper's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops process `pid` (the server, or under a wrapper the server the wrapper runs) with
    /// SIGTERM, as an operator would, and waits for the child to end (a wrapper ends with the
    /// process it runs, after writing what it has).
    pub fn stop(mut self, pid: u32) {
        // SAFETY: kill(2) of a process of ours, which is not reaped until the wait below.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }

    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// User plus system CPU time the server has used so far.
    pub fn cpu_time(&self) -> Option<Duration> {
        cpu_time_of(self.child.id())
    }
}

/// User plus system CPU time process `pid` has used so far (from `/proc/PID/stat`).
pub fn cpu_time_of(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // The kernel reports in USER_HZ, 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

async fn wait_for_greeting(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(stream) = TcpStream::connect(addr).await {
            let mut lines = tokio::io::BufReader::new(stream);
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

pub async fn start_sink(api: SocketAddr) -> anyhow::Result<Server> {
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
pub enum StoreKind {
    /// A new SQLite file in the bench directory.
    Sqlite,
    /// A new schema in this Postgres database.
    Postgres(String),
}

/// The prefix of the schemas the bench makes, so that a later run can drop them.
const BENCH_SCHEMA_PREFIX: &str = "relay_bench_";

impl StoreKind {
    /// The `--store` URL of a new, empty store named after `port` (not yet migrated).
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
    pub async fn clean(&self) -> anyhow::Result<()> {
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

/// Where the relays of a run keep their logs and records, and what their stores hold.
pub struct Relays<'a> {
    pub dir: &'a Path,
    pub store: &'a StoreKind,
    /// `--backlog N`: records in every store before its relay starts.
    pub backlog: Option<u64>,
}

impl Relays<'_> {
    /// A new store for the relay that will listen on `port`: empty, or with the run's backlog
    /// when `with_backlog`. A backlog is written by SQL into a migrated store while no relay
    /// runs on it (on SQLite a fill of a million records holds the one write lock for a
    /// while): a relay is started once on the store so that it migrates it, and stopped.
    pub async fn new_store(&self, port: u16, with_backlog: bool) -> anyhow::Result<String> {
        let records = self.backlog.filter(|_| with_backlog);
        let Some(records) = records else {
            return self.store.fresh(self.dir, port).await;
        };
        match self.store {
            // Filled once per run, then copied: every relay starts from the same file.
            StoreKind::Sqlite => {
                let template = self.dir.join(format!("backlog-{records}.db"));
                if !template.exists() {
                    let url = format!("sqlite://{}", template.display());
                    migrate(self.dir, &url).await?;
                    backlog::fill_sqlite(&template, records)?;
                }
                let path = self.dir.join(format!("relay-{port}.db"));
                std::fs::copy(&template, &path).context("copy the backlog store")?;
                // On disk before the relay starts: otherwise the relay's first checkpoint
                // fsyncs gigabytes of the copy's dirty pages inside the measured run.
                std::fs::File::open(&path)
                    .and_then(|f| f.sync_all())
                    .context("sync the backlog store")?;
                Ok(format!("sqlite://{}", path.display()))
            }
            StoreKind::Postgres(_) => {
                let url = self.store.fresh(self.dir, port).await?;
                migrate(self.dir, &url).await?;
                backlog::fill_postgres(&url, records).await?;
                Ok(url)
            }
        }
    }

    /// The relay as an operator would run it, on a new store (with the run's backlog, if
    /// any): see `spawn_relay`.
    pub async fn start(&self, upstream: Option<SocketAddr>) -> anyhow::Result<Server> {
        let addr = free_port();
        let url = self.new_store(addr.port(), true).await?;
        spawn_relay(self.dir, &url, addr, upstream).await
    }

    /// A relay on a new, empty store, whatever the run's backlog.
    pub async fn start_empty(&self, upstream: Option<SocketAddr>) -> anyhow::Result<Server> {
        let addr = free_port();
        let url = self.new_store(addr.port(), false).await?;
        spawn_relay(self.dir, &url, addr, upstream).await
    }
}

/// Starts a relay on `url` until it greets (it has migrated the store by then) and stops it.
async fn migrate(dir: &Path, url: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    drop(spawn_relay(dir, url, free_port(), None).await?);
    println!(
        "  (store migrated in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The relay as an operator would run it: default settings (info logs included, written to a
/// file), on the store at `url`, listening on `addr`, optionally forwarding to `upstream`.
pub async fn spawn_relay(
    dir: &Path,
    url: &str,
    addr: SocketAddr,
    upstream: Option<SocketAddr>,
) -> anyhow::Result<Server> {
    spawn_relay_with(dir, url, addr, upstream, "").await
}

/// `spawn_relay` with `extra` appended to the upstream's config file (TOML tables after
/// `[delivery]`, e.g. `[before_queue]`).
pub async fn spawn_relay_with(
    dir: &Path,
    url: &str,
    addr: SocketAddr,
    upstream: Option<SocketAddr>,
    extra: &str,
) -> anyhow::Result<Server> {
    spawn_relay_under(dir, url, addr, upstream, extra, &[]).await
}

/// `spawn_relay_with`, the relay started by the command `wrapper` (say `strace -f -o FILE
/// --`) when it is not empty: the child is then the wrapper, and the relay its child.
pub async fn spawn_relay_under(
    dir: &Path,
    url: &str,
    addr: SocketAddr,
    upstream: Option<SocketAddr>,
    extra: &str,
    wrapper: &[String],
) -> anyhow::Result<Server> {
    let log = std::fs::File::create(dir.join(format!("relay-{}.log", addr.port())))?;
    // BENCH_RELAY_BIN: another build of the relay (say main's, copied aside) measured against
    // the same sink, for a before/after in one run.
    let bin = std::env::var_os("BENCH_RELAY_BIN").unwrap_or_else(|| BIN.into());
    let mut cmd = match wrapper.split_first() {
        None => Command::new(bin),
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(bin);
            cmd
        }
    };
    cmd.args([
        "serve",
        "--listen",
        &addr.to_string(),
        "--hostname",
        "bench.test",
    ])
    .args(["--admin", "127.0.0.1:0"])
    .args(["--store", url]);
    if let Some(up) = upstream {
        // An upstream that takes all it gets: no rate cap (the default, 50/s, protects a
        // real account), more connections, and a scan that does not idle.
        let config = dir.join("fast-upstream.toml");
        std::fs::write(
            &config,
            format!(
                "[delivery]\nconnections = {}\nrate = 1000000.0\nburst = 1000.0\nscan_interval = \"50ms\"\n{extra}",
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
    Ok(server)
}

pub fn bench_dir() -> anyhow::Result<PathBuf> {
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
