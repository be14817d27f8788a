//! The contract for a notice queued with a retry (the delay notice): it is written in the
//! commit that schedules the retry, and a later retry that brings the same notice again
//! (same key, a new queue id) queues nothing more.

use super::{instances, record, Backend, LONG_LEASE, RETENTION};
use idemrelay::store::{AttemptResult, KeySource, NewRecord, OutcomeKind, Phase, Settle};
use std::time::Duration;

fn deferred() -> AttemptResult {
    AttemptResult {
        outcome: OutcomeKind::Transient,
        phase: Some(Phase::Rcpt),
        code: Some(451),
        reply: "451 4.2.1 busy".into(),
    }
}

/// The delay notice as the worker builds it on each retry: the same key, a new id.
fn notice(id: &str) -> NewRecord {
    let mut n = record(id, "dsn-delayed-m1", 7);
    n.envelope.mail_from = String::new();
    n.envelope.rcpt_to = vec!["a@example.com".into()];
    n.key_source = Some(KeySource::Dsn);
    n.dsn_of = Some("m1".into());
    n
}

on_both_backends!(two_retries_with_a_delay_notice_queue_it_once);
async fn two_retries_with_a_delay_notice_queue_it_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("m1", "k1", 1), RETENTION).await.unwrap();
        let mut set_aside = Vec::new();
        for (attempt, (store, dsn_id)) in [(&a, "d1"), (&b, "d2")].into_iter().enumerate() {
            let attempt = attempt as u32 + 1;
            // The queued notice is due too: set it aside to reach the original.
            let job = loop {
                let job = store.claim("w", LONG_LEASE).await.unwrap().expect("a job");
                if job.id == "m1" {
                    break job;
                }
                assert_eq!(job.id, "d1", "{name}: only the first notice is queued");
                set_aside.push(job.id.clone());
                store
                    .release(&job.id, job.token, Duration::from_secs(3600))
                    .await
                    .unwrap();
            };
            assert!(store.begin_attempt("m1", job.token, attempt).await.unwrap());
            let retry = Settle::Retry {
                after: Duration::ZERO,
                dsn: Some(Box::new(notice(dsn_id))),
            };
            assert!(
                store
                    .settle("m1", job.token, Some((attempt, &deferred())), &retry)
                    .await
                    .unwrap(),
                "{name}"
            );
        }
        let m1 = a.message("m1").await.unwrap().unwrap();
        assert_eq!(m1.dsns, ["d1"], "{name}: one notice for two retries");
        assert!(b.message("d2").await.unwrap().is_none(), "{name}");
        assert_eq!(a.attempts("m1").await.unwrap().len(), 2, "{name}");
        // The notice has its own job, one (perhaps set aside above).
        let mut claimed = set_aside;
        while let Some(job) = b.claim("x", LONG_LEASE).await.unwrap() {
            claimed.push(job.id.clone());
            b.release(&job.id, job.token, Duration::from_secs(3600))
                .await
                .unwrap();
        }
        claimed.sort();
        assert_eq!(
            claimed,
            ["d1", "m1"],
            "{name}: m1 is due again, and d1 once"
        );
    }
}
