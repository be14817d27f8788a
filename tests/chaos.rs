//! Chaos test of exactly-once (issue 7), black-box. Run it with
//!
//! ```sh
//! cargo test --locked --features failpoints --test chaos
//! ```
//!
//! Without the `failpoints` feature this file compiles to nothing: the relay binary under test
//! (`CARGO_BIN_EXE_idemrelay`, built with the test's features) must carry the crash points of
//! `src/failpoint.rs`.
//!
//! Relay processes deliver to an in-process `idemrelay sink` (which deduplicates by key within
//! its window, like the real upstream) while client tasks submit a few thousand messages and
//! retry (same key, same bytes) until they get a 250 or a 5xx. Some keys are submitted by two
//! clients at once with the same bytes, some with different bytes (one must get E01005 and never
//! be forwarded). Faults: the relay is SIGKILLed at random moments and aborts at its crash
//! points (and is restarted on the same store each time), clients hang up right after the
//! final dot, the sink cuts the connection or withholds its reply after the dot, answers 4xx in
//! bursts, and the store is locked from outside for about a second.
//!
//! Scenarios: one relay on SQLite; two relays on one Postgres schema (skipped, saying so,
//! unless `IDEMRELAY_TEST_POSTGRES` names a database). Each prints T (keys attempted),
//! A (keys answered 250), D (keys delivered at the sink after its dedup) and R (raw sink
//! transactions), and fails unless: nothing answered 250 is missing at the sink, nothing is
//! there twice or unasked for, every raw transaction beyond the first is explained by an
//! UNKNOWN attempt inside the upstream window, no mismatched bytes are forwarded, and no
//! UNKNOWN is retried past the window.
//!
//! `IDEMRELAY_CHAOS_SEED` (decimal, `0x` hex, or `random`) replays a run's plan: which keys get
//! which fault, the schedule of kills, locks and bursts, and the crash points' draws. Thread
//! and I/O timing still differ between runs, so a replay is the same storm, not the same
//! interleaving. `IDEMRELAY_CHAOS_MESSAGES` sets the keys per scenario (default 1500).
#![cfg(feature = "failpoints")]

mod common;
#[path = "chaos/power_loss.rs"]
mod power_loss;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::backend::{self, WriteLock};
use common::dot_stuff;
use common::process::RelayProcess;
use idemrelay::sink::{FaultRule, Outcome as SinkOutcome, Phase, Sink, SinkConfig, SinkHandle};
use idemrelay::store::{self, AttemptRow, State, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};

const SEED_ENV: &str = "IDEMRELAY_CHAOS_SEED";
const COUNT_ENV: &str = "IDEMRELAY_CHAOS_MESSAGES";
const DEFAULT_SEED: u64 = 0xc4a0_5eed_1d3e_0007;
const DEFAULT_COUNT: usize = 1500;

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
/// Concurrent client tasks (a key submitted twice at once holds one).
const CLIENTS: usize = 16;
/// One submission (connect to reply) may take this long before the client gives up on it.
const TRY_LIMIT: Duration = Duration::from_secs(15);
/// A key that is neither accepted nor refused within this is a liveness failure.
const KEY_LIMIT: Duration = Duration::from_secs(150);
/// The storm lasts at least this long, and at least until the clients are done.
const STORM_MIN: Duration = Duration::from_secs(22);
/// Submissions start evenly spread over this.
const SUBMIT_SPREAD: Duration = Duration::from_secs(20);
/// Waiting for the queue to drain once the clients are done.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

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

// --- the plan ------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Single,
    /// Two clients at once, same key and bytes: one record, both answered with its id.
    SameBytesTwice,
    /// Two clients at once, same key, different bytes: one wins, the other gets E01005.
    DifferentBytesTwice,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// The client's first try closes the connection right after the final dot.
    ClientHangup,
    /// The sink commits the message, then closes without replying (reply lost).
    SinkDrop,
    /// The sink commits, then withholds the reply past the relay's dot deadline.
    SinkWithhold,
    /// The sink closes at the dot without committing.
    SinkCut,
    /// The sink answers 451 at the dot this many times in a row.
    Sink4xx(u32),
    /// The sink commits and drops the reply on every attempt: the relay can only retry
    /// until the window is over, then park the message as unresolved.
    PastWindow,
}

#[derive(Debug, Clone)]
struct Plan {
    key: String,
    shape: Shape,
    fault: Fault,
    /// Approximate message size.
    size: usize,
}

