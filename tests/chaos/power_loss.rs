//! Power cuts (docs/operations/data.md: "a power cut loses nothing that was answered
//! 250"). The relay's SQLite store, spool included, sits on LazyFS, a FUSE file system that
//! keeps every unsynced byte in its own cache; `lazyfs::clear-cache` drops them, as a power cut
//! would. Concurrent clients submit keyed messages (a mix of small ones, kept inline, and
//! spool-sized ones) while the relay, which delivers to an in-process sink, is repeatedly
//! SIGKILLed, the cache cleared, and the relay restarted on the same store. After every cut,
//! every key answered 250 so far must replay (same bytes, same queue id, "(idempotent
//! replay)"); at the end every acknowledged key must be at the sink exactly once, with the
//! bytes that were submitted behind the relay's `Received:` field.
//!
//! LazyFS is built from `tools/lazyfs` (`build.sh` into `target/tmp/lazyfs`, once; it installs
//! the Debian packages it needs) unless `IDEMRELAY_LAZYFS` names a built binary. Mounting it
//! needs /dev/fuse and root. When LazyFS cannot be built or mounted the test says SKIPPED,
//! except under `CI`, where it fails. LazyFS caches data only: file creation, rename and
//! unlink reach the disk at once, so a cut never loses a directory entry.
//!
//! `IDEMRELAY_POWER_LOSS_EATMYDATA=1` runs the relay under `eatmydata` (fsync does nothing), and
//! the test then passes only if it finds lost acknowledged messages: it can see lost writes.
//! `IDEMRELAY_CHAOS_SEED` replays the plan (sizes, when the cuts come).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemrelay::store::{self, State};
use idemrelay_sink::SinkHandle;
use tokio::sync::Semaphore;

use super::common::process::{self, RelayProcess};
use super::{list_all, mix, queue_id, seed, submit_once, tail, Try, SEED_ENV};

// The helpers, by part; each reads what it needs from this file with `use super::*`.

const EATMYDATA_ENV: &str = "IDEMRELAY_POWER_LOSS_EATMYDATA";
const LAZYFS_ENV: &str = "IDEMRELAY_LAZYFS";
const MESSAGES: usize = 500;
const CUTS: usize = 10;
const CLIENTS: usize = 8;
/// Bodies from this size on go to the spool (`SPOOL_MIN` in crates/store/src/sqlite/spool.rs).
const SPOOL_MIN: usize = 32 * 1024;
/// Waiting for the clients to get this many 250s before the next cut.
const PROGRESS_LIMIT: Duration = Duration::from_secs(90);
/// A key neither accepted nor refused within this is a liveness failure.
const KEY_LIMIT: Duration = Duration::from_secs(120);
/// A replay that gets no answer within this (dead connections, 4xx) counts as failed.
const REPLAY_LIMIT: Duration = Duration::from_secs(60);
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
const MOUNT_LIMIT: Duration = Duration::from_secs(30);

/// Why the test cannot run here: SKIPPED, or a failure under CI.
fn unavailable(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("power-loss test cannot run (CI is set, so this is a failure): {why}");
    }
    eprintln!("SKIPPED power_cuts_on_sqlite_lose_no_acknowledged_message: {why}");
}

fn eatmydata_mode() -> bool {
    match std::env::var(EATMYDATA_ENV).as_deref().map(str::trim) {
        Ok("1") | Ok("true") | Ok("yes") => true,
        Ok("0") | Ok("") | Ok("false") | Ok("no") | Err(_) => false,
        Ok(other) => panic!("{EATMYDATA_ENV}={other:?}: expected 1 or 0"),
    }
}

// --- the relay and the clients -------------------------------------------------------------

fn write_config(path: &Path) {
    // Every phase is listed: `[delivery.timeouts]` does not accept a partial table. Quick
    // retries; deadlines a loaded machine does not reach (no UNKNOWN from slowness alone).
    let text = r#"
[delivery]
connections = 3
scan_interval = "50ms"
retry_base = "50ms"
retry_cap = "400ms"
max_attempts = 100000
rate = 2000.0
burst = 2000.0
breaker_threshold = 100000
breaker_cooldown = "100ms"

[delivery.timeouts]
connect = "5s"
greeting = "5s"
starttls = "5s"
auth = "5s"
mail = "5s"
rcpt = "5s"
data = "5s"
dot = "5s"
"#;
    std::fs::write(path, text).unwrap();
}

