//! idemrelay: an SMTP submission relay with exactly-once acceptance.
//!
//! Bytes flow socket → `smtp::server` → `smtp::session` (pure) → `intake` → `store`.

pub mod admin;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod delivery;
pub mod intake;
pub mod metrics;
pub mod sink;
pub mod smtp;
pub mod store;
