//! Load benchmark: an SMTP load generator against the relay and, in the same run, against a
//! plain SMTP sink (`idemrelay sink`, in memory, no fsync) as the ceiling.
//!
//! `cargo bench --bench relay_load` (add `-- --quick` for a short run). Both servers run as
//! release-built child processes; the generator runs on one thread of this process. The relay
//! uses SQLite with `synchronous=FULL` in `target/bench-tmp` (a real disk, never tmpfs, so that
//! every commit is an fsync), or with `--store postgres://USER@HOST/DB` a fresh schema in that
//! database for each relay started (`synchronous_commit=on`, as the relay always sets it). It
//! prints, per scenario, accepted messages/s and the latency from the final dot to the 250
//! (p50/p99), the relay/sink ratio against the project's throughput targets (docs/contributing/performance.md), and the relay's
//! peak RSS.
//!
//! `--backlog N`: every relay's store holds N records (half queued) before it starts, and
//! intake is also measured on an empty store beside it; `--only drain`: the claim rate
//! (deliveries to the sink) from a full queue, on an empty store and with the backlog;
//! `--instances N` (Postgres): N relays on one store (intake, and end to end with a check that
//! the sink saw every key exactly once); `--only units`: disk bytes written and fsyncs per
//! accepted message (and Postgres WAL bytes and write transactions), C=1, C=50 and end to end.

mod backlog;
mod before_queue;
mod drain;
mod load;
mod multi;
mod report;
mod servers;
mod units;

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{bail, Context};

use load::{reset_sink, run, wait_for_sink, Load, Measured, Sessions};
use report::{line, median, median_of, per_message, Report};
use servers::{bench_dir, start_sink, Relays, StoreKind};

/// What every scenario measures against: the sink (its SMTP address and API), the relays it
/// starts, and the rounds of each load.
pub struct Bench<'a> {
    pub sink: SocketAddr,
    pub api: SocketAddr,
    pub relays: Relays<'a>,
    pub rounds: usize,
}

/// Sink and relay in turn, `rounds` times (a fresh relay each round), so that both see the
/// machine in the same state; returns the medians and the relay's highest peak RSS. With a
/// backlog, a relay on an empty store runs after each backlog relay, and the ratio of the
/// two is printed.
async fn compare(
    bench: &Bench<'_>,
    title: &str,
    load: Load,
    tag: &str,
    report: &mut Report,
) -> anyhow::Result<(Measured, Measured, Option<u64>)> {
    let Bench {
        sink,
        api,
        ref relays,
        rounds,
    } = *bench;
    println!(
        "{title}: {} messages of {} B, C={}, {:?}, {rounds} rounds",
        load.messages, load.size, load.concurrency, load.sessions
    );
    let (mut at_sink, mut at_relay, mut at_empty, mut rss) =
        (Vec::new(), Vec::new(), Vec::new(), None);
    for round in 0..rounds {
        reset_sink(api).await?;
        let measured = run(&[sink], load, &format!("{tag}-sink-{round}")).await?;
        line("sink", &measured);
        at_sink.push(measured);
        let relay = relays.start(None).await?;
        let measured = run(&[relay.addr], load, &format!("{tag}-relay-{round}")).await?;
        line("relay", &measured);
        at_relay.push(measured);
        rss = rss.max(relay.peak_rss_kib());
        drop(relay);
        if relays.backlog.is_some() {
            let relay = relays.start_empty(None).await?;
            let measured = run(&[relay.addr], load, &format!("{tag}-empty-{round}")).await?;
            line("empty", &measured);
            at_empty.push(measured);
        }
    }
    let (at_sink, at_relay) = (median(&at_sink), median(&at_relay));
    if rounds > 1 {
        line("sink~", &at_sink);
        line("relay~", &at_relay);
    }
    if let Some(records) = relays.backlog {
        let at_empty = median(&at_empty);
        if rounds > 1 {
            line("empty~", &at_empty);
        }
        report.ratio_of(
            &format!("{title} intake with {records} records stored vs an empty store"),
            "backlog/empty",
            at_relay.per_second / at_empty.per_second,
            0.8,
            true,
        );
    }
    if let Some(kib) = rss {
        println!("  relay peak RSS {}", report::mb(kib));
    }
    Ok((at_sink, at_relay, rss))
}