fn make_plans(rng: &mut fastrand::Rng, tag: &str, n: usize) -> Vec<Plan> {
    // First in line, so that their window has run out by the time the rest is delivered.
    let past_window = (n / 250).max(2);
    (0..n)
        .map(|i| {
            // Fixed width: the sink's `key=` matches substrings, and no key may contain another.
            let key = format!("chaos-{tag}-{i:05}");
            let (shape, fault) = if i < past_window {
                (Shape::Single, Fault::PastWindow)
            } else {
                let shape = match rng.u32(0..100) {
                    0..10 => Shape::SameBytesTwice,
                    10..18 => Shape::DifferentBytesTwice,
                    _ => Shape::Single,
                };
                let fault = match rng.u32(0..100) {
                    0..6 => Fault::ClientHangup,
                    6..11 => Fault::SinkDrop,
                    11..15 => Fault::SinkWithhold,
                    15..19 => Fault::SinkCut,
                    19..24 => Fault::Sink4xx(rng.u32(1..=3)),
                    _ => Fault::None,
                };
                (shape, fault)
            };
            Plan {
                key,
                shape,
                fault,
                // One in ten is large enough to be spooled outside SQLite's pages.
                size: if rng.usize(0..10) == 0 {
                    rng.usize(33_000..120_000)
                } else {
                    rng.usize(300..6000)
                },
            }
        })
        .collect()
}

fn sink_rule(plan: &Plan) -> Option<FaultRule> {
    let rule = match plan.fault {
        Fault::None | Fault::ClientHangup => return None,
        Fault::SinkDrop => FaultRule::drop_after_dot().with_times(1),
        Fault::SinkWithhold => FaultRule::delay(Phase::Dot, WITHHOLD).with_times(1),
        Fault::SinkCut => FaultRule::disconnect(Phase::Dot).with_times(1),
        Fault::Sink4xx(n) => FaultRule::reply(Phase::Dot, 451, "").with_times(n),
        Fault::PastWindow => FaultRule::drop_after_dot(),
    };
    Some(rule.with_key(plan.key.clone()))
}

/// The marker line that tells the variants of a key apart.
fn variant_line(key: &str, variant: char) -> String {
    format!("chaos message {key}, variant {variant}")
}

fn message_bytes(plan: &Plan, variant: char) -> Vec<u8> {
    let mut body = format!(
        "{}\r\n.a line that needs dot-stuffing\r\n",
        variant_line(&plan.key, variant)
    );
    let mut n = 0;
    while body.len() < plan.size {
        body.push_str(&format!(
            "line {n:04} of {} ({variant}): the quick brown fox jumps over the lazy dog\r\n",
            plan.key
        ));
        n += 1;
    }
    body.push_str("end");
    common::message(Some(&plan.key), &format!("chaos {}", plan.key), &body)
}

// --- the client ----------------------------------------------------------------------------

