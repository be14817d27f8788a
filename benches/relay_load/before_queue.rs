//! `--only bq`: what the before-queue mode costs the client (docs/guides/before-queue.md).
//! One relay per round forwards to the sink and listens twice: an ordinary listener and a
//! before-queue one. The same load goes to each in turn (ordinary first, then before-queue,
//! the sink drained and emptied between), at C=1 and at C=50, a new connection per message;
//! the figures are messages/s and the time from the final dot to the client's final reply
//! (p50/p99): `250 queued` for the ordinary mode, the upstream's verdict for the other.

use crate::load::{reset_sink, run, wait_for_sink, Load, Measured, Sessions};
use crate::report::{line, median};
use crate::servers::{free_port, spawn_relay_with};
use crate::Bench;

pub async fn before_queue(bench: &Bench<'_>, scale: impl Fn(usize) -> usize) -> anyhow::Result<()> {
    // BENCH_BQ_CONNECTIONS: the before-queue connections (default: the relay's default, 4).
    let connections: usize = std::env::var("BENCH_BQ_CONNECTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4);
    for (concurrency, messages) in [(1, scale(400)), (50, scale(2000))] {
        let load = Load {
            messages,
            concurrency,
            size: 1024,
            sessions: Sessions::NewPerMessage,
        };
        println!(
            "before-queue vs ordinary: {messages} messages of 1024 B, C={concurrency}, relay -> sink, {connections} before-queue connections, {} rounds",
            bench.rounds
        );
        let (mut ordinary, mut waiting) = (Vec::new(), Vec::new());
        for round in 0..bench.rounds {
            let (queued, told) = one_round(bench, load, connections, round).await?;
            ordinary.push(queued);
            waiting.push(told);
        }
        let (ordinary, waiting) = (median(&ordinary), median(&waiting));
        if bench.rounds > 1 {
            line("queue~", &ordinary);
            line("bq~", &waiting);
        }
        println!(
            "  => C={concurrency}: before-queue {:.0} msg/s vs ordinary {:.0} ({:.2}x); dot to final reply p50 {:.2} ms vs {:.2} ms, p99 {:.2} ms vs {:.2} ms",
            waiting.per_second,
            ordinary.per_second,
            waiting.per_second / ordinary.per_second,
            ms(&waiting, false),
            ms(&ordinary, false),
            ms(&waiting, true),
            ms(&ordinary, true),
        );
    }
    Ok(())
}

fn ms(m: &Measured, p99: bool) -> f64 {
    let d = if p99 { m.p99 } else { m.p50 };
    d.as_secs_f64() * 1000.0
}

async fn one_round(
    bench: &Bench<'_>,
    load: Load,
    connections: usize,
    round: usize,
) -> anyhow::Result<(Measured, Measured)> {
    let waiting_addr = free_port();
    let addr = free_port();
    let url = bench.relays.new_store(addr.port(), false).await?;
    let extra =
        format!("[before_queue]\nlisten = [\"{waiting_addr}\"]\nconnections = {connections}\n");
    let relay = spawn_relay_with(bench.relays.dir, &url, addr, Some(bench.sink), &extra).await?;
    reset_sink(bench.api).await?;
    let ordinary = run(
        &[addr],
        load,
        &format!("bq-queue-{round}-{}", load.concurrency),
    )
    .await?;
    line("queue", &ordinary);
    // The ordinary mode's deliveries end before the other load starts.
    wait_for_sink(bench.api, load.messages, "ordinary deliveries").await?;
    reset_sink(bench.api).await?;
    let waiting = run(
        &[waiting_addr],
        load,
        &format!("bq-wait-{round}-{}", load.concurrency),
    )
    .await?;
    line("bq", &waiting);
    wait_for_sink(bench.api, load.messages, "before-queue deliveries").await?;
    drop(relay);
    Ok((ordinary, waiting))
}
