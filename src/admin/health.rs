//! `/healthz` (the process is up), `/readyz` (it can take and move mail) and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::state::AdminState;
use crate::metrics::{Format, PauseReason, Snapshot};

pub(crate) async fn healthz(State(state): State<Arc<AdminState>>) -> Response {
    if state.stopping.is_stopping() {
        let body = serde_json::json!({ "status": "shutting down" });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// Ready or not, and why in a word, to anyone: load balancers carry no credentials. The
/// details (the store, the delivery's progress, an operator's pause reason, the breaker) only
/// to a caller that passes the API's token check: a pause reason is the operator's free text.
pub(crate) async fn readyz(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    let stopping = state.stopping.is_stopping();
    let writable = state
        .ready_probe
        .writable(state.store.as_ref(), &state.store_health)
        .await;
    let idle = state.wedged_after.map(|limit| {
        let idle = state
            .metrics
            .since_delivery_heartbeat()
            .unwrap_or_else(|| state.started.elapsed());
        (idle, idle > limit)
    });
    let wedged = matches!(idle, Some((_, true)));
    // A pause is the relay doing its job (an account-level refusal, or an operator): it
    // still accepts mail, so it stays ready; a wedge or an unwritable store does not.
    let (ready, word) = if stopping {
        (false, "shutting_down")
    } else if !writable {
        (false, "store_not_writable")
    } else if wedged {
        (false, "delivery_wedged")
    } else {
        (true, "ready")
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if !super::state::authorized(&state, &headers) {
        let body = serde_json::json!({ "ready": ready, "status": word });
        return (status, Json(body)).into_response();
    }
    let paused = state.store.paused().await.ok().flatten();
    let delivery = match idle {
        None => serde_json::json!({ "status": "not configured" }),
        Some((idle, wedged)) => {
            let status = if wedged {
                "wedged"
            } else if paused.is_some() {
                "paused"
            } else {
                "running"
            };
            serde_json::json!({
                "status": status,
                "since_progress_ms": idle.as_millis() as u64,
                "paused_reason": paused.as_ref().map(|p| p.reason.clone()),
            })
        }
    };
    // An open breaker is the relay protecting the upstream while it keeps accepting mail:
    // like a pause it is shown, not made a reason to be taken out of rotation (another
    // instance would meet the same upstream).
    let breaker = state
        .wedged_after
        .map(|_| state.metrics.breaker_now().as_str());
    let body = serde_json::json!({
        "ready": ready,
        "status": word,
        "shutting_down": stopping,
        "store": if writable { "writable" } else { "not writable" },
        "delivery": delivery,
        "breaker": breaker.unwrap_or("not configured"),
    });
    (status, Json(body)).into_response()
}

/// How long a scrape waits for the store's counts: a store that hangs (a lock held from
/// outside) must not hang the scrape that would show it, so past this the store-derived
/// gauges keep their last values and `idemrelay_store_writable` says the rest.
const STATS_WAIT: Duration = Duration::from_secs(2);

pub(crate) async fn metrics(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let stats = match tokio::time::timeout(STATS_WAIT, state.stats.get(state.store.as_ref())).await
    {
        Ok(Ok(stats)) => Some(stats),
        Ok(Err(err)) => {
            tracing::warn!(target: "idemrelay::admin", error = %err, "metrics: cannot read queue statistics; the store gauges keep their last values");
            None
        }
        Err(_) => {
            tracing::warn!(target: "idemrelay::admin", "metrics: queue statistics not read within {STATS_WAIT:?}; the store gauges keep their last values");
            None
        }
    };
    let paused = match tokio::time::timeout(STATS_WAIT, state.store.paused()).await {
        Ok(Ok(Some(pause))) if pause.probe => Some(PauseReason::Account),
        Ok(Ok(Some(_))) => Some(PauseReason::Operator),
        _ => None,
    };
    let snapshot = Snapshot {
        stats,
        now_ms: crate::store::now_ms(),
        connections_open: state.limits.open_connections(),
        paused,
        store_writable: state.store_health.is_writable(),
    };
    let text = state.metrics.render(&snapshot, format);
    ([(header::CONTENT_TYPE, format.content_type())], text).into_response()
}
