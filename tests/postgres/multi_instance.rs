//! Several relay instances on one Postgres database, black-box: three `idemrelay serve`
//! processes share a fresh schema and deliver to one in-process sink (which dedups by key like
//! the real upstream). Many clients submit, some the same key to two instances at the same
//! moment; one instance is SIGKILLed while deliveries are in flight, and its clients retry on
//! the others. Every accepted key must reach the sink exactly once, under one queue id.
//!
//! Skips (saying so) unless `IDEMRELAY_TEST_POSTGRES` names a database.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::backend;
use common::process::RelayProcess;
use common::{message, Client};
use idemrelay::store::{self, State};
use idemrelay_sink::{DotDecision, FaultRule, FaultStage, Sink, SinkConfig};
use tokio::sync::Semaphore;

const KEYS: usize = 150;
/// Every fourth key is sent to two instances at once.
const RACED_EVERY: usize = 4;
const LIMIT: Duration = Duration::from_secs(60);

fn write_config(path: &std::path::Path) {
    write_delivery_config(path, 3, "5s");
}

/// Delivery settings for quick tests: `connections` workers, `dot` as the final-dot timeout.
pub(crate) fn write_delivery_config(path: &std::path::Path, connections: usize, dot: &str) {
    // Every phase is listed: `[delivery.timeouts]` does not accept a partial table.
    let text = format!(
        r#"
[delivery]
connections = {connections}
scan_interval = "50ms"
retry_base = "50ms"
retry_cap = "300ms"
max_attempts = 200
breaker_threshold = 1000

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

fn serve(store: &str, config: &std::path::Path, upstream: SocketAddr) -> RelayProcess {
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--hostname",
        "relay.test",
        "--store",
        store,
        "--config",
        &config.display().to_string(),
        "--upstream",
        &format!("smtp://{upstream}?tls=none"),
        "--admin",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    RelayProcess::spawn(&args)
}

fn key_message(key: &str) -> Vec<u8> {
    message(
        Some(key),
        &format!("multi-instance {key}"),
        &format!("body of {key}\r\n.a dot-stuffed line\r\nend of {key}"),
    )
}

/// Submits until a 250 (retrying on another instance after a failure or a 4xx, as a client
/// behind a load balancer would); returns the queue id.
async fn submit_until_accepted(addrs: Vec<SocketAddr>, first: usize, key: String) -> String {
    let msg = key_message(&key);
    let deadline = Instant::now() + LIMIT;
    let mut target = first;
    loop {
        let answer = Client::try_submit(
            addrs[target % addrs.len()],
            "sender@example.com",
            &["rcpt@example.com"],
            &msg,
        )
        .await;
        match answer {
            Some(a) if a.code == 250 => {
                return a
                    .queue_id()
                    .unwrap_or_else(|| panic!("{key}: 250 without a queue id: {a:?}"));
            }
            Some(a) if a.code >= 500 => panic!("{key}: refused for good: {a:?}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "{key}: never accepted");
        target += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idemrelay_test_postgres),
    ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
)]
async fn three_instances_on_one_postgres_deliver_every_key_once_through_a_sigkill() {
    let Some(base) = backend::postgres_or_skip("multi_instance") else {
        return;
    };
    let url = backend::fresh_schema(&base).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.toml");
    write_config(&config);
    let sink = Sink::start(SinkConfig::default()).await.expect("sink");
    // Slow answers at the dot: many attempts are in flight when the kill lands.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_millis(250),
    )])
    .unwrap();

    // Started together: the three run the migrations concurrently on the fresh schema.
    let spawned: Vec<RelayProcess> = (0..3)
        .map(|_| serve(&url, &config, sink.smtp_addr()))
        .collect();
    let mut relays = Vec::new();
    for r in spawned {
        relays.push(r.ready().await);
    }
    let addrs: Vec<SocketAddr> = relays.iter().map(|r| r.addr).collect();

    // Clients: one task per submission, 40 at a time; a raced key has two tasks that start on
    // different instances at the same moment.
    let ids: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
    let gate = Arc::new(Semaphore::new(40));
    let mut tasks = Vec::new();
    let mut submissions = 0;
    for k in 0..KEYS {
        let key = format!("multi-{k:03}");
        let starts: Vec<usize> = if k % RACED_EVERY == 0 {
            vec![k % 3, (k + 1) % 3]
        } else {
            vec![k % 3]
        };
        let barrier = Arc::new(tokio::sync::Barrier::new(starts.len()));
        for first in starts {
            submissions += 1;
            let (addrs, key, ids, gate, barrier) = (
                addrs.clone(),
                key.clone(),
                ids.clone(),
                gate.clone(),
                barrier.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                barrier.wait().await;
                let id = submit_until_accepted(addrs, first, key.clone()).await;
                ids.lock().unwrap().entry(key).or_default().insert(id);
            }));
        }
    }

    // SIGKILL the third instance once deliveries are under way.
    sink.wait_until(LIMIT, |s| s.messages >= 20)
        .await
        .expect("deliveries start");
    tokio::time::sleep(Duration::from_millis(120)).await;
    let killed = relays.pop().unwrap();
    let killed_log = killed.kill();
    let at_kill = sink.stats().messages;

    for t in tasks {
        t.await.expect("client task");
    }
    let ids = Arc::try_unwrap(ids).unwrap().into_inner().unwrap();
    assert_eq!(ids.len(), KEYS, "every key was accepted in the end");
    for (key, set) in &ids {
        assert_eq!(set.len(), 1, "{key} got two different queue ids: {set:?}");
    }

    // Wait for the survivors to deliver everything, the killed instance's jobs included.
    let reader = store::open(&url, Duration::from_secs(5)).await.unwrap();
    let deadline = Instant::now() + LIMIT;
    let records = loop {
        let records = reader.list(None, 10_000, None).await.unwrap();
        if records.len() == KEYS && records.iter().all(|r| r.state == State::Delivered) {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "not all delivered: {:?}\nkilled relay's log tail:\n{}",
            records
                .iter()
                .filter(|r| r.state != State::Delivered)
                .collect::<Vec<_>>(),
            tail(&killed_log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // One record per key, under the id every client was given.
    let by_key: BTreeMap<String, String> = records
        .iter()
        .map(|r| (r.key.clone().expect("keyed"), r.id.clone()))
        .collect();
    assert_eq!(by_key.len(), KEYS);
    for (key, set) in &ids {
        assert_eq!(set.iter().next(), Some(&by_key[key]), "{key}");
    }

    // At the sink, after its dedup: every key once, nothing else, identical bytes.
    let stats = sink.stats();
    let transactions = sink.transactions();
    let at_sink: BTreeSet<&String> = stats.keys.keys().collect();
    assert_eq!(at_sink, ids.keys().collect::<BTreeSet<_>>());
    let mut extra = 0;
    let mut unknown = 0;
    for (key, st) in &stats.keys {
        assert_eq!(st.accepted, 1, "{key}: {st:?}");
        assert_eq!(st.conflicts, 0, "{key}: bytes changed between attempts");
        let mine: Vec<_> = transactions
            .iter()
            .filter(|t| t.key.as_deref() == Some(key.as_str()))
            .collect();
        assert!(mine.iter().all(|t| t.bytes == mine[0].bytes), "{key}");
        assert_eq!(
            mine.iter()
                .filter(|t| t.outcome == DotDecision::Accepted)
                .count(),
            1,
            "{key}"
        );
        let ledger = reader.attempts(&by_key[key]).await.unwrap();
        assert!(
            ledger.iter().all(|a| a.outcome.is_some()),
            "{key}: {ledger:?}"
        );
        let unknowns = ledger
            .iter()
            .filter(|a| a.outcome.as_deref() == Some("unknown"))
            .count();
        unknown += unknowns;
        if mine.len() > 1 {
            extra += mine.len() - 1;
            assert!(
                unknowns > 0,
                "{key}: {} transactions without an unknown attempt: {ledger:?}",
                mine.len()
            );
        }
    }
    eprintln!(
        "multi_instance: T={KEYS} keys in {submissions} submissions, A={} accepted, \
         D={} delivered after dedup, R={} raw transactions ({extra} extra), \
         {unknown} UNKNOWN attempts, {at_kill} at the sink when instance 3 was killed",
        ids.len(),
        stats.messages,
        transactions.len()
    );
    assert_eq!(stats.messages, KEYS);
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

// --- liveness: containers that share a host name and PID 1 ---------------------------------

/// How long the sink holds every reply to the final dot: attempts stay in flight that long.
const HELD_DOT: Duration = Duration::from_secs(6);

fn liveness_config(path: &std::path::Path) {
    // A long final-dot timeout makes the lease long (the worst-case attempt plus 10 s, here
    // over 40 s): a takeover within seconds can only come from the heartbeat.
    write_delivery_config(path, 2, "25s");
}

/// `idemrelay serve` as PID 1 of a PID namespace of its own (as in a container), on this
/// host's name; `--kill-child` makes a SIGKILL of the `unshare` process reach the relay.
fn serve_in_pid_namespace(
    store: &str,
    config: &std::path::Path,
    upstream: SocketAddr,
) -> RelayProcess {
    let mut cmd = std::process::Command::new("unshare");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("IDEMRELAY_") {
            cmd.env_remove(name);
        }
    }
    let args: Vec<String> = [
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        common::process::BIN,
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--hostname",
        "relay.test",
        "--store",
        store,
        "--config",
        &config.display().to_string(),
        "--upstream",
        &format!("smtp://{upstream}?tls=none"),
        "--admin",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    RelayProcess::spawn_command(cmd, &args)
}

fn pid_namespaces_available() -> bool {
    std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

async fn ledgers(
    store: &dyn store::Store,
    ids: &[String],
) -> BTreeMap<String, Vec<store::AttemptRow>> {
    let mut out = BTreeMap::new();
    for id in ids {
        out.insert(id.clone(), store.attempts(id).await.unwrap());
    }
    out
}

async fn wait_all_delivered(store: &dyn store::Store, ids: &[String], within: Duration) {
    let deadline = Instant::now() + within;
    for id in ids {
        loop {
            let m = store.message(id).await.unwrap().unwrap();
            if m.state == State::Delivered {
                break;
            }
            assert!(Instant::now() < deadline, "{id} not delivered: {m:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// docs/guides/postgres.md "Liveness": two relays, each PID 1 in its own PID namespace with the same host
/// name (containers with host networking), share one Postgres. While both live, neither takes
/// the other's leases (each attempt is the only one of its message); once one is SIGKILLed,
/// the other takes over its jobs within seconds, long before their leases would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idemrelay_test_postgres),
    ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
)]
async fn relays_in_their_own_pid_namespaces_take_over_only_a_dead_sibling() {
    let Some(base) = backend::postgres_or_skip("liveness in PID namespaces") else {
        return;
    };
    if !pid_namespaces_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "unshare --pid cannot run here, and CI must run this test"
        );
        eprintln!("SKIPPED liveness in PID namespaces: `unshare --pid --fork --mount-proc` fails (needs root)");
        return;
    }
    let url = backend::fresh_schema(&base).await;
    let reader = store::open(&url, Duration::from_secs(5)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.toml");
    liveness_config(&config);
    let sink = Sink::start(SinkConfig::default()).await.expect("sink");
    sink.set_faults(vec![FaultRule::delay(FaultStage::Dot, HELD_DOT)])
        .unwrap();
    let first = serve_in_pid_namespace(&url, &config, sink.smtp_addr())
        .ready()
        .await;
    let second = serve_in_pid_namespace(&url, &config, sink.smtp_addr())
        .ready()
        .await;
    let addrs = vec![first.addr, second.addr];

    // Both alive: four attempts in flight at once (two per relay), each held for seconds.
    let mut calm = Vec::new();
    for n in 0..4 {
        calm.push(submit_until_accepted(addrs.clone(), n, format!("calm-{n}")).await);
    }
    wait_all_delivered(reader.as_ref(), &calm, LIMIT).await;
    for (id, ledger) in ledgers(reader.as_ref(), &calm).await {
        assert_eq!(
            ledger.len(),
            1,
            "{id}: a live sibling's lease was taken over: {ledger:?}\nfirst:\n{}\nsecond:\n{}",
            tail(&first.log()),
            tail(&second.log())
        );
    }

    // Four more in flight, then one relay dies mid-attempt.
    let mut orphaned = Vec::new();
    for n in 0..4 {
        orphaned.push(submit_until_accepted(addrs.clone(), n, format!("orphan-{n}")).await);
    }
    sink.wait_until(LIMIT, |s| s.transactions >= 8)
        .await
        .expect("all four in flight");
    let killed_at = common::now_ms();
    first.kill();
    wait_all_delivered(reader.as_ref(), &orphaned, LIMIT).await;
    let mut taken_over = 0;
    for (id, ledger) in ledgers(reader.as_ref(), &orphaned).await {
        if ledger.len() < 2 {
            continue;
        }
        taken_over += 1;
        assert_eq!(
            ledger[0].outcome.as_deref(),
            Some("unknown"),
            "{id}: {ledger:?}"
        );
        let after = ledger[1].started_at_ms - killed_at;
        eprintln!("{id}: taken over {after} ms after the SIGKILL");
        assert!(
            after < 20_000,
            "{id}: taken over {after} ms after the kill (the lease is over 40 s): {ledger:?}"
        );
    }
    assert!(
        taken_over > 0,
        "the killed relay held none of the jobs in flight\n{}",
        tail(&second.log())
    );
    // One copy per key at the sink, after its dedup.
    let stats = sink.stats();
    for key in (0..4).flat_map(|n| [format!("calm-{n}"), format!("orphan-{n}")]) {
        assert_eq!(stats.keys[&key].accepted, 1, "{key}");
    }
}
