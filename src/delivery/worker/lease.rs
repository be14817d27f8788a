//! Acting under a delivery lease: how long this worker may still act by its own clock, and
//! the writes that end an attempt, retried while the lease lasts.

use std::time::{Duration, Instant};

use crate::store::{AttemptResult, Settle, Store};

/// How long this worker may still act under its lease, by its own clock: from the moment a
/// claim or renewal was asked for (the store's lease starts no earlier), less a margin for
/// the store's clock and the write in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct HeldLease {
    until: Instant,
    lease: Duration,
}

impl HeldLease {
    pub(super) fn new(claimed_at: Instant, lease: Duration) -> Self {
        HeldLease {
            until: claimed_at + lease,
            lease,
        }
    }

    /// Until when the outcome's write is retried: the lease as last renewed, not as first
    /// claimed (a long attempt renews it many times). A write after it would be refused by the
    /// fencing token anyway.
    pub(super) fn settle_by(&self) -> Instant {
        self.until
    }

    pub(super) fn renewed(&mut self, asked_at: Instant) {
        self.until = self.until.max(asked_at + self.lease);
    }

    /// When the attempt is given up if no renewal lands: a tenth of the lease (at least a
    /// second) before it could expire.
    pub(super) fn abandon_at(&self) -> Instant {
        let margin = (self.lease / 10).max(Duration::from_secs(1));
        self.until.checked_sub(margin).unwrap_or(self.until)
    }
}

/// `answer`: the reply a waiting client is told, stored as the record's reply in the same
/// commit (before-queue mode).
pub(super) async fn settle_with_retry(
    store: &dyn Store,
    id: &str,
    token: i64,
    attempt: Option<(u32, &AttemptResult)>,
    settle: &Settle,
    answer: Option<&crate::reply::Reply>,
    until: Instant,
) -> anyhow::Result<bool> {
    let mut pause = Duration::from_millis(100);
    loop {
        let written = match answer {
            Some(reply) => {
                store
                    .settle_answered(id, token, attempt, settle, &reply.line())
                    .await
            }
            None => store.settle(id, token, attempt, settle).await,
        };
        match written {
            Ok(held) => return Ok(held),
            Err(err) if Instant::now() + pause < until => {
                tracing::warn!(target: "idemrelay::store", error = %err, id = %id, "cannot write the attempt outcome yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// Gives a lease back, retrying while the store refuses and the lease lasts; past that, the
/// lease simply runs out.
pub(super) async fn release_with_retry(
    store: &dyn Store,
    id: &str,
    token: i64,
    after: Duration,
    until: Instant,
) {
    let mut pause = Duration::from_millis(100);
    loop {
        match store.release(id, token, after).await {
            Ok(()) => return,
            Err(err) if Instant::now() + pause < until => {
                tracing::warn!(target: "idemrelay::store", error = %err, id = %id, "cannot give the delivery lease back yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HeldLease;
    use std::time::{Duration, Instant};

    #[test]
    fn a_lease_is_given_up_before_it_could_expire_when_renewals_fail() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut held = HeldLease::new(t0, s(30));
        assert_eq!(held.abandon_at(), t0 + s(27));
        // A renewal asked at +10 s extends from then, not from its answer.
        held.renewed(t0 + s(10));
        assert_eq!(held.abandon_at(), t0 + s(37));
        // A renewal that was asked earlier than the one in force changes nothing.
        held.renewed(t0 + s(5));
        assert_eq!(held.abandon_at(), t0 + s(37));
        // The outcome's write is retried until the renewed lease ends, not the first one.
        assert_eq!(held.settle_by(), t0 + s(40));
        // Short leases keep at least a second of margin.
        assert_eq!(HeldLease::new(t0, s(5)).abandon_at(), t0 + s(4));
    }
}
