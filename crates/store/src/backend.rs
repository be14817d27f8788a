//! The storage contract, split by role: intake, queue (delivery), operator, webhook and read.
//! Both backends (`sqlite`, `postgres`) implement every role, one file per role in each
//! dialect's folder, and the contract tests (tests/postgres/store_contract.rs) check both.
//! `Store` is all the roles together, for what wires the relay up.

use std::time::Duration;

use async_trait::async_trait;

use super::listing::{Cursor, ListFilter, Page, StateFilter};
use super::record::{
    Action, ActionRow, AttemptResult, AttemptRow, Claimed, DailyCounts, Existing, Flush, Insert,
    MessageSummary, NewRecord, Operator, Pause, QueueStats, RelayHealth, Requeue, Resolution,
    Resolve, Settle, State, StoreError, StoredMessage,
};
use super::retention::Retention;
use super::webhook::{EventRow, WebhookApplied, WebhookReceipt};

/// What intake needs: the record under its key, durably, and the key's owners.
#[async_trait]
pub trait IntakeStore: Send + Sync {
    /// Inserts the record (and its delivery job when queued) in one transaction, relying on
    /// the unique (scope, key, part) constraint. When that is taken, the live parts under the
    /// key are returned instead; when every record under the key has expired
    /// (`Retention::expired`), they are replaced.
    async fn insert(&self, record: &NewRecord, retention: Retention) -> Result<Insert, StoreError>;

    /// The live records (parts) under (scope, key), by part number.
    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        retention: Retention,
    ) -> Result<Vec<Existing>, StoreError>;

    /// Checks that a write transaction can be opened now (used to fail closed at connect).
    async fn probe(&self) -> Result<(), StoreError>;

    /// Counts one idempotent replay for the scope on the UTC day of `at_ms` (replays store
    /// nothing else, and `report` needs them).
    async fn record_replay(&self, scope: &str, at_ms: i64) -> Result<(), StoreError>;

    /// Makes `scope` the owner of `key_space` (an upstream account) unless a scope already
    /// is, and returns the owner: the one scope whose clients' keys that upstream sees
    /// unchanged. The first claim stands for good, for every instance on this store.
    async fn claim_key_space(&self, key_space: &str, scope: &str) -> Result<String, StoreError>;
}

/// What delivery workers need: leases on due jobs, the attempt ledger's writes, liveness,
/// and the relay-wide pause that governs them all.
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Leases the next due job (fair across scopes), closing a dead worker's open intent.
    /// Nothing is claimed while delivery is paused (checked in the same transaction).
    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError>;

    /// Leases the record `id` itself, due or not, when no one holds it and delivery is not
    /// paused (the before-queue mode sends a message the moment intake committed it). `None`
    /// otherwise, and for a record whose body cannot be used (marked damaged) or that has an
    /// intent left open (the ordinary claim closes it).
    async fn claim_id(
        &self,
        id: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError>;

    /// Writes the intent row before the upstream is contacted. False if the lease was lost.
    async fn begin_attempt(&self, id: &str, token: i64, attempt: u32) -> Result<bool, StoreError>;

    /// Writes the attempt's outcome (if an attempt was made) and what follows, in one
    /// commit, fenced by the lease token. False if the lease was lost.
    async fn settle(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
    ) -> Result<bool, StoreError>;

    /// `settle`, and in the same commit the record's stored reply (what a retry of the
    /// submission replays) becomes `reply`: the before-queue mode told the client the
    /// upstream's verdict. Fenced by the lease token like `settle`.
    async fn settle_answered(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
        reply: &str,
    ) -> Result<bool, StoreError>;

    /// Extends a lease still held under `token`; false if it was lost.
    async fn renew_lease(&self, id: &str, token: i64, lease: Duration) -> Result<bool, StoreError>;

    /// Gives a lease back without an attempt (queue paused, breaker open, rate limit).
    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError>;

    /// Records, at the store's clock, that the relay process `process` is alive (docs/concepts/delivery.md
    /// "Liveness"). Its workers' lease owners are `<process>-<n>`.
    async fn heartbeat(&self, process: &str) -> Result<(), StoreError>;

    /// Ends the unexpired leases of processes whose heartbeat is older than `stale_after`, so
    /// their jobs (and open intents, which become UNKNOWN at the next claim) are taken over
    /// now rather than at lease expiry. A lease whose process has no heartbeat row at all is
    /// left to expire: that is no evidence either way.
    async fn reclaim_dead_leases(&self, stale_after: Duration) -> Result<u64, StoreError>;

    /// Relay-wide delivery pause; `None` when running.
    async fn paused(&self) -> Result<Option<Pause>, StoreError>;

    /// `probe`: the relay may resume by itself once the upstream answers a probe normally.
    async fn pause(&self, reason: &str, probe: bool) -> Result<(), StoreError>;

    /// An operator lifts the pause, whoever set it.
    async fn resume(&self) -> Result<(), StoreError>;

    /// A probe that the upstream answered normally lifts the pause only if the relay set it
    /// and no operator has paused since (an operator's pause is lifted only by an operator).
    /// True when it was lifted.
    async fn resume_after_probe(&self) -> Result<bool, StoreError>;
}

