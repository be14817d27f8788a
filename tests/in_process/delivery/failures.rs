//! Temporary and permanent failures, outages, the breaker, and an outcome still unknown
//! after the window.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_then_success_is_delivered() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Rcpt,
        451,
        "4.3.0 try again later",
    )
    .with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("transient-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Delivered).await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert_eq!(ledger[0].outcome.as_deref(), Some("transient"));
    assert_eq!(ledger[0].phase.as_deref(), Some("rcpt"));
    assert_eq!(ledger[0].code, Some(451));
    assert_eq!(sink.messages().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_at_rcpt_fails_the_message_and_sends_one_dsn() {
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
        "sender@example.com",
        &["nobody@example.com"],
        &message(Some("perm-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Failed).await;
    let dsns = sink.wait_for_messages(1, LIMIT).await.unwrap();
    assert_eq!(dsns.len(), 1);
    let dsn = &dsns[0];
    assert_eq!(dsn.mail_from, "", "DSNs use the null sender");
    assert_eq!(dsn.rcpt_to, vec!["sender@example.com"]);
    let text = String::from_utf8_lossy(&dsn.bytes);
    assert!(text.contains("report-type=delivery-status"), "{text}");
    assert!(text.contains("Status: 5.1.1"), "{text}");
    assert!(
        text.contains("Final-Recipient: rfc822; nobody@example.com"),
        "{text}"
    );
    assert!(dsn.key.as_deref().unwrap().starts_with("dsn-"));
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].outcome.as_deref(), Some("permanent"));
    // Nothing else arrives later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.messages().len(), 1);
    assert_eq!(sink.transactions().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_for_a_while_is_delivered_after_it_returns() {
    let sink = start_sink().await;
    // Greet421 keeps the port: a refused port could be handed to another test's sink.
    sink.pause(Down::Greet421).await.unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("down-1"), "s", "b"),
    )
    .await;
    eventually(LIMIT, "a few failed connects", || async {
        (relay.store().attempts(&id).await.unwrap().len() >= 2).then_some(())
    })
    .await;
    sink.resume().await.unwrap();
    wait_state(&relay, &id, State::Delivered).await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert!(ledger[..ledger.len() - 1]
        .iter()
        .all(|a| a.outcome.as_deref() == Some("transient") && a.code == Some(421)));
    assert_eq!(sink.messages().len(), 1);
}

/// The breaker's changes (closed, open, half-open, closed) are counted, and `/readyz` shows
/// its state while staying 200: an open breaker protects the upstream, the relay still takes
/// mail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_changes_are_counted_and_shown_by_readyz() {
    use common::http::{get, sample};
    let sink = start_sink().await;
    sink.pause(Down::Greet421).await.unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.breaker_threshold = 2;
        s.delivery.breaker_cooldown = Duration::from_millis(300);
    })
    .await;
    let admin = relay.admin();
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("breaker-1"), "s", "b"),
    )
    .await;
    let ready = eventually(LIMIT, "/readyz showing the breaker open", || async {
        let ready = get(admin, "/readyz", None).await;
        (ready.json()["breaker"] == "open").then_some(ready)
    })
    .await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    sink.resume().await.unwrap();
    wait_state(&relay, &id, State::Delivered).await;
    let ready = eventually(LIMIT, "/readyz showing the breaker closed", || async {
        let ready = get(admin, "/readyz", None).await;
        (ready.json()["breaker"] == "closed").then_some(ready)
    })
    .await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    let page = get(admin, "/metrics", None).await.body;
    let value =
        |series: &str| sample(&page, series).unwrap_or_else(|| panic!("{series} missing:\n{page}"));
    for to in ["open", "half_open", "closed"] {
        let series = format!("idemrelay_circuit_breaker_transitions_total{{to=\"{to}\"}}");
        assert!(value(&series) >= 1.0, "{series} in:\n{page}");
    }
    assert_eq!(
        value("idemrelay_circuit_breaker_state{state=\"closed\"}"),
        1.0
    );
    // The 421 greetings are 4xx replies; the last attempt a 2xx.
    assert!(value("idemrelay_upstream_replies_total{class=\"4xx\"}") >= 2.0);
    assert_eq!(
        value("idemrelay_upstream_replies_total{class=\"2xx\"}"),
        1.0
    );
    // Counted just after the commit that wait_state saw.
    eventually(LIMIT, "the delivery latency observed", || async {
        let page = get(admin, "/metrics", None).await.body;
        (sample(&page, "idemrelay_delivery_latency_seconds_count") == Some(1.0)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_past_the_window_is_unresolved_and_not_resent() {
    let (sink, relay) = common::relay_whose_attempts_end_unknown().await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("window-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Unresolved).await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    // Every attempt ends UNKNOWN, except that the last may have been claimed just inside the
    // window and stopped before DATA as it closed: not sent, so transient.
    let (last, earlier) = ledger.split_last().unwrap();
    assert!(
        earlier
            .iter()
            .all(|a| a.outcome.as_deref() == Some("unknown")),
        "{ledger:?}"
    );
    assert!(
        last.outcome.as_deref() == Some("unknown")
            || (last.outcome.as_deref() == Some("transient")
                && last.phase.as_deref() == Some("data")
                && last.reply.as_deref().is_some_and(|r| r.contains("window"))),
        "{ledger:?}"
    );
    // No attempt starts after window - margin; an attempt's start is written just after its
    // claim passed that check, hence the slack.
    let ms = |d: Duration| d.as_millis() as i64;
    let last_start = ms(common::UNKNOWN_WINDOW - common::UNKNOWN_WINDOW_MARGIN);
    let first = ledger[0].started_at_ms;
    for a in &ledger {
        assert!(
            a.started_at_ms - first < last_start + 300,
            "attempt after window - margin: {ledger:?}"
        );
    }
    // What the window protects: no transaction reached the upstream after it closed.
    for t in sink.transactions() {
        assert!(
            (t.received_at_ms as i64) < first + ms(common::UNKNOWN_WINDOW),
            "a transaction after the window: {t:?}"
        );
    }
    let transactions = sink.transactions().len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        sink.transactions().len(),
        transactions,
        "resent after unresolved"
    );
    assert_eq!(
        relay.store().attempts(&id).await.unwrap().len(),
        ledger.len()
    );
}

/// The 354 may take up to the DATA timeout: a retry that passed the window check before DATA
/// must not begin its body once the window has closed while it waited (docs/concepts/delivery.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_body_byte_leaves_after_the_window_even_when_the_354_is_slow() {
    const WINDOW: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(1);
    // The first attempt starts at t0, waits this for its 354 and loses its reply (UNKNOWN);
    // the retry starts its DATA well before t0 + WINDOW - MARGIN, and its 354 comes after.
    const SLOW_354: Duration = Duration::from_secs(5);
    let sink = start_sink().await;
    sink.set_faults(vec![
        FaultRule::drop_after_dot().with_times(1),
        FaultRule::delay(FaultStage::Data, SLOW_354),
    ])
    .unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.upstream_window = WINDOW;
        s.delivery.window_margin = MARGIN;
        s.delivery.timeouts.data = Duration::from_secs(8);
    })
    .await;
    let msg = message(Some("slow-354-1"), "s", "body");
    let id = submit(&relay, "sender@example.com", &["rcpt@example.com"], &msg).await;
    wait_state(&relay, &id, State::Unresolved).await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    let second = &ledger[1];
    assert_eq!(
        (second.outcome.as_deref(), second.phase.as_deref()),
        (Some("transient"), Some("data")),
        "{ledger:?}"
    );
    let limit = ledger[0].started_at_ms + (WINDOW - MARGIN).as_millis() as i64;
    assert!(
        second.started_at_ms < limit,
        "the retry began in time: {ledger:?}"
    );
    assert_eq!(
        sink.transactions().len(),
        1,
        "a body was sent after the window: {:?}",
        sink.transactions()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_a_key_is_not_retried_after_unknown() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::drop_after_dot().with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |s| {
        s.missing_key = idemrelay::mail::MissingKey::Pass;
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(None, "s", "no key"),
    )
    .await;
    wait_state(&relay, &id, State::Unresolved).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.transactions().len(), 1);
}
