//! The admin HTTP listener: health checks, Prometheus metrics and the ledger API (docs/operations/).
//!
//! `/healthz` and `/readyz` are always open (container and load-balancer probes carry no
//! credentials; `/readyz` shows its details only to a caller that passes the token check);
//! `/metrics` and `/api/` need `Authorization: Bearer <admin_token>` when a token is
//! configured. `/console` is the web console for a browser (see `console`). Every other
//! request passes `guard` first (Host, Origin); operator actions need a token or
//! `admin_allow_changes_without_token`. Connections are served with the limits of
//! `http_serve`.

pub(crate) mod api;
pub(crate) mod client;
pub(crate) mod console;
pub(crate) mod guard;
pub(crate) mod health;
pub(crate) mod healthcheck;
pub(crate) mod login_throttle;
pub(crate) mod ops;
pub(crate) mod ready_probe;
pub(crate) mod state;
pub(crate) mod stats_cache;
pub(crate) mod view;
pub(crate) mod waiting;
pub(crate) mod wire;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

use crate::http_serve::{self, HttpLimits};
use crate::shutdown::Stop;
pub(crate) use state::{error, AdminState};

pub(crate) fn router(state: Arc<AdminState>) -> Router {
    let protected = Router::new()
        .route("/metrics", get(health::metrics))
        .route("/api/v1/messages", get(api::list))
        .route("/api/v1/messages/{id}", get(api::show).delete(api::cancel))
        .route("/api/v1/messages/{id}/cancel", post(api::cancel))
        .route("/api/v1/messages/{id}/retry", post(api::retry))
        .route("/api/v1/messages/{id}/flush", post(api::flush))
        .route("/api/v1/messages/{id}/resolve", post(api::resolve))
        .route("/api/v1/queue/flush", post(api::flush_all))
        .route("/api/v1/queue/cancel", post(api::cancel_matching))
        .route("/api/v1/queue/pause", post(api::pause))
        .route("/api/v1/queue/resume", post(api::resume))
        .route("/api/v1/queue/purge", post(api::purge))
        .route("/api/v1/queue/status", get(api::status))
        .route("/api/v1/keys/{scope}/{*key}", get(api::show_key))
        .route_layer(middleware::from_fn_with_state(state.clone(), bearer));
    // Host and Origin are checked before the token: a rebound or cross-site request is
    // refused whatever it carries. The health checks are left out: probes from load balancers
    // and orchestrators send whatever Host they were configured with, and they show nothing
    // a page could use.
    let guarded = Router::new()
        .merge(protected)
        .merge(console::router(state.clone()))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            guard::same_origin,
        ));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        // A browser pointed at the listener lands on the console (303: GET it).
        .route("/", get(|| async { Redirect::to("/console") }))
        .merge(guarded)
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .layer(middleware::map_response_with_state(
            state.clone(),
            name_instance,
        ))
        .with_state(state)
}

/// Every answer names the relay that gave it (`Idemrelay-Instance`), so a client that reached
/// another relay than it meant to can tell.
async fn name_instance(State(state): State<Arc<AdminState>>, mut response: Response) -> Response {
    if let Ok(name) = header::HeaderValue::from_str(api::instance_name(&state)) {
        response.headers_mut().insert(wire::INSTANCE_HEADER, name);
    }
    response
}

/// Serves until `stop` is given. The relay gives it only after its own shutdown has drained,
/// so `/healthz` can answer 503 during the drain. Requests in flight then get `limits`'
/// shutdown grace.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    limits: HttpLimits,
    stop: Stop,
) {
    let app = router(state);
    let shutdown = async move { stop.stopped().await };
    http_serve::serve("admin", listener, None, app, limits, shutdown).await;
}

async fn bearer(State(state): State<Arc<AdminState>>, request: Request, next: Next) -> Response {
    match state::authorized(&state, request.headers()) {
        true => next.run(request).await,
        false => {
            if state.log_budget.allow() {
                tracing::warn!(
                    target: "idemrelay::admin",
                    path = %request.uri().path(),
                    "admin API refused: no or wrong bearer token"
                );
            }
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

#[cfg(test)]
mod tests {
    use super::state::constant_time_eq;

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
