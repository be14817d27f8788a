//! Pauses: an account failure, an operator's pause, probes still refused, and shutdown.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_failure_pauses_the_queue_instead_of_failing_messages() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Mail,
        554,
        "5.7.1 Account suspended: sending disabled",
    )
    .with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.pause_probe_interval = Duration::from_millis(300);
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("account-1"), "s", "b"),
    )
    .await;
    // The refusal paused delivery; the probe finds the upstream normal again and resumes.
    wait_state(&relay, &id, State::Delivered).await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(
        ledger[0].outcome.as_deref(),
        Some("transient"),
        "{ledger:?}"
    );
    assert_eq!(ledger[0].code, Some(554));
    assert_eq!(relay.store().paused().await.unwrap(), None);
    assert_eq!(sink.messages().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pause_holds_delivery_until_resumed() {
    let sink = start_sink().await;
    // The probe interval is short: an operator's pause must still wait for the operator.
    let relay = relay_for(&sink, |_| {}).await;
    relay.store().pause("maintenance", false).await.unwrap();
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("op-pause-1"), "s", "b"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.transactions(), vec![]);
    assert_eq!(relay.stored(&id).await.state, State::Queued);
    relay.store().resume().await.unwrap();
    wait_state(&relay, &id, State::Delivered).await;
}

/// An operator who pauses delivery while the relay's own probe is talking to the upstream
/// keeps the pause: the probe's success lifts only the pause the relay set itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pause_made_during_a_probe_survives_its_success() {
    let sink = start_sink().await;
    // The attempt meets an account-level refusal (the relay pauses itself); the probe that
    // follows is slow at MAIL, then normal.
    sink.set_faults(vec![
        FaultRule::reply(FaultStage::Mail, 554, "5.7.1 Account suspended").with_times(1),
        FaultRule::delay(FaultStage::Mail, Duration::from_secs(3)).with_times(1),
    ])
    .unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.pause_probe_interval = Duration::from_millis(200);
        // The slow MAIL is within its deadline: the probe succeeds.
        s.delivery.timeouts.mail = Duration::from_secs(10);
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("probe-vs-operator"), "s", "b"),
    )
    .await;
    eventually(LIMIT, "the probe held at MAIL", || async {
        (sink.faults()[1].fired == 1).then_some(())
    })
    .await;
    let paused = common::http::post_json(
        relay.admin(),
        "/api/v1/queue/pause",
        None,
        r#"{"reason": "operator hold"}"#,
    )
    .await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    // The probe succeeds about 3 s after it began; wait well past it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let pause = relay.store().paused().await.unwrap();
    assert_eq!(
        pause.as_ref().map(|p| (p.reason.as_str(), p.probe)),
        Some(("operator hold", false)),
        "the operator's pause was lifted by the probe"
    );
    assert_eq!(sink.messages().len(), 0, "mail went out during the pause");
    assert_eq!(relay.stored(&id).await.state, State::Queued);
}

/// SIGTERM while an attempt waits for a slow reply to the final dot: the attempt runs to
/// its end within `shutdown_grace` (the process stays alive in the store's eyes meanwhile),
/// so its outcome is recorded instead of being left open as UNKNOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_in_flight_at_shutdown_finishes_within_the_grace_period() {
    let sink = start_sink().await;
    // Longer than a heartbeat's lifetime (10 s), shorter than the grace.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_secs(13),
    )
    .with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |s| {
        s.shutdown_grace = Duration::from_secs(40);
        s.delivery.timeouts.dot = Duration::from_secs(30);
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("slow-at-shutdown"), "s", "b"),
    )
    .await;
    eventually(LIMIT, "the attempt waiting at the dot", || async {
        (sink.faults()[0].fired == 1).then_some(())
    })
    .await;
    let store = relay.store().clone();
    let started = std::time::Instant::now();
    relay.relay.shutdown().await;
    let took = started.elapsed();
    let ledger = store.attempts(&id).await.unwrap();
    assert_eq!(
        ledger
            .iter()
            .map(|a| a.outcome.as_deref())
            .collect::<Vec<_>>(),
        vec![Some("accepted")],
        "after {took:?}: {ledger:?}"
    );
    assert_eq!(
        store.message(&id).await.unwrap().unwrap().state,
        State::Delivered
    );
    assert_eq!(sink.messages().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_that_are_still_refused_at_mail_keep_the_queue_paused() {
    let sink = start_sink().await;
    // The first attempt and the next two probes meet the refusal at MAIL.
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Mail,
        554,
        "5.7.1 Sending quota exceeded for this account",
    )
    .with_times(3)])
        .unwrap();
    // Probes 1 s apart keep the pause up for about 2 s: long enough to be seen by polling.
    let relay = relay_for(&sink, |s| {
        s.delivery.pause_probe_interval = Duration::from_secs(1);
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("quota-1"), "s", "b"),
    )
    .await;
    eventually(LIMIT, "the pause", || async {
        relay.store().paused().await.unwrap().map(|_| ())
    })
    .await;
    wait_state(&relay, &id, State::Delivered).await;
    // Probes are not attempts: one refused attempt, then the delivery.
    let ledger = relay.store().attempts(&id).await.unwrap();
    let outcomes: Vec<_> = ledger.iter().map(|a| a.outcome.clone().unwrap()).collect();
    assert_eq!(outcomes, vec!["transient", "accepted"], "{ledger:?}");
    assert_eq!(sink.faults()[0].fired, 3, "the probes met the refusal too");
}
