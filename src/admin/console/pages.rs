//! The console's HTML, one function per page, from data already read. maud escapes every
//! interpolated value, so keys, addresses and header fields (all user input) cannot add markup.

use std::collections::BTreeMap;

use maud::{html, Markup, DOCTYPE};

use crate::admin::view::{recipient_status, time_ms};
use crate::admin::waiting::Waiting;
use crate::admin::wire::ListQuery;
use crate::delivery::breaker::BreakerState;
use crate::store::{
    ActionRow, AttemptRow, EventRow, MessageSummary, Pause, ProcessRow, QueueStats, RelayHealth,
    State, StateFilter, StoredMessage,
};

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{background:#24313f;color:#fff;padding:.5em 1em;display:flex;gap:1.5em;align-items:center}
header a{color:#fff}header form{margin-left:auto}
main{padding:1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#eef}
td.n{text-align:right}
.state{font-weight:bold}
.queued{color:#06c}.delivered{color:#080}.failed,.rejected{color:#b00}.unresolved{color:#c60}.cancelled{color:#777}
.warn{background:#fff3cd;border:1px solid #e0b000;padding:.75em;max-width:50em}
.note{color:#666}
pre,code{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}
form.inline{display:inline}
label{margin-right:1em}
table.list{font-size:13px}
td.id,td.id code{white-space:nowrap;word-break:normal}
.clip{max-width:24em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
td.clip.key{max-width:12em}td.clip.addr{max-width:16em}
.clip code{white-space:nowrap;word-break:normal}
td.reply .clip{max-width:34em}div.waiting{font-size:92%}
#last-error-reply{word-break:normal}
.refresh{float:right;font-size:90%;color:#666}
.bad{background:#fde8e8;border:1px solid #d33;padding:.75em;max-width:60em}
.ok{color:#080}
";

/// One link in the header bar: (path, label).
const NAV: [(&str, &str); 3] = [
    ("/console", "Overview"),
    ("/console/search", "Search"),
    ("/console/unresolved", "Unresolved"),
];

/// How often a page that shows the queue's state reloads itself while auto-refresh is on.
pub(crate) const REFRESH_SECONDS: u32 = 15;

/// Auto-refresh of a page that shows the queue's state: a `<meta http-equiv="refresh">`
/// (no script: the console's CSP allows none), stopped by `refresh=off` in the query.
pub(crate) struct AutoRefresh {
    pub on: bool,
    /// The page's path and query without `refresh` (where "turn it on" leads).
    pub here: String,
}

impl AutoRefresh {
    fn off_href(&self) -> String {
        let sep = if self.here.contains('?') { '&' } else { '?' };
        format!("{}{sep}refresh=off", self.here)
    }
}

pub(crate) fn layout(title: &str, csrf: Option<&str>, body: Markup) -> Markup {
    layout_with(title, csrf, None, body)
}

pub(crate) fn layout_with(
    title: &str,
    csrf: Option<&str>,
    refresh: Option<&AutoRefresh>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if refresh.is_some_and(|r| r.on) {
                    meta http-equiv="refresh" content=(REFRESH_SECONDS);
                }
                title { (title) " · idemrelay console" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "idemrelay" }
                    @for (href, label) in NAV {
                        a href=(href) { (label) }
                    }
                    @if let Some(csrf) = csrf {
                        form.inline method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main {
                    @if let Some(r) = refresh {
                        p.refresh #auto-refresh {
                            @if r.on {
                                "Refreshes every " (REFRESH_SECONDS) " s · "
                                a #refresh-off href=(r.off_href()) { "Stop auto-refresh" }
                            } @else {
                                "Auto-refresh is off · "
                                a #refresh-on href=(r.here) { "Refresh every " (REFRESH_SECONDS) " s" }
                            }
                        }
                    }
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// A path segment or query value, percent-encoded.
pub(crate) fn enc(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

pub(crate) fn message_href(id: &str) -> String {
    format!("/console/messages/{}", enc(id))
}

/// The search page for one state filter's name (`deferred` included).
pub(crate) fn search_href_filter(state: &str) -> String {
    format!("/console/search?state={}", enc(state))
}

pub(crate) fn search_href(state: Option<State>, scope: Option<&str>) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    if let Some(state) = state {
        query.append_pair("state", state.as_str());
    }
    if let Some(scope) = scope {
        query.append_pair("scope", scope);
    }
    format!("/console/search?{}", query.finish())
}

fn state_badge(state: State) -> Markup {
    html! { span class={"state " (state.as_str())} { (state.as_str()) } }
}

fn opt(value: Option<&str>) -> Markup {
    match value {
        Some(v) => html! { (v) },
        None => html! { span.note { "—" } },
    }
}

pub(crate) fn login(error: Option<&str>) -> Markup {
    layout(
        "Log in",
        None,
        html! {
            @if let Some(error) = error { p.warn { (error) } }
            form method="post" action="/console/login" {
                label { "Admin token " input type="password" name="token" autocomplete="current-password" autofocus; }
                label { "Your name " input type="text" name="name" maxlength="64" placeholder="recorded with your actions"; }
                button type="submit" { "Log in" }
            }
            p.note { "The admin API's bearer token (admin_token). The console keeps it only as a signed, HttpOnly session cookie." }
        },
    )
}

pub(crate) fn notice(title: &str, text: &str, csrf: Option<&str>) -> Markup {
    layout(
        title,
        csrf,
        html! {
            p.warn { (text) }
            p { a href="/console" { "Back to the overview" } }
        },
    )
}

/// Counts per scope and state from a scan of at most `limit` records.
pub(crate) struct ScopeCounts {
    pub counts: BTreeMap<String, BTreeMap<&'static str, u64>>,
    pub scanned: usize,
    pub complete: bool,
}

pub(crate) struct Overview<'a> {
    pub stats: &'a QueueStats,
    pub paused: Option<&'a Pause>,
    pub scopes: &'a ScopeCounts,
    /// The newest relay-wide operator actions (pause, resume, purge).
    pub actions: &'a [ActionRow],
    pub breaker: BreakerState,
    /// The ledger's newest failure, the deferred count, the processes' heartbeats.
    pub health: &'a RelayHealth,
    /// How long ago `health` was read (it is cached): ages count on from its read by this.
    pub health_age_ms: i64,
    /// This relay: its `hostname` setting, and the start of its process id as its heartbeat
    /// row names it (`host/pid/`).
    pub hostname: &'a str,
    pub process_prefix: &'a str,
    /// How old a heartbeat may be for its process to count as alive.
    pub alive_within_ms: i64,
    pub now_ms: i64,
}

/// How long ago `then` was, from `now` (both Unix ms), to the second: "9m 12s".
pub(crate) fn age(now_ms: i64, then_ms: i64) -> String {
    let secs = ((now_ms - then_ms).max(0) / 1000) as u64;
    if secs == 0 {
        return "0s".into();
    }
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

fn time_and_age(now_ms: i64, then_ms: i64) -> Markup {
    html! { (time_ms(then_ms)) " (" span.age { (age(now_ms, then_ms)) } " ago)" }
}

/// An attempt's reply line with what kind of failure it was: "transient at rcpt: 451 …".
fn failure_text(a: &AttemptRow) -> Markup {
    html! {
        span.note #last-error-class {
            (a.outcome.as_deref().unwrap_or("open"))
            @if let Some(phase) = &a.phase { " at " (phase) }
            ": "
        }
        code #last-error-reply { (a.reply.as_deref().unwrap_or("no reply recorded")) }
    }
}

/// The upstream as the attempt ledger shows it: failing (since when, the last error), or its
/// last delivery and last error; and how many records wait to retry.
fn upstream_section(o: &Overview<'_>) -> Markup {
    let h = o.health;
    let now = h.read_at_ms + o.health_age_ms;
    // A failure with no delivery since is an outage only while something waits on it: a lone
    // parked record or one greylisted recipient is not the upstream down.
    let outage = h.deferred > 0 || o.breaker == BreakerState::Open;
    html! {
        @match (&h.newest_failure, h.failing_since_ms.filter(|_| outage)) {
            (Some((id, a)), Some(since)) => {
                div.bad #upstream-failing {
                    p {
                        strong { "Upstream failing since " (time_and_age(now, since)) "." }
                        @match h.last_delivery_ms {
                            Some(ms) => { " Last delivery: " (time_and_age(now, ms)) "." }
                            None => { " No delivery yet." }
                        }
                    }
                    p #last-error {
                        "Last error " (time_and_age(now, a.finished_at_ms.unwrap_or(a.started_at_ms)))
                        ", record " a href=(message_href(id)) { code { (id) } } ", attempt " (a.attempt) ": "
                        (failure_text(a))
                    }
                }
            }
            (Some((id, a)), None) => {
                p #last-error {
                    "Last upstream error " (time_and_age(now, a.finished_at_ms.unwrap_or(a.started_at_ms)))
                    ", record " a href=(message_href(id)) { code { (id) } } ": " (failure_text(a))
                    @match (h.failing_since_ms, h.last_delivery_ms) {
                        (Some(_), Some(ms)) => { ". No delivery since; the last one " (time_and_age(now, ms)) }
                        (Some(_), None) => { ". No delivery yet" }
                        (None, Some(ms)) => { ". Delivered since: last delivery " (time_and_age(now, ms)) }
                        (None, None) => {}
                    }
                    "."
                }
            }
            (None, _) => {
                p #last-error {
                    "No failed attempt in the ledger."
                    @if let Some(ms) = h.last_delivery_ms { " Last delivery: " (time_and_age(now, ms)) "." }
                }
            }
        }
        p #deferred {
            @if h.deferred > 0 {
                a href=(search_href_filter("deferred")) { strong { (h.deferred) " deferred" } }
            } @else { "0 deferred" }
            " (queued, waiting to retry after a failed attempt)."
            @if o.health_age_ms >= 1000 {
                span.note #health-read { " Read from the store " (age(now, h.read_at_ms)) " ago (at most every 10 s)." }
            }
        }
    }
}

/// Whether `p` is this relay's process: its id starts with this process's host and pid (the
/// random rest of the id is the delivery workers' own).
fn is_this(p: &ProcessRow, prefix: &str) -> bool {
    p.id.starts_with(prefix)
}

fn instances_section(o: &Overview<'_>) -> Markup {
    let h = o.health;
    let now = h.read_at_ms + o.health_age_ms;
    // Alive or not as of the read: a cached read must not make a live process look stopped.
    let alive = |p: &ProcessRow| h.read_at_ms - p.heartbeat_at_ms <= o.alive_within_ms;
    let this = h
        .processes
        .iter()
        .filter(|p| is_this(p, o.process_prefix))
        .max_by_key(|p| p.heartbeat_at_ms);
    let siblings = h
        .processes
        .iter()
        .filter(|p| this.is_none_or(|t| t.id != p.id) && alive(p))
        .count();
    html! {
        p #this-instance {
            "This console: relay " strong { (o.hostname) } ", process "
            @match this {
                Some(p) => { code { (p.id) } }
                None => { code { (o.process_prefix) "…" } " (no heartbeat in the store: this relay runs no delivery workers)" }
            }
            ". Other live instances on this store: " strong #siblings { (siblings) } "."
        }
        @if !h.processes.is_empty() {
            table #instances {
                tr { th { "Process (host/pid/nonce)" } th { "Started" } th { "Last heartbeat" } th { "State" } }
                @for p in &h.processes {
                    tr {
                        td.id { code { (p.id) } @if this.is_some_and(|t| t.id == p.id) { " " strong { "(this one)" } } }
                        td { (time_ms(p.started_at_ms)) }
                        td { (time_and_age(now, p.heartbeat_at_ms)) }
                        td { @if alive(p) { span.ok { "alive" } } @else { span.note { "stopped (no heartbeat)" } } }
                    }
                }
            }
        }
    }
}

fn all_states() -> impl Iterator<Item = State> {
    State::ALL.into_iter()
}

/// A form posting one operator action, with its reason.
fn action_form(action: &str, button: &str, csrf: &str, id: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) id=(id) {
            input type="hidden" name="csrf" value=(csrf);
            label { "Reason " input type="text" name="reason" required placeholder="why (kept in the history)"; }
            button type="submit" { (button) }
        }
    }
}

/// Closing an unresolved record by hand: after checking the upstream's own records, the
/// operator says what became of it. Nothing is sent again either way.
fn resolve_form(action: &str, csrf: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) id="resolve" {
            input type="hidden" name="csrf" value=(csrf);
            "Checked the upstream? Close it without sending again: "
            label { input type="radio" name="as" value="delivered" required; " delivered" }
            " "
            label { input type="radio" name="as" value="failed"; " failed (no DSN)" }
            " "
            label { "Reason " input type="text" name="reason" required placeholder="what the upstream's records showed"; }
            button type="submit" { "Resolve" }
        }
    }
}

