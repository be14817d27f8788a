//! The bottom of the workspace: the nouns every layer of idemrelay shares, with no I/O and no
//! dependency on any other idemrelay crate. The SMTP protocol, the store and the relay all name
//! these, so none of them has to import another to speak of an envelope or a reply line.

// First: `failpoint!` is exported for the crates that place crash points (store, relay).
#[macro_use]
pub mod failpoint;

mod authenticated;
pub mod breaker;
pub mod fingerprint;
pub mod mail;
pub mod reply;
pub mod secret;
pub mod timestamp;

pub use authenticated::Authenticated;
