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

// --- the plan ------------------------------------------------------------------------------

/// The `scope` of unauthenticated (allow-listed) clients: the relay's default.
const ANON_SCOPE: &str = "default";
/// The users of the users file, each with a scope of its own: (name, password, scope).
const USERS: [(&str, &str, &str); 2] = [
    ("alice", "chaos alice password", "tenant-alice"),
    ("bob", "chaos bob password", "tenant-bob"),
];

/// Who submits: an unauthenticated client, or a user of [`USERS`] after `AUTH PLAIN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Anonymous,
    User(usize),
}

impl Who {
    fn scope(self) -> &'static str {
        match self {
            Who::Anonymous => ANON_SCOPE,
            Who::User(i) => USERS[i].2,
        }
    }

    fn login(self) -> Option<(&'static str, &'static str)> {
        match self {
            Who::Anonymous => None,
            Who::User(i) => Some((USERS[i].0, USERS[i].1)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Single,
    /// Two clients at once, same key and bytes: one record, both answered with its id.
    SameBytesTwice,
    /// Two clients at once, same key, different bytes: one wins, the other gets E01005.
    DifferentBytesTwice,
    /// One message in `parts` transactions with disjoint recipient sets, all by `who`: each
    /// part once the one before was answered (numbered in that order), or all at once when
    /// `racing` (on different instances when there are several; numbered as they commit).
    /// Every part is sent again once after its 250 and must be answered as a replay of it.
    Split {
        who: Who,
        parts: usize,
        racing: bool,
    },
    /// Two scopes at once under one key, each with its own bytes: both accepted, each
    /// delivered once, under upstream keys of their own.
    TwoScopes(Who, Who),
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
    /// A per-key sink fault matches the key inside every upstream key made of it, so it hits
    /// whichever part or scope reaches the sink first (all of them when it has no count).
    fault: Fault,
    /// Approximate message size.
    size: usize,
    /// What the sink's webhook does with this key's event batches (every part and scope).
    hook: Option<WebhookFault>,
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
                    0..9 => Shape::SameBytesTwice,
                    9..16 => Shape::DifferentBytesTwice,
                    16..24 => Shape::Split {
                        who: match rng.u32(0..3) {
                            0 => Who::Anonymous,
                            n => Who::User(n as usize - 1),
                        },
                        parts: if rng.u32(0..4) == 0 { 3 } else { 2 },
                        racing: rng.u32(0..4) == 0,
                    },
                    // Mostly alice and bob; also either of them with the unauthenticated scope.
                    24..31 => match rng.u32(0..4) {
                        0 => Shape::TwoScopes(Who::Anonymous, Who::User(0)),
                        1 => Shape::TwoScopes(Who::User(1), Who::Anonymous),
                        _ => Shape::TwoScopes(Who::User(0), Who::User(1)),
                    },
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
                hook: None,
            }
        })
        .collect()
}

/// The webhook faults, from a stream of their own so that the SMTP plan of a seed stays what
/// it was before there were webhooks. The past-window keys, which only an event can resolve,
/// get one each in turn; a quarter of the others get one at random.
fn plan_hooks(rng: &mut fastrand::Rng, plans: &mut [Plan]) {
    let draw = |rng: &mut fastrand::Rng, n: u32| match n {
        0 => Some(WebhookFault::Duplicate),
        1 => Some(WebhookFault::Reorder),
        2 => Some(WebhookFault::Late(Duration::from_millis(
            rng.u64(500..3000),
        ))),
        3 => Some(WebhookFault::LoseAck),
        _ => None,
    };
    let mut turn = 0;
    for plan in plans {
        plan.hook = if plan.fault == Fault::PastWindow {
            turn += 1;
            draw(rng, (turn - 1) % 4)
        } else {
            match rng.u32(0..100) {
                0..8 => draw(rng, 0),
                8..16 => draw(rng, 1),
                16..21 => draw(rng, 2),
                21..26 => draw(rng, 3),
                _ => None,
            }
        };
    }
}

fn hook_rule(plan: &Plan) -> Option<FaultRule> {
    plan.hook
        .map(|f| FaultRule::webhook(f).with_key(plan.key.clone()))
}

fn sink_rule(plan: &Plan) -> Option<FaultRule> {
    let rule = match plan.fault {
        Fault::None | Fault::ClientHangup => return None,
        Fault::SinkDrop => FaultRule::drop_after_dot().with_times(1),
        Fault::SinkWithhold => FaultRule::delay(FaultStage::Dot, WITHHOLD).with_times(1),
        Fault::SinkCut => FaultRule::disconnect(FaultStage::Dot).with_times(1),
        Fault::Sink4xx(n) => FaultRule::reply(FaultStage::Dot, 451, "").with_times(n),
        Fault::PastWindow => FaultRule::drop_after_dot(),
    };
    Some(rule.with_key(plan.key.clone()))
}

/// One unit of the exactly-once promise: one part of one key in one scope.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Unit {
    scope: String,
    key: String,
    part: u32,
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}#{}", self.scope, self.key, self.part)
    }
}

/// The units a plan must end with, each accepted once and delivered once.
fn units(plan: &Plan) -> BTreeSet<Unit> {
    let unit = |who: Who, part: usize| Unit {
        scope: who.scope().to_string(),
        key: plan.key.clone(),
        part: part as u32,
    };
    match plan.shape {
        Shape::Single | Shape::SameBytesTwice | Shape::DifferentBytesTwice => {
            [unit(Who::Anonymous, 1)].into()
        }
        Shape::Split { who, parts, .. } => (1..=parts).map(|p| unit(who, p)).collect(),
        Shape::TwoScopes(x, y) => [unit(x, 1), unit(y, 1)].into(),
    }
}

/// One request a client makes of the relay, retried until answered: who sends which bytes to
/// which recipient set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Ask {
    who: Who,
    variant: char,
    /// The recipient set: 0 unless the key is split, then the part's place in the message.
    set: usize,
}

impl std::fmt::Display for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} variant {} set {}",
            self.who.scope(),
            self.variant,
            self.set
        )
    }
}