fn actions_table(id: &str, actions: &[ActionRow]) -> Markup {
    html! {
        table id=(id) {
            tr { th { "When" } th { "Action" } th { "Who" } th { "Why" } th { "Detail" } }
            @for a in actions {
                tr {
                    td { (time_ms(a.at_ms)) }
                    td { (a.action) }
                    td { (a.actor) }
                    td { (a.reason) }
                    td { (a.detail.as_deref().unwrap_or("")) }
                }
            }
        }
    }
}

fn waiting_text(w: Option<&Waiting>) -> Markup {
    match w {
        Some(w) => html! { span title=(w.detail) { (w.reason) } ": " (w.detail) },
        None => html! {},
    }
}

pub(crate) fn overview(o: &Overview<'_>, csrf: &str, refresh: &AutoRefresh) -> Markup {
    let body = html! {
        h2 { "Delivery" }
        @match o.paused {
            Some(p) => {
                p.warn {
                    "Paused since " (time_and_age(o.now_ms, p.since_ms)) ": " (p.reason)
                    @if p.probe { " (the relay resumes by itself once the upstream answers a probe normally)" }
                }
                p { a.action #resume href="/console/resume" { "Resume delivery…" } }
            }
            None => {
                p #delivering { "Delivering. Upstream circuit breaker: " strong { (o.breaker.as_str()) } "." }
                p { a.action #pause href="/console/pause" { "Pause delivery…" } }
            }
        }
        (upstream_section(o))
        p { a.action #flush-all href="/console/flush" { "Flush: make every queued record due now…" } }
        h2 { "Instances" }
        (instances_section(o))
        @if !o.actions.is_empty() {
            h3 { "Recent operator actions" }
            (actions_table("relay-actions", o.actions))
        }
        h2 { "Records by state" }
        table #by-state {
            tr { th { "State" } th { "Records" } }
            @for (state, n) in &o.stats.by_state {
                tr {
                    td { a href=(search_href(Some(*state), None)) { (state_badge(*state)) } }
                    td.n { (n) }
                }
            }
        }
        p {
            "Oldest queued: "
            @match o.stats.oldest_queued_at_ms {
                Some(ms) => { (time_and_age(o.now_ms, ms)) }
                None => { "none" }
            }
            ". Damaged bodies: " (o.stats.damaged)
            ". Upstream events without a record: " (o.stats.unmatched_events) "."
        }
        h2 { "Records by scope" }
        @if !o.scopes.complete {
            p.note { "Counted over the first " (o.scopes.scanned) " records; the per-state table above counts all." }
        }
        table #by-scope {
            tr {
                th { "Scope" }
                @for state in all_states() { th { (state.as_str()) } }
            }
            @for (scope, counts) in &o.scopes.counts {
                tr {
                    td { a href=(search_href(None, Some(scope))) { (scope) } }
                    @for state in all_states() {
                        @let n = counts.get(state.as_str()).copied().unwrap_or(0);
                        td.n {
                            @if n > 0 { a href=(search_href(Some(state), Some(scope))) { (n) } } @else { "0" }
                        }
                    }
                }
            }
        }
    };
    layout_with("Queue overview", Some(csrf), Some(refresh), body)
}

/// The form of a relay-wide action (pause, resume, flush), on a page of its own: the
/// overview reloads itself, which would wipe a reason being typed.
pub(crate) fn relay_action(action: &str, title: &str, explain: &str, csrf: &str) -> Markup {
    let button = title.trim_end_matches('?');
    let body = html! {
        p { (explain) }
        p { (action_form(&format!("/console/{action}"), button, csrf, action)) }
        p { a href="/console" { "Back to the overview" } }
    };
    layout(title, Some(csrf), body)
}

/// The reply a listed record last got: its newest attempt's reply line, else the final
/// upstream reply; one line, cut with an ellipsis (the whole line is its title). Below it,
/// why a queued record waits (the detail in its title).
fn last_reply_cell(r: &MessageSummary, waiting: Option<&Waiting>) -> Markup {
    let reply = r.last_reply.as_deref().or(r.upstream_reply.as_deref());
    html! {
        td.reply {
            @match reply {
                Some(reply) => {
                    div.clip.last-reply title=(reply) {
                        @if let Some(outcome) = &r.last_outcome { span.note { (outcome) ": " } }
                        code { (reply) }
                    }
                }
                None => { div.last-reply { span.note { "—" } } }
            }
            @if let Some(w) = waiting {
                div.clip.waiting title=(w.detail) { span.note { "waiting: " } (w.reason) " — " (w.detail) }
            }
        }
    }
}

/// A key: one line, cut with an ellipsis, whole in its title.
fn key_cell(key: Option<&str>) -> Markup {
    html! {
        @match key {
            Some(k) => { td.clip.key title=(k) { code { (k) } } }
            None => { td { span.note { "—" } } }
        }
    }
}

/// A time on one line without its milliseconds ("2026-12-04 23:40:48"), whole in its title.
fn short_time(ms: i64) -> Markup {
    let full = time_ms(ms);
    let short = full.get(..19).unwrap_or(&full).replace('T', " ");
    html! { span title=(full) { (short) } }
}

fn summary_table(rows: &[MessageSummary], waiting: &[Option<Waiting>]) -> Markup {
    html! {
        table.list #results {
            tr {
                th { "Id" } th { "State" } th { "Scope" } th { "Key" } th { "From / to" }
                th { "Accepted" } th { "Attempts" } th { "Last reply / waiting" }
            }
            @for (i, r) in rows.iter().enumerate() {
                tr {
                    td.id { a href=(message_href(&r.id)) { code { (r.id) } } }
                    td { (state_badge(r.state)) }
                    td { (r.scope) }
                    (key_cell(r.key.as_deref()))
                    td.clip.addr title=(format!("from {} to {}", r.mail_from, r.rcpt_to.join(", "))) {
                        span.note { code { (r.mail_from) } } br;
                        @for to in &r.rcpt_to { code { (to) } br; }
                    }
                    td.id { (short_time(r.accepted_at_ms)) }
                    td.n { (r.attempts) }
                    (last_reply_cell(r, waiting.get(i).and_then(Option::as_ref)))
                }
            }
        }
    }
}

