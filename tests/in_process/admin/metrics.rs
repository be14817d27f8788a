//! The metrics (exactly counted, valid for promtool), a store outage, and readiness.

use super::*;

/// One scripted run, then `/metrics` must say exactly what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_scripted_run_exactly() {
    let sink = start_sink().await;
    sink.set_faults(vec![no_such_user()]).unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let admin = relay.admin();

    let first = message(Some("met-a"), "s", "b");
    let a = submit(&relay, "rcpt@example.com", &first).await;
    let mut c = Client::ready(relay.addr).await;
    let replay = c
        .submit("sender@example.com", &["rcpt@example.com"], &first)
        .await;
    assert!(replay.line().ends_with("(idempotent replay)"), "{replay:?}");
    let conflict = c
        .submit(
            "sender@example.com",
            &["rcpt@example.com"],
            &message(Some("met-a"), "s", "another body"),
        )
        .await;
    assert!(conflict.line().contains("E01005"), "{conflict:?}");
    let long_key = "k".repeat(300);
    let invalid = c
        .submit(
            "sender@example.com",
            &["rcpt@example.com"],
            &message(Some(&long_key), "s", "b"),
        )
        .await;
    assert!(invalid.line().contains("E01001"), "{invalid:?}");
    let no_from = c
        .submit(
            "sender@example.com",
            &["rcpt@example.com"],
            b"To: rcpt@example.com\r\nX-Bird-Idempotency-Key: met-r\r\nSubject: s\r\n\r\nb\r\n",
        )
        .await;
    assert_eq!(no_from.code, 550, "{no_from:?}");
    c.quit().await;
    let b = submit(
        &relay,
        "nobody@example.com",
        &message(Some("met-b"), "s", "b"),
    )
    .await;
    wait_state(&relay, &a, State::Delivered).await;
    wait_state(&relay, &b, State::Failed).await;
    // The DSN for b, delivered to the sender.
    sink.wait_for_messages(2, LIMIT).await.unwrap();
    let dsn = common::eventually(LIMIT, "the DSN delivered", || async {
        let page = get(admin, "/api/v1/messages?state=delivered", None)
            .await
            .json();
        let rows = page["messages"].as_array().unwrap().clone();
        (rows.len() == 2).then_some(rows)
    })
    .await;
    assert!(dsn.iter().any(|m| m["id"] == a.as_str()));

    // A worker counts its attempt just after writing the outcome the waits above saw.
    let page = common::eventually(
        LIMIT,
        "no open connections, every decision counted",
        || async {
            let page = get(admin, "/metrics", None).await.body;
            (sample(&page, "idemrelay_connections_open") == Some(0.0)
                && sample(
                    &page,
                    "idemrelay_delivery_decisions_total{decision=\"delivered\"}",
                ) == Some(2.0)
                && sample(
                    &page,
                    "idemrelay_delivery_decisions_total{decision=\"failed\"}",
                ) == Some(1.0))
            .then_some(page)
        },
    )
    .await;
    let expected: &[(&str, f64)] = &[
        ("idemrelay_submissions_total{result=\"accepted\"}", 2.0),
        ("idemrelay_submissions_total{result=\"replayed\"}", 1.0),
        ("idemrelay_submissions_total{result=\"conflict\"}", 1.0),
        ("idemrelay_submissions_total{result=\"invalid_key\"}", 1.0),
        ("idemrelay_submissions_total{result=\"rejected\"}", 1.0),
        ("idemrelay_submissions_total{result=\"in_progress\"}", 0.0),
        ("idemrelay_submissions_total{result=\"unavailable\"}", 0.0),
        // a and the DSN accepted after the dot; b refused at RCPT.
        (
            "idemrelay_delivery_attempts_total{outcome=\"accepted\",phase=\"dot\"}",
            2.0,
        ),
        (
            "idemrelay_delivery_attempts_total{outcome=\"permanent\",phase=\"rcpt\"}",
            1.0,
        ),
        (
            "idemrelay_delivery_decisions_total{decision=\"delivered\"}",
            2.0,
        ),
        (
            "idemrelay_delivery_decisions_total{decision=\"failed\"}",
            1.0,
        ),
        (
            "idemrelay_delivery_decisions_total{decision=\"retry\"}",
            0.0,
        ),
        (
            "idemrelay_delivery_decisions_total{decision=\"unresolved\"}",
            0.0,
        ),
        (
            "idemrelay_upstream_attempt_duration_seconds_count{outcome=\"accepted\"}",
            2.0,
        ),
        (
            "idemrelay_upstream_attempt_duration_seconds_count{outcome=\"permanent\"}",
            1.0,
        ),
        // a, b and the stored rejection were committed by intake (the DSN by delivery).
        ("idemrelay_intake_commit_duration_seconds_count", 3.0),
        ("idemrelay_queue_depth{state=\"queued\"}", 0.0),
        ("idemrelay_queue_depth{state=\"delivered\"}", 2.0),
        ("idemrelay_queue_depth{state=\"failed\"}", 1.0),
        ("idemrelay_queue_depth{state=\"rejected\"}", 1.0),
        ("idemrelay_queue_depth{state=\"unresolved\"}", 0.0),
        ("idemrelay_queue_depth{state=\"cancelled\"}", 0.0),
        ("idemrelay_oldest_queued_age_seconds", 0.0),
        ("idemrelay_circuit_breaker_state{state=\"closed\"}", 1.0),
        ("idemrelay_circuit_breaker_state{state=\"open\"}", 0.0),
        ("idemrelay_delivery_paused{reason=\"operator\"}", 0.0),
        ("idemrelay_delivery_paused{reason=\"account\"}", 0.0),
        ("idemrelay_replay_count_failures_total", 0.0),
        ("idemrelay_store_writable", 1.0),
        // a and the DSN taken; b refused at RCPT.
        ("idemrelay_upstream_replies_total{class=\"2xx\"}", 2.0),
        ("idemrelay_upstream_replies_total{class=\"5xx\"}", 1.0),
        ("idemrelay_upstream_replies_total{class=\"4xx\"}", 0.0),
        ("idemrelay_upstream_replies_total{class=\"connect\"}", 0.0),
        ("idemrelay_delivery_latency_seconds_count", 2.0),
        ("idemrelay_queued_by_scope{scope=\"other\"}", 0.0),
        (
            "idemrelay_circuit_breaker_transitions_total{to=\"open\"}",
            0.0,
        ),
        (
            "idemrelay_smtp_connections_refused_total{reason=\"store\"}",
            0.0,
        ),
        (
            "idemrelay_smtp_commands_refused_total{reason=\"smuggling\"}",
            0.0,
        ),
    ];
    for (series, value) in expected {
        assert_eq!(sample(&page, series), Some(*value), "{series} in:\n{page}");
    }
    assert!(page.contains("# TYPE idemrelay_intake_commit_duration_seconds histogram"));
    // No Accept header, as curl sends none: the Prometheus text format, which promtool reads.
    assert!(!page.contains("# EOF"), "{page}");
    promtool_check_metrics(&page);
    let build = format!(
        "idemrelay_build_info{{version=\"{}\",commit=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        idemrelay::build_info::GIT_COMMIT
    );
    assert_eq!(sample(&page, &build), Some(1.0), "{page}");
    let ready = get(admin, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["breaker"], "closed", "{}", ready.body);

    // The same registry in the Prometheus text format, as promtool reads it.
    let text = scrape(admin, Some("text/plain; version=0.0.4")).await;
    assert_eq!(
        text.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(!text.body.contains("# EOF"), "{}", text.body);
    assert!(text
        .body
        .contains("# TYPE idemrelay_submissions_total counter\n"));
    assert_eq!(
        sample(
            &text.body,
            "idemrelay_submissions_total{result=\"accepted\"}"
        ),
        Some(2.0)
    );
    promtool_check_metrics(&text.body);
    // Asking for it, as Prometheus does: OpenMetrics.
    let open = scrape(
        admin,
        Some("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"),
    )
    .await;
    assert_eq!(
        open.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(open.body.ends_with("# EOF\n"));

    // The same run, as `report` will show it.
    let report = relay.store().report(None).await.unwrap();
    assert_eq!(report.len(), 1, "{report:?}");
    let day = &report[0];
    assert_eq!(day.scope, "default");
    assert_eq!(
        (
            day.accepted,
            day.replayed,
            day.delivered,
            day.failed,
            day.unresolved
        ),
        (2, 1, 2, 1, 0),
        "{day:?}"
    );
}

/// `promtool check metrics` (from Debian's `prometheus` package) on a real scrape: it finds
/// missing HELP, misnamed counters and format errors. Skipped where promtool is missing,
/// except under CI, which installs it.
fn promtool_check_metrics(page: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none(),
                "promtool is not installed (CI installs the prometheus package)"
            );
            eprintln!("promtool not installed: `promtool check metrics` skipped");
            return;
        }
        Err(err) => panic!("cannot run promtool: {err}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {}\n{said}\n{page}",
        out.status
    );
}

