//! The upstream-events listener (docs/concepts/webhooks.md): `POST /webhooks/{name}` per configured source.
//! A request is verified (`signature`), read as events (`events`) and received exactly once
//! by the store in one transaction; 200 only after that commit. Every refusal stores nothing
//! and is counted by reason.

pub(crate) mod events;
pub mod signature;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use tokio::net::TcpListener;

use crate::config::WebhookSource;
use crate::http_serve::{self, HttpLimits};
use crate::log_budget::LogBudget;
use crate::metrics::{Metrics, WebhookRefusal};
use crate::shutdown::Stop;
use crate::smtp::tls::TlsCerts;
use crate::store::webhook::log_resolution;
use crate::store::{Store, WebhookApplied, WebhookReceipt};
use signature::{Headers, Refusal};

/// The largest body taken (413 beyond it): a batch of a few thousand events.
pub(crate) const MAX_BODY: usize = 1024 * 1024;

/// The refusal of a request no configured secret signed (or naming no configured source).
const UNSIGNED: &str = "no webhook-signature entry matches a configured secret";

/// A client gets this long to send its body (408 after it).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// A configured source with its decoded keys.
pub(crate) struct Source {
    pub config: WebhookSource,
    keys: Vec<Vec<u8>>,
}

pub(crate) struct WebhookState {
    pub store: Arc<dyn Store>,
    pub sources: BTreeMap<String, Source>,
    pub metrics: Arc<Metrics>,
    /// Lines about requests refused before they were authenticated: bounded, since anyone
    /// who reaches the listener can cause them.
    pub log_budget: LogBudget,
}

