//! Relay-wide delivery policy (docs/concepts/delivery.md), in process, with `idemrelay sink` as the upstream:
//! fairness across scopes sharing one store, the circuit breaker, the relay-wide slow-down,
//! and connection reuse with its cap.

use crate::common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{eventually, message, relay_for, start_sink, Client, TestRelay};
use idemrelay::store::{AttemptRow, State};
use idemrelay_sink::{Down, FaultRule, FaultStage, SinkHandle};

const LIMIT: Duration = Duration::from_secs(20);

/// Submits one message per key on one session; returns the queue ids in order.
async fn submit_keys(relay: &TestRelay, rcpt: &str, keys: &[String]) -> Vec<String> {
    let mut c = Client::ready(relay.addr).await;
    let mut ids = Vec::new();
    for key in keys {
        let answer = c
            .submit(
                "sender@example.com",
                &[rcpt],
                &message(Some(key), &format!("policy {key}"), &format!("body {key}")),
            )
            .await;
        ids.push(
            answer
                .queue_id()
                .unwrap_or_else(|| panic!("{key} not accepted: {answer:?}")),
        );
    }
    c.quit().await;
    ids
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:02}")).collect()
}

async fn wait_delivered(relay: &TestRelay, ids: &[String]) {
    for id in ids {
        eventually(LIMIT, &format!("{id} delivered"), || async {
            (relay.stored(id).await.state == State::Delivered).then_some(())
        })
        .await;
    }
}

/// The position of each key in the sink's acceptance order.
fn positions(sink: &SinkHandle, keys: &[String]) -> Vec<usize> {
    let order: Vec<Option<String>> = sink.messages().into_iter().map(|m| m.key).collect();
    keys.iter()
        .map(|k| {
            order
                .iter()
                .position(|m| m.as_deref() == Some(k.as_str()))
                .unwrap_or_else(|| panic!("{k} not at the sink: {order:?}"))
        })
        .collect()
}

/// Log lines of this test binary (all tests share the process-wide subscriber).
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Capture(writer.clone()))
            .try_init();
        buf
    })
    .clone()
}

fn log_lines(logs: &Arc<Mutex<Vec<u8>>>) -> Vec<String> {
    String::from_utf8_lossy(&logs.lock().unwrap())
        .lines()
        .map(str::to_string)
        .collect()
}

// --- a. fairness across scopes ------------------------------------------------------------

