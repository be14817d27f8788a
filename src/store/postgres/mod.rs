//! The shared Postgres backend: several relay instances, one database. Every time that decides
//! retention, windows and leases comes from the database's clock (`idemrelay_now_ms()`), so
//! instances with skewed clocks still agree. Claims use `FOR UPDATE SKIP LOCKED`; every write
//! of a lease holder is fenced by the lease token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, Row};

use self::hosts::Hosts;
use self::intake::Intake;
use crate::store::backend::Store;
use crate::store::listing::{self, queue_stats_sql, ListFilter, Page};
use crate::store::migrate::{self, Embedded};
use crate::store::record::{
    queue_stats, retention_ms, utc_day, Action, ActionRow, AttemptResult, AttemptRow, Claimed,
    DailyCounts, Existing, Flush, Insert, NewRecord, Operator, Pause, QueueStats, RelayHealth,
    Requeue, Resolution, Resolve, Settle, State, StoreError, StoredMessage, FORGET_PROCESS_AFTER,
};
use crate::store::retention::Retention;
use crate::store::rows;
use crate::store::webhook::{EventRow, WebhookApplied, WebhookReceipt};

mod hosts;
mod immediate;
mod intake;
#[cfg(test)]
mod tests;
mod webhook;
mod write;

pub(crate) struct PostgresStore {
    pool: PgPool,
    /// The intake writers (group commit).
    intake: Intake,
    /// The URL's hosts, and which one the pool connects to (`hosts.rs`).
    hosts: Arc<Hosts>,
    busy_timeout: Duration,
    /// The last health probe failed (with several hosts, the next one walks them first).
    probe_failed: AtomicBool,
}

impl PostgresStore {
    /// `busy_timeout` bounds each statement and each wait for a pooled connection, so an
    /// unreachable or wedged database turns into a prompt E01033 rather than a hung client.
    pub(crate) async fn open(url: &str, busy_timeout: Duration) -> Result<Self, StoreError> {
        let hosts = Arc::new(Hosts::parse(url, |o| o.application_name("idemrelay"))?);
        let first = hosts.first_suitable(busy_timeout).await?;
        hosts.start_at(first);
        // Migrations run on a connection of their own, without the statement timeout: a
        // future migration of a big table may rightly take longer than a store write.
        let mut migrating = PgConnection::connect_with(&hosts.current()).await?;
        Migrator::new(Embedded(migrate::POSTGRES))
            .await?
            .run(&mut migrating)
            .await?;
        migrating.close().await?;
        let (checked, fresh) = (hosts.clone(), hosts.clone());
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(busy_timeout + Duration::from_secs(1))
            .after_connect(move |conn, _| {
                let hosts = checked.clone();
                Box::pin(async move {
                    hosts.check(conn).await?;
                    durable_commits(conn).await
                })
            })
            .before_acquire(move |_, meta| {
                let fresh = fresh.fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .connect_with(session_options(hosts.current(), busy_timeout))
            .await?;
        let intake = Intake::start(pool.clone(), hosts.clone());
        Ok(PostgresStore {
            pool,
            intake,
            hosts,
            busy_timeout,
            probe_failed: AtomicBool::new(false),
        })
    }

    /// The health probe's own test: takes, and gives back, the lock an insert needs.
    async fn probe_writable(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        tx.execute("LOCK TABLE messages IN ROW EXCLUSIVE MODE")
            .await?;
        tx.rollback().await?;
        Ok(())
    }
}

/// The pool's connections bound each statement and lock wait by the busy timeout.
fn session_options(options: PgConnectOptions, busy_timeout: Duration) -> PgConnectOptions {
    let timeout_ms = retention_ms(busy_timeout).max(1);
    options.options([
        ("statement_timeout", timeout_ms),
        ("lock_timeout", timeout_ms),
    ])
}

/// A commit must be on disk before its 250: `synchronous_commit=off` would acknowledge
/// commits a crash can still lose, and `local` does not wait for synchronous replicas. The
/// level is set on every connection, even when the server's is already durable: a session's
/// own setting outlives a later reload of the server's configuration, which would otherwise
/// apply to this session too. `remote_write` is raised to `on` as well: it waits only until
/// a synchronous standby has handed the commit to its operating system, not until it is on
/// the standby's disk, so a standby's power cut after a failover could lose an acknowledged
/// message. `remote_apply` (stronger than `on`) is kept.
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
        _ => "SET synchronous_commit = on",
    }
}

