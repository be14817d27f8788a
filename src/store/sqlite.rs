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

use super::group_commit::{BatchHooks, Writer};
use super::migrate::{Embedded, Steps};
use super::rows;
use super::spool::{Spool, SpoolReader, WithSpool};
use super::sqlite_writes as writes;
use super::{
    listing, now_ms, utc_day, Action, ActionRow, AttemptResult, AttemptRow, Claimed, DailyCounts,
    EventRow, Existing, Flush, Insert, ListFilter, NewRecord, Operator, Page, Pause, QueueStats,
    Requeue, Retention, Settle, State, Store, StoreError, StoredMessage, WebhookApplied,
    WebhookReceipt,
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
    (
        6,
        "spool",
        include_str!("../../migrations/sqlite/0006_spool.sql"),
    ),
    (
        7,
        "body_integrity",
        include_str!("../../migrations/sqlite/0007_body_integrity.sql"),
    ),
    (
        8,
        "liveness",
        include_str!("../../migrations/sqlite/0008_liveness.sql"),
    ),
    (
        9,
        "parts",
        include_str!("../../migrations/sqlite/0009_parts.sql"),
    ),
    (
        10,
        "webhooks",
        include_str!("../../migrations/sqlite/0010_webhooks.sql"),
    ),
    (
        11,
        "operator",
        include_str!("../../migrations/sqlite/0011_operator.sql"),
    ),
];

