//! The upstream circuit breaker blames the right thing (docs/concepts/delivery.md, "Circuit
//! breaker"), over real sockets with `idemrelay sink` as the upstream: messages failing on their
//! own (a busy mailbox, a lost reply to the dot) leave it closed and a healthy message goes
//! through at once; an upstream that cannot be reached opens it, connection checks (not the
//! failing messages) probe it, and it closes when the upstream is back.

use crate::common;

use std::time::{Duration, Instant};

use common::http::{get, sample};
use common::{eventually, message, relay_for, start_sink, Client, TestRelay};
use idemrelay::store::{AttemptRow, State};
use idemrelay_sink::{Down, FaultRule, FaultStage};

const LIMIT: Duration = Duration::from_secs(20);

/// Submits one message per key to `rcpt`; returns the queue ids in order.
async fn submit_to(relay: &TestRelay, rcpt: &str, keys: &[&str]) -> Vec<String> {
    let mut c = Client::ready(relay.addr).await;
    let mut ids = Vec::new();
    for key in keys {
        let answer = c
            .submit(
                "sender@example.com",
                &[rcpt],
                &message(Some(key), &format!("breaker {key}"), "body"),
            )
            .await;
        ids.push(
            answer
                .queue_id()
                .unwrap_or_else(|| panic!("{key} not accepted: {answer:?}")),
        );
    }
    c.quit().await;
    ids
}

async fn attempts(relay: &TestRelay, id: &str) -> Vec<AttemptRow> {
    relay.store().attempts(id).await.unwrap()
}

/// The breaker's series from the relay's `/metrics`: state gauge and transitions by target.
#[derive(Debug, Clone, Copy, PartialEq)]
struct BreakerSeries {
    closed: f64,
    open: f64,
    half_open: f64,
    to_open: f64,
    to_half_open: f64,
    to_closed: f64,
}

async fn breaker_series(relay: &TestRelay) -> BreakerSeries {
    let page = get(relay.admin(), "/metrics", None).await.body;
    let value =
        |series: &str| sample(&page, series).unwrap_or_else(|| panic!("{series} missing:\n{page}"));
    BreakerSeries {
        closed: value("idemrelay_circuit_breaker_state{state=\"closed\"}"),
        open: value("idemrelay_circuit_breaker_state{state=\"open\"}"),
        half_open: value("idemrelay_circuit_breaker_state{state=\"half_open\"}"),
        to_open: value("idemrelay_circuit_breaker_transitions_total{to=\"open\"}"),
        to_half_open: value("idemrelay_circuit_breaker_transitions_total{to=\"half_open\"}"),
        to_closed: value("idemrelay_circuit_breaker_transitions_total{to=\"closed\"}"),
    }
}

