//! Intake over real sockets: every row of the reply table of docs/concepts/contract.md, derived keys, the
//! concurrent same-key race, retention, and store unavailability.

use crate::common;

use std::time::Duration;

use common::backend::WriteLock;
use common::{message, Client, TestRelay};
use idemrelay::mail::MissingKey;
use idemrelay::store::State;

const E01005: &str = "554 5.6.0 X-Bird-Idempotency-Key already used for a different message (E01005 IdempotencyKeyReuse); use a new key";
const E01004: &str = "451 4.3.0 a message with this X-Bird-Idempotency-Key is still being processed (E01004 RequestInProgress); retry later";
const E01001: &str = "554 5.6.0 X-Bird-Idempotency-Key must be 1-255 printable characters (E01001); message not accepted";
const E01033: &str = "451 4.3.0 idempotency store unavailable; message not accepted, retry later (E01033 IdempotencyUnavailable)";

async fn submit_once(relay: &TestRelay, to: &[&str], msg: &[u8]) -> common::Answer {
    let mut c = Client::ready(relay.addr).await;
    let answer = c.submit("sender@example.com", to, msg).await;
    c.quit().await;
    answer
}

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

#[tokio::test]
async fn terminal_records_expire_after_retention_but_queued_ones_do_not() {
    let sink = common::start_sink().await;
    let relay = common::relay_for(&sink, |s| {
        s.retention = Duration::from_secs(3);
        s.purge_interval = Duration::from_millis(200);
        // A delivered key stays taken while the upstream may still hold it: as long here.
        s.delivery.upstream_window = s.retention;
        s.delivery.window_margin = Duration::from_millis(100);
    })
    .await;
    // A delivered record and a stored rejection expire ...
    let delivered = message(Some("exp-delivered"), "s", "b");
    let id = submit_once(&relay, &["r@example.com"], &delivered)
        .await
        .queue_id()
        .unwrap();
    common::wait_state(&relay, &id, State::Delivered).await;
    // The operator pauses delivery, so the next record stays queued.
    relay
        .store()
        .pause("held for the test", false)
        .await
        .unwrap();
    // Within retention the delivered record still replays.
    assert!(submit_once(&relay, &["r@example.com"], &delivered)
        .await
        .line()
        .ends_with("(idempotent replay)"));
    let rejected = b"To: r@example.com\r\nX-Bird-Idempotency-Key: exp-rejected\r\n\r\nbody\r\n";
    assert_eq!(
        submit_once(&relay, &["r@example.com"], rejected).await.code,
        550
    );
    // ... a queued one never does.
    let queued = message(Some("exp-queued"), "s", "b");
    let queued_id = submit_once(&relay, &["r@example.com"], &queued)
        .await
        .queue_id()
        .unwrap();

    // The purge removes the two terminal records once retention is over.
    common::eventually(Duration::from_secs(10), "the purge", || async {
        (relay.count("messages").await == 1).then_some(())
    })
    .await;
    let again = submit_once(&relay, &["r@example.com"], &delivered).await;
    assert!(!again.line().contains("replay"), "{again:?}");
    assert_ne!(again.queue_id().unwrap(), id);
    let fixed = message(Some("exp-rejected"), "s", "b");
    assert_eq!(
        submit_once(&relay, &["r@example.com"], &fixed).await.code,
        250
    );
    assert_eq!(
        submit_once(&relay, &["r@example.com"], &queued)
            .await
            .line(),
        format!("250 2.0.0 OK queued as {queued_id} (idempotent replay)")
    );
}

