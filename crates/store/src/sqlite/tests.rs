//! The SQLite backend's own tests (the contract both backends keep is in
//! tests/postgres/store_contract.rs).

use super::*;
use crate::test_record as record;
use crate::*;

mod upgrades;

const LEASE: Duration = Duration::from_secs(60);

#[test]
fn a_sibling_is_reported_once_its_heartbeat_moves() {
    let mut siblings = Siblings::default();
    let beat = |pairs: &[(&str, i64)]| -> Vec<(String, i64)> {
        pairs.iter().map(|(id, t)| (id.to_string(), *t)).collect()
    };
    // First look: a row is no evidence of life (it may be a relay killed just now).
    assert!(siblings
        .alive(beat(&[("dead", 100), ("live", 100)]))
        .is_empty());
    // The live one's heartbeat moves on, the dead one's does not; a newcomer appears.
    assert_eq!(
        siblings.alive(beat(&[("dead", 100), ("live", 1100), ("new", 1000)])),
        ["live"]
    );
    // Once per process, however long it runs.
    assert_eq!(
        siblings.alive(beat(&[("dead", 100), ("live", 2100), ("new", 2000)])),
        ["new"]
    );
    assert!(siblings
        .alive(beat(&[("live", 3100), ("new", 3000)]))
        .is_empty());
}

#[tokio::test]
async fn heartbeats_list_the_other_processes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    store.heartbeat("a/1/01").await.unwrap();
    store.heartbeat("b/1/02").await.unwrap();
    let others = store
        .writer
        .write(|conn| queue::heartbeat(conn, "a/1/01"))
        .await
        .unwrap();
    assert_eq!(
        others.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["b/1/02"]
    );
}

