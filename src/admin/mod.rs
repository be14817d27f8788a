//! The admin HTTP listener: health checks, Prometheus metrics and the ledger API (DESIGN §5).
//!
//! `/healthz` and `/readyz` are always open (container and load-balancer probes carry no
//! credentials); `/metrics` and `/api/` need `Authorization: Bearer <admin_token>` when a
//! token is configured. `/console` is the web console for a browser (see `console`).

pub mod api;
pub mod client;
pub mod console;
pub mod health;
pub mod healthcheck;
pub mod ops;
pub mod stats_cache;
pub mod view;
pub mod waiting;
pub mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::smtp::server::ConnectionLimits;
use crate::store::{Retention, Store};

/// What the admin handlers read; owned by the relay.
pub struct AdminState {
    pub store: Arc<dyn Store>,
    pub intake: Arc<Intake>,
    pub metrics: Arc<Metrics>,
    pub limits: Arc<ConnectionLimits>,
    /// The relay's stop signal: given once shutdown has begun (health turns 503).
    pub stopping: Stop,
    pub token: Option<String>,
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
}

pub fn router(state: Arc<AdminState>) -> Router {
    let protected = Router::new()
        .route("/metrics", get(health::metrics))
        .route("/api/v1/messages", get(api::list))
        .route("/api/v1/messages/{id}", get(api::show).delete(api::cancel))
        .route("/api/v1/messages/{id}/cancel", post(api::cancel))
        .route("/api/v1/messages/{id}/retry", post(api::retry))
        .route("/api/v1/messages/{id}/flush", post(api::flush))
        .route("/api/v1/queue/flush", post(api::flush_all))
        .route("/api/v1/queue/pause", post(api::pause))
        .route("/api/v1/queue/resume", post(api::resume))
        .route("/api/v1/queue/purge", post(api::purge))
        .route("/api/v1/queue/status", get(api::status))
        .route("/api/v1/keys/{scope}/{*key}", get(api::show_key))
        .route_layer(middleware::from_fn_with_state(state.clone(), bearer));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .merge(protected)
        .merge(console::router(state.clone()))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .with_state(state)
}

/// Serves until `stop` is given. The relay gives it only after its own shutdown has drained,
/// so `/healthz` can answer 503 during the drain.
pub async fn serve(listener: TcpListener, state: Arc<AdminState>, stop: Stop) {
    let app = router(state);
    let shutdown = async move { stop.stopped().await };
    if let Err(err) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!(target: "idemrelay::admin", error = %err, "admin listener failed");
    }
}

/// A JSON error body: `{"error": "...", "code": "..."}`.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into(), "code": code });
    (status, Json(body)).into_response()
}

async fn bearer(State(state): State<Arc<AdminState>>, request: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => {
            next.run(request).await
        }
        _ => {
            let mut response = error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this endpoint needs Authorization: Bearer <admin_token>",
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("static"));
            response
        }
    }
}

/// Compares without stopping at the first difference, so response time does not reveal how
/// much of a guessed token was right. `subtle` keeps the optimizer from turning the loop back
/// into an early exit; only the length is compared in the open, and it is no secret.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"abcde", b"abcdef"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }
}
