//! Migrations compiled into the binary (one list per dialect), applied with sqlx's migrator
//! at start, so a release binary needs no migrations directory beside it.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use sqlx::migrate::{Migration, MigrationSource, MigrationType};

/// (version, name, SQL) in version order.
pub(crate) type Steps = &'static [(i64, &'static str, &'static str)];

// `SQLITE` and `POSTGRES`, listed from the migrations directories by build.rs.
include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

#[derive(Debug)]
pub(crate) struct Embedded(pub Steps);

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

#[cfg(test)]
mod tests {
    use super::{Steps, POSTGRES, SQLITE};
    use crate::record::State;

    /// The list after the last `marker` in the migrations: what the schema says now.
    fn last_list(steps: Steps, marker: &str) -> String {
        let (_, _, sql) = steps
            .iter()
            .rev()
            .find(|(_, _, sql)| sql.contains(marker))
            .unwrap_or_else(|| panic!("no migration has {marker}"));
        let from = sql.rfind(marker).unwrap() + marker.len();
        sql[from..].split(')').next().unwrap().trim().to_string()
    }

    #[test]
    fn the_listed_migrations_are_the_files_in_version_order() {
        for (steps, dir) in [(SQLITE, "sqlite"), (POSTGRES, "postgres")] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../migrations")
                .join(dir);
            let mut files: Vec<String> = std::fs::read_dir(path)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            files.sort();
            let listed: Vec<String> = steps
                .iter()
                .map(|(version, name, _)| format!("{version:04}_{name}.sql"))
                .collect();
            assert_eq!(listed, files, "{dir}");
            assert!(steps.windows(2).all(|w| w[0].0 < w[1].0), "{dir}");
        }
    }

    /// From `ALIKE_FROM` on, one change to the schema is one migration with the same version
    /// and name in both dialects (the two series were numbered apart before it: SQLite has no
    /// 14, and its 1 to 13 are not Postgres's 1 to 13). An upgrade then reads the same in both
    /// release notes, and a change made to one dialect alone fails here.
    #[test]
    fn migrations_are_numbered_alike_in_both_dialects_from_15_on() {
        const ALIKE_FROM: i64 = 15;
        let alike = |steps: Steps| -> Vec<(i64, &str)> {
            steps
                .iter()
                .filter(|(version, _, _)| *version >= ALIKE_FROM)
                .map(|(version, name, _)| (*version, *name))
                .collect()
        };
        assert_eq!(alike(SQLITE), alike(POSTGRES));
        assert!(!alike(SQLITE).is_empty());
    }

    /// The schema's lists of states are SQL the store cannot build at run time: they are
    /// checked against `State` here instead.
    #[test]
    fn the_schema_lists_the_states_state_knows() {
        assert_eq!(
            last_list(POSTGRES, "CHECK (state IN ("),
            State::sql_list(State::ALL)
        );
        // The finished states with a daily column of their own (`rejected` has none).
        let counted = State::sql_list(
            State::TERMINAL
                .into_iter()
                .filter(|s| *s != State::Rejected),
        );
        assert_eq!(last_list(POSTGRES, "NEW.state IN ("), counted);
        assert_eq!(last_list(SQLITE, "NEW.state IN ("), counted);
    }
}
