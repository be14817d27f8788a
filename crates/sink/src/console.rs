//! `/ui` on the sink's API listener: what the sink received, for a person at a browser, like
//! Mailpit's inbox: messages with their subjects, per-key counts, a message's text and HTML
//! parts and raw source, every transaction with the fault that fired, and the fault rules.
//! Read-only; the JSON API changes things.
//!
//! A message's HTML is whatever a client sent: it is shown only in an `<iframe sandbox>`
//! (an opaque origin, no scripts, no forms) through `srcdoc`, under this page's CSP (which
//! loads nothing from anywhere, so no remote image or tracking pixel either); it never runs
//! in the sink's origin, where the JSON API that changes fault rules lives.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::search::{Content, MessageFilter, Rendered};
use super::state::{DotDecision, Shared};
use idemrelay_model::timestamp::time_ms;

/// Newest rows shown per table; the JSON API has them all.
const SHOWN: usize = 200;

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{background:#3a2f4f;color:#fff;padding:.5em 1em;display:flex;gap:1.5em}
header a{color:#fff}
main{padding:1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f1eefa}
td.n{text-align:right}
.note{color:#666}
pre,code{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}
pre.raw,pre.text{background:#f7f7f7;border:1px solid #ddd;padding:.75em}
pre.text{white-space:pre-wrap;word-break:normal}
td.id,td.id code{white-space:nowrap;word-break:normal}
td.clip{max-width:28em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
iframe.html{width:100%;max-width:60em;height:24em;border:1px solid #ddd;background:#fff}
";

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/ui", get(inbox))
        .route("/ui/messages/{id}", get(message))
        .with_state(shared)
}

fn layout(title: &str, body: Markup) -> Response {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · idemrelay sink" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header { strong { "idemrelay sink" } a href="/ui" { "Inbox" } a href="/faults" { "Faults (JSON)" } a href="/stats" { "Stats (JSON)" } }
                main { h1 { (title) } (body) }
            }
        }
    };
    (
        [(
            axum::http::header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
        )],
        page,
    )
        .into_response()
}

fn message_href(id: &str) -> String {
    format!(
        "/ui/messages/{}",
        url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
    )
}

fn opt(value: Option<&str>) -> Markup {
    match value {
        Some(v) => html! { code { (v) } },
        None => html! { span.note { "—" } },
    }
}

fn outcome(o: DotDecision) -> &'static str {
    match o {
        DotDecision::Accepted => "accepted",
        DotDecision::Replayed => "replayed",
        DotDecision::KeyReuse => "key reuse (E01005)",
        DotDecision::InProgress => "in progress (E01004)",
        DotDecision::InvalidKey => "invalid key (E01001)",
        DotDecision::Rejected => "rejected",
        DotDecision::Faulted => "faulted",
    }
}

fn at(ms: u64) -> String {
    time_ms(ms as i64)
}

/// The search form's fields, as given (empty ones mean "any").
fn field<'a>(pairs: &'a [(String, String)], name: &str) -> &'a str {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}

