//! What keeps other web pages out of the admin listener. A browser will send requests to
//! loopback for any page it shows; the relay must tell those from the operator's own.
//!
//! - **Host**, on every request but the health checks: an IP address, `localhost`, or a name
//!   the relay was told it serves (`hostname`, `admin_hosts`). A DNS rebinding page reaches the
//!   relay under the attacker's own name, which the browser sends as Host, and would otherwise
//!   read the answers as its own origin's.
//! - **Sec-Fetch-Site and Origin**, on every request that may change something (any method
//!   but GET, HEAD and OPTIONS): a browser says whether the page was the relay's own
//!   (`Sec-Fetch-Site: same-origin`, or `none` when the user typed it); one that does not say
//!   so names the page's origin, which must be the Host it was sent to or a configured name.
//!   Requests with neither (curl, the CLI) pass: only browsers send them, and a browser always
//!   does on a cross-site POST.
//! - **A token or an explicit opt-in** for operator actions (`changes_allowed`), and the API's
//!   parameters in a JSON body (`api::Action`), which a page cannot post to another origin
//!   without a CORS preflight the relay never answers.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::state::{error, AdminState};

/// What the operator is told when an action is refused for want of a token.
pub(crate) const CHANGES_NEED_TOKEN: &str = "operator actions need the admin token, and none is configured: set admin_token (or IDEMRELAY_ADMIN_TOKEN) and send it as Authorization: Bearer, or set admin_allow_changes_without_token = true (IDEMRELAY_ADMIN_ALLOW_CHANGES_WITHOUT_TOKEN=true) to let anyone who can connect act";

/// Whether operator actions may run at all: with a token (checked before the handler), or
/// without one only when the operator said so.
pub(crate) fn changes_allowed(state: &AdminState) -> bool {
    state.token.is_some() || state.allow_changes_without_token
}

/// The name part of a Host value (`name`, `name:port`, `1.2.3.4:port`, `[::1]:port`),
/// lowercase and without a trailing dot; None when it is no host at all.
fn host_name(value: &str) -> Option<String> {
    let value = value.trim();
    let name = if let Some(rest) = value.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        // Without brackets, so that it parses as an address in `serves`.
        return inside
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|_| inside.to_ascii_lowercase());
    } else {
        match value.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return None,
            None => value,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    (!name.is_empty() && plain).then_some(name)
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a Host name is one the relay serves. Any IP address is: rebinding always comes
/// with a name, and a relay bound to 0.0.0.0 is reached by whichever address routes to it.
fn serves(state: &AdminState, name: &str) -> bool {
    name.parse::<IpAddr>().is_ok() || name == "localhost" || state.hosts.iter().any(|h| h == name)
}

/// The request's Host (the header; HTTP/1.1 requires it), or the authority of an
/// absolute-form target.
fn host_of(request: &Request) -> Option<String> {
    match request.headers().get(header::HOST) {
        Some(value) => value.to_str().ok().map(str::to_string),
        None => request.uri().authority().map(|a| a.as_str().to_string()),
    }
}

/// Whether a state-changing request came from a page of another origin, by what the browser
/// says: `Sec-Fetch-Site` other than same-origin (or none, typed by the user), or an Origin
/// that is not the Host the request was sent to nor a configured name.
fn from_another_origin(state: &AdminState, headers: &HeaderMap, host: &str) -> bool {
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    // A browser that sends Sec-Fetch-Site knows best (it also covers a page whose referrer
    // policy turned its Origin into "null"); Origin is the check for those that do not.
    match site.as_deref() {
        Some("same-origin" | "none") => return false,
        Some(_) => return true,
        None => {}
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    // "null" (a sandboxed frame, a file://, a redirect across origins) and anything that is
    // not scheme://host[:port] are foreign.
    let Some(authority) = origin.to_str().ok().and_then(|o| {
        o.strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"))
    }) else {
        return true;
    };
    if authority.eq_ignore_ascii_case(host.trim()) {
        return false;
    }
    // A reverse proxy may rewrite Host; the names the operator configured are the relay's.
    !host_name(authority).is_some_and(|name| state.hosts.contains(&name))
}

/// The middleware: refuses a foreign Host (421) on every request it guards, and a cross-origin
/// browser request (403) on every method that may change something.
pub(crate) async fn same_origin(
    State(state): State<Arc<AdminState>>,
    request: Request,
    next: Next,
) -> Response {
    let host = host_of(&request).unwrap_or_default();
    if !host_name(&host).is_some_and(|name| serves(&state, &name)) {
        if state.log_budget.allow() {
            tracing::warn!(
                target: "idemrelay::admin",
                host = %host,
                path = %request.uri().path(),
                "admin listener refused a request for a Host it does not serve (DNS rebinding?)"
            );
        }
        return error(
            StatusCode::MISDIRECTED_REQUEST,
            "unknown_host",
            "this listener does not serve that Host: use its address, localhost, or a name listed in admin_hosts",
        );
    }
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if !safe && from_another_origin(&state, request.headers(), &host) {
        if state.log_budget.allow() {
            let said = |name: &str| {
                request
                    .headers()
                    .get(name)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .unwrap_or_else(|| "-".into())
            };
            tracing::warn!(
                target: "idemrelay::admin",
                origin = %said("origin"),
                sec_fetch_site = %said("sec-fetch-site"),
                path = %request.uri().path(),
                "admin listener refused a state change from a page of another origin"
            );
        }
        return error(
            StatusCode::FORBIDDEN,
            "cross_origin",
            "refused: this request came from a page of another origin",
        );
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::host_name;

    #[test]
    fn host_names() {
        assert_eq!(host_name("127.0.0.1:8025").as_deref(), Some("127.0.0.1"));
        assert_eq!(host_name("[::1]:8025").as_deref(), Some("::1"));
        assert_eq!(host_name("[::1]").as_deref(), Some("::1"));
        assert_eq!(host_name("LocalHost.").as_deref(), Some("localhost"));
        assert_eq!(
            host_name("relay.internal").as_deref(),
            Some("relay.internal")
        );
        assert_eq!(host_name("evil.example:80:80"), None);
        assert_eq!(host_name("[::1]x"), None);
        assert_eq!(host_name(""), None);
        assert_eq!(host_name(":80"), None);
    }
}
