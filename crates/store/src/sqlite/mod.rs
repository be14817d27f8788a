//! The embedded SQLite backend: WAL, `synchronous=FULL`, every write under `BEGIN IMMEDIATE`.

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use self::group_commit::{BatchHooks, Writer};
use self::spool::{Spool, SpoolReader};
use crate::migrate::{self, Embedded};
use crate::record::StoreError;

mod group_commit;
mod intake;
mod operator;
mod queue;
mod read;
mod spool;
#[cfg(test)]
mod tests;
mod webhook;

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
pub fn database_path(url: &str) -> Result<std::path::PathBuf, StoreError> {
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
