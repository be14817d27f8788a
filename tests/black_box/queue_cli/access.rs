//! Who may act: the token, the named relay, and the actor's name.

use super::*;

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
