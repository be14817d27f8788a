//! The contract of `Store::claim_id` and `Store::settle_answered` (the before-queue mode,
//! docs/guides/before-queue.md), on both backends.

use std::time::Duration;

use idemrelay::store::{AttemptResult, OutcomeKind, Phase, Settle, State};

use super::{accepted, instances, record, Backend, LONG_LEASE, RETENTION};

fn refused() -> AttemptResult {
    AttemptResult {
        outcome: OutcomeKind::Permanent,
        phase: Some(Phase::Dot),
        code: Some(554),
        reply: "554 5.7.1 no".into(),
    }
}

on_both_backends!(a_record_is_leased_by_its_id_only_when_free_and_not_paused);
async fn a_record_is_leased_by_its_id_only_when_free_and_not_paused(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("m1", "k1", 1), RETENTION).await.unwrap();
        a.insert(&record("m2", "k2", 2), RETENTION).await.unwrap();
        // Not the head of the queue: m2 is leased by its id, m1 stays due for the claim.
        let held = a
            .claim_id("m2", "now", LONG_LEASE)
            .await
            .unwrap()
            .expect("leased by id");
        assert_eq!(held.id, "m2", "{name}");
        assert_eq!(held.attempts, 0, "{name}");
        assert!(
            b.claim_id("m2", "other", LONG_LEASE)
                .await
                .unwrap()
                .is_none(),
            "{name}: leased twice"
        );
        let next = b.claim("worker", LONG_LEASE).await.unwrap().expect("m1");
        assert_eq!(
            next.id, "m1",
            "{name}: the ordinary claim took the held record"
        );
        assert!(
            b.claim_id("m1", "now", LONG_LEASE).await.unwrap().is_none(),
            "{name}: took a record a worker holds"
        );
        assert!(a
            .claim_id("absent", "now", LONG_LEASE)
            .await
            .unwrap()
            .is_none());
        // Nothing while delivery is paused.
        a.insert(&record("m3", "k3", 3), RETENTION).await.unwrap();
        a.pause("operator", false).await.unwrap();
        assert!(
            b.claim_id("m3", "now", LONG_LEASE).await.unwrap().is_none(),
            "{name}: leased while paused"
        );
        a.resume().await.unwrap();
        let m3 = b.claim_id("m3", "now", LONG_LEASE).await.unwrap();
        assert!(m3.is_some(), "{name}");
        // A released lease can be taken by id again (the token moves on).
        let m3 = m3.unwrap();
        b.release("m3", m3.token, Duration::ZERO).await.unwrap();
        let again = a.claim_id("m3", "now", LONG_LEASE).await.unwrap().unwrap();
        assert!(again.token > m3.token, "{name}");
        // Once an attempt has begun, the record is ordinary delivery's (with its backoff): a
        // lease by id is refused even when the lease is free again.
        assert!(a.begin_attempt("m3", again.token, 1).await.unwrap());
        a.release("m3", again.token, Duration::ZERO).await.unwrap();
        assert!(
            b.claim_id("m3", "now", LONG_LEASE).await.unwrap().is_none(),
            "{name}: leased by id after an attempt"
        );
    }
}

on_both_backends!(an_answered_settle_stores_the_reply_in_the_same_commit_under_the_fence);
async fn an_answered_settle_stores_the_reply_in_the_same_commit_under_the_fence(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("m1", "k1", 1), RETENTION).await.unwrap();
        let short = Duration::from_millis(300);
        let old = a.claim_id("m1", "old", short).await.unwrap().unwrap();
        assert!(a.begin_attempt("m1", old.token, 1).await.unwrap());
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Taken over: the stale holder's answer changes nothing, reply included.
        let new = b
            .claim("new", LONG_LEASE)
            .await
            .unwrap()
            .expect("taken over");
        let failed = Settle::Failed {
            upstream_reply: "554 5.7.1 no".into(),
            dsn: None,
        };
        assert!(
            !a.settle_answered("m1", old.token, Some((1, &refused())), &failed, "554 stale")
                .await
                .unwrap(),
            "{name}"
        );
        let m = a.message("m1").await.unwrap().unwrap();
        assert_eq!(m.reply, "250 2.0.0 OK queued as m1", "{name}");
        assert_eq!(m.state, State::Queued, "{name}");
        // The holder's answer lands with the outcome.
        assert!(b.begin_attempt("m1", new.token, 2).await.unwrap());
        let line = "554 5.7.1 upstream refused m1: 554 5.7.1 no";
        assert!(b
            .settle_answered("m1", new.token, Some((2, &refused())), &failed, line)
            .await
            .unwrap());
        let m = a.message("m1").await.unwrap().unwrap();
        assert_eq!((m.state, m.reply.as_str()), (State::Failed, line), "{name}");
        assert!(m.dsns.is_empty(), "{name}");
        // The same for a delivery, and the replay under the key is the new line.
        a.insert(&record("m2", "k2", 2), RETENTION).await.unwrap();
        let job = a.claim_id("m2", "now", LONG_LEASE).await.unwrap().unwrap();
        assert!(a.begin_attempt("m2", job.token, 1).await.unwrap());
        let delivered = Settle::Delivered {
            upstream_reply: "250 ok".into(),
            dsn: None,
        };
        let line = "250 2.0.0 OK delivered as m2; upstream: 250 ok";
        assert!(a
            .settle_answered("m2", job.token, Some((1, &accepted())), &delivered, line)
            .await
            .unwrap());
        let parts = b.lookup("s", "k2", RETENTION).await.unwrap();
        assert_eq!(parts[0].reply, line, "{name}");
        assert_eq!(parts[0].state, State::Delivered, "{name}");
    }
}