fn spawn_relay(args: &[String], eatmydata: bool) -> RelayProcess {
    if !eatmydata {
        return RelayProcess::spawn(args);
    }
    // The same cleaned environment as `idemrelay()`, with the binary run by `eatmydata` (which
    // execs it: the child is still the relay, and SIGKILL reaches it).
    let clean = process::idemrelay();
    let mut cmd = Command::new("eatmydata");
    for (name, value) in clean.get_envs() {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    cmd.arg("--").arg(process::BIN);
    RelayProcess::spawn_command(cmd, args)
}

struct Msg {
    key: String,
    bytes: Vec<u8>,
}

impl Msg {
    fn spooled(&self) -> bool {
        // The stored body is the relay's Received field (about 150 bytes) and these bytes;
        // the sizes used here are far from the threshold.
        self.bytes.len() >= SPOOL_MIN
    }

    fn describe(&self) -> String {
        format!(
            "{} ({} bytes, {})",
            self.key,
            self.bytes.len(),
            if self.spooled() { "spooled" } else { "inline" }
        )
    }
}

fn make_messages(rng: &mut fastrand::Rng) -> Vec<Msg> {
    (0..MESSAGES)
        .map(|i| {
            // Fixed width: no key contains another.
            let key = format!("power-{i:05}");
            let size = if rng.usize(0..3) == 0 {
                rng.usize(40 * 1024..64 * 1024)
            } else {
                rng.usize(900..1200)
            };
            let mut body =
                format!("power-loss message {key}\r\n.a line that needs dot-stuffing\r\n");
            let mut n = 0;
            while body.len() < size {
                body.push_str(&format!(
                    "line {n:05} of {key}: the quick brown fox jumps over the lazy dog\r\n"
                ));
                n += 1;
            }
            body.push_str("end");
            let bytes = super::common::message(Some(&key), &format!("power loss {key}"), &body);
            Msg { key, bytes }
        })
        .collect()
}

/// What the clients and the cuts share.
#[derive(Default)]
struct Shared {
    /// The running relay; `None` between a cut and the restart.
    addr: Mutex<Option<SocketAddr>>,
    next: AtomicUsize,
    /// Messages with a lower index may be submitted (raised batch by batch).
    allowed: AtomicUsize,
    /// Message index → the queue id its client was given (updated when a lost record is
    /// accepted again under a new id).
    acked: Mutex<BTreeMap<usize, String>>,
    /// Every queue id each message was given (more than one only after a loss).
    ids: Mutex<BTreeMap<usize, BTreeSet<String>>>,
    /// Refusals and give-ups: never expected.
    problems: Mutex<Vec<String>>,
}

impl Shared {
    fn ack(&self, i: usize, id: String) {
        self.ids
            .lock()
            .unwrap()
            .entry(i)
            .or_default()
            .insert(id.clone());
        self.acked.lock().unwrap().insert(i, id);
    }
}

/// One client: takes the next message, submits it until a 250 or a 5xx (same bytes every
/// time, waiting out the relay's restarts), and so on.
async fn client(shared: Arc<Shared>, msgs: Arc<Vec<Msg>>, mut rng: fastrand::Rng) {
    loop {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        let Some(msg) = msgs.get(i) else { return };
        while i >= shared.allowed.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let deadline = Instant::now() + KEY_LIMIT;
        loop {
            if Instant::now() > deadline {
                shared.problems.lock().unwrap().push(format!(
                    "{}: neither accepted nor refused within {KEY_LIMIT:?}",
                    msg.describe()
                ));
                break;
            }
            let addr = *shared.addr.lock().unwrap();
            let Some(addr) = addr else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            match submit_once(addr, &msg.bytes, false).await {
                Try::Answer(250, line) => {
                    let id = queue_id(&line).unwrap_or_else(|| format!("250 without id: {line}"));
                    shared.ack(i, id);
                    break;
                }
                Try::Answer(code, line) if code >= 500 => {
                    shared
                        .problems
                        .lock()
                        .unwrap()
                        .push(format!("{}: refused: {line}", msg.describe()));
                    break;
                }
                Try::Answer(..) | Try::Lost => {}
            }
            tokio::time::sleep(Duration::from_millis(rng.u64(10..100))).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(0..20))).await;
    }
}

