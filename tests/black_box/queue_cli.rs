//! `idemrelay queue list|show|retry|cancel|flush|purge` run as an operator would: the built
//! binary against a running in-process relay's admin API, or with `--direct` against its
//! store, with `idemrelay sink` as the upstream.

use crate::common;

use std::process::{Command, Output};
use std::time::Duration;

use common::process::{idemrelay, store_url};
use common::{message, relay_for, start_sink, wait_state, TestRelay};
use idemrelay::store::State;
use idemrelay_sink::{FaultRule, FaultStage};

/// How long a state the relay reaches by itself may take to show: generous, because CI runs the
/// whole suite at once on two cores and each poll here starts an `idemrelay queue` process.
const LIMIT: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

async fn submit(relay: &TestRelay, to: &str, msg: &[u8]) -> String {
    common::submit(relay, "sender@example.com", &[to], msg).await
}

/// The result of one `idemrelay queue --store URL ARGS...` run.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", self.stdout))
    }
}

/// How `idemrelay queue` reaches the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The relay's admin API (`--admin ADDR`), the default.
    Api,
    /// `--direct --store <the relay's store>`.
    Store,
}

/// `idemrelay queue --admin <the relay's admin API> ARGS...`, or `--direct --store URL`.
async fn queue_via(relay: &TestRelay, via: Via, args: &[&str]) -> Run {
    let mut all = vec!["queue".to_string()];
    match via {
        Via::Api => all.extend(["--admin".to_string(), relay.admin().to_string()]),
        Via::Store => all.extend([
            "--direct".to_string(),
            "--store".to_string(),
            relay.settings.store.expose().to_string(),
        ]),
    }
    all.extend(args.iter().map(|a| a.to_string()));
    run(all).await
}

async fn ok(relay: &TestRelay, args: &[&str]) -> Run {
    ok_via(relay, Via::Api, args).await
}

async fn ok_via(relay: &TestRelay, via: Via, args: &[&str]) -> Run {
    let run = queue_via(relay, via, args).await;
    assert!(
        run.ok,
        "queue {args:?} via {via:?} failed:\n{}\n{}",
        run.stdout, run.stderr
    );
    run
}

async fn refused(relay: &TestRelay, args: &[&str]) -> Run {
    refused_via(relay, Via::Api, args).await
}

async fn refused_via(relay: &TestRelay, via: Via, args: &[&str]) -> Run {
    let run = queue_via(relay, via, args).await;
    assert!(
        !run.ok,
        "queue {args:?} via {via:?} succeeded:\n{}",
        run.stdout
    );
    run
}

/// The first line of `text` that `is_it`, or a failure naming `what` was looked for.
fn line_where<'a>(text: &'a str, what: &str, is_it: impl Fn(&str) -> bool) -> &'a str {
    text.lines()
        .find(|l| is_it(l))
        .unwrap_or_else(|| panic!("no {what}:\n{text}"))
}

