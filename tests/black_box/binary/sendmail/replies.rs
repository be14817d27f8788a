//! Replays, the link named sendmail, and exit statuses that follow the relay's answer.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_input_again_is_an_idempotent_replay() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    // No key, no Date, no Message-ID, no From: what cron sends.
    let input = b"Subject: Cron <root@host> run-parts /etc/cron.daily\nTo: root\n\nall done\n";
    let args = ["-FCronDaemon", "-i", "-B8BITMIME", "-oem", "-v", "root"];
    let first = sendmail_to(relay.addr, &args, input);
    assert_eq!(first.code, 0, "{first:?}");
    let id = first.id();
    assert!(!first.stderr.contains("replay"), "{first:?}");
    let second = sendmail_to(relay.addr, &args, input);
    assert_eq!(second.code, 0, "{second:?}");
    assert_eq!(second.ids(), [id.as_str()]);
    assert!(second.stderr.contains("(idempotent replay)"), "{second:?}");
    assert_eq!(record_count(&db), 1);
    let record = show(&db, &id);
    assert_eq!(record["key_source"], "content");
    // One changed byte is another message.
    let other = sendmail_to(
        relay.addr,
        &args,
        b"Subject: Cron <root@host> run-parts /etc/cron.daily\nTo: root\n\nall done!\n",
    );
    assert_eq!(other.code, 0, "{other:?}");
    assert_ne!(other.id(), id);
    assert_eq!(record_count(&db), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_named_sendmail_is_sendmail_and_finds_the_relay_in_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let link = dir.path().join("sendmail");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let input = b"From: a@example.com\nSubject: link\n\nvia the link\n";

    // The relay from IDEMRELAY_LISTEN, as `serve` reads it.
    let mut via_link = Command::new(&link);
    via_link
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("IDEMRELAY_LISTEN", relay.addr.to_string())
        // Read only with --auth-user, and known: no warning about it.
        .env("IDEMRELAY_SENDMAIL_PASSWORD", "unused")
        .args(["-t", "-i", "-v", "r@example.com"]);
    let out = run(via_link, input);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.starts_with("sendmail: 250 "), "{out:?}");
    let id = out.id();
    assert_eq!(strings(&show(&db, &id)["rcpt_to"]), ["r@example.com"]);

    // The relay from a configuration file (-C is --config), and a wildcard listener there
    // is reached over loopback.
    let config = dir.path().join("idemrelay.toml");
    std::fs::write(
        &config,
        format!("listen = [\"0.0.0.0:{}\"]\n", relay.addr.port()),
    )
    .unwrap();
    for flag in ["-C", "--config"] {
        let mut cmd = Command::new(&link);
        cmd.env_clear()
            .arg(flag)
            .arg(&config)
            .args(["-v", "r@example.com"]);
        let out = run(cmd, input);
        assert_eq!(out.code, 0, "{flag}: {out:?}");
        assert_eq!(out.ids(), [id.as_str()], "{flag}");
        assert!(
            out.stderr.contains("(idempotent replay)"),
            "{flag}: {out:?}"
        );
    }
    // Global flags before `sendmail` count as on its own line; an IDEMRELAY_* variable that
    // nothing reads is warned about, as with the other commands.
    let mut cmd = idemrelay();
    cmd.env("IDEMRELAY_MAX_ERRORS", "5")
        .args(["--log-format", "human", "--listen"])
        .arg(relay.addr.to_string())
        .args(["sendmail", "-v", "r@example.com"]);
    let out = run(cmd, input);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.ids(), [id]);
    assert!(
        out.stderr.contains("IDEMRELAY_MAX_ERRORS is ignored"),
        "{out:?}"
    );
    assert_eq!(record_count(&db), 1);
}

