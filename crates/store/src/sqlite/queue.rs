//! Delivery on SQLite: leasing due jobs (and one record by its id, for the before-queue mode,
//! docs/guides/before-queue.md), the attempt ledger's intent and outcome fenced by the lease
//! token, liveness, and the relay-wide pause. Writes run on the group-commit writer.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use sqlx::Row;

use super::spool::{Spool, SpoolReader, WithSpool};
use super::webhook;
use super::SqliteStore;
use crate::attempt::Phase;
use crate::backend::QueueStore;
use crate::record::{
    now_ms, retention_ms, AttemptResult, Claimed, Pause, Settle, StoreError, FORGET_PROCESS_AFTER,
};
use crate::rows;
use crate::transition::{self, Finish};

#[async_trait]
impl QueueStore for SqliteStore {
    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError> {
        let owner = owner.to_string();
        let spool = self.spool_reader.clone();
        self.writer
            .write(move |conn| claim(conn, &spool, &owner, lease))
            .await
    }

    async fn claim_id(
        &self,
        id: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError> {
        let (id, owner) = (id.to_string(), owner.to_string());
        let spool = self.spool_reader.clone();
        self.writer
            .write(move |conn| claim_id(conn, &spool, &id, &owner, lease))
            .await
    }

    async fn begin_attempt(&self, id: &str, token: i64, attempt: u32) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| begin_attempt(conn, &id, token, attempt))
            .await
    }

    async fn settle(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
    ) -> Result<bool, StoreError> {
        let id = id.to_string();
        let attempt = attempt.map(|(n, r)| (n, r.clone()));
        let settle = settle.clone();
        let spool = self.spool.clone();
        self.writer
            .write(move |conn| {
                let attempt = attempt.as_ref().map(|(n, r)| (*n, r));
                self::settle(conn, &spool, &id, token, attempt, &settle)
            })
            .await
    }

    async fn settle_answered(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
        reply: &str,
    ) -> Result<bool, StoreError> {
        let (id, reply) = (id.to_string(), reply.to_string());
        let attempt = attempt.map(|(n, r)| (n, r.clone()));
        let settle = settle.clone();
        let spool = self.spool.clone();
        self.writer
            .write(move |conn| {
                let attempt = attempt.as_ref().map(|(n, r)| (*n, r));
                settle_answered(conn, &spool, &id, token, attempt, &settle, &reply)
            })
            .await
    }

    async fn renew_lease(&self, id: &str, token: i64, lease: Duration) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| renew_lease(conn, &id, token, lease))
            .await
    }

    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| release(conn, &id, token, after))
            .await
    }

    async fn heartbeat(&self, process: &str) -> Result<(), StoreError> {
        let me = process.to_string();
        let others = self.writer.write(move |conn| heartbeat(conn, &me)).await?;
        let alive = self
            .siblings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alive(others);
        for other in alive {
            tracing::warn!(
                target: "idemrelay::store",
                this_process = process,
                other_process = %other,
                "another relay process is serving this SQLite store too; they take turns at its write lock. If that is not meant, stop one of them; several instances belong on a shared Postgres store"
            );
        }
        Ok(())
    }

    async fn reclaim_dead_leases(&self, stale_after: Duration) -> Result<u64, StoreError> {
        self.writer
            .write(move |conn| reclaim_dead_leases(conn, stale_after))
            .await
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
        let reason = reason.to_string();
        self.writer
            .write(move |conn| pause(conn, &reason, probe))
            .await
    }

    async fn resume(&self) -> Result<(), StoreError> {
        self.writer.write(resume).await
    }

    async fn resume_after_probe(&self) -> Result<bool, StoreError> {
        self.writer.write(resume_after_probe).await
    }
}

/// A claim that finds damaged bodies marks them and goes on to the next job, up to this many
/// per claim (the next claim continues).
const DAMAGED_PER_CLAIM: usize = 16;

/// An intent left open by a worker that lost its lease: whether the upstream got the message
/// cannot be known, so it is recorded as UNKNOWN (docs/concepts/delivery.md), never as not sent.
fn close_open_intents(conn: &Connection, id: &str, now: i64) -> Result<usize, StoreError> {
    Ok(conn
        .prepare_cached(
            "UPDATE attempts SET outcome = 'unknown', finished_at = ?,
                reply = 'worker stopped with this attempt open; outcome unknown'
             WHERE message_id = ? AND outcome IS NULL",
        )?
        .execute(params![now, id])?)
}

