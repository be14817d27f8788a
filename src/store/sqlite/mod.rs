//! The embedded SQLite backend: WAL, `synchronous=FULL`, every write under `BEGIN IMMEDIATE`.

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;

use self::group_commit::{BatchHooks, Writer};
use self::spool::{Spool, SpoolReader, WithSpool};
use crate::store::backend::Store;
use crate::store::listing::{self, queue_stats_sql, ListFilter, Page};
use crate::store::migrate::{self, Embedded};
use crate::store::record::{
    now_ms, queue_stats, utc_day, Action, ActionRow, AttemptResult, AttemptRow, Claimed,
    DailyCounts, Existing, Flush, Insert, NewRecord, Operator, Pause, QueueStats, RelayHealth,
    Requeue, Resolution, Resolve, Settle, State, StoreError, StoredMessage,
};
use crate::store::retention::Retention;
use crate::store::rows;
use crate::store::webhook::{EventRow, WebhookApplied, WebhookReceipt};

mod group_commit;
mod immediate;
mod spool;
#[cfg(test)]
mod tests;
mod webhook;
mod write;

pub(crate) struct SqliteStore {
    /// Readers; WAL lets them run beside the writer.
    pool: SqlitePool,
    /// Every write goes through the group-commit writer.
    writer: Writer,
    /// Appends large bodies; used by writer operations only (the lock is never contended).
    spool: Arc<Mutex<Spool>>,
    spool_reader: SpoolReader,
    /// Other relay processes seen heartbeating into this file.
    siblings: Mutex<Siblings>,
}

/// Another process serving the same SQLite file works (the write lock serialises them), but
/// it is seldom meant: two units started by mistake, or a container and a host relay on one
/// volume. The heartbeats tell: a row whose heartbeat moves on while this process runs
/// belongs to a live process. A row that stays put (a relay killed a moment ago) says
/// nothing, and the ids carry a random part, so processes with the same pid (containers) are
/// told apart.
#[derive(Debug, Default)]
struct Siblings {
    /// Each other process's heartbeat as last seen.
    seen: std::collections::HashMap<String, i64>,
    warned: HashSet<String>,
}

impl Siblings {
    /// The processes to warn about now: seen before, heartbeat moved since; each only once.
    fn alive(&mut self, others: Vec<(String, i64)>) -> Vec<String> {
        let mut alive = Vec::new();
        for (id, heartbeat) in others {
            let before = self.seen.insert(id.clone(), heartbeat);
            if before.is_some_and(|b| heartbeat > b) && self.warned.insert(id.clone()) {
                alive.push(id);
            }
        }
        alive
    }
}

impl SqliteStore {
    /// Removes spool segments that no committed row points at any more. The segments are
    /// locked first (see the spool): what points into them is committed by then.
    async fn remove_unused_segments(&self) -> Result<usize, StoreError> {
        let sealed = self
            .spool_reader
            .lock_sealed()
            .map_err(|e| StoreError::Spool(format!("locking sealed segments: {e}")))?;
        let referenced: HashSet<i64> = sqlx::query_scalar(
            "SELECT DISTINCT spool_segment FROM messages WHERE spool_segment IS NOT NULL",
        )
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .collect();
        self.spool_reader
            .remove_unreferenced(sealed, &referenced)
            .map_err(|e| StoreError::Spool(format!("removing unused segments: {e}")))
    }
}

/// The spool's part in every batch: its appends are synced before the COMMIT.
struct SpoolHooks(Arc<Mutex<Spool>>);

impl BatchHooks for SpoolHooks {
    fn before_commit(&mut self) -> Result<(), String> {
        self.0
            .lock()
            .expect("spool lock")
            .sync()
            .map_err(|e| format!("spool sync failed: {e}"))
    }

    fn after_batch(&mut self) {
        self.0.lock().expect("spool lock").after_batch();
    }
}

impl SqliteStore {
    pub(crate) async fn open(url: &str, busy_timeout: Duration) -> Result<Self, StoreError> {
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
        Migrator::new(Embedded(migrate::SQLITE))
            .await?
            .run(&pool)
            .await?;
        // A connection that read the schema before a migration added a column prepares
        // `SELECT m.*` with the old column list and steps it with the new one (sqlx then reads
        // past its row): the serving pool starts on connections opened after the migrations.
        pool.close().await;
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(busy_timeout + Duration::from_secs(1))
            .connect_with(options.clone())
            .await?;
        let path = options.get_filename();
        let (spool, spool_reader) = Spool::open(&spool_dir(path))
            .map_err(|e| StoreError::Config(format!("cannot open the spool: {e}")))?;
        let spool = Arc::new(Mutex::new(spool));
        let writer = Writer::start(
            writer_connection(path, busy_timeout)?,
            Some(Box::new(SpoolHooks(spool.clone()))),
        )
        .map_err(|e| StoreError::Config(format!("cannot start the SQLite writer: {e}")))?;
        Ok(SqliteStore {
            pool,
            writer,
            spool,
            spool_reader,
            siblings: Mutex::new(Siblings::default()),
        })
    }
}

