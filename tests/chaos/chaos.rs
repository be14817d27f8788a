//! Chaos test of exactly-once, black-box. Run it with
//!
//! ```sh
//! cargo test --locked --features failpoints --test chaos
//! ```
//!
//! Without the `failpoints` feature this file compiles to nothing: the relay binary under test
//! (`CARGO_BIN_EXE_idemrelay`, built with the test's features) must carry the crash points of
//! `crates/model/src/failpoint.rs`.
//!
//! Relay processes deliver to an in-process `idemrelay sink` (which deduplicates by key within
//! its window, like the real upstream) while client tasks submit a few thousand messages and
//! retry (same key, same bytes) until they get a 250 or a 5xx. Some keys are submitted by two
//! clients at once with the same bytes, some with different bytes (one must get E01005 and never
//! be forwarded). Some are split messages (docs/concepts/contract.md "Split transactions"): the same bytes in
//! two or three transactions with disjoint recipient sets, one after the other or all at once,
//! each its own part, and each part re-sent once after its 250 (it must replay its own queue
//! id). Some keys are used by two scopes at once (users alice and bob, who AUTH PLAIN, and the
//! unauthenticated clients' scope), each with its own bytes: both are accepted. With several
//! scopes on the one upstream, every key the sink sees is `u1-<scope tag>-<part>-<key>`
//! (docs/concepts/contract.md "The key the upstream sees"), mapped back to (scope, key, part) through the store.
//! Faults: the relay is SIGKILLed at random moments and aborts at its crash points (and is
//! restarted on the same store each time), clients hang up right after the final dot, the sink
//! cuts the connection or withholds its reply after the dot, answers 4xx in bursts, and the
//! store is locked from outside for about a second.
//!
//! Scenarios: one relay on SQLite; two relays on one Postgres schema (skipped, saying so,
//! unless `IDEMRELAY_TEST_POSTGRES` names a database). Everything is counted per unit, a
//! (scope, key, part): each scenario prints T (units attempted), A (answered 250), D (delivered
//! at the sink after its dedup) and R (raw sink transactions), and fails unless: nothing
//! answered 250 is missing at the sink, nothing is there twice or unasked for, every part and
//! every scope of a key got its own record and its own upstream key, every raw transaction
//! beyond the first is explained by an UNKNOWN attempt inside the upstream window, no
//! mismatched bytes (or recipients) are forwarded, and no UNKNOWN is retried past the window.
//!
//! `IDEMRELAY_CHAOS_SEED` (decimal, `0x` hex, or `random`) replays a run's plan: which keys get
//! which fault, the schedule of kills, locks and bursts, and the crash points' draws. Thread
//! and I/O timing still differ between runs, so a replay is the same storm, not the same
//! interleaving. `IDEMRELAY_CHAOS_MESSAGES` sets the keys per scenario (default 1300: about
//! 1500 units, as much delivery work as the 1500 keys of one part each before splits and
//! shared keys, so that the queue's delays stay well inside the window).
#![cfg(feature = "failpoints")]