/// The dead-lease check walks the leased jobs, not the queue: on a 500,000-job queue a scan
/// held the writer for 83-238 ms every two seconds.
#[tokio::test]
async fn the_dead_lease_check_reads_only_leased_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let plan = store
        .writer
        .write(|conn| {
            let mut stmt = conn.prepare(&format!(
                "EXPLAIN QUERY PLAN {}",
                queue::RECLAIM_DEAD_LEASES
            ))?;
            let rows = stmt.query_map([0i64, 0i64], |row| row.get::<_, String>(3))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
        .unwrap();
    let delivery_jobs: Vec<&String> = plan
        .iter()
        .filter(|d| d.contains("delivery_jobs"))
        .collect();
    assert!(
        delivery_jobs
            .iter()
            .all(|d| d.contains("USING INDEX delivery_jobs_leased")),
        "{plan:?}"
    );
    assert!(!delivery_jobs.is_empty(), "{plan:?}");
}

/// The retention purge bounds the replayed records by the `(state, accepted_at)` index instead
/// of reading every finished record: 1 s on a million-record store, in the one writer, at
/// start and every `purge_interval`.
#[tokio::test]
async fn the_purge_reads_only_expired_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let plan = store
        .writer
        .write(|conn| {
            let mut stmt =
                conn.prepare(&format!("EXPLAIN QUERY PLAN {}", operator::purge_sql()))?;
            let rows = stmt.query_map([0i64, 0, 0, 0], |row| row.get::<_, String>(3))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
        .unwrap();
    assert!(
        plan.iter()
            .any(|d| d.contains("messages_state_accepted (state=? AND accepted_at<?)")),
        "{plan:?}"
    );
}

fn op() -> Operator {
    Operator {
        actor: "test".into(),
        reason: "because".into(),
    }
}

async fn store(dir: &tempfile::TempDir) -> SqliteStore {
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    SqliteStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap()
}

fn large(id: &str, key: &str, fill: u8) -> NewRecord {
    let mut body = b"Subject: big\r\n\r\n".to_vec();
    body.resize(super::spool::SPOOL_MIN + 1000, fill);
    body.extend_from_slice(b"\r\n");
    NewRecord {
        size: body.len(),
        content: Some(body),
        ..record(id, key)
    }
}

fn segments(dir: &tempfile::TempDir) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("t.db.spool"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_large_body_is_spooled_and_read_back_exactly_by_claims_and_lookups() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let retention = Retention::flat(Duration::from_secs(3600));
    let big = large("m1", "k1", b'a');
    store.insert(&big, retention).await.unwrap();
    store.insert(&record("m2", "k2"), retention).await.unwrap();
    // A replay of the key appends nothing.
    let replay = large("m3", "k1", b'b');
    assert!(matches!(
        store.insert(&replay, retention).await.unwrap(),
        Insert::Existing(_)
    ));
    let (inline, segment, offset): (Option<Vec<u8>>, Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT content, spool_segment, spool_offset FROM messages WHERE id = 'm1'")
            .fetch_one(&store.pool)
            .await
            .unwrap();
    assert_eq!((inline, segment, offset), (None, Some(1), Some(0)));
    let small: Option<i64> =
        sqlx::query_scalar("SELECT spool_segment FROM messages WHERE id = 'm2'")
            .fetch_one(&store.pool)
            .await
            .unwrap();
    assert_eq!(small, None, "a small body stays inline");
    let len = std::fs::metadata(dir.path().join("t.db.spool/0000000000000001.seg"))
        .unwrap()
        .len();
    assert_eq!(len, big.size as u64, "the replay appended nothing");

    assert_eq!(
        store.message("m1").await.unwrap().unwrap().content,
        big.content
    );
    let job = store.claim("w", LEASE).await.unwrap().unwrap();
    assert_eq!(
        (job.id.as_str(), Some(&job.content)),
        ("m1", big.content.as_ref())
    );
    let failed = Settle::Failed {
        upstream_reply: "550 no".into(),
        dsn: None,
    };
    assert!(store.settle("m1", job.token, None, &failed).await.unwrap());
    assert_eq!(
        store.requeue("m1", false, &op()).await.unwrap(),
        Requeue::Requeued,
        "a spooled body counts as stored content"
    );
}

#[tokio::test]
async fn a_sealed_segment_is_removed_once_no_row_points_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Retention::flat(Duration::from_secs(3600));
    {
        let store = store(&dir).await;
        store
            .insert(&large("m1", "k1", b'a'), retention)
            .await
            .unwrap();
        store
            .insert(&large("m2", "k2", b'b'), retention)
            .await
            .unwrap();
        deliver(&store, "m1").await;
    }
    // A new process spools into segment 2 and may collect segment 1.
    let store = store(&dir).await;
    store
        .insert(&large("m3", "k3", b'c'), retention)
        .await
        .unwrap();
    assert_eq!(
        segments(&dir),
        ["0000000000000001.seg", "0000000000000002.seg"]
    );
    // m2 is still queued and points into segment 1: nothing is removed.
    assert_eq!(
        store
            .purge_expired(Retention::flat(Duration::ZERO))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        segments(&dir),
        ["0000000000000001.seg", "0000000000000002.seg"]
    );
    assert_eq!(
        store.message("m2").await.unwrap().unwrap().content,
        large("m2", "k2", b'b').content
    );
    deliver(&store, "m2").await;
    assert_eq!(
        store
            .purge_expired(Retention::flat(Duration::ZERO))
            .await
            .unwrap(),
        1
    );
    // Segment 2 is still open (and m3 points into it): only segment 1 goes.
    assert_eq!(segments(&dir), ["0000000000000002.seg"]);
    assert_eq!(
        store.message("m3").await.unwrap().unwrap().content,
        large("m3", "k3", b'c').content
    );
}

/// Flips one byte of a stored body where it lives: in its spool segment or inline.
async fn flip_a_byte(store: &SqliteStore, dir: &tempfile::TempDir, id: &str) {
    let (segment, offset): (Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT spool_segment, spool_offset FROM messages WHERE id = ?")
            .bind(id)
            .fetch_one(&store.pool)
            .await
            .unwrap();
    match (segment, offset) {
        (Some(segment), Some(offset)) => {
            use std::os::unix::fs::FileExt;
            let path = dir.path().join(format!("t.db.spool/{segment:016}.seg"));
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.write_all_at(b"X", offset as u64 + 100).unwrap();
        }
        _ => {
            sqlx::query(
                "UPDATE messages SET content = CAST(replace(CAST(content AS TEXT), 'body', 'bodY') AS BLOB) WHERE id = ?",
            )
            .bind(id)
            .execute(&store.pool)
            .await
            .unwrap();
        }
    }
}

#[tokio::test]
async fn a_damaged_body_is_marked_failed_never_handed_out_and_the_queue_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let retention = Retention::flat(Duration::from_secs(3600));
    store
        .insert(&large("torn", "k1", b'a'), retention)
        .await
        .unwrap();
    store
        .insert(&record("flipped", "k2"), retention)
        .await
        .unwrap();
    store
        .insert(&large("gone", "k3", b'c'), retention)
        .await
        .unwrap();
    store
        .insert(&record("good", "k4"), retention)
        .await
        .unwrap();
    flip_a_byte(&store, &dir, "torn").await;
    flip_a_byte(&store, &dir, "flipped").await;
    // A body that points past the end of its segment (a torn tail) cannot be read.
    let offset: i64 = sqlx::query_scalar("SELECT spool_offset FROM messages WHERE id = 'gone'")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE messages SET spool_offset = 1000000 WHERE id = 'gone'")
        .execute(&store.pool)
        .await
        .unwrap();

    let job = store.claim("w", LEASE).await.unwrap().unwrap();
    assert_eq!(
        job.id, "good",
        "the damaged records are skipped, not blocking"
    );
    assert!(store.claim("w", LEASE).await.unwrap().is_none());
    for (id, reason) in [
        ("torn", "checksum mismatch"),
        ("flipped", "checksum mismatch"),
        ("gone", "segment 1 at 1000000"),
    ] {
        let m = store.message(id).await.unwrap().unwrap();
        assert_eq!(m.state, State::Failed, "{id}");
        assert!(!m.has_job, "{id}");
        let damage = m.damage.unwrap_or_default();
        assert!(damage.contains(reason), "{id}: {damage}");
        assert!(
            m.upstream_reply
                .unwrap_or_default()
                .contains("not forwarded"),
            "{id}"
        );
    }
    assert_eq!(store.queue_stats().await.unwrap().damaged, 3);
    // Once an operator has restored the body, a requeue clears the mark.
    sqlx::query("UPDATE messages SET spool_offset = ? WHERE id = 'gone'")
        .bind(offset)
        .execute(&store.pool)
        .await
        .unwrap();
    assert_eq!(
        store.requeue("gone", false, &op()).await.unwrap(),
        Requeue::Requeued
    );
    let again = store.claim("w", LEASE).await.unwrap().unwrap();
    assert_eq!(again.id, "gone");
    assert_eq!(Some(again.content), large("gone", "k3", b'c').content);
    assert_eq!(store.message("gone").await.unwrap().unwrap().damage, None);
}

/// A spool read that fails for a reason that is not the bytes (here the segment's path is
/// briefly a directory: the read fails with EISDIR, as one fails with EMFILE when the process
/// is out of file descriptors) is a passing failure: the claim fails, the record stays
/// queued and unmarked, and it is delivered once reads work again.
#[tokio::test]
async fn a_spool_read_that_fails_for_another_reason_than_the_bytes_marks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let retention = Retention::flat(Duration::from_secs(3600));
    store
        .insert(&large("big", "k1", b'a'), retention)
        .await
        .unwrap();
    let segment = dir.path().join("t.db.spool").join(&segments(&dir)[0]);
    let aside = dir.path().join("aside.seg");
    std::fs::rename(&segment, &aside).unwrap();
    std::fs::create_dir(&segment).unwrap();
    assert!(store.claim("w", LEASE).await.is_err(), "the claim fails");
    let m = store.message("big").await;
    std::fs::remove_dir(&segment).unwrap();
    std::fs::rename(&aside, &segment).unwrap();
    let m = m.unwrap_or(None);
    let after = store.message("big").await.unwrap().unwrap();
    assert_eq!(after.state, State::Queued, "{m:?}");
    assert_eq!(after.damage, None);
    assert_eq!(store.queue_stats().await.unwrap().damaged, 0);
    let job = store.claim("w", LEASE).await.unwrap().unwrap();
    assert_eq!(job.id, "big");
    assert_eq!(Some(job.content), large("big", "k1", b'a').content);
}

/// Delivers `id` the way a worker does: leases it, opens the attempt, settles it accepted.
async fn deliver(store: &SqliteStore, id: &str) {
    let job = store.claim_id(id, "w", LEASE).await.unwrap().unwrap();
    let n = job.attempts + 1;
    assert!(store.begin_attempt(id, job.token, n).await.unwrap());
    let accepted = AttemptResult {
        outcome: OutcomeKind::Accepted,
        phase: Some(Phase::Dot),
        code: Some(250),
        reply: "250 ok".into(),
    };
    let delivered = Settle::Delivered {
        upstream_reply: "250 ok".into(),
        dsn: None,
    };
    assert!(store
        .settle(id, job.token, Some((n, &accepted)), &delivered)
        .await
        .unwrap());
}

/// Claims `id` and settles one attempt with `outcome` into `settle`.
async fn attempt(store: &SqliteStore, id: &str, outcome: OutcomeKind, settle: Settle) {
    let job = store.claim("w", LEASE).await.unwrap().unwrap();
    assert_eq!(job.id, id);
    let n = job.attempts + 1;
    assert!(store.begin_attempt(id, job.token, n).await.unwrap());
    let result = AttemptResult {
        outcome,
        phase: Some(Phase::Rcpt),
        code: Some(550),
        reply: "550 no".into(),
    };
    assert!(store
        .settle(id, job.token, Some((n, &result)), &settle)
        .await
        .unwrap());
}

#[tokio::test]
async fn store_requeue_of_failed_keeps_the_ledger_and_continues_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let retention = Retention::flat(Duration::from_secs(3600));
    store.insert(&record("m1", "k1"), retention).await.unwrap();
    let failed = Settle::Failed {
        upstream_reply: "550 no".into(),
        dsn: None,
    };
    attempt(&store, "m1", OutcomeKind::Permanent, failed).await;
    let listed = store.list(Some(State::Failed), 10, None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].attempts, 1);
    assert_eq!(listed[0].last_code, Some(550));
    assert_eq!(listed[0].upstream_reply.as_deref(), Some("550 no"));

    assert_eq!(
        store.requeue("nope", false, &op()).await.unwrap(),
        Requeue::NotFound
    );
    assert_eq!(
        store.requeue("m1", false, &op()).await.unwrap(),
        Requeue::Requeued
    );
    let m = store.message("m1").await.unwrap().unwrap();
    assert_eq!(m.state, State::Queued);
    assert!(m.has_job);
    assert_eq!(m.upstream_reply, None);
    assert_eq!(m.finished_at_ms, None);
    assert_eq!(
        store.requeue("m1", true, &op()).await.unwrap(),
        Requeue::WrongState(State::Queued)
    );
    let job = store.claim("w2", LEASE).await.unwrap().unwrap();
    assert_eq!(job.attempts, 1, "the next attempt is number 2");
}

