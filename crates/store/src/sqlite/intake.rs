//! Intake on SQLite: the record and its job in the batch's commit, key lookups, replay
//! counts and upstream key-space owners. The writes run on the group-commit writer's thread
//! (rusqlite, synchronous), each under its own savepoint of one batch transaction; reads stay
//! on sqlx's pool.

use std::sync::Mutex;

use async_trait::async_trait;
use rusqlite::{params, Connection};

use super::spool::{Spool, SPOOL_MIN};
use super::webhook;
use super::SqliteStore;
use crate::backend::IntakeStore;
use crate::record::{
    body_checksum, now_ms, utc_day, Existing, Insert, KeySource, NewRecord, State, StoreError,
};
use crate::retention::Retention;
use crate::rows;

#[async_trait]
impl IntakeStore for SqliteStore {
    async fn insert(&self, record: &NewRecord, retention: Retention) -> Result<Insert, StoreError> {
        let record = record.clone();
        let spool = self.spool.clone();
        self.writer
            .write(move |conn| insert(conn, &spool, &record, retention))
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

    async fn probe(&self) -> Result<(), StoreError> {
        // Runs in a batch: succeeds when the writer can take the write lock now.
        self.writer.write(|_| Ok(())).await
    }

    async fn record_replay(&self, scope: &str, at_ms: i64) -> Result<(), StoreError> {
        let scope = scope.to_string();
        let day = utc_day(at_ms);
        self.writer
            .write(move |conn| record_replay(conn, &scope, &day))
            .await
    }

    async fn claim_key_space(&self, key_space: &str, scope: &str) -> Result<String, StoreError> {
        let (key_space, scope) = (key_space.to_string(), scope.to_string());
        self.writer
            .write(move |conn| claim_key_space(conn, &key_space, &scope))
            .await
    }
}

/// Inserts a message row unless its (scope, key) is taken; returns the rows inserted. A
/// queued record's delivery job comes with it (a trigger). A large body goes to the spool
/// (synced before the batch commits); a row that is not inserted leaves only unreferenced
/// bytes there.
pub(super) fn insert_message(
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
            KeySource::stored(record.key_source),
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

pub(super) fn insert(
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

pub(super) fn claim_key_space(
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

pub(super) fn record_replay(conn: &Connection, scope: &str, day: &str) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO daily_counts (scope, day, replayed) VALUES (?, ?, 1)
         ON CONFLICT (scope, day) DO UPDATE SET replayed = daily_counts.replayed + 1",
    )?
    .execute(params![scope, day])?;
    Ok(())
}