/// A store outage must show on the dashboard: an operator's drill (the store locked from
/// outside) answered clients `421 4.3.2` while `submissions_total{result="unavailable"}` stayed
/// 0, because once the health probe sees the outage every client is turned away at connect,
/// before any submission is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_shows_in_the_metrics() {
    let relay = TestRelay::start_with(|s| {
        s.store_busy_timeout = Duration::from_millis(200);
        s.store_probe_interval = Duration::from_millis(100);
    })
    .await;
    let admin = relay.admin();
    let page = get(admin, "/metrics", None).await.body;
    assert_eq!(sample(&page, "idemrelay_store_writable"), Some(1.0));
    let lock = WriteLock::hold(relay.settings.store.expose()).await;
    let greeting = common::eventually(LIMIT, "a 421 at connect", || async {
        let (_client, greeting) = Client::connect(relay.addr).await;
        (greeting.code == 421).then_some(greeting)
    })
    .await;
    assert!(greeting.line().starts_with("421 4.3.2 "), "{greeting:?}");
    let page = get(admin, "/metrics", None).await.body;
    lock.release().await;
    let expected: &[(&str, f64)] = &[
        ("idemrelay_store_writable", 0.0),
        ("idemrelay_submissions_total{result=\"unavailable\"}", 1.0),
        (
            "idemrelay_smtp_connections_refused_total{reason=\"store\"}",
            1.0,
        ),
        (
            "idemrelay_smtp_connections_refused_total{reason=\"caps\"}",
            0.0,
        ),
    ];
    for (series, value) in expected {
        assert_eq!(sample(&page, series), Some(*value), "{series} in:\n{page}");
    }
    common::eventually(LIMIT, "the store writable again", || async {
        let page = get(admin, "/metrics", None).await.body;
        (sample(&page, "idemrelay_store_writable") == Some(1.0)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_store() {
    let relay = TestRelay::start_with(|s| s.store_busy_timeout = Duration::from_millis(200)).await;
    let admin = relay.admin();
    assert_eq!(get(admin, "/readyz", None).await.status, 200);
    // Another writer holds the store's write lock, as a stuck process would.
    let lock = WriteLock::hold(relay.settings.store.expose()).await;
    // The probe's result answers for a second; the next one finds the lock.
    let ready = common::eventually(LIMIT, "/readyz 503", || async {
        let ready = get(admin, "/readyz", None).await;
        (ready.status == 503).then_some(ready)
    })
    .await;
    assert_eq!(ready.json()["store"], "not writable");
    assert_eq!(ready.json()["ready"], false);
    // Alive all the same: a restart would not help.
    assert_eq!(get(admin, "/healthz", None).await.status, 200);
    lock.release().await;
    let ready = common::eventually(LIMIT, "/readyz 200", || async {
        let ready = get(admin, "/readyz", None).await;
        (ready.status == 200).then_some(ready)
    })
    .await;
    assert_eq!(ready.json()["store"], "writable");
}

/// The replay count is bookkeeping: when it cannot be written the replay is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_answered_when_its_count_cannot_be_written() {
    let relay = TestRelay::start().await;
    // A daily_counts table that refuses any replay count (the accepted count still works).
    let store = relay.settings.store.expose();
    if store.starts_with("postgres") {
        let check = "ALTER TABLE daily_counts ADD CONSTRAINT no_replays CHECK (replayed = 0)";
        backend::execute(store, check).await;
    } else {
        // One transaction: the relay must never see a schema without the table.
        backend::execute(
            store,
            "BEGIN IMMEDIATE;
             DROP TABLE daily_counts;
             CREATE TABLE daily_counts (scope TEXT NOT NULL, day TEXT NOT NULL,
                accepted INTEGER NOT NULL DEFAULT 0,
                replayed INTEGER NOT NULL DEFAULT 0 CHECK (replayed = 0),
                delivered INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
                unresolved INTEGER NOT NULL DEFAULT 0,
                cancelled INTEGER NOT NULL DEFAULT 0,
                resolved_by_event INTEGER NOT NULL DEFAULT 0,
                bounced INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (scope, day)) STRICT;
             COMMIT",
        )
        .await;
    }
    let msg = message(Some("count-fails"), "s", "b");
    let id = submit(&relay, "rcpt@example.com", &msg).await;
    let mut c = Client::ready(relay.addr).await;
    let replay = c
        .submit("sender@example.com", &["rcpt@example.com"], &msg)
        .await;
    c.quit().await;
    assert_eq!(
        replay.line(),
        format!("250 2.0.0 OK queued as {id} (idempotent replay)")
    );
    let page = get(relay.admin(), "/metrics", None).await.body;
    assert_eq!(
        sample(&page, "idemrelay_submissions_total{result=\"replayed\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&page, "idemrelay_replay_count_failures_total"),
        Some(1.0),
        "{page}"
    );
    let report = relay.store().report(None).await.unwrap();
    assert_eq!((report[0].accepted, report[0].replayed), (1, 0));
}
