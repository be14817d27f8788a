//! Retry math as pure functions (docs/concepts/delivery.md): exponential backoff with full jitter, a cap, a
//! maximum number of attempts, a deadline, and the upstream's idempotency window for attempts
//! whose outcome is unknown.
//!
//! Time never comes from a clock here: the ledger's ages and the jitter's random unit are
//! passed in, so every decision can be replayed in a test.

use std::time::Duration;

use super::outcome::OutcomeKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    pub base: Duration,
    pub cap: Duration,
    pub max_attempts: u32,
    /// Since acceptance.
    pub deadline: Duration,
    /// How long the upstream collapses retries with the same key (Bird: 3h).
    pub window: Duration,
    /// Kept free at the end of the window, so an attempt started before the window closes also
    /// reaches the upstream before it does (connect, TLS, AUTH and the body all take time).
    pub window_margin: Duration,
    /// A message still queued this long after acceptance gets a delay notice for the
    /// recipients that asked for one (NOTIFY=DELAY); zero: never.
    pub delay_notice_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(30),
            cap: Duration::from_secs(30 * 60),
            max_attempts: 20,
            deadline: Duration::from_secs(2 * 24 * 3600),
            window: Duration::from_secs(3 * 3600),
            window_margin: Duration::from_secs(10 * 60),
            delay_notice_after: Duration::from_secs(4 * 3600),
        }
    }
}

impl RetryPolicy {
    /// The last moment, counted from the first attempt, at which a message whose outcome may
    /// already be accepted can be retried without risking a second copy.
    pub(crate) fn unknown_retry_limit(&self) -> Duration {
        self.window.saturating_sub(self.window_margin)
    }
}

/// min(cap, base * 2^attempt), saturating; attempt 0 is the first retry.
pub(crate) fn backoff_ceiling(policy: &RetryPolicy, attempt: u32) -> Duration {
    let grown = 2u32
        .checked_pow(attempt)
        .and_then(|factor| policy.base.checked_mul(factor));
    match grown {
        Some(d) => d.min(policy.cap),
        None => policy.cap,
    }
}

/// Full jitter: uniform in [0, ceiling], `unit` in [0,1) supplied by the caller
/// (fastrand::f64() in production). Out-of-range units are clamped and NaN counts as 0, so a
/// bad random source can shorten a delay but never exceed the ceiling or panic.
pub(crate) fn full_jitter(policy: &RetryPolicy, attempt: u32, unit: f64) -> Duration {
    let ceiling = backoff_ceiling(policy, attempt);
    let unit = if unit.is_nan() {
        0.0
    } else {
        unit.clamp(0.0, 1.0)
    };
    // Through f64 a huge ceiling can round up past Duration::MAX (mul_f64 would panic) or
    // overshoot by a nanosecond; the bound is a promise, so fall back to and clamp at it.
    Duration::try_from_secs_f64(ceiling.as_secs_f64() * unit)
        .unwrap_or(ceiling)
        .min(ceiling)
}

/// Facts about one message's ledger, from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ledger {
    /// Finished attempts, including the last.
    pub attempts: u32,
    pub since_accepted: Duration,
    pub since_first_attempt: Duration,
    /// Any attempt so far ended Unknown (including the last).
    pub any_unknown: bool,
    /// The message has an idempotency key the upstream honours.
    pub keyed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    Delivered,
    RetryAfter(Duration),
    Failed,
    Unresolved,
}

impl Next {
    /// Every value of [`Next::label`], so that metrics can show each from the start.
    pub(crate) const LABELS: [&'static str; 4] = ["delivered", "retry", "failed", "unresolved"];

    /// The decision's name in the `idemrelay_delivery_decisions` metric and the attempt log.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Next::Delivered => "delivered",
            Next::RetryAfter(_) => "retry",
            Next::Failed => "failed",
            Next::Unresolved => "unresolved",
        }
    }
}

