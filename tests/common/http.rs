//! A minimal HTTP/1.1 client for the admin API (the project has no HTTP client dependency,
//! and the tests want to see exactly what goes over the socket).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request on a fresh connection; `token` adds `Authorization: Bearer`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> HttpResponse {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    send(addr, method, path, &headers, Body::Bytes(b"")).await
}

/// An operator action as the CLI sends it: POST with a JSON body (`{}` for none) and, with
/// `token`, `Authorization: Bearer`.
pub async fn post_json(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> HttpResponse {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend(auth.iter().map(|a| ("Authorization", a.as_str())));
    send(addr, "POST", path, &headers, Body::Bytes(body.as_bytes())).await
}

/// A request body as it goes over the socket.
pub enum Body<'a> {
    /// With its Content-Length.
    Bytes(&'a [u8]),
    /// `Transfer-Encoding: chunked`, in chunks of this many bytes (no length declared).
    Chunked(&'a [u8], usize),
}

/// One request with `headers` and `body` on a fresh connection (`Host` is the address unless
/// `headers` has one).
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Body<'_>,
) -> HttpResponse {
    let mut stream = TcpStream::connect(addr).await.expect("connect to admin");
    // A `Host` among `headers` replaces the address (a rebinding attack names another host).
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let mut payload = Vec::new();
    match body {
        Body::Bytes(bytes) => {
            head.push_str(&format!("Content-Length: {}\r\n", bytes.len()));
            payload.extend_from_slice(bytes);
        }
        Body::Chunked(bytes, size) => {
            head.push_str("Transfer-Encoding: chunked\r\n");
            for chunk in bytes.chunks(size) {
                payload.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                payload.extend_from_slice(chunk);
                payload.extend_from_slice(b"\r\n");
            }
            payload.extend_from_slice(b"0\r\n\r\n");
        }
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("write");
    // A server that refuses early may close before taking the whole body.
    let _ = stream.write_all(&payload).await;
    let mut raw = Vec::new();
    let read = tokio::time::timeout(super::TIMEOUT, stream.read_to_end(&mut raw))
        .await
        .expect("the server answered in time");
    // A server that answered before reading the whole body may reset the connection after
    // its answer: what came before the reset counts.
    if let Err(err) = read {
        assert!(!raw.is_empty(), "read: {err}");
    }
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("header/body separator");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

pub async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> HttpResponse {
    request(addr, "GET", path, token).await
}

/// The value of the sample `series` (name with labels, as exposed) in a Prometheus text page.
pub fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
