//! Upstream events (DESIGN §7) as the store keeps them: the types both backends share and the
//! decisions they take the same way (which record an event names, whether it is stale, what
//! a resolution says), free of SQL.

/// One webhook request, verified and parsed, to be received exactly once.
#[derive(Debug, Clone)]
pub struct WebhookReceipt {
    /// The configured source (`[webhooks.NAME]`).
    pub source: String,
    /// The sender's `webhook-id`: unique per source, the same on every retry.
    pub webhook_id: String,
    pub events: Vec<UpstreamEvent>,
}

/// What an event says about its message, by the source's type lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The upstream accepted the message (injection, delivery, ...): proof that an attempt
    /// whose reply was lost did happen.
    Accepted,
    Bounced,
    Other,
}

impl EventKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventKind::Accepted => "accepted",
            EventKind::Bounced => "bounced",
            EventKind::Other => "other",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "accepted" => EventKind::Accepted,
            "bounced" => EventKind::Bounced,
            "other" => EventKind::Other,
            _ => return None,
        })
    }
}

/// One event of a request, with the fields the source's JSON Pointers found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamEvent {
    pub event_type: String,
    pub kind: EventKind,
    /// The event's own time (or the request's timestamp when it has none), Unix ms.
    pub event_time_ms: i64,
    /// The idempotency key as the upstream saw it (the record's upstream key).
    pub key: Option<String>,
    /// The upstream's own message id.
    pub upstream_id: Option<String>,
    /// The Message-ID header value, angle brackets removed (`message_id`).
    pub message_id: Option<String>,
    /// The recipient the event is about, lower-cased (`recipient`).
    pub recipient: Option<String>,
    /// The event as received, capped at `MAX_EVENT_JSON` bytes.
    pub json: String,
}

/// What a request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookApplied {
    /// The (source, webhook id) was received before: nothing changed.
    Duplicate,
    Applied(WebhookOutcome),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookOutcome {
    pub events: u32,
    pub matched: u32,
    /// Kept without a record (yet); matched when the record becomes known.
    pub unmatched: u32,
    /// Matched, but older than the newest event already applied to its record and
    /// recipient: stored, not applied.
    pub stale: u32,
    /// Bounce events matched to a record.
    pub bounced: u32,
    /// Records this request resolved from `unresolved` to `delivered`.
    pub resolved: Vec<Resolution>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub id: String,
    /// The event named as the evidence (`source/webhook-id#index type`).
    pub evidence: String,
}

/// One stored event of a record, for `queue show` and the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub source: String,
    pub webhook_id: String,
    /// Its place in the request's batch, from 0.
    pub index: u32,
    pub event_type: String,
    pub kind: EventKind,
    pub event_time_ms: i64,
    pub received_at_ms: i64,
    /// `None`: the event named no recipient (it is about the whole message).
    pub recipient: Option<String>,
    pub key: Option<String>,
    pub upstream_id: Option<String>,
    pub message_id: Option<String>,
    /// False when it was older than the newest event already applied to its record and
    /// recipient (stored, not applied).
    pub applied: bool,
    /// This event resolved the record.
    pub evidence: bool,
    pub json: String,
}

/// Events are stored as received up to this size; longer ones are cut (the fields that
/// matter are in columns of their own).
pub(crate) const MAX_EVENT_JSON: usize = 16 * 1024;

/// A record's upstream key, Message-ID and recipients, for late matching.
pub(crate) type RecordIdentifiers = (Option<String>, Option<String>, Vec<String>);

/// A record an event might name, as found by one of its identifiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub id: String,
    pub rcpt_to: Vec<String>,
    pub accepted_at_ms: i64,
}

/// Which identifier found the candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MatchBy {
    UpstreamId,
    Key,
    MessageId,
}

/// The identifiers of an event to try, most specific first: the upstream's own id names one
/// attempt of one record; the key names one record (part) per upstream; one Message-ID may
/// be shared by several transactions (parts, or separate sends to other recipients).
pub(crate) fn match_order(event: &UpstreamEvent) -> Vec<(MatchBy, &str)> {
    [
        (MatchBy::UpstreamId, event.upstream_id.as_deref()),
        (MatchBy::Key, event.key.as_deref()),
        (MatchBy::MessageId, event.message_id.as_deref()),
    ]
    .into_iter()
    .filter_map(|(by, v)| v.map(|v| (by, v)))
    .collect()
}

