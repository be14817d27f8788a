//! The Postgres failover drill, on this machine's PostgreSQL binaries: a primary and a
//! streaming standby (two clusters in a tempdir, on free ports; the Postgres on 5432 is not
//! used), two `idemrelay serve` processes sharing the store through a URL that names both
//! hosts, six SMTP clients submitting distinct keys (each retrying a key until it gets a
//! 250, as a mailer does), and the test sink upstream. Mid-load the standby goes down
//! (commits now wait for it), then every process of the primary is SIGKILLed while commits
//! wait, and the standby comes back, read-only, and is promoted once both relays have passed
//! over it. The relays must find the new primary by themselves, answer only 421 4.3.2 at connect or 451 4.3.0 at the dot (E01033) meanwhile,
//! and every key that got a 250 must be in the promoted store under the id it was given and
//! reach the upstream exactly once.
//!
//! The same drill with asynchronous replication is the check of the checker: there the
//! relays acknowledge commits the standby never received, and the drill must count them as
//! lost. (The standby is stopped rather than frozen with SIGSTOP: the kernel of a frozen
//! standby still takes the WAL into its socket buffers, and it reads it after the thaw.)
//!
//! Compiled as ignored unless `IDEMRELAY_TEST_POSTGRES` is set, like the other Postgres
//! tests (it needs no database of its own there, only the PostgreSQL server binaries); it
//! skips, saying why, without `initdb`, `pg_ctl` and `pg_basebackup` under
//! /usr/lib/postgresql/*/bin, except under `CI`, where it fails.

use crate::common;
use crate::multi_instance::write_delivery_config;
use crate::postgres_outage::{E01033_AT_CONNECT, E01033_AT_DOT};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::RelayProcess;
use common::{backend, message, Client};
use idemrelay::store::{self, State};
use idemrelay_sink::{FaultRule, FaultStage, Sink, SinkConfig, SinkHandle};
use sqlx::Connection;

// The helpers, by part; each reads what it needs from this file with `use super::*`.
mod clusters;
use clusters::*;

const CLIENTS: usize = 6;
/// How long the standby stays down before the primary is killed: long enough for every
/// client to be waiting on a commit the standby has not confirmed.
const STALL: Duration = Duration::from_millis(1500);
const LIMIT: Duration = Duration::from_secs(60);
/// The relays' `--store-busy-timeout` and `--store-probe-interval`: a dead host is noticed
/// within about busy + 1 s (the pool's wait for a connection), the new one within a probe.
const BUSY: &str = "1s";
const PROBE: &str = "200ms";

// --- the clients ----------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Outcome {
    /// The queue id, and whether the 250 said `(idempotent replay)`.
    Accepted(String, bool),
    Refused(String),
    /// The connection failed or closed before an answer.
    Dropped,
}

#[derive(Debug, Clone)]
struct Try {
    relay: usize,
    key: String,
    started: Instant,
    answered: Instant,
    outcome: Outcome,
}