use crate::common;
#[path = "power_loss.rs"]
mod power_loss;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::backend::{self, WriteLock};
use common::dot_stuff;
use common::process::RelayProcess;
use idemrelay::store::{self, AttemptRow, State, Store};
use idemrelay_sink::{
    AttemptOutcome, DotDecision, FaultRule, FaultStage, RetryPolicy, Sink, SinkConfig, SinkHandle,
    WebhookAttempt, WebhookConfig, WebhookFault,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

// The helpers, by part; each reads what it needs from this file with `use super::*`.
mod audit;
mod client;
mod events;
mod plan;
mod relays;
mod report;
use audit::*;
use client::*;
use events::*;
use plan::*;
use relays::*;
use report::*;

const SEED_ENV: &str = "IDEMRELAY_CHAOS_SEED";
const COUNT_ENV: &str = "IDEMRELAY_CHAOS_MESSAGES";
const DEFAULT_SEED: u64 = 0xc4a0_5eed_1d3e_0007;
const DEFAULT_COUNT: usize = 1300;

/// The upstream's idempotency window, for the relay (`upstream_window`) and the sink alike.
/// Short, so that a retry past it would reach a sink that has forgotten the key and be
/// counted as a duplicate, and so that the past-window keys finish within the run; long
/// enough that the queue's own delays (a backlog on SQLite, where every claim, intent and
/// outcome is an fsync'd write) stay well inside it, or a retry of a cut connection would be
/// parked unresolved and count as lost.
const WINDOW: Duration = Duration::from_secs(60);
const MARGIN: Duration = Duration::from_secs(5);
/// The intent row is written just after the window check, and may wait for the store (up to
/// `store_busy_timeout`) in between; an attempt started this much past the limit is not yet
/// a violation. Anything that reaches the sink is held to the window itself.
const INTENT_SLACK: Duration = Duration::from_secs(1);
/// The relay's deadline for the reply to the final dot; the sink withholds it for longer.
const DOT_TIMEOUT: &str = "1s";
const WITHHOLD: Duration = Duration::from_millis(1600);
/// Concurrent client tasks (a key submitted twice at once, or split, holds one). Split keys
/// hold theirs for four to six submissions: 20 keep intake within the spread, as 16 did
/// before there were any.
const CLIENTS: usize = 20;
/// One submission (connect to reply) may take this long before the client gives up on it.
const TRY_LIMIT: Duration = Duration::from_secs(15);
/// A key that is neither accepted nor refused within this is a liveness failure.
const KEY_LIMIT: Duration = Duration::from_secs(150);
/// The storm lasts at least this long, and at least until the clients are done.
const STORM_MIN: Duration = Duration::from_secs(22);
/// Submissions start evenly spread over this.
const SUBMIT_SPREAD: Duration = Duration::from_secs(20);
/// Waiting for the queue (and the sink's webhook posts) to drain once the clients are done.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// The relays' webhook source (`[webhooks.upstream]`) and the secret the sink signs with.
const HOOK_SOURCE: &str = "upstream";
const HOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The sink's retries of a webhook post: quick and many, so that a post that met a relay
/// being restarted or a locked store is back within a second, and no batch is given up
/// while the storm lasts (a post starts at most `deadline` after the first).
const HOOK_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(100),
    max_delay: Duration::from_secs(1),
    max_attempts: 1000,
    deadline: Duration::from_secs(150),
};

/// Read once: with `random`, both scenarios and every message must name the same seed.
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| match std::env::var(SEED_ENV).as_deref().map(str::trim) {
        Ok("random") => fastrand::u64(..),
        Ok("") | Err(_) => DEFAULT_SEED,
        Ok(s) => s
            .strip_prefix("0x")
            .map_or_else(|| s.parse(), |hex| u64::from_str_radix(hex, 16))
            .unwrap_or_else(|e| panic!("{SEED_ENV}={s:?}: {e}")),
    })
}

fn count() -> usize {
    std::env::var(COUNT_ENV).map_or(DEFAULT_COUNT, |s| {
        s.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{COUNT_ENV}={s:?}: {e}"))
    })
}