#[tokio::test]
async fn store_requeue_of_unresolved_needs_confirmation() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    store
        .insert(
            &record("m1", "k1"),
            Retention::flat(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let unresolved = Settle::Unresolved {
        upstream_reply: "unknown".into(),
    };
    attempt(&store, "m1", OutcomeKind::Unknown, unresolved).await;
    assert_eq!(
        store.requeue("m1", false, &op()).await.unwrap(),
        Requeue::NeedsConfirmation(State::Unresolved)
    );
    assert_eq!(
        store.message("m1").await.unwrap().unwrap().state,
        State::Unresolved
    );
    assert_eq!(
        store.requeue("m1", true, &op()).await.unwrap(),
        Requeue::Requeued
    );
    assert_eq!(
        store.message("m1").await.unwrap().unwrap().state,
        State::Queued
    );
}

#[tokio::test]
async fn store_cancel_fails_an_unleased_queued_record_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let retention = Retention::flat(Duration::from_secs(3600));
    store.insert(&record("m1", "k1"), retention).await.unwrap();
    store.insert(&record("m2", "k2"), retention).await.unwrap();
    let leased = store.claim("w", LEASE).await.unwrap().unwrap();
    assert!(
        !store.cancel(&leased.id, &op()).await.unwrap(),
        "leased right now"
    );
    let other = if leased.id == "m1" { "m2" } else { "m1" };
    assert!(store.cancel(other, &op()).await.unwrap());
    let m = store.message(other).await.unwrap().unwrap();
    assert_eq!(m.state, State::Cancelled);
    assert!(!m.has_job);
    assert_eq!(
        m.upstream_reply.as_deref(),
        Some("cancelled by an operator")
    );
    assert_eq!(m.history.len(), 1);
    assert_eq!(
        (m.history[0].action.as_str(), m.history[0].reason.as_str()),
        ("cancel", "because")
    );
    assert!(
        !store.cancel(other, &op()).await.unwrap(),
        "already terminal"
    );
    assert!(!store.cancel("nope", &op()).await.unwrap());
    // Paging by id.
    let page = store.list(None, 1, None).await.unwrap();
    assert_eq!(page[0].id, "m1");
    let next = store.list(None, 10, Some("m1")).await.unwrap();
    assert_eq!(
        next.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["m2"]
    );
}

