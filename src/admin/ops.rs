//! The queue's operations, one function each, shared by the admin API and by `idemrelay queue
//! --direct` (the store without the relay): the same checks, the same answers (JSON), the same
//! record of who did what and why (docs/operations/: every operator action is logged with who and
//! why). Errors carry the HTTP status the API answers with; the CLI prints their message.

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::view::{action_json, show_json, summary_json};
use super::waiting::{why_waiting, RecordFacts, RelayFacts};
use super::wire::ListQuery;
use crate::delivery::breaker::BreakerState;
use crate::store::{
    Action, Flush, ListFilter, Operator, Requeue, Resolution, Resolve, Retention, State, Store,
    StoreError,
};

/// A refusal or failure, with the status the API answers it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl OpError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        OpError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn not_found(id: &str) -> Self {
        OpError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no record with id {id:?}"),
        )
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpError {}

impl From<StoreError> for OpError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::InvalidFilter(message) => {
                OpError::new(StatusCode::BAD_REQUEST, "bad_filter", message)
            }
            err => OpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                err.to_string(),
            ),
        }
    }
}

pub(crate) type OpResult = Result<Value, OpError>;

/// The one log line of an operator action: `grep id=ID` finds it with the record's others.
fn log_action(action: Action, id: Option<&str>, by: &Operator, detail: Option<&str>) {
    // Every field as Display, as on the relay's other lines; the log's formatter (`log_format`)
    // quotes and escapes a reason with spaces or line breaks.
    tracing::info!(
        target: "idemrelay::operator",
        id = %id.unwrap_or("-"),
        action = %action.as_str(),
        actor = %by.actor,
        reason = %by.reason,
        detail = %detail.unwrap_or(""),
        "operator action"
    );
}

/// What the relay knows beyond the store: `breaker` is `None` without the running relay.
pub(crate) async fn relay_facts(
    store: &dyn Store,
    breaker: Option<BreakerState>,
) -> Result<RelayFacts, OpError> {
    Ok(RelayFacts {
        pause: store.paused().await?,
        breaker,
    })
}

/// `{"messages": [...], "next_cursor": CURSOR|null}`.
pub(crate) async fn list(store: &dyn Store, filter: &ListFilter, relay: &RelayFacts) -> OpResult {
    let page = store.list_page(filter).await?;
    let messages: Vec<Value> = page
        .records
        .iter()
        .map(|s| {
            let waiting = why_waiting(
                &RecordFacts {
                    state: s.state,
                    next_attempt_at_ms: s.next_attempt_at_ms,
                    leased: s.leased,
                    last_outcome: s.last_outcome.as_deref(),
                    now_ms: s.read_at_ms,
                },
                relay,
            );
            summary_json(s, waiting.as_ref())
        })
        .collect();
    Ok(json!({
        "messages": messages,
        "next_cursor": page.next_cursor.map(|c| c.encode()),
    }))
}

/// The record with its replies, attempts, events, DSN links, operator history and, while
/// queued, why it waits.
pub(crate) async fn show(store: &dyn Store, id: &str, relay: &RelayFacts) -> OpResult {
    let Some(message) = store.message(id).await? else {
        return Err(OpError::not_found(id));
    };
    let attempts = store.attempts(id).await?;
    let events = store.events(id).await?;
    let waiting = why_waiting(
        &RecordFacts {
            state: message.state,
            next_attempt_at_ms: message.next_attempt_at_ms,
            leased: message.leased,
            last_outcome: attempts.last().and_then(|a| a.outcome.as_deref()),
            now_ms: crate::store::now_ms(),
        },
        relay,
    );
    Ok(show_json(&message, &attempts, &events, waiting.as_ref()))
}

/// The id of the record under (scope, key), expired or not (part 1 of a split message).
pub(crate) async fn id_of_key(
    store: &dyn Store,
    scope: &str,
    key: &str,
) -> Result<String, OpError> {
    store.lookup_id_by_key(scope, key).await?.ok_or_else(|| {
        OpError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no record under key {key:?} in scope {scope:?}"),
        )
    })
}

