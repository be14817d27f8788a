//! Read-only views on Postgres.

use async_trait::async_trait;

use super::PostgresStore;
use crate::backend::ReadStore;
use crate::listing::{self, ListFilter, Page};
use crate::record::{
    ActionRow, AttemptRow, DailyCounts, QueueStats, RelayHealth, StoreError, StoredMessage,
};
use crate::rows;
use crate::shared_reads::SharedReads;
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
        SharedReads(&self.pool).complete(&mut message, id).await?;
        Ok(Some(message))
    }

    async fn attempts(&self, id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        SharedReads(&self.pool).attempts(id).await
    }

    async fn list_page(&self, filter: &ListFilter) -> Result<Page, StoreError> {
        SharedReads(&self.pool)
            .list_page(filter, listing::Dialect::Postgres)
            .await
    }

    async fn relay_actions(&self, limit: usize) -> Result<Vec<ActionRow>, StoreError> {
        SharedReads(&self.pool).relay_actions(limit).await
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
        SharedReads(&self.pool)
            .relay_health(listing::Dialect::Postgres)
            .await
    }

    async fn lookup_id_by_key(&self, scope: &str, key: &str) -> Result<Option<String>, StoreError> {
        SharedReads(&self.pool).id_by_key(scope, key).await
    }

    async fn events(&self, record_id: &str) -> Result<Vec<EventRow>, StoreError> {
        SharedReads(&self.pool).events(record_id).await
    }
}
