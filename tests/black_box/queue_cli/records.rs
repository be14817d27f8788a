//! One message at a time: listed, shown, retried, resolved by hand, cancelled, and a waiting
//! one flushed.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_message_is_listed_shown_and_delivered_after_retry() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Rcpt,
        550,
        "5.1.1 no such user",
    )
    .with_rcpt("nobody@")
    .with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let id = submit(
        &relay,
        "nobody@example.com",
        &message(Some("retry-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Failed).await;
    // The DSN to the sender.
    sink.wait_for_messages(1, LIMIT).await.unwrap();

    // Every column, with the last outcome and the upstream's reply: --wide.
    let list = ok(&relay, &["list", "--wide"]).await.stdout;
    assert!(list.starts_with("ID "), "{list}");
    let line = row(&list, &id);
    for part in [
        "failed",
        "default",
        "retry-1",
        "permanent@rcpt 550",
        "5.1.1",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line:?}");
    }

    let failed = ok(&relay, &["list", "--state", "failed", "--json"])
        .await
        .json();
    assert_eq!(failed["next_cursor"], serde_json::Value::Null);
    let failed = failed["messages"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["id"], id.as_str());
    assert_eq!(failed[0]["state"], "failed");
    assert_eq!(failed[0]["key"], "retry-1");
    assert_eq!(failed[0]["attempts"], 1);
    assert_eq!(failed[0]["last_code"], 550);
    assert_eq!(
        failed[0]["rcpt_to"],
        serde_json::json!(["nobody@example.com"])
    );
    assert_eq!(failed[0]["mail_from"], "sender@example.com");
    let delivered = ok(&relay, &["list", "--state", "delivered", "--json"])
        .await
        .json();
    assert!(delivered["messages"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["id"] != id.as_str()));

    // The DSN and the record it reports on point at each other.
    let shown = ok(&relay, &["show", &id, "--json"]).await.json();
    let dsns = shown["dsns"].as_array().unwrap();
    assert_eq!(dsns.len(), 1, "{shown}");
    let dsn = dsns[0].as_str().unwrap();
    let dsn_shown = ok(&relay, &["show", dsn]).await.stdout;
    assert!(
        dsn_shown.contains(&format!("dsn of          {id}")),
        "{dsn_shown}"
    );
    assert!(
        ok(&relay, &["show", &id])
            .await
            .stdout
            .contains(&format!("dsn sent        {dsn}")),
        "the record names its DSN"
    );

    // By id and by key (in the configured scope).
    for what in [id.as_str(), "retry-1"] {
        let show = ok(&relay, &["show", what]).await.stdout;
        assert!(show.contains(&format!("id              {id}")), "{show}");
        assert!(show.contains("state           failed"), "{show}");
        assert!(show.contains("attempts        1"), "{show}");
        let attempt = line_where(&show, "attempt row", |l| l.starts_with("1 "));
        assert!(attempt.contains("permanent"), "{attempt}");
        assert!(attempt.contains("rcpt"), "{attempt}");
        assert!(attempt.contains("550"), "{attempt}");
    }
    let missing = refused(&relay, &["show", "retry-1", "--scope", "elsewhere"]).await;
    assert!(missing.stderr.contains("no record"), "{}", missing.stderr);

    let retry = ok(&relay, &["retry", &id]).await;
    assert!(
        retry.stdout.contains(&format!("requeued {id}")),
        "{}",
        retry.stdout
    );
    wait_state(&relay, &id, State::Delivered).await;
    let messages = sink.wait_for_messages(2, LIMIT).await.unwrap();
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.key.as_deref() == Some("retry-1"))
            .count(),
        1
    );
    let show = ok(&relay, &["show", &id, "--json"]).await.json();
    assert_eq!(show["state"], "delivered");
    let attempts = show["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{show}");
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[0]["outcome"], "permanent");
    assert_eq!(attempts[1]["attempt"], 2);
    assert_eq!(attempts[1]["outcome"], "accepted");
    assert!(show["upstream_reply"].as_str().unwrap().starts_with("250"));

    let again = refused(&relay, &["retry", &id]).await;
    assert!(
        again.stderr.contains("is delivered") && again.stderr.contains("only failed"),
        "{}",
        again.stderr
    );
    let none = refused(&relay, &["retry", "no-such-id"]).await;
    assert!(none.stderr.contains("no record"), "{}", none.stderr);
    let bad = refused(&relay, &["list", "--state", "lost"]).await;
    assert!(bad.stderr.contains("unknown state"), "{}", bad.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_message_is_retried_only_with_confirmation() {
    let (sink, relay) = common::relay_whose_attempts_end_unknown().await;
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("unres-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Unresolved).await;
    sink.set_faults(vec![]).unwrap();
    let before = relay.store().attempts(&id).await.unwrap().len();

    // This one goes to the store directly (`--direct`), as with a relay that is down.
    let list = ok_via(&relay, Via::Store, &["list", "--state", "unresolved"])
        .await
        .stdout;
    // The narrow listing shows the beginning of the id.
    assert!(row(&list, &id[..16]).contains("unresolved"), "{list}");

    let refusal = refused_via(&relay, Via::Store, &["retry", &id]).await;
    assert!(
        refusal.stderr.contains("unresolved")
            && refusal.stderr.contains("second copy")
            && refusal.stderr.contains("--confirm-duplicate-risk"),
        "{}",
        refusal.stderr
    );
    assert_eq!(refusal.stdout, "");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(relay.stored(&id).await.state, State::Unresolved);
    assert_eq!(relay.store().attempts(&id).await.unwrap().len(), before);

    common::wait_out_held_replies(&relay, &id).await;
    let retry = ok_via(
        &relay,
        Via::Store,
        &[
            "retry",
            "--key",
            "unres-1",
            "--confirm-duplicate-risk",
            "--reason",
            "checked with the upstream: not there",
        ],
    )
    .await;
    assert!(
        retry.stdout.contains(&format!("requeued {id}")),
        "{}",
        retry.stdout
    );
    // The action's one log line names the record.
    assert!(
        retry.stderr.contains(&format!("id={id}")) && retry.stderr.contains("operator action"),
        "{}",
        retry.stderr
    );
    wait_state(&relay, &id, State::Delivered).await;
    let show = ok(&relay, &["show", &id, "--json"]).await.json();
    let history = show["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{show}");
    assert_eq!(history[0]["action"], "retry");
    assert!(
        history[0]["actor"]
            .as_str()
            .unwrap()
            .starts_with("local user "),
        "{show}"
    );
    assert_eq!(history[0]["reason"], "checked with the upstream: not there");
    assert!(
        history[0]["detail"]
            .as_str()
            .unwrap()
            .contains("duplicate risk confirmed"),
        "{show}"
    );
    // The old ledger stays; new attempts continue its numbering and the last one is accepted
    // (the upstream's replay of the transaction it held).
    let attempts = show["attempts"].as_array().unwrap();
    assert!(attempts.len() > before, "{show}");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(a["attempt"], i + 1, "{show}");
    }
    // Each earlier attempt ended UNKNOWN, or, on a loaded machine, missed a 2 s connect or
    // greeting deadline (transient); the same reading as tests/in_process/admin.rs.
    let earlier = &attempts[..before];
    assert!(
        earlier.iter().any(|a| a["outcome"] == "unknown")
            && earlier
                .iter()
                .all(|a| a["outcome"] == "unknown" || a["outcome"] == "transient"),
        "{show}"
    );
    assert_eq!(attempts.last().unwrap()["outcome"], "accepted", "{show}");
    // The same key and bytes: the upstream holds one copy.
    let copies = sink
        .messages()
        .iter()
        .filter(|m| m.key.as_deref() == Some("unres-1"))
        .count();
    assert_eq!(copies, 1);
}

/// `queue resolve` closes unresolved records without sending them again: through the API as
/// delivered, on the store itself (`--direct`) as failed; each is in the record's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_message_is_resolved_by_hand_without_a_resend() {
    let (sink, relay) = common::relay_whose_attempts_end_unknown().await;
    let seen = submit(&relay, "a@example.com", &message(Some("res-1"), "s", "b")).await;
    let lost = submit(&relay, "b@example.com", &message(Some("res-2"), "s", "b")).await;
    wait_state(&relay, &seen, State::Unresolved).await;
    wait_state(&relay, &lost, State::Unresolved).await;
    sink.set_faults(vec![]).unwrap();
    let copies = sink.messages().len();

    // The reason and the outcome are both required.
    let refusal = refused(&relay, &["resolve", &seen, "--as", "delivered"]).await;
    assert!(refusal.stderr.contains("--reason"), "{}", refusal.stderr);
    let refusal = refused(&relay, &["resolve", &seen, "--as", "sent", "--reason", "x"]).await;
    assert!(refusal.stderr.contains("delivered"), "{}", refusal.stderr);

    let done = ok(
        &relay,
        &[
            "resolve",
            "--key",
            "res-1",
            "--as",
            "delivered",
            "--reason",
            "upstream log: 250 at 10:02",
        ],
    )
    .await;
    assert_eq!(
        done.stdout,
        format!("resolved {seen} as delivered: not sent again, no DSN\n")
    );
    let done = ok_via(
        &relay,
        Via::Store,
        &[
            "resolve",
            &lost,
            "--as",
            "failed",
            "--reason",
            "no trace upstream",
        ],
    )
    .await;
    assert!(done.stdout.contains("as failed"), "{}", done.stdout);
    assert!(
        done.stderr.contains(&format!("id={lost}")) && done.stderr.contains("action=resolve"),
        "{}",
        done.stderr
    );
    assert_eq!(relay.stored(&seen).await.state, State::Delivered);
    assert_eq!(relay.stored(&lost).await.state, State::Failed);

    let show = ok(&relay, &["show", &seen, "--json"]).await.json();
    let history = show["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{show}");
    assert_eq!(history[0]["action"], "resolve");
    assert_eq!(history[0]["detail"], "delivered");
    assert_eq!(history[0]["reason"], "upstream log: 250 at 10:02");

    // Resolved twice is refused; nothing went upstream again.
    let again = refused(
        &relay,
        &["resolve", &seen, "--as", "failed", "--reason", "x"],
    )
    .await;
    assert!(again.stderr.contains("only unresolved"), "{}", again.stderr);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(sink.messages().len(), copies);
    let unresolved = ok(&relay, &["list", "--state", "unresolved"]).await.stdout;
    assert!(
        !unresolved.contains(&seen) && !unresolved.contains(&lost),
        "{unresolved}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_message_is_cancelled_and_never_delivered() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    relay.store().pause("hold", false).await.unwrap();
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("cancel-1"), "s", "b"),
    )
    .await;
    let queued = ok(&relay, &["list", "--state", "queued", "--json"])
        .await
        .json();
    let queued = &queued["messages"];
    assert_eq!(queued[0]["id"], id.as_str());
    assert_eq!(queued[0]["state"], "queued");
    assert_eq!(queued[0]["attempts"], 0);
    assert_eq!(queued[0]["waiting"]["reason"], "paused", "{queued}");

    let cancel = ok(
        &relay,
        &[
            "cancel",
            "--key",
            "cancel-1",
            "--reason",
            "sent to the wrong list",
        ],
    )
    .await;
    assert!(
        cancel.stdout.contains(&format!("cancelled {id}")),
        "{}",
        cancel.stdout
    );
    let show = ok(&relay, &["show", &id]).await.stdout;
    assert!(show.contains("state           cancelled"), "{show}");
    assert!(show.contains("cancelled by an operator"), "{show}");
    assert!(show.contains("attempts        0"), "{show}");
    assert!(show.contains("operator actions 1"), "{show}");
    let action = line_where(&show, "cancel row", |l| l.contains(" cancel "));
    // Through the API, the actor is the token's name and the local user the CLI names.
    assert!(action.contains("admin API"), "{action}");
    assert!(action.contains("sent to the wrong list"), "{action}");
    let cancelled = ok(&relay, &["list", "--state", "cancelled", "--json"])
        .await
        .json();
    assert_eq!(cancelled["messages"][0]["id"], id.as_str());
    assert_eq!(
        ok(&relay, &["list", "--state", "failed", "--json"])
            .await
            .json()["messages"],
        serde_json::json!([]),
        "cancelled is not failed"
    );

    relay.store().resume().await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(sink.transactions(), vec![]);
    assert_eq!(relay.stored(&id).await.state, State::Cancelled);
    assert_eq!(relay.count("delivery_jobs").await, 0, "no DSN, no job");

    let again = refused(&relay, &["cancel", &id]).await;
    assert!(again.stderr.contains("only queued"), "{}", again.stderr);

    // Parked for an operator: nothing goes within `parked_retention` (30 days); past it,
    // the cancelled record does.
    let purge = ok(&relay, &["purge", "--expired"]).await;
    assert!(purge.stdout.contains("purged 0 "), "{}", purge.stdout);
    common::backend::age_records(relay.settings.store.expose(), 31 * DAY).await;
    let purge = ok(&relay, &["purge", "--expired"]).await;
    assert!(purge.stdout.contains("purged 1 "), "{}", purge.stdout);
    let gone = refused(&relay, &["show", &id]).await;
    assert!(gone.stderr.contains("no record"), "{}", gone.stderr);
    assert!(refused(&relay, &["purge"])
        .await
        .stderr
        .contains("--expired"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_message_says_why_and_flush_sends_it_now() {
    // Every attempt is deferred by the upstream until the faults are cleared.
    let sink = common::start_deferring_sink().await;
    let relay = relay_for(&sink, |s| {
        s.delivery.retry_base = Duration::from_secs(3600);
        s.delivery.retry_cap = Duration::from_secs(3600);
        s.delivery.max_attempts = 1000;
    })
    .await;
    let id = submit(
        &relay,
        "Waiting@Example.com",
        &message(Some("flush-1"), "s", "b"),
    )
    .await;
    // Full jitter may pick a short backoff now and then: wait for a long one.
    let listed = common::eventually(LIMIT, "a long backoff", || async {
        let run = ok(&relay, &["list", "--state", "deferred", "--json"]).await;
        let page = run.json();
        let row = page["messages"].as_array()?.first()?.clone();
        let due = row["next_attempt_at_ms"].as_i64()?;
        (due > common::now_ms() + 60_000).then_some(row)
    })
    .await;
    assert_eq!(listed["id"], id.as_str());
    assert_eq!(listed["waiting"]["reason"], "backoff", "{listed}");
    assert_eq!(listed["last_outcome"], "transient");
    let table = ok(&relay, &["list", "--state", "deferred"]).await.stdout;
    let line = row(&table, &id[..16]);
    assert!(line.contains("backoff"), "{table}");
    assert!(line.contains("waiting@example.com") || line.contains("Waiting@Example.com"));
    let show = ok(&relay, &["show", "--key", "flush-1"]).await.stdout;
    assert!(
        show.contains("waiting         backoff: retry backoff"),
        "{show}"
    );
    assert!(show.contains("next attempt"), "{show}");

    // Finding it: by recipient (any case), sender, Message-ID-less key, scope and time.
    for filter in [
        vec!["--recipient", "waiting@example.com"],
        vec!["--sender", "SENDER@example.com"],
        vec!["--key", "flush-1", "--in-scope", "default"],
        vec!["--since", "10m", "--state", "queued"],
    ] {
        let mut args = vec!["list", "--json"];
        args.extend(&filter);
        let page = ok(&relay, &args).await.json();
        let ids: Vec<&str> = page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [id.as_str()], "{filter:?}");
    }
    for filter in [
        vec!["--recipient", "waiting@example"],
        vec!["--in-scope", "elsewhere"],
        vec!["--until", "10m"],
        vec!["--state", "delivered"],
    ] {
        let mut args = vec!["list", "--json"];
        args.extend(&filter);
        let page = ok(&relay, &args).await.json();
        assert_eq!(page["messages"], serde_json::json!([]), "{filter:?}");
    }
    let bad = refused(&relay, &["list", "--state", "lost"]).await;
    assert!(bad.stderr.contains("deferred"), "{}", bad.stderr);

    sink.set_faults(vec![]).unwrap();
    let flush = ok(&relay, &["flush", &id, "--reason", "the upstream is back"]).await;
    assert!(
        flush.stdout.contains(&format!("flushed {id}: due now")),
        "{}",
        flush.stdout
    );
    wait_state(&relay, &id, State::Delivered).await;
    let shown = ok(&relay, &["show", &id, "--json"]).await.json();
    assert_eq!(shown["waiting"], serde_json::Value::Null);
    let history = shown["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{shown}");
    assert_eq!(history[0]["action"], "flush");
    assert_eq!(history[0]["reason"], "the upstream is back");
    assert!(
        history[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("was due in"),
        "{shown}"
    );
    let again = refused(&relay, &["flush", &id]).await;
    assert!(again.stderr.contains("only queued"), "{}", again.stderr);
    let all = ok(&relay, &["flush", "--all"]).await;
    assert!(
        all.stdout.starts_with("flushed 0 record(s)"),
        "{}",
        all.stdout
    );

    // A page at a time, with the way on printed under the table.
    let second = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("flush-2"), "s", "b"),
    )
    .await;
    let first = ok(&relay, &["list", "--limit", "1"]).await.stdout;
    let more = first
        .lines()
        .find_map(|l| l.strip_prefix("more: --cursor "))
        .unwrap_or_else(|| panic!("no cursor line:\n{first}"));
    assert!(first.contains(&id[..16]), "{first}");
    let next = ok(&relay, &["list", "--limit", "1", "--cursor", more])
        .await
        .stdout;
    assert!(next.contains(&second[..16]), "{next}");
    assert!(!next.contains("more:"), "{next}");
    let newest = ok(&relay, &["list", "--newest", "--limit", "1"])
        .await
        .stdout;
    assert!(
        newest.contains(&second[..16]) && newest.contains("more: --cursor"),
        "{newest}"
    );
}
