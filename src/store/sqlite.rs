//! The embedded SQLite backend: WAL, `synchronous=FULL`, every write under `BEGIN IMMEDIATE`.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Connection, Row};

use super::{
    now_ms, retention_ms, Existing, Insert, NewRecord, State, Store, StoreError, StoredMessage,
};
use crate::intake::fingerprint::Fingerprint;

/// Migrations compiled into the binary, applied with sqlx's migrator at start.
#[derive(Debug)]
struct Embedded;

const MIGRATIONS: &[(i64, &str, &str)] = &[(
    1,
    "messages",
    include_str!("../../migrations/sqlite/0001_messages.sql"),
)];

impl<'s> MigrationSource<'s> for Embedded {
    #[allow(clippy::type_complexity)]
    fn resolve(
        self,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<Vec<Migration>, Box<dyn std::error::Error + Send + Sync>>>
                + Send
                + 's,
        >,
    > {
        Box::pin(async {
            Ok(MIGRATIONS
                .iter()
                .map(|(version, name, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*name),
                        MigrationType::Simple,
                        Cow::Borrowed(*sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

pub struct SqliteStore {
    pool: SqlitePool,
}

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
            .connect_with(options)
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
        Migrator::new(Embedded).await?.run(&pool).await?;
        Ok(SqliteStore { pool })
    }
}

fn existing_from_row(row: &SqliteRow) -> Result<Existing, StoreError> {
    let id: String = row.try_get("id")?;
    let fp: Vec<u8> = row.try_get("fingerprint")?;
    let state: String = row.try_get("state")?;
    Ok(Existing {
        fingerprint: Fingerprint::from_slice(&fp).ok_or(StoreError::Corrupt {
            id: id.clone(),
            what: "fingerprint",
        })?,
        state: State::parse(&state).ok_or(StoreError::Corrupt {
            id: id.clone(),
            what: "state",
        })?,
        reply: row.try_get("reply")?,
        id,
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn insert(&self, record: &NewRecord, retention: Duration) -> Result<Insert, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_ms();
        let insert = || {
            sqlx::query(
                "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                    rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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
        };
        let mut inserted = insert().execute(&mut *tx).await?.rows_affected() == 1;
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
            let existing = existing_from_row(&row)?;
            let accepted_at: i64 = row.try_get("accepted_at")?;
            let expired = existing.state.is_terminal()
                && accepted_at.saturating_add(retention_ms(retention)) <= now;
            if !expired {
                tx.rollback().await?;
                return Ok(Insert::Existing(existing));
            }
            sqlx::query("DELETE FROM messages WHERE id = ?")
                .bind(&existing.id)
                .execute(&mut *tx)
                .await?;
            inserted = insert().execute(&mut *tx).await?.rows_affected() == 1;
        }
        debug_assert!(inserted);
        if record.state == State::Queued {
            sqlx::query("INSERT INTO delivery_jobs (message_id, due_at) VALUES (?, ?)")
                .bind(&record.id)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Insert::Inserted)
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
        row.as_ref().map(existing_from_row).transpose()
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
        let existing = existing_from_row(&row)?;
        let rcpts: String = row.try_get("rcpt_to")?;
        Ok(Some(StoredMessage {
            id: existing.id,
            scope: row.try_get("scope")?,
            key: row.try_get("idem_key")?,
            key_source: row.try_get("key_source")?,
            fingerprint: existing.fingerprint,
            mail_from: row.try_get("mail_from")?,
            rcpt_to: rcpts.split('\n').map(str::to_string).collect(),
            content: row.try_get("content")?,
            state: existing.state,
            reply: existing.reply,
            accepted_at_ms: row.try_get("accepted_at")?,
            has_job: row.try_get("has_job")?,
        }))
    }

    async fn finish(
        &self,
        id: &str,
        state: State,
        upstream_reply: Option<&str>,
    ) -> Result<bool, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
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
        tx.commit().await?;
        Ok(updated == 1)
    }

    async fn probe(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        let tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        tx.rollback().await?;
        Ok(())
    }

    async fn purge_expired(&self, retention: Duration) -> Result<u64, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let deleted = sqlx::query(&format!(
            "DELETE FROM messages WHERE state IN {TERMINAL_STATES} AND accepted_at + ? <= ?"
        ))
        .bind(retention_ms(retention))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }
}
