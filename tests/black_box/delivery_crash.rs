//! Crash recovery of delivery, black-box: the built `idemrelay` binary delivers to an
//! in-process sink (which dedups by `X-Bird-Idempotency-Key` like the real upstream), is
//! SIGKILLed while deliveries are in flight, and is restarted on the same store. Whatever the
//! moment of the kill, every accepted key must reach the sink exactly once (after its dedup),
//! with byte-identical retries that the attempt ledger explains.
//!
//! The kill moments come from a seeded generator: set `IDEMRELAY_CRASH_SEED` to replay a run
//! (the seed is printed on stderr and in every failure message).
//!
//! Nothing in the store is written by these tests: the restarted relay has to notice by
//! itself that the leases it finds belong to a process that is gone (it takes them over at
//! start) and that their open intents are UNKNOWN. The store is only read, to check the
//! attempt ledger.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::process::{idemrelay, serve_args, RelayProcess};
use common::{message, Client};
use idemrelay_sink::{DotDecision, FaultRule, FaultStage, Sink, SinkConfig, SinkHandle};
use sqlx::{Row, SqlitePool};

// The helpers, by part; each reads what it needs from this file with `use super::*`.
mod ledger;
use ledger::*;

/// Upper bound for any one wait in these tests.
const LIMIT: Duration = Duration::from_secs(20);

/// What the relay writes into an intent it finds open when it claims the job again.
const RECOVERED_REPLY: &str = "worker stopped with this attempt open; outcome unknown";

const DEFAULT_SEED: u64 = 0x1de3_2e1a_c2a5_4001;

