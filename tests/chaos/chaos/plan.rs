//! The plan: which keys are split, shared between scopes or raced, which fault each gets,
//! and the bytes each client sends.

use super::*;

/// The `scope` of unauthenticated (allow-listed) clients: the relay's default.
pub(super) const ANON_SCOPE: &str = "default";
/// The users of the users file, each with a scope of its own: (name, password, scope).
pub(super) const USERS: [(&str, &str, &str); 2] = [
    ("alice", "chaos alice password", "tenant-alice"),
    ("bob", "chaos bob password", "tenant-bob"),
];

/// Who submits: an unauthenticated client, or a user of [`USERS`] after `AUTH PLAIN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Who {
    Anonymous,
    User(usize),
}

impl Who {
    pub(super) fn scope(self) -> &'static str {
        match self {
            Who::Anonymous => ANON_SCOPE,
            Who::User(i) => USERS[i].2,
        }
    }

    pub(super) fn login(self) -> Option<(&'static str, &'static str)> {
        match self {
            Who::Anonymous => None,
            Who::User(i) => Some((USERS[i].0, USERS[i].1)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
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
pub(super) enum Fault {
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
pub(super) struct Plan {
    pub(super) key: String,
    pub(super) shape: Shape,
    /// A per-key sink fault matches the key inside every upstream key made of it, so it hits
    /// whichever part or scope reaches the sink first (all of them when it has no count).
    pub(super) fault: Fault,
    /// Approximate message size.
    pub(super) size: usize,
    /// What the sink's webhook does with this key's event batches (every part and scope).
    pub(super) hook: Option<WebhookFault>,
}

pub(super) fn make_plans(rng: &mut fastrand::Rng, tag: &str, n: usize) -> Vec<Plan> {
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
pub(super) fn plan_hooks(rng: &mut fastrand::Rng, plans: &mut [Plan]) {
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

pub(super) fn hook_rule(plan: &Plan) -> Option<FaultRule> {
    plan.hook
        .map(|f| FaultRule::webhook(f).with_key(plan.key.clone()))
}

pub(super) fn sink_rule(plan: &Plan) -> Option<FaultRule> {
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
pub(super) struct Unit {
    pub(super) scope: String,
    pub(super) key: String,
    pub(super) part: u32,
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}#{}", self.scope, self.key, self.part)
    }
}

/// The units a plan must end with, each accepted once and delivered once.
pub(super) fn units(plan: &Plan) -> BTreeSet<Unit> {
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
pub(super) struct Ask {
    pub(super) who: Who,
    pub(super) variant: char,
    /// The recipient set: 0 unless the key is split, then the part's place in the message.
    pub(super) set: usize,
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
pub(super) fn recipients(plan: &Plan, set: usize) -> Vec<String> {
    match plan.shape {
        Shape::Split { .. } => (0..=set % 2)
            .map(|j| format!("part{set}-rcpt{j}@example.com"))
            .collect(),
        _ => vec!["rcpt@example.com".into()],
    }
}

/// The marker line that tells the variants of a key apart.
pub(super) fn variant_line(key: &str, variant: char) -> String {
    format!("chaos message {key}, variant {variant}")
}

pub(super) fn message_bytes(plan: &Plan, variant: char) -> Vec<u8> {
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
pub(super) fn stored_as(stored: &[u8], submitted: &[u8], key: &str, upstream: &str) -> bool {
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
