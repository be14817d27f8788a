//! What is stored and for how long: retention, the stored bytes, and the session's rules.

use super::*;

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
