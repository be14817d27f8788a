//! Durable records: one storage trait, backends chosen by URL scheme.

mod group_commit;
pub mod listing;
mod migrate;
pub mod postgres;
mod postgres_intake;
mod postgres_webhook;
mod rows;
mod spool;
pub mod sqlite;
mod sqlite_webhook;
mod sqlite_writes;
pub mod webhook;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::mail::Envelope;
use crate::mail::Fingerprint;
pub use listing::{Action, ActionRow, Cursor, Flush, ListFilter, Operator, Page, StateFilter};
pub use webhook::{
    EventKind, EventRow, UpstreamEvent, WebhookApplied, WebhookOutcome, WebhookReceipt,
};

/// Lifecycle of a record. Everything but `Queued` is terminal and may expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Queued,
    Delivered,
    Failed,
    Unresolved,
    /// Refused at intake with a permanent reply that is replayed to retries.
    Rejected,
    /// Taken out of the queue by an operator before delivery (no DSN).
    Cancelled,
}

impl State {
    pub const TERMINAL: [State; 5] = [
        State::Delivered,
        State::Failed,
        State::Unresolved,
        State::Rejected,
        State::Cancelled,
    ];

    /// Every state, for lists that must not miss one (counts, metrics labels, help texts).
    pub const ALL: [State; 6] = [
        State::Queued,
        State::Delivered,
        State::Failed,
        State::Unresolved,
        State::Rejected,
        State::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Delivered => "delivered",
            State::Failed => "failed",
            State::Unresolved => "unresolved",
            State::Rejected => "rejected",
            State::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => State::Queued,
            "delivered" => State::Delivered,
            "failed" => State::Failed,
            "unresolved" => State::Unresolved,
            "rejected" => State::Rejected,
            "cancelled" => State::Cancelled,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        self != State::Queued
    }
}

/// A record to insert. `key` is `None` for `missing_key = "pass"` submissions.
#[derive(Debug, Clone)]
pub struct NewRecord {
    pub id: String,
    pub scope: String,
    pub key: Option<String>,
    pub key_source: &'static str,
    pub fingerprint: Fingerprint,
    pub envelope: Envelope,
    /// Bytes to deliver (relay lines included); kept only for queued records.
    pub content: Option<Vec<u8>>,
    pub size: usize,
    pub state: State,
    /// The reply line given to the client, replayed to its retries.
    pub reply: String,
    /// For a delivery status notification: the message it reports on.
    pub dsn_of: Option<String>,
    /// Which part of a split message this is (DESIGN §1 "Split transactions"); 1 for most.
    pub part: u32,
    /// The fingerprint without the recipient set, shared by the parts of one message.
    pub message_fp: Fingerprint,
    /// The key the upstream sees, as written into `content` (DESIGN §1).
    pub upstream_key: Option<String>,
    /// The Message-ID header's value (without angle brackets), for matching upstream events.
    pub message_id: Option<String>,
}

/// A live record (one part) under the same (scope, key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    pub id: String,
    pub fingerprint: Fingerprint,
    pub reply: String,
    pub state: State,
    pub part: u32,
    /// `None` for a record stored before parts existed: it takes no further part.
    pub message_fp: Option<Fingerprint>,
    pub rcpt_to: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Insert {
    Inserted,
    /// The (scope, key, part) is taken: every live part under (scope, key), by part number.
    Existing(Vec<Existing>),
}