pub(crate) struct SearchResults<'a> {
    /// The filters as given (the form shows them again).
    pub form: &'a ListQuery,
    pub rows: &'a [MessageSummary],
    /// Why each queued row waits, by position.
    pub waiting: &'a [Option<Waiting>],
    /// The query string of the next page, when there is one.
    pub next: Option<String>,
}

fn text_field(label: &str, name: &str, value: &Option<String>, hint: &str) -> Markup {
    html! {
        label { (label) " " input type="text" name=(name) value=(value.as_deref().unwrap_or("")) placeholder=(hint); }
    }
}

pub(crate) fn search(s: &SearchResults<'_>, csrf: &str, refresh: Option<&AutoRefresh>) -> Markup {
    let f = s.form;
    let state = f.state.as_deref().and_then(StateFilter::parse);
    let newest = f.order.as_deref() == Some("newest");
    let body = html! {
        form method="get" action="/console/search" #search {
            p {
                label { "State "
                    select name="state" {
                        option value="" selected[state.is_none()] { "any" }
                        @for st in all_states() {
                            option value=(st.as_str()) selected[state == Some(StateFilter::Is(st))] { (st.as_str()) }
                        }
                        option value="deferred" selected[state == Some(StateFilter::Deferred)] { "deferred (queued, retrying)" }
                    }
                }
                (text_field("Scope", "scope", &f.scope, ""))
                (text_field("Key", "key", &f.key, "exact"))
                (text_field("Message-ID", "message_id", &f.message_id, ""))
            }
            p {
                (text_field("Sender", "sender", &f.sender, "MAIL FROM"))
                (text_field("Recipient", "recipient", &f.recipient, "one RCPT TO"))
                (text_field("Since", "since", &f.since, "2026-12-02T10:00:00Z or 2h"))
                (text_field("Until", "until", &f.until, "RFC 3339 or 30m"))
                label { "Order "
                    select name="order" {
                        option value="oldest" selected[!newest] { "oldest first" }
                        option value="newest" selected[newest] { "newest first" }
                    }
                }
                @if refresh.is_some_and(|r| !r.on) { input type="hidden" name="refresh" value="off"; }
                button type="submit" { "Search" }
            }
        }
        p #result-count { (s.rows.len()) " record(s)" @if s.next.is_some() { ", more on the next page" } "." }
        (summary_table(s.rows, s.waiting))
        @if let Some(next) = &s.next {
            @let off = if refresh.is_some_and(|r| !r.on) { "&refresh=off" } else { "" };
            p { a #next-page href=(format!("/console/search?{next}{off}")) { "Next page" } }
        }
    };
    layout_with("Search", Some(csrf), refresh, body)
}

