//! The relay's Prometheus metrics: one registry per relay (tests run several relays in one
//! process, so nothing here is global). Counters and histograms are updated where things
//! happen; gauges that mirror the store are set from a snapshot when `/metrics` is scraped.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::store::{QueueStats, State, WebhookOutcome};
use idemrelay_model::breaker::BreakerState;

type Labels = Vec<(&'static str, &'static str)>;
/// Labels whose values come from data (scope names), bounded by the code that sets them.
type OwnedLabels = Vec<(&'static str, String)>;

/// Scopes shown by name in `idemrelay_queued_by_scope`; the rest are summed as `other`, so a
/// relay with thousands of users does not become thousands of series.
pub(crate) const TOP_SCOPES: usize = 10;

/// Why delivery is paused, as the `reason` label of `idemrelay_delivery_paused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseReason {
    /// `queue pause` or the API: a person stopped it and a person resumes it.
    Operator,
    /// The upstream refused the account; the relay probes and resumes by itself.
    Account,
}

impl PauseReason {
    pub(crate) const ALL: [PauseReason; 2] = [PauseReason::Operator, PauseReason::Account];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PauseReason::Operator => "operator",
            PauseReason::Account => "account",
        }
    }
}

/// The two exposition formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `application/openmetrics-text; version=1.0.0`, for a client that asks for it
    /// (Prometheus does).
    OpenMetrics,
    /// `text/plain; version=0.0.4`, the Prometheus text format, the default (`curl | promtool
    /// check metrics`), as the Go client library answers.
    Text004,
}

impl Format {
    /// The format an `Accept` header prefers: OpenMetrics only when it asks for
    /// `application/openmetrics-text` at least as much as for `text/plain`; the text format
    /// otherwise (no header, `*/*`), as the Go client library decides.
    pub(crate) fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text004;
        };
        let mut openmetrics = None::<f32>;
        let mut text = None::<f32>;
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .and_then(|(_, v)| v.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            let slot = match media.as_str() {
                "application/openmetrics-text" => &mut openmetrics,
                "text/plain" => &mut text,
                _ => continue,
            };
            *slot = Some(slot.map_or(q, |old| old.max(q)));
        }
        match (openmetrics, text) {
            (Some(o), Some(t)) if o > 0.0 && o >= t => Format::OpenMetrics,
            (Some(o), None) if o > 0.0 => Format::OpenMetrics,
            _ => Format::Text004,
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// What `/metrics` reads besides the registry, at scrape time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// None when the store could not be read in time: the store-derived gauges keep the
    /// values of the last scrape that could.
    pub stats: Option<QueueStats>,
    pub now_ms: i64,
    pub connections_open: usize,
    pub paused: Option<PauseReason>,
    /// The last store outcome (a write, or the health probe every `store_probe_interval`).
    pub store_writable: bool,
}

/// The label values each labelled family exists with from the first scrape, so a rate() over a
/// counter that has not moved yet is 0, not absent. The relay fills it from its own types'
/// label lists (`app`), so this module names no intake or delivery type.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelValues {
    /// `submissions_total{result}`.
    pub submission_results: Vec<&'static str>,
    /// `delivery_decisions_total{decision}`.
    pub decisions: Vec<&'static str>,
    /// `smtp_connections_refused_total{reason}`.
    pub connection_refusals: Vec<&'static str>,
    /// `smtp_commands_refused_total{reason}`.
    pub command_refusals: Vec<&'static str>,
    /// `upstream_replies_total{class}`.
    pub upstream_reply_classes: Vec<&'static str>,
    /// `delivery_attempts_total{outcome, phase}`: the pairs an attempt can end in.
    pub attempt_endings: Vec<(&'static str, &'static str)>,
}

/// Why a webhook request was refused (nothing of it stored), as the metric's `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WebhookRefusal {
    /// 401: no valid signature under a configured secret.
    Signature,
    /// 400: signed, but the timestamp is more than 5 minutes off.
    Timestamp,
    /// 413: body over 1 MiB.
    TooLarge,
    /// 400 (408 for a body that never came): not events, or headers missing or garbled.
    Malformed,
    /// 404: no such source.
    UnknownSource,
    /// 503: the store could not commit.
    Store,
}

