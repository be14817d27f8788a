//! The console login's throttle: wrong admin tokens are counted, and past a few per minute
//! no token is even compared. A leaf, so the admin state can hold one.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong admin tokens at the login form: at most `MAX_FAILURES` per `WINDOW` for the admin
/// listener, then every login is answered "wait" without looking at the token until the
/// window has moved on. Counted for the listener, not per client: behind a proxy every client
/// has one address, and the token's owner has the API (bearer token) meanwhile.
#[derive(Default)]
pub(crate) struct LoginThrottle {
    failures: Mutex<VecDeque<Instant>>,
}

impl LoginThrottle {
    pub(crate) const MAX_FAILURES: usize = 10;
    pub(crate) const WINDOW: Duration = Duration::from_secs(60);

    /// `None` when a login may be tried now, else how long until one may.
    pub(crate) fn wait(&self, now: Instant) -> Option<Duration> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        while failures
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= Self::WINDOW)
        {
            failures.pop_front();
        }
        (failures.len() >= Self::MAX_FAILURES)
            .then(|| Self::WINDOW - now.saturating_duration_since(failures[0]))
    }

    pub(crate) fn failed(&self, now: Instant) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_tokens_are_throttled_for_a_window() {
        let throttle = LoginThrottle::default();
        let t0 = Instant::now();
        for n in 0..LoginThrottle::MAX_FAILURES {
            assert_eq!(throttle.wait(t0), None, "{n}");
            throttle.failed(t0);
        }
        assert_eq!(throttle.wait(t0), Some(LoginThrottle::WINDOW));
        let later = t0 + LoginThrottle::WINDOW;
        assert_eq!(throttle.wait(later), None);
    }
}