/// The operator's report: four messages to one mailbox answered `451 4.2.1 mailbox busy` and
/// two whose reply to the final dot is dropped, retried again and again on a healthy upstream.
/// Their failures are their own: the breaker stays closed (its gauge and its transition
/// counter say so), and a normal message queued among them is delivered within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_failing_on_their_own_leave_the_breaker_closed() {
    const THRESHOLD: u32 = 3;
    let sink = start_sink().await;
    sink.set_faults(vec![
        FaultRule::reply(FaultStage::Rcpt, 451, "4.2.1 mailbox busy").with_rcpt("busy@"),
        FaultRule::drop_after_dot().with_rcpt("lost@"),
    ])
    .unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.breaker_threshold = THRESHOLD;
        // Long: a breaker opened by these messages would hold the healthy one for a minute.
        s.delivery.breaker_cooldown = Duration::from_secs(60);
        s.delivery.max_attempts = 1000;
        s.delivery.connections = 2;
    })
    .await;
    let mut failing = submit_to(
        &relay,
        "busy@example.com",
        &["busy-1", "busy-2", "busy-3", "busy-4"],
    )
    .await;
    failing.extend(submit_to(&relay, "lost@example.com", &["lost-1", "lost-2"]).await);

    // As many failures in a row as the threshold, before the healthy message is queued.
    eventually(LIMIT, "the failing messages tried", || async {
        let mut failed = 0;
        for id in &failing {
            failed += attempts(&relay, id)
                .await
                .iter()
                .filter(|a| a.finished_at_ms.is_some())
                .count();
        }
        (failed >= THRESHOLD as usize).then_some(())
    })
    .await;

    let queued = Instant::now();
    let healthy = submit_to(&relay, "ok@example.com", &["healthy-1"]).await;
    let healthy = &healthy[0];
    let deadline = queued + Duration::from_secs(5);
    loop {
        if relay.stored(healthy).await.state == State::Delivered {
            break;
        }
        if Instant::now() >= deadline {
            let tried = attempts(&relay, healthy).await.len();
            panic!(
                "the healthy message was not delivered within 5 s ({tried} attempts); breaker: {:?}",
                breaker_series(&relay).await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delay = queued.elapsed();

    // Each failing message keeps failing, well past the threshold, and the breaker stays shut.
    eventually(LIMIT, "each failing message tried three times", || async {
        for id in &failing {
            if attempts(&relay, id).await.len() < 3 {
                return None;
            }
        }
        Some(())
    })
    .await;
    let series = breaker_series(&relay).await;
    assert_eq!(
        (series.closed, series.open, series.half_open, series.to_open),
        (1.0, 0.0, 0.0, 0.0),
        "{series:?}"
    );
    for id in &failing[..4] {
        for a in attempts(&relay, id)
            .await
            .iter()
            .filter(|a| a.outcome.is_some())
        {
            assert_eq!(
                (a.outcome.as_deref(), a.phase.as_deref(), a.code),
                (Some("transient"), Some("rcpt"), Some(451)),
                "{a:?}"
            );
        }
    }
    for id in &failing[4..] {
        for a in attempts(&relay, id)
            .await
            .iter()
            .filter(|a| a.outcome.is_some())
        {
            assert_eq!(
                (a.outcome.as_deref(), a.phase.as_deref()),
                (Some("unknown"), Some("dot")),
                "{a:?}"
            );
        }
    }
    let tried = attempts(&relay, healthy).await;
    assert_eq!(tried.len(), 1, "{tried:?}");
    eprintln!(
        "healthy message delivered {} ms after it was queued",
        delay.as_millis()
    );
}

/// An upstream that cannot be reached opens the breaker. While it stays down, each probe is a
/// connection check, not one of the messages (they have failed before): no message pays an
/// attempt for a probe, and every failed check reopens the breaker. Once the upstream is back
/// the next check closes it and the messages are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_opens_the_breaker_and_a_connection_check_closes_it() {
    const THRESHOLD: u32 = 2;
    const CONNECTIONS: usize = 2;
    let sink = start_sink().await;
    sink.pause(Down::Refuse).await.unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.breaker_threshold = THRESHOLD;
        s.delivery.breaker_cooldown = Duration::from_millis(300);
        s.delivery.connections = CONNECTIONS;
    })
    .await;
    let ids = submit_to(&relay, "rcpt@example.com", &["down-1", "down-2"]).await;

    // Opened, then reopened by at least two failed checks.
    let down = eventually(LIMIT, "the breaker open and reopened twice", || async {
        let s = breaker_series(&relay).await;
        (s.to_open >= 3.0 && s.to_half_open >= 2.0).then_some(s)
    })
    .await;
    assert_eq!(down.closed, 0.0, "{down:?}");
    let mut during = Vec::new();
    for id in &ids {
        during.extend(attempts(&relay, id).await);
    }
    // The run that opened it, plus at most one attempt another connection had begun.
    assert!(
        during.len() < THRESHOLD as usize + CONNECTIONS,
        "probes paid message attempts: {during:#?}"
    );
    for a in during.iter().filter(|a| a.outcome.is_some()) {
        assert_eq!(
            (a.outcome.as_deref(), a.phase.as_deref(), a.code),
            (Some("transient"), Some("connect"), None),
            "{a:?}"
        );
    }

    sink.resume().await.unwrap();
    for id in &ids {
        eventually(LIMIT, &format!("{id} delivered"), || async {
            (relay.stored(id).await.state == State::Delivered).then_some(())
        })
        .await;
    }
    let up = breaker_series(&relay).await;
    assert_eq!(
        (up.closed, up.open, up.half_open),
        (1.0, 0.0, 0.0),
        "{up:?}"
    );
    assert!(up.to_closed >= 1.0, "{up:?}");
    // Each message: the failures while down, then exactly one attempt, accepted.
    let mut after = 0;
    for id in &ids {
        let rows = attempts(&relay, id).await;
        assert_eq!(
            rows.last().and_then(|a| a.outcome.as_deref()),
            Some("accepted")
        );
        after += rows.len();
    }
    assert_eq!(after, during.len() + ids.len(), "{during:#?}");
    assert_eq!(sink.messages().len(), ids.len());
}

/// Messages failing on their own open the breaker only as many different ones: three messages
/// to one busy mailbox, failing again and again, leave it closed (they count once); a third
/// different recipient failing too, with nothing going through, opens it (`breaker_window_*`).
/// Once the mailboxes take mail again, a connection check closes it and all are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_different_messages_failing_open_the_breaker() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Rcpt,
        451,
        "4.2.1 mailbox busy",
    )
    .with_rcpt("busy")])
        .unwrap();
    let relay = relay_for(&sink, |s| {
        s.delivery.breaker_cooldown = Duration::from_millis(300);
        s.delivery.breaker_window = Duration::from_secs(60);
        s.delivery.breaker_window_messages = 3;
        s.delivery.breaker_window_ratio = 0.8;
        s.delivery.max_attempts = 1000;
    })
    .await;
    let mut ids = submit_to(&relay, "busy1@example.com", &["same-1", "same-2", "same-3"]).await;
    eventually(
        LIMIT,
        "each message to one mailbox tried three times",
        || async {
            for id in &ids {
                if attempts(&relay, id).await.len() < 3 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    assert_eq!(breaker_series(&relay).await.to_open, 0.0);

    ids.extend(submit_to(&relay, "busy2@example.com", &["other-2"]).await);
    ids.extend(submit_to(&relay, "busy3@example.com", &["other-3"]).await);
    let open = eventually(LIMIT, "the breaker open", || async {
        let s = breaker_series(&relay).await;
        (s.to_open >= 1.0).then_some(s)
    })
    .await;
    assert_eq!(open.to_closed, 0.0, "{open:?}");

    sink.set_faults(vec![]).unwrap();
    for id in &ids {
        eventually(LIMIT, &format!("{id} delivered"), || async {
            (relay.stored(id).await.state == State::Delivered).then_some(())
        })
        .await;
    }
    let up = breaker_series(&relay).await;
    assert_eq!(
        (up.closed, up.open, up.half_open),
        (1.0, 0.0, 0.0),
        "{up:?}"
    );
    assert!(up.to_closed >= 1.0, "{up:?}");
}
