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

use crate::delivery::breaker::BreakerState;
use crate::intake::Outcome as SubmissionOutcome;
use crate::store::{QueueStats, State, WebhookOutcome};

type Labels = Vec<(&'static str, &'static str)>;

/// Every submission result, in the words of the metric's `result` label.
const SUBMISSION_RESULTS: [SubmissionOutcome; 7] = [
    SubmissionOutcome::Accepted,
    SubmissionOutcome::Replayed,
    SubmissionOutcome::Conflict,
    SubmissionOutcome::InProgress,
    SubmissionOutcome::InvalidKey,
    SubmissionOutcome::Unavailable,
    SubmissionOutcome::Rejected,
];

const DECISIONS: [&str; 4] = ["delivered", "retry", "failed", "unresolved"];

/// Why a webhook request was refused (nothing of it stored), as the metric's `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookRefusal {
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
    pub const ALL: [WebhookRefusal; 6] = [
        WebhookRefusal::Signature,
        WebhookRefusal::Timestamp,
        WebhookRefusal::TooLarge,
        WebhookRefusal::Malformed,
        WebhookRefusal::UnknownSource,
        WebhookRefusal::Store,
    ];

    pub fn as_str(self) -> &'static str {
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

pub struct Metrics {
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
    connections_open: Gauge,
    delivery_paused: Gauge,
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
        Metrics::new()
    }
}

fn label(name: &'static str, value: &'static str) -> Labels {
    vec![(name, value)]
}

impl Metrics {
    pub fn new() -> Self {
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
        let connections_open = Gauge::default();
        let delivery_paused = Gauge::default();
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
            "1 while delivery is paused (account-level upstream failure or an operator)",
            delivery_paused.clone(),
        );
        // Every label value exists from the start, so a rate() over a counter that has not
        // moved yet is 0, not absent.
        for outcome in SUBMISSION_RESULTS {
            let _ = submissions.get_or_create(&label("result", result_label(outcome)));
        }
        for decision in DECISIONS {
            let _ = decisions.get_or_create(&label("decision", decision));
        }
        for reason in WebhookRefusal::ALL {
            let _ = webhook_refused.get_or_create(&label("reason", reason.as_str()));
        }
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
            connections_open,
            delivery_paused,
            webhook_requests,
            webhook_duplicates,
            webhook_refused,
            webhook_events_unmatched,
            webhook_resolved,
            webhook_bounces,
            unmatched_events,
            heartbeat: Mutex::new(None),
        };
        metrics.breaker_state(BreakerState::Closed);
        metrics
    }

    pub fn submission(&self, outcome: SubmissionOutcome) {
        self.submissions
            .get_or_create(&label("result", result_label(outcome)))
            .inc();
    }

    pub fn replay_count_failed(&self) {
        self.replay_count_failures.inc();
    }

    pub fn intake_commit(&self, took: Duration) {
        self.intake_commit.observe(took.as_secs_f64());
    }

    /// One finished upstream attempt and the decision that followed it.
    pub fn attempt(
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
    pub fn decision(&self, decision: &'static str) {
        self.decisions
            .get_or_create(&label("decision", decision))
            .inc();
    }

    pub fn webhook_refused(&self, reason: WebhookRefusal) {
        self.webhook_refused
            .get_or_create(&label("reason", reason.as_str()))
            .inc();
    }

    pub fn webhook_duplicate(&self) {
        self.webhook_duplicates.inc();
    }

    pub fn webhook_applied(&self, outcome: &WebhookOutcome) {
        self.webhook_requests.inc();
        self.webhook_events_unmatched
            .inc_by(u64::from(outcome.unmatched));
        self.webhook_resolved.inc_by(outcome.resolved.len() as u64);
        self.webhook_bounces.inc_by(u64::from(outcome.bounced));
    }

    pub fn breaker_state(&self, state: BreakerState) {
        for s in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            self.breaker
                .get_or_create(&label("state", s.as_str()))
                .set(i64::from(s == state));
        }
    }

    /// A delivery worker is alive and not stuck (see `admin` readiness).
    pub fn delivery_heartbeat(&self) {
        *self.heartbeat.lock().expect("heartbeat lock") = Some(Instant::now());
    }

    pub fn since_delivery_heartbeat(&self) -> Option<Duration> {
        self.heartbeat
            .lock()
            .expect("heartbeat lock")
            .map(|t| t.elapsed())
    }

    /// The text exposition, with the store-derived gauges set from `stats` first.
    pub fn render(
        &self,
        stats: &QueueStats,
        now_ms: i64,
        connections_open: usize,
        paused: bool,
    ) -> String {
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
        self.connections_open
            .set(i64::try_from(connections_open).unwrap_or(i64::MAX));
        self.delivery_paused.set(i64::from(paused));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Label values use underscores, as Prometheus label values conventionally do.
fn result_label(outcome: SubmissionOutcome) -> &'static str {
    match outcome {
        SubmissionOutcome::Accepted => "accepted",
        SubmissionOutcome::Replayed => "replayed",
        SubmissionOutcome::Conflict => "conflict",
        SubmissionOutcome::InProgress => "in_progress",
        SubmissionOutcome::InvalidKey => "invalid_key",
        SubmissionOutcome::Unavailable => "unavailable",
        SubmissionOutcome::Rejected => "rejected",
    }
}

