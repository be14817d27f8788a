//! Intake's part in the before-queue mode (docs/guides/before-queue.md): a submission whose
//! client waits for the upstream's verdict registers its record before the commit, and a
//! retry of a record whose first client still waits here hears what that client hears.

use std::sync::Arc;

use super::key::IdemKey;
use super::{replay, unavailable, Decision, Intake, Origin, SubmissionResult};
use crate::delivery::immediate::{BeforeQueue, Waiter};
use crate::mail::Submission;
use crate::reply::Reply;

impl Intake {
    /// Lets submissions wait for the upstream's verdict (`submit_waiting`).
    pub(crate) fn with_before_queue(mut self, before_queue: Arc<BeforeQueue>) -> Self {
        self.before_queue = Some(before_queue);
        self
    }

    /// `submit` for a client that waits for the upstream's verdict: an accepted record comes
    /// with its client's slot, registered before the commit, and the delivery workers are not
    /// woken for it (the immediate send takes it; `BeforeQueue::answer`).
    pub(crate) async fn submit_waiting(
        &self,
        origin: &Origin,
        sub: &Submission,
    ) -> (Reply, SubmissionResult, Option<Waiter>) {
        self.submit_with(origin, sub, true).await
    }

    /// A retry that found a record whose first client waits here for the upstream's verdict
    /// waits for that answer too, then replays what the record says: both hear the same.
    /// Bounded by the first client's bound and `in_progress_wait` for its write; past that,
    /// E01004 (retry later), as for any submission still in progress.
    pub(super) async fn after_verdict(
        &self,
        scope: &str,
        key: Option<&IdemKey>,
        decision: Decision,
    ) -> Decision {
        let (Some(before_queue), Some(key)) = (&self.before_queue, key) else {
            return decision;
        };
        let Some(id) = decision.id.clone() else {
            return decision;
        };
        let Some(mut finished) = before_queue.registry.pending(&id) else {
            return decision;
        };
        let bound = before_queue.wait + self.settings.in_progress_wait;
        if tokio::time::timeout(bound, finished.wait_for(|done| *done))
            .await
            .is_err()
        {
            return Decision::refused(Reply::key_in_progress(), SubmissionResult::InProgress);
        }
        match self
            .store
            .lookup(scope, &key.value, self.settings.retention)
            .await
        {
            Ok(parts) => parts
                .iter()
                .find(|part| part.id == id)
                .map_or(decision, replay),
            Err(err) => unavailable(&err),
        }
    }
}
