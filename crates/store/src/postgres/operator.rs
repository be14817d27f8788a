//! Operator changes on Postgres (requeue, cancel, resolve, flush, pause actions, the retention
//! purge), each recorded as the operator's action in the same commit. Each transition is
//! decided by `store::transition`; this file only says it in Postgres SQL.

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Row;

use super::{db_now, PostgresStore};
use crate::backend::OperatorStore;
use crate::record::{Action, Flush, Operator, Requeue, Resolution, Resolve, State, StoreError};
use crate::retention::Retention;
use crate::transition::{self, CancelFacts, FlushFacts, RequeueFacts};

#[async_trait]
impl OperatorStore for PostgresStore {
    async fn requeue(
        &self,
        id: &str,
        confirmed: bool,
        by: &Operator,
    ) -> Result<Requeue, StoreError> {
        requeue(&self.pool, id, confirmed, by).await
    }

    async fn cancel(&self, id: &str, by: &Operator) -> Result<bool, StoreError> {
        cancel(&self.pool, id, by).await
    }

    async fn cancel_all(
        &self,
        ids: &[String],
        by: &Operator,
        what: &str,
    ) -> Result<Vec<String>, StoreError> {
        cancel_all(&self.pool, ids, by, what).await
    }

    async fn resolve(
        &self,
        id: &str,
        resolution: Resolution,
        by: &Operator,
    ) -> Result<Resolve, StoreError> {
        resolve(&self.pool, id, resolution, by).await
    }

    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError> {
        flush(&self.pool, id, by).await
    }

    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError> {
        flush_all(&self.pool, by).await
    }

    async fn record_action(
        &self,
        action: Action,
        by: &Operator,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        let now = db_now(&mut conn).await?;
        record_action(&mut conn, None, action, by, detail, now).await
    }

    async fn purge_expired(&self, retention: Retention) -> Result<u64, StoreError> {
        let [replay, parked, window] = retention.sql_params();
        let purged: i64 = sqlx::query_scalar(&purge_sql())
            .bind(replay)
            .bind(parked)
            .bind(window)
            .fetch_one(&self.pool)
            .await?;
        // A sender retries a webhook for days at most: its receipt (the duplicate check) and
        // an event that never found its record are kept as long as a parked record.
        sqlx::query("DELETE FROM webhook_receipts WHERE received_at <= idemrelay_now_ms() - $1")
            .bind(parked)
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "DELETE FROM upstream_events
             WHERE record_id IS NULL AND received_at <= idemrelay_now_ms() - $1",
        )
        .bind(parked)
        .execute(&self.pool)
        .await?;
        // A record's actions go with it; the relay-wide ones are kept as long as a parked
        // record.
        sqlx::query(
            "DELETE FROM operator_actions
             WHERE record_id IS NULL AND at <= idemrelay_now_ms() - $1",
        )
        .bind(parked)
        .execute(&self.pool)
        .await?;
        Ok(u64::try_from(purged).unwrap_or(0))
    }
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
    super::ledger::delete_job(&mut tx, id).await?;
    let now = db_now(&mut tx).await?;
    super::inserts::insert_job(&mut tx, id, now).await?;
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
    super::ledger::finish_record(tx, id, &finish, now).await?;
    Ok(true)
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
    super::ledger::finish_record(&mut tx, id, &finish, now).await?;
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

/// The retention purge, one statement: each way a record is kept deleted alone (each bounded
/// by its index), and how many went. Its parameters are `Retention::sql_params`. The clock is
/// read once, in a subquery: the planner can bound an index by its value, where the function
/// itself, which is volatile, it must call for every row it reads.
pub(super) fn purge_sql() -> String {
    let [replayed, parked] =
        Retention::expired_by_kind_sql("(SELECT idemrelay_now_ms())", "$1", "$2", "$3");
    format!(
        "WITH replayed AS (DELETE FROM messages m WHERE {replayed} RETURNING 1),
              parked AS (DELETE FROM messages m WHERE {parked} RETURNING 1)
         SELECT (SELECT COUNT(*) FROM replayed) + (SELECT COUNT(*) FROM parked)"
    )
}