/// A claim that finds damaged bodies marks them and goes on, up to this many per claim.
const DAMAGED_PER_CLAIM: usize = 16;

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
    ) -> Result<Vec<Existing>, StoreError> {
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
        write::delete_job(&mut tx, id).await?;
        tx.commit().await?;
        Ok(updated == 1)
    }

    /// Takes, and gives back, the lock an insert needs: this fails on a read-only standby
    /// (as after a failover to a replica that was not promoted), without the privilege to
    /// write records, and, after `lock_timeout`, while another session blocks writers. With
    /// several hosts in the URL, a failure walks them again, and the pool moves to the one
    /// that now takes writes (a promoted standby): the probe runs every
    /// `store_probe_interval`, so the relay finds the new primary by itself.
    async fn probe(&self) -> Result<(), StoreError> {
        if !self.hosts.several() {
            return self.probe_writable().await;
        }
        let busy = self.busy_timeout;
        let follow = || {
            self.hosts
                .follow(&self.pool, busy, |o| session_options(o, busy))
        };
        let probed = async {
            // Once a probe has failed, the list is walked first: the pool's host may be the
            // dead primary, and waiting for a connection to it (`store_busy_timeout` + 1 s)
            // at every probe would put off the move to a standby promoted meanwhile by that
            // much each time.
            if self.probe_failed.load(Ordering::Relaxed) {
                follow().await?;
                return self.probe_writable().await;
            }
            if self.probe_writable().await.is_ok() {
                return Ok(());
            }
            follow().await?;
            self.probe_writable().await
        }
        .await;
        self.probe_failed.store(probed.is_err(), Ordering::Relaxed);
        probed
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
                    write::mark_damaged(&self.pool, &id, token, &reason, now).await?;
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
        write::settle(&self.pool, id, token, attempt, settle).await
    }

    async fn claim_id(
        &self,
        id: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError> {
        immediate::claim_id(&self.pool, id, owner, lease).await
    }

    async fn settle_answered(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
        reply: &str,
    ) -> Result<bool, StoreError> {
        write::settle_replying(&self.pool, id, token, attempt, settle, Some(reply)).await
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

    async fn claim_key_space(&self, key_space: &str, scope: &str) -> Result<String, StoreError> {
        // The upsert that changes nothing still returns the row, so one statement answers
        // both the first claim and every later one.
        Ok(sqlx::query_scalar(
            "INSERT INTO upstream_key_owners (key_space, scope, claimed_at)
             VALUES ($1, $2, idemrelay_now_ms())
             ON CONFLICT (key_space) DO UPDATE SET key_space = excluded.key_space
             RETURNING scope",
        )
        .bind(key_space)
        .bind(scope)
        .fetch_one(&self.pool)
        .await?)
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

    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError> {
        write::release(&self.pool, id, token, after).await
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
        write::requeue(&self.pool, id, confirmed, by).await
    }

    async fn cancel(&self, id: &str, by: &Operator) -> Result<bool, StoreError> {
        write::cancel(&self.pool, id, by).await
    }

    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError> {
        write::flush(&self.pool, id, by).await
    }

    async fn resolve(
        &self,
        id: &str,
        resolution: Resolution,
        by: &Operator,
    ) -> Result<Resolve, StoreError> {
        write::resolve(&self.pool, id, resolution, by).await
    }

    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError> {
        write::flush_all(&self.pool, by).await
    }

    async fn cancel_all(
        &self,
        ids: &[String],
        by: &Operator,
        what: &str,
    ) -> Result<Vec<String>, StoreError> {
        write::cancel_all(&self.pool, ids, by, what).await
    }

    async fn record_action(
        &self,
        action: Action,
        by: &Operator,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        let now = write::db_now(&mut conn).await?;
        write::record_action(&mut conn, None, action, by, detail, now).await
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
        let counts: Vec<(String, i64)> = sqlx::query_as(queue_stats_sql::STATES)
            .fetch_all(&self.pool)
            .await?;
        let oldest: Option<i64> = sqlx::query_scalar(queue_stats_sql::OLDEST_QUEUED)
            .fetch_one(&self.pool)
            .await?;
        let damaged: i64 = sqlx::query_scalar(queue_stats_sql::DAMAGED)
            .fetch_one(&self.pool)
            .await?;
        let unmatched: i64 = sqlx::query_scalar(queue_stats_sql::UNMATCHED_EVENTS)
            .fetch_one(&self.pool)
            .await?;
        let by_scope: Vec<(String, i64)> = sqlx::query_as(queue_stats_sql::QUEUED_BY_SCOPE)
            .fetch_all(&self.pool)
            .await?;
        Ok(queue_stats(counts, oldest, damaged, unmatched, by_scope))
    }

    async fn relay_health(&self) -> Result<RelayHealth, StoreError> {
        let sql = listing::health_sql(listing::Dialect::Postgres);
        let summary = sqlx::query(&sql.summary).fetch_one(&self.pool).await?;
        let newest = sqlx::query(&sql.newest_failure)
            .fetch_optional(&self.pool)
            .await?;
        let processes = sqlx::query(listing::PROCESSES)
            .fetch_all(&self.pool)
            .await?;
        let mut health = rows::relay_health(&summary, newest.as_ref(), &processes)?;
        if health.failing_since_ms.is_some() {
            let after = health.last_delivery_ms.unwrap_or(i64::MIN);
            let since: Option<i64> = sqlx::query_scalar(&sql.failing_since)
                .bind(after)
                .fetch_one(&self.pool)
                .await?;
            health.failing_since_ms = since.or(health.failing_since_ms);
        }
        Ok(health)
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
        let now = write::db_now(&mut tx).await?;
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
