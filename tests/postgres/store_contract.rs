//! The storage contract both backends must keep, driven through the `Store` trait with two
//! independent handles on one database, as two relay instances would hold. Runs on SQLite
//! always and on Postgres when `IDEMRELAY_TEST_POSTGRES` names a database.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::backend;
use idemrelay::mail::Fingerprint;
use idemrelay::mail::{BodyType, Envelope};
use idemrelay::store::{
    self, AttemptResult, EventKind, Insert, KeySource, NewRecord, OutcomeKind, Phase, Retention,
    Settle, State, Store, UpstreamEvent, WebhookApplied, WebhookOutcome, WebhookReceipt,
};

const RETENTION: Retention = Retention {
    replay: Duration::from_secs(3600),
    upstream_window: Duration::from_secs(3600),
    parked: Duration::from_secs(3600),
};
const LONG_LEASE: Duration = Duration::from_secs(600);

fn operator() -> store::Operator {
    store::Operator {
        actor: "local user tester".into(),
        reason: "contract test".into(),
    }
}

fn record(id: &str, key: &str, fp: u8) -> NewRecord {
    NewRecord {
        id: id.into(),
        scope: "s".into(),
        key: Some(key.into()),
        key_source: Some(KeySource::Header),
        fingerprint: Fingerprint::from_bytes([fp; 32]),
        envelope: Envelope {
            mail_from: "a@example.com".into(),
            rcpt_to: vec!["b@example.com".into()],
            body: BodyType::SevenBit,
            smtputf8: false,
            requests: Default::default(),
        },
        content: Some(b"Subject: x\r\n\r\nbody\r\n".to_vec()),
        size: 20,
        state: State::Queued,
        reply: format!("250 2.0.0 OK queued as {id}"),
        dsn_of: None,
        part: 1,
        message_fp: Fingerprint::from_bytes([100; 32]),
        upstream_key: Some(key.into()),
        message_id: None,
    }
}

/// Two handles on one fresh store: (name, first, second).
async fn instances(
    dir: &tempfile::TempDir,
    backend: Backend,
) -> Vec<(&'static str, Arc<dyn Store>, Arc<dyn Store>)> {
    instances_with_urls(dir, backend)
        .await
        .into_iter()
        .map(|(name, a, b, _)| (name, a, b))
        .collect()
}

type Instances = Vec<(&'static str, Arc<dyn Store>, Arc<dyn Store>, String)>;

/// `instances`, with the store's URL for SQL from outside.
async fn instances_with_urls(dir: &tempfile::TempDir, backend: Backend) -> Instances {
    let timeout = Duration::from_secs(5);
    let (name, url) = match backend {
        Backend::Sqlite => (
            "sqlite",
            format!("sqlite://{}", dir.path().join("s.db").display()),
        ),
        Backend::Postgres => {
            let base = backend::postgres_base().unwrap_or_else(|| {
                panic!("built for Postgres, but {} is unset", backend::POSTGRES_ENV)
            });
            ("postgres", backend::fresh_schema(&base).await)
        }
    };
    vec![(
        name,
        store::open(&url, timeout).await.unwrap(),
        store::open(&url, timeout).await.unwrap(),
        url,
    )]
}

#[derive(Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// Each contract is two tests, `NAME::sqlite` and `NAME::postgres`; the second is compiled as
/// ignored unless IDEMRELAY_TEST_POSTGRES was set for the build (build.rs), so a run without a
/// database reports it ignored instead of passing it.
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            #[cfg_attr(
                not(idemrelay_test_postgres),
                ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
            )]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await
            }
        }
    };
}

fn accepted() -> AttemptResult {
    AttemptResult {
        outcome: OutcomeKind::Accepted,
        phase: Some(Phase::Dot),
        code: Some(250),
        reply: "250 ok".into(),
    }
}

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

// --- upstream events (webhooks, docs/concepts/webhooks.md) ------------------------------------------------

/// Event times below are offsets from an hour after the first event was made: later than
/// every attempt these tests make, as a real event follows the attempt it reports on. Tests
/// of events from before an attempt give their times from `common::now_ms()` instead.
fn event(kind: EventKind, event_type: &str, at_ms: i64) -> UpstreamEvent {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| common::now_ms() + 3_600_000);
    UpstreamEvent {
        event_type: event_type.into(),
        kind,
        event_time_ms: base + at_ms,
        key: None,
        upstream_id: None,
        message_id: None,
        recipient: Some("b@example.com".into()),
        json: format!("{{\"type\":\"{event_type}\"}}"),
    }
}

fn by_key(mut e: UpstreamEvent, key: &str) -> UpstreamEvent {
    e.key = Some(key.into());
    e
}

fn receipt(webhook_id: &str, events: Vec<UpstreamEvent>) -> WebhookReceipt {
    WebhookReceipt {
        source: "upstream".into(),
        webhook_id: webhook_id.into(),
        events,
    }
}

fn applied(result: WebhookApplied) -> WebhookOutcome {
    match result {
        WebhookApplied::Applied(outcome) => outcome,
        WebhookApplied::Duplicate => panic!("not expected as a duplicate"),
    }
}

