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

pub(crate) use idemrelay_model::breaker::BreakerState;

/// A change of state, seen once (`Breaker::transition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    pub from: BreakerState,
    pub to: BreakerState,
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
    pub(crate) fn transition(&mut self, now: Instant) -> Option<Transition> {
        let state = self.state(now);
        (state != self.reported).then(|| Transition {
            from: std::mem::replace(&mut self.reported, state),
            to: state,
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
mod tests;