pub(crate) fn unresolved(
    rows: &[MessageSummary],
    more: bool,
    csrf: &str,
    refresh: &AutoRefresh,
) -> Markup {
    let body = html! {
        p {
            "An unresolved record's last attempt ended without a reply to the final dot: the upstream may or may not have it. "
            "Check with the upstream (its events, its logs) before a retry; a retry may deliver a second copy."
        }
        table.list #unresolved {
            tr { th { "Id" } th { "Scope" } th { "Key" } th { "Accepted" } th { "Attempts" } th { "Last reply" } th {} }
            @for r in rows {
                tr {
                    td.id { a href=(message_href(&r.id)) { code { (r.id) } } }
                    td { (r.scope) }
                    (key_cell(r.key.as_deref()))
                    td.id { (short_time(r.accepted_at_ms)) }
                    td.n { (r.attempts) }
                    (last_reply_cell(r, None))
                    td { a.retry href=(format!("{}/retry", message_href(&r.id))) { "Retry…" } }
                }
            }
        }
        @if rows.is_empty() { p #none { "No unresolved records." } }
        @if more { p.note { "Showing the first " (rows.len()) "; search by state for the rest." } }
    };
    layout_with("Unresolved records", Some(csrf), Some(refresh), body)
}

pub(crate) struct MessagePage<'a> {
    pub m: &'a StoredMessage,
    pub attempts: &'a [AttemptRow],
    pub events: &'a [EventRow],
    /// None when the bytes are no longer stored.
    pub headers: Option<Vec<(String, String)>>,
    /// Why a queued record waits.
    pub waiting: Option<&'a Waiting>,
}