/// The record an event names among the candidates one identifier found: one holding the
/// event's recipient if any does, and among equals the newest.
pub(crate) fn choose_record<'c>(
    candidates: &'c [Candidate],
    recipient: Option<&str>,
) -> Option<&'c Candidate> {
    let holders: Vec<&Candidate> = match recipient {
        Some(r) => candidates.iter().filter(|c| holds(&c.rcpt_to, r)).collect(),
        None => Vec::new(),
    };
    let pool: Vec<&Candidate> = if holders.is_empty() {
        candidates.iter().collect()
    } else {
        holders
    };
    pool.into_iter()
        .max_by(|a, b| (a.accepted_at_ms, &a.id).cmp(&(b.accepted_at_ms, &b.id)))
}

/// Whether a record found later may take an event that matched nothing so far: not when the
/// event names a recipient the record does not hold (it waits for the record that does).
pub(crate) fn late_match_fits(rcpt_to: &[String], recipient: Option<&str>) -> bool {
    recipient.is_none_or(|r| holds(rcpt_to, r))
}

fn holds(rcpt_to: &[String], recipient: &str) -> bool {
    rcpt_to.iter().any(|r| r.eq_ignore_ascii_case(recipient))
}

/// An event is applied unless it is older than the newest one already applied to the same
/// record and recipient (equal times: the later arrival wins).
pub(crate) fn is_applied(event_time_ms: i64, newest_applied_ms: Option<i64>) -> bool {
    newest_applied_ms.is_none_or(|newest| event_time_ms >= newest)
}

