//! Circuit breaker for the upstream (docs/concepts/delivery.md, "Circuit breaker"): when the
//! upstream itself is unwell, all attempts stop for a cooldown, then one probe decides whether
//! traffic resumes.
//!
//! What counts is decided in [`super::decide::breaker_input`]: a run of `threshold` failures
//! that blame the upstream (connect, greeting, TLS, AUTH, a session lost before MAIL FROM was
//! answered, a 421) opens it; a message failing on its own (a 4xx after MAIL FROM, an UNKNOWN
//! reply to the dot) never does by itself, only as one of at least `window_messages` different
//! messages failing within `window`, making up at least `window_ratio` of the messages seen.
//!
//! The probe is never a message that has failed before (it would fail again on its own and
//! reopen the breaker for everyone): such a message waits while the worker checks the
//! connection instead (connect, greeting, TLS, AUTH, a `MAIL FROM:<>` that is reset).
//!
//! Time is passed in, so the breaker is a plain value a worker keeps behind its own lock.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::decide::{BreakerInput, Unwell};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    /// Every state, the one at start first (the metrics' label values).
    pub(crate) const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];

    pub(crate) fn parse(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == label)
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// The breaker's settings (`[delivery]` `breaker_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BreakerPolicy {
    /// Consecutive failures blaming the upstream that open it (0 is read as 1: a breaker that
    /// never closes would stop all mail).
    pub threshold: u32,
    /// How long it stays open.
    pub cooldown: Duration,
    /// How far back messages failing on their own are counted.
    pub window: Duration,
    /// Different messages that must have failed within the window (0: never opens for them).
    pub window_messages: u32,
    /// The share of the messages seen within the window that must have failed, in [0, 1].
    pub window_ratio: f64,
}

/// Why the breaker opened, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// A run of failures that blame the upstream; the class of the last one.
    Unwell(Unwell),
    /// Many different messages failed on their own within the window: `failing` of `seen`.
    Messages { failing: u32, seen: u32 },
}

impl Why {
    /// The `class` field of the log line.
    pub(crate) fn class(self) -> &'static str {
        match self {
            Why::Unwell(u) => u.as_str(),
            Why::Messages { .. } => "messages",
        }
    }
}

/// What the half-open probe is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ProbeBy {
    /// A message that had not failed before (its id).
    Message(String),
    /// A connection check, for want of such a message.
    Connection,
}

/// A message the worker has claimed and would send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate<'a> {
    pub id: &'a str,
    /// An attempt of it failed before (or was lost): it must not be the probe.
    pub failed_before: bool,
}

/// Whether the claimed message may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: send it.
    Send,
    /// Half-open, and this message is the probe: send it; its outcome decides.
    Probe,
    /// Half-open, and this message has failed before: check the connection instead
    /// ([`Breaker::on_check`]); the message waits for the result.
    CheckConnection,
    /// Open, or another probe is under way: hand the message back for this long.
    Wait(Duration),
}

/// One finished attempt, for the breaker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempted<'a> {
    pub id: &'a str,
    /// Its recipients, as one string: the window counts messages to the same recipients once,
    /// so a burst to one busy mailbox is one failing "message".
    pub to: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Inner {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        why: Why,
    },
    /// `probe_since` is when the current probe was let through; half-open is only ever
    /// entered by letting a probe through.
    HalfOpen {
        probe_since: Instant,
        probe: ProbeBy,
        why: Why,
    },
}

/// An outcome within the window, by recipients.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    /// A hash of the recipients: a message may have hundreds, and the window thousands of
    /// entries (a collision merely counts two recipient sets as one).
    to: u64,
    failed: bool,
}

/// The window never holds more than this many outcomes: at a high rate it covers less time,
/// which only makes it see fewer failing messages.
const WINDOW_CAP: usize = 4096;
/// While a probe is under way, a claimed message is handed back for this long (at most the
/// cooldown): the probe usually answers within it, and a message must not wait a whole
/// cooldown behind a probe that succeeded.
const PROBE_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    policy: BreakerPolicy,
    inner: Inner,
    window: VecDeque<Seen>,
    /// The state last handed out by [`Breaker::transition`].
    reported: BreakerState,
}