#[tokio::test]
async fn expired_terminal_record_is_replaced_even_before_the_purge_runs() {
    let sink = common::start_sink().await;
    let relay = common::relay_for(&sink, |s| {
        s.retention = Duration::from_millis(300);
        s.purge_interval = Duration::from_secs(3600);
        s.delivery.upstream_window = s.retention;
        s.delivery.window_margin = Duration::from_millis(100);
    })
    .await;
    let msg = message(Some("exp-2"), "s", "b");
    let id = submit_once(&relay, &["r@example.com"], &msg)
        .await
        .queue_id()
        .unwrap();
    common::wait_state(&relay, &id, State::Delivered).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = submit_once(&relay, &["r@example.com"], &msg).await;
    assert_eq!(again.code, 250);
    assert!(!again.line().contains("replay"));
    assert_eq!(relay.count("messages").await, 1);
}

/// The stored bytes are the submitted bytes with exactly the relay's lines in front.
fn assert_stored_is_submitted_plus_relay_lines(
    content: &[u8],
    submitted: &[u8],
    id: &str,
    derived_key: Option<&str>,
) {
    assert!(
        content.ends_with(submitted),
        "submitted bytes not kept verbatim"
    );
    let added = std::str::from_utf8(&content[..content.len() - submitted.len()]).unwrap();
    let expected_start =
        format!("Received: from client.test ([127.0.0.1])\r\n\tby relay.test (idemrelay) with ESMTP id {id};\r\n\t");
    assert!(added.starts_with(&expected_start), "{added:?}");
    let lines: Vec<&str> = added.split_inclusive("\r\n").collect();
    // Received (3 physical lines) and, for derived keys, the key header.
    match derived_key {
        Some(key) => {
            assert_eq!(lines.len(), 4, "{added:?}");
            assert_eq!(lines[3], format!("X-Bird-Idempotency-Key: {key}\r\n"));
        }
        None => assert_eq!(lines.len(), 3, "{added:?}"),
    }
}

#[tokio::test]
async fn stored_bytes_are_the_submission_plus_the_relay_lines() {
    let relay = TestRelay::start().await;
    let header_keyed = message(Some("bytes-1"), "s", ".leading dot\r\n..two dots\r\n\r\n.");
    let answer = submit_once(&relay, &["r@example.com"], &header_keyed).await;
    let id = answer.queue_id().unwrap();
    let stored = relay.stored(&id).await;
    assert_stored_is_submitted_plus_relay_lines(
        stored.content.as_ref().unwrap(),
        &header_keyed,
        &id,
        None,
    );
}

#[tokio::test]
async fn corpus_messages_are_stored_byte_for_byte() {
    let relay = TestRelay::start().await;
    let mut accepted = 0;
    for (name, mut msg) in common::corpus() {
        // Over DATA the last line ends in CRLF: that is what a client transmits.
        if !msg.ends_with(b"\r\n") {
            msg.extend_from_slice(b"\r\n");
        }
        let answer = submit_once(&relay, &["r@example.com"], &msg).await;
        let has_from = idemrelay::intake::message::scan_headers(&msg).has_from;
        let longest_line = msg
            .split(|&b| b == b'\n')
            .map(|l| l.len().saturating_sub(1))
            .max();
        if longest_line > Some(998) {
            assert_eq!(answer.code, 550, "{name}: {answer:?}");
            continue;
        }
        if msg.contains(&0) {
            assert_eq!(
                answer.line(),
                "554 5.6.0 NUL character in message; message not accepted",
                "{name}"
            );
            continue;
        }
        if !idemrelay::intake::message::has_header_section(&msg) {
            assert_eq!(answer.code, 550, "{name}: {answer:?}");
            continue;
        }
        if !has_from {
            assert!(
                answer.line().starts_with("550 5.6.0 Message has no From:"),
                "{name}: {answer:?}"
            );
            continue;
        }
        let scan = idemrelay::intake::message::scan_headers(&msg);
        let key_header = idemrelay::intake::key::read_key_header(&scan.key_values);
        if key_header == idemrelay::intake::key::KeyHeader::Invalid {
            assert_eq!(answer.line(), E01001, "{name}");
            continue;
        }
        let id = answer
            .queue_id()
            .unwrap_or_else(|| panic!("{name} not accepted: {answer:?}"));
        let stored = relay.stored(&id).await;
        let derived = (stored.key_source != "header").then(|| stored.key.clone().unwrap());
        assert_stored_is_submitted_plus_relay_lines(
            stored.content.as_ref().unwrap(),
            &msg,
            &id,
            derived.as_deref(),
        );
        // And its retry is a replay.
        let retry = submit_once(&relay, &["r@example.com"], &msg).await;
        assert_eq!(
            retry.line(),
            format!("250 2.0.0 OK queued as {id} (idempotent replay)"),
            "{name}"
        );
        accepted += 1;
    }
    assert!(accepted >= 20, "only {accepted} corpus messages accepted");
}

