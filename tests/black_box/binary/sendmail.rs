//! `idemrelay sendmail` (docs/guides/sendmail.md), run as the built binary the way programs
//! run /usr/sbin/sendmail: a message on standard input, sendmail options on the command line,
//! the answer in the exit status. Against a relay process on port 0 (what it stored is read
//! back with `queue show` and from its SQLite file), an in-process sink where a reply has to be
//! provoked, and PHP's `mail()` as a real caller.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use idemrelay_sink::{FaultRule, FaultStage};

use super::common::process::{idemrelay, store_url, RelayProcess, BIN};
use super::{queue_json, start_relay, stored_row, text};

/// What a sendmail run came to.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The queue ids in the `-v` output (`... queued as ID[ (idempotent replay)]`), in order.
    fn ids(&self) -> Vec<String> {
        self.stderr
            .lines()
            .filter_map(|l| l.split_once("queued as ")?.1.split(' ').next())
            .map(str::to_string)
            .collect()
    }

    fn id(&self) -> String {
        let ids = self.ids();
        assert_eq!(ids.len(), 1, "{self:?}");
        ids[0].clone()
    }
}

/// Runs `cmd` with `input` on standard input.
fn run(mut cmd: Command, input: &[u8]) -> Run {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sendmail");
    // A sendmail that exits early (a usage error) closes its end: not a test failure.
    let _ = child.stdin.take().unwrap().write_all(input);
    let out = child.wait_with_output().expect("wait for sendmail");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
    }
}

/// `idemrelay sendmail ARGS` with a clean environment.
fn sendmail(args: &[&str], input: &[u8]) -> Run {
    let mut cmd = idemrelay();
    cmd.arg("sendmail").args(args);
    run(cmd, input)
}

/// `idemrelay sendmail --server ADDR ARGS`.
fn sendmail_to(addr: SocketAddr, args: &[&str], input: &[u8]) -> Run {
    let server = addr.to_string();
    let mut all = vec!["--server", server.as_str()];
    all.extend_from_slice(args);
    sendmail(&all, input)
}