/// Claims the next job, which must be `id`, and settles one attempt with `result`.
async fn attempt_once(store: &Arc<dyn Store>, id: &str, result: AttemptResult, settle: Settle) {
    let job = store.claim("w", LONG_LEASE).await.unwrap().unwrap();
    assert_eq!(job.id, id);
    let n = job.attempts + 1;
    assert!(store.begin_attempt(id, job.token, n).await.unwrap());
    assert!(store
        .settle(id, job.token, Some((n, &result)), &settle)
        .await
        .unwrap());
}

/// Inserts `id` under `key` and ends its one attempt UNKNOWN, past the window: unresolved.
async fn unresolved_record(store: &Arc<dyn Store>, id: &str, key: &str) {
    store.insert(&record(id, key, 1), RETENTION).await.unwrap();
    let unknown = AttemptResult {
        outcome: OutcomeKind::Unknown,
        phase: Some(Phase::Dot),
        code: None,
        reply: "connection lost after the final dot".into(),
    };
    let settle = Settle::Unresolved {
        upstream_reply: "unknown past the window".into(),
    };
    attempt_once(store, id, unknown, settle).await;
}

on_both_backends!(a_webhook_id_is_received_once);
/// The same (source, webhook id) again changes nothing, whatever its events say; another
/// source may use the same id.
async fn a_webhook_id_is_received_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances_with_urls(&dir, backend)
        .await
        .into_iter()
        .map(|(n, a, b, _)| (n, a, b))
    {
        unresolved_record(&a, "r1", "k1").await;
        let first = receipt(
            "msg_1",
            vec![by_key(event(EventKind::Bounced, "bounce", 1000), "k1")],
        );
        let outcome = applied(a.apply_webhook(&first).await.unwrap());
        assert_eq!((outcome.matched, outcome.bounced), (1, 1), "{name}");
        // The retry carries an accepted event this time: still a duplicate, nothing changes.
        let again = receipt(
            "msg_1",
            vec![by_key(event(EventKind::Accepted, "delivery", 2000), "k1")],
        );
        assert_eq!(
            b.apply_webhook(&again).await.unwrap(),
            WebhookApplied::Duplicate,
            "{name}"
        );
        assert_eq!(b.events("r1").await.unwrap().len(), 1, "{name}");
        assert_eq!(
            b.message("r1").await.unwrap().unwrap().state,
            State::Unresolved,
            "{name}"
        );
        let other_source = WebhookReceipt {
            source: "other".into(),
            ..again
        };
        assert!(matches!(
            b.apply_webhook(&other_source).await.unwrap(),
            WebhookApplied::Applied(_)
        ));
        let report = b.report(None).await.unwrap();
        assert_eq!(report.iter().map(|d| d.bounced).sum::<u64>(), 1, "{name}");
    }
}

on_both_backends!(an_event_older_than_the_newest_applied_is_stored_not_applied);
/// Out of order per (record, recipient): a delivery, then the older injection.
async fn an_event_older_than_the_newest_applied_is_stored_not_applied(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("r1", "k1", 1), RETENTION).await.unwrap();
        attempt_once(
            &a,
            "r1",
            accepted(),
            Settle::Delivered {
                upstream_reply: "250 ok".into(),
                dsn: None,
            },
        )
        .await;
        let newer = receipt(
            "d",
            vec![by_key(event(EventKind::Accepted, "delivery", 2000), "k1")],
        );
        let older = receipt(
            "i",
            vec![by_key(event(EventKind::Accepted, "injection", 1000), "k1")],
        );
        assert_eq!(applied(a.apply_webhook(&newer).await.unwrap()).stale, 0);
        let outcome = applied(b.apply_webhook(&older).await.unwrap());
        assert_eq!((outcome.matched, outcome.stale), (1, 1), "{name}");
        // Another recipient has a newest event of its own.
        let mut other = by_key(event(EventKind::Bounced, "bounce", 500), "k1");
        other.recipient = Some("c@example.com".into());
        let outcome = applied(b.apply_webhook(&receipt("c", vec![other])).await.unwrap());
        assert_eq!(outcome.stale, 0, "{name}");
        let events = b.events("r1").await.unwrap();
        let seen: Vec<(&str, &str, bool)> = events
            .iter()
            .map(|e| {
                (
                    e.recipient.as_deref().unwrap_or("-"),
                    e.event_type.as_str(),
                    e.applied,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("b@example.com", "injection", false),
                ("b@example.com", "delivery", true),
                ("c@example.com", "bounce", true),
            ],
            "{name}"
        );
    }
}

