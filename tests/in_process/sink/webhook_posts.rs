//! The webhooks the sink posts: signed events per recipient, retries, giving up, and the fault
//! rules that duplicate, reorder, delay and lose them.

use super::*;

/// Another secret: the sink's signatures must not verify under it.
const OTHER_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

fn webhook_sink(receiver: &Receiver, tune: impl FnOnce(&mut WebhookConfig)) -> SinkConfig {
    let mut webhook = WebhookConfig::new(receiver.url(), vec![SECRET.parse().unwrap()]);
    webhook.retry = RetryPolicy {
        first: Duration::from_millis(30),
        max_delay: Duration::from_millis(200),
        max_attempts: 5,
        deadline: Duration::from_secs(10),
    };
    tune(&mut webhook);
    SinkConfig {
        webhook: Some(webhook),
        ..SinkConfig::default()
    }
}

fn message_with_id(key: Option<&str>, message_id: Option<&str>, body: &str) -> Vec<u8> {
    let mut m = String::from("From: app@example.com\r\nTo: user@example.com\r\nSubject: hooks\r\n");
    if let Some(id) = message_id {
        m.push_str(&format!("Message-ID: {id}\r\n"));
    }
    if let Some(key) = key {
        m.push_str(&format!("X-Bird-Idempotency-Key: {key}\r\n"));
    }
    m.push_str("\r\n");
    m.push_str(body);
    m.push_str("\r\n");
    m.into_bytes()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn event_time(event: &Value) -> std::time::SystemTime {
    humantime::parse_rfc3339(event["timestamp"].as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_send_injection_then_delivery_per_recipient_signed() {
    let receiver = Receiver::start().await;
    let sink = start(webhook_sink(&receiver, |_| {})).await;
    let mut c = session(sink.smtp_addr()).await;
    let msg = message_with_id(Some("wh-order-1"), Some("<order-1@shop.example>"), "hello");
    let rcpts = ["first@example.net", "second@example.org"];
    let accepted_at = std::time::SystemTime::now();
    let reply = c.submit("app@example.com", &rcpts, &msg).await.unwrap();
    let id = id_of(&reply);

    let hooks = receiver.wait_for(2).await;
    assert_eq!(hooks.len(), 2, "{hooks:#?}");
    let (injection, delivery) = (&hooks[0], &hooks[1]);
    assert_eq!(injection.webhook_id, format!("msg_{id}_injection"));
    assert_eq!(delivery.webhook_id, format!("msg_{id}_delivery"));
    for hook in &hooks {
        assert_eq!(hook.path, "/webhooks/upstream");
        assert_eq!(hook.content_type, "application/json");
        assert!(signature_verifies(SECRET, hook), "{hook:?}");
        assert!(!signature_verifies(OTHER_SECRET, hook), "{hook:?}");
        let ts: i64 = hook.timestamp.parse().unwrap();
        assert!((ts - unix_now()).abs() <= 5, "webhook-timestamp {ts}");
        // A byte changed anywhere breaks the signature.
        let mut tampered = hook.clone();
        tampered.body[3] ^= 1;
        assert!(!signature_verifies(SECRET, &tampered));
        let mut replayed = hook.clone();
        replayed.timestamp = (ts + 1).to_string();
        assert!(!signature_verifies(SECRET, &replayed));
    }
    // The delivery comes a moment (200 ms by default) after the injection.
    let gap = delivery.at - injection.at;
    assert!(gap >= Duration::from_millis(150), "{gap:?}");

    for (hook, event_type) in [(injection, "injection"), (delivery, "delivery")] {
        let events = hook.events();
        let to: Vec<&str> = events
            .iter()
            .map(|e| e["rcpt_to"].as_str().unwrap())
            .collect();
        assert_eq!(to, rcpts, "one event per recipient, in RCPT order");
        for event in &events {
            let keys: Vec<&str> = event
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            let mut want = vec![
                "headers",
                "idempotency_key",
                "message_id",
                "rcpt_to",
                "timestamp",
                "type",
            ];
            want.sort();
            assert_eq!(keys, want, "{event}");
            assert_eq!(event["type"], event_type);
            assert_eq!(event["idempotency_key"], "wh-order-1");
            assert_eq!(event["message_id"], id.as_str());
            assert_eq!(event["headers"]["message-id"], "<order-1@shop.example>");
        }
    }
    let injected_at = event_time(&injection.events()[0]);
    let delivered_at = event_time(&delivery.events()[0]);
    assert_eq!(
        delivered_at.duration_since(injected_at).unwrap(),
        Duration::from_millis(200)
    );
    let skew = injected_at
        .duration_since(accepted_at)
        .unwrap_or_else(|e| e.duration());
    assert!(skew < Duration::from_secs(2), "{skew:?}");

    // A replay is not a new message: no new events. A message without key or Message-ID
    // gets nulls.
    let replay = c.submit("app@example.com", &rcpts, &msg).await.unwrap();
    assert!(replay.text.ends_with("(idempotent replay)"), "{replay:?}");
    let plain = c
        .submit(
            "app@example.com",
            &["x@example.net"],
            &message(None, "no key"),
        )
        .await
        .unwrap();
    let plain_id = id_of(&plain);
    let hooks = receiver.wait_for(4).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(receiver.hooks().len(), 4, "{hooks:#?}");
    let plain_hooks = receiver.hooks_for(&plain_id);
    assert_eq!(plain_hooks.len(), 2);
    let event = &plain_hooks[0].events()[0];
    assert_eq!(event["idempotency_key"], Value::Null);
    assert_eq!(event["headers"]["message-id"], Value::Null);

    let attempts = sink.webhooks();
    assert_eq!(attempts.len(), 4);
    assert!(attempts.iter().all(|a| a.status == Some(200)
        && a.outcome == AttemptOutcome::Delivered
        && a.attempt == 1));
    assert_eq!(attempts[0].key.as_deref(), Some("wh-order-1"));
    assert_eq!(attempts[0].events, 2);
    let stats = sink
        .wait_until(WAIT, |s| s.webhooks.pending == 0)
        .await
        .unwrap();
    assert_eq!(
        (
            stats.webhooks.batches,
            stats.webhooks.attempts,
            stats.webhooks.delivered,
            stats.webhooks.failed,
            stats.webhooks.dropped
        ),
        (4, 4, 4, 0, 0)
    );
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_retry_after_500_with_the_same_id_and_body() {
    let receiver = Receiver::start().await;
    receiver.fail_first(2);
    let sink = start(webhook_sink(&receiver, |_| {})).await;
    let mut c = session(sink.smtp_addr()).await;
    let reply = c
        .submit(
            "app@example.com",
            &["a@example.net"],
            &message(Some("wh-retry"), "x"),
        )
        .await
        .unwrap();
    let id = id_of(&reply);
    receiver.wait_for(6).await;
    sink.wait_until(WAIT, |s| s.webhooks.pending == 0)
        .await
        .unwrap();
    for event_type in ["injection", "delivery"] {
        let posts: Vec<Hook> = receiver
            .hooks_for(&id)
            .into_iter()
            .filter(|h| h.event_type() == event_type)
            .collect();
        let answers: Vec<u16> = posts.iter().map(|h| h.answered).collect();
        assert_eq!(answers, [500, 500, 200], "{event_type}");
        for post in &posts {
            assert_eq!(post.webhook_id, posts[0].webhook_id);
            assert_eq!(post.body, posts[0].body);
            assert!(signature_verifies(SECRET, post));
        }
        // Backoff: the retries do not come at once.
        assert!(posts[2].at - posts[0].at >= Duration::from_millis(30));
        let attempts: Vec<(u32, Option<u16>, AttemptOutcome)> = sink
            .webhooks()
            .into_iter()
            .filter(|a| a.event_type.as_str() == event_type)
            .map(|a| (a.attempt, a.status, a.outcome))
            .collect();
        assert_eq!(
            attempts,
            [
                (1, Some(500), AttemptOutcome::Retrying),
                (2, Some(500), AttemptOutcome::Retrying),
                (3, Some(200), AttemptOutcome::Delivered),
            ]
        );
    }
    let stats = sink.stats().webhooks;
    assert_eq!((stats.attempts, stats.delivered, stats.failed), (6, 2, 0));
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_give_up_after_their_attempts_and_never_delay_smtp() {
    // Nothing listens here: every post fails to connect.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url: url::Url = format!("http://{}/hook", dead.local_addr().unwrap())
        .parse()
        .unwrap();
    drop(dead);
    let receiver = Receiver::start().await;
    let sink = start(webhook_sink(&receiver, |w| {
        w.url = dead_url;
        w.retry.max_attempts = 3;
        w.delivery_delay = Duration::from_millis(50);
    }))
    .await;
    let mut c = session(sink.smtp_addr()).await;
    c.submit(
        "app@example.com",
        &["a@example.net"],
        &message(Some("wh-dead"), "x"),
    )
    .await
    .unwrap();
    let stats = sink
        .wait_until(WAIT, |s| s.webhooks.failed == 2 && s.webhooks.pending == 0)
        .await
        .unwrap();
    assert_eq!(stats.webhooks.attempts, 6);
    let attempts = sink.webhooks();
    for event_type in [EventType::Injection, EventType::Delivery] {
        let mine: Vec<&WebhookAttempt> = attempts
            .iter()
            .filter(|a| a.event_type == event_type)
            .collect();
        let outcomes: Vec<AttemptOutcome> = mine.iter().map(|a| a.outcome).collect();
        assert_eq!(
            outcomes,
            [
                AttemptOutcome::Retrying,
                AttemptOutcome::Retrying,
                AttemptOutcome::GaveUp
            ]
        );
        for a in mine {
            assert_eq!(a.status, None);
            assert!(a.error.as_deref().unwrap().starts_with("connect"), "{a:?}");
        }
    }

    // A receiver that accepts the connection and never answers: the dot is still answered
    // at once, since posting happens beside the SMTP session.
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_url: url::Url = format!("http://{}/hook", hang.local_addr().unwrap())
        .parse()
        .unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = hang.accept().await {
            open.push(stream);
        }
    });
    let slow = start(webhook_sink(&receiver, |w| {
        w.url = hang_url;
        w.delivery_delay = Duration::ZERO;
    }))
    .await;
    let mut c = session(slow.smtp_addr()).await;
    for i in 0..5 {
        let started = Instant::now();
        let reply = c
            .submit(
                "app@example.com",
                &["a@example.net"],
                &message(Some(&format!("wh-hang-{i}")), "x"),
            )
            .await
            .unwrap();
        assert_eq!(reply.code, 250);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    slow.wait_until(WAIT, |s| s.webhooks.pending == 10)
        .await
        .unwrap();
    assert!(slow.webhooks().is_empty(), "nothing has answered yet");
    slow.shutdown().await;
    held.abort();
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_fault_rules_duplicate_reorder_late_and_lose_ack() {
    let receiver = Receiver::start().await;
    let sink = start(SinkConfig {
        faults: vec![
            "phase=webhook,action=duplicate,times=1,key=dup"
                .parse()
                .unwrap(),
            "phase=webhook,action=reorder,key=reo".parse().unwrap(),
            "phase=webhook,action=late,ms=700,times=1,key=late"
                .parse()
                .unwrap(),
            "phase=webhook,action=lose_ack,times=1,key=lose"
                .parse()
                .unwrap(),
        ],
        ..webhook_sink(&receiver, |_| {})
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;
    let mut ids = std::collections::BTreeMap::new();
    let mut accepted = std::collections::BTreeMap::new();
    for key in ["dup-1", "reo-1", "late-1", "lose-1", "plain-1"] {
        accepted.insert(key, Instant::now());
        let reply = c
            .submit(
                "app@example.com",
                &["a@example.net"],
                &message(Some(key), key),
            )
            .await
            .unwrap();
        ids.insert(key, id_of(&reply));
    }
    // dup and lose: injection twice, delivery once; the others two each.
    receiver.wait_for(12).await;
    sink.wait_until(WAIT, |s| s.webhooks.pending == 0)
        .await
        .unwrap();
    let types = |key: &str| -> Vec<String> {
        receiver
            .hooks_for(&ids[key])
            .iter()
            .map(Hook::event_type)
            .collect()
    };
    assert_eq!(types("dup-1"), ["injection", "injection", "delivery"]);
    assert_eq!(types("reo-1"), ["delivery", "injection"]);
    assert_eq!(types("late-1"), ["delivery", "injection"]);
    assert_eq!(types("lose-1"), ["injection", "injection", "delivery"]);
    assert_eq!(types("plain-1"), ["injection", "delivery"]);
    assert_eq!(receiver.hooks().len(), 12);

    // The same batch twice is the same request, byte for byte, under the same id.
    for key in ["dup-1", "lose-1"] {
        let hooks = receiver.hooks_for(&ids[key]);
        assert_eq!(hooks[0].webhook_id, hooks[1].webhook_id);
        assert_eq!(hooks[0].body, hooks[1].body);
        assert!(hooks.iter().all(|h| signature_verifies(SECRET, h)));
    }
    let late = receiver.hooks_for(&ids["late-1"]);
    let held = late[1].at - accepted["late-1"];
    assert!(held >= Duration::from_millis(700), "{held:?}");

    let attempts_of = |key: &str| -> Vec<(String, u32, u32, AttemptOutcome)> {
        sink.webhooks()
            .into_iter()
            .filter(|a| a.message_id == ids[key])
            .map(|a| {
                (
                    a.event_type.as_str().to_string(),
                    a.copy,
                    a.attempt,
                    a.outcome,
                )
            })
            .collect()
    };
    use AttemptOutcome::{AckLost, Delivered};
    assert_eq!(
        attempts_of("dup-1"),
        [
            ("injection".into(), 1, 1, Delivered),
            ("injection".into(), 2, 1, Delivered),
            ("delivery".into(), 1, 1, Delivered),
        ]
    );
    assert_eq!(
        attempts_of("lose-1"),
        [
            ("injection".into(), 1, 1, AckLost),
            ("injection".into(), 1, 2, Delivered),
            ("delivery".into(), 1, 1, Delivered),
        ]
    );
    let lost = sink
        .webhooks()
        .into_iter()
        .find(|a| a.outcome == AckLost)
        .unwrap();
    assert_eq!(lost.status, Some(200));
    assert_eq!(
        lost.fault.as_deref(),
        Some("phase=webhook,action=lose_ack,times=1,key=lose")
    );
    let fired: Vec<u32> = sink.faults().iter().map(|r| r.fired).collect();
    assert_eq!(
        fired,
        [1, 1, 1, 1],
        "reorder fires on injection batches only"
    );
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_bounce_matching_recipients_and_follow_a_dropped_reply() {
    let receiver = Receiver::start().await;
    let sink = start(SinkConfig {
        faults: vec![FaultRule::drop_after_dot().with_times(1)],
        ..webhook_sink(&receiver, |w| w.bounce = vec!["unknown@".into()])
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;
    let msg = message_with_id(Some("wh-bounce"), Some("<b@shop.example>"), "x");
    let rcpts = ["ok@example.net", "Unknown@example.net"];
    // The reply to the dot is lost, but the message was committed: its events still come.
    assert_eq!(c.submit("app@example.com", &rcpts, &msg).await, None);
    let id = sink.wait_for_messages(1, WAIT).await.unwrap()[0].id.clone();
    receiver.wait_for(3).await;
    sink.wait_until(WAIT, |s| s.webhooks.pending == 0)
        .await
        .unwrap();
    let mut hooks = receiver.hooks_for(&id);
    // Delivery and bounce are due at the same moment, and race.
    hooks[1..].sort_by_key(Hook::event_type);
    let types: Vec<String> = hooks.iter().map(Hook::event_type).collect();
    assert_eq!(types, ["injection", "bounce", "delivery"]);
    assert_eq!(hooks[0].events().len(), 2);
    let delivered = hooks[2].events();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0]["rcpt_to"], "ok@example.net");
    let bounced = hooks[1].events();
    assert_eq!(bounced.len(), 1);
    assert_eq!(bounced[0]["type"], "bounce");
    assert_eq!(bounced[0]["rcpt_to"], "Unknown@example.net");
    assert_eq!(bounced[0]["reason"], "5.1.1 user unknown");
    assert_eq!(bounced[0]["idempotency_key"], "wh-bounce");
    assert_eq!(bounced[0]["headers"]["message-id"], "<b@shop.example>");
    assert_eq!(bounced[0]["timestamp"], delivered[0]["timestamp"]);
    assert!(hooks.iter().all(|h| signature_verifies(SECRET, h)));
    // The client's retry is a replay: no second set of events.
    let mut c = session(sink.smtp_addr()).await;
    let replay = c.submit("app@example.com", &rcpts, &msg).await.unwrap();
    assert_eq!(id_of(&replay), id);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(receiver.hooks().len(), 3);
    sink.shutdown().await;
}
