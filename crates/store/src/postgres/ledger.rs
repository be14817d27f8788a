//! The delivery side's fenced statements: the claim of the next due job, the intent before
//! an attempt, and an attempt's outcome with the record's state. The group commit
//! (`group_commit.rs`) runs the claim, the intent and a plain outcome in its batches; the
//! queue and operator roles run the rest inside their own transactions.

use sqlx::postgres::{PgConnection, PgRow};

use crate::attempt::Phase;
use crate::record::{retention_ms, AttemptResult, Settle, StoreError};
use crate::transition::{self, Finish};

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

/// Writes a `Finish` (as SQLite's `finish_record` does): the record's terminal state and
/// reply, its open intents closed as UNKNOWN when asked, its job row gone.
pub(super) async fn finish_record(
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

pub(super) fn settle_writes<'q>(
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
        .bind(attempt.map(|(_, r)| r.outcome.as_str()))
        .bind(attempt.and_then(|(_, r)| r.phase.map(Phase::as_str)))
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

/// `idemrelay_claim`: leases the next due job for `owner`, moves its scope's turn and closes
/// an intent its last holder left open; the job's row, or none when nothing is due.
pub(super) async fn claim_next(
    conn: &mut PgConnection,
    owner: &str,
    lease_ms: i64,
) -> Result<Option<PgRow>, StoreError> {
    Ok(sqlx::query("SELECT * FROM idemrelay_claim($1, $2)")
        .bind(owner)
        .bind(lease_ms)
        .fetch_optional(conn)
        .await?)
}

/// The intent row, written under an unexpired lease held with `token`: one statement, the
/// lease check and the intent. Only under an unexpired lease: once expired it may be another
/// worker's any moment.
pub(super) async fn write_intent(
    conn: &mut PgConnection,
    id: &str,
    token: i64,
    attempt: u32,
) -> Result<bool, StoreError> {
    Ok(sqlx::query(
        "WITH clock AS MATERIALIZED (SELECT idemrelay_now_ms() AS now_ms),
         held AS (
            UPDATE delivery_jobs j SET first_attempt_at = COALESCE(j.first_attempt_at, c.now_ms)
            FROM clock c
            WHERE j.message_id = $1 AND j.lease_token = $2 AND j.lease_owner IS NOT NULL
              AND j.lease_until > c.now_ms
            RETURNING j.message_id, j.lease_owner, c.now_ms)
         INSERT INTO attempts (message_id, attempt, owner, started_at)
         SELECT message_id, $3, lease_owner, now_ms FROM held",
    )
    .bind(id)
    .bind(token)
    .bind(i64::from(attempt))
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}

/// An outcome with nothing else to write: the fenced writes, one statement.
pub(super) async fn write_plain_outcome(
    conn: &mut PgConnection,
    id: &str,
    token: i64,
    attempt: Option<(u32, &AttemptResult)>,
    settle: &Settle,
) -> Result<bool, StoreError> {
    let settled = transition::settle(attempt.map(|(_, r)| r), settle);
    let wrote = settle_writes(id, token, None, attempt, &settled)
        .fetch_optional(conn)
        .await?;
    Ok(wrote.is_some())
}
