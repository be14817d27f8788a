//! The nouns every part of the store shares (the record, its state, the store's errors) and
//! the small helpers both backends use. A leaf: it names no other store module, so both
//! backends and the shared SQL builders can use it without a cycle through the crate root (`lib.rs`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::attempt::{OutcomeKind, Phase};
use idemrelay_model::mail::Envelope;
use idemrelay_model::mail::Fingerprint;

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
    pub(crate) const TERMINAL: [State; 5] = [
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

    pub(crate) fn parse(s: &str) -> Option<Self> {
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

    #[cfg(test)]
    pub(crate) fn is_terminal(self) -> bool {
        State::TERMINAL.contains(&self)
    }

    /// `states` as the list of an SQL `IN (...)`, so that SQL naming a set of states is built
    /// from the constants above rather than typed again.
    pub(crate) fn sql_list(states: impl IntoIterator<Item = State>) -> String {
        states
            .into_iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where a record's key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// The client's `X-Bird-Idempotency-Key` header.
    Header,
    /// Derived from the message's Message-ID.
    MessageId,
    /// Derived from the message's content.
    Content,
    /// A notice (DSN) the relay queued itself, keyed after the record it is about.
    Dsn,
}

impl KeySource {
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::Header => "header",
            KeySource::MessageId => "message-id",
            KeySource::Content => "content",
            KeySource::Dsn => "dsn",
        }
    }

    /// As stored: a record without a key says `none`.
    pub(crate) fn stored(source: Option<KeySource>) -> &'static str {
        source.map_or("none", KeySource::as_str)
    }
}

/// A record to insert. `key` is `None` for `missing_key = "pass"` submissions.
#[derive(Debug, Clone)]
pub struct NewRecord {
    pub id: String,
    pub scope: String,
    pub key: Option<String>,
    /// Where the key came from; `None` for a record without one.
    pub key_source: Option<KeySource>,
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
    /// Which part of a split message this is (docs/concepts/contract.md "Split transactions"); 1 for most.
    pub part: u32,
    /// The fingerprint without the recipient set, shared by the parts of one message.
    pub message_fp: Fingerprint,
    /// The key the upstream sees, as written into `content` (docs/concepts/contract.md "What the relay answers at the end of DATA").
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
    /// The DSN parameters and REQUIRETLS the client asked for (empty for most mail).
    pub requests: idemrelay_model::mail::DeliveryRequests,
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
    /// The newest attempt's reply line (a deferred record's last refusal, or what went wrong
    /// talking to the upstream).
    pub last_reply: Option<String>,
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
    /// The DSN parameters and REQUIRETLS stored with the record.
    pub requests: idemrelay_model::mail::DeliveryRequests,
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
    pub outcome: OutcomeKind,
    pub phase: Option<Phase>,
    pub code: Option<u16>,
    pub reply: String,
}

/// What becomes of the message after an attempt.
#[derive(Debug, Clone)]
pub enum Settle {
    /// Taken upstream; the sender's "relayed" notice (if some recipient asked to hear of
    /// success and the upstream will not tell) is queued in the same commit.
    Delivered {
        upstream_reply: String,
        dsn: Option<Box<NewRecord>>,
    },
    /// Due again after `after`; the sender's delay notice (the message has waited long, and
    /// some recipient asked to hear of delays) is queued in the same commit, once per record.
    Retry {
        after: Duration,
        dsn: Option<Box<NewRecord>>,
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

/// What the store knows of delivery relay-wide, for the console's overview: the attempt
/// ledger's newest failure and the run it belongs to, and the relay processes' heartbeats.
/// Read from the store rather than from one process's memory, so every instance on a shared
/// store shows the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayHealth {
    /// The newest attempt that ended transient or unknown, with its record's id.
    pub newest_failure: Option<(String, AttemptRow)>,
    /// When the run of failures that ends with `newest_failure` began: the first failed
    /// attempt after the newest delivery. None once a delivery came after the newest failure.
    pub failing_since_ms: Option<i64>,
    /// When the newest accepted attempt ended.
    pub last_delivery_ms: Option<i64>,
    /// Queued records with at least one failed attempt (the `deferred` listing).
    pub deferred: u64,
    /// Every relay process that has written a heartbeat into this store lately.
    pub processes: Vec<ProcessRow>,
    /// The store's clock at the read (to age the times above by).
    pub read_at_ms: i64,
}

/// One relay process's liveness row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRow {
    /// `host/pid/nonce`; its workers' lease owners are `<id>-<n>`.
    pub id: String,
    pub started_at_ms: i64,
    pub heartbeat_at_ms: i64,
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
    /// A spooled message body could not be written, synced or read, for a passing reason.
    #[error("store spool: {0}")]
    Spool(String),
    /// A spooled message body is not there in full (its segment is gone or too short).
    #[error("store spool: {0}")]
    SpoolDamage(String),
    /// A stored body that cannot be forwarded: unreadable, or not matching its checksum.
    #[error("stored body of {id} is damaged: {reason}")]
    Damaged { id: String, reason: String },
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
        "ALERT stored body damaged; record failed, not forwarded (see docs/operations/data.md: damaged records)"
    );
    format!("stored body damaged ({reason}); not forwarded")
}

