//! The HTTP API: what it reports, its filters, its fault rules, its refusal of other sites,
//! and the maildir.

use super::*;

/// A sink with its HTTP API on an ephemeral port, and the API's address.
async fn start_with_api(config: SinkConfig) -> (SinkHandle, SocketAddr) {
    let sink = start(SinkConfig {
        api: Some("127.0.0.1:0".parse().unwrap()),
        ..config
    })
    .await;
    let api = sink.api_addr().unwrap();
    (sink, api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_reports_what_the_handle_reports() {
    let (sink, api) = start_with_api(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    let text = message(Some("api-1"), "plain text");
    c.submit("a@example.com", &["b@example.com"], &text)
        .await
        .unwrap();
    c.submit("a@example.com", &["b@example.com"], &text)
        .await
        .unwrap();
    let mut binary = message(None, "");
    binary.extend_from_slice(b"\xff\xfe binary\r\n");
    c.submit("a@example.com", &["c@example.com"], &binary)
        .await
        .unwrap();

    let listed = get_json(api, "/messages").await;
    let messages = sink.messages();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), messages.len());
    for (json, m) in listed.iter().zip(&messages) {
        assert_eq!(json["id"], m.id.as_str());
        assert_eq!(json["key"], serde_json::json!(m.key));
        assert_eq!(json["mail_from"], m.mail_from.as_str());
        assert_eq!(json["rcpt_to"], serde_json::json!(m.rcpt_to));
        assert_eq!(json["size"], m.bytes.len());
        assert_eq!(json["received_at_ms"], m.received_at_ms);
        assert_eq!(json["received_at"], rfc3339(m.received_at_ms));
        assert_eq!(json["blake3"], m.blake3.as_str());
        // A list leaves the bytes out; they are one request away.
        assert!(json.get("body").is_none(), "{json}");
        let raw_path = format!("/messages/{}/raw", m.id);
        assert_eq!(json["raw"], raw_path.as_str());
        let (status, raw) = http(api, "GET", &raw_path, "").await;
        assert_eq!((status, raw), (200, m.bytes.clone()));
        // The message by id: the same fields, and the bytes as `body` when they are UTF-8.
        let one = get_json(api, &format!("/messages/{}", m.id)).await;
        for field in [
            "id",
            "key",
            "rcpt_to",
            "size",
            "blake3",
            "received_at",
            "raw",
        ] {
            assert_eq!(one[field], json[field], "{field}");
        }
        match std::str::from_utf8(&m.bytes) {
            Ok(body) => assert_eq!(one["body"], body),
            Err(_) => assert!(one.get("body").is_none()),
        }
    }
    let filtered = get_json(api, "/messages?key=api-1").await;
    assert_eq!(filtered.as_array().unwrap().len(), 1);

    let stats = get_json(api, "/stats").await;
    assert_eq!(stats, serde_json::to_value(sink.stats()).unwrap());
    assert_eq!(stats["keys"]["api-1"]["accepted"], 1);
    assert_eq!(stats["keys"]["api-1"]["replayed"], 1);
    assert_eq!(stats["keys"]["api-1"]["transactions"], 2);
    assert_eq!(stats["messages"], 2);
    assert_eq!(stats["transactions"], 3);
    let counts = get_json(api, "/counts").await;
    assert_eq!(
        (
            &counts["messages"],
            &counts["transactions"],
            &counts["connections"]
        ),
        (
            &stats["messages"],
            &stats["transactions"],
            &stats["connections"]
        )
    );
    assert!(counts.get("keys").is_none());

    let txns = get_json(api, "/transactions").await;
    let outcomes: Vec<&str> = txns
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["accepted", "replayed", "accepted"]);
    for (json, t) in txns.as_array().unwrap().iter().zip(sink.transactions()) {
        assert_eq!(json["received_at"], rfc3339(t.received_at_ms));
    }

    // Faults: added over HTTP (both forms), see them fire over SMTP, then remove them.
    let (status, body) = http(
        api,
        "POST",
        "/faults",
        r#"[{"phase":"rcpt","action":"reply","code":451,"times":1},"phase=dot,action=drop,times=1"]"#,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(sink.faults().len(), 2);
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<b@example.com>", 451).await;
    c.expect("RSET", 250).await;
    let (status, _) = http(
        api,
        "POST",
        "/faults",
        r#"[{"phase":"rcpt","action":"drop"}]"#,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(sink.faults().len(), 2, "a refused update changes nothing");
    let faults = get_json(api, "/faults").await;
    assert_eq!(faults[0]["fired"], 1);
    assert_eq!(faults[1]["action"], "drop");
    let (status, _) = http(api, "DELETE", "/faults", "").await;
    assert_eq!(status, 204);
    assert!(sink.faults().is_empty());

    // Down and back up through the API.
    let (status, _) = http(api, "POST", "/pause?mode=refuse", "").await;
    assert_eq!(status, 204);
    assert!(TcpStream::connect(sink.smtp_addr()).await.is_err());
    let (status, _) = http(api, "POST", "/resume", "").await;
    assert_eq!(status, 204);

    let (status, _) = http(api, "POST", "/reset", "").await;
    assert_eq!(status, 204);
    assert!(sink.messages().is_empty());
    assert_eq!(get_json(api, "/messages").await, serde_json::json!([]));
    assert_eq!(get_json(api, "/stats").await["transactions"], 0);
    sink.shutdown().await;
}

/// A status and a JSON `{"error": ...}` body that says something.
async fn json_error(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, response) = http(addr, method, path, body).await;
    let json: Value = serde_json::from_slice(&response).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: {status} with a body that is not JSON ({e}): {}",
            String::from_utf8_lossy(&response)
        )
    });
    let error = json["error"].as_str().unwrap_or_else(|| panic!("{json}"));
    assert!(!error.is_empty());
    (status, error.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_finds_messages_by_key_recipient_and_text_and_refuses_unknown_filters() {
    let (sink, api) = start_with_api(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    let invoice = "From: app@example.com\r\nSubject: Invoice 42\r\n\
                   X-Bird-Idempotency-Key: inv-42\r\n\r\nPlease pay by Friday.\r\n";
    // The subject as an encoded word and the body in base64: searched decoded.
    let greeting = "From: app@example.com\r\nSubject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\n\
                    MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
                    Content-Transfer-Encoding: base64\r\n\r\naGVsbG8gd29ybGQ=\r\n";
    let inv = id_of(
        &c.submit(
            "a@example.com",
            &["Bob@Example.com", "carol@example.org"],
            invoice.as_bytes(),
        )
        .await
        .unwrap(),
    );
    let greet = id_of(
        &c.submit("a@example.com", &["dave@example.net"], greeting.as_bytes())
            .await
            .unwrap(),
    );

    let all = get_json(api, "/messages").await;
    assert_eq!(ids(&all), [inv.clone(), greet.clone()]);
    assert_eq!(all[0]["subject"], "Invoice 42");
    assert_eq!(all[1]["subject"], "Grüße");
    let cases: &[(&str, &[&String])] = &[
        ("key=inv-42", &[&inv]),
        ("key=inv", &[]),
        ("rcpt=bob%40example.COM", &[&inv]),
        ("rcpt=example.", &[&inv, &greet]),
        ("rcpt=nobody", &[]),
        ("text=invoice", &[&inv]),
        ("text=PAY%20BY", &[&inv]),
        ("text=gr%C3%BC%C3%9Fe", &[&greet]),
        ("text=hello%20world", &[&greet]),
        ("key=inv-42&text=hello", &[]),
        ("rcpt=dave&text=world", &[&greet]),
    ];
    for (query, want) in cases {
        let got = get_json(api, &format!("/messages?{query}")).await;
        let want: Vec<String> = want.iter().map(|id| id.to_string()).collect();
        assert_eq!(ids(&got), want, "?{query}");
    }

    // A filter the sink does not know is refused, never ignored.
    for query in ["recipient=bob", "to=bob", "key=a&key=b"] {
        let (status, error) = json_error(api, "GET", &format!("/messages?{query}"), "").await;
        assert_eq!(status, 400, "?{query}: {error}");
    }
    let (_, error) = json_error(api, "GET", "/messages?recipient=bob", "").await;
    assert!(
        error.contains("recipient") && error.contains("rcpt"),
        "{error}"
    );
    let (status, _) = json_error(api, "GET", "/transactions?rcpt=bob", "").await;
    assert_eq!(status, 400);
    let (status, _) = json_error(api, "GET", "/webhooks?text=x", "").await;
    assert_eq!(status, 400);

    // Unknown ids and paths: 404 with a JSON body.
    let (status, error) = json_error(api, "GET", "/messages/S999", "").await;
    assert_eq!(status, 404);
    assert!(error.contains("S999"), "{error}");
    let (status, _) = json_error(api, "GET", "/messages/S999/raw", "").await;
    assert_eq!(status, 404);
    let (status, _) = json_error(api, "GET", "/nothing/here", "").await;
    assert_eq!(status, 404);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_post_adds_fault_rules_and_put_replaces_them() {
    let (sink, api) = start_with_api(SinkConfig {
        faults: vec!["phase=mail,action=reply,code=451,times=1".parse().unwrap()],
        ..SinkConfig::default()
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;
    c.expect("MAIL FROM:<a@example.com>", 451).await;

    // POST adds after the active rules, whose fire counts go on.
    let (status, body) = http(
        api,
        "POST",
        "/faults",
        r#"["phase=rcpt,action=reply,code=452,times=1"]"#,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let rules: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(rules.as_array().unwrap().len(), 2);
    assert_eq!(
        (&rules[0]["phase"], &rules[0]["fired"]),
        (&"mail".into(), &1.into())
    );
    assert_eq!(
        (&rules[1]["phase"], &rules[1]["fired"]),
        (&"rcpt".into(), &0.into())
    );
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<b@example.com>", 452).await;
    c.expect("RSET", 250).await;

    // A bad rule in a POST adds nothing, not even the good one before it.
    let (status, error) = json_error(
        api,
        "POST",
        "/faults",
        r#"["phase=data,action=disconnect", {"phase":"rcpt","action":"drop"}]"#,
    )
    .await;
    assert_eq!(status, 400);
    assert!(error.starts_with("rule 1:"), "{error}");
    assert_eq!(sink.faults().len(), 2);

    // PUT replaces them all, counts starting over.
    let (status, body) = http(
        api,
        "PUT",
        "/faults",
        r#"[{"phase":"data","action":"reply","code":554,"text":"5.7.1 no"}]"#,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let faults = get_json(api, "/faults").await;
    assert_eq!(faults.as_array().unwrap().len(), 1);
    assert_eq!(
        (&faults[0]["phase"], &faults[0]["fired"]),
        (&"data".into(), &0.into())
    );
    c.expect("MAIL FROM:<a@example.com>", 250).await;
    c.expect("RCPT TO:<b@example.com>", 250).await;
    c.expect("DATA", 554).await;
    sink.shutdown().await;
}

/// The sink's API has no authentication, so a web page in the tester's browser must not drive
/// it: a form or `no-cors` fetch from another origin is refused (nothing reset, no rule
/// added), and so is a request naming a host in someone's DNS (rebinding). curl-like clients,
/// which send no Origin, pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_refuses_other_sites_and_rebinding() {
    let (sink, api) = start_with_api(SinkConfig::default()).await;
    let mut c = session(sink.smtp_addr()).await;
    c.submit(
        "a@example.com",
        &["b@example.com"],
        &message(Some("x-1"), "x"),
    )
    .await
    .unwrap();
    let send = |method: &'static str,
                path: &'static str,
                headers: Vec<(&'static str, String)>,
                body: &'static str| async move {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        crate::common::http::send(
            api,
            method,
            path,
            &headers,
            crate::common::http::Body::Bytes(body.as_bytes()),
        )
        .await
    };
    let evil = || ("Origin", "http://evil.example".to_string());
    let form = (
        "Content-Type",
        "application/x-www-form-urlencoded".to_string(),
    );
    let reset = send(
        "POST",
        "/reset",
        vec![
            evil(),
            form.clone(),
            ("Sec-Fetch-Site", "cross-site".into()),
        ],
        "",
    )
    .await;
    assert_eq!(reset.status, 403, "{}", reset.body);
    let rule = send(
        "POST",
        "/faults",
        vec![evil(), ("Content-Type", "text/plain".into())],
        r#"[{"phase":"dot","action":"drop"}]"#,
    )
    .await;
    assert_eq!(rule.status, 403, "{}", rule.body);
    let rebound = send(
        "GET",
        "/messages",
        vec![("Host", "rebind.attacker.example:80".into())],
        "",
    )
    .await;
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert_eq!(sink.messages().len(), 1, "the reset went through");
    assert!(sink.faults().is_empty(), "the rule was added");
    // The sink's own page and local tools still work.
    let own = send(
        "POST",
        "/reset",
        vec![
            ("Origin", format!("http://{api}")),
            ("Sec-Fetch-Site", "same-origin".into()),
        ],
        "",
    )
    .await;
    assert_eq!(own.status, 204, "{}", own.body);
    assert_eq!(http(api, "GET", "/messages", "").await.0, 200);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reset_also_empties_the_maildir() {
    let dir = tempfile::tempdir().unwrap();
    let maildir = dir.path().join("mail");
    let (sink, api) = start_with_api(SinkConfig {
        maildir: Some(maildir.clone()),
        ..SinkConfig::default()
    })
    .await;
    let mut c = session(sink.smtp_addr()).await;
    for key in ["m-1", "m-2"] {
        c.submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some(key), key),
        )
        .await
        .unwrap();
    }
    // Files the sink did not write stay, messages included: a reset is one HTTP request and
    // the directory may be anyone's.
    std::fs::write(maildir.join("notes.txt"), "kept").unwrap();
    std::fs::write(maildir.join("someone-elses.eml"), "kept").unwrap();
    let eml = |dir: &std::path::Path| -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "eml")
            })
            .count()
    };
    assert_eq!(eml(&maildir), 3);

    let (status, _) = http(api, "POST", "/reset", "").await;
    assert_eq!(status, 204);
    assert_eq!(eml(&maildir), 1);
    assert!(maildir.join("notes.txt").exists());
    assert!(maildir.join("someone-elses.eml").exists());
    assert_eq!(get_json(api, "/messages").await, serde_json::json!([]));

    // The sink goes on writing there after a reset.
    let id = id_of(
        &c.submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some("m-3"), "x"),
        )
        .await
        .unwrap(),
    );
    assert!(maildir.join(format!("{id}.eml")).exists());
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maildir_that_cannot_be_written_refuses_instead_of_lying() {
    let dir = tempfile::tempdir().unwrap();
    let maildir = dir.path().join("mail");
    let sink = start(SinkConfig {
        maildir: Some(maildir.clone()),
        ..SinkConfig::default()
    })
    .await;
    // Replace the directory by a file: every write fails.
    std::fs::remove_dir(&maildir).unwrap();
    std::fs::write(&maildir, b"not a directory").unwrap();
    let msg = message(Some("disk-1"), "x");
    let mut c = session(sink.smtp_addr()).await;
    let reply = c
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(reply.code, 451, "{reply:?}");
    assert!(sink.messages().is_empty());

    // Once storage works again the key is free: a first acceptance, not a replay.
    std::fs::remove_file(&maildir).unwrap();
    std::fs::create_dir(&maildir).unwrap();
    let reply = c
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(reply.line(), format!("250 2.0.0 OK {}", id_of(&reply)));
    sink.shutdown().await;
}