fn state_label(state: State) -> &'static str {
    state.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `name{labels}` in a text exposition.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn counters_gauges_and_histograms_are_exposed() {
        let m = Metrics::new();
        m.submission(SubmissionOutcome::Accepted);
        m.submission(SubmissionOutcome::Accepted);
        m.submission(SubmissionOutcome::InProgress);
        m.attempt(
            "permanent",
            Some("rcpt"),
            "failed",
            Duration::from_millis(30),
        );
        m.intake_commit(Duration::from_millis(2));
        m.breaker_state(BreakerState::Open);
        let stats = QueueStats {
            by_state: vec![(State::Queued, 3), (State::Failed, 1)],
            oldest_queued_at_ms: Some(10_000),
            damaged: 1,
            unmatched_events: 4,
        };
        let text = m.render(&stats, 12_500, 7, true);
        let v = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("{series}\n{text}"));
        assert_eq!(v("idemrelay_submissions_total{result=\"accepted\"}"), 2.0);
        assert_eq!(
            v("idemrelay_submissions_total{result=\"in_progress\"}"),
            1.0
        );
        assert_eq!(v("idemrelay_submissions_total{result=\"conflict\"}"), 0.0);
        assert_eq!(
            v("idemrelay_delivery_attempts_total{outcome=\"permanent\",phase=\"rcpt\"}"),
            1.0
        );
        assert_eq!(
            v("idemrelay_delivery_decisions_total{decision=\"failed\"}"),
            1.0
        );
        assert_eq!(
            v("idemrelay_delivery_decisions_total{decision=\"delivered\"}"),
            0.0
        );
        assert_eq!(
            v("idemrelay_upstream_attempt_duration_seconds_bucket{le=\"0.05\",outcome=\"permanent\"}"),
            1.0
        );
        assert_eq!(v("idemrelay_intake_commit_duration_seconds_count"), 1.0);
        assert_eq!(v("idemrelay_queue_depth{state=\"queued\"}"), 3.0);
        assert_eq!(v("idemrelay_oldest_queued_age_seconds"), 2.5);
        assert_eq!(v("idemrelay_damaged_records"), 1.0);
        assert_eq!(v("idemrelay_upstream_events_unmatched"), 4.0);
        assert_eq!(
            v("idemrelay_webhook_rejected_total{reason=\"too_large\"}"),
            0.0
        );
        assert_eq!(v("idemrelay_circuit_breaker_state{state=\"open\"}"), 1.0);
        assert_eq!(v("idemrelay_circuit_breaker_state{state=\"closed\"}"), 0.0);
        assert_eq!(v("idemrelay_connections_open"), 7.0);
        assert_eq!(v("idemrelay_delivery_paused"), 1.0);
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
