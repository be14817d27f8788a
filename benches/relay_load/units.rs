//! `--only units`: what one accepted message costs the store, in units that do not depend on
//! the machine's speed: disk bytes written and fsyncs per message (SQLite), WAL bytes and
//! write transactions per message (Postgres), at C=1 and at C=50, and end to end (intake and
//! delivery of each message, C=50).
//!
//! The relay runs under `strace --seccomp-bpf -f -ttt -e trace=fsync,fdatasync`: seccomp
//! stops only those two calls, so the relay runs at nearly its own speed, and every call is
//! logged with its time; the calls counted are those between the first and last message of
//! the load. Bytes are the relay's `write_bytes` in `/proc/PID/io` (what it handed the
//! block layer: WAL, database pages at checkpoints, spool segments), read before and after
//! the load. The heartbeat's own commit (one every few seconds) is counted with the rest.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use sqlx::{Connection, Row};

use crate::load::{reset_sink, run, wait_for_sink, Load, Sessions};
use crate::servers::{free_port, spawn_relay_under, StoreKind};
use crate::Bench;

/// The figures of one load.
struct Costs {
    messages: usize,
    /// `write_bytes` of the relay process over the load.
    disk_bytes: u64,
    /// fsync and fdatasync calls of the relay over the load.
    fsyncs: usize,
    /// Postgres: WAL bytes and write transactions over the load.
    postgres: Option<[i64; 2]>,
    /// Postgres: where the load's WAL starts and ends, for `pg_waldump --stats`.
    wal_range: Option<(i64, i64)>,
}

/// An LSN as Postgres prints it.
fn lsn(bytes: i64) -> String {
    format!("{:X}/{:X}", bytes >> 32, bytes & 0xFFFF_FFFF)
}

impl Costs {
    fn print(&self, what: &str) {
        let n = self.messages as f64;
        let mut line = format!(
            "  {what}: {} messages; per message: disk bytes written {:.1} KB, fsyncs {:.2}",
            self.messages,
            self.disk_bytes as f64 / n / 1024.0,
            self.fsyncs as f64 / n,
        );
        if let Some([wal, transactions]) = self.postgres {
            line.push_str(&format!(
                "; Postgres WAL {:.1} KB, write transactions {:.2}",
                wal as f64 / n / 1024.0,
                // One of them is the second reading's own.
                (transactions - 1) as f64 / n
            ));
        }
        if let Some((from, to)) = self.wal_range {
            line.push_str(&format!(" (WAL {} to {})", lsn(from), lsn(to)));
        }
        println!("{line}");
    }
}

pub async fn units(bench: &Bench<'_>, scale: impl Fn(usize) -> usize) -> anyhow::Result<()> {
    let c1 = Load {
        messages: scale(2000),
        concurrency: 1,
        size: 1024,
        sessions: Sessions::NewPerMessage,
    };
    let c50 = Load {
        messages: scale(8000),
        concurrency: 50,
        ..c1
    };
    println!(
        "store costs per accepted message (1 KB, a new connection per message), {} rounds",
        bench.rounds
    );
    let backlog = bench
        .relays
        .backlog
        .map(|records| format!("intake C=50 with {records} records stored"));
    let scenarios = [
        ("intake C=1", c1, None, false),
        ("intake C=50", c50, None, false),
        (
            "end to end C=50 (intake and delivery)",
            c50,
            Some(bench.sink),
            false,
        ),
    ]
    .into_iter()
    .chain(backlog.as_deref().map(|what| (what, c50, None, true)));
    for (what, load, upstream, with_backlog) in scenarios {
        // At C=50 the figures follow how many messages each commit carried, which the
        // machine's timing decides: each round is printed, then the median round (by bytes).
        let mut rounds = Vec::new();
        for _ in 0..bench.rounds {
            let costs = measure(bench, load, upstream, with_backlog).await?;
            costs.print(&format!("{what}, one round"));
            rounds.push(costs);
        }
        rounds.sort_by_key(|c| c.disk_bytes);
        rounds[rounds.len() / 2].print(&format!("{what}, median"));
    }
    Ok(())
}

