//! Records, jobs and leases with two instances on one store: inserts, claims, takeovers,
//! expired keys, damaged bodies, requeues and parts.

use super::*;

on_both_backends!(concurrent_inserts_of_one_key_on_two_instances_make_one_record);
async fn concurrent_inserts_of_one_key_on_two_instances_make_one_record(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let mut tasks = Vec::new();
        for k in 0..40 {
            for (side, store) in [("a", a.clone()), ("b", b.clone())] {
                tasks.push(tokio::spawn(async move {
                    let rec = record(&format!("{side}{k}"), &format!("key-{k}"), 1);
                    (k, store.insert(&rec, RETENTION).await.unwrap())
                }));
            }
        }
        let mut winners = vec![Vec::new(); 40];
        let mut losers = vec![Vec::new(); 40];
        for t in tasks {
            let (k, result) = t.await.unwrap();
            match result {
                Insert::Inserted => winners[k].push(()),
                Insert::Existing(e) => losers[k].push(e[0].id.clone()),
            }
        }
        for k in 0..40 {
            assert_eq!(
                winners[k].len(),
                1,
                "{name}: key-{k} inserted {} times",
                winners[k].len()
            );
            assert_eq!(losers[k].len(), 1, "{name}: key-{k}");
            let kept = a.lookup("s", &format!("key-{k}"), RETENTION).await.unwrap();
            assert_eq!(
                losers[k][0], kept[0].id,
                "{name}: the loser sees the winner's record"
            );
        }
        assert_eq!(a.list(None, 1000, None).await.unwrap().len(), 40, "{name}");
    }
}

on_both_backends!(concurrent_claims_on_two_instances_take_each_job_once);
async fn concurrent_claims_on_two_instances_take_each_job_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        for n in 0..60 {
            a.insert(&record(&format!("m{n:02}"), &format!("k{n}"), 1), RETENTION)
                .await
                .unwrap();
        }
        let mut tasks = Vec::new();
        for w in 0..6 {
            let store = if w % 2 == 0 { a.clone() } else { b.clone() };
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(job) = store.claim(&format!("w{w}"), LONG_LEASE).await.unwrap() {
                    got.push(job.id);
                }
                got
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let distinct: HashSet<_> = all.iter().cloned().collect();
        assert_eq!(all.len(), 60, "{name}: every job claimed exactly once");
        assert_eq!(distinct.len(), 60, "{name}");
    }
}

on_both_backends!(a_holder_whose_lease_was_taken_over_cannot_write);
async fn a_holder_whose_lease_was_taken_over_cannot_write(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("m1", "k1", 1), RETENTION).await.unwrap();
        let short = Duration::from_millis(300);
        let old = a.claim("old", short).await.unwrap().expect("claimed");
        assert!(a.begin_attempt("m1", old.token, 1).await.unwrap(), "{name}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Expired: another instance takes the job over, and the open intent becomes unknown.
        let new = b
            .claim("new", LONG_LEASE)
            .await
            .unwrap()
            .expect("taken over");
        assert_ne!(new.token, old.token, "{name}: a claim changes the token");
        assert!(new.recovered && new.attempts == 1, "{name}: {new:?}");

        // Every write the old holder might still attempt is refused.
        assert!(
            !a.renew_lease("m1", old.token, LONG_LEASE).await.unwrap(),
            "{name}"
        );
        assert!(
            !a.begin_attempt("m1", old.token, 2).await.unwrap(),
            "{name}"
        );
        let delivered = Settle::Delivered {
            upstream_reply: "250 stale".into(),
            dsn: None,
        };
        assert!(
            !a.settle("m1", old.token, Some((1, &accepted())), &delivered)
                .await
                .unwrap(),
            "{name}: a stale outcome must not overwrite the ledger"
        );
        a.release("m1", old.token, Duration::ZERO).await.unwrap();
        let ledger = a.attempts("m1").await.unwrap();
        assert_eq!(ledger.len(), 1, "{name}");
        assert_eq!(ledger[0].outcome.as_deref(), Some("unknown"), "{name}");
        assert_eq!(a.message("m1").await.unwrap().unwrap().state, State::Queued);
        assert!(
            b.claim("other", LONG_LEASE).await.unwrap().is_none(),
            "{name}: the stale release did not free the new holder's lease"
        );

        // The new holder's writes go through.
        assert!(
            b.renew_lease("m1", new.token, LONG_LEASE).await.unwrap(),
            "{name}"
        );
        assert!(b.begin_attempt("m1", new.token, 2).await.unwrap(), "{name}");
        let fresh = Settle::Delivered {
            upstream_reply: "250 fresh".into(),
            dsn: None,
        };
        assert!(b
            .settle("m1", new.token, Some((2, &accepted())), &fresh)
            .await
            .unwrap());
        let m = a.message("m1").await.unwrap().unwrap();
        assert_eq!(m.state, State::Delivered, "{name}");
        assert_eq!(m.upstream_reply.as_deref(), Some("250 fresh"), "{name}");
        let owners: Vec<_> = a
            .attempts("m1")
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.owner)
            .collect();
        assert_eq!(owners, ["old", "new"], "{name}");
    }
}

