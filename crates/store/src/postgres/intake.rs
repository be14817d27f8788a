//! Intake on Postgres: the store's intake role. A new record goes to the group-commit
//! writers (`intake_writers.rs`); the lookups, the probe and the counts are statements of
//! their own.

use async_trait::async_trait;

use super::PostgresStore;
use crate::backend::IntakeStore;
use crate::record::{utc_day, Existing, Insert, NewRecord, StoreError};
use crate::retention::Retention;
use crate::rows;

#[async_trait]
impl IntakeStore for PostgresStore {
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
                .follow(&self.pool, busy, |o| super::session_options(o, busy))
        };
        let probed = async {
            // Once a probe has failed, the list is walked first: the pool's host may be the
            // dead primary, and waiting for a connection to it (`store_busy_timeout` + 1 s)
            // at every probe would put off the move to a standby promoted meanwhile by that
            // much each time.
            if self.probe_failed.load(std::sync::atomic::Ordering::Relaxed) {
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
        self.probe_failed
            .store(probed.is_err(), std::sync::atomic::Ordering::Relaxed);
        probed
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
}
