//! The shared Postgres backend: several relay instances, one database. Every time that decides
//! retention, windows and leases comes from the database's clock (`idemrelay_now_ms()`), so
//! instances with skewed clocks still agree. Claims use `FOR UPDATE SKIP LOCKED`; every write
//! of a lease holder is fenced by the lease token.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, Row};

use super::migrate::{Embedded, Steps};
use super::postgres_intake::Intake;
use super::postgres_webhook as webhook;
use super::{
    listing, retention_ms, rows, utc_day, Action, ActionRow, AttemptResult, AttemptRow, Claimed,
    DailyCounts, EventRow, Flush, Insert, ListFilter, NewRecord, Operator, Page, Pause, QueueStats,
    Requeue, Retention, Settle, State, Store, StoreError, StoredMessage, WebhookApplied,
    WebhookReceipt,
};

const MIGRATIONS: Steps = &[
    (
        1,
        "schema",
        include_str!("../../migrations/postgres/0001_schema.sql"),
    ),
    (
        2,
        "daily_counts",
        include_str!("../../migrations/postgres/0002_daily_counts.sql"),
    ),
    (
        3,
        "job_order",
        include_str!("../../migrations/postgres/0003_job_order.sql"),
    ),
    (
        4,
        "claim_by_scope",
        include_str!("../../migrations/postgres/0004_claim_by_scope.sql"),
    ),
    (
        5,
        "body_integrity",
        include_str!("../../migrations/postgres/0005_body_integrity.sql"),
    ),
    (
        6,
        "liveness",
        include_str!("../../migrations/postgres/0006_liveness.sql"),
    ),
    (
        7,
        "parts",
        include_str!("../../migrations/postgres/0007_parts.sql"),
    ),
    (
        8,
        "webhooks",
        include_str!("../../migrations/postgres/0008_webhooks.sql"),
    ),
    (
        9,
        "operator",
        include_str!("../../migrations/postgres/0009_operator.sql"),
    ),
    (
        10,
        "batch_counts",
        include_str!("../../migrations/postgres/0010_batch_counts.sql"),
    ),
    (
        11,
        "claim_in_one_call",
        include_str!("../../migrations/postgres/0011_claim_in_one_call.sql"),
    ),
];

pub struct PostgresStore {
    pool: PgPool,
    /// The intake writers (group commit).
    intake: Intake,
}

impl PostgresStore {
    /// `busy_timeout` bounds each statement and each wait for a pooled connection, so an
    /// unreachable or wedged database turns into a prompt E01033 rather than a hung client.
    pub async fn open(url: &str, busy_timeout: Duration) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)?.application_name("idemrelay");
        // Migrations run on a connection of their own, without the statement timeout: a
        // future migration of a big table may rightly take longer than a store write.
        let mut migrating = PgConnection::connect_with(&options).await?;
        Migrator::new(Embedded(MIGRATIONS))
            .await?
            .run(&mut migrating)
            .await?;
        migrating.close().await?;
        let timeout_ms = retention_ms(busy_timeout).max(1);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(busy_timeout + Duration::from_secs(1))
            .after_connect(|conn, _| Box::pin(async move { durable_commits(conn).await }))
            .connect_with(options.options([
                ("statement_timeout", timeout_ms),
                ("lock_timeout", timeout_ms),
            ]))
            .await?;
        let intake = Intake::start(pool.clone());
        Ok(PostgresStore { pool, intake })
    }
}

/// A commit must be on disk before its 250: `synchronous_commit=off` would acknowledge
/// commits a crash can still lose, and `local` does not wait for synchronous replicas. The
/// level is set on every connection, even when the server's is already durable: a session's
/// own setting outlives a later reload of the server's configuration, which would otherwise
/// apply to this session too. Stronger settings (remote_write, remote_apply) are kept.
async fn durable_commits(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let mode: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut *conn)
        .await?;
    conn.execute(durable_commit_statement(&mode)).await?;
    Ok(())
}

/// The `SET` for a connection whose server-side level is `mode`.
fn durable_commit_statement(mode: &str) -> &'static str {
    match mode {
        "remote_apply" => "SET synchronous_commit = remote_apply",
        "remote_write" => "SET synchronous_commit = remote_write",
        _ => "SET synchronous_commit = on",
    }
}

/// A claim that finds damaged bodies marks them and goes on, up to this many per claim.
const DAMAGED_PER_CLAIM: usize = 16;