on_both_backends!(an_expired_terminal_record_is_replaced_and_a_live_one_is_not);
async fn an_expired_terminal_record_is_replaced_and_a_live_one_is_not(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let mut rejected = record("r1", "k", 1);
        rejected.state = State::Rejected;
        rejected.content = None;
        assert_eq!(
            a.insert(&rejected, RETENTION).await.unwrap(),
            Insert::Inserted
        );
        match b.insert(&record("r2", "k", 2), RETENTION).await.unwrap() {
            Insert::Existing(e) => assert_eq!(e[0].id, "r1", "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let short = Retention::flat(Duration::from_millis(10));
        assert!(
            b.lookup("s", "k", short).await.unwrap().is_empty(),
            "{name}"
        );
        assert_eq!(
            b.insert(&record("r3", "k", 3), short).await.unwrap(),
            Insert::Inserted
        );
        assert!(a.message("r1").await.unwrap().is_none(), "{name}");
        assert_eq!(a.lookup("s", "k", RETENTION).await.unwrap()[0].id, "r3");
    }
}

on_both_backends!(two_instances_replacing_one_expired_key_at_once_keep_one_record);
/// Two instances take one expired key for a new operation at the same moment: one record
/// goes in, the other submission finds it (a conflict or a replay), and no record that was
/// answered as inserted is deleted by the other's replacement.
async fn two_instances_replacing_one_expired_key_at_once_keep_one_record(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let short = Retention::flat(Duration::from_millis(10));
        for round in 0..40 {
            let key = format!("race-{round}");
            let mut old = record(&format!("old{round}"), &key, 1);
            old.state = State::Rejected;
            old.content = None;
            a.insert(&old, RETENTION).await.unwrap();
            tokio::time::sleep(Duration::from_millis(15)).await;
            let first = record(&format!("a{round}"), &key, 2);
            let second = record(&format!("b{round}"), &key, 3);
            let (x, y) = tokio::join!(a.insert(&first, short), b.insert(&second, short));
            let (x, y) = (x.unwrap(), y.unwrap());
            let inserted: Vec<&str> = [(&x, "a"), (&y, "b")]
                .into_iter()
                .filter(|(r, _)| **r == Insert::Inserted)
                .map(|(_, who)| who)
                .collect();
            let kept = a.lookup("s", &key, RETENTION).await.unwrap();
            assert_eq!(
                inserted.len(),
                1,
                "{name} round {round}: {x:?} / {y:?}, kept {kept:?}"
            );
            assert_eq!(kept.len(), 1, "{name} round {round}: {kept:?}");
            assert_eq!(
                kept[0].id,
                format!("{}{round}", inserted[0]),
                "{name} round {round}: the record answered as inserted is gone"
            );
        }
    }
}

