//! Black-box tests of the built `idemrelay` binary: the process is started the way an operator
//! or a supervisor would start it, and is only observed through its socket, its exit status,
//! its stdout/stderr and the SQLite file it leaves behind.

use crate::common;
#[path = "binary/kit.rs"]
mod kit;
#[path = "binary/postfix.rs"]
mod postfix;
#[path = "binary/sendmail.rs"]
mod sendmail;

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use common::process::{idemrelay, serve_args, store_url, RelayProcess};
use common::{corpus, corpus_dir, dot_stuff, message, Client};

/// How long an idle relay may take to exit after SIGTERM (it has nothing to wait for).
const QUICK_EXIT: Duration = Duration::from_secs(5);

/// Starts the relay on `db` and waits until it reports its port. It blocks, but the async
/// tests calling it have nothing else running on their runtime meanwhile.
fn start_relay(db: &Path, extra: &[&str]) -> RelayProcess {
    RelayProcess::spawn(&serve_args(db, extra)).wait_ready()
}

/// Polls until a TCP connect to `addr` is refused. A connect racing the shutdown may still
/// succeed, or be reset when the closing listener drops its backlog, so neither is a failure
/// once; a listener that keeps accepting is.
async fn assert_refuses_connections(addr: SocketAddr, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match tokio::net::TcpStream::connect(addr).await {
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => return,
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => assert!(
                Instant::now() < deadline,
                "{addr} still resets connections {within:?} after SIGTERM"
            ),
            Err(err) => panic!("connect to {addr} failed unexpectedly: {err}"),
            Ok(_) => assert!(
                Instant::now() < deadline,
                "{addr} still accepts connections {within:?} after SIGTERM"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn queued_line(id: &str) -> String {
    format!("250 2.0.0 OK queued as {id}")
}

fn replay_line(id: &str) -> String {
    format!("250 2.0.0 OK queued as {id} (idempotent replay)")
}

const KEY_REUSE_LINE: &str = "554 5.6.0 X-Bird-Idempotency-Key already used for a different message (E01005 IdempotencyKeyReuse); use a new key";

// --- swaks ------------------------------------------------------------------------------

/// Runs the real swaks against the relay and returns its transcript (stdout and stderr).
///
/// swaks stamps Date, Message-Id and a Subject containing the current time into every
/// message; fixing all three is what makes two runs byte-identical, as a retrying client is.
fn swaks(addr: SocketAddr, key: &str, body: Option<&str>) -> (ExitStatus, String) {
    let mut cmd = Command::new("swaks");
    cmd.args(["--server", &addr.to_string()])
        .args(["--helo", "client.test"])
        .args(["--from", "sender@example.com", "--to", "rcpt@example.com"])
        .args(["--header", "Date: Sun, 29 Nov 2026 10:00:00 +0000"])
        .args(["--header", "Message-Id: <fixed@example.com>"])
        .args(["--header", "Subject: swaks replay test"])
        .args(["--header", &format!("X-Bird-Idempotency-Key: {key}")])
        .args(["--timeout", "20"]);
    if let Some(body) = body {
        cmd.args(["--body", body]);
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
            "swaks is not installed (needed by this test): `apt-get install swaks` \
             (CI installs it)"
        ),
        Err(err) => panic!("cannot run swaks: {err}"),
    };
    let transcript = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, transcript)
}

/// The server's reply to the final dot in a swaks transcript. swaks marks server lines with
/// `<-` (or `<**` for errors) and echoes the dot it sent as ` -> .`.
fn swaks_data_reply(transcript: &str) -> String {
    let mut lines = transcript.lines().skip_while(|l| l.trim() != "-> .");
    lines
        .find_map(|l| {
            let l = l.trim_start();
            l.starts_with('<').then(|| {
                l.trim_start_matches(['<', '-', '*', '~'])
                    .trim()
                    .to_string()
            })
        })
        .unwrap_or_else(|| panic!("no reply to the final dot in swaks transcript:\n{transcript}"))
}

// Plain #[test]: everything async here happens in the relay process and in swaks.
#[test]
fn swaks_submits_and_replays() {
    // CI installs swaks and must run this; on a developer machine without it, say so loudly.
    if std::env::var_os("CI").is_none() && Command::new("swaks").arg("--version").output().is_err()
    {
        eprintln!(
            "SKIPPED swaks_submits_and_replays: swaks is not installed (apt-get install -y swaks)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay(&dir.path().join("relay.db"), &[]);

    let (status, first) = swaks(relay.addr, "swaks-key-1", None);
    assert!(status.success(), "swaks failed ({status}):\n{first}");
    let reply = swaks_data_reply(&first);
    let id = reply
        .strip_prefix("250 2.0.0 OK queued as ")
        .unwrap_or_else(|| panic!("not accepted: {reply}\n{first}"))
        .to_string();
    assert!(!id.is_empty() && !id.contains(' '), "{reply}");

    let (status, second) = swaks(relay.addr, "swaks-key-1", None);
    assert!(status.success(), "swaks failed ({status}):\n{second}");
    assert_eq!(swaks_data_reply(&second), replay_line(&id), "{second}");

    let (status, third) = swaks(relay.addr, "swaks-key-1", Some("other"));
    assert!(
        !status.success(),
        "swaks should report the rejection:\n{third}"
    );
    assert_eq!(swaks_data_reply(&third), KEY_REUSE_LINE, "{third}");
}

// --- restarts and signals ----------------------------------------------------------------

enum Stop {
    /// Graceful: the supervisor's normal stop.
    Term,
    /// A crash or OOM kill: nothing runs after the signal.
    Kill,
}

async fn restart_replays_after(stop: Stop) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let msg = message(Some("restart-key"), "before restart", "accepted once");

    let mut relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let first = client
        .submit("sender@example.com", &["rcpt@example.com"], &msg)
        .await;
    let id = first
        .queue_id()
        .unwrap_or_else(|| panic!("not accepted: {first:?}"));
    assert_eq!(first.line(), queued_line(&id));

    match stop {
        Stop::Term => {
            client.quit().await;
            relay.signal("TERM");
            let status = relay.wait_exit(QUICK_EXIT).await;
            assert!(status.success(), "{status}; stderr:\n{}", relay.log());
        }
        Stop::Kill => {
            // The session stays open: the 250 alone must be enough for the record to survive.
            relay.signal("KILL");
            let status = relay.wait_exit(QUICK_EXIT).await;
            assert_eq!(status.signal(), Some(9), "{status}");
            drop(client);
        }
    }

    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let again = client
        .submit("sender@example.com", &["rcpt@example.com"], &msg)
        .await;
    assert_eq!(again.line(), replay_line(&id), "stderr:\n{}", relay.log());

    let changed = message(Some("restart-key"), "before restart", "a different body");
    let reuse = client
        .submit("sender@example.com", &["rcpt@example.com"], &changed)
        .await;
    assert_eq!(reuse.line(), KEY_REUSE_LINE);
    client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replays_a_key_accepted_before() {
    restart_replays_after(Stop::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_sigkill_replays_a_key_accepted_before() {
    restart_replays_after(Stop::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_message_in_progress_finish() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let grace = Duration::from_secs(10);
    let mut relay = start_relay(&db, &["--shutdown-grace", "10s"]);
    let addr = relay.addr;

    let mut idle = Client::ready(addr).await;
    let mut busy = Client::ready(addr).await;
    let msg = message(
        Some("in-flight-key"),
        "finishes during shutdown",
        "first line\r\n.leading dot\r\nlast line",
    );
    assert_eq!(busy.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
    assert_eq!(busy.cmd("RCPT TO:<rcpt@example.com>").await.code, 250);
    assert_eq!(busy.cmd("DATA").await.code, 354);
    let wire = dot_stuff(&msg);
    // Cut inside the dot-stuffed line, so the relay holds whole lines and a partial one.
    let cut = wire
        .windows(7)
        .position(|w| w == b"leading")
        .expect("cut point");
    busy.send(&wire[..cut]).await;

    relay.signal("TERM");

    let bye = idle.read_answer().await.expect("idle session gets a reply");
    assert!(bye.line().starts_with("421 4.3.0 "), "{bye:?}");
    assert!(idle.is_closed().await, "idle session left open");

    // Still inside the grace period with `busy` mid-message: no new sessions.
    assert_refuses_connections(addr, QUICK_EXIT).await;

    busy.send(&wire[cut..]).await;
    let done = busy.read_answer().await.expect("reply to the final dot");
    let id = done
        .queue_id()
        .unwrap_or_else(|| panic!("message in progress was not accepted: {done:?}"));
    assert_eq!(done.line(), queued_line(&id));
    let bye = busy.read_answer().await.expect("421 after the message");
    assert!(bye.line().starts_with("421 4.3.0 "), "{bye:?}");
    assert!(
        busy.is_closed().await,
        "session left open after its message"
    );

    // Exiting once the last session ends, not when the grace period runs out.
    let closed_at = Instant::now();
    let status = relay.wait_exit(grace).await;
    assert!(status.success(), "{status}; stderr:\n{}", relay.log());
    assert!(
        closed_at.elapsed() < QUICK_EXIT,
        "exit took {:?} after the last session ended",
        closed_at.elapsed()
    );
    assert_refuses_connections(addr, Duration::ZERO).await;

    // The 250 given during shutdown was a commit like any other.
    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let again = client
        .submit("sender@example.com", &["rcpt@example.com"], &msg)
        .await;
    assert_eq!(again.line(), replay_line(&id));
    client.quit().await;
}

/// A supervisor may stop the relay the moment it reports readiness; that stop must be as
/// graceful as any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_ready_is_graceful() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..20 {
        let mut relay = start_relay(&dir.path().join("relay.db"), &[]);
        relay.signal("TERM");
        let status = relay.wait_exit(QUICK_EXIT).await;
        assert!(status.success(), "round {round}: {status}");
    }
}

// --- check-config -----------------------------------------------------------------------

fn check_config(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = idemrelay();
    cmd.arg("check-config").args(args);
    for (name, value) in env {
        cmd.env(name, value);
    }
    cmd.output().expect("run idemrelay check-config")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_config_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_url(&dir.path().join("relay.db"));
    let base = ["--store", &store, "--listen", "127.0.0.1:2600"];

    let from_flag = check_config(
        &[&base[..], &["--upstream", "smtp://user:s3cret@host:587"]].concat(),
        &[],
    );
    let from_env = check_config(
        &base,
        &[("IDEMRELAY_UPSTREAM", "smtp://user:s3cret@host:587")],
    );
    for out in [&from_flag, &from_env] {
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{}: {stderr}", out.status);
        assert!(
            stdout.contains("upstream = \"smtp://user:********@host:587\""),
            "{stdout}"
        );
        assert!(
            !stdout.contains("s3cret") && !stderr.contains("s3cret"),
            "password shown:\n{stdout}\n{stderr}"
        );
        assert!(stdout.contains(&format!("store = \"{store}\"")), "{stdout}");
    }
    assert_eq!(from_flag.stdout, from_env.stdout);

    // What check-config prints is itself a valid configuration with the same meaning.
    let file = dir.path().join("effective.toml");
    std::fs::write(&file, &from_flag.stdout).unwrap();
    let reread = check_config(&["--config", file.to_str().unwrap()], &[]);
    assert!(reread.status.success(), "{}", text(&reread.stderr));
    assert_eq!(text(&reread.stdout), text(&from_flag.stdout));
}

#[test]
fn check_config_rejects_bad_settings() {
    let dir = tempfile::tempdir().unwrap();
    let unknown_key = dir.path().join("unknown.toml");
    std::fs::write(&unknown_key, "lisen = [\"127.0.0.1:2600\"]\n").unwrap();
    let bad_value = dir.path().join("bad-value.toml");
    std::fs::write(&bad_value, "retention = \"soon\"\n").unwrap();
    let missing = dir.path().join("missing.toml");

    let cases: &[(&[&str], &[&str])] = &[
        (&["--store", "mysql://x"], &["store", "mysql://x"]),
        (
            &["--config", unknown_key.to_str().unwrap()],
            &["lisen", "unknown.toml"],
        ),
        (
            &["--config", bad_value.to_str().unwrap()],
            &["retention", "bad-value.toml"],
        ),
        (&["--config", missing.to_str().unwrap()], &["missing.toml"]),
        (&["--retention", "soon"], &["--retention"]),
        // A key may not be freed while the upstream may still hold it (docs/concepts/contract.md).
        (&["--retention", "1h"], &["retention", "upstream_window"]),
        (
            &["--parked-retention", "1h"],
            &["parked_retention", "upstream_window"],
        ),
        (&["--listen", "nowhere"], &["--listen"]),
        (&["--scope", ""], &["scope"]),
        // The refusal names the problem without printing the password it refuses.
        (
            &["--upstream", "http://user:s3cret@host:25"],
            &["upstream", "user:********@host"],
        ),
    ];
    for (args, mentions) in cases {
        let out = check_config(args, &[]);
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} accepted:\n{}",
            text(&out.stdout)
        );
        assert!(out.stdout.is_empty(), "{args:?} printed settings anyway");
        for word in *mentions {
            assert!(
                stderr.contains(word),
                "{args:?}: stderr lacks {word:?}:\n{stderr}"
            );
        }
        assert!(
            !stderr.contains("s3cret"),
            "{args:?} leaked the password:\n{stderr}"
        );
    }
}

// --- key derive -------------------------------------------------------------------------

#[derive(Debug, PartialEq, Eq)]
struct Derived {
    key: String,
    source: String,
    fingerprint: String,
}

fn key_derive(file: &Path, from: &str, to: &[&str]) -> Derived {
    let mut cmd = idemrelay();
    cmd.args(["key", "derive"]).arg(file).args(["--from", from]);
    for rcpt in to {
        cmd.args(["--to", rcpt]);
    }
    let out = cmd.output().expect("run idemrelay key derive");
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "key derive {}: {}",
        file.display(),
        text(&out.stderr)
    );
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} in key derive output:\n{stdout}"))
            .to_string()
    };
    Derived {
        key: field("key: "),
        source: field("source: "),
        fingerprint: field("fingerprint: "),
    }
}