/// SQLite's CHECK was widened in place (migration 11): what the schema holds now must list
/// exactly the states `State` knows.
#[tokio::test]
async fn the_state_check_lists_every_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let sql: String = sqlx::query_scalar(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'",
    )
    .fetch_one(&store.pool)
    .await
    .unwrap();
    let check = format!("CHECK (state IN ({}))", State::sql_list(State::ALL));
    assert!(sql.contains(&check), "{sql}");
}

/// The overview's health read: the newest failed attempt, the run of failures it ends (from
/// the first failure after the newest delivery; none once a delivery follows it), the deferred
/// count and the heartbeat rows.
#[tokio::test]
async fn relay_health_tells_the_run_of_failures_since_the_last_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let retention = Retention::flat(Duration::from_secs(3600));
    let health = store.relay_health().await.unwrap();
    assert_eq!(
        (
            health.newest_failure,
            health.failing_since_ms,
            health.deferred
        ),
        (None, None, 0)
    );
    assert!(health.processes.is_empty());
    let retry = || Settle::Retry {
        after: Duration::ZERO,
        dsn: None,
    };
    // Ledger times are milliseconds: a pause keeps each step after the one before.
    let tick = || tokio::time::sleep(Duration::from_millis(5));

    store.insert(&record("m1", "k1"), retention).await.unwrap();
    attempt(&store, "m1", OutcomeKind::Transient, retry()).await;
    let first = store.attempts("m1").await.unwrap()[0].clone();
    let health = store.relay_health().await.unwrap();
    assert_eq!(health.newest_failure, Some(("m1".into(), first.clone())));
    assert_eq!(health.failing_since_ms, Some(first.started_at_ms));
    assert_eq!((health.last_delivery_ms, health.deferred), (None, 1));

    tick().await;
    attempt(
        &store,
        "m1",
        OutcomeKind::Accepted,
        Settle::Delivered {
            upstream_reply: "250 ok".into(),
            dsn: None,
        },
    )
    .await;
    let delivered = store.attempts("m1").await.unwrap()[1].finished_at_ms;
    let health = store.relay_health().await.unwrap();
    assert_eq!(health.newest_failure, Some(("m1".into(), first)));
    assert_eq!(health.failing_since_ms, None, "a delivery came after it");
    assert_eq!((health.last_delivery_ms, health.deferred), (delivered, 0));

    tick().await;
    store.insert(&record("m2", "k2"), retention).await.unwrap();
    attempt(&store, "m2", OutcomeKind::Transient, retry()).await;
    tick().await;
    attempt(&store, "m2", OutcomeKind::Unknown, retry()).await;
    let ledger = store.attempts("m2").await.unwrap();
    let health = store.relay_health().await.unwrap();
    assert_eq!(
        health.newest_failure,
        Some(("m2".into(), ledger[1].clone()))
    );
    assert_eq!(health.failing_since_ms, Some(ledger[0].started_at_ms));
    assert_eq!(health.deferred, 1);

    store.heartbeat("host/1/abc").await.unwrap();
    let health = store.relay_health().await.unwrap();
    assert_eq!(health.processes.len(), 1);
    assert_eq!(health.processes[0].id, "host/1/abc");
    assert!(health.read_at_ms >= health.processes[0].heartbeat_at_ms);
    let listed = store.list(Some(State::Queued), 10, None).await.unwrap();
    assert_eq!(listed[0].last_reply.as_deref(), Some("550 no"));
}