on_both_backends!(a_body_that_fails_its_checksum_is_failed_as_damaged_and_the_queue_goes_on);
/// A body changed after its commit (a bit flip, a torn write) fails its checksum: the record
/// is failed as damaged and never handed to a worker, and the claim goes on to the next job.
async fn a_body_that_fails_its_checksum_is_failed_as_damaged_and_the_queue_goes_on(
    backend: Backend,
) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b, url) in instances_with_urls(&dir, backend).await {
        a.insert(&record("bad", "k-bad", 1), RETENTION)
            .await
            .unwrap();
        a.insert(&record("good", "k-good", 2), RETENTION)
            .await
            .unwrap();
        let flip = if name == "postgres" {
            "UPDATE messages SET content = overlay(content placing 'X'::bytea from 16) WHERE id = 'bad'"
        } else {
            "UPDATE messages SET content = CAST(replace(CAST(content AS TEXT), 'body', 'bodX') AS BLOB) WHERE id = 'bad'"
        };
        backend::execute(&url, flip).await;
        let job = b.claim("w", LONG_LEASE).await.unwrap().expect("a job");
        assert_eq!(job.id, "good", "{name}");
        assert!(b.claim("w", LONG_LEASE).await.unwrap().is_none(), "{name}");
        let bad = a.message("bad").await.unwrap().unwrap();
        assert_eq!(bad.state, State::Failed, "{name}");
        assert!(!bad.has_job, "{name}");
        assert!(
            bad.damage
                .as_deref()
                .unwrap_or_default()
                .contains("checksum"),
            "{name}: {:?}",
            bad.damage
        );
        assert_eq!(a.queue_stats().await.unwrap().damaged, 1, "{name}");
    }
}

on_both_backends!(a_requeue_needs_confirmation_whenever_the_ledger_holds_an_unknown);
/// A dead worker's open intent, closed as UNKNOWN by an operator's cancel, makes the record
/// `cancelled` with an UNKNOWN in its ledger: retrying it may send a second copy, so it needs
/// the confirmation like an `unresolved` record. Without one (a ledger of definite outcomes),
/// the upstream window keeps counting from the first attempt ever made.
async fn a_requeue_needs_confirmation_whenever_the_ledger_holds_an_unknown(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("open", "k-open", 1), RETENTION)
            .await
            .unwrap();
        let job = a
            .claim("dead-worker", Duration::from_millis(200))
            .await
            .unwrap()
            .unwrap();
        assert!(a.begin_attempt("open", job.token, 1).await.unwrap());
        // The worker dies; its lease runs out; an operator cancels the record.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(b.cancel("open", &operator()).await.unwrap(), "{name}");
        let ledger = b.attempts("open").await.unwrap();
        assert_eq!(ledger[0].outcome.as_deref(), Some("unknown"), "{name}");
        assert_eq!(
            b.requeue("open", false, &operator()).await.unwrap(),
            store::Requeue::NeedsConfirmation(State::Cancelled),
            "{name}"
        );
        assert_eq!(
            b.message("open").await.unwrap().unwrap().state,
            State::Cancelled,
            "{name}"
        );
        assert_eq!(
            b.requeue("open", true, &operator()).await.unwrap(),
            store::Requeue::Requeued,
            "{name}"
        );
        let again = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        assert_eq!(
            (again.id.as_str(), again.first_attempt_at_ms),
            ("open", None),
            "{name}: a confirmed retry starts a new window"
        );
        let failed = Settle::Failed {
            upstream_reply: "550 no".into(),
            dsn: None,
        };
        assert!(a.settle("open", again.token, None, &failed).await.unwrap());

        // A ledger without UNKNOWN: no confirmation, and the window's start is kept.
        a.insert(&record("plain", "k-plain", 2), RETENTION)
            .await
            .unwrap();
        let job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        assert_eq!(job.id, "plain");
        assert!(a.begin_attempt("plain", job.token, 1).await.unwrap());
        let permanent = AttemptResult {
            outcome: OutcomeKind::Permanent,
            phase: Some(Phase::Rcpt),
            code: Some(550),
            reply: "550 no".into(),
        };
        assert!(a
            .settle("plain", job.token, Some((1, &permanent)), &failed)
            .await
            .unwrap());
        let started = b.attempts("plain").await.unwrap()[0].started_at_ms;
        assert_eq!(
            b.requeue("plain", false, &operator()).await.unwrap(),
            store::Requeue::Requeued,
            "{name}"
        );
        let again = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        assert_eq!(again.id, "plain", "{name}");
        assert_eq!(again.first_attempt_at_ms, Some(started), "{name}");
    }
}

