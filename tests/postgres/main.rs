//! The tests about the store's backends and Postgres, one binary: the storage contract on
//! SQLite and Postgres, several relay processes on one Postgres database, Postgres going
//! away under load, and a failover to a synchronous standby. The Postgres tests are compiled
//! as ignored (saying why) unless `IDEMRELAY_TEST_POSTGRES` names a database (`build.rs`).
//! Each suite is a module, so its tests are named `SUITE::test`.

#[path = "../common/mod.rs"]
mod common;

mod failover;
mod multi_instance;
mod postgres_outage;
mod store_contract;