/// A record whose body cannot be used is failed with the reason, so that it is never
/// forwarded; an open intent stays on record as UNKNOWN (closed by the claim before this).
/// Fenced by the claim's lease token: the claim committed on its own.
async fn mark_damaged(
    pool: &PgPool,
    id: &str,
    token: i64,
    reason: &str,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "WITH job AS (
            DELETE FROM delivery_jobs
            WHERE message_id = $4 AND lease_token = $5 AND lease_owner IS NOT NULL
            RETURNING message_id)
         UPDATE messages m SET state = 'failed', damage = $1, upstream_reply = $2,
            finished_at = $3
         FROM job WHERE m.id = job.message_id",
    )
    .bind(reason)
    .bind(super::report_damage(id, reason))
    .bind(now)
    .bind(id)
    .bind(token)
    .execute(pool)
    .await?;
    Ok(())
}

async fn db_now(conn: &mut PgConnection) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar("SELECT idemrelay_now_ms()")
        .fetch_one(&mut *conn)
        .await?)
}

/// Binds a new record's columns as $1..$20, in the order of `messages`' insert statements
/// (`insert_message` here, the batch's in postgres_intake.rs).
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
                .map(|body| super::body_checksum(body).to_vec()),
        )
        .bind(i64::from(record.part))
        .bind(&record.message_fp.as_bytes()[..])
        .bind(&record.upstream_key)
        .bind(&record.message_id)
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
            content_hash, part, message_fp, upstream_key, header_message_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
            $18, $19, $20)
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
/// cannot be known, so it is recorded as UNKNOWN (DESIGN §2), never as not sent.
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
async fn record_action(
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
    upstream_id: Option<&'q str>,
    settle: &'q Settle,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let sql = match settle {
        Settle::Retry { .. } => SETTLE_RETRY,
        _ => SETTLE_FINAL,
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
        .bind(upstream_id);
    let (state, reply) = match settle {
        Settle::Retry { after } => return query.bind(retention_ms(*after)),
        Settle::Delivered { upstream_reply } => (State::Delivered, upstream_reply),
        Settle::Unresolved { upstream_reply } => (State::Unresolved, upstream_reply),
        Settle::Failed { upstream_reply, .. } => (State::Failed, upstream_reply),
    };
    query.bind(state.as_str()).bind(reply.as_str())
}

