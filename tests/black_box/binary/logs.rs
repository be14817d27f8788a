//! JSON logs: one event per submission and per attempt with no secrets, and one search for
//! an id that finds a message's whole life.

use super::*;

/// `--log-format json`: one JSON object per line, one event per submission with what an
/// operator needs to answer "was this sent?", and never the body or the addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_have_one_event_per_submission_and_no_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(&dir.path().join("relay.db"), &["--log-format", "json"]);
    let mut client = Client::ready(relay.addr).await;
    let msg = message(Some("json-log-1"), "subject-not-logged", "body-not-logged");
    let answer = client
        .submit(
            "sender-not-logged@example.com",
            &["rcpt-not-logged@example.com"],
            &msg,
        )
        .await;
    let id = answer.queue_id().expect("queued");
    client.quit().await;
    let log = common::eventually(Duration::from_secs(10), "the submission event", || {
        let log = relay.log();
        async move { log.contains("\"submission\"").then_some(log) }
    })
    .await;
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let submission = events
        .iter()
        .find(|e| e["fields"]["message"] == "submission")
        .expect("a submission event");
    let f = &submission["fields"];
    assert_eq!(f["id"], id.as_str());
    assert_eq!(f["key"], "json-log-1");
    assert_eq!(f["scope"], "default");
    assert_eq!(f["key_source"], "header");
    assert_eq!(f["result"], "accepted");
    assert_eq!(f["recipients"], 1);
    assert_eq!(f["size"], msg.len());
    for secret in [
        "body-not-logged",
        "subject-not-logged",
        "sender-not-logged",
        "rcpt-not-logged",
    ] {
        assert!(!log.contains(secret), "{secret} leaked into the log");
    }
}

/// `--log-format json`: one event per delivery attempt with id, key, attempt, outcome, phase,
/// code, decision and latency, and never the body, the addresses or a credential. The admin
/// API of the same process answers with the token from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_have_one_event_per_attempt_and_no_secrets() {
    const TOKEN: &str = "token-not-logged-0123456789";
    let sink = common::start_sink().await;
    sink.set_faults(vec![idemrelay_sink::FaultRule::reply(
        idemrelay_sink::FaultStage::Rcpt,
        550,
        "5.1.1 no such user",
    )
    .with_rcpt("nobody-not-logged@")])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let upstream = format!("smtp://{}?tls=none", sink.smtp_addr());
    let args = serve_args(
        &dir.path().join("relay.db"),
        &["--log-format", "json", "--upstream", &upstream],
    );
    // The token comes from the environment, as an operator should pass it.
    let mut cmd = idemrelay();
    cmd.env("IDEMRELAY_ADMIN_TOKEN", TOKEN);
    let process = RelayProcess::spawn_command(cmd, &args).ready().await;
    let mut client = Client::ready(process.addr).await;
    let sent = message(
        Some("json-attempt-1"),
        "subject-not-logged",
        "body-not-logged",
    );
    let ok = client
        .submit(
            "sender-not-logged@example.com",
            &["rcpt-not-logged@example.com"],
            &sent,
        )
        .await
        .queue_id()
        .expect("queued");
    let refused = client
        .submit(
            "sender-not-logged@example.com",
            &["nobody-not-logged@example.com"],
            &message(
                Some("json-attempt-2"),
                "subject-not-logged",
                "body-not-logged",
            ),
        )
        .await
        .queue_id()
        .expect("queued");
    client.quit().await;
    // Three attempts: the two messages and the DSN for the refused one.
    // And their last lines: two delivered (the first message and the DSN), one bounced.
    let log = common::eventually(Duration::from_secs(20), "three attempt events", || {
        let log = process.log();
        let done = log.matches("\"message\":\"attempt\"").count() >= 3
            && log.matches("\"status\":\"delivered\"").count() >= 2
            && log.contains("\"status\":\"bounced\"");
        async move { done.then_some(log) }
    })
    .await;
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let attempt = |id: &str| {
        let found: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["fields"]["message"] == "attempt" && e["fields"]["id"] == id)
            .collect();
        assert_eq!(found.len(), 1, "one attempt event for {id}:\n{log}");
        found[0]["fields"].clone()
    };
    let f = attempt(&ok);
    assert_eq!(f["key"], "json-attempt-1");
    assert_eq!(f["attempt"], 1);
    assert_eq!(f["outcome"], "accepted");
    assert_eq!(f["phase"], "dot");
    assert_eq!(f["code"], 250);
    assert_eq!(f["decision"], "delivered");
    assert!(f["latency_ms"].is_u64(), "{f}");
    let f = attempt(&refused);
    assert_eq!(f["key"], "json-attempt-2");
    assert_eq!(f["outcome"], "permanent");
    assert_eq!(f["phase"], "rcpt");
    assert_eq!(f["code"], 550);
    assert_eq!(f["decision"], "failed");
    assert_eq!(f["reply"], "550 5.1.1 no such user");
    assert!(f["latency_ms"].is_u64(), "{f}");
    // Each message's last line: the upstream's reply (and for the bounce its enhanced code).
    let last = |id: &str, status: &str| {
        events
            .iter()
            .find(|e| e["fields"]["id"] == id && e["fields"]["status"] == status)
            .unwrap_or_else(|| panic!("no {status} event for {id}:\n{log}"))["fields"]
            .clone()
    };
    let delivered = last(&ok, "delivered");
    assert_eq!(delivered["reply"], attempt(&ok)["reply"]);
    assert!(
        delivered["reply"]
            .as_str()
            .is_some_and(|r| r.starts_with("250 2.0.0 OK ")),
        "{delivered}"
    );
    let bounced = last(&refused, "bounced");
    assert_eq!(bounced["enhanced"], "5.1.1");
    assert_eq!(bounced["reply"], "550 5.1.1 no such user");
    for secret in [
        "body-not-logged",
        "subject-not-logged",
        "sender-not-logged",
        "rcpt-not-logged",
        "nobody-not-logged",
        TOKEN,
    ] {
        assert!(!log.contains(secret), "{secret} leaked into the log");
    }

    // The process's admin API, with the token it was given.
    let admin = process.admin();
    let refused = common::http::get(admin, "/api/v1/messages", None).await;
    assert_eq!(refused.status, 401);
    let page = common::http::get(admin, "/metrics", Some(TOKEN)).await;
    assert_eq!(page.status, 200);
    assert_eq!(
        common::http::sample(
            &page.body,
            "idemrelay_delivery_decisions_total{decision=\"delivered\"}"
        ),
        Some(2.0),
        "{}",
        page.body
    );
}