/// A stored record as read back (for `key`/`queue` commands and tests).
#[derive(Debug, Clone)]
pub struct StoredMessage {
    pub id: String,
    pub scope: String,
    pub key: Option<String>,
    /// The key the upstream sees (the client's own in the common case).
    pub upstream_key: Option<String>,
    pub part: u32,
    pub key_source: String,
    pub fingerprint: Fingerprint,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub content: Option<Vec<u8>>,
    pub state: State,
    pub reply: String,
    pub accepted_at_ms: i64,
    pub has_job: bool,
    /// When the record reached its terminal state.
    pub finished_at_ms: Option<i64>,
    /// The upstream's reply (or the relay's reason) for a terminal record.
    pub upstream_reply: Option<String>,
    /// Why the stored body cannot be used (unreadable, or not matching its checksum): as
    /// recorded when a claim found it, or as found by this read.
    pub damage: Option<String>,
    /// The Message-ID header's value at intake (without angle brackets).
    pub message_id: Option<String>,
    /// The upstream event that resolved this record (`source/webhook-id#index type`), when
    /// one did.
    pub resolved_by: Option<String>,
    /// For a delivery status notification: the record it reports on.
    pub dsn_of: Option<String>,
    /// The DSNs sent about this record (normally at most one).
    pub dsns: Vec<String>,
    /// When the queued record's next attempt is due (its job's due time).
    pub next_attempt_at_ms: Option<i64>,
    /// A worker holds the record's lease right now.
    pub leased: bool,
    /// Operator actions on this record, oldest first.
    pub history: Vec<ActionRow>,
}

/// One record as listed by `queue list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageSummary {
    pub id: String,
    pub scope: String,
    pub key: Option<String>,
    pub state: State,
    pub accepted_at_ms: i64,
    /// Rows in the attempt ledger.
    pub attempts: u32,
    /// Attempts that ended transient or unknown.
    pub failed_attempts: u32,
    pub last_outcome: Option<String>,
    pub last_phase: Option<String>,
    pub last_code: Option<u16>,
    pub upstream_reply: Option<String>,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    /// The Message-ID header's value (without angle brackets).
    pub message_id: Option<String>,
    /// For a DSN: the record it reports on.
    pub dsn_of: Option<String>,
    /// When a queued record's next attempt is due.
    pub next_attempt_at_ms: Option<i64>,
    /// A worker holds its lease right now.
    pub leased: bool,
    /// The store's clock when the listing was read (to say how far off `next_attempt_at_ms` is).
    pub read_at_ms: i64,
}

/// What an operator's requeue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    Requeued,
    NotFound,
    /// Only `failed` and `unresolved` records can be requeued.
    WrongState(State),
    /// The ledger holds an UNKNOWN attempt (always so for `unresolved`): a requeue may send a
    /// second copy, so it needs confirming. The record's state.
    NeedsConfirmation(State),
    /// The record's bytes are no longer stored, so there is nothing to resend.
    ContentGone,
}

/// A queued message handed to one worker under a lease, with the facts of its ledger.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: String,
    pub scope: String,
    pub key: Option<String>,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub eight_bit: bool,
    pub smtputf8: bool,
    pub content: Vec<u8>,
    pub accepted_at_ms: i64,
    /// Finished attempts so far (a recovered one included).
    pub attempts: u32,
    pub first_attempt_at_ms: Option<i64>,
    pub any_unknown: bool,
    /// An intent left open by a worker that lost its lease was closed as unknown.
    pub recovered: bool,
    /// The store's clock at the claim.
    pub now_ms: i64,
    /// Fencing token of this lease: every later write of the holder presents it, and a claim
    /// by anyone else changes it.
    pub token: i64,
}

/// The outcome of one attempt, as written to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptResult {
    pub outcome: &'static str,
    pub phase: Option<&'static str>,
    pub code: Option<u16>,
    pub reply: String,
}

/// What becomes of the message after an attempt.
#[derive(Debug, Clone)]
pub enum Settle {
    Delivered {
        upstream_reply: String,
    },
    Retry {
        after: Duration,
    },
    /// Permanently failed; the DSN (if the sender can get one) is queued in the same commit.
    Failed {
        upstream_reply: String,
        dsn: Option<Box<NewRecord>>,
    },
    Unresolved {
        upstream_reply: String,
    },
}