/// Independent streams for the scenarios and the relay incarnations from one seed.
fn mix(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// --- the scenario --------------------------------------------------------------------------

struct Scenario {
    name: &'static str,
    tag: &'static str,
    /// Makes the scenarios' plans differ under one seed.
    salt: u64,
    store_url: String,
    instances: usize,
}

#[derive(Debug, Default)]
struct Counts {
    /// Units (scope, key, part) attempted, answered 250, delivered at the sink after its
    /// dedup; raw transactions.
    t: usize,
    a: usize,
    d: usize,
    r: usize,
    /// The mix: split keys (racing ones among them) and their parts, keys of two scopes.
    split_keys: usize,
    racing_splits: usize,
    split_parts: usize,
    shared_keys: usize,
    /// Parts sent again after their 250, and those answered as a replay of it.
    resent: usize,
    replayed: usize,
    submissions: usize,
    tries: u64,
    lost_tries: u64,
    deferred_tries: u64,
    deferrals: BTreeMap<String, u64>,
    e01005: usize,
    faulted_units: usize,
    unknown_attempts: usize,
    unresolved: usize,
    /// The longest wait between two attempts of one message, past-window keys aside: the
    /// queue's delay, to be compared with the window.
    longest_gap_ms: i64,
    longest_gap_unit: String,
    /// Unresolved although the sink did not drop every reply: only a stuck queue does that.
    parked_early: usize,
    extra_raw: usize,
    /// Pass criteria: each must be 0.
    lost: usize,
    duplicated: usize,
    unexpected: usize,
    /// Delivered although no client was ever told 250 (its retries must get the replay).
    unanswered: usize,
    unexplained_extra: usize,
    mismatched_forwarded: usize,
    unknown_after_window: usize,
}

async fn list_all(reader: &dyn Store) -> Vec<store::MessageSummary> {
    let mut all = Vec::new();
    loop {
        let page = reader
            .list(
                None,
                1000,
                all.last().map(|m: &store::MessageSummary| m.id.as_str()),
            )
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        all.extend(page);
    }
    all
}

/// What a scenario left behind once its storm is over and every relay is stopped: the plan,
/// what each client was told, the sink and the store to read, and the storm's own counts.
struct Ran {
    scenario: Scenario,
    seed: u64,
    /// Keys in the plan.
    n: usize,
    plans: Vec<Plan>,
    answers: BTreeMap<String, Vec<Submitted>>,
    sink: SinkHandle,
    reader: Arc<dyn Store>,
    cluster: Cluster,
    storm: Storm,
    balanced: Arc<Mutex<Balanced>>,
    started: Instant,
    submitted_in: Duration,
    /// The longest wait for a free client, and the key that took longest.
    gate_wait: Duration,
    slowest: (Duration, String),
    /// The relays' config and users; removed when the run is dropped.
    _dir: tempfile::TempDir,
}

async fn run(scenario: Scenario) {
    let ran = storm(scenario).await;
    let audit = audit(&ran).await;
    report(&ran, &audit);
}

/// Plans the keys, starts the sink, the relays and the storm, has every key submitted, and
/// waits until every record is settled and every planned event posted.
async fn storm(scenario: Scenario) -> Ran {
    let seed = mix(seed(), scenario.salt);
    let n = count();
    eprintln!(
        "chaos {}: seed {seed:#x} from {SEED_ENV}={:#x} (set it to replay), {n} keys",
        scenario.name,
        self::seed()
    );
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut plans = make_plans(&mut rng, scenario.tag, n);
    plan_hooks(&mut fastrand::Rng::with_seed(mix(seed, 0x3b)), &mut plans);

    // The balancer is bound first: the sink needs its address, the relays the sink's.
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/webhooks/{HOOK_SOURCE}",
        front.local_addr().unwrap()
    );
    let mut webhook = WebhookConfig::new(url.parse().unwrap(), vec![HOOK_SECRET.parse().unwrap()]);
    webhook.retry = HOOK_RETRY;
    webhook.timeout = Duration::from_secs(5);
    let sink = Sink::start(SinkConfig {
        window: WINDOW,
        faults: plans
            .iter()
            .filter_map(sink_rule)
            .chain(plans.iter().filter_map(hook_rule))
            .collect(),
        webhook: Some(webhook),
        ..SinkConfig::default()
    })
    .await
    .expect("sink");
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    write_users(&users);
    let config = dir.path().join("relay.toml");
    write_config(&config, &users);
    // About four firings of each point per scenario, whatever the number of keys.
    let p = 4.0 / n as f64;
    let failpoints = idemrelay::failpoint::NAMES
        .iter()
        .map(|name| format!("{name}={p}"))
        .collect::<Vec<_>>()
        .join(",");
    let cluster = Cluster::start(
        scenario.store_url.clone(),
        config,
        sink.smtp_addr(),
        scenario.instances,
        failpoints,
        rng.u64(..),
    )
    .await;
    let addrs = cluster.addrs.clone();
    let balanced = Arc::new(Mutex::new(Balanced::default()));
    let balancer = tokio::spawn(balance(front, cluster.hooks.clone(), balanced.clone()));
    let (stage_tx, stage_rx) = watch::channel(Stage::Storm);
    let chaos_task = tokio::spawn(chaos(cluster, sink.clone(), rng.u64(..), stage_rx));

    let gate = Arc::new(Semaphore::new(CLIENTS));
    let mut tasks = Vec::new();
    // Paced over most of the storm: submitting as fast as possible takes a few seconds, and
    // the store locks and kills would then find intake idle.
    let paced = tokio::time::Instant::now();
    for (i, plan) in plans.iter().enumerate() {
        let (plan, addrs, gate) = (plan.clone(), addrs.clone(), gate.clone());
        let key_seed = rng.u64(..);
        let instances = scenario.instances;
        let at = paced + SUBMIT_SPREAD.mul_f64(i as f64 / n as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let _permit = gate.acquire_owned().await.unwrap();
            let waited = at.elapsed();
            let key = plan.key.clone();
            let subs = run_key(plan, addrs, instances, key_seed).await;
            (key, subs, waited, at.elapsed() - waited)
        }));
    }
    let mut answers: BTreeMap<String, Vec<Submitted>> = BTreeMap::new();
    // The longest wait for a free client, and the key that took longest.
    let mut gate_wait = Duration::ZERO;
    let mut slowest = (Duration::ZERO, String::new());
    for t in tasks {
        let (key, subs, waited, took) = t.await.expect("client task");
        gate_wait = gate_wait.max(waited);
        if took > slowest.0 {
            slowest = (took, key.clone());
        }
        answers.insert(key, subs);
    }
    let submitted_in = started.elapsed();
    // Intake is quicker than delivery: the storm goes on for a while, so that kills, locks
    // and bursts also land in the middle of deliveries.
    tokio::time::sleep((started + STORM_MIN).saturating_duration_since(Instant::now())).await;
    stage_tx.send(Stage::Drain).unwrap();

    // Every record terminal: delivered, or parked once its window is over; and every event
    // batch the sink planned posted to the end (a 2xx is only given after the relay's commit,
    // so every resolution an event makes is in the store by then).
    let reader = store::open(&scenario.store_url, Duration::from_secs(10))
        .await
        .expect("open the store for reading");
    let deadline = Instant::now() + DRAIN_LIMIT;
    loop {
        let records = list_all(reader.as_ref()).await;
        let queued = records.iter().filter(|r| r.state == State::Queued).count();
        let posting = sink.stats().webhooks.pending;
        if queued == 0 && posting == 0 {
            break;
        }
        if Instant::now() >= deadline {
            stage_tx.send(Stage::Stop).unwrap();
            let (cluster, _) = chaos_task.await.unwrap();
            panic!(
                "{queued} records still queued and {posting} webhook batches pending \
                 {DRAIN_LIMIT:?} after the clients finished (seed {seed:#x})\n{}",
                cluster.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    balancer.abort();
    stage_tx.send(Stage::Stop).unwrap();
    let (mut cluster, storm) = chaos_task.await.unwrap();
    // Nothing runs while the results are read (dropping a relay SIGKILLs it).
    for i in 0..cluster.relays.len() {
        if let Some(relay) = cluster.relays[i].take() {
            cluster.dead_logs.push(relay.log());
        }
    }

    Ran {
        scenario,
        seed,
        n,
        plans,
        answers,
        sink,
        reader,
        cluster,
        storm,
        balanced,
        started,
        submitted_in,
        gate_wait,
        slowest,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_one_relay_on_sqlite_delivers_every_accepted_key_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("relay.db").display());
    run(Scenario {
        name: "sqlite (one relay)",
        tag: "sq",
        salt: 1,
        store_url: url,
        instances: 1,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idemrelay_test_postgres),
    ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
)]
async fn chaos_two_relays_on_postgres_deliver_every_accepted_key_exactly_once() {
    let Some(base) = backend::postgres_or_skip("chaos (two relays on Postgres)") else {
        return;
    };
    run(Scenario {
        name: "postgres (two relays)",
        tag: "pg",
        salt: 2,
        store_url: backend::fresh_schema(&base).await,
        instances: 2,
    })
    .await;
}
