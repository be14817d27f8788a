//! The Postgres store's writes of the delivery side and the operator (settle, release, the
//! operator's requeue, cancel and flush) and the statements they share with intake. Each transition is
//! decided by `store::transition`; this file only says it in Postgres SQL.

use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Row;

use super::webhook;
use crate::store::record::{
    body_checksum, retention_ms, Action, AttemptResult, Flush, NewRecord, Operator, Requeue,
    Resolution, Resolve, Settle, State, StoreError,
};
use crate::store::transition::{self, CancelFacts, Finish, FlushFacts, RequeueFacts};

/// A record whose body cannot be used is failed with the reason, so that it is never
/// forwarded; an open intent stays on record as UNKNOWN (closed by the claim before this).
/// Fenced by the claim's lease token: the claim committed on its own.
pub(super) async fn mark_damaged(
    pool: &PgPool,
    id: &str,
    token: i64,
    reason: &str,
    now: i64,
) -> Result<(), StoreError> {
    let finish = transition::damaged(id, reason);
    sqlx::query(
        "WITH job AS (
            DELETE FROM delivery_jobs
            WHERE message_id = $5 AND lease_token = $6 AND lease_owner IS NOT NULL
            RETURNING message_id)
         UPDATE messages m SET state = $1, damage = $2, upstream_reply = $3, finished_at = $4
         FROM job WHERE m.id = job.message_id",
    )
    .bind(finish.state.as_str())
    .bind(reason)
    .bind(&finish.upstream_reply)
    .bind(now)
    .bind(id)
    .bind(token)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn db_now(conn: &mut PgConnection) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar("SELECT idemrelay_now_ms()")
        .fetch_one(&mut *conn)
        .await?)
}

/// Binds a new record's columns as $1..$21, in the order of `messages`' insert statements
/// (`insert_message` here, the batch's in intake.rs).
pub(super) fn bind_new_record<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    record: &'q NewRecord,
    now: i64,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(&record.id)
        .bind(&record.scope)
        .bind(&record.key)
        .bind(record.key_source)
        .bind(&record.fingerprint.as_bytes()[..])
        .bind(&record.envelope.mail_from)
        .bind(record.envelope.rcpt_to.join("\n"))
        .bind(record.envelope.body.as_str())
        .bind(record.envelope.smtputf8)
        .bind(i64::try_from(record.size).unwrap_or(i64::MAX))
        .bind(record.content.as_deref())
        .bind(record.state.as_str())
        .bind(&record.reply)
        .bind(now)
        .bind(&record.dsn_of)
        .bind(
            record
                .content
                .as_deref()
                .map(|body| body_checksum(body).to_vec()),
        )
        .bind(i64::from(record.part))
        .bind(&record.message_fp.as_bytes()[..])
        .bind(&record.upstream_key)
        .bind(&record.message_id)
        .bind(record.envelope.requests.to_stored())
}