/// Why delivery is paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    pub reason: String,
    pub since_ms: i64,
    /// Set by the relay for an account-level failure: a normal probe resumes it.
    pub probe: bool,
}

/// One row of the ledger, for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRow {
    pub attempt: u32,
    pub owner: String,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub outcome: Option<String>,
    pub phase: Option<String>,
    pub code: Option<u16>,
    pub reply: Option<String>,
    /// The upstream's id for the message, from its reply to an accepted attempt.
    pub upstream_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(#[from] sqlx::Error),
    /// From the SQLite writer (rusqlite).
    #[error("store unavailable: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("store migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("store misconfigured: {0}")]
    Config(String),
    /// A listing's filter that cannot be run (the caller's mistake, not the store's).
    #[error("{0}")]
    InvalidFilter(String),
    /// The batch this write was part of did not commit: nothing of it is durable.
    #[error("store commit failed: {0}")]
    CommitFailed(String),
    #[error("store writer stopped")]
    WriterGone,
    #[error("corrupt record {id}: {what}")]
    Corrupt { id: String, what: &'static str },
    /// A spooled message body could not be written, synced or read.
    #[error("store spool: {0}")]
    Spool(String),
    /// A stored body that cannot be forwarded: unreadable, or not matching its checksum.
    #[error("stored body of {id} is damaged: {reason}")]
    Damaged { id: String, reason: String },
}

#[async_trait]
pub trait Store: Send + Sync {
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

    async fn message(&self, id: &str) -> Result<Option<StoredMessage>, StoreError>;

    /// Moves a queued record to a terminal state and removes its job.
    async fn finish(
        &self,
        id: &str,
        state: State,
        upstream_reply: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// Checks that a write transaction can be opened now (used to fail closed at connect).
    async fn probe(&self) -> Result<(), StoreError>;

    /// Deletes the records that have expired (`Retention::expired`); returns how many.
    async fn purge_expired(&self, retention: Retention) -> Result<u64, StoreError>;

    /// Leases the next due job (fair across scopes), closing a dead worker's open intent.
    /// Nothing is claimed while delivery is paused (checked in the same transaction).
    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError>;

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

    /// Extends a lease still held under `token`; false if it was lost.
    async fn renew_lease(&self, id: &str, token: i64, lease: Duration) -> Result<bool, StoreError>;

    /// Records, at the store's clock, that the relay process `process` is alive (DESIGN §2
    /// "Liveness"). Its workers' lease owners are `<process>-<n>`.
    async fn heartbeat(&self, process: &str) -> Result<(), StoreError>;

    /// Ends the unexpired leases of processes whose heartbeat is older than `stale_after`, so
    /// their jobs (and open intents, which become UNKNOWN at the next claim) are taken over
    /// now rather than at lease expiry. A lease whose process has no heartbeat row at all is
    /// left to expire: that is no evidence either way.
    async fn reclaim_dead_leases(&self, stale_after: Duration) -> Result<u64, StoreError>;

    /// Gives a lease back without an attempt (queue paused, breaker open, rate limit).
    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError>;

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

    /// Makes a queued record that no worker holds due now, recorded as `by`'s action.
    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError>;

    /// Makes every queued record due now that is not yet due and that no worker holds; each
    /// is recorded as `by`'s action. Returns the ids flushed.
    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError>;

    /// Records an operator action on the whole relay (pause, resume, purge).
    async fn record_action(
        &self,
        action: Action,
        by: &Operator,
        detail: Option<&str>,
    ) -> Result<(), StoreError>;

    /// The newest operator actions on the whole relay, newest first.
    async fn relay_actions(&self, limit: usize) -> Result<Vec<ActionRow>, StoreError>;

    /// Relay-wide delivery pause; `None` when running.
    async fn paused(&self) -> Result<Option<Pause>, StoreError>;
    /// `probe`: the relay may resume by itself once the upstream answers a probe normally.
    async fn pause(&self, reason: &str, probe: bool) -> Result<(), StoreError>;
    async fn resume(&self) -> Result<(), StoreError>;

    /// Counts one idempotent replay for the scope on the UTC day of `at_ms` (replays store
    /// nothing else, and `report` needs them).
    async fn record_replay(&self, scope: &str, at_ms: i64) -> Result<(), StoreError>;

    /// Daily counts per scope from `since_day` (`YYYY-MM-DD`, UTC) on, ordered by day, scope.
    async fn report(&self, since_day: Option<&str>) -> Result<Vec<DailyCounts>, StoreError>;

    /// Records per state and the acceptance time of the oldest queued one (for metrics).
    async fn queue_stats(&self) -> Result<QueueStats, StoreError>;

    /// The id of the record under (scope, key), expired or not (operators look up old keys too).
    async fn lookup_id_by_key(&self, scope: &str, key: &str) -> Result<Option<String>, StoreError>;

    /// Receives one webhook request exactly once, in ONE transaction: the receipt under the
    /// unique (source, webhook id) (a duplicate changes nothing), every event, its match and
    /// its effect (DESIGN §7).
    async fn apply_webhook(&self, receipt: &WebhookReceipt) -> Result<WebhookApplied, StoreError>;

    /// The upstream events matched to a record, by recipient and event time.
    async fn events(&self, record_id: &str) -> Result<Vec<EventRow>, StoreError>;
}

/// How long a terminal record keeps its key and replays (DESIGN §1 "Retention").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A `delivered` or `rejected` record replays for at least this long after acceptance.
    pub replay: Duration,
    /// Any record's key stays taken until the upstream's window has closed on its last
    /// attempt: until then the upstream may still hold the key, and a new operation under it
    /// (other bytes: a new `Received:` line at least) would be refused there as a reuse.
    pub upstream_window: Duration,
    /// `failed` and `unresolved` records are parked for an operator this long after they
    /// were parked.
    pub parked: Duration,
}

impl Retention {
    /// One duration for everything and no upstream window (store tests).
    pub fn flat(d: Duration) -> Self {
        Retention {
            replay: d,
            upstream_window: Duration::ZERO,
            parked: d,
        }
    }

    /// Whether a record has expired: its key is free for a new operation and the record may
    /// be purged. Queued records never expire.
    pub fn expired(
        &self,
        state: State,
        accepted_at_ms: i64,
        finished_at_ms: Option<i64>,
        last_attempt_at_ms: Option<i64>,
        now_ms: i64,
    ) -> bool {
        let after = |from: i64, d: Duration| from.saturating_add(retention_ms(d)) <= now_ms;
        let own = match state {
            State::Queued => return false,
            State::Delivered | State::Rejected => after(accepted_at_ms, self.replay),
            State::Failed | State::Unresolved | State::Cancelled => {
                after(finished_at_ms.unwrap_or(accepted_at_ms), self.parked)
            }
        };
        own && last_attempt_at_ms.is_none_or(|at| after(at, self.upstream_window))
    }

    /// `expired` as an SQL condition on `messages m`, given the SQL text of its parameters
    /// (`?1` or `$1` style): now, replay, parked and upstream window, in milliseconds.
    pub(crate) fn expired_sql(now: &str, replay: &str, parked: &str, window: &str) -> String {
        format!(
            "((m.state IN ('delivered', 'rejected') AND m.accepted_at + {replay} <= {now})
               OR (m.state IN ('failed', 'unresolved', 'cancelled')
                   AND COALESCE(m.finished_at, m.accepted_at) + {parked} <= {now}))
             AND NOT EXISTS (SELECT 1 FROM attempts a
                             WHERE a.message_id = m.id AND a.started_at + {window} > {now})"
        )
    }

    /// The parameters of `expired_sql`, in its order.
    pub(crate) fn sql_params(&self) -> [i64; 3] {
        [
            retention_ms(self.replay),
            retention_ms(self.parked),
            retention_ms(self.upstream_window),
        ]
    }
}

