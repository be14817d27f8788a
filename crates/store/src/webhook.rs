//! Upstream events (docs/concepts/webhooks.md) as the store keeps them: the types both backends share and the
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
    pub fn as_str(self) -> &'static str {
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
pub const MAX_EVENT_JSON: usize = 16 * 1024;

/// How far an event's time may lie before the first attempt of the record it names: the
/// upstream's clock and ours differ a little (the same allowance as a webhook timestamp's).
pub(crate) const EVENT_CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;

/// What an event names its message by, whether it arrives now or was kept unmatched. The
/// Message-ID is not among them: one Message-ID is legitimately shared by several records
/// (parts, separate sends), so it is kept as a hint for people, never used to match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventNames<'a> {
    /// The key the upstream saw.
    pub key: Option<&'a str>,
    /// The upstream's own message id.
    pub upstream_id: Option<&'a str>,
    pub event_time_ms: i64,
}

impl UpstreamEvent {
    pub(crate) fn names(&self) -> EventNames<'_> {
        EventNames {
            key: self.key.as_deref(),
            upstream_id: self.upstream_id.as_deref(),
            event_time_ms: self.event_time_ms,
        }
    }
}

/// A record an event might belong to: one whose upstream key is the event's key, or one
/// with an attempt whose reply carried the event's upstream id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub id: String,
    pub upstream_key: Option<String>,
    /// When its first attempt began; `None`: never attempted (the upstream never saw it).
    pub first_attempt_ms: Option<i64>,
    /// One of its attempts' replies carried the event's upstream id.
    pub has_event_upstream_id: bool,
    /// One of its attempts' replies carried some upstream id.
    pub has_upstream_ids: bool,
}

/// Whether an event belongs to a record: what it names identifies the record (its key is the
/// record's upstream key, or its upstream id is one recorded for the record's attempts),
/// nothing it names contradicts the record (another key; an upstream id recorded for another
/// record, or not among the record's own when it has some), and it happened no earlier than
/// the record's first attempt (less `EVENT_CLOCK_SKEW_MS`). `id_known` says whether the
/// event's upstream id is recorded for any record at all. The recipient an event names is
/// not part of it: the upstream may spell an address otherwise, and the key or id already
/// names the record.
pub(crate) fn belongs(event: &EventNames<'_>, record: &Candidate, id_known: bool) -> bool {
    let by_key = event.key.is_some() && event.key == record.upstream_key.as_deref();
    let by_upstream_id = event.upstream_id.is_some() && record.has_event_upstream_id;
    if !(by_key || by_upstream_id) {
        return false;
    }
    if event.key.is_some() && !by_key {
        return false;
    }
    // A record whose reply to the dot was lost has no upstream id: the key alone names it,
    // unless the id the event carries is another record's.
    if event.upstream_id.is_some() && !by_upstream_id && (record.has_upstream_ids || id_known) {
        return false;
    }
    let Some(first_attempt) = record.first_attempt_ms else {
        return false;
    };
    event.event_time_ms >= first_attempt.saturating_sub(EVENT_CLOCK_SKEW_MS)
}

/// The record an event belongs to: the one candidate it belongs to. `candidates` holds every
/// record the event's key or upstream id finds. When the event belongs to several (a key used
/// again after its record expired, say), it names none of them alone and is kept unmatched
/// rather than attached to a guess.
pub(crate) fn choose_record<'c>(
    event: &EventNames<'_>,
    candidates: &'c [Candidate],
) -> Option<&'c Candidate> {
    let id_known = candidates.iter().any(|c| c.has_event_upstream_id);
    let mut fitting = candidates.iter().filter(|c| belongs(event, c, id_known));
    let first = fitting.next()?;
    fitting.next().is_none().then_some(first)
}

/// An event is applied unless it is older than the newest one already applied to the same
/// record and recipient (equal times: the later arrival wins).
pub(crate) fn is_applied(event_time_ms: i64, newest_applied_ms: Option<i64>) -> bool {
    newest_applied_ms.is_none_or(|newest| event_time_ms >= newest)
}