pub(crate) async fn retry(store: &dyn Store, id: &str, confirmed: bool, by: &Operator) -> OpResult {
    match store.requeue(id, confirmed, by).await? {
        Requeue::Requeued => {
            let detail = if confirmed {
                "duplicate risk confirmed"
            } else {
                ""
            };
            log_action(Action::Retry, Some(id), by, Some(detail));
            Ok(json!({ "id": id, "state": "queued", "requeued": true }))
        }
        Requeue::NotFound => Err(OpError::not_found(id)),
        Requeue::WrongState(s) => Err(OpError::new(
            StatusCode::CONFLICT,
            "wrong_state",
            format!(
                "{id} is {}: only failed, unresolved or cancelled records can be retried",
                s.as_str()
            ),
        )),
        Requeue::NeedsConfirmation(state) => Err(OpError::new(
            StatusCode::CONFLICT,
            "confirmation_required",
            crate::store::confirmation_reason(id, state),
        )),
        Requeue::ContentGone => Err(OpError::new(
            StatusCode::GONE,
            "content_gone",
            format!("{id} can not be retried: its content is no longer stored"),
        )),
    }
}

pub(crate) async fn cancel(store: &dyn Store, id: &str, by: &Operator) -> OpResult {
    if store.cancel(id, by).await? {
        log_action(Action::Cancel, Some(id), by, None);
        return Ok(json!({ "id": id, "state": "cancelled", "cancelled": true }));
    }
    Err(match store.message(id).await? {
        None => OpError::not_found(id),
        Some(m) if m.state == State::Queued => OpError::new(
            StatusCode::CONFLICT,
            "leased",
            format!(
                "{id} is being delivered right now (leased by a worker); try again when the \
                 attempt has finished"
            ),
        ),
        Some(m) => OpError::new(
            StatusCode::CONFLICT,
            "wrong_state",
            format!(
                "{id} is {}: only queued records can be cancelled",
                m.state.as_str()
            ),
        ),
    })
}

/// Closes an `unresolved` record as delivered or failed after the operator has checked the
/// upstream's own records: nothing is sent again, and no DSN goes out.
pub(crate) async fn resolve(
    store: &dyn Store,
    id: &str,
    resolution: Resolution,
    by: &Operator,
) -> OpResult {
    match store.resolve(id, resolution, by).await? {
        Resolve::Resolved => {
            log_action(Action::Resolve, Some(id), by, Some(resolution.as_str()));
            Ok(json!({ "id": id, "state": resolution.state().as_str(), "resolved": true }))
        }
        Resolve::NotFound => Err(OpError::not_found(id)),
        Resolve::WrongState(state) => Err(OpError::new(
            StatusCode::CONFLICT,
            "wrong_state",
            format!(
                "{id} is {}: only unresolved records are resolved (a queued one is cancelled, \
                 a finished one keeps its outcome)",
                state.as_str()
            ),
        )),
    }
}

pub(crate) async fn flush(store: &dyn Store, id: &str, by: &Operator) -> OpResult {
    match store.flush(id, by).await? {
        Flush::Flushed { was_due_at_ms } => {
            log_action(Action::Flush, Some(id), by, None);
            Ok(json!({
                "id": id,
                "flushed": true,
                "was_due_at": super::view::time_ms(was_due_at_ms),
                "paused": store.paused().await?.is_some(),
            }))
        }
        Flush::NotFound => Err(OpError::not_found(id)),
        Flush::NotQueued(state) => Err(OpError::new(
            StatusCode::CONFLICT,
            "wrong_state",
            format!(
                "{id} is {}: only queued records wait to be flushed",
                state.as_str()
            ),
        )),
        Flush::Leased => Err(OpError::new(
            StatusCode::CONFLICT,
            "leased",
            format!("{id} is being delivered right now (leased by a worker); nothing to flush"),
        )),
    }
}

/// Every waiting record due now: ONE action (relay-wide, with the count), logged once.
pub(crate) async fn flush_all(store: &dyn Store, by: &Operator) -> OpResult {
    let ids = store.flush_all(by).await?;
    let detail = crate::store::flush_all_detail(ids.len());
    log_action(Action::Flush, None, by, Some(&detail));
    Ok(json!({
        "flushed": ids.len(),
        "ids": ids,
        "paused": store.paused().await?.is_some(),
    }))
}

pub(crate) async fn pause(store: &dyn Store, by: &Operator) -> OpResult {
    store.pause(&by.reason, false).await?;
    store.record_action(Action::Pause, by, None).await?;
    log_action(Action::Pause, None, by, None);
    status(store).await
}