#[tokio::test]
async fn bdat_and_data_store_the_same_bytes() {
    let relay = TestRelay::start().await;
    let msg = message(Some("bdat-1"), "chunks", ".dot line\r\nsecond");
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(c.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
    assert_eq!(c.cmd("RCPT TO:<r@example.com>").await.code, 250);
    let (a, b) = msg.split_at(31);
    c.send(format!("BDAT {}\r\n", a.len()).as_bytes()).await;
    c.send(a).await;
    assert_eq!(
        c.read_answer().await.unwrap().line(),
        format!("250 2.0.0 {} octets received", a.len())
    );
    c.send(format!("BDAT {} LAST\r\n", b.len()).as_bytes())
        .await;
    c.send(b).await;
    let answer = c.read_answer().await.unwrap();
    let id = answer.queue_id().expect("queued");
    // The DATA submission of the same bytes is the same request.
    let via_data = c
        .submit("sender@example.com", &["r@example.com"], &msg)
        .await;
    assert_eq!(
        via_data.line(),
        format!("250 2.0.0 OK queued as {id} (idempotent replay)")
    );
    c.quit().await;
    let stored = relay.stored(&id).await;
    assert!(stored.content.unwrap().ends_with(&msg));
}

#[tokio::test]
async fn pipelined_commands_are_answered_in_order() {
    let relay = TestRelay::start().await;
    let msg = message(Some("pipe-1"), "pipelined", "body");
    let mut c = Client::ready(relay.addr).await;
    let mut burst = b"MAIL FROM:<sender@example.com>\r\nRCPT TO:<a@example.com>\r\nRCPT TO:<b@example.com>\r\nDATA\r\n".to_vec();
    burst.extend_from_slice(&common::dot_stuff(&msg));
    burst.extend_from_slice(b"NOOP\r\nQUIT\r\n");
    c.send(&burst).await;
    let mut codes = Vec::new();
    while let Some(a) = c.read_answer().await {
        codes.push(a.code);
    }
    assert_eq!(codes, vec![250, 250, 250, 354, 250, 250, 221]);
}

#[tokio::test]
async fn clients_outside_the_allow_list_cannot_submit() {
    let relay =
        TestRelay::start_with(|s| s.allow_networks = vec!["10.0.0.0/8".parse().unwrap()]).await;
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(
        c.cmd("MAIL FROM:<sender@example.com>").await.line(),
        "530 5.7.0 Authentication required"
    );
    assert_eq!(c.cmd("RCPT TO:<r@example.com>").await.code, 503);
    assert_eq!(c.cmd("DATA").await.code, 503);
    c.quit().await;
    assert_eq!(relay.count("messages").await, 0);
}

#[tokio::test]
async fn scopes_use_keys_independently() {
    let dir_a = TestRelay::start_with(|s| s.scope = "tenant-a".into()).await;
    let msg = message(Some("shared-key"), "s", "b");
    let a = submit_once(&dir_a, &["r@example.com"], &msg).await;
    // Same store file, another listener scope.
    let mut settings = dir_a.settings.clone();
    settings.scope = "tenant-b".into();
    settings.listen = vec!["127.0.0.1:0".parse().unwrap()];
    let relay_b = idemrelay::app::Relay::start(&settings).await.unwrap();
    let mut c = Client::ready(relay_b.local_addrs()[0]).await;
    let b = c
        .submit("sender@example.com", &["r@example.com"], &msg)
        .await;
    c.quit().await;
    assert_eq!(a.code, 250);
    assert_eq!(b.code, 250);
    assert!(!b.line().contains("replay"));
    assert_ne!(a.queue_id(), b.queue_id());
    // A different body under the other scope is not a conflict either.
    assert_eq!(dir_a.count("messages").await, 2);
}

#[tokio::test]
async fn an_oversized_header_section_is_refused_before_parsing() {
    let relay = TestRelay::start().await;
    let mut msg = b"From: a@example.com\r\nX-Bird-Idempotency-Key: big-headers\r\n".to_vec();
    msg.extend_from_slice(&b"a:\r\n".repeat(50_000));
    msg.extend_from_slice(b"\r\nbody\r\n");
    let answer = submit_once(&relay, &["r@example.com"], &msg).await;
    assert_eq!(
        answer.line(),
        "550 5.6.0 Header section too large; message not accepted"
    );
    assert_eq!(relay.count("messages").await, 0);
}

/// What Python's `email.message.EmailMessage` with `policy=email.policy.SMTP` writes for a key
/// header (Python 3.11, byte for byte): past 77 characters, or with non-ASCII text, the value is
/// RFC 2047-encoded and folded.
pub(crate) fn python_message(message_id: &str, key_field: &str) -> Vec<u8> {
    format!(
        "From: app@example.com\r\nTo: user@example.com\r\nSubject: Receipt\r\n\
         Date: Sun, 29 Nov 2026 10:00:00 +0000\r\nMessage-ID: <{message_id}@example.com>\r\n\
         X-Bird-Idempotency-Key: {key_field}\r\n\
         Content-Type: text/plain; charset=\"utf-8\"\r\nContent-Transfer-Encoding: 7bit\r\n\
         MIME-Version: 1.0\r\n\r\nThank you.\r\n"
    )
    .into_bytes()
}

/// A 205-character key (inside 1-255) as Python spells it: four Q words, 273 characters.
pub(crate) const PYTHON_LONG_KEY: &str = "receipt-2026-11-29-0000-0001-0002-0003-0004-0005-0006-0007-0008-0009-0010-0011-0012-0013-0014-0015-0016-0017-0018-0019-0020-0021-0022-0023-0024-0025-0026-0027-0028-0029-0030-0031-0032-0033-0034-0035-0036-0";
pub(crate) const PYTHON_LONG_FIELD: &str = "=?utf-8?q?receipt-2026-11-29-0000-0001-0002-0003-000?=\r\n =?utf-8?q?4-0005-0006-0007-0008-0009-0010-0011-0012-0013-0014-0015-0016-001?=\r\n =?utf-8?q?7-0018-0019-0020-0021-0022-0023-0024-0025-0026-0027-0028-0029-003?=\r\n =?utf-8?q?0-0031-0032-0033-0034-0035-0036-0?=";
/// A Cyrillic key as Python spells it: a B word, then a Q word.
const PYTHON_CYRILLIC_KEY: &str = "заказ-1234-квитанция";
const PYTHON_CYRILLIC_FIELD: &str =
    "=?utf-8?b?0LfQsNC60LDQty0xMjM0LdC60LLQuNGC0LDQvdGG?=\r\n =?utf-8?q?=D0=B8=D1=8F?=";

/// A path segment for the admin API: every byte but the unreserved ones percent-encoded.
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The key is what the application set, whatever encoding its mail library chose: stored and
/// found under it, replayed on a retry of the same bytes, and written for the upstream in a
/// form every reader takes for that key.
#[tokio::test]
async fn keys_encoded_by_mail_libraries_are_the_applications_keys() {
    let relay = TestRelay::start().await;
    let long = python_message("r-205", PYTHON_LONG_FIELD);
    let cyrillic = python_message("r-20", PYTHON_CYRILLIC_FIELD);
    let mut ids = Vec::new();
    for (key, msg) in [(PYTHON_LONG_KEY, &long), (PYTHON_CYRILLIC_KEY, &cyrillic)] {
        let first = submit_once(&relay, &["user@example.com"], msg).await;
        let id = first
            .queue_id()
            .unwrap_or_else(|| panic!("{key}: not accepted: {first:?}"));
        let shown = common::http::get(
            relay.admin(),
            &format!("/api/v1/keys/default/{}", path_segment(key)),
            None,
        )
        .await;
        assert_eq!(shown.status, 200, "{key}: {}", shown.body);
        let shown = shown.json();
        assert_eq!(shown["id"], id.as_str());
        assert_eq!(shown["key"], key);
        assert_eq!(shown["key_source"], "header");
        assert_eq!(shown["upstream_key"], key);
        let again = submit_once(&relay, &["user@example.com"], msg).await;
        assert_eq!(
            again.line(),
            format!("250 2.0.0 OK queued as {id} (idempotent replay)")
        );
        ids.push(id);
    }
    assert_eq!(relay.count("messages").await, 2);

    // An ASCII key goes upstream plain, in place of the client's encoded field: every reader
    // finds it, whether or not it decodes encoded words (spelled encoded, this one is longer
    // than a key may be).
    let stored = relay.stored(&ids[0]).await.content.unwrap();
    let text = String::from_utf8(stored).unwrap();
    let header = &text[..text.find("\r\n\r\n").unwrap() + 2];
    assert!(
        header.contains(&format!(
            "\r\nX-Bird-Idempotency-Key: {PYTHON_LONG_KEY}\r\n"
        )),
        "{header}"
    );
    assert_eq!(
        header.matches("X-Bird-Idempotency-Key:").count(),
        1,
        "{header}"
    );
    assert!(!header.contains("=?utf-8?q?receipt"), "{header}");
    // A key that is not ASCII can only be written encoded in a message that is not SMTPUTF8:
    // the client's field goes as it came.
    let stored = relay.stored(&ids[1]).await.content.unwrap();
    let text = String::from_utf8(stored).unwrap();
    assert!(
        text.contains(&format!(
            "\r\nX-Bird-Idempotency-Key: {PYTHON_CYRILLIC_FIELD}\r\n"
        )),
        "{text}"
    );
    assert_eq!(text.matches("X-Bird-Idempotency-Key:").count(), 1, "{text}");
}

/// Earlier versions stored a key spelled in encoded words as spelled. A client's retry that
/// reaches an upgraded relay (within retention) must still replay that record, not become a
/// second message under the decoded key.
#[tokio::test]
async fn a_record_stored_under_the_encoded_spelling_still_replays() {
    let relay = TestRelay::start().await;
    let msg = python_message("r-20", PYTHON_CYRILLIC_FIELD);
    let first = submit_once(&relay, &["user@example.com"], &msg).await;
    let id = first.queue_id().expect("queued");
    // The record as an earlier version stored it: under the unfolded spelling.
    let spelled = PYTHON_CYRILLIC_FIELD.replace("\r\n", "");
    common::backend::execute(
        relay.settings.store.expose(),
        &format!("UPDATE messages SET idem_key = '{spelled}' WHERE id = '{id}'"),
    )
    .await;
    let again = submit_once(&relay, &["user@example.com"], &msg).await;
    assert_eq!(
        again.line(),
        format!("250 2.0.0 OK queued as {id} (idempotent replay)")
    );
    assert_eq!(relay.count("messages").await, 1);
    // And another message under that key is a reuse, as it was before the upgrade.
    let other = python_message("r-21", PYTHON_CYRILLIC_FIELD);
    let answer = submit_once(&relay, &["user@example.com"], &other).await;
    assert_eq!(answer.line(), E01005);
    assert_eq!(relay.count("messages").await, 1);
}