/// The table row that starts with `id`.
fn row<'a>(table: &'a str, id: &str) -> &'a str {
    line_where(table, &format!("row for {id}"), |l| l.starts_with(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_message_is_listed_shown_and_delivered_after_retry() {
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
        "nobody@example.com",
        &message(Some("retry-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Failed).await;
    // The DSN to the sender.
    sink.wait_for_messages(1, LIMIT).await.unwrap();

    // Every column, with the last outcome and the upstream's reply: --wide.
    let list = ok(&relay, &["list", "--wide"]).await.stdout;
    assert!(list.starts_with("ID "), "{list}");
    let line = row(&list, &id);
    for part in [
        "failed",
        "default",
        "retry-1",
        "permanent@rcpt 550",
        "5.1.1",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line:?}");
    }

    let failed = ok(&relay, &["list", "--state", "failed", "--json"])
        .await
        .json();
    assert_eq!(failed["next_cursor"], serde_json::Value::Null);
    let failed = failed["messages"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["id"], id.as_str());
    assert_eq!(failed[0]["state"], "failed");
    assert_eq!(failed[0]["key"], "retry-1");
    assert_eq!(failed[0]["attempts"], 1);
    assert_eq!(failed[0]["last_code"], 550);
    assert_eq!(
        failed[0]["rcpt_to"],
        serde_json::json!(["nobody@example.com"])
    );
    assert_eq!(failed[0]["mail_from"], "sender@example.com");
    let delivered = ok(&relay, &["list", "--state", "delivered", "--json"])
        .await
        .json();
    assert!(delivered["messages"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["id"] != id.as_str()));

    // The DSN and the record it reports on point at each other.
    let shown = ok(&relay, &["show", &id, "--json"]).await.json();
    let dsns = shown["dsns"].as_array().unwrap();
    assert_eq!(dsns.len(), 1, "{shown}");
    let dsn = dsns[0].as_str().unwrap();
    let dsn_shown = ok(&relay, &["show", dsn]).await.stdout;
    assert!(
        dsn_shown.contains(&format!("dsn of          {id}")),
        "{dsn_shown}"
    );
    assert!(
        ok(&relay, &["show", &id])
            .await
            .stdout
            .contains(&format!("dsn sent        {dsn}")),
        "the record names its DSN"
    );

    // By id and by key (in the configured scope).
    for what in [id.as_str(), "retry-1"] {
        let show = ok(&relay, &["show", what]).await.stdout;
        assert!(show.contains(&format!("id              {id}")), "{show}");
        assert!(show.contains("state           failed"), "{show}");
        assert!(show.contains("attempts        1"), "{show}");
        let attempt = line_where(&show, "attempt row", |l| l.starts_with("1 "));
        assert!(attempt.contains("permanent"), "{attempt}");
        assert!(attempt.contains("rcpt"), "{attempt}");
        assert!(attempt.contains("550"), "{attempt}");
    }
    let missing = refused(&relay, &["show", "retry-1", "--scope", "elsewhere"]).await;
    assert!(missing.stderr.contains("no record"), "{}", missing.stderr);

    let retry = ok(&relay, &["retry", &id]).await;
    assert!(
        retry.stdout.contains(&format!("requeued {id}")),
        "{}",
        retry.stdout
    );
    wait_state(&relay, &id, State::Delivered).await;
    let messages = sink.wait_for_messages(2, LIMIT).await.unwrap();
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.key.as_deref() == Some("retry-1"))
            .count(),
        1
    );
    let show = ok(&relay, &["show", &id, "--json"]).await.json();
    assert_eq!(show["state"], "delivered");
    let attempts = show["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{show}");
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[0]["outcome"], "permanent");
    assert_eq!(attempts[1]["attempt"], 2);
    assert_eq!(attempts[1]["outcome"], "accepted");
    assert!(show["upstream_reply"].as_str().unwrap().starts_with("250"));

    let again = refused(&relay, &["retry", &id]).await;
    assert!(
        again.stderr.contains("is delivered") && again.stderr.contains("only failed"),
        "{}",
        again.stderr
    );
    let none = refused(&relay, &["retry", "no-such-id"]).await;
    assert!(none.stderr.contains("no record"), "{}", none.stderr);
    let bad = refused(&relay, &["list", "--state", "lost"]).await;
    assert!(bad.stderr.contains("unknown state"), "{}", bad.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_message_is_retried_only_with_confirmation() {
    let (sink, relay) = common::relay_whose_attempts_end_unknown().await;
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("unres-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Unresolved).await;
    sink.set_faults(vec![]).unwrap();
    let before = relay.store().attempts(&id).await.unwrap().len();

    // This one goes to the store directly (`--direct`), as with a relay that is down.
    let list = ok_via(&relay, Via::Store, &["list", "--state", "unresolved"])
        .await
        .stdout;
    // The narrow listing shows the beginning of the id.
    assert!(row(&list, &id[..16]).contains("unresolved"), "{list}");

    let refusal = refused_via(&relay, Via::Store, &["retry", &id]).await;
    assert!(
        refusal.stderr.contains("unresolved")
            && refusal.stderr.contains("second copy")
            && refusal.stderr.contains("--confirm-duplicate-risk"),
        "{}",
        refusal.stderr
    );
    assert_eq!(refusal.stdout, "");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(relay.stored(&id).await.state, State::Unresolved);
    assert_eq!(relay.store().attempts(&id).await.unwrap().len(), before);

    common::wait_out_held_replies(&relay, &id).await;
    let retry = ok_via(
        &relay,
        Via::Store,
        &[
            "retry",
            "--key",
            "unres-1",
            "--confirm-duplicate-risk",
            "--reason",
            "checked with the upstream: not there",
        ],
    )
    .await;
    assert!(
        retry.stdout.contains(&format!("requeued {id}")),
        "{}",
        retry.stdout
    );
    // The action's one log line names the record.
    assert!(
        retry.stderr.contains(&format!("id={id}")) && retry.stderr.contains("operator action"),
        "{}",
        retry.stderr
    );
    wait_state(&relay, &id, State::Delivered).await;
    let show = ok(&relay, &["show", &id, "--json"]).await.json();
    let history = show["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{show}");
    assert_eq!(history[0]["action"], "retry");
    assert!(
        history[0]["actor"]
            .as_str()
            .unwrap()
            .starts_with("local user "),
        "{show}"
    );
    assert_eq!(history[0]["reason"], "checked with the upstream: not there");
    assert!(
        history[0]["detail"]
            .as_str()
            .unwrap()
            .contains("duplicate risk confirmed"),
        "{show}"
    );
    // The old ledger stays; new attempts continue its numbering and the last one is accepted
    // (the upstream's replay of the transaction it held).
    let attempts = show["attempts"].as_array().unwrap();
    assert!(attempts.len() > before, "{show}");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(a["attempt"], i + 1, "{show}");
    }
    // Each earlier attempt ended UNKNOWN, or, on a loaded machine, missed a 2 s connect or
    // greeting deadline (transient); the same reading as tests/in_process/admin.rs.
    let earlier = &attempts[..before];
    assert!(
        earlier.iter().any(|a| a["outcome"] == "unknown")
            && earlier
                .iter()
                .all(|a| a["outcome"] == "unknown" || a["outcome"] == "transient"),
        "{show}"
    );
    assert_eq!(attempts.last().unwrap()["outcome"], "accepted", "{show}");
    // The same key and bytes: the upstream holds one copy.
    let copies = sink
        .messages()
        .iter()
        .filter(|m| m.key.as_deref() == Some("unres-1"))
        .count();
    assert_eq!(copies, 1);
}

/// `queue resolve` closes unresolved records without sending them again: through the API as
/// delivered, on the store itself (`--direct`) as failed; each is in the record's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolved_message_is_resolved_by_hand_without_a_resend() {
    let (sink, relay) = common::relay_whose_attempts_end_unknown().await;
    let seen = submit(&relay, "a@example.com", &message(Some("res-1"), "s", "b")).await;
    let lost = submit(&relay, "b@example.com", &message(Some("res-2"), "s", "b")).await;
    wait_state(&relay, &seen, State::Unresolved).await;
    wait_state(&relay, &lost, State::Unresolved).await;
    sink.set_faults(vec![]).unwrap();
    let copies = sink.messages().len();

    // The reason and the outcome are both required.
    let refusal = refused(&relay, &["resolve", &seen, "--as", "delivered"]).await;
    assert!(refusal.stderr.contains("--reason"), "{}", refusal.stderr);
    let refusal = refused(&relay, &["resolve", &seen, "--as", "sent", "--reason", "x"]).await;
    assert!(refusal.stderr.contains("delivered"), "{}", refusal.stderr);

    let done = ok(
        &relay,
        &[
            "resolve",
            "--key",
            "res-1",
            "--as",
            "delivered",
            "--reason",
            "upstream log: 250 at 10:02",
        ],
    )
    .await;
    assert_eq!(
        done.stdout,
        format!("resolved {seen} as delivered: not sent again, no DSN\n")
    );
    let done = ok_via(
        &relay,
        Via::Store,
        &[
            "resolve",
            &lost,
            "--as",
            "failed",
            "--reason",
            "no trace upstream",
        ],
    )
    .await;
    assert!(done.stdout.contains("as failed"), "{}", done.stdout);
    assert!(
        done.stderr.contains(&format!("id={lost}")) && done.stderr.contains("action=resolve"),
        "{}",
        done.stderr
    );
    assert_eq!(relay.stored(&seen).await.state, State::Delivered);
    assert_eq!(relay.stored(&lost).await.state, State::Failed);

    let show = ok(&relay, &["show", &seen, "--json"]).await.json();
    let history = show["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{show}");
    assert_eq!(history[0]["action"], "resolve");
    assert_eq!(history[0]["detail"], "delivered");
    assert_eq!(history[0]["reason"], "upstream log: 250 at 10:02");

    // Resolved twice is refused; nothing went upstream again.
    let again = refused(
        &relay,
        &["resolve", &seen, "--as", "failed", "--reason", "x"],
    )
    .await;
    assert!(again.stderr.contains("only unresolved"), "{}", again.stderr);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(sink.messages().len(), copies);
    let unresolved = ok(&relay, &["list", "--state", "unresolved"]).await.stdout;
    assert!(
        !unresolved.contains(&seen) && !unresolved.contains(&lost),
        "{unresolved}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_message_is_cancelled_and_never_delivered() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    relay.store().pause("hold", false).await.unwrap();
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("cancel-1"), "s", "b"),
    )
    .await;
    let queued = ok(&relay, &["list", "--state", "queued", "--json"])
        .await
        .json();
    let queued = &queued["messages"];
    assert_eq!(queued[0]["id"], id.as_str());
    assert_eq!(queued[0]["state"], "queued");
    assert_eq!(queued[0]["attempts"], 0);
    assert_eq!(queued[0]["waiting"]["reason"], "paused", "{queued}");

    let cancel = ok(
        &relay,
        &[
            "cancel",
            "--key",
            "cancel-1",
            "--reason",
            "sent to the wrong list",
        ],
    )
    .await;
    assert!(
        cancel.stdout.contains(&format!("cancelled {id}")),
        "{}",
        cancel.stdout
    );
    let show = ok(&relay, &["show", &id]).await.stdout;
    assert!(show.contains("state           cancelled"), "{show}");
    assert!(show.contains("cancelled by an operator"), "{show}");
    assert!(show.contains("attempts        0"), "{show}");
    assert!(show.contains("operator actions 1"), "{show}");
    let action = line_where(&show, "cancel row", |l| l.contains(" cancel "));
    // Through the API, the actor is the token's name and the local user the CLI names.
    assert!(action.contains("admin API"), "{action}");
    assert!(action.contains("sent to the wrong list"), "{action}");
    let cancelled = ok(&relay, &["list", "--state", "cancelled", "--json"])
        .await
        .json();
    assert_eq!(cancelled["messages"][0]["id"], id.as_str());
    assert_eq!(
        ok(&relay, &["list", "--state", "failed", "--json"])
            .await
            .json()["messages"],
        serde_json::json!([]),
        "cancelled is not failed"
    );

    relay.store().resume().await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(sink.transactions(), vec![]);
    assert_eq!(relay.stored(&id).await.state, State::Cancelled);
    assert_eq!(relay.count("delivery_jobs").await, 0, "no DSN, no job");

    let again = refused(&relay, &["cancel", &id]).await;
    assert!(again.stderr.contains("only queued"), "{}", again.stderr);

    // Parked for an operator: nothing goes within `parked_retention` (30 days); past it,
    // the cancelled record does.
    let purge = ok(&relay, &["purge", "--expired"]).await;
    assert!(purge.stdout.contains("purged 0 "), "{}", purge.stdout);
    common::backend::age_records(relay.settings.store.expose(), 31 * DAY).await;
    let purge = ok(&relay, &["purge", "--expired"]).await;
    assert!(purge.stdout.contains("purged 1 "), "{}", purge.stdout);
    let gone = refused(&relay, &["show", &id]).await;
    assert!(gone.stderr.contains("no record"), "{}", gone.stderr);
    assert!(refused(&relay, &["purge"])
        .await
        .stderr
        .contains("--expired"));
}

