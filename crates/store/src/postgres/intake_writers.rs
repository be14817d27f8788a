//! Intake on Postgres with group commit. Sessions hand their records to a few writer tasks;
//! a writer takes every record waiting, writes them in one transaction on one connection, in
//! one statement each, and answers every member only after that COMMIT has returned (the
//! connection's `synchronous_commit` is at least `on`, so a returned COMMIT is durable). What
//! would be one commit and seven round trips per message becomes one commit and four round
//! trips per batch: BEGIN, locks and clock, one multi-row insert, COMMIT. A member whose
//! (scope, key, part) is taken, or that an unmatched upstream event may name, takes the
//! steps of a lone insert after that, in the same transaction.
//!
//! Members are written in (scope, key, part) order, arrival order among equal keys: the second
//! of two inserts of one key in a batch is skipped by the multi-row insert and then finds the
//! first's row, as two sequential inserts would,
//! and two writers' batches take their row locks in one order, so they cannot deadlock on each
//! other. A batch that fails before its COMMIT has committed nothing: each member is then
//! written alone, so one bad record never fails the others. A failed COMMIT (its outcome
//! unknown) fails every member, as it would a lone insert.

use std::cmp::Ordering;

use std::sync::Arc;

use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, Postgres, Row};
use tokio::sync::{mpsc, oneshot, Mutex};

use super::group_commit::next_batch;
use super::hosts::Hosts;
use super::inserts::bind_new_record;
use super::matching;
use crate::record::{body_checksum, Insert, KeySource, NewRecord, State, StoreError};
use crate::retention::Retention;
use crate::rows;

/// Two writers, so that one batch is written while the other waits for its commit's flush.
const WRITERS: usize = 2;
/// At most this many records in one transaction: it bounds how long its locks are held.
const MAX_BATCH: usize = 64;
/// Records waiting for a writer; more makes a session wait to hand its record over.
const QUEUE: usize = 1024;

struct Pending {
    record: NewRecord,
    retention: Retention,
    answer: oneshot::Sender<Result<Insert, StoreError>>,
}

/// The sessions' side of the writers.
pub(super) struct IntakeWriters {
    queue: mpsc::Sender<Pending>,
}

impl IntakeWriters {
    /// Starts the writers on the current runtime; they stop when the `IntakeWriters` is dropped.
    pub(crate) fn start(pool: PgPool, hosts: Arc<Hosts>) -> IntakeWriters {
        let (queue, waiting) = mpsc::channel(QUEUE);
        let waiting = Arc::new(Mutex::new(waiting));
        for _ in 0..WRITERS {
            tokio::spawn(writer(pool.clone(), hosts.clone(), waiting.clone()));
        }
        IntakeWriters { queue }
    }

    pub(crate) async fn insert(
        &self,
        record: &NewRecord,
        retention: Retention,
    ) -> Result<Insert, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Pending {
                record: record.clone(),
                retention,
                answer,
            })
            .await
            .map_err(|_| StoreError::WriterGone)?;
        answered.await.map_err(|_| StoreError::WriterGone)?
    }
}

/// A writer's own connection, kept from batch to batch: taking one from the pool for each
/// batch cost a round trip (the pool's liveness ping) per message at one message per commit.
/// It is given back when it failed (it may be broken) and when the store moved to another
/// host after it was taken.
struct Held {
    conn: PoolConnection<Postgres>,
    taken_at: Instant,
}

async fn writer(pool: PgPool, hosts: Arc<Hosts>, waiting: Arc<Mutex<mpsc::Receiver<Pending>>>) {
    let mut held: Option<Held> = None;
    while let Some(batch) = next_batch(&waiting, MAX_BATCH).await {
        if held
            .as_ref()
            .is_some_and(|h| !hosts.fresh(h.taken_at.elapsed()))
        {
            held = None;
        }
        write_batch(&pool, &mut held, batch).await;
    }
}

fn lock_order(a: &Pending, b: &Pending) -> Ordering {
    (&a.record.scope, &a.record.key, a.record.part).cmp(&(
        &b.record.scope,
        &b.record.key,
        b.record.part,
    ))
}

/// How a batch went wrong.
enum Failed {
    /// Before COMMIT: rolled back, nothing of it is in.
    Uncommitted(StoreError),
    /// At COMMIT: it may or may not be in.
    Commit(StoreError),
}

