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
use super::life::Down;
use super::search::{query_params, Content, MessageFilter};
use super::state::{ReceivedMessage, Shared, Transaction};
use idemrelay_model::timestamp::time_ms;

/// The JSON API. Other views of the same state (an HTML page, say) are routers of their own,
/// merged next to this one in `Sink::start`, which also sets the fallback (`not_found`).
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/messages", get(messages))
        .route("/messages/{id}", get(message))
        .route("/messages/{id}/raw", get(raw_message))
        .route("/transactions", get(transactions))
        .route("/webhooks", get(webhooks))
        .route("/stats", get(stats))
        .route("/counts", get(counts))
        .route(
            "/faults",
            get(faults)
                .post(add_faults)
                .put(replace_faults)
                .delete(clear_faults),
        )
        .route("/reset", post(reset))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .with_state(shared)
}

/// RFC 3339 (UTC, milliseconds) under `name`, and the Unix milliseconds under `name_ms` for
/// arithmetic.
fn time_fields(out: &mut Value, name: &str, ms: u64) {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    out[name] = json!(time_ms(ms));
    out[format!("{name}_ms")] = json!(ms);
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

/// A message in a list: everything but its bytes, which are at `raw`.
pub(crate) fn message_summary_json(m: &ReceivedMessage) -> Value {
    let mut out = json!({
        "id": m.id,
        "key": m.key,
        "mail_from": m.mail_from,
        "rcpt_to": m.rcpt_to,
        "subject": Content::of(&m.bytes).subject,
        "eightbitmime": m.eightbitmime,
        "smtputf8": m.smtputf8,
        "tls": m.tls,
        "auth_user": m.auth_user,
        "mail_command": m.mail_command,
        "rcpt_commands": m.rcpt_commands,
        "size": m.bytes.len(),
        "blake3": m.blake3,
        "raw": format!("/messages/{}/raw", m.id),
    });
    time_fields(&mut out, "received_at", m.received_at_ms);
    out
}

/// One message: the summary plus its bytes as `body` (when UTF-8).
pub(crate) fn message_json(m: &ReceivedMessage) -> Value {
    let mut out = message_summary_json(m);
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
        "tls": t.tls,
        "auth_user": t.auth_user,
        "mail_command": t.mail_command,
        "rcpt_commands": t.rcpt_commands,
    });
    time_fields(&mut out, "received_at", t.received_at_ms);
    body_fields(&mut out, &t.bytes);
    out
}

/// An error as every endpoint gives it: `{"error": "..."}` with the status.
fn error(status: StatusCode, msg: impl std::fmt::Display) -> Response {
    (status, Json(json!({ "error": msg.to_string() }))).into_response()
}

fn bad_request(msg: impl std::fmt::Display) -> Response {
    error(StatusCode::BAD_REQUEST, msg)
}

/// Any path no router has: a JSON 404 too.
pub(crate) async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such endpoint")
}

/// Accepted messages without their bytes; `?key=`, `?rcpt=`, `?text=` narrow the list.
async fn messages(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let filter = match MessageFilter::from_query(query) {
        Ok(filter) => filter,
        Err(e) => return bad_request(e),
    };
    let list: Vec<Value> = shared
        .messages()
        .iter()
        .filter(|m| filter.matches(m))
        .map(message_summary_json)
        .collect();
    Json(Value::Array(list)).into_response()
}

fn no_message(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, format!("no message with id {id:?}"))
}

async fn message(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match shared.message(&id) {
        Some(m) => Json(message_json(&m)).into_response(),
        None => no_message(&id),
    }
}

async fn raw_message(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match shared.message(&id) {
        Some(m) => ([(header::CONTENT_TYPE, "message/rfc822")], m.bytes).into_response(),
        None => no_message(&id),
    }
}

async fn transactions(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let key = match query_params(query, &["key"]) {
        Ok(mut params) => params.remove("key"),
        Err(e) => return bad_request(e),
    };
    let list: Vec<Value> = shared
        .transactions()
        .iter()
        .filter(|t| key.is_none() || t.key == key)
        .map(transaction_json)
        .collect();
    Json(Value::Array(list)).into_response()
}

/// Every post of an event batch, in the order the posts ended; `?key=` (the message's key)
/// and `?id=` (the sink's message id) narrow it.
async fn webhooks(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let (key, id) = match query_params(query, &["key", "id"]) {
        Ok(mut params) => (params.remove("key"), params.remove("id")),
        Err(e) => return bad_request(e),
    };
    let list: Vec<Value> = shared
        .webhook_attempts()
        .iter()
        .filter(|a| key.is_none() || a.key == key)
        .filter(|a| id.as_ref().is_none_or(|id| *id == a.message_id))
        .map(|a| {
            let mut out = json!(a);
            time_fields(&mut out, "sent_at", a.sent_at);
            out
        })
        .collect();
    Json(Value::Array(list)).into_response()
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

/// `POST /faults`: the rules go after the active ones.
async fn add_faults(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let rules = match parse_rules(&body) {
        Ok(rules) => rules,
        Err(e) => return bad_request(e),
    };
    match shared.add_faults(rules) {
        Ok(()) => Json(json!(shared.faults())).into_response(),
        Err(e) => bad_request(e),
    }
}

/// `PUT /faults`: the rules replace the active ones (fire counts start over).
async fn replace_faults(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
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

/// Forgets everything the sink saw, removes the rules and empties the maildir.
async fn reset(State(shared): State<Arc<Shared>>) -> Response {
    shared.clear();
    let _ = shared.set_faults(Vec::new());
    let maildir = shared.clone();
    match tokio::task::spawn_blocking(move || maildir.clear_maildir()).await {
        Ok(Ok(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the maildir could not be emptied: {e}"),
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
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
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

async fn resume(State(shared): State<Arc<Shared>>) -> Response {
    match shared.resume().await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
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