async fn delete_job(conn: &mut PgConnection, id: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM delivery_jobs WHERE message_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

#[async_trait]
impl Store for PostgresStore {
    async fn insert(&self, record: &NewRecord, retention: Retention) -> Result<Insert, StoreError> {
        self.intake.insert(record, retention).await
    }

    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        retention: Retention,
    ) -> Result<Vec<super::Existing>, StoreError> {
        let [replay, parked, window] = retention.sql_params();
        let found = sqlx::query(&format!(
            "SELECT {} FROM messages m
             WHERE scope = $4 AND idem_key = $5 AND NOT ({}) ORDER BY part",
            rows::EXISTING_COLUMNS,
            Retention::expired_sql("idemrelay_now_ms()", "$1", "$2", "$3")
        ))
        .bind(replay)
        .bind(parked)
        .bind(window)
        .bind(scope)
        .bind(key)
        .fetch_all(&self.pool)
        .await?;
        found.iter().map(rows::existing).collect()
    }

    async fn message(&self, id: &str) -> Result<Option<StoredMessage>, StoreError> {
        let row = sqlx::query(
            "SELECT m.*, j.message_id IS NOT NULL AS has_job, j.due_at,
                COALESCE(j.lease_until > idemrelay_now_ms(), FALSE) AS leased
             FROM messages m LEFT JOIN delivery_jobs j ON j.message_id = m.id
             WHERE m.id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut message = rows::stored_message(&row)?;
        message.dsns = sqlx::query_scalar("SELECT id FROM messages WHERE dsn_of = $1 ORDER BY id")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        let history = sqlx::query(&format!(
            "SELECT {} FROM operator_actions WHERE record_id = $1 ORDER BY seq",
            listing::ACTION_COLUMNS
        ))
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        message.history = history.iter().map(rows::action).collect::<Result<_, _>>()?;
        Ok(Some(message))
    }

    async fn finish(
        &self,
        id: &str,
        state: State,
        upstream_reply: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE messages SET state = $1, upstream_reply = $2, finished_at = idemrelay_now_ms()
             WHERE id = $3 AND state = 'queued'",
        )
        .bind(state.as_str())
        .bind(upstream_reply)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        delete_job(&mut tx, id).await?;
        tx.commit().await?;
        Ok(updated == 1)
    }

    /// Takes, and gives back, the lock an insert needs: this fails on a read-only standby
    /// (as after a failover to a replica that was not promoted), without the privilege to
    /// write records, and, after `lock_timeout`, while another session blocks writers.
    async fn probe(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        tx.execute("LOCK TABLE messages IN ROW EXCLUSIVE MODE")
            .await?;
        tx.rollback().await?;
        Ok(())
    }

    async fn purge_expired(&self, retention: Retention) -> Result<u64, StoreError> {
        let [replay, parked, window] = retention.sql_params();
        let purged = sqlx::query(&format!(
            "DELETE FROM messages m WHERE {}",
            Retention::expired_sql("idemrelay_now_ms()", "$1", "$2", "$3")
        ))
        .bind(replay)
        .bind(parked)
        .bind(window)
        .execute(&self.pool)
        .await?
        .rows_affected();
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
        Ok(purged)
    }

    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError> {
        // A damaged body is marked in a commit of its own and the claim goes on to the next
        // job, so one bad record never blocks the queue.
        for _ in 0..DAMAGED_PER_CLAIM {
            // One call, committed on its own (migration 11): the lease, the turn and the
            // intents it closes are durable before the claim is used.
            let m = sqlx::query("SELECT * FROM idemrelay_claim($1, $2)")
                .bind(owner)
                .bind(retention_ms(lease))
                .fetch_optional(&self.pool)
                .await?;
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

    async fn begin_attempt(&self, id: &str, token: i64, attempt: u32) -> Result<bool, StoreError> {
        // One statement, one commit: the lease check and the intent, as one transaction.
        // Only under an unexpired lease: once expired it may be another worker's any moment.
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
        .execute(&self.pool)
        .await?
        .rows_affected()
            == 1)
    }

    async fn settle(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
    ) -> Result<bool, StoreError> {
        let upstream_id = attempt.and_then(|(_, r)| super::accepted_upstream_id(r));
        let unresolved = matches!(settle, Settle::Unresolved { .. });
        let dsn = match settle {
            Settle::Failed { dsn, .. } => dsn.as_deref(),
            _ => None,
        };
        if upstream_id.is_none() && !unresolved && dsn.is_none() {
            // Nothing but the outcome to write: the fenced writes alone, one statement and
            // one commit (their fence takes the job's row lock first, as below).
            let wrote = settle_writes(id, token, None, attempt, upstream_id.as_deref(), settle)
                .fetch_optional(&self.pool)
                .await?;
            return Ok(wrote.is_some());
        }
        let mut tx = self.pool.begin().await?;
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
        let message_id: Option<String> = held.try_get("header_message_id")?;
        let rcpt_to: Vec<String> = held
            .try_get::<String, _>("rcpt_to")?
            .split('\n')
            .map(str::to_string)
            .collect();
        let known = (upstream_id.is_some() || unresolved).then(|| webhook::Known {
            id,
            upstream_key: key.as_deref().filter(|_| unresolved),
            message_id: message_id.as_deref().filter(|_| unresolved),
            upstream_id: upstream_id.as_deref(),
            rcpt_to: &rcpt_to,
            unresolved,
        });
        if let Some(known) = &known {
            webhook::lock(&mut tx, known.lock_names()).await?;
        }
        settle_writes(
            id,
            token,
            Some(now),
            attempt,
            upstream_id.as_deref(),
            settle,
        )
        .fetch_one(&mut *tx)
        .await?;
        if let Some(dsn) = dsn {
            if insert_message(&mut tx, dsn, now).await? == 1 {
                insert_job(&mut tx, &dsn.id, now).await?;
            }
        }
        if let Some(known) = &known {
            webhook::attach_unmatched(&mut tx, known, now).await?;
        }
        tx.commit().await?;
        Ok(true)
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
            .bind(retention_ms(super::FORGET_PROCESS_AFTER))
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

    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE delivery_jobs SET lease_owner = NULL, lease_until = NULL,
                due_at = GREATEST(due_at, idemrelay_now_ms() + $1)
             WHERE message_id = $2 AND lease_token = $3 AND lease_owner IS NOT NULL",
        )
        .bind(retention_ms(after))
        .bind(id)
        .bind(token)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn attempts(&self, id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        let found = sqlx::query(
            "SELECT attempt, owner, started_at, finished_at, outcome, phase, code, reply,
                upstream_id
             FROM attempts WHERE message_id = $1 ORDER BY attempt",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        found.iter().map(rows::attempt).collect()
    }

    async fn list_page(&self, filter: &ListFilter) -> Result<Page, StoreError> {
        let (sql, params) = listing::list_sql(filter, listing::Dialect::Postgres)
            .map_err(StoreError::InvalidFilter)?;
        let found = listing::bind(sqlx::query(&sql), params)
            .fetch_all(&self.pool)
            .await?;
        let records = found.iter().map(rows::summary).collect::<Result<_, _>>()?;
        Ok(listing::page(records, filter))
    }

    async fn requeue(
        &self,
        id: &str,
        confirmed: bool,
        by: &Operator,
    ) -> Result<Requeue, StoreError> {
        let mut tx = self.pool.begin().await?;
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
        let state: String = row.try_get("state")?;
        let state = State::parse(&state).ok_or(StoreError::Corrupt {
            id: id.to_string(),
            what: "state",
        })?;
        let has_content = row.try_get::<bool, _>("has_content")?;
        let any_unknown = row.try_get::<bool, _>("any_unknown")?;
        let refusal = super::requeue_refusal(state, confirmed, has_content, any_unknown);
        if let Some(refusal) = refusal {
            tx.rollback().await?;
            return Ok(refusal);
        }
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
        let first_attempt =
            super::requeued_first_attempt(state, any_unknown, row.try_get("first_attempt_at")?);
        sqlx::query("UPDATE delivery_jobs SET first_attempt_at = $1 WHERE message_id = $2")
            .bind(first_attempt)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let detail = super::retry_detail(state, confirmed);
        record_action(&mut tx, Some(id), Action::Retry, by, Some(&detail), now).await?;
        tx.commit().await?;
        Ok(Requeue::Requeued)
    }

    async fn cancel(&self, id: &str, by: &Operator) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now = db_now(&mut tx).await?;
        // A job locked right now (being claimed or settled) counts as leased.
        let free: Option<i64> = sqlx::query_scalar(
            "SELECT 1::BIGINT FROM delivery_jobs j JOIN messages m ON m.id = j.message_id
             WHERE m.id = $1 AND m.state = 'queued'
               AND (j.lease_until IS NULL OR j.lease_until <= $2)
             FOR UPDATE OF j SKIP LOCKED",
        )
        .bind(id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        if free.is_none() {
            tx.rollback().await?;
            return Ok(false);
        }
        // An intent left open by a dead worker stays on record as unknown, as a claim would.
        close_open_intents(&mut tx, id, now).await?;
        sqlx::query(
            "UPDATE messages SET state = 'cancelled', finished_at = $1, upstream_reply = $2
             WHERE id = $3",
        )
        .bind(now)
        .bind(super::CANCELLED_REPLY)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        delete_job(&mut tx, id).await?;
        record_action(&mut tx, Some(id), Action::Cancel, by, None, now).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now = db_now(&mut tx).await?;
        // A job locked right now (being claimed or settled) counts as leased.
        let free: Option<i64> = sqlx::query_scalar(
            "SELECT j.due_at FROM delivery_jobs j
             WHERE j.message_id = $1 AND (j.lease_until IS NULL OR j.lease_until <= $2)
             FOR UPDATE SKIP LOCKED",
        )
        .bind(id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(due_at) = free else {
            tx.rollback().await?;
            return Ok(match self.message(id).await? {
                None => Flush::NotFound,
                Some(m) if m.state == State::Queued => Flush::Leased,
                Some(m) => Flush::NotQueued(m.state),
            });
        };
        sqlx::query("UPDATE delivery_jobs SET due_at = LEAST(due_at, $1) WHERE message_id = $2")
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let detail = super::flush_detail(due_at, now);
        record_action(&mut tx, Some(id), Action::Flush, by, Some(&detail), now).await?;
        tx.commit().await?;
        Ok(Flush::Flushed {
            was_due_at_ms: due_at,
        })
    }

    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin().await?;
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
        for (id, due_at) in &waiting {
            let detail = super::flush_detail(*due_at, now);
            record_action(&mut tx, Some(id), Action::Flush, by, Some(&detail), now).await?;
        }
        tx.commit().await?;
        Ok(waiting.into_iter().map(|(id, _)| id).collect())
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

    async fn relay_actions(&self, limit: usize) -> Result<Vec<ActionRow>, StoreError> {
        let found = sqlx::query(&format!(
            "SELECT {} FROM operator_actions WHERE record_id IS NULL ORDER BY seq DESC LIMIT $1",
            listing::ACTION_COLUMNS
        ))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        found.iter().map(rows::action).collect()
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

    async fn record_replay(&self, scope: &str, at_ms: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO daily_counts (scope, day, shard, replayed) VALUES ($1, $2, $3, 1)
             ON CONFLICT (scope, day, shard) DO UPDATE SET replayed = daily_counts.replayed + 1",
        )
        .bind(scope)
        .bind(utc_day(at_ms))
        .bind(i16::from(fastrand::u8(..8)))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn report(&self, since_day: Option<&str>) -> Result<Vec<DailyCounts>, StoreError> {
        let found = sqlx::query(
            "SELECT scope, day, SUM(accepted)::BIGINT AS accepted,
                    SUM(replayed)::BIGINT AS replayed, SUM(delivered)::BIGINT AS delivered,
                    SUM(failed)::BIGINT AS failed, SUM(unresolved)::BIGINT AS unresolved,
                    SUM(cancelled)::BIGINT AS cancelled,
                    SUM(resolved_by_event)::BIGINT AS resolved_by_event,
                    SUM(bounced)::BIGINT AS bounced
             FROM daily_counts WHERE ($1::TEXT IS NULL OR day >= $1)
             GROUP BY scope, day
             ORDER BY day, scope",
        )
        .bind(since_day)
        .fetch_all(&self.pool)
        .await?;
        found.iter().map(rows::daily_counts).collect()
    }

    async fn queue_stats(&self) -> Result<QueueStats, StoreError> {
        let counts: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, COUNT(*) FROM messages GROUP BY state")
                .fetch_all(&self.pool)
                .await?;
        let oldest: Option<i64> =
            sqlx::query_scalar("SELECT MIN(accepted_at) FROM messages WHERE state = 'queued'")
                .fetch_one(&self.pool)
                .await?;
        let damaged: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM messages WHERE damage IS NOT NULL")
                .fetch_one(&self.pool)
                .await?;
        let unmatched: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM upstream_events WHERE record_id IS NULL")
                .fetch_one(&self.pool)
                .await?;
        let by_scope: Vec<(String, i64)> = sqlx::query_as(
            "SELECT scope, COUNT(*) FROM messages WHERE state = 'queued' GROUP BY scope",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(super::queue_stats(
            counts, oldest, damaged, unmatched, by_scope,
        ))
    }

    async fn lookup_id_by_key(&self, scope: &str, key: &str) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM messages WHERE scope = $1 AND idem_key = $2
                 ORDER BY part LIMIT 1",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn apply_webhook(&self, receipt: &WebhookReceipt) -> Result<WebhookApplied, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now = db_now(&mut tx).await?;
        let applied = webhook::apply(&mut tx, receipt, now).await?;
        if applied == WebhookApplied::Duplicate {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
        Ok(applied)
    }

    async fn events(&self, record_id: &str) -> Result<Vec<EventRow>, StoreError> {
        let found = sqlx::query(rows::EVENTS_OF_RECORD)
            .bind(record_id)
            .fetch_all(&self.pool)
            .await?;
        found.iter().map(rows::event).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_levels_are_at_least_on_and_stronger_ones_are_kept() {
        for (server, set) in [
            ("off", "SET synchronous_commit = on"),
            ("local", "SET synchronous_commit = on"),
            ("on", "SET synchronous_commit = on"),
            ("remote_write", "SET synchronous_commit = remote_write"),
            ("remote_apply", "SET synchronous_commit = remote_apply"),
        ] {
            assert_eq!(durable_commit_statement(server), set, "{server}");
        }
    }

    /// A level the session set itself is not changed by a later reload of the server's
    /// configuration; one it only inherited is.
    #[tokio::test]
    async fn every_connection_sets_its_commit_level_itself() {
        let Some(base) = std::env::var("IDEMRELAY_TEST_POSTGRES")
            .ok()
            .filter(|u| !u.is_empty())
        else {
            eprintln!("SKIPPED every_connection_sets_its_commit_level_itself: set IDEMRELAY_TEST_POSTGRES");
            return;
        };
        let schema = format!("t_commit_level_{}", fastrand::u32(..));
        let mut admin = PgConnection::connect(&base).await.unwrap();
        admin
            .execute(format!("CREATE SCHEMA {schema}").as_str())
            .await
            .unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options[search_path]={schema}");
        let store = PostgresStore::open(&url, Duration::from_secs(5))
            .await
            .unwrap();
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut conn = store.pool.acquire().await.unwrap();
            let (setting, source): (String, String) = sqlx::query_as(
                "SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'",
            )
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            assert_eq!((setting.as_str(), source.as_str()), ("on", "session"));
            held.push(conn);
        }
        drop(held);
        store.pool.close().await;
        admin
            .execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
            .await
            .unwrap();
    }
}
