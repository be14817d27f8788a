//! `/readyz`'s store probe, cached: a leaf, so the admin state can hold one.

use std::time::{Duration, Instant};

use crate::store::{Store, StoreHealth};

/// How long a store probe's result answers `/readyz`. A probe is a write transaction: a
/// load balancer (or anyone) asking many times a second must not put that many writes in
/// front of the mail. A second is well inside any probe period worth configuring.
pub(crate) const READY_PROBE_MAX_AGE: Duration = Duration::from_secs(1);

/// The last store probe `/readyz` ran, with its time. One probe at a time: callers arriving
/// while it runs wait for its result instead of starting their own.
pub(crate) struct ReadyProbe {
    last: tokio::sync::Mutex<Option<(Instant, bool)>>,
    max_age: Duration,
}

impl ReadyProbe {
    pub(crate) fn new(max_age: Duration) -> ReadyProbe {
        ReadyProbe {
            last: tokio::sync::Mutex::new(None),
            max_age,
        }
    }

    pub(crate) async fn writable(&self, store: &dyn Store, health: &StoreHealth) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, writable)) = *last {
            if at.elapsed() < self.max_age {
                return writable;
            }
        }
        let writable = health.probe(store).await;
        *last = Some((Instant::now(), writable));
        writable
    }
}
