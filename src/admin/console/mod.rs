//! The web console on the admin listener (`/console`): server-rendered pages that read the
//! store as `/api/v1` does and act through the API's own operations (`admin::ops`), with forms
//! that work without scripts.
//!
//! Access: the admin token as `Authorization: Bearer` (like the API), or a session cookie
//! from the login form (see `session`). Every POST needs its session's CSRF token, unless it
//! came with the bearer header, which no other site's page can make a browser send. Host and
//! Origin are checked before any of this (`admin::guard`); without a token, actions are
//! refused unless `admin_allow_changes_without_token` is set.

mod headers;
mod pages;
mod session;

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, Query, RawQuery, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use maud::Markup;
use serde::Deserialize;

use super::api::{reason_or_default, token_actor, wake_workers_if_ok};
use super::guard::{changes_allowed, CHANGES_NEED_TOKEN};
use super::ops::{self, OpError};
use super::state::AdminState;
use super::waiting::{why_waiting, RecordFacts, RelayFacts, Waiting};
use super::wire::ListQuery;
use crate::store::{
    AttemptRow, ListFilter, Operator, Resolution, State as RecordState, StateFilter, StoreError,
    StoredMessage,
};
use session::ConsoleLogin;

/// Records read to count them by scope on the overview (the per-state counts are exact).
const SCOPE_SCAN_LIMIT: usize = 20_000;
const SEARCH_PAGE: usize = 50;
const UNRESOLVED_PAGE: usize = 200;
/// Rows per store call while counting by scope.
const BATCH: usize = 1000;
/// Relay-wide operator actions shown on the overview.
const RECENT_ACTIONS: usize = 10;

pub(crate) fn router(state: Arc<AdminState>) -> Router<Arc<AdminState>> {
    let signed_in = Router::new()
        .route("/console", get(overview))
        .route("/console/search", get(search))
        .route("/console/unresolved", get(unresolved))
        .route("/console/messages/{id}", get(message))
        .route(
            "/console/messages/{id}/retry",
            get(retry_confirm).post(retry),
        )
        .route("/console/messages/{id}/cancel", post(cancel))
        .route("/console/messages/{id}/resolve", post(resolve))
        .route("/console/messages/{id}/flush", post(flush))
        .route("/console/flush", get(flush_all_form).post(flush_all))
        .route("/console/pause", get(pause_form).post(pause))
        .route("/console/resume", get(resume_form).post(resume))
        .route("/console/logout", post(logout))
        .route_layer(middleware::from_fn_with_state(state, authenticate));
    Router::new()
        .route("/console/login", get(login_form).post(login))
        .merge(signed_in)
        .layer(middleware::map_response(hardened))
}

/// How the request was let in; handlers put `csrf` into their forms.
#[derive(Clone)]
struct Access {
    /// None for a bearer-header request.
    session: Option<ConsoleLogin>,
    csrf: String,
}

