//! Delivery over real sockets with `idemrelay sink` as the upstream: every row of the delivery
//! outcome table (docs/concepts/delivery.md), byte-identical forwarding, DSNs, pause on account failures.

use crate::common;

use std::time::Duration;

use common::{eventually, message, relay_for, start_sink, submit, wait_state, Client};
use idemrelay::store::State;
use idemrelay_sink::{Down, FaultRule, FaultStage, Sink, SinkConfig, SinkHandle};

const LIMIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_upstream_is_delivered_with_identical_bytes() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    let msg = message(Some("deliver-1"), "hello", "body\r\n.leading dot\r\n..two");
    let id = submit(&relay, "sender@example.com", &["rcpt@example.com"], &msg).await;
    wait_state(&relay, &id, State::Delivered).await;
    let stored = relay.stored(&id).await;
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key.as_deref(), Some("deliver-1"));
    assert_eq!(got[0].bytes, stored.content.clone().unwrap());
    assert_eq!(got[0].mail_from, "sender@example.com");
    assert_eq!(got[0].rcpt_to, vec!["rcpt@example.com"]);
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].outcome.as_deref(), Some("accepted"));
    assert_eq!(ledger[0].code, Some(250));
    assert!(ledger[0].finished_at_ms.is_some());
}

/// The sink reads keys with its own parser, so this checks the relay's reading of a folded,
/// oddly cased key header against an independent one: both must find the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folded_key_header_means_the_same_key_to_the_relay_and_the_upstream() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    let msg = b"From: Sender <sender@example.com>\r\n\
                x-BIRD-idempotency-key:\r\n\
                \tfolded-key-7 \r\n\
                Subject: folded\r\n\
                \r\n\
                X-Bird-Idempotency-Key: not-this-one\r\n";
    let id = submit(&relay, "sender@example.com", &["rcpt@example.com"], msg).await;
    wait_state(&relay, &id, State::Delivered).await;
    let stored = relay.stored(&id).await;
    assert_eq!(stored.key.as_deref(), Some("folded-key-7"));
    assert_eq!(stored.upstream_key.as_deref(), Some("folded-key-7"));
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key.as_deref(), Some("folded-key-7"));
    assert_eq!(got[0].bytes, stored.content.unwrap());
}

/// A key that Python's `EmailMessage` encoded (205 characters, 273 as spelled) reaches the
/// upstream plain: the sink, which does not decode encoded words, finds the application's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_ascii_key_reaches_the_upstream_plain() {
    use crate::intake::{python_message, PYTHON_LONG_FIELD, PYTHON_LONG_KEY};
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    let msg = python_message("r-205", PYTHON_LONG_FIELD);
    let id = submit(&relay, "app@example.com", &["user@example.com"], &msg).await;
    wait_state(&relay, &id, State::Delivered).await;
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key.as_deref(), Some(PYTHON_LONG_KEY));
    assert_eq!(got[0].bytes, relay.stored(&id).await.content.unwrap());
}

/// One mailbox named twice in a transaction, its domain in another case, reaches the upstream
/// once (as Postfix forwards it), under one spelling; a local part in another case is another
/// mailbox and goes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipient_repeated_in_another_case_is_forwarded_once() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(c.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
    for rcpt in ["dup@example.net", "dup@EXAMPLE.NET", "Dup@example.net"] {
        let answer = c.cmd(&format!("RCPT TO:<{rcpt}>")).await;
        assert_eq!(answer.code, 250, "{rcpt}: {answer:?}");
    }
    let answer = c.data(&message(Some("dup-case-1"), "s", "b")).await;
    c.quit().await;
    let id = answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"));
    wait_state(&relay, &id, State::Delivered).await;
    let forwarded = vec!["dup@EXAMPLE.NET", "Dup@example.net"];
    let got = sink.transactions();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].rcpt_to, forwarded);
    assert_eq!(relay.stored(&id).await.rcpt_to, forwarded);
}

