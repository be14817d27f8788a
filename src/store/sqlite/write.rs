//! The SQLite store's write operations, run by the group-commit writer on its own thread
//! (rusqlite, synchronous): inside one batch transaction, each under its own savepoint.
//! Reads stay on sqlx's pool.

use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::spool::{Spool, SpoolReader, WithSpool, SPOOL_MIN};
use super::webhook;
use crate::store::record::{
    body_checksum, now_ms, retention_ms, Action, AttemptResult, Claimed, Flush, Insert, NewRecord,
    Operator, Requeue, Resolution, Resolve, Settle, State, StoreError, FORGET_PROCESS_AFTER,
};
use crate::store::retention::Retention;
use crate::store::rows;
use crate::store::transition::{self, CancelFacts, Finish, FlushFacts, RequeueFacts};

/// A claim that finds damaged bodies marks them and goes on to the next job, up to this many
/// per claim (the next claim continues).
const DAMAGED_PER_CLAIM: usize = 16;

/// Inserts a message row unless its (scope, key) is taken; returns the rows inserted. A
/// queued record's delivery job comes with it (a trigger). A large body goes to the spool
/// (synced before the batch commits); a row that is not inserted leaves only unreferenced
/// bytes there.
fn insert_message(
    conn: &Connection,
    spool: &Mutex<Spool>,
    record: &NewRecord,
    now: i64,
) -> Result<usize, StoreError> {
    let (inline, spooled) = match record.content.as_deref() {
        Some(body) if body.len() >= SPOOL_MIN => {
            // A replay must not append its body again only to be refused by the conflict.
            let taken = conn
                .prepare_cached(
                    "SELECT 1 FROM messages WHERE scope = ? AND idem_key = ? AND part = ?",
                )?
                .exists(params![record.scope, record.key, record.part])?;
            if taken {
                return Ok(0);
            }
            let at = spool
                .lock()
                .expect("spool lock")
                .append(body)
                .map_err(|e| StoreError::Spool(format!("append: {e}")))?;
            (None, Some(at))
        }
        body => (body, None),
    };
    let checksum = record.content.as_deref().map(body_checksum);
    Ok(conn
        .prepare_cached(
            "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at, dsn_of,
                spool_segment, spool_offset, content_hash, part, message_fp, upstream_key,
                header_message_id, requests)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (scope, idem_key, part) DO NOTHING",
        )?
        .execute(params![
            record.id,
            record.scope,
            record.key,
            record.key_source,
            &record.fingerprint.as_bytes()[..],
            record.envelope.mail_from,
            record.envelope.rcpt_to.join("\n"),
            record.envelope.body.as_str(),
            record.envelope.smtputf8,
            i64::try_from(record.size).unwrap_or(i64::MAX),
            inline,
            record.state.as_str(),
            record.reply,
            now,
            record.dsn_of,
            spooled.map(|at| at.segment),
            spooled.map(|at| at.offset),
            checksum.as_ref().map(|c| &c[..]),
            record.part,
            &record.message_fp.as_bytes()[..],
            record.upstream_key,
            record.message_id,
            record.envelope.requests.to_stored(),
        ])?)
}

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

pub(crate) fn insert(
    conn: &Connection,
    spool: &Mutex<Spool>,
    record: &NewRecord,
    retention: Retention,
) -> Result<Insert, StoreError> {
    let now = now_ms();
    if insert_message(conn, spool, record, now)? == 0 {
        let key = record.key.as_deref().unwrap_or_default();
        let mut live = Vec::new();
        let mut statement = conn.prepare_cached(&format!(
            "SELECT {}, accepted_at, finished_at,
                (SELECT MAX(a.started_at) FROM attempts a WHERE a.message_id = m.id)
                    AS last_attempt_at
             FROM messages m WHERE scope = ? AND idem_key = ? ORDER BY part",
            rows::EXISTING_COLUMNS
        ))?;
        let mut found = statement.query(params![record.scope, key])?;
        while let Some(row) = found.next()? {
            let existing = rows::existing(row)?;
            let expired = retention.expired(
                existing.state,
                row.get("accepted_at")?,
                row.get("finished_at")?,
                row.get("last_attempt_at")?,
                now,
            );
            if !expired {
                live.push(existing);
            }
        }
        if !live.is_empty() {
            return Ok(Insert::Existing(live));
        }
        // Every record under the key has expired: the key starts a new operation.
        conn.prepare_cached("DELETE FROM messages WHERE scope = ? AND idem_key = ?")?
            .execute(params![record.scope, key])?;
        let inserted = insert_message(conn, spool, record, now)?;
        debug_assert_eq!(inserted, 1);
    }
    if record.state == State::Queued {
        webhook::attach_unmatched(conn, &webhook::Known::inserted(record))?;
    }
    // The batch commits after this: the record is written but not durable.
    failpoint!("intake.before_commit");
    Ok(Insert::Inserted)
}

