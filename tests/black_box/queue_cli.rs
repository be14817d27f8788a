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

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod access;
mod bulk_and_listing;
mod records;
mod report;

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

/// `idemrelay ARGS...` with extra environment variables.
async fn run_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = idemrelay();
    cmd.args(args);
    for (name, value) in env {
        cmd.env(name, value);
    }
    run_command(cmd).await
}
