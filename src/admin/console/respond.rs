//! What every console handler answers with: how the request was let in (`Access`), pages and
//! redirects, the store's failure and a stale form as pages, and a record read with its ledger.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::Markup;

use super::pages;
use super::session::ConsoleLogin;
use crate::admin::state::AdminState;
use crate::store::{AttemptRow, StoreError, StoredMessage};

/// How the request was let in; handlers put `csrf` into their forms.
#[derive(Clone)]
pub(super) struct Access {
    /// None for a bearer-header request.
    pub(super) session: Option<ConsoleLogin>,
    pub(super) csrf: String,
}

impl Access {
    pub(super) fn allows_post(&self, key: &ring::hmac::Key, presented: Option<&str>) -> bool {
        match &self.session {
            None => true,
            Some(session) => presented.is_some_and(|p| session.csrf_matches(key, p)),
        }
    }
}

pub(super) fn html(status: StatusCode, markup: Markup) -> Response {
    (status, markup).into_response()
}

pub(super) fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}

pub(super) fn store_failed(err: StoreError, access: &Access) -> Response {
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::notice("Store unavailable", &err.to_string(), Some(&access.csrf)),
    )
}

pub(super) fn forbidden_form(access: &Access) -> Response {
    html(
        StatusCode::FORBIDDEN,
        pages::notice(
            "Form expired",
            "This form does not belong to your session (it is stale, or came from another page): reload the page and try again.",
            Some(&access.csrf),
        ),
    )
}

pub(super) fn no_record(id: &str, access: &Access) -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::notice(
            "No such record",
            &format!("There is no record with id {id:?}."),
            Some(&access.csrf),
        ),
    )
}

/// A record and its attempts (the ledger), or None when there is no such record.
pub(super) async fn record_with_attempts(
    state: &AdminState,
    id: &str,
) -> Result<Option<(StoredMessage, Vec<AttemptRow>)>, StoreError> {
    let Some(m) = state.store.message(id).await? else {
        return Ok(None);
    };
    let attempts = state.store.attempts(id).await?;
    Ok(Some((m, attempts)))
}