impl Breaker {
    pub(crate) fn new(policy: BreakerPolicy) -> Self {
        Breaker {
            policy: BreakerPolicy {
                threshold: policy.threshold.max(1),
                window_ratio: if policy.window_ratio.is_nan() {
                    1.0
                } else {
                    policy.window_ratio.clamp(0.0, 1.0)
                },
                ..policy
            },
            inner: Inner::Closed { failures: 0 },
            window: VecDeque::new(),
            reported: BreakerState::Closed,
        }
    }

    /// The state at `now` when it differs from the one this returned last (or from closed, the
    /// first time): call it after every `admit` and `on_*`, and each change is seen once, for
    /// the log and the transition counter.
    pub(crate) fn transition(&mut self, now: Instant) -> Option<BreakerState> {
        let state = self.state(now);
        (state != self.reported).then(|| {
            self.reported = state;
            state
        })
    }

    /// May `candidate` be sent now? Open → wait until the cooldown has elapsed, then HalfOpen
    /// admitting exactly one probe at a time: the candidate itself if it never failed, else a
    /// connection check.
    ///
    /// A probe whose result never comes back (its worker died) would hold the breaker half-open
    /// forever, so a probe slot is given up after one cooldown and the next caller probes.
    pub(crate) fn admit(&mut self, now: Instant, candidate: Candidate<'_>) -> Admit {
        match &self.inner {
            Inner::Closed { .. } => Admit::Send,
            Inner::Open { until, .. } if now < *until => Admit::Wait(*until - now),
            Inner::Open { why, .. } => self.start_probe(now, candidate, *why),
            Inner::HalfOpen {
                probe_since, why, ..
            } => {
                if now.saturating_duration_since(*probe_since) >= self.policy.cooldown {
                    self.start_probe(now, candidate, *why)
                } else {
                    Admit::Wait(PROBE_WAIT.min(self.policy.cooldown))
                }
            }
        }
    }

    fn start_probe(&mut self, now: Instant, candidate: Candidate<'_>, why: Why) -> Admit {
        let (probe, admit) = if candidate.failed_before {
            (ProbeBy::Connection, Admit::CheckConnection)
        } else {
            (ProbeBy::Message(candidate.id.to_string()), Admit::Probe)
        };
        self.inner = Inner::HalfOpen {
            probe_since: now,
            probe,
            why,
        };
        admit
    }

    /// A finished attempt of a message.
    ///
    /// A success (or a 5xx verdict) closes the breaker from any state: the upstream has just
    /// shown it is up, even for an attempt that began before it opened. Failures count only
    /// while closed, or as the probe's own outcome: late reports of attempts that began before
    /// the breaker opened neither extend the cooldown nor decide a probe.
    pub(crate) fn on_attempt(&mut self, now: Instant, attempt: Attempted<'_>, input: BreakerInput) {
        let is_probe = matches!(
            &self.inner,
            Inner::HalfOpen { probe: ProbeBy::Message(id), .. } if id == attempt.id
        );
        match input {
            BreakerInput::Success | BreakerInput::Neutral => {
                self.close();
                self.remember(now, attempt.to, false);
            }
            BreakerInput::Unwell(class) => match self.inner {
                Inner::Closed { failures } => {
                    let failures = failures.saturating_add(1);
                    self.inner = if failures >= self.policy.threshold {
                        self.open(now, Why::Unwell(class))
                    } else {
                        Inner::Closed { failures }
                    };
                }
                _ if is_probe => self.inner = self.open(now, Why::Unwell(class)),
                _ => {}
            },
            BreakerInput::MessageFailure => match &self.inner {
                // The upstream answered the session: the run of upstream failures is over.
                Inner::Closed { .. } => {
                    self.inner = Inner::Closed { failures: 0 };
                    self.remember(now, attempt.to, true);
                    if let Some(why) = self.too_many_failing(now) {
                        self.inner = self.open(now, why);
                    }
                }
                // Opened for an unwell upstream: a session that got past MAIL FROM shows it
                // is well again. Opened for failing messages: a fresh one failed too.
                Inner::HalfOpen { why, .. } if is_probe => match *why {
                    Why::Unwell(_) => self.close(),
                    why @ Why::Messages { .. } => self.inner = self.open(now, why),
                },
                _ => {}
            },
        }
    }