/// Heartbeat rows older than this are removed: no lease lasts nearly as long.
pub(crate) const FORGET_PROCESS_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// One row of `idemrelay report`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyCounts {
    pub scope: String,
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub accepted: u64,
    pub replayed: u64,
    pub delivered: u64,
    pub failed: u64,
    pub unresolved: u64,
    /// Records an operator cancelled.
    pub cancelled: u64,
    /// `unresolved` records that an upstream event resolved to `delivered` (also counted in
    /// `delivered`, on the day of the resolution).
    pub resolved_by_event: u64,
    /// Bounce events matched to a record of the scope.
    pub bounced: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Every state, zero included.
    pub by_state: Vec<(State, u64)>,
    pub oldest_queued_at_ms: Option<i64>,
    /// Records failed because their stored body was damaged (each needs an operator).
    pub damaged: u64,
    /// Upstream events kept without a record to match (yet).
    pub unmatched_events: u64,
    /// Queued records per scope, scopes with none left out (metrics keep the largest few).
    pub queued_by_scope: Vec<(String, u64)>,
}

/// The UTC calendar day of a Unix time in milliseconds, as `YYYY-MM-DD`.
pub fn utc_day(ms: i64) -> String {
    // Howard Hinnant's days-to-civil; avoids a date crate for one conversion.
    let z = ms.div_euclid(86_400_000) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Checks a `YYYY-MM-DD` day (the form `report --since` takes and `utc_day` gives).
pub fn parse_day(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let shaped = b.len() == 10 && b[4] == b'-' && b[7] == b'-' && digits(0..4);
    if !shaped || !digits(5..7) || !digits(8..10) {
        return None;
    }
    let month: u32 = text[5..7].parse().ok()?;
    let day: u32 = text[8..10].parse().ok()?;
    ((1..=12).contains(&month) && (1..=31).contains(&day)).then(|| text.to_string())
}

/// Opens the backend named by the URL scheme.
pub async fn open(url: &str, busy_timeout: Duration) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(
            sqlite::SqliteStore::open(url, busy_timeout).await?,
        ))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(Arc::new(
            postgres::PostgresStore::open(url, busy_timeout).await?,
        ))
    } else {
        Err(StoreError::Config(format!(
            "unsupported store URL scheme in {} (supported: sqlite://, postgres://)",
            crate::config::SecretUrl(url.to_string()).redacted()
        )))
    }
}

