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
use super::waiting::RelayFacts;
use super::{error, AdminState};
use crate::store::{Cursor, ListFilter, Operator, StateFilter};

const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// The header a client may name its person with (`idemrelay queue` sends the local user): it
/// is recorded beside the token's name, as the caller's claim.
pub const OPERATOR_HEADER: &str = "x-idemrelay-operator";

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

pub async fn show(State(state): State<Arc<AdminState>>, Path(id): Path<String>) -> Response {
    respond(show_id(&state, &id).await)
}

async fn show_id(state: &AdminState, id: &str) -> OpResult {
    let relay = relay_facts(state).await?;
    ops::show(state.store.as_ref(), id, &relay).await
}

pub async fn show_key(
    State(state): State<Arc<AdminState>>,
    Path((scope, key)): Path<(String, String)>,
) -> Response {
    let result = async {
        let id = ops::resolve_key(state.store.as_ref(), &scope, &key).await?;
        show_id(&state, &id).await
    };
    respond(result.await)
}

/// The filters of `GET /api/v1/messages`; any other parameter is refused (400), so a typo
/// never returns an unrelated listing.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub state: Option<String>,
    pub scope: Option<String>,
    pub key: Option<String>,
    pub sender: Option<String>,
    pub recipient: Option<String>,
    pub message_id: Option<String>,
    /// RFC 3339, or a duration meaning that long ago (`2h`).
    pub since: Option<String>,
    pub until: Option<String>,
    /// `newest` (newest first) or `oldest` (the default).
    pub order: Option<String>,
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

impl ListQuery {
    /// The query string this listing is asked for with (without the `?`).
    pub fn to_query_string(&self) -> String {
        let limit = self.limit.map(|l| l.to_string());
        [
            ("state", &self.state),
            ("scope", &self.scope),
            ("key", &self.key),
            ("sender", &self.sender),
            ("recipient", &self.recipient),
            ("message_id", &self.message_id),
            ("since", &self.since),
            ("until", &self.until),
            ("order", &self.order),
            ("limit", &limit),
            ("cursor", &self.cursor),
        ]
        .iter()
        .filter_map(|(name, value)| {
            value
                .as_ref()
                .map(|v| format!("{name}={}", super::client::encode(v)))
        })
        .collect::<Vec<_>>()
        .join("&")
    }

    pub fn into_filter(self, now_ms: i64) -> Result<ListFilter, (&'static str, String)> {
        let state = match self.state.as_deref() {
            None => None,
            Some(name) => Some(StateFilter::parse(name).ok_or_else(|| {
                (
                    "bad_state",
                    format!("unknown state {name:?} ({})", StateFilter::names()),
                )
            })?),
        };
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(("bad_limit", format!("limit must be 1 to {MAX_PAGE}")));
        }
        let newest_first = match self.order.as_deref() {
            None | Some("oldest") => false,
            Some("newest") => true,
            Some(other) => {
                return Err((
                    "bad_order",
                    format!("order={other:?}: the orders are newest and oldest"),
                ))
            }
        };
        let time = |text: Option<String>| {
            text.map(|t| parse_time(&t, now_ms))
                .transpose()
                .map_err(|e| ("bad_time", e))
        };
        let cursor = self
            .cursor
            .map(|c| Cursor::decode(&c))
            .transpose()
            .map_err(|e| ("bad_cursor", e))?;
        Ok(ListFilter {
            state,
            scope: self.scope,
            key: self.key,
            sender: self.sender,
            recipient: self.recipient,
            message_id: self.message_id,
            since_ms: time(self.since)?,
            until_ms: time(self.until)?,
            newest_first,
            limit,
            cursor,
        })
    }
}

/// An RFC 3339 time, or a duration before `now_ms` (`90m`, `2h`, `1d`), as Unix milliseconds.
pub fn parse_time(text: &str, now_ms: i64) -> Result<i64, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        let since_epoch = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("{text:?} is before 1970"))?;
        return Ok(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX));
    }
    match humantime::parse_duration(text) {
        Ok(ago) => Ok(now_ms.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX))),
        Err(_) => Err(format!(
            "{text:?} is neither an RFC 3339 time (2026-12-02T10:00:00Z) nor a duration ago (2h)"
        )),
    }
}

/// `{"messages": [...], "next_cursor": CURSOR|null}`: pass `next_cursor` as `cursor` (with
/// the same filters) for the next page; null means this was the last one.
pub async fn list(
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
pub struct ActionParams {
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
pub struct Action {
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
pub fn reason_or_default(reason: Option<String>) -> String {
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

pub async fn retry(
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

pub async fn cancel(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    if action.confirm.is_some() {
        return bad_request("bad_query", "cancel takes no confirmation");
    }
    respond(ops::cancel(state.store.as_ref(), &id, &action.by).await)
}

pub async fn flush(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let result = ops::flush(state.store.as_ref(), &id, &action.by).await;
    respond(wake_workers_if_ok(&state, result))
}

pub async fn flush_all(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::flush_all(state.store.as_ref(), &action.by).await;
    respond(wake_workers_if_ok(&state, result))
}

pub async fn pause(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    respond(ops::pause(state.store.as_ref(), &action.by).await)
}

pub async fn resume(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::resume(state.store.as_ref(), &action.by).await;
    respond(wake_workers_if_ok(&state, result))
}

pub async fn status(State(state): State<Arc<AdminState>>) -> Response {
    respond(ops::status(state.store.as_ref()).await.map(|mut status| {
        status["store"] = state.store_url.clone().into();
        status
    }))
}

pub async fn purge(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    respond(ops::purge(state.store.as_ref(), state.retention, &action.by).await)
}