impl WebhookState {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        sources: &BTreeMap<String, WebhookSource>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<WebhookState> {
        let sources = sources
            .iter()
            .map(|(name, config)| {
                let keys = config.keys()?;
                Ok((
                    name.clone(),
                    Source {
                        config: config.clone(),
                        keys,
                    },
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(WebhookState {
            store,
            sources,
            metrics,
            log_budget: LogBudget::new("webhook"),
        })
    }
}

pub(crate) fn router(state: Arc<WebhookState>) -> Router {
    Router::new()
        .route("/webhooks/{name}", post(receive))
        .fallback(|| async { refuse(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .with_state(state)
}

/// Serves until `stop` is given, then lets the requests in flight finish within `limits`'
/// shutdown grace (their commits decide their answers); idle and half-sent connections are
/// closed at once. With `tls`, every connection is TLS (HTTPS).
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<Arc<TlsCerts>>,
    state: Arc<WebhookState>,
    limits: HttpLimits,
    stop: Stop,
) {
    let app = router(state);
    let shutdown = async move { stop.stopped().await };
    http_serve::serve("webhooks", listener, tls, app, limits, shutdown).await;
}

fn refuse(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into(), "code": code });
    (status, Json(body)).into_response()
}

async fn receive(
    State(state): State<Arc<WebhookState>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let webhook_id = header_text(&parts.headers, "webhook-id")
        .unwrap_or("-")
        .to_string();
    // Values are escaped and cut by the log's formatter (`log_format`); `name` is whatever
    // the client put in the path.
    let log_refusal = |reason: WebhookRefusal, status: StatusCode, message: &str| {
        tracing::warn!(
            target: "idemrelay::webhook",
            source = %name,
            webhook_id = %webhook_id,
            status = status.as_u16(),
            reason = reason.as_str(),
            "webhook refused: {message}"
        );
    };
    // Before the request is known to come from a configured source: within the budget.
    let refused = |reason: WebhookRefusal, status: StatusCode, message: String| {
        state.metrics.webhook_refused(reason);
        if state.log_budget.allow() {
            log_refusal(reason, status, &message);
        }
        refuse(status, reason.as_str(), message)
    };
    // After it was verified: every one is logged.
    let refused_signed = |reason: WebhookRefusal, status: StatusCode, message: String| {
        state.metrics.webhook_refused(reason);
        log_refusal(reason, status, &message);
        refuse(status, reason.as_str(), message)
    };
    // An unknown name is checked like a known one against no key at all, so it gets the
    // answer a bad signature gets: the listener does not tell which names exist.
    let source = state.sources.get(&name);
    let body = match read_limited(&parts.headers, body).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            return refused(
                WebhookRefusal::TooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is over {MAX_BODY} bytes"),
            )
        }
        Err(BodyError::Timeout) => {
            return refused(
                WebhookRefusal::Malformed,
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {BODY_TIMEOUT:?}"),
            )
        }
        Err(BodyError::Broken(why)) => {
            return refused(
                WebhookRefusal::Malformed,
                StatusCode::BAD_REQUEST,
                format!("the body could not be read: {why}"),
            )
        }
    };
    let keys = source.map(|s| s.keys.clone()).unwrap_or_default();
    let text = |name: &str| header_text(&parts.headers, name).map(str::to_string);
    let (id, timestamp, sig) = (
        text("webhook-id"),
        text("webhook-timestamp"),
        text("webhook-signature"),
    );
    // An HMAC over up to 1 MiB per key: on a blocking thread, never on the ones serving SMTP.
    let checked = tokio::task::spawn_blocking(move || {
        let headers = Headers {
            id: id.as_deref(),
            timestamp: timestamp.as_deref(),
            signature: sig.as_deref(),
        };
        let verified = signature::verify(&keys, headers, &body, now_secs());
        (verified, body)
    })
    .await;
    let Ok((verified, body)) = checked else {
        return refused(
            WebhookRefusal::Malformed,
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request could not be checked".into(),
        );
    };
    let Some(source) = source else {
        // Counted and logged as what it is; answered as a bad signature.
        state.metrics.webhook_refused(WebhookRefusal::UnknownSource);
        if state.log_budget.allow() {
            tracing::warn!(
                target: "idemrelay::webhook",
                // Cut shorter than the formatter would: a name is never this long.
                source = %name.chars().take(64).collect::<String>(),
                webhook_id = %webhook_id,
                status = StatusCode::UNAUTHORIZED.as_u16(),
                reason = WebhookRefusal::UnknownSource.as_str(),
                "webhook refused: no such source is configured"
            );
        }
        return refuse(
            StatusCode::UNAUTHORIZED,
            WebhookRefusal::Signature.as_str(),
            UNSIGNED.to_string(),
        );
    };
    let verified = match verified {
        Ok(verified) => verified,
        Err(Refusal::Headers) => {
            return refused(
                WebhookRefusal::Malformed,
                StatusCode::BAD_REQUEST,
                "webhook-id and webhook-timestamp (integer Unix seconds) are required".into(),
            )
        }
        Err(Refusal::Signature) => {
            return refused(
                WebhookRefusal::Signature,
                StatusCode::UNAUTHORIZED,
                UNSIGNED.into(),
            )
        }
        Err(Refusal::Timestamp) => {
            return refused(
                WebhookRefusal::Timestamp,
                StatusCode::BAD_REQUEST,
                format!(
                    "webhook-timestamp is more than {} s from the relay's clock",
                    signature::TOLERANCE_SECS
                ),
            )
        }
    };
    let events = match events::parse(&body, &source.config, verified.timestamp) {
        Ok(events) => events,
        Err(malformed) => {
            return refused_signed(
                WebhookRefusal::Malformed,
                StatusCode::BAD_REQUEST,
                malformed.to_string(),
            )
        }
    };
    let receipt = WebhookReceipt {
        source: name.clone(),
        webhook_id: verified.id,
        events,
    };
    match state.store.apply_webhook(&receipt).await {
        Ok(WebhookApplied::Duplicate) => {
            state.metrics.webhook_duplicate();
            tracing::info!(
                target: "idemrelay::webhook",
                source = %name,
                webhook_id = %receipt.webhook_id,
                "webhook duplicate: received before, nothing changed"
            );
            Json(serde_json::json!({ "duplicate": true })).into_response()
        }
        Ok(WebhookApplied::Applied(outcome)) => {
            state.metrics.webhook_applied(&outcome);
            let resolved: Vec<&str> = outcome.resolved.iter().map(|r| r.id.as_str()).collect();
            tracing::info!(
                target: "idemrelay::webhook",
                source = %name,
                webhook_id = %receipt.webhook_id,
                events = outcome.events,
                matched = outcome.matched,
                unmatched = outcome.unmatched,
                stale = outcome.stale,
                bounced = outcome.bounced,
                resolved = %resolved.join(","),
                "webhook received"
            );
            for r in &outcome.resolved {
                log_resolution(&r.id, &r.evidence);
            }
            Json(serde_json::json!({
                "duplicate": false,
                "events": outcome.events,
                "matched": outcome.matched,
                "unmatched": outcome.unmatched,
                "stale": outcome.stale,
                "bounced": outcome.bounced,
                "resolved": resolved,
            }))
            .into_response()
        }
        Err(err) => {
            // Nothing committed: the sender retries the same id later.
            refused_signed(
                WebhookRefusal::Store,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store could not commit ({err}); retry later"),
            )
        }
    }
}

fn header_text<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

enum BodyError {
    TooLarge,
    Timeout,
    Broken(String),
}

/// Reads the body, never holding more than `MAX_BODY` bytes: a declared length over it is
/// refused before a byte is read, an undeclared one as soon as it passes the limit.
async fn read_limited(headers: &HeaderMap, mut body: Body) -> Result<Vec<u8>, BodyError> {
    let declared =
        header_text(headers, header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(BodyError::TooLarge);
    }
    let read = async {
        let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.map_err(|e| BodyError::Broken(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > MAX_BODY {
                    return Err(BodyError::TooLarge);
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf)
    };
    tokio::time::timeout(BODY_TIMEOUT, read)
        .await
        .unwrap_or(Err(BodyError::Timeout))
}

fn now_secs() -> i64 {
    crate::store::now_ms().div_euclid(1000)
}