/// Header sections where a lenient parser and an RFC 5322 reader disagree about the key: the
/// relay must either refuse them or record exactly the key the upstream (the sink, an
/// independent RFC 5322 reader) finds in the bytes it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_hidden_by_a_malformed_header_section_is_never_deduplicated_alone() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    let shapes: [&[u8]; 4] = [
        b"From: <s@x>\r\ngarbage\r\n X-Bird-Idempotency-Key: lead-2\r\nSubject: s\r\n\r\nbody\r\n",
        b"From: <s@x>\r\nSubject: s\r\n\tX-Bird-Idempotency-Key: lead-3\r\n\r\nbody\r\n",
        b"From: <s@x>\r\nX-Bird-Idempotency-Key : lead-4\r\n\r\nbody\r\n",
        b"From: <s@x>\r\ngarbage\r\nX-Bird-Idempotency-Key: lead-5\r\n\r\nbody\r\n",
    ];
    for msg in shapes {
        let shown = String::from_utf8_lossy(msg);
        let mut c = Client::ready(relay.addr).await;
        let answer = c.submit("s@x", &["rcpt@example.com"], msg).await;
        c.quit().await;
        let Some(id) = answer.queue_id() else {
            assert!(
                answer.line().starts_with("554 5.6.0 "),
                "{shown:?}: {answer:?}"
            );
            continue;
        };
        wait_state(&relay, &id, State::Delivered).await;
        let stored = relay.stored(&id).await;
        let got = sink.messages();
        let sent = got.last().unwrap();
        assert_eq!(sent.bytes, stored.content.clone().unwrap(), "{shown:?}");
        assert_eq!(sent.key, stored.upstream_key, "{shown:?}");
    }
}

/// 200 KB: on SQLite the body lives in a spool segment, read back for each attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_message_is_delivered_with_identical_bytes_on_every_attempt() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::drop_after_dot().with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let line = "a line of a large message, with .dots and trailing space \r\n.";
    let body: String = (0..3000).map(|n| format!("{n:05} {line}\r\n")).collect();
    let msg = message(Some("large-1"), "large", &body);
    assert!(msg.len() > 200_000);
    let id = submit(&relay, "sender@example.com", &["rcpt@example.com"], &msg).await;
    wait_state(&relay, &id, State::Delivered).await;
    let stored = relay.stored(&id).await.content.unwrap();
    // The relay's Received header, then the client's bytes.
    assert!(stored.starts_with(b"Received: ") && stored.ends_with(&msg));
    let tx = sink.transactions();
    assert_eq!(tx.len(), 2, "the lost reply is retried");
    assert!(
        tx.iter().all(|t| t.bytes == stored),
        "bytes differ at the sink"
    );
    assert_eq!(sink.messages().len(), 1);
    if relay.settings.store.0.starts_with("sqlite:") {
        // The body went to the spool, not into the database's pages.
        let spool = relay.dir.path().join("relay.db.spool");
        let spooled: u64 = std::fs::read_dir(&spool)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(spooled, stored.len() as u64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_lost_after_the_dot_is_retried_with_the_same_key_and_bytes() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::drop_after_dot().with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let msg = message(Some("lost-reply-1"), "s", "body");
    let id = submit(&relay, "sender@example.com", &["rcpt@example.com"], &msg).await;
    wait_state(&relay, &id, State::Delivered).await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    let outcomes: Vec<_> = ledger.iter().map(|a| a.outcome.clone().unwrap()).collect();
    assert_eq!(outcomes, vec!["unknown", "accepted"], "{ledger:?}");
    assert_eq!(ledger[0].phase.as_deref(), Some("dot"));
    // One message at the sink after its dedup; two raw transactions with identical bytes.
    assert_eq!(sink.messages().len(), 1);
    let tx = sink.transactions();
    assert_eq!(tx.len(), 2);
    assert_eq!(tx[0].bytes, tx[1].bytes);
    assert_eq!(tx[0].key, tx[1].key);
    assert_eq!(tx[0].bytes, relay.stored(&id).await.content.unwrap());
    assert!(tx[1]
        .reply
        .as_deref()
        .unwrap()
        .ends_with("(idempotent replay)"));
    assert_eq!(sink.stats().keys["lost-reply-1"].accepted, 1);
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_are_identical_for_dots_8bit_and_a_missing_final_crlf() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    let mut c = Client::ready(relay.addr).await;
    // Dot-stuffed lines.
    let dotted = message(Some("bytes-dots"), "dots", ".\r\n..\r\n.x\r\n...y");
    let a = c
        .submit("s@example.com", &["r@example.com"], &dotted)
        .await
        .queue_id()
        .unwrap();
    // 8-bit body declared with BODY=8BITMIME.
    let eight = [
        &b"From: s@example.com\r\nX-Bird-Idempotency-Key: bytes-8bit\r\nSubject: 8bit\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n"[..],
        "grüße, ümlaut, 日本語\r\n".as_bytes(),
    ]
    .concat();
    assert_eq!(
        c.cmd("MAIL FROM:<s@example.com> BODY=8BITMIME").await.code,
        250
    );
    assert_eq!(c.cmd("RCPT TO:<r@example.com>").await.code, 250);
    let b = c.data(&eight).await.queue_id().unwrap();
    // BDAT without a final CRLF: DATA upstream must end the last line.
    let open_ended =
        b"From: s@example.com\r\nX-Bird-Idempotency-Key: bytes-open\r\n\r\nno final newline";
    assert_eq!(c.cmd("MAIL FROM:<s@example.com>").await.code, 250);
    assert_eq!(c.cmd("RCPT TO:<r@example.com>").await.code, 250);
    c.send(format!("BDAT {} LAST\r\n", open_ended.len()).as_bytes())
        .await;
    c.send(open_ended).await;
    let d = c.read_answer().await.unwrap().queue_id().unwrap();
    c.quit().await;
    for id in [&a, &b, &d] {
        wait_state(&relay, id, State::Delivered).await;
    }
    let by_key = |k: &str| {
        sink.messages()
            .into_iter()
            .find(|m| m.key.as_deref() == Some(k))
            .unwrap()
    };
    assert_eq!(
        by_key("bytes-dots").bytes,
        relay.stored(&a).await.content.unwrap()
    );
    let eight_at_sink = by_key("bytes-8bit");
    assert!(eight_at_sink.eightbitmime);
    assert_eq!(eight_at_sink.bytes, relay.stored(&b).await.content.unwrap());
    let mut expected = relay.stored(&d).await.content.unwrap();
    assert!(!expected.ends_with(b"\r\n"));
    expected.extend_from_slice(b"\r\n");
    assert_eq!(by_key("bytes-open").bytes, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_messages_arrive_byte_for_byte() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| s.delivery.connections = 1).await;
    let mut ids = Vec::new();
    let mut c = Client::ready(relay.addr).await;
    for (_, mut msg) in common::corpus() {
        if !msg.ends_with(b"\r\n") {
            msg.extend_from_slice(b"\r\n");
        }
        let answer = c.submit("s@example.com", &["r@example.com"], &msg).await;
        if let Some(id) = answer.queue_id() {
            ids.push(id);
        }
    }
    c.quit().await;
    assert!(ids.len() >= 20);
    for id in &ids {
        wait_state(&relay, id, State::Delivered).await;
    }
    let messages = sink.messages();
    assert_eq!(messages.len(), ids.len());
    for id in &ids {
        let content = relay.stored(id).await.content.unwrap();
        assert!(
            messages.iter().any(|m| m.bytes == content),
            "{id}: sink bytes differ from the stored bytes"
        );
    }
    // One connection carried them all (reuse), well under the per-connection cap.
    assert!(
        sink.stats().connections <= 2,
        "{:?}",
        sink.stats().connections
    );
}

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

/// A sink with TLS from a certificate made now, and AUTH required.
async fn tls_sink(implicit: bool) -> (SinkHandle, tempfile::TempDir) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let sink = Sink::start(SinkConfig {
        tls: Some((cert, key)),
        implicit_tls: implicit,
        require_auth: Some(("relay-user".into(), "s3cret pass".into())),
        ..SinkConfig::default()
    })
    .await
    .unwrap();
    (sink, dir)
}

