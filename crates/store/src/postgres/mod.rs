//! The shared Postgres backend: several relay instances, one database. Every time that decides
//! retention, windows and leases comes from the database's clock (`idemrelay_now_ms()`), so
//! instances with skewed clocks still agree. Claims use `FOR UPDATE SKIP LOCKED`; every write
//! of a lease holder is fenced by the lease token.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor};

use self::group_commit::GroupCommit;
use self::hosts::Hosts;
use self::intake_writers::IntakeWriters;
use crate::migrate::{self, Embedded};
use crate::record::{retention_ms, StoreError};

mod group_commit;
mod hosts;
mod inserts;
mod intake;
mod intake_writers;
mod ledger;
mod matching;
mod operator;
mod queue;
mod read;
#[cfg(test)]
mod tests;
mod webhook;

pub(crate) struct PostgresStore {
    pool: PgPool,
    /// The intake writers (group commit).
    intake: IntakeWriters,
    /// The delivery side's writers of intents and plain outcomes (group commit).
    ledger: GroupCommit,
    /// The URL's hosts, and which one the pool connects to (`hosts.rs`).
    hosts: Arc<Hosts>,
    busy_timeout: Duration,
    /// The last health probe failed (with several hosts, the next one walks them first).
    probe_failed: AtomicBool,
}

impl PostgresStore {
    /// `busy_timeout` bounds each statement and each wait for a pooled connection, so an
    /// unreachable or wedged database turns into a prompt E01033 rather than a hung client.
    pub(crate) async fn open(url: &str, busy_timeout: Duration) -> Result<Self, StoreError> {
        let hosts = Arc::new(Hosts::parse(url, |o| o.application_name("idemrelay"))?);
        let first = hosts.first_suitable(busy_timeout).await?;
        hosts.start_at(first);
        // Migrations run on a connection of their own, without the statement timeout: a
        // future migration of a big table may rightly take longer than a store write.
        let mut migrating = PgConnection::connect_with(&hosts.current()).await?;
        Migrator::new(Embedded(migrate::POSTGRES))
            .await?
            .run(&mut migrating)
            .await?;
        migrating.close().await?;
        let (checked, fresh) = (hosts.clone(), hosts.clone());
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(busy_timeout + Duration::from_secs(1))
            .after_connect(move |conn, _| {
                let hosts = checked.clone();
                Box::pin(async move {
                    hosts.check(conn).await?;
                    durable_commits(conn).await
                })
            })
            .before_acquire(move |_, meta| {
                let fresh = fresh.fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .connect_with(session_options(hosts.current(), busy_timeout))
            .await?;
        let intake = IntakeWriters::start(pool.clone(), hosts.clone());
        let ledger = GroupCommit::start(pool.clone());
        Ok(PostgresStore {
            pool,
            intake,
            ledger,
            hosts,
            busy_timeout,
            probe_failed: AtomicBool::new(false),
        })
    }

    /// The health probe's own test: takes, and gives back, the lock an insert needs.
    async fn probe_writable(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        tx.execute("LOCK TABLE messages IN ROW EXCLUSIVE MODE")
            .await?;
        tx.rollback().await?;
        Ok(())
    }
}

/// The pool's connections bound each statement and lock wait by the busy timeout, and never
/// compile a plan to machine code: on a large table (a million records) the planner's cost
/// estimates pass the JIT threshold for statements that read a few index pages, and the
/// compiling took 240 ms of CPU for a retention purge that runs in 0.3 ms without it.
pub(super) fn session_options(
    options: PgConnectOptions,
    busy_timeout: Duration,
) -> PgConnectOptions {
    let timeout_ms = retention_ms(busy_timeout).max(1).to_string();
    options.options([
        ("statement_timeout", timeout_ms.as_str()),
        ("lock_timeout", timeout_ms.as_str()),
        ("jit", "off"),
    ])
}

/// A commit must be on disk before its 250: `synchronous_commit=off` would acknowledge
/// commits a crash can still lose, and `local` does not wait for synchronous replicas. The
/// level is set on every connection, even when the server's is already durable: a session's
/// own setting outlives a later reload of the server's configuration, which would otherwise
/// apply to this session too. `remote_write` is raised to `on` as well: it waits only until
/// a synchronous standby has handed the commit to its operating system, not until it is on
/// the standby's disk, so a standby's power cut after a failover could lose an acknowledged
/// message. `remote_apply` (stronger than `on`) is kept.
async fn durable_commits(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let mode: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut *conn)
        .await?;
    conn.execute(durable_commit_statement(&mode)).await?;
    Ok(())
}

/// The `SET` for a connection whose server-side level is `mode`.
fn durable_commit_statement(mode: &str) -> &'static str {
    match mode {
        "remote_apply" => "SET synchronous_commit = remote_apply",
        _ => "SET synchronous_commit = on",
    }
}

pub(super) async fn db_now(conn: &mut PgConnection) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar("SELECT idemrelay_now_ms()")
        .fetch_one(&mut *conn)
        .await?)
}
