//! The operator's actions from the console: retry (with its confirmation page), cancel,
//! resolve, flush, and the relay-wide flush, pause and resume. Each goes through the same
//! operations as the API (`admin::ops`) and answers with a redirect or a refusal page.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::pages;
use super::respond::{
    forbidden_form, html, no_record, record_with_attempts, see_other, store_failed, Access,
};
use crate::admin::api::{reason_or_default, token_actor, wake_workers_if_ok};
use crate::admin::guard::{changes_allowed, CHANGES_NEED_TOKEN};
use crate::admin::ops::{self, OpError};
use crate::admin::state::AdminState;
use crate::store::{AttemptRow, Operator, Resolution, State as RecordState, StoredMessage};

/// Why a retry of this record may deliver a second copy, if it may: the same rule as the
/// store's (`requeue_refusal`), read from the ledger so the warning is shown before asking.
pub(super) fn duplicate_risk(m: &StoredMessage, attempts: &[AttemptRow]) -> Option<String> {
    let unknown = attempts
        .iter()
        .any(|a| a.outcome.as_deref() == Some("unknown"));
    (m.state == RecordState::Unresolved || unknown)
        .then(|| crate::store::confirmation_reason(&m.id, m.state))
}

pub(super) async fn retry_confirm(
    State(state): State<Arc<AdminState>>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
) -> Response {
    match record_with_attempts(&state, &id).await {
        Ok(Some((m, attempts))) => {
            let warning = duplicate_risk(&m, &attempts);
            html(
                StatusCode::OK,
                pages::retry_confirm(&m, warning.as_deref(), &access.csrf),
            )
        }
        Ok(None) => no_record(&id, &access),
        Err(err) => store_failed(err, &access),
    }
}

/// Who acts, as the API names it (the one admin token), with the name given at login, and
/// that it was the console.
pub(super) fn operator(state: &AdminState, access: &Access, reason: Option<String>) -> Operator {
    let mut actor = token_actor(state);
    if let Some(name) = access
        .session
        .as_ref()
        .map(|s| s.operator.as_str())
        .filter(|n| !n.is_empty())
    {
        actor.push_str(&format!(" ({name})"));
    }
    actor.push_str(" via console");
    Operator {
        actor,
        reason: reason_or_default(reason),
    }
}

/// An action's answer: on success back to `to`, which shows the result; a refusal as a page
/// with the API's status and message.
pub(super) fn after_action(
    result: Result<serde_json::Value, OpError>,
    to: &str,
    access: &Access,
) -> Response {
    match result {
        Ok(_) => see_other(to),
        Err(err) => html(
            err.status,
            pages::notice("Not done", &err.message, Some(&access.csrf)),
        ),
    }
}

#[derive(Deserialize)]
pub(super) struct ActionForm {
    csrf: Option<String>,
    reason: Option<String>,
    confirm: Option<String>,
    /// `delivered` or `failed`, for a resolve.
    #[serde(rename = "as")]
    resolution: Option<String>,
}

/// An action form's request, as every action handler takes it: how the request was let in,
/// who acts and why, and the confirmation. A form without its session's CSRF token is refused
/// before the handler runs. It reads the body, so it is the handler's last argument.
pub(super) struct Action {
    access: Access,
    by: Operator,
    confirm: Option<String>,
    resolution: Option<String>,
    /// The form named a reason (`by.reason` says "no reason given" otherwise).
    reason_given: bool,
}

impl FromRequest<Arc<AdminState>> for Action {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<AdminState>) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let Extension(access) = Extension::<Access>::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let Form(form) = Form::<ActionForm>::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        let key = super::session::key();
        if !access.allows_post(&key, form.csrf.as_deref()) {
            return Err(forbidden_form(&access));
        }
        // As on the API: without a token, only when the operator allowed it.
        if !changes_allowed(state) {
            return Err(html(
                StatusCode::FORBIDDEN,
                pages::notice("Not allowed", CHANGES_NEED_TOKEN, Some(&access.csrf)),
            ));
        }
        let reason_given = form.reason.as_deref().is_some_and(|r| !r.trim().is_empty());
        Ok(Action {
            reason_given,
            by: operator(state, &access, form.reason),
            confirm: form.confirm,
            resolution: form.resolution,
            access,
        })
    }
}

/// `ops::retry`, as `POST /api/v1/messages/{id}/retry` runs it; back to the record's page,
/// which shows its new state.
pub(super) async fn retry(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let confirmed = action.confirm.as_deref() == Some("duplicate-risk");
    let result = ops::retry(state.store.as_ref(), &id, confirmed, &action.by).await;
    let result = wake_workers_if_ok(&state, result);
    // The record changed since the page was shown (e.g. a failed one now has an UNKNOWN
    // attempt): ask again, with the warning.
    if matches!(&result, Err(err) if err.code == "confirmation_required") {
        return see_other(&format!("{}/retry", pages::message_href(&id)));
    }
    after_action(result, &pages::message_href(&id), &action.access)
}

pub(super) async fn cancel(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let result = ops::cancel(state.store.as_ref(), &id, &action.by).await;
    after_action(result, &pages::message_href(&id), &action.access)
}

/// `ops::resolve`, as `POST /api/v1/messages/{id}/resolve` runs it (the form's reason field
/// is required, as the API requires one).
pub(super) async fn resolve(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let resolution = action.resolution.as_deref().and_then(Resolution::parse);
    let Some(resolution) = resolution.filter(|_| action.reason_given) else {
        return html(
            StatusCode::BAD_REQUEST,
            pages::notice(
                "Not done",
                "Choose how the record ends (delivered or failed) and say what the upstream's \
                 records showed.",
                Some(&action.access.csrf),
            ),
        );
    };
    let result = ops::resolve(state.store.as_ref(), &id, resolution, &action.by).await;
    if result.is_ok() {
        state.stats.forget().await;
    }
    after_action(result, &pages::message_href(&id), &action.access)
}

pub(super) async fn flush(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let result = ops::flush(state.store.as_ref(), &id, &action.by).await;
    let result = wake_workers_if_ok(&state, result);
    after_action(result, &pages::message_href(&id), &action.access)
}

pub(super) async fn flush_all(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::flush_all(state.store.as_ref(), &action.by).await;
    let result = wake_workers_if_ok(&state, result);
    after_action(result, "/console", &action.access)
}

pub(super) async fn pause(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::pause(state.store.as_ref(), &action.by).await;
    after_action(result, "/console", &action.access)
}

pub(super) async fn resume(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::resume(state.store.as_ref(), &action.by).await;
    let result = wake_workers_if_ok(&state, result);
    after_action(result, "/console", &action.access)
}
