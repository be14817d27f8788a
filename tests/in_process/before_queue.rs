//! The before-queue mode over real sockets (docs/guides/before-queue.md): a client of a
//! before-queue listener hears the upstream's verdict at the end of DATA, and every other
//! outcome falls back to `250 queued` and ordinary delivery, with exactly one copy upstream.

use crate::common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{eventually, message, relay_for, start_sink, wait_state, Answer, Client, TestRelay};
use idemrelay::config::Settings;
use idemrelay::store::State;
use idemrelay_sink::{DotDecision, FaultRule, FaultStage, SinkHandle};

const LIMIT: Duration = Duration::from_secs(20);

/// A relay for `sink` with one ordinary and one before-queue listener, waiting `wait`.
async fn relay_waiting(
    sink: &SinkHandle,
    wait: Duration,
    tune: impl FnOnce(&mut Settings),
) -> (TestRelay, SocketAddr) {
    let relay = relay_for(sink, |s| {
        s.before_queue.listen = vec!["127.0.0.1:0".parse().unwrap()];
        s.before_queue.wait = wait;
        tune(s);
    })
    .await;
    let addrs = relay.relay.local_addrs();
    assert_eq!(addrs.len(), 2, "{addrs:?}");
    let waiting = addrs[1];
    (relay, waiting)
}

async fn submit_to(addr: SocketAddr, msg: &[u8]) -> Answer {
    let mut c = Client::ready(addr).await;
    let answer = c
        .submit("sender@example.com", &["rcpt@example.com"], msg)
        .await;
    c.quit().await;
    answer
}

/// `250 2.0.0 OK delivered as <id>; upstream: ...` → the id.
fn delivered_id(answer: &Answer) -> String {
    let line = answer.line();
    let rest = line
        .strip_prefix("250 2.0.0 OK delivered as ")
        .unwrap_or_else(|| panic!("not a before-queue delivery: {line}"));
    rest.split(';').next().unwrap().to_string()
}

fn accepted_at_sink(sink: &SinkHandle) -> usize {
    sink.transactions()
        .iter()
        .filter(|t| t.outcome == DotDecision::Accepted)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_hears_the_upstreams_250_only_after_the_upstream_has_the_message() {
    let sink = start_sink().await;
    // The sink holds its reply to the dot: the client must still be waiting meanwhile.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_millis(1500),
    )])
    .unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_secs(10), |_| {}).await;
    let msg = message(Some("bq-accept-1"), "bq", "body");
    let first = {
        let msg = msg.clone();
        tokio::spawn(async move { submit_to(waiting, &msg).await })
    };
    eventually(LIMIT, "the sink to have the message", || async {
        (!sink.transactions().is_empty()).then_some(())
    })
    .await;
    let sink_had_it = Instant::now();
    assert!(
        !first.is_finished(),
        "the client was answered before the upstream had answered"
    );
    let answer = first.await.unwrap();
    assert!(
        sink_had_it.elapsed() >= Duration::from_millis(500),
        "{answer:?}"
    );
    let id = delivered_id(&answer);
    let sink_id = &sink.messages()[0].id;
    assert!(
        answer
            .line()
            .ends_with(&format!("; upstream: 250 2.0.0 OK {sink_id}")),
        "{answer:?}"
    );
    // Delivered, and the line the client heard is what a retry replays.
    let stored = relay.stored(&id).await;
    assert_eq!(stored.state, State::Delivered);
    assert_eq!(stored.reply, answer.line());
    sink.set_faults(vec![]).unwrap();
    let again = submit_to(waiting, &msg).await;
    assert_eq!(
        again.line(),
        format!("{} (idempotent replay)", answer.line())
    );
    // The ordinary listener replays the same.
    let elsewhere = submit_to(relay.addr, &msg).await;
    assert_eq!(elsewhere.line(), again.line());
    assert_eq!(sink.transactions().len(), 1, "sent again on a retry");
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].outcome.as_deref(), Some("accepted"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_5xx_at_the_dot_is_the_clients_answer_without_a_bounce_and_is_replayed() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Dot,
        554,
        "5.7.1 message\tcontent rejected\u{7f} by policy",
    )])
    .unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_secs(10), |_| {}).await;
    let msg = message(Some("bq-refuse-1"), "bq", "body");
    let answer = submit_to(waiting, &msg).await;
    assert_eq!(answer.code, 554, "{answer:?}");
    let line = answer.line();
    assert!(line.starts_with("554 5.7.1 upstream refused "), "{line}");
    // The upstream's words, on one printable line.
    assert!(
        line.ends_with(": 554 5.7.1 message content rejected by policy"),
        "{line}"
    );
    let id = line["554 5.7.1 upstream refused ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    let stored = relay.stored(&id).await;
    assert_eq!(stored.state, State::Failed);
    assert_eq!(stored.reply, line);
    assert!(
        stored.dsns.is_empty(),
        "a bounce for a refusal the client heard"
    );
    assert_eq!(relay.count("messages").await, 1, "a DSN record was queued");
    // A retry replays the refusal and sends nothing, even once the upstream would accept.
    sink.set_faults(vec![]).unwrap();
    let again = submit_to(waiting, &msg).await;
    assert_eq!(again.line(), format!("{line} (idempotent replay)"));
    let on_ordinary = submit_to(relay.addr, &msg).await;
    assert_eq!(on_ordinary.line(), again.line());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.transactions().len(), 1, "a second upstream attempt");
    assert_eq!(relay.store().attempts(&id).await.unwrap().len(), 1);
}

