//! In-process integration tests, one binary (linking the crate once instead of once per suite):
//! the relay, the sink and the admin/webhook listeners started inside the test process on port
//! 0, driven over real sockets (and by real clients where one exists: swaks, curl, HAProxy,
//! headless Chromium), plus the pure properties and the example config. Each suite is a module,
//! so its tests are named `SUITE::test`; `cargo test --test in_process SUITE::` runs one suite.
//!
//! The shared suites (intake, delivery_requests, delivery, delivery_races, delivery_policy,
//! breaker, hostile, admin, webhooks) run on Postgres with `IDEMRELAY_TEST_BACKEND=postgres` (see .ci/run).
//! The shared suites (intake, delivery, delivery_races, delivery_policy, dsn, breaker, hostile,
//! admin, webhooks) run on Postgres with `IDEMRELAY_TEST_BACKEND=postgres` (see .ci/run).

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod before_queue;
mod breaker;
mod delay_notice;
mod delivery;
mod delivery_policy;
mod delivery_races;
mod delivery_requests;
mod docs_reference;
mod dsn;
mod example_config;
mod fuzz_session;
mod hostile;
mod http_listeners;
mod intake;
mod proxy;
mod sink;
mod tls;
mod webhooks;
