//! The admin API's client, for `idemrelay queue` (which prefers the running relay to the store
//! underneath it): one request per connection, JSON in and out, the API's JSON error turned
//! into the same `OpError` the direct path gives.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE, HOST, USER_AGENT};
use tokio::net::TcpStream;

use super::healthcheck::probe_addr;
use super::ops::{OpError, OpResult};
use super::wire::{INSTANCE_HEADER, OPERATOR_HEADER};

/// Answers larger than this are refused (a listing page is far smaller).
const MAX_ANSWER: usize = 64 * 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct AdminClient {
    addr: SocketAddr,
    token: Option<String>,
    /// The local user, sent as the person behind the token.
    operator: String,
    /// The relay's name from the last answer's `Idemrelay-Instance` header.
    instance: std::sync::Mutex<Option<String>>,
}

impl AdminClient {
    pub(crate) fn new(addr: SocketAddr, token: Option<String>, operator: String) -> Self {
        AdminClient {
            addr: probe_addr(addr),
            token,
            operator,
            instance: std::sync::Mutex::new(None),
        }
    }

    /// The name the relay gave in its last answer, if it gave one (a relay of an older
    /// version names none).
    pub(crate) fn instance(&self) -> Option<String> {
        self.instance.lock().ok().and_then(|i| i.clone())
    }

    pub(crate) fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) async fn get(&self, path: &str) -> OpResult {
        self.request("GET", path, None).await
    }

    pub(crate) async fn post(&self, path: &str, body: serde_json::Value) -> OpResult {
        self.request("POST", path, Some(body)).await
    }

    async fn request(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> OpResult {
        let what = format!("{method} {}{path}", self.base());
        let unreachable = |e: String| {
            OpError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "admin_unreachable",
                format!(
                    "the relay's admin API at {} is not reachable ({e}); is the relay running \
                     with this --admin address? To work on the store itself, add --direct",
                    self.base()
                ),
            )
        };
        let failed = |e: String| {
            OpError::new(
                StatusCode::BAD_GATEWAY,
                "admin_failed",
                format!("{what}: {e}"),
            )
        };
        let exchange = async {
            let stream = TcpStream::connect(self.addr)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Body>(
                hyper_util::rt::TokioIo::new(stream),
            )
            .await
            .map_err(|e| failed(e.to_string()))?;
            let connection = tokio::spawn(connection);
            let mut request = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header(HOST, self.addr.to_string())
                .header(USER_AGENT, "idemrelay-queue")
                .header(CONNECTION, "close");
            if let Some(token) = &self.token {
                let value = HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|e| failed(format!("admin token: {e}")))?;
                request = request.header(AUTHORIZATION, value);
            }
            if let Ok(person) = HeaderValue::from_str(&self.operator) {
                request = request.header(OPERATOR_HEADER, person);
            }
            let request = match body {
                Some(body) => request
                    .header(CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string())),
                None => request.body(Body::empty()),
            }
            .map_err(|e| failed(e.to_string()))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| failed(e.to_string()))?;
            let status = response.status();
            if let Some(name) = response
                .headers()
                .get(INSTANCE_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                if let Ok(mut instance) = self.instance.lock() {
                    *instance = Some(name.to_string());
                }
            }
            let bytes = axum::body::to_bytes(Body::new(response.into_body()), MAX_ANSWER)
                .await
                .map_err(|e| failed(e.to_string()))?;
            connection.abort();
            Ok::<_, OpError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| failed(format!("no answer within {}s", TIMEOUT.as_secs())))??;
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| {
            failed(format!(
                "answered {status} without JSON: {}",
                String::from_utf8_lossy(&bytes)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))
        })?;
        if status.is_success() {
            return Ok(value);
        }
        let message = value["error"]
            .as_str()
            .map_or_else(|| value.to_string(), str::to_string);
        let code = match value["code"].as_str() {
            Some("unauthorized") => "unauthorized",
            Some("not_found") => "not_found",
            Some("confirmation_required") => "confirmation_required",
            _ => "admin_refused",
        };
        let message = if code == "unauthorized" {
            format!("{message} (set IDEMRELAY_ADMIN_TOKEN to the relay's admin token)")
        } else {
            message
        };
        Err(OpError::new(status, code, message))
    }
}