/// Inserts a message row unless its (scope, key) is taken; returns the rows inserted.
async fn insert_message(
    conn: &mut PgConnection,
    record: &NewRecord,
    now: i64,
) -> Result<u64, StoreError> {
    Ok(bind_new_record(
        sqlx::query(
            "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
            rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at, dsn_of,
            content_hash, part, message_fp, upstream_key, header_message_id, requests)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
            $18, $19, $20, $21)
         ON CONFLICT (scope, idem_key, part) DO NOTHING",
        ),
        record,
        now,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// An intent left open by a worker that lost its lease: whether the upstream got the message
/// cannot be known, so it is recorded as UNKNOWN (docs/concepts/delivery.md), never as not sent.
async fn close_open_intents(
    conn: &mut PgConnection,
    id: &str,
    now: i64,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE attempts SET outcome = 'unknown', finished_at = $1,
            reply = 'worker stopped with this attempt open; outcome unknown'
         WHERE message_id = $2 AND outcome IS NULL",
    )
    .bind(now)
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// A job due `now`, filed under its message's scope, which gets a turn row if it is new.
async fn insert_job(conn: &mut PgConnection, id: &str, now: i64) -> Result<(), StoreError> {
    sqlx::query(
        "WITH job AS (
            INSERT INTO delivery_jobs (message_id, scope, due_at)
                SELECT id, scope, $2 FROM messages WHERE id = $1
                RETURNING scope)
         INSERT INTO scope_turns (scope, turn) SELECT scope, 0 FROM job
             ON CONFLICT (scope) DO NOTHING",
    )
    .bind(id)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Writes one operator action (relay-wide when `record_id` is `None`).
pub(super) async fn record_action(
    conn: &mut PgConnection,
    record_id: Option<&str>,
    action: Action,
    by: &Operator,
    detail: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO operator_actions (at, record_id, action, actor, reason, detail)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(now)
    .bind(record_id)
    .bind(action.as_str())
    .bind(&by.actor)
    .bind(&by.reason)
    .bind(detail)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// An outcome's writes in one statement, fenced by the lease token: `held` writes the job
/// (due again, or gone) first, which holds off a concurrent claim until the commit; then the
/// attempt's outcome and, for a final outcome, the record's state. `$3` is the transaction's
/// clock when the caller read it already, else NULL (read here). Gives one row when the lease
/// was still ours, none when it was taken over (the new holder owns the record then).
macro_rules! settle_statement {
    ($held:literal) => {
        concat!(
            "WITH clock AS MATERIALIZED (
                SELECT COALESCE($3::BIGINT, idemrelay_now_ms()) AS now_ms),",
            $held,
            "attempt AS (
                UPDATE attempts a SET finished_at = c.now_ms, outcome = $5, phase = $6,
                    code = $7, reply = $8, upstream_id = $9
                FROM held h, clock c WHERE a.message_id = h.message_id AND a.attempt = $4)
             SELECT c.now_ms FROM held, clock c"
        )
    };
}

/// `$10`: milliseconds until the job is due again.
const SETTLE_RETRY: &str = settle_statement!(
    "held AS (
        UPDATE delivery_jobs j
        SET due_at = LEAST(c.now_ms::NUMERIC + $10, 9223372036854775807)::BIGINT,
            attempts = j.attempts + 1, lease_owner = NULL, lease_until = NULL
        FROM clock c
        WHERE j.message_id = $1 AND j.lease_token = $2 AND j.lease_owner IS NOT NULL
        RETURNING j.message_id),"
);

/// `$10`, `$11`: the record's final state and the upstream's reply.
const SETTLE_FINAL: &str = settle_statement!(
    "held AS (
        DELETE FROM delivery_jobs j
        WHERE j.message_id = $1 AND j.lease_token = $2 AND j.lease_owner IS NOT NULL
        RETURNING j.message_id),
     finished AS (
        UPDATE messages m SET state = $10, upstream_reply = $11, finished_at = c.now_ms
        FROM held h, clock c WHERE m.id = h.message_id),"
);

fn settle_writes<'q>(
    id: &'q str,
    token: i64,
    now: Option<i64>,
    attempt: Option<(u32, &'q AttemptResult)>,
    settled: &'q transition::Settled<'q>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let sql = match settled.retry_after {
        Some(_) => SETTLE_RETRY,
        None => SETTLE_FINAL,
    };
    let query = sqlx::query(sql)
        .bind(id)
        .bind(token)
        .bind(now)
        .bind(attempt.map(|(n, _)| i64::from(n)))
        .bind(attempt.map(|(_, r)| r.outcome))
        .bind(attempt.and_then(|(_, r)| r.phase))
        .bind(attempt.and_then(|(_, r)| r.code.map(i64::from)))
        .bind(attempt.map(|(_, r)| r.reply.as_str()))
        .bind(settled.upstream_id.as_deref());
    match (settled.retry_after, settled.finish) {
        (Some(after), _) => query.bind(retention_ms(after)),
        (None, Some((state, reply))) => query.bind(state.as_str()).bind(reply),
        // `transition::settle` gives a final state to every outcome but a retry.
        (None, None) => unreachable!("a settle neither retried nor finished"),
    }
}