/// Opens a store that must exist already (the `queue` and `report` commands: a typo in a path
/// must not create an empty store and report it empty). Only `serve` creates a store.
pub async fn open_existing(
    url: &str,
    busy_timeout: Duration,
) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        let path = sqlite::database_path(url)?;
        if !path.exists() {
            return Err(StoreError::Config(format!(
                "no store at {} (from {url}); check --store / IDEMRELAY_STORE (`idemrelay serve` \
                 creates the store, the queue commands never do)",
                path.display()
            )));
        }
    }
    open(url, busy_timeout).await
}

/// Per-state counts (from `SELECT state, COUNT(*) ... GROUP BY state`) with every state
/// present, zero included.
pub(crate) fn queue_stats(
    counts: impl IntoIterator<Item = (String, i64)>,
    oldest_queued_at_ms: Option<i64>,
    damaged: i64,
    unmatched_events: i64,
    queued_by_scope: Vec<(String, i64)>,
) -> QueueStats {
    let mut by_state: Vec<(State, u64)> = State::ALL.into_iter().map(|s| (s, 0)).collect();
    for (state, n) in counts {
        if let Some(slot) = by_state.iter_mut().find(|(s, _)| s.as_str() == state) {
            slot.1 = n.max(0) as u64;
        }
    }
    QueueStats {
        by_state,
        oldest_queued_at_ms,
        damaged: damaged.max(0) as u64,
        unmatched_events: unmatched_events.max(0) as u64,
        queued_by_scope: queued_by_scope
            .into_iter()
            .map(|(scope, n)| (scope, n.max(0) as u64))
            .collect(),
    }
}