pub(crate) fn message(p: &MessagePage<'_>, csrf: &str) -> Markup {
    let m = p.m;
    let retryable = matches!(
        m.state,
        State::Failed | State::Unresolved | State::Cancelled
    );
    let href = message_href(&m.id);
    let body = html! {
        p { "State: " span #state { (state_badge(m.state)) }
            @if retryable { " " a.retry href=(format!("{href}/retry")) { "Retry…" } }
        }
        @if m.state == State::Queued {
            p #waiting {
                @if let Some(at) = m.next_attempt_at_ms { "Next attempt: " (time_ms(at)) ". " }
                (waiting_text(p.waiting))
            }
            p { (action_form(&format!("{href}/flush"), "Flush: attempt now", csrf, "flush")) }
            p { (action_form(&format!("{href}/cancel"), "Cancel delivery", csrf, "cancel")) }
        }
        @if m.state == State::Unresolved {
            (resolve_form(&format!("{href}/resolve"), csrf))
        }
        h2 { "Envelope" }
        table #envelope {
            tr { th { "Id" } td { code { (m.id) } } }
            tr { th { "Scope" } td { (m.scope) } }
            tr { th { "Key" } td { code { (opt(m.key.as_deref())) } " (" (m.key_source) ")" } }
            tr { th { "Upstream key" } td { code { (opt(m.upstream_key.as_deref())) } } }
            tr { th { "Part" } td { (m.part) } }
            tr { th { "MAIL FROM" } td { code { (m.mail_from) } } }
            tr { th { "RCPT TO" } td { @for r in &m.rcpt_to { code { (r) (crate::admin::view::rcpt_requests(&m.requests, r)) } br; } } }
            @if !m.requests.is_empty() {
                tr { th { "MAIL parameters" } td { code { (crate::admin::view::mail_requests(&m.requests)) } } }
            }
            tr { th { "Message-ID" } td { code { (opt(m.message_id.as_deref())) } } }
            tr { th { "Accepted" } td { (time_ms(m.accepted_at_ms)) } }
            tr { th { "Finished" } td { (opt(m.finished_at_ms.map(time_ms).as_deref())) } }
            tr { th { "Reply to the client" } td { code { (m.reply) } } }
            tr { th { "Upstream reply" } td { code { (opt(m.upstream_reply.as_deref())) } } }
            tr { th { "Resolved by" } td { (opt(m.resolved_by.as_deref())) } }
            tr { th { "Queued job" } td { (if m.has_job { "yes" } else { "no" }) } }
            tr { th { "Fingerprint" } td { code { (m.fingerprint.to_hex()) } } }
            @if let Some(of) = &m.dsn_of { tr { th { "Reports on" } td { a href=(message_href(of)) { code { (of) } } } } }
            @if !m.dsns.is_empty() {
                tr { th { "DSNs sent" } td { @for d in &m.dsns { a href=(message_href(d)) { code { (d) } } br; } } }
            }
            @if let Some(damage) = &m.damage { tr { th { "Damage" } td.failed { (damage) } } }
        }
        h2 { "Headers" }
        @match &p.headers {
            Some(fields) => {
                table #headers {
                    @for (name, value) in fields { tr { th { (name) } td { code { (value) } } } }
                }
            }
            None => { p.note { "The message's bytes are no longer stored." } }
        }
        h2 { "Delivery attempts" }
        @if p.attempts.is_empty() { p.note { "None yet." } } @else {
            table #attempts {
                tr { th { "#" } th { "Worker" } th { "Started" } th { "Took" } th { "Outcome" } th { "Phase" } th { "Code" } th { "Upstream reply" } th { "Upstream id" } }
                @for a in p.attempts {
                    tr {
                        td.n { (a.attempt) }
                        td { code { (a.owner) } }
                        td { (time_ms(a.started_at_ms)) }
                        td.n { @if let Some(f) = a.finished_at_ms { (f - a.started_at_ms) " ms" } @else { "running" } }
                        td { (opt(a.outcome.as_deref())) }
                        td { (opt(a.phase.as_deref())) }
                        td.n { (opt(a.code.map(|c| c.to_string()).as_deref())) }
                        td { code { (opt(a.reply.as_deref())) } }
                        td { code { (opt(a.upstream_id.as_deref())) } }
                    }
                }
            }
        }
        h2 { "Upstream events" }
        @if p.events.is_empty() { p.note { "No webhook events matched to this record." } } @else {
            table #recipient-status {
                tr { th { "Recipient" } th { "Last event" } }
                @for (who, event) in recipient_status(p.events) { tr { td { code { (who) } } td { (event) } } }
            }
            table #events {
                tr { th { "Event time" } th { "Received" } th { "Recipient" } th { "Type" } th { "Applied" } th { "Source" } th { "Resolved the record" } th { "Upstream id" } }
                @for e in p.events {
                    tr {
                        td { (time_ms(e.event_time_ms)) }
                        td { (time_ms(e.received_at_ms)) }
                        td { code { (opt(e.recipient.as_deref())) } }
                        td { (e.event_type) " (" (e.kind.as_str()) ")" }
                        td { (if e.applied { "yes" } else { "stale" }) }
                        td { (e.source) "/" (e.webhook_id) "#" (e.index) }
                        td { (if e.evidence { "yes" } else { "" }) }
                        td { code { (opt(e.upstream_id.as_deref())) } }
                    }
                }
            }
        }
    };
    let body = html! {
        (body)
        h2 { "Operator history" }
        @if m.history.is_empty() { p.note #no-history { "No operator action on this record." } } @else {
            (actions_table("history", &m.history))
        }
    };
    layout(&format!("Message {}", m.id), Some(csrf), body)
}

/// The confirmation step of a retry. `warning`: why the retry may deliver a second copy, when
/// it may.
pub(crate) fn retry_confirm(m: &StoredMessage, warning: Option<&str>, csrf: &str) -> Markup {
    let body = html! {
        p { "Record " a href=(message_href(&m.id)) { code { (m.id) } } " (" (m.scope) ", key " code { (opt(m.key.as_deref())) } ") is " (state_badge(m.state)) "." }
        @if let Some(warning) = warning {
            p.warn #duplicate-risk { strong { "The upstream may already have this message. " } (warning) "." }
        }
        form method="post" action=(format!("{}/retry", message_href(&m.id))) #confirm-retry {
            input type="hidden" name="csrf" value=(csrf);
            p { label { "Reason " input type="text" name="reason" required size="50" placeholder="why (kept in the record's history)"; } }
            @if warning.is_some() {
                input type="hidden" name="confirm" value="duplicate-risk";
                button type="submit" { "Retry, accepting that a second copy may be delivered" }
            } @else {
                button type="submit" { "Retry now" }
            }
        }
        p { a href=(message_href(&m.id)) { "Cancel, back to the record" } }
    };
    layout("Retry delivery?", Some(csrf), body)
}