/// A port nothing listens on.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_status_follows_the_relays_answer() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let config = dir.path().join("idemrelay.toml");
    std::fs::write(&config, "max_connections_per_ip = 1\n").unwrap();
    let config = config.to_str().unwrap().to_string();
    let relay = start_relay(&db, &["--config", &config, "--max-message-size", "4000"]);
    let ok = b"From: a@example.com\nSubject: s\n\nbody\n";

    // 75: the relay is down (connection refused).
    let out = sendmail_to(closed_port(), &["r@example.com"], ok);
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.stderr.contains("at connect"), "{out:?}");

    // 75: the relay answers 421 at the greeting (here: its per-client connection cap, held
    // by another connection).
    let mut holder = std::net::TcpStream::connect(relay.addr).unwrap();
    let mut greeting = [0u8; 64];
    let _ = std::io::Read::read(&mut holder, &mut greeting).unwrap();
    let out = sendmail_to(relay.addr, &["r@example.com"], ok);
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.stderr.contains("at greeting: 421 4.7.0"), "{out:?}");
    drop(holder);
    // The cap counts the held connection until the relay notices it closed.
    super::common::eventually(
        Duration::from_secs(10),
        "the held connection to close",
        || async {
            (sendmail_to(relay.addr, &["-v", "r@example.com"], ok).code == 0).then_some(())
        },
    )
    .await;

    // 65: the relay refuses the message itself at the final dot (too big: 552; NUL: 554).
    let big = format!(
        "From: a@example.com\nSubject: big\n\n{}\n",
        "x".repeat(5000)
    );
    let out = sendmail_to(relay.addr, &["r@example.com"], big.as_bytes());
    assert_eq!(out.code, 65, "{out:?}");
    assert!(out.stderr.contains("at end of data: 552 5.3.4"), "{out:?}");
    let out = sendmail_to(
        relay.addr,
        &["r@example.com"],
        b"From: a@example.com\n\nnul \0 here\n",
    );
    assert_eq!(out.code, 65, "{out:?}");
    assert!(out.stderr.contains("at end of data: 554 5.6.0"), "{out:?}");
    // 65 before connecting: larger than the max_message_size sendmail itself was given.
    let out = sendmail_to(
        closed_port(),
        &["--max-message-size", "100", "r@example.com"],
        big.as_bytes(),
    );
    assert_eq!(out.code, 65, "{out:?}");
    assert!(out.stderr.contains("max_message_size"), "{out:?}");
    assert_eq!(record_count(&db), 1);
    drop(relay);

    // 69: a 5xx before the message: this relay does not let loopback submit without AUTH.
    let db2 = dir.path().join("closed.db");
    let closed = start_relay(&db2, &["--allow-network", "192.0.2.0/24"]);
    let out = sendmail_to(closed.addr, &["r@example.com"], ok);
    assert_eq!(out.code, 69, "{out:?}");
    assert!(out.stderr.contains("at MAIL FROM: 530 5.7.0"), "{out:?}");
    assert_eq!(record_count(&db2), 0);
}

/// Runs a blocking sendmail off the runtime that serves the in-process sink.
async fn blocking(f: impl FnOnce() -> Run + Send + 'static) -> Run {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_or_no_answer_at_the_dot_is_75_and_the_retry_replays() {
    let sink = super::common::start_sink().await;
    let addr = sink.smtp_addr();
    const KEYED: &[u8] =
        b"From: a@example.com\nX-Bird-Idempotency-Key: order-17\nSubject: s\n\nbody\n";
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Dot,
        451,
        "4.3.0 try later",
    )
    .with_times(1)])
        .unwrap();
    let out = blocking(move || sendmail_to(addr, &["r@example.com"], KEYED)).await;
    assert_eq!(out.code, 75, "{out:?}");
    assert!(
        out.stderr.contains("at end of data: 451 4.3.0 try later"),
        "{out:?}"
    );
    assert!(sink.messages().is_empty());

    // The reply to the dot does not come in time: the server may have the message.
    sink.set_faults(vec![FaultRule::delay(
        FaultStage::Dot,
        Duration::from_secs(3),
    )
    .with_times(1)])
        .unwrap();
    let out =
        blocking(move || sendmail_to(addr, &["--timeout", "1s", "r@example.com"], KEYED)).await;
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.stderr.contains("may have committed"), "{out:?}");
    // It had: the caller runs the same command again, and again while the first is still
    // in progress there (451 E01004), and gets a replay, not a second copy.
    let out = super::common::eventually(Duration::from_secs(15), "a replay", || async move {
        let out = blocking(move || sendmail_to(addr, &["-v", "r@example.com"], KEYED)).await;
        match out.code {
            75 if out.stderr.contains("E01004") => None,
            _ => Some(out),
        }
    })
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("(idempotent replay)"), "{out:?}");
    assert_eq!(sink.messages().len(), 1);
}