impl Access {
    fn allows_post(&self, key: &ring::hmac::Key, presented: Option<&str>) -> bool {
        match &self.session {
            None => true,
            Some(session) => presented.is_some_and(|p| session.csrf_matches(key, p)),
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn html(status: StatusCode, markup: Markup) -> Response {
    (status, markup).into_response()
}

fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}

async fn authenticate(
    State(state): State<Arc<AdminState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let key = session::key();
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let (Some(token), Some(given)) = (&state.token, bearer) {
        if crate::admin::state::constant_time_eq(given.as_bytes(), token.as_bytes()) {
            request.extensions_mut().insert(Access {
                session: None,
                csrf: String::new(),
            });
            return next.run(request).await;
        }
    }
    let now = now_ms();
    let from_cookie = request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(session::from_cookie_header)
        .find_map(|value| ConsoleLogin::verify(value, &key, now));
    let (session, minted) = match from_cookie {
        Some(session) => (session, false),
        // Without an admin token the console is as open as the API; a session is minted only
        // to tie forms to it, and a form must come from a page that was served first.
        None if state.token.is_none() && request.method() == Method::GET => {
            (ConsoleLogin::new(now, ""), true)
        }
        None if request.method() == Method::GET => return see_other("/console/login"),
        None => {
            return html(
                StatusCode::FORBIDDEN,
                pages::notice(
                    "Not signed in",
                    "This form needs a console session: log in and try again.",
                    None,
                ),
            )
        }
    };
    let csrf = session.csrf(&key);
    let cookie = minted.then(|| session::set_cookie(&session.cookie_value(&key)));
    request.extensions_mut().insert(Access {
        session: Some(session),
        csrf,
    });
    let mut response = next.run(request).await;
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// No caching of pages that show queue state, no framing, no scripts, no outside resources.
async fn hardened(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null` on
    // the console's own form posts, which the origin check (`admin::guard`) must refuse.
    // Nothing leaves for other sites either way.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

fn store_failed(err: StoreError, access: &Access) -> Response {
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::notice("Store unavailable", &err.to_string(), Some(&access.csrf)),
    )
}

fn forbidden_form(access: &Access) -> Response {
    html(
        StatusCode::FORBIDDEN,
        pages::notice(
            "Form expired",
            "This form does not belong to your session (it is stale, or came from another page): reload the page and try again.",
            Some(&access.csrf),
        ),
    )
}

async fn login_form(State(state): State<Arc<AdminState>>) -> Response {
    if state.token.is_none() {
        return see_other("/console");
    }
    html(StatusCode::OK, pages::login(None))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    /// Who is logging in, recorded with their actions (optional).
    name: Option<String>,
}

async fn login(State(state): State<Arc<AdminState>>, Form(form): Form<LoginForm>) -> Response {
    let Some(token) = &state.token else {
        return see_other("/console");
    };
    let throttle = &state.login_throttle;
    let now = std::time::Instant::now();
    if let Some(wait) = throttle.wait(now) {
        // Not even compared: guessing the token here costs a window per few guesses.
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, wait.as_secs().max(1).to_string())],
            html(
                StatusCode::TOO_MANY_REQUESTS,
                pages::login(Some(
                    "Too many wrong tokens: logins are paused for a minute.",
                )),
            ),
        )
            .into_response();
    }
    if !crate::admin::state::constant_time_eq(form.token.as_bytes(), token.as_bytes()) {
        throttle.failed(now);
        tracing::warn!(target: "idemrelay::admin", "console login refused: wrong admin token");
        return html(
            StatusCode::UNAUTHORIZED,
            pages::login(Some("That is not the admin token.")),
        );
    }
    let name = form.name.as_deref().unwrap_or("").trim();
    if !session::valid_operator(name) {
        return html(
            StatusCode::BAD_REQUEST,
            pages::login(Some(
                "A name is up to 64 characters, without line breaks or other control characters.",
            )),
        );
    }
    let key = session::key();
    let cookie = session::set_cookie(&ConsoleLogin::new(now_ms(), name).cookie_value(&key));
    tracing::info!(target: "idemrelay::admin", operator = ?name, "console login");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console")).into_response()
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: Option<String>,
}

async fn logout(
    State(state): State<Arc<AdminState>>,
    Extension(access): Extension<Access>,
    Form(form): Form<CsrfForm>,
) -> Response {
    if !access.allows_post(&session::key(), form.csrf.as_deref()) {
        return forbidden_form(&access);
    }
    // The cookie is cleared in the browser and refused here from now on, should a copy of it
    // be replayed.
    if let Some(session) = &access.session {
        session.revoke(now_ms());
    }
    let to = if state.token.is_some() {
        "/console/login"
    } else {
        "/console"
    };
    (
        [(header::SET_COOKIE, session::clear_cookie())],
        Redirect::to(to),
    )
        .into_response()
}

/// Per scope and state, over at most `SCOPE_SCAN_LIMIT` records.
async fn scope_counts(state: &AdminState) -> Result<pages::ScopeCounts, StoreError> {
    let mut counts = pages::ScopeCounts {
        counts: Default::default(),
        scanned: 0,
        complete: false,
    };
    let mut filter = ListFilter::all(BATCH);
    while counts.scanned < SCOPE_SCAN_LIMIT {
        let page = state.store.list_page(&filter).await?;
        for r in &page.records {
            *counts
                .counts
                .entry(r.scope.clone())
                .or_default()
                .entry(r.state.as_str())
                .or_default() += 1;
        }
        counts.scanned += page.records.len();
        match page.next_cursor {
            Some(cursor) => filter.cursor = Some(cursor),
            None => {
                counts.complete = true;
                break;
            }
        }
    }
    Ok(counts)
}

/// `refresh=off` in a page's query stops its auto-refresh; every other parameter is the
/// page's own. Returns the auto-refresh and the query without `refresh`.
fn split_refresh(path: &str, query: Option<&str>) -> (pages::AutoRefresh, String) {
    let mut on = true;
    let mut rest = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if name == "refresh" {
            on = value != "off";
        } else {
            rest.append_pair(&name, &value);
        }
    }
    let rest = rest.finish();
    let here = if rest.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{rest}")
    };
    (pages::AutoRefresh { on, here }, rest)
}

/// The start of this process's id in the store's liveness rows (`host/pid/`): the delivery
/// workers name their process `host/pid/nonce`, with '/' and '-' in the host name replaced by
/// '_' (docs/guides/postgres.md).
fn process_prefix() -> String {
    format!(
        "{}/{}/",
        crate::hostname::system_hostname().replace(['/', '-'], "_"),
        std::process::id()
    )
}

async fn overview(
    State(state): State<Arc<AdminState>>,
    Extension(access): Extension<Access>,
    RawQuery(query): RawQuery,
) -> Response {
    let (refresh, _) = split_refresh("/console", query.as_deref());
    let read = async {
        let stats = state.store.queue_stats().await?;
        let paused = state.store.paused().await?;
        let scopes = scope_counts(&state).await?;
        let actions = state.store.relay_actions(RECENT_ACTIONS).await?;
        let (health, health_age) = state.stats.health(state.store.as_ref()).await?;
        Ok::<_, StoreError>((stats, paused, scopes, actions, health, health_age))
    };
    match read.await {
        Ok((stats, paused, scopes, actions, health, health_age)) => {
            let prefix = process_prefix();
            let page = pages::Overview {
                stats: &stats,
                paused: paused.as_ref(),
                scopes: &scopes,
                actions: &actions,
                breaker: state.metrics.breaker_now(),
                health: &health,
                health_age_ms: health_age.as_millis() as i64,
                hostname: state.hosts.first().map_or("", String::as_str),
                process_prefix: &prefix,
                alive_within_ms: crate::delivery::worker::STALE_AFTER.as_millis() as i64,
                now_ms: now_ms(),
            };
            html(
                StatusCode::OK,
                pages::overview(&page, &access.csrf, &refresh),
            )
        }
        Err(err) => store_failed(err, &access),
    }
}

async fn pause_form(Extension(access): Extension<Access>) -> Response {
    html(
        StatusCode::OK,
        pages::relay_action(
            "pause",
            "Pause delivery?",
            "No record is attempted while delivery is paused; intake goes on, and records wait queued until delivery resumes.",
            &access.csrf,
        ),
    )
}

async fn resume_form(Extension(access): Extension<Access>) -> Response {
    html(
        StatusCode::OK,
        pages::relay_action(
            "resume",
            "Resume delivery?",
            "Queued records are attempted again, each when it is due.",
            &access.csrf,
        ),
    )
}

async fn flush_all_form(Extension(access): Extension<Access>) -> Response {
    html(
        StatusCode::OK,
        pages::relay_action(
            "flush",
            "Flush: make every queued record due now?",
            "Every queued record becomes due at once, its retry backoff cut short (the upstream rate limit still paces the attempts).",
            &access.csrf,
        ),
    )
}

/// The search form's fields are the API's list filters (`GET /api/v1/messages`), read by the
/// same code; a field left empty means "any".
fn blank_is_none(q: &mut ListQuery) {
    for field in [
        &mut q.state,
        &mut q.scope,
        &mut q.key,
        &mut q.sender,
        &mut q.recipient,
        &mut q.message_id,
        &mut q.since,
        &mut q.until,
        &mut q.order,
        &mut q.cursor,
    ] {
        if field.as_deref().is_some_and(|v| v.trim().is_empty()) {
            *field = None;
        }
    }
}

fn copy(q: &ListQuery) -> ListQuery {
    ListQuery {
        state: q.state.clone(),
        scope: q.scope.clone(),
        key: q.key.clone(),
        sender: q.sender.clone(),
        recipient: q.recipient.clone(),
        message_id: q.message_id.clone(),
        since: q.since.clone(),
        until: q.until.clone(),
        order: q.order.clone(),
        limit: q.limit,
        cursor: q.cursor.clone(),
    }
}

async fn relay_facts(state: &AdminState) -> Result<RelayFacts, StoreError> {
    Ok(RelayFacts {
        pause: state.store.paused().await?,
        breaker: Some(state.metrics.breaker_now()),
    })
}

async fn search(
    State(state): State<Arc<AdminState>>,
    Extension(access): Extension<Access>,
    RawQuery(raw): RawQuery,
) -> Response {
    let bad = |text: String| {
        html(
            StatusCode::BAD_REQUEST,
            pages::notice("Bad search", &text, Some(&access.csrf)),
        )
    };
    // A list asked for (any filter) reloads itself; the bare form does not.
    let (refresh, rest) = split_refresh("/console/search", raw.as_deref());
    let refresh = (!rest.is_empty()).then_some(refresh);
    let uri: axum::http::Uri = match format!("/console/search?{rest}").parse() {
        Ok(uri) => uri,
        Err(err) => return bad(err.to_string()),
    };
    let mut query = match Query::<ListQuery>::try_from_uri(&uri) {
        Ok(Query(query)) => query,
        Err(rejection) => return bad(rejection.body_text()),
    };
    blank_is_none(&mut query);
    query.limit = Some(query.limit.unwrap_or(SEARCH_PAGE));
    let form = copy(&query);
    let filter = match query.into_filter(now_ms()) {
        Ok(filter) => filter,
        Err((_, text)) => return bad(text),
    };
    let read = async {
        let page = state.store.list_page(&filter).await?;
        let relay = relay_facts(&state).await?;
        Ok::<_, StoreError>((page, relay))
    };
    match read.await {
        Ok((page, relay)) => {
            let waiting: Vec<Option<Waiting>> = page
                .records
                .iter()
                .map(|r| {
                    why_waiting(
                        &RecordFacts {
                            state: r.state,
                            next_attempt_at_ms: r.next_attempt_at_ms,
                            leased: r.leased,
                            last_outcome: r.last_outcome.as_deref(),
                            now_ms: r.read_at_ms,
                        },
                        &relay,
                    )
                })
                .collect();
            let next = page.next_cursor.map(|cursor| {
                let mut next = copy(&form);
                next.cursor = Some(cursor.encode());
                next.to_query_string()
            });
            let results = pages::SearchResults {
                form: &form,
                rows: &page.records,
                waiting: &waiting,
                next,
            };
            html(
                StatusCode::OK,
                pages::search(&results, &access.csrf, refresh.as_ref()),
            )
        }
        Err(err) => store_failed(err, &access),
    }
}

async fn unresolved(
    State(state): State<Arc<AdminState>>,
    Extension(access): Extension<Access>,
    RawQuery(query): RawQuery,
) -> Response {
    let (refresh, _) = split_refresh("/console/unresolved", query.as_deref());
    let filter = ListFilter {
        state: Some(StateFilter::Is(RecordState::Unresolved)),
        ..ListFilter::all(UNRESOLVED_PAGE)
    };
    match state.store.list_page(&filter).await {
        Ok(page) => html(
            StatusCode::OK,
            pages::unresolved(
                &page.records,
                page.next_cursor.is_some(),
                &access.csrf,
                &refresh,
            ),
        ),
        Err(err) => store_failed(err, &access),
    }
}

fn no_record(id: &str, access: &Access) -> Response {
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
async fn record_with_attempts(
    state: &AdminState,
    id: &str,
) -> Result<Option<(StoredMessage, Vec<AttemptRow>)>, StoreError> {
    let Some(m) = state.store.message(id).await? else {
        return Ok(None);
    };
    let attempts = state.store.attempts(id).await?;
    Ok(Some((m, attempts)))
}

async fn message(
    State(state): State<Arc<AdminState>>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
) -> Response {
    let read = async {
        let Some((m, attempts)) = record_with_attempts(&state, &id).await? else {
            return Ok(None);
        };
        let events = state.store.events(&id).await?;
        let relay = relay_facts(&state).await?;
        Ok::<_, StoreError>(Some((m, attempts, events, relay)))
    };
    match read.await {
        Ok(Some((m, attempts, events, relay))) => {
            let waiting = why_waiting(
                &RecordFacts {
                    state: m.state,
                    next_attempt_at_ms: m.next_attempt_at_ms,
                    leased: m.leased,
                    last_outcome: attempts.last().and_then(|a| a.outcome.as_deref()),
                    now_ms: now_ms(),
                },
                &relay,
            );
            let page = pages::MessagePage {
                m: &m,
                attempts: &attempts,
                events: &events,
                headers: m.content.as_deref().map(headers::fields),
                waiting: waiting.as_ref(),
            };
            html(StatusCode::OK, pages::message(&page, &access.csrf))
        }
        Ok(None) => no_record(&id, &access),
        Err(err) => store_failed(err, &access),
    }
}

/// Why a retry of this record may deliver a second copy, if it may: the same rule as the
/// store's (`requeue_refusal`), read from the ledger so the warning is shown before asking.
fn duplicate_risk(m: &StoredMessage, attempts: &[AttemptRow]) -> Option<String> {
    let unknown = attempts
        .iter()
        .any(|a| a.outcome.as_deref() == Some("unknown"));
    (m.state == RecordState::Unresolved || unknown)
        .then(|| crate::store::confirmation_reason(&m.id, m.state))
}

async fn retry_confirm(
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
fn operator(state: &AdminState, access: &Access, reason: Option<String>) -> Operator {
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
fn after_action(result: Result<serde_json::Value, OpError>, to: &str, access: &Access) -> Response {
    match result {
        Ok(_) => see_other(to),
        Err(err) => html(
            err.status,
            pages::notice("Not done", &err.message, Some(&access.csrf)),
        ),
    }
}

#[derive(Deserialize)]
struct ActionForm {
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
struct Action {
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
        let key = session::key();
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
async fn retry(
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

async fn cancel(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let result = ops::cancel(state.store.as_ref(), &id, &action.by).await;
    after_action(result, &pages::message_href(&id), &action.access)
}

/// `ops::resolve`, as `POST /api/v1/messages/{id}/resolve` runs it (the form's reason field
/// is required, as the API requires one).
async fn resolve(
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

async fn flush(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    action: Action,
) -> Response {
    let result = ops::flush(state.store.as_ref(), &id, &action.by).await;
    let result = wake_workers_if_ok(&state, result);
    after_action(result, &pages::message_href(&id), &action.access)
}

async fn flush_all(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::flush_all(state.store.as_ref(), &action.by).await;
    let result = wake_workers_if_ok(&state, result);
    after_action(result, "/console", &action.access)
}

async fn pause(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::pause(state.store.as_ref(), &action.by).await;
    after_action(result, "/console", &action.access)
}

async fn resume(State(state): State<Arc<AdminState>>, action: Action) -> Response {
    let result = ops::resume(state.store.as_ref(), &action.by).await;
    let result = wake_workers_if_ok(&state, result);
    after_action(result, "/console", &action.access)
}