/// A replay of an acknowledged message: `Ok` when the relay answers with the original id as a
/// replay, otherwise what it answered.
async fn replay(addr: SocketAddr, msg: &Msg, id: &str) -> Result<(), String> {
    let deadline = Instant::now() + REPLAY_LIMIT;
    let mut last = String::from("no try");
    while Instant::now() < deadline {
        match submit_once(addr, &msg.bytes, false).await {
            Try::Answer(250, line) => {
                let same = queue_id(&line).as_deref() == Some(id);
                return if same && line.ends_with(idemrelay::reply::REPLAY_SUFFIX) {
                    Ok(())
                } else {
                    Err(line)
                };
            }
            Try::Answer(code, line) if code >= 500 => return Err(line),
            Try::Answer(_, line) => last = line,
            Try::Lost => last = "no reply".into(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("no answer within {REPLAY_LIMIT:?} (last: {last})"))
}

/// A lost acknowledged message, as seen.
struct Loss {
    index: usize,
    what: String,
}

/// Replays every message acknowledged before the cut, a few at a time, while the clients go
/// on submitting. A lost record that the replay got accepted again is acknowledged anew.
async fn replay_all(
    addr: SocketAddr,
    cut: usize,
    acked: BTreeMap<usize, String>,
    msgs: &Arc<Vec<Msg>>,
    shared: &Arc<Shared>,
) -> Vec<Loss> {
    let gate = Arc::new(Semaphore::new(CLIENTS));
    let mut tasks = Vec::new();
    for (i, id) in acked {
        let (gate, msgs) = (gate.clone(), msgs.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            (i, id.clone(), replay(addr, &msgs[i], &id).await)
        }));
    }
    let mut losses = Vec::new();
    for t in tasks {
        let (i, id, result) = t.await.expect("replay task");
        if let Err(seen) = result {
            if let Some(new_id) = seen
                .strip_prefix("250 ")
                .and_then(|_| queue_id(&seen))
                .filter(|new| *new != id)
            {
                shared.ack(i, new_id);
            }
            losses.push(Loss {
                index: i,
                what: format!(
                    "{}: answered 250 as {id}, replay after cut {cut} got: {seen}",
                    msgs[i].describe()
                ),
            });
        }
    }
    losses
}

/// The relay's `Received:` field, naming one of the queue ids the message was given.
fn received_field_naming(prefix: &[u8], ids: &BTreeSet<String>) -> bool {
    let Ok(text) = std::str::from_utf8(prefix) else {
        return false;
    };
    let lines: Vec<&str> = text.split_inclusive("\r\n").collect();
    text.starts_with("Received: ")
        && text.ends_with("\r\n")
        && lines[1..].iter().all(|l| l.starts_with('\t'))
        && ids.iter().any(|id| text.contains(&format!(" id {id};")))
}

