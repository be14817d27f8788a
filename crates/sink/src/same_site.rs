//! The sink's HTTP API answers only its own pages and local tools. It has no authentication
//! (it is a test tool), so what a browser on the same machine may do to it is limited here:
//! a page of another site could otherwise reset the sink or add fault rules with a form or a
//! `no-cors` fetch, or read it through DNS rebinding (an attacker's name that resolves to
//! 127.0.0.1). Browsers say where a request comes from (`Origin`, `Sec-Fetch-Site`); curl and
//! test clients send neither, and pass.

use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Refuses a request from another site, or one that names a host the sink cannot be (403).
pub(crate) async fn only(request: Request, next: Next) -> Response {
    match refusal(request.headers()) {
        None => next.run(request).await,
        Some(why) => (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({ "error": why })),
        )
            .into_response(),
    }
}

fn text<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Why a request is refused, if it is.
fn refusal(headers: &HeaderMap) -> Option<&'static str> {
    let host = text(headers, header::HOST.as_str())?;
    if !local_host(host) {
        return Some("the Host names neither an address nor a local name (DNS rebinding?)");
    }
    if let Some(site) = text(headers, "sec-fetch-site") {
        if !matches!(site, "same-origin" | "none") {
            return Some("requests from other sites are refused");
        }
    }
    if let Some(origin) = text(headers, header::ORIGIN.as_str()) {
        let authority = origin.split_once("://").map_or("", |(_, rest)| rest);
        if !authority.eq_ignore_ascii_case(host) {
            return Some("requests from other origins are refused");
        }
    }
    None
}

/// An IP literal, `localhost`, or a name of one label (a container's service name): never a
/// name in somebody's DNS zone, which is what a rebinding attack needs.
fn local_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_ok()
        || bare.eq_ignore_ascii_case("localhost")
        || (!bare.is_empty() && !bare.contains('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, value.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_local_tools_and_the_sinks_own_pages_pass() {
        let ok = [
            headers(&[("host", "127.0.0.1:8025")]),
            headers(&[("host", "[::1]:8025")]),
            headers(&[("host", "localhost:8025"), ("sec-fetch-site", "none")]),
            headers(&[("host", "sink:8025")]),
            headers(&[
                ("host", "127.0.0.1:8025"),
                ("origin", "http://127.0.0.1:8025"),
                ("sec-fetch-site", "same-origin"),
            ]),
        ];
        for h in &ok {
            assert_eq!(refusal(h), None, "{h:?}");
        }
        let refused = [
            headers(&[("host", "rebind.attacker.example:8025")]),
            headers(&[("host", "127.0.0.1:8025"), ("sec-fetch-site", "cross-site")]),
            headers(&[("host", "127.0.0.1:8025"), ("sec-fetch-site", "same-site")]),
            headers(&[
                ("host", "127.0.0.1:8025"),
                ("origin", "http://evil.example"),
            ]),
            headers(&[("host", "127.0.0.1:8025"), ("origin", "null")]),
        ];
        for h in &refused {
            assert!(refusal(h).is_some(), "{h:?}");
        }
    }
}