fn show(db: &Path, id: &str) -> serde_json::Value {
    queue_json(db, &["show", id, "--json"])
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The bytes the relay stored for `id`, without the lines it put in front (its `Received:`
/// field and, for a derived key, the key field): what sendmail sent.
async fn sent_bytes(db: &Path, id: &str) -> String {
    let content = stored_row(db, id).await.content.expect("content stored");
    let content = text(&content);
    let mut rest = content.as_str();
    loop {
        let field_end = rest.find("\r\n").map(|i| i + 2).expect("a header line");
        let mut end = field_end;
        while rest[end..].starts_with([' ', '\t']) {
            end += rest[end..].find("\r\n").unwrap() + 2;
        }
        let field = &rest[..end];
        if field.starts_with("Received:") || field.starts_with("X-Bird-Idempotency-Key: d1-") {
            rest = &rest[end..];
        } else {
            return rest.to_string();
        }
    }
}

fn record_count(db: &Path) -> usize {
    queue_json(db, &["list", "--json"])["messages"]
        .as_array()
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t_takes_to_cc_and_bcc_and_the_bcc_field_is_not_sent() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let input = b"From: App <app@example.com>\n\
To: Ann <ann@example.com>, root\n\
Cc: \"Doe, Bob\" <bob@example.com>\n\
Bcc: hidden@example.com,\n secret@example.com\n\
Subject: t\n\
\n\
Bcc: a body line, not a field\n";
    // -t and a recipient argument: both count, as Postfix's sendmail does.
    let out = sendmail_to(
        relay.addr,
        &[
            "-t",
            "-i",
            "-v",
            "--hostname",
            "sender.test",
            "extra@example.com",
        ],
        input,
    );
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.id();
    let record = show(&db, &id);
    assert_eq!(record["mail_from"], "app@example.com");
    assert_eq!(
        strings(&record["rcpt_to"]),
        [
            "extra@example.com",
            "ann@example.com",
            "root@sender.test",
            "bob@example.com",
            "hidden@example.com",
            "secret@example.com",
        ]
    );
    assert_eq!(
        sent_bytes(&db, &id).await,
        "From: App <app@example.com>\r\n\
To: Ann <ann@example.com>, root\r\n\
Cc: \"Doe, Bob\" <bob@example.com>\r\n\
Subject: t\r\n\
\r\n\
Bcc: a body line, not a field\r\n"
    );

    // Without -t the header names nobody: no recipient is an error, nothing is sent.
    let out = sendmail_to(relay.addr, &["-i"], input);
    assert_eq!(out.code, 64, "{out:?}");
    assert!(out.stderr.contains("no recipients"), "{out:?}");
    // -t and a header without addresses: the message is at fault.
    let out = sendmail_to(
        relay.addr,
        &["-t"],
        b"From: a@example.com\nSubject: x\n\nx\n",
    );
    assert_eq!(out.code, 65, "{out:?}");
    assert_eq!(record_count(&db), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f_sets_the_sender_and_f_name_the_from_field_only_when_missing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);

    // No From: field: sendmail adds one from -f, with -F as the display name.
    let out = sendmail_to(
        relay.addr,
        &[
            "-v",
            "-F",
            "Build Bot",
            "-fbounce@example.com",
            "dev@example.com",
        ],
        b"Subject: build 17\n\nok\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.id();
    assert_eq!(show(&db, &id)["mail_from"], "bounce@example.com");
    assert_eq!(
        sent_bytes(&db, &id).await,
        "Subject: build 17\r\nFrom: \"Build Bot\" <bounce@example.com>\r\n\r\nok\r\n"
    );

    // A From: field is kept as it is; -r is -f.
    let out = sendmail_to(
        relay.addr,
        &[
            "-v",
            "-F",
            "Ignored",
            "-r",
            "bounce@example.com",
            "dev@example.com",
        ],
        b"From: Ann <ann@example.com>\nSubject: s\n\nok\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.id();
    assert_eq!(show(&db, &id)["mail_from"], "bounce@example.com");
    assert_eq!(
        sent_bytes(&db, &id).await,
        "From: Ann <ann@example.com>\r\nSubject: s\r\n\r\nok\r\n"
    );

    // Without -f the envelope sender is the From: address...
    let out = sendmail_to(
        relay.addr,
        &["-v", "dev@example.com"],
        b"From: Ann <ann@example.com>\nSubject: s2\n\nok\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(show(&db, &out.id())["mail_from"], "ann@example.com");

    // ...and without either, the user running sendmail at the configured host name.
    let out = sendmail_to(
        relay.addr,
        &["-v", "--hostname", "sender.test", "dev@example.com"],
        b"Subject: s3\n\nok\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let id = out.id();
    let mail_from = show(&db, &id)["mail_from"].as_str().unwrap().to_string();
    let (login, domain) = mail_from.split_once('@').unwrap();
    assert!(!login.is_empty() && domain == "sender.test", "{mail_from}");
    assert_eq!(
        sent_bytes(&db, &id).await,
        format!("Subject: s3\r\nFrom: {mail_from}\r\n\r\nok\r\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_dot_ends_the_message_unless_i_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let input =
        b"From: a@example.com\r\nSubject: dots\r\n\r\nline 1\r\n..two dots\r\n.\r\nline 3\r\n";

    let out = sendmail_to(relay.addr, &["-v", "r@example.com"], input);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        sent_bytes(&db, &out.id()).await,
        "From: a@example.com\r\nSubject: dots\r\n\r\nline 1\r\n..two dots\r\n"
    );

    // With -i (or -oi) the dot is data: dot-stuffed on the wire, stored as it was read.
    for flag in ["-i", "-oi"] {
        let out = sendmail_to(relay.addr, &["-v", flag, "r@example.com"], input);
        assert_eq!(out.code, 0, "{flag}: {out:?}");
        assert_eq!(
            sent_bytes(&db, &out.id()).await,
            "From: a@example.com\r\nSubject: dots\r\n\r\nline 1\r\n..two dots\r\n.\r\nline 3\r\n",
            "{flag}"
        );
    }
    // The same message with LF line endings is the same message.
    let lf = text(input).replace("\r\n", "\n");
    let out = sendmail_to(relay.addr, &["-v", "-i", "r@example.com"], lf.as_bytes());
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("(idempotent replay)"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bm_and_the_flags_callers_pass_are_accepted_unknown_ones_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let out = sendmail_to(
        relay.addr,
        &[
            "-bm",
            "-odi",
            "-odb",
            "-oem",
            "-oee",
            "-om",
            "-o7",
            "-Am",
            "-Ac",
            "-G",
            "-U",
            "-n",
            "-N",
            "never",
            "-L",
            "app",
            "-X",
            "/dev/null",
            "-O",
            "DeliveryMode=b",
            "-h",
            "5",
            "-R",
            "full",
            "-B8BITMIME",
            "-v",
            "r@example.com",
        ],
        "From: a@example.com\nSubject: flags\n\nsmørrebrød\n".as_bytes(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(show(&db, &out.id())["state"], "queued");

    // Nothing to do: no alias database, no queue of our own to flush.
    for args in [&["-bi"][..], &["-I"], &["-q"], &["-q15m"]] {
        let out = sendmail_to(relay.addr, args, b"");
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
    }
    // Usage errors exit 64 before anything is read or sent.
    for (args, says) in [
        (&["-z", "r@example.com"][..], "unknown option -z"),
        (&["-bs"], "-bs"),
        (&["-bp"], "idemrelay queue list"),
        (&["-V", "r@example.com"], "VERP"),
        (&["-B", "BINARYMIME", "r@example.com"], "-B"),
        (
            &["--no-such-setting", "1", "r@example.com"],
            "no-such-setting",
        ),
        (&["--server", "nowhere", "r@example.com"], "HOST:PORT"),
    ] {
        let out = sendmail_to(relay.addr, args, b"From: a@example.com\n\nx\n");
        assert_eq!(out.code, 64, "{args:?}: {out:?}");
        assert!(out.stderr.contains(says), "{args:?}: {out:?}");
    }
    assert_eq!(record_count(&db), 1);

    let help = sendmail(&["--help"], b"");
    assert_eq!(help.code, 0);
    for line in [
        "-oi",
        "-odi",
        "-oem",
        "Exit status",
        "75",
        "--server HOST:PORT",
    ] {
        assert!(
            help.stdout.contains(line),
            "--help lacks {line:?}:\n{}",
            help.stdout
        );
    }
}

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