pub(crate) async fn resume(store: &dyn Store, by: &Operator) -> OpResult {
    store.resume().await?;
    store.record_action(Action::Resume, by, None).await?;
    log_action(Action::Resume, None, by, None);
    status(store).await
}

/// How many of the newest relay-wide actions `status` shows.
const RECENT_ACTIONS: usize = 10;

/// `{"paused": bool, "reason", "since", "by_relay": bool, "recent_actions": [...]}`.
pub(crate) async fn status(store: &dyn Store) -> OpResult {
    let pause = store.paused().await?;
    let recent = store.relay_actions(RECENT_ACTIONS).await?;
    Ok(json!({
        "paused": pause.is_some(),
        "reason": pause.as_ref().map(|p| p.reason.clone()),
        "since": pause.as_ref().map(|p| super::view::time_ms(p.since_ms)),
        // Paused by the relay after an account-level failure (a normal probe resumes it).
        "by_relay": pause.as_ref().is_some_and(|p| p.probe),
        "recent_actions": recent.iter().map(action_json).collect::<Vec<_>>(),
    }))
}

pub(crate) async fn purge(store: &dyn Store, retention: Retention, by: &Operator) -> OpResult {
    let purged = store.purge_expired(retention).await?;
    let detail = format!("purged {purged} expired record(s)");
    store
        .record_action(Action::Purge, by, Some(&detail))
        .await?;
    log_action(Action::Purge, None, by, Some(&detail));
    Ok(json!({
        "purged": purged,
        "retention": humantime::format_duration(retention.replay).to_string(),
        "parked_retention": humantime::format_duration(retention.parked).to_string(),
        "upstream_window": humantime::format_duration(retention.upstream_window).to_string(),
    }))
}

/// How many ids one listing page of a bulk cancel reads at a time.
const BULK_PAGE: usize = 1000;

/// Cancels every queued record `selection` matches (the filters of `list`; `state` may only be
/// `queued`, the default, or `deferred`), skipping those a worker holds right now. ONE
/// operator action with the count and the filters, not one per record: `queue status` shows it.
/// `{"cancelled": N, "ids": [...], "matched": M, "skipped_leased": M - N}`.
pub(crate) async fn cancel_matching(
    store: &dyn Store,
    mut selection: ListQuery,
    by: &Operator,
) -> OpResult {
    let bad = |message: String| OpError::new(StatusCode::BAD_REQUEST, "bad_filter", message);
    if selection.order.is_some() || selection.limit.is_some() || selection.cursor.is_some() {
        return Err(bad(
            "a bulk cancel takes the filters of a listing, not its order, limit or cursor".into(),
        ));
    }
    match selection.state.as_deref() {
        None => selection.state = Some("queued".into()),
        Some("queued" | "deferred") => {}
        Some(other) => {
            return Err(bad(format!(
                "state {other:?}: only queued records (state queued or deferred) can be cancelled"
            )))
        }
    }
    let what = describe_selection(&selection);
    selection.limit = Some(BULK_PAGE);
    let mut filter = selection
        .into_filter(crate::store::now_ms())
        .map_err(|(code, message)| OpError::new(StatusCode::BAD_REQUEST, code, message))?;
    let mut ids = Vec::new();
    loop {
        let page = store.list_page(&filter).await?;
        ids.extend(page.records.into_iter().map(|r| r.id));
        match page.next_cursor {
            Some(cursor) => filter.cursor = Some(cursor),
            None => break,
        }
    }
    let cancelled = store.cancel_all(&ids, by, &what).await?;
    let detail = format!("cancelled {} record(s) {what}", cancelled.len());
    log_action(Action::Cancel, None, by, Some(&detail));
    Ok(json!({
        "cancelled": cancelled.len(),
        "matched": ids.len(),
        "skipped_leased": ids.len() - cancelled.len(),
        "ids": cancelled,
    }))
}

/// The filters of a bulk action as its record says them: `matching state=queued recipient=...`.
fn describe_selection(q: &ListQuery) -> String {
    let parts: Vec<String> = [
        ("state", &q.state),
        ("scope", &q.scope),
        ("key", &q.key),
        ("sender", &q.sender),
        ("recipient", &q.recipient),
        ("message_id", &q.message_id),
        ("since", &q.since),
        ("until", &q.until),
    ]
    .iter()
    .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={v}")))
    .collect();
    format!("matching {}", parts.join(" "))
}