/// One try of a submission.
enum Try {
    /// The reply that ended the try: to the greeting, a command, or the final dot.
    Answer(u16, String),
    /// No reply: connection refused or closed, a timeout, or our own hang-up.
    Lost,
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// The last line of one reply, `None` when the connection closed first.
    async fn reply(&mut self) -> Option<(u16, String)> {
        loop {
            while let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let text = String::from_utf8_lossy(&line[..pos]).to_string();
                let code: u16 = text.get(..3)?.parse().ok()?;
                if text.as_bytes().get(3) != Some(&b'-') {
                    return Some((code, text));
                }
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    async fn command(&mut self, line: &str) -> Option<(u16, String)> {
        self.stream
            .write_all(format!("{line}\r\n").as_bytes())
            .await
            .ok()?;
        self.reply().await
    }
}

async fn submit_once(addr: SocketAddr, message: &[u8], hang_up: bool) -> Try {
    let attempt = async {
        let stream = TcpStream::connect(addr).await.ok()?;
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
        };
        let greeting = conn.reply().await?;
        if greeting.0 != 220 {
            return Some(Try::Answer(greeting.0, greeting.1));
        }
        for step in [
            "EHLO chaos.test",
            "MAIL FROM:<sender@example.com>",
            "RCPT TO:<rcpt@example.com>",
            "DATA",
        ] {
            let (code, line) = conn.command(step).await?;
            if code >= 400 {
                return Some(Try::Answer(code, line));
            }
        }
        conn.stream.write_all(&dot_stuff(message)).await.ok()?;
        if hang_up {
            // Gone before the reply could be read: the relay may or may not have committed.
            return Some(Try::Lost);
        }
        let (code, line) = conn.reply().await?;
        let _ = conn.stream.write_all(b"QUIT\r\n").await;
        Some(Try::Answer(code, line))
    };
    match tokio::time::timeout(TRY_LIMIT, attempt).await {
        Ok(Some(t)) => t,
        Ok(None) | Err(_) => Try::Lost,
    }
}

#[derive(Debug, Clone)]
enum Final {
    Accepted,
    Refused(String),
    GaveUp,
}

/// What one client saw for one submission, across its tries.
#[derive(Debug, Clone)]
struct Submitted {
    variant: char,
    last: Final,
    tries: u32,
    /// Tries without a reply (refused connection, a dead relay, our hang-up).
    lost: u32,
    /// Tries answered 4xx.
    deferred: u32,
    /// The queue ids of every 250 (one unless a bug).
    ids: Vec<String>,
}

fn queue_id(line: &str) -> Option<String> {
    let rest = &line[line.find("queued as ")? + "queued as ".len()..];
    rest.split_whitespace().next().map(str::to_string)
}

type Addrs = Arc<Mutex<Vec<Option<SocketAddr>>>>;

/// Submits until a 250 or a 5xx, as a well-behaved client: same bytes every time, another
/// instance after a failure, a short random pause between tries.
async fn submit_until_answered(
    addrs: Addrs,
    start: usize,
    message: Vec<u8>,
    variant: char,
    hang_up_first: bool,
    mut rng: fastrand::Rng,
) -> Submitted {
    let mut out = Submitted {
        variant,
        last: Final::GaveUp,
        tries: 0,
        lost: 0,
        deferred: 0,
        ids: Vec::new(),
    };
    let deadline = Instant::now() + KEY_LIMIT;
    while Instant::now() < deadline {
        let addr = {
            let addrs = addrs.lock().unwrap();
            let n = addrs.len();
            (0..n).find_map(|i| addrs[(start + out.tries as usize + i) % n])
        };
        let Some(addr) = addr else {
            // Every instance is being restarted.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let hang_up = hang_up_first && out.tries == 0;
        out.tries += 1;
        match submit_once(addr, &message, hang_up).await {
            Try::Answer(250, line) => {
                out.ids
                    .push(queue_id(&line).unwrap_or_else(|| format!("250 without id: {line}")));
                out.last = Final::Accepted;
                return out;
            }
            Try::Answer(code, line) if code >= 500 => {
                out.last = Final::Refused(line);
                return out;
            }
            Try::Answer(..) => out.deferred += 1,
            Try::Lost => out.lost += 1,
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(10..120))).await;
    }
    out
}

async fn run_key(plan: Plan, addrs: Addrs, instances: usize, seed: u64) -> Vec<Submitted> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let start = rng.usize(0..instances);
    let hang_up = plan.fault == Fault::ClientHangup;
    let one = |variant: char, start: usize, hang_up: bool, rng: fastrand::Rng| {
        submit_until_answered(
            addrs.clone(),
            start,
            message_bytes(&plan, variant),
            variant,
            hang_up,
            rng,
        )
    };
    match plan.shape {
        Shape::Single => vec![one('a', start, hang_up, rng.fork()).await],
        // Two clients at the same moment, on different instances when there are several.
        Shape::SameBytesTwice | Shape::DifferentBytesTwice => {
            let second = if plan.shape == Shape::SameBytesTwice {
                'a'
            } else {
                'b'
            };
            let (x, y) = tokio::join!(
                one('a', start, hang_up, rng.fork()),
                one(second, start + 1, false, rng.fork())
            );
            vec![x, y]
        }
    }
}

// --- the relays ----------------------------------------------------------------------------

fn write_config(path: &Path) {
    // Every phase is listed: `[delivery.timeouts]` does not accept a partial table.
    let text = format!(
        r#"
in_progress_wait = "1s"
store_busy_timeout = "700ms"
store_probe_interval = "200ms"

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
upstream_window = "{}s"
window_margin = "{}s"

[delivery.timeouts]
connect = "2s"
greeting = "2s"
starttls = "2s"
auth = "2s"
mail = "2s"
rcpt = "2s"
data = "2s"
dot = "{DOT_TIMEOUT}"
"#,
        WINDOW.as_secs(),
        MARGIN.as_secs()
    );
    std::fs::write(path, text).unwrap();
}

#[derive(Debug, Default)]
struct Deaths {
    sigkill: usize,
    failpoints: BTreeMap<String, usize>,
    /// Deaths nobody asked for (a panic, an exit): always a failure.
    unexpected: Vec<String>,
}

