//! Keys: replays, mismatches, refusals, keys still being committed, derived keys, and
//! concurrent sessions.

use super::*;

/// Holds the store's write lock from outside the relay, as a stuck writer would.
async fn hold_write_lock(relay: &TestRelay) -> WriteLock {
    WriteLock::hold(relay.settings.store.expose()).await
}

async fn release_write_lock(lock: WriteLock) {
    lock.release().await;
}

#[tokio::test]
async fn new_key_is_committed_with_its_job_before_the_250() {
    let relay = TestRelay::start().await;
    let msg = message(Some("order-1"), "hello", "body");
    let answer = submit_once(&relay, &["rcpt@example.com"], &msg).await;
    let id = answer.queue_id().expect("queued");
    assert_eq!(answer.line(), format!("250 2.0.0 OK queued as {id}"));
    let stored = relay.stored(&id).await;
    assert_eq!(stored.state, State::Queued);
    assert!(stored.has_job);
    assert_eq!(stored.key.as_deref(), Some("order-1"));
    assert_eq!(stored.key_source, "header");
    assert_eq!(stored.scope, "default");
    assert_eq!(stored.mail_from, "sender@example.com");
    assert_eq!(stored.rcpt_to, vec!["rcpt@example.com"]);
    assert_eq!(relay.count("delivery_jobs").await, 1);
}

#[tokio::test]
async fn same_key_same_message_replays_the_original_id() {
    let relay = TestRelay::start().await;
    let msg = message(Some("order-2"), "hello", "body");
    let first = submit_once(&relay, &["rcpt@example.com"], &msg).await;
    let id = first.queue_id().unwrap();
    // A retry on a fresh connection, and one on the same session after a RSET.
    let second = submit_once(&relay, &["rcpt@example.com"], &msg).await;
    assert_eq!(
        second.line(),
        format!("250 2.0.0 OK queued as {id} (idempotent replay)")
    );
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(
        c.submit("sender@example.com", &["rcpt@example.com"], &msg)
            .await
            .line(),
        second.line()
    );
    assert_eq!(c.cmd("RSET").await.code, 250);
    assert_eq!(
        c.submit("sender@example.com", &["rcpt@example.com"], &msg)
            .await
            .line(),
        second.line()
    );
    c.quit().await;
    assert_eq!(relay.count("messages").await, 1);
    assert_eq!(relay.count("delivery_jobs").await, 1);
}

#[tokio::test]
async fn recipient_order_and_repeats_do_not_change_the_request() {
    let relay = TestRelay::start().await;
    let msg = message(Some("order-3"), "hello", "body");
    let first = submit_once(&relay, &["a@example.com", "b@example.com"], &msg).await;
    let again = submit_once(
        &relay,
        &["b@example.com", "a@example.com", "b@example.com"],
        &msg,
    )
    .await;
    assert_eq!(
        again.line(),
        format!(
            "250 2.0.0 OK queued as {} (idempotent replay)",
            first.queue_id().unwrap()
        )
    );
}

#[tokio::test]
async fn same_key_different_request_is_e01005() {
    let relay = TestRelay::start().await;
    let msg = message(Some("order-4"), "hello", "body");
    assert_eq!(
        submit_once(&relay, &["rcpt@example.com"], &msg).await.code,
        250
    );
    // One changed byte in the body.
    let changed = message(Some("order-4"), "hello", "bodY");
    assert_eq!(
        submit_once(&relay, &["rcpt@example.com"], &changed)
            .await
            .line(),
        E01005
    );
    // Another recipient set that overlaps the first (a disjoint one is another part of a
    // split message: see the split-transactions test).
    assert_eq!(
        submit_once(&relay, &["rcpt@example.com", "other@example.com"], &msg)
            .await
            .line(),
        E01005
    );
    // Another envelope sender.
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(
        c.submit("else@example.com", &["rcpt@example.com"], &msg)
            .await
            .line(),
        E01005
    );
    // BODY=8BITMIME is part of the request.
    assert_eq!(
        c.cmd("MAIL FROM:<sender@example.com> BODY=8BITMIME")
            .await
            .code,
        250
    );
    assert_eq!(c.cmd("RCPT TO:<rcpt@example.com>").await.code, 250);
    assert_eq!(c.data(&msg).await.line(), E01005);
    c.quit().await;
    assert_eq!(relay.count("messages").await, 1);
}