/// The checksum stored with every body and checked on every read before a byte of it goes
/// upstream.
pub(crate) fn body_checksum(body: &[u8]) -> [u8; 32] {
    *blake3::hash(body).as_bytes()
}

/// The reply a damaged record keeps as its outcome, and the ALERT an operator acts on.
pub(crate) fn report_damage(id: &str, reason: &str) -> String {
    tracing::error!(
        target: "idemrelay::store",
        id = %id,
        reason,
        "ALERT stored body damaged; record failed, not forwarded (see README: damaged records)"
    );
    format!("stored body damaged ({reason}); not forwarded")
}

/// Why a record cannot be requeued, if it cannot: only `failed`, `unresolved` and `cancelled` records,
/// only while their bytes are kept, and only with the operator's confirmation of the
/// duplicate risk whenever the ledger holds an UNKNOWN attempt (an `unresolved` record always
/// does; a `failed` one may, e.g. cancelled with a dead worker's intent open).
pub(crate) fn requeue_refusal(
    state: State,
    confirmed: bool,
    has_content: bool,
    any_unknown: bool,
) -> Option<Requeue> {
    let refusal = match state {
        State::Failed | State::Unresolved | State::Cancelled => {
            let risky = any_unknown || state == State::Unresolved;
            (risky && !confirmed).then_some(Requeue::NeedsConfirmation(state))
        }
        other => Some(Requeue::WrongState(other)),
    };
    refusal.or((!has_content).then_some(Requeue::ContentGone))
}

/// The first-attempt time a requeued job starts with. A confirmed duplicate risk starts a new
/// upstream window (the operator accepted a second copy); otherwise the window still counts
/// from the first attempt ever made, so that an UNKNOWN in the new round is not retried past
/// the upstream's window.
/// Why a requeue needs the operator's confirmation, for the CLI and the admin API.
pub fn confirmation_reason(id: &str, state: State) -> String {
    let what = if state == State::Unresolved {
        format!("{id} is unresolved")
    } else {
        format!(
            "{id} is {} with an attempt whose outcome is unknown",
            state.as_str()
        )
    };
    format!(
        "{what}: the upstream may already have accepted it (its reply after the final dot was \
         lost), so a retry may deliver a second copy; check with the upstream first"
    )
}

/// The reply a cancelled record keeps.
pub(crate) const CANCELLED_REPLY: &str = "cancelled by an operator";

/// What a retry's action row says beyond who and why.
pub(crate) fn retry_detail(state: State, confirmed: bool) -> String {
    let mut detail = format!("requeued from {}", state.as_str());
    if confirmed {
        detail.push_str("; duplicate risk confirmed");
    }
    detail
}

/// What a flush's action row says beyond who and why.
pub(crate) fn flush_detail(was_due_at_ms: i64, now_ms: i64) -> String {
    if was_due_at_ms > now_ms {
        format!(
            "was due in {}",
            humantime::format_duration(std::time::Duration::from_secs(
                ((was_due_at_ms - now_ms + 999) / 1000) as u64
            ))
        )
    } else {
        "was already due".to_string()
    }
}

pub(crate) fn requeued_first_attempt(
    state: State,
    any_unknown: bool,
    first_attempt_at_ms: Option<i64>,
) -> Option<i64> {
    let confirmed_risk = any_unknown || state == State::Unresolved;
    if confirmed_risk {
        None
    } else {
        first_attempt_at_ms
    }
}

