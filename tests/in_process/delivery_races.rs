//! Delivery under slow upstreams and a failing store: no path sends a message twice or loses
//! a known outcome (found in review; each of these failed before its fix).

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{eventually, fast_delivery, message, submit, TestRelay};
use idemrelay::app::Relay;
use idemrelay::smtp::server::ListenerKind;
use idemrelay::store::{
    self, Action, ActionRow, AttemptResult, AttemptRow, Claimed, DailyCounts, Existing, Flush,
    Insert, IntakeStore, ListFilter, NewRecord, Operator, OperatorStore, Page, Pause, QueueStats,
    QueueStore, ReadStore, Requeue, Resolution, Resolve, Retention, Settle, State, Store,
    StoreError, StoredMessage, WebhookStore,
};
use idemrelay_sink::{FaultRule, FaultStage, Sink, SinkConfig, SinkHandle};

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
    // 100 RCPTs at 200 ms each (20 s) outlast the lease: the worst-case attempt (7 phases at
    // 500 ms, 4 RCPTs at 600 ms, the dot at 1 s: 6.9 s) plus 10 s. Each RCPT keeps 400 ms to
    // spare for a loaded machine.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Rcpt,
        Duration::from_millis(200),
    )])
    .unwrap();
    let addr = sink.smtp_addr();
    let relay = TestRelay::start_with(|s| {
        fast_delivery(s, addr);
        let t = &mut s.delivery.timeouts;
        let d = Duration::from_millis(500);
        (t.connect, t.greeting, t.starttls, t.auth, t.mail, t.data) = (d, d, d, d, d, d);
        t.rcpt = Duration::from_millis(600);
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
    // The first attempt ends UNKNOWN by the relay's 1 s dot timeout; the sink counts the
    // transaction at the dot, so the test has that second (and the retry's backoff) to slow
    // the sink down before the retry connects.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_secs(3),
    )
    .with_times(1)])
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
        FaultRule::delay(FaultStage::Connect, d),
        FaultRule::delay(FaultStage::Ehlo, d),
        FaultRule::delay(FaultStage::Mail, d),
        FaultRule::delay(FaultStage::Rcpt, d),
        FaultRule::delay(FaultStage::Data, d),
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
        FaultStage::Rcpt,
        550,
        "5.1.1 no such user",
    )
    .with_rcpt("nobody@")])
        .unwrap();
    let addr = sink.smtp_addr();
    let relay = TestRelay::start_with(|s| {
        fast_delivery(s, addr);
        // Failed records are parked and keep their key until the upstream window closed on
        // their last attempt: all three short here, so that the key is soon free again.
        s.retention = Duration::from_secs(1);
        s.parked_retention = Duration::from_secs(1);
        s.delivery.upstream_window = Duration::from_secs(1);
        s.delivery.window_margin = Duration::from_millis(500);
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
        FaultStage::Dot,
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

/// A store that fails the next `begin_attempt` calls, either before writing anything or after
/// committing the intent (the commit's answer lost), and otherwise is the real store.
struct FlakyIntent {
    inner: Arc<dyn Store>,
    failures: AtomicU32,
    commit_first: bool,
}

#[async_trait]
impl IntakeStore for FlakyIntent {
    async fn insert(&self, record: &NewRecord, retention: Retention) -> Result<Insert, StoreError> {
        self.inner.insert(record, retention).await
    }
    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        retention: Retention,
    ) -> Result<Vec<Existing>, StoreError> {
        self.inner.lookup(scope, key, retention).await
    }
    async fn probe(&self) -> Result<(), StoreError> {
        self.inner.probe().await
    }
    async fn record_replay(&self, scope: &str, at_ms: i64) -> Result<(), StoreError> {
        self.inner.record_replay(scope, at_ms).await
    }
    async fn claim_key_space(&self, key_space: &str, scope: &str) -> Result<String, StoreError> {
        self.inner.claim_key_space(key_space, scope).await
    }
}

#[async_trait]
impl QueueStore for FlakyIntent {
    async fn claim(&self, owner: &str, lease: Duration) -> Result<Option<Claimed>, StoreError> {
        self.inner.claim(owner, lease).await
    }
    async fn claim_id(
        &self,
        id: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError> {
        self.inner.claim_id(id, owner, lease).await
    }
    async fn begin_attempt(&self, id: &str, token: i64, attempt: u32) -> Result<bool, StoreError> {
        let fail = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !fail {
            return self.inner.begin_attempt(id, token, attempt).await;
        }
        if self.commit_first {
            self.inner.begin_attempt(id, token, attempt).await?;
        }
        Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut))
    }
    async fn settle(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
    ) -> Result<bool, StoreError> {
        self.inner.settle(id, token, attempt, settle).await
    }
    async fn settle_answered(
        &self,
        id: &str,
        token: i64,
        attempt: Option<(u32, &AttemptResult)>,
        settle: &Settle,
        reply: &str,
    ) -> Result<bool, StoreError> {
        self.inner
            .settle_answered(id, token, attempt, settle, reply)
            .await
    }
    async fn renew_lease(&self, id: &str, token: i64, lease: Duration) -> Result<bool, StoreError> {
        self.inner.renew_lease(id, token, lease).await
    }
    async fn release(&self, id: &str, token: i64, after: Duration) -> Result<(), StoreError> {
        self.inner.release(id, token, after).await
    }
    async fn heartbeat(&self, process: &str) -> Result<(), StoreError> {
        self.inner.heartbeat(process).await
    }
    async fn reclaim_dead_leases(&self, stale_after: Duration) -> Result<u64, StoreError> {
        self.inner.reclaim_dead_leases(stale_after).await
    }
    async fn paused(&self) -> Result<Option<Pause>, StoreError> {
        self.inner.paused().await
    }
    async fn pause(&self, reason: &str, probe: bool) -> Result<(), StoreError> {
        self.inner.pause(reason, probe).await
    }
    async fn resume(&self) -> Result<(), StoreError> {
        self.inner.resume().await
    }
    async fn resume_after_probe(&self) -> Result<bool, StoreError> {
        self.inner.resume_after_probe().await
    }
}