// --- the test ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_on_sqlite_lose_no_acknowledged_message() {
    let eatmydata = eatmydata_mode();
    if eatmydata {
        let found = Command::new("eatmydata").arg("true").status();
        assert!(
            found.is_ok_and(|s| s.success()),
            "{EATMYDATA_ENV}=1 needs eatmydata (apt-get install -y eatmydata)"
        );
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return unavailable(&format!("cannot open /dev/fuse: {e}"));
    }
    if Command::new("fusermount3").arg("-V").output().is_err() {
        return unavailable("fusermount3 is missing (apt-get install -y fuse3)");
    }
    let bin = match lazyfs_binary() {
        Ok(bin) => bin,
        Err(e) => return unavailable(&format!("LazyFS cannot be built: {e}")),
    };
    let dir = tempfile::tempdir().unwrap();
    let fs = match LazyFs::mount(&bin, dir.path()) {
        Ok(fs) => fs,
        Err(e) => return unavailable(&format!("LazyFS cannot be mounted: {e}")),
    };

    let seed = mix(seed(), 13);
    let mode = if eatmydata {
        "eatmydata: fsync is a no-op, lost messages must be found"
    } else {
        "normal"
    };
    eprintln!(
        "power loss ({mode}): seed {seed:#x} from {SEED_ENV}={:#x}, {MESSAGES} messages, \
         {CUTS} cuts",
        self::seed()
    );
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let msgs = Arc::new(make_messages(&mut rng));

    let sink: SinkHandle = super::common::start_sink().await;
    let db = fs.mnt.join("relay.db");
    let store_url = process::store_url(&db);
    let config = dir.path().join("relay.toml");
    write_config(&config);
    let args = process::serve_args(
        &db,
        &[
            "--config",
            &config.display().to_string(),
            "--upstream",
            &format!("smtp://{}?tls=none", sink.smtp_addr()),
        ],
    );
    let mut relay = spawn_relay(&args, eatmydata).ready().await;
    let shared = Arc::new(Shared::default());
    *shared.addr.lock().unwrap() = Some(relay.addr);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(client(shared.clone(), msgs.clone(), rng.fork())))
        .collect();

    // The plan of cuts: most come while a batch of submissions is in flight; the others
    // (`quick`) soon after a restart, while the relay recovers and delivers its backlog.
    let quick: Vec<bool> = (0..CUTS).map(|c| c > 0 && rng.u32(0..4) == 0).collect();
    let batches = quick.iter().filter(|q| !**q).count();
    // The clients submit in batches, one per cut that waits for one and one after the last.
    let step = MESSAGES / (batches + 1);
    let mut batch = 0;
    let mut losses: Vec<Loss> = Vec::new();
    let mut dead_logs: Vec<String> = Vec::new();
    let mut replays = 0;
    let mut downtime = Duration::ZERO;
    for cut in 1..=CUTS {
        if quick[cut - 1] {
            tokio::time::sleep(Duration::from_millis(rng.u64(0..300))).await;
        } else {
            batch += 1;
            shared.allowed.store(batch * step, Ordering::Relaxed);
            // The cut comes with the batch's last few submissions still in flight.
            let target = batch * step - rng.usize(0..=CLIENTS.min(step / 2));
            let waiting = Instant::now();
            while shared.acked.lock().unwrap().len() < target {
                assert!(
                    waiting.elapsed() < PROGRESS_LIMIT,
                    "cut {cut}: fewer than {target} messages acknowledged after \
                     {PROGRESS_LIMIT:?}; problems {:?}; relay log:\n{}",
                    shared.problems.lock().unwrap(),
                    tail(&relay.log(), 40)
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            tokio::time::sleep(Duration::from_millis(rng.u64(0..20))).await;
        }

        let down = Instant::now();
        *shared.addr.lock().unwrap() = None;
        dead_logs.push(relay.kill());
        fs.clear_cache().await;
        // Every 250 counted here came from a relay now dead: each must have survived.
        let acked = shared.acked.lock().unwrap().clone();
        relay = spawn_relay(&args, eatmydata).ready().await;
        downtime += down.elapsed();
        *shared.addr.lock().unwrap() = Some(relay.addr);
        if quick.get(cut) == Some(&true) {
            // Checked after the next cut, which comes before the replays would be done.
            continue;
        }
        replays += acked.len();
        let lost = replay_all(relay.addr, cut, acked, &msgs, &shared).await;
        // Under eatmydata nearly everything is lost at every cut: a few lines tell enough.
        let shown = if eatmydata { 3 } else { lost.len() };
        for l in lost.iter().take(shown) {
            eprintln!("power loss: LOST {}", l.what);
        }
        if lost.len() > shown {
            eprintln!(
                "power loss: ... and {} more lost at cut {cut}",
                lost.len() - shown
            );
        }
        losses.extend(lost);
    }
    shared.allowed.store(MESSAGES, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client task");
    }
    let submitted_in = started.elapsed();

    // The relay stays up: everything queued must reach the sink.
    let reader = store::open(&store_url, Duration::from_secs(10))
        .await
        .expect("open the store for reading");
    let deadline = Instant::now() + DRAIN_LIMIT;
    let drained = loop {
        let queued = list_all(reader.as_ref())
            .await
            .iter()
            .filter(|r| r.state == State::Queued)
            .count();
        if queued == 0 {
            break true;
        }
        if Instant::now() >= deadline {
            eprintln!("power loss: {queued} records still queued after {DRAIN_LIMIT:?}");
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if !eatmydata {
        assert!(
            drained,
            "records still queued {DRAIN_LIMIT:?} after the clients finished; relay log:\n{}",
            tail(&relay.log(), 40)
        );
    }

    let acked = shared.acked.lock().unwrap().clone();
    let ids = shared.ids.lock().unwrap().clone();
    let records: BTreeMap<String, store::MessageSummary> = list_all(reader.as_ref())
        .await
        .into_iter()
        .filter_map(|r| Some((r.key.clone()?, r)))
        .collect();
    let stats = sink.stats();
    let transactions = sink.transactions();
    let mut violations: Vec<String> = Vec::new();
    let mut duplicated = 0;
    let mut mismatched = 0;
    let mut resent = 0;
    for (&i, id) in &acked {
        let msg = &msgs[i];
        let key = msg.key.as_str();
        match records.get(key) {
            None => losses.push(Loss {
                index: i,
                what: format!(
                    "{}: answered 250 as {id}, no record at the end",
                    msg.describe()
                ),
            }),
            Some(r) if r.id != *id => losses.push(Loss {
                index: i,
                what: format!(
                    "{}: answered 250 as {id}, but the record is {}",
                    msg.describe(),
                    r.id
                ),
            }),
            Some(r) if r.state != State::Delivered => losses.push(Loss {
                index: i,
                what: format!(
                    "{}: answered 250 as {id}, ended {:?} ({:?})",
                    msg.describe(),
                    r.state,
                    r.upstream_reply
                ),
            }),
            Some(_) => {}
        }
        let accepted = stats.keys.get(key).map_or(0, |s| s.accepted);
        if accepted == 0 {
            losses.push(Loss {
                index: i,
                what: format!("{}: answered 250 as {id}, never delivered", msg.describe()),
            });
        } else if accepted > 1 {
            duplicated += accepted as usize - 1;
            violations.push(format!("{key}: delivered {accepted} times"));
        }
        let txs: Vec<_> = transactions
            .iter()
            .filter(|t| t.key.as_deref() == Some(key))
            .collect();
        for t in &txs {
            let same = t.bytes.len() > msg.bytes.len()
                && t.bytes.ends_with(&msg.bytes)
                && received_field_naming(&t.bytes[..t.bytes.len() - msg.bytes.len()], &ids[&i]);
            if !same {
                mismatched += 1;
                violations.push(format!(
                    "{}: transaction #{} ({:?}) carried other bytes than were submitted \
                     ({} bytes)",
                    msg.describe(),
                    t.seq,
                    t.outcome,
                    t.bytes.len()
                ));
            }
        }
        // Sent again after the sink had it: only an attempt whose outcome a cut left
        // unknown explains that.
        let extra = txs.len().saturating_sub(1);
        if extra > 0 {
            resent += extra;
            if let Some(r) = records.get(key) {
                let attempts = reader.attempts(&r.id).await.unwrap();
                let unknown = attempts
                    .iter()
                    .filter(|a| a.outcome.as_deref() == Some("unknown"))
                    .count();
                if unknown == 0 {
                    violations.push(format!(
                        "{}: {} transactions at the sink, no UNKNOWN attempt: {attempts:?}",
                        msg.describe(),
                        txs.len()
                    ));
                }
            }
        }
    }
    let ours: BTreeSet<&str> = msgs.iter().map(|m| m.key.as_str()).collect();
    for key in stats.keys.keys() {
        if !ours.contains(key.as_str()) {
            violations.push(format!("{key}: delivered, but nobody submitted it"));
        }
    }
    drop(reader);

    let lost_keys: BTreeSet<usize> = losses.iter().map(|l| l.index).collect();
    let lost_spooled = lost_keys.iter().filter(|&&i| msgs[i].spooled()).count();
    let spooled = acked.keys().filter(|&&i| msgs[i].spooled()).count();
    let problems = shared.problems.lock().unwrap().clone();
    eprintln!(
        "power loss ({mode}): {CUTS} cuts ({quick} soon after a restart), {acked} messages \
         acknowledged ({spooled} spooled) of {MESSAGES}, {replays} replays checked after the \
         cuts; lost {lost} ({lost_spooled} spooled), duplicated {duplicated}, mismatched bytes \
         {mismatched}; {resent} sent to the sink again after its first copy, {problems} refused \
         or given up; clients done after {submitted_in:.1?} ({downtime:.1?} of it between kills \
         and restarts), all done after {total:.1?}",
        acked = acked.len(),
        quick = CUTS - batches,
        lost = lost_keys.len(),
        problems = problems.len(),
        total = started.elapsed(),
    );

    if eatmydata {
        // Inverted: with fsync gone, the cuts must cost acknowledged messages, or this test
        // could not see a lost write.
        assert!(
            !lost_keys.is_empty(),
            "under eatmydata no acknowledged message was lost: the test cannot see lost writes"
        );
        eprintln!(
            "power loss: as expected under eatmydata, {} acknowledged messages were lost",
            lost_keys.len()
        );
        return;
    }
    let context = || {
        let mut seen: Vec<String> = losses.iter().take(25).map(|l| l.what.clone()).collect();
        seen.extend(violations.iter().take(25).cloned());
        seen.extend(problems.iter().take(10).cloned());
        format!(
            "seed {seed:#x}:\n{}\n--- last dead relay log ---\n{}\n--- live relay log ---\n{}",
            seen.join("\n"),
            dead_logs.last().map_or(String::new(), |l| tail(l, 40)),
            tail(&relay.log(), 40)
        )
    };
    assert!(
        lost_keys.is_empty(),
        "{} acknowledged messages lost\n{}",
        lost_keys.len(),
        context()
    );
    assert_eq!(duplicated, 0, "duplicated\n{}", context());
    assert_eq!(mismatched, 0, "mismatched bytes\n{}", context());
    assert!(violations.is_empty(), "{}", context());
    assert!(problems.is_empty(), "{}", context());
    assert_eq!(acked.len(), MESSAGES, "{}", context());
}

#[path = "power_loss/lazyfs.rs"]
mod lazyfs;
use lazyfs::*;
