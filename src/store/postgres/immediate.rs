//! The Postgres lease of one record by its id, for the before-queue mode
//! (docs/guides/before-queue.md).

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::Row;

use super::write;
use crate::store::record::{retention_ms, Claimed, StoreError};
use crate::store::rows;

/// Leases `id` when no one holds it, no attempt was ever begun on it (else ordinary delivery,
/// with its backoff, owns it: another instance may have tried it and backed off) and delivery
/// is not paused, in one statement (one commit). Unlike the ordinary claim it does not move the scope's turn: the record jumps the
/// queue only because its client is waiting for it. A record with an intent left open is
/// handed straight back: closing it as UNKNOWN is the ordinary claim's work.
pub(super) async fn claim_id(
    pool: &PgPool,
    id: &str,
    owner: &str,
    lease: Duration,
) -> Result<Option<Claimed>, StoreError> {
    let row = sqlx::query(
        "WITH clock AS MATERIALIZED (SELECT idemrelay_now_ms() AS now_ms),
         leased AS (
            UPDATE delivery_jobs j
            SET lease_owner = $2,
                lease_until = LEAST(c.now_ms::NUMERIC + $3, 9223372036854775807)::BIGINT,
                lease_token = j.lease_token + 1
            FROM clock c
            WHERE j.message_id = $1 AND (j.lease_until IS NULL OR j.lease_until <= c.now_ms)
              AND j.first_attempt_at IS NULL
              AND NOT EXISTS (SELECT 1 FROM delivery_control WHERE paused_at IS NOT NULL)
            RETURNING j.message_id, j.scope, j.lease_token, j.first_attempt_at, c.now_ms)
         SELECT l.scope AS job_scope, l.now_ms, m.idem_key, m.mail_from, m.rcpt_to,
            m.body_type, m.smtputf8, m.requests, m.content, m.content_hash, m.accepted_at,
            l.first_attempt_at, l.lease_token,
            (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id) AS attempts,
            EXISTS (SELECT 1 FROM attempts a
                    WHERE a.message_id = m.id AND a.outcome = 'unknown') AS any_unknown,
            EXISTS (SELECT 1 FROM attempts a
                    WHERE a.message_id = m.id AND a.outcome IS NULL) AS open_intent
         FROM leased l JOIN messages m ON m.id = l.message_id",
    )
    .bind(id)
    .bind(owner)
    .bind(retention_ms(lease))
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let token: i64 = row.try_get("lease_token")?;
    let now: i64 = row.try_get("now_ms")?;
    if row.try_get::<bool, _>("open_intent")? {
        give_back(pool, id, token).await?;
        return Ok(None);
    }
    let scope: String = row.try_get("job_scope")?;
    match rows::claimed(&row, id.to_string(), scope, false, now) {
        Err(StoreError::Damaged { id, reason }) => {
            write::mark_damaged(pool, &id, token, &reason, now).await?;
            Ok(None)
        }
        claimed => claimed.map(Some),
    }
}

async fn give_back(pool: &PgPool, id: &str, token: i64) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE delivery_jobs SET lease_owner = NULL, lease_until = NULL
         WHERE message_id = $1 AND lease_token = $2 AND lease_owner IS NOT NULL",
    )
    .bind(id)
    .bind(token)
    .execute(pool)
    .await?;
    Ok(())
}