/// A delivery's notice (a "relayed" DSN) is queued in the commit that marks the message
/// delivered; settling a delivery again with a notice under the same key (a redelivery of the
/// same record) queues nothing more.
#[tokio::test]
async fn a_delivered_settle_queues_its_notice_once_under_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let retention = Retention::flat(Duration::from_secs(3600));
    let notice = |id: &str, of: &str| NewRecord {
        dsn_of: Some(of.into()),
        key_source: Some(KeySource::Dsn),
        fingerprint: idemrelay_model::mail::Fingerprint::from_bytes([9; 32]),
        ..record(id, "dsn-relayed-1")
    };
    for (id, key) in [("m1", "k1"), ("m2", "k2")] {
        store.insert(&record(id, key), retention).await.unwrap();
    }
    for id in ["m1", "m2"] {
        let delivered = Settle::Delivered {
            upstream_reply: "250 ok".into(),
            dsn: Some(Box::new(notice(&format!("D-{id}"), id))),
        };
        attempt(&store, id, OutcomeKind::Accepted, delivered).await;
    }
    let m1 = store.message("m1").await.unwrap().unwrap();
    assert_eq!(m1.state, State::Delivered);
    assert_eq!(m1.dsns, ["D-m1"]);
    let queued = store.message("D-m1").await.unwrap().unwrap();
    assert_eq!((queued.state, queued.has_job), (State::Queued, true));
    assert!(
        store.message("D-m2").await.unwrap().is_none(),
        "the key was taken: no second notice"
    );
}