/// What to do after an attempt ended with `last`.
///
/// The retry being scheduled is retry number `attempts` (the first attempt is not a retry), so
/// its backoff index is `attempts - 1`: after the first attempt the delay is drawn from
/// [0, base], after the second from [0, 2·base], and so on.
///
/// A last outcome of `Unknown` counts as `any_unknown` even if the ledger says otherwise: the
/// safe reading of a stale ledger is the one that cannot send a second copy.
pub(crate) fn next_step(
    policy: &RetryPolicy,
    last: OutcomeKind,
    ledger: &Ledger,
    unit: f64,
) -> Next {
    let any_unknown = ledger.any_unknown || last == OutcomeKind::Unknown;
    match last {
        OutcomeKind::Accepted => return Next::Delivered,
        // An earlier attempt may have been accepted upstream; a later 5xx cannot disprove it.
        OutcomeKind::Permanent if any_unknown => return Next::Unresolved,
        OutcomeKind::Permanent => return Next::Failed,
        // Without a key the upstream cannot collapse a retry into the first copy.
        OutcomeKind::Unknown if !ledger.keyed => return Next::Unresolved,
        OutcomeKind::Unknown | OutcomeKind::Transient => {}
    }
    let delay = full_jitter(policy, ledger.attempts.saturating_sub(1), unit);
    if retry_allowed(policy, ledger, any_unknown, delay) {
        Next::RetryAfter(delay)
    } else if any_unknown {
        Next::Unresolved
    } else {
        Next::Failed
    }
}

fn retry_allowed(
    policy: &RetryPolicy,
    ledger: &Ledger,
    any_unknown: bool,
    delay: Duration,
) -> bool {
    let within_attempts = ledger.attempts < policy.max_attempts;
    let within_deadline = ledger
        .since_accepted
        .checked_add(delay)
        .is_some_and(|at| at <= policy.deadline);
    let within_window = !any_unknown
        || ledger
            .since_first_attempt
            .checked_add(delay)
            .is_some_and(|at| at < policy.unknown_retry_limit());
    within_attempts && within_deadline && within_window
}

#[cfg(test)]
mod tests {
    use super::*;
    use OutcomeKind as K;

    const S: u64 = 1;
    const M: u64 = 60;
    const H: u64 = 3600;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn policy() -> RetryPolicy {
        RetryPolicy::default()
    }

    fn ledger(attempts: u32, since_accepted: u64, since_first: u64, any_unknown: bool) -> Ledger {
        Ledger {
            attempts,
            since_accepted: secs(since_accepted),
            since_first_attempt: secs(since_first),
            any_unknown,
            keyed: true,
        }
    }

    #[test]
    fn default_policy() {
        let p = policy();
        assert_eq!(p.base, secs(30 * S));
        assert_eq!(p.cap, secs(30 * M));
        assert_eq!(p.max_attempts, 20);
        assert_eq!(p.deadline, secs(48 * H));
        assert_eq!(p.window, secs(3 * H));
        assert_eq!(p.window_margin, secs(10 * M));
        assert_eq!(p.unknown_retry_limit(), secs(170 * M));
    }

    #[test]
    fn every_decision_label_is_listed_once() {
        let all = [
            Next::Delivered,
            Next::RetryAfter(Duration::ZERO),
            Next::Failed,
            Next::Unresolved,
        ];
        assert_eq!(all.map(Next::label), Next::LABELS);
        assert_eq!(Next::RetryAfter(secs(90)).label(), "retry");
    }

    #[test]
    fn backoff_ceiling_table() {
        let p = policy();
        let cases: &[(u32, u64)] = &[
            (0, 30),
            (1, 60),
            (2, 120),
            (3, 240),
            (5, 960),
            (6, 1800), // 1920 capped
            (7, 1800),
            (31, 1800),
            (32, 1800), // 2^32 overflows u32
            (64, 1800),
            (1000, 1800),
            (u32::MAX, 1800),
        ];
        for &(attempt, want) in cases {
            assert_eq!(
                backoff_ceiling(&p, attempt),
                secs(want),
                "attempt {attempt}"
            );
        }
    }

    #[test]
    fn backoff_saturates_even_without_a_useful_cap() {
        let p = RetryPolicy {
            base: Duration::MAX,
            cap: Duration::MAX,
            ..policy()
        };
        assert_eq!(backoff_ceiling(&p, 0), Duration::MAX);
        assert_eq!(backoff_ceiling(&p, 1), Duration::MAX);
        assert_eq!(backoff_ceiling(&p, 1000), Duration::MAX);
        let small_cap = RetryPolicy {
            base: secs(100),
            cap: secs(10),
            ..policy()
        };
        assert_eq!(backoff_ceiling(&small_cap, 0), secs(10));
    }