pub struct SqliteStore {
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
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON",
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
            .write(move |conn| writes::insert(conn, &spool, &record, retention))
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
            .write(move |conn| writes::finish(conn, &id, state, upstream_reply.as_deref()))
            .await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        // Runs in a batch: succeeds when the writer can take the write lock now.
        self.writer.write(|_| Ok(())).await
    }

    async fn purge_expired(&self, retention: Retention) -> Result<u64, StoreError> {
        let purged = self
            .writer
            .write(move |conn| writes::purge_expired(conn, retention))
            .await?;
        self.remove_unused_segments().await?;
        Ok(purged)
    }

    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError> {
        let owner = owner.to_string();
        let spool = self.spool_reader.clone();
        self.writer
            .write(move |conn| writes::claim(conn, &spool, &owner, lease))
            .await
    }

    async fn begin_attempt(&self, id: &str, token: i64, attempt: u32) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| writes::begin_attempt(conn, &id, token, attempt))
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
                writes::settle(conn, &spool, &id, token, attempt, &settle)
            })
            .await
    }

    async fn renew_lease(&self, id: &str, token: i64, lease: Duration) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| writes::renew_lease(conn, &id, token, lease))
            .await
    }

    async fn heartbeat(&self, process: &str) -> Result<(), StoreError> {
        let me = process.to_string();
        let others = self
            .writer
            .write(move |conn| writes::heartbeat(conn, &me))
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
            .write(move |conn| writes::reclaim_dead_leases(conn, stale_after))
            .await
    }

    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError> {
        let id = id.to_string();
        self.writer
            .write(move |conn| writes::release(conn, &id, token, after))
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
            .write(move |conn| writes::requeue(conn, &id, confirmed, &by))
            .await
    }

    async fn cancel(&self, id: &str, by: &Operator) -> Result<bool, StoreError> {
        let (id, by) = (id.to_string(), by.clone());
        self.writer
            .write(move |conn| writes::cancel(conn, &id, &by))
            .await
    }

    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError> {
        let (id, by) = (id.to_string(), by.clone());
        self.writer
            .write(move |conn| writes::flush(conn, &id, &by))
            .await
    }

    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError> {
        let by = by.clone();
        self.writer
            .write(move |conn| writes::flush_all(conn, &by))
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
                writes::record_action(conn, None, action, &by, detail.as_deref(), now_ms())
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
            .write(move |conn| writes::pause(conn, &reason, probe))
            .await
    }

    async fn resume(&self) -> Result<(), StoreError> {
        self.writer.write(writes::resume).await
    }

    // --- operator surface: reporting and metrics -------------------------------------------

    async fn record_replay(&self, scope: &str, at_ms: i64) -> Result<(), StoreError> {
        let scope = scope.to_string();
        let day = utc_day(at_ms);
        self.writer
            .write(move |conn| writes::record_replay(conn, &scope, &day))
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
            .write(move |conn| super::sqlite_webhook::apply(conn, &receipt))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_record as record;

    const LEASE: Duration = Duration::from_secs(60);

    #[test]
    fn a_sibling_is_reported_once_its_heartbeat_moves() {
        let mut siblings = Siblings::default();
        let beat = |pairs: &[(&str, i64)]| -> Vec<(String, i64)> {
            pairs.iter().map(|(id, t)| (id.to_string(), *t)).collect()
        };
        // First look: a row is no evidence of life (it may be a relay killed just now).
        assert!(siblings
            .alive(beat(&[("dead", 100), ("live", 100)]))
            .is_empty());
        // The live one's heartbeat moves on, the dead one's does not; a newcomer appears.
        assert_eq!(
            siblings.alive(beat(&[("dead", 100), ("live", 1100), ("new", 1000)])),
            ["live"]
        );
        // Once per process, however long it runs.
        assert_eq!(
            siblings.alive(beat(&[("dead", 100), ("live", 2100), ("new", 2000)])),
            ["new"]
        );
        assert!(siblings
            .alive(beat(&[("live", 3100), ("new", 3000)]))
            .is_empty());
    }

    #[tokio::test]
    async fn heartbeats_list_the_other_processes() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        store.heartbeat("a/1/01").await.unwrap();
        store.heartbeat("b/1/02").await.unwrap();
        let others = store
            .writer
            .write(|conn| writes::heartbeat(conn, "a/1/01"))
            .await
            .unwrap();
        assert_eq!(
            others.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
            ["b/1/02"]
        );
    }

    /// A store made before the `cancelled` state (migrations up to 10) keeps its rows, and a
    /// queued record in it can be cancelled once the relay opens it; the state column still
    /// refuses anything else.
    #[tokio::test]
    async fn a_store_from_before_the_cancelled_state_takes_it_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        {
            let options = SqliteConnectOptions::from_str(&url)
                .unwrap()
                .create_if_missing(true)
                .foreign_keys(true);
            let pool = SqlitePool::connect_with(options).await.unwrap();
            Migrator::new(Embedded(&MIGRATIONS[..10]))
                .await
                .unwrap()
                .run(&pool)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                    rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at)
                 VALUES ('old', 's', 'k', 'header', zeroblob(32), 'a@example.com', 'b@example.com',
                    '7BIT', 0, 4, x'41420d0a', 'queued', '250 ok', 1)",
            )
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO attempts (message_id, attempt, owner, started_at, finished_at, outcome)
                 VALUES ('old', 1, 'w', 2, 3, 'transient')",
            )
            .execute(&pool)
            .await
            .unwrap();
            pool.close().await;
        }
        let store = SqliteStore::open(&url, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(store.cancel("old", &op()).await.unwrap());
        let m = store.message("old").await.unwrap().unwrap();
        assert_eq!(m.state, State::Cancelled);
        assert_eq!(m.history.len(), 1);
        assert_eq!(
            store.attempts("old").await.unwrap().len(),
            1,
            "the ledger kept"
        );
        let refused = store
            .writer
            .write(|conn| {
                Ok(conn.execute("UPDATE messages SET state = 'bogus' WHERE id = 'old'", [])?)
            })
            .await;
        assert!(refused.is_err(), "the CHECK still holds: {refused:?}");
        let check: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(check, "ok");
    }

    fn op() -> Operator {
        Operator {
            actor: "test".into(),
            reason: "because".into(),
        }
    }

    async fn store(dir: &tempfile::TempDir) -> SqliteStore {
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        SqliteStore::open(&url, Duration::from_secs(5))
            .await
            .unwrap()
    }

    fn large(id: &str, key: &str, fill: u8) -> NewRecord {
        let mut body = b"Subject: big\r\n\r\n".to_vec();
        body.resize(super::super::spool::SPOOL_MIN + 1000, fill);
        body.extend_from_slice(b"\r\n");
        NewRecord {
            size: body.len(),
            content: Some(body),
            ..record(id, key)
        }
    }

    fn segments(dir: &tempfile::TempDir) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("t.db.spool"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_large_body_is_spooled_and_read_back_exactly_by_claims_and_lookups() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let retention = Retention::flat(Duration::from_secs(3600));
        let big = large("m1", "k1", b'a');
        store.insert(&big, retention).await.unwrap();
        store.insert(&record("m2", "k2"), retention).await.unwrap();
        // A replay of the key appends nothing.
        let replay = large("m3", "k1", b'b');
        assert!(matches!(
            store.insert(&replay, retention).await.unwrap(),
            Insert::Existing(_)
        ));
        let (inline, segment, offset): (Option<Vec<u8>>, Option<i64>, Option<i64>) =
            sqlx::query_as(
                "SELECT content, spool_segment, spool_offset FROM messages WHERE id = 'm1'",
            )
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!((inline, segment, offset), (None, Some(1), Some(0)));
        let small: Option<i64> =
            sqlx::query_scalar("SELECT spool_segment FROM messages WHERE id = 'm2'")
                .fetch_one(&store.pool)
                .await
                .unwrap();
        assert_eq!(small, None, "a small body stays inline");
        let len = std::fs::metadata(dir.path().join("t.db.spool/0000000000000001.seg"))
            .unwrap()
            .len();
        assert_eq!(len, big.size as u64, "the replay appended nothing");

        assert_eq!(
            store.message("m1").await.unwrap().unwrap().content,
            big.content
        );
        let job = store.claim("w", LEASE).await.unwrap().unwrap();
        assert_eq!(
            (job.id.as_str(), Some(&job.content)),
            ("m1", big.content.as_ref())
        );
        let failed = Settle::Failed {
            upstream_reply: "550 no".into(),
            dsn: None,
        };
        assert!(store.settle("m1", job.token, None, &failed).await.unwrap());
        assert_eq!(
            store.requeue("m1", false, &op()).await.unwrap(),
            Requeue::Requeued,
            "a spooled body counts as stored content"
        );
    }

    #[tokio::test]
    async fn a_sealed_segment_is_removed_once_no_row_points_at_it() {
        let dir = tempfile::tempdir().unwrap();
        let retention = Retention::flat(Duration::from_secs(3600));
        {
            let store = store(&dir).await;
            store
                .insert(&large("m1", "k1", b'a'), retention)
                .await
                .unwrap();
            store
                .insert(&large("m2", "k2", b'b'), retention)
                .await
                .unwrap();
            store.finish("m1", State::Delivered, None).await.unwrap();
        }
        // A new process spools into segment 2 and may collect segment 1.
        let store = store(&dir).await;
        store
            .insert(&large("m3", "k3", b'c'), retention)
            .await
            .unwrap();
        assert_eq!(
            segments(&dir),
            ["0000000000000001.seg", "0000000000000002.seg"]
        );
        // m2 is still queued and points into segment 1: nothing is removed.
        assert_eq!(
            store
                .purge_expired(Retention::flat(Duration::ZERO))
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            segments(&dir),
            ["0000000000000001.seg", "0000000000000002.seg"]
        );
        assert_eq!(
            store.message("m2").await.unwrap().unwrap().content,
            large("m2", "k2", b'b').content
        );
        store.finish("m2", State::Delivered, None).await.unwrap();
        assert_eq!(
            store
                .purge_expired(Retention::flat(Duration::ZERO))
                .await
                .unwrap(),
            1
        );
        // Segment 2 is still open (and m3 points into it): only segment 1 goes.
        assert_eq!(segments(&dir), ["0000000000000002.seg"]);
        assert_eq!(
            store.message("m3").await.unwrap().unwrap().content,
            large("m3", "k3", b'c').content
        );
    }

    /// Flips one byte of a stored body where it lives: in its spool segment or inline.
    async fn flip_a_byte(store: &SqliteStore, dir: &tempfile::TempDir, id: &str) {
        let (segment, offset): (Option<i64>, Option<i64>) =
            sqlx::query_as("SELECT spool_segment, spool_offset FROM messages WHERE id = ?")
                .bind(id)
                .fetch_one(&store.pool)
                .await
                .unwrap();
        match (segment, offset) {
            (Some(segment), Some(offset)) => {
                use std::os::unix::fs::FileExt;
                let path = dir.path().join(format!("t.db.spool/{segment:016}.seg"));
                let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                file.write_all_at(b"X", offset as u64 + 100).unwrap();
            }
            _ => {
                sqlx::query(
                    "UPDATE messages SET content = CAST(replace(CAST(content AS TEXT), 'body', 'bodY') AS BLOB) WHERE id = ?",
                )
                .bind(id)
                .execute(&store.pool)
                .await
                .unwrap();
            }
        }
    }

    #[tokio::test]
    async fn a_damaged_body_is_marked_failed_never_handed_out_and_the_queue_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let retention = Retention::flat(Duration::from_secs(3600));
        store
            .insert(&large("torn", "k1", b'a'), retention)
            .await
            .unwrap();
        store
            .insert(&record("flipped", "k2"), retention)
            .await
            .unwrap();
        store
            .insert(&large("gone", "k3", b'c'), retention)
            .await
            .unwrap();
        store
            .insert(&record("good", "k4"), retention)
            .await
            .unwrap();
        flip_a_byte(&store, &dir, "torn").await;
        flip_a_byte(&store, &dir, "flipped").await;
        // A body that points past the end of its segment (a torn tail) cannot be read.
        let offset: i64 = sqlx::query_scalar("SELECT spool_offset FROM messages WHERE id = 'gone'")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        sqlx::query("UPDATE messages SET spool_offset = 1000000 WHERE id = 'gone'")
            .execute(&store.pool)
            .await
            .unwrap();

        let job = store.claim("w", LEASE).await.unwrap().unwrap();
        assert_eq!(
            job.id, "good",
            "the damaged records are skipped, not blocking"
        );
        assert!(store.claim("w", LEASE).await.unwrap().is_none());
        for (id, reason) in [
            ("torn", "checksum mismatch"),
            ("flipped", "checksum mismatch"),
            ("gone", "segment 1 at 1000000"),
        ] {
            let m = store.message(id).await.unwrap().unwrap();
            assert_eq!(m.state, State::Failed, "{id}");
            assert!(!m.has_job, "{id}");
            let damage = m.damage.unwrap_or_default();
            assert!(damage.contains(reason), "{id}: {damage}");
            assert!(
                m.upstream_reply
                    .unwrap_or_default()
                    .contains("not forwarded"),
                "{id}"
            );
        }
        assert_eq!(store.queue_stats().await.unwrap().damaged, 3);
        // Once an operator has restored the body, a requeue clears the mark.
        sqlx::query("UPDATE messages SET spool_offset = ? WHERE id = 'gone'")
            .bind(offset)
            .execute(&store.pool)
            .await
            .unwrap();
        assert_eq!(
            store.requeue("gone", false, &op()).await.unwrap(),
            Requeue::Requeued
        );
        let again = store.claim("w", LEASE).await.unwrap().unwrap();
        assert_eq!(again.id, "gone");
        assert_eq!(Some(again.content), large("gone", "k3", b'c').content);
        assert_eq!(store.message("gone").await.unwrap().unwrap().damage, None);
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
        let retention = Retention::flat(Duration::from_secs(3600));
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
            store.requeue("nope", false, &op()).await.unwrap(),
            Requeue::NotFound
        );
        assert_eq!(
            store.requeue("m1", false, &op()).await.unwrap(),
            Requeue::Requeued
        );
        let m = store.message("m1").await.unwrap().unwrap();
        assert_eq!(m.state, State::Queued);
        assert!(m.has_job);
        assert_eq!(m.upstream_reply, None);
        assert_eq!(m.finished_at_ms, None);
        assert_eq!(
            store.requeue("m1", true, &op()).await.unwrap(),
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
            .insert(
                &record("m1", "k1"),
                Retention::flat(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
        let unresolved = Settle::Unresolved {
            upstream_reply: "unknown".into(),
        };
        attempt(&store, "m1", "unknown", unresolved).await;
        assert_eq!(
            store.requeue("m1", false, &op()).await.unwrap(),
            Requeue::NeedsConfirmation(State::Unresolved)
        );
        assert_eq!(
            store.message("m1").await.unwrap().unwrap().state,
            State::Unresolved
        );
        assert_eq!(
            store.requeue("m1", true, &op()).await.unwrap(),
            Requeue::Requeued
        );
        assert_eq!(
            store.message("m1").await.unwrap().unwrap().state,
            State::Queued
        );
    }

    #[tokio::test]
    async fn store_cancel_fails_an_unleased_queued_record_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let retention = Retention::flat(Duration::from_secs(3600));
        store.insert(&record("m1", "k1"), retention).await.unwrap();
        store.insert(&record("m2", "k2"), retention).await.unwrap();
        let leased = store.claim("w", LEASE).await.unwrap().unwrap();
        assert!(
            !store.cancel(&leased.id, &op()).await.unwrap(),
            "leased right now"
        );
        let other = if leased.id == "m1" { "m2" } else { "m1" };
        assert!(store.cancel(other, &op()).await.unwrap());
        let m = store.message(other).await.unwrap().unwrap();
        assert_eq!(m.state, State::Cancelled);
        assert!(!m.has_job);
        assert_eq!(
            m.upstream_reply.as_deref(),
            Some("cancelled by an operator")
        );
        assert_eq!(m.history.len(), 1);
        assert_eq!(
            (m.history[0].action.as_str(), m.history[0].reason.as_str()),
            ("cancel", "because")
        );
        assert!(
            !store.cancel(other, &op()).await.unwrap(),
            "already terminal"
        );
        assert!(!store.cancel("nope", &op()).await.unwrap());
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