    /// The result of a connection check let through by [`Admit::CheckConnection`]: anything
    /// but a failure blaming the upstream closes the breaker.
    pub(crate) fn on_check(&mut self, now: Instant, input: BreakerInput) {
        if !matches!(
            self.inner,
            Inner::HalfOpen {
                probe: ProbeBy::Connection,
                ..
            }
        ) {
            return;
        }
        match input {
            BreakerInput::Unwell(class) => self.inner = self.open(now, Why::Unwell(class)),
            BreakerInput::Success | BreakerInput::Neutral | BreakerInput::MessageFailure => {
                self.close()
            }
        }
    }

    fn close(&mut self) {
        if !matches!(self.inner, Inner::Closed { .. }) {
            self.inner = Inner::Closed { failures: 0 };
        }
    }

    fn open(&mut self, now: Instant, why: Why) -> Inner {
        // What the window held has been acted on; after the cooldown it starts afresh.
        self.window.clear();
        // An absurd cooldown saturates to "open until the far future" instead of panicking.
        let until = now
            .checked_add(self.policy.cooldown)
            .unwrap_or_else(|| far_future(now));
        Inner::Open { until, why }
    }

    /// Records an outcome in the window (only while closed: it judges a closed breaker).
    fn remember(&mut self, now: Instant, to: &str, failed: bool) {
        if !matches!(self.inner, Inner::Closed { .. }) || self.policy.window_messages == 0 {
            return;
        }
        if self.window.len() >= WINDOW_CAP {
            self.window.pop_front();
        }
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(to, &mut hasher);
        self.window.push_back(Seen {
            at: now,
            to: std::hash::Hasher::finish(&hasher),
            failed,
        });
    }

    /// The window's verdict: each recipient set counts once, by its latest outcome.
    fn too_many_failing(&mut self, now: Instant) -> Option<Why> {
        if let Some(start) = now.checked_sub(self.policy.window) {
            while self.window.front().is_some_and(|s| s.at < start) {
                self.window.pop_front();
            }
        }
        // Fewer outcomes than the messages needed cannot be enough (nor can an empty policy).
        if self.policy.window_messages == 0
            || self.window.len() < self.policy.window_messages as usize
        {
            return None;
        }
        let mut latest: HashMap<u64, bool> = HashMap::new();
        for seen in &self.window {
            latest.insert(seen.to, seen.failed);
        }
        let seen = latest.len() as u32;
        let failing = latest.values().filter(|f| **f).count() as u32;
        let enough = failing >= self.policy.window_messages
            && f64::from(failing) >= self.policy.window_ratio * f64::from(seen);
        enough.then_some(Why::Messages { failing, seen })
    }

    /// The state as [`Breaker::admit`] would see it at `now` (an elapsed Open reads HalfOpen).
    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        match self.inner {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { until, .. } if now < until => BreakerState::Open,
            Inner::Open { .. } | Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Why it is open or half-open (`None` while closed).
    pub(crate) fn why(&self) -> Option<Why> {
        match &self.inner {
            Inner::Closed { .. } => None,
            Inner::Open { why, .. } | Inner::HalfOpen { why, .. } => Some(*why),
        }
    }

    /// What the current half-open probe is, for its log line: `message` or `connection_check`.
    pub(crate) fn probe_name(&self) -> Option<&'static str> {
        match &self.inner {
            Inner::HalfOpen { probe, .. } => Some(match probe {
                ProbeBy::Message(_) => "message",
                ProbeBy::Connection => "connection_check",
            }),
            _ => None,
        }
    }

