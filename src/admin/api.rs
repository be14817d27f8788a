//! `/api/v1`: find records (filters, pages), read one by id or key with its history, and the
//! operator actions (cancel, retry, flush, pause, resume, purge), each recorded with who and
//! why. The operations themselves live in `ops`, shared with `idemrelay queue --direct`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::ops::{self, OpError, OpResult};
use super::state::{error, AdminState};
use super::waiting::RelayFacts;
use super::wire::{ListQuery, OPERATOR_HEADER};
use crate::delivery::breaker::BreakerState;
use crate::store::Operator;

fn respond(result: OpResult) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(err) => error(err.status, err.code, err.message),
    }
}

fn bad_request(code: &'static str, message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, code, message)
}

/// Pause and breaker, as the running relay knows them.
async fn relay_facts(state: &AdminState) -> Result<RelayFacts, OpError> {
    ops::relay_facts(
        state.store.as_ref(),
        BreakerState::parse(state.metrics.breaker_now()),
    )
    .await
}

pub(crate) async fn show(State(state): State<Arc<AdminState>>, Path(id): Path<String>) -> Response {
    respond(show_id(&state, &id).await)
}

async fn show_id(state: &AdminState, id: &str) -> OpResult {
    let relay = relay_facts(state).await?;
    ops::show(state.store.as_ref(), id, &relay).await
}

pub(crate) async fn show_key(
    State(state): State<Arc<AdminState>>,
    Path((scope, key)): Path<(String, String)>,
) -> Response {
    let result = async {
        let id = ops::resolve_key(state.store.as_ref(), &scope, &key).await?;
        show_id(&state, &id).await
    };
    respond(result.await)
}

/// `{"messages": [...], "next_cursor": CURSOR|null}`: pass `next_cursor` as `cursor` (with
/// the same filters) for the next page; null means this was the last one.
pub(crate) async fn list(
    State(state): State<Arc<AdminState>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => return bad_request("bad_query", rejection.body_text()),
    };
    let filter = match query.into_filter(crate::store::now_ms()) {
        Ok(filter) => filter,
        Err((code, message)) => return bad_request(code, message),
    };
    let result = async {
        let relay = relay_facts(&state).await?;
        ops::list(state.store.as_ref(), &filter, &relay).await
    };
    respond(result.await)
}

/// The parameters of an action, in the query string or a JSON body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ActionParams {
    reason: Option<String>,
    /// `duplicate-risk`, for a retry that may send a second copy.
    confirm: Option<String>,
}

/// The reason and confirmation from the query string and the body (either may carry them).
fn action_params(
    query: Result<Query<ActionParams>, axum::extract::rejection::QueryRejection>,
    body: &Bytes,
) -> Result<ActionParams, OpError> {
    let Query(mut params) =
        query.map_err(|r| OpError::new(StatusCode::BAD_REQUEST, "bad_query", r.body_text()))?;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let from_body: ActionParams = serde_json::from_slice(body).map_err(|e| {
            OpError::new(
                StatusCode::BAD_REQUEST,
                "bad_body",
                format!("the body must be JSON like {{\"reason\": \"...\"}}: {e}"),
            )
        })?;
        params.reason = params.reason.or(from_body.reason);
        params.confirm = params.confirm.or(from_body.confirm);
    }
    Ok(params)
}

/// An operator action's request, as every action handler takes it: who acts and why (the
/// token, the person the client names, the reason) and the confirmation, from the query string
/// or a JSON body. A bad query or body is refused with 400 before the handler runs. It reads the
/// body, so it is the handler's last argument.
pub(crate) struct Action {
    by: Operator,
    confirm: Option<String>,
}

impl FromRequest<Arc<AdminState>> for Action {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<AdminState>) -> Result<Self, Response> {
        let query = Query::<ActionParams>::try_from_uri(req.uri());
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let params = action_params(query, &body).map_err(|err| respond(Err(err)))?;
        Ok(Action {
            by: operator(state, &headers, params.reason),
            confirm: params.confirm,
        })
    }
}

/// The admin token's name as an actor (there is one token), or that none is configured.
pub(super) fn token_actor(state: &AdminState) -> String {
    if state.token.is_some() {
        "admin_token".to_string()
    } else {
        "admin API (no token configured)".to_string()
    }
}

/// Who acts: the token's name (there is one admin token), with the person the client names.
fn operator(state: &AdminState, headers: &HeaderMap, reason: Option<String>) -> Operator {
    let mut actor = token_actor(state);
    let claimed = headers
        .get(OPERATOR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_graphic()));
    if let Some(person) = claimed {
        actor.push_str(&format!(" ({person})"));
    }
    Operator {
        actor,
        reason: reason_or_default(reason),
    }
}

/// What an action records when no reason was given.
pub(crate) fn reason_or_default(reason: Option<String>) -> String {
    reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "no reason given".to_string())
}

/// After an action that makes jobs due now: wake the workers rather than wait for their next scan.
pub(super) fn wake_workers_if_ok(state: &AdminState, result: OpResult) -> OpResult {
    if result.is_ok() {
        state.delivery_hint.notify_waiters();
    }
    result
}

pub(crate) async fn retry(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let confirmed = match action.confirm.as_deref() {
        None => false,
        Some("duplicate-risk") => true,
        Some(other) => {
            return bad_request(
                "bad_confirmation",
                format!("confirm={other:?}: the only confirmation is confirm=duplicate-risk"),
            )
        }
    };
    let result = ops::retry(state.store.as_ref(), &id, confirmed, &action.by).await;
    respond(wake_workers_if_ok(&state, result).map_err(|mut e| {
        if e.code == "confirmation_required" {
            e.message
                .push_str(", then POST again with ?confirm=duplicate-risk");
        }
        e
    }))
}

pub(crate) async fn cancel(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    if action.confirm.is_some() {
        return bad_request("bad_query", "cancel takes no confirmation");
    }
    respond(ops::cancel(state.store.as_ref(), &id, &action.by).await)
}

pub(crate) async fn flush(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let result = ops::flush(state.store.as_ref(), &id, &action.by).await;
    respond(wake_workers_if_ok(&state, result))
}

pub(crate) async fn flush_all(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::flush_all(state.store.as_ref(), &action.by).await;
    respond(wake_workers_if_ok(&state, result))
}

pub(crate) async fn pause(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    respond(ops::pause(state.store.as_ref(), &action.by).await)
}

pub(crate) async fn resume(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::resume(state.store.as_ref(), &action.by).await;
    respond(wake_workers_if_ok(&state, result))
}

pub(crate) async fn status(State(state): State<Arc<AdminState>>) -> Response {
    respond(ops::status(state.store.as_ref()).await.map(|mut status| {
        status["store"] = state.store_url.clone().into();
        status
    }))
}

pub(crate) async fn purge(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    respond(ops::purge(state.store.as_ref(), state.retention, &action.by).await)
}