/// Disjoint per set (and of one or two recipients), the same for every try of an ask.
fn recipients(plan: &Plan, set: usize) -> Vec<String> {
    match plan.shape {
        Shape::Split { .. } => (0..=set % 2)
            .map(|j| format!("part{set}-rcpt{j}@example.com"))
            .collect(),
        _ => vec!["rcpt@example.com".into()],
    }
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

/// Whether `stored` is what the relay must store for `submitted` when the upstream is to see
/// `upstream` (docs/concepts/contract.md): its `Received:` line, the key field for `upstream`, then the
/// submitted bytes without the client's key field.
fn stored_as(stored: &[u8], submitted: &[u8], key: &str, upstream: &str) -> bool {
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let client_field = format!("X-Bird-Idempotency-Key: {key}\r\n");
    let Some(at) = find(submitted, client_field.as_bytes()) else {
        return false;
    };
    let rest = [&submitted[..at], &submitted[at + client_field.len()..]].concat();
    let relay_lines = format!("\r\nX-Bird-Idempotency-Key: {upstream}\r\n");
    stored.starts_with(b"Received: ")
        && stored.len() >= rest.len()
        && stored.ends_with(&rest)
        && stored[..stored.len() - rest.len()].ends_with(relay_lines.as_bytes())
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

/// An unauthenticated submission to `rcpt@example.com` (also the power-loss test's).
async fn submit_once(addr: SocketAddr, message: &[u8], hang_up: bool) -> Try {
    submit_as(
        addr,
        None,
        &["rcpt@example.com".to_string()],
        message,
        hang_up,
    )
    .await
}

/// One try: `AUTH PLAIN` first when `login` names a user.
async fn submit_as(
    addr: SocketAddr,
    login: Option<(&str, &str)>,
    rcpts: &[String],
    message: &[u8],
    hang_up: bool,
) -> Try {
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
        let mut steps = vec!["EHLO chaos.test".to_string()];
        steps.extend(login.map(|(user, password)| common::auth_plain(user, password)));
        steps.push("MAIL FROM:<sender@example.com>".into());
        steps.extend(rcpts.iter().map(|r| format!("RCPT TO:<{r}>")));
        steps.push("DATA".into());
        for step in &steps {
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

/// What one client saw for one ask, across its tries.
#[derive(Debug, Clone)]
struct Submitted {
    ask: Ask,
    /// The ask was answered 250 before: this is a client's retry of it, which must replay.
    resend: bool,
    /// The part number the relay must have given it: parts sent one after the other are
    /// numbered in that order.
    expect_part: Option<u32>,
    last: Final,
    tries: u32,
    /// Tries without a reply (refused connection, a dead relay, our hang-up).
    lost: u32,
    /// Tries answered 4xx, and by what (code and error code, or the reply's first words).
    deferred: u32,
    deferrals: BTreeMap<String, u32>,
    /// The 250 line and its queue id.
    accepted: Option<(String, String)>,
}

/// A reply line without its variable parts: the code and its `(Ennnnn ...)` error code when
/// it has one, else its first words.
fn reply_kind(line: &str) -> String {
    match line.find("(E0") {
        Some(at) => format!(
            "{} {}",
            line.get(..3).unwrap_or(line),
            line[at + 1..].split_whitespace().next().unwrap_or_default()
        ),
        None => line
            .split_whitespace()
            .take(4)
            .collect::<Vec<_>>()
            .join(" "),
    }
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
    plan: Arc<Plan>,
    ask: Ask,
    hang_up_first: bool,
    mut rng: fastrand::Rng,
) -> Submitted {
    let message = message_bytes(&plan, ask.variant);
    let rcpts = recipients(&plan, ask.set);
    let mut out = Submitted {
        ask,
        resend: false,
        expect_part: None,
        last: Final::GaveUp,
        tries: 0,
        lost: 0,
        deferred: 0,
        deferrals: BTreeMap::new(),
        accepted: None,
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
        match submit_as(addr, ask.who.login(), &rcpts, &message, hang_up).await {
            Try::Answer(250, line) => {
                let id = queue_id(&line).unwrap_or_else(|| format!("250 without id: {line}"));
                out.accepted = Some((line, id));
                out.last = Final::Accepted;
                return out;
            }
            Try::Answer(code, line) if code >= 500 => {
                out.last = Final::Refused(line);
                return out;
            }
            Try::Answer(_, line) => {
                out.deferred += 1;
                *out.deferrals.entry(reply_kind(&line)).or_default() += 1;
            }
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
    let plan = Arc::new(plan);
    let one = |who: Who, variant: char, set: usize, start: usize, hang_up: bool, rng| {
        let ask = Ask { who, variant, set };
        submit_until_answered(addrs.clone(), start, plan.clone(), ask, hang_up, rng)
    };
    match plan.shape {
        Shape::Single => vec![one(Who::Anonymous, 'a', 0, start, hang_up, rng.fork()).await],
        // Two clients at the same moment, on different instances when there are several.
        Shape::SameBytesTwice | Shape::DifferentBytesTwice => {
            let second = if plan.shape == Shape::SameBytesTwice {
                'a'
            } else {
                'b'
            };
            let (x, y) = tokio::join!(
                one(Who::Anonymous, 'a', 0, start, hang_up, rng.fork()),
                one(Who::Anonymous, second, 0, start + 1, false, rng.fork())
            );
            vec![x, y]
        }
        Shape::TwoScopes(x, y) => {
            let (x, y) = tokio::join!(
                one(x, 'a', 0, start, hang_up, rng.fork()),
                one(y, 'b', 0, start + 1, false, rng.fork())
            );
            vec![x, y]
        }
        Shape::Split { who, parts, racing } => {
            let mut out = Vec::new();
            if racing {
                let mut racers = tokio::task::JoinSet::new();
                for part in 0..parts {
                    racers.spawn(one(
                        who,
                        'a',
                        part,
                        start + part,
                        hang_up && part == 0,
                        rng.fork(),
                    ));
                }
                out = racers.join_all().await;
                out.sort_by_key(|s| s.ask.set);
            } else {
                for part in 0..parts {
                    let mut s = one(
                        who,
                        'a',
                        part,
                        start + part,
                        hang_up && part == 0,
                        rng.fork(),
                    )
                    .await;
                    s.expect_part = Some(part as u32 + 1);
                    let accepted = s.accepted.is_some();
                    out.push(s);
                    if !accepted {
                        // A client gives up on the message; the checks say why.
                        break;
                    }
                }
            }
            // A client that did not hear the 250 in time (or a careless one) sends it again.
            let answered: Vec<usize> = out
                .iter()
                .filter(|s| s.accepted.is_some())
                .map(|s| s.ask.set)
                .collect();
            for part in answered.into_iter().rev() {
                let mut s = one(who, 'a', part, start + part + 1, false, rng.fork()).await;
                s.resend = true;
                out.push(s);
            }
            out
        }
    }
}

// --- the relays ----------------------------------------------------------------------------

/// The users of [`USERS`], with cheap argon2 parameters: `AUTH` verifies with the parameters
/// of the stored hash, and the default ones (19 MiB, two passes) would put hundreds of such
/// runs per scenario on the test's two cores, one per login.
fn write_users(path: &Path) {
    use argon2::CustomizedPasswordHasher as _;
    for (name, password, scope) in USERS {
        idemrelay::auth::Users::add_user(path, name, password, scope, &[]).unwrap();
        let params = argon2::Params::new(8, 1, 1, None).unwrap();
        let cheap = argon2::Argon2::default()
            .hash_password_with_params(password.as_bytes(), b"chaos-test-salt", params)
            .unwrap()
            .to_string();
        // The hash just written is the one with other parameters than the cheap ones.
        let text = std::fs::read_to_string(path).unwrap();
        let costly = text
            .split('"')
            .find(|s| s.starts_with("$argon2") && !s.contains("$m=8,t=1,p=1$"))
            .unwrap_or_else(|| panic!("no new hash for {name} in {text}"))
            .to_string();
        std::fs::write(path, text.replace(&costly, &cheap)).unwrap();
    }
}

fn write_config(path: &Path, users: &Path) {
    // Every phase is listed: `[delivery.timeouts]` does not accept a partial table.
    let text = format!(
        r#"
users_file = "{}"
webhook_listen = "127.0.0.1:0"
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

# The sink's event shape (docs/guides/sink.md "Its webhooks").
[webhooks.{HOOK_SOURCE}]
secrets = ["{HOOK_SECRET}"]
[webhooks.{HOOK_SOURCE}.fields]
event_type = "/type"
event_time = "/timestamp"
key = "/idempotency_key"
upstream_id = "/message_id"
message_id = "/headers/message-id"
recipient = "/rcpt_to"
[webhooks.{HOOK_SOURCE}.types]
accepted = ["injection", "delivery"]
bounced = ["bounce"]
"#,
        users.display(),
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
    /// The webhook listeners of the relays that are up, for the balancer.
    hooks: Addrs,
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
            hooks: Arc::new(Mutex::new(vec![None; instances])),
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
        self.hooks.lock().unwrap()[i] = Some(relay.webhooks());
        self.relays[i] = Some(relay);
    }

    /// Notes why a relay died and starts another on the same store.
    async fn buried(&mut self, i: usize, relay: RelayProcess, status: std::process::ExitStatus) {
        use std::os::unix::process::ExitStatusExt;
        // The log is collected by a thread that may not yet have drained the pipe when the
        // exit is seen, and a crash point's line is the last one: without this wait, a busy
        // relay's abort could be taken for a death nobody asked for.
        let settle = Instant::now() + Duration::from_secs(3);
        let log = loop {
            let log = relay.log();
            if status.signal() == Some(9)
                || log.contains(" fired: aborting\n")
                || Instant::now() >= settle
            {
                break log;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
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
                self.hooks.lock().unwrap()[i] = None;
                let relay = self.relays[i].take().unwrap();
                self.buried(i, relay, status).await;
            }
        }
    }

    async fn sigkill(&mut self, i: usize) {
        self.addrs.lock().unwrap()[i] = None;
        self.hooks.lock().unwrap()[i] = None;
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

/// What the balancer in front of the relays' webhook listeners did.
#[derive(Debug, Default)]
struct Balanced {
    /// Connections passed on, per relay instance.
    per_relay: Vec<u64>,
    /// Connections closed at once: no relay was up, or the one picked refused.
    closed: u64,
}

/// The relays' webhook listeners behind one address, as a load balancer in TCP mode puts
/// them (the sink is told one URL; the relays move to new ports when restarted): each
/// connection goes to the next relay that is up, round robin, and is closed at once when none
/// is, so that the sink retries.
async fn balance(listener: TcpListener, hooks: Addrs, counts: Arc<Mutex<Balanced>>) {
    let mut next = 0usize;
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let picked = {
            let hooks = hooks.lock().unwrap();
            let n = hooks.len();
            (0..n).find_map(|i| hooks[(next + i) % n].map(|addr| ((next + i) % n, addr)))
        };
        next = next.wrapping_add(1);
        let counts = counts.clone();
        tokio::spawn(async move {
            let outbound = match picked {
                Some((i, addr)) => {
                    tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .map(|s| (i, s))
                }
                None => None,
            };
            let Some((i, mut outbound)) = outbound else {
                counts.lock().unwrap().closed += 1;
                return;
            };
            {
                let mut counts = counts.lock().unwrap();
                if counts.per_relay.len() <= i {
                    counts.per_relay.resize(i + 1, 0);
                }
                counts.per_relay[i] += 1;
            }
            // A relay killed in the middle of a request breaks both halves: the sender sees
            // no answer, as it would behind a real balancer.
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
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
                            FaultRule::reply(FaultStage::Mail, 451, "4.3.0 chaos burst")
                                .with_times(times),
                        );
                        storm.sink_bursts += 1;
                    }
                    _ => {
                        let times = rng.u32(3..10);
                        add_sink_rule(
                            &sink,
                            FaultRule::reply(FaultStage::Connect, 421, "4.3.2 chaos burst")
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

// --- the upstream's events ------------------------------------------------------------------

#[derive(Debug, Default)]
struct HookCounts {
    batches: u64,
    posts: usize,
    /// Posts without a 2xx (no relay up, one killed mid-request, a locked store's 503),
    /// each retried.
    refused_posts: usize,
    /// Batches posted twice on purpose (`duplicate`), and 2xx treated as lost (`lose_ack`).
    duplicated: usize,
    acks_lost: usize,
    /// Posts the relays answered `{"duplicate":true}`.
    duplicate_answers: usize,
    receipts: usize,
    events: i64,
    /// Stored, not applied: older than an event already applied to the same record and
    /// recipient (a reordered injection).
    stale: i64,
    /// Records an event resolved from `unresolved` to `delivered`.
    resolved: usize,
    /// Records settled unresolved, as `report` counts them.
    settled_unresolved: u64,
}

/// What the relay answered a 2xx post: `Some(true)` for a webhook-id it had received before.
fn duplicate_answer(post: &WebhookAttempt) -> Option<bool> {
    let body = post.response.as_deref()?;
    if body.contains(r#""duplicate":true"#) {
        Some(true)
    } else if body.contains(r#""duplicate":false"#) {
        Some(false)
    } else {
        None
    }
}

/// The upstream's truth against the store, once the sink has posted every batch to the end:
/// each webhook-id received once (a receipt for each id that got a 2xx, nothing else; every
/// later post of it answered as a duplicate; as many events stored as those batches hold), no
/// event left without its record, a record the sink accepted never left `unresolved`, and a
/// record resolved only by an event about a message the sink accepted with its key and bytes.
async fn check_webhooks(
    store_url: &str,
    reader: &dyn Store,
    sink: &SinkHandle,
    stored: &BTreeMap<Unit, (&store::MessageSummary, store::StoredMessage)>,
    violations: &mut Vec<String>,
) -> HookCounts {
    let stats = sink.stats();
    let posts = sink.webhooks();
    let messages: BTreeMap<String, idemrelay_sink::ReceivedMessage> = sink
        .messages()
        .into_iter()
        .map(|m| (m.id.clone(), m))
        .collect();
    let mut h = HookCounts {
        batches: stats.webhooks.batches,
        posts: posts.len(),
        ..HookCounts::default()
    };
    if stats.webhooks.failed > 0 || stats.webhooks.dropped > 0 {
        violations.push(format!(
            "the sink gave up on webhook batches: {:?}",
            stats.webhooks
        ));
    }

    let mut by_id: BTreeMap<&str, Vec<&WebhookAttempt>> = BTreeMap::new();
    for p in &posts {
        by_id.entry(p.webhook_id.as_str()).or_default().push(p);
    }
    let mut through: BTreeSet<String> = BTreeSet::new();
    let mut batch_events: i64 = 0;
    for (id, mut ps) in by_id {
        ps.sort_by_key(|p| p.seq);
        let ok: Vec<&WebhookAttempt> = ps
            .iter()
            .copied()
            .filter(|p| p.status.is_some_and(|s| (200..300).contains(&s)))
            .collect();
        h.refused_posts += ps.len() - ok.len();
        h.duplicated += usize::from(ps.iter().any(|p| p.copy == 2));
        h.acks_lost += ps
            .iter()
            .filter(|p| p.outcome == AttemptOutcome::AckLost)
            .count();
        let Some(first) = ok.first() else {
            violations.push(format!("webhook {id}: never answered 2xx: {ps:?}"));
            continue;
        };
        through.insert(id.to_string());
        batch_events += first.events as i64;
        h.duplicate_answers += ok
            .iter()
            .filter(|p| duplicate_answer(p) == Some(true))
            .count();
        // The first 2xx may itself be a duplicate (an earlier post was committed, and the
        // relay died before answering); every one after it must be.
        if duplicate_answer(first).is_none()
            || ok[1..].iter().any(|p| duplicate_answer(p) != Some(true))
        {
            violations.push(format!(
                "webhook {id}: received more than once: {:?}",
                ok.iter()
                    .map(|p| (p.copy, p.attempt, p.response.clone()))
                    .collect::<Vec<_>>()
            ));
        }
    }
    let receipts: BTreeSet<String> =
        backend::strings(store_url, "SELECT webhook_id FROM webhook_receipts")
            .await
            .into_iter()
            .collect();
    h.receipts = receipts.len();
    if receipts != through {
        violations.push(format!(
            "webhook receipts: {} stored, {} ids got a 2xx; stored only: {:?}; 2xx only: {:?}",
            receipts.len(),
            through.len(),
            receipts.difference(&through).take(5).collect::<Vec<_>>(),
            through.difference(&receipts).take(5).collect::<Vec<_>>()
        ));
    }
    h.events = backend::count(store_url, "upstream_events").await;
    if h.events != batch_events {
        violations.push(format!(
            "{} upstream events stored, the {} batches received hold {batch_events}",
            h.events,
            through.len()
        ));
    }
    let unmatched = backend::scalar(
        store_url,
        "SELECT COUNT(*) FROM upstream_events WHERE record_id IS NULL",
    )
    .await;
    if unmatched > 0 {
        violations.push(format!("{unmatched} upstream events matched no record"));
    }
    h.stale = backend::scalar(
        store_url,
        "SELECT COUNT(*) FROM upstream_events WHERE record_id IS NOT NULL AND NOT applied",
    )
    .await;

    // The sink's truth per record: which upstream keys it holds a message for.
    let accepted: BTreeSet<&str> = stats
        .keys
        .iter()
        .filter(|(_, k)| k.accepted >= 1)
        .map(|(up, _)| up.as_str())
        .collect();
    for (unit, (record, m)) in stored {
        let up = m.upstream_key.as_deref().unwrap_or_default();
        if accepted.contains(up) && record.state == State::Unresolved {
            violations.push(format!(
                "{unit} ({}): the sink accepted it and sent its events, yet it stays unresolved",
                record.id
            ));
        }
        let Some(evidence) = &m.resolved_by else {
            continue;
        };
        h.resolved += 1;
        // `upstream/msg_<sink id>_<type>#<index> <type>`
        let sink_id = evidence
            .strip_prefix(&format!("{HOOK_SOURCE}/msg_"))
            .and_then(|rest| rest.split('_').next());
        let proven = sink_id.and_then(|id| messages.get(id)).is_some_and(|sm| {
            sm.key.as_deref() == Some(up) && m.content.as_deref() == Some(sm.bytes.as_slice())
        });
        if record.state != State::Delivered || !proven {
            violations.push(format!(
                "{unit} ({}): {:?} by {evidence}, which names no message the sink accepted \
                 with its key and bytes",
                record.id, record.state
            ));
        }
    }
    let report = reader.report(None).await.unwrap();
    h.settled_unresolved = report.iter().map(|d| d.unresolved).sum();
    let by_event: u64 = report.iter().map(|d| d.resolved_by_event).sum();
    if by_event != h.resolved as u64 {
        violations.push(format!(
            "report counts {by_event} resolved by event, {} records name their event",
            h.resolved
        ));
    }
    h
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

    let records = list_all(reader.as_ref()).await;
    let mut violations: Vec<String> = Vec::new();
    let mut c = Counts {
        t: plans.iter().map(|p| units(p).len()).sum(),
        submissions: answers.values().map(Vec::len).sum(),
        ..Counts::default()
    };
    for plan in &plans {
        match plan.shape {
            Shape::Split { parts, racing, .. } => {
                c.split_keys += 1;
                c.split_parts += parts;
                c.racing_splits += usize::from(racing);
            }
            Shape::TwoScopes(..) => c.shared_keys += 1,
            _ => {}
        }
    }
    let plan_of: BTreeMap<&str, &Plan> = plans.iter().map(|p| (p.key.as_str(), p)).collect();
    let names = |units: &BTreeSet<Unit>| units.iter().map(Unit::to_string).collect::<Vec<_>>();

    // The store: one record per unit, each under an upstream key of its own.
    let mut stored: BTreeMap<Unit, (&store::MessageSummary, store::StoredMessage)> =
        BTreeMap::new();
    let mut unit_of_id: BTreeMap<&str, Unit> = BTreeMap::new();
    let mut unit_of_upstream: BTreeMap<String, Unit> = BTreeMap::new();
    let mut scope_tags: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in &records {
        let Some(key) = r.key.clone() else {
            violations.push(format!("record {} without a key", r.id));
            continue;
        };
        let Some(m) = reader.message(&r.id).await.unwrap() else {
            violations.push(format!("record {} listed, but not there to read", r.id));
            continue;
        };
        let unit = Unit {
            scope: m.scope.clone(),
            key,
            part: m.part,
        };
        match plan_of.get(unit.key.as_str()) {
            None => violations.push(format!("record {} under a key nobody sent: {unit}", r.id)),
            Some(plan) if !units(plan).contains(&unit) => violations.push(format!(
                "record {} is {unit}, which nobody asked for ({:?})",
                r.id, plan.shape
            )),
            Some(_) => {}
        }
        match r.state {
            State::Delivered => {}
            State::Unresolved => c.unresolved += 1,
            other => violations.push(format!("{unit} ({}): ended {other:?}", r.id)),
        }
        match &m.upstream_key {
            None => violations.push(format!("{unit} ({}): no upstream key", r.id)),
            Some(up) => {
                // Several scopes share the upstream: every key the upstream sees carries its
                // scope's tag and its part.
                let suffix = format!("-{}-{}", unit.part, unit.key);
                match up
                    .strip_prefix("u1-")
                    .and_then(|rest| rest.strip_suffix(&suffix))
                {
                    Some(tag) if tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()) => {
                        scope_tags
                            .entry(unit.scope.clone())
                            .or_default()
                            .insert(tag.to_string());
                    }
                    _ => violations.push(format!(
                        "{unit} ({}): the upstream sees {up:?}, not u1-<scope tag>{suffix}",
                        r.id
                    )),
                }
                if let Some(other) = unit_of_upstream.insert(up.clone(), unit.clone()) {
                    violations.push(format!("{other} and {unit}: one upstream key {up}"));
                }
            }
        }
        unit_of_id.insert(r.id.as_str(), unit.clone());
        if let Some((other, _)) = stored.insert(unit.clone(), (r, m)) {
            violations.push(format!("{unit}: two records, {} and {}", other.id, r.id));
        }
    }
    let mut tag_of: BTreeMap<&str, &str> = BTreeMap::new();
    for (scope, tags) in &scope_tags {
        if tags.len() != 1 {
            violations.push(format!(
                "scope {scope}: upstream keys with the tags {tags:?}"
            ));
        }
        for tag in tags {
            if let Some(other) = tag_of.insert(tag, scope) {
                violations.push(format!("scopes {other} and {scope} share the tag {tag}"));
            }
        }
    }

    // What the clients were told.
    let mut ids_of_ask: BTreeMap<(&str, Ask), BTreeSet<&str>> = BTreeMap::new();
    let mut asks_of_id: BTreeMap<&str, BTreeSet<(&str, Ask)>> = BTreeMap::new();
    let mut answered: BTreeSet<Unit> = BTreeSet::new();
    for (key, subs) in &answers {
        let plan = plan_of[key.as_str()];
        let mut told: BTreeSet<Unit> = BTreeSet::new();
        for s in subs {
            c.tries += u64::from(s.tries);
            c.lost_tries += u64::from(s.lost);
            c.deferred_tries += u64::from(s.deferred);
            for (kind, n) in &s.deferrals {
                *c.deferrals.entry(kind.clone()).or_default() += u64::from(*n);
            }
            match &s.last {
                Final::GaveUp => violations.push(format!(
                    "{key} ({}): neither accepted nor refused within {KEY_LIMIT:?}",
                    s.ask
                )),
                Final::Refused(line) => {
                    let conflict = line.starts_with("554 ") && line.contains("E01005");
                    if conflict {
                        c.e01005 += 1;
                    }
                    if plan.shape != Shape::DifferentBytesTwice || !conflict {
                        violations.push(format!(
                            "{key} ({}, {:?}{}): refused: {line}",
                            s.ask,
                            plan.shape,
                            if s.resend { ", sent again" } else { "" }
                        ));
                    }
                }
                Final::Accepted => {}
            }
            let Some((line, id)) = &s.accepted else {
                continue;
            };
            ids_of_ask
                .entry((key.as_str(), s.ask))
                .or_default()
                .insert(id);
            asks_of_id
                .entry(id)
                .or_default()
                .insert((key.as_str(), s.ask));
            if s.resend {
                c.resent += 1;
                if line.contains("(idempotent replay)") {
                    c.replayed += 1;
                } else {
                    violations.push(format!(
                        "{key} ({}): sent again after its 250, answered {line:?}: not a replay",
                        s.ask
                    ));
                }
            }
            let Some(unit) = unit_of_id.get(id.as_str()) else {
                violations.push(format!(
                    "{key} ({}): answered 250 as {id}, no such record",
                    s.ask
                ));
                continue;
            };
            if unit.scope != s.ask.who.scope() || unit.key != *key {
                violations.push(format!(
                    "{key} ({}): answered with {id}, the record of {unit}",
                    s.ask
                ));
            }
            if let Some(part) = s.expect_part {
                if unit.part != part {
                    violations.push(format!(
                        "{key} ({}): sent as part {part} once the parts before were answered, \
                         numbered {}",
                        s.ask, unit.part
                    ));
                }
            }
            told.insert(unit.clone());
        }
        let accepted = subs.iter().filter(|s| s.accepted.is_some()).count();
        if plan.shape == Shape::DifferentBytesTwice && accepted != 1 {
            violations.push(format!(
                "{key}: {accepted} of two different messages under one key accepted"
            ));
        }
        let want = units(plan);
        if told != want {
            violations.push(format!(
                "{key} ({:?}): clients were told 250 for {:?}, the plan has {:?}",
                plan.shape,
                names(&told),
                names(&want)
            ));
        }
        answered.extend(told);
    }
    c.a = answered.len();
    for ((key, ask), ids) in &ids_of_ask {
        if ids.len() > 1 {
            violations.push(format!(
                "{key} ({ask}): answered with several queue ids {ids:?}"
            ));
        }
    }
    for (id, asks) in &asks_of_id {
        if asks.len() > 1 {
            violations.push(format!("{id}: the answer to different requests {asks:?}"));
        }
    }

    // The sink, after its dedup and raw; it sees the upstream keys.
    let stats = sink.stats();
    let transactions = sink.transactions();
    let messages = sink.messages();
    c.r = transactions.len();
    let mut delivered: BTreeSet<Unit> = BTreeSet::new();
    let mut delivered_keys = 0;
    for (up, s) in &stats.keys {
        let unit = unit_of_upstream.get(up);
        let name = unit.map_or_else(|| up.clone(), |u| format!("{u} ({up})"));
        if s.accepted >= 1 {
            delivered_keys += 1;
            match unit {
                Some(u) => {
                    delivered.insert(u.clone());
                }
                None => {
                    c.unexpected += 1;
                    violations.push(format!("{up}: delivered, but no record has this key"));
                }
            }
        }
        if s.accepted > 1 {
            c.duplicated += s.accepted as usize - 1;
            violations.push(format!("{name}: delivered {} times: {s:?}", s.accepted));
        }
    }
    c.d = delivered.len();
    for u in &answered {
        if !delivered.contains(u) {
            c.lost += 1;
            violations.push(format!("{u}: answered 250, never delivered"));
        }
    }
    for u in &delivered {
        if !plan_of
            .get(u.key.as_str())
            .is_some_and(|p| units(p).contains(u))
        {
            c.unexpected += 1;
            violations.push(format!("{u}: delivered, but nobody submitted it"));
        } else if !answered.contains(u) {
            // Committed but never confirmed, although its client kept retrying: a retry must
            // get the replay.
            c.unanswered += 1;
            violations.push(format!("{u}: delivered, but its clients never got a 250"));
        }
    }
    if messages.len() != delivered_keys + c.duplicated {
        violations.push(format!(
            "the sink holds {} messages for {delivered_keys} keys",
            messages.len()
        ));
    }
    let no_key = transactions.iter().filter(|t| t.key.is_none()).count();
    if no_key > 0 {
        c.unexpected += no_key;
        violations.push(format!("{no_key} sink transactions without a key"));
    }

    // Per unit: bytes forwarded, raw transactions explained by the ledger, window kept.
    let mut by_key: BTreeMap<&str, Vec<&idemrelay_sink::Transaction>> = BTreeMap::new();
    for t in &transactions {
        if let Some(k) = &t.key {
            by_key.entry(k.as_str()).or_default().push(t);
        }
    }
    for (up, txs) in &by_key {
        if !unit_of_upstream.contains_key(*up) {
            c.mismatched_forwarded += txs.len();
            violations.push(format!("{up}: {} transactions, but no record", txs.len()));
        }
    }
    let retried: BTreeSet<&str> = answers
        .iter()
        .filter(|(_, subs)| subs.iter().any(|s| s.tries > 1))
        .map(|(k, _)| k.as_str())
        .collect();
    let envelope = |rcpts: &[String]| -> BTreeSet<String> {
        rcpts
            .iter()
            .map(|r| r.trim_matches(['<', '>']).to_ascii_lowercase())
            .collect()
    };
    let window_ms = WINDOW.as_millis() as i64;
    let retry_limit_ms = (WINDOW - MARGIN + INTENT_SLACK).as_millis() as i64;
    let mut faulted: BTreeSet<&Unit> = BTreeSet::new();
    for (unit, (record, m)) in &stored {
        let Some(plan) = plan_of.get(unit.key.as_str()) else {
            continue;
        };
        let key = unit.key.as_str();
        let up = m.upstream_key.as_deref().unwrap_or_default();
        let txs = by_key.get(up).cloned().unwrap_or_default();
        if plan.fault != Fault::None
            || plan.shape == Shape::DifferentBytesTwice
            || txs.len() > 1
            || retried.contains(key)
        {
            faulted.insert(unit);
        }
        let attempts: Vec<AttemptRow> = reader.attempts(&record.id).await.unwrap();
        if attempts.len() > 1 {
            faulted.insert(unit);
        }
        if plan.fault != Fault::PastWindow {
            for pair in attempts.windows(2) {
                let gap = pair[1].started_at_ms - pair[0].started_at_ms;
                if gap > c.longest_gap_ms {
                    c.longest_gap_ms = gap;
                    let before = &pair[0];
                    c.longest_gap_unit = format!(
                        "{unit} before attempt {}, {:?}: attempt {} by {} ended {} at {} \
                         after {} ms",
                        pair[1].attempt,
                        plan.fault,
                        before.attempt,
                        before.owner,
                        before.outcome.as_deref().unwrap_or("open"),
                        before.phase.as_deref().unwrap_or("?"),
                        before
                            .finished_at_ms
                            .map_or(-1, |f| f - before.started_at_ms)
                    );
                }
            }
        }
        let unknowns = attempts
            .iter()
            .filter(|a| a.outcome.as_deref() == Some("unknown"))
            .count();
        c.unknown_attempts += unknowns;
        if let Some(open) = attempts.iter().find(|a| a.outcome.is_none()) {
            violations.push(format!("{unit}: intent left open: {open:?}"));
        }
        // Settled unresolved, whether an upstream event has resolved it since or not.
        let parked = record.state == State::Unresolved || m.resolved_by.is_some();
        if plan.fault != Fault::PastWindow && parked {
            c.parked_early += 1;
            // Not a violation (the relay may park what it cannot resolve in time), but worth
            // seeing: nothing else in this run should come near the window.
            eprintln!(
                "chaos {}: {unit} ({:?}) parked unresolved ({:?}); ledger: {attempts:#?}\n{}",
                scenario.name,
                plan.fault,
                record.upstream_reply,
                cluster.lines_about(&record.id)
            );
        }
        // Every reply was lost, so only the ledger's window could park it, and only the
        // sink's events (it did commit the message) can then resolve it.
        if plan.fault == Fault::PastWindow
            && (record.state != State::Delivered || m.resolved_by.is_none())
        {
            violations.push(format!(
                "{unit}: every reply was lost, yet the record is {:?} (resolved by {:?})",
                record.state, m.resolved_by
            ));
        }
        if plan.fault == Fault::PastWindow
            && attempts
                .iter()
                .any(|a| a.outcome.as_deref() == Some("accepted"))
        {
            violations.push(format!(
                "{unit}: every reply was lost, yet the ledger has an accepted attempt: \
                 {attempts:?}"
            ));
        }

        // What was stored is what its client sent (with the relay's lines), to the part's
        // recipients.
        let content = m.content.clone().unwrap_or_default();
        let ask = asks_of_id
            .get(record.id.as_str())
            .and_then(|asks| asks.first())
            .map(|(_, ask)| *ask);
        if let Some(ask) = ask {
            if !stored_as(&content, &message_bytes(plan, ask.variant), key, up) {
                violations.push(format!(
                    "{unit} ({}): the stored bytes are not those of {ask} under {up}",
                    record.id
                ));
            }
            if envelope(&m.rcpt_to) != envelope(&recipients(plan, ask.set)) {
                violations.push(format!(
                    "{unit} ({}): stored for {:?}, sent by {ask} to {:?}",
                    record.id,
                    m.rcpt_to,
                    recipients(plan, ask.set)
                ));
            }
        }

        // Byte identity: every transaction carried the stored bytes to the stored recipients,
        // and a losing variant never got out.
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
                    "{unit}: transaction #{} forwarded bytes of variant {which} that differ from \
                     the stored record {}",
                    t.seq, record.id
                ));
            }
            if envelope(&t.rcpt_to) != envelope(&m.rcpt_to) {
                c.mismatched_forwarded += 1;
                violations.push(format!(
                    "{unit}: transaction #{} went to {:?}, the record {} is for {:?}",
                    t.seq, t.rcpt_to, record.id, m.rcpt_to
                ));
            }
        }

        // A transaction after the sink's first commit is the relay sending again what the
        // upstream already has: only an UNKNOWN attempt justifies that, and only inside the
        // window measured from the first attempt.
        let first_attempt = attempts.first().map(|a| a.started_at_ms);
        if txs.len() > attempts.len() {
            violations.push(format!(
                "{unit}: {} transactions but {} attempts in the ledger",
                txs.len(),
                attempts.len()
            ));
        }
        if let Some(commit) = txs.iter().position(|t| t.outcome == DotDecision::Accepted) {
            let extra = &txs[commit + 1..];
            c.extra_raw += extra.len();
            if !extra.is_empty() {
                let late = extra
                    .iter()
                    .any(|t| first_attempt.is_none_or(|f| t.received_at_ms as i64 > f + window_ms));
                if unknowns == 0 || late {
                    c.unexplained_extra += extra.len();
                    violations.push(format!(
                        "{unit}: {} raw transactions after the commit, {unknowns} UNKNOWN \
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
                        "{unit}: attempt {} started {} ms after the first, past the window \
                         ({} ms) less the margin",
                        a.attempt,
                        a.started_at_ms - first,
                        (WINDOW - MARGIN).as_millis()
                    ));
                }
            }
        }
    }
    c.faulted_units = faulted.len();
    let hooks = check_webhooks(
        &scenario.store_url,
        reader.as_ref(),
        &sink,
        &stored,
        &mut violations,
    )
    .await;
    drop(reader);

    // Per scope: units answered 250 / delivered.
    let mut per_scope: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for u in &answered {
        per_scope.entry(u.scope.as_str()).or_default().0 += 1;
    }
    for u in &delivered {
        per_scope.entry(u.scope.as_str()).or_default().1 += 1;
    }
    let later_parts = delivered.iter().filter(|u| u.part > 1).count();

    let elapsed = started.elapsed();
    let deaths = &cluster.deaths;
    let fired: usize = deaths.failpoints.values().sum();
    for d in &deaths.unexpected {
        violations.push(d.clone());
    }
    let share = 100.0 * c.faulted_units as f64 / c.t as f64;
    let per_fault = |f: fn(&Fault) -> bool| plans.iter().filter(|p| f(&p.fault)).count();
    let balanced = std::mem::take(&mut *balanced.lock().unwrap());
    let per_hook =
        |f: fn(WebhookFault) -> bool| plans.iter().filter(|p| p.hook.is_some_and(f)).count();
    eprintln!(
        "chaos {name}: seed {seed:#x}, {n} keys in {subs} submissions ({tries} tries: {lost} \
         without a reply, {deferred} answered 4xx {deferrals:?}), clients done after \
         {submitted_in:.1?} (a key waited up to {gate_wait:.1?} for a free client; the \
         slowest, {slow_key} {slow_shape}, took {slow:.1?}), all settled after {elapsed:.1?}\n\
         \x20 T={t} units (scope, key, part) attempted, A={a} answered 250, D={d} delivered at \
         the sink after its dedup, R={r} raw sink transactions ({extra} after a commit)\n\
         \x20 mix: {splits} split keys ({racing} sending their parts at once) in {parts} parts, \
         {later} parts past the first delivered, {resent} parts sent again after their 250 \
         ({replayed} answered as a replay); {shared} keys used by two scopes; per scope \
         (A/D): {scopes}\n\
         \x20 per-key faults planned on {planned:.1}% of keys, faults of any kind touched \
         {share:.1}% of units: {sigkill} SIGKILLs, {fired} crash-point aborts \
         {fp:?}, {locks} store locks, {bursts} sink 4xx bursts; per key: {hang} client \
         hang-ups, {drop} replies dropped, {hold} withheld, {cut} cuts, {four} 4xx runs, \
         {past} past the window\n\
         \x20 ledger: {unknown} UNKNOWN attempts, {settled} settled unresolved ({early} not a \
         past-window key), {resolved} of them resolved by an upstream event, {unresolved} \
         still unresolved; longest wait between attempts {gap:.1} s ({gap_unit}); {e01005} \
         E01005 answers to a reused key\n\
         \x20 webhooks: {batches} batches ({events} events) in {posts} posts via the balancer \
         (connections per relay {per_relay:?}, {closed} closed with no relay up), {refused} \
         posts without a 2xx and retried; faults per key: {h_dup} duplicated, {h_reorder} \
         reordered, {h_late} late, {h_lose} lose_ack; {duplicated} batches posted twice, \
         {acks} 2xx treated as lost, {dup_answers} posts answered as a duplicate; \
         {receipts} receipts (one per webhook-id that got a 2xx), {stale} stale events \
         stored unapplied, {resolved} records resolved by event\n\
         \x20 per (scope, key, part): lost {lost_k}, duplicated {dup}, unexpected {unexp}, \
         unanswered {unans}, unexplained extra transactions {unexpl}, mismatched bytes \
         forwarded {mism}, UNKNOWN retried after the window {late}",
        name = scenario.name,
        subs = c.submissions,
        tries = c.tries,
        lost = c.lost_tries,
        deferred = c.deferred_tries,
        deferrals = c.deferrals,
        slow = slowest.0,
        slow_key = slowest.1,
        slow_shape = plan_of
            .get(slowest.1.as_str())
            .map_or(String::new(), |p| format!("{:?}", p.shape)),
        t = c.t,
        a = c.a,
        d = c.d,
        r = c.r,
        extra = c.extra_raw,
        splits = c.split_keys,
        racing = c.racing_splits,
        parts = c.split_parts,
        later = later_parts,
        resent = c.resent,
        replayed = c.replayed,
        shared = c.shared_keys,
        scopes = per_scope
            .iter()
            .map(|(s, (a, d))| format!("{s} {a}/{d}"))
            .collect::<Vec<_>>()
            .join(", "),
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
        settled = hooks.settled_unresolved,
        resolved = hooks.resolved,
        batches = hooks.batches,
        events = hooks.events,
        posts = hooks.posts,
        per_relay = balanced.per_relay,
        closed = balanced.closed,
        refused = hooks.refused_posts,
        h_dup = per_hook(|f| f == WebhookFault::Duplicate),
        h_reorder = per_hook(|f| f == WebhookFault::Reorder),
        h_late = per_hook(|f| matches!(f, WebhookFault::Late(_))),
        h_lose = per_hook(|f| f == WebhookFault::LoseAck),
        duplicated = hooks.duplicated,
        acks = hooks.acks_lost,
        dup_answers = hooks.duplicate_answers,
        receipts = hooks.receipts,
        stale = hooks.stale,
        early = c.parked_early,
        gap = c.longest_gap_ms as f64 / 1000.0,
        gap_unit = c.longest_gap_unit,
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
        later_parts > 0 && c.replayed > 0 && c.shared_keys > 0,
        "no split or shared key in the mix: {c:?}"
    );
    let all_scopes = std::iter::once(ANON_SCOPE).chain(USERS.iter().map(|u| u.2));
    for scope in all_scopes {
        assert!(
            per_scope.get(scope).is_some_and(|&(_, d)| d > 0),
            "nothing delivered for scope {scope}: {per_scope:?}"
        );
    }
    // The events had work to do: duplicates recognised, a reordered event kept stale, an
    // unresolved record resolved.
    assert!(
        hooks.resolved > 0 && hooks.duplicate_answers > 0 && hooks.acks_lost > 0 && hooks.stale > 0,
        "{hooks:?}"
    );
    assert!(
        share >= 20.0,
        "faults touched only {share:.1}% of units: {c:?}"
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