    #[test]
    fn full_jitter_bounds() {
        let p = policy();
        for attempt in [0, 1, 5, 6, 64, 1000] {
            let ceiling = backoff_ceiling(&p, attempt);
            assert_eq!(full_jitter(&p, attempt, 0.0), Duration::ZERO);
            assert_eq!(full_jitter(&p, attempt, 1.0), ceiling);
            let near_one = full_jitter(&p, attempt, 1.0 - f64::EPSILON);
            assert!(near_one <= ceiling);
            assert!(ceiling - near_one < Duration::from_micros(1), "{attempt}");
            assert_eq!(full_jitter(&p, attempt, 0.5), ceiling / 2);
            // A broken random source stays within bounds.
            assert_eq!(full_jitter(&p, attempt, -3.0), Duration::ZERO);
            assert_eq!(full_jitter(&p, attempt, f64::NAN), Duration::ZERO);
            assert_eq!(full_jitter(&p, attempt, 7.0), ceiling);
            assert_eq!(full_jitter(&p, attempt, f64::INFINITY), ceiling);
        }
        let huge = RetryPolicy {
            base: Duration::MAX,
            cap: Duration::MAX,
            ..p
        };
        assert!(full_jitter(&huge, 3, 1.0 - f64::EPSILON) <= Duration::MAX);
        assert_eq!(full_jitter(&huge, 3, 1.0), Duration::MAX);
        for i in 0..1000 {
            let unit = i as f64 / 1000.0;
            assert!(full_jitter(&p, 3, unit) <= backoff_ceiling(&p, 3));
        }
    }

    #[test]
    fn next_step_table() {
        let p = policy();
        let half = 0.5;
        // (last, ledger, unit, expected)
        let cases: &[(&str, OutcomeKind, Ledger, f64, Next)] = &[
            (
                "accepted",
                K::Accepted,
                ledger(1, 0, 0, false),
                half,
                Next::Delivered,
            ),
            (
                "accepted after unknown",
                K::Accepted,
                ledger(3, 0, 0, true),
                half,
                Next::Delivered,
            ),
            (
                "permanent",
                K::Permanent,
                ledger(1, 0, 0, false),
                half,
                Next::Failed,
            ),
            (
                "permanent after unknown",
                K::Permanent,
                ledger(2, 60, 60, true),
                half,
                Next::Unresolved,
            ),
            (
                "first transient: index 0",
                K::Transient,
                ledger(1, 0, 0, false),
                half,
                Next::RetryAfter(secs(15)),
            ),
            (
                "third transient: index 2",
                K::Transient,
                ledger(3, 600, 600, false),
                1.0,
                Next::RetryAfter(secs(120)),
            ),
            (
                "transient, attempts exhausted",
                K::Transient,
                ledger(20, 600, 600, false),
                half,
                Next::Failed,
            ),
            (
                "transient, attempts exhausted after an unknown",
                K::Transient,
                ledger(20, 600, 600, true),
                half,
                Next::Unresolved,
            ),
            (
                "transient, one attempt left",
                K::Transient,
                ledger(19, 600, 600, false),
                0.0,
                Next::RetryAfter(Duration::ZERO),
            ),
            (
                "transient, delay lands exactly on the deadline",
                K::Transient,
                ledger(10, 48 * H - 900, 0, false),
                half,
                Next::RetryAfter(secs(900)),
            ),
            (
                "transient, delay lands past the deadline",
                K::Transient,
                ledger(10, 48 * H - 899, 0, false),
                half,
                Next::Failed,
            ),
            (
                "transient, deadline already passed, zero delay",
                K::Transient,
                ledger(2, 48 * H + 1, 0, false),
                0.0,
                Next::Failed,
            ),
            (
                "unknown, keyed, early",
                K::Unknown,
                ledger(1, 5, 5, true),
                half,
                Next::RetryAfter(secs(15)),
            ),
            (
                "unknown, ledger flag missing: still treated as unknown",
                K::Unknown,
                ledger(1, 170 * M, 170 * M, false),
                0.0,
                Next::Unresolved,
            ),
            (
                "unknown, delay lands exactly at window - margin",
                K::Unknown,
                ledger(3, 170 * M - 60, 170 * M - 60, true),
                half,
                Next::Unresolved,
            ),
            (
                "unknown, delay lands just before window - margin",
                K::Unknown,
                ledger(3, 170 * M - 61, 170 * M - 61, true),
                half,
                Next::RetryAfter(secs(60)),
            ),
            (
                "transient after an earlier unknown, past the window",
                K::Transient,
                ledger(4, 3 * H, 3 * H, true),
                0.0,
                Next::Unresolved,
            ),
            (
                "transient after an earlier unknown, inside the window",
                K::Transient,
                ledger(4, 30 * M, 30 * M, true),
                half,
                Next::RetryAfter(secs(120)),
            ),
            (
                "transient without unknowns ignores the window",
                K::Transient,
                ledger(4, 5 * H, 5 * H, false),
                half,
                Next::RetryAfter(secs(120)),
            ),
        ];
        for (name, last, l, unit, want) in cases {
            assert_eq!(next_step(&p, *last, l, *unit), *want, "{name}");
        }
    }