on_both_backends!(a_requeued_record_never_hands_out_a_token_a_stale_holder_has);
/// A worker that froze holding a claim, while the record went on to be parked and then
/// requeued by an operator, must find every write refused when it wakes: the job row the
/// requeue makes may not start its fencing tokens again where the old one's began.
async fn a_requeued_record_never_hands_out_a_token_a_stale_holder_has(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("m1", "k1", 1), RETENTION).await.unwrap();
        let frozen = a
            .claim("frozen", Duration::from_millis(200))
            .await
            .unwrap()
            .expect("claimed");
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Taken over after the lease ran out, and failed for good.
        let next = b
            .claim("next", LONG_LEASE)
            .await
            .unwrap()
            .expect("taken over");
        assert!(b.begin_attempt("m1", next.token, 1).await.unwrap());
        let refused = AttemptResult {
            outcome: OutcomeKind::Permanent,
            phase: Some(Phase::Rcpt),
            code: Some(550),
            reply: "550 5.1.1 no such user".into(),
        };
        let failed = Settle::Failed {
            upstream_reply: refused.reply.clone(),
            dsn: None,
        };
        assert!(b
            .settle("m1", next.token, Some((1, &refused)), &failed)
            .await
            .unwrap());
        // The operator requeues it; a worker claims it again.
        assert_eq!(
            b.requeue("m1", false, &operator()).await.unwrap(),
            store::Requeue::Requeued,
            "{name}"
        );
        let again = b
            .claim("again", LONG_LEASE)
            .await
            .unwrap()
            .expect("claimed");
        assert_ne!(
            again.token, frozen.token,
            "{name}: a token handed out twice"
        );
        assert!(
            !a.begin_attempt("m1", frozen.token, 1).await.unwrap(),
            "{name}: the frozen holder wrote an intent"
        );
        assert!(b.begin_attempt("m1", again.token, 2).await.unwrap());
    }
}

on_both_backends!(no_intent_is_written_under_an_expired_lease);
/// A worker whose lease ran out (its process stalled between the claim and the intent) may
/// not begin an attempt: the job may be another worker's at any moment.
async fn no_intent_is_written_under_an_expired_lease(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, _) in instances(&dir, backend).await {
        a.insert(&record("late", "k-late", 1), RETENTION)
            .await
            .unwrap();
        let job = a
            .claim("stalled", Duration::from_millis(200))
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            !a.begin_attempt("late", job.token, 1).await.unwrap(),
            "{name}"
        );
        assert!(a.attempts("late").await.unwrap().is_empty(), "{name}");
    }
}

