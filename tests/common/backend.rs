//! Which store the tests run on, and the backend-specific tools they need (a fresh Postgres
//! schema per relay, a writer that blocks the store, row counts).

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use idemrelay::config::SecretUrl;
use sqlx::{Connection, Executor};

/// Names a Postgres database the tests may fill with schemas (`.ci/run` creates it fresh).
pub const POSTGRES_ENV: &str = "IDEMRELAY_TEST_POSTGRES";
/// `postgres` runs the shared suites on Postgres instead of SQLite.
pub const BACKEND_ENV: &str = "IDEMRELAY_TEST_BACKEND";

pub fn postgres_base() -> Option<String> {
    std::env::var(POSTGRES_ENV).ok().filter(|u| !u.is_empty())
}

/// The Postgres URL for a test that needs one, or None after saying clearly that it skips.
pub fn postgres_or_skip(test: &str) -> Option<String> {
    let base = postgres_base();
    if base.is_none() {
        eprintln!("SKIPPED {test}: set {POSTGRES_ENV}=postgres://USER@HOST/DB to run it");
    }
    base
}

pub fn on_postgres() -> bool {
    match std::env::var(BACKEND_ENV).as_deref() {
        Ok("postgres") => {
            assert!(
                postgres_base().is_some(),
                "{BACKEND_ENV}=postgres needs {POSTGRES_ENV}"
            );
            true
        }
        Ok("sqlite") | Ok("") | Err(_) => false,
        Ok(other) => panic!("{BACKEND_ENV}={other:?}: expected sqlite or postgres"),
    }
}

/// The store for a new test relay: its own SQLite file in `dir`, or its own Postgres schema.
pub async fn store_url(dir: &Path) -> SecretUrl {
    if on_postgres() {
        SecretUrl(fresh_schema(&postgres_base().unwrap()).await)
    } else {
        SecretUrl(format!("sqlite://{}", dir.join("relay.db").display()))
    }
}

/// Creates an empty schema in the database at `base` and returns a URL whose connections
/// use it, so tests sharing one database never see each other's rows.
pub async fn fresh_schema(base: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let schema = format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        fastrand::u32(..)
    );
    let mut conn = sqlx::PgConnection::connect(base)
        .await
        .unwrap_or_else(|e| panic!("cannot reach {POSTGRES_ENV}: {e}"));
    conn.execute(format!("CREATE SCHEMA {schema}").as_str())
        .await
        .unwrap();
    conn.close().await.unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options[search_path]={schema}")
}

/// Number of rows in a table, read through a separate connection.
pub async fn count(store: &str, table: &str) -> i64 {
    scalar(store, &format!("SELECT COUNT(*) FROM {table}")).await
}

/// The one integer a query returns, read through a separate connection.
pub async fn scalar(store: &str, sql: &str) -> i64 {
    if store.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(store).await.unwrap();
        let n = sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap();
        conn.close().await.unwrap();
        n
    } else {
        let mut conn = sqlx::SqliteConnection::connect(store).await.unwrap();
        let n = sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap();
        conn.close().await.unwrap();
        n
    }
}

/// Moves every record's times (acceptance, finish, attempts) `by` into the past, as if that
/// much time had gone by: for retention rules measured in hours and days.
pub async fn age_records(store: &str, by: std::time::Duration) {
    let ms = by.as_millis();
    execute(
        store,
        &format!(
            "UPDATE messages SET accepted_at = accepted_at - {ms},
                finished_at = finished_at - {ms}"
        ),
    )
    .await;
    execute(
        store,
        &format!(
            "UPDATE attempts SET started_at = started_at - {ms},
                finished_at = finished_at - {ms}"
        ),
    )
    .await;
}

/// A writer that holds the store's write lock from outside the relay, as a stuck writer
/// would: SQLite's reserved lock, or an EXCLUSIVE lock on the Postgres record tables (reads
/// still pass, as with SQLite).
pub enum WriteLock {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl WriteLock {
    pub async fn hold(store: &str) -> WriteLock {
        if store.starts_with("postgres") {
            let mut conn = sqlx::PgConnection::connect(store).await.unwrap();
            // The tables are locked one after the other, in the order the relay's own
            // transactions reach them (a webhook receipt before the records it matches), so
            // that a relay transaction already under way finishes first instead of waiting
            // on us while we wait on it. Should Postgres still find a deadlock with some
            // other order and pick this lock as its victim, it is taken again.
            let mut tries = 0;
            loop {
                conn.execute("BEGIN").await.unwrap();
                let locked = conn
                    .execute(
                        "LOCK TABLE webhook_receipts, messages, delivery_jobs, attempts \
                         IN EXCLUSIVE MODE",
                    )
                    .await;
                match locked {
                    Ok(_) => break,
                    Err(e) if tries < 5 => {
                        tries += 1;
                        eprintln!("write lock: {e}; taking it again");
                        conn.execute("ROLLBACK").await.unwrap();
                    }
                    Err(e) => panic!("write lock: {e}"),
                }
            }
            WriteLock::Postgres(conn)
        } else {
            let mut conn = sqlx::SqliteConnection::connect(store).await.unwrap();
            conn.execute("BEGIN IMMEDIATE").await.unwrap();
            WriteLock::Sqlite(conn)
        }
    }

    pub async fn release(self) {
        match self {
            WriteLock::Sqlite(mut conn) => {
                conn.execute("ROLLBACK").await.unwrap();
                conn.close().await.unwrap();
            }
            WriteLock::Postgres(mut conn) => {
                conn.execute("ROLLBACK").await.unwrap();
                conn.close().await.unwrap();
            }
        }
    }
}

/// Runs one statement on the store through a separate connection (to break it on purpose).
pub async fn execute(store: &str, sql: &str) {
    if store.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(store).await.unwrap();
        conn.execute(sql).await.unwrap();
        conn.close().await.unwrap();
    } else {
        let mut conn = sqlx::SqliteConnection::connect(store).await.unwrap();
        conn.execute(sql).await.unwrap();
        conn.close().await.unwrap();
    }
}

/// The one text column a query returns, every row, read through a separate connection.
pub async fn strings(store: &str, sql: &str) -> Vec<String> {
    if store.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(store).await.unwrap();
        let rows = sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap();
        conn.close().await.unwrap();
        rows
    } else {
        let mut conn = sqlx::SqliteConnection::connect(store).await.unwrap();
        let rows = sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap();
        conn.close().await.unwrap();
        rows
    }
}
