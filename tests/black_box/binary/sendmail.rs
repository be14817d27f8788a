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
use super::{common, logged_listeners, queue_json, start_relay, stored_row, text};

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod flags;
mod replies;
mod transport;

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