/// Runs `idemrelay ARGS...`.
async fn run(args: Vec<String>) -> Run {
    let mut cmd = idemrelay();
    cmd.args(args);
    run_command(cmd).await
}

/// Runs `cmd` off the runtime's threads (the relay shares them).
async fn run_command(mut cmd: Command) -> Run {
    let out: Output = tokio::task::spawn_blocking(move || cmd.output().expect("run idemrelay"))
        .await
        .unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

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

/// `idemrelay ARGS...` with extra environment variables.
async fn run_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = idemrelay();
    cmd.args(args);
    for (name, value) in env {
        cmd.env(name, value);
    }
    run_command(cmd).await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_an_action_is_refused_and_says_how_to_allow_it() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| s.admin_allow_changes_without_token = false).await;
    let refused = refused(&relay, &["pause", "--reason", "drill"]).await;
    assert!(
        refused.stderr.contains("admin_allow_changes_without_token")
            && refused.stderr.contains("admin_token"),
        "{}",
        refused.stderr
    );
    assert_eq!(relay.store().paused().await.unwrap(), None);
    // Reads still work without a token.
    let status = ok(&relay, &["status", "--json"]).await;
    assert_eq!(status.json()["paused"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_needs_the_token_and_records_its_name_as_who() {
    const TOKEN: &str = "queue-cli-admin-token-0123";
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| {
        s.admin_token = Some(idemrelay::config::Secret(TOKEN.into()))
    })
    .await;
    let admin = relay.admin().to_string();
    let base = ["queue", "--admin", admin.as_str()];
    let with =
        |args: &[&str]| -> Vec<String> { base.iter().chain(args).map(|s| s.to_string()).collect() };
    let refused = run_env(
        &with(&["pause"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
    )
    .await;
    assert!(!refused.ok);
    assert!(
        refused.stderr.contains("IDEMRELAY_ADMIN_TOKEN"),
        "{}",
        refused.stderr
    );
    assert_eq!(relay.store().paused().await.unwrap(), None);
    let env = [("IDEMRELAY_ADMIN_TOKEN", TOKEN), ("USER", "ops-alice")];
    let args = with(&["pause", "--reason", "upstream maintenance 14:00"]);
    let paused = run_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), &env).await;
    assert!(paused.ok, "{}", paused.stderr);
    assert!(
        paused
            .stdout
            .contains("delivery paused: upstream maintenance 14:00"),
        "{}",
        paused.stdout
    );
    let args = with(&["status", "--json"]);
    let status = run_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), &env).await;
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(status["paused"], true);
    assert_eq!(status["recent_actions"][0]["action"], "pause");
    assert_eq!(
        status["recent_actions"][0]["actor"],
        "admin_token (ops-alice)"
    );
    assert_eq!(
        status["recent_actions"][0]["reason"],
        "upstream maintenance 14:00"
    );
    let args = with(&["resume", "--reason", "done"]);
    let resumed = run_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), &env).await;
    assert!(resumed.ok, "{}", resumed.stderr);
    assert_eq!(relay.store().paused().await.unwrap(), None);
    let args = with(&["status"]);
    let status = run_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), &env).await;
    assert!(status.stdout.starts_with("running\n"), "{}", status.stdout);
    assert!(status.stdout.contains("resume"), "{}", status.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_message_says_why_and_flush_sends_it_now() {
    // Every attempt is deferred by the upstream until the faults are cleared.
    let sink = common::start_deferring_sink().await;
    let relay = relay_for(&sink, |s| {
        s.delivery.retry_base = Duration::from_secs(3600);
        s.delivery.retry_cap = Duration::from_secs(3600);
        s.delivery.max_attempts = 1000;
    })
    .await;
    let id = submit(
        &relay,
        "Waiting@Example.com",
        &message(Some("flush-1"), "s", "b"),
    )
    .await;
    // Full jitter may pick a short backoff now and then: wait for a long one.
    let listed = common::eventually(LIMIT, "a long backoff", || async {
        let run = ok(&relay, &["list", "--state", "deferred", "--json"]).await;
        let page = run.json();
        let row = page["messages"].as_array()?.first()?.clone();
        let due = row["next_attempt_at_ms"].as_i64()?;
        (due > common::now_ms() + 60_000).then_some(row)
    })
    .await;
    assert_eq!(listed["id"], id.as_str());
    assert_eq!(listed["waiting"]["reason"], "backoff", "{listed}");
    assert_eq!(listed["last_outcome"], "transient");
    let table = ok(&relay, &["list", "--state", "deferred"]).await.stdout;
    let line = row(&table, &id[..16]);
    assert!(line.contains("backoff"), "{table}");
    assert!(line.contains("waiting@example.com") || line.contains("Waiting@Example.com"));
    let show = ok(&relay, &["show", "--key", "flush-1"]).await.stdout;
    assert!(
        show.contains("waiting         backoff: retry backoff"),
        "{show}"
    );
    assert!(show.contains("next attempt"), "{show}");

    // Finding it: by recipient (any case), sender, Message-ID-less key, scope and time.
    for filter in [
        vec!["--recipient", "waiting@example.com"],
        vec!["--sender", "SENDER@example.com"],
        vec!["--key", "flush-1", "--in-scope", "default"],
        vec!["--since", "10m", "--state", "queued"],
    ] {
        let mut args = vec!["list", "--json"];
        args.extend(&filter);
        let page = ok(&relay, &args).await.json();
        let ids: Vec<&str> = page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [id.as_str()], "{filter:?}");
    }
    for filter in [
        vec!["--recipient", "waiting@example"],
        vec!["--in-scope", "elsewhere"],
        vec!["--until", "10m"],
        vec!["--state", "delivered"],
    ] {
        let mut args = vec!["list", "--json"];
        args.extend(&filter);
        let page = ok(&relay, &args).await.json();
        assert_eq!(page["messages"], serde_json::json!([]), "{filter:?}");
    }
    let bad = refused(&relay, &["list", "--state", "lost"]).await;
    assert!(bad.stderr.contains("deferred"), "{}", bad.stderr);

    sink.set_faults(vec![]).unwrap();
    let flush = ok(&relay, &["flush", &id, "--reason", "the upstream is back"]).await;
    assert!(
        flush.stdout.contains(&format!("flushed {id}: due now")),
        "{}",
        flush.stdout
    );
    wait_state(&relay, &id, State::Delivered).await;
    let shown = ok(&relay, &["show", &id, "--json"]).await.json();
    assert_eq!(shown["waiting"], serde_json::Value::Null);
    let history = shown["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{shown}");
    assert_eq!(history[0]["action"], "flush");
    assert_eq!(history[0]["reason"], "the upstream is back");
    assert!(
        history[0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("was due in"),
        "{shown}"
    );
    let again = refused(&relay, &["flush", &id]).await;
    assert!(again.stderr.contains("only queued"), "{}", again.stderr);
    let all = ok(&relay, &["flush", "--all"]).await;
    assert!(
        all.stdout.starts_with("flushed 0 record(s)"),
        "{}",
        all.stdout
    );

    // A page at a time, with the way on printed under the table.
    let second = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("flush-2"), "s", "b"),
    )
    .await;
    let first = ok(&relay, &["list", "--limit", "1"]).await.stdout;
    let more = first
        .lines()
        .find_map(|l| l.strip_prefix("more: --cursor "))
        .unwrap_or_else(|| panic!("no cursor line:\n{first}"));
    assert!(first.contains(&id[..16]), "{first}");
    let next = ok(&relay, &["list", "--limit", "1", "--cursor", more])
        .await
        .stdout;
    assert!(next.contains(&second[..16]), "{next}");
    assert!(!next.contains("more:"), "{next}");
    let newest = ok(&relay, &["list", "--newest", "--limit", "1"])
        .await
        .stdout;
    assert!(
        newest.contains(&second[..16]) && newest.contains("more: --cursor"),
        "{newest}"
    );
}

