//! Decoding of stored rows into the trait's types, shared by both backends so that the two
//! cannot drift apart. Each backend only says how to read one column.

use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::record::{
    body_checksum, ActionRow, AttemptRow, Claimed, DailyCounts, Existing, MessageSummary,
    ProcessRow, RelayHealth, State, StoreError, StoredMessage,
};
use super::webhook::{EventKind, EventRow};
use idemrelay_model::mail::{DeliveryRequests, Fingerprint};

/// Column access by name with the types the schema uses in both dialects (integers are
/// 64-bit everywhere; flags are booleans). SQLite rows come from sqlx (reads) or rusqlite (the
/// group-commit writer).
pub(crate) trait Columns {
    fn text(&self, col: &str) -> Result<String, StoreError>;
    fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError>;
    fn int(&self, col: &str) -> Result<i64, StoreError>;
    fn opt_int(&self, col: &str) -> Result<Option<i64>, StoreError>;
    fn flag(&self, col: &str) -> Result<bool, StoreError>;
    fn bytes(&self, col: &str) -> Result<Vec<u8>, StoreError>;
    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, StoreError>;
}

macro_rules! columns_for {
    ($row:ty, $get:ident) => {
        impl Columns for $row {
            fn text(&self, col: &str) -> Result<String, StoreError> {
                Ok(self.$get(col)?)
            }
            fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError> {
                Ok(self.$get(col)?)
            }
            fn int(&self, col: &str) -> Result<i64, StoreError> {
                Ok(self.$get(col)?)
            }
            fn opt_int(&self, col: &str) -> Result<Option<i64>, StoreError> {
                Ok(self.$get(col)?)
            }
            fn flag(&self, col: &str) -> Result<bool, StoreError> {
                Ok(self.$get(col)?)
            }
            fn bytes(&self, col: &str) -> Result<Vec<u8>, StoreError> {
                Ok(self.$get(col)?)
            }
            fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>, StoreError> {
                Ok(self.$get(col)?)
            }
        }
    };
}