/// A backlog in one scope does not hold back another scope's mail: both scopes' relays share
/// one store, the bulk relay's single connection delivers for both, and the urgent messages,
/// queued after the whole backlog, go out within a few deliveries instead of last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_in_one_scope_does_not_hold_back_another_scope() {
    const BACKLOG: usize = 40;
    let sink = start_sink().await;
    // Each delivery takes a while, so the backlog lasts a few seconds.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_millis(60),
    )])
    .unwrap();
    let bulk = relay_for(&sink, |s| {
        s.scope = "bulk".into();
        s.delivery.connections = 1;
    })
    .await;
    // Hold delivery until the whole backlog is queued, so the backlog is really ahead.
    bulk.store()
        .pause("test: queue the backlog first", false)
        .await
        .unwrap();
    let store_url = bulk.settings.store.clone();
    let urgent = TestRelay::start_with(|s| {
        s.store = store_url;
        s.scope = "urgent".into();
        // It only accepts: the bulk relay's worker delivers for both scopes.
        s.upstream = None;
    })
    .await;

    let bulk_keys = keys("bulk", BACKLOG);
    let bulk_ids = submit_keys(&bulk, "rcpt@example.com", &bulk_keys).await;
    bulk.store().resume().await.unwrap();
    sink.wait_for_messages(3, LIMIT).await.unwrap();

    // Paused while the urgent mail is queued: on a loaded machine the submissions (each
    // waiting for a commit beside the bulk relay's) could otherwise let the backlog drain.
    bulk.store()
        .pause("test: queue the urgent mail", false)
        .await
        .unwrap();
    let at_submit = sink.stats().messages;
    let urgent_keys = keys("urgent", 2);
    let urgent_ids = submit_keys(&urgent, "rcpt@example.com", &urgent_keys).await;
    let queued = sink.stats().messages;
    bulk.store().resume().await.unwrap();
    assert!(
        queued <= 12,
        "the backlog drained too fast for this test to mean anything: {queued} of {BACKLOG} \
         delivered when the urgent mail was queued"
    );

    wait_delivered(&bulk, &urgent_ids).await;
    let urgent_at = positions(&sink, &urgent_keys);
    let last_urgent = *urgent_at.iter().max().unwrap();
    eprintln!(
        "fairness: urgent queued while the sink had {at_submit}..{queued} of {BACKLOG}; \
         delivered at positions {urgent_at:?}"
    );
    // FIFO would deliver them at positions 40 and 41. Round-robin takes them within the next
    // few claims (one bulk message may already be in flight, and turns alternate).
    assert!(
        last_urgent < queued + 5,
        "urgent mail at positions {urgent_at:?}; {at_submit}..{queued} delivered while it was \
         queued"
    );
    // And the backlog really was still there when they went.
    let bulk_after = BACKLOG + 2 - 1 - last_urgent;
    assert!(
        bulk_after >= 20,
        "only {bulk_after} bulk messages were left after the urgent ones"
    );

    wait_delivered(&bulk, &bulk_ids).await;
    let all = sink.messages();
    assert_eq!(all.len(), BACKLOG + 2);
    // Within the bulk scope the order stays first come, first served.
    let bulk_at = positions(&sink, &bulk_keys);
    assert!(
        bulk_at.windows(2).all(|w| w[0] < w[1]),
        "bulk order changed: {bulk_at:?}"
    );
    // The urgent relay sees its records delivered by the other process.
    for id in &urgent_ids {
        assert_eq!(urgent.stored(id).await.state, State::Delivered);
    }
}

// --- b. circuit breaker -------------------------------------------------------------------

/// Every attempt of every message, ordered by start.
async fn all_attempts(relay: &TestRelay, ids: &[String]) -> Vec<(String, AttemptRow)> {
    let mut all = Vec::new();
    for id in ids {
        for a in relay.store().attempts(id).await.unwrap() {
            all.push((id.clone(), a));
        }
    }
    all.sort_by_key(|(_, a)| (a.started_at_ms, a.finished_at_ms));
    all
}