    #[test]
    fn unkeyed_messages() {
        let p = policy();
        let mut l = ledger(1, 0, 0, true);
        l.keyed = false;
        assert_eq!(next_step(&p, K::Unknown, &l, 0.0), Next::Unresolved);
        l.any_unknown = false;
        // A transient failure was never accepted, so retrying an unkeyed message is safe.
        assert_eq!(
            next_step(&p, K::Transient, &l, 0.0),
            Next::RetryAfter(Duration::ZERO)
        );
        assert_eq!(next_step(&p, K::Permanent, &l, 0.0), Next::Failed);
        assert_eq!(next_step(&p, K::Accepted, &l, 0.0), Next::Delivered);
    }

    #[test]
    fn zero_attempts_and_zero_limits_do_not_panic() {
        let p = policy();
        assert_eq!(
            next_step(&p, K::Transient, &ledger(0, 0, 0, false), 1.0),
            Next::RetryAfter(secs(30))
        );
        let none = RetryPolicy {
            max_attempts: 0,
            ..p
        };
        assert_eq!(
            next_step(&none, K::Transient, &ledger(1, 0, 0, false), 0.0),
            Next::Failed
        );
        let no_window = RetryPolicy {
            window: secs(60),
            window_margin: secs(600),
            ..p
        };
        assert_eq!(
            next_step(&no_window, K::Unknown, &ledger(1, 0, 0, true), 0.0),
            Next::Unresolved
        );
        let huge = ledger(1, u64::MAX, u64::MAX, true);
        assert_eq!(next_step(&p, K::Unknown, &huge, 1.0), Next::Unresolved);
    }

    /// Walks many random schedules: a retry of an UNKNOWN never lands at or after
    /// window - margin, and no retry ever lands after the deadline.
    #[test]
    fn unknown_retries_never_land_after_the_window() {
        let p = RetryPolicy {
            base: secs(60),
            cap: secs(40 * M),
            max_attempts: 1000,
            ..policy()
        };
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..2000 {
            let mut t = Duration::from_millis(rng.u64(0..10_000));
            let mut attempts = 0;
            let mut any_unknown = false;
            loop {
                attempts += 1;
                let last = if rng.bool() { K::Unknown } else { K::Transient };
                any_unknown |= last == K::Unknown;
                let l = Ledger {
                    attempts,
                    since_accepted: t,
                    since_first_attempt: t,
                    any_unknown,
                    keyed: true,
                };
                match next_step(&p, last, &l, rng.f64()) {
                    Next::RetryAfter(d) => {
                        t += d;
                        assert!(t <= p.deadline);
                        if any_unknown {
                            assert!(t < p.unknown_retry_limit(), "{t:?}");
                        }
                        // The attempt itself takes time.
                        t += Duration::from_millis(rng.u64(0..5_000));
                    }
                    Next::Unresolved => {
                        assert!(any_unknown);
                        break;
                    }
                    Next::Failed => {
                        assert!(!any_unknown);
                        break;
                    }
                    Next::Delivered => unreachable!(),
                }
            }
        }
    }
}