async fn write_batch(pool: &PgPool, held: &mut Option<Held>, mut batch: Vec<Pending>) {
    // A stable sort: equal keys keep their arrival order.
    batch.sort_by(lock_order);
    let was_held = held.is_some();
    let mut written = write_held(pool, held, &batch).await;
    if was_held && matches!(written, Err(Failed::Uncommitted(_))) {
        // A held connection can have died while idle (a restarted server, a cut link), where
        // the pool's ping would have found it: once more on a connection just taken and
        // checked, before any member is told of a failure. A batch that failed on a freshly
        // taken connection is not tried again: its failure is not the connection's age.
        written = write_held(pool, held, &batch).await;
    }
    match written {
        Ok(results) => {
            for (pending, result) in batch.into_iter().zip(results) {
                // A session that gave up meanwhile gets its record anyway: its retry replays.
                let _ = pending.answer.send(Ok(result));
            }
        }
        Err(Failed::Uncommitted(_)) if batch.len() > 1 => {
            for pending in batch {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let alone = insert_alone(&pool, &pending.record, pending.retention).await;
                    let _ = pending.answer.send(alone);
                });
            }
        }
        Err(Failed::Uncommitted(why) | Failed::Commit(why)) => fail_all(batch, why),
    }
}

/// Every member gets the error (the one member its own).
fn fail_all(mut batch: Vec<Pending>, why: StoreError) {
    if batch.len() == 1 {
        let _ = batch.remove(0).answer.send(Err(why));
        return;
    }
    let why = why.to_string();
    for pending in batch {
        let _ = pending
            .answer
            .send(Err(StoreError::CommitFailed(why.clone())));
    }
}

/// `write_together` on the held connection, taken from the pool first if there is none; a
/// connection whose batch failed is given back.
async fn write_held(
    pool: &PgPool,
    held: &mut Option<Held>,
    batch: &[Pending],
) -> Result<Vec<Insert>, Failed> {
    let mut taken = match held.take() {
        Some(taken) => taken,
        None => Held {
            conn: pool
                .acquire()
                .await
                .map_err(|e| Failed::Uncommitted(e.into()))?,
            taken_at: Instant::now(),
        },
    };
    let written = write_together(&mut taken.conn, batch).await;
    if written.is_ok() {
        *held = Some(taken);
    }
    written
}

async fn write_together(conn: &mut PgConnection, batch: &[Pending]) -> Result<Vec<Insert>, Failed> {
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| Failed::Uncommitted(e.into()))?;
    let mut results = Vec::with_capacity(batch.len());
    let written: Result<(), StoreError> = async {
        let names = batch.iter().flat_map(|p| lock_names(&p.record)).collect();
        let now = lock_and_now(&mut tx, names).await?;
        if let [alone] = batch {
            // One statement for one record is cheaper to plan and run than the multi-row one.
            let result = write_record(&mut tx, &alone.record, alone.retention, now).await?;
            results.push(result);
            return Ok(());
        }
        let first_try = insert_all(&mut tx, batch, now).await?;
        for (pending, tried) in batch.iter().zip(first_try) {
            let result = match tried {
                Some(unmatched) => {
                    if unmatched {
                        let known = matching::Known::inserted(&pending.record);
                        matching::attach_unmatched(&mut tx, &known, now).await?;
                    }
                    Insert::Inserted
                }
                // Taken, by an earlier record or an earlier member of this batch: as alone.
                None => write_record(&mut tx, &pending.record, pending.retention, now).await?,
            };
            results.push(result);
        }
        Ok(())
    }
    .await;
    if let Err(why) = written {
        // Dropping the transaction rolls it back; say so to the server before reusing it.
        let _ = tx.rollback().await;
        return Err(Failed::Uncommitted(why));
    }
    failpoint!("intake.before_commit");
    tx.commit().await.map_err(|e| Failed::Commit(e.into()))?;
    Ok(results)
}

/// One record in a transaction of its own (a batch's member after the batch failed).
async fn insert_alone(
    pool: &PgPool,
    record: &NewRecord,
    retention: Retention,
) -> Result<Insert, StoreError> {
    let mut tx = pool.begin().await?;
    let now = lock_and_now(&mut tx, lock_names(record)).await?;
    let result = write_record(&mut tx, record, retention, now).await?;
    failpoint!("intake.before_commit");
    tx.commit().await?;
    Ok(result)
}

/// The advisory locks a queued record takes before it is written (see `matching.rs`).
fn lock_names(record: &NewRecord) -> Vec<String> {
    if record.state == State::Queued {
        matching::Known::inserted(record).lock_names()
    } else {
        Vec::new()
    }
}