/// What operators change (the admin API, the console, `idemrelay queue`): each change is
/// recorded as the operator's action in the same commit.
#[async_trait]
pub trait OperatorStore: Send + Sync {
    /// Puts a `failed`, `unresolved` or `cancelled` record back in the queue with a job due
    /// now; its ledger is kept and later attempts continue its numbering. `confirmed`: the
    /// operator accepts that a retry may deliver a second copy, required whenever the ledger
    /// holds an UNKNOWN attempt (see `requeue_refusal`). Recorded as `by`'s action in the
    /// same commit.
    async fn requeue(
        &self,
        id: &str,
        confirmed: bool,
        by: &Operator,
    ) -> Result<Requeue, StoreError>;

    /// Cancels a queued record whose job is not leased right now (no DSN), recorded as
    /// `by`'s action in the same commit. False otherwise.
    async fn cancel(&self, id: &str, by: &Operator) -> Result<bool, StoreError>;

    /// Cancels each of `ids` still queued and not leased right now (no DSN), in one commit
    /// with ONE relay-wide action row for them all: "cancelled N record(s) WHAT" (`what`
    /// names the selection, e.g. the filters). Returns the ids cancelled.
    async fn cancel_all(
        &self,
        ids: &[String],
        by: &Operator,
        what: &str,
    ) -> Result<Vec<String>, StoreError>;

    /// Closes an `unresolved` record as delivered or failed without sending it again,
    /// recorded as `by`'s action in the same commit (no DSN).
    async fn resolve(
        &self,
        id: &str,
        resolution: Resolution,
        by: &Operator,
    ) -> Result<Resolve, StoreError>;

    /// Makes a queued record that no worker holds due now, recorded as `by`'s action.
    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError>;

    /// Makes every queued record due now that is not yet due and that no worker holds,
    /// recorded as ONE relay-wide action of `by`'s with the count. Returns the ids flushed.
    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError>;

    /// Records an operator action on the whole relay (pause, resume, purge).
    async fn record_action(
        &self,
        action: Action,
        by: &Operator,
        detail: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Deletes the records that have expired (`Retention::expired`); returns how many.
    async fn purge_expired(&self, retention: Retention) -> Result<u64, StoreError>;
}

/// What the webhook listener writes: a request's events, matched and applied once.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Receives one webhook request exactly once, in ONE transaction: the receipt under the
    /// unique (source, webhook id) (a duplicate changes nothing), every event, its match and
    /// its effect (docs/concepts/webhooks.md).
    async fn apply_webhook(&self, receipt: &WebhookReceipt) -> Result<WebhookApplied, StoreError>;
}

/// Read-only views for the console, the API, reports and metrics; none of them writes.
#[async_trait]
pub trait ReadStore: Send + Sync {
    async fn message(&self, id: &str) -> Result<Option<StoredMessage>, StoreError>;

    async fn attempts(&self, id: &str) -> Result<Vec<AttemptRow>, StoreError>;

    /// One page of the records `filter` selects, ordered by id (acceptance order). A cursor
    /// from a listing in the other order is `StoreError::InvalidFilter`.
    async fn list_page(&self, filter: &ListFilter) -> Result<Page, StoreError>;

    /// Records ordered by id, optionally in one state, after `after_id` (for paging).
    async fn list(
        &self,
        state: Option<State>,
        limit: usize,
        after_id: Option<&str>,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let filter = ListFilter {
            state: state.map(StateFilter::Is),
            cursor: after_id.map(Cursor::after_id),
            ..ListFilter::all(limit)
        };
        Ok(self.list_page(&filter).await?.records)
    }

    /// The newest operator actions on the whole relay, newest first.
    async fn relay_actions(&self, limit: usize) -> Result<Vec<ActionRow>, StoreError>;

    /// Daily counts per scope from `since_day` (`YYYY-MM-DD`, UTC) on, ordered by day, scope.
    async fn report(&self, since_day: Option<&str>) -> Result<Vec<DailyCounts>, StoreError>;

    /// Records per state and the acceptance time of the oldest queued one (for metrics).
    async fn queue_stats(&self) -> Result<QueueStats, StoreError>;

    /// The ledger's newest failure and the run it ends, the deferred count and the relay
    /// processes' heartbeats (the console's overview). Read-only.
    async fn relay_health(&self) -> Result<RelayHealth, StoreError>;

    /// The id of the record under (scope, key), expired or not (operators look up old keys too).
    async fn lookup_id_by_key(&self, scope: &str, key: &str) -> Result<Option<String>, StoreError>;

    /// The upstream events matched to a record, by recipient and event time.
    async fn events(&self, record_id: &str) -> Result<Vec<EventRow>, StoreError>;
}

/// The whole storage contract: every role. Each backend implements the roles; a component
/// that needs only one can hold that role (`Arc<dyn Store>` coerces to `Arc<dyn QueueStore>`).
pub trait Store: IntakeStore + QueueStore + OperatorStore + WebhookStore + ReadStore {}

impl<T> Store for T where T: IntakeStore + QueueStore + OperatorStore + WebhookStore + ReadStore {}
