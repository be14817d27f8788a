use super::*;
use crate::delivery::upstream::ReplyClass;
use crate::intake::SubmissionResult;
use crate::smtp::session::RefusalReason;

/// The value of the sample `name{labels}` in a text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn stats() -> QueueStats {
    QueueStats {
        by_state: vec![(State::Queued, 3), (State::Failed, 1)],
        oldest_queued_at_ms: Some(10_000),
        damaged: 1,
        unmatched_events: 4,
        queued_by_scope: Vec::new(),
    }
}

fn snapshot(stats: QueueStats) -> Snapshot {
    Snapshot {
        stats: Some(stats),
        now_ms: 12_500,
        connections_open: 7,
        paused: Some(PauseReason::Account),
        store_writable: true,
    }
}

#[test]
fn counters_gauges_and_histograms_are_exposed() {
    let m = Metrics::new(&crate::app::relay_label_values());
    m.submission(SubmissionResult::Accepted.label());
    m.submission(SubmissionResult::Accepted.label());
    m.submission(SubmissionResult::InProgress.label());
    m.attempt(
        "permanent",
        Some("rcpt"),
        "failed",
        Duration::from_millis(30),
    );
    m.intake_commit(Duration::from_millis(2));
    m.breaker_transition(BreakerState::Open);
    m.connection_refused(RefusalReason::Store.as_str());
    m.command_refused(RefusalReason::Smuggling.as_str());
    m.upstream_reply(ReplyClass::Connect.as_str());
    m.delivered_after(Duration::from_secs(3));
    let text = m.render(&snapshot(stats()), Format::OpenMetrics);
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
    // Every possible pair is there from the start.
    assert_eq!(
        v("idemrelay_delivery_attempts_total{outcome=\"transient\",phase=\"connect\"}"),
        0.0
    );
    assert_eq!(
        v("idemrelay_delivery_attempts_total{outcome=\"unknown\",phase=\"dot\"}"),
        0.0
    );
    assert_eq!(
        sample(
            &text,
            "idemrelay_delivery_attempts_total{outcome=\"accepted\",phase=\"rcpt\"}"
        ),
        None
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
    assert_eq!(
        v("idemrelay_circuit_breaker_transitions_total{to=\"open\"}"),
        1.0
    );
    assert_eq!(
        v("idemrelay_circuit_breaker_transitions_total{to=\"closed\"}"),
        0.0
    );
    assert_eq!(m.breaker_now(), BreakerState::Open);
    assert_eq!(v("idemrelay_connections_open"), 7.0);
    assert_eq!(v("idemrelay_delivery_paused{reason=\"account\"}"), 1.0);
    assert_eq!(v("idemrelay_delivery_paused{reason=\"operator\"}"), 0.0);
    assert_eq!(v("idemrelay_store_writable"), 1.0);
    assert_eq!(
        v("idemrelay_smtp_connections_refused_total{reason=\"store\"}"),
        1.0
    );
    assert_eq!(
        v("idemrelay_smtp_connections_refused_total{reason=\"caps\"}"),
        0.0
    );
    assert_eq!(
        v("idemrelay_smtp_commands_refused_total{reason=\"smuggling\"}"),
        1.0
    );
    assert_eq!(
        v("idemrelay_smtp_commands_refused_total{reason=\"auth\"}"),
        0.0
    );
    assert_eq!(
        v("idemrelay_upstream_replies_total{class=\"connect\"}"),
        1.0
    );
    assert_eq!(v("idemrelay_upstream_replies_total{class=\"5xx\"}"), 0.0);
    assert_eq!(
        v("idemrelay_delivery_latency_seconds_bucket{le=\"5.0\"}"),
        1.0
    );
    assert_eq!(
        v("idemrelay_delivery_latency_seconds_bucket{le=\"2.5\"}"),
        0.0
    );
    let build = format!(
        "idemrelay_build_info{{version=\"{}\",commit=\"{}\"}}",
        crate::build_info::VERSION,
        crate::build_info::GIT_COMMIT
    );
    assert_eq!(v(&build), 1.0);
    assert_eq!(v("idemrelay_queued_by_scope{scope=\"other\"}"), 0.0);
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn queued_by_scope_keeps_the_largest_scopes_and_sums_the_rest() {
    let m = Metrics::new(&crate::app::relay_label_values());
    let mut s = stats();
    s.queued_by_scope = (0..TOP_SCOPES as u64 + 3)
        .map(|i| (format!("scope{i:02}"), i + 1))
        .chain([("other".to_string(), 100)])
        .collect();
    let text = m.render(&snapshot(s.clone()), Format::OpenMetrics);
    let series = text
        .lines()
        .filter(|l| l.starts_with("idemrelay_queued_by_scope{"))
        .count();
    assert_eq!(series, TOP_SCOPES + 1, "{text}");
    // The three smallest (1, 2, 3) and the scope called "other" (100) are summed.
    assert_eq!(
        sample(&text, "idemrelay_queued_by_scope{scope=\"other\"}"),
        Some(106.0)
    );
    assert_eq!(
        sample(&text, "idemrelay_queued_by_scope{scope=\"scope12\"}"),
        Some(13.0)
    );
    assert_eq!(
        sample(&text, "idemrelay_queued_by_scope{scope=\"scope00\"}"),
        None
    );
    // A scope that empties leaves the exposition at the next scrape.
    s.queued_by_scope = vec![("only".to_string(), 2)];
    let text = m.render(&snapshot(s), Format::OpenMetrics);
    assert_eq!(
        sample(&text, "idemrelay_queued_by_scope{scope=\"scope12\"}"),
        None
    );
    assert_eq!(
        sample(&text, "idemrelay_queued_by_scope{scope=\"only\"}"),
        Some(2.0)
    );
    // Without fresh store counts the last ones stand.
    let unread = Snapshot {
        stats: None,
        store_writable: false,
        ..snapshot(stats())
    };
    let text = m.render(&unread, Format::OpenMetrics);
    assert_eq!(
        sample(&text, "idemrelay_queued_by_scope{scope=\"only\"}"),
        Some(2.0)
    );
    assert_eq!(sample(&text, "idemrelay_store_writable"), Some(0.0));
}

#[test]
fn the_text_format_names_counters_by_their_samples_and_has_no_eof() {
    let m = Metrics::new(&crate::app::relay_label_values());
    let om = m.render(&snapshot(stats()), Format::OpenMetrics);
    let text = m.render(&snapshot(stats()), Format::Text004);
    assert!(!text.contains("# EOF"), "{text}");
    assert!(!text.contains("# UNIT"), "{text}");
    assert!(text.contains("# TYPE idemrelay_submissions_total counter\n"));
    assert!(text.contains("# HELP idemrelay_submissions_total Submissions"));
    assert!(text.contains("# TYPE idemrelay_queue_depth gauge\n"));
    assert!(text.contains("# TYPE idemrelay_intake_commit_duration_seconds histogram\n"));
    // The samples are the same lines in both formats.
    let samples = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect()
    };
    assert_eq!(samples(&om), samples(&text));
    // What the conversion relies on: only types 0.0.4 knows, no exemplars (` # {`), no
    // `_created`, and HELP texts that need no escaping in either format.
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let kind = rest.rsplit(' ').next().unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
        }
        if line.starts_with("# HELP ") {
            assert!(!line.contains('\\') && !line.contains('"'), "{line}");
        }
        assert!(
            !line.contains(" # {") && !line.contains("_created"),
            "{line}"
        );
    }
}

#[test]
fn accept_headers_choose_the_format() {
    use Format::*;
    let table: &[(Option<&str>, Format)] = &[
            (None, Text004),
            (Some("*/*"), Text004),
            (Some("text/plain; version=0.0.4"), Text004),
            (Some("text/plain"), Text004),
            (Some("application/openmetrics-text; version=1.0.0"), OpenMetrics),
            // Prometheus 2.x's own header: OpenMetrics first.
            (
                Some("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
                OpenMetrics,
            ),
            (
                Some("application/openmetrics-text;q=0.2, text/plain;version=0.0.4;q=0.9"),
                Text004,
            ),
            (Some("text/plain;q=0"), Text004),
            (Some("application/openmetrics-text;q=0"), Text004),
            (Some("TEXT/PLAIN; Version=0.0.4"), Text004),
        ];
    for (accept, want) in table {
        assert_eq!(Format::negotiate(*accept), *want, "{accept:?}");
    }
}