on_both_backends!(a_batch_is_one_receipt_and_each_event_finds_its_record);
/// One request, several events: matched by upstream id, by key; one naming only a
/// Message-ID and one naming an unknown key match nothing.
async fn a_batch_is_one_receipt_and_each_event_finds_its_record(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("r1", "k1", 1), RETENTION).await.unwrap();
        let ok = AttemptResult {
            reply: "250 2.0.0 Ok: queued as 4F2C81234".into(),
            ..accepted()
        };
        let delivered = Settle::Delivered {
            upstream_reply: ok.reply.clone(),
            dsn: None,
        };
        attempt_once(&a, "r1", ok, delivered).await;
        assert_eq!(
            a.attempts("r1").await.unwrap()[0].upstream_id.as_deref(),
            Some("4F2C81234"),
            "{name}"
        );
        // Two parts of one message share its Message-ID; each holds its own recipient.
        for (id, key, rcpt) in [
            ("p1", "kp1", "x@example.com"),
            ("p2", "kp2", "y@example.com"),
        ] {
            let mut part = record(id, key, 2);
            part.envelope.rcpt_to = vec![rcpt.into()];
            part.message_id = Some("shared@example.com".into());
            a.insert(&part, RETENTION).await.unwrap();
        }
        let mut by_id = event(EventKind::Accepted, "delivery", 1000);
        by_id.upstream_id = Some("4F2C81234".into());
        let mut by_mid = event(EventKind::Bounced, "bounce", 1000);
        by_mid.message_id = Some("shared@example.com".into());
        by_mid.recipient = Some("y@example.com".into());
        let nothing = by_key(event(EventKind::Other, "open", 1000), "nobody");
        let batch = receipt(
            "batch",
            vec![
                by_id,
                by_key(event(EventKind::Other, "open", 900), "k1"),
                by_mid,
                nothing,
            ],
        );
        let outcome = applied(b.apply_webhook(&batch).await.unwrap());
        assert_eq!(
            (
                outcome.events,
                outcome.matched,
                outcome.unmatched,
                outcome.bounced
            ),
            (4, 2, 2, 0),
            "{name}"
        );
        assert_eq!(b.events("r1").await.unwrap().len(), 2, "{name}");
        // A Message-ID alone names no record: kept unmatched, whichever part holds the
        // recipient.
        assert_eq!(b.events("p1").await.unwrap().len(), 0, "{name}");
        assert_eq!(b.events("p2").await.unwrap().len(), 0, "{name}");
        assert_eq!(b.queue_stats().await.unwrap().unmatched_events, 2, "{name}");
    }
}

on_both_backends!(an_event_kept_unmatched_is_matched_when_its_record_becomes_known);
/// The race with the final dot's reply: events that arrive before their record is known by
/// the identifier they carry are matched by the accepted attempt (the upstream's id), and
/// resolve a record the moment it is settled unresolved.
async fn an_event_kept_unmatched_is_matched_when_its_record_becomes_known(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        // By the upstream's id, once the attempt is settled.
        let mut early = event(EventKind::Accepted, "injection", 1000);
        early.upstream_id = Some("S0001".into());
        let outcome = applied(b.apply_webhook(&receipt("w1", vec![early])).await.unwrap());
        assert_eq!(outcome.unmatched, 1, "{name}");
        assert_eq!(a.queue_stats().await.unwrap().unmatched_events, 1, "{name}");
        a.insert(&record("r1", "k1", 1), RETENTION).await.unwrap();
        assert!(a.events("r1").await.unwrap().is_empty(), "{name}");
        let ok = AttemptResult {
            reply: "250 2.0.0 OK S0001".into(),
            ..accepted()
        };
        let settle = Settle::Delivered {
            upstream_reply: ok.reply.clone(),
            dsn: None,
        };
        attempt_once(&a, "r1", ok, settle).await;
        let events = b.events("r1").await.unwrap();
        assert_eq!((events.len(), events[0].applied), (1, true), "{name}");

        // By key, and the record is unresolved later: resolved at once, by that event.
        let injection = by_key(event(EventKind::Accepted, "injection", 1000), "k3");
        b.apply_webhook(&receipt("w3", vec![injection]))
            .await
            .unwrap();
        unresolved_record(&a, "r3", "k3").await;
        let r3 = b.message("r3").await.unwrap().unwrap();
        assert_eq!(r3.state, State::Delivered, "{name}");
        assert_eq!(
            r3.resolved_by.as_deref(),
            Some("upstream/w3#0 injection"),
            "{name}"
        );
        assert!(b.events("r3").await.unwrap()[0].evidence, "{name}");
        // Never by Message-ID, and never at the insert (no attempt yet: nothing to report).
        let mut by_mid = event(EventKind::Accepted, "injection", 1000);
        by_mid.message_id = Some("m2@example.com".into());
        b.apply_webhook(&receipt("w2", vec![by_mid])).await.unwrap();
        let mut r2 = record("r2", "k2", 2);
        r2.message_id = Some("m2@example.com".into());
        a.insert(&r2, RETENTION).await.unwrap();
        assert_eq!(b.events("r2").await.unwrap().len(), 0, "{name}");
        assert_eq!(b.message("r2").await.unwrap().unwrap().state, State::Queued);
        assert_eq!(b.queue_stats().await.unwrap().unmatched_events, 1, "{name}");
    }
}

