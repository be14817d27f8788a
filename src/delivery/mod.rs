//! Delivery: claim → attempt → classify → schedule, with the attempt ledger in the store.

pub(crate) mod breaker;
pub(crate) mod decide;
pub(crate) mod dsn;
pub(crate) mod extensions;
pub(crate) mod immediate;
pub(crate) mod outcome;
pub(crate) mod ratelimit;
pub(crate) mod reply_class;
pub(crate) mod retry;
pub(crate) mod upstream;
pub(crate) mod worker;