/// `/ui[?key=K][&rcpt=R][&text=T]`: the filters of `GET /messages`, read by the same code.
async fn inbox(
    State(shared): State<Arc<Shared>>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Response {
    let pairs: Vec<(String, String)> = pairs.into_iter().filter(|(_, v)| !v.is_empty()).collect();
    let filter = match MessageFilter::from_query(pairs.clone()) {
        Ok(filter) => filter,
        Err(e) => {
            let mut response = layout("Bad search", html! { p { (e) } });
            *response.status_mut() = StatusCode::BAD_REQUEST;
            return response;
        }
    };
    let mut stats = shared.stats();
    let messages: Vec<_> = shared
        .messages()
        .into_iter()
        .filter(|m| filter.matches(m))
        .collect();
    let mut transactions = shared.transactions();
    // A filter narrows every table: the per-key counts to the keys of the messages and
    // transactions it finds, the transactions to those it matches.
    let filtered = !filter.is_empty();
    if filtered {
        transactions.retain(|t| filter.matches_parts(t.key.as_deref(), &t.rcpt_to, &t.bytes));
        let keys: std::collections::BTreeSet<&str> = messages
            .iter()
            .filter_map(|m| m.key.as_deref())
            .chain(transactions.iter().filter_map(|t| t.key.as_deref()))
            .collect();
        stats.keys.retain(|k, _| keys.contains(k.as_str()));
    }
    let faults = shared.faults();
    let body = html! {
        p #totals {
            (stats.messages) " message(s), " (stats.transactions) " transaction(s), "
            (stats.connections) " connection(s)."
        }
        h2 { "Messages" }
        form method="get" action="/ui" #search {
            label { "Key " input type="text" name="key" value=(field(&pairs, "key")) placeholder="exact"; } " "
            label { "Recipient " input type="text" name="rcpt" value=(field(&pairs, "rcpt")) placeholder="contains"; } " "
            label { "Text " input type="text" name="text" value=(field(&pairs, "text")) placeholder="subject or body"; } " "
            button type="submit" { "Filter" }
        }
        p.note { (messages.len()) " message(s)" @if messages.len() > SHOWN { ", the newest " (SHOWN) " shown" } "." }
        table #messages {
            tr { th { "Id" } th { "Subject" } th { "Key" } th { "From" } th { "To" } th { "Size" } th { "Received" } th { "TLS" } th { "AUTH" } }
            @for m in messages.iter().rev().take(SHOWN) {
                @let subject = Content::of(&m.bytes).subject;
                tr {
                    td.id { a href=(message_href(&m.id)) { code { (m.id) } } }
                    @match &subject {
                        Some(s) => { td.clip.subject title=(s) { a href=(message_href(&m.id)) { (s) } } }
                        None => { td.subject { span.note { "(no subject)" } } }
                    }
                    td { (opt(m.key.as_deref())) }
                    td { code { (m.mail_from) } }
                    td { @for r in &m.rcpt_to { code { (r) } br; } }
                    td.n { (m.bytes.len()) }
                    td { (at(m.received_at_ms)) }
                    td { (if m.tls { "yes" } else { "no" }) }
                    td { (opt(m.auth_user.as_deref())) }
                }
            }
        }
        h2 { "Per key" }
        @if filtered { p.note #keys-filtered { "The keys of the messages and transactions the filter finds." } }
        table #keys {
            tr { th { "Key" } th { "Accepted" } th { "Replayed" } th { "Transactions" } th { "E01005" } th { "E01004" } }
            @for (key, k) in &stats.keys {
                tr {
                    td { code { (key) } }
                    td.n { (k.accepted) } td.n { (k.replayed) } td.n { (k.transactions) }
                    td.n { (k.conflicts) } td.n { (k.in_progress) }
                }
            }
        }
        h2 { "Transactions" }
        @if filtered { p.note { (transactions.len()) " transaction(s) match the filter." } }
        table #transactions {
            tr { th { "#" } th { "Key" } th { "Outcome" } th { "Reply" } th { "Fault that fired" } th { "Message" } th { "Received" } }
            @for t in transactions.iter().rev().take(SHOWN) {
                tr {
                    td.n { (t.seq) }
                    td { (opt(t.key.as_deref())) }
                    td { (outcome(t.outcome)) }
                    td { @match &t.reply { Some(r) => code { (r) }, None => span.note { "none (connection closed)" } } }
                    td { (opt(t.fault.as_deref())) }
                    td { @if let Some(id) = &t.message_id { a href=(message_href(id)) { code { (id) } } } }
                    td { (at(t.received_at_ms)) }
                }
            }
        }
        h2 { "Fault rules" }
        @if faults.is_empty() { p.note #no-faults { "No fault rules: every transaction is answered normally." } } @else {
            table #faults {
                tr { th { "Rule" } th { "Fired" } }
                @for f in &faults { tr { td { code { (f.rule.to_string()) } } td.n { (f.fired) } } }
            }
        }
    };
    layout("Inbox", body)
}

async fn message(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let Some(m) = shared.message(&id) else {
        let body = html! { p { "No message with id " code { (id) } "." } };
        let mut response = layout("No such message", body);
        *response.status_mut() = StatusCode::NOT_FOUND;
        return response;
    };
    let raw_href = format!(
        "/messages/{}/raw",
        url::form_urlencoded::byte_serialize(m.id.as_bytes()).collect::<String>()
    );
    let content = Content::of(&m.bytes);
    let rendered = Rendered::of(&m.bytes);
    let body = html! {
        table #envelope {
            tr { th { "Id" } td { code { (m.id) } } }
            tr { th { "Subject" } td #subject { (content.subject.as_deref().unwrap_or("(no subject)")) } }
            tr { th { "Key" } td { (opt(m.key.as_deref())) } }
            tr { th { "MAIL FROM" } td { code { (m.mail_from) } } }
            tr { th { "RCPT TO" } td { @for r in &m.rcpt_to { code { (r) } br; } } }
            tr { th { "Received" } td { (at(m.received_at_ms)) } }
            tr { th { "Size" } td { (m.bytes.len()) " bytes, BLAKE3 " code { (blake3::hash(&m.bytes).to_hex().to_string()) } } }
            tr { th { "8BITMIME / SMTPUTF8" } td { (m.eightbitmime) " / " (m.smtputf8) } }
            tr { th { "Commands" } td { code { (m.mail_command) } br; @for r in &m.rcpt_commands { code { (r) } br; } } }
        }
        @for (i, text) in rendered.text.iter().enumerate() {
            h2 { "Text" @if rendered.text.len() > 1 { " (part " (i + 1) ")" } }
            pre.text.text-part { (text) }
        }
        @for (i, part) in rendered.html.iter().enumerate() {
            h2 { "HTML" @if rendered.html.len() > 1 { " (part " (i + 1) ")" } }
            p.note { "Shown sandboxed: no scripts run and nothing is loaded from elsewhere (remote images neither)." }
            // `sandbox` with no permission: an opaque origin, no script, no form, no popup.
            iframe.html.html-part sandbox="" referrerpolicy="no-referrer" title="HTML part" srcdoc=(part) {}
        }
        @if rendered.text.is_empty() && rendered.html.is_empty() { p.note #no-body { "No text or HTML body part." } }
        h2 { "Raw source" }
        p { a href=(raw_href) { "Download (message/rfc822)" } }
        pre.raw #raw { (String::from_utf8_lossy(&m.bytes)) }
    };
    layout(&format!("Message {}", m.id), body)
}
