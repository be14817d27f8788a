//! Records over the API: read, listed in pages, retried, requeued, resolved, cancelled,
//! and waiting ones flushed.

use super::*;

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
