//! The queue commands' arguments, as clap reads them.

use clap::Subcommand;
use serde_json::Value;

use crate::admin::wire::ListQuery;

#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Resume delivery after a pause (the relay notices within a second).
    Resume {
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Pause delivery for the whole relay; accepted messages keep queueing.
    Pause {
        /// Why (shown by `queue status`, recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Show whether delivery is paused, and why, with the latest relay-wide operator actions.
    Status {
        /// The API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List records (oldest first unless --newest), with filters; says when more follow.
    List(ListArgs),
    /// Show one record (by id, or by idempotency key) with its replies, every attempt, its
    /// upstream events, its DSN links, why it waits, and its operator history.
    Show {
        /// An id (or its first 12 or more characters, as `queue list` shows them); failing
        /// that, a key in `--scope` (default: the configured `scope`).
        #[arg(required_unless_present = "key")]
        id_or_key: Option<String>,
        /// Name the record by its idempotency key (in `--scope`).
        #[arg(long, conflicts_with = "id_or_key")]
        key: Option<String>,
        /// The API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Requeue a `failed`, `unresolved` or `cancelled` record for delivery now.
    Retry {
        #[command(flatten)]
        record: RecordArg,
        /// Required for an `unresolved` record: the upstream may already have it, so a retry
        /// can deliver a second copy.
        #[arg(long)]
        confirm_duplicate_risk: bool,
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel a queued record that is not being delivered right now (state `cancelled`; no
    /// DSN is sent), or with --all every queued record the filters match (one recorded
    /// action with the count).
    Cancel {
        /// The record's id (or its first 12 or more characters, as `queue list` shows them).
        #[arg(required_unless_present_any = ["key", "all"])]
        id: Option<String>,
        /// Name the record by its idempotency key instead (in `--scope`, default: the
        /// configured scope).
        #[arg(long, conflicts_with = "id")]
        key: Option<String>,
        /// Every queued record that the filters (--state, --in-scope, --recipient, --sender,
        /// --older-than, ...) match; without filters, every queued record. Records being
        /// delivered right now are skipped (and counted).
        #[arg(long, conflicts_with_all = ["id", "key"])]
        all: bool,
        #[command(flatten)]
        filter: BulkFilter,
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Close an `unresolved` record as delivered or failed, without sending it again and
    /// without a DSN, once the upstream's own records (its logs, message search or support)
    /// have told what became of the lost attempt.
    Resolve {
        #[command(flatten)]
        record: RecordArg,
        /// How the record ends: `delivered` (the upstream has it) or `failed` (it never got
        /// there and will not be sent).
        #[arg(long = "as", value_name = "OUTCOME", value_parser = ["delivered", "failed"])]
        resolution: String,
        /// What the upstream's records showed (required: recorded with who did it).
        #[arg(long)]
        reason: String,
    },
    /// Make a queued record (or, with --all, every waiting one) due now; records a worker
    /// holds are left alone, and a pause still holds them all.
    Flush {
        /// The record's id (or its first 12 or more characters, as `queue list` shows them).
        #[arg(required_unless_present_any = ["key", "all"])]
        id: Option<String>,
        /// Name the record by its idempotency key (in `--scope`).
        #[arg(long, conflicts_with = "id")]
        key: Option<String>,
        /// Every queued record that is not due yet.
        #[arg(long, conflicts_with_all = ["id", "key"])]
        all: bool,
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Delete records past the configured retention.
    Purge {
        /// Delete terminal records older than `retention` (the only purge there is).
        #[arg(long, required = true)]
        expired: bool,
        /// Why (recorded with who did it).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// The filters of `queue cancel --all`: those of `queue list`, each requiring --all.
#[derive(Debug, clap::Args)]
pub(crate) struct BulkFilter {
    /// With --all: `queued` (the default) or `deferred` (queued after a failed attempt).
    #[arg(long = "state", requires = "all", value_name = "STATE")]
    pub(super) bulk_state: Option<String>,
    /// With --all: only records of this scope.
    #[arg(long = "in-scope", requires = "all", value_name = "SCOPE")]
    pub(super) bulk_scope: Option<String>,
    /// With --all: only records with this envelope sender (ASCII case ignored).
    #[arg(long = "sender", requires = "all", value_name = "ADDRESS")]
    pub(super) bulk_sender: Option<String>,
    /// With --all: only records with this envelope recipient (ASCII case ignored).
    #[arg(long = "recipient", requires = "all", value_name = "ADDRESS")]
    pub(super) bulk_recipient: Option<String>,
    /// With --all: only records with this Message-ID header.
    #[arg(long = "message-id", requires = "all", value_name = "ID")]
    pub(super) bulk_message_id: Option<String>,
    /// With --all: only records accepted at least this long ago (`1h`, `2d`), or before an
    /// RFC 3339 time.
    #[arg(long = "older-than", requires = "all", value_name = "AGE|TIME")]
    pub(super) older_than: Option<String>,
    /// With --all: only records accepted within this long (`30m`), or since an RFC 3339 time.
    #[arg(long = "newer-than", requires = "all", value_name = "AGE|TIME")]
    pub(super) newer_than: Option<String>,
}

impl BulkFilter {
    pub(super) fn query(&self) -> ListQuery {
        ListQuery {
            state: self.bulk_state.clone(),
            scope: self.bulk_scope.clone(),
            sender: self.bulk_sender.clone(),
            recipient: self.bulk_recipient.clone(),
            message_id: self.bulk_message_id.clone(),
            since: self.newer_than.clone(),
            until: self.older_than.clone(),
            ..ListQuery::default()
        }
    }

    /// The API's `filter` object.
    pub(super) fn json(&self) -> Value {
        let q = self.query();
        let mut filter = serde_json::Map::new();
        for (name, value) in [
            ("state", q.state),
            ("scope", q.scope),
            ("sender", q.sender),
            ("recipient", q.recipient),
            ("message_id", q.message_id),
            ("since", q.since),
            ("until", q.until),
        ] {
            if let Some(value) = value {
                filter.insert(name.to_string(), value.into());
            }
        }
        Value::Object(filter)
    }
}

/// The filters of `queue list` (those of `GET /api/v1/messages`).
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Only records in this state (queued, delivered, failed, unresolved, rejected,
    /// cancelled), or `deferred`: queued after at least one failed attempt.
    #[arg(long)]
    pub(super) state: Option<String>,
    /// Only records of this scope (`--scope` is the relay's own setting).
    #[arg(long)]
    pub(super) in_scope: Option<String>,
    /// Only records under this idempotency key (in any scope unless --in-scope).
    #[arg(long)]
    pub(super) key: Option<String>,
    /// Only records with this envelope sender (MAIL FROM; ASCII case ignored).
    #[arg(long)]
    pub(super) sender: Option<String>,
    /// Only records with this envelope recipient (RCPT TO; ASCII case ignored).
    #[arg(long)]
    pub(super) recipient: Option<String>,
    /// Only records with this Message-ID header.
    #[arg(long)]
    pub(super) message_id: Option<String>,
    /// Accepted at or after: an RFC 3339 time, or a duration ago (`2h`).
    #[arg(long)]
    pub(super) since: Option<String>,
    /// Accepted before: an RFC 3339 time, or a duration ago.
    #[arg(long)]
    pub(super) until: Option<String>,
    /// Newest first.
    #[arg(long)]
    pub(super) newest: bool,
    /// At most this many records (1 to 1000); `more: --cursor ...` says when more follow.
    #[arg(long, default_value_t = 100)]
    pub(super) limit: usize,
    /// Continue a listing: the cursor its last page printed (same filters).
    #[arg(long)]
    pub(super) cursor: Option<String>,
    /// The API's JSON (`{"messages": [...], "next_cursor": ...}`) instead of a table.
    #[arg(long)]
    pub(super) json: bool,
    /// Every column, full ids, keys and recipients and absolute times (UTC), however wide;
    /// by default rows fit 80 columns, with ages (`3m`, `2h`, `5d`) and shortened values.
    #[arg(long)]
    pub(super) wide: bool,
}

impl ListArgs {
    pub(super) fn query(&self) -> ListQuery {
        ListQuery {
            state: self.state.clone(),
            scope: self.in_scope.clone(),
            key: self.key.clone(),
            sender: self.sender.clone(),
            recipient: self.recipient.clone(),
            message_id: self.message_id.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
            order: self.newest.then(|| "newest".to_string()),
            limit: Some(self.limit),
            cursor: self.cursor.clone(),
        }
    }
}

/// A record named by id, or by key in `--scope`.
#[derive(Debug, clap::Args)]
pub(crate) struct RecordArg {
    /// The record's id (or its first 12 or more characters, as `queue list` shows them).
    #[arg(required_unless_present = "key")]
    pub(super) id: Option<String>,
    /// Name the record by its idempotency key instead (in `--scope`, default: the configured
    /// scope).
    #[arg(long, conflicts_with = "id")]
    pub(super) key: Option<String>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum RecordAction {
    Retry,
    Cancel,
    Flush,
}

impl RecordAction {
    /// The API's path segment.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            RecordAction::Retry => "retry",
            RecordAction::Cancel => "cancel",
            RecordAction::Flush => "flush",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum RelayAction {
    Pause,
    Resume,
    FlushAll,
    Purge,
}

impl RelayAction {
    /// The API's path segment.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            RelayAction::Pause => "pause",
            RelayAction::Resume => "resume",
            RelayAction::FlushAll => "flush",
            RelayAction::Purge => "purge",
        }
    }
}
