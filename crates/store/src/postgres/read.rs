//! Read-only views on Postgres.

use async_trait::async_trait;

use super::PostgresStore;
use crate::backend::ReadStore;
use crate::listing::{self, ListFilter, Page};
use crate::record::{
    ActionRow, AttemptRow, DailyCounts, QueueStats, RelayHealth, StoreError, StoredMessage,
};
use crate::rows::{self, shared_sql};
use crate::webhook::EventRow;

#[async_trait]
impl ReadStore for PostgresStore {
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
        message.dsns = sqlx::query_scalar(shared_sql::DSNS_OF_RECORD)
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        let history = sqlx::query(shared_sql::ACTIONS_OF_RECORD)
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        message.history = history.iter().map(rows::action).collect::<Result<_, _>>()?;
        Ok(Some(message))
    }

    async fn attempts(&self, id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        let found = sqlx::query(shared_sql::ATTEMPTS_OF_RECORD)
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

    async fn relay_actions(&self, limit: usize) -> Result<Vec<ActionRow>, StoreError> {
        let found = sqlx::query(shared_sql::RELAY_ACTIONS)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        found.iter().map(rows::action).collect()
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
        listing::queue_stats(&self.pool).await
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
        Ok(sqlx::query_scalar(shared_sql::ID_BY_KEY)
            .bind(scope)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn events(&self, record_id: &str) -> Result<Vec<EventRow>, StoreError> {
        let found = sqlx::query(rows::EVENTS_OF_RECORD)
            .bind(record_id)
            .fetch_all(&self.pool)
            .await?;
        found.iter().map(rows::event).collect()
    }
}
