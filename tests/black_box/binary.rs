//! Black-box tests of the built `idemrelay` binary: the process is started the way an operator
//! or a supervisor would start it, and is only observed through its socket, its exit status,
//! its stdout/stderr and the SQLite file it leaves behind.

use crate::common;
mod kit;
mod postfix;
mod sendmail;

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use common::process::{idemrelay, serve_args, store_url, RelayProcess};
use common::{corpus, corpus_dir, dot_stuff, message, Client};

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod certificates;
mod config_check;
mod first_run;
mod key_derive;
mod logs;
mod restarts;
mod swaks;

/// How long an idle relay may take to exit after SIGTERM (it has nothing to wait for).
const QUICK_EXIT: Duration = Duration::from_secs(5);

/// Starts the relay on `db` and waits until it reports its port. It blocks, but the async
/// tests calling it have nothing else running on their runtime meanwhile.
fn start_relay(db: &Path, extra: &[&str]) -> RelayProcess {
    RelayProcess::spawn(&serve_args(db, extra)).wait_ready()
}

fn queued_line(id: &str) -> String {
    format!("250 2.0.0 OK queued as {id}")
}

fn replay_line(id: &str) -> String {
    format!("250 2.0.0 OK queued as {id} (idempotent replay)")
}

const KEY_REUSE_LINE: &str = "554 5.6.0 X-Bird-Idempotency-Key already used for a different message (E01005 IdempotencyKeyReuse); use a new key";

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
