//! `--instances N` (Postgres): N relay processes on one store (the same database and schema),
//! the generator's clients spread over them round-robin. On a 2-core machine this shows
//! correctness and the cost per message, not scaling.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::backlog::postgres_backends;
use crate::load::{reset_sink, run, sink_keys, wait_for_sink, Load};
use crate::report::{line, median_of, per_message, Report};
use crate::servers::{cpu_time_of, free_port, spawn_relay, Relays, Server, StoreKind};
use crate::Bench;

/// CPU time of the Postgres backends of the bench's database, per process id.
struct PostgresCpu {
    base: String,
    before: HashMap<u32, Duration>,
}

impl PostgresCpu {
    async fn start(base: &str) -> anyhow::Result<Self> {
        let before = postgres_backends(base)
            .await?
            .into_iter()
            .filter_map(|pid| Some((pid, cpu_time_of(pid)?)))
            .collect();
        Ok(PostgresCpu {
            base: base.to_string(),
            before,
        })
    }

    /// CPU used since `start` by the backends alive now (a backend that came and went in
    /// between is missed: the relays' pools keep theirs open); None when none of them can be
    /// read (Postgres on another machine or in another process namespace).
    async fn used(&self) -> anyhow::Result<Option<Duration>> {
        let mut used = None;
        for pid in postgres_backends(&self.base).await? {
            if let Some(now) = cpu_time_of(pid) {
                let since = now.saturating_sub(self.before.get(&pid).copied().unwrap_or_default());
                used = Some(used.unwrap_or(Duration::ZERO) + since);
            }
        }
        Ok(used)
    }
}

/// `instances` relays on one new store: the first migrates it before the others start.
async fn start_instances(
    relays: &Relays<'_>,
    instances: usize,
    upstream: Option<SocketAddr>,
) -> anyhow::Result<Vec<Server>> {
    let first = free_port();
    let url = relays.new_store(first.port(), false).await?;
    let mut started = vec![spawn_relay(relays.dir, &url, first, upstream).await?];
    for _ in 1..instances {
        started.push(spawn_relay(relays.dir, &url, free_port(), upstream).await?);
    }
    Ok(started)
}

fn cpu_now(servers: &[Server]) -> Vec<Option<Duration>> {
    servers.iter().map(Server::cpu_time).collect()
}

/// Each instance's CPU since `before`, per message of `messages`.
fn instances_cpu(servers: &[Server], before: &[Option<Duration>], messages: &[usize]) -> String {
    servers
        .iter()
        .zip(before)
        .zip(messages)
        .map(|((s, b), n)| {
            let used = s.cpu_time().zip(*b).map(|(a, b)| a - b);
            format!("{n} msgs, {}/msg", per_message(used, *n))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

pub async fn multi(
    bench: &Bench<'_>,
    instances: usize,
    load: Load,
    report: &mut Report,
) -> anyhow::Result<()> {
    let Bench {
        sink,
        api,
        ref relays,
        rounds,
    } = *bench;
    let StoreKind::Postgres(base) = relays.store else {
        bail!("--instances needs --store postgres://...");
    };
    println!(
        "{instances} relays on one Postgres store: {} messages of {} B, C={} spread round-robin, \
         {:?}, {rounds} rounds",
        load.messages, load.size, load.concurrency, load.sessions
    );
    let (mut direct, mut together) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        reset_sink(api).await?;
        let measured = run(&[sink], load, &format!("multi-sink-{round}")).await?;
        line("sink", &measured);
        direct.push(measured.per_second);
        let servers = start_instances(relays, instances, None).await?;
        let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
        let before = cpu_now(&servers);
        let postgres = PostgresCpu::start(base).await?;
        let measured = run(&addrs, load, &format!("multi-{round}")).await?;
        let pg = postgres.used().await?;
        line("relays", &measured);
        println!(
            "  per instance: {}",
            instances_cpu(&servers, &before, &measured.per_server)
        );
        println!(
            "  Postgres backends: {} per message",
            per_message(pg, load.messages)
        );
        together.push(measured.per_second);
    }
    let (direct, together) = (median_of(direct), median_of(together));
    println!(
        "  medians: sink {direct:.0} msg/s, {instances} relays {together:.0} msg/s accepted: \
         relays/sink = {:.2} (no target on 2 cores)",
        together / direct
    );

    println!("end to end with {instances} relays delivering to the sink (each key exactly once)");
    for round in 0..rounds {
        let servers = start_instances(relays, instances, Some(sink)).await?;
        let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
        reset_sink(api).await?;
        let before = cpu_now(&servers);
        let postgres = PostgresCpu::start(base).await?;
        let started = Instant::now();
        let submitted = run(&addrs, load, &format!("multi-e2e-{round}")).await?;
        line("relays", &submitted);
        let e2e = wait_for_sink(api, load.messages, "end to end").await? - started;
        let pg = postgres.used().await?;
        println!(
            "  all {} at the sink after {:.2} s: {:.0} msg/s end to end",
            load.messages,
            e2e.as_secs_f64(),
            load.messages as f64 / e2e.as_secs_f64()
        );
        println!(
            "  per instance (accepted; CPU over intake and delivery): {}",
            instances_cpu(&servers, &before, &submitted.per_server)
        );
        println!(
            "  Postgres backends: {} per message",
            per_message(pg, load.messages)
        );
        // Late duplicates would come after the count was reached.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let seen = sink_keys(api).await?;
        let ok = seen.keys == load.messages && seen.sent_again == 0;
        println!(
            "  => sink saw {} keys of {}, {} sent more than once: {}",
            seen.keys,
            load.messages,
            seen.sent_again,
            if ok { "PASS" } else { "MISS" }
        );
        if !ok {
            report
                .failures
                .push(format!("{instances} relays end to end: {seen:?}"));
        }
    }
    Ok(())
}