// --- following one message in the log ---------------------------------------------------

/// The lines of `log` that contain `needle`.
fn lines_with<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

/// Like Postfix's queue id in maillog: `grep 'id=ID'` on the relay's (human) log finds every
/// line of one message's life, each with what an operator needs: the submission with client,
/// HELO and Message-ID; each attempt with the upstream's whole reply, or why there was none
/// (connection refused); the final delivered or bounced line (with the enhanced code); and
/// the breaker opening and closing around an outage. A session cut for a bare LF leaves a
/// line too. Bodies, subjects and passwords never appear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_grep_for_the_id_finds_a_messages_whole_life() {
    let sink = common::start_sink().await;
    // Down at first: the first attempts meet a refused connection.
    sink.pause(idemrelay_sink::Down::Refuse).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        r#"
[delivery]
connections = 1
scan_interval = "50ms"
retry_base = "100ms"
retry_cap = "300ms"
max_attempts = 200
breaker_threshold = 2
breaker_cooldown = "200ms"

[delivery.timeouts]
connect = "2s"
greeting = "2s"
starttls = "2s"
auth = "2s"
mail = "2s"
rcpt = "2s"
data = "2s"
dot = "3s"
"#,
    )
    .unwrap();
    let upstream = format!("smtp://{}?tls=none", sink.smtp_addr());
    let args = serve_args(
        &dir.path().join("relay.db"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--upstream",
            &upstream,
        ],
    );
    let relay = RelayProcess::spawn(&args).ready().await;
    let mut client = Client::ready(relay.addr).await;
    let mail = |key: &str| {
        format!(
            "From: Sender <sender@example.com>\r\nTo: rcpt@example.com\r\n\
             Message-ID: <{key}@example.com>\r\nX-Bird-Idempotency-Key: {key}\r\n\
             Subject: subject-not-logged\r\n\r\nbody-not-logged\r\n"
        )
        .into_bytes()
    };
    let a = client
        .submit("sender@example.com", &["rcpt@example.com"], &mail("life-a"))
        .await
        .queue_id()
        .expect("queued");
    let b = client
        .submit(
            "sender@example.com",
            &["nobody@example.com"],
            &mail("life-b"),
        )
        .await
        .queue_id()
        .expect("queued");
    client.quit().await;
    common::eventually(Duration::from_secs(20), "the breaker open", || {
        let log = relay.log();
        async move { log.contains("circuit breaker open").then_some(()) }
    })
    .await;
    // Back, with one 4xx for a and a 5xx for b.
    sink.set_faults(vec![
        idemrelay_sink::FaultRule::reply(
            idemrelay_sink::FaultStage::Rcpt,
            451,
            "4.2.1 mailbox busy, try later",
        )
        .with_rcpt("rcpt@")
        .with_times(1),
        idemrelay_sink::FaultRule::reply(
            idemrelay_sink::FaultStage::Rcpt,
            550,
            "5.1.1 no such user",
        )
        .with_rcpt("nobody@"),
    ])
    .unwrap();
    sink.resume().await.unwrap();
    // A session cut for a bare LF.
    let (mut cut, greeting) = Client::connect(relay.addr).await;
    assert_eq!(greeting.code, 220);
    cut.send(b"EHLO smuggler.test\r\nNOOP\n").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        let log = relay.log();
        let done = |id: &str, status: &str| {
            log.lines()
                .any(|l| l.contains(&format!("id={id} ")) && l.contains(status))
        };
        if done(&a, "status=delivered")
            && done(&b, "status=bounced")
            && log.contains("session closed by the relay")
        {
            break log;
        }
        assert!(
            Instant::now() < deadline,
            "no final lines for {a} and {b}, or no cut session:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Every line naming a, and only those, is found by `id=<a>` (never `id="<a>"`).
    for id in [&a, &b] {
        let naming = lines_with(&log, id);
        let found = lines_with(&log, &format!("id={id} "));
        assert_eq!(naming, found, "lines naming {id} without id={id}:\n{log}");
    }
    let life = lines_with(&log, &format!("id={a} "));
    let one = |what: &str, test: &dyn Fn(&str) -> bool| -> String {
        let hits: Vec<&&str> = life.iter().filter(|l| test(l)).collect();
        assert!(
            !hits.is_empty(),
            "no {what} line for {a}:\n{}",
            life.join("\n")
        );
        hits[0].to_string()
    };
    let submission = one("submission", &|l| l.contains("submission"));
    for field in [
        "result=accepted",
        "client=127.0.0.1",
        "helo=client.test",
        "user=-",
        "message_id=life-a@example.com",
        "key=life-a",
        // A value with spaces is quoted (logfmt), so that no value can pass for another field.
        &format!("reply=\"250 2.0.0 OK queued as {a}\""),
    ] {
        assert!(submission.contains(field), "{field} missing: {submission}");
    }
    let refused = one("refused connection", &|l| {
        l.contains(" attempt ") || l.contains("attempt id=")
    });
    assert!(
        refused.contains("class=connect") && refused.contains("Connection refused"),
        "the first attempt says why it failed: {refused}"
    );
    let busy = one("4xx attempt", &|l| l.contains("code=451"));
    assert!(
        busy.contains(r#"reply="451 4.2.1 mailbox busy, try later""#)
            && busy.contains("decision=retry")
            && busy.contains("class=4xx"),
        "{busy}"
    );
    let accepted = one("accepted attempt", &|l| l.contains("outcome=accepted"));
    let upstream_reply = accepted
        .split("reply=\"")
        .nth(1)
        .and_then(|r| r.split("\" decision=").next())
        .unwrap_or_else(|| panic!("no reply on {accepted}"))
        .to_string();
    assert!(upstream_reply.starts_with("250 2.0.0 OK "), "{accepted}");
    let delivered = one("delivered", &|l| l.contains("status=delivered"));
    assert!(
        delivered.contains(&format!("reply=\"{upstream_reply}\"")),
        "the final line carries the upstream's reply (its queue id): {delivered}"
    );
    // b bounced: the enhanced code and text, and the DSN it caused.
    let bounced = lines_with(&log, &format!("id={b} "))
        .into_iter()
        .find(|l| l.contains("status=bounced"))
        .unwrap()
        .to_string();
    for field in [
        "enhanced=5.1.1",
        "code=550",
        "phase=rcpt",
        r#"reply="550 5.1.1 no such user""#,
    ] {
        assert!(bounced.contains(field), "{field} missing: {bounced}");
    }
    assert!(!bounced.contains("dsn_id=-"), "{bounced}");
    // The breaker around the outage, in order. It says what opened it (refused connections),
    // and the probe was a connection check: both messages had failed before.
    let line = |what: &str| log.lines().find(|l| l.contains(what)).unwrap_or_default();
    assert!(
        line("circuit breaker open").contains("class=connect"),
        "{}",
        line("circuit breaker open")
    );
    assert!(
        line("circuit breaker half-open").contains("probe=connection_check"),
        "{}",
        line("circuit breaker half-open")
    );
    let open = log.find("circuit breaker open").unwrap();
    let half = log
        .find("circuit breaker half-open")
        .expect("half-open logged");
    let closed = log.find("circuit breaker closed").expect("closed logged");
    assert!(open < half && half < closed, "{log}");
    // The bare LF.
    let cut = lines_with(&log, "session closed by the relay");
    assert!(
        cut.iter().any(|l| l.contains("reason=smuggling")
            && l.contains("helo=smuggler.test")
            && l.contains("reply=\"521 5.5.2")),
        "{cut:?}"
    );
    for secret in ["body-not-logged", "subject-not-logged"] {
        assert!(!log.contains(secret), "{secret} leaked into the log");
    }
}