/// A Message-ID as the store compares them: without angle brackets and spaces.
pub(crate) fn normalize_message_id(value: &str) -> Option<String> {
    let id = value
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// A recipient as the store compares them: lower-cased, without angle brackets.
pub(crate) fn normalize_recipient(value: &str) -> Option<String> {
    let r = value
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .trim();
    (!r.is_empty()).then(|| r.to_ascii_lowercase())
}

/// Counts an event matched to a record into the request's outcome, the same way on both
/// backends. True when it resolves that record: an accepted-type event for an `unresolved`
/// record proves the lost attempt happened, whether or not it is stale for its recipient.
pub(crate) fn tally(
    outcome: &mut WebhookOutcome,
    applied: bool,
    kind: EventKind,
    record_state: Option<&str>,
) -> bool {
    outcome.matched += 1;
    outcome.stale += u32::from(!applied);
    outcome.bounced += u32::from(kind == EventKind::Bounced);
    kind == EventKind::Accepted && record_state == Some("unresolved")
}

/// The event named as the evidence of a resolution.
pub(crate) fn evidence(source: &str, webhook_id: &str, index: u32, event_type: &str) -> String {
    format!("{source}/{webhook_id}#{index} {event_type}")
}

/// The `upstream_reply` of a record an event resolved.
pub(crate) fn resolution_reply(evidence: &str, event_time_ms: i64) -> String {
    format!(
        "delivered by upstream event {evidence} (event time {} UTC)",
        format_ms(event_time_ms)
    )
}

/// `YYYY-MM-DD HH:MM:SS.mmm`, UTC.
pub(crate) fn format_ms(ms: i64) -> String {
    let day = super::record::utc_day(ms);
    let in_day = ms.rem_euclid(86_400_000);
    format!(
        "{day} {:02}:{:02}:{:02}.{:03}",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

/// The log line of a resolution (at receipt, or when the record became known later).
pub(crate) fn log_resolution(id: &str, evidence: &str) {
    tracing::info!(target: "idemrelay::webhook", id = %id, "resolved delivered by event {evidence}");
}

/// The text to store for an event: as received, cut at `MAX_EVENT_JSON` on a character
/// boundary.
pub(crate) fn cap_json(json: &str) -> String {
    if json.len() <= MAX_EVENT_JSON {
        return json.to_string();
    }
    let mut end = MAX_EVENT_JSON;
    while !json.is_char_boundary(end) {
        end -= 1;
    }
    json[..end].to_string()
}

/// Names under which two transactions that could match an event to a record are serialized
/// (Postgres advisory locks): an event looking for a record by an identifier and a record
/// becoming known by it must not miss each other.
pub(crate) fn lock_names(
    key: Option<&str>,
    message_id: Option<&str>,
    upstream_id: Option<&str>,
) -> Vec<String> {
    [("k:", key), ("m:", message_id), ("u:", upstream_id)]
        .into_iter()
        .filter_map(|(prefix, v)| v.map(|v| format!("{prefix}{v}")))
        .collect()
}

/// A record as it becomes known by an identifier an event may already have named.
pub(crate) struct Known<'a> {
    pub id: &'a str,
    pub upstream_key: Option<&'a str>,
    pub message_id: Option<&'a str>,
    pub upstream_id: Option<&'a str>,
    pub rcpt_to: &'a [String],
    pub unresolved: bool,
}

impl<'a> Known<'a> {
    /// A record being inserted: known by its upstream key and Message-ID, not yet by the
    /// upstream's id, and not unresolved.
    pub(crate) fn inserted(record: &'a super::record::NewRecord) -> Known<'a> {
        Known {
            id: &record.id,
            upstream_key: record.upstream_key.as_deref(),
            message_id: record.message_id.as_deref(),
            upstream_id: None,
            rcpt_to: &record.envelope.rcpt_to,
            unresolved: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matched_event_is_counted_and_only_accepted_ones_resolve_unresolved_records() {
        use EventKind::*;
        // (applied, kind, record state) -> (stale, bounced, resolves)
        let table = [
            (true, Accepted, Some("unresolved"), (0, 0, true)),
            (false, Accepted, Some("unresolved"), (1, 0, true)),
            (true, Accepted, Some("queued"), (0, 0, false)),
            (true, Accepted, Some("failed"), (0, 0, false)),
            (true, Bounced, Some("unresolved"), (0, 1, false)),
            (false, Other, Some("delivered"), (1, 0, false)),
        ];
        for (applied, kind, state, (stale, bounced, resolves)) in table {
            let mut outcome = WebhookOutcome::default();
            let resolved = tally(&mut outcome, applied, kind, state);
            assert_eq!(
                (outcome.matched, outcome.stale, outcome.bounced, resolved),
                (1, stale, bounced, resolves),
                "{applied} {kind:?} {state:?}"
            );
        }
    }

    fn c(id: &str, rcpt: &[&str], at: i64) -> Candidate {
        Candidate {
            id: id.into(),
            rcpt_to: rcpt.iter().map(|r| r.to_string()).collect(),
            accepted_at_ms: at,
        }
    }

    #[test]
    fn the_record_holding_the_recipient_wins_then_the_newest() {
        let parts = [
            c("p1", &["a@x"], 10),
            c("p2", &["B@x"], 5),
            c("p3", &["c@x"], 20),
        ];
        assert_eq!(choose_record(&parts, Some("b@x")).unwrap().id, "p2");
        assert_eq!(choose_record(&parts, Some("z@x")).unwrap().id, "p3");
        assert_eq!(choose_record(&parts, None).unwrap().id, "p3");
        assert_eq!(choose_record(&[], Some("a@x")), None);
        assert!(late_match_fits(&parts[1].rcpt_to, Some("b@x")));
        assert!(!late_match_fits(&parts[0].rcpt_to, Some("b@x")));
        assert!(late_match_fits(&parts[0].rcpt_to, None));
    }

    #[test]
    fn older_events_are_not_applied_equal_times_are() {
        assert!(is_applied(5, None));
        assert!(is_applied(5, Some(5)));
        assert!(is_applied(6, Some(5)));
        assert!(!is_applied(4, Some(5)));
    }

    #[test]
    fn identifiers_are_normalized() {
        assert_eq!(normalize_message_id(" <a@b> ").as_deref(), Some("a@b"));
        assert_eq!(normalize_message_id("<>"), None);
        assert_eq!(
            normalize_recipient("<User@Example.NET>").as_deref(),
            Some("user@example.net")
        );
        assert_eq!(format_ms(1_764_655_200_123), "2025-12-02 06:00:00.123");
        let long = "é".repeat(MAX_EVENT_JSON);
        let capped = cap_json(&long);
        assert!(capped.len() <= MAX_EVENT_JSON && capped.chars().all(|ch| ch == 'é'));
    }
}
