//! Users and their credentials.
//!
//! The users file is TOML with one `[users.<name>]` table per submission user; see
//! `file.rs` for its exact rules. Passwords are stored only as argon2id PHC strings.

mod file;
mod gate;
mod live;
pub(crate) mod throttle;
mod users;
pub(crate) mod verify;

pub(crate) use gate::{AuthGate, AuthVerdict};
pub(crate) use live::LiveUsers;
pub use users::{
    hash_password, Authenticated, User, Users, MAX_NAME_LEN, MAX_PATTERN_LEN, MAX_SCOPE_LEN,
    MIN_PASSWORD_CHARS,
};

#[cfg(test)]
pub(crate) use users::tests;