async fn deliver_over_tls(url: String, sink: &SinkHandle, ca: std::path::PathBuf) {
    let relay = relay_for(sink, |s| {
        s.upstream = Some(idemrelay::config::SecretUrl(url));
        s.delivery.ca_file = Some(ca);
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("tls-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Delivered).await;
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert!(got[0].tls, "delivered without TLS");
    assert_eq!(got[0].auth_user.as_deref(), Some("relay-user"));
    assert_eq!(got[0].bytes, relay.stored(&id).await.content.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_and_auth_with_a_custom_ca() {
    let (sink, dir) = tls_sink(false).await;
    let port = sink.smtp_addr().port();
    // The password is percent-encoded in the URL (it has a space).
    let url = format!("smtp://relay-user:s3cret%20pass@localhost:{port}");
    deliver_over_tls(url, &sink, dir.path().join("cert.pem")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implicit_tls_and_auth_with_a_custom_ca() {
    let (sink, dir) = tls_sink(true).await;
    let port = sink.smtp_addr().port();
    let url = format!("smtps://relay-user:s3cret%20pass@localhost:{port}");
    deliver_over_tls(url, &sink, dir.path().join("cert.pem")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_not_delivered_to() {
    let (sink, _dir) = tls_sink(false).await;
    let port = sink.smtp_addr().port();
    let relay = relay_for(&sink, |s| {
        s.upstream = Some(idemrelay::config::SecretUrl(format!(
            "smtp://relay-user:s3cret%20pass@localhost:{port}"
        )));
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("tls-untrusted"), "s", "b"),
    )
    .await;
    eventually(LIMIT, "a failed TLS attempt", || async {
        let ledger = relay.store().attempts(&id).await.unwrap();
        ledger
            .first()
            .filter(|a| a.finished_at_ms.is_some())
            .cloned()
    })
    .await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(
        ledger[0].outcome.as_deref(),
        Some("transient"),
        "{ledger:?}"
    );
    assert_eq!(ledger[0].phase.as_deref(), Some("starttls"), "{ledger:?}");
    assert!(sink.messages().is_empty());
    assert_eq!(relay.stored(&id).await.state, State::Queued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_upstream_without_starttls_is_refused_for_smtp_urls() {
    // `smtp://` without `?tls=none` requires STARTTLS: a sink that does not offer it is not
    // given the message (nor the password) in the clear.
    let sink = start_sink().await;
    let port = sink.smtp_addr().port();
    let relay = relay_for(&sink, |s| {
        s.upstream = Some(idemrelay::config::SecretUrl(format!(
            "smtp://user:pw@127.0.0.1:{port}"
        )));
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("no-starttls"), "s", "b"),
    )
    .await;
    let attempt = eventually(LIMIT, "a refused attempt", || async {
        relay
            .store()
            .attempts(&id)
            .await
            .unwrap()
            .into_iter()
            .find(|a| a.finished_at_ms.is_some())
    })
    .await;
    assert_eq!(attempt.phase.as_deref(), Some("starttls"));
    assert_eq!(attempt.outcome.as_deref(), Some("transient"));
    assert_eq!(sink.transactions().len(), 0);
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

/// A split message (docs/concepts/contract.md): both parts reach the upstream, each under a key of its own
/// (the client's for part 1), so the upstream takes neither for a reuse of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_parts_of_a_split_message_are_delivered_under_their_own_keys() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| s.max_recipients = 2).await;
    let msg = message(Some("split-delivery"), "s", "one message, three recipients");
    let a = submit(
        &relay,
        "sender@example.com",
        &["a@example.com", "b@example.com"],
        &msg,
    )
    .await;
    let b = submit(&relay, "sender@example.com", &["c@example.com"], &msg).await;
    assert_ne!(a, b);
    wait_state(&relay, &a, State::Delivered).await;
    wait_state(&relay, &b, State::Delivered).await;
    let mut keys: Vec<String> = sink
        .messages()
        .iter()
        .filter_map(|m| m.key.clone())
        .collect();
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], "split-delivery");
    assert!(keys[1].ends_with("-2-split-delivery"), "{keys:?}");
    let stats = sink.stats();
    assert!(stats.keys.values().all(|k| k.accepted == 1), "{stats:?}");
}

/// Two tenants sharing one upstream account (docs/concepts/contract.md "The key the upstream sees"): alice and
/// bob each send their own message under `welcome-customer-1`. Both are delivered, each once,
/// under keys that carry the scope; the upstream sees no reuse and no DSN is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_scopes_with_the_same_key_are_both_delivered() {
    let sink = start_sink().await;
    let relay = relay_with_alice_and_bob(&sink, |_| {}).await;
    let ids = alice_and_bob_submit(&relay, "welcome-customer-1").await;
    let keys: Vec<String> = sink
        .messages()
        .iter()
        .filter_map(|m| m.key.clone())
        .collect();
    assert_eq!(keys.len(), 2, "no DSN, no refusal: {keys:?}");
    assert_ne!(keys[0], keys[1]);
    for id in &ids {
        let stored = relay.stored(id).await;
        assert_eq!(stored.key.as_deref(), Some("welcome-customer-1"));
        let up = stored.upstream_key.unwrap();
        assert!(
            up.starts_with("u1-") && up.ends_with("-1-welcome-customer-1"),
            "{up}"
        );
        assert!(keys.contains(&up), "{up} not at the sink: {keys:?}");
    }
}

/// Two relays on one store and one upstream, each with a scope of its own (two tenants'
/// instances): whether a scope's keys reach the upstream unchanged is decided for the whole
/// deployment, in the store, not by each instance's config. `order-1` of each reaches the
/// upstream under two different keys, and both messages are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_different_scopes_on_one_store_send_different_upstream_keys() {
    let sink = start_sink().await;
    let first = relay_for(&sink, |s| s.scope = "tenant-a".into()).await;
    let mut settings = first.settings.clone();
    settings.scope = "tenant-b".into();
    let second = common::TestRelay::start_in(tempfile::tempdir().unwrap(), settings).await;
    let mut ids = Vec::new();
    for (relay, who) in [(&first, "a"), (&second, "b")] {
        let msg = message(Some("order-1"), "order", &format!("tenant {who}'s order"));
        ids.push(submit(relay, "shop@example.com", &["buyer@example.net"], &msg).await);
    }
    for id in &ids {
        wait_state(&first, id, State::Delivered).await;
    }
    let mut keys: Vec<String> = sink
        .messages()
        .iter()
        .filter_map(|m| m.key.clone())
        .collect();
    keys.sort();
    assert_eq!(
        keys.len(),
        2,
        "both messages reached the upstream: {keys:?}"
    );
    assert_ne!(keys[0], keys[1], "one upstream key for two messages");
    // The first scope to claim the upstream keeps its clients' keys; the other's carry it.
    let mut upstream_keys = Vec::new();
    for id in &ids {
        upstream_keys.push(first.stored(id).await.upstream_key.unwrap());
    }
    assert!(
        upstream_keys.contains(&"order-1".to_string()),
        "{upstream_keys:?}"
    );
    let stats = sink.stats();
    assert!(stats.keys.values().all(|k| k.accepted == 1), "{stats:?}");
}

/// A user with an upstream of their own (the users file's `upstream`): that scope's mail goes
/// there, under the client's key unchanged when the scope is alone on it, while the others
/// keep using the relay's upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_an_upstream_of_their_own_is_delivered_there() {
    let shared_sink = start_sink().await;
    let own_sink = start_sink().await;
    let own = own_sink.smtp_addr();
    let relay = relay_with_alice_and_bob(&shared_sink, |users| {
        // The upstream is set by hand in the file; a later `user add` keeps it.
        let text = std::fs::read_to_string(users).unwrap().replace(
            "[users.alice]\n",
            &format!("[users.alice]\nupstream = \"smtp://{own}?tls=none\"\n"),
        );
        std::fs::write(users, text).unwrap();
        idemrelay::auth::Users::add_user(users, "alice", "correct horse", "tenant-alice", &[])
            .unwrap();
        assert!(std::fs::read_to_string(users)
            .unwrap()
            .contains("upstream = "));
    })
    .await;
    alice_and_bob_submit(&relay, "welcome-2").await;
    let keys = |sink: &SinkHandle| -> Vec<String> {
        sink.messages()
            .iter()
            .filter_map(|m| m.key.clone())
            .collect()
    };
    // alice is alone on her upstream: her key as she sent it.
    assert_eq!(keys(&own_sink), vec!["welcome-2".to_string()]);
    // bob shares the relay's upstream with the listener's scope: his carries the scope.
    let bobs = keys(&shared_sink);
    assert_eq!(bobs.len(), 1, "{bobs:?}");
    assert!(
        bobs[0].ends_with("-1-welcome-2") && bobs[0].starts_with("u1-"),
        "{bobs:?}"
    );
}

/// A relay delivering to `sink`, with users alice (scope tenant-alice) and bob (tenant-bob)
/// who may AUTH on the plain listener; `edit` may change the users file first.
async fn relay_with_alice_and_bob(
    sink: &SinkHandle,
    edit: impl FnOnce(&std::path::Path),
) -> common::TestRelay {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    idemrelay::auth::Users::add_user(&users, "alice", "correct horse", "tenant-alice", &[])
        .unwrap();
    idemrelay::auth::Users::add_user(&users, "bob", "battery staple", "tenant-bob", &[]).unwrap();
    edit(&users);
    let mut settings = common::test_settings(dir.path());
    settings.users_file = Some(users);
    common::fast_delivery(&mut settings, sink.smtp_addr());
    common::TestRelay::start_in(dir, settings).await
}

/// alice and bob each submit their own message under `key`, and both are delivered; returns
/// the queue ids.
async fn alice_and_bob_submit(relay: &common::TestRelay, key: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for (user, password) in [("alice", "correct horse"), ("bob", "battery staple")] {
        let mut c = Client::ready(relay.addr).await;
        assert_eq!(c.cmd(&common::auth_plain(user, password)).await.code, 235);
        let msg = message(Some(key), "welcome", &format!("welcome from {user}"));
        let answer = c
            .submit(
                &format!("{user}@example.com"),
                &["customer@example.net"],
                &msg,
            )
            .await;
        ids.push(
            answer
                .queue_id()
                .unwrap_or_else(|| panic!("{user}: {answer:?}")),
        );
        c.quit().await;
    }
    for id in &ids {
        wait_state(relay, id, State::Delivered).await;
    }
    ids
}