impl WebhookRefusal {
    pub(crate) const ALL: [WebhookRefusal; 6] = [
        WebhookRefusal::Signature,
        WebhookRefusal::Timestamp,
        WebhookRefusal::TooLarge,
        WebhookRefusal::Malformed,
        WebhookRefusal::UnknownSource,
        WebhookRefusal::Store,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WebhookRefusal::Signature => "signature",
            WebhookRefusal::Timestamp => "timestamp",
            WebhookRefusal::TooLarge => "too_large",
            WebhookRefusal::Malformed => "malformed",
            WebhookRefusal::UnknownSource => "unknown_source",
            WebhookRefusal::Store => "store",
        }
    }
}

/// Upstream attempts run from milliseconds (a local smarthost) to the 10-minute dot timeout.
const ATTEMPT_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0, 600.0,
];

/// An intake commit is one fsync'd SQLite transaction: sub-millisecond to the busy timeout.
const COMMIT_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// From acceptance to the upstream's 250: seconds on a healthy path, hours through an outage
/// (the upstream's window is 3 hours by default).
const DELIVERY_BUCKETS: [f64; 16] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 10800.0,
    86400.0,
];

pub(crate) struct Metrics {
    registry: Registry,
    submissions: Family<Labels, Counter>,
    attempts: Family<Labels, Counter>,
    decisions: Family<Labels, Counter>,
    replay_count_failures: Counter,
    intake_commit: Histogram,
    attempt_latency: Family<Labels, Histogram>,
    queue_depth: Family<Labels, Gauge>,
    oldest_queued: Gauge<f64, AtomicU64>,
    damaged: Gauge,
    breaker: Family<Labels, Gauge>,
    breaker_transitions: Family<Labels, Counter>,
    /// The breaker's state as the workers last saw it, for `/readyz` and the admin pages.
    breaker_now: Mutex<BreakerState>,
    connections_open: Gauge,
    delivery_paused: Family<Labels, Gauge>,
    store_writable: Gauge,
    connections_refused: Family<Labels, Counter>,
    commands_refused: Family<Labels, Counter>,
    delivery_latency: Histogram,
    upstream_replies: Family<Labels, Counter>,
    queued_by_scope: Family<OwnedLabels, Gauge>,
    webhook_requests: Counter,
    webhook_duplicates: Counter,
    webhook_refused: Family<Labels, Counter>,
    webhook_events_unmatched: Counter,
    webhook_resolved: Counter,
    webhook_bounces: Counter,
    unmatched_events: Gauge,
    /// Last time a delivery worker finished a step or renewed a lease (readiness).
    heartbeat: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(&LabelValues::default())
    }
}

fn label(name: &'static str, value: &'static str) -> Labels {
    vec![(name, value)]
}

