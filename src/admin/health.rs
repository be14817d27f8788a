//! `/healthz` (the process is up), `/readyz` (it can take and move mail) and `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{error, AdminState};

pub async fn healthz(State(state): State<Arc<AdminState>>) -> Response {
    if *state.stopping.borrow() {
        let body = serde_json::json!({ "status": "shutting down" });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

pub async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    let stopping = *state.stopping.borrow();
    let writable = state.intake.check_store().await;
    let paused = state.store.paused().await.ok().flatten();
    let delivery = match state.wedged_after {
        None => serde_json::json!({ "status": "not configured" }),
        Some(limit) => {
            let idle = state
                .metrics
                .since_delivery_heartbeat()
                .unwrap_or_else(|| state.started.elapsed());
            let status = if idle > limit {
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
    // A pause is the relay doing its job (an account-level refusal, or an operator): it
    // still accepts mail, so it stays ready; a wedge or an unwritable store does not.
    let ready = !stopping && writable && delivery["status"] != "wedged";
    let body = serde_json::json!({
        "ready": ready,
        "shutting_down": stopping,
        "store": if writable { "writable" } else { "not writable" },
        "delivery": delivery,
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

pub async fn metrics(State(state): State<Arc<AdminState>>) -> Response {
    let stats = match state.store.queue_stats().await {
        Ok(stats) => stats,
        Err(err) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                format!("cannot read queue statistics: {err}"),
            )
        }
    };
    let paused = matches!(state.store.paused().await, Ok(Some(_)));
    let text = state.metrics.render(
        &stats,
        crate::store::now_ms(),
        state.limits.open_connections(),
        paused,
    );
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