pub(crate) fn finish(
    conn: &Connection,
    id: &str,
    state: State,
    upstream_reply: Option<&str>,
) -> Result<bool, StoreError> {
    let updated = conn
        .prepare_cached(
            "UPDATE messages SET state = ?, upstream_reply = ?, finished_at = ?
             WHERE id = ? AND state = 'queued'",
        )?
        .execute(params![state.as_str(), upstream_reply, now_ms(), id])?;
    conn.prepare_cached("DELETE FROM delivery_jobs WHERE message_id = ?")?
        .execute([id])?;
    Ok(updated == 1)
}

/// The retention purge's DELETE; its parameters are now, then `Retention::sql_params`.
pub(super) fn purge_sql() -> String {
    format!(
        "DELETE FROM messages AS m WHERE {}",
        Retention::expired_sql("?1", "?2", "?3", "?4")
    )
}

pub(crate) fn purge_expired(conn: &Connection, retention: Retention) -> Result<u64, StoreError> {
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

const CLAIM_DETAILS: &str = "SELECT m.idem_key, m.mail_from, m.rcpt_to, m.body_type,
        m.smtputf8, m.requests, m.content, m.content_hash, m.spool_segment, m.spool_offset, m.size, m.accepted_at, j.first_attempt_at, j.lease_token,
        (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id) AS attempts,
        EXISTS (SELECT 1 FROM attempts a
                WHERE a.message_id = m.id AND a.outcome = 'unknown') AS any_unknown,
        EXISTS (SELECT 1 FROM attempts a
                WHERE a.message_id = m.id AND a.outcome IS NULL) AS open_intent
     FROM messages m JOIN delivery_jobs j ON j.message_id = m.id WHERE m.id = ?";

pub(crate) fn claim(
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
fn finish_record(
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

pub(crate) fn begin_attempt(
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

pub(crate) fn settle(
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
            result.outcome,
            result.phase,
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
        insert_message(conn, spool, dsn, now)?;
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

pub(crate) fn renew_lease(
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
pub(crate) fn heartbeat(
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

pub(crate) fn reclaim_dead_leases(
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
pub(crate) fn release(
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

pub(crate) fn requeue(
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

pub(crate) fn cancel(conn: &Connection, id: &str, by: &Operator) -> Result<bool, StoreError> {
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
pub(crate) fn cancel_all(
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
    finish_record(conn, id, &finish, None, now)?;
    Ok(true)
}

pub(crate) fn resolve(
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
    finish_record(conn, id, &finish, None, now)?;
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

pub(crate) fn flush(conn: &Connection, id: &str, by: &Operator) -> Result<Flush, StoreError> {
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

pub(crate) fn flush_all(conn: &Connection, by: &Operator) -> Result<Vec<String>, StoreError> {
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
pub(crate) fn record_action(
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

pub(crate) fn pause(conn: &Connection, reason: &str, probe: bool) -> Result<(), StoreError> {
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

pub(crate) fn resume(conn: &Connection) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE delivery_control SET paused_at = NULL, reason = NULL, probe = 0 WHERE id = 1",
    )?
    .execute([])?;
    Ok(())
}

pub(crate) fn claim_key_space(
    conn: &Connection,
    key_space: &str,
    scope: &str,
) -> Result<String, StoreError> {
    conn.prepare_cached(
        "INSERT INTO upstream_key_owners (key_space, scope, claimed_at) VALUES (?, ?, ?)
         ON CONFLICT (key_space) DO NOTHING",
    )?
    .execute(params![key_space, scope, now_ms()])?;
    Ok(conn
        .prepare_cached("SELECT scope FROM upstream_key_owners WHERE key_space = ?")?
        .query_row([key_space], |row| row.get(0))?)
}

pub(crate) fn resume_after_probe(conn: &Connection) -> Result<bool, StoreError> {
    let lifted = conn
        .prepare_cached(
            "UPDATE delivery_control SET paused_at = NULL, reason = NULL, probe = 0
             WHERE id = 1 AND paused_at IS NOT NULL AND probe",
        )?
        .execute([])?;
    Ok(lifted == 1)
}

pub(crate) fn record_replay(conn: &Connection, scope: &str, day: &str) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO daily_counts (scope, day, replayed) VALUES (?, ?, 1)
         ON CONFLICT (scope, day) DO UPDATE SET replayed = daily_counts.replayed + 1",
    )?
    .execute(params![scope, day])?;
    Ok(())
}

fn parse_state(id: &str, state: &str) -> Result<State, StoreError> {
    State::parse(state).ok_or(StoreError::Corrupt {
        id: id.to_string(),
        what: "state",
    })
}
