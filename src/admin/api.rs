//! `/api/v1`: find records (filters, pages), read one by id or key with its history, and the
//! operator actions (cancel, retry, flush, pause, resume, purge), each recorded with who and
//! why. The operations themselves live in `ops`, shared with `idemrelay queue --direct`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::guard::{changes_allowed, CHANGES_NEED_TOKEN};
use super::ops::{self, OpError, OpResult};
use super::state::{error, AdminState};
use super::waiting::RelayFacts;
use super::wire::{ListQuery, OPERATOR_HEADER};
use crate::store::{Operator, Resolution};

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
    ops::relay_facts(state.store.as_ref(), Some(state.metrics.breaker_now())).await
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
        let id = ops::id_of_key(state.store.as_ref(), &scope, &key).await?;
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

/// The parameters of an action, in a JSON body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ActionParams {
    reason: Option<String>,
    /// `duplicate-risk`, for a retry that may send a second copy.
    confirm: Option<String>,
    /// `delivered` or `failed`: how a resolve closes an unresolved record.
    #[serde(rename = "as")]
    resolution: Option<String>,
}

/// Whether the request says its body is JSON (`application/json`, any parameters).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// The reason and confirmation from the JSON body. Only JSON, and nothing in the query
/// string: a page of another origin can post a form or a `text/plain` body (and put anything
/// in the URL) without asking, but not `application/json`, which needs a CORS preflight the
/// relay never grants. An empty body is `{}`; a DELETE may come without a type.
fn action_params(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<ActionParams, OpError> {
    let empty = body.iter().all(u8::is_ascii_whitespace);
    if !is_json(headers) && (*method == Method::POST || !empty) {
        return Err(OpError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "json_required",
            "an action takes Content-Type: application/json and its parameters as a JSON body, e.g. {\"reason\": \"...\"} (an empty body is {})",
        ));
    }
    if uri.query().is_some_and(|q| !q.is_empty()) {
        return Err(OpError::new(
            StatusCode::BAD_REQUEST,
            "bad_query",
            "an action takes no query parameters: send them as a JSON body, e.g. {\"reason\": \"...\", \"confirm\": \"duplicate-risk\"}",
        ));
    }
    if empty {
        return Ok(ActionParams::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        OpError::new(
            StatusCode::BAD_REQUEST,
            "bad_body",
            format!("the body must be JSON like {{\"reason\": \"...\"}}: {e}"),
        )
    })
}

/// An operator action's request, as every action handler takes it: who acts and why (the
/// token, the person the client names, the reason) and the confirmation, from a JSON body.
/// Refused before the handler runs: without a token unless changes are allowed without one
/// (403), without a JSON body (415), with a query or a bad body (400). It reads the body, so
/// it is the handler's last argument.
pub(crate) struct Action {
    by: Operator,
    confirm: Option<String>,
    resolution: Option<String>,
    /// The body named a reason (`by.reason` says "no reason given" otherwise).
    reason_given: bool,
}