const CLAIM_DETAILS: &str = "SELECT m.idem_key, m.mail_from, m.rcpt_to, m.body_type,
        m.smtputf8, m.requests, m.content, m.content_hash, m.spool_segment, m.spool_offset, m.size, m.accepted_at, j.first_attempt_at, j.lease_token,
        (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id) AS attempts,
        EXISTS (SELECT 1 FROM attempts a
                WHERE a.message_id = m.id AND a.outcome = 'unknown') AS any_unknown,
        EXISTS (SELECT 1 FROM attempts a
                WHERE a.message_id = m.id AND a.outcome IS NULL) AS open_intent
     FROM messages m JOIN delivery_jobs j ON j.message_id = m.id WHERE m.id = ?";

pub(super) fn claim(
    conn: &Connection,
    spool: &SpoolReader,
    owner: &str,
    lease: Duration,
) -> Result<Option<Claimed>, StoreError> {
    let now = now_ms();
    for _ in 0..DAMAGED_PER_CLAIM {
        let Some((id, scope)) = lease_next(conn, owner, lease, now)? else {
            return Ok(None);
        };
        match claim_details(conn, spool, id, scope, now) {
            Err(StoreError::Damaged { id, reason }) => mark_damaged(conn, &id, &reason, now)?,
            claimed => return claimed.map(Some),
        }
    }
    Ok(None)
}

/// Leases the head of the next scope's queue: one statement (an index probe per scope); a
/// trigger moves that scope to the back of the turns.
fn lease_next(
    conn: &Connection,
    owner: &str,
    lease: Duration,
    now: i64,
) -> Result<Option<(String, String)>, StoreError> {
    Ok(conn
        .prepare_cached(
            "UPDATE delivery_jobs
             SET lease_owner = ?2, lease_until = ?3, lease_token = lease_token + 1
             WHERE message_id = (
                SELECT message_id FROM (
                    SELECT t.scope, t.turn,
                        (SELECT j.message_id FROM delivery_jobs j
                         WHERE j.scope = t.scope AND j.due_at <= ?1
                           AND (j.lease_until IS NULL OR j.lease_until <= ?1)
                         ORDER BY j.due_at, j.rowid LIMIT 1) AS message_id
                    FROM scope_turns t
                    WHERE NOT EXISTS
                        (SELECT 1 FROM delivery_control WHERE paused_at IS NOT NULL))
                WHERE message_id IS NOT NULL
                ORDER BY turn, scope
                LIMIT 1)
             RETURNING message_id, scope",
        )?
        .query_row(
            params![now, owner, now.saturating_add(retention_ms(lease))],
            |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
        )
        .optional()?)
}

/// The leased job's message, its body checked, and the facts of its ledger.
pub(super) fn claim_details(
    conn: &Connection,
    spool: &SpoolReader,
    id: String,
    scope: String,
    now: i64,
) -> Result<Claimed, StoreError> {
    let details = |recovered: bool| {
        conn.prepare_cached(CLAIM_DETAILS)?
            .query_row([&id], |row| {
                Ok((
                    row.get::<_, bool>("open_intent")?,
                    rows::claimed(
                        &WithSpool { row, spool },
                        id.clone(),
                        scope.clone(),
                        recovered,
                        now,
                    ),
                ))
            })
            .map_err(StoreError::from)
    };
    let (open_intent, claimed) = details(false)?;
    if !open_intent {
        return claimed;
    }
    // Rare: a worker lost this lease with its attempt open. Closing it as UNKNOWN changes the
    // ledger just read, so it is read again.
    let recovered = close_open_intents(conn, &id, now)? > 0;
    details(recovered)?.1
}

/// A record whose body cannot be used is failed with the reason, in this commit, so that it
/// never blocks the queue and is never forwarded; an open intent stays on record as UNKNOWN.
pub(super) fn mark_damaged(
    conn: &Connection,
    id: &str,
    reason: &str,
    now: i64,
) -> Result<(), StoreError> {
    finish_record(
        conn,
        id,
        &transition::damaged(id, reason),
        Some(reason),
        now,
    )
}

/// Writes a `Finish`: the record's terminal state and reply (and damage mark, if any), its
/// job row gone.
pub(super) fn finish_record(
    conn: &Connection,
    id: &str,
    finish: &Finish,
    damage: Option<&str>,
    now: i64,
) -> Result<(), StoreError> {
    if finish.close_open_intents {
        close_open_intents(conn, id, now)?;
    }
    conn.prepare_cached(
        "UPDATE messages SET state = ?, damage = COALESCE(?, damage), upstream_reply = ?,
            finished_at = ?
         WHERE id = ?",
    )?
    .execute(params![
        finish.state.as_str(),
        damage,
        finish.upstream_reply,
        now,
        id
    ])?;
    conn.prepare_cached("DELETE FROM delivery_jobs WHERE message_id = ?")?
        .execute([id])?;
    Ok(())
}

