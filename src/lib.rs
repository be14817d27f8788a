//! idemrelay: an SMTP submission relay with exactly-once acceptance.
//!
//! Bytes flow socket → `smtp::server` → `smtp::session` (pure) → `intake` → `store`.

// First: `failpoint!` is a macro_rules macro, visible only to the modules declared after it.
#[macro_use]
pub mod failpoint;

pub mod admin;
pub mod allocator;
pub mod app;
pub mod auth;
pub mod build_info;
pub mod cli;
pub mod config;
pub mod config_env;
pub mod delivery;
#[doc(hidden)]
pub mod docs_reference;
pub(crate) mod hostname;
pub(crate) mod http_serve;
pub(crate) mod human_duration;
pub mod intake;
pub(crate) mod log_budget;
pub mod log_format;
pub mod mail;
pub mod metrics;
pub mod reply;
pub mod secret;
pub mod sendmail;
pub mod shutdown;
pub mod sink;
pub mod smtp;
pub mod store;
pub mod webhook;