on_both_backends!(an_accepted_event_resolves_an_unresolved_record_and_names_itself);
async fn an_accepted_event_resolves_an_unresolved_record_and_names_itself(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        unresolved_record(&a, "r1", "k1").await;
        // A type that proves nothing leaves it unresolved.
        let open = by_key(event(EventKind::Other, "open", 1000), "k1");
        let outcome = applied(b.apply_webhook(&receipt("o", vec![open])).await.unwrap());
        assert!(outcome.resolved.is_empty(), "{name}");
        let delivery = by_key(event(EventKind::Accepted, "delivery", 2000), "k1");
        let outcome = applied(
            b.apply_webhook(&receipt("d", vec![delivery]))
                .await
                .unwrap(),
        );
        assert_eq!(outcome.resolved.len(), 1, "{name}");
        assert_eq!(outcome.resolved[0].id, "r1");
        assert_eq!(outcome.resolved[0].evidence, "upstream/d#0 delivery");
        let m = a.message("r1").await.unwrap().unwrap();
        assert_eq!(m.state, State::Delivered, "{name}");
        assert_eq!(m.resolved_by.as_deref(), Some("upstream/d#0 delivery"));
        let reply = m.upstream_reply.unwrap();
        assert!(
            reply.starts_with("delivered by upstream event upstream/d#0 delivery"),
            "{name}: {reply}"
        );
        assert!(m.finished_at_ms.is_some());
        // A second accepted event changes nothing more.
        let again = by_key(event(EventKind::Accepted, "delivery", 3000), "k1");
        let outcome = applied(b.apply_webhook(&receipt("d2", vec![again])).await.unwrap());
        assert!(outcome.resolved.is_empty(), "{name}");
        let report = a.report(None).await.unwrap();
        let sum = |f: fn(&store::DailyCounts) -> u64| report.iter().map(f).sum::<u64>();
        assert_eq!(sum(|d| d.resolved_by_event), 1, "{name}");
        assert_eq!(sum(|d| d.unresolved), 1, "{name}");
        assert_eq!(sum(|d| d.delivered), 1, "{name}");
        assert_eq!(
            a.list(Some(State::Unresolved), 10, None)
                .await
                .unwrap()
                .len(),
            0,
            "{name}: the unresolved list shrank by itself"
        );
    }
}

on_both_backends!(an_event_resolves_only_the_record_it_names_and_not_before_it);
/// An event belongs to a record only when its key is the record's upstream key or its
/// upstream id one of the record's attempts', nothing it names contradicts the record, and it
/// is not older than the record's first attempt: sharing a Message-ID, naming another key or
/// upstream id, or predating the record never resolves it, whether the event arrives after
/// the record parked or was kept from before.
async fn an_event_resolves_only_the_record_it_names_and_not_before_it(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let day = 86_400_000;
        let now = common::now_ms();
        // A day-old event of a key not stored yet, kept unmatched.
        let early = by_key(event(EventKind::Accepted, "delivery", 0), "order-3");
        let early = UpstreamEvent {
            event_time_ms: now - day,
            ..early
        };
        let kept = applied(
            b.apply_webhook(&receipt("early", vec![early]))
                .await
                .unwrap(),
        );
        assert_eq!(kept.unmatched, 1, "{name}");

        // order-2 parks unresolved; order-1 was delivered with an upstream id.
        let mut two = record("r2", "order-2", 2);
        two.message_id = Some("shared@example.com".into());
        a.insert(&two, RETENTION).await.unwrap();
        let unknown = AttemptResult {
            outcome: OutcomeKind::Unknown,
            phase: Some(Phase::Dot),
            code: None,
            reply: "connection lost after the final dot".into(),
        };
        let park = Settle::Unresolved {
            upstream_reply: "unknown past the window".into(),
        };
        attempt_once(&a, "r2", unknown.clone(), park.clone()).await;
        let mut one = record("r1", "order-1", 1);
        one.message_id = Some("shared@example.com".into());
        a.insert(&one, RETENTION).await.unwrap();
        let ok = AttemptResult {
            reply: "250 2.0.0 OK U0001".into(),
            ..accepted()
        };
        let delivered = Settle::Delivered {
            upstream_reply: ok.reply.clone(),
            dsn: None,
        };
        attempt_once(&a, "r1", ok, delivered).await;
        unresolved_record(&a, "r3", "order-3").await;
        for id in ["r2", "r3"] {
            assert_eq!(
                b.message(id).await.unwrap().unwrap().state,
                State::Unresolved,
                "{name}: {id} resolved by an event kept from before its first attempt"
            );
        }

        // Events that do not belong to r2, each an accepted type.
        let mut older_of_one = by_key(event(EventKind::Accepted, "delivery", 0), "order-1");
        older_of_one.event_time_ms = now - day;
        older_of_one.message_id = Some("shared@example.com".into());
        let mut only_message_id = event(EventKind::Accepted, "delivery", 10);
        only_message_id.message_id = Some("shared@example.com".into());
        let mut other_key_and_id = by_key(event(EventKind::Accepted, "delivery", 20), "order-9");
        other_key_and_id.upstream_id = Some("U0009".into());
        let mut its_key_but_ones_id = by_key(event(EventKind::Accepted, "delivery", 30), "order-2");
        its_key_but_ones_id.upstream_id = Some("U0001".into());
        let mut its_key_but_too_old = by_key(event(EventKind::Accepted, "delivery", 0), "order-2");
        its_key_but_too_old.event_time_ms = now - day;
        let outcome = applied(
            b.apply_webhook(&receipt(
                "strangers",
                vec![
                    older_of_one,
                    only_message_id,
                    other_key_and_id,
                    its_key_but_ones_id,
                    its_key_but_too_old,
                ],
            ))
            .await
            .unwrap(),
        );
        assert!(outcome.resolved.is_empty(), "{name}: {outcome:?}");
        assert_eq!(
            b.message("r2").await.unwrap().unwrap().state,
            State::Unresolved,
            "{name}"
        );
        assert!(b.events("r2").await.unwrap().is_empty(), "{name}");
        // The older event of order-1 names order-1 but predates its first attempt too.
        assert!(b.events("r1").await.unwrap().is_empty(), "{name}");

        // One that names r2's key and is newer than its first attempt resolves it.
        let mine = by_key(event(EventKind::Accepted, "delivery", 40), "order-2");
        let outcome = applied(b.apply_webhook(&receipt("mine", vec![mine])).await.unwrap());
        assert_eq!(outcome.resolved.len(), 1, "{name}: {outcome:?}");
        assert_eq!(outcome.resolved[0].id, "r2", "{name}");
        assert_eq!(
            b.message("r2").await.unwrap().unwrap().state,
            State::Delivered,
            "{name}"
        );
        assert_eq!(
            b.message("r3").await.unwrap().unwrap().state,
            State::Unresolved,
            "{name}"
        );
    }
}