pub(super) fn begin_attempt(
    conn: &Connection,
    id: &str,
    token: i64,
    attempt: u32,
) -> Result<bool, StoreError> {
    // The intent is written only under the lease; a trigger records the first attempt's time
    // on the job.
    // ... and only while the lease lasts: once expired it may be another worker's any moment.
    let now = now_ms();
    let written = conn
        .prepare_cached(
            "INSERT INTO attempts (message_id, attempt, owner, started_at)
             SELECT message_id, ?1, lease_owner, ?2 FROM delivery_jobs
             WHERE message_id = ?3 AND lease_token = ?4 AND lease_owner IS NOT NULL
               AND lease_until > ?2",
        )?
        .execute(params![i64::from(attempt), now, id, token])?;
    Ok(written == 1)
}

pub(super) fn settle(
    conn: &Connection,
    spool: &Mutex<Spool>,
    id: &str,
    token: i64,
    attempt: Option<(u32, &AttemptResult)>,
    settle: &Settle,
) -> Result<bool, StoreError> {
    let now = now_ms();
    let settled = transition::settle(attempt.map(|(_, r)| r), settle);
    // The job's own statement goes first, fenced by the token: when it changes nothing, the
    // lease was taken over and nothing else is written.
    let held = match settled.retry_after {
        Some(after) => conn
            .prepare_cached(
                "UPDATE delivery_jobs SET due_at = ?, attempts = attempts + 1,
                    lease_owner = NULL, lease_until = NULL
                 WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL",
            )?
            .execute(params![now.saturating_add(retention_ms(after)), id, token])?,
        None => conn
            .prepare_cached(
                "DELETE FROM delivery_jobs
                 WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL",
            )?
            .execute(params![id, token])?,
    } == 1;
    if !held {
        // Our lease was taken over; the new holder owns the record now.
        return Ok(false);
    }
    if let Some((attempt, result)) = attempt {
        conn.prepare_cached(
            "UPDATE attempts SET finished_at = ?, outcome = ?, phase = ?, code = ?, reply = ?,
                upstream_id = ?
             WHERE message_id = ? AND attempt = ?",
        )?
        .execute(params![
            now,
            result.outcome.as_str(),
            result.phase.map(Phase::as_str),
            result.code.map(i64::from),
            result.reply,
            settled.upstream_id,
            id,
            i64::from(attempt),
        ])?;
    }
    if let Some((state, reply)) = settled.finish {
        conn.prepare_cached(
            "UPDATE messages SET state = ?, upstream_reply = ?, finished_at = ? WHERE id = ?",
        )?
        .execute(params![state.as_str(), reply, now, id])?;
    }
    if let Some(dsn) = settled.dsn {
        super::intake::insert_message(conn, spool, dsn, now)?;
    }
    if settled.late_match() {
        late_match_after_settle(conn, id, &settled)?;
    }
    Ok(true)
}

/// The record is known by more now: its upstream id (an accepted attempt), or its being
/// unresolved, which events already kept may resolve at once.
fn late_match_after_settle(
    conn: &Connection,
    id: &str,
    settled: &transition::Settled,
) -> Result<(), StoreError> {
    let unresolved = settled.unresolved;
    let upstream_key = webhook::upstream_key(conn, id)?;
    webhook::attach_unmatched(
        conn,
        &webhook::Known {
            id,
            upstream_key: upstream_key.as_deref().filter(|_| unresolved),
            upstream_id: settled.upstream_id.as_deref(),
            unresolved,
        },
    )
}

pub(super) fn renew_lease(
    conn: &Connection,
    id: &str,
    token: i64,
    lease: Duration,
) -> Result<bool, StoreError> {
    let now = now_ms();
    let renewed = conn
        .prepare_cached(
            "UPDATE delivery_jobs SET lease_until = ?
             WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL
               AND lease_until > ?",
        )?
        .execute(params![
            now.saturating_add(retention_ms(lease)),
            id,
            token,
            now
        ])?;
    Ok(renewed == 1)
}

