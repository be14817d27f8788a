//! Delivery on Postgres: leasing due jobs with `FOR UPDATE SKIP LOCKED` (and one record by
//! its id, for the before-queue mode, docs/guides/before-queue.md), the attempt ledger's intent
//! and outcome fenced by the lease token, liveness, and the relay-wide pause. Each transition
//! is decided by `store::transition`; this file only says it in Postgres SQL.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use sqlx::Row;

use super::group_commit::FencedWrite;
use super::ledger::settle_writes;
use super::matching;
use super::PostgresStore;
use crate::backend::QueueStore;
use crate::record::{
    retention_ms, AttemptResult, Claimed, Pause, Settle, StoreError, FORGET_PROCESS_AFTER,
};
use crate::rows;
use crate::transition;

/// A claim that finds damaged bodies marks them and goes on, up to this many per claim.
const DAMAGED_PER_CLAIM: usize = 16;

#[async_trait]
impl QueueStore for PostgresStore {
    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError> {
        // A damaged body is marked in a commit of its own and the claim goes on to the next
        // job, so one bad record never blocks the queue.
        for _ in 0..DAMAGED_PER_CLAIM {
            // One call (migration 11), in a batch of the delivery side's group commit: the
            // lease, the turn and the intents it closes are durable before the claim is used.
            let m = self.ledger.claim(owner, retention_ms(lease)).await?;
            let Some(m) = m else {
                return Ok(None);
            };
            let id: String = m.try_get("job_id")?;
            let scope: String = m.try_get("job_scope")?;
            let now: i64 = m.try_get("now_ms")?;
            let recovered: bool = m.try_get("recovered")?;
            let token: i64 = m.try_get("lease_token")?;
            match rows::claimed(&m, id, scope, recovered, now) {
                Err(StoreError::Damaged { id, reason }) => {
                    mark_damaged(&self.pool, &id, token, &reason, now).await?;
                }
                claimed => return claimed.map(Some),
            }
        }
        Ok(None)
    }

