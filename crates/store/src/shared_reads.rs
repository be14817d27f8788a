//! The reads both dialects run as written, on either dialect's pool: the statements
//! (`rows::shared_sql`, `listing`) and their decoding (`rows`) are the same, only the driver
//! differs. Each dialect's `read.rs` keeps what differs: the record's own row (SQLite's spool,
//! the clock each reads) and the daily counts (sharded on Postgres).

use sqlx::{Database, Pool};

use crate::listing::{self, Dialect, ListFilter, Page};
use crate::record::{ActionRow, AttemptRow, RelayHealth, StoreError, StoredMessage};
use crate::rows::{self, shared_sql, Columns};
use crate::webhook::EventRow;

/// The shared reads on one pool.
pub(crate) struct SharedReads<'p, DB: Database>(pub(crate) &'p Pool<DB>);

impl<DB> SharedReads<'_, DB>
where
    DB: Database,
    DB::Row: Columns,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    (String,): for<'r> sqlx::FromRow<'r, DB::Row>,
    (Option<i64>,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    /// A record's notices and the operators' actions on it, beside its own row.
    pub(crate) async fn complete(
        &self,
        message: &mut StoredMessage,
        id: &str,
    ) -> Result<(), StoreError> {
        message.dsns = sqlx::query_scalar(shared_sql::DSNS_OF_RECORD)
            .bind(id)
            .fetch_all(self.0)
            .await?;
        let history = sqlx::query(shared_sql::ACTIONS_OF_RECORD)
            .bind(id)
            .fetch_all(self.0)
            .await?;
        message.history = history.iter().map(rows::action).collect::<Result<_, _>>()?;
        Ok(())
    }

    pub(crate) async fn attempts(&self, id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        let found = sqlx::query(shared_sql::ATTEMPTS_OF_RECORD)
            .bind(id)
            .fetch_all(self.0)
            .await?;
        found.iter().map(rows::attempt).collect()
    }

    pub(crate) async fn list_page(
        &self,
        filter: &ListFilter,
        dialect: Dialect,
    ) -> Result<Page, StoreError> {
        let (sql, params) =
            listing::list_sql(filter, dialect).map_err(StoreError::InvalidFilter)?;
        let found = listing::bind(sqlx::query(&sql), params)
            .fetch_all(self.0)
            .await?;
        let records = found.iter().map(rows::summary).collect::<Result<_, _>>()?;
        Ok(listing::page(records, filter))
    }

    pub(crate) async fn relay_actions(&self, limit: usize) -> Result<Vec<ActionRow>, StoreError> {
        let found = sqlx::query(shared_sql::RELAY_ACTIONS)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(self.0)
            .await?;
        found.iter().map(rows::action).collect()
    }

    pub(crate) async fn relay_health(&self, dialect: Dialect) -> Result<RelayHealth, StoreError> {
        let sql = listing::health_sql(dialect);
        let summary = sqlx::query(&sql.summary).fetch_one(self.0).await?;
        let newest = sqlx::query(&sql.newest_failure)
            .fetch_optional(self.0)
            .await?;
        let processes = sqlx::query(listing::PROCESSES).fetch_all(self.0).await?;
        let mut health = rows::relay_health(&summary, newest.as_ref(), &processes)?;
        if health.failing_since_ms.is_some() {
            let after = health.last_delivery_ms.unwrap_or(i64::MIN);
            let since: Option<i64> = sqlx::query_scalar(&sql.failing_since)
                .bind(after)
                .fetch_one(self.0)
                .await?;
            health.failing_since_ms = since.or(health.failing_since_ms);
        }
        Ok(health)
    }

    pub(crate) async fn id_by_key(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(shared_sql::ID_BY_KEY)
            .bind(scope)
            .bind(key)
            .fetch_optional(self.0)
            .await?)
    }

    pub(crate) async fn events(&self, record_id: &str) -> Result<Vec<EventRow>, StoreError> {
        let found = sqlx::query(rows::EVENTS_OF_RECORD)
            .bind(record_id)
            .fetch_all(self.0)
            .await?;
        found.iter().map(rows::event).collect()
    }
}
