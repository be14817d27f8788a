//! `--only drain`: the claim (delivery) rate, from a relay whose queue is already full to the
//! sink, on an empty store and, with `--backlog N`, on a store holding N records.

use std::net::SocketAddr;
use std::time::Instant;

use crate::backlog::set_paused;
use crate::load::{reset_sink, run, wait_for_sink, Load, Sessions};
use crate::report::{line, mb, median_of, per_message, Report};
use crate::servers::{free_port, spawn_relay, Server};
use crate::Bench;

/// The rate of the first `k` deliveries: on a store whose only records are `k` messages
/// submitted while delivery was paused, and (with a backlog) on one whose queue holds half
/// the backlog. Both relays forward to the sink with the same settings; the clock starts at
/// the resume and stops when the sink's `/counts` shows `k`.
pub async fn drain(bench: &Bench<'_>, k: usize, report: &mut Report) -> anyhow::Result<()> {
    let Bench {
        sink,
        api,
        ref relays,
        rounds,
    } = *bench;
    let (mut empty, mut deep) = (Vec::new(), Vec::new());
    let queued = relays.backlog.map(|records| (records / 2) as usize);
    let deep_k = queued.map(|q| k.min(q));
    println!(
        "claim rate: time for the first {k} deliveries to the sink after delivery resumes, \
         {rounds} rounds"
    );
    for round in 0..rounds {
        let addr = free_port();
        let url = relays.new_store(addr.port(), false).await?;
        let relay = spawn_relay(relays.dir, &url, addr, Some(sink)).await?;
        // Nothing is queued yet: the pause is in place before the first message.
        set_paused(&url, true).await?;
        let load = Load {
            messages: k,
            concurrency: 50,
            size: 1024,
            sessions: Sessions::NewPerMessage,
        };
        let submitted = run(&[relay.addr], load, &format!("drain-{round}")).await?;
        line("queued", &submitted);
        empty.push(measure(&relay, &url, api, k, "empty store", report).await?);
        drop(relay);

        let (Some(records), Some(deep_k)) = (relays.backlog, deep_k) else {
            continue;
        };
        let addr = free_port();
        let url = relays.new_store(addr.port(), true).await?;
        set_paused(&url, true).await?;
        let relay = spawn_relay(relays.dir, &url, addr, Some(sink)).await?;
        let what = format!("{records} records stored, half queued");
        deep.push(measure(&relay, &url, api, deep_k, &what, report).await?);
    }
    let empty = median_of(empty);
    if deep.is_empty() {
        println!("  claim rate on an empty store: {empty:.0} msg/s (median)");
        return Ok(());
    }
    let deep = median_of(deep);
    println!("  medians: empty store {empty:.0} msg/s, with the backlog {deep:.0} msg/s");
    report.ratio_of(
        "claim rate with the backlog vs an empty store",
        "backlog/empty",
        deep / empty,
        0.8,
        true,
    );
    Ok(())
}

/// Resumes delivery on `relay` and times its first `k` deliveries.
async fn measure(
    relay: &Server,
    url: &str,
    api: SocketAddr,
    k: usize,
    what: &str,
    report: &mut Report,
) -> anyhow::Result<f64> {
    reset_sink(api).await?;
    let cpu_before = relay.cpu_time();
    let started = Instant::now();
    set_paused(url, false).await?;
    let elapsed = wait_for_sink(api, k, what).await? - started;
    let cpu = relay
        .cpu_time()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let rate = k as f64 / elapsed.as_secs_f64();
    let rss = relay.peak_rss_kib();
    println!(
        "  {what}: {k} delivered in {:.2} s: {rate:.0} msg/s; relay CPU {} per message; \
         peak RSS {}",
        elapsed.as_secs_f64(),
        per_message(cpu, k),
        rss.map_or("?".into(), mb)
    );
    report.rss(&format!("relay draining ({what})"), rss);
    Ok(rate)
}
