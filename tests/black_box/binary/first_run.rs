//! A newcomer's first run, config flags before or after any subcommand, and the
//! environment variables.

use super::*;

/// The README's first command (`serve` with no `--store`) in an empty working directory: the
/// default store `sqlite://idemrelay.db` is a bare file name, whose parent is the empty path.
/// Every other test passes absolute paths, which never see that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_the_default_relative_store_in_an_empty_directory_queues_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = idemrelay();
    cmd.current_dir(dir.path());
    let args: Vec<String> = ["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]
        .map(String::from)
        .to_vec();
    let relay = RelayProcess::spawn_command(cmd, &args).ready().await;
    let mut client = Client::ready(relay.addr).await;
    // Large enough to go to the spool, whose directory the first start creates.
    let big = "spooled line of a large body\r\n".repeat(2000);
    for (key, body) in [
        ("first-run-small", "small"),
        ("first-run-large", big.as_str()),
    ] {
        let msg = message(Some(key), "first run", body);
        let answer = client
            .submit("sender@example.com", &["rcpt@example.com"], &msg)
            .await;
        let id = answer
            .queue_id()
            .unwrap_or_else(|| panic!("not queued: {answer:?}; stderr:\n{}", relay.log()));
        assert_eq!(answer.line(), queued_line(&id));
    }
    client.quit().await;
    assert!(dir.path().join("idemrelay.db").is_file());
    assert!(dir.path().join("idemrelay.db.spool").is_dir());
    // An operator's command with the same relative default finds the same store.
    let listed = idemrelay()
        .current_dir(dir.path())
        .args(["queue", "--direct", "list"])
        .output()
        .unwrap();
    let out = text(&listed.stdout);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert_eq!(out.matches("queued").count(), 2, "{out}");
}

// --- config flags anywhere, and the variables ---------------------------

/// `queue show ID --store URL --json` used to answer `unexpected argument '--store'`: a config
/// flag is now taken before the subcommand, between it and its own subcommand, or after both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_flags_are_taken_before_or_after_any_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let msg = message(Some("flags-anywhere"), "flags", "body");
    let answer = client
        .submit("sender@example.com", &["rcpt@example.com"], &msg)
        .await;
    let id = answer.queue_id().expect("queued");
    client.quit().await;

    let store = store_url(&db);
    let placements: [Vec<&str>; 3] = [
        vec![
            "--store", &store, "queue", "--direct", "show", &id, "--json",
        ],
        vec![
            "queue", "--store", &store, "show", &id, "--json", "--direct",
        ],
        vec![
            "queue", "--direct", "show", &id, "--store", &store, "--json",
        ],
    ];
    let mut shown = Vec::new();
    for args in &placements {
        let out = run_checked(idemrelay().args(args), None);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", text(&out.stdout)));
        assert_eq!(json["id"], id.as_str(), "{args:?}");
        shown.push(json);
    }
    assert!(shown.windows(2).all(|w| w[0] == w[1]));

    // A key is looked up in the global --scope, wherever it stands.
    let by_key = run_checked(
        idemrelay()
            .args([
                "queue",
                "--direct",
                "show",
                "flags-anywhere",
                "--json",
                "--scope",
                "default",
            ])
            .args(["--store", &store]),
        None,
    );
    let json: serde_json::Value = serde_json::from_slice(&by_key.stdout).unwrap();
    assert_eq!(json["id"], id.as_str());
    let other_scope = idemrelay()
        .args([
            "--scope",
            "elsewhere",
            "--store",
            &store,
            "queue",
            "--direct",
            "show",
            "flags-anywhere",
        ])
        .output()
        .unwrap();
    assert!(!other_scope.status.success());
    assert!(
        text(&other_scope.stderr).contains("in scope \"elsewhere\""),
        "{}",
        text(&other_scope.stderr)
    );

    for args in [
        vec!["--max-recipients", "7", "check-config", "--store", &store],
        vec!["check-config", "--store", &store, "--max-recipients", "7"],
    ] {
        let out = run_checked(idemrelay().args(&args), None);
        assert!(text(&out.stdout).contains("max_recipients = 7"), "{args:?}");
    }
    drop(relay);
}

/// `IDEMRELAY_MAX_ERRORS=5` was silently ignored, and a bad value in a variable was blamed on
/// the flag the user never typed.
#[test]
fn unknown_variables_are_warned_about_and_bad_values_name_their_variable() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir.path().join("relay.db"));
    let out = check_config(
        &["--store", &store],
        &[
            ("IDEMRELAY_MAX_ERRORS", "5"),
            ("IDEMRELAY_STROE", "sqlite://x.db"),
        ],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("IDEMRELAY_MAX_ERRORS is ignored: `max_errors` has no variable or flag"),
        "{stderr}"
    );
    assert!(
        stderr.contains("IDEMRELAY_STROE is ignored: it matches no setting"),
        "{stderr}"
    );
    let quiet = check_config(&["--store", &store], &[("IDEMRELAY_MAX_RECIPIENTS", "9")]);
    assert!(
        !text(&quiet.stderr).contains("ignored"),
        "{}",
        text(&quiet.stderr)
    );
    assert!(text(&quiet.stdout).contains("max_recipients = 9"));

    let bad = check_config(
        &["--store", &store],
        &[("IDEMRELAY_MAX_RECIPIENTS", "many")],
    );
    let stderr = text(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "invalid value 'many' for IDEMRELAY_MAX_RECIPIENTS (the variable of --max-recipients)"
        ),
        "{stderr}"
    );
    // The same value typed as a flag is the flag's fault.
    let typed = check_config(&["--store", &store, "--max-recipients", "many"], &[]);
    let stderr = text(&typed.stderr);
    assert_eq!(typed.status.code(), Some(2));
    assert!(
        stderr.contains("for '--max-recipients <MAX_RECIPIENTS>'"),
        "{stderr}"
    );
}