    async fn claim_id(
        &self,
        id: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError> {
        claim_id(&self.pool, id, owner, lease).await
    }

    async fn begin_attempt(&self, id: &str, token: i64, attempt: u32) -> Result<bool, StoreError> {
        self.ledger
            .write(FencedWrite::Intent {
                id: id.to_string(),
                token,
                attempt,
            })
            .await
    }

    async fn settle(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
    ) -> Result<bool, StoreError> {
        self.settle_replying(id, token, attempt, settle, None).await
    }

    async fn settle_answered(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
        reply: &str,
    ) -> Result<bool, StoreError> {
        self.settle_replying(id, token, attempt, settle, Some(reply))
            .await
    }

    async fn renew_lease(&self, id: &str, token: i64, lease: Duration) -> Result<bool, StoreError> {
        Ok(sqlx::query(
            "UPDATE delivery_jobs SET lease_until = idemrelay_now_ms() + $1
             WHERE message_id = $2 AND lease_token = $3 AND lease_owner IS NOT NULL
               AND lease_until > idemrelay_now_ms()",
        )
        .bind(retention_ms(lease))
        .bind(id)
        .bind(token)
        .execute(&self.pool)
        .await?
        .rows_affected()
            == 1)
    }

    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError> {
        release(&self.pool, id, token, after).await
    }

    async fn heartbeat(&self, process: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO relay_processes (id, started_at, heartbeat_at)
             VALUES ($1, idemrelay_now_ms(), idemrelay_now_ms())
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
        )
        .bind(process)
        .execute(&self.pool)
        .await?;
        sqlx::query("DELETE FROM relay_processes WHERE heartbeat_at < idemrelay_now_ms() - $1")
            .bind(retention_ms(FORGET_PROCESS_AFTER))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn reclaim_dead_leases(&self, stale_after: Duration) -> Result<u64, StoreError> {
        Ok(sqlx::query(
            "UPDATE delivery_jobs SET lease_until = idemrelay_now_ms()
             WHERE lease_owner IS NOT NULL AND lease_until > idemrelay_now_ms()
               AND EXISTS (SELECT 1 FROM relay_processes p
                           WHERE substr(delivery_jobs.lease_owner, 1, length(p.id) + 1) = p.id || '-'
                             AND p.heartbeat_at <= idemrelay_now_ms() - $1)",
        )
        .bind(retention_ms(stale_after))
        .execute(&self.pool)
        .await?
        .rows_affected())
    }

    async fn paused(&self) -> Result<Option<Pause>, StoreError> {
        let row = sqlx::query("SELECT paused_at, reason, probe FROM delivery_control WHERE id = 1")
            .fetch_one(&self.pool)
            .await?;
        let Some(since_ms) = row.try_get::<Option<i64>, _>("paused_at")? else {
            return Ok(None);
        };
        Ok(Some(Pause {
            reason: row
                .try_get::<Option<String>, _>("reason")?
                .unwrap_or_default(),
            since_ms,
            probe: row.try_get("probe")?,
        }))
    }

    async fn pause(&self, reason: &str, probe: bool) -> Result<(), StoreError> {
        // An operator's pause is never downgraded to one a probe may lift.
        sqlx::query(
            "UPDATE delivery_control SET reason = $1,
                probe = CASE WHEN paused_at IS NULL THEN $2 ELSE probe AND $2 END,
                paused_at = COALESCE(paused_at, idemrelay_now_ms())
             WHERE id = 1",
        )
        .bind(reason)
        .bind(probe)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn resume(&self) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE delivery_control SET paused_at = NULL, reason = NULL, probe = false
             WHERE id = 1",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn resume_after_probe(&self) -> Result<bool, StoreError> {
        let lifted = sqlx::query(
            "UPDATE delivery_control SET paused_at = NULL, reason = NULL, probe = false
             WHERE id = 1 AND paused_at IS NOT NULL AND probe",
        )
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(lifted == 1)
    }
}

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

impl PostgresStore {
    /// `settle`, and with `reply` the record's stored reply too (`settle_answered`).
    async fn settle_replying(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
        reply: Option<&str>,
    ) -> Result<bool, StoreError> {
        let settled = transition::settle(attempt.map(|(_, r)| r), settle);
        if !settled.late_match() && settled.dsn.is_none() && reply.is_none() {
            // Nothing but the outcome to write: one fenced statement, in a batch of the
            // delivery side's group commit (its fence takes the job's row lock first, as
            // `settle_with_more` does).
            return self
                .ledger
                .write(FencedWrite::Outcome {
                    id: id.to_string(),
                    token,
                    attempt: attempt.map(|(n, r)| (n, r.clone())),
                    settle: settle.clone(),
                })
                .await;
        }
        settle_with_more(&self.pool, id, token, attempt, &settled, reply).await
    }
}

/// An outcome with more to write (the sender's notice, a late match of upstream events, the
/// client's reply), in one transaction.
async fn settle_with_more(
    pool: &PgPool,
    id: &str,
    token: i64,
    attempt: Option<(u32, &AttemptResult)>,
    settled: &transition::Settled<'_>,
    reply: Option<&str>,
) -> Result<bool, StoreError> {
    let unresolved = settled.unresolved;
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
    let known = settled.late_match().then(|| matching::Known {
        id,
        upstream_key: key.as_deref().filter(|_| unresolved),
        upstream_id: settled.upstream_id.as_deref(),
        unresolved,
    });
    if let Some(known) = &known {
        matching::lock(&mut tx, known.lock_names()).await?;
    }
    settle_writes(id, token, Some(now), attempt, settled)
        .fetch_one(&mut *tx)
        .await?;
    if let Some(dsn) = settled.dsn {
        if super::inserts::insert_message(&mut tx, dsn, now).await? == 1 {
            super::inserts::insert_job(&mut tx, &dsn.id, now).await?;
        }
    }
    if let Some(known) = &known {
        matching::attach_unmatched(&mut tx, known, now).await?;
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
            mark_damaged(pool, &id, token, &reason, now).await?;
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