/// Three consecutive failures open the breaker: no attempt starts for the cooldown (apart
/// from one that another connection had already begun), then one probe at a time, each
/// failed probe buying a fresh cooldown; once the upstream is back everything is delivered.
/// A message that has failed before is never the probe (a connection check is, which leaves
/// no attempt in the ledger): a probe that is a message is one never tried before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_stops_attempts_for_the_cooldown_then_probes() {
    const COOLDOWN_MS: i64 = 2000;
    // Between the breaker's decision and the ledger's timestamp: one store write (slow on a
    // loaded machine) and millisecond rounding.
    const SLACK_MS: i64 = 300;
    const CONNECTIONS: usize = 2;
    let sink = start_sink().await;
    // Greet421 keeps the port: a refused port could be handed to another test's sink.
    sink.pause(Down::Greet421).await.unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.breaker_threshold = 3;
        s.delivery.breaker_cooldown = Duration::from_millis(COOLDOWN_MS as u64);
        s.delivery.connections = CONNECTIONS;
    })
    .await;
    let ids = submit_keys(&relay, "rcpt@example.com", &keys("breaker", 4)).await;

    // Wait for the breaker to have opened and failed two probes (three cooldowns' worth).
    let opened_at = |attempts: &[(String, AttemptRow)]| -> Option<(i64, i64)> {
        let mut finished: Vec<i64> = attempts
            .iter()
            .filter_map(|(_, a)| a.finished_at_ms)
            .collect();
        finished.sort();
        let mut started: Vec<i64> = attempts.iter().map(|(_, a)| a.started_at_ms).collect();
        started.sort();
        Some((*started.get(2)?, *finished.get(2)?))
    };
    let reopened = |page: &str| {
        let value = |series: &str| common::http::sample(page, series).unwrap_or(0.0);
        (
            value("idemrelay_circuit_breaker_transitions_total{to=\"open\"}"),
            value("idemrelay_circuit_breaker_transitions_total{to=\"half_open\"}"),
        )
    };
    eventually(
        LIMIT,
        "two failed probes after the breaker opened",
        || async {
            let page = common::http::get(relay.admin(), "/metrics", None)
                .await
                .body;
            let (opened, half_opened) = reopened(&page);
            (opened >= 3.0 && half_opened >= 2.0).then_some(())
        },
    )
    .await;
    let down = all_attempts(&relay, &ids).await;
    sink.resume().await.unwrap();
    wait_delivered(&relay, &ids).await;

    for (id, a) in &down {
        if a.finished_at_ms.is_some() {
            assert_eq!(a.outcome.as_deref(), Some("transient"), "{id}: {a:?}");
            assert_eq!(a.code, Some(421), "{id}: {a:?}");
        }
    }
    // The breaker opened when the third failure was reported: after the third attempt
    // started (s3) and before the third finished attempt was written (f3).
    let (s3, f3) = opened_at(&down).unwrap();
    let first = down[0].1.started_at_ms;
    assert!(
        f3 - first < COOLDOWN_MS,
        "the first failures were not quick: {down:#?}"
    );
    let starts: Vec<i64> = down.iter().map(|(_, a)| a.started_at_ms).collect();
    // Started after the opening and before its cooldown was over: only attempts that another
    // connection had already been let through for.
    let in_cooldown: Vec<i64> = starts
        .iter()
        .copied()
        .filter(|&s| s > f3 && s < s3 + COOLDOWN_MS - SLACK_MS)
        .collect();
    assert!(
        in_cooldown.len() < CONNECTIONS,
        "attempts started during the cooldown at {in_cooldown:?} (s3={s3}, f3={f3}): {down:#?}"
    );
    // After it: half-open probes, one at a time, each failure reopening for a full cooldown.
    // A message that has failed before is never the probe (a connection check is, and leaves
    // no attempt in the ledger): every probe in the ledger is a message's first attempt. How
    // many there are depends on when intake committed the messages: one committed after the
    // breaker opened was never tried, and may be a probe.
    let probe_rows: Vec<&(String, AttemptRow)> = down
        .iter()
        .filter(|(_, a)| a.started_at_ms >= s3 + COOLDOWN_MS - SLACK_MS)
        .collect();
    assert!(
        probe_rows.iter().all(|(_, a)| a.attempt == 1),
        "probes that were messages tried before: {down:#?}"
    );
    let probes: Vec<i64> = probe_rows.iter().map(|(_, a)| a.started_at_ms).collect();
    eprintln!(
        "breaker: attempt starts (ms after the first) {:?}; opened between {} and {}",
        starts.iter().map(|s| s - first).collect::<Vec<_>>(),
        s3 - first,
        f3 - first
    );
    for pair in probes.windows(2) {
        assert!(
            pair[1] - pair[0] >= COOLDOWN_MS - SLACK_MS,
            "probes {pair:?} closer than the cooldown: {down:#?}"
        );
    }
    // Without the breaker the backoff (at most 200 ms here) would have retried ~4 messages
    // every fraction of a second: the ledger stays small.
    assert!(
        down.len() <= 3 + (CONNECTIONS - 1) + probes.len(),
        "{down:#?}"
    );

    let messages = sink.messages();
    assert_eq!(messages.len(), ids.len());
    assert_eq!(sink.transactions().len(), ids.len());
}

// --- c. slow down -------------------------------------------------------------------------