#[async_trait]
impl OperatorStore for FlakyIntent {
    async fn requeue(
        &self,
        id: &str,
        allow_unresolved: bool,
        by: &Operator,
    ) -> Result<Requeue, StoreError> {
        self.inner.requeue(id, allow_unresolved, by).await
    }
    async fn cancel(&self, id: &str, by: &Operator) -> Result<bool, StoreError> {
        self.inner.cancel(id, by).await
    }
    async fn cancel_all(
        &self,
        ids: &[String],
        by: &Operator,
        what: &str,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.cancel_all(ids, by, what).await
    }
    async fn resolve(
        &self,
        id: &str,
        resolution: Resolution,
        by: &Operator,
    ) -> Result<Resolve, StoreError> {
        self.inner.resolve(id, resolution, by).await
    }
    async fn flush(&self, id: &str, by: &Operator) -> Result<Flush, StoreError> {
        self.inner.flush(id, by).await
    }
    async fn flush_all(&self, by: &Operator) -> Result<Vec<String>, StoreError> {
        self.inner.flush_all(by).await
    }
    async fn record_action(
        &self,
        action: Action,
        by: &Operator,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.record_action(action, by, detail).await
    }
    async fn purge_expired(&self, retention: Retention) -> Result<u64, StoreError> {
        self.inner.purge_expired(retention).await
    }
}

#[async_trait]
impl WebhookStore for FlakyIntent {
    async fn apply_webhook(
        &self,
        receipt: &idemrelay::store::WebhookReceipt,
    ) -> Result<idemrelay::store::WebhookApplied, StoreError> {
        self.inner.apply_webhook(receipt).await
    }
}

#[async_trait]
impl ReadStore for FlakyIntent {
    async fn message(&self, id: &str) -> Result<Option<StoredMessage>, StoreError> {
        self.inner.message(id).await
    }
    async fn attempts(&self, id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        self.inner.attempts(id).await
    }
    async fn list_page(&self, filter: &ListFilter) -> Result<Page, StoreError> {
        self.inner.list_page(filter).await
    }
    async fn relay_actions(&self, limit: usize) -> Result<Vec<ActionRow>, StoreError> {
        self.inner.relay_actions(limit).await
    }
    async fn report(&self, since_day: Option<&str>) -> Result<Vec<DailyCounts>, StoreError> {
        self.inner.report(since_day).await
    }
    async fn queue_stats(&self) -> Result<QueueStats, StoreError> {
        self.inner.queue_stats().await
    }
    async fn relay_health(&self) -> Result<idemrelay::store::RelayHealth, StoreError> {
        self.inner.relay_health().await
    }
    async fn lookup_id_by_key(&self, scope: &str, key: &str) -> Result<Option<String>, StoreError> {
        self.inner.lookup_id_by_key(scope, key).await
    }
    async fn events(&self, record_id: &str) -> Result<Vec<idemrelay::store::EventRow>, StoreError> {
        self.inner.events(record_id).await
    }
}

async fn relay_on_flaky_intents(sink: &SinkHandle, commit_first: bool) -> TestRelay {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.store = common::backend::store_url(dir.path()).await;
    fast_delivery(&mut settings, sink.smtp_addr());
    let inner = store::open(settings.store.expose(), settings.store_busy_timeout)
        .await
        .unwrap();
    let flaky: Arc<dyn Store> = Arc::new(FlakyIntent {
        inner,
        failures: AtomicU32::new(1),
        commit_first,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let relay = Relay::with_parts(&settings, flaky, vec![(ListenerKind::Plain, listener)]).unwrap();
    TestRelay {
        relay,
        addr,
        dir,
        settings,
    }
}

/// The store fails while the intent is written, after the job was claimed. Nothing was sent,
/// so the job is handed back at once; kept, its lease (the worst-case attempt time: minutes,
/// with real timeouts) would hold the message, and an earlier UNKNOWN's window could run out
/// meanwhile and park as unresolved a message that was simply not sent yet. Found by the chaos
/// test (store locked from outside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_error_at_the_intent_hands_the_job_back_at_once() {
    for commit_first in [false, true] {
        let sink = Sink::start(SinkConfig::default()).await.unwrap();
        let relay = relay_on_flaky_intents(&sink, commit_first).await;
        let id = submit(
            &relay,
            "sender@example.com",
            &["rcpt@example.com"],
            &message(Some("intent-1"), "s", "b"),
        )
        .await;
        // Far below the lease (about 2.5 minutes with these timeouts).
        assert_eq!(
            wait_terminal(&relay, &id, Duration::from_secs(5)).await,
            State::Delivered,
            "commit_first {commit_first}"
        );
        assert_eq!(sink.transactions().len(), 1);
        let ledger = relay.store().attempts(&id).await.unwrap();
        if commit_first {
            // The intent got in although the relay was told otherwise: an UNKNOWN, the safe
            // reading, then the attempt that delivered.
            assert_eq!(ledger.len(), 2, "{ledger:?}");
            assert_eq!(ledger[0].outcome.as_deref(), Some("unknown"), "{ledger:?}");
        } else {
            assert_eq!(ledger.len(), 1, "{ledger:?}");
        }
        assert_eq!(
            ledger.last().unwrap().outcome.as_deref(),
            Some("accepted"),
            "{ledger:?}"
        );
    }
}
