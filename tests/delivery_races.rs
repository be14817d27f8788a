//! Delivery under slow upstreams and a failing store: no path sends a message twice or loses
//! a known outcome (found in review; each of these failed before its fix).

mod common;

use std::time::Duration;

use common::{eventually, fast_delivery, message, submit, TestRelay};
use idemrelay::sink::{FaultRule, Phase as SinkPhase, Sink, SinkConfig};
use idemrelay::store::State;

async fn wait_terminal(relay: &TestRelay, id: &str, limit: Duration) -> State {
    eventually(limit, "a terminal state", || async {
        let state = relay.stored(id).await.state;
        (state != State::Queued).then_some(state)
    })
    .await
}

/// An attempt longer than the lease (100 tarpitted RCPTs) keeps its lease by renewing it, so
/// no second worker claims the job and sends it again meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_attempt_renews_its_lease_instead_of_being_sent_twice() {
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    sink.set_faults(vec![FaultRule::delay(
        SinkPhase::Rcpt,
        Duration::from_millis(170),
    )])
    .unwrap();
    let addr = sink.smtp_addr();
    let relay = TestRelay::start_with(|s| {
        fast_delivery(s, addr);
        let t = &mut s.delivery.timeouts;
        let d = Duration::from_millis(200);
        (
            t.connect, t.greeting, t.starttls, t.auth, t.mail, t.rcpt, t.data,
        ) = (d, d, d, d, d, d, d);
        t.dot = Duration::from_secs(1);
    })
    .await;
    let rcpts: Vec<String> = (0..100).map(|i| format!("r{i}@example.com")).collect();
    let rcpts: Vec<&str> = rcpts.iter().map(String::as_str).collect();
    let id = submit(
        &relay,
        "sender@example.com",
        &rcpts,
        &message(Some("lease-1"), "s", "b"),
    )
    .await;
    assert_eq!(
        wait_terminal(&relay, &id, Duration::from_secs(60)).await,
        State::Delivered
    );
    assert_eq!(
        sink.transactions().len(),
        1,
        "two workers sent the same job"
    );
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
}

/// A retry of an UNKNOWN whose slow early phases would carry its DATA past the upstream's
/// window is stopped before DATA: the message is parked, not sent a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_retry_never_reaches_data_after_the_window() {
    let window = Duration::from_secs(6);
    let sink = Sink::start(SinkConfig {
        window,
        ..SinkConfig::default()
    })
    .await
    .unwrap();
    sink.set_faults(vec![FaultRule::drop_after_dot().with_times(1)])
        .unwrap();
    let addr = sink.smtp_addr();
    let relay = TestRelay::start_with(|s| {
        fast_delivery(s, addr);
        s.delivery.upstream_window = window;
        s.delivery.window_margin = Duration::from_millis(1500);
        s.delivery.retry_base = Duration::from_secs(1);
        s.delivery.retry_cap = Duration::from_secs(1);
        s.delivery.timeouts.greeting = Duration::from_secs(4);
        s.delivery.timeouts.dot = Duration::from_secs(1);
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("win-1"), "s", "b"),
    )
    .await;
    eventually(Duration::from_secs(10), "the first attempt", || async {
        (sink.transactions().len() == 1).then_some(())
    })
    .await;
    let d = Duration::from_millis(1500);
    sink.set_faults(vec![
        FaultRule::delay(SinkPhase::Connect, d),
        FaultRule::delay(SinkPhase::Ehlo, d),
        FaultRule::delay(SinkPhase::Mail, d),
        FaultRule::delay(SinkPhase::Rcpt, d),
        FaultRule::delay(SinkPhase::Data, d),
    ])
    .unwrap();
    assert_eq!(
        wait_terminal(&relay, &id, Duration::from_secs(30)).await,
        State::Unresolved
    );
    assert_eq!(sink.messages().len(), 1, "the upstream accepted two copies");
    assert_eq!(
        sink.transactions().len(),
        1,
        "a retry reached the final dot"
    );
}

/// The DSN key is per failed record: a key reused after retention that fails again gets its
/// own notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failure_under_a_reused_key_gets_its_own_dsn() {
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    sink.set_faults(vec![FaultRule::reply(
        SinkPhase::Rcpt,
        550,
        "5.1.1 no such user",
    )
    .with_rcpt("nobody@")])
        .unwrap();
    let addr = sink.smtp_addr();
    let relay = TestRelay::start_with(|s| {
        fast_delivery(s, addr);
        s.retention = Duration::from_secs(1);
        s.purge_interval = Duration::from_secs(3600);
    })
    .await;
    let a = submit(
        &relay,
        "sender@example.com",
        &["nobody@example.com"],
        &message(Some("reuse-1"), "s", "first"),
    )
    .await;
    assert_eq!(
        wait_terminal(&relay, &a, Duration::from_secs(10)).await,
        State::Failed
    );
    sink.wait_for_messages(1, Duration::from_secs(10))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b = submit(
        &relay,
        "sender@example.com",
        &["nobody@example.com"],
        &message(Some("reuse-1"), "s", "second"),
    )
    .await;
    assert_ne!(a, b);
    assert_eq!(
        wait_terminal(&relay, &b, Duration::from_secs(10)).await,
        State::Failed
    );
    sink.wait_for_messages(2, Duration::from_secs(10))
        .await
        .unwrap();
}

/// The store refuses writes while the upstream accepts the message: the known outcome is
/// written once the store is back, never turned into an UNKNOWN and sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_hiccup_at_settle_time_does_not_resend() {
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    sink.set_faults(vec![FaultRule::delay(
        SinkPhase::Dot,
        Duration::from_millis(1500),
    )])
    .unwrap();
    let addr = sink.smtp_addr();
    let relay = TestRelay::start_with(|s| {
        fast_delivery(s, addr);
        s.store_busy_timeout = Duration::from_millis(500);
        s.delivery.timeouts.dot = Duration::from_secs(3);
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("settle-1"), "s", "b"),
    )
    .await;
    eventually(Duration::from_secs(10), "an open intent", || async {
        relay
            .store()
            .attempts(&id)
            .await
            .unwrap()
            .first()
            .filter(|a| a.outcome.is_none())
            .map(|_| ())
    })
    .await;
    // Hold the store's write lock across the moment the outcome is written.
    let lock = common::backend::WriteLock::hold(relay.settings.store.expose()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    lock.release().await;
    assert_eq!(
        wait_terminal(&relay, &id, Duration::from_secs(30)).await,
        State::Delivered
    );
    assert_eq!(
        sink.transactions().len(),
        1,
        "sent again after a lost settle"
    );
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].outcome.as_deref(), Some("accepted"));
}