/// A transient "slow down" is retried like any transient reply (no pause, no bounce), and the
/// relay lowers its pace for everyone; the queue still drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_down_reply_is_retried_and_the_queue_still_drains() {
    let logs = captured_logs();
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Mail,
        421,
        "4.7.0 Rate limit exceeded, slow down",
    )
    .with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let id = submit_keys(&relay, "rcpt@example.com", &keys("slow", 1))
        .await
        .remove(0);
    wait_delivered(&relay, std::slice::from_ref(&id)).await;

    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger.len(), 2, "{ledger:#?}");
    assert_eq!(ledger[0].outcome.as_deref(), Some("transient"));
    assert_eq!(ledger[0].phase.as_deref(), Some("mail"));
    assert_eq!(ledger[0].code, Some(421));
    assert!(
        ledger[0]
            .reply
            .as_deref()
            .is_some_and(|r| r.contains("slow down")),
        "{ledger:#?}"
    );
    assert_eq!(ledger[1].outcome.as_deref(), Some("accepted"));
    // Not an account problem: the queue was not paused.
    assert_eq!(relay.store().paused().await.unwrap(), None);
    // The refusal came before the dot: one transaction, one message.
    assert_eq!(sink.transactions().len(), 1);
    assert_eq!(sink.messages().len(), 1);

    // The lowered pace does not stop the queue.
    let more = submit_keys(&relay, "rcpt@example.com", &keys("after-slow", 5)).await;
    wait_delivered(&relay, &more).await;
    assert_eq!(sink.messages().len(), 6);
    for id in &more {
        assert_eq!(relay.store().attempts(id).await.unwrap().len(), 1);
    }

    // The log says what happened and nothing alarming.
    let lines = log_lines(&logs);
    let mine: Vec<&String> = lines.iter().filter(|l| l.contains(&id)).collect();
    assert!(
        mine.iter()
            .any(|l| l.contains("outcome=transient") && l.contains("decision=retry")),
        "{mine:#?}"
    );
    assert!(
        mine.iter().any(|l| l.contains("decision=delivered")),
        "{mine:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("relay-wide rate lowered")),
        "no slow-down line in the log"
    );
    for line in &mine {
        assert!(
            !line.contains("ALERT") && !line.contains("ERROR") && !line.contains("unresolved"),
            "{line}"
        );
    }
}

// --- d. connection reuse ------------------------------------------------------------------

/// Messages share a connection up to `max_messages_per_connection`, then a new one is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_carries_at_most_the_configured_number_of_messages() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| {
        s.delivery.connections = 1;
        s.delivery.max_messages_per_connection = 3;
    })
    .await;
    relay
        .store()
        .pause("test: queue first", false)
        .await
        .unwrap();
    let ids = submit_keys(&relay, "rcpt@example.com", &keys("reuse", 7)).await;
    relay.store().resume().await.unwrap();
    wait_delivered(&relay, &ids).await;
    let stats = sink.stats();
    assert_eq!(stats.messages, 7);
    assert_eq!(stats.transactions, 7);
    assert_eq!(
        stats.connections, 3,
        "7 messages, 3 per connection: {stats:?}"
    );
}

/// A connection on which a transaction failed is closed, not reused: with the failure as the
/// first transaction, 7 messages at 3 per connection take 1 + 3 connections (a reused one
/// would make it 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_not_reused_after_a_failed_transaction() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Rcpt,
        451,
        "4.3.0 try again later",
    )
    .with_rcpt("first@")
    .with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.connections = 1;
        s.delivery.max_messages_per_connection = 3;
    })
    .await;
    relay
        .store()
        .pause("test: queue first", false)
        .await
        .unwrap();
    let first = submit_keys(&relay, "first@example.com", &keys("failing", 1))
        .await
        .remove(0);
    // A later acceptance time: the failing message is claimed first.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let rest = submit_keys(&relay, "rcpt@example.com", &keys("after-fail", 6)).await;
    relay.store().resume().await.unwrap();
    let mut all = vec![first.clone()];
    all.extend(rest.iter().cloned());
    wait_delivered(&relay, &all).await;

    let ledger = relay.store().attempts(&first).await.unwrap();
    assert_eq!(ledger.len(), 2, "{ledger:#?}");
    assert_eq!(ledger[0].outcome.as_deref(), Some("transient"));
    assert_eq!(ledger[0].phase.as_deref(), Some("rcpt"));
    assert_eq!(ledger[0].code, Some(451));
    // The premise: the failed transaction was the first one of all.
    for id in &rest {
        let a = relay.store().attempts(id).await.unwrap();
        assert_eq!(a.len(), 1, "{id}: {a:#?}");
        assert!(a[0].started_at_ms >= ledger[0].started_at_ms);
    }
    let stats = sink.stats();
    assert_eq!(stats.messages, 7);
    assert_eq!(stats.transactions, 7, "the failure never reached the dot");
    assert_eq!(
        stats.connections, 4,
        "one failed connection, then 7 messages at 3 per connection: {stats:?}"
    );
}