/// Driven by swaks, as a test suite would: the RCPT refusal reaches swaks as a 5xx at the end
/// of DATA, and swaks says so in its exit status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaks_hears_an_upstream_rcpt_refusal_at_the_end_of_data() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Rcpt,
        550,
        "5.1.1 <nobody@example.net>: Recipient address rejected: User unknown",
    )])
    .unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_secs(10), |_| {}).await;
    let run = move || {
        Command::new("swaks")
            .args(["--server", &waiting.to_string()])
            .args(["--helo", "client.test"])
            .args(["--from", "sender@example.com", "--to", "nobody@example.net"])
            .args(["--header", "Date: Sun, 29 Nov 2026 10:00:00 +0000"])
            .args(["--header", "Message-Id: <bq-swaks@example.com>"])
            .args(["--header", "Subject: before-queue"])
            .args(["--header", "X-Bird-Idempotency-Key: bq-swaks-1"])
            .args(["--timeout", "20"])
            .output()
    };
    let out = match tokio::task::spawn_blocking(run).await.unwrap() {
        Ok(out) => out,
        Err(_) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED: swaks is not installed (apt-get install -y swaks)");
            return;
        }
        Err(err) => panic!("swaks is required in CI: {err}"),
    };
    let transcript = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!out.status.success(), "{transcript}");
    assert!(
        transcript.contains("<** 550 5.1.1 upstream refused ")
            && transcript.contains("Recipient address rejected: User unknown"),
        "{transcript}"
    );
    assert!(sink.transactions().is_empty());
    let failed = relay
        .store()
        .list(Some(State::Failed), 10, None)
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(relay.count("messages").await, 1, "a DSN record was queued");
    // swaks again with the same bytes: the same refusal, replayed; still no upstream session
    // reached the dot, and the ledger holds the one attempt.
    let again = tokio::task::spawn_blocking(run).await.unwrap().unwrap();
    let transcript = String::from_utf8_lossy(&again.stdout).to_string();
    assert!(transcript.contains("(idempotent replay)"), "{transcript}");
    let attempts = relay.store().attempts(&failed[0].id).await.unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_4xx_answers_queued_and_ordinary_delivery_sends_it_once() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Dot,
        451,
        "4.3.0 try later",
    )
    .with_times(1)])
        .unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_secs(10), |_| {}).await;
    let answer = submit_to(waiting, &message(Some("bq-4xx-1"), "bq", "body")).await;
    let id = answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"));
    wait_state(&relay, &id, State::Delivered).await;
    assert_eq!(accepted_at_sink(&sink), 1);
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert_eq!(ledger[0].outcome.as_deref(), Some("transient"));
    // The client heard `queued`, so that is what a retry replays.
    assert_eq!(relay.stored(&id).await.reply, answer.line());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_slower_than_the_bound_answers_queued_and_is_delivered_once() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_millis(2000),
    )
    .with_times(1)])
        .unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_millis(700), |_| {}).await;
    let started = Instant::now();
    let answer = submit_to(waiting, &message(Some("bq-slow-1"), "bq", "body")).await;
    let waited = started.elapsed();
    let id = answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"));
    assert!(waited >= Duration::from_millis(600), "{waited:?}");
    assert!(waited < Duration::from_millis(1900), "{waited:?}");
    wait_state(&relay, &id, State::Delivered).await;
    assert_eq!(sink.transactions().len(), 1, "sent twice");
    assert_eq!(relay.stored(&id).await.reply, answer.line());
}

