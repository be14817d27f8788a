//! Black-box tests of the built `idemrelay` binary: the process is started the way an operator
//! or a supervisor would start it, and is only observed through its socket, its exit status,
//! its stdout/stderr and the SQLite file it leaves behind.

mod common;

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
    sink.set_faults(vec![idemrelay::sink::FaultRule::reply(
        idemrelay::sink::Phase::Rcpt,
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
    let log = common::eventually(Duration::from_secs(20), "three attempt events", || {
        let log = process.log();
        async move { (log.matches("\"message\":\"attempt\"").count() >= 3).then_some(log) }
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
    assert!(f["latency_ms"].is_u64(), "{f}");
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
        .args(["queue", "list"])
        .output()
        .unwrap();
    let out = text(&listed.stdout);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert_eq!(out.matches("queued").count(), 2, "{out}");
}
