//! Delivery: claim → attempt → classify → schedule, with the attempt ledger in the store.

pub mod breaker;
pub mod decide;
pub mod dsn;
pub mod outcome;
pub mod ratelimit;
pub mod retry;
pub mod upstream;
pub mod upstream_id;
pub mod worker;