/// The header section (up to the first empty line) of a CRLF message.
fn header_lines(msg: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(msg);
    text.split("\r\n")
        .take_while(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn has_field(headers: &[String], name: &str) -> bool {
    headers.iter().any(|l| {
        l.split_once(':')
            .is_some_and(|(n, _)| n.trim_end().eq_ignore_ascii_case(name))
    })
}

/// Corpus messages the relay accepts without a key of their own: a From: field, no key header
/// (malformed/ holds messages meant to be refused).
fn keyless_corpus() -> Vec<(String, Vec<u8>)> {
    corpus()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("malformed/"))
        .filter(|(_, msg)| {
            let headers = header_lines(msg);
            has_field(&headers, "From") && !has_field(&headers, "X-Bird-Idempotency-Key")
        })
        .collect()
}

struct StoredRow {
    idem_key: Option<String>,
    key_source: String,
    fingerprint_hex: String,
    content: Option<Vec<u8>>,
}

async fn stored_row(db: &Path, id: &str) -> StoredRow {
    // Read-only, through a separate connection, while the relay still has the file open.
    let pool = sqlx::SqlitePool::connect(&format!("{}?mode=ro", store_url(db)))
        .await
        .expect("open the relay's database");
    let (idem_key, key_source, fingerprint_hex, content): (
        Option<String>,
        String,
        String,
        Option<Vec<u8>>,
    ) = sqlx::query_as(
        "SELECT idem_key, key_source, lower(hex(fingerprint)), content FROM messages WHERE id = ?",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap_or_else(|e| panic!("no row for {id}: {e}"));
    pool.close().await;
    StoredRow {
        idem_key,
        key_source,
        fingerprint_hex,
        content,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_derive_matches_what_the_relay_stores() {
    const FROM: &str = "a@example.com";
    // The key binds the recipient *set*: order and repeats on the wire must not matter.
    const TO: &[&str] = &["b@example.com", "c@example.com"];
    const RCPT_ON_WIRE: &[&str] = &["c@example.com", "b@example.com", "c@example.com"];
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;

    let messages = keyless_corpus();
    assert!(messages.len() >= 5, "too few usable corpus messages");
    let mut sources = Vec::new();
    for (name, msg) in &messages {
        // What an SMTP client transmits always ends in CRLF before the dot; the file given
        // to `key derive` holds exactly the bytes the relay will receive.
        let mut sent = msg.clone();
        if !sent.ends_with(b"\r\n") {
            sent.extend_from_slice(b"\r\n");
        }
        let crlf_file = dir.path().join("message.eml");
        std::fs::write(&crlf_file, &sent).unwrap();
        let derived = key_derive(&crlf_file, FROM, TO);
        assert!(
            derived.key.starts_with("d1-") && derived.fingerprint.len() == 64,
            "{name}: {derived:?}"
        );

        // Files without a final newline: see key_derive_reads_a_file_without_final_newline_as_sent.
        let raw_file = corpus_dir().join("eml").join(name);
        if std::fs::read(&raw_file).unwrap().ends_with(b"\n") {
            assert_eq!(
                key_derive(&raw_file, FROM, TO),
                derived,
                "{name}: LF vs CRLF file"
            );
        }

        let first = client.submit(FROM, RCPT_ON_WIRE, &sent).await;
        let id = first
            .queue_id()
            .unwrap_or_else(|| panic!("{name} not accepted: {first:?}"));
        assert_eq!(first.line(), queued_line(&id), "{name}");
        let second = client.submit(FROM, RCPT_ON_WIRE, &sent).await;
        assert_eq!(second.line(), replay_line(&id), "{name}");

        let row = stored_row(&db, &id).await;
        assert_eq!(
            row.idem_key.as_deref(),
            Some(derived.key.as_str()),
            "{name}"
        );
        assert_eq!(row.key_source, derived.source, "{name}");
        assert_eq!(row.fingerprint_hex, derived.fingerprint, "{name}");
        let content = row.content.unwrap_or_else(|| panic!("{name}: no content"));
        let inserted: Vec<String> = header_lines(&content)
            .into_iter()
            .filter(|l| l.starts_with("X-Bird-Idempotency-Key:"))
            .collect();
        assert_eq!(
            inserted,
            vec![format!("X-Bird-Idempotency-Key: {}", derived.key)],
            "{name}"
        );
        assert!(content.ends_with(&sent), "{name}: submitted bytes altered");
        sources.push(derived.source);
    }
    client.quit().await;
    for source in ["message-id", "content"] {
        assert!(
            sources.iter().any(|s| s == source),
            "no corpus message exercised source {source}: {sources:?}"
        );
    }
}

/// `key derive` reads its file "as an SMTP client would send it"; a client always ends the
/// content with CRLF before the dot, so a file without a final newline must give the key the
/// relay derives for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_derive_reads_a_file_without_final_newline_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let relay = start_relay(&db, &[]);
    let mut client = Client::ready(relay.addr).await;
    let file = dir.path().join("no-final-newline.eml");
    let msg = b"From: a@example.com\nSubject: no final newline\n\nlast line";
    std::fs::write(&file, msg).unwrap();
    let derived = key_derive(&file, "a@example.com", &["b@example.com"]);
    assert_eq!(derived.source, "content");

    let crlf = common::to_crlf(msg);
    let answer = client
        .submit("a@example.com", &["b@example.com"], &crlf)
        .await;
    let id = answer.queue_id().expect("accepted");
    let row = stored_row(&db, &id).await;
    assert_eq!(row.idem_key.as_deref(), Some(derived.key.as_str()));
    client.quit().await;
}

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

// --- a newcomer's first run ------------------------------------------------------------

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

// --- certificates a real client accepts ----------------------------------

/// The listeners of one kind the relay logged (`listening on ADDR (ImplicitTls)`).
fn logged_listeners(relay: &RelayProcess, kind: &str, count: usize) -> Vec<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = relay.log();
        let found: Vec<SocketAddr> = log
            .lines()
            .filter(|l| l.ends_with(&format!("({kind})")))
            .filter_map(common::process::listening_addr)
            .collect();
        if found.len() >= count {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no {count} {kind} listeners:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `certs generate` put only `localhost` in the certificate, so msmtp refused `host 127.0.0.1`,
/// and its validity (1975-4096) was flagged. With the defaults, msmtp (GnuTLS, verifying
/// against the generated certificate) submits over implicit TLS to 127.0.0.1 and to ::1.
#[test]
fn msmtp_accepts_the_generated_certificate_for_ipv4_and_ipv6_loopback() {
    if Command::new("msmtp").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "msmtp is required in CI (apt-get install -y msmtp)"
        );
        eprintln!("SKIPPED msmtp: msmtp is not installed (apt-get install -y msmtp)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    run_checked(
        idemrelay().args(["certs", "generate", "--out", certs.to_str().unwrap()]),
        None,
    );
    let cert = certs.join("cert.pem");
    let users = dir.path().join("users.toml");
    let password = "correct horse battery staple";
    run_checked(
        idemrelay().args(["user", "add", "alice", "--users", users.to_str().unwrap()]),
        Some(format!("{password}\n").as_bytes()),
    );
    let relay = start_relay(
        &dir.path().join("relay.db"),
        &[
            "--submissions-listen",
            "127.0.0.1:0,[::1]:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            certs.join("key.pem").to_str().unwrap(),
            "--users-file",
            users.to_str().unwrap(),
        ],
    );
    let listeners = logged_listeners(&relay, "ImplicitTls", 2);
    for addr in &listeners {
        let host = addr.ip().to_string();
        let msg = format!(
            "From: app@example.com\r\nTo: user@example.net\r\nSubject: msmtp over {host}\r\n\
             X-Bird-Idempotency-Key: msmtp-{host}\r\n\r\nhello\r\n"
        );
        let out = run_checked(
            Command::new("msmtp").args([
                &format!("--host={host}"),
                &format!("--port={}", addr.port()),
                "--tls=on",
                "--tls-starttls=off",
                &format!("--tls-trust-file={}", cert.display()),
                "--auth=plain",
                "--user=alice",
                &format!("--passwordeval=echo {password}"),
                "--from=app@example.com",
                "--domain=client.test",
                "user@example.net",
            ]),
            Some(msg.as_bytes()),
        );
        assert!(
            out.status.success(),
            "msmtp to {host}: {}",
            text(&out.stderr)
        );
    }
    let listed = queue_json(&dir.path().join("relay.db"), &["list", "--json"]);
    let keys: Vec<&str> = listed["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2, "{listed}");
    assert!(
        keys.contains(&"msmtp-127.0.0.1") && keys.contains(&"msmtp-::1"),
        "{keys:?}"
    );
}

fn run_checked(cmd: &mut Command, stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut input = child.stdin.take().expect("stdin is piped");
    if let Some(bytes) = stdin {
        input.write_all(bytes).expect("write stdin");
    }
    drop(input);
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// `idemrelay queue --direct --store URL ARGS...` → its stdout as JSON.
fn queue_json(db: &Path, args: &[&str]) -> serde_json::Value {
    let out = run_checked(
        idemrelay()
            .args(["queue", "--direct", "--store", &store_url(db)])
            .args(args),
        None,
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("queue {args:?}: not JSON ({e}): {}", text(&out.stdout)))
}