/// Writes `process`'s heartbeat; returns the other processes' last heartbeats (id, Unix ms),
/// which tell whether another relay serves this file too.
pub(super) fn heartbeat(
    conn: &Connection,
    process: &str,
) -> Result<Vec<(String, i64)>, StoreError> {
    let now = now_ms();
    conn.prepare_cached(
        "INSERT INTO relay_processes (id, started_at, heartbeat_at) VALUES (?1, ?2, ?2)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
    )?
    .execute(params![process, now])?;
    conn.prepare_cached("DELETE FROM relay_processes WHERE heartbeat_at < ?")?
        .execute([now.saturating_sub(retention_ms(FORGET_PROCESS_AFTER))])?;
    let others = conn
        .prepare_cached("SELECT id, heartbeat_at FROM relay_processes WHERE id <> ?")?
        .query_map([process], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok(others)
}

/// Ends the leases of relays whose heartbeat stopped. It runs every two seconds in the one
/// writer, so it must walk the leased jobs only (`delivery_jobs_leased`), never the queue.
pub(super) const RECLAIM_DEAD_LEASES: &str = "UPDATE delivery_jobs SET lease_until = ?1
     WHERE lease_owner IS NOT NULL AND lease_until > ?1
       AND EXISTS (SELECT 1 FROM relay_processes p
                   WHERE substr(delivery_jobs.lease_owner, 1, length(p.id) + 1) = p.id || '-'
                     AND p.heartbeat_at <= ?2)";

pub(super) fn reclaim_dead_leases(
    conn: &Connection,
    stale_after: Duration,
) -> Result<u64, StoreError> {
    let now = now_ms();
    Ok(conn
        .prepare_cached(RECLAIM_DEAD_LEASES)?
        .execute(params![now, now.saturating_sub(retention_ms(stale_after))])? as u64)
}

/// Gives a lease back without an attempt's outcome (the worker did not send): the job is due
/// again `after` from now, or later if it was already due later; only the lease holder's
/// token releases it.
pub(super) fn release(
    conn: &Connection,
    id: &str,
    token: i64,
    after: Duration,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE delivery_jobs SET lease_owner = NULL, lease_until = NULL,
            due_at = MAX(due_at, ?)
         WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL",
    )?
    .execute(params![
        now_ms().saturating_add(retention_ms(after)),
        id,
        token
    ])?;
    Ok(())
}

pub(super) fn pause(conn: &Connection, reason: &str, probe: bool) -> Result<(), StoreError> {
    // An operator's pause is never downgraded to one a probe may lift.
    conn.prepare_cached(
        "UPDATE delivery_control SET reason = ?1,
            probe = CASE WHEN paused_at IS NULL THEN ?2 ELSE probe AND ?2 END,
            paused_at = COALESCE(paused_at, ?3)
         WHERE id = 1",
    )?
    .execute(params![reason, probe, now_ms()])?;
    Ok(())
}

pub(super) fn resume(conn: &Connection) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE delivery_control SET paused_at = NULL, reason = NULL, probe = 0 WHERE id = 1",
    )?
    .execute([])?;
    Ok(())
}

pub(super) fn resume_after_probe(conn: &Connection) -> Result<bool, StoreError> {
    let lifted = conn
        .prepare_cached(
            "UPDATE delivery_control SET paused_at = NULL, reason = NULL, probe = 0
             WHERE id = 1 AND paused_at IS NOT NULL AND probe",
        )?
        .execute([])?;
    Ok(lifted == 1)
}

/// Leases `id` when no one holds it, no attempt was ever begun on it (else ordinary delivery,
/// with its backoff, owns it) and delivery is not paused; the claim trigger sends its scope to
/// the back of the turns as any claim does.
pub(super) fn claim_id(
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
    match claim_details(conn, spool, id.to_string(), scope, now) {
        Err(StoreError::Damaged { id, reason }) => {
            mark_damaged(conn, &id, &reason, now)?;
            Ok(None)
        }
        claimed => claimed.map(Some),
    }
}

/// `settle` and the record's new reply, in the same savepoint of the batch.
pub(super) fn settle_answered(
    conn: &Connection,
    spool: &Mutex<Spool>,
    id: &str,
    token: i64,
    attempt: Option<(u32, &AttemptResult)>,
    settle: &Settle,
    reply: &str,
) -> Result<bool, StoreError> {
    if !self::settle(conn, spool, id, token, attempt, settle)? {
        return Ok(false);
    }
    conn.prepare_cached("UPDATE messages SET reply = ? WHERE id = ?")?
        .execute(params![reply, id])?;
    Ok(true)
}
