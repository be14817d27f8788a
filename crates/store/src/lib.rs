//! Durable records: one storage trait, backends chosen by URL scheme.
//!
//! Layout: `record` (the shared nouns), `retention` and `transition` (what expiry and each
//! change of state mean, decided once), `backend` (the `Store` contract, one trait per role), `listing`, `rows` and
//! `webhook` (SQL and decoding both dialects share), then one directory per dialect. Only
//! this file names the modules together; they never name it back.

// `failpoint!`, exported by the model crate.
#[macro_use]
extern crate idemrelay_model;

mod attempt;
mod backend;
mod health;
pub(crate) mod listing;
mod migrate;
pub(crate) mod postgres;
mod record;
mod retention;
mod rows;
mod shared_reads;
pub mod sqlite;
#[cfg(test)]
mod test_checks;
mod transition;
mod upstream_id;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

pub use attempt::{OutcomeKind, Phase};
pub use backend::{IntakeStore, OperatorStore, QueueStore, ReadStore, Store, WebhookStore};
pub use health::StoreHealth;
pub use listing::{Cursor, ListFilter, Page, StateFilter};
pub use record::*;
pub use retention::Retention;
pub use transition::{confirmation_reason, flush_all_detail};
pub use webhook::{
    EventKind, EventRow, UpstreamEvent, WebhookApplied, WebhookOutcome, WebhookReceipt,
};

/// Opens the backend named by the URL scheme.
pub async fn open(url: &str, busy_timeout: Duration) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(
            sqlite::SqliteStore::open(url, busy_timeout).await?,
        ))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(
            postgres::PostgresStore::open(url, busy_timeout).await?,
        ))
    } else {
        Err(StoreError::Config(format!(
            "unsupported store URL scheme in {} (supported: sqlite://, postgres://)",
            idemrelay_model::secret::SecretUrl(url.to_string()).redacted()
        )))
    }
}

/// Opens a store that must exist already (the `queue` and `report` commands: a typo in a path
/// must not create an empty store and report it empty). Only `serve` creates a store.
pub async fn open_existing(
    url: &str,
    busy_timeout: Duration,
) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        let path = sqlite::database_path(url)?;
        if !path.exists() {
            return Err(StoreError::Config(format!(
                "no store at {} (from {url}); check --store / IDEMRELAY_STORE (`idemrelay serve` \
                 creates the store, the queue commands never do)",
                path.display()
            )));
        }
    }
    open(url, busy_timeout).await
}
