//! The admin HTTP API over a real socket: health, readiness, the ledger by id and key, paged
//! lists, retry (with the duplicate-risk confirmation), cancel, the bearer token, and a
//! `/metrics` scrape after a scripted run whose every counter is known.

use crate::common;
#[path = "admin/console.rs"]
mod console;
#[path = "admin/cross_site.rs"]
mod cross_site;

use std::time::Duration;

use common::backend::{self, WriteLock};
use common::http::{get, post_json, request, sample};
use common::{message, relay_for, start_sink, wait_state, Client, TestRelay};
use idemrelay::config::Secret;
use idemrelay::store::State;
use idemrelay_sink::{FaultRule, FaultStage};

const LIMIT: Duration = Duration::from_secs(20);

async fn submit(relay: &TestRelay, to: &str, msg: &[u8]) -> String {
    common::submit(relay, "sender@example.com", &[to], msg).await
}

fn no_such_user() -> FaultRule {
    FaultRule::reply(FaultStage::Rcpt, 550, "5.1.1 no such user").with_rcpt("nobody@")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_read_by_id_and_key_listed_in_pages_and_retried() {
    let sink = start_sink().await;
    sink.set_faults(vec![no_such_user().with_times(1)]).unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let admin = relay.admin();
    let ok = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("adm-ok"), "s", "b"),
    )
    .await;
    let failed = submit(
        &relay,
        "nobody@example.com",
        &message(Some("adm/fail 1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &ok, State::Delivered).await;
    wait_state(&relay, &failed, State::Failed).await;
    // The DSN for the failed one.
    sink.wait_for_messages(2, LIMIT).await.unwrap();

    let shown = get(admin, &format!("/api/v1/messages/{failed}"), None).await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert!(shown
        .header("content-type")
        .is_some_and(|v| v.starts_with("application/json")));
    let m = shown.json();
    assert_eq!(m["id"], failed.as_str());
    assert_eq!(m["state"], "failed");
    assert_eq!(m["scope"], "default");
    assert_eq!(m["key"], "adm/fail 1");
    assert_eq!(m["key_source"], "header");
    assert_eq!(m["reply"], format!("250 2.0.0 OK queued as {failed}"));
    assert!(m["upstream_reply"]
        .as_str()
        .unwrap()
        .contains("5.1.1 no such user"));
    let attempts = m["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{m}");
    let a = &attempts[0];
    assert_eq!(a["attempt"], 1);
    assert_eq!(a["outcome"], "permanent");
    assert_eq!(a["phase"], "rcpt");
    assert_eq!(a["code"], 550);
    assert!(a["reply"].as_str().unwrap().contains("no such user"), "{a}");
    let started = a["started_at_ms"].as_i64().unwrap();
    let finished = a["finished_at_ms"].as_i64().unwrap();
    assert!(finished >= started);
    assert_eq!(a["duration_ms"].as_i64().unwrap(), finished - started);
    assert!(a["started_at"].as_str().unwrap().ends_with('Z'), "{a}");

    // By key: a key with a slash and a space, percent-encoded like any path segment.
    let by_key = get(admin, "/api/v1/keys/default/adm%2Ffail%201", None).await;
    assert_eq!(by_key.status, 200, "{}", by_key.body);
    assert_eq!(by_key.json(), m);
    let by_key = get(admin, "/api/v1/keys/default/adm-ok", None).await.json();
    assert_eq!(by_key["id"], ok.as_str());
    assert_eq!(by_key["state"], "delivered");
    assert_eq!(by_key["attempts"][0]["outcome"], "accepted");
    assert!(by_key["upstream_reply"]
        .as_str()
        .unwrap()
        .starts_with("250"));
    for path in [
        "/api/v1/keys/other-scope/adm-ok".to_string(),
        "/api/v1/keys/default/never-used".to_string(),
        "/api/v1/messages/NOSUCHID".to_string(),
    ] {
        let missing = get(admin, &path, None).await;
        assert_eq!(missing.status, 404, "{path}");
        assert_eq!(missing.json()["code"], "not_found", "{path}");
    }

    // Filtered and paged lists.
    let listed = get(admin, "/api/v1/messages?state=failed", None)
        .await
        .json();
    let rows = listed["messages"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{listed}");
    assert_eq!(rows[0]["id"], failed.as_str());
    assert_eq!(rows[0]["last_outcome"], "permanent");
    assert_eq!(rows[0]["last_code"], 550);
    assert_eq!(listed["next_cursor"], serde_json::Value::Null);
    let everything = get(admin, "/api/v1/messages", None).await.json();
    let all: Vec<String> = everything["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(all.len(), 3, "the two messages and the DSN: {everything}");
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let path = match &cursor {
            Some(c) => format!("/api/v1/messages?limit=2&cursor={c}"),
            None => "/api/v1/messages?limit=2".to_string(),
        };
        let page = get(admin, &path, None).await.json();
        let ids: Vec<String> = page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect();
        assert!(ids.len() <= 2, "{page}");
        paged.extend(ids);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(paged, all, "pages cover the list once, in order");
    for (query, code) in [
        ("state=lost", "bad_state"),
        ("limit=0", "bad_limit"),
        // An unknown filter is refused, never ignored.
        ("rcpt=x", "bad_query"),
        ("after=x", "bad_query"),
        ("cursor=nonsense", "bad_cursor"),
        ("since=yesterday", "bad_time"),
        ("order=sideways", "bad_order"),
    ] {
        let bad = get(admin, &format!("/api/v1/messages?{query}"), None).await;
        assert_eq!(bad.status, 400, "{query}");
        assert_eq!(bad.json()["code"], code);
    }

    // Retry of the failed record: it is delivered once, with its ledger kept.
    let retry = post_json(
        admin,
        &format!("/api/v1/messages/{failed}/retry"),
        None,
        "{}",
    )
    .await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(retry.json()["requeued"], true);
    wait_state(&relay, &failed, State::Delivered).await;
    let m = get(admin, &format!("/api/v1/messages/{failed}"), None)
        .await
        .json();
    let outcomes: Vec<&str> = m["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["permanent", "accepted"]);
    let again = post_json(
        admin,
        &format!("/api/v1/messages/{failed}/retry"),
        None,
        "{}",
    )
    .await;
    assert_eq!(again.status, 409);
    assert_eq!(again.json()["code"], "wrong_state");
    assert!(again.json()["error"]
        .as_str()
        .unwrap()
        .contains("is delivered"));
    let none = post_json(admin, "/api/v1/messages/NOSUCHID/retry", None, "").await;
    assert_eq!(none.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_record_is_requeued_only_with_the_confirmation() {
    let (sink, relay) = common::relay_whose_attempts_end_unknown().await;
    let admin = relay.admin();
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("adm-unres"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Unresolved).await;
    sink.set_faults(vec![]).unwrap();
    let before = relay.store().attempts(&id).await.unwrap().len();
    let shown = get(admin, &format!("/api/v1/messages/{id}"), None)
        .await
        .json();
    assert_eq!(shown["state"], "unresolved");
    // Each attempt is UNKNOWN, or, on a loaded machine, may fail to connect in time (transient).
    let attempts = shown["attempts"].as_array().unwrap();
    assert!(
        attempts.iter().any(|a| a["outcome"] == "unknown")
            && attempts
                .iter()
                .all(|a| a["outcome"] == "unknown" || a["outcome"] == "transient"),
        "{attempts:?}"
    );

    let path = format!("/api/v1/messages/{id}/retry");
    let refused = post_json(admin, &path, None, "{}").await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    let body = refused.json();
    assert_eq!(body["code"], "confirmation_required");
    let text = body["error"].as_str().unwrap();
    assert!(
        text.contains("unresolved") && text.contains("second copy"),
        "{text}"
    );
    assert!(text.contains(r#"{"confirm": "duplicate-risk"}"#), "{text}");
    let wrong = post_json(admin, &path, None, r#"{"confirm": "yes"}"#).await;
    assert_eq!(wrong.status, 400);
    assert_eq!(wrong.json()["code"], "bad_confirmation");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(relay.stored(&id).await.state, State::Unresolved);
    assert_eq!(relay.store().attempts(&id).await.unwrap().len(), before);

    common::wait_out_held_replies(&relay, &id).await;
    let confirmed = post_json(admin, &path, None, r#"{"confirm": "duplicate-risk"}"#).await;
    assert_eq!(confirmed.status, 200, "{}", confirmed.body);
    assert_eq!(confirmed.json()["state"], "queued");
    wait_state(&relay, &id, State::Delivered).await;
    let copies = sink
        .messages()
        .iter()
        .filter(|m| m.key.as_deref() == Some("adm-unres"))
        .count();
    assert_eq!(copies, 1);
}

/// An operator who has checked the upstream's records closes an unresolved record as
/// delivered (or failed): no attempt is made, nothing reaches the upstream again, the history
/// says who and why, and the unresolved gauge drops at the next scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_record_is_resolved_without_a_resend_and_its_gauge_drops() {
    let (sink, relay) = common::relay_whose_attempts_end_unknown().await;
    let admin = relay.admin();
    let delivered = submit(
        &relay,
        "a@example.com",
        &message(Some("adm-res-1"), "s", "b"),
    )
    .await;
    let failed = submit(
        &relay,
        "b@example.com",
        &message(Some("adm-res-2"), "s", "b"),
    )
    .await;
    wait_state(&relay, &delivered, State::Unresolved).await;
    wait_state(&relay, &failed, State::Unresolved).await;
    sink.set_faults(vec![]).unwrap();
    let unresolved_gauge = |page: &str| sample(page, "idemrelay_queue_depth{state=\"unresolved\"}");
    assert_eq!(unresolved_gauge(&scrape(admin, None).await.body), Some(2.0));
    let attempts_before = relay.store().attempts(&delivered).await.unwrap().len();
    let copies_before = sink.messages().len();

    let path = format!("/api/v1/messages/{delivered}/resolve");
    for (body, code) in [
        (r#"{"reason": "seen upstream"}"#, "resolution_required"),
        (
            r#"{"as": "sent", "reason": "seen upstream"}"#,
            "bad_resolution",
        ),
        (r#"{"as": "delivered"}"#, "reason_required"),
        (r#"{"as": "delivered", "reason": "  "}"#, "reason_required"),
    ] {
        let refused = post_json(admin, &path, None, body).await;
        assert_eq!(refused.status, 400, "{body}: {}", refused.body);
        assert_eq!(refused.json()["code"], code, "{body}");
    }
    assert_eq!(relay.stored(&delivered).await.state, State::Unresolved);

    let reason = r#"{"as": "delivered", "reason": "upstream log: 250 queued as 9f2c"}"#;
    let done = post_json(admin, &path, None, reason).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(done.json()["state"], "delivered");
    let done = post_json(
        admin,
        &format!("/api/v1/messages/{failed}/resolve"),
        None,
        r#"{"as": "failed", "reason": "upstream has no trace of it"}"#,
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.body);
    // Gauges follow at once: the scrape after an operator's change counts afresh.
    let page = scrape(admin, None).await.body;
    assert_eq!(unresolved_gauge(&page), Some(0.0), "{page}");

    let shown = get(admin, &format!("/api/v1/messages/{delivered}"), None)
        .await
        .json();
    assert_eq!(shown["state"], "delivered");
    let reply = shown["upstream_reply"].as_str().unwrap();
    assert!(
        reply.contains("resolved as delivered") && reply.contains("9f2c"),
        "{reply}"
    );
    let history = shown["history"].as_array().expect("history");
    assert!(
        history.iter().any(|a| a["action"] == "resolve"
            && a["detail"] == "delivered"
            && a["reason"] == "upstream log: 250 queued as 9f2c"),
        "{history:?}"
    );
    assert_eq!(relay.stored(&failed).await.state, State::Failed);

    // Nothing more is sent, and no DSN: no attempt, no new message at the upstream.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        relay.store().attempts(&delivered).await.unwrap().len(),
        attempts_before
    );
    assert_eq!(sink.messages().len(), copies_before);
    assert_eq!(relay.stored(&delivered).await.state, State::Delivered);

    // A record that is not unresolved keeps its outcome.
    let again = post_json(admin, &path, None, reason).await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert_eq!(again.json()["code"], "wrong_state");
    let missing = post_json(admin, "/api/v1/messages/nope/resolve", None, reason).await;
    assert_eq!(missing.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_record_is_cancelled_with_delete() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    let admin = relay.admin();
    relay.store().pause("hold", false).await.unwrap();
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("adm-cancel"), "s", "b"),
    )
    .await;
    let queued = get(admin, "/api/v1/messages?state=queued", None)
        .await
        .json();
    assert_eq!(queued["messages"][0]["id"], id.as_str());
    assert_eq!(queued["messages"][0]["attempts"], 0);

    let path = format!("/api/v1/messages/{id}");
    let cancelled = request(admin, "DELETE", &path, None).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.json()["cancelled"], true);
    let m = get(admin, &path, None).await.json();
    assert_eq!(m["state"], "cancelled");
    assert_eq!(m["upstream_reply"], "cancelled by an operator");
    assert_eq!(m["queued_job"], false);

    relay.store().resume().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.transactions(), vec![]);
    let again = request(admin, "DELETE", &path, None).await;
    assert_eq!(again.status, 409);
    assert_eq!(again.json()["code"], "wrong_state");
    let missing = request(admin, "DELETE", "/api/v1/messages/NOSUCHID", None).await;
    assert_eq!(missing.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_the_api_and_metrics_but_not_health() {
    const TOKEN: &str = "test-admin-token-0123456789";
    let relay = TestRelay::start_with(|s| s.admin_token = Some(Secret(TOKEN.into()))).await;
    let admin = relay.admin();
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("adm-token"), "s", "b"),
    )
    .await;
    for path in [
        "/metrics".to_string(),
        "/api/v1/messages".to_string(),
        format!("/api/v1/messages/{id}"),
        "/api/v1/keys/default/adm-token".to_string(),
    ] {
        for token in [None, Some("wrong-token-0123456789")] {
            let refused = get(admin, &path, token).await;
            assert_eq!(refused.status, 401, "{path} {token:?}");
            assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
            assert_eq!(refused.json()["code"], "unauthorized");
            assert!(!refused.body.contains(&id), "{path}: {}", refused.body);
        }
        let allowed = get(admin, &path, Some(TOKEN)).await;
        assert_eq!(allowed.status, 200, "{path}: {}", allowed.body);
    }
    for method in ["POST", "DELETE"] {
        let path = if method == "POST" {
            format!("/api/v1/messages/{id}/retry")
        } else {
            format!("/api/v1/messages/{id}")
        };
        let refused = if method == "POST" {
            post_json(admin, &path, None, "{}").await
        } else {
            request(admin, method, &path, None).await
        };
        assert_eq!(refused.status, 401);
    }
    // Nothing was cancelled by the refused DELETE.
    assert_eq!(relay.stored(&id).await.state, State::Queued);

    let health = get(admin, "/healthz", None).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");
    // Without the token, ready or not in a word; the details with it.
    let ready = get(admin, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        ready.json(),
        serde_json::json!({ "ready": true, "status": "ready" })
    );
    let ready = get(admin, "/readyz", Some(TOKEN)).await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    let ready = ready.json();
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["store"], "writable");
    assert_eq!(ready["delivery"]["status"], "not configured");
    let unknown = get(admin, "/nothing-here", None).await;
    assert_eq!(unknown.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_503_while_shutting_down() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| s.shutdown_grace = Duration::from_secs(10)).await;
    let admin = relay.admin();
    let ready = get(admin, "/readyz", None).await.json();
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["delivery"]["status"], "running", "{ready}");
    relay.store().pause("operator hold", false).await.unwrap();
    let ready = get(admin, "/readyz", None).await;
    assert_eq!(ready.status, 200, "a paused queue still takes mail");
    assert_eq!(ready.json()["delivery"]["status"], "paused");
    assert_eq!(ready.json()["delivery"]["paused_reason"], "operator hold");

    // A session in the middle of a message keeps the relay draining.
    let mut client = Client::ready(relay.addr).await;
    assert_eq!(client.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
    assert_eq!(client.cmd("RCPT TO:<rcpt@example.com>").await.code, 250);
    assert_eq!(client.cmd("DATA").await.code, 354);
    client
        .send(b"From: a@example.com\r\nX-Bird-Idempotency-Key: drain-1\r\n")
        .await;
    let TestRelay {
        relay, dir: _dir, ..
    } = relay;
    let stopping = tokio::spawn(relay.shutdown());
    let health = common::eventually(LIMIT, "healthz 503", || async {
        let h = get(admin, "/healthz", None).await;
        (h.status == 503).then_some(h)
    })
    .await;
    assert_eq!(health.json()["status"], "shutting down");
    let ready = get(admin, "/readyz", None).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["shutting_down"], true);

    client.send(b"Subject: s\r\n\r\nbody\r\n.\r\n").await;
    let answer = client.read_answer().await.expect("reply to the dot");
    assert_eq!(answer.code, 250, "{answer:?}");
    tokio::time::timeout(LIMIT, stopping)
        .await
        .unwrap()
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "the admin listener is closed once the relay has stopped"
    );
}

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

/// `/metrics` with this `Accept` header (none: no header).
async fn scrape(admin: std::net::SocketAddr, accept: Option<&str>) -> common::http::HttpResponse {
    let headers: Vec<(&str, &str)> = accept.iter().map(|a| ("Accept", *a)).collect();
    common::http::send(
        admin,
        "GET",
        "/metrics",
        &headers,
        common::http::Body::Bytes(b""),
    )
    .await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_record_says_why_over_http_and_is_flushed() {
    // An upstream that greets with 421: a failure of the upstream itself (a message deferred
    // at RCPT is its own problem and would not open the breaker).
    let sink = start_sink().await;
    sink.pause(idemrelay_sink::Down::Greet421).await.unwrap();
    // One failure opens the breaker for an hour.
    let relay = relay_for(&sink, |s| {
        s.delivery.breaker_threshold = 1;
        s.delivery.breaker_cooldown = Duration::from_secs(3600);
    })
    .await;
    let admin = relay.admin();
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("adm-wait"), "s", "b"),
    )
    .await;
    let path = format!("/api/v1/messages/{id}");
    let shown = common::eventually(LIMIT, "the breaker holding it", || async {
        let m = get(admin, &path, None).await.json();
        (m["waiting"]["reason"] == "breaker_open").then_some(m)
    })
    .await;
    assert!(
        shown["next_attempt_at"].is_string() && shown["waiting"]["detail"].is_string(),
        "{shown}"
    );
    // A worker still claims the job now and then and gives it back at once (the breaker):
    // caught in that moment the listing says `delivering`, so it is asked again.
    let deferred = common::eventually(LIMIT, "the listing saying why", || async {
        let listed = get(admin, "/api/v1/messages?state=deferred", None)
            .await
            .json();
        (listed["messages"][0]["waiting"]["reason"] == "breaker_open").then_some(listed)
    })
    .await;
    assert_eq!(deferred["messages"][0]["id"], id.as_str(), "{deferred}");

    // An operator's pause is the reason above all others (and, as no worker claims anything
    // while it lasts, no flush below meets a lease).
    let paused = post_json(
        admin,
        "/api/v1/queue/pause",
        None,
        r#"{"reason": "maintenance"}"#,
    )
    .await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    assert_eq!(paused.json()["paused"], true);
    // A claim that began before the pause gives its lease back at once (the breaker). One
    // that is still in flight when the lease is read holds the job's row: the flush then
    // answers 409 leased, rightly, and is asked again once that claim has let go.
    common::eventually(LIMIT, "no lease", || async {
        let m = get(admin, &path, None).await.json();
        (m["leased"] == false).then_some(())
    })
    .await;

    let flushed = common::eventually(LIMIT, "a flush that meets no lease", || async {
        let answer = post_json(
            admin,
            &format!("/api/v1/messages/{id}/flush"),
            None,
            r#"{"reason": "probe now"}"#,
        )
        .await;
        let leased = answer.status == 409 && answer.json()["code"] == "leased";
        (!leased).then_some(answer)
    })
    .await;
    assert_eq!(flushed.status, 200, "{}", flushed.body);
    assert_eq!(flushed.json()["flushed"], true);
    assert_eq!(flushed.json()["paused"], true);
    let m = get(admin, &path, None).await.json();
    let history = m["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{m}");
    assert_eq!(history[0]["action"], "flush");
    assert_eq!(history[0]["actor"], "admin API (no token configured)");
    assert_eq!(history[0]["reason"], "probe now");
    // The reason may come in a JSON body; the person is the client's claim, kept beside the
    // token's name, as people write names (spaces, parentheses); a value longer than 64
    // characters, or with bytes other than visible ASCII and spaces, is left out.
    let too_long = "x".repeat(65);
    for (who, recorded) in [
        ("ops-bob", "admin API (no token configured) (ops-bob)"),
        (
            "Ann O'Neil (on call)",
            "admin API (no token configured) (Ann O'Neil (on call))",
        ),
        (too_long.as_str(), "admin API (no token configured)"),
        ("tab\there", "admin API (no token configured)"),
    ] {
        let answer = common::http::send(
            admin,
            "POST",
            &format!("/api/v1/messages/{id}/flush"),
            &[
                ("Content-Type", "application/json"),
                ("X-Idemrelay-Operator", who),
            ],
            common::http::Body::Bytes(br#"{"reason": "from a script"}"#),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let m = get(admin, &path, None).await.json();
        let last = m["history"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["actor"], recorded, "{m}");
        assert_eq!(last["reason"], "from a script");
    }
    let bad_body = common::http::send(
        admin,
        "POST",
        &format!("/api/v1/messages/{id}/flush"),
        &[("Content-Type", "application/json")],
        common::http::Body::Bytes(br#"{"why": "typo"}"#),
    )
    .await;
    assert_eq!(bad_body.status, 400, "{}", bad_body.body);
    assert_eq!(bad_body.json()["code"], "bad_body");
    let all = post_json(admin, "/api/v1/queue/flush", None, "{}").await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert!(all.json()["flushed"].is_u64());
    let missing = post_json(admin, "/api/v1/messages/NOSUCHID/flush", None, "{}").await;
    assert_eq!(missing.status, 404);
    // Parameters an action does not take are refused, not ignored.
    let typo = post_json(
        admin,
        &format!("/api/v1/messages/{id}/flush"),
        None,
        r#"{"reasn": "x"}"#,
    )
    .await;
    assert_eq!(typo.status, 400, "{}", typo.body);

    let m = get(admin, &path, None).await.json();
    assert_eq!(m["waiting"]["reason"], "paused", "{m}");
    assert!(m["waiting"]["detail"]
        .as_str()
        .unwrap()
        .contains("maintenance"));
    let status = get(admin, "/api/v1/queue/status", None).await.json();
    // The flush of every waiting record is one relay-wide action, after the pause.
    assert_eq!(status["recent_actions"][0]["action"], "flush", "{status}");
    assert_eq!(status["recent_actions"][1]["action"], "pause", "{status}");
    let resumed = post_json(admin, "/api/v1/queue/resume", None, "").await;
    assert_eq!(resumed.status, 200);
    assert_eq!(resumed.json()["paused"], false);
}