/// The upstream's id for the message, kept with an accepted attempt (from its reply).
pub(crate) fn accepted_upstream_id(result: &AttemptResult) -> Option<String> {
    (result.outcome == "accepted")
        .then(|| crate::delivery::upstream_id::parse(&result.reply))
        .flatten()
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(crate) fn retention_ms(retention: Duration) -> i64 {
    i64::try_from(retention.as_millis()).unwrap_or(i64::MAX)
}

/// A queued record under `key`, for the store's unit tests.
#[cfg(test)]
pub(crate) fn test_record(id: &str, key: &str) -> NewRecord {
    NewRecord {
        id: id.into(),
        scope: "s".into(),
        key: Some(key.into()),
        key_source: "header",
        fingerprint: Fingerprint::from_bytes([7; 32]),
        envelope: Envelope {
            mail_from: "a@example.com".into(),
            rcpt_to: vec!["b@example.com".into()],
            body: crate::mail::BodyType::SevenBit,
            smtputf8: false,
        },
        content: Some(b"Subject: x\r\n\r\nbody\r\n".to_vec()),
        size: 20,
        state: State::Queued,
        reply: "250 ok".into(),
        dsn_of: None,
        part: 1,
        message_fp: Fingerprint::from_bytes([8; 32]),
        upstream_key: Some(key.into()),
        message_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_day, utc_day, Retention, State};
    use std::time::Duration;

    #[test]
    fn records_expire_by_state_and_never_inside_the_upstream_window() {
        const H: i64 = 3_600_000;
        let r = Retention {
            replay: Duration::from_secs(3 * 3600),
            upstream_window: Duration::from_secs(3 * 3600),
            parked: Duration::from_secs(30 * 24 * 3600),
        };
        // (state, accepted, finished, last attempt, now, expired)
        let table = [
            (State::Queued, 0, None, None, 1000 * H, false),
            (State::Delivered, 0, Some(H), Some(H), 3 * H, false),
            // Replayed for 3 h, and the last attempt's window is over too.
            (State::Delivered, 0, Some(H), Some(0), 3 * H, true),
            // A late delivery: the key stays taken until its attempt's window closed.
            (State::Delivered, 0, Some(2 * H), Some(2 * H), 4 * H, false),
            (State::Delivered, 0, Some(2 * H), Some(2 * H), 5 * H, true),
            (State::Rejected, 0, None, None, 3 * H, true),
            (State::Rejected, 0, None, None, 3 * H - 1, false),
            // Parked at 2h50m: not gone ten minutes later, gone 30 days after parking.
            (
                State::Unresolved,
                0,
                Some(170 * 60_000),
                Some(0),
                3 * H,
                false,
            ),
            (
                State::Unresolved,
                0,
                Some(3 * H),
                Some(0),
                3 * H + 720 * H,
                true,
            ),
            (State::Failed, 0, Some(48 * H), Some(48 * H), 50 * H, false),
            (
                State::Failed,
                0,
                Some(48 * H),
                Some(48 * H),
                48 * H + 720 * H,
                true,
            ),
            (State::Failed, 0, None, None, 720 * H, true),
        ];
        for (state, accepted, finished, last, now, expired) in table {
            assert_eq!(
                r.expired(state, accepted, finished, last, now),
                expired,
                "{state:?} accepted {accepted} finished {finished:?} last {last:?} now {now}"
            );
        }
    }

    #[test]
    fn utc_days() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(86_399_999), "1970-01-01");
        assert_eq!(utc_day(86_400_000), "1970-01-02");
        // 2024-02-29T23:59:59.999Z and the next millisecond.
        assert_eq!(utc_day(1_709_251_199_999), "2024-02-29");
        assert_eq!(utc_day(1_709_251_200_000), "2024-03-01");
        assert_eq!(utc_day(-1), "1969-12-31");
    }

    #[test]
    fn days_are_checked() {
        assert_eq!(parse_day("2026-11-29").as_deref(), Some("2026-11-29"));
        for bad in [
            "2026-13-01",
            "2026-1-01",
            "26-11-29",
            "2026-11-29T",
            "yyyy-mm-dd",
            "",
        ] {
            assert_eq!(parse_day(bad), None, "{bad}");
        }
    }
}
