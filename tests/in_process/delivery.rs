//! Delivery over real sockets with `idemrelay sink` as the upstream: every row of the delivery
//! outcome table (docs/concepts/delivery.md), byte-identical forwarding, DSNs, pause on account failures.

use crate::common;

use std::time::Duration;

use common::{eventually, message, relay_for, start_sink, submit, wait_state, Client};
use idemrelay::store::State;
use idemrelay_sink::{Down, FaultRule, FaultStage, Sink, SinkConfig, SinkHandle};

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod bytes;
mod destinations;
mod failures;
mod pause;
mod tls;

const LIMIT: Duration = Duration::from_secs(20);