/// A Message-ID as the store compares them: without angle brackets and spaces.
pub fn normalize_message_id(value: &str) -> Option<String> {
    let id = value
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// A recipient as the store compares them: lower-cased, without angle brackets.
pub fn normalize_recipient(value: &str) -> Option<String> {
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
pub fn log_resolution(id: &str, evidence: &str) {
    tracing::info!(target: "idemrelay::webhook", id = %id, "resolved delivered by event {evidence}");
}

/// The text to store for an event: as received, cut at `MAX_EVENT_JSON` on a character
/// boundary.
pub fn cap_json(json: &str) -> String {
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
pub(crate) fn lock_names(key: Option<&str>, upstream_id: Option<&str>) -> Vec<String> {
    [("k:", key), ("u:", upstream_id)]
        .into_iter()
        .filter_map(|(prefix, v)| v.map(|v| format!("{prefix}{v}")))
        .collect()
}

/// A record as it becomes known by an identifier an event may already have named: events
/// kept unmatched under these identifiers are matched again, by the same rule (`belongs`).
pub(crate) struct Known<'a> {
    pub id: &'a str,
    pub upstream_key: Option<&'a str>,
    pub upstream_id: Option<&'a str>,
    pub unresolved: bool,
}

impl<'a> Known<'a> {
    /// A record being inserted: known by its upstream key, not yet by the upstream's id, and
    /// not unresolved. No event can belong to it before its first attempt, so nothing kept
    /// attaches here; the call keeps insert and settle alike.
    pub(crate) fn inserted(record: &'a super::record::NewRecord) -> Known<'a> {
        Known {
            id: &record.id,
            upstream_key: record.upstream_key.as_deref(),
            upstream_id: None,
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

    const T0: i64 = 1_800_000_000_000;

    fn record(id: &str, key: &str, first_attempt: Option<i64>) -> Candidate {
        Candidate {
            id: id.into(),
            upstream_key: Some(key.into()),
            first_attempt_ms: first_attempt,
            has_event_upstream_id: false,
            has_upstream_ids: false,
        }
    }

    fn names<'a>(key: Option<&'a str>, id: Option<&'a str>, at: i64) -> EventNames<'a> {
        EventNames {
            key,
            upstream_id: id,
            event_time_ms: at,
        }
    }

    #[test]
    fn an_event_belongs_to_a_record_only_by_its_key_or_upstream_id_and_not_before_it() {
        let r = record("r1", "order-2", Some(T0));
        // (event, belongs, why)
        let with_id = |mut c: Candidate, this: bool| {
            c.has_upstream_ids = true;
            c.has_event_upstream_id = this;
            c
        };
        let table: [(EventNames<'_>, Candidate, bool, &str); 11] = [
            (
                names(Some("order-2"), None, T0 + 1),
                r.clone(),
                true,
                "its key, after",
            ),
            (
                names(Some("order-1"), None, T0 + 1),
                r.clone(),
                false,
                "another key",
            ),
            (
                names(None, None, T0 + 1),
                r.clone(),
                false,
                "names nothing (a Message-ID alone)",
            ),
            (
                names(Some("order-2"), None, T0 - 86_400_000),
                r.clone(),
                false,
                "a day before the first attempt",
            ),
            (
                names(Some("order-2"), None, T0 - EVENT_CLOCK_SKEW_MS),
                r.clone(),
                true,
                "within the skew",
            ),
            (
                names(Some("order-2"), None, T0 + 1),
                record("r1", "order-2", None),
                false,
                "never attempted",
            ),
            (
                names(None, Some("U1"), T0 + 1),
                with_id(r.clone(), true),
                true,
                "its upstream id",
            ),
            (
                names(None, Some("U2"), T0 + 1),
                with_id(r.clone(), false),
                false,
                "another upstream id",
            ),
            (
                names(Some("order-2"), Some("U2"), T0 + 1),
                with_id(r.clone(), false),
                false,
                "its key, another upstream id",
            ),
            (
                names(Some("order-1"), Some("U1"), T0 + 1),
                with_id(r.clone(), true),
                false,
                "its upstream id, another key",
            ),
            (
                names(Some("order-2"), Some("U9"), T0 + 1),
                r.clone(),
                true,
                "its key; its reply (and id) was lost",
            ),
        ];
        for (event, candidate, expected, why) in table {
            assert_eq!(belongs(&event, &candidate, false), expected, "{why}");
        }
        // Its key, and an upstream id recorded for another record: not its event.
        let carries_anothers_id = names(Some("order-2"), Some("U1"), T0 + 1);
        assert!(!belongs(&carries_anothers_id, &r, true));
    }

    #[test]
    fn an_event_that_fits_several_records_is_attached_to_none() {
        let old = record("old", "k", Some(T0));
        let new = record("new", "k", Some(T0 + 86_400_000));
        let both = [old.clone(), new.clone()];
        // Between the two first attempts only the old record can be meant.
        let between = names(Some("k"), None, T0 + 1000);
        assert_eq!(
            choose_record(&between, &both).map(|c| c.id.as_str()),
            Some("old")
        );
        let after = names(Some("k"), None, T0 + 2 * 86_400_000);
        assert_eq!(choose_record(&after, &both), None);
        assert_eq!(choose_record(&after, &[]), None);
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