// --- e. the rate limit holds across connections -------------------------------------------

/// The token bucket caps the relay's upstream message rate, whatever the number of
/// connections: `n` attempts with burst `b` at rate `r` span at least `(n - b) / r`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_holds_across_connections() {
    const RATE: f64 = 4.0;
    const BURST: f64 = 1.0;
    const N: usize = 12;
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| {
        s.delivery.connections = 4;
        s.delivery.rate = RATE;
        s.delivery.burst = BURST;
    })
    .await;
    relay
        .store()
        .pause("test: queue first", false)
        .await
        .unwrap();
    let ids = submit_keys(&relay, "rcpt@example.com", &keys("rate", N)).await;
    relay.store().resume().await.unwrap();
    wait_delivered(&relay, &ids).await;
    let attempts = all_attempts(&relay, &ids).await;
    assert_eq!(attempts.len(), N);
    let starts: Vec<i64> = attempts.iter().map(|(_, a)| a.started_at_ms).collect();
    let span = starts[N - 1] - starts[0];
    let least = ((N as f64 - BURST) / RATE * 1000.0) as i64;
    // The bound allows for the first intent's write landing late (a loaded machine); a limit
    // kept per connection would give a span of about 500 ms.
    assert!(
        span >= least - 700,
        "{N} attempts within {span} ms at {RATE}/s (burst {BURST}) need at least {least} ms; \
         starts (ms after the first): {:?}",
        starts.iter().map(|s| s - starts[0]).collect::<Vec<_>>()
    );
}

/// A worker waits for its rate-limit token before it claims a job, never while holding a
/// lease: a lease is the time an attempt may take, and a wait spent inside it could let the
/// lease pass to another worker mid-attempt. With one token at a time, at most one job is
/// leased at any moment, however many workers are waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_wait_for_the_rate_limit_without_holding_a_lease() {
    const N: usize = 6;
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| {
        s.delivery.connections = 3;
        s.delivery.rate = 2.0;
        s.delivery.burst = 1.0;
    })
    .await;
    relay
        .store()
        .pause("test: queue first", false)
        .await
        .unwrap();
    let ids = submit_keys(&relay, "rcpt@example.com", &keys("lease-wait", N)).await;
    relay.store().resume().await.unwrap();
    let store = relay.settings.store.expose().to_string();
    let mut most = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        let leased = common::backend::scalar(
            &store,
            "SELECT COUNT(*) FROM delivery_jobs WHERE lease_owner IS NOT NULL",
        )
        .await;
        most = most.max(leased);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        most <= 1,
        "{most} jobs leased at once while waiting for tokens"
    );
    wait_delivered(&relay, &ids).await;
}

/// A pooled connection that the upstream closed while it sat idle (a restart, the server's
/// idle timeout, which Postfix and others announce with an unsolicited 421) is found out
/// before it is used: the next message does not pay an attempt, a backoff and a breaker
/// failure for it. lettre's own pool checks with NOOP before reuse for this reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_by_the_upstream_while_idle_costs_no_attempt() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| s.delivery.connections = 1).await;
    let first = submit_keys(&relay, "rcpt@example.com", &keys("idle-a", 1)).await;
    wait_delivered(&relay, &first).await;
    // The upstream restarts: its open connections get `421 4.3.2` and are closed.
    sink.pause(Down::Greet421).await.unwrap();
    sink.resume().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let second = submit_keys(&relay, "rcpt@example.com", &keys("idle-b", 1)).await;
    wait_delivered(&relay, &second).await;
    let ledger = relay.store().attempts(&second[0]).await.unwrap();
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0].outcome.as_deref(), Some("accepted"));
    assert_eq!(sink.stats().connections, 2);
}
