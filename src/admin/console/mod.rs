//! The web console on the admin listener (`/console`): server-rendered pages that read the
//! store as `/api/v1` does and act through the API's own operations (`admin::ops`), with forms
//! that work without scripts.
//!
//! Access: the admin token as `Authorization: Bearer` (like the API), or a session cookie
//! from the login form (see `session`). Every POST needs its session's CSRF token, unless it
//! came with the bearer header, which no other site's page can make a browser send. Host and
//! Origin are checked before any of this (`admin::guard`); without a token, actions are
//! refused unless `admin_allow_changes_without_token` is set.

mod actions;
mod headers;
mod pages;
mod respond;
mod session;

use std::sync::Arc;

use axum::extract::{Path, Query, RawQuery, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use serde::Deserialize;

use super::state::AdminState;
use super::waiting::{why_waiting, RecordFacts, RelayFacts, Waiting};
use super::wire::ListQuery;
use crate::store::{ListFilter, State as RecordState, StateFilter, StoreError};
use actions::{cancel, flush, flush_all, pause, resolve, resume, retry, retry_confirm};
use respond::{
    forbidden_form, html, no_record, record_with_attempts, see_other, store_failed, Access,
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

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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
