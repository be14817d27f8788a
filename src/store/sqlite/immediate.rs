//! The SQLite writes of the before-queue mode (docs/guides/before-queue.md): leasing one
//! record by its id, and settling it with the reply the client was given.

use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::spool::{Spool, SpoolReader};
use super::write;
use crate::store::record::{now_ms, retention_ms, AttemptResult, Claimed, Settle, StoreError};

/// Leases `id` when no one holds it, no attempt was ever begun on it (else ordinary delivery,
/// with its backoff, owns it) and delivery is not paused; the claim trigger sends its scope to
/// the back of the turns as any claim does.
pub(crate) fn claim_id(
    conn: &Connection,
    spool: &SpoolReader,
    id: &str,
    owner: &str,
    lease: Duration,
) -> Result<Option<Claimed>, StoreError> {
    let now = now_ms();
    let scope: Option<String> = conn
        .prepare_cached(
            "UPDATE delivery_jobs
             SET lease_owner = ?2, lease_until = ?3, lease_token = lease_token + 1
             WHERE message_id = ?1 AND (lease_until IS NULL OR lease_until <= ?4)
               AND first_attempt_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM delivery_control WHERE paused_at IS NOT NULL)
             RETURNING scope",
        )?
        .query_row(
            params![id, owner, now.saturating_add(retention_ms(lease)), now],
            |row| row.get(0),
        )
        .optional()?;
    let Some(scope) = scope else {
        return Ok(None);
    };
    match write::claim_details(conn, spool, id.to_string(), scope, now) {
        Err(StoreError::Damaged { id, reason }) => {
            write::mark_damaged(conn, &id, &reason, now)?;
            Ok(None)
        }
        claimed => claimed.map(Some),
    }
}

/// `write::settle` and the record's new reply, in the same savepoint of the batch.
pub(crate) fn settle_answered(
    conn: &Connection,
    spool: &Mutex<Spool>,
    id: &str,
    token: i64,
    attempt: Option<(u32, &AttemptResult)>,
    settle: &Settle,
    reply: &str,
) -> Result<bool, StoreError> {
    if !write::settle(conn, spool, id, token, attempt, settle)? {
        return Ok(false);
    }
    conn.prepare_cached("UPDATE messages SET reply = ? WHERE id = ?")?
        .execute(params![reply, id])?;
    Ok(true)
}
