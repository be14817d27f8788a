//! Operator changes on SQLite (requeue, cancel, resolve, flush, pause actions, the retention
//! purge), each recorded as the operator's action in the same commit, on the group-commit
//! writer.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

use super::SqliteStore;
use crate::backend::OperatorStore;
use crate::record::{
    now_ms, Action, Flush, Operator, Requeue, Resolution, Resolve, State, StoreError,
};
use crate::retention::Retention;
use crate::transition::{self, CancelFacts, FlushFacts, RequeueFacts};

#[async_trait]
impl OperatorStore for SqliteStore {
    async fn requeue(
        &self,
        id: &str,
        confirmed: bool,
        by: &Operator,
    ) -> Result<Requeue, StoreError> {
        let (id, by) = (id.to_string(), by.clone());
        self.writer
            .write(move |conn| requeue(conn, &id, confirmed, &by))
            .await
    }

    async fn cancel(&self, id: &str, by: &Operator) -> Result<bool, StoreError> {
        let (id, by) = (id.to_string(), by.clone());
        self.writer.write(move |conn| cancel(conn, &id, &by)).await
    }

    async fn cancel_all(
        &self,
        ids: &[String],
        by: &Operator,
        what: &str,
    ) -> Result<Vec<String>, StoreError> {
        let (ids, by, what) = (ids.to_vec(), by.clone(), what.to_string());
        self.writer
            .write(move |conn| cancel_all(conn, &ids, &by, &what))
            .await
    }

    async fn resolve(
        &self,
        id: &str,
        resolution: Resolution,
        by: &Operator,
    ) -> Result<Resolve, StoreError> {
        let (id, by) = (id.to_string(), by.clone());
        self.writer
            .write(move |conn| resolve(conn, &id, resolution, &by))
            .await
    }

    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError> {
        let (id, by) = (id.to_string(), by.clone());
        self.writer.write(move |conn| flush(conn, &id, &by)).await
    }

    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError> {
        let by = by.clone();
        self.writer.write(move |conn| flush_all(conn, &by)).await
    }

    async fn record_action(
        &self,
        action: Action,
        by: &Operator,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        let (by, detail) = (by.clone(), detail.map(str::to_string));
        self.writer
            .write(move |conn| record_action(conn, None, action, &by, detail.as_deref(), now_ms()))
            .await
    }

    async fn purge_expired(&self, retention: Retention) -> Result<u64, StoreError> {
        let purged = self
            .writer
            .write(move |conn| purge_expired(conn, retention))
            .await?;
        self.remove_unused_segments().await?;
        Ok(purged)
    }
}

/// The retention purge's DELETE; its parameters are now, then `Retention::sql_params`.
pub(super) fn purge_sql() -> String {
    format!(
        "DELETE FROM messages AS m WHERE {}",
        Retention::expired_sql("?1", "?2", "?3", "?4")
    )
}

pub(super) fn purge_expired(conn: &Connection, retention: Retention) -> Result<u64, StoreError> {
    let [replay, parked, window] = retention.sql_params();
    let deleted =
        conn.prepare_cached(&purge_sql())?
            .execute(params![now_ms(), replay, parked, window])?;
    // A sender retries a webhook for days at most: its receipt (the duplicate check) and an
    // event that never found its record are kept as long as a parked record.
    let before = now_ms().saturating_sub(parked);
    conn.prepare_cached("DELETE FROM webhook_receipts WHERE received_at <= ?")?
        .execute([before])?;
    conn.prepare_cached(
        "DELETE FROM upstream_events WHERE record_id IS NULL AND received_at <= ?",
    )?
    .execute([before])?;
    // A record's actions go with it; the relay-wide ones are kept as long as a parked record.
    conn.prepare_cached("DELETE FROM operator_actions WHERE record_id IS NULL AND at <= ?")?
        .execute([before])?;
    Ok(deleted as u64)
}