/// The database file a `sqlite:` URL names.
pub(crate) fn database_path(url: &str) -> Result<std::path::PathBuf, StoreError> {
    Ok(SqliteConnectOptions::from_str(url)?
        .get_filename()
        .to_path_buf())
}

/// Next to the database file: `idemrelay.db` spools into `idemrelay.db.spool/`.
fn spool_dir(db: &std::path::Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".spool");
    name.into()
}

/// The writer's own connection, with the same durability settings as the pool's, checked the
/// same way: the 250 depends on this connection's commits.
fn writer_connection(
    path: &std::path::Path,
    busy_timeout: Duration,
) -> Result<rusqlite::Connection, StoreError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(busy_timeout)?;
    // temp_store = MEMORY: each message's savepoint and each statement inside the batch keep
    // their undo pages (the statement journal) in memory. On disk, a journal that passed
    // 64 KiB was created, written and unlinked in the temporary directory, in about one
    // commit of three at one message per commit; it is only ever read to roll back.
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;
         PRAGMA temp_store = MEMORY",
    )?;
    let synchronous: i64 = conn.query_row("PRAGMA synchronous", [], |row| row.get(0))?;
    let journal: String = conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
    if synchronous != 2 || !journal.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Config(format!(
            "SQLite writer must run journal_mode=WAL with synchronous=FULL, found {journal} / {synchronous}"
        )));
    }
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