on_both_backends!(parked_records_and_keys_inside_the_upstream_window_are_kept);
/// docs/concepts/contract.md "Retention": a parked record (`unresolved`, `failed`) keeps its key, bytes and
/// ledger until `parked` has passed since it was parked, whatever `replay` says; and no record
/// gives up its key while the upstream window is open on its last attempt. Both the purge and
/// an insert under the key follow the same rule.
async fn parked_records_and_keys_inside_the_upstream_window_are_kept(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let ms = Duration::from_millis;
    for (name, a, b) in instances(&dir, backend).await {
        // Replay is over at once; parked records wait 1.5 s; the window is 1.5 s.
        let retention = Retention {
            replay: ms(1),
            upstream_window: ms(1500),
            parked: ms(1500),
        };
        a.insert(&record("parked", "k-parked", 1), retention)
            .await
            .unwrap();
        a.insert(&record("sent", "k-sent", 2), retention)
            .await
            .unwrap();
        let parked = Settle::Unresolved {
            upstream_reply: "unknown".into(),
        };
        let sent = Settle::Delivered {
            upstream_reply: "250 ok".into(),
            dsn: None,
        };
        // Claims take a scope's jobs in insertion order.
        for (id, outcome, settle) in [
            ("parked", OutcomeKind::Unknown, parked),
            ("sent", OutcomeKind::Accepted, sent),
        ] {
            let job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
            assert_eq!(job.id, id, "{name}");
            assert!(a.begin_attempt(id, job.token, 1).await.unwrap());
            let result = AttemptResult {
                outcome,
                phase: Some(Phase::Dot),
                code: None,
                reply: "r".into(),
            };
            assert!(a
                .settle(id, job.token, Some((1, &result)), &settle)
                .await
                .unwrap());
        }
        tokio::time::sleep(ms(300)).await;
        assert_eq!(b.purge_expired(retention).await.unwrap(), 0, "{name}");
        for (id, key) in [("parked", "k-parked"), ("sent", "k-sent")] {
            assert_eq!(
                b.lookup("s", key, retention)
                    .await
                    .unwrap()
                    .first()
                    .map(|e| e.id.as_str()),
                Some(id),
                "{name}: {key} still taken"
            );
            let again = record("new", key, 9);
            match b.insert(&again, retention).await.unwrap() {
                Insert::Existing(e) => assert_eq!(e[0].id, id, "{name}"),
                other => panic!("{name}: {key} given away: {other:?}"),
            }
        }
        let parked = b.message("parked").await.unwrap().unwrap();
        assert!(parked.content.is_some(), "{name}: bytes kept");
        assert_eq!(b.attempts("parked").await.unwrap().len(), 1, "{name}");
        tokio::time::sleep(ms(1500)).await;
        assert_eq!(b.purge_expired(retention).await.unwrap(), 2, "{name}");
        assert!(b
            .lookup("s", "k-parked", retention)
            .await
            .unwrap()
            .is_empty());
    }
}

on_both_backends!(parts_racing_on_two_instances_are_numbered_once);
/// Parts are numbered once, at their first commit (docs/concepts/contract.md): two new parts of one message
/// racing on two instances for the same part number get it once; the other learns of the
/// winner and takes the next number.
async fn parts_racing_on_two_instances_are_numbered_once(backend: Backend) {
    use idemrelay::intake::parts::{choose_part, PartChoice};
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let part = |id: &str, fp: u8, n: u32, rcpt: &str| {
            let mut r = record(id, "split", fp);
            r.part = n;
            r.envelope.rcpt_to = vec![rcpt.to_string()];
            r
        };
        a.insert(&part("p1", 1, 1, "a@example.com"), RETENTION)
            .await
            .unwrap();
        let (left, right) = (
            part("p2a", 2, 2, "b@example.com"),
            part("p2b", 3, 2, "c@example.com"),
        );
        let (ra, rb) = tokio::join!(a.insert(&left, RETENTION), b.insert(&right, RETENTION));
        let (won, lost, loser) = match (ra.unwrap(), rb.unwrap()) {
            (Insert::Inserted, Insert::Existing(parts)) => (left.id.clone(), parts, right),
            (Insert::Existing(parts), Insert::Inserted) => (right.id.clone(), parts, left),
            other => panic!("{name}: {other:?}"),
        };
        let numbers: Vec<(u32, &str)> = lost.iter().map(|p| (p.part, p.id.as_str())).collect();
        assert_eq!(numbers, vec![(1, "p1"), (2, won.as_str())], "{name}");
        let next = match choose_part(
            &loser.fingerprint,
            &loser.message_fp,
            &loser.envelope.rcpt_to,
            &lost,
        ) {
            PartChoice::New(n) => n,
            other => panic!("{name}: {other:?}"),
        };
        let mut third = loser.clone();
        third.part = next;
        assert_eq!(b.insert(&third, RETENTION).await.unwrap(), Insert::Inserted);
        let all = a.lookup("s", "split", RETENTION).await.unwrap();
        let numbers: Vec<u32> = all.iter().map(|p| p.part).collect();
        assert_eq!(numbers, vec![1, 2, 3], "{name}");
    }
}
