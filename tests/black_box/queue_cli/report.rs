//! `report` and `healthcheck`, and a store or relay that is missing.

use super::*;

async fn report(relay: &TestRelay, args: &[&str]) -> Run {
    let mut all = vec![
        "report".to_string(),
        "--store".to_string(),
        relay.settings.store.expose().to_string(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    run(all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_counts_each_scope_and_day() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Rcpt,
        550,
        "5.1.1 no such user",
    )
    .with_rcpt("nobody@")])
        .unwrap();
    let relay = relay_for(&sink, |s| s.scope = "tenant-a".into()).await;
    let first = message(Some("rep-1"), "s", "b");
    let delivered = submit(&relay, "rcpt@example.com", &first).await;
    // The client retries twice: two replays, nothing new.
    assert_eq!(submit(&relay, "rcpt@example.com", &first).await, delivered);
    assert_eq!(submit(&relay, "rcpt@example.com", &first).await, delivered);
    let failed = submit(
        &relay,
        "nobody@example.com",
        &message(Some("rep-2"), "s", "b"),
    )
    .await;
    wait_state(&relay, &delivered, State::Delivered).await;
    wait_state(&relay, &failed, State::Failed).await;
    // The DSN for the failed one.
    sink.wait_for_messages(2, LIMIT).await.unwrap();
    common::eventually(LIMIT, "the DSN delivered", || async {
        let rows = relay
            .store()
            .list(Some(State::Delivered), 10, None)
            .await
            .unwrap();
        (rows.len() == 2).then_some(())
    })
    .await;

    let today = idemrelay::store::utc_day(common::now_ms());
    let rows = report(&relay, &["--json"]).await;
    assert!(rows.ok, "{}", rows.stderr);
    assert_eq!(
        rows.json(),
        serde_json::json!([{
            "day": today,
            "scope": "tenant-a",
            "accepted": 2,
            "replayed": 2,
            // The DSN is sent (and counted) by the upstream too.
            "delivered": 2,
            "failed": 1,
            "unresolved": 0,
            "cancelled": 0,
            "resolved_by_event": 0,
            "bounced": 0,
        }])
    );
    let table = report(&relay, &["--since", &today]).await;
    assert!(table.ok, "{}", table.stderr);
    let lines: Vec<Vec<&str>> = table
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        vec![
            vec![
                "DAY",
                "SCOPE",
                "ACCEPTED",
                "REPLAYED",
                "DELIVERED",
                "FAILED",
                "UNRESOLVED",
                "CANCELLED",
                "RESOLVED-BY-EVENT",
                "BOUNCED"
            ],
            vec![
                today.as_str(),
                "tenant-a",
                "2",
                "2",
                "2",
                "1",
                "0",
                "0",
                "0",
                "0"
            ],
            vec!["total", "-", "2", "2", "2", "1", "0", "0", "0", "0"],
        ],
        "{}",
        table.stdout
    );
    let later = report(&relay, &["--since", "2999-01-01", "--json"]).await;
    assert!(later.ok, "{}", later.stderr);
    assert_eq!(later.json(), serde_json::json!([]));
    let bad = report(&relay, &["--since", "yesterday"]).await;
    assert!(!bad.ok);
    assert!(bad.stderr.contains("not a day"), "{}", bad.stderr);

    // The counts outlive the records: purge them all (past even the parked retention), the
    // report stays.
    common::backend::age_records(relay.settings.store.expose(), 31 * DAY).await;
    let purge = ok(&relay, &["purge", "--expired"]).await;
    assert!(purge.stdout.contains("purged 3 "), "{}", purge.stdout);
    assert_eq!(report(&relay, &["--json"]).await.json(), rows.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_zero_only_for_a_healthy_admin_api() {
    let relay = TestRelay::start().await;
    let admin = relay.admin().to_string();
    let up = run(vec!["healthcheck".into(), "--admin".into(), admin.clone()]).await;
    assert!(up.ok, "{}", up.stderr);
    assert!(up.stdout.contains("/healthz answered 200"), "{}", up.stdout);
    let ready = run(vec![
        "healthcheck".into(),
        "--ready".into(),
        "--admin".into(),
        admin,
    ])
    .await;
    assert!(ready.ok, "{}", ready.stderr);
    assert!(
        ready.stdout.contains("/readyz answered 200"),
        "{}",
        ready.stdout
    );

    // The SMTP port answers, but not HTTP; a closed port does not answer at all.
    let smtp = run(vec![
        "healthcheck".into(),
        "--admin".into(),
        relay.addr.to_string(),
    ])
    .await;
    assert!(!smtp.ok);
    assert!(smtp.stderr.contains("not HTTP"), "{}", smtp.stderr);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let down = run(vec!["healthcheck".into(), "--admin".into(), addr]).await;
    assert!(!down.ok, "{}", down.stdout);
    assert!(down.stderr.contains("/healthz"), "{}", down.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_store_or_relay_is_an_error_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.db");
    let url = store_url(&typo);
    for args in [
        vec!["queue", "--direct", "--store", &url, "list"],
        vec!["queue", "--store", &url, "list", "--direct"],
        vec!["report", "--store", &url],
    ] {
        let run = run_env(&args, &[]).await;
        assert!(!run.ok, "{args:?}: {}", run.stdout);
        assert!(
            run.stderr.contains(&typo.display().to_string()) && run.stderr.contains("no store"),
            "{args:?}: {}",
            run.stderr
        );
        assert_eq!(run.stdout, "", "{args:?}");
    }
    // Without --direct the relay is asked; when it does not answer, nothing falls back to a
    // store by itself.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let down = run_env(&["queue", "--admin", &addr, "--store", &url, "list"], &[]).await;
    assert!(!down.ok, "{}", down.stdout);
    assert!(
        down.stderr.contains("not reachable") && down.stderr.contains("--direct"),
        "{}",
        down.stderr
    );
    let off = run_env(&["queue", "--admin", "off", "--store", &url, "status"], &[]).await;
    // A relay that serves another store than the one named is not asked about this one.
    let relay = TestRelay::start().await;
    let admin = relay.admin().to_string();
    let other = run_env(&["queue", "--admin", &admin, "--store", &url, "list"], &[]).await;
    assert!(!other.ok, "{}", other.stdout);
    assert!(
        other.stderr.contains("serves the store") && other.stderr.contains("--direct"),
        "{}",
        other.stderr
    );
    let own = relay.settings.store.expose().to_string();
    let same = run_env(&["queue", "--admin", &admin, "--store", &own, "list"], &[]).await;
    assert!(same.ok, "{}", same.stderr);
    assert!(!off.ok);
    assert!(off.stderr.contains("--direct"), "{}", off.stderr);
    assert!(!typo.exists(), "a queue command created the store");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