impl FromRequest<Arc<AdminState>> for Action {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<AdminState>) -> Result<Self, Response> {
        if !changes_allowed(state) {
            return Err(error(
                StatusCode::FORBIDDEN,
                "changes_need_token",
                CHANGES_NEED_TOKEN,
            ));
        }
        let (method, uri, headers) = (
            req.method().clone(),
            req.uri().clone(),
            req.headers().clone(),
        );
        let body = Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let params =
            action_params(&method, &uri, &headers, &body).map_err(|err| respond(Err(err)))?;
        let reason_given = params
            .reason
            .as_deref()
            .is_some_and(|r| !r.trim().is_empty());
        Ok(Action {
            reason_given,
            by: operator(state, &headers, params.reason),
            confirm: params.confirm,
            resolution: params.resolution,
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
        .filter(|v| {
            !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c == ' ' || c.is_ascii_graphic())
        });
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
                format!(
                    "confirm {other:?}: the only confirmation is \"confirm\": \"duplicate-risk\""
                ),
            )
        }
    };
    let result = ops::retry(state.store.as_ref(), &id, confirmed, &action.by).await;
    respond(wake_workers_if_ok(&state, result).map_err(|mut e| {
        if e.code == "confirmation_required" {
            e.message
                .push_str(", then POST again with {\"confirm\": \"duplicate-risk\"}");
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
        return bad_request("bad_body", "cancel takes no confirmation");
    }
    respond(ops::cancel(state.store.as_ref(), &id, &action.by).await)
}

/// `{"as": "delivered"|"failed", "reason": "..."}`: closes an unresolved record without
/// sending it again. The reason is required: it is what the next person reads.
pub(crate) async fn resolve(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    if action.confirm.is_some() {
        return bad_request("bad_body", "resolve takes no confirmation");
    }
    let names = || {
        Resolution::ALL
            .iter()
            .map(|r| format!("{:?}", r.as_str()))
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let Some(resolution) = action.resolution.as_deref() else {
        return bad_request(
            "resolution_required",
            format!(
                "say how the record ends: {{\"as\": {}, \"reason\": \"...\"}}",
                names()
            ),
        );
    };
    let Some(resolution) = Resolution::parse(resolution) else {
        return bad_request(
            "bad_resolution",
            format!("\"as\": {resolution:?}: the record ends as {}", names()),
        );
    };
    if !action.reason_given {
        return bad_request(
            "reason_required",
            "resolve needs a reason (what the upstream's records showed): {\"as\": ..., \"reason\": \"...\"}",
        );
    }
    let result = ops::resolve(state.store.as_ref(), &id, resolution, &action.by).await;
    if result.is_ok() {
        state.stats.forget().await;
    }
    respond(result)
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
        status["instance"] = instance_name(&state).into();
        status
    }))
}

/// The name this relay answers with (its `hostname` setting), in `/api/v1/queue/status` and in
/// the `Idemrelay-Instance` header of every admin response: `idemrelay queue` shows it, so an
/// operator sees which relay answered before trusting a listing or an action.
pub(crate) fn instance_name(state: &AdminState) -> &str {
    // `hosts` starts with the relay's own `hostname` (see `AdminState::hosts`).
    state.hosts.first().map_or("", String::as_str)
}

pub(crate) async fn purge(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    respond(ops::purge(state.store.as_ref(), state.retention, &action.by).await)
}

/// `POST /api/v1/queue/cancel`'s body: `{"filter": {...}, "reason": "..."}`. The filter takes
/// the parameters of `GET /api/v1/messages` (state `queued`, the default, or `deferred`), and
/// must be given, if only as `{}` for every queued record: a body without it is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkCancelParams {
    reason: Option<String>,
    filter: ListQuery,
}

/// Cancels every queued record the filter matches, as ONE recorded action with the count.
/// Refused as the other actions are: without a token unless changes are allowed (403), without
/// a JSON body (415), with a query (400).
pub(crate) async fn cancel_matching(
    State(state): State<Arc<AdminState>>,
    request: Request,
) -> Response {
    if !changes_allowed(&state) {
        return error(
            StatusCode::FORBIDDEN,
            "changes_need_token",
            CHANGES_NEED_TOKEN,
        );
    }
    let (parts, body) = request.into_parts();
    if !is_json(&parts.headers) {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "json_required",
            "a bulk cancel takes Content-Type: application/json and a body like {\"filter\": {\"state\": \"queued\", \"recipient\": \"...\"}, \"reason\": \"...\"}",
        );
    }
    if parts.uri.query().is_some_and(|q| !q.is_empty()) {
        return bad_request(
            "bad_query",
            "a bulk cancel takes no query parameters: the filter goes in the JSON body",
        );
    }
    let body = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(body) => body,
        Err(e) => return bad_request("bad_body", e.to_string()),
    };
    let params: BulkCancelParams = match serde_json::from_slice(&body) {
        Ok(params) => params,
        Err(e) => {
            return bad_request(
                "bad_body",
                format!(
                    "the body must be JSON like {{\"filter\": {{\"state\": \"queued\"}}, \"reason\": \"...\"}} ({{}} as the filter: every queued record): {e}"
                ),
            )
        }
    };
    let by = operator(&state, &parts.headers, params.reason);
    respond(ops::cancel_matching(state.store.as_ref(), params.filter, &by).await)
}