fn seed() -> u64 {
    match std::env::var("IDEMRELAY_CRASH_SEED") {
        Ok(s) => {
            let s = s.trim();
            s.strip_prefix("0x")
                .map_or_else(|| s.parse(), |hex| u64::from_str_radix(hex, 16))
                .unwrap_or_else(|e| panic!("IDEMRELAY_CRASH_SEED={s:?}: {e}"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

// --- the relay process -------------------------------------------------------------------

/// The relay on `db` with the test's config file, delivering to the sink.
async fn start_relay(db: &Path, config: &Path, upstream: SocketAddr) -> RelayProcess {
    let config = config.display().to_string();
    let upstream = format!("smtp://{upstream}?tls=none");
    let extra = [
        "--config",
        &config,
        "--upstream",
        &upstream,
        "--retry-base",
        "50ms",
        "--upstream-window",
        "3h",
    ];
    RelayProcess::spawn(&serve_args(db, &extra)).ready().await
}

// --- the harness -------------------------------------------------------------------------

/// Relay settings for these tests: quick scans and retries, an upstream dot deadline longer
/// than the sink's delays, and no breaker (retries that meet E01004 are expected here).
fn write_config(path: &Path, connections: usize, dot: &str) {
    // Every phase is listed: `[delivery.timeouts]` does not accept a partial table.
    let text = format!(
        r#"
[delivery]
connections = {connections}
scan_interval = "50ms"
retry_cap = "300ms"
max_attempts = 200
breaker_threshold = 1000
breaker_cooldown = "100ms"

[delivery.timeouts]
connect = "2s"
greeting = "2s"
starttls = "2s"
auth = "2s"
mail = "2s"
rcpt = "2s"
data = "2s"
dot = "{dot}"
"#
    );
    std::fs::write(path, text).unwrap();
}

struct Harness {
    _dir: tempfile::TempDir,
    db: PathBuf,
    config: PathBuf,
    sink: SinkHandle,
    relay: Option<RelayProcess>,
    /// stderr of the relays killed so far.
    old_logs: Vec<String>,
    seed: u64,
}

#[derive(Debug, Clone)]
struct Kill {
    /// Messages at the sink once the relay was dead.
    at_sink: usize,
    /// Intents left open: written, never completed (some may date from an earlier kill when
    /// the relay was killed again before it got to them).
    open_intents: BTreeSet<(String, i64)>,
    /// Jobs the killed relay held under a lease that had not run out.
    leased: i64,
}

impl Harness {
    async fn start(sink: SinkHandle, connections: usize, dot: &str, seed: u64) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("relay.db");
        let config = dir.path().join("relay.toml");
        write_config(&config, connections, dot);
        let relay = start_relay(&db, &config, sink.smtp_addr()).await;
        Harness {
            _dir: dir,
            db,
            config,
            sink,
            relay: Some(relay),
            old_logs: Vec::new(),
            seed,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.relay.as_ref().expect("relay running").addr
    }

    /// SIGKILL, note what the dead relay left behind, start it again on the same store with
    /// the same flags.
    async fn kill_and_restart(&mut self) -> Kill {
        self.kill_and_restart_with(|_| {}).await
    }

    /// `kill_and_restart`, running `between` while no relay runs.
    async fn kill_and_restart_with(&mut self, between: impl FnOnce(&SinkHandle)) -> Kill {
        let relay = self.relay.take().expect("relay running");
        self.old_logs.push(relay.kill());
        // Nothing reaches the sink's dot from a dead relay: this is final.
        let at_sink = self.sink.stats().messages;
        between(&self.sink);
        let open_intents = open_intents(&self.db).await;
        let leased = leased_jobs(&self.db).await;
        self.relay = Some(start_relay(&self.db, &self.config, self.sink.smtp_addr()).await);
        Kill {
            at_sink,
            open_intents,
            leased,
        }
    }

    /// Everything the relays wrote, for failure messages (the tail: it can be long).
    fn context(&self) -> String {
        let mut all = self.old_logs.join("--- relay killed and restarted ---\n");
        if let Some(relay) = &self.relay {
            all.push_str("--- current relay ---\n");
            all.push_str(&relay.log());
        }
        let tail_start = all.len().saturating_sub(6000);
        let tail_start = (tail_start..all.len())
            .find(|&i| all.is_char_boundary(i))
            .unwrap_or(all.len());
        format!(
            "seed {:#x} (IDEMRELAY_CRASH_SEED); relay stderr (tail):\n{}",
            self.seed,
            &all[tail_start..]
        )
    }

    /// Waits until every record is terminal and no job is left.
    async fn wait_all_settled(&self, expected: usize) -> Ledger {
        let deadline = Instant::now() + LIMIT;
        loop {
            let ledger = Ledger::read(&self.db).await;
            let done = ledger.jobs == 0
                && ledger.messages.len() >= expected
                && ledger.messages.iter().all(|m| m.state != "queued");
            if done {
                return ledger;
            }
            assert!(
                Instant::now() < deadline,
                "records not settled within {LIMIT:?}: {} jobs left, states {:?}\n{}",
                ledger.jobs,
                ledger
                    .messages
                    .iter()
                    .map(|m| m.state.as_str())
                    .collect::<Vec<_>>(),
                self.context()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Submits one message per key, spread over `connections` concurrent sessions; returns
/// key → queue id from the 250s.
async fn submit_all(
    addr: SocketAddr,
    keys: &[String],
    connections: usize,
) -> BTreeMap<String, String> {
    let per = keys.len().div_ceil(connections);
    let mut tasks = Vec::new();
    for chunk in keys.chunks(per) {
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut client = Client::ready(addr).await;
            let mut ids = Vec::new();
            for key in chunk {
                let msg = message(
                    Some(&key),
                    &format!("crash test {key}"),
                    &format!("body of {key}\r\n.a dot-stuffed line\r\nend of {key}"),
                );
                let answer = client
                    .submit("sender@example.com", &["rcpt@example.com"], &msg)
                    .await;
                let id = answer
                    .queue_id()
                    .unwrap_or_else(|| panic!("{key} not accepted: {answer:?}"));
                assert_eq!(answer.line(), format!("250 2.0.0 OK queued as {id}"));
                ids.push((key, id));
            }
            client.quit().await;
            ids
        }));
    }
    let mut out = BTreeMap::new();
    for task in tasks {
        for (key, id) in task.await.expect("submitting task") {
            assert!(out.insert(key, id).is_none());
        }
    }
    out
}

/// The checks every crash run ends with. `accepted` is key → queue id. Returns, per key, the
/// number of raw transactions the sink saw.
fn assert_exactly_once(
    h: &Harness,
    ledger: &Ledger,
    accepted: &BTreeMap<String, String>,
) -> BTreeMap<String, usize> {
    let ctx = h.context();
    let stats = h.sink.stats();
    let messages = h.sink.messages();
    let transactions = h.sink.transactions();

    // The store holds exactly the accepted records, each delivered, under its key.
    assert_eq!(ledger.messages.len(), accepted.len(), "{ctx}");
    for (key, id) in accepted {
        let row = ledger.by_id(id);
        assert_eq!(row.key.as_deref(), Some(key.as_str()), "{ctx}");
        assert_eq!(row.state, "delivered", "{key} ({id}) {row:?}\n{ctx}");
    }

    // After the sink's dedup: every accepted key once, and nothing else.
    let at_sink: BTreeSet<&str> = stats.keys.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = accepted.keys().map(String::as_str).collect();
    assert_eq!(
        at_sink, expected,
        "unexpected or missing keys at the sink\n{ctx}"
    );
    for (key, st) in &stats.keys {
        assert_eq!(st.accepted, 1, "{key}: {st:?}\n{ctx}");
        assert_eq!(
            st.conflicts, 0,
            "{key}: bytes changed between attempts {st:?}\n{ctx}"
        );
    }
    assert_eq!(messages.len(), accepted.len(), "{ctx}");
    assert_eq!(stats.messages, accepted.len(), "{ctx}");

    let mut per_key: BTreeMap<String, usize> = BTreeMap::new();
    for m in &messages {
        let key = m.key.clone().expect("every message has a key");
        let stored = ledger.by_id(&accepted[&key]);
        assert_eq!(
            Some(&m.bytes),
            stored.content.as_ref(),
            "{key}: sink bytes differ from the stored bytes\n{ctx}"
        );
        // Every raw transaction under the key carried the very same bytes and envelope.
        let mine: Vec<_> = transactions
            .iter()
            .filter(|t| t.key.as_deref() == Some(key.as_str()))
            .collect();
        for t in &mine {
            assert_eq!(
                t.bytes, m.bytes,
                "{key}: transaction #{} differs\n{ctx}",
                t.seq
            );
            assert_eq!(t.mail_from, m.mail_from, "{ctx}");
            assert_eq!(t.rcpt_to, m.rcpt_to, "{ctx}");
        }
        let accepted_tx = mine
            .iter()
            .filter(|t| t.outcome == DotDecision::Accepted)
            .count();
        assert_eq!(accepted_tx, 1, "{key}: {mine:?}\n{ctx}");
        per_key.insert(key, mine.len());
    }
    assert!(
        transactions
            .iter()
            .all(|t| t.key.as_deref().is_some_and(|k| accepted.contains_key(k))),
        "a transaction under an unexpected key\n{ctx}"
    );

    // The ledger explains every raw transaction beyond the first: an attempt of that message
    // ended (or was found) UNKNOWN. Each transaction is one attempt, so there are never more
    // transactions than attempts; exactly one attempt was accepted, and it was the last.
    for (key, id) in accepted {
        let attempts = ledger.attempts_of(id);
        let tx = per_key[key];
        assert!(
            tx <= attempts.len(),
            "{key}: {tx} transactions but {} attempts: {attempts:?}\n{ctx}",
            attempts.len()
        );
        if tx > 1 {
            assert!(
                attempts
                    .iter()
                    .any(|a| a.outcome.as_deref() == Some("unknown")),
                "{key}: {tx} transactions without an unknown attempt: {attempts:?}\n{ctx}"
            );
        }
        assert!(
            attempts.iter().all(|a| a.outcome.is_some()),
            "{key}: an intent is still open: {attempts:?}\n{ctx}"
        );
        let numbers: Vec<i64> = attempts.iter().map(|a| a.attempt).collect();
        let want: Vec<i64> = (1..=attempts.len() as i64).collect();
        assert_eq!(numbers, want, "{key}: {attempts:?}\n{ctx}");
        let accepted_attempts: Vec<_> = attempts
            .iter()
            .filter(|a| a.outcome.as_deref() == Some("accepted"))
            .collect();
        assert_eq!(accepted_attempts.len(), 1, "{key}: {attempts:?}\n{ctx}");
        let last = attempts.last().unwrap();
        assert_eq!(last.outcome.as_deref(), Some("accepted"), "{ctx}");
        assert_eq!(last.code, Some(250), "{key}: {last:?}\n{ctx}");
        assert_eq!(last.phase.as_deref(), Some("dot"), "{key}: {last:?}\n{ctx}");
    }
    per_key
}

// --- the tests ---------------------------------------------------------------------------

const TOTAL: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_deliveries_are_in_flight_loses_and_duplicates_nothing() {
    let seed = seed();
    eprintln!("delivery_crash seed {seed:#x} (set IDEMRELAY_CRASH_SEED to replay)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();

    let sink = Sink::start(SinkConfig::default()).await.expect("sink");
    // Slow answers at the dot (the message is committed first): many attempts in flight.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_millis(300),
    )])
    .unwrap();
    let mut h = Harness::start(sink.clone(), 4, "5s", seed).await;

    let keys: Vec<String> = (0..TOTAL).map(|i| format!("crash-{i:02}")).collect();
    let accepted = submit_all(h.addr(), &keys, 4).await;
    assert_eq!(accepted.len(), TOTAL);

    // Two or three kills, each after a seeded number of further deliveries plus a seeded
    // fraction of a dot delay, so the kill lands anywhere in an attempt.
    // The next kill waits for the restarted relay to deliver a few more.
    let kills = 2 + rng.usize(0..=1);
    let mut delivered = 0;
    let mut report = Vec::new();
    for _ in 0..kills {
        let threshold = delivered + rng.usize(4..=16);
        if threshold > TOTAL - 8 {
            break;
        }
        if let Err(err) = sink.wait_until(LIMIT, |s| s.messages >= threshold).await {
            panic!(
                "no progress to {threshold} messages: {err}\n{}",
                h.context()
            );
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(0..300))).await;
        let kill = h.kill_and_restart().await;
        assert!(
            kill.at_sink >= 1 && kill.at_sink < TOTAL,
            "the kill must land while some but not all are delivered: {kill:?}\n{}",
            h.context()
        );
        delivered = kill.at_sink;
        report.push(kill);
    }
    assert!(report.len() >= 2, "{report:?}");

    let waited = sink
        .wait_until(LIMIT, |s| {
            keys.iter()
                .all(|k| s.keys.get(k).is_some_and(|st| st.accepted >= 1))
        })
        .await;
    if let Err(err) = waited {
        panic!("not every key reached the sink: {err}\n{}", h.context());
    }
    let ledger = h.wait_all_settled(TOTAL).await;
    // Anything still under way would show up now: give it a moment, then read again.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ledger_after = Ledger::read(&h.db).await;
    assert_eq!(ledger_after.jobs, 0);
    assert_eq!(
        ledger_after.attempts.values().map(Vec::len).sum::<usize>(),
        ledger.attempts.values().map(Vec::len).sum::<usize>(),
        "attempts after everything was delivered\n{}",
        h.context()
    );

    let per_key = assert_exactly_once(&h, &ledger, &accepted);

    // Not vacuous: the kills left intents open, and each was recovered as UNKNOWN by a later
    // claim (and retried with the same key and bytes, as checked above).
    let open: BTreeSet<(String, i64)> = report
        .iter()
        .flat_map(|k| k.open_intents.iter().cloned())
        .collect();
    assert!(
        !open.is_empty(),
        "no kill caught an attempt in flight: {report:?}\n{}",
        h.context()
    );
    let recovered: BTreeSet<(String, i64)> = ledger
        .attempts
        .iter()
        .flat_map(|(id, attempts)| {
            attempts
                .iter()
                .filter(|a| a.reply.as_deref() == Some(RECOVERED_REPLY))
                .map(move |a| (id.clone(), a.attempt))
        })
        .collect();
    assert_eq!(
        recovered,
        open,
        "every intent open at a kill, and only those, is closed as unknown on recovery: \
         {report:?}\n{}",
        h.context()
    );
    for a in ledger.attempts.values().flatten() {
        if a.reply.as_deref() == Some(RECOVERED_REPLY) {
            assert_eq!(a.outcome.as_deref(), Some("unknown"), "{a:?}");
        }
    }
    let raw: usize = per_key.values().sum();
    let kills: Vec<(usize, usize, i64)> = report
        .iter()
        .map(|k| (k.at_sink, k.open_intents.len(), k.leased))
        .collect();
    eprintln!(
        "delivery_crash: seed {seed:#x}, kills (at sink, open intents, leases) {kills:?}, \
         {TOTAL} keys, {raw} raw transactions, \
         {} intents recovered as unknown, {:?}",
        recovered.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_the_upstream_withholds_the_reply_recovers_unknown_and_replays() {
    let seed = seed();
    let sink = Sink::start(SinkConfig::default()).await.expect("sink");
    // The sink commits `hold-*` messages at the dot and keeps the reply back long enough for
    // the relay to be killed while it waits: the intent is open, the outcome is unknown.
    const HOLD: Duration = Duration::from_millis(2500);
    sink.set_faults(vec![
        FaultRule::delay(FaultStage::Dot, HOLD).with_key("hold-")
    ])
    .unwrap();
    // More connections than holds: the plain messages never wait behind a held one.
    let mut h = Harness::start(sink.clone(), 6, "10s", seed).await;

    let keys: Vec<String> = (0..4)
        .flat_map(|i| [format!("hold-{i}"), format!("plain-{i}")])
        .collect();
    let holds: Vec<&String> = keys.iter().filter(|k| k.starts_with("hold-")).collect();
    let hold_set: BTreeSet<String> = holds.iter().map(|k| k.to_string()).collect();
    let accepted = submit_all(h.addr(), &keys, 2).await;

    // All four holds have reached the sink's dot (and are committed there) and wait for their
    // reply with their intents open; the plain ones are delivered and settled.
    let reached = sink
        .wait_until(LIMIT, |s| {
            holds
                .iter()
                .all(|k| s.keys.get(*k).is_some_and(|st| st.transactions >= 1))
        })
        .await;
    if let Err(err) = reached {
        panic!("holds not in flight: {err}\n{}", h.context());
    }
    let deadline = Instant::now() + LIMIT;
    loop {
        let open = open_intent_keys(&h.db).await;
        let delivered = Ledger::read(&h.db)
            .await
            .messages
            .iter()
            .filter(|m| m.state == "delivered")
            .count();
        if open == hold_set && delivered == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "open intents {open:?} (want the holds), {delivered} delivered (want the 4 plain)\n{}",
            h.context()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Kill while the replies are withheld; the sink stops delaying new transactions, but the
    // four committed ones stay "in progress" until their delay is over (E01004 meanwhile).
    let kill = h
        .kill_and_restart_with(|sink| sink.set_faults(Vec::new()).unwrap())
        .await;
    assert_eq!(kill.open_intents.len(), 4, "{kill:?}\n{}", h.context());
    assert!(kill.leased >= 4, "{kill:?}\n{}", h.context());

    let waited = sink
        .wait_until(LIMIT, |s| {
            holds
                .iter()
                .all(|k| s.keys.get(*k).is_some_and(|st| st.replayed >= 1))
        })
        .await;
    if let Err(err) = waited {
        panic!("holds not replayed: {err}\n{}", h.context());
    }
    let ledger = h.wait_all_settled(keys.len()).await;
    assert_exactly_once(&h, &ledger, &accepted);
    let ctx = h.context();
    let stats = sink.stats();
    let messages = sink.messages();

    for key in &holds {
        let id = &accepted[*key];
        let st = &stats.keys[*key];
        assert_eq!(st.accepted, 1, "{key}: {st:?}\n{ctx}");
        assert!(st.replayed >= 1, "{key}: {st:?}\n{ctx}");
        let attempts = ledger.attempts_of(id);
        // 1: the intent the kill left open, closed as UNKNOWN by the restarted relay.
        let first = &attempts[0];
        assert_eq!(
            first.outcome.as_deref(),
            Some("unknown"),
            "{attempts:?}\n{ctx}"
        );
        assert_eq!(first.reply.as_deref(), Some(RECOVERED_REPLY), "{ctx}");
        // Then, while the sink still ran the first request: E01004, a transient refusal.
        let middle = &attempts[1..attempts.len() - 1];
        for a in middle {
            assert_eq!(
                a.outcome.as_deref(),
                Some("transient"),
                "{attempts:?}\n{ctx}"
            );
            assert_eq!(a.code, Some(451), "{attempts:?}\n{ctx}");
            assert!(
                a.reply.as_deref().is_some_and(|r| r.contains("E01004")),
                "{attempts:?}\n{ctx}"
            );
        }
        // Last: the same key and bytes, answered from the upstream's record.
        let last = attempts.last().unwrap();
        assert_eq!(last.outcome.as_deref(), Some("accepted"), "{ctx}");
        let reply = last.reply.as_deref().unwrap_or_default();
        assert!(reply.ends_with("(idempotent replay)"), "{last:?}\n{ctx}");
        // ... naming the message the sink accepted before the kill.
        let original = messages
            .iter()
            .find(|m| m.key.as_deref() == Some(key.as_str()))
            .unwrap();
        assert!(
            reply.contains(&original.id),
            "{reply} vs {}\n{ctx}",
            original.id
        );
        let row = ledger.by_id(id);
        assert_eq!(row.upstream_reply.as_deref(), Some(reply), "{ctx}");
    }
    for key in keys.iter().filter(|k| k.starts_with("plain-")) {
        let st = &stats.keys[key];
        assert_eq!(
            (st.accepted, st.transactions),
            (1, 1),
            "{key}: {st:?}\n{ctx}"
        );
    }
}

/// A restarted relay does not wait for the dead relay's leases to run out (the worst-case
/// attempt time plus a margin: 42 s with this test's timeouts, about half an hour with the
/// defaults): it sees in the store that their owner's heartbeat has stopped, takes them over
/// within seconds, and retries the in-flight mail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_takes_over_the_leases_of_the_killed_relay_at_once() {
    let sink = Sink::start(SinkConfig::default()).await.expect("sink");
    // Long enough for the polling below and the kill to happen while both replies are held.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_secs(4),
    )])
    .unwrap();
    let mut h = Harness::start(sink.clone(), 2, "10s", seed()).await;
    let keys: Vec<String> = (0..2).map(|i| format!("lease-{i}")).collect();
    let accepted = submit_all(h.addr(), &keys, 1).await;
    // Both messages are committed at the sink, which withholds the replies; both intents
    // are open.
    let at_dot = sink
        .wait_until(LIMIT, |s| {
            keys.iter()
                .all(|k| s.keys.get(k).is_some_and(|st| st.transactions >= 1))
        })
        .await;
    if let Err(err) = at_dot {
        panic!("not at the sink's dot: {err}\n{}", h.context());
    }
    let deadline = Instant::now() + LIMIT;
    while open_intents(&h.db).await.len() < 2 {
        assert!(Instant::now() < deadline, "{}", h.context());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kill = h.kill_and_restart().await;
    assert_eq!((kill.open_intents.len(), kill.leased), (2, 2), "{kill:?}");
    let restarted = Instant::now();
    // Each retry meets E01004 or the delay once more; far below the 42 s lease either way.
    let within = Duration::from_secs(15);
    let resumed = sink
        .wait_until(within, |s| {
            keys.iter()
                .all(|k| s.keys.get(k).is_some_and(|st| st.replayed >= 1))
        })
        .await;
    if let Err(err) = resumed {
        panic!(
            "in-flight mail not retried within {within:?} of the restart: {err}\njobs: {}\n{}",
            jobs_dump(&h.db).await,
            h.context()
        );
    }
    let ledger = h.wait_all_settled(keys.len()).await;
    assert_exactly_once(&h, &ledger, &accepted);
    let log = h.relay.as_ref().unwrap().log();
    assert!(
        log.contains("took over leases of a relay process whose heartbeat stopped"),
        "{}",
        h.context()
    );
    eprintln!(
        "lease takeover: delivered {:?} after the restart",
        restarted.elapsed()
    );
}

/// `[delivery.timeouts]` with only the phases one wants to change, as an operator writes it.
#[test]
fn a_partial_timeouts_table_keeps_the_other_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.toml");
    std::fs::write(&config, "[delivery.timeouts]\ndot = \"800ms\"\n").unwrap();
    let out = idemrelay()
        .env_remove("IDEMRELAY_CONFIG")
        .arg("check-config")
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run idemrelay check-config");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}{stderr}", out.status);
    assert!(stdout.contains("dot = \"800ms\""), "{stdout}");
    assert!(stdout.contains("connect = \"30s\""), "{stdout}");
}