impl Metrics {
    pub(crate) fn new(labels: &LabelValues) -> Self {
        let mut registry = Registry::with_prefix("idemrelay");
        let submissions = Family::<Labels, Counter>::default();
        let attempts = Family::<Labels, Counter>::default();
        let decisions = Family::<Labels, Counter>::default();
        let replay_count_failures = Counter::default();
        let intake_commit = Histogram::new(COMMIT_BUCKETS);
        let attempt_latency =
            Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(ATTEMPT_BUCKETS));
        let queue_depth = Family::<Labels, Gauge>::default();
        let oldest_queued = Gauge::<f64, AtomicU64>::default();
        let damaged = Gauge::default();
        let breaker = Family::<Labels, Gauge>::default();
        let breaker_transitions = Family::<Labels, Counter>::default();
        let connections_open = Gauge::default();
        let delivery_paused = Family::<Labels, Gauge>::default();
        let store_writable = Gauge::default();
        let connections_refused = Family::<Labels, Counter>::default();
        let commands_refused = Family::<Labels, Counter>::default();
        let delivery_latency = Histogram::new(DELIVERY_BUCKETS);
        let upstream_replies = Family::<Labels, Counter>::default();
        let queued_by_scope = Family::<OwnedLabels, Gauge>::default();
        let build_info = Family::<Labels, Gauge>::default();
        let webhook_requests = Counter::default();
        let webhook_duplicates = Counter::default();
        let webhook_refused = Family::<Labels, Counter>::default();
        let webhook_events_unmatched = Counter::default();
        let webhook_resolved = Counter::default();
        let webhook_bounces = Counter::default();
        let unmatched_events = Gauge::default();
        registry.register(
            "webhook_requests",
            "Webhook requests received and committed (duplicates not included)",
            webhook_requests.clone(),
        );
        registry.register(
            "webhook_duplicates",
            "Webhook requests whose webhook-id was received before: answered 200, nothing changed",
            webhook_duplicates.clone(),
        );
        registry.register(
            "webhook_rejected",
            "Webhook requests refused, nothing stored, by reason (signature, timestamp, too_large, malformed, unknown_source, store)",
            webhook_refused.clone(),
        );
        registry.register(
            "webhook_events_unmatched",
            "Upstream events received that matched no record (kept, and matched when the record becomes known)",
            webhook_events_unmatched.clone(),
        );
        registry.register(
            "webhook_resolved",
            "Unresolved records resolved to delivered by an upstream event on receipt",
            webhook_resolved.clone(),
        );
        registry.register(
            "webhook_bounces",
            "Bounce events received that matched a record",
            webhook_bounces.clone(),
        );
        registry.register(
            "upstream_events_unmatched",
            "Upstream events in the store that match no record yet",
            unmatched_events.clone(),
        );
        registry.register(
            "submissions",
            "Submissions answered at the end of DATA, by result",
            submissions.clone(),
        );
        registry.register(
            "delivery_attempts",
            "Upstream delivery attempts, by ledger outcome and the phase it ended in",
            attempts.clone(),
        );
        registry.register(
            "delivery_decisions",
            "What followed an attempt (or a check of the window): delivered, retry, failed, unresolved",
            decisions.clone(),
        );
        registry.register(
            "replay_count_failures",
            "Replays answered whose count for `idemrelay report` could not be written",
            replay_count_failures.clone(),
        );
        registry.register_with_unit(
            "intake_commit_duration",
            "Time to commit a new record and its job (the wait before a 250)",
            Unit::Seconds,
            intake_commit.clone(),
        );
        registry.register_with_unit(
            "upstream_attempt_duration",
            "Time of one upstream delivery attempt, by outcome",
            Unit::Seconds,
            attempt_latency.clone(),
        );
        registry.register(
            "queue_depth",
            "Records in the store, by state",
            queue_depth.clone(),
        );
        registry.register_with_unit(
            "oldest_queued_age",
            "Age of the oldest queued (undelivered) record; 0 when none is queued",
            Unit::Seconds,
            oldest_queued.clone(),
        );
        registry.register(
            "damaged_records",
            "Records whose stored body was unreadable or failed its checksum: failed, not forwarded, waiting for an operator",
            damaged.clone(),
        );
        registry.register(
            "circuit_breaker_state",
            "1 for the upstream circuit breaker's current state (closed, open, half_open)",
            breaker.clone(),
        );
        registry.register(
            "connections_open",
            "SMTP client connections open now",
            connections_open.clone(),
        );
        registry.register(
            "delivery_paused",
            "1 while delivery is paused, by reason: operator (a person paused it) or account (the upstream refused the account; the relay probes and resumes)",
            delivery_paused.clone(),
        );
        registry.register(
            "circuit_breaker_transitions",
            "Upstream circuit breaker state changes, by the state entered",
            breaker_transitions.clone(),
        );
        registry.register(
            "store_writable",
            "1 when the last store write or health probe succeeded; 0 while new mail is refused (421 4.3.2 / 451 4.3.0)",
            store_writable.clone(),
        );
        registry.register(
            "smtp_connections_refused",
            "SMTP connections turned away before a session, by reason (store, caps, policy, shutdown)",
            connections_refused.clone(),
        );
        registry.register(
            "smtp_commands_refused",
            "SMTP commands refused and sessions cut by the relay, by reason (store, policy, smuggling, limits, auth, shutdown)",
            commands_refused.clone(),
        );
        registry.register_with_unit(
            "delivery_latency",
            "Time from the client's 250 to the upstream's 250, per delivered record",
            Unit::Seconds,
            delivery_latency.clone(),
        );
        registry.register(
            "upstream_replies",
            "Upstream attempt endings by class: 2xx, 4xx, 5xx, connect (refused or lost before the dot), timeout (a phase deadline before the dot), tls, auth (refused at AUTH), unknown (no usable answer to the final dot)",
            upstream_replies.clone(),
        );
        registry.register(
            "queued_by_scope",
            "Queued records per scope: the largest scopes by name, the rest summed as other",
            queued_by_scope.clone(),
        );
        registry.register(
            "build_info",
            "Always 1; the labels say which version and git commit is running",
            build_info.clone(),
        );
        // Every label value exists from the start, so a rate() over a counter that has not
        // moved yet is 0, not absent.
        for result in &labels.submission_results {
            let _ = submissions.get_or_create(&label("result", result));
        }
        for decision in &labels.decisions {
            let _ = decisions.get_or_create(&label("decision", decision));
        }
        for reason in WebhookRefusal::ALL {
            let _ = webhook_refused.get_or_create(&label("reason", reason.as_str()));
        }
        for reason in &labels.connection_refusals {
            let _ = connections_refused.get_or_create(&label("reason", reason));
        }
        for reason in &labels.command_refusals {
            let _ = commands_refused.get_or_create(&label("reason", reason));
        }
        for class in &labels.upstream_reply_classes {
            let _ = upstream_replies.get_or_create(&label("class", class));
        }
        for state in BreakerState::ALL {
            let _ = breaker_transitions.get_or_create(&label("to", state.as_str()));
        }
        for &(outcome, phase) in &labels.attempt_endings {
            let _ = attempts.get_or_create(&vec![("outcome", outcome), ("phase", phase)]);
        }
        for reason in PauseReason::ALL {
            let _ = delivery_paused.get_or_create(&label("reason", reason.as_str()));
        }
        build_info
            .get_or_create(&vec![
                ("version", crate::build_info::VERSION),
                ("commit", crate::build_info::GIT_COMMIT),
            ])
            .set(1);
        let metrics = Metrics {
            registry,
            submissions,
            attempts,
            decisions,
            replay_count_failures,
            intake_commit,
            attempt_latency,
            queue_depth,
            oldest_queued,
            damaged,
            breaker,
            breaker_transitions,
            breaker_now: Mutex::new(BreakerState::default()),
            connections_open,
            delivery_paused,
            store_writable,
            connections_refused,
            commands_refused,
            delivery_latency,
            upstream_replies,
            queued_by_scope,
            webhook_requests,
            webhook_duplicates,
            webhook_refused,
            webhook_events_unmatched,
            webhook_resolved,
            webhook_bounces,
            unmatched_events,
            heartbeat: Mutex::new(None),
        };
        metrics.breaker_state(BreakerState::default());
        metrics
    }

    /// `result` is a `SubmissionResult::label()`.
    pub(crate) fn submission(&self, result: &'static str) {
        self.submissions
            .get_or_create(&label("result", result))
            .inc();
    }

    pub(crate) fn replay_count_failed(&self) {
        self.replay_count_failures.inc();
    }

    pub(crate) fn intake_commit(&self, took: Duration) {
        self.intake_commit.observe(took.as_secs_f64());
    }

    /// One finished upstream attempt and the decision that followed it.
    pub(crate) fn attempt(
        &self,
        outcome: &'static str,
        phase: Option<&'static str>,
        decision: &'static str,
        took: Duration,
    ) {
        self.attempts
            .get_or_create(&vec![
                ("outcome", outcome),
                ("phase", phase.unwrap_or("none")),
            ])
            .inc();
        self.attempt_latency
            .get_or_create(&label("outcome", outcome))
            .observe(took.as_secs_f64());
        self.decision(decision);
    }

    /// A decision taken without an attempt (an UNKNOWN past the upstream's window).
    pub(crate) fn decision(&self, decision: &'static str) {
        self.decisions
            .get_or_create(&label("decision", decision))
            .inc();
    }

    pub(crate) fn webhook_refused(&self, reason: WebhookRefusal) {
        self.webhook_refused
            .get_or_create(&label("reason", reason.as_str()))
            .inc();
    }

    pub(crate) fn webhook_duplicate(&self) {
        self.webhook_duplicates.inc();
    }

    pub(crate) fn webhook_applied(&self, outcome: &WebhookOutcome) {
        self.webhook_requests.inc();
        self.webhook_events_unmatched
            .inc_by(u64::from(outcome.unmatched));
        self.webhook_resolved.inc_by(outcome.resolved.len() as u64);
        self.webhook_bounces.inc_by(u64::from(outcome.bounced));
    }

    pub(crate) fn breaker_state(&self, state: BreakerState) {
        for s in BreakerState::ALL {
            self.breaker
                .get_or_create(&label("state", s.as_str()))
                .set(i64::from(s == state));
        }
        *self.breaker_now.lock().expect("breaker state lock") = state;
    }

    /// The breaker entered `to` (the state gauge follows through `breaker_state`).
    pub(crate) fn breaker_transition(&self, to: BreakerState) {
        self.breaker_transitions
            .get_or_create(&label("to", to.as_str()))
            .inc();
        self.breaker_state(to);
    }

    /// The breaker's state as the delivery workers last saw it.
    pub(crate) fn breaker_now(&self) -> BreakerState {
        *self.breaker_now.lock().expect("breaker state lock")
    }

    pub(crate) fn connection_refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&label("reason", reason))
            .inc();
    }

    pub(crate) fn command_refused(&self, reason: &'static str) {
        self.commands_refused
            .get_or_create(&label("reason", reason))
            .inc();
    }

    /// A record delivered `took` after the client's 250.
    pub(crate) fn delivered_after(&self, took: Duration) {
        self.delivery_latency.observe(took.as_secs_f64());
    }

    pub(crate) fn upstream_reply(&self, class: &'static str) {
        self.upstream_replies
            .get_or_create(&label("class", class))
            .inc();
    }

    /// A delivery worker is alive and not stuck (see `admin` readiness).
    pub(crate) fn delivery_heartbeat(&self) {
        *self.heartbeat.lock().expect("heartbeat lock") = Some(Instant::now());
    }

    pub(crate) fn since_delivery_heartbeat(&self) -> Option<Duration> {
        self.heartbeat
            .lock()
            .expect("heartbeat lock")
            .map(|t| t.elapsed())
    }

    /// The exposition in `format`, with the scrape-time gauges set from `snapshot` first.
    pub(crate) fn render(&self, snapshot: &Snapshot, format: Format) -> String {
        if let Some(stats) = &snapshot.stats {
            self.set_store_gauges(stats, snapshot.now_ms);
        }
        self.connections_open
            .set(i64::try_from(snapshot.connections_open).unwrap_or(i64::MAX));
        for reason in PauseReason::ALL {
            self.delivery_paused
                .get_or_create(&label("reason", reason.as_str()))
                .set(i64::from(snapshot.paused == Some(reason)));
        }
        self.store_writable.set(i64::from(snapshot.store_writable));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        match format {
            Format::OpenMetrics => out,
            Format::Text004 => text_format_004(&out),
        }
    }

    fn set_store_gauges(&self, stats: &QueueStats, now_ms: i64) {
        for (state, n) in &stats.by_state {
            self.queue_depth
                .get_or_create(&label("state", state_label(*state)))
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        let age_ms = stats
            .oldest_queued_at_ms
            .map_or(0, |at| now_ms.saturating_sub(at).max(0));
        self.oldest_queued.set(age_ms as f64 / 1000.0);
        self.damaged
            .set(i64::try_from(stats.damaged).unwrap_or(i64::MAX));
        self.unmatched_events
            .set(i64::try_from(stats.unmatched_events).unwrap_or(i64::MAX));
        // Rebuilt on every read: a scope that left the top must not linger with an old value.
        self.queued_by_scope.clear();
        let mut other = 0u64;
        // A scope literally named "other" is summed with the rest: one series per name.
        let (mut by_scope, named_other): (Vec<_>, Vec<_>) = stats
            .queued_by_scope
            .iter()
            .cloned()
            .partition(|(scope, _)| scope != "other");
        for (_, n) in named_other {
            other = other.saturating_add(n);
        }
        by_scope.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (i, (scope, n)) in by_scope.into_iter().enumerate() {
            if i < TOP_SCOPES {
                self.queued_by_scope
                    .get_or_create(&vec![("scope", scope)])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            } else {
                other = other.saturating_add(n);
            }
        }
        self.queued_by_scope
            .get_or_create(&vec![("scope", "other".to_string())])
            .set(i64::try_from(other).unwrap_or(i64::MAX));
    }
}

/// The Prometheus text format 0.0.4, from prometheus-client's OpenMetrics output. The sample
/// lines are the same in both; the differences are in the metadata: 0.0.4 has no `# UNIT` and
/// no `# EOF`, and a counter's HELP and TYPE name the sample (`x_total`), where OpenMetrics
/// names the family (`x`). The registry uses no type 0.0.4 lacks (info, stateset,
/// gaugehistogram), no exemplars and no `_created` samples; a test holds it to that.
pub(crate) fn text_format_004(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(line) => out.push_str(&line),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

fn state_label(state: State) -> &'static str {
    state.as_str()
}

#[cfg(test)]
mod tests;