/// Takes the locks (sorted, in one statement, before any row lock) and reads the database's
/// clock, in one round trip. Later statements of the transaction see whatever the holders of
/// these locks committed.
async fn lock_and_now(conn: &mut PgConnection, mut names: Vec<String>) -> Result<i64, StoreError> {
    names.sort();
    names.dedup();
    Ok(sqlx::query_scalar(
        "SELECT idemrelay_now_ms() FROM (
            SELECT COUNT(pg_advisory_xact_lock($1, h)) FROM (
                SELECT DISTINCT hashtext(n) AS h FROM unnest($2::TEXT[]) n ORDER BY 1) s) l",
    )
    .bind(matching::MATCH_LOCKS)
    .bind(&names)
    .fetch_one(&mut *conn)
    .await?)
}

/// Writes one record inside the caller's transaction: the row, its job and scope turn when
/// queued, in one statement that also says whether an unmatched upstream event may name it;
/// only then are those events read and attached. A taken (scope, key, part) reads the live
/// parts instead, or replaces them when all have expired.
async fn write_record(
    conn: &mut PgConnection,
    record: &NewRecord,
    retention: Retention,
    now: i64,
) -> Result<Insert, StoreError> {
    let queued = record.state == State::Queued;
    loop {
        let (inserted, unmatched) = insert_queued(conn, record, queued, now).await?;
        if inserted {
            if unmatched {
                let known = matching::Known::inserted(record);
                matching::attach_unmatched(conn, &known, now).await?;
            }
            return Ok(Insert::Inserted);
        }
        // Locked as read: the expiry decided below holds for exactly these rows until the
        // commit, and the delete takes only them (a part another instance commits meanwhile
        // is live, and is neither read nor deleted here).
        let found = sqlx::query(&format!(
            "SELECT {}, accepted_at, finished_at,
                (SELECT MAX(a.started_at) FROM attempts a WHERE a.message_id = m.id)
                    AS last_attempt_at
             FROM messages m WHERE scope = $1 AND idem_key = $2 ORDER BY part
             FOR UPDATE OF m",
            rows::EXISTING_COLUMNS
        ))
        .bind(&record.scope)
        .bind(record.key.as_deref().unwrap_or_default())
        .fetch_all(&mut *conn)
        .await?;
        // Gone between our insert and this read: the holder rolled back or was purged.
        if found.is_empty() {
            continue;
        }
        let mut live = Vec::new();
        let mut expired_ids = Vec::new();
        for row in &found {
            let existing = rows::existing(row)?;
            let expired = retention.expired(
                existing.state,
                row.try_get("accepted_at")?,
                row.try_get("finished_at")?,
                row.try_get("last_attempt_at")?,
                now,
            );
            if expired {
                expired_ids.push(existing.id);
            } else {
                live.push(existing);
            }
        }
        if !live.is_empty() {
            return Ok(Insert::Existing(live));
        }
        // Every record read under the key has expired: the key starts a new operation.
        sqlx::query("DELETE FROM messages WHERE id = ANY($1)")
            .bind(&expired_ids)
            .execute(&mut *conn)
            .await?;
    }
}

/// The row unless its (scope, key, part) is taken, and for a queued record its job (due now)
/// and its scope's turn row; returns whether the row went in and whether an unmatched event
/// names its upstream key or Message-ID.
async fn insert_queued(
    conn: &mut PgConnection,
    record: &NewRecord,
    queued: bool,
    now: i64,
) -> Result<(bool, bool), StoreError> {
    let row = bind_new_record(
        sqlx::query(
            "WITH m AS (
            INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at, dsn_of,
                content_hash, part, message_fp, upstream_key, header_message_id, requests)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                $18, $19, $20, $21)
            ON CONFLICT (scope, idem_key, part) DO NOTHING
            RETURNING id, scope),
         j AS (
            INSERT INTO delivery_jobs (message_id, scope, due_at)
                SELECT id, scope, $14 FROM m WHERE $22
                RETURNING scope),
         t AS (
            INSERT INTO scope_turns (scope, turn) SELECT scope, 0 FROM j
                ON CONFLICT (scope) DO NOTHING)
         SELECT EXISTS (SELECT 1 FROM m) AS inserted,
            $22 AND (
                EXISTS (SELECT 1 FROM upstream_events
                        WHERE record_id IS NULL AND idem_key = $19)
                OR EXISTS (SELECT 1 FROM upstream_events
                        WHERE record_id IS NULL AND header_message_id = $20)) AS unmatched",
        ),
        record,
        now,
    )
    .bind(queued)
    .fetch_one(&mut *conn)
    .await?;
    Ok((row.try_get("inserted")?, row.try_get("unmatched")?))
}

