//! The sink's SMTP side: byte-exact acceptance, the idempotency answers, every fault kind,
//! the down modes and shutdown.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_bytes_exactly_several_per_connection_and_writes_maildir() {
    let dir = tempfile::tempdir().unwrap();
    let maildir = dir.path().join("mail");
    let sink = start(SinkConfig {
        maildir: Some(maildir.clone()),
        ..SinkConfig::default()
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;

    // Leading dots, a lone dot, a line of dots, and 8-bit bytes that are not UTF-8.
    let mut tricky = b"From: a@example.com\r\nSubject: dots\r\n\r\n.leading dot\r\n.\r\n..\r\n\
        ...three\r\nnot. a dot\r\n"
        .to_vec();
    tricky.extend_from_slice(b"caf\xe9 \xff\xfe 8-bit\r\n. \r\n");
    let first = c
        .submit(
            "a@example.com",
            &["b@example.com", "c@example.com"],
            &tricky,
        )
        .await
        .unwrap();
    let first_id = id_of(&first);
    assert_eq!(first.line(), format!("250 2.0.0 OK {first_id}"));

    // Pipelined: the whole transaction in one write, replies in order.
    let plain = message(None, "second message");
    let mut batch =
        b"MAIL FROM:<a@example.com> BODY=8BITMIME\r\nRCPT TO:<d@example.com>\r\nDATA\r\n".to_vec();
    batch.extend_from_slice(&dot_stuff(&plain));
    c.send(&batch).await;
    let codes: Vec<u16> = [
        c.reply().await.unwrap(),
        c.reply().await.unwrap(),
        c.reply().await.unwrap(),
        c.reply().await.unwrap(),
    ]
    .iter()
    .map(|r| r.code)
    .collect();
    assert_eq!(codes, vec![250, 250, 354, 250]);

    // No key: the same message is accepted again, every time.
    let again = c
        .submit("a@example.com", &["d@example.com"], &plain)
        .await
        .unwrap();
    assert_eq!(again.code, 250);
    c.expect("RSET", 250).await;
    c.expect("NOOP", 250).await;
    c.expect("QUIT", 221).await;

    let messages = sink.messages();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[0].id, first_id);
    assert_eq!(messages[0].bytes, tricky);
    assert_eq!(messages[0].rcpt_to, vec!["b@example.com", "c@example.com"]);
    assert_eq!(
        messages[0].blake3,
        blake3::hash(&tricky).to_hex().to_string()
    );
    assert!(!messages[0].eightbitmime);
    assert!(messages[1].eightbitmime);
    assert_eq!(messages[1].bytes, plain);
    assert_eq!(messages[2].bytes, plain);
    assert_ne!(messages[1].id, messages[2].id);
    assert_eq!(messages[0].key, None);

    let stats = sink.stats();
    assert_eq!(
        (stats.messages, stats.transactions, stats.connections),
        (3, 3, 1)
    );
    assert!(stats.keys.is_empty());

    // Maildir: one file per accepted message, exactly the bytes, no temporary files left.
    let mut names: Vec<String> = std::fs::read_dir(&maildir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut expected: Vec<String> = messages.iter().map(|m| format!("{}.eml", m.id)).collect();
    expected.sort();
    assert_eq!(names, expected);
    for m in &messages {
        let on_disk = std::fs::read(maildir.join(format!("{}.eml", m.id))).unwrap();
        assert_eq!(on_disk, m.bytes);
    }
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_what_a_strict_upstream_refuses() {
    let sink = start(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    c.expect("DATA", 503).await;
    c.expect("RCPT TO:<x@example.com>", 503).await;

    let mut long = message(None, "");
    long.extend(std::iter::repeat_n(b'x', 999));
    long.extend_from_slice(b"\r\n");
    let reply = c
        .submit("a@example.com", &["b@example.com"], &long)
        .await
        .unwrap();
    assert_eq!(reply.code, 550, "{reply:?}");

    let invalid_key = message(Some(""), "empty key");
    let reply = c
        .submit("a@example.com", &["b@example.com"], &invalid_key)
        .await
        .unwrap();
    assert_eq!(reply.code, 554);
    assert!(reply.text.contains("E01001"), "{reply:?}");

    // Bare LF inside DATA: refused and the connection closed, never a transaction.
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<b@example.com>", 250).await;
    c.expect("DATA", 354).await;
    c.send(b"Subject: x\r\n\r\nsmuggle\n.\r\n").await;
    let reply = c.reply().await.unwrap();
    assert_eq!(reply.code, 521);
    c.assert_closed().await;

    assert!(sink.messages().is_empty());
    let outcomes: Vec<DotDecision> = sink.transactions().iter().map(|t| t.outcome).collect();
    assert_eq!(
        outcomes,
        vec![DotDecision::Rejected, DotDecision::InvalidKey]
    );
    sink.shutdown().await;
}

// --- idempotency ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_the_same_key_is_counted_once() {
    let sink = start(SinkConfig::default()).await;
    let msg = message(Some("order-1"), "hello");
    let mut c = session(sink.smtp_addr()).await;
    let first = c
        .submit("a@example.com", &["b@example.com", "c@example.com"], &msg)
        .await
        .unwrap();
    let id = id_of(&first);

    // Same connection, then a fresh one with the recipients in the other order.
    let second = c
        .submit("a@example.com", &["b@example.com", "c@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(
        second.line(),
        format!("250 2.0.0 OK {id} (idempotent replay)")
    );
    let mut c2 = session(sink.smtp_addr()).await;
    let third = c2
        .submit("a@example.com", &["c@example.com", "b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(
        third.line(),
        format!("250 2.0.0 OK {id} (idempotent replay)")
    );

    assert_eq!(sink.messages().len(), 1);
    let txns = sink.transactions();
    assert_eq!(txns.len(), 3);
    assert_eq!(
        txns.iter().map(|t| t.outcome).collect::<Vec<_>>(),
        vec![
            DotDecision::Accepted,
            DotDecision::Replayed,
            DotDecision::Replayed
        ]
    );
    assert!(txns
        .iter()
        .all(|t| t.bytes == msg && t.message_id.as_deref() == Some(&id)));
    assert_eq!(txns[1].reply.as_deref(), Some(second.line().as_str()));
    let stats = sink.stats();
    let k = &stats.keys["order-1"];
    assert_eq!((k.accepted, k.replayed, k.transactions), (1, 2, 3));
    assert_eq!((stats.messages, stats.transactions), (1, 3));
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_different_bytes_or_envelope_is_e01005() {
    let sink = start(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    let first = c
        .submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some("k-5"), "one"),
        )
        .await
        .unwrap();
    assert_eq!(first.code, 250);
    let changed_byte = c
        .submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some("k-5"), "One"),
        )
        .await
        .unwrap();
    assert_eq!(changed_byte.code, 554);
    assert!(changed_byte.text.starts_with("5.6.0 "), "{changed_byte:?}");
    assert!(changed_byte.text.contains("E01005"), "{changed_byte:?}");
    let other_rcpt = c
        .submit(
            "a@example.com",
            &["z@example.com"],
            &message(Some("k-5"), "one"),
        )
        .await
        .unwrap();
    assert!(other_rcpt.text.contains("E01005"), "{other_rcpt:?}");

    assert_eq!(sink.messages().len(), 1);
    let k = &sink.stats().keys["k-5"];
    assert_eq!((k.accepted, k.conflicts, k.transactions), (1, 2, 3));
    assert_eq!(sink.transactions()[1].outcome, DotDecision::KeyReuse);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_window_the_key_is_a_new_operation() {
    let sink = start(SinkConfig {
        window: Duration::from_millis(300),
        ..SinkConfig::default()
    })
    .await;
    let msg = message(Some("short-lived"), "x");
    let mut c = session(sink.smtp_addr()).await;
    let first = id_of(
        &c.submit("a@example.com", &["b@example.com"], &msg)
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = id_of(
        &c.submit("a@example.com", &["b@example.com"], &msg)
            .await
            .unwrap(),
    );
    assert_ne!(first, second);
    assert_eq!(sink.messages().len(), 2);
    assert_eq!(sink.stats().keys["short-lived"].accepted, 2);
    sink.shutdown().await;
}

// --- faults -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_faults_at_every_phase() {
    let sink = start(SinkConfig::default()).await;
    let rules = [
        "phase=connect,action=reply,code=421,times=1",
        "phase=ehlo,action=reply,code=550,times=1",
        "phase=mail,action=reply,code=451,times=1,text=4.3.0 try later",
        "phase=rcpt,action=reply,code=550,rcpt=BAD@",
        "phase=data,action=reply,code=452,times=1",
        "phase=dot,action=reply,code=550,times=1,text=5.7.1 no, thank you",
    ];
    sink.set_faults(rules.iter().map(|r| r.parse().unwrap()).collect())
        .unwrap();

    let mut refused = Client::new(TcpStream::connect(sink.smtp_addr()).await.unwrap());
    let greeting = refused.reply().await.unwrap();
    assert_eq!(greeting.line(), "421 4.0.0 sink fault at connect");
    refused.assert_closed().await;

    let mut c = connect(sink.smtp_addr()).await;
    c.expect("EHLO client.test", 550).await;
    c.expect("EHLO client.test", 250).await;
    let mail = c.expect("MAIL FROM:<a@example.com>", 451).await;
    assert_eq!(mail.text, "4.3.0 try later");
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<bad@example.com>", 550).await;
    c.expect("RCPT TO:<good@example.com>", 250).await;
    c.expect("DATA", 452).await;
    c.expect("DATA", 354).await;
    let msg = message(Some("faulted"), "body");
    c.send(&dot_stuff(&msg)).await;
    let dot = c.reply().await.unwrap();
    assert_eq!(dot.line(), "550 5.7.1 no, thank you");

    // Nothing was committed: the retry is a first acceptance, not a replay.
    let retry = c
        .submit("a@example.com", &["good@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(retry.line(), format!("250 2.0.0 OK {}", id_of(&retry)));
    assert_eq!(sink.messages().len(), 1);
    let txns = sink.transactions();
    assert_eq!(txns[0].outcome, DotDecision::Faulted);
    assert_eq!(txns[0].reply.as_deref(), Some("550 5.7.1 no, thank you"));
    assert_eq!(txns[0].bytes, msg);
    assert!(txns[0].fault.as_deref().unwrap().contains("action=reply"));
    assert_eq!(txns[1].outcome, DotDecision::Accepted);
    let fired: Vec<u32> = sink.faults().iter().map(|s| s.fired).collect();
    assert_eq!(fired, vec![1, 1, 1, 1, 1, 1]);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_after_dot_commits_then_the_retry_replays() {
    let sink = start(SinkConfig {
        faults: vec!["phase=dot,action=drop,times=1,key=lost".parse().unwrap()],
        ..SinkConfig::default()
    })
    .await;
    let msg = message(Some("reply-lost-1"), "RFC 1047");
    let mut c = session(sink.smtp_addr()).await;
    assert_eq!(
        c.submit("a@example.com", &["b@example.com"], &msg).await,
        None
    );

    let messages = sink.messages();
    assert_eq!(messages.len(), 1, "the dropped message was committed");
    let txns = sink.transactions();
    assert_eq!(txns[0].outcome, DotDecision::Accepted);
    assert_eq!(txns[0].reply, None);

    let mut c2 = session(sink.smtp_addr()).await;
    let retry = c2
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(
        retry.line(),
        format!("250 2.0.0 OK {} (idempotent replay)", messages[0].id)
    );
    let k = &sink.stats().keys["reply-lost-1"];
    assert_eq!((k.accepted, k.replayed, k.transactions), (1, 1, 2));
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_faults_accept_nothing() {
    let sink = start(SinkConfig {
        faults: vec![
            FaultRule::disconnect(FaultStage::Connect).with_times(1),
            FaultRule::disconnect(FaultStage::Rcpt).with_times(1),
            FaultRule::disconnect(FaultStage::Dot).with_times(1),
        ],
        ..SinkConfig::default()
    })
    .await;
    let mut no_greeting = Client::new(TcpStream::connect(sink.smtp_addr()).await.unwrap());
    no_greeting.assert_closed().await;

    let mut c = session(sink.smtp_addr()).await;
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.send(b"RCPT TO:<b@example.com>\r\n").await;
    c.assert_closed().await;

    let msg = message(Some("cut"), "x");
    let mut c = session(sink.smtp_addr()).await;
    assert_eq!(
        c.submit("a@example.com", &["b@example.com"], &msg).await,
        None
    );
    assert!(sink.messages().is_empty());
    let txns = sink.transactions();
    assert_eq!(
        (txns[0].outcome, txns[0].reply.as_deref()),
        (DotDecision::Faulted, None)
    );

    let mut c = session(sink.smtp_addr()).await;
    let retry = c
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert!(!retry.text.contains("replay"), "{retry:?}");
    assert_eq!(sink.messages().len(), 1);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_reply_commits_first_and_holds_the_key_until_answered() {
    let delay = Duration::from_secs(3);
    let sink = start(SinkConfig {
        faults: vec![
            FaultRule::delay(FaultStage::Ehlo, Duration::from_millis(200)).with_times(1),
            FaultRule::delay(FaultStage::Dot, delay).with_times(1),
        ],
        ..SinkConfig::default()
    })
    .await;
    let addr = sink.smtp_addr();
    let msg = message(Some("slow-1"), "take your time");

    let mut a = connect(addr).await;
    let started = Instant::now();
    a.expect("EHLO client.test", 250).await;
    assert!(started.elapsed() >= Duration::from_millis(200));

    let msg_a = msg.clone();
    let slow = tokio::spawn(async move {
        let started = Instant::now();
        let reply = a.submit("a@example.com", &["b@example.com"], &msg_a).await;
        (reply, started.elapsed())
    });
    // The message counts as accepted while its reply is held back...
    let messages = sink.wait_for_messages(1, WAIT).await.unwrap();
    // ...and a retry meanwhile is told the first is still running (E01004).
    let mut b = session(addr).await;
    let busy = b
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(busy.code, 451, "{busy:?}");
    assert!(busy.text.contains("E01004"), "{busy:?}");

    let (reply, took) = slow.await.unwrap();
    let reply = reply.unwrap();
    assert!(took >= delay, "{took:?}");
    assert_eq!(reply.line(), format!("250 2.0.0 OK {}", messages[0].id));

    let replay = b
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert!(replay.text.ends_with("(idempotent replay)"), "{replay:?}");
    let k = &sink.stats().keys["slow-1"];
    assert_eq!(
        (k.accepted, k.in_progress, k.replayed, k.transactions),
        (1, 1, 1, 3)
    );
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_during_a_delay_still_had_its_message_accepted() {
    let sink = start(SinkConfig {
        faults: vec![FaultRule::delay(FaultStage::Dot, Duration::from_millis(500)).with_times(1)],
        ..SinkConfig::default()
    })
    .await;
    let msg = message(Some("timeout-1"), "x");
    let mut a = session(sink.smtp_addr()).await;
    a.expect("MAIL FROM:<a@example.com>", 250).await;
    a.expect("RCPT TO:<b@example.com>", 250).await;
    a.expect("DATA", 354).await;
    a.send(&dot_stuff(&msg)).await;
    let messages = sink.wait_for_messages(1, WAIT).await.unwrap();
    drop(a); // the relay's final-dot timeout fired

    let mut b = session(sink.smtp_addr()).await;
    let deadline = Instant::now() + WAIT;
    let reply = loop {
        let reply = b
            .submit("a@example.com", &["b@example.com"], &msg)
            .await
            .unwrap();
        if reply.code != 451 || Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        reply.line(),
        format!("250 2.0.0 OK {} (idempotent replay)", messages[0].id)
    );
    assert_eq!(sink.messages().len(), 1);
    sink.shutdown().await;
}

// --- down modes -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_modes_refuse_or_greet_421_and_come_back_on_the_same_port() {
    let sink = start(SinkConfig::default()).await;
    let addr = sink.smtp_addr();

    let mut open = session(addr).await;
    sink.pause(Down::Refuse).await.unwrap();
    open.assert_closed().await;
    let err = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);

    sink.resume().await.unwrap();
    let mut c = session(addr).await;
    let reply = c
        .submit("a@example.com", &["b@example.com"], &message(None, "back"))
        .await
        .unwrap();
    assert_eq!(reply.code, 250);

    sink.pause(Down::Greet421).await.unwrap();
    let reply = c.reply().await.unwrap();
    assert_eq!(reply.code, 421);
    assert!(reply.text.starts_with("4.3.2 "), "{reply:?}");
    c.assert_closed().await;
    let mut refused = Client::new(TcpStream::connect(addr).await.unwrap());
    let greeting = refused.reply().await.unwrap();
    assert_eq!(greeting.code, 421);
    assert!(greeting.text.starts_with("4.3.2 "));
    refused.assert_closed().await;

    // From Greet421 straight to Refuse and back.
    sink.pause(Down::Refuse).await.unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
    sink.resume().await.unwrap();
    session(addr).await.expect("QUIT", 221).await;
    assert_eq!(sink.messages().len(), 1);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_connections_and_the_port() {
    let sink = start(SinkConfig::default()).await;
    let addr = sink.smtp_addr();
    let mut c = session(addr).await;
    sink.shutdown().await;
    let bye = c.reply().await.unwrap();
    assert_eq!(bye.code, 421);
    c.assert_closed().await;
    assert!(TcpStream::connect(addr).await.is_err());
    // A second shutdown is harmless.
    sink.shutdown().await;
}
