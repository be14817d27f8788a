//! What every admin handler shares: the relay's state they read, the JSON error body, the
//! token comparison. A leaf of `admin`, so the API, health and console files need not import
//! the router that imports them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::Notify;

use super::stats_cache;
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::smtp::server::ConnectionLimits;
use crate::store::{Retention, Store, StoreHealth};

/// What the admin handlers read; owned by the relay.
pub(crate) struct AdminState {
    pub store: Arc<dyn Store>,
    /// Whether the store was writable at its last write or probe.
    pub store_health: Arc<StoreHealth>,
    pub metrics: Arc<Metrics>,
    pub limits: Arc<ConnectionLimits>,
    /// The relay's stop signal: given once shutdown has begun (health turns 503).
    pub stopping: Stop,
    pub token: Option<String>,
    /// `admin_allow_changes_without_token`: without a token, operator actions are refused
    /// unless this is set.
    pub allow_changes_without_token: bool,
    /// The host names (lowercase) `Host` may carry besides IP addresses and `localhost`:
    /// `hostname` and `admin_hosts`.
    pub hosts: Vec<String>,
    /// With an upstream: how long the delivery workers may go without making progress before
    /// the relay is reported not ready. None without an upstream (nothing to wedge).
    pub wedged_after: Option<Duration>,
    pub started: Instant,
    pub delivery_hint: Arc<Notify>,
    /// For `POST /api/v1/queue/purge`: the relay's retention settings.
    pub retention: Retention,
    /// The store this relay serves, password redacted (in `/api/v1/queue/status`, so that
    /// `idemrelay queue --store URL` can tell when it would be reading another one).
    pub store_url: String,
    /// The queue counts `/metrics` shows.
    pub stats: stats_cache::StatsCache,
    /// Lines about refused unauthenticated requests (wrong token, foreign Host, another
    /// origin): bounded, since anyone who reaches the listener can cause them.
    pub log_budget: crate::log_budget::LogBudget,
    /// Wrong admin tokens at the console's login form.
    pub login_throttle: super::login_throttle::LoginThrottle,
    /// `/readyz`'s store probe, run at most once per `ready_probe::READY_PROBE_MAX_AGE`.
    pub ready_probe: super::ready_probe::ReadyProbe,
}

/// A JSON error body: `{"error": "...", "code": "..."}`.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into(), "code": code });
    (status, Json(body)).into_response()
}

/// Compares without stopping at the first difference, so response time does not reveal how
/// much of a guessed token was right. `subtle` keeps the optimizer from turning the loop back
/// into an early exit; only the length is compared in the open, and it is no secret.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.ct_eq(b))
}

/// Whether a request passes the API's token check: it presents the configured token, or none
/// is configured.
pub(crate) fn authorized(state: &AdminState, headers: &HeaderMap) -> bool {
    let Some(token) = &state.token else {
        return true;
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    presented.is_some_and(|given| constant_time_eq(given.as_bytes(), token.as_bytes()))
}
