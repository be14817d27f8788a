//! Black-box tests of the built `idemrelay` binary, one binary (linking the crate once): the
//! relay, `sendmail` and the `queue`/`report` commands run as processes the way an operator, a
//! supervisor or a program would run them, observed through sockets, exit statuses, output and
//! the store they leave behind; SIGKILL during deliveries. Each suite is a module, so its tests
//! are named `SUITE::test`.

#[path = "../common/mod.rs"]
mod common;

mod backup;
mod binary;
mod delivery_crash;
mod descriptors;
mod doc_examples;
mod logs;
mod queue_cli;