/// What the command line asks for.
struct Args {
    quick: bool,
    only: Option<String>,
    store: StoreKind,
    backlog: Option<u64>,
    /// Messages per drain (`--drain K`).
    drain: usize,
    instances: Option<usize>,
    rounds: usize,
}

impl Args {
    fn parse() -> anyhow::Result<Args> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let value = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
        };
        let number = |name: &str| -> anyhow::Result<Option<u64>> {
            match args.iter().position(|a| a == name) {
                None => Ok(None),
                Some(i) => Ok(Some(
                    args.get(i + 1)
                        .and_then(|n| n.parse::<u64>().ok())
                        .with_context(|| format!("{name} N: a number"))?,
                )),
            }
        };
        let quick = args.iter().any(|a| a == "--quick");
        // `--store postgres://USER@HOST/DB`: each relay gets a fresh schema in that database.
        let store = match value("--store") {
            None => StoreKind::Sqlite,
            Some(url) if url.starts_with("postgres") => StoreKind::Postgres(url.clone()),
            Some(other) => {
                bail!("--store {other}: expected a postgres:// URL (SQLite is the default)")
            }
        };
        let instances = number("--instances")?.map(|n| n as usize);
        if instances.is_some() && !matches!(store, StoreKind::Postgres(_)) {
            bail!("--instances needs --store postgres://...");
        }
        Ok(Args {
            quick,
            // `--only c50|reuse|c1|big|e2e|drain|multi|bq|units` runs one scenario (or several: `c50,drain`).
            only: value("--only").cloned(),
            store,
            // `--backlog N`: every relay's store holds N records before the load starts.
            backlog: number("--backlog")?,
            drain: number("--drain")?.map_or(if quick { 2000 } else { 20000 }, |k| k as usize),
            instances,
            rounds: number("--rounds")?.map_or(if quick { 1 } else { 3 }, |n| n as usize),
        })
    }

    /// The scenarios run without `--only`: the single-relay ones, the drain with a backlog,
    /// or only the multi-instance ones with `--instances`.
    fn wanted(&self, name: &str) -> bool {
        match (&self.only, name) {
            (Some(only), _) => only.split(',').any(|o| o == name),
            (None, "multi") => self.instances.is_some(),
            (None, _) if self.instances.is_some() => false,
            (None, "drain") => self.backlog.is_some(),
            (None, "bq" | "units") => false,
            (None, _) => true,
        }
    }
}

