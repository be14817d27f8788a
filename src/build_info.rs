//! What this binary is: its version and the git commit it was built from (see build.rs).

pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit, 12 hex digits, or `unknown` when built outside a git checkout without
/// `IDEMRELAY_GIT_COMMIT`.
pub const GIT_COMMIT: &str = env!("IDEMRELAY_GIT_COMMIT");

/// `--version`'s text after the program name.
pub(crate) const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("IDEMRELAY_GIT_COMMIT"),
    ")"
);
