//! idemrelay: an SMTP submission relay with exactly-once acceptance.
//!
//! Bytes flow socket → `smtp::server` → `smtp::session` (pure) → `intake` → `store`.

// `failpoint!`, exported by the model crate, for the whole crate.
#[macro_use]
extern crate idemrelay_model;

// The lower crates under the names the relay's modules and tests use for them.
pub use idemrelay_model::{failpoint, mail, reply, secret};
pub(crate) use idemrelay_serve::http_serve;
#[cfg(feature = "sink")]
pub use idemrelay_sink as sink;
pub use idemrelay_store as store;

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
pub(crate) mod human_duration;
pub mod intake;
pub(crate) mod log_budget;
pub mod log_format;
pub mod metrics;
pub mod sendmail;
pub mod shutdown;
pub mod smtp;
pub mod webhook;
