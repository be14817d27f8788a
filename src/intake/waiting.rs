//! Intake's part in the before-queue mode (docs/guides/before-queue.md): a submission whose
//! client waits for the upstream's verdict registers its record before the commit, and a
//! retry of a record whose first client still waits here hears what that client hears.

use std::sync::Arc;

use super::key::IdemKey;
use super::{replay, unavailable, ClientAnswer, Intake, Origin, SubmissionResult};
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

    /// Runs intake for a client that waits for the upstream's verdict, and answers it: the
    /// upstream's verdict within the bound, else what was stored (`BeforeQueue::answer`).
    pub(crate) async fn submit_and_wait(
        &self,
        before_queue: &BeforeQueue,
        origin: &Origin,
        sub: &Submission,
    ) -> Reply {
        match self.submit_waiting(origin, sub).await {
            (queued, _, Some(waiter)) => before_queue.answer(queued, waiter).await,
            (reply, _, None) => reply,
        }
    }

    /// A retry that found a record whose first client waits here for the upstream's verdict
    /// waits for that answer too, then replays what the record says: both hear the same.
    /// Bounded by the first client's bound and `in_progress_wait` for its write; past that,
    /// E01004 (retry later), as for any submission still in progress.
    pub(super) async fn after_verdict(
        &self,
        scope: &str,
        key: Option<&IdemKey>,
        decision: ClientAnswer,
    ) -> ClientAnswer {
        let (Some(before_queue), Some(key)) = (&self.before_queue, key) else {
            return decision;
        };
        let Some(id) = decision.id.clone() else {
            return decision;
        };
        match before_queue.registry.pending(&id) {
            Some(mut finished) => {
                let bound = before_queue.wait + self.settings.in_progress_wait;
                if tokio::time::timeout(bound, finished.wait_for(|done| *done))
                    .await
                    .is_err()
                {
                    return ClientAnswer::refused(
                        Reply::key_in_progress(),
                        SubmissionResult::InProgress,
                    );
                }
            }
            // No client of this record waits here now. One may have, until a moment ago: its
            // verdict stored and its slot finished between this retry's lookup and here (the
            // slot goes only once the verdict is written). A replay of the record's first
            // answer, `queued`, is read once more so that both clients hear the same.
            None if decision.reply == Reply::queued(&id).replayed() => {}
            None => return decision,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::intake::key::KeySource;
    use crate::intake::{IntakeSettings, KeySpaces};
    use crate::store::sqlite::SqliteStore;
    use crate::store::{Retention, Store};

    /// The race a retry can lose: its lookup read the record's first reply (`queued`), then the
    /// first client's verdict was stored and its slot finished before the retry looked for the
    /// slot. The retry must hear the verdict, as the first client did.
    #[tokio::test]
    async fn a_retry_that_missed_the_slot_reads_the_verdict_stored_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("r.db").display());
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(&url, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        let retention = Retention::flat(Duration::from_secs(3600));
        let verdict =
            "554 5.7.1 upstream refused M1 (not delivered, no bounce will follow): 554 5.7.1 spam";
        let mut record = crate::store::test_record("M1", "k1");
        record.reply = verdict.into();
        store.insert(&record, retention).await.unwrap();
        let hint = Arc::new(tokio::sync::Notify::new());
        let intake = Intake::new(
            store.clone(),
            IntakeSettings {
                hostname: "relay.test".into(),
                missing_key: crate::mail::MissingKey::Derive,
                retention,
                in_progress_wait: Duration::from_secs(1),
                key_spaces: KeySpaces::new(),
                log_recipients: false,
            },
            hint.clone(),
            Default::default(),
        )
        .with_before_queue(Arc::new(BeforeQueue::new(
            Duration::from_secs(1),
            1,
            store,
            hint,
        )));
        let key = IdemKey {
            value: "k1".into(),
            source: KeySource::Header,
            encoded: false,
            undecoded: None,
        };
        let read_before = ClientAnswer {
            reply: Reply::queued("M1").replayed(),
            outcome: SubmissionResult::Replayed,
            id: Some("M1".into()),
        };
        let heard = intake.after_verdict("s", Some(&key), read_before).await;
        assert_eq!(heard.reply, Reply::from_line(verdict).unwrap().replayed());
        // Any other replay is what the record said, without a second read.
        let other = ClientAnswer {
            reply: Reply::from_line("250 2.0.0 OK delivered as M1; upstream: 250 ok")
                .unwrap()
                .replayed(),
            outcome: SubmissionResult::Replayed,
            id: Some("M1".into()),
        };
        let kept = other.reply.clone();
        assert_eq!(
            intake.after_verdict("s", Some(&key), other).await.reply,
            kept
        );
    }
}
