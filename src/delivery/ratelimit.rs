//! Token bucket on the upstream message rate (docs/concepts/delivery.md). One bucket serves the whole relay,
//! so a "slow down" reply to any message lowers the pace for all of them; accepted messages
//! bring it back gradually (additive increase, multiplicative decrease).
//!
//! Time is passed in; the bucket is a plain value kept behind the caller's lock.

use std::time::{Duration, Instant};

/// The lowest a slow-down can push the rate, as a fraction of the configured rate: low enough
/// to back off hard, high enough that the queue still drains.
const MIN_RATE_DIVISOR: f64 = 16.0;
/// Per accepted message, the rate recovers by this fraction of the configured rate: from the
/// floor, full speed returns after about 19 accepted messages.
const RECOVERY_STEP: f64 = 0.05;
/// Float dust after a refill of exactly the advertised wait must not cost another wait.
const EPSILON: f64 = 1e-9;

#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    configured: f64,
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A rate that is not a positive finite number (0 is the usual way to write it) means
    /// "no limit": every take succeeds and slow-downs are ignored. `burst` is at least one
    /// token, since a bucket that can never hold a whole token never lets anything through.
    /// The bucket starts full.
    pub(crate) fn new(rate_per_sec: f64, burst: f64, now: Instant) -> Self {
        let burst = if burst.is_finite() {
            burst.max(1.0)
        } else {
            1.0
        };
        TokenBucket {
            configured: rate_per_sec,
            rate: rate_per_sec,
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn unlimited(&self) -> bool {
        !(self.configured.is_finite() && self.configured > 0.0)
    }

    fn min_rate(&self) -> f64 {
        self.configured / MIN_RATE_DIVISOR
    }

    /// A clock that steps backwards adds nothing and does not move `last` back.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if now > self.last {
            self.last = now;
        }
    }

    /// Takes a token, or says how long to wait for one.
    pub(crate) fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        if self.unlimited() {
            return Ok(());
        }
        self.refill(now);
        if self.tokens + EPSILON >= 1.0 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            return Ok(());
        }
        let secs = (1.0 - self.tokens) / self.rate;
        // Round up so that waiting the returned time really yields a token.
        let wait = Duration::try_from_secs_f64(secs)
            .map(|d| d + Duration::from_nanos(1))
            .unwrap_or(Duration::MAX);
        Err(wait)
    }

    /// A slow-down reply: halve the current rate (not below min_rate = configured/16) and drop
    /// accumulated tokens, so the lower rate applies from the next message on, not after a
    /// burst.
    pub(crate) fn slow_down(&mut self, now: Instant) {
        if self.unlimited() {
            return;
        }
        self.refill(now);
        self.rate = (self.rate / 2.0).max(self.min_rate());
        self.tokens = 0.0;
    }

    /// An accepted message: recover the rate additively toward the configured one
    /// (+5% of configured per success).
    pub(crate) fn on_success(&mut self) {
        if self.unlimited() {
            return;
        }
        self.rate = (self.rate + self.configured * RECOVERY_STEP).min(self.configured);
    }

    /// Returns a token taken for work that did not happen (nothing was due).
    pub(crate) fn give_back(&mut self) {
        if self.unlimited() {
            return;
        }
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    pub(crate) fn current_rate(&self) -> f64 {
        self.rate
    }

    #[cfg(test)]
    pub(crate) fn configured_rate(&self) -> f64 {
        self.configured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn approx(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn starts_full_then_paces() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3.0, t0);
        for _ in 0..3 {
            assert_eq!(b.try_take(t0), Ok(()));
        }
        let wait = b.try_take(t0).unwrap_err();
        assert!(
            wait >= ms(100) && wait <= ms(100) + Duration::from_nanos(10),
            "{wait:?}"
        );
        assert!(b.try_take(t0 + ms(99)).is_err());
        assert_eq!(b.try_take(t0 + ms(100)), Ok(()));
        assert!(b.try_take(t0 + ms(100)).is_err());
    }

    #[test]
    fn waiting_the_advertised_time_yields_a_token() {
        let t0 = Instant::now();
        for rate in [0.3, 1.0, 7.0, 33.3, 1000.0] {
            let mut b = TokenBucket::new(rate, 1.0, t0);
            let mut now = t0;
            assert_eq!(b.try_take(now), Ok(()));
            for _ in 0..50 {
                let wait = b.try_take(now).unwrap_err();
                now += wait;
                assert_eq!(b.try_take(now), Ok(()), "rate {rate}");
            }
        }
    }

    #[test]
    fn refill_is_capped_at_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 2.0, t0);
        assert_eq!(b.try_take(t0), Ok(()));
        assert_eq!(b.try_take(t0), Ok(()));
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(b.try_take(later), Ok(()));
        assert_eq!(b.try_take(later), Ok(()));
        assert!(b.try_take(later).is_err());
    }

    #[test]
    fn burst_table() {
        let t0 = Instant::now();
        // (burst, tokens available at start)
        let cases: &[(f64, usize)] = &[
            (0.0, 1),
            (0.5, 1),
            (1.0, 1),
            (2.5, 2),
            (5.0, 5),
            (f64::NAN, 1),
        ];
        for &(burst, want) in cases {
            let mut b = TokenBucket::new(1.0, burst, t0);
            let mut n = 0;
            while b.try_take(t0).is_ok() {
                n += 1;
            }
            assert_eq!(n, want, "burst {burst}");
        }
    }

    #[test]
    fn backwards_clock_adds_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::new(1.0, 1.0, t0);
        assert_eq!(b.try_take(t0), Ok(()));
        assert!(b.try_take(t0 - Duration::from_secs(5)).is_err());
        // `last` did not move back, so going forward again is measured from t0.
        assert!(b.try_take(t0 + ms(999)).is_err());
        assert_eq!(b.try_take(t0 + ms(1000)), Ok(()));
    }

    #[test]
    fn slow_down_halves_to_a_floor_and_drops_tokens() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(16.0, 10.0, t0);
        let expected = [8.0, 4.0, 2.0, 1.0, 1.0, 1.0];
        for want in expected {
            b.slow_down(t0);
            assert!(
                approx(b.current_rate(), want),
                "{} != {want}",
                b.current_rate()
            );
        }
        assert!(approx(b.configured_rate(), 16.0));
        // No tokens left, and the next one comes at the lowered rate.
        let wait = b.try_take(t0).unwrap_err();
        assert!(wait >= Duration::from_secs(1) && wait < Duration::from_secs(1) + ms(1));
        // Time that passed before the slow-down is not kept as credit.
        let mut c = TokenBucket::new(16.0, 10.0, t0);
        for _ in 0..10 {
            c.try_take(t0).unwrap();
        }
        c.slow_down(t0 + Duration::from_secs(60));
        assert!(c.try_take(t0 + Duration::from_secs(60)).is_err());
        assert_eq!(c.try_take(t0 + Duration::from_secs(60) + ms(125)), Ok(()));
    }

    #[test]
    fn recovery_is_additive_and_capped() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(20.0, 1.0, t0);
        for _ in 0..10 {
            b.slow_down(t0);
        }
        assert!(approx(b.current_rate(), 1.25));
        b.on_success();
        assert!(approx(b.current_rate(), 2.25));
        b.on_success();
        assert!(approx(b.current_rate(), 3.25));
        for _ in 0..100 {
            b.on_success();
        }
        assert!(approx(b.current_rate(), 20.0));
        b.slow_down(t0);
        assert!(approx(b.current_rate(), 10.0));
        for _ in 0..10 {
            b.on_success();
        }
        assert!(approx(b.current_rate(), 20.0));
    }

    #[test]
    fn on_success_at_full_rate_is_a_no_op() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(5.0, 1.0, t0);
        b.on_success();
        assert!(approx(b.current_rate(), 5.0));
    }

    #[test]
    fn non_positive_rate_means_unlimited() {
        let t0 = Instant::now();
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut b = TokenBucket::new(rate, 1.0, t0);
            for _ in 0..1000 {
                assert_eq!(b.try_take(t0), Ok(()), "rate {rate}");
            }
            b.slow_down(t0);
            b.on_success();
            assert_eq!(b.try_take(t0), Ok(()));
        }
    }

    #[test]
    fn tiny_rate_does_not_panic() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1e-300, 1.0, t0);
        assert_eq!(b.try_take(t0), Ok(()));
        assert_eq!(b.try_take(t0), Err(Duration::MAX));
    }
}