/// The bound passed first, so the refusal that comes later is the ordinary kind: failed, with
/// a bounce to the sender, and the client's `queued` stays what a retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_the_bound_takes_the_ordinary_path_with_a_bounce() {
    let sink = start_sink().await;
    sink.set_faults(vec![
        FaultRule::delay(FaultStage::Rcpt, Duration::from_millis(1500))
            .with_rcpt("rcpt@example.com")
            .with_times(1),
        FaultRule::reply(FaultStage::Dot, 554, "5.7.1 rejected").with_key("bq-late-1"),
    ])
    .unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_millis(500), |_| {}).await;
    let msg = message(Some("bq-late-1"), "bq", "body");
    let answer = submit_to(waiting, &msg).await;
    let id = answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"));
    wait_state(&relay, &id, State::Failed).await;
    let stored = relay.stored(&id).await;
    assert_eq!(
        stored.dsns.len(),
        1,
        "no bounce after a refusal the client did not hear"
    );
    assert_eq!(stored.reply, answer.line());
    let again = submit_to(waiting, &msg).await;
    assert_eq!(
        again.line(),
        format!("{} (idempotent replay)", answer.line())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_after_the_dot_answers_queued_and_one_copy_reaches_the_upstream() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::drop_after_dot().with_times(1)])
        .unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_secs(10), |_| {}).await;
    let answer = submit_to(waiting, &message(Some("bq-lost-1"), "bq", "body")).await;
    let id = answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"));
    wait_state(&relay, &id, State::Delivered).await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger[0].outcome.as_deref(), Some("unknown"), "{ledger:?}");
    // The retry under the same key was the upstream's replay, not a second message.
    assert_eq!(accepted_at_sink(&sink), 1);
    assert_eq!(sink.messages().len(), 1);
}