/// One load against a fresh relay under strace; with `upstream`, until the sink has every
/// message; `with_backlog`, on a store holding the `--backlog` records.
async fn measure(
    bench: &Bench<'_>,
    load: Load,
    upstream: Option<SocketAddr>,
    with_backlog: bool,
) -> anyhow::Result<Costs> {
    let dir = bench.relays.dir;
    let addr = free_port();
    let url = bench.relays.new_store(addr.port(), with_backlog).await?;
    let trace = dir.join(format!("fsyncs-{}.txt", addr.port()));
    let wrapper: Vec<String> = [
        "strace",
        "--seccomp-bpf",
        "-f",
        "-qq",
        "-ttt",
        "-e",
        "trace=fsync,fdatasync",
        "-o",
    ]
    .into_iter()
    .map(String::from)
    .chain([trace.display().to_string(), "--".into()])
    .collect();
    let relay = spawn_relay_under(dir, &url, addr, upstream, "", &wrapper).await?;
    let pid = traced_child(relay.pid())?;
    reset_sink(bench.api).await?;
    let postgres = match bench.relays.store {
        StoreKind::Postgres(base) => Some(base.as_str()),
        StoreKind::Sqlite => None,
    };
    let wal_before = match postgres {
        Some(base) => Some(wal_counters(base).await?),
        None => None,
    };
    let bytes_before = write_bytes(pid)?;
    let started = unix_now();
    run(&[addr], load, &format!("units-{}", addr.port())).await?;
    if upstream.is_some() {
        wait_for_sink(bench.api, load.messages, "units end to end").await?;
    }
    let ended = unix_now();
    let disk_bytes = write_bytes(pid)? - bytes_before;
    let (postgres, wal_range) = match (postgres, wal_before) {
        (Some(base), Some(before)) => {
            let after = wal_counters(base).await?;
            (
                Some([0, 1].map(|i| after[i] - before[i])),
                Some((before[0], after[0])),
            )
        }
        _ => (None, None),
    };
    relay.stop(pid);
    let fsyncs = fsyncs_between(&trace, started, ended)?;
    Ok(Costs {
        messages: load.messages,
        disk_bytes,
        fsyncs,
        postgres,
        wal_range,
    })
}

/// The relay strace runs: strace's one child.
fn traced_child(wrapper: u32) -> anyhow::Result<u32> {
    let path = format!("/proc/{wrapper}/task/{wrapper}/children");
    for _ in 0..100 {
        let children = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
        if let Some(pid) = children.split_whitespace().next() {
            return Ok(pid.parse()?);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!("strace ({wrapper}) has no child")
}

fn write_bytes(pid: u32) -> anyhow::Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .context("write_bytes in /proc/PID/io")?
        .trim()
        .parse()
        .context("write_bytes")
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// Lines of strace's log (`PID SECONDS.MICROS fsync(...) = 0`) whose time is in the window.
fn fsyncs_between(trace: &Path, from: f64, to: f64) -> anyhow::Result<usize> {
    let log = std::fs::read_to_string(trace).with_context(|| format!("read {trace:?}"))?;
    Ok(log
        .lines()
        .filter(|l| l.contains("sync("))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .filter(|t| (from..=to).contains(t))
        .count())
}

/// Postgres's WAL position (bytes) and transaction id counter (write transactions), read
/// from the server's own counters: exact at once, where the statistics views (pg_stat_wal,
/// pg_stat_database) hold each backend's figures back until it has been idle a while. One
/// xid goes to this reading's own transaction. Cluster-wide: nothing else should run.
async fn wal_counters(base: &str) -> anyhow::Result<[i64; 2]> {
    let mut conn = sqlx::PgConnection::connect(base).await?;
    let row = sqlx::query(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::BIGINT,
                (pg_current_xact_id()::TEXT)::BIGINT",
    )
    .fetch_one(&mut conn)
    .await?;
    let counters = [row.try_get(0)?, row.try_get(1)?];
    conn.close().await?;
    Ok(counters)
}

/// The unit the C=1 overhead is counted in, measured in the same run: on SQLite the p50 of
/// appending 1 KB to a file in the bench directory and `fdatasync`ing it (what one commit
/// cannot do without), on Postgres the p50 of a single-row INSERT committed on its own, over
/// one connection like the relay's.
pub async fn commit_unit(
    store: &StoreKind,
    dir: &Path,
) -> anyhow::Result<(&'static str, Duration)> {
    const SAMPLES: usize = 500;
    let mut times = Vec::with_capacity(SAMPLES);
    match store {
        StoreKind::Sqlite => {
            use std::io::Write;
            let mut file = std::fs::File::create(dir.join("fdatasync-probe"))?;
            let block = [b'x'; 1024];
            for _ in 0..SAMPLES {
                let started = std::time::Instant::now();
                file.write_all(&block)?;
                file.sync_data()?;
                times.push(started.elapsed());
            }
            times.sort();
            Ok(("1 KB fdatasync", times[SAMPLES / 2]))
        }
        StoreKind::Postgres(base) => {
            let mut conn = sqlx::PgConnection::connect(base).await?;
            // A real table (a temporary one writes no WAL), dropped after.
            sqlx::query("CREATE TABLE IF NOT EXISTS relay_bench_commit_probe (v TEXT)")
                .execute(&mut conn)
                .await?;
            for _ in 0..SAMPLES {
                let started = std::time::Instant::now();
                sqlx::query("INSERT INTO relay_bench_commit_probe (v) VALUES ('x')")
                    .execute(&mut conn)
                    .await?;
                times.push(started.elapsed());
            }
            sqlx::query("DROP TABLE relay_bench_commit_probe")
                .execute(&mut conn)
                .await?;
            conn.close().await?;
            times.sort();
            Ok(("single-row INSERT commit", times[SAMPLES / 2]))
        }
    }
}