/// Every member's row, and for queued ones the job and scope turn, in one statement; each
/// member whose row went in gets `Some(whether an unmatched upstream event names its upstream
/// key or Message-ID)`, the others (key taken, by an earlier member too) `None`.
async fn insert_all(
    conn: &mut PgConnection,
    batch: &[Pending],
    now: i64,
) -> Result<Vec<Option<bool>>, StoreError> {
    let records = || batch.iter().map(|p| &p.record);
    let text = |f: fn(&NewRecord) -> &str| records().map(f).collect::<Vec<&str>>();
    let maybe = |f: fn(&NewRecord) -> Option<&str>| records().map(f).collect::<Vec<_>>();
    let bytes = |f: fn(&NewRecord) -> Vec<u8>| records().map(f).collect::<Vec<Vec<u8>>>();
    let rows: Vec<(String, bool)> = sqlx::query_as(
        "WITH input AS (
            SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BYTEA[],
                $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::BOOLEAN[], $10::BIGINT[], $11::BYTEA[],
                $12::TEXT[], $13::TEXT[], $14::TEXT[], $15::BYTEA[], $16::BIGINT[], $17::BYTEA[],
                $18::TEXT[], $19::TEXT[], $21::TEXT[])
                WITH ORDINALITY AS r (id, scope, idem_key, key_source, fingerprint, mail_from,
                    rcpt_to, body_type, smtputf8, size, content, state, reply, dsn_of,
                    content_hash, part, message_fp, upstream_key, header_message_id, requests,
                    n)),
         m AS (
            INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at, dsn_of,
                content_hash, part, message_fp, upstream_key, header_message_id, requests)
            SELECT id, scope, idem_key, key_source, fingerprint, mail_from, rcpt_to,
                body_type, smtputf8, size, content, state, reply, $20, dsn_of, content_hash,
                part, message_fp, upstream_key, header_message_id, requests
            FROM input ORDER BY n
            ON CONFLICT (scope, idem_key, part) DO NOTHING
            RETURNING id, scope, state, upstream_key, header_message_id),
         j AS (
            INSERT INTO delivery_jobs (message_id, scope, due_at)
                SELECT id, scope, $20 FROM m WHERE state = 'queued'
                RETURNING scope),
         t AS (
            INSERT INTO scope_turns (scope, turn) SELECT DISTINCT scope, 0 FROM j
                ON CONFLICT (scope) DO NOTHING)
         SELECT id, state = 'queued' AND (
                EXISTS (SELECT 1 FROM upstream_events e
                        WHERE e.record_id IS NULL AND e.idem_key = m.upstream_key)
                OR EXISTS (SELECT 1 FROM upstream_events e
                        WHERE e.record_id IS NULL AND e.header_message_id = m.header_message_id))
         FROM m",
    )
    .bind(text(|r| &r.id))
    .bind(text(|r| &r.scope))
    .bind(maybe(|r| r.key.as_deref()))
    .bind(text(|r| KeySource::stored(r.key_source)))
    .bind(bytes(|r| r.fingerprint.as_bytes().to_vec()))
    .bind(text(|r| &r.envelope.mail_from))
    .bind(
        records()
            .map(|r| r.envelope.rcpt_to.join("\n"))
            .collect::<Vec<_>>(),
    )
    .bind(text(|r| r.envelope.body.as_str()))
    .bind(records().map(|r| r.envelope.smtputf8).collect::<Vec<_>>())
    .bind(
        records()
            .map(|r| i64::try_from(r.size).unwrap_or(i64::MAX))
            .collect::<Vec<_>>(),
    )
    .bind(records().map(|r| r.content.as_deref()).collect::<Vec<_>>())
    .bind(text(|r| r.state.as_str()))
    .bind(text(|r| &r.reply))
    .bind(maybe(|r| r.dsn_of.as_deref()))
    .bind(
        records()
            .map(|r| {
                r.content
                    .as_deref()
                    .map(|body| body_checksum(body).to_vec())
            })
            .collect::<Vec<_>>(),
    )
    .bind(records().map(|r| i64::from(r.part)).collect::<Vec<_>>())
    .bind(bytes(|r| r.message_fp.as_bytes().to_vec()))
    .bind(maybe(|r| r.upstream_key.as_deref()))
    .bind(maybe(|r| r.message_id.as_deref()))
    .bind(now)
    .bind(
        records()
            .map(|r| r.envelope.requests.to_stored())
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut went_in: std::collections::HashMap<String, bool> = rows.into_iter().collect();
    Ok(records().map(|r| went_in.remove(&r.id)).collect())
}
