//! What the upstream receives: the same bytes and key on every attempt, whatever the message.

use super::*;

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