on_both_backends!(queue_stats_count_queued_records_per_scope);
/// The per-scope queue depth behind `idemrelay_queued_by_scope`: queued records only, each
/// scope once, scopes with nothing queued left out.
async fn queue_stats_count_queued_records_per_scope(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, _b) in instances(&dir, backend).await {
        let in_scope = |id: &str, scope: &str, fp: u8| NewRecord {
            scope: scope.into(),
            ..record(id, &format!("k-{id}"), fp)
        };
        // Delivered records in "t" and "u" first: only queued ones count.
        for (id, scope, fp) in [("done", "t", 1), ("gone", "u", 5)] {
            a.insert(&in_scope(id, scope, fp), RETENTION).await.unwrap();
            attempt_once(
                &a,
                id,
                accepted(),
                Settle::Delivered {
                    upstream_reply: "250 ok".into(),
                    dsn: None,
                },
            )
            .await;
        }
        for (id, scope, fp) in [("s1", "s", 2), ("s2", "s", 3), ("t1", "t", 4)] {
            a.insert(&in_scope(id, scope, fp), RETENTION).await.unwrap();
        }
        let mut by_scope = a.queue_stats().await.unwrap().queued_by_scope;
        by_scope.sort();
        assert_eq!(
            by_scope,
            vec![("s".to_string(), 2), ("t".to_string(), 1)],
            "{name}"
        );
    }
}

/// A record with an id in the relay's form (acceptance time first), so that listings order
/// and bound it as they do real ones.
fn listed_record(n: u8, scope: &str, from: &str, rcpt: &[&str]) -> NewRecord {
    let mut r = record(
        &format!("{:011X}{:013X}", common::now_ms(), n),
        &format!("k{n}"),
        n,
    );
    r.scope = scope.into();
    r.envelope.mail_from = from.into();
    r.envelope.rcpt_to = rcpt.iter().map(|s| s.to_string()).collect();
    r.message_id = Some(format!("m{n}@example.com"));
    r
}

fn ids(page: &store::Page) -> Vec<String> {
    page.records.iter().map(|r| r.id.clone()).collect()
}