/// A retry arriving while the first submission's attempt is in flight waits for the first
/// client's answer and hears the same; neither causes a second upstream attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_during_the_attempt_hears_what_the_first_client_hears() {
    let sink = start_sink().await;
    sink.set_faults(vec![
        FaultRule::delay(FaultStage::Rcpt, Duration::from_millis(1500)),
        FaultRule::reply(FaultStage::Dot, 550, "5.7.1 refused").with_key("bq-race-refused"),
    ])
    .unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_secs(10), |_| {}).await;
    for (key, code) in [("bq-race-refused", 550), ("bq-race-accepted", 250)] {
        let msg = message(Some(key), "bq", "body");
        let first = {
            let msg = msg.clone();
            tokio::spawn(async move { submit_to(waiting, &msg).await })
        };
        // The first attempt is at the upstream (held at RCPT) when the retries come, one on
        // each listener.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let retry_here = {
            let msg = msg.clone();
            tokio::spawn(async move { submit_to(waiting, &msg).await })
        };
        let retry_ordinary = {
            let msg = msg.clone();
            let addr = relay.addr;
            tokio::spawn(async move { submit_to(addr, &msg).await })
        };
        let first = first.await.unwrap();
        assert_eq!(first.code, code, "{first:?}");
        let replayed = format!("{} (idempotent replay)", first.line());
        assert_eq!(retry_here.await.unwrap().line(), replayed);
        assert_eq!(retry_ordinary.await.unwrap().line(), replayed);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attempts: usize = relay
        .store()
        .list(None, 10, None)
        .await
        .unwrap()
        .iter()
        .map(|m| m.attempts as usize)
        .sum();
    assert_eq!(attempts, 2, "one attempt per message");
    assert_eq!(sink.transactions().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_relay_answers_queued_at_once_and_sends_nothing_until_resumed() {
    let sink = start_sink().await;
    let (relay, waiting) = relay_waiting(&sink, Duration::from_secs(10), |_| {}).await;
    relay.store().pause("operator", false).await.unwrap();
    let started = Instant::now();
    let answer = submit_to(waiting, &message(Some("bq-paused-1"), "bq", "body")).await;
    let id = answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited for a paused upstream"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sink.transactions().is_empty());
    relay.store().resume().await.unwrap();
    wait_state(&relay, &id, State::Delivered).await;
    assert_eq!(sink.transactions().len(), 1);
}

/// Per user: `before_queue = true` in the users file makes that user's submissions wait for
/// the verdict on an ordinary listener; other users there are answered `250 queued`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_marked_before_queue_hears_the_verdict_on_an_ordinary_listener() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Dot,
        554,
        "5.7.1 no thanks",
    )])
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    idemrelay::auth::Users::add_user(&users, "alice", "correct horse", "tenant-alice", &[])
        .unwrap();
    idemrelay::auth::Users::add_user(&users, "bob", "battery staple", "tenant-bob", &[]).unwrap();
    let text = std::fs::read_to_string(&users)
        .unwrap()
        .replace("[users.alice]\n", "[users.alice]\nbefore_queue = true\n");
    std::fs::write(&users, text).unwrap();
    // A password change keeps the setting.
    idemrelay::auth::Users::add_user(&users, "alice", "correct horse", "tenant-alice", &[])
        .unwrap();
    assert!(std::fs::read_to_string(&users)
        .unwrap()
        .contains("before_queue = true"));
    let mut settings = common::test_settings(dir.path());
    settings.users_file = Some(users);
    common::fast_delivery(&mut settings, sink.smtp_addr());
    let relay = TestRelay::start_in(dir, settings).await;
    let mut answers = Vec::new();
    for (user, password) in [("alice", "correct horse"), ("bob", "battery staple")] {
        let mut c = Client::ready(relay.addr).await;
        assert_eq!(c.cmd(&common::auth_plain(user, password)).await.code, 235);
        let msg = message(Some("bq-user-1"), "bq", &format!("from {user}"));
        answers.push(
            c.submit(&format!("{user}@example.com"), &["x@example.net"], &msg)
                .await,
        );
        c.quit().await;
    }
    assert_eq!(answers[0].code, 554, "alice: {:?}", answers[0]);
    assert!(
        answers[0].line().contains("upstream refused"),
        "{:?}",
        answers[0]
    );
    let bobs = answers[1]
        .queue_id()
        .unwrap_or_else(|| panic!("bob: {:?}", answers[1]));
    // Bob's refusal is an ordinary one: failed, with a bounce.
    wait_state(&relay, &bobs, State::Failed).await;
    assert_eq!(relay.stored(&bobs).await.dsns.len(), 1);
}

/// An upstream that is down opens the breaker; from then on a waiting client is answered
/// `250 queued` at once, no attempt is made for it, and the message goes out once the
/// upstream is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_answers_queued_at_once_without_an_attempt() {
    let sink = start_sink().await;
    sink.pause(idemrelay_sink::Down::Greet421).await.unwrap();
    let (relay, waiting) = relay_waiting(&sink, Duration::from_secs(10), |s| {
        s.delivery.breaker_threshold = 1;
        s.delivery.breaker_cooldown = Duration::from_secs(2);
    })
    .await;
    // The first one's immediate attempt meets the 421 greeting: transient, and the breaker
    // opens on it.
    let first = submit_to(waiting, &message(Some("bq-breaker-1"), "bq", "one")).await;
    let first = first
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {first:?}"));
    eventually(LIMIT, "the first attempt", || async {
        let n = relay.store().attempts(&first).await.unwrap().len();
        (n >= 1).then_some(())
    })
    .await;
    let started = Instant::now();
    let second = submit_to(waiting, &message(Some("bq-breaker-2"), "bq", "two")).await;
    let second = second
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {second:?}"));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "waited for an open breaker"
    );
    assert!(
        relay.store().attempts(&second).await.unwrap().is_empty(),
        "an attempt while the breaker is open"
    );
    sink.resume().await.unwrap();
    wait_state(&relay, &first, State::Delivered).await;
    wait_state(&relay, &second, State::Delivered).await;
    assert_eq!(accepted_at_sink(&sink), 2);
}
