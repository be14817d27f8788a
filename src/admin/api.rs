//! `/api/v1`: read the ledger by id or key, list by state (paged), requeue and cancel. The
//! same store operations as `idemrelay queue`, with the same JSON shapes.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::view::{show_json, summary_json};
use super::{error, AdminState};
use crate::store::{Requeue, State as RecordState, StoreError};

const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

fn store_error(err: StoreError) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        err.to_string(),
    )
}

fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no record with id {id:?}"),
    )
}

/// The record with its replies, every attempt and its upstream events, or 404.
async fn record(state: &AdminState, id: &str) -> Response {
    let message = match state.store.message(id).await {
        Ok(Some(message)) => message,
        Ok(None) => return not_found(id),
        Err(err) => return store_error(err),
    };
    let attempts = match state.store.attempts(id).await {
        Ok(attempts) => attempts,
        Err(err) => return store_error(err),
    };
    match state.store.events(id).await {
        Ok(events) => Json(show_json(&message, &attempts, &events)).into_response(),
        Err(err) => store_error(err),
    }
}

pub async fn show(State(state): State<Arc<AdminState>>, Path(id): Path<String>) -> Response {
    record(&state, &id).await
}

pub async fn show_key(
    State(state): State<Arc<AdminState>>,
    Path((scope, key)): Path<(String, String)>,
) -> Response {
    match state.store.lookup_id_by_key(&scope, &key).await {
        Ok(Some(id)) => record(&state, &id).await,
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no record under key {key:?} in scope {scope:?}"),
        ),
        Err(err) => store_error(err),
    }
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    state: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

/// `{"messages": [...], "next_after": ID|null}`: pass `next_after` as `after` for the next
/// page; null means this was the last one.
pub async fn list(State(state): State<Arc<AdminState>>, Query(q): Query<ListQuery>) -> Response {
    let filter = match q.state.as_deref().map(|s| (s, RecordState::parse(s))) {
        None => None,
        Some((_, Some(parsed))) => Some(parsed),
        Some((name, None)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_state",
                format!("unknown state {name:?} (queued, delivered, failed, unresolved, rejected)"),
            )
        }
    };
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_limit",
            format!("limit must be 1 to {MAX_PAGE}"),
        );
    }
    // One row more than asked tells whether another page follows.
    let mut rows = match state
        .store
        .list(filter, limit + 1, q.after.as_deref())
        .await
    {
        Ok(rows) => rows,
        Err(err) => return store_error(err),
    };
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next_after = more.then(|| rows.last().map(|r| r.id.clone())).flatten();
    Json(serde_json::json!({
        "messages": rows.iter().map(summary_json).collect::<Vec<_>>(),
        "next_after": next_after,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
pub struct RetryQuery {
    confirm: Option<String>,
}

pub async fn retry(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    Query(q): Query<RetryQuery>,
) -> Response {
    let confirmed = match q.confirm.as_deref() {
        None => false,
        Some("duplicate-risk") => true,
        Some(other) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_confirmation",
                format!("confirm={other:?}: the only confirmation is confirm=duplicate-risk"),
            )
        }
    };
    match state.store.requeue(&id, confirmed).await {
        Ok(Requeue::Requeued) => {
            // The job is due now: wake the workers rather than wait for their next scan.
            state.delivery_hint.notify_waiters();
            tracing::info!(target: "idemrelay::admin", id = %id, duplicate_risk_confirmed = confirmed, "requeued by an operator");
            Json(serde_json::json!({ "id": id, "state": "queued", "requeued": true }))
                .into_response()
        }
        Ok(Requeue::NotFound) => not_found(&id),
        Ok(Requeue::WrongState(s)) => error(
            StatusCode::CONFLICT,
            "wrong_state",
            format!(
                "{id} is {}: only failed or unresolved records can be retried",
                s.as_str()
            ),
        ),
        Ok(Requeue::NeedsConfirmation(state)) => error(
            StatusCode::CONFLICT,
            "confirmation_required",
            format!(
                "{}, then POST again with ?confirm=duplicate-risk",
                crate::store::confirmation_reason(&id, state)
            ),
        ),
        Ok(Requeue::ContentGone) => error(
            StatusCode::GONE,
            "content_gone",
            format!("{id} can not be retried: its content is no longer stored"),
        ),
        Err(err) => store_error(err),
    }
}

pub async fn cancel(State(state): State<Arc<AdminState>>, Path(id): Path<String>) -> Response {
    match state.store.cancel(&id).await {
        Ok(true) => {
            tracing::info!(target: "idemrelay::admin", id = %id, "cancelled by an operator");
            Json(serde_json::json!({ "id": id, "state": "failed", "cancelled": true }))
                .into_response()
        }
        Ok(false) => match state.store.message(&id).await {
            Ok(None) => not_found(&id),
            Ok(Some(m)) if m.state == RecordState::Queued => error(
                StatusCode::CONFLICT,
                "leased",
                format!(
                    "{id} is being delivered right now; try again when the attempt has finished"
                ),
            ),
            Ok(Some(m)) => error(
                StatusCode::CONFLICT,
                "wrong_state",
                format!(
                    "{id} is {}: only queued records can be cancelled",
                    m.state.as_str()
                ),
            ),
            Err(err) => store_error(err),
        },
        Err(err) => store_error(err),
    }
}