/// `idemrelay queue ARGS...` with no relay named: no --admin, no IDEMRELAY_ADMIN, and the
/// default config file moved to `default_config` (so the host's /etc is never read).
async fn queue_unnamed(default_config: &std::path::Path, args: &[&str]) -> Run {
    let mut all = vec!["queue"];
    all.extend(args);
    run_env(
        &all,
        &[("IDEMRELAY_DEFAULT_CONFIG", default_config.to_str().unwrap())],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_named_relay_changes_are_refused_and_every_answer_names_its_relay() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |_| {}).await;
    relay.store().pause("hold", false).await.unwrap();
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("named-1"), "s", "b"),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("idemrelay.toml");

    // Nothing names a relay: whichever listens on the built-in default would take the change.
    for args in [
        &["flush", "--all"][..],
        &["cancel", &id],
        &["cancel", "--all", "--recipient", "rcpt@example.com"],
        &["pause", "--reason", "drill"],
        &["purge", "--expired"],
    ] {
        let run = queue_unnamed(&absent, args).await;
        assert!(!run.ok, "{args:?} was not refused: {}", run.stdout);
        assert!(
            run.stderr.contains("refusing to")
                && run.stderr.contains("--admin http://HOST:PORT")
                && run.stderr.contains("--config"),
            "{args:?}: {}",
            run.stderr
        );
    }
    // A read may go there, and says so.
    let read = queue_unnamed(&absent, &["status"]).await;
    assert!(
        read.stderr.contains("built-in default 127.0.0.1:8025"),
        "{}",
        read.stderr
    );

    // The default config file names the relay: changes go to it, and it is named.
    let admin = relay.admin();
    std::fs::write(&absent, format!("admin = \"{admin}\"\n")).unwrap();
    let paused = queue_unnamed(&absent, &["pause", "--reason", "named by the file"]).await;
    assert!(paused.ok, "{}", paused.stderr);
    assert!(
        paused
            .stderr
            .contains(&format!("answered by relay relay.test at http://{admin}")),
        "{}",
        paused.stderr
    );
    assert!(
        paused
            .stderr
            .contains(&format!("the `admin` of {}", absent.display())),
        "{}",
        paused.stderr
    );
    assert!(
        !paused.stdout.contains("relay.test"),
        "stdout stays the result"
    );
    // JSON output carries it as a field; the status names the instance too.
    let status = queue_unnamed(&absent, &["status", "--json"]).await.json();
    assert_eq!(status["answered_by"]["instance"], "relay.test", "{status}");
    assert_eq!(
        status["answered_by"]["admin"],
        format!("http://{admin}"),
        "{status}"
    );
    assert_eq!(status["instance"], "relay.test");
    assert_eq!(status["reason"], "named by the file");
    let listed = queue_unnamed(&absent, &["list", "--json"]).await.json();
    assert_eq!(listed["answered_by"]["instance"], "relay.test");
    assert_eq!(listed["messages"][0]["id"], id.as_str());

    // --admin takes a URL as well as HOST:PORT; https is refused with a reason.
    for given in [format!("http://{admin}"), format!("http://{admin}/")] {
        let run = run_env(&["queue", "--admin", &given, "status", "--json"], &[]).await;
        assert!(run.ok, "{given}: {}", run.stderr);
        assert_eq!(run.json()["answered_by"]["instance"], "relay.test");
    }
    let tls = run_env(
        &["queue", "--admin", &format!("https://{admin}"), "status"],
        &[],
    )
    .await;
    assert!(!tls.ok);
    assert!(tls.stderr.contains("plain HTTP"), "{}", tls.stderr);
    // A --config file that leaves `admin` out names no relay either.
    let bare = dir.path().join("bare.toml");
    std::fs::write(&bare, "scope = \"default\"\n").unwrap();
    let run = run_env(
        &[
            "queue",
            "--config",
            bare.to_str().unwrap(),
            "flush",
            "--all",
        ],
        &[],
    )
    .await;
    assert!(
        !run.ok && run.stderr.contains("refusing to flush --all"),
        "{}",
        run.stderr
    );

    // Every admin answer names the relay; the root sends a browser to the console.
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-D", "-"])
        .arg(format!("http://{admin}/"))
        .output()
        .expect("curl");
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 303"), "{head}");
    assert!(head.contains("location: /console\r\n"), "{head}");
    assert!(
        head.contains("idemrelay-instance: relay.test\r\n"),
        "{head}"
    );
}

