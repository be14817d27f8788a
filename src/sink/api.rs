//! The sink's HTTP API: what the in-process `SinkHandle` offers, for tests and demos that run
//! the sink as a separate process.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::faults::FaultRule;
use super::state::{ReceivedMessage, Shared, Transaction};
use super::Down;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/messages", get(messages))
        .route("/messages/{id}/raw", get(raw_message))
        .route("/transactions", get(transactions))
        .route("/webhooks", get(webhooks))
        .route("/stats", get(stats))
        .route("/counts", get(counts))
        .route("/faults", get(faults).post(set_faults).delete(clear_faults))
        .route("/reset", post(reset))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .with_state(shared)
}

/// The bytes go out as `body` only when they are UTF-8 (JSON strings cannot carry anything
/// else); `blake3` is always there and `/messages/{id}/raw` has the exact bytes.
fn body_fields(out: &mut Value, bytes: &[u8]) {
    out["size"] = json!(bytes.len());
    out["blake3"] = json!(blake3::hash(bytes).to_hex().to_string());
    if let Ok(text) = std::str::from_utf8(bytes) {
        out["body"] = json!(text);
    }
}

pub(crate) fn message_json(m: &ReceivedMessage) -> Value {
    let mut out = json!({
        "id": m.id,
        "key": m.key,
        "mail_from": m.mail_from,
        "rcpt_to": m.rcpt_to,
        "eightbitmime": m.eightbitmime,
        "smtputf8": m.smtputf8,
        "received_at": m.received_at_ms,
        "tls": m.tls,
        "auth_user": m.auth_user,
    });
    body_fields(&mut out, &m.bytes);
    out
}

pub(crate) fn transaction_json(t: &Transaction) -> Value {
    let mut out = json!({
        "seq": t.seq,
        "key": t.key,
        "mail_from": t.mail_from,
        "rcpt_to": t.rcpt_to,
        "eightbitmime": t.eightbitmime,
        "smtputf8": t.smtputf8,
        "outcome": t.outcome,
        "message_id": t.message_id,
        "reply": t.reply.as_deref().unwrap_or("none"),
        "fault": t.fault,
        "received_at": t.received_at_ms,
        "tls": t.tls,
        "auth_user": t.auth_user,
    });
    body_fields(&mut out, &t.bytes);
    out
}

fn bad_request(msg: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({ "error": msg.to_string() })),
    )
        .into_response()
}

#[derive(Deserialize)]
struct KeyFilter {
    key: Option<String>,
}

async fn messages(
    State(shared): State<Arc<Shared>>,
    Query(filter): Query<KeyFilter>,
) -> Json<Value> {
    let list: Vec<Value> = shared
        .messages()
        .iter()
        .filter(|m| filter.key.is_none() || m.key == filter.key)
        .map(message_json)
        .collect();
    Json(Value::Array(list))
}

async fn raw_message(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match shared.message(&id) {
        Some(m) => ([(header::CONTENT_TYPE, "message/rfc822")], m.bytes).into_response(),
        None => (StatusCode::NOT_FOUND, "no such message\n").into_response(),
    }
}

async fn transactions(
    State(shared): State<Arc<Shared>>,
    Query(filter): Query<KeyFilter>,
) -> Json<Value> {
    let list: Vec<Value> = shared
        .transactions()
        .iter()
        .filter(|t| filter.key.is_none() || t.key == filter.key)
        .map(transaction_json)
        .collect();
    Json(Value::Array(list))
}

#[derive(Deserialize)]
struct WebhookFilter {
    key: Option<String>,
    id: Option<String>,
}

/// Every post of an event batch, in the order the posts ended; `?key=` (the message's key)
/// and `?id=` (the sink's message id) narrow it.
async fn webhooks(
    State(shared): State<Arc<Shared>>,
    Query(filter): Query<WebhookFilter>,
) -> Json<Value> {
    let list: Vec<Value> = shared
        .webhook_attempts()
        .iter()
        .filter(|a| filter.key.is_none() || a.key == filter.key)
        .filter(|a| filter.id.as_ref().is_none_or(|id| *id == a.message_id))
        .map(|a| json!(a))
        .collect();
    Json(Value::Array(list))
}

async fn stats(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(json!(shared.stats()))
}

/// `/stats` without the per-key map: cheap enough to poll while the sink is under load.
async fn counts(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let (messages, transactions, connections) = shared.counts();
    Json(json!({
        "messages": messages,
        "transactions": transactions,
        "connections": connections,
    }))
}

async fn faults(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(json!(shared.faults()))
}

/// Rules in the JSON form, or in the CLI form as strings; both may be mixed in one array.
#[derive(Deserialize)]
#[serde(untagged)]
enum RuleInput {
    Cli(String),
    Json(Value),
}

fn parse_rules(body: &[u8]) -> Result<Vec<FaultRule>, String> {
    let inputs: Vec<RuleInput> =
        serde_json::from_slice(body).map_err(|e| format!("expected a JSON array of rules: {e}"))?;
    inputs
        .into_iter()
        .enumerate()
        .map(|(i, input)| {
            match input {
                RuleInput::Cli(text) => text.parse::<FaultRule>().map_err(|e| e.to_string()),
                RuleInput::Json(value) => {
                    serde_json::from_value::<FaultRule>(value).map_err(|e| e.to_string())
                }
            }
            .map_err(|e| format!("rule {i}: {e}"))
        })
        .collect()
}

async fn set_faults(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let rules = match parse_rules(&body) {
        Ok(rules) => rules,
        Err(e) => return bad_request(e),
    };
    match shared.set_faults(rules) {
        Ok(()) => Json(json!(shared.faults())).into_response(),
        Err(e) => bad_request(e),
    }
}

async fn clear_faults(State(shared): State<Arc<Shared>>) -> StatusCode {
    let _ = shared.set_faults(Vec::new());
    StatusCode::NO_CONTENT
}

async fn reset(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.clear();
    let _ = shared.set_faults(Vec::new());
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct PauseQuery {
    mode: Option<String>,
}

async fn pause(State(shared): State<Arc<Shared>>, Query(q): Query<PauseQuery>) -> Response {
    let down = match q.mode.as_deref().unwrap_or("refuse") {
        "refuse" => Down::Refuse,
        "greet421" | "421" => Down::Greet421,
        other => return bad_request(format!("unknown mode {other:?} (refuse, greet421)")),
    };
    match shared.pause(down).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn resume(State(shared): State<Arc<Shared>>) -> Response {
    match shared.resume().await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_may_come_in_either_form() {
        let rules = parse_rules(
            br#"["phase=dot,action=drop,times=1",
                {"phase":"rcpt","action":"reply","code":451,"text":"try later"}]"#,
        )
        .unwrap();
        assert_eq!(
            rules,
            vec![
                "phase=dot,action=drop,times=1".parse().unwrap(),
                "phase=rcpt,action=reply,code=451,text=try later"
                    .parse()
                    .unwrap(),
            ]
        );
        assert!(parse_rules(br#"{"phase":"dot","action":"drop"}"#).is_err());
        let err = parse_rules(br#"["phase=dot,action=drop", "phase=dot"]"#).unwrap_err();
        assert!(err.starts_with("rule 1:"), "{err}");
    }
}