on_both_backends!(listings_filter_page_and_say_when_more_follow);
/// `queue list` / `GET /api/v1/messages`: every filter, both orders, and a cursor that walks
/// the pages once; a cursor is opaque and belongs to its order.
async fn listings_filter_page_and_say_when_more_follow(backend: Backend) {
    use store::{Cursor, ListFilter, StateFilter};
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let r1 = listed_record(1, "s", "a@example.com", &["b@example.com"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let r2 = listed_record(2, "t", "x@example.com", &["C@Example.com", "d@example.com"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let r3 = listed_record(3, "s", "y@example.com", &["b@example.com"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let r4 = listed_record(4, "s", "z@example.com", &["e@example.com"]);
        for r in [&r1, &r2, &r3, &r4] {
            a.insert(r, RETENTION).await.unwrap();
        }
        let all = vec![r1.id.clone(), r2.id.clone(), r3.id.clone(), r4.id.clone()];
        // r4 fails once (transient) and waits an hour: deferred.
        let mut job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        while job.id != r4.id {
            a.release(&job.id, job.token, Duration::ZERO).await.unwrap();
            job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        }
        assert!(a.begin_attempt(&r4.id, job.token, 1).await.unwrap());
        let transient = AttemptResult {
            outcome: OutcomeKind::Transient,
            phase: Some(Phase::Connect),
            code: None,
            reply: "connection refused".into(),
        };
        let retry = Settle::Retry {
            after: Duration::from_secs(3600),
            dsn: None,
        };
        assert!(a
            .settle(&r4.id, job.token, Some((1, &transient)), &retry)
            .await
            .unwrap());

        let find = |f: ListFilter| {
            let b = b.clone();
            async move { b.list_page(&ListFilter { limit: 100, ..f }).await.unwrap() }
        };
        let everything = find(ListFilter::default()).await;
        assert_eq!(ids(&everything), all, "{name}");
        assert_eq!(everything.next_cursor, None, "{name}");
        let by = |f: ListFilter| {
            let find = &find;
            async move { ids(&find(f).await) }
        };
        let state = |s| ListFilter {
            state: Some(s),
            ..ListFilter::default()
        };
        assert_eq!(
            by(state(StateFilter::Is(State::Queued))).await,
            all,
            "{name}"
        );
        assert_eq!(
            by(state(StateFilter::Deferred)).await,
            std::slice::from_ref(&r4.id),
            "{name}"
        );
        assert_eq!(
            by(state(StateFilter::Is(State::Delivered))).await,
            Vec::<String>::new(),
            "{name}"
        );
        let filters = [
            (
                ListFilter {
                    scope: Some("t".into()),
                    ..ListFilter::default()
                },
                vec![&r2],
            ),
            (
                ListFilter {
                    key: Some("k3".into()),
                    ..ListFilter::default()
                },
                vec![&r3],
            ),
            (
                ListFilter {
                    sender: Some("A@EXAMPLE.COM".into()),
                    ..ListFilter::default()
                },
                vec![&r1],
            ),
            (
                ListFilter {
                    recipient: Some("c@example.com".into()),
                    ..ListFilter::default()
                },
                vec![&r2],
            ),
            (
                ListFilter {
                    recipient: Some("b@example.com".into()),
                    scope: Some("s".into()),
                    ..ListFilter::default()
                },
                vec![&r1, &r3],
            ),
            // A recipient matches a whole address, never a part of one.
            (
                ListFilter {
                    recipient: Some("example.com".into()),
                    ..ListFilter::default()
                },
                vec![],
            ),
            (
                ListFilter {
                    message_id: Some("<m3@example.com>".into()),
                    ..ListFilter::default()
                },
                vec![&r3],
            ),
        ];
        for (filter, want) in filters {
            let want: Vec<String> = want.iter().map(|r| r.id.clone()).collect();
            assert_eq!(by(filter.clone()).await, want, "{name}: {filter:?}");
        }
        // Time ranges on acceptance.
        let at: Vec<i64> = everything
            .records
            .iter()
            .map(|r| r.accepted_at_ms)
            .collect();
        let range = ListFilter {
            since_ms: Some(at[1]),
            until_ms: Some(at[2] + 1),
            ..ListFilter::default()
        };
        // Records accepted in the same millisecond as the third fall inside the range too.
        let in_range: Vec<String> = everything
            .records
            .iter()
            .filter(|r| r.accepted_at_ms >= at[1] && r.accepted_at_ms < at[2] + 1)
            .map(|r| r.id.clone())
            .collect();
        assert!(
            in_range.contains(&all[1]) && in_range.contains(&all[2]),
            "{name}: {at:?}"
        );
        assert!(
            !in_range.contains(&all[0]) || at[0] == at[1],
            "{name}: {at:?}"
        );
        assert_eq!(by(range).await, in_range, "{name}: {at:?}");

        // What a listing tells about a record.
        let r4_row = &everything.records[3];
        assert_eq!(r4_row.failed_attempts, 1, "{name}");
        assert_eq!(r4_row.rcpt_to, ["e@example.com"], "{name}");
        assert_eq!(
            r4_row.message_id.as_deref(),
            Some("m4@example.com"),
            "{name}"
        );
        let due = r4_row.next_attempt_at_ms.unwrap();
        assert!(due > r4_row.read_at_ms + 3_500_000, "{name}: {due}");
        assert!(!r4_row.leased, "{name}");

        // Pages of two, both orders; the cursor survives being a string.
        for newest_first in [false, true] {
            let mut seen = Vec::new();
            let mut cursor = None;
            for _ in 0..4 {
                let filter = ListFilter {
                    newest_first,
                    limit: 2,
                    cursor: cursor.clone(),
                    ..ListFilter::default()
                };
                let page = b.list_page(&filter).await.unwrap();
                seen.extend(ids(&page));
                match page.next_cursor {
                    Some(next) => cursor = Some(Cursor::decode(&next.encode()).unwrap()),
                    None => break,
                }
            }
            let mut want = all.clone();
            if newest_first {
                want.reverse();
            }
            assert_eq!(seen, want, "{name}: newest first {newest_first}");
        }
        let oldest_cursor = b
            .list_page(&ListFilter::all(1))
            .await
            .unwrap()
            .next_cursor
            .unwrap();
        let mixed = ListFilter {
            newest_first: true,
            cursor: Some(oldest_cursor),
            ..ListFilter::all(1)
        };
        assert!(
            matches!(
                b.list_page(&mixed).await,
                Err(store::StoreError::InvalidFilter(_))
            ),
            "{name}"
        );
        assert!(Cursor::decode("not-a-cursor").is_err());
        // The compatibility listing by state and id still pages.
        assert_eq!(
            b.list(None, 2, Some(&all[1])).await.unwrap().len(),
            2,
            "{name}"
        );
    }
}

on_both_backends!(operator_actions_are_recorded_with_the_change_they_made);
/// Cancel, retry and flush write their action row (who, why) in the same commit as the
/// change; relay-wide actions are kept apart; a DSN and its record link both ways.
async fn operator_actions_are_recorded_with_the_change_they_made(backend: Backend) {
    use store::{Action, Flush, Requeue};
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let by = operator();
        a.insert(&record("q1", "k1", 1), RETENTION).await.unwrap();
        a.insert(&record("q2", "k2", 2), RETENTION).await.unwrap();
        let job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        let (held, free) = if job.id == "q1" {
            ("q1", "q2")
        } else {
            ("q2", "q1")
        };
        assert_eq!(b.flush(held, &by).await.unwrap(), Flush::Leased, "{name}");
        assert!(b.message(held).await.unwrap().unwrap().leased, "{name}");
        assert!(matches!(
            b.flush(free, &by).await.unwrap(),
            Flush::Flushed { .. }
        ));
        // The held one fails once and waits an hour; a flush makes it due now.
        assert!(a.begin_attempt(held, job.token, 1).await.unwrap());
        let transient = AttemptResult {
            outcome: OutcomeKind::Transient,
            phase: Some(Phase::Connect),
            code: None,
            reply: "connection refused".into(),
        };
        let hour = Settle::Retry {
            after: Duration::from_secs(3600),
            dsn: None,
        };
        assert!(a
            .settle(held, job.token, Some((1, &transient)), &hour)
            .await
            .unwrap());
        let waiting = b.message(held).await.unwrap().unwrap();
        let due = waiting.next_attempt_at_ms.unwrap();
        assert!(due > common::now_ms() + 3_500_000, "{name}");
        match b.flush(held, &by).await.unwrap() {
            Flush::Flushed { was_due_at_ms } => assert_eq!(was_due_at_ms, due, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        let now_due = b.message(held).await.unwrap().unwrap();
        assert!(
            now_due.next_attempt_at_ms.unwrap() <= common::now_ms(),
            "{name}"
        );
        // The refused flush (leased) left no row.
        let history = &now_due.history;
        assert_eq!(history.len(), 1, "{name}: {history:?}");
        assert_eq!(
            (history[0].action.as_str(), history[0].actor.as_str()),
            ("flush", "local user tester"),
            "{name}"
        );
        assert!(
            history[0]
                .detail
                .as_deref()
                .unwrap_or_default()
                .starts_with("was due in"),
            "{name}: {history:?}"
        );
        assert_eq!(history[0].reason, "contract test", "{name}");
        assert_eq!(history[0].record_id.as_deref(), Some(held), "{name}");

        // flush --all takes what is not due yet and not leased.
        let job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        assert!(a.settle(&job.id, job.token, None, &hour).await.unwrap());
        assert_eq!(
            b.flush_all(&by).await.unwrap(),
            std::slice::from_ref(&job.id),
            "{name}"
        );
        assert_eq!(
            b.flush_all(&by).await.unwrap(),
            Vec::<String>::new(),
            "{name}"
        );

        // Cancel: a state of its own, counted apart, retryable, all on record.
        assert!(b.cancel(free, &by).await.unwrap(), "{name}");
        let cancelled = b.message(free).await.unwrap().unwrap();
        assert_eq!(cancelled.state, State::Cancelled, "{name}");
        assert_eq!(
            b.flush(free, &by).await.unwrap(),
            Flush::NotQueued(State::Cancelled),
            "{name}"
        );
        assert_eq!(
            b.flush("nope", &by).await.unwrap(),
            Flush::NotFound,
            "{name}"
        );
        let stats = b.queue_stats().await.unwrap();
        assert!(
            stats.by_state.contains(&(State::Cancelled, 1)),
            "{name}: {stats:?}"
        );
        let today = b.report(None).await.unwrap();
        assert_eq!(
            (today[0].cancelled, today[0].failed),
            (1, 0),
            "{name}: {today:?}"
        );
        assert_eq!(
            b.requeue(free, false, &by).await.unwrap(),
            Requeue::Requeued,
            "{name}"
        );
        let actions: Vec<(String, Option<String>)> = b
            .message(free)
            .await
            .unwrap()
            .unwrap()
            .history
            .into_iter()
            .map(|h| (h.action, h.detail))
            .collect();
        let want: Vec<(String, Option<String>)> = vec![
            ("flush".into(), Some("was already due".into())),
            ("cancel".into(), None),
            ("retry".into(), Some("requeued from cancelled".into())),
        ];
        // flush_all may have taken this one too (it was the one not due yet).
        let actions: Vec<_> = actions
            .into_iter()
            .filter(|(a, d)| !(a == "flush" && d.as_deref() != Some("was already due")))
            .collect();
        assert_eq!(actions, want, "{name}");

        // Relay-wide actions are not any record's.
        b.record_action(Action::Pause, &by, None).await.unwrap();
        b.record_action(Action::Purge, &by, Some("purged 0 expired record(s)"))
            .await
            .unwrap();
        let relay: Vec<String> = a
            .relay_actions(10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.action)
            .collect();
        // The two flushes of every waiting record are one relay-wide action each.
        assert_eq!(
            relay,
            ["purge", "pause", "flush", "flush"],
            "{name}: newest first"
        );

        // A DSN and the record it reports on.
        let mut dsn = record("dsn1", "k-dsn", 9);
        dsn.dsn_of = Some(held.into());
        a.insert(&dsn, RETENTION).await.unwrap();
        assert_eq!(
            b.message(held).await.unwrap().unwrap().dsns,
            ["dsn1"],
            "{name}"
        );
        assert_eq!(
            b.message("dsn1").await.unwrap().unwrap().dsn_of.as_deref(),
            Some(held),
            "{name}"
        );

        // Relay-wide actions are kept as long as parked records, then purged.
        b.purge_expired(RETENTION).await.unwrap();
        assert_eq!(a.relay_actions(10).await.unwrap().len(), 4, "{name}");
        tokio::time::sleep(Duration::from_millis(5)).await;
        b.purge_expired(Retention::flat(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(a.relay_actions(10).await.unwrap(), [], "{name}");
        assert!(
            !b.message(held).await.unwrap().unwrap().history.is_empty(),
            "{name}: a queued record keeps its history"
        );
    }
}

on_both_backends!(a_bulk_cancel_is_one_action_and_leaves_what_it_cannot_cancel);
/// `cancel_all` cancels the queued records no worker holds, in one commit with ONE relay-wide
/// action row carrying the count, and none per record.
async fn a_bulk_cancel_is_one_action_and_leaves_what_it_cannot_cancel(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let by = operator();
        for (n, id) in ["q1", "q2", "q3"].iter().enumerate() {
            a.insert(&record(id, &format!("k{n}"), n as u8), RETENTION)
                .await
                .unwrap();
        }
        let held = a.claim("w", LONG_LEASE).await.unwrap().unwrap().id;
        let ids: Vec<String> = ["q1", "q2", "q3", "nope"].map(String::from).to_vec();
        let cancelled = b
            .cancel_all(&ids, &by, "matching state=queued")
            .await
            .unwrap();
        let want: Vec<String> = ["q1", "q2", "q3"]
            .iter()
            .filter(|id| **id != held)
            .map(|id| id.to_string())
            .collect();
        assert_eq!(cancelled, want, "{name}");
        for id in &want {
            let m = b.message(id).await.unwrap().unwrap();
            assert_eq!(m.state, State::Cancelled, "{name}");
            assert!(m.history.is_empty(), "{name}: {:?}", m.history);
        }
        assert_eq!(
            b.message(&held).await.unwrap().unwrap().state,
            State::Queued,
            "{name}"
        );
        let relay = a.relay_actions(10).await.unwrap();
        assert_eq!(relay.len(), 1, "{name}: {relay:?}");
        assert_eq!(relay[0].action, "cancel", "{name}");
        assert_eq!(
            relay[0].detail.as_deref(),
            Some("cancelled 2 record(s) matching state=queued"),
            "{name}"
        );
    }
}

on_both_backends!(inserts_arriving_together_behave_as_one_after_another);
/// Many sessions' inserts at once (on Postgres they share commits: several records in one
/// transaction): each key is inserted once, and every other insert of it, whether in the same
/// batch or not, finds that record as a sequential insert would, with the same fingerprint
/// (a replay) or not (a reuse of the key).
async fn inserts_arriving_together_behave_as_one_after_another(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, _) in instances(&dir, backend).await {
        let mut tasks = Vec::new();
        for k in 0..30 {
            for copy in 0..3u8 {
                let store = a.clone();
                tasks.push(tokio::spawn(async move {
                    // Copies 0 and 1 are the same message; copy 2 reuses the key.
                    let rec = record(&format!("r{k}-{copy}"), &format!("key-{k}"), copy / 2);
                    (k, store.insert(&rec, RETENTION).await.unwrap())
                }));
            }
        }
        let mut inserted = vec![Vec::new(); 30];
        let mut found = vec![Vec::new(); 30];
        for t in tasks {
            let (k, result) = t.await.unwrap();
            match result {
                Insert::Inserted => inserted[k].push(()),
                Insert::Existing(e) => found[k].push(e),
            }
        }
        for k in 0..30 {
            assert_eq!(inserted[k].len(), 1, "{name}: key-{k}");
            let kept = a.lookup("s", &format!("key-{k}"), RETENTION).await.unwrap();
            assert_eq!(kept.len(), 1, "{name}: key-{k}");
            for existing in &found[k] {
                assert_eq!(existing.len(), 1, "{name}: key-{k}");
                assert_eq!(existing[0].id, kept[0].id, "{name}: key-{k}");
                assert_eq!(existing[0].fingerprint, kept[0].fingerprint, "{name}");
            }
            let job = a.message(&kept[0].id).await.unwrap().unwrap();
            assert!(job.has_job, "{name}: key-{k} is queued with its job");
        }
        assert_eq!(a.list(None, 1000, None).await.unwrap().len(), 30, "{name}");
        // Counted once each, whichever transaction and counter shard they went in with.
        let days = a.report(None).await.unwrap();
        let accepted: u64 = days.iter().map(|d| d.accepted).sum();
        assert_eq!(accepted, 30, "{name}");
    }
}

on_both_backends!(a_record_the_database_refuses_fails_alone);
/// A record Postgres refuses (text with a NUL byte) among others arriving at the same time:
/// it fails, and only it; every other is inserted and stays. SQLite stores such text, so
/// there all are inserted.
async fn a_record_the_database_refuses_fails_alone(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let mut tasks = Vec::new();
        for k in 0..20 {
            let store = a.clone();
            tasks.push(tokio::spawn(async move {
                let mut rec = record(&format!("r{k}"), &format!("key-{k}"), 1);
                if k == 10 {
                    rec.envelope.mail_from = "nul\0@example.com".into();
                }
                (k, store.insert(&rec, RETENTION).await)
            }));
        }
        for t in tasks {
            let (k, result) = t.await.unwrap();
            let refused = k == 10 && name == "postgres";
            assert_eq!(result.is_err(), refused, "{name}: r{k}: {result:?}");
            let stored = b.message(&format!("r{k}")).await.unwrap();
            assert_eq!(stored.is_none(), refused, "{name}: r{k}");
        }
    }
}

/// The before-queue mode's writes: leasing one record by id, and settling it with the reply
/// its client heard.
mod immediate;

#[path = "store_contract_delay.rs"]
mod delay_notice;