/// The relay instances of a scenario, restarted on the same store whenever one dies.
struct Cluster {
    store_url: String,
    config: PathBuf,
    upstream: SocketAddr,
    failpoints: String,
    seed: u64,
    relays: Vec<Option<RelayProcess>>,
    addrs: Addrs,
    incarnations: u64,
    deaths: Deaths,
    /// The logs of dead relays, for failure messages.
    dead_logs: Vec<String>,
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Cluster {
    async fn start(
        store_url: String,
        config: PathBuf,
        upstream: SocketAddr,
        instances: usize,
        failpoints: String,
        seed: u64,
    ) -> Cluster {
        let mut cluster = Cluster {
            store_url,
            config,
            upstream,
            failpoints,
            seed,
            relays: (0..instances).map(|_| None).collect(),
            addrs: Arc::new(Mutex::new(vec![None; instances])),
            incarnations: 0,
            deaths: Deaths::default(),
            dead_logs: Vec::new(),
        };
        // Spawned together: on Postgres they run the migrations concurrently.
        let spawned: Vec<RelayProcess> = (0..instances).map(|_| cluster.spawn()).collect();
        for (i, relay) in spawned.into_iter().enumerate() {
            cluster.install(i, relay).await;
        }
        cluster
    }

    fn spawn(&mut self) -> RelayProcess {
        self.incarnations += 1;
        let args: Vec<String> = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--hostname",
            "relay.test",
            "--store",
            &self.store_url,
            "--config",
            &self.config.display().to_string(),
            "--upstream",
            &format!("smtp://{}?tls=none", self.upstream),
            // Two instances on one host: each its own admin port.
            "--admin",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec();
        let env = [
            ("IDEMRELAY_FAILPOINTS", self.failpoints.clone()),
            (
                "IDEMRELAY_FAILPOINT_SEED",
                format!("{:#x}", mix(self.seed, self.incarnations)),
            ),
        ];
        RelayProcess::spawn_with_env(&args, &env)
    }

    async fn install(&mut self, i: usize, relay: RelayProcess) {
        let relay = relay.ready().await;
        self.addrs.lock().unwrap()[i] = Some(relay.addr);
        self.relays[i] = Some(relay);
    }

    /// Notes why a relay died and starts another on the same store.
    async fn buried(&mut self, i: usize, relay: RelayProcess, status: std::process::ExitStatus) {
        use std::os::unix::process::ExitStatusExt;
        let log = relay.log();
        drop(relay);
        let fired = log.lines().rev().find_map(|l| {
            l.strip_prefix("failpoint ")
                .and_then(|rest| rest.strip_suffix(" fired: aborting"))
        });
        match (status.signal(), fired) {
            (Some(6), Some(name)) => *self.deaths.failpoints.entry(name.into()).or_default() += 1,
            (Some(9), _) => self.deaths.sigkill += 1,
            _ => self.deaths.unexpected.push(format!(
                "relay {i} died on its own ({status}):\n{}",
                tail(&log, 40)
            )),
        }
        self.dead_logs.push(log);
        let relay = self.spawn();
        self.install(i, relay).await;
    }

    /// Restarts every relay that has died by itself since the last look.
    async fn reap(&mut self) {
        for i in 0..self.relays.len() {
            let status = self.relays[i].as_mut().and_then(RelayProcess::try_exit);
            if let Some(status) = status {
                self.addrs.lock().unwrap()[i] = None;
                let relay = self.relays[i].take().unwrap();
                self.buried(i, relay, status).await;
            }
        }
    }

    async fn sigkill(&mut self, i: usize) {
        self.addrs.lock().unwrap()[i] = None;
        let mut relay = self.relays[i].take().expect("relay running");
        // Signalled like an operator would, so that a relay that aborted at a crash point a
        // moment earlier is simply found dead (and counted as such).
        relay.signal("KILL");
        let status = relay.wait_exit(Duration::from_secs(10)).await;
        self.buried(i, relay, status).await;
    }

    /// Every log line that names `id`, from all relays so far.
    fn lines_about(&self, id: &str) -> String {
        self.dead_logs
            .iter()
            .flat_map(|log| log.lines())
            .filter(|l| l.contains(id))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for (i, log) in self.dead_logs.iter().rev().take(3).enumerate() {
            let log = tail(log, 40);
            out.push_str(&format!("--- dead relay log (last but {i}) ---\n{log}\n"));
        }
        for relay in self.relays.iter().flatten() {
            out.push_str(&format!(
                "--- live relay log ---\n{}\n",
                tail(&relay.log(), 40)
            ));
        }
        out
    }
}

#[derive(Debug, Default)]
struct Storm {
    store_locks: usize,
    sink_bursts: usize,
}

/// Adds a rule behind the ones still active, keeping what is left of each count (the rules
/// are replaced as a whole).
fn add_sink_rule(sink: &SinkHandle, rule: FaultRule) {
    let mut rules: Vec<FaultRule> = sink
        .faults()
        .into_iter()
        .filter_map(|s| match s.rule.times {
            Some(t) if s.fired >= t => None,
            Some(t) => Some(s.rule.with_times(t - s.fired)),
            None => Some(s.rule),
        })
        .collect();
    rules.push(rule);
    sink.set_faults(rules).unwrap();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Clients submitting: kills, locks and bursts on a seeded schedule.
    Storm,
    /// Clients done: only the crash points still fire; dead relays are still restarted.
    Drain,
    Stop,
}

/// Watches the relays (restarting the dead) and, during the storm, injects the faults.
async fn chaos(
    mut cluster: Cluster,
    sink: SinkHandle,
    seed: u64,
    stage: watch::Receiver<Stage>,
) -> (Cluster, Storm) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut storm = Storm::default();
    let mut next = Instant::now() + Duration::from_millis(rng.u64(200..600));
    loop {
        cluster.reap().await;
        let current = *stage.borrow();
        match current {
            Stage::Stop => return (cluster, storm),
            Stage::Drain => {}
            Stage::Storm if Instant::now() >= next => {
                match rng.u32(0..100) {
                    0..40 => {
                        let i = rng.usize(0..cluster.relays.len());
                        cluster.sigkill(i).await;
                    }
                    40..65 => {
                        let lock = WriteLock::hold(&cluster.store_url).await;
                        tokio::time::sleep(Duration::from_millis(rng.u64(500..1500))).await;
                        lock.release().await;
                        storm.store_locks += 1;
                    }
                    65..85 => {
                        let times = rng.u32(5..25);
                        add_sink_rule(
                            &sink,
                            FaultRule::reply(Phase::Mail, 451, "4.3.0 chaos burst")
                                .with_times(times),
                        );
                        storm.sink_bursts += 1;
                    }
                    _ => {
                        let times = rng.u32(3..10);
                        add_sink_rule(
                            &sink,
                            FaultRule::reply(Phase::Connect, 421, "4.3.2 chaos burst")
                                .with_times(times),
                        );
                        storm.sink_bursts += 1;
                    }
                }
                next = Instant::now() + Duration::from_millis(rng.u64(300..1200));
            }
            Stage::Storm => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    /// Keys attempted, answered 250, delivered at the sink after its dedup; raw transactions.
    t: usize,
    a: usize,
    d: usize,
    r: usize,
    submissions: usize,
    tries: u64,
    lost_tries: u64,
    deferred_tries: u64,
    e01005: usize,
    faulted_keys: usize,
    unknown_attempts: usize,
    unresolved: usize,
    /// The longest wait between two attempts of one message, past-window keys aside: the
    /// queue's delay, to be compared with the window.
    longest_gap_ms: i64,
    longest_gap_key: String,
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

async fn run(scenario: Scenario) {
    let seed = mix(seed(), scenario.salt);
    let n = count();
    eprintln!(
        "chaos {}: seed {seed:#x} from {SEED_ENV}={:#x} (set it to replay), {n} keys",
        scenario.name,
        self::seed()
    );
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let plans = make_plans(&mut rng, scenario.tag, n);

    let sink = Sink::start(SinkConfig {
        window: WINDOW,
        faults: plans.iter().filter_map(sink_rule).collect(),
        ..SinkConfig::default()
    })
    .await
    .expect("sink");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.toml");
    write_config(&config);
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
            let key = plan.key.clone();
            (key, run_key(plan, addrs, instances, key_seed).await)
        }));
    }
    let mut answers: BTreeMap<String, Vec<Submitted>> = BTreeMap::new();
    for t in tasks {
        let (key, subs) = t.await.expect("client task");
        answers.insert(key, subs);
    }
    let submitted_in = started.elapsed();
    // Intake is quicker than delivery: the storm goes on for a while, so that kills, locks
    // and bursts also land in the middle of deliveries.
    tokio::time::sleep((started + STORM_MIN).saturating_duration_since(Instant::now())).await;
    stage_tx.send(Stage::Drain).unwrap();

    // Every record terminal: delivered, or parked once its window is over.
    let reader = store::open(&scenario.store_url, Duration::from_secs(10))
        .await
        .expect("open the store for reading");
    let deadline = Instant::now() + DRAIN_LIMIT;
    loop {
        let records = list_all(reader.as_ref()).await;
        let queued = records.iter().filter(|r| r.state == State::Queued).count();
        if queued == 0 {
            break;
        }
        if Instant::now() >= deadline {
            stage_tx.send(Stage::Stop).unwrap();
            let (cluster, _) = chaos_task.await.unwrap();
            panic!(
                "{queued} records still queued {DRAIN_LIMIT:?} after the clients finished \
                 (seed {seed:#x})\n{}",
                cluster.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stage_tx.send(Stage::Stop).unwrap();
    let (mut cluster, storm) = chaos_task.await.unwrap();
    // Nothing runs while the results are read (dropping a relay SIGKILLs it).
    for i in 0..cluster.relays.len() {
        if let Some(relay) = cluster.relays[i].take() {
            cluster.dead_logs.push(relay.log());
        }
    }

    let records = list_all(reader.as_ref()).await;
    let mut violations: Vec<String> = Vec::new();
    let mut c = Counts {
        t: plans.len(),
        submissions: answers.values().map(Vec::len).sum(),
        ..Counts::default()
    };
    let plan_of: BTreeMap<&str, &Plan> = plans.iter().map(|p| (p.key.as_str(), p)).collect();

    // What the clients were told.
    let mut answered: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (key, subs) in &answers {
        let plan = plan_of[key.as_str()];
        for s in subs {
            c.tries += u64::from(s.tries);
            c.lost_tries += u64::from(s.lost);
            c.deferred_tries += u64::from(s.deferred);
            if !s.ids.is_empty() {
                answered
                    .entry(key)
                    .or_default()
                    .extend(s.ids.iter().cloned());
            }
        }
        let accepted: Vec<&Submitted> = subs
            .iter()
            .filter(|s| matches!(s.last, Final::Accepted))
            .collect();
        for s in subs {
            match &s.last {
                Final::GaveUp => violations.push(format!(
                    "{key} variant {}: neither accepted nor refused within {KEY_LIMIT:?}",
                    s.variant
                )),
                Final::Refused(line) => {
                    let conflict = line.starts_with("554 ") && line.contains("E01005");
                    if conflict {
                        c.e01005 += 1;
                    }
                    if plan.shape != Shape::DifferentBytesTwice || !conflict {
                        violations.push(format!(
                            "{key} variant {} ({:?}): refused: {line}",
                            s.variant, plan.shape
                        ));
                    }
                }
                Final::Accepted => {}
            }
        }
        if plan.shape == Shape::DifferentBytesTwice && accepted.len() != 1 {
            violations.push(format!(
                "{key}: {} of two different messages under one key accepted",
                accepted.len()
            ));
        }
    }
    c.a = answered.len();
    for (key, ids) in &answered {
        if ids.len() > 1 {
            violations.push(format!("{key}: answered with several queue ids {ids:?}"));
        }
    }

    // The store: one record per key, under the id the clients were given.
    let mut record_of: BTreeMap<String, &store::MessageSummary> = BTreeMap::new();
    for r in &records {
        let Some(key) = r.key.clone() else {
            violations.push(format!("record {} without a key", r.id));
            continue;
        };
        if !plan_of.contains_key(key.as_str()) {
            violations.push(format!("record {} under a key nobody sent: {key}", r.id));
        }
        if let Some(other) = record_of.insert(key.clone(), r) {
            violations.push(format!("{key}: two records, {} and {}", other.id, r.id));
        }
        match r.state {
            State::Delivered => {}
            State::Unresolved => c.unresolved += 1,
            other => violations.push(format!("{key} ({}): ended {other:?}", r.id)),
        }
    }
    for (key, ids) in &answered {
        match record_of.get(*key) {
            None => violations.push(format!("{key}: answered 250 but no record")),
            Some(r) if !ids.contains(&r.id) => violations.push(format!(
                "{key}: answered {ids:?} but the record is {}",
                r.id
            )),
            Some(_) => {}
        }
    }

    // The sink, after its dedup and raw.
    let stats = sink.stats();
    let transactions = sink.transactions();
    let messages = sink.messages();
    c.r = transactions.len();
    let delivered: BTreeSet<&str> = stats
        .keys
        .iter()
        .filter(|(_, s)| s.accepted >= 1)
        .map(|(k, _)| k.as_str())
        .collect();
    c.d = delivered.len();
    for key in answered.keys() {
        if !delivered.contains(key) {
            c.lost += 1;
            violations.push(format!("{key}: answered 250, never delivered"));
        }
    }
    for key in &delivered {
        if !plan_of.contains_key(key) {
            c.unexpected += 1;
            violations.push(format!("{key}: delivered, but nobody submitted it"));
        } else if !answered.contains_key(key) {
            // Committed but never confirmed, although its client kept retrying: a retry must
            // get the replay.
            c.unanswered += 1;
            violations.push(format!("{key}: delivered, but its clients never got a 250"));
        }
    }
    for (key, s) in &stats.keys {
        if s.accepted > 1 {
            c.duplicated += s.accepted as usize - 1;
            violations.push(format!("{key}: delivered {} times: {s:?}", s.accepted));
        }
    }
    if messages.len() != delivered.len() + c.duplicated {
        violations.push(format!(
            "the sink holds {} messages for {} keys",
            messages.len(),
            delivered.len()
        ));
    }
    let no_key = transactions.iter().filter(|t| t.key.is_none()).count();
    if no_key > 0 {
        c.unexpected += no_key;
        violations.push(format!("{no_key} sink transactions without a key"));
    }

    // Per key: bytes forwarded, raw transactions explained by the ledger, window kept.
    let mut by_key: BTreeMap<&str, Vec<&idemrelay::sink::Transaction>> = BTreeMap::new();
    for t in &transactions {
        if let Some(k) = &t.key {
            by_key.entry(k.as_str()).or_default().push(t);
        }
    }
    let window_ms = WINDOW.as_millis() as i64;
    let retry_limit_ms = (WINDOW - MARGIN + INTENT_SLACK).as_millis() as i64;
    let mut faulted: BTreeSet<&str> = BTreeSet::new();
    for plan in &plans {
        let key = plan.key.as_str();
        let txs = by_key.get(key).cloned().unwrap_or_default();
        let subs = &answers[key];
        if plan.fault != Fault::None
            || plan.shape == Shape::DifferentBytesTwice
            || txs.len() > 1
            || subs.iter().any(|s| s.tries > 1)
        {
            faulted.insert(key);
        }
        let Some(record) = record_of.get(key) else {
            if !txs.is_empty() {
                c.mismatched_forwarded += txs.len();
                violations.push(format!("{key}: forwarded without a record"));
            }
            continue;
        };
        let attempts: Vec<AttemptRow> = reader.attempts(&record.id).await.unwrap();
        if attempts.len() > 1 {
            faulted.insert(key);
        }
        if plan.fault != Fault::PastWindow {
            for pair in attempts.windows(2) {
                let gap = pair[1].started_at_ms - pair[0].started_at_ms;
                if gap > c.longest_gap_ms {
                    c.longest_gap_ms = gap;
                    c.longest_gap_key = format!("{key} before attempt {}", pair[1].attempt);
                }
            }
        }
        let unknowns = attempts
            .iter()
            .filter(|a| a.outcome.as_deref() == Some("unknown"))
            .count();
        c.unknown_attempts += unknowns;
        if let Some(open) = attempts.iter().find(|a| a.outcome.is_none()) {
            violations.push(format!("{key}: intent left open: {open:?}"));
        }
        if plan.fault != Fault::PastWindow && record.state == State::Unresolved {
            c.parked_early += 1;
            // Not a violation (the relay may park what it cannot resolve in time), but worth
            // seeing: nothing else in this run should come near the window.
            eprintln!(
                "chaos {}: {key} ({:?}) parked unresolved ({:?}); ledger: {attempts:#?}\n{}",
                scenario.name,
                plan.fault,
                record.upstream_reply,
                cluster.lines_about(&record.id)
            );
        }
        if plan.fault == Fault::PastWindow && record.state != State::Unresolved {
            violations.push(format!(
                "{key}: every reply was lost, yet the record is {:?}",
                record.state
            ));
        }

        // Byte identity: every transaction carried the stored bytes, and a losing variant
        // never got out.
        let content = reader
            .message(&record.id)
            .await
            .unwrap()
            .and_then(|m| m.content)
            .unwrap_or_default();
        for t in &txs {
            if t.bytes != content {
                c.mismatched_forwarded += 1;
                let which = ['a', 'b']
                    .into_iter()
                    .find(|v| {
                        let line = variant_line(key, *v);
                        t.bytes.windows(line.len()).any(|w| w == line.as_bytes())
                    })
                    .map_or("?".to_string(), |v| v.to_string());
                violations.push(format!(
                    "{key}: transaction #{} forwarded bytes of variant {which} that differ from \
                     the stored record {}",
                    t.seq, record.id
                ));
            }
        }

        // A transaction after the sink's first commit is the relay sending again what the
        // upstream already has: only an UNKNOWN attempt justifies that, and only inside the
        // window measured from the first attempt.
        let first_attempt = attempts.first().map(|a| a.started_at_ms);
        if txs.len() > attempts.len() {
            violations.push(format!(
                "{key}: {} transactions but {} attempts in the ledger",
                txs.len(),
                attempts.len()
            ));
        }
        if let Some(commit) = txs.iter().position(|t| t.outcome == SinkOutcome::Accepted) {
            let extra = &txs[commit + 1..];
            c.extra_raw += extra.len();
            if !extra.is_empty() {
                let late = extra
                    .iter()
                    .any(|t| first_attempt.is_none_or(|f| t.received_at_ms as i64 > f + window_ms));
                if unknowns == 0 || late {
                    c.unexplained_extra += extra.len();
                    violations.push(format!(
                        "{key}: {} raw transactions after the commit, {unknowns} UNKNOWN \
                         attempts, late {late}: {attempts:?}",
                        extra.len()
                    ));
                }
            }
        }
        if let (Some(first), Some(u)) = (
            first_attempt,
            attempts
                .iter()
                .position(|a| a.outcome.as_deref() == Some("unknown")),
        ) {
            for a in &attempts[u + 1..] {
                if a.started_at_ms > first + retry_limit_ms {
                    c.unknown_after_window += 1;
                    violations.push(format!(
                        "{key}: attempt {} started {} ms after the first, past the window \
                         ({} ms) less the margin",
                        a.attempt,
                        a.started_at_ms - first,
                        (WINDOW - MARGIN).as_millis()
                    ));
                }
            }
        }
    }
    c.faulted_keys = faulted.len();
    drop(reader);

    let elapsed = started.elapsed();
    let deaths = &cluster.deaths;
    let fired: usize = deaths.failpoints.values().sum();
    for d in &deaths.unexpected {
        violations.push(d.clone());
    }
    let share = 100.0 * c.faulted_keys as f64 / c.t as f64;
    let per_fault = |f: fn(&Fault) -> bool| plans.iter().filter(|p| f(&p.fault)).count();
    eprintln!(
        "chaos {name}: seed {seed:#x}, {n} keys in {subs} submissions ({tries} tries: {lost} \
         without a reply, {deferred} answered 4xx), clients done after {submitted_in:.1?}, \
         all settled after {elapsed:.1?}\n\
         \x20 T={t} keys attempted, A={a} answered 250, D={d} delivered at the sink after its \
         dedup, R={r} raw sink transactions ({extra} after a commit)\n\
         \x20 per-key faults planned on {planned:.1}% of keys, faults of any kind touched \
         {share:.1}%: {sigkill} SIGKILLs, {fired} crash-point aborts \
         {fp:?}, {locks} store locks, {bursts} sink 4xx bursts; per key: {hang} client \
         hang-ups, {drop} replies dropped, {hold} withheld, {cut} cuts, {four} 4xx runs, \
         {past} past the window\n\
         \x20 ledger: {unknown} UNKNOWN attempts, {unresolved} unresolved ({early} not a \
         past-window key), longest wait between attempts {gap:.1} s ({gap_key}); {e01005} E01005 answers \
         to a reused key\n\
         \x20 lost {lost_k}, duplicated {dup}, unexpected {unexp}, unanswered {unans}, \
         unexplained extra transactions {unexpl}, mismatched bytes forwarded {mism}, UNKNOWN \
         retried after the window {late}",
        name = scenario.name,
        subs = c.submissions,
        tries = c.tries,
        lost = c.lost_tries,
        deferred = c.deferred_tries,
        t = c.t,
        a = c.a,
        d = c.d,
        r = c.r,
        extra = c.extra_raw,
        planned = 100.0 * (n - per_fault(|f| *f == Fault::None)) as f64 / n as f64,
        sigkill = deaths.sigkill,
        fp = deaths.failpoints,
        locks = storm.store_locks,
        bursts = storm.sink_bursts,
        hang = per_fault(|f| *f == Fault::ClientHangup),
        drop = per_fault(|f| *f == Fault::SinkDrop),
        hold = per_fault(|f| *f == Fault::SinkWithhold),
        cut = per_fault(|f| *f == Fault::SinkCut),
        four = per_fault(|f| matches!(f, Fault::Sink4xx(_))),
        past = per_fault(|f| *f == Fault::PastWindow),
        unknown = c.unknown_attempts,
        unresolved = c.unresolved,
        early = c.parked_early,
        gap = c.longest_gap_ms as f64 / 1000.0,
        gap_key = c.longest_gap_key,
        e01005 = c.e01005,
        lost_k = c.lost,
        dup = c.duplicated,
        unexp = c.unexpected,
        unans = c.unanswered,
        unexpl = c.unexplained_extra,
        mism = c.mismatched_forwarded,
        late = c.unknown_after_window,
    );

    let context = || {
        let shown: Vec<&String> = violations.iter().take(25).collect();
        format!(
            "chaos {}: seed {seed:#x} ({SEED_ENV}={:#x} replays it); {} violations, first \
             ones:\n{}\n{}",
            scenario.name,
            self::seed(),
            violations.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            cluster.logs()
        )
    };
    assert_eq!(c.lost, 0, "lost\n{}", context());
    assert_eq!(c.duplicated, 0, "duplicated\n{}", context());
    assert_eq!(c.unexpected, 0, "unexpected\n{}", context());
    assert_eq!(c.unanswered, 0, "unanswered\n{}", context());
    assert_eq!(c.unexplained_extra, 0, "unexplained extra\n{}", context());
    assert_eq!(c.mismatched_forwarded, 0, "mismatched\n{}", context());
    assert_eq!(
        c.unknown_after_window,
        0,
        "late UNKNOWN retry\n{}",
        context()
    );
    assert!(violations.is_empty(), "{}", context());
    // Not vacuous: the storm happened, and the checks had something to check.
    assert!(
        deaths.sigkill + fired >= 3,
        "too few relay deaths: {deaths:?}"
    );
    assert!(c.unknown_attempts > 0 && c.extra_raw > 0, "{c:?}");
    assert!(c.e01005 > 0, "no key reuse was refused: {c:?}");
    assert!(
        share >= 20.0,
        "faults touched only {share:.1}% of keys: {c:?}"
    );
    drop(dir);
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
