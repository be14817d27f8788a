//! Migrations compiled into the binary (one list per dialect), applied with sqlx's migrator
//! at start, so a release binary needs no migrations directory beside it.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use sqlx::migrate::{Migration, MigrationSource, MigrationType};

/// (version, name, SQL) in version order.
pub type Steps = &'static [(i64, &'static str, &'static str)];

#[derive(Debug)]
pub struct Embedded(pub Steps);

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
        Box::pin(async move {
            Ok(self
                .0
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