    #[cfg(test)]
    /// Consecutive failures counted while closed, or the threshold once open.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        match self.inner {
            Inner::Closed { failures } => failures,
            Inner::Open { .. } | Inner::HalfOpen { .. } => self.policy.threshold,
        }
    }
}

fn far_future(now: Instant) -> Instant {
    // Halve until it fits: Instant's range is platform-defined.
    let mut step = Duration::from_secs(u64::MAX / 2);
    loop {
        if let Some(t) = now.checked_add(step) {
            return t;
        }
        step /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BreakerState::*;

    const COOL: Duration = Duration::from_secs(30);

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    fn policy(threshold: u32) -> BreakerPolicy {
        BreakerPolicy {
            threshold,
            cooldown: COOL,
            window: Duration::from_secs(60),
            window_messages: 3,
            window_ratio: 0.75,
        }
    }

    const DOWN: BreakerInput = BreakerInput::Unwell(Unwell::Connect);
    const BUSY: BreakerInput = BreakerInput::MessageFailure;
    const OK: BreakerInput = BreakerInput::Success;
    const FIVE: BreakerInput = BreakerInput::Neutral;

    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// `admit` at t of message `id`, which has (true) or has not failed before.
        Ask(u64, &'static str, bool, Admit),
        /// An attempt of `id` to `id`'s own recipients ended at t.
        Ended(u64, &'static str, BreakerInput),
        /// An attempt of `id` to recipients `to`.
        EndedTo(u64, &'static str, &'static str, BreakerInput),
        /// A connection check ended at t.
        Checked(u64, BreakerInput),
        State(u64, BreakerState),
        /// Why it is open or half-open, by the log line's class.
        Class(Option<&'static str>),
        /// `transition` at t: the state entered since the last call, if any.
        Moved(u64, Option<BreakerState>),
    }
    use Step::*;

    const WAIT_PROBE: Admit = Admit::Wait(PROBE_WAIT);

    fn wait(secs: u64) -> Admit {
        Admit::Wait(Duration::from_secs(secs))
    }

    fn run(name: &str, policy: BreakerPolicy, steps: &[Step]) {
        let t0 = Instant::now();
        let mut b = Breaker::new(policy);
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Ask(t, id, failed_before, want) => assert_eq!(
                    b.admit(at(t0, t), Candidate { id, failed_before }),
                    want,
                    "{name}: step {i} {step:?}"
                ),
                Ended(t, id, input) => b.on_attempt(at(t0, t), Attempted { id, to: id }, input),
                EndedTo(t, id, to, input) => b.on_attempt(at(t0, t), Attempted { id, to }, input),
                Checked(t, input) => b.on_check(at(t0, t), input),
                State(t, want) => assert_eq!(b.state(at(t0, t)), want, "{name}: step {i} {step:?}"),
                Class(want) => assert_eq!(b.why().map(Why::class), want, "{name}: step {i}"),
                Moved(t, want) => {
                    assert_eq!(b.transition(at(t0, t)), want, "{name}: step {i} {step:?}")
                }
            }
        }
    }

    #[test]
    fn names() {
        assert_eq!(Closed.as_str(), "closed");
        assert_eq!(Open.as_str(), "open");
        assert_eq!(HalfOpen.as_str(), "half_open");
    }

    #[test]
    fn scenarios() {
        let table: &[(&str, u32, &[Step])] = &[
            (
                "fresh breaker is closed",
                3,
                &[
                    State(0, Closed),
                    Ask(0, "a", false, Admit::Send),
                    Ask(0, "b", true, Admit::Send),
                ],
            ),
            (
                "opens at the threshold of upstream failures, not before, and says why",
                3,
                &[
                    Ended(0, "a", DOWN),
                    Ended(1, "b", DOWN),
                    State(1, Closed),
                    Ask(1, "c", false, Admit::Send),
                    Ended(2, "c", BreakerInput::Unwell(Unwell::Greeting)),
                    State(2, Open),
                    Class(Some("greeting")),
                    Ask(2, "d", false, wait(30)),
                    Ask(12, "d", false, wait(20)),
                ],
            ),
            (
                "the operator's case: a busy mailbox and dropped dot replies never open it",
                2,
                &[
                    EndedTo(0, "m1", "busy@", BUSY),
                    EndedTo(0, "m2", "busy@", BUSY),
                    EndedTo(0, "m3", "busy@", BUSY),
                    EndedTo(0, "m4", "busy@", BUSY),
                    EndedTo(1, "m5", "lost@", BUSY),
                    EndedTo(1, "m6", "lost@", BUSY),
                    EndedTo(2, "m1", "busy@", BUSY),
                    EndedTo(2, "m5", "lost@", BUSY),
                    EndedTo(3, "m2", "busy@", BUSY),
                    State(3, Closed),
                    Ask(3, "healthy", false, Admit::Send),
                ],
            ),
            (
                "a message failing on its own ends a run of upstream failures",
                2,
                &[
                    Ended(0, "a", DOWN),
                    Ended(1, "b", BUSY),
                    Ended(2, "c", DOWN),
                    State(2, Closed),
                ],
            ),
            (
                "a success or a 5xx in between resets the run",
                2,
                &[
                    Ended(0, "a", DOWN),
                    Ended(1, "b", OK),
                    Ended(2, "a", DOWN),
                    Ended(3, "c", FIVE),
                    Ended(4, "a", DOWN),
                    State(4, Closed),
                    Ended(5, "a", DOWN),
                    State(5, Open),
                ],
            ),
            (
                "many different messages failing on their own open it",
                99,
                &[
                    Ended(0, "a", BUSY),
                    Ended(1, "b", BUSY),
                    State(1, Closed),
                    Ended(2, "c", BUSY),
                    State(2, Open),
                    Class(Some("messages")),
                ],
            ),
            (
                "...not when they are few among many healthy ones",
                99,
                &[
                    Ended(0, "ok1", OK),
                    Ended(0, "ok2", OK),
                    Ended(1, "a", BUSY),
                    Ended(1, "b", BUSY),
                    Ended(2, "c", BUSY),
                    State(2, Closed),
                    // 3 of 5 is under 0.75, and so are 5 of 7.
                    Ended(3, "d", BUSY),
                    Ended(3, "e", BUSY),
                    State(3, Closed),
                    // The healthy ones age out of the window: 5 of 5.
                    Ended(61, "e", BUSY),
                    State(61, Open),
                ],
            ),
            (
                "...not when one message keeps failing, nor many to the same recipients",
                99,
                &[
                    Ended(0, "a", BUSY),
                    Ended(1, "a", BUSY),
                    Ended(2, "a", BUSY),
                    EndedTo(3, "b", "a", BUSY),
                    EndedTo(3, "c", "a", BUSY),
                    Ended(4, "d", BUSY),
                    State(4, Closed),
                ],
            ),
            (
                "...and a message that then goes through no longer counts as failing",
                99,
                &[
                    Ended(0, "a", BUSY),
                    Ended(1, "b", BUSY),
                    Ended(2, "a", OK),
                    Ended(3, "c", BUSY),
                    State(3, Closed),
                    Ended(4, "d", BUSY),
                    State(4, Open),
                ],
            ),
            (
                "stays open for the cooldown, then admits exactly one probe",
                1,
                &[
                    Ended(10, "a", DOWN),
                    Ask(39, "b", false, wait(1)),
                    State(39, Open),
                    State(40, HalfOpen),
                    Ask(40, "b", false, Admit::Probe),
                    Ask(40, "c", false, WAIT_PROBE),
                    Ask(41, "a", true, WAIT_PROBE),
                    State(41, HalfOpen),
                ],
            ),
            (
                "a message that failed before is not the probe: the connection is checked",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ask(30, "a", true, Admit::CheckConnection),
                    Ask(30, "b", false, WAIT_PROBE),
                    Checked(31, OK),
                    State(31, Closed),
                    Ask(31, "a", true, Admit::Send),
                ],
            ),
            (
                "a failed connection check reopens with a fresh cooldown and its class",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ask(30, "a", true, Admit::CheckConnection),
                    Checked(31, BreakerInput::Unwell(Unwell::Tls)),
                    State(31, Open),
                    Class(Some("tls")),
                    Ask(60, "a", true, wait(1)),
                    Ask(61, "b", false, Admit::Probe),
                ],
            ),
            (
                "a check refused at MAIL FROM:<> still shows the upstream answering",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ask(30, "a", true, Admit::CheckConnection),
                    Checked(31, BUSY),
                    State(31, Closed),
                ],
            ),
            (
                "a check result while no check is under way changes nothing",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Checked(1, OK),
                    State(1, Open),
                    Ask(30, "b", false, Admit::Probe),
                    Checked(31, OK),
                    Checked(31, DOWN),
                    State(31, HalfOpen),
                ],
            ),
            (
                "successful probe closes",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ask(30, "b", false, Admit::Probe),
                    Ended(30, "b", OK),
                    State(30, Closed),
                    Ask(30, "a", true, Admit::Send),
                ],
            ),
            (
                "a 5xx probe closes",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ask(30, "b", false, Admit::Probe),
                    Ended(30, "b", FIVE),
                    State(30, Closed),
                ],
            ),
            (
                "opened for an unwell upstream, a probe failing on its own shows the session works",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ask(30, "b", false, Admit::Probe),
                    Ended(31, "b", BUSY),
                    State(31, Closed),
                ],
            ),
            (
                "opened for failing messages, a fresh probe failing too reopens",
                99,
                &[
                    Ended(0, "a", BUSY),
                    Ended(0, "b", BUSY),
                    Ended(0, "c", BUSY),
                    Ask(30, "d", false, Admit::Probe),
                    Ended(31, "d", BUSY),
                    State(31, Open),
                    Class(Some("messages")),
                    Ask(61, "e", false, Admit::Probe),
                    Ended(62, "e", OK),
                    State(62, Closed),
                ],
            ),
            (
                "a failed probe reopens with a fresh cooldown",
                3,
                &[
                    Ended(0, "a", DOWN),
                    Ended(0, "a", DOWN),
                    Ended(0, "a", DOWN),
                    Ask(30, "b", false, Admit::Probe),
                    Ended(35, "b", DOWN),
                    State(35, Open),
                    Ask(64, "c", false, wait(1)),
                    Ask(65, "c", false, Admit::Probe),
                    Ask(65, "d", false, WAIT_PROBE),
                ],
            ),
            (
                "late failures of other messages decide nothing in half-open",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ask(30, "b", false, Admit::Probe),
                    Ended(31, "x", DOWN),
                    Ended(31, "y", BUSY),
                    State(31, HalfOpen),
                    Ended(32, "b", OK),
                    State(32, Closed),
                ],
            ),
            (
                "late failures while open do not extend the cooldown",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ended(20, "b", DOWN),
                    Ended(29, "c", BUSY),
                    Ask(30, "d", false, Admit::Probe),
                ],
            ),
            (
                "late success while open closes",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ended(1, "b", OK),
                    State(1, Closed),
                    Ask(1, "a", true, Admit::Send),
                ],
            ),
            (
                "a lost probe is given up after a cooldown",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Ask(30, "b", false, Admit::Probe),
                    Ask(59, "c", false, WAIT_PROBE),
                    Ask(60, "a", true, Admit::CheckConnection),
                    Ask(60, "c", false, WAIT_PROBE),
                    // The first probe's late answer no longer decides.
                    Ended(61, "b", DOWN),
                    State(61, HalfOpen),
                ],
            ),
            (
                "threshold 0 behaves as 1",
                0,
                &[
                    State(0, Closed),
                    Ask(0, "a", false, Admit::Send),
                    Ended(0, "a", DOWN),
                    State(0, Open),
                    Ask(0, "a", true, wait(30)),
                ],
            ),
            (
                "each change is reported once: closed, open, half-open, closed",
                2,
                &[
                    Moved(0, None),
                    Ended(0, "a", DOWN),
                    Moved(0, None),
                    Ended(1, "a", DOWN),
                    Moved(1, Some(Open)),
                    Moved(2, None),
                    Ask(31, "a", true, Admit::CheckConnection),
                    Moved(31, Some(HalfOpen)),
                    Moved(31, None),
                    Checked(31, OK),
                    Moved(31, Some(Closed)),
                    Moved(32, None),
                    Class(None),
                ],
            ),
            (
                "a failed probe reports open again; an elapsed cooldown reads half-open",
                1,
                &[
                    Ended(0, "a", DOWN),
                    Moved(0, Some(Open)),
                    Moved(30, Some(HalfOpen)),
                    Ask(30, "b", false, Admit::Probe),
                    Moved(30, None),
                    Ended(31, "b", DOWN),
                    Moved(31, Some(Open)),
                ],
            ),
            (
                "a clock that goes backwards keeps it open",
                1,
                &[
                    Ended(100, "a", DOWN),
                    Ask(50, "a", true, wait(80)),
                    State(50, Open),
                ],
            ),
        ];
        for (name, threshold, steps) in table {
            run(name, policy(*threshold), steps);
        }
    }

    #[test]
    fn the_window_can_be_switched_off_and_odd_ratios_are_tamed() {
        let t0 = Instant::now();
        let busy = |b: &mut Breaker, n: u32| {
            for i in 0..n {
                let id = format!("m{i}");
                b.on_attempt(t0, Attempted { id: &id, to: &id }, BUSY);
            }
        };
        let mut off = Breaker::new(BreakerPolicy {
            window_messages: 0,
            ..policy(5)
        });
        busy(&mut off, 100);
        assert_eq!(off.state(t0), Closed);
        assert!(off.window.is_empty());
        // A NaN ratio reads as 1 (all of them), a ratio above 1 too.
        for ratio in [f64::NAN, 7.0] {
            let mut b = Breaker::new(BreakerPolicy {
                window_ratio: ratio,
                ..policy(5)
            });
            b.on_attempt(t0, Attempted { id: "ok", to: "ok" }, OK);
            busy(&mut b, 10);
            assert_eq!(b.state(t0), Closed, "{ratio}");
        }
        // The window is bounded, however many outcomes come.
        let mut big = Breaker::new(BreakerPolicy {
            window_messages: u32::MAX,
            ..policy(5)
        });
        busy(&mut big, (WINDOW_CAP + 10) as u32);
        assert_eq!(big.window.len(), WINDOW_CAP);
    }

    #[test]
    fn failure_count_saturates_and_huge_cooldown_does_not_panic() {
        let t0 = Instant::now();
        let mut b = Breaker::new(BreakerPolicy {
            threshold: u32::MAX,
            cooldown: Duration::MAX,
            ..policy(1)
        });
        let a = Attempted { id: "a", to: "a" };
        for _ in 0..10 {
            b.on_attempt(t0, a, DOWN);
        }
        assert_eq!(b.consecutive_failures(), 10);
        b.inner = Inner::Closed {
            failures: u32::MAX - 1,
        };
        b.on_attempt(t0, a, DOWN);
        assert_eq!(b.state(t0), Open);
        b.on_attempt(t0, a, DOWN);
        let later = t0 + Duration::from_secs(3600 * 24 * 365);
        assert!(matches!(
            b.admit(
                later,
                Candidate {
                    id: "a",
                    failed_before: true
                }
            ),
            Admit::Wait(_)
        ));
    }
}
