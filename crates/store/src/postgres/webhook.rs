//! Upstream events on Postgres: the store's webhook role. The matching itself, and its
//! advisory locks, are in `matching.rs`, which intake and delivery run too.

use async_trait::async_trait;

use super::matching;
use super::PostgresStore;
use crate::backend::WebhookStore;
use crate::record::StoreError;
use crate::webhook::{WebhookApplied, WebhookReceipt};

#[async_trait]
impl WebhookStore for PostgresStore {
    async fn apply_webhook(&self, receipt: &WebhookReceipt) -> Result<WebhookApplied, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now = super::db_now(&mut tx).await?;
        let applied = matching::apply(&mut tx, receipt, now).await?;
        if applied == WebhookApplied::Duplicate {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
        Ok(applied)
    }
}
