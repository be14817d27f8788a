//! The embedded SQLite backend: WAL, `synchronous=FULL`, every write under `BEGIN IMMEDIATE`.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row, SqliteConnection};

use super::group_commit::Writer;
use super::migrate::{Embedded, Steps};
use super::rows;
use super::{
    now_ms, retention_ms, utc_day, AttemptResult, AttemptRow, Claimed, DailyCounts, Existing,
    Insert, MessageSummary, NewRecord, Pause, QueueStats, Requeue, Settle, State, Store,
    StoreError, StoredMessage,
};

const MIGRATIONS: Steps = &[
    (
        1,
        "messages",
        include_str!("../../migrations/sqlite/0001_messages.sql"),
    ),
    (
        2,
        "delivery",
        include_str!("../../migrations/sqlite/0002_delivery.sql"),
    ),
    (
        3,
        "fencing",
        include_str!("../../migrations/sqlite/0003_fencing.sql"),
    ),
    (
        4,
        "daily_counts",
        include_str!("../../migrations/sqlite/0004_daily_counts.sql"),
    ),
    (
        5,
        "claim_by_scope",
        include_str!("../../migrations/sqlite/0005_claim_by_scope.sql"),
    ),
];

pub struct SqliteStore {
    /// Readers; WAL lets them run beside the writer.
    pool: SqlitePool,
    /// Every write goes through the group-commit writer.
    writer: Writer,
}

/// A statement whose bound values it owns, so that it can wait for the writer.
type Statement = sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'static>>;

const TERMINAL_STATES: &str = "('delivered', 'failed', 'unresolved', 'rejected')";

impl SqliteStore {
    pub async fn open(url: &str, busy_timeout: Duration) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(busy_timeout);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(busy_timeout + Duration::from_secs(1))
            .connect_with(options.clone())
            .await?;
        // NORMAL would not fsync the WAL on commit: a 250 could outlive a power cut's loss.
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&pool)
            .await?;
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await?;
        if synchronous != 2 || !journal.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Config(format!(
                "SQLite must run journal_mode=WAL with synchronous=FULL, found {journal} / {synchronous}"
            )));
        }
        Migrator::new(Embedded(MIGRATIONS))
            .await?
            .run(&pool)
            .await?;
        let writer = Writer::start(options.connect().await?);
        Ok(SqliteStore { pool, writer })
    }

    /// One write statement, run in the next group commit; returns the rows it changed.
    async fn write_one(&self, statement: Statement) -> Result<u64, StoreError> {
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move { Ok(statement.execute(&mut *tx).await?.rows_affected()) })
            })
            .await
    }
}