pub(super) fn requeue(
    conn: &Connection,
    id: &str,
    confirmed: bool,
    by: &Operator,
) -> Result<Requeue, StoreError> {
    let found = conn
        .prepare_cached(
            "SELECT state, content IS NOT NULL OR spool_segment IS NOT NULL, scope,
                EXISTS (SELECT 1 FROM attempts a WHERE a.message_id = m.id AND a.outcome = 'unknown'),
                (SELECT MIN(started_at) FROM attempts a WHERE a.message_id = m.id)
             FROM messages m WHERE id = ?",
        )?
        .query_row([id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, bool>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, bool>(3)?,
                row.get::<_, Option<i64>>(4)?,
            ))
        })
        .optional()?;
    let Some((state, has_content, scope, any_unknown, first_attempt_at_ms)) = found else {
        return Ok(Requeue::NotFound);
    };
    let facts = RequeueFacts {
        state: parse_state(id, &state)?,
        has_content,
        any_unknown,
        first_attempt_at_ms,
    };
    let requeued = match transition::requeue(facts, confirmed) {
        Ok(requeued) => requeued,
        Err(refusal) => return Ok(refusal),
    };
    conn.prepare_cached(
        "UPDATE messages SET state = 'queued', finished_at = NULL, upstream_reply = NULL,
            damage = NULL
         WHERE id = ?",
    )?
    .execute([id])?;
    // A terminal record has no job; a stray one would make the insert fail.
    conn.prepare_cached("DELETE FROM delivery_jobs WHERE message_id = ?")?
        .execute([id])?;
    let now = now_ms();
    conn.prepare_cached(
        "INSERT INTO delivery_jobs (message_id, scope, due_at, first_attempt_at, lease_token)
         VALUES (?, ?, ?, ?, ?)",
    )?
    .execute(params![
        id,
        scope,
        now,
        requeued.first_attempt_at_ms,
        transition::requeued_token_base(now)
    ])?;
    record_action(
        conn,
        Some(id),
        Action::Retry,
        by,
        Some(&requeued.detail),
        now_ms(),
    )?;
    Ok(Requeue::Requeued)
}

pub(super) fn cancel(conn: &Connection, id: &str, by: &Operator) -> Result<bool, StoreError> {
    let now = now_ms();
    if !cancel_unrecorded(conn, id, now)? {
        return Ok(false);
    }
    record_action(conn, Some(id), Action::Cancel, by, None, now)?;
    Ok(true)
}

/// Cancels each of `ids` that is still queued and not leased, in the caller's transaction, and
/// records them as ONE relay-wide action with the count: a bulk cancel is one decision, and
/// `queue status` shows it among the recent actions. Returns the ids cancelled.
pub(super) fn cancel_all(
    conn: &Connection,
    ids: &[String],
    by: &Operator,
    what: &str,
) -> Result<Vec<String>, StoreError> {
    let now = now_ms();
    let mut cancelled = Vec::new();
    for id in ids {
        if cancel_unrecorded(conn, id, now)? {
            cancelled.push(id.clone());
        }
    }
    let detail = format!("cancelled {} record(s) {what}", cancelled.len());
    record_action(conn, None, Action::Cancel, by, Some(detail.trim_end()), now)?;
    Ok(cancelled)
}

/// The cancel itself, without its action row.
fn cancel_unrecorded(conn: &Connection, id: &str, now: i64) -> Result<bool, StoreError> {
    let found = conn
        .prepare_cached(
            "SELECT m.state, j.message_id IS NOT NULL, j.lease_until FROM messages m
             LEFT JOIN delivery_jobs j ON j.message_id = m.id WHERE m.id = ?",
        )?
        .query_row([id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, bool>(1)?,
                row.get::<_, Option<i64>>(2)?,
            ))
        })
        .optional()?;
    let found = match found {
        Some((state, has_job, lease_until)) => Some(CancelFacts {
            state: parse_state(id, &state)?,
            leased: has_job.then_some(lease_until.is_some_and(|until| until > now)),
        }),
        None => None,
    };
    let Some(finish) = transition::cancel(found) else {
        return Ok(false);
    };
    super::queue::finish_record(conn, id, &finish, None, now)?;
    Ok(true)
}