/// The upstream's id for the message, kept with an accepted attempt (from its reply).
pub(crate) fn accepted_upstream_id(result: &AttemptResult) -> Option<String> {
    (result.outcome == OutcomeKind::Accepted)
        .then(|| super::upstream_id::parse(&result.reply))
        .flatten()
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(crate) fn retention_ms(retention: Duration) -> i64 {
    i64::try_from(retention.as_millis()).unwrap_or(i64::MAX)
}

/// Who acts on the queue and why (an operator action's record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// The API token's name, or the local OS user for direct store access.
    pub actor: String,
    pub reason: String,
}

/// Operator actions on the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pause,
    Resume,
    Cancel,
    Retry,
    Flush,
    Purge,
    /// An `unresolved` record closed as delivered or failed, without a resend.
    Resolve,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Cancel => "cancel",
            Action::Retry => "retry",
            Action::Flush => "flush",
            Action::Purge => "purge",
            Action::Resolve => "resolve",
        }
    }
}

/// One operator action as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRow {
    pub at_ms: i64,
    /// `None` for an action on the whole relay (pause, resume, purge).
    pub record_id: Option<String>,
    pub action: String,
    pub actor: String,
    pub reason: String,
    pub detail: Option<String>,
}

/// What `flush` did to one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Due now; it had been due at this time.
    Flushed {
        was_due_at_ms: i64,
    },
    NotFound,
    /// Only queued records wait.
    NotQueued(State),
    /// A worker holds it right now (an attempt may be under way): left alone.
    Leased,
}

/// How an operator closes an `unresolved` record once the upstream's own logs (or its support)
/// have told what happened to the lost attempt. Nothing is sent again either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The upstream has the message: the record is `delivered`.
    Delivered,
    /// The upstream never took it and it will not be sent: the record is `failed` (no DSN;
    /// whoever resolves it tells the sender, as with a cancel).
    Failed,
}

impl Resolution {
    pub const ALL: [Resolution; 2] = [Resolution::Delivered, Resolution::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Delivered => "delivered",
            Resolution::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == text)
    }

    /// The record's state once resolved this way.
    pub fn state(self) -> State {
        match self {
            Resolution::Delivered => State::Delivered,
            Resolution::Failed => State::Failed,
        }
    }
}

/// What `resolve` did to one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// Closed; the record is in the resolution's state.
    Resolved,
    NotFound,
    /// Only `unresolved` records are resolved this way.
    WrongState(State),
}

/// A queued record under `key`, for the store's unit tests and the relay's (its `test-support`
/// feature, which only the relay's dev-dependencies turn on).
#[cfg(any(test, feature = "test-support"))]
pub fn test_record(id: &str, key: &str) -> NewRecord {
    NewRecord {
        id: id.into(),
        scope: "s".into(),
        key: Some(key.into()),
        key_source: Some(KeySource::Header),
        fingerprint: Fingerprint::from_bytes([7; 32]),
        envelope: Envelope {
            mail_from: "a@example.com".into(),
            rcpt_to: vec!["b@example.com".into()],
            body: idemrelay_model::mail::BodyType::SevenBit,
            smtputf8: false,
            requests: Default::default(),
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
    use super::{parse_day, utc_day, State};

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

    #[test]
    fn terminal_means_every_state_but_queued() {
        for state in State::ALL {
            assert_eq!(state.is_terminal(), state != State::Queued, "{state:?}");
            assert_eq!(State::parse(state.as_str()), Some(state));
        }
        assert_eq!(
            State::sql_list(State::TERMINAL),
            "'delivered', 'failed', 'unresolved', 'rejected', 'cancelled'"
        );
    }
}