/// One transaction of a split submission: MAIL, every RCPT (the answers returned), and DATA
/// when some recipient was accepted.
async fn transaction(
    relay: &TestRelay,
    to: &[String],
    msg: &[u8],
) -> (Vec<u16>, Option<common::Answer>) {
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(c.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
    let mut codes = Vec::new();
    for rcpt in to {
        codes.push(c.cmd(&format!("RCPT TO:<{rcpt}>")).await.code);
    }
    let answer = if codes.contains(&250) {
        Some(c.data(msg).await)
    } else {
        None
    };
    c.quit().await;
    (codes, answer)
}

/// docs/concepts/contract.md "Split transactions": the relay's own `max_recipients` answers 452 to the rest,
/// as Postfix's recipient limit would split it, and the client sends those in a new
/// transaction with the same message. That is a second part of the same operation: a record
/// of its own, with its own queue id and its own key for the upstream, and a retry of either
/// part replays it. A recipient set that overlaps an earlier part's is a reuse (E01005).
#[tokio::test]
async fn a_message_split_across_transactions_is_stored_as_parts() {
    let relay = TestRelay::start_with(|s| s.max_recipients = 100).await;
    let msg = message(Some("split-1"), "newsletter", "one message, 120 recipients");
    let everyone: Vec<String> = (0..120).map(|i| format!("r{i:03}@example.com")).collect();
    let (codes, first) = transaction(&relay, &everyone, &msg).await;
    assert_eq!(codes.iter().filter(|&&c| c == 250).count(), 100);
    assert_eq!(codes.iter().filter(|&&c| c == 452).count(), 20);
    let first = first.unwrap();
    let first_id = first.queue_id().expect("part 1 queued");
    let rest = everyone[100..].to_vec();
    let (_, second) = transaction(&relay, &rest, &msg).await;
    let second = second.unwrap();
    let second_id = second
        .queue_id()
        .unwrap_or_else(|| panic!("the rest was refused: {second:?}"));
    assert_ne!(first_id, second_id);
    assert_eq!(second.line(), format!("250 2.0.0 OK queued as {second_id}"));

    // Retries of each part replay it.
    let (_, again) = transaction(&relay, &rest, &msg).await;
    assert_eq!(
        again.unwrap().line(),
        format!("250 2.0.0 OK queued as {second_id} (idempotent replay)")
    );
    let (_, again) = transaction(&relay, &everyone[..100], &msg).await;
    assert_eq!(
        again.unwrap().line(),
        format!("250 2.0.0 OK queued as {first_id} (idempotent replay)")
    );
    // Overlapping recipients, or other bytes for new recipients: a reuse.
    let overlap = everyone[95..110].to_vec();
    let (_, reuse) = transaction(&relay, &overlap, &msg).await;
    assert_eq!(reuse.unwrap().line(), E01005);
    let other = message(Some("split-1"), "newsletter", "another body");
    let (_, reuse) = transaction(&relay, &["new@example.com".to_string()], &other).await;
    assert_eq!(reuse.unwrap().line(), E01005);
    assert_eq!(relay.count("messages").await, 2);

    // Part 1 goes upstream under the client's key; part 2 under one of its own, written into
    // its stored bytes in place of the client's field.
    let one = relay.stored(&first_id).await;
    let two = relay.stored(&second_id).await;
    assert_eq!(
        (one.part, one.upstream_key.as_deref()),
        (1, Some("split-1"))
    );
    assert_eq!(two.part, 2);
    assert_eq!(two.rcpt_to, rest);
    let key_two = two.upstream_key.clone().unwrap();
    assert!(
        key_two.starts_with("u1-") && key_two.ends_with("-2-split-1"),
        "{key_two}"
    );
    let text = String::from_utf8(two.content.unwrap()).unwrap();
    assert!(
        text.contains(&format!("\r\nX-Bird-Idempotency-Key: {key_two}\r\n")),
        "{text}"
    );
    assert!(!text.contains("X-Bird-Idempotency-Key: split-1"), "{text}");
    let text = String::from_utf8(one.content.unwrap()).unwrap();
    assert!(
        text.contains("X-Bird-Idempotency-Key: split-1\r\n"),
        "{text}"
    );
}

/// A stored reply that cannot be read says nothing about what the client was told: the
/// retry is refused as the store being unavailable, never answered 250 by default.
#[tokio::test]
async fn a_stored_reply_that_cannot_be_read_fails_closed() {
    let relay = TestRelay::start().await;
    let msg = message(Some("order-unreadable-reply"), "hello", "body");
    let first = submit_once(&relay, &["rcpt@example.com"], &msg).await;
    first.queue_id().expect("queued");
    common::backend::execute(
        relay.settings.store.expose(),
        "UPDATE messages SET reply = 'garbled' WHERE idem_key = 'order-unreadable-reply'",
    )
    .await;
    let retry = submit_once(&relay, &["rcpt@example.com"], &msg).await;
    assert_eq!(retry.line(), E01033);
}

#[tokio::test]
async fn a_stored_permanent_rejection_is_replayed() {
    let relay = TestRelay::start().await;
    // No From: header field: refused permanently, and the refusal is bound to the key.
    let msg =
        b"To: rcpt@example.com\r\nX-Bird-Idempotency-Key: nofrom-1\r\nSubject: s\r\n\r\nbody\r\n";
    let first = submit_once(&relay, &["rcpt@example.com"], msg).await;
    assert_eq!(
        first.line(),
        "550 5.6.0 Message has no From: header field (RFC 5322 3.6); message not accepted"
    );
    let again = submit_once(&relay, &["rcpt@example.com"], msg).await;
    assert_eq!(
        again.line(),
        format!("{} (idempotent replay)", first.line())
    );
    // The key is spent on that request: a corrected message needs a new key.
    let fixed = message(Some("nofrom-1"), "s", "body");
    assert_eq!(
        submit_once(&relay, &["rcpt@example.com"], &fixed)
            .await
            .line(),
        E01005
    );
    assert_eq!(relay.count("messages").await, 1);
    assert_eq!(relay.count("delivery_jobs").await, 0);
}

#[tokio::test]
async fn invalid_keys_are_e01001_and_store_nothing() {
    let relay = TestRelay::start().await;
    let long = "k".repeat(256);
    let cases: Vec<Vec<u8>> = vec![
        b"From: a@example.com\r\nX-Bird-Idempotency-Key: \r\n\r\nbody\r\n".to_vec(),
        format!("From: a@example.com\r\nX-Bird-Idempotency-Key: {long}\r\n\r\nbody\r\n")
            .into_bytes(),
        b"From: a@example.com\r\nX-Bird-Idempotency-Key: a\x01b\r\n\r\nbody\r\n".to_vec(),
        b"From: a@example.com\r\nX-Bird-Idempotency-Key: one\r\nX-Bird-Idempotency-Key: two\r\n\r\nbody\r\n".to_vec(),
    ];
    for msg in &cases {
        let answer = submit_once(&relay, &["rcpt@example.com"], msg).await;
        assert_eq!(answer.line(), E01001, "{}", String::from_utf8_lossy(msg));
    }
    assert_eq!(relay.count("messages").await, 0);

    // Repeated identical headers count as one; folding is undone; 255 characters is fine.
    let ok: Vec<Vec<u8>> = vec![
        b"From: a@example.com\r\nX-Bird-Idempotency-Key: same\r\nX-Bird-Idempotency-Key: same\r\n\r\nbody\r\n".to_vec(),
        b"From: a@example.com\r\nX-Bird-Idempotency-Key:\r\n folded\r\n\r\nbody\r\n".to_vec(),
        format!(
            "From: a@example.com\r\nX-Bird-Idempotency-Key: {}\r\n\r\nbody\r\n",
            "k".repeat(255)
        )
        .into_bytes(),
    ];
    for msg in &ok {
        let answer = submit_once(&relay, &["rcpt@example.com"], msg).await;
        assert_eq!(answer.code, 250, "{answer:?}");
    }
    let folded = relay
        .stored(
            &submit_once(&relay, &["rcpt@example.com"], &ok[1])
                .await
                .queue_id()
                .unwrap(),
        )
        .await;
    assert_eq!(folded.key.as_deref(), Some("folded"));
}

#[tokio::test]
async fn a_key_still_being_committed_is_e01004_then_replays() {
    let relay = TestRelay::start_with(|s| {
        s.in_progress_wait = Duration::from_millis(300);
        s.store_busy_timeout = Duration::from_secs(10);
    })
    .await;
    let msg = message(Some("slow-1"), "hello", "body");
    let lock = hold_write_lock(&relay).await;
    // The first submission's commit waits on the lock ...
    let addr = relay.addr;
    let first_msg = msg.clone();
    let first = tokio::spawn(async move {
        let mut c = Client::ready(addr).await;
        c.submit("sender@example.com", &["rcpt@example.com"], &first_msg)
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ... so the retry cannot be answered yet.
    let second = submit_once(&relay, &["rcpt@example.com"], &msg).await;
    assert_eq!(second.line(), E01004);
    release_write_lock(lock).await;
    let first = first.await.unwrap();
    let id = first.queue_id().expect("first submission accepted");
    let third = submit_once(&relay, &["rcpt@example.com"], &msg).await;
    assert_eq!(
        third.line(),
        format!("250 2.0.0 OK queued as {id} (idempotent replay)")
    );
    assert_eq!(relay.count("messages").await, 1);
}

#[tokio::test]
async fn an_unwritable_store_is_e01033_and_nothing_is_accepted() {
    let relay = TestRelay::start_with(|s| {
        s.store_busy_timeout = Duration::from_millis(200);
        s.store_probe_interval = Duration::from_millis(100);
    })
    .await;
    let keyed = message(Some("down-1"), "hello", "body");
    let unkeyed = message(None, "hello", "no key");
    // Greeted first: the store probe may find the lock and refuse new connections (below).
    let mut c = Client::ready(relay.addr).await;
    let lock = hold_write_lock(&relay).await;
    assert_eq!(
        c.submit("sender@example.com", &["rcpt@example.com"], &keyed)
            .await
            .line(),
        E01033
    );
    assert_eq!(
        c.submit("sender@example.com", &["rcpt@example.com"], &unkeyed)
            .await
            .line(),
        E01033
    );
    c.quit().await;
    // New connections are refused while the store cannot be written.
    let (mut c, greeting) = Client::connect(relay.addr).await;
    assert_eq!(
        greeting.line(),
        "421 4.3.2 idempotency store unavailable; try again later (E01033 IdempotencyUnavailable)"
    );
    assert!(c.is_closed().await);
    release_write_lock(lock).await;
    assert_eq!(relay.count("messages").await, 0);
    // The health probe notices the store is back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_c, greeting) = Client::connect(relay.addr).await;
        if greeting.code == 220 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still refused: {greeting:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Once the store is back, the same key is a fresh, first acceptance.
    let answer = submit_once(&relay, &["rcpt@example.com"], &keyed).await;
    assert!(!answer.line().contains("replay"), "{answer:?}");
    assert_eq!(answer.code, 250);
}

#[tokio::test]
async fn derived_key_from_message_id_binds_the_envelope() {
    let relay = TestRelay::start().await;
    let msg =
        b"From: a@example.com\r\nMessage-ID: <abc-1@example.com>\r\nSubject: s\r\n\r\nbody\r\n";
    let first = submit_once(&relay, &["r1@example.com"], msg).await;
    let id = first.queue_id().unwrap();
    let stored = relay.stored(&id).await;
    assert_eq!(stored.key_source, "message-id");
    let key = stored.key.clone().unwrap();
    assert!(key.starts_with("d1-"));
    let content = stored.content.unwrap();
    let header = format!("X-Bird-Idempotency-Key: {key}\r\n");
    assert!(content
        .windows(header.len())
        .any(|w| w == header.as_bytes()));

    // The client's retry of the same message maps to the same key.
    let retry = submit_once(&relay, &["r1@example.com"], msg).await;
    assert_eq!(
        retry.line(),
        format!("250 2.0.0 OK queued as {id} (idempotent replay)")
    );
    // The same Message-ID to another recipient set is another send.
    let other = submit_once(&relay, &["r2@example.com"], msg).await;
    let other_id = other.queue_id().unwrap();
    assert_ne!(other_id, id);
    assert!(!other.line().contains("replay"));
    assert_ne!(relay.stored(&other_id).await.key.unwrap(), key);
    // A different message reusing the Message-ID is visible, not swallowed.
    let reused = b"From: a@example.com\r\nMessage-ID: <abc-1@example.com>\r\nSubject: s\r\n\r\nanother body\r\n";
    let conflict = submit_once(&relay, &["r1@example.com"], reused).await;
    assert!(conflict.line().starts_with(E01005), "{conflict:?}");
    assert!(conflict.line().contains("derived from the Message-ID"));
}

#[tokio::test]
async fn derived_key_without_message_id_follows_the_content() {
    let relay = TestRelay::start().await;
    let msg = message(None, "no id", "body one");
    let first = submit_once(&relay, &["r@example.com"], &msg).await;
    let id = first.queue_id().unwrap();
    assert_eq!(relay.stored(&id).await.key_source, "content");
    let retry = submit_once(&relay, &["r@example.com"], &msg).await;
    assert_eq!(
        retry.line(),
        format!("250 2.0.0 OK queued as {id} (idempotent replay)")
    );
    let other = submit_once(
        &relay,
        &["r@example.com"],
        &message(None, "no id", "body two"),
    )
    .await;
    assert_ne!(other.queue_id().unwrap(), id);
    let other_rcpt = submit_once(&relay, &["s@example.com"], &msg).await;
    assert_ne!(other_rcpt.queue_id().unwrap(), id);
    assert_eq!(relay.count("messages").await, 3);
}

#[tokio::test]
async fn missing_key_pass_and_reject_policies() {
    let relay = TestRelay::start_with(|s| s.missing_key = MissingKey::Pass).await;
    let msg = message(None, "pass", "body");
    let a = submit_once(&relay, &["r@example.com"], &msg).await;
    let b = submit_once(&relay, &["r@example.com"], &msg).await;
    assert_ne!(a.queue_id().unwrap(), b.queue_id().unwrap());
    let stored = relay.stored(&a.queue_id().unwrap()).await;
    assert_eq!((stored.key, stored.key_source.as_str()), (None, "none"));
    // With pass, nothing is added but the Received line.
    let content = stored.content.unwrap();
    assert!(!String::from_utf8_lossy(&content).contains("X-Bird-Idempotency-Key"));

    let relay = TestRelay::start_with(|s| s.missing_key = MissingKey::Reject).await;
    let answer = submit_once(&relay, &["r@example.com"], &msg).await;
    assert_eq!(answer.code, 554);
    assert!(answer
        .line()
        .starts_with("554 5.6.0 X-Bird-Idempotency-Key header required"));
    assert_eq!(relay.count("messages").await, 0);
    let keyed = submit_once(&relay, &["r@example.com"], &message(Some("k"), "s", "b")).await;
    assert_eq!(keyed.code, 250);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_with_one_key_make_one_record() {
    let relay = TestRelay::start_with(|s| s.in_progress_wait = Duration::from_secs(10)).await;
    let msg = message(Some("race-1"), "race", "body");
    let sessions = 24;
    // Everyone reaches the end of DATA first; then all final dots go out at once.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(sessions));
    let mut tasks = Vec::new();
    for _ in 0..sessions {
        let (addr, msg, barrier) = (relay.addr, msg.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::ready(addr).await;
            assert_eq!(c.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
            assert_eq!(c.cmd("RCPT TO:<rcpt@example.com>").await.code, 250);
            assert_eq!(c.cmd("DATA").await.code, 354);
            let stuffed = common::dot_stuff(&msg);
            c.send(&stuffed[..stuffed.len() - 3]).await;
            barrier.wait().await;
            c.send(b".\r\n").await;
            c.read_answer().await.unwrap()
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let ids: std::collections::BTreeSet<_> =
        answers.iter().map(|a| a.queue_id().expect("250")).collect();
    assert_eq!(ids.len(), 1, "{answers:?}");
    let fresh = answers
        .iter()
        .filter(|a| !a.line().contains("replay"))
        .count();
    assert_eq!(fresh, 1, "exactly one first acceptance: {answers:?}");
    assert_eq!(relay.count("messages").await, 1);
    assert_eq!(relay.count("delivery_jobs").await, 1);
}