/// Inserts a message row unless its (scope, key) is taken; returns the rows inserted.
async fn insert_message(
    conn: &mut SqliteConnection,
    record: &NewRecord,
    now: i64,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
            rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at, dsn_of)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (scope, idem_key) DO NOTHING",
    )
    .bind(&record.id)
    .bind(&record.scope)
    .bind(&record.key)
    .bind(record.key_source)
    .bind(&record.fingerprint.as_bytes()[..])
    .bind(&record.envelope.mail_from)
    .bind(record.envelope.rcpt_to.join("\n"))
    .bind(record.envelope.body.as_str())
    .bind(record.envelope.smtputf8)
    .bind(record.size as i64)
    .bind(record.content.as_deref())
    .bind(record.state.as_str())
    .bind(&record.reply)
    .bind(now)
    .bind(&record.dsn_of)
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// An intent left open by a worker that lost its lease: whether the upstream got the message
/// cannot be known, so it is recorded as UNKNOWN (DESIGN §2), never as not sent.
async fn close_open_intents(
    conn: &mut SqliteConnection,
    id: &str,
    now: i64,
) -> Result<u64, StoreError> {
    Ok(sqlx::query(
        "UPDATE attempts SET outcome = 'unknown', finished_at = ?,
            reply = 'worker stopped with this attempt open; outcome unknown'
         WHERE message_id = ? AND outcome IS NULL",
    )
    .bind(now)
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// The job of a record put back in the queue (a new queued record gets its job from a
/// trigger).
async fn insert_job(
    conn: &mut SqliteConnection,
    id: &str,
    scope: &str,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO delivery_jobs (message_id, scope, due_at) VALUES (?, ?, ?)")
        .bind(id)
        .bind(scope)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn insert(&self, record: &NewRecord, retention: Duration) -> Result<Insert, StoreError> {
        let record = record.clone();
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move {
                    let record = &record;
                    let now = now_ms();
                    let mut inserted = insert_message(&mut *tx, record, now).await? == 1;
                    if !inserted {
                        let key = record.key.as_deref().unwrap_or_default();
                        let row = sqlx::query(
                            "SELECT id, fingerprint, reply, state, accepted_at FROM messages
                     WHERE scope = ? AND idem_key = ?",
                        )
                        .bind(&record.scope)
                        .bind(key)
                        .fetch_one(&mut *tx)
                        .await?;
                        let existing = rows::existing(&row)?;
                        let accepted_at: i64 = row.try_get("accepted_at")?;
                        let expired = existing.state.is_terminal()
                            && accepted_at.saturating_add(retention_ms(retention)) <= now;
                        if !expired {
                            return Ok(Insert::Existing(existing));
                        }
                        sqlx::query("DELETE FROM messages WHERE id = ?")
                            .bind(&existing.id)
                            .execute(&mut *tx)
                            .await?;
                        inserted = insert_message(&mut *tx, record, now).await? == 1;
                    }
                    debug_assert!(inserted);
                    // A queued record's delivery job comes with it (a trigger).
                    // The batch commits after this: the record is written but not durable.
                    failpoint!("intake.before_commit");
                    Ok(Insert::Inserted)
                })
            })
            .await
    }

    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        retention: Duration,
    ) -> Result<Option<Existing>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT id, fingerprint, reply, state FROM messages
             WHERE scope = ? AND idem_key = ?
               AND NOT (state IN {TERMINAL_STATES} AND accepted_at + ? <= ?)"
        ))
        .bind(scope)
        .bind(key)
        .bind(retention_ms(retention))
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(rows::existing).transpose()
    }

    async fn message(&self, id: &str) -> Result<Option<StoredMessage>, StoreError> {
        let row = sqlx::query(
            "SELECT m.*, EXISTS (SELECT 1 FROM delivery_jobs j WHERE j.message_id = m.id) AS has_job
             FROM messages m WHERE m.id = ?",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(rows::stored_message(&row)?))
    }

    async fn finish(
        &self,
        id: &str,
        state: State,
        upstream_reply: Option<&str>,
    ) -> Result<bool, StoreError> {
        let id = id.to_string();
        let upstream_reply = upstream_reply.map(str::to_string);
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move {
                    let id = id.as_str();
                    let upstream_reply = upstream_reply.as_deref();
                    let updated = sqlx::query(
                        "UPDATE messages SET state = ?, upstream_reply = ?, finished_at = ?
                 WHERE id = ? AND state = 'queued'",
                    )
                    .bind(state.as_str())
                    .bind(upstream_reply)
                    .bind(now_ms())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    sqlx::query("DELETE FROM delivery_jobs WHERE message_id = ?")
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    Ok(updated == 1)
                })
            })
            .await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.writer
            .write(|_: &mut SqliteConnection| Box::pin(async { Ok(()) }))
            .await
    }

    async fn purge_expired(&self, retention: Duration) -> Result<u64, StoreError> {
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move {
                    let deleted = sqlx::query(&format!(
                "DELETE FROM messages WHERE state IN {TERMINAL_STATES} AND accepted_at + ? <= ?"
            ))
                    .bind(retention_ms(retention))
                    .bind(now_ms())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    Ok(deleted)
                })
            })
            .await
    }

    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError> {
        let owner = owner.to_string();
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move {
                    let owner = owner.as_str();
                    let now = now_ms();
                    // One statement finds the head of the next scope's queue and leases it; a
                    // trigger moves that scope to the back of the turns.
                    let row = sqlx::query(
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
                    )
                    .bind(now)
                    .bind(owner)
                    .bind(now.saturating_add(retention_ms(lease)))
                    .fetch_optional(&mut *tx)
                    .await?;
                    let Some(row) = row else {
                        return Ok(None);
                    };
                    let id: String = row.try_get("message_id")?;
                    let scope: String = row.try_get("scope")?;
                    let details = "SELECT m.idem_key, m.mail_from, m.rcpt_to, m.body_type,
                            m.smtputf8, m.content, m.accepted_at, j.first_attempt_at, j.lease_token,
                            (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id) AS attempts,
                            EXISTS (SELECT 1 FROM attempts a
                                    WHERE a.message_id = m.id AND a.outcome = 'unknown') AS any_unknown,
                            EXISTS (SELECT 1 FROM attempts a
                                    WHERE a.message_id = m.id AND a.outcome IS NULL) AS open_intent
                         FROM messages m JOIN delivery_jobs j ON j.message_id = m.id WHERE m.id = ?";
                    let mut m = sqlx::query(details).bind(&id).fetch_one(&mut *tx).await?;
                    // Rare: a worker lost this lease with its attempt open.
                    let recovered = m.try_get::<bool, _>("open_intent")?
                        && close_open_intents(&mut *tx, &id, now).await? > 0;
                    if recovered {
                        m = sqlx::query(details).bind(&id).fetch_one(&mut *tx).await?;
                    }
                    Ok(Some(rows::claimed(&m, id, scope, recovered, now)?))
                })
            })
            .await
    }

    async fn begin_attempt(&self, id: &str, token: i64, attempt: u32) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move {
                    let id = id.as_str();
                    let now = now_ms();
                    // The intent is written only under the lease; a trigger records the first
                    // attempt's time on the job.
                    let held = sqlx::query(
                        "INSERT INTO attempts (message_id, attempt, owner, started_at)
                         SELECT message_id, ?, lease_owner, ? FROM delivery_jobs
                         WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL",
                    )
                    .bind(attempt as i64)
                    .bind(now)
                    .bind(id)
                    .bind(token)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                        == 1;
                    Ok(held)
                })
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
        let id = id.to_string();
        let attempt = attempt.map(|(n, r)| (n, r.clone()));
        let settle = settle.clone();
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move {
                    let id = id.as_str();
                    let attempt = attempt.as_ref().map(|(n, r)| (*n, r));
                    let settle = &settle;
                    let now = now_ms();
                    // The job's own statement goes first, fenced by the token: when it
                    // changes nothing, the lease was taken over and nothing else is written.
                    let job = match settle {
                        Settle::Retry { after } => sqlx::query(
                            "UPDATE delivery_jobs SET due_at = ?, attempts = attempts + 1,
                                lease_owner = NULL, lease_until = NULL
                             WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL",
                        )
                        .bind(now.saturating_add(retention_ms(*after))),
                        _ => sqlx::query(
                            "DELETE FROM delivery_jobs
                             WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL",
                        ),
                    };
                    let held = job
                        .bind(id)
                        .bind(token)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                        == 1;
                    if !held {
                        // Our lease was taken over; the new holder owns the record now.
                        return Ok(false);
                    }
                    if let Some((attempt, result)) = attempt {
                        sqlx::query(
                            "UPDATE attempts SET finished_at = ?, outcome = ?, phase = ?, code = ?, reply = ?
                             WHERE message_id = ? AND attempt = ?",
                        )
                        .bind(now)
                        .bind(result.outcome)
                        .bind(result.phase)
                        .bind(result.code.map(i64::from))
                        .bind(&result.reply)
                        .bind(id)
                        .bind(attempt as i64)
                        .execute(&mut *tx)
                        .await?;
                    }
                    let finish = |state: State, reply: &str| {
                        sqlx::query(
                            "UPDATE messages SET state = ?, upstream_reply = ?, finished_at = ? WHERE id = ?",
                        )
                        .bind(state.as_str())
                        .bind(reply.to_string())
                        .bind(now)
                        .bind(id.to_string())
                    };
                    match settle {
                        Settle::Retry { .. } => {}
                        Settle::Delivered { upstream_reply } => {
                            finish(State::Delivered, upstream_reply)
                                .execute(&mut *tx)
                                .await?;
                        }
                        Settle::Unresolved { upstream_reply } => {
                            finish(State::Unresolved, upstream_reply)
                                .execute(&mut *tx)
                                .await?;
                        }
                        Settle::Failed {
                            upstream_reply,
                            dsn,
                        } => {
                            finish(State::Failed, upstream_reply)
                                .execute(&mut *tx)
                                .await?;
                            if let Some(dsn) = dsn {
                                // Its delivery job comes with it (a trigger); an existing DSN
                                // under the same key is left as it is.
                                insert_message(&mut *tx, dsn, now).await?;
                            }
                        }
                    }
                    Ok(true)
                })
            })
            .await
    }

    async fn renew_lease(&self, id: &str, token: i64, lease: Duration) -> Result<bool, StoreError> {
        let now = now_ms();
        let renew = sqlx::query(
            "UPDATE delivery_jobs SET lease_until = ?
             WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL
               AND lease_until > ?",
        )
        .bind(now.saturating_add(retention_ms(lease)))
        .bind(id.to_string())
        .bind(token)
        .bind(now);
        Ok(self.write_one(renew).await? == 1)
    }

    async fn lease_owners(&self) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT lease_owner FROM delivery_jobs
             WHERE lease_owner IS NOT NULL AND lease_until > ?",
        )
        .bind(now_ms())
        .fetch_all(&self.pool)
        .await?)
    }

    async fn reclaim_leases(&self, owners: &[String]) -> Result<u64, StoreError> {
        let mut reclaimed = 0;
        for owner in owners {
            let reclaim = sqlx::query(
                "UPDATE delivery_jobs SET lease_until = ? WHERE lease_owner = ? AND lease_until > ?",
            )
            .bind(now_ms())
            .bind(owner.clone())
            .bind(now_ms());
            reclaimed += self.write_one(reclaim).await?;
        }
        Ok(reclaimed)
    }

    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError> {
        let release = sqlx::query(
            "UPDATE delivery_jobs SET lease_owner = NULL, lease_until = NULL,
                due_at = MAX(due_at, ?)
             WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL",
        )
        .bind(now_ms().saturating_add(retention_ms(after)))
        .bind(id.to_string())
        .bind(token);
        self.write_one(release).await?;
        Ok(())
    }

    async fn attempts(&self, id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        let found = sqlx::query(
            "SELECT attempt, owner, started_at, finished_at, outcome, phase, code, reply
             FROM attempts WHERE message_id = ? ORDER BY attempt",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        found.iter().map(rows::attempt).collect()
    }

    async fn list(
        &self,
        state: Option<State>,
        limit: usize,
        after_id: Option<&str>,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let found = sqlx::query(
            "SELECT m.id, m.scope, m.idem_key, m.state, m.accepted_at, m.upstream_reply,
                    (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id) AS attempts,
                    l.outcome, l.phase, l.code
             FROM messages m
             LEFT JOIN attempts l ON l.message_id = m.id
                AND l.attempt = (SELECT MAX(attempt) FROM attempts x WHERE x.message_id = m.id)
             WHERE (?1 IS NULL OR m.state = ?1) AND (?2 IS NULL OR m.id > ?2)
             ORDER BY m.id
             LIMIT ?3",
        )
        .bind(state.map(State::as_str))
        .bind(after_id)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        found.iter().map(rows::summary).collect()
    }

    async fn requeue(&self, id: &str, allow_unresolved: bool) -> Result<Requeue, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move {
                    let id = id.as_str();
                    let row = sqlx::query(
                "SELECT state, content IS NOT NULL AS has_content FROM messages WHERE id = ?",
            )
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
                    let Some(row) = row else {
                        return Ok(Requeue::NotFound);
                    };
                    let state: String = row.try_get("state")?;
                    let state = State::parse(&state).ok_or(StoreError::Corrupt {
                        id: id.to_string(),
                        what: "state",
                    })?;
                    let refusal = match state {
                        State::Failed => None,
                        State::Unresolved if allow_unresolved => None,
                        State::Unresolved => Some(Requeue::NeedsConfirmation),
                        other => Some(Requeue::WrongState(other)),
                    };
                    let refusal = refusal
                        .or((!row.try_get::<bool, _>("has_content")?)
                            .then_some(Requeue::ContentGone));
                    if let Some(refusal) = refusal {
                        return Ok(refusal);
                    }
                    sqlx::query(
                "UPDATE messages SET state = 'queued', finished_at = NULL, upstream_reply = NULL
                 WHERE id = ?",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
                    // A terminal record has no job; a stray one would make the insert fail.
                    sqlx::query("DELETE FROM delivery_jobs WHERE message_id = ?")
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    let scope: String =
                        sqlx::query_scalar("SELECT scope FROM messages WHERE id = ?")
                            .bind(id)
                            .fetch_one(&mut *tx)
                            .await?;
                    insert_job(&mut *tx, id, &scope, now_ms()).await?;
                    Ok(Requeue::Requeued)
                })
            })
            .await
    }

    async fn cancel(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |tx: &mut SqliteConnection| {
                Box::pin(async move {
                    let id = id.as_str();
                    let now = now_ms();
                    let free: Option<i64> = sqlx::query_scalar(
                        "SELECT 1 FROM messages m JOIN delivery_jobs j ON j.message_id = m.id
                 WHERE m.id = ?1 AND m.state = 'queued'
                   AND (j.lease_until IS NULL OR j.lease_until <= ?2)",
                    )
                    .bind(id)
                    .bind(now)
                    .fetch_optional(&mut *tx)
                    .await?;
                    if free.is_none() {
                        return Ok(false);
                    }
                    // An intent left open by a dead worker stays on record as unknown, as a claim would.
                    close_open_intents(&mut *tx, id, now).await?;
                    sqlx::query(
                        "UPDATE messages SET state = 'failed', finished_at = ?,
                    upstream_reply = 'cancelled by an operator'
                 WHERE id = ?",
                    )
                    .bind(now)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query("DELETE FROM delivery_jobs WHERE message_id = ?")
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    Ok(true)
                })
            })
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
        // An operator's pause is never downgraded to one a probe may lift.
        let pause = sqlx::query(
            "UPDATE delivery_control SET reason = ?,
                probe = CASE WHEN paused_at IS NULL THEN ? ELSE probe AND ? END,
                paused_at = COALESCE(paused_at, ?)
             WHERE id = 1",
        )
        .bind(reason.to_string())
        .bind(probe)
        .bind(probe)
        .bind(now_ms());
        self.write_one(pause).await?;
        Ok(())
    }

    async fn resume(&self) -> Result<(), StoreError> {
        let resume = sqlx::query(
            "UPDATE delivery_control SET paused_at = NULL, reason = NULL, probe = 0 WHERE id = 1",
        );
        self.write_one(resume).await?;
        Ok(())
    }

    // --- operator surface: reporting and metrics -------------------------------------------

    async fn record_replay(&self, scope: &str, at_ms: i64) -> Result<(), StoreError> {
        let count = sqlx::query(
            "INSERT INTO daily_counts (scope, day, replayed) VALUES (?, ?, 1)
             ON CONFLICT (scope, day) DO UPDATE SET replayed = daily_counts.replayed + 1",
        )
        .bind(scope.to_string())
        .bind(utc_day(at_ms));
        self.write_one(count).await?;
        Ok(())
    }

    async fn report(&self, since_day: Option<&str>) -> Result<Vec<DailyCounts>, StoreError> {
        let rows = sqlx::query(
            "SELECT scope, day, accepted, replayed, delivered, failed, unresolved
             FROM daily_counts WHERE (?1 IS NULL OR day >= ?1)
             ORDER BY day, scope",
        )
        .bind(since_day)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(rows::daily_counts).collect()
    }

    async fn queue_stats(&self) -> Result<QueueStats, StoreError> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM messages GROUP BY state")
            .fetch_all(&self.pool)
            .await?;
        let mut by_state: Vec<(State, u64)> = [State::Queued]
            .into_iter()
            .chain(State::TERMINAL)
            .map(|s| (s, 0))
            .collect();
        for row in &rows {
            let state: String = row.try_get("state")?;
            let n: i64 = row.try_get("n")?;
            if let Some(slot) = by_state.iter_mut().find(|(s, _)| s.as_str() == state) {
                slot.1 = n.max(0) as u64;
            }
        }
        let oldest_queued_at_ms: Option<i64> =
            sqlx::query_scalar("SELECT MIN(accepted_at) FROM messages WHERE state = 'queued'")
                .fetch_one(&self.pool)
                .await?;
        Ok(QueueStats {
            by_state,
            oldest_queued_at_ms,
        })
    }

    async fn lookup_id_by_key(&self, scope: &str, key: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT id FROM messages WHERE scope = ? AND idem_key = ?")
                .bind(scope)
                .bind(key)
                .fetch_optional(&self.pool)
                .await?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intake::fingerprint::Fingerprint;
    use crate::smtp::session::{BodyType, Envelope};

    const LEASE: Duration = Duration::from_secs(60);

    async fn store(dir: &tempfile::TempDir) -> SqliteStore {
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        SqliteStore::open(&url, Duration::from_secs(5))
            .await
            .unwrap()
    }

    fn record(id: &str, key: &str) -> NewRecord {
        NewRecord {
            id: id.into(),
            scope: "s".into(),
            key: Some(key.into()),
            key_source: "header",
            fingerprint: Fingerprint::from_bytes([7; 32]),
            envelope: Envelope {
                mail_from: "a@example.com".into(),
                rcpt_to: vec!["b@example.com".into()],
                body: BodyType::SevenBit,
                smtputf8: false,
            },
            content: Some(b"Subject: x\r\n\r\nbody\r\n".to_vec()),
            size: 20,
            state: State::Queued,
            reply: "250 ok".into(),
            dsn_of: None,
        }
    }

    /// Claims `id` and settles one attempt with `outcome` into `settle`.
    async fn attempt(store: &SqliteStore, id: &str, outcome: &'static str, settle: Settle) {
        let job = store.claim("w", LEASE).await.unwrap().unwrap();
        assert_eq!(job.id, id);
        let n = job.attempts + 1;
        assert!(store.begin_attempt(id, job.token, n).await.unwrap());
        let result = AttemptResult {
            outcome,
            phase: Some("rcpt"),
            code: Some(550),
            reply: "550 no".into(),
        };
        assert!(store
            .settle(id, job.token, Some((n, &result)), &settle)
            .await
            .unwrap());
    }

    #[tokio::test]
    async fn store_requeue_of_failed_keeps_the_ledger_and_continues_numbering() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let retention = Duration::from_secs(3600);
        store.insert(&record("m1", "k1"), retention).await.unwrap();
        let failed = Settle::Failed {
            upstream_reply: "550 no".into(),
            dsn: None,
        };
        attempt(&store, "m1", "permanent", failed).await;
        let listed = store.list(Some(State::Failed), 10, None).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].attempts, 1);
        assert_eq!(listed[0].last_code, Some(550));
        assert_eq!(listed[0].upstream_reply.as_deref(), Some("550 no"));

        assert_eq!(
            store.requeue("nope", false).await.unwrap(),
            Requeue::NotFound
        );
        assert_eq!(store.requeue("m1", false).await.unwrap(), Requeue::Requeued);
        let m = store.message("m1").await.unwrap().unwrap();
        assert_eq!(m.state, State::Queued);
        assert!(m.has_job);
        assert_eq!(m.upstream_reply, None);
        assert_eq!(m.finished_at_ms, None);
        assert_eq!(
            store.requeue("m1", true).await.unwrap(),
            Requeue::WrongState(State::Queued)
        );
        let job = store.claim("w2", LEASE).await.unwrap().unwrap();
        assert_eq!(job.attempts, 1, "the next attempt is number 2");
    }

    #[tokio::test]
    async fn store_requeue_of_unresolved_needs_confirmation() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        store
            .insert(&record("m1", "k1"), Duration::from_secs(3600))
            .await
            .unwrap();
        let unresolved = Settle::Unresolved {
            upstream_reply: "unknown".into(),
        };
        attempt(&store, "m1", "unknown", unresolved).await;
        assert_eq!(
            store.requeue("m1", false).await.unwrap(),
            Requeue::NeedsConfirmation
        );
        assert_eq!(
            store.message("m1").await.unwrap().unwrap().state,
            State::Unresolved
        );
        assert_eq!(store.requeue("m1", true).await.unwrap(), Requeue::Requeued);
        assert_eq!(
            store.message("m1").await.unwrap().unwrap().state,
            State::Queued
        );
    }

    #[tokio::test]
    async fn store_cancel_fails_an_unleased_queued_record_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let retention = Duration::from_secs(3600);
        store.insert(&record("m1", "k1"), retention).await.unwrap();
        store.insert(&record("m2", "k2"), retention).await.unwrap();
        let leased = store.claim("w", LEASE).await.unwrap().unwrap();
        assert!(!store.cancel(&leased.id).await.unwrap(), "leased right now");
        let other = if leased.id == "m1" { "m2" } else { "m1" };
        assert!(store.cancel(other).await.unwrap());
        let m = store.message(other).await.unwrap().unwrap();
        assert_eq!(m.state, State::Failed);
        assert!(!m.has_job);
        assert_eq!(
            m.upstream_reply.as_deref(),
            Some("cancelled by an operator")
        );
        assert!(!store.cancel(other).await.unwrap(), "already terminal");
        assert!(!store.cancel("nope").await.unwrap());
        // Paging by id.
        let page = store.list(None, 1, None).await.unwrap();
        assert_eq!(page[0].id, "m1");
        let next = store.list(None, 10, Some("m1")).await.unwrap();
        assert_eq!(
            next.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["m2"]
        );
    }
}