columns_for!(SqliteRow, try_get);
columns_for!(PgRow, try_get);
columns_for!(rusqlite::Row<'_>, get);

fn state(row: &impl Columns, id: &str) -> Result<State, StoreError> {
    State::parse(&row.text("state")?).ok_or(StoreError::Corrupt {
        id: id.to_string(),
        what: "state",
    })
}

fn recipients(row: &impl Columns) -> Result<Vec<String>, StoreError> {
    Ok(row
        .text("rcpt_to")?
        .split('\n')
        .map(str::to_string)
        .collect())
}

fn code(row: &impl Columns) -> Result<Option<u16>, StoreError> {
    Ok(row.opt_int("code")?.and_then(|c| u16::try_from(c).ok()))
}

/// Columns: id, fingerprint, reply, state, part, message_fp, rcpt_to.
pub(crate) fn existing(row: &impl Columns) -> Result<Existing, StoreError> {
    let id = row.text("id")?;
    let corrupt = |what| StoreError::Corrupt {
        id: id.clone(),
        what,
    };
    let message_fp = match row.opt_bytes("message_fp")? {
        Some(fp) => Some(Fingerprint::from_slice(&fp).ok_or_else(|| corrupt("message_fp"))?),
        None => None,
    };
    Ok(Existing {
        fingerprint: Fingerprint::from_slice(&row.bytes("fingerprint")?)
            .ok_or_else(|| corrupt("fingerprint"))?,
        state: state(row, &id)?,
        reply: row.text("reply")?,
        part: u32::try_from(row.int("part")?).map_err(|_| corrupt("part"))?,
        message_fp,
        rcpt_to: recipients(row)?,
        id,
    })
}

/// The columns `existing` reads.
pub(crate) const EXISTING_COLUMNS: &str =
    "id, fingerprint, reply, state, part, message_fp, rcpt_to";

/// The body, read (from the spool, when it is there) and checked against its checksum.
/// Columns: content, content_hash (and what `WithSpool` needs).
pub(crate) fn content(row: &impl Columns, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let damaged = |reason: String| StoreError::Damaged {
        id: id.to_string(),
        reason,
    };
    let body = match row.opt_bytes("content") {
        Ok(body) => body,
        Err(StoreError::SpoolDamage(reason)) => return Err(damaged(reason)),
        Err(err) => return Err(err),
    };
    let Some(body) = body else {
        return Ok(None);
    };
    let Some(stored) = row.opt_bytes("content_hash")? else {
        // A row from before checksums were kept.
        return Ok(Some(body));
    };
    if stored.as_slice() != body_checksum(&body) {
        return Err(damaged(format!(
            "checksum mismatch over {} bytes",
            body.len()
        )));
    }
    Ok(Some(body))
}

/// Columns: every column of `messages`, plus has_job.
pub(crate) fn stored_message(row: &impl Columns) -> Result<StoredMessage, StoreError> {
    let existing = existing(row)?;
    let (content, damage) = match content(row, &existing.id) {
        Ok(content) => (content, row.opt_text("damage")?),
        Err(StoreError::Damaged { reason, .. }) => (None, Some(reason)),
        Err(err) => return Err(err),
    };
    // Shown, not acted on: unreadable requests show as none rather than hide the record.
    let shown_requests = requests(row, &existing.id).unwrap_or_default();
    Ok(StoredMessage {
        id: existing.id,
        scope: row.text("scope")?,
        key: row.opt_text("idem_key")?,
        upstream_key: row.opt_text("upstream_key")?,
        part: existing.part,
        key_source: row.text("key_source")?,
        fingerprint: existing.fingerprint,
        mail_from: row.text("mail_from")?,
        rcpt_to: recipients(row)?,
        requests: shown_requests,
        content,
        damage,
        state: existing.state,
        reply: existing.reply,
        accepted_at_ms: row.int("accepted_at")?,
        has_job: row.flag("has_job")?,
        finished_at_ms: row.opt_int("finished_at")?,
        upstream_reply: row.opt_text("upstream_reply")?,
        message_id: row.opt_text("header_message_id")?,
        resolved_by: row.opt_text("resolved_by")?,
        dsn_of: row.opt_text("dsn_of")?,
        // Filled in by the backend from their own queries.
        dsns: Vec::new(),
        history: Vec::new(),
        next_attempt_at_ms: row.opt_int("due_at")?,
        leased: row.flag("leased")?,
    })
}

/// Columns: idem_key, mail_from, rcpt_to, body_type, smtputf8, requests, content, content_hash,
/// accepted_at, first_attempt_at, lease_token, attempts, any_unknown.
pub(crate) fn claimed(
    row: &impl Columns,
    id: String,
    scope: String,
    recovered: bool,
    now_ms: i64,
) -> Result<Claimed, StoreError> {
    Ok(Claimed {
        content: content(row, &id)?.ok_or(StoreError::Corrupt {
            id: id.clone(),
            what: "queued message without content",
        })?,
        key: row.opt_text("idem_key")?,
        mail_from: row.text("mail_from")?,
        rcpt_to: recipients(row)?,
        eight_bit: row.text("body_type")? == "8BITMIME",
        smtputf8: row.flag("smtputf8")?,
        requests: requests(row, &id)?,
        accepted_at_ms: row.int("accepted_at")?,
        attempts: u32::try_from(row.int("attempts")?).unwrap_or(u32::MAX),
        first_attempt_at_ms: row.opt_int("first_attempt_at")?,
        any_unknown: row.flag("any_unknown")?,
        recovered,
        now_ms,
        token: row.int("lease_token")?,
        id,
        scope,
    })
}

/// The `requests` column: NULL for ordinary mail, JSON the relay wrote otherwise. A value it
/// cannot read marks the record damaged (set aside, like a body that fails its checksum)
/// rather than delivering it without what its client asked for.
fn requests(row: &impl Columns, id: &str) -> Result<DeliveryRequests, StoreError> {
    DeliveryRequests::from_stored(row.opt_text("requests")?.as_deref()).map_err(|e| {
        StoreError::Damaged {
            id: id.to_string(),
            reason: format!("unreadable delivery requests: {e}"),
        }
    })
}

/// Columns: attempt, owner, started_at, finished_at, outcome, phase, code, reply, upstream_id.
pub(crate) fn attempt(row: &impl Columns) -> Result<AttemptRow, StoreError> {
    Ok(AttemptRow {
        attempt: u32::try_from(row.int("attempt")?).unwrap_or(u32::MAX),
        owner: row.text("owner")?,
        started_at_ms: row.int("started_at")?,
        finished_at_ms: row.opt_int("finished_at")?,
        outcome: row.opt_text("outcome")?,
        phase: row.opt_text("phase")?,
        code: code(row)?,
        reply: row.opt_text("reply")?,
        upstream_id: row.opt_text("upstream_id")?,
    })
}

/// From `listing::health_sql`'s summary row, its newest failure (with `message_id`) and the
/// processes. `failing_since_ms` is the newest failure's own start when no delivery followed
/// it (the backend then asks for the run's first failure); None otherwise.
pub(crate) fn relay_health<R: Columns>(
    summary: &R,
    newest: Option<&R>,
    processes: &[R],
) -> Result<RelayHealth, StoreError> {
    let last_delivery_ms = summary.opt_int("last_delivery_at")?;
    let newest_failure = match newest {
        Some(row) => Some((row.text("message_id")?, attempt(row)?)),
        None => None,
    };
    let failing_since_ms = newest_failure.as_ref().and_then(|(_, a)| {
        let at = a.finished_at_ms.unwrap_or(a.started_at_ms);
        last_delivery_ms
            .is_none_or(|delivered| at > delivered)
            .then_some(a.started_at_ms)
    });
    Ok(RelayHealth {
        newest_failure,
        failing_since_ms,
        last_delivery_ms,
        deferred: u64::try_from(summary.int("deferred")?).unwrap_or(0),
        processes: processes.iter().map(process).collect::<Result<_, _>>()?,
        read_at_ms: summary.int("now_ms")?,
    })
}

/// Columns: `listing::PROCESSES`'s.
pub(crate) fn process(row: &impl Columns) -> Result<ProcessRow, StoreError> {
    Ok(ProcessRow {
        id: row.text("id")?,
        started_at_ms: row.int("started_at")?,
        heartbeat_at_ms: row.int("heartbeat_at")?,
    })
}

/// Columns: those of `listing::list_sql`.
pub(crate) fn summary(row: &impl Columns) -> Result<MessageSummary, StoreError> {
    let id = row.text("id")?;
    let count = |col: &str| -> Result<u32, StoreError> {
        Ok(u32::try_from(row.int(col)?).unwrap_or(u32::MAX))
    };
    let read_at_ms = row.int("now_ms")?;
    Ok(MessageSummary {
        state: state(row, &id)?,
        scope: row.text("scope")?,
        key: row.opt_text("idem_key")?,
        accepted_at_ms: row.int("accepted_at")?,
        attempts: count("attempts")?,
        failed_attempts: count("failed_attempts")?,
        last_outcome: row.opt_text("outcome")?,
        last_phase: row.opt_text("phase")?,
        last_code: code(row)?,
        upstream_reply: row.opt_text("upstream_reply")?,
        last_reply: row.opt_text("last_reply")?,
        mail_from: row.text("mail_from")?,
        rcpt_to: recipients(row)?,
        message_id: row.opt_text("header_message_id")?,
        dsn_of: row.opt_text("dsn_of")?,
        next_attempt_at_ms: row.opt_int("due_at")?,
        leased: row
            .opt_int("lease_until")?
            .is_some_and(|until| until > read_at_ms),
        read_at_ms,
        id,
    })
}

/// Columns: those of `shared_sql::ACTIONS_OF_RECORD`.
pub(crate) fn action(row: &impl Columns) -> Result<ActionRow, StoreError> {
    Ok(ActionRow {
        at_ms: row.int("at")?,
        record_id: row.opt_text("record_id")?,
        action: row.text("action")?,
        actor: row.text("actor")?,
        reason: row.text("reason")?,
        detail: row.opt_text("detail")?,
    })
}

/// Columns: scope, day, accepted, replayed, delivered, failed, unresolved.
pub(crate) fn daily_counts(row: &impl Columns) -> Result<DailyCounts, StoreError> {
    let count = |name: &str| -> Result<u64, StoreError> { Ok(row.int(name)?.max(0) as u64) };
    Ok(DailyCounts {
        scope: row.text("scope")?,
        day: row.text("day")?,
        accepted: count("accepted")?,
        replayed: count("replayed")?,
        delivered: count("delivered")?,
        failed: count("failed")?,
        unresolved: count("unresolved")?,
        cancelled: count("cancelled")?,
        resolved_by_event: count("resolved_by_event")?,
        bounced: count("bounced")?,
    })
}

/// Read statements both dialects run as written: `$N` parameters, which sqlx binds by number
/// on SQLite too. (Statements that read the clock or need a cast stay per dialect.)
pub(crate) mod shared_sql {
    /// The notices (DSNs) the relay queued about a record, by id.
    pub(crate) const DSNS_OF_RECORD: &str = "SELECT id FROM messages WHERE dsn_of = $1 ORDER BY id";
    /// A record's operator actions, oldest first; decoded by `rows::action`.
    pub(crate) const ACTIONS_OF_RECORD: &str = "SELECT at, record_id, action, actor, reason, detail
         FROM operator_actions WHERE record_id = $1 ORDER BY seq";
    /// The newest relay-wide operator actions (`$1`: how many); decoded by `rows::action`.
    pub(crate) const RELAY_ACTIONS: &str = "SELECT at, record_id, action, actor, reason, detail
         FROM operator_actions WHERE record_id IS NULL ORDER BY seq DESC LIMIT $1";
    /// A record's attempts, in order; decoded by `rows::attempt`.
    pub(crate) const ATTEMPTS_OF_RECORD: &str =
        "SELECT attempt, owner, started_at, finished_at, outcome, phase, code, reply, upstream_id
         FROM attempts WHERE message_id = $1 ORDER BY attempt";
    /// The first record under (scope, key), expired or not.
    pub(crate) const ID_BY_KEY: &str =
        "SELECT id FROM messages WHERE scope = $1 AND idem_key = $2 ORDER BY part LIMIT 1";
}

/// A record's events, by recipient and event time (one parameter: the record's id; the
/// same text in both dialects).
pub(crate) const EVENTS_OF_RECORD: &str =
    "SELECT source, webhook_id, idx, event_type, kind, event_time, received_at, recipient,
            idem_key, upstream_id, header_message_id, applied, evidence, body
     FROM upstream_events WHERE record_id = $1 ORDER BY recipient, event_time, seq";

/// Columns: those of `EVENTS_OF_RECORD`.
pub(crate) fn event(row: &impl Columns) -> Result<EventRow, StoreError> {
    let kind = row.text("kind")?;
    let recipient = row.text("recipient")?;
    Ok(EventRow {
        source: row.text("source")?,
        webhook_id: row.text("webhook_id")?,
        index: u32::try_from(row.int("idx")?).unwrap_or(u32::MAX),
        event_type: row.text("event_type")?,
        kind: EventKind::parse(&kind).ok_or(StoreError::Corrupt {
            id: row.text("webhook_id")?,
            what: "event kind",
        })?,
        event_time_ms: row.int("event_time")?,
        received_at_ms: row.int("received_at")?,
        recipient: (!recipient.is_empty()).then_some(recipient),
        key: row.opt_text("idem_key")?,
        upstream_id: row.opt_text("upstream_id")?,
        message_id: row.opt_text("header_message_id")?,
        applied: row.flag("applied")?,
        evidence: row.flag("evidence")?,
        json: row.text("body")?,
    })
}