/// Submits keys `failover-{client}-{n}` to one relay, each until it gets a 250; stops between
/// keys once `stop` is set.
async fn client(
    n_client: usize,
    relay: usize,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Try>>>,
) {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("failover-{n_client}-{n}");
        let msg = message(Some(&key), "failover", &format!("body of {key}"));
        let deadline = Instant::now() + LIMIT;
        loop {
            let started = Instant::now();
            let answer =
                Client::try_submit(addr, "sender@example.com", &["rcpt@example.com"], &msg).await;
            let outcome = match answer {
                Some(a) if a.code == 250 => Outcome::Accepted(
                    a.queue_id().unwrap_or_else(|| a.line()),
                    a.line().ends_with("(idempotent replay)"),
                ),
                Some(a) => Outcome::Refused(a.line()),
                None => Outcome::Dropped,
            };
            let accepted = matches!(outcome, Outcome::Accepted(..));
            log.lock().unwrap().push(Try {
                relay,
                key: key.clone(),
                started,
                answered: Instant::now(),
                outcome,
            });
            if accepted {
                break;
            }
            assert!(Instant::now() < deadline, "{key}: no 250 within {LIMIT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn serve(store: &str, config: &Path, upstream: SocketAddr) -> RelayProcess {
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--hostname",
        "relay.test",
        "--store",
        store,
        "--store-busy-timeout",
        BUSY,
        "--store-probe-interval",
        PROBE,
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

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// What one drill saw.
#[derive(Debug, Default)]
struct Figures {
    submissions: usize,
    /// Keys answered 250 (each exactly one queue id, or the drill fails).
    acknowledged: usize,
    refused_at_dot: usize,
    refused_at_connect: usize,
    /// Refusals other than those two (must be none).
    refused_other: Vec<String>,
    dropped: usize,
    /// 250s for submissions begun after the standby went down and answered before it was
    /// promoted: acknowledged without the standby's flush.
    acked_without_standby: usize,
    /// Acknowledged keys whose record is not in the promoted store under the id given.
    lost_in_store: Vec<String>,
    /// Acknowledged keys the upstream never accepted.
    lost_upstream: Vec<String>,
    /// Keys the upstream accepted more than once.
    duplicated: Vec<String>,
    /// Keys sent upstream more than once (the upstream replayed the copies).
    resent: usize,
    /// Of those, keys whose ledger has no UNKNOWN attempt to explain the copy.
    resent_without_unknown: Vec<String>,
    /// 250s that replayed a record (a retry of a submission refused after its commit).
    replayed: usize,
    /// Refusals answered before the kill, while the standby was down (waits for locks that
    /// commits waiting for the standby held).
    refused_before_kill: usize,
    /// From the standby going down to the first refusal.
    first_refusal: Option<Duration>,
    /// The standby was down this long before the kill.
    stall: Duration,
    promoted_after_kill: Duration,
    /// From the kill to the first 250 for a submission begun after it.
    kill_to_service: Duration,
    /// From the first refusal to that 250.
    without_service: Duration,
    /// From the kill until every record of the promoted store was delivered (not awaited
    /// in the asynchronous drill).
    all_delivered: Option<Duration>,
}

impl Figures {
    /// Acknowledged keys lost either way (missing from the store, or never upstream).
    fn lost(&self) -> usize {
        self.lost_in_store
            .iter()
            .chain(&self.lost_upstream)
            .collect::<BTreeSet<_>>()
            .len()
    }

    fn print(&self, replication: Replication) {
        let upstream = match self.all_delivered {
            Some(_) => format!("{} never upstream", self.lost_upstream.len()),
            None => "the upstream not checked".to_string(),
        };
        eprintln!(
            "failover drill ({replication:?}):\n  \
             {} submissions, {} keys acknowledged ({} of them by a replay)\n  \
             refused: {} at the dot (451 4.3.0 E01033), {} at connect (421 4.3.2 E01033), {} \
             other, {} dropped; {} of them before the kill\n  \
             acknowledged while the standby was down: {}\n  \
             lost: {} ({} not in the promoted store, {upstream})\n  \
             duplicated upstream: {} ({} keys sent again after an UNKNOWN attempt, answered \
             by the upstream's replay)\n  \
             standby down {} s before the kill; first refusal {} s after it went down; \
             standby promoted {} s after the kill; first 250 {} s after the kill; all \
             delivered {} s after the kill\n  \
             seconds without service (first refusal to next 250): {}",
            self.submissions,
            self.acknowledged,
            self.replayed,
            self.refused_at_dot,
            self.refused_at_connect,
            self.refused_other.len(),
            self.dropped,
            self.refused_before_kill,
            self.acked_without_standby,
            self.lost(),
            self.lost_in_store.len(),
            self.duplicated.len(),
            self.resent,
            secs(self.stall),
            self.first_refusal.map_or("-".into(), secs),
            secs(self.promoted_after_kill),
            secs(self.kill_to_service),
            self.all_delivered.map_or("-".into(), secs),
            secs(self.without_service),
        );
    }
}

/// Runs the drill; returns what it saw (the callers decide what must hold) and panics only
/// when the drill itself cannot go on.
async fn drill(bin: PgBin, replication: Replication) -> Figures {
    let pair = start_pair(bin, replication).await;
    let (primary, standby) = (&pair.primary, &pair.standby);
    // A store whose only host is the standby is refused at once, under either target that
    // asks for a writable server, naming the reason.
    for (attrs, says) in [
        ("read-write", ": not read-write"),
        ("primary", ": not primary"),
    ] {
        let url = format!("{}?target_session_attrs={attrs}", standby.url());
        let refused = store::open(&url, Duration::from_secs(5)).await.err();
        assert!(
            refused
                .as_ref()
                .is_some_and(|e| e.to_string().contains(says)),
            "{url}: {refused:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.toml");
    write_delivery_config(&config, 3, "2s");
    let sink: SinkHandle = Sink::start(SinkConfig::default()).await.expect("sink");
    // Slower answers at the dot: deliveries are in flight when the standby goes down and
    // the primary dies (short enough that the backlog drains in seconds afterwards).
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_millis(20),
    )])
    .unwrap();

    // Both hosts in each URL, in both orders: one relay starts on the first host, the other
    // must pass over the standby it lists first; the first says target_session_attrs, the
    // second relies on its default with several hosts.
    let (p, s) = (primary.host(), standby.host());
    let urls = [
        format!("postgres://postgres@{p},{s}/postgres?target_session_attrs=read-write"),
        format!("postgres://postgres@{s},{p}/postgres"),
    ];
    let spawned: Vec<RelayProcess> = urls
        .iter()
        .map(|u| serve(u, &config, sink.smtp_addr()))
        .collect();
    let mut relays = Vec::new();
    for r in spawned {
        relays.push(r.ready().await);
    }

    let log: Arc<Mutex<Vec<Try>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let relay = c % relays.len();
            tokio::spawn(client(
                c,
                relay,
                relays[relay].addr,
                stop.clone(),
                log.clone(),
            ))
        })
        .collect();
    let accepted = |log: &Mutex<Vec<Try>>| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|t| matches!(t.outcome, Outcome::Accepted(..)))
            .count()
    };
    let deadline = Instant::now() + LIMIT;
    while accepted(&log) < 60 || sink.stats().messages < 20 {
        assert!(
            Instant::now() < deadline,
            "no steady load before the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The standby goes down (its machine stops); commits now wait for it.
    let standby_data = standby.data.display().to_string();
    pair.bin.run(
        "pg_ctl",
        &[
            "-D",
            &standby_data,
            "-m",
            "immediate",
            "-w",
            "-t",
            "30",
            "stop",
        ],
    );
    let standby_down_at = Instant::now();
    tokio::time::sleep(STALL).await;
    // The primary's machine dies: every process of it at once, commits still waiting.
    let killed = primary.signal_all("KILL");
    // Taken once `kill` has returned: no commit of the primary can end after this.
    let killed_at = Instant::now();
    assert!(killed >= 2, "primary processes: {killed}");
    // The standby comes back with what it had flushed, read-only. It is promoted only once
    // both relays have looked for a writable host and passed over it (as a failover tool
    // that takes its time to decide): a relay must not take a standby for the new primary.
    let standby_log = standby.data.with_extension("log").display().to_string();
    pair.bin.run(
        "pg_ctl",
        &[
            "-D",
            &standby_data,
            "-l",
            &standby_log,
            "-w",
            "-t",
            "30",
            "start",
        ],
    );
    let passed_over = format!("{s}: not read-write");
    let deadline = Instant::now() + LIMIT;
    while !relays.iter().all(|r| r.log().contains(&passed_over)) {
        assert!(
            Instant::now() < deadline,
            "the relays did not look for a writable host; logs:\n{}",
            relays
                .iter()
                .map(|r| tail(&r.log()))
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pair.bin.run(
        "pg_ctl",
        &["-D", &standby_data, "-w", "-t", "30", "promote"],
    );
    let promoted_at = Instant::now();

    // Each relay serves again by itself: a 250 for a submission begun after the promotion.
    let deadline = Instant::now() + LIMIT;
    loop {
        let back: BTreeSet<usize> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|t| t.started > promoted_at && matches!(t.outcome, Outcome::Accepted(..)))
            .map(|t| t.relay)
            .collect();
        if back.len() == relays.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "relays {back:?} serve again, not all; logs:\n{}",
            relays
                .iter()
                .map(|r| tail(&r.log()))
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }
    let tries = Arc::try_unwrap(log).unwrap().into_inner().unwrap();

    // Each relay moved to the promoted standby by itself, and says so.
    for (n, relay) in relays.iter().enumerate() {
        let text = relay.log();
        assert!(
            text.contains("now go to another host") && text.contains(&s),
            "relay {n} did not log its move to {s}:\n{}",
            tail(&text)
        );
    }

    let mut f = Figures {
        submissions: tries.len(),
        stall: killed_at - standby_down_at,
        promoted_after_kill: promoted_at - killed_at,
        ..Figures::default()
    };
    let mut acked: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in &tries {
        match &t.outcome {
            Outcome::Accepted(id, replay) => {
                acked.entry(t.key.clone()).or_default().insert(id.clone());
                f.replayed += usize::from(*replay);
                if t.started > standby_down_at && t.answered < promoted_at {
                    f.acked_without_standby += 1;
                }
            }
            Outcome::Refused(line) if line == E01033_AT_DOT => f.refused_at_dot += 1,
            Outcome::Refused(line) if line == E01033_AT_CONNECT => f.refused_at_connect += 1,
            Outcome::Refused(line) => f.refused_other.push(line.clone()),
            Outcome::Dropped => f.dropped += 1,
        }
        if !matches!(t.outcome, Outcome::Accepted(..)) && t.answered < killed_at {
            f.refused_before_kill += 1;
        }
    }
    f.acknowledged = acked.len();
    for (key, ids) in &acked {
        assert_eq!(ids.len(), 1, "{key} was given two queue ids: {ids:?}");
    }
    let first_refusal = tries
        .iter()
        .filter(|t| !matches!(t.outcome, Outcome::Accepted(..)))
        .map(|t| t.answered)
        .min();
    f.first_refusal = first_refusal.map(|t| t.saturating_duration_since(standby_down_at));
    let back_at = tries
        .iter()
        .filter(|t| t.started > killed_at && matches!(t.outcome, Outcome::Accepted(..)))
        .map(|t| t.answered)
        .min()
        .expect("a 250 after the kill");
    f.kill_to_service = back_at - killed_at;
    f.without_service = back_at.saturating_duration_since(first_refusal.unwrap_or(back_at));

    // Everything the promoted store holds is delivered (refused submissions whose commit had
    // reached the standby included: a retry of theirs was replayed). The asynchronous drill
    // only counts what the store lost: waiting out the leases its lost claims left behind
    // would add half a minute to CI and show nothing more.
    let reader = store::open(&standby.url(), Duration::from_secs(5))
        .await
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    let records = loop {
        let records = reader.list(None, 100_000, None).await.unwrap();
        if replication == Replication::Asynchronous
            || records.iter().all(|r| r.state == State::Delivered)
        {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "not all delivered after the failover: {:?}\nrelay logs:\n{}",
            records
                .iter()
                .filter(|r| r.state != State::Delivered)
                .collect::<Vec<_>>(),
            relays
                .iter()
                .map(|r| tail(&r.log()))
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if replication == Replication::Synchronous {
        f.all_delivered = Some(killed_at.elapsed());
    }
    let stored: BTreeMap<String, String> = records
        .iter()
        .filter_map(|r| Some((r.key.clone()?, r.id.clone())))
        .collect();
    let stats = sink.stats();
    for (key, ids) in &acked {
        let id = ids.iter().next().unwrap();
        if stored.get(key) != Some(id) {
            f.lost_in_store.push(key.clone());
        }
        if replication == Replication::Synchronous
            && stats.keys.get(key).is_none_or(|k| k.accepted == 0)
        {
            f.lost_upstream.push(key.clone());
        }
    }
    for (key, k) in &stats.keys {
        assert_eq!(k.conflicts, 0, "{key}: the bytes changed between attempts");
        if k.accepted > 1 {
            f.duplicated.push(key.clone());
        }
        // Sent again (the upstream answered the copy from its record): only after an attempt
        // whose outcome the relay could not know, which its ledger says.
        if k.transactions > 1 {
            f.resent += 1;
            if let Some(id) = stored.get(key) {
                let ledger = reader.attempts(id).await.unwrap();
                if !ledger
                    .iter()
                    .any(|a| a.outcome.as_deref() == Some("unknown"))
                {
                    f.resent_without_unknown.push(format!("{key}: {ledger:?}"));
                }
            }
        }
    }
    f
}

/// The binaries, or None after saying why the drill skips (never under `CI`).
fn binaries_or_skip(test: &str) -> Option<PgBin> {
    backend::postgres_or_skip(test)?;
    match PgBin::find() {
        Ok(bin) => Some(bin),
        Err(why) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{test}: {why}; CI must run the failover drill (apt-get install postgresql)"
            );
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idemrelay_test_postgres),
    ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
)]
async fn failover_to_a_synchronous_standby_loses_no_acknowledged_message() {
    let Some(bin) = binaries_or_skip("failover drill") else {
        return;
    };
    let f = drill(bin, Replication::Synchronous).await;
    f.print(Replication::Synchronous);
    assert!(f.acknowledged > 0);
    assert_eq!(
        f.acked_without_standby, 0,
        "250s given while the standby could not confirm the commit"
    );
    assert!(f.lost_in_store.is_empty(), "lost: {:?}", f.lost_in_store);
    assert!(
        f.lost_upstream.is_empty(),
        "never upstream: {:?}",
        f.lost_upstream
    );
    assert!(
        f.duplicated.is_empty(),
        "duplicated upstream: {:?}",
        f.duplicated
    );
    assert!(
        f.resent_without_unknown.is_empty(),
        "sent twice without an UNKNOWN attempt: {:?}",
        f.resent_without_unknown
    );
    assert!(
        f.refused_other.is_empty(),
        "answers other than E01033: {:?}",
        f.refused_other
    );
    assert_eq!(f.dropped, 0, "connections closed without an answer");
    // The kill caught submissions waiting at the dot: they were refused, not left hanging.
    assert!(
        f.refused_at_dot > 0,
        "no 451 at the dot: the switch went unnoticed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idemrelay_test_postgres),
    ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
)]
async fn the_drill_finds_the_losses_of_asynchronous_replication() {
    let Some(bin) = binaries_or_skip("failover drill, asynchronous") else {
        return;
    };
    let f = drill(bin, Replication::Asynchronous).await;
    f.print(Replication::Asynchronous);
    // Without a synchronous standby, the relays acknowledged what only the primary had, and
    // the drill saw those messages missing after the promotion.
    assert!(
        f.acked_without_standby > 0,
        "nothing acknowledged while the standby was down"
    );
    assert!(
        !f.lost_in_store.is_empty(),
        "acknowledged messages the standby never received were not found lost"
    );
}
