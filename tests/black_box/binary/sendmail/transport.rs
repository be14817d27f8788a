//! STARTTLS and AUTH, several transactions, and PHP's mail() through the link.

use super::*;

/// The port of the relay's listener of `kind` (`Plain`, `StartTls`, `ImplicitTls`), once its
/// log names it (the listeners are logged one after another, after the first is ready).
fn listener_port(relay: &RelayProcess, kind: &str) -> u16 {
    super::logged_listeners(relay, kind, 1)[0].port()
}

/// Runs an `idemrelay` setup command, which must succeed.
fn checked(cmd: &mut Command, stdin: &[u8]) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_and_auth_on_a_submission_listener() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let certs = dir.path().join("certs");
    let users = dir.path().join("users.toml");
    checked(
        idemrelay()
            .args([
                "certs",
                "generate",
                "--name",
                "relay.test",
                "--name",
                "localhost",
            ])
            .arg("--out")
            .arg(&certs),
        b"",
    );
    checked(
        idemrelay()
            .args(["user", "add", "app", "--scope", "tenant-app", "--users"])
            .arg(&users),
        b"correct horse\n",
    );
    let cert = certs.join("cert.pem").to_str().unwrap().to_string();
    let key = certs.join("key.pem").to_str().unwrap().to_string();
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--submission-listen",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--users-file",
        users.to_str().unwrap(),
        "--hostname",
        "relay.test",
        "--admin",
        "off",
        "--store",
        &store_url(&db),
    ]
    .map(String::from)
    .to_vec();
    let relay = RelayProcess::spawn(&args).ready().await;
    let port = listener_port(&relay, "StartTls");
    // What sendmail reads: no plain listener, so it goes to the submission listener, with
    // STARTTLS, trusting tls_cert and checking the name `hostname`.
    let config = dir.path().join("idemrelay.toml");
    std::fs::write(
        &config,
        format!(
            "listen = []\nsubmission_listen = [\"127.0.0.1:{port}\"]\nhostname = \"relay.test\"\n\
             tls_cert = \"{cert}\"\ntls_key = \"{key}\"\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let input = b"From: app@example.com\nSubject: over TLS\n\nsecret body\n";
    let with_password = |password: &str, args: &[&str]| {
        let mut cmd = idemrelay();
        cmd.env("IDEMRELAY_SENDMAIL_PASSWORD", password)
            .arg("sendmail")
            .args(args);
        run(cmd, input)
    };

    let out = with_password(
        "correct horse",
        &[
            "--config",
            &config,
            "--auth-user",
            "app",
            "-v",
            "r@example.com",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(show(&db, &out.id())["scope"], "tenant-app");
    // Explicit: --server with --starttls and --tls-ca; the name checked is the host given.
    let server = format!("localhost:{port}");
    let out = with_password(
        "correct horse",
        &[
            "--server",
            &server,
            "--starttls",
            "--tls-ca",
            &cert,
            "--auth-user",
            "app",
            "-v",
            "r@example.com",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("(idempotent replay)"), "{out:?}");

    // A wrong password is a 5xx at AUTH: 69, and the password is not echoed.
    let out = with_password(
        "wrong password",
        &["--config", &config, "--auth-user", "app", "r@example.com"],
    );
    assert_eq!(out.code, 69, "{out:?}");
    assert!(out.stderr.contains("at AUTH: 535"), "{out:?}");
    assert!(!out.stderr.contains("wrong password"), "{out:?}");
    // No password in the environment: a configuration error.
    let out = sendmail(
        &["--config", &config, "--auth-user", "app", "r@example.com"],
        input,
    );
    assert_eq!(out.code, 78, "{out:?}");
    // Without STARTTLS the submission listener refuses MAIL: 69.
    let plain = format!("127.0.0.1:{port}");
    let out = with_password("correct horse", &["--server", &plain, "r@example.com"]);
    assert_eq!(out.code, 69, "{out:?}");
    assert!(out.stderr.contains("530 5.7.0"), "{out:?}");
    // A certificate sendmail does not trust: no TLS, nothing sent.
    let out = with_password(
        "correct horse",
        &[
            "--server",
            &server,
            "--starttls",
            "--auth-user",
            "app",
            "r@example.com",
        ],
    );
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.stderr.contains("at STARTTLS"), "{out:?}");
    assert_eq!(record_count(&db), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_recipients_than_the_relay_takes_go_in_several_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &["--max-recipients", "2"]);
    let input = b"From: a@example.com\nX-Bird-Idempotency-Key: newsletter-9\nSubject: s\n\nhi\n";
    let rcpts = [
        "r1@example.com",
        "r2@example.com",
        "r3@example.com",
        "r4@example.com",
        "r5@example.com",
    ];
    let mut args = vec!["-v"];
    args.extend(rcpts);
    let out = sendmail_to(relay.addr, &args, input);
    assert_eq!(out.code, 0, "{out:?}");
    let ids = out.ids();
    assert_eq!(ids.len(), 3, "{out:?}");
    let mut seen = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let record = show(&db, id);
        assert_eq!(record["key"], "newsletter-9");
        assert_eq!(record["part"], n as u64 + 1);
        seen.extend(strings(&record["rcpt_to"]));
    }
    assert_eq!(seen, rcpts);
    // The same command again: the same split, every part replayed.
    let again = sendmail_to(relay.addr, &args, input);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.ids(), ids);
    assert_eq!(
        again.stderr.matches("(idempotent replay)").count(),
        3,
        "{again:?}"
    );
    assert_eq!(record_count(&db), 3);
}

/// A real caller: PHP's mail() runs `sendmail_path` with the message on standard input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn php_mail_submits_through_the_link_and_its_retry_replays() {
    const NAME: &str = "php_mail_submits_through_the_link_and_its_retry_replays";
    if std::env::var_os("CI").is_none() && Command::new("php").arg("--version").output().is_err() {
        eprintln!("SKIPPED {NAME}: php is not installed (apt-get install -y php-cli)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let link = dir.path().join("sendmail");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    // PHP's default sendmail_path is `sendmail -t -i`.
    let sendmail_path = format!("{} -t -i --server {}", link.display(), relay.addr);
    let script = r#"
        $ok = mail(
            "Ann <ann@example.com>, bob@example.com",
            "Order 1234",
            "Thank you for your order.\n.\nA line with a lone dot above.\n",
            "From: Shop <shop@example.com>\r\nBcc: audit@example.com\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8"
        );
        echo $ok ? "sent\n" : "failed\n";
    "#;
    let php = || {
        let out = Command::new("php")
            .args(["-n", "-d", &format!("sendmail_path={sendmail_path}")])
            .args(["-r", script])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .expect("run php");
        (text(&out.stdout), text(&out.stderr))
    };
    let (stdout, stderr) = php();
    assert_eq!(stdout.trim(), "sent", "php: {stdout} {stderr}");
    let list = queue_json(&db, &["list", "--json"]);
    let list = list["messages"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let id = list[0]["id"].as_str().unwrap().to_string();
    let record = show(&db, &id);
    assert_eq!(record["mail_from"], "shop@example.com");
    assert_eq!(
        strings(&record["rcpt_to"]),
        ["ann@example.com", "bob@example.com", "audit@example.com"]
    );
    let sent = sent_bytes(&db, &id).await;
    assert!(
        sent.starts_with("To: Ann <ann@example.com>, bob@example.com\r\nSubject: Order 1234\r\n"),
        "{sent}"
    );
    assert!(!sent.contains("audit@example.com"), "{sent}");
    // -i: the lone dot in the body is data (PHP ends the body with one more newline).
    assert!(
        sent.ends_with(
            "\r\n\r\nThank you for your order.\r\n.\r\nA line with a lone dot above.\r\n\r\n"
        ),
        "{sent}"
    );

    // PHP adds no Date or Message-ID: calling mail() again with the same arguments (a retry
    // after a timeout, say) sends the same bytes, and the relay replays instead of queueing.
    let (stdout, stderr) = php();
    assert_eq!(stdout.trim(), "sent", "php: {stdout} {stderr}");
    assert_eq!(record_count(&db), 1);

    // With the relay down, mail() reports the failure.
    drop(relay);
    let (stdout, _) = php();
    assert_eq!(stdout.trim(), "failed");
}
