//! Bulk actions, the listing's width, and the metrics fetched by curl.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancel_and_flush_all_are_one_recorded_action_each() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    relay.store().pause("hold", false).await.unwrap();
    let mut wrong = Vec::new();
    for n in 0..3 {
        let key = format!("bulk-{n}");
        wrong.push(submit(&relay, "list@example.com", &message(Some(&key), "s", "b")).await);
    }
    let keep = submit(
        &relay,
        "keep@example.com",
        &message(Some("bulk-keep"), "s", "b"),
    )
    .await;

    // The API refuses a bulk cancel that does not name its filter (`{}` for every record).
    let out = Command::new("curl")
        .args(["-sS", "-X", "POST", "-H", "Content-Type: application/json"])
        .args(["-d", r#"{"reason": "no filter"}"#, "-w", " %{http_code}"])
        .arg(format!("http://{}/api/v1/queue/cancel", relay.admin()))
        .output()
        .expect("curl");
    let answer = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        answer.ends_with(" 400") && answer.contains("missing field `filter`"),
        "{answer}"
    );
    assert_eq!(relay.count("operator_actions").await, 0);
    // Filters without --all, or a state that cannot be cancelled, are refused.
    let no_all = refused(&relay, &["cancel", "--recipient", "list@example.com"]).await;
    assert!(no_all.stderr.contains("--all"), "{}", no_all.stderr);
    let delivered = refused(&relay, &["cancel", "--all", "--state", "delivered"]).await;
    assert!(
        delivered.stderr.contains("only queued"),
        "{}",
        delivered.stderr
    );

    let two = ok(
        &relay,
        &[
            "cancel",
            "--all",
            "--state",
            "queued",
            "--recipient",
            "LIST@example.com",
            "--older-than",
            "0s",
            "--reason",
            "sent to the wrong list",
        ],
    )
    .await;
    assert!(
        two.stdout.starts_with("cancelled 3 record(s)"),
        "{}",
        two.stdout
    );
    for id in &wrong {
        assert_eq!(relay.stored(id).await.state, State::Cancelled);
        assert!(two.stdout.contains(id.as_str()), "{}", two.stdout);
    }
    assert_eq!(relay.stored(&keep).await.state, State::Queued);
    let status = ok(&relay, &["status", "--json"]).await.json();
    let recent = &status["recent_actions"][0];
    assert_eq!(recent["action"], "cancel", "{status}");
    assert_eq!(recent["reason"], "sent to the wrong list");
    assert_eq!(
        recent["detail"],
        "cancelled 3 record(s) matching state=queued recipient=LIST@example.com until=0s"
    );
    // One action for the three, not one each.
    assert_eq!(relay.count("operator_actions").await, 1);
    let text = ok(&relay, &["status"]).await.stdout;
    assert!(text.contains("cancelled 3 record(s)"), "{text}");

    // flush --all: one action with the count, shown by `queue status`.
    let flushed = ok(&relay, &["flush", "--all", "--reason", "upstream back"]).await;
    assert!(flushed.stdout.starts_with("flushed "), "{}", flushed.stdout);
    let status = ok(&relay, &["status", "--json"]).await.json();
    let recent = &status["recent_actions"][0];
    assert_eq!(recent["action"], "flush", "{status}");
    assert_eq!(recent["reason"], "upstream back");
    assert!(
        recent["detail"]
            .as_str()
            .unwrap()
            .ends_with("record(s) (all)"),
        "{status}"
    );
    assert_eq!(relay.count("operator_actions").await, 2);

    // The same on the store itself.
    let rest = ok_via(
        &relay,
        Via::Store,
        &["cancel", "--all", "--in-scope", "default"],
    )
    .await;
    assert!(
        rest.stdout.starts_with("cancelled 1 record(s)") && rest.stdout.contains(&keep),
        "{}",
        rest.stdout
    );
    assert_eq!(relay.count("operator_actions").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_fits_80_columns_and_wide_shows_everything() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    relay.store().pause("hold", false).await.unwrap();
    let key = format!("order-{}-end", "k".repeat(180));
    let rcpt = format!("{}@a-rather-long-domain-name.example.com", "r".repeat(60));
    let id = submit(&relay, &rcpt, &message(Some(&key), "s", "b")).await;
    let other = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("short"), "s", "b"),
    )
    .await;

    let list = ok(&relay, &["list"]).await;
    for line in list.stdout.lines() {
        assert!(line.chars().count() <= 80, "{} wide: {line}", line.len());
    }
    let header: Vec<&str> = list
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["ID", "STATE", "AGE", "TRY", "KEY", "RCPT"]);
    // An id's beginning, unique, that every record command takes; an age, not a time.
    let short = list
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert!(id.starts_with(&short) && short.len() < id.len(), "{short}");
    let line = row(&list.stdout, &short);
    assert!(line.contains(" paused "), "{line}");
    assert!(line.contains("order-k") && line.contains("…"), "{line}");
    assert!(!line.contains(&key), "{line}");
    let age = line.split_whitespace().nth(2).unwrap();
    assert!(age.ends_with('s') || age.ends_with('m'), "{line}");
    let shown = ok(&relay, &["show", &short, "--json"]).await.json();
    assert_eq!(shown["id"], id.as_str());
    assert!(row(&list.stdout, &other[..16]).contains("short"));

    let wide = ok(&relay, &["list", "--wide"]).await.stdout;
    let line = row(&wide, &id);
    assert!(line.contains(&key) && line.contains(&rcpt), "{line}");
    assert!(line.len() > 200, "{line}");
    let accepted = shown["accepted_at"].as_str().unwrap();
    assert!(line.contains(accepted), "{accepted} not in {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_fetched_by_curl_pass_promtool_and_prometheus_gets_openmetrics() {
    let relay = TestRelay::start().await;
    let url = format!("http://{}/metrics", relay.admin());
    // curl sends `Accept: */*`: the Prometheus text format, which promtool checks.
    let script = format!("set -o pipefail; curl -sSf {url} | promtool check metrics");
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if said.contains("promtool: command not found") {
        assert!(std::env::var_os("CI").is_none(), "CI installs promtool");
        eprintln!("SKIPPED promtool: not installed");
    } else {
        assert!(out.status.success() && said.trim().is_empty(), "{said}");
    }
    let head = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{content_type}"])
        .arg(&url)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&head.stdout),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    // Prometheus's own Accept header: OpenMetrics.
    let accept = "Accept: application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
    let open = Command::new("curl")
        .args(["-sS", "-H", accept, "-D", "-"])
        .arg(&url)
        .output()
        .unwrap();
    let open = String::from_utf8_lossy(&open.stdout).to_string();
    assert!(
        open.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{open}"
    );
    assert!(open.ends_with("# EOF\n"), "{open}");
}