pub(super) async fn delete_job(conn: &mut PgConnection, id: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM delivery_jobs WHERE message_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(super) async fn settle(
    pool: &PgPool,
    id: &str,
    token: i64,
    attempt: Option<(u32, &AttemptResult)>,
    settle: &Settle,
) -> Result<bool, StoreError> {
    settle_replying(pool, id, token, attempt, settle, None).await
}

/// `settle`; with `reply`, the record's stored reply (what a retry replays) becomes it in
/// the same commit (the before-queue mode's answer to the client).
pub(super) async fn settle_replying(
    pool: &PgPool,
    id: &str,
    token: i64,
    attempt: Option<(u32, &AttemptResult)>,
    settle: &Settle,
    reply: Option<&str>,
) -> Result<bool, StoreError> {
    let settled = transition::settle(attempt.map(|(_, r)| r), settle);
    let unresolved = settled.unresolved;
    if !settled.late_match() && settled.dsn.is_none() && reply.is_none() {
        // Nothing but the outcome to write: the fenced writes alone, one statement and
        // one commit (their fence takes the job's row lock first, as below).
        let wrote = settle_writes(id, token, None, attempt, &settled)
            .fetch_optional(pool)
            .await?;
        return Ok(wrote.is_some());
    }
    let mut tx = pool.begin().await?;
    // The row lock holds off a concurrent claim until this commit: the token checked
    // here stays the token until the outcome is written. The record's identifiers come
    // with it, for late matching.
    let held = sqlx::query(
        "SELECT idemrelay_now_ms() AS now_ms, m.upstream_key, m.header_message_id, m.rcpt_to
         FROM delivery_jobs j JOIN messages m ON m.id = j.message_id
         WHERE j.message_id = $1 AND j.lease_token = $2 AND j.lease_owner IS NOT NULL
         FOR UPDATE OF j",
    )
    .bind(id)
    .bind(token)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(held) = held else {
        // Our lease was taken over; the new holder owns the record now.
        tx.rollback().await?;
        return Ok(false);
    };
    let now: i64 = held.try_get("now_ms")?;
    // Late matching: the record is known by more now, its upstream id or its being
    // unresolved. The locks come before the record's row is written (see the module).
    let key: Option<String> = held.try_get("upstream_key")?;
    let known = settled.late_match().then(|| webhook::Known {
        id,
        upstream_key: key.as_deref().filter(|_| unresolved),
        upstream_id: settled.upstream_id.as_deref(),
        unresolved,
    });
    if let Some(known) = &known {
        webhook::lock(&mut tx, known.lock_names()).await?;
    }
    settle_writes(id, token, Some(now), attempt, &settled)
        .fetch_one(&mut *tx)
        .await?;
    if let Some(dsn) = settled.dsn {
        if insert_message(&mut tx, dsn, now).await? == 1 {
            insert_job(&mut tx, &dsn.id, now).await?;
        }
    }
    if let Some(known) = &known {
        webhook::attach_unmatched(&mut tx, known, now).await?;
    }
    if let Some(reply) = reply {
        sqlx::query("UPDATE messages SET reply = $1 WHERE id = $2")
            .bind(reply)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Gives a lease back without an attempt's outcome (the worker did not send): the job is due
/// again `after` from now, or later if it was already due later; only the lease holder's
/// token releases it.
pub(super) async fn release(
    pool: &PgPool,
    id: &str,
    token: i64,
    after: Duration,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE delivery_jobs SET lease_owner = NULL, lease_until = NULL,
            due_at = GREATEST(due_at, idemrelay_now_ms() + $1)
         WHERE message_id = $2 AND lease_token = $3 AND lease_owner IS NOT NULL",
    )
    .bind(retention_ms(after))
    .bind(id)
    .bind(token)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn requeue(
    pool: &PgPool,
    id: &str,
    confirmed: bool,
    by: &Operator,
) -> Result<Requeue, StoreError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query(
        "SELECT state, content IS NOT NULL AS has_content,
            EXISTS (SELECT 1 FROM attempts a
                    WHERE a.message_id = m.id AND a.outcome = 'unknown') AS any_unknown,
            (SELECT MIN(started_at) FROM attempts a WHERE a.message_id = m.id)
                AS first_attempt_at
         FROM messages m WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        tx.rollback().await?;
        return Ok(Requeue::NotFound);
    };
    let facts = RequeueFacts {
        state: parse_state(id, &row.try_get::<String, _>("state")?)?,
        has_content: row.try_get("has_content")?,
        any_unknown: row.try_get("any_unknown")?,
        first_attempt_at_ms: row.try_get("first_attempt_at")?,
    };
    let requeued = match transition::requeue(facts, confirmed) {
        Ok(requeued) => requeued,
        Err(refusal) => {
            tx.rollback().await?;
            return Ok(refusal);
        }
    };
    sqlx::query(
        "UPDATE messages SET state = 'queued', finished_at = NULL, upstream_reply = NULL,
            damage = NULL
         WHERE id = $1",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    // A terminal record has no job; a stray one would make the insert fail.
    delete_job(&mut tx, id).await?;
    let now = db_now(&mut tx).await?;
    insert_job(&mut tx, id, now).await?;
    sqlx::query(
        "UPDATE delivery_jobs SET first_attempt_at = $1, lease_token = $3 WHERE message_id = $2",
    )
    .bind(requeued.first_attempt_at_ms)
    .bind(id)
    .bind(transition::requeued_token_base(now))
    .execute(&mut *tx)
    .await?;
    let detail = Some(requeued.detail.as_str());
    record_action(&mut tx, Some(id), Action::Retry, by, detail, now).await?;
    tx.commit().await?;
    Ok(Requeue::Requeued)
}

pub(super) async fn cancel(pool: &PgPool, id: &str, by: &Operator) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let now = db_now(&mut tx).await?;
    if !cancel_unrecorded(&mut tx, id, now).await? {
        tx.rollback().await?;
        return Ok(false);
    }
    record_action(&mut tx, Some(id), Action::Cancel, by, None, now).await?;
    tx.commit().await?;
    Ok(true)
}

/// Cancels each of `ids` still queued and not leased, in one transaction recorded as ONE
/// relay-wide action with the count (a bulk cancel is one decision, shown by `queue status`).
pub(super) async fn cancel_all(
    pool: &PgPool,
    ids: &[String],
    by: &Operator,
    what: &str,
) -> Result<Vec<String>, StoreError> {
    let mut tx = pool.begin().await?;
    let now = db_now(&mut tx).await?;
    let mut cancelled = Vec::new();
    for id in ids {
        if cancel_unrecorded(&mut tx, id, now).await? {
            cancelled.push(id.clone());
        }
    }
    let detail = format!("cancelled {} record(s) {what}", cancelled.len());
    record_action(
        &mut tx,
        None,
        Action::Cancel,
        by,
        Some(detail.trim_end()),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(cancelled)
}

/// The cancel itself, without its action row, in the caller's transaction.
async fn cancel_unrecorded(tx: &mut PgConnection, id: &str, now: i64) -> Result<bool, StoreError> {
    // A job locked right now (being claimed or settled) is skipped: it counts as leased.
    let found: Option<(String, Option<i64>)> = sqlx::query_as(
        "SELECT m.state, j.lease_until FROM delivery_jobs j JOIN messages m ON m.id = j.message_id
         WHERE m.id = $1
         FOR UPDATE OF j SKIP LOCKED",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let found = match found {
        Some((state, lease_until)) => Some(CancelFacts {
            state: parse_state(id, &state)?,
            leased: Some(lease_until.is_some_and(|until| until > now)),
        }),
        None => None,
    };
    let Some(finish) = transition::cancel(found) else {
        return Ok(false);
    };
    finish_record(tx, id, &finish, now).await?;
    Ok(true)
}

/// Writes a `Finish` (as SQLite's `finish_record` does): the record's terminal state and
/// reply, its open intents closed as UNKNOWN when asked, its job row gone.
async fn finish_record(
    conn: &mut PgConnection,
    id: &str,
    finish: &Finish,
    now: i64,
) -> Result<(), StoreError> {
    if finish.close_open_intents {
        close_open_intents(&mut *conn, id, now).await?;
    }
    sqlx::query(
        "UPDATE messages SET state = $1, finished_at = $2, upstream_reply = $3
         WHERE id = $4",
    )
    .bind(finish.state.as_str())
    .bind(now)
    .bind(&finish.upstream_reply)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    delete_job(conn, id).await
}

pub(super) async fn resolve(
    pool: &PgPool,
    id: &str,
    resolution: Resolution,
    by: &Operator,
) -> Result<Resolve, StoreError> {
    let mut tx = pool.begin().await?;
    let now = db_now(&mut tx).await?;
    // The row lock orders this against a webhook event resolving the same record.
    let state: Option<String> =
        sqlx::query_scalar("SELECT state FROM messages WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let found = state.map(|s| parse_state(id, &s)).transpose()?;
    let finish = match transition::resolve(found, resolution, by) {
        Ok(finish) => finish,
        Err(refusal) => {
            tx.rollback().await?;
            return Ok(refusal);
        }
    };
    finish_record(&mut tx, id, &finish, now).await?;
    record_action(
        &mut tx,
        Some(id),
        Action::Resolve,
        by,
        Some(resolution.as_str()),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(Resolve::Resolved)
}

pub(super) async fn flush(pool: &PgPool, id: &str, by: &Operator) -> Result<Flush, StoreError> {
    let mut tx = pool.begin().await?;
    let now = db_now(&mut tx).await?;
    // A job locked right now (being claimed or settled) is skipped: it counts as leased.
    let job: Option<(String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT m.state, j.due_at, j.lease_until
         FROM delivery_jobs j JOIN messages m ON m.id = j.message_id
         WHERE j.message_id = $1
         FOR UPDATE OF j SKIP LOCKED",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let found = match job {
        Some((state, due_at, lease_until)) => Some(FlushFacts {
            state: parse_state(id, &state)?,
            due_at_ms: Some(due_at),
            leased: lease_until.is_some_and(|until| until > now),
        }),
        None => {
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM messages WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            match state {
                Some(state) => {
                    let state = parse_state(id, &state)?;
                    // Queued without a job it could lock: the job is held right now.
                    Some(FlushFacts {
                        state,
                        due_at_ms: (state == State::Queued).then_some(now),
                        leased: true,
                    })
                }
                None => None,
            }
        }
    };
    let flushed = match transition::flush(found, now) {
        Ok(flushed) => flushed,
        Err(refusal) => {
            tx.rollback().await?;
            return Ok(refusal);
        }
    };
    sqlx::query("UPDATE delivery_jobs SET due_at = $1 WHERE message_id = $2")
        .bind(flushed.due_at_ms)
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let detail = Some(flushed.detail.as_str());
    record_action(&mut tx, Some(id), Action::Flush, by, detail, now).await?;
    tx.commit().await?;
    Ok(Flush::Flushed {
        was_due_at_ms: flushed.was_due_at_ms,
    })
}

pub(super) async fn flush_all(pool: &PgPool, by: &Operator) -> Result<Vec<String>, StoreError> {
    let mut tx = pool.begin().await?;
    let now = db_now(&mut tx).await?;
    let waiting: Vec<(String, i64)> = sqlx::query_as(
        "WITH picked AS (
            SELECT message_id, due_at FROM delivery_jobs
            WHERE due_at > $1 AND (lease_until IS NULL OR lease_until <= $1)
            FOR UPDATE SKIP LOCKED),
         flushed AS (
            UPDATE delivery_jobs j SET due_at = $1 FROM picked p
            WHERE j.message_id = p.message_id RETURNING j.message_id)
         SELECT message_id, due_at FROM picked",
    )
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    // One relay-wide action with the count, not one per record: it is one decision, and
    // `queue status` lists relay-wide actions only.
    let detail = transition::flush_all_detail(waiting.len());
    record_action(&mut tx, None, Action::Flush, by, Some(&detail), now).await?;
    tx.commit().await?;
    Ok(waiting.into_iter().map(|(id, _)| id).collect())
}

fn parse_state(id: &str, state: &str) -> Result<State, StoreError> {
    State::parse(state).ok_or(StoreError::Corrupt {
        id: id.to_string(),
        what: "state",
    })
}