pub(super) fn resolve(
    conn: &Connection,
    id: &str,
    resolution: Resolution,
    by: &Operator,
) -> Result<Resolve, StoreError> {
    let now = now_ms();
    let state = conn
        .prepare_cached("SELECT state FROM messages WHERE id = ?")?
        .query_row([id], |row| row.get::<_, String>(0))
        .optional()?;
    let found = state.map(|s| parse_state(id, &s)).transpose()?;
    let finish = match transition::resolve(found, resolution, by) {
        Ok(finish) => finish,
        Err(refusal) => return Ok(refusal),
    };
    super::queue::finish_record(conn, id, &finish, None, now)?;
    record_action(
        conn,
        Some(id),
        Action::Resolve,
        by,
        Some(resolution.as_str()),
        now,
    )?;
    Ok(Resolve::Resolved)
}

pub(super) fn flush(conn: &Connection, id: &str, by: &Operator) -> Result<Flush, StoreError> {
    let now = now_ms();
    let found = conn
        .prepare_cached(
            "SELECT m.state, j.due_at, j.lease_until FROM messages m
             LEFT JOIN delivery_jobs j ON j.message_id = m.id WHERE m.id = ?",
        )?
        .query_row([id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, Option<i64>>(1)?,
                row.get::<_, Option<i64>>(2)?,
            ))
        })
        .optional()?;
    let found = match found {
        Some((state, due_at_ms, lease_until)) => Some(FlushFacts {
            state: parse_state(id, &state)?,
            due_at_ms,
            leased: lease_until.is_some_and(|until| until > now),
        }),
        None => None,
    };
    let flushed = match transition::flush(found, now) {
        Ok(flushed) => flushed,
        Err(refusal) => return Ok(refusal),
    };
    conn.prepare_cached("UPDATE delivery_jobs SET due_at = ? WHERE message_id = ?")?
        .execute(params![flushed.due_at_ms, id])?;
    record_action(
        conn,
        Some(id),
        Action::Flush,
        by,
        Some(&flushed.detail),
        now,
    )?;
    Ok(Flush::Flushed {
        was_due_at_ms: flushed.was_due_at_ms,
    })
}

pub(super) fn flush_all(conn: &Connection, by: &Operator) -> Result<Vec<String>, StoreError> {
    let now = now_ms();
    let mut flushed = Vec::new();
    {
        let mut waiting = conn.prepare_cached(
            "SELECT message_id, due_at FROM delivery_jobs
             WHERE due_at > ?1 AND (lease_until IS NULL OR lease_until <= ?1)",
        )?;
        let mut rows = waiting.query([now])?;
        while let Some(row) = rows.next()? {
            flushed.push((row.get::<_, String>(0)?, row.get::<_, i64>(1)?));
        }
    }
    for (id, _) in &flushed {
        conn.prepare_cached("UPDATE delivery_jobs SET due_at = ? WHERE message_id = ?")?
            .execute(params![now, id])?;
    }
    // One relay-wide action with the count, not one per record: it is one decision, and
    // `queue status` lists relay-wide actions only.
    let detail = transition::flush_all_detail(flushed.len());
    record_action(conn, None, Action::Flush, by, Some(&detail), now)?;
    Ok(flushed.into_iter().map(|(id, _)| id).collect())
}

/// Writes one operator action (relay-wide when `record_id` is `None`).
pub(super) fn record_action(
    conn: &Connection,
    record_id: Option<&str>,
    action: Action,
    by: &Operator,
    detail: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO operator_actions (at, record_id, action, actor, reason, detail)
         VALUES (?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        now,
        record_id,
        action.as_str(),
        by.actor,
        by.reason,
        detail
    ])?;
    Ok(())
}

fn parse_state(id: &str, state: &str) -> Result<State, StoreError> {
    State::parse(state).ok_or(StoreError::Corrupt {
        id: id.to_string(),
        what: "state",
    })
}