#[async_trait]
impl Store for SqliteStore {
    async fn insert(&self, record: &NewRecord, retention: Retention) -> Result<Insert, StoreError> {
        let record = record.clone();
        let spool = self.spool.clone();
        self.writer
            .write(move |conn| write::insert(conn, &spool, &record, retention))
            .await
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
             WHERE scope = ?5 AND idem_key = ?6 AND NOT ({}) ORDER BY part",
            rows::EXISTING_COLUMNS,
            Retention::expired_sql("?1", "?2", "?3", "?4")
        ))
        .bind(now_ms())
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
                COALESCE(j.lease_until > ?2, 0) AS leased
             FROM messages m LEFT JOIN delivery_jobs j ON j.message_id = m.id
             WHERE m.id = ?1",
        )
        .bind(id)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut message = rows::stored_message(&WithSpool {
            row: &row,
            spool: &self.spool_reader,
        })?;
        message.dsns = sqlx::query_scalar("SELECT id FROM messages WHERE dsn_of = ? ORDER BY id")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        let history = sqlx::query(&format!(
            "SELECT {} FROM operator_actions WHERE record_id = ? ORDER BY seq",
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
        let id = id.to_string();
        let upstream_reply = upstream_reply.map(str::to_string);
        self.writer
            .write(move |conn| write::finish(conn, &id, state, upstream_reply.as_deref()))
            .await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        // Runs in a batch: succeeds when the writer can take the write lock now.
        self.writer.write(|_| Ok(())).await
    }

    async fn purge_expired(&self, retention: Retention) -> Result<u64, StoreError> {
        let purged = self
            .writer
            .write(move |conn| write::purge_expired(conn, retention))
            .await?;
        self.remove_unused_segments().await?;
        Ok(purged)
    }

    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError> {
        let owner = owner.to_string();
        let spool = self.spool_reader.clone();
        self.writer
            .write(move |conn| write::claim(conn, &spool, &owner, lease))
            .await
    }

    async fn begin_attempt(&self, id: &str, token: i64, attempt: u32) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| write::begin_attempt(conn, &id, token, attempt))
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
                write::settle(conn, &spool, &id, token, attempt, &settle)
            })
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
            .write(move |conn| immediate::claim_id(conn, &spool, &id, &owner, lease))
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
                immediate::settle_answered(conn, &spool, &id, token, attempt, &settle, &reply)
            })
            .await
    }

    async fn renew_lease(&self, id: &str, token: i64, lease: Duration) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| write::renew_lease(conn, &id, token, lease))
            .await
    }

    async fn claim_key_space(&self, key_space: &str, scope: &str) -> Result<String, StoreError> {
        let (key_space, scope) = (key_space.to_string(), scope.to_string());
        self.writer
            .write(move |conn| write::claim_key_space(conn, &key_space, &scope))
            .await
    }

    async fn heartbeat(&self, process: &str) -> Result<(), StoreError> {
        let me = process.to_string();
        let others = self
            .writer
            .write(move |conn| write::heartbeat(conn, &me))
            .await?;
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
            .write(move |conn| write::reclaim_dead_leases(conn, stale_after))
            .await
    }

    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| write::release(conn, &id, token, after))
            .await
    }

    async fn attempts(&self, id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        let found = sqlx::query(
            "SELECT attempt, owner, started_at, finished_at, outcome, phase, code, reply,
                upstream_id
             FROM attempts WHERE message_id = ? ORDER BY attempt",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        found.iter().map(rows::attempt).collect()
    }

    async fn list_page(&self, filter: &ListFilter) -> Result<Page, StoreError> {
        let dialect = listing::Dialect::Sqlite { now_ms: now_ms() };
        let (sql, params) =
            listing::list_sql(filter, dialect).map_err(StoreError::InvalidFilter)?;
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
        let (id, by) = (id.to_string(), by.clone());
        self.writer
            .write(move |conn| write::requeue(conn, &id, confirmed, &by))
            .await
    }

    async fn cancel(&self, id: &str, by: &Operator) -> Result<bool, StoreError> {
        let (id, by) = (id.to_string(), by.clone());
        self.writer
            .write(move |conn| write::cancel(conn, &id, &by))
            .await
    }

    async fn cancel_all(
        &self,
        ids: &[String],
        by: &Operator,
        what: &str,
    ) -> Result<Vec<String>, StoreError> {
        let (ids, by, what) = (ids.to_vec(), by.clone(), what.to_string());
        self.writer
            .write(move |conn| write::cancel_all(conn, &ids, &by, &what))
            .await
    }

    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError> {
        let (id, by) = (id.to_string(), by.clone());
        self.writer
            .write(move |conn| write::flush(conn, &id, &by))
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
            .write(move |conn| write::resolve(conn, &id, resolution, &by))
            .await
    }

    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError> {
        let by = by.clone();
        self.writer
            .write(move |conn| write::flush_all(conn, &by))
            .await
    }

    async fn record_action(
        &self,
        action: Action,
        by: &Operator,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        let (by, detail) = (by.clone(), detail.map(str::to_string));
        self.writer
            .write(move |conn| {
                write::record_action(conn, None, action, &by, detail.as_deref(), now_ms())
            })
            .await
    }

    async fn relay_actions(&self, limit: usize) -> Result<Vec<ActionRow>, StoreError> {
        let found = sqlx::query(&format!(
            "SELECT {} FROM operator_actions WHERE record_id IS NULL ORDER BY seq DESC LIMIT ?",
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
        let reason = reason.to_string();
        self.writer
            .write(move |conn| write::pause(conn, &reason, probe))
            .await
    }

    async fn resume(&self) -> Result<(), StoreError> {
        self.writer.write(write::resume).await
    }

    async fn resume_after_probe(&self) -> Result<bool, StoreError> {
        self.writer.write(write::resume_after_probe).await
    }

    // --- operator surface: reporting and metrics -------------------------------------------

    async fn record_replay(&self, scope: &str, at_ms: i64) -> Result<(), StoreError> {
        let scope = scope.to_string();
        let day = utc_day(at_ms);
        self.writer
            .write(move |conn| write::record_replay(conn, &scope, &day))
            .await
    }

    async fn report(&self, since_day: Option<&str>) -> Result<Vec<DailyCounts>, StoreError> {
        let rows = sqlx::query(
            "SELECT scope, day, accepted, replayed, delivered, failed, unresolved, cancelled,
                resolved_by_event, bounced
             FROM daily_counts WHERE (?1 IS NULL OR day >= ?1)
             ORDER BY day, scope",
        )
        .bind(since_day)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(rows::daily_counts).collect()
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
        let sql = listing::health_sql(listing::Dialect::Sqlite { now_ms: now_ms() });
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
            "SELECT id FROM messages WHERE scope = ? AND idem_key = ? ORDER BY part LIMIT 1",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn apply_webhook(&self, receipt: &WebhookReceipt) -> Result<WebhookApplied, StoreError> {
        let receipt = receipt.clone();
        self.writer
            .write(move |conn| webhook::apply(conn, &receipt))
            .await
    }

    async fn events(&self, record_id: &str) -> Result<Vec<EventRow>, StoreError> {
        let found = sqlx::query(rows::EVENTS_OF_RECORD)
            .bind(record_id)
            .fetch_all(&self.pool)
            .await?;
        found.iter().map(rows::event).collect()
    }
}
