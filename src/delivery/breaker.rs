//! Circuit breaker for the upstream (README "What delivery does"): a run of transient/unknown failures stops
//! all attempts for a cooldown, then one probe decides whether traffic resumes.
//!
//! Time is passed in, so the breaker is a plain value a worker keeps behind its own lock.

use std::time::{Duration, Instant};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inner {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// `probe_since` is when the current probe was let through; half-open is only ever
    /// entered by letting a probe through.
    HalfOpen {
        probe_since: Instant,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    inner: Inner,
    /// The state last handed out by [`Breaker::transition`].
    reported: BreakerState,
}

impl Breaker {
    /// `threshold` consecutive transient/unknown failures open the breaker (0 is read as 1:
    /// a breaker that never closes would stop all mail); `cooldown` is how long it stays open.
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            inner: Inner::Closed { failures: 0 },
            reported: BreakerState::Closed,
        }
    }

    /// The state at `now` when it differs from the one this returned last (or from closed, the
    /// first time): call it after every `allow` and `on_*`, and each change is seen once, for
    /// the log and the transition counter.
    pub(crate) fn transition(&mut self, now: Instant) -> Option<BreakerState> {
        let state = self.state(now);
        (state != self.reported).then(|| {
            self.reported = state;
            state
        })
    }

    /// May an attempt start now? Open → false until cooldown elapsed, then HalfOpen admitting
    /// exactly one probe at a time.
    ///
    /// A probe whose result never comes back (its worker died) would hold the breaker half-open
    /// forever, so a probe slot is given up after one cooldown and the next caller probes.
    pub(crate) fn allow(&mut self, now: Instant) -> bool {
        match self.inner {
            Inner::Closed { .. } => true,
            Inner::Open { until } if now < until => false,
            Inner::Open { .. } => self.start_probe(now),
            Inner::HalfOpen { probe_since } => {
                if now.saturating_duration_since(probe_since) >= self.cooldown {
                    self.start_probe(now)
                } else {
                    false
                }
            }
        }
    }

    fn start_probe(&mut self, now: Instant) -> bool {
        self.inner = Inner::HalfOpen { probe_since: now };
        true
    }

    /// Closes and resets the count. A success reported while open (an attempt that began before
    /// the breaker opened) also closes it: the upstream has just shown it is up.
    pub(crate) fn on_success(&mut self) {
        self.inner = Inner::Closed { failures: 0 };
    }

    /// A transient or unknown failure. In HalfOpen the probe failed: reopen with a fresh
    /// cooldown. While already Open the cooldown is not extended, so late reports from attempts
    /// that started before the breaker opened cannot keep it shut.
    pub(crate) fn on_failure(&mut self, now: Instant) {
        match self.inner {
            Inner::Closed { failures } => {
                let failures = failures.saturating_add(1);
                self.inner = if failures >= self.threshold {
                    self.open(now)
                } else {
                    Inner::Closed { failures }
                };
            }
            Inner::HalfOpen { .. } => self.inner = self.open(now),
            Inner::Open { .. } => {}
        }
    }

    fn open(&self, now: Instant) -> Inner {
        // An absurd cooldown saturates to "open until the far future" instead of panicking.
        let until = now
            .checked_add(self.cooldown)
            .unwrap_or_else(|| far_future(now));
        Inner::Open { until }
    }

    /// E.g. a permanent per-message 5xx: the upstream is up and answering, so for the breaker it
    /// counts as a success.
    pub(crate) fn on_neutral(&mut self) {
        self.on_success();
    }

    /// The state as [`Breaker::allow`] would see it at `now` (an elapsed Open reads HalfOpen).
    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        match self.inner {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { until } if now < until => BreakerState::Open,
            Inner::Open { .. } | Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    #[cfg(test)]
    /// Consecutive failures counted while closed, or the threshold once open (for metrics).
    pub(crate) fn consecutive_failures(&self) -> u32 {
        match self.inner {
            Inner::Closed { failures } => failures,
            Inner::Open { .. } | Inner::HalfOpen { .. } => self.threshold,
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

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Allow(u64, bool),
        Fail(u64),
        Succeed,
        Neutral,
        State(u64, BreakerState),
        /// `transition` at t: the state entered since the last call, if any.
        Moved(u64, Option<BreakerState>),
    }
    use Step::*;

    fn run(name: &str, threshold: u32, steps: &[Step]) {
        let t0 = Instant::now();
        let mut b = Breaker::new(threshold, COOL);
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Allow(t, want) => assert_eq!(b.allow(at(t0, t)), want, "{name}: step {i} {step:?}"),
                Fail(t) => b.on_failure(at(t0, t)),
                Succeed => b.on_success(),
                Neutral => b.on_neutral(),
                State(t, want) => assert_eq!(b.state(at(t0, t)), want, "{name}: step {i} {step:?}"),
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
                &[State(0, Closed), Allow(0, true), Allow(0, true)],
            ),
            (
                "opens at the threshold, not before",
                3,
                &[
                    Fail(0),
                    Fail(1),
                    State(1, Closed),
                    Allow(1, true),
                    Fail(2),
                    State(2, Open),
                    Allow(2, false),
                ],
            ),
            (
                "a success in between resets the run",
                3,
                &[
                    Fail(0),
                    Fail(1),
                    Succeed,
                    Fail(2),
                    Fail(3),
                    State(3, Closed),
                    Fail(4),
                    State(4, Open),
                ],
            ),
            (
                "a neutral outcome resets the run too",
                2,
                &[
                    Fail(0),
                    Neutral,
                    Fail(1),
                    State(1, Closed),
                    Fail(2),
                    State(2, Open),
                ],
            ),
            (
                "stays open for the cooldown, then admits exactly one probe",
                1,
                &[
                    Fail(10),
                    Allow(39, false),
                    State(39, Open),
                    State(40, HalfOpen),
                    Allow(40, true),
                    Allow(40, false),
                    Allow(41, false),
                    State(41, HalfOpen),
                ],
            ),
            (
                "successful probe closes",
                1,
                &[
                    Fail(0),
                    Allow(30, true),
                    Succeed,
                    State(30, Closed),
                    Allow(30, true),
                    Allow(30, true),
                ],
            ),
            (
                "neutral probe closes",
                1,
                &[
                    Fail(0),
                    Allow(30, true),
                    Neutral,
                    State(30, Closed),
                    Allow(31, true),
                ],
            ),
            (
                "failed probe reopens with a fresh cooldown",
                3,
                &[
                    Fail(0),
                    Fail(0),
                    Fail(0),
                    Allow(30, true),
                    Fail(35),
                    State(35, Open),
                    Allow(64, false),
                    Allow(65, true),
                    Allow(65, false),
                ],
            ),
            (
                "reopened breaker needs only one failure, not a new run",
                3,
                &[
                    Fail(0),
                    Fail(0),
                    Fail(0),
                    Allow(30, true),
                    Fail(30),
                    State(30, Open),
                ],
            ),
            (
                "late failures while open do not extend the cooldown",
                1,
                &[Fail(0), Fail(20), Fail(29), Allow(30, true)],
            ),
            (
                "late success while open closes",
                1,
                &[Fail(0), Succeed, State(1, Closed), Allow(1, true)],
            ),
            (
                "a lost probe is given up after a cooldown",
                1,
                &[
                    Fail(0),
                    Allow(30, true),
                    Allow(59, false),
                    Allow(60, true),
                    Allow(60, false),
                ],
            ),
            (
                "threshold 0 behaves as 1",
                0,
                &[
                    State(0, Closed),
                    Allow(0, true),
                    Fail(0),
                    State(0, Open),
                    Allow(0, false),
                ],
            ),
            (
                "each change is reported once: closed, open, half-open, closed",
                2,
                &[
                    Moved(0, None),
                    Fail(0),
                    Moved(0, None),
                    Fail(1),
                    Moved(1, Some(Open)),
                    Moved(2, None),
                    Allow(31, true),
                    Moved(31, Some(HalfOpen)),
                    Moved(31, None),
                    Succeed,
                    Moved(31, Some(Closed)),
                    Moved(32, None),
                ],
            ),
            (
                "a failed probe reports open again; an elapsed cooldown reads half-open",
                1,
                &[
                    Fail(0),
                    Moved(0, Some(Open)),
                    Moved(30, Some(HalfOpen)),
                    Allow(30, true),
                    Moved(30, None),
                    Fail(31),
                    Moved(31, Some(Open)),
                ],
            ),
            (
                "a clock that goes backwards keeps it open",
                1,
                &[Fail(100), Allow(50, false), State(50, Open)],
            ),
        ];
        for (name, threshold, steps) in table {
            run(name, *threshold, steps);
        }
    }

    #[test]
    fn failure_count_saturates_and_huge_cooldown_does_not_panic() {
        let t0 = Instant::now();
        let mut b = Breaker::new(u32::MAX, Duration::MAX);
        for _ in 0..10 {
            b.on_failure(t0);
        }
        assert_eq!(b.consecutive_failures(), 10);
        b.inner = Inner::Closed {
            failures: u32::MAX - 1,
        };
        b.on_failure(t0);
        assert_eq!(b.state(t0), Open);
        b.on_failure(t0);
        assert!(!b.allow(t0 + Duration::from_secs(3600 * 24 * 365)));
    }
}