/// `idemrelay queue --direct --store <the relay's store> ARGS...` as a user without $USER or
/// $LOGNAME (root in a container, a cron job).
async fn direct_without_user(relay: &TestRelay, args: &[&str]) -> Run {
    let store = relay.settings.store.expose().to_string();
    let mut cmd = idemrelay();
    cmd.args(["queue", "--direct", "--store", &store])
        .args(args)
        .env_remove("USER")
        .env_remove("LOGNAME");
    run_command(cmd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_user_the_actor_is_the_os_user_name_and_by_names_another() {
    let relay = TestRelay::start().await;
    let os_user = Command::new("id").arg("-un").output().expect("id -un");
    let os_user = String::from_utf8_lossy(&os_user.stdout).trim().to_string();
    assert!(!os_user.is_empty());

    let paused = direct_without_user(&relay, &["pause", "--reason", "r1"]).await;
    assert!(paused.ok, "{}", paused.stderr);
    let status = direct_without_user(&relay, &["status", "--json"])
        .await
        .json();
    assert_eq!(
        status["recent_actions"][0]["actor"],
        format!("local user {os_user}"),
        "{status}"
    );
    let resumed = direct_without_user(&relay, &["resume", "--by", "ops-carol"]).await;
    assert!(resumed.ok, "{}", resumed.stderr);
    // Through the API too: the person beside the token's name.
    let mut cmd = idemrelay();
    cmd.args(["queue", "--admin", &relay.admin().to_string(), "pause"])
        .env_remove("USER")
        .env_remove("LOGNAME");
    assert!(run_command(cmd).await.ok);
    let status = direct_without_user(&relay, &["status", "--json"])
        .await
        .json();
    let actors: Vec<&str> = status["recent_actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["actor"].as_str().unwrap())
        .collect();
    assert_eq!(
        actors[..2],
        [
            format!("admin API (no token configured) ({os_user})").as_str(),
            "local user ops-carol",
        ],
        "{status}"
    );
    let bad = direct_without_user(&relay, &["resume", "--by", "two words"]).await;
    assert!(!bad.ok && bad.stderr.contains("--by"), "{}", bad.stderr);
}

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