async fn bench(args: &Args) -> anyhow::Result<Vec<String>> {
    let wanted = |name: &str| args.wanted(name);
    let scale = |n: usize| if args.quick { n / 4 } else { n };
    let rounds = args.rounds;
    let store = &args.store;
    let dir = bench_dir()?;
    store.clean().await?;
    // The performance targets (docs/contributing/performance.md), for Postgres and for SQLite.
    let (c50_target, c1_target) = match store {
        StoreKind::Sqlite => (0.50, 1.6),
        StoreKind::Postgres(_) => (0.50, 2.0),
    };
    println!("store: {store:?}");
    let api = servers::free_port();
    let sink = start_sink(api).await?;
    let bench = Bench {
        sink: sink.addr,
        api,
        relays: Relays {
            dir: &dir,
            store,
            backlog: args.backlog,
        },
        rounds,
    };
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
    run(&[sink.addr], warm, "warm").await?;

    let c50 = Load {
        messages: scale(4000),
        concurrency: 50,
        size: 1024,
        sessions: Sessions::NewPerMessage,
    };
    if wanted("c50") {
        let (s, r, rss) = compare(&bench, "1 KB, C=50", c50, "c50", &mut report).await?;
        report.ratio(
            "1 KB C=50 throughput",
            r.per_second,
            s.per_second,
            c50_target,
            true,
        );
        report.rss("relay under the C=50 load", rss);
    }

    if wanted("reuse") {
        let reused = Load {
            sessions: Sessions::Reused,
            ..c50
        };
        let (s, r, _) = compare(&bench, "1 KB, C=50", reused, "reuse", &mut report).await?;
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
        let (s, r, _) = compare(&bench, "1 KB, C=1", c1, "c1", &mut report).await?;
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
        // The same overhead in commits of this machine, measured now: a figure that a faster
        // or slower disk changes less than the ratio.
        let (unit, took) = units::commit_unit(store, &dir).await?;
        let overhead = 1.0 / r.per_second - 1.0 / s.per_second;
        println!(
            "  => 1 KB C=1 relay minus sink per message: {:.3} ms = {:.1} x the {unit} p50 ({:.3} ms, this run)",
            overhead * 1e3,
            overhead / took.as_secs_f64(),
            took.as_secs_f64() * 1e3
        );
    }

    if wanted("big") {
        let big = Load {
            messages: scale(1000),
            size: 100 * 1024,
            ..c50
        };
        let (s, r, _) = compare(&bench, "100 KB, C=50", big, "big", &mut report).await?;
        report.ratio(
            "100 KB C=50 throughput",
            r.per_second,
            s.per_second,
            0.60,
            true,
        );
    }
    if wanted("e2e") {
        end_to_end(&bench, c50, &mut report).await?;
    }
    if wanted("drain") {
        drain::drain(&bench, args.drain, &mut report).await?;
    }
    if wanted("bq") {
        before_queue::before_queue(&bench, scale).await?;
    }
    if wanted("units") {
        units::units(&bench, scale).await?;
    }
    if wanted("multi") {
        let instances = args.instances.unwrap_or(3);
        multi::multi(&bench, instances, c50, &mut report).await?;
    }
    Ok(report.failures)
}

/// Submitted to the relay, delivered to the sink; the clock stops when the sink holds all of
/// them. Each round: the sink alone (the reference), then a fresh relay forwarding to it
/// (with a backlog, the relay delivers the backlog's queue first: the figure is then the
/// claim and delivery rate over a deep queue).
async fn end_to_end(bench: &Bench<'_>, load: Load, report: &mut Report) -> anyhow::Result<()> {
    let Bench {
        sink,
        api,
        ref relays,
        rounds,
    } = *bench;
    println!(
        "end to end: {} messages of 1024 B, C=50, new connection per message, relay -> sink",
        load.messages
    );
    let (mut direct, mut delivered, mut rss) = (Vec::new(), Vec::new(), None);
    for round in 0..rounds {
        reset_sink(api).await?;
        let measured = run(&[sink], load, &format!("e2e-sink-{round}")).await?;
        line("sink", &measured);
        direct.push(measured.per_second);
        let relay = relays.start(Some(sink)).await?;
        reset_sink(api).await?;
        let started = Instant::now();
        let submitted = run(&[relay.addr], load, &format!("e2e-{round}")).await?;
        line("relay", &submitted);
        let e2e = wait_for_sink(api, load.messages, "end to end").await? - started;
        let rate = load.messages as f64 / e2e.as_secs_f64();
        println!(
            "  all {} at the sink after {:.2} s: {rate:.0} msg/s end to end; relay CPU {} per message",
            load.messages,
            e2e.as_secs_f64(),
            per_message(relay.cpu_time(), load.messages),
        );
        delivered.push(rate);
        rss = rss.max(relay.peak_rss_kib());
    }
    let (direct, delivered) = (median_of(direct), median_of(delivered));
    println!("  medians: sink {direct:.0} msg/s, end to end {delivered:.0} msg/s");
    report.ratio("end to end C=50", delivered, direct, 0.30, true);
    if let Some(kib) = rss {
        println!("  relay peak RSS {}", report::mb(kib));
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse()?;
    // One thread: the generator must not take both cores from the servers it measures.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let failures = rt.block_on(bench(&args))?;
    if failures.is_empty() {
        println!("all targets met");
    } else {
        println!("targets missed: {}", failures.join("; "));
    }
    Ok(())
}
