//! Backup and restore of both stores, done the way docs/operations/data.md ("Backup and
//! restore") tells an operator to, with the real tools: the `sqlite3` shell and `rsync` for a
//! SQLite store (the page's own shell lines are run, only the two directories replaced), and
//! `pg_dump -Fc` / `pg_restore` for Postgres. The backup is taken while the built relay runs
//! and goes on accepting; the restored store is then served by a new relay, and has to hold
//! every message acknowledged before the backup began, deliver each one with its bytes intact
//! (large bodies come from the copied spool and pass their checksum), and answer a client's
//! retry of such a message as an idempotent replay, not as a new message.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::process::{idemrelay, RelayProcess};
use common::{message, Client};
use sqlx::{Connection, Executor};

/// Upper bound for any one wait in these tests.
const LIMIT: Duration = Duration::from_secs(60);

const FROM: &str = "sender@example.com";
const TO: &str = "rcpt@example.com";

/// A body this large is spooled by the SQLite store (32 KiB and more, see the page).
const LARGE_BODY: usize = 100 * 1024;

/// A message the relay answered 250.
#[derive(Clone, Debug)]
struct Accepted {
    key: String,
    id: String,
    bytes: Vec<u8>,
}

/// A message under `key`, of about `size` bytes of body in lines of 76 characters; the body
/// differs from key to key so that a mixed-up body is seen.
fn keyed_message(key: &str, size: usize) -> Vec<u8> {
    let seed = blake3::hash(key.as_bytes()).as_bytes()[..8]
        .iter()
        .fold(0u64, |acc, b| acc << 8 | *b as u64);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut body = String::with_capacity(size + 80);
    body.push_str(key);
    body.push_str("\r\n");
    while body.len() < size {
        let line: String = (0..76).map(|_| rng.alphanumeric()).collect();
        body.push_str(&line);
        body.push_str("\r\n");
    }
    message(Some(key), &format!("backup {key}"), &body)
}

/// `idemrelay serve` on port 0 with this store, then `extra`.
fn serve(store: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--hostname",
        "relay.test",
        "--admin",
        "127.0.0.1:0",
        "--store",
        store,
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A relay without an upstream: everything it accepts stays queued.
async fn holding_relay(store: &str) -> RelayProcess {
    RelayProcess::spawn(&serve(store, &[])).ready().await
}

/// A relay delivering to `upstream` at once, retrying soon.
async fn delivering_relay(store: &str, upstream: SocketAddr) -> RelayProcess {
    let upstream = format!("smtp://{upstream}?tls=none");
    let extra = ["--upstream", &upstream, "--retry-base", "50ms"];
    RelayProcess::spawn(&serve(store, &extra)).ready().await
}

async fn submit(addr: SocketAddr, key: &str, size: usize) -> Accepted {
    let bytes = keyed_message(key, size);
    let mut client = Client::ready(addr).await;
    let answer = client.submit(FROM, &[TO], &bytes).await;
    client.quit().await;
    assert_eq!(answer.code, 250, "{key}: {answer:?}");
    Accepted {
        key: key.to_string(),
        id: answer.queue_id().expect("queue id in the 250"),
        bytes,
    }
}

/// Small and large messages, one after the other, all acknowledged when this returns.
async fn submit_before_backup(addr: SocketAddr) -> Vec<Accepted> {
    let mut accepted = Vec::new();
    for i in 0..8 {
        let size = if i % 2 == 0 {
            200
        } else {
            LARGE_BODY + i * 1000
        };
        accepted.push(submit(addr, &format!("before-{i}"), size).await);
    }
    accepted
}

/// A client that goes on submitting (small and large, in turn) until told to stop: the
/// backup is taken while the relay accepts. Returns what it had acknowledged.
struct Traffic {
    stop: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<Accepted>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(addr: SocketAddr) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let (stop, accepted) = (stop.clone(), accepted.clone());
            async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let size = if i % 2 == 0 { 300 } else { LARGE_BODY };
                    let a = submit(addr, &format!("during-{i}"), size).await;
                    accepted.lock().unwrap().push(a);
                    i += 1;
                }
            }
        });
        Traffic {
            stop,
            accepted,
            task,
        }
    }

    fn count(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }

    /// Waits until `n` more messages than now were acknowledged.
    async fn wait_for_more(&self, n: usize) {
        let target = self.count() + n;
        common::eventually(LIMIT, "the relay to go on accepting", || async {
            (self.count() >= target).then_some(())
        })
        .await;
    }

    async fn stop(self) -> Vec<Accepted> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the submitting client panicked");
        Arc::try_unwrap(self.accepted)
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

/// Runs `script` with `sh -e`, panicking with its output unless it succeeds.
fn sh(script: &str) {
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "{script}\nfailed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn require_tool(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "`{tool}` is not installed: docs/operations/data.md backs stores up with it \
         (.ci/run installs it)"
    );
}

// --- the page ------------------------------------------------------------------------------

/// The SQLite backup commands of docs/operations/data.md, as printed there (the ```sh block
/// under "### SQLite").
fn documented_sqlite_backup() -> Vec<String> {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations/data.md");
    let page = std::fs::read_to_string(&page).expect("read docs/operations/data.md");
    let section = &page[page.find("### SQLite").expect("a SQLite section")..];
    let block = &section[section.find("```sh\n").expect("a sh block") + "```sh\n".len()..];
    let block = &block[..block.find("```").expect("the block's end")];
    block.lines().map(str::to_string).collect()
}

/// Which of the two database copies the page offers.
#[derive(Clone, Copy, Debug)]
enum DbCopy {
    /// `sqlite3 idemrelay.db ".backup '...'"`, the command as printed.
    Backup,
    /// `sqlite3 idemrelay.db "VACUUM INTO '...'"`, the alternative in its comment.
    VacuumInto,
}

/// The page's backup, run in `live` (for `/var/lib/idemrelay`) into `backup` (for
/// `/backup`): the database copy, then the spool's.
fn sqlite_backup(live: &Path, backup: &Path, copy: DbCopy) {
    let lines = documented_sqlite_backup();
    assert_eq!(lines.len(), 3, "cd, database copy, spool copy: {lines:?}");
    assert_eq!(lines[0], "cd /var/lib/idemrelay", "{lines:?}");
    let (command, alternative) = lines[1]
        .split_once("# or: ")
        .expect("the database line names VACUUM INTO as the alternative");
    let db_line = match copy {
        DbCopy::Backup => command.trim(),
        DbCopy::VacuumInto => alternative.trim(),
    };
    assert!(
        db_line.starts_with("sqlite3 idemrelay.db ") && lines[2].starts_with("rsync "),
        "{lines:?}"
    );
    let backup = backup.display().to_string();
    let script = [
        format!("cd '{}'", live.display()),
        db_line.replace("/backup/", &format!("{backup}/")),
        lines[2].replace("/backup/", &format!("{backup}/")),
    ]
    .join("\n");
    eprintln!("backup:\n{script}");
    sh(&script);
}

/// The page's restore, with the relay stopped: the database copy in place as `idemrelay.db`,
/// any `-wal` and `-shm` of the database it replaces removed, the spool copy put at
/// `idemrelay.db.spool/`. (The files already belong to the relay's user here.)
fn sqlite_restore(backup: &Path, into: &Path) {
    let script = format!(
        "cd '{into}'
         cp '{backup}/idemrelay.db' idemrelay.db
         rm -f idemrelay.db-wal idemrelay.db-shm
         rm -rf idemrelay.db.spool
         cp -a '{backup}/idemrelay.db.spool' idemrelay.db.spool",
        into = into.display(),
        backup = backup.display()
    );
    sh(&script);
}

// --- the restored store, checked ------------------------------------------------------------

/// `idemrelay queue --direct --store STORE list --json`: id → (key, state).
fn queue_list(store: &str) -> BTreeMap<String, (String, String)> {
    let out = run(idemrelay().args([
        "queue", "--direct", "--store", store, "list", "--limit", "1000", "--json",
    ]));
    let json: serde_json::Value = serde_json::from_str(&out).expect("queue list --json");
    assert_eq!(json["next_cursor"], serde_json::Value::Null, "{json}");
    json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                (
                    m["key"].as_str().unwrap_or_default().to_string(),
                    m["state"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

/// Everything a restored store must show, read while no relay runs on it, then with a relay
/// delivering to a sink: `before` (acknowledged before the backup began) all there and
/// queued; every record in the copy delivered with its bytes (none damaged); a retry of a
/// backed-up message answered as a replay of its record.
async fn check_restored(store: &str, before: &[Accepted], during: &[Accepted]) {
    let listed = queue_list(store);
    for a in before {
        assert_eq!(
            listed.get(&a.id),
            Some(&(a.key.clone(), "queued".to_string())),
            "{} ({}) acknowledged before the backup, not queued in the restored store: {listed:?}",
            a.id,
            a.key
        );
    }
    // Records the copy holds beyond those: accepted while the backup ran.
    let during_ids: BTreeSet<&str> = during.iter().map(|a| a.id.as_str()).collect();
    for (id, (key, _)) in &listed {
        assert!(
            before.iter().any(|a| &a.id == id) || during_ids.contains(id.as_str()),
            "the restored store holds {id} ({key}), which no client was told about"
        );
    }
    eprintln!(
        "restored store: {} records ({} acknowledged before the backup, {} during it)",
        listed.len(),
        before.len(),
        listed.len() - before.len()
    );

    let sink = common::start_sink().await;
    let relay = delivering_relay(store, sink.smtp_addr()).await;
    // A body the copy lacks or that fails its checksum is marked damaged, never sent: that
    // ends the wait at once, with the relay's word for it.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while sink.messages().len() < listed.len() {
        let log = relay.log();
        assert!(
            tokio::time::Instant::now() < deadline && !log.contains("ALERT stored body damaged"),
            "{} of {} restored records delivered; the store now: {:?}\nrelay log:\n{log}",
            sink.messages().len(),
            listed.len(),
            queue_list(store),
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let received: BTreeMap<String, Vec<u8>> = sink
        .messages()
        .into_iter()
        .map(|m| (m.key.clone().expect("keyed"), m.bytes))
        .collect();
    assert_eq!(received.len(), listed.len(), "one copy per record");
    let all: Vec<&Accepted> = before.iter().chain(during).collect();
    for (id, (key, _)) in &listed {
        let sent = all.iter().find(|a| &a.id == id).unwrap();
        let got = received
            .get(key)
            .unwrap_or_else(|| panic!("{id} ({key}) not delivered"));
        // The relay adds its trace header on top; the client's bytes follow unchanged.
        assert!(
            got.ends_with(&sent.bytes),
            "{id} ({key}): the delivered body is not the one submitted ({} bytes submitted, \
             {} delivered)",
            sent.bytes.len(),
            got.len()
        );
    }
    let log = relay.log();
    assert!(!log.contains("ALERT stored body damaged"), "{log}");

    // A client that missed its 250 sends again: the restored store knows the key.
    for a in [&before[0], &before[1]] {
        let mut client = Client::ready(relay.addr).await;
        let answer = client.submit(FROM, &[TO], &a.bytes).await;
        client.quit().await;
        assert_eq!(
            answer.line(),
            format!("250 2.0.0 OK queued as {} (idempotent replay)", a.id),
            "{}",
            a.key
        );
    }
    // Nothing more went upstream.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.messages().len(), listed.len());
    let after = queue_list(store);
    for a in before {
        assert_eq!(after[&a.id].1, "delivered", "{}", a.key);
    }
    drop(relay);
    sink.shutdown().await;
}

// --- SQLite ---------------------------------------------------------------------------------

async fn sqlite_round_trip(copy: DbCopy, restore_in_place: bool) {
    require_tool("sqlite3");
    require_tool("rsync");
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("var-lib-idemrelay");
    let backup = dir.path().join("backup");
    std::fs::create_dir_all(&live).unwrap();
    std::fs::create_dir_all(&backup).unwrap();
    let db = live.join("idemrelay.db");
    let store = format!("sqlite://{}", db.display());

    let relay = holding_relay(&store).await;
    let before = submit_before_backup(relay.addr).await;
    assert!(
        live.join("idemrelay.db.spool").is_dir(),
        "large bodies were spooled"
    );
    let traffic = Traffic::start(relay.addr);
    traffic.wait_for_more(2).await;
    sqlite_backup(&live, &backup, copy);
    traffic.wait_for_more(2).await;
    let during = traffic.stop().await;
    // SIGKILL: the live directory keeps its -wal and -shm, which the in-place restore must
    // remove (they hold commits the copy does not have).
    relay.kill();

    let restored = if restore_in_place {
        assert!(live.join("idemrelay.db-wal").exists());
        live.clone()
    } else {
        let fresh = dir.path().join("restored");
        std::fs::create_dir_all(&fresh).unwrap();
        fresh
    };
    sqlite_restore(&backup, &restored);
    let store = format!("sqlite://{}", restored.join("idemrelay.db").display());
    check_restored(&store, &before, &during).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_online_backup_and_rsync_restore_into_a_fresh_directory() {
    sqlite_round_trip(DbCopy::Backup, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_vacuum_into_and_rsync_restore_over_the_old_store() {
    sqlite_round_trip(DbCopy::VacuumInto, true).await;
}

// --- Postgres -------------------------------------------------------------------------------

/// A database of its own on the server of `IDEMRELAY_TEST_POSTGRES`, dropped when this is.
struct Database {
    admin_url: String,
    name: String,
    url: String,
}

impl Database {
    async fn create(base: &str, tag: &str) -> Database {
        let name = format!("backup_{tag}_{}_{}", std::process::id(), fastrand::u32(..));
        let mut url = url::Url::parse(base).expect("IDEMRELAY_TEST_POSTGRES is a URL");
        let mut conn = sqlx::PgConnection::connect(base).await.unwrap();
        conn.execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .unwrap();
        conn.close().await.unwrap();
        let admin_url = base.to_string();
        url.set_path(&format!("/{name}"));
        Database {
            admin_url,
            name,
            url: url.to_string(),
        }
    }

    async fn drop_now(self) {
        let mut conn = sqlx::PgConnection::connect(&self.admin_url).await.unwrap();
        conn.execute(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name).as_str())
            .await
            .unwrap();
        conn.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pg_dump_and_pg_restore_into_an_empty_database() {
    let test = "backup::postgres_pg_dump_and_pg_restore_into_an_empty_database";
    let Some(base) = common::backend::postgres_or_skip(test) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test} must run under CI: set IDEMRELAY_TEST_POSTGRES"
        );
        return;
    };
    require_tool("pg_dump");
    require_tool("pg_restore");
    let live = Database::create(&base, "live").await;
    let restored = Database::create(&base, "restored").await;
    let dir = tempfile::tempdir().unwrap();
    let dump: PathBuf = dir.path().join("idemrelay.dump");

    let relay = holding_relay(&live.url).await;
    let before = submit_before_backup(relay.addr).await;
    let traffic = Traffic::start(relay.addr);
    traffic.wait_for_more(2).await;
    // docs/operations/data.md: `pg_dump -Fc -d idemrelay -f idemrelay.dump` while the relays
    // run, `pg_restore -d idemrelay idemrelay.dump` into an empty database.
    run(Command::new("pg_dump")
        .args(["-Fc", "-d", &live.url, "-f"])
        .arg(&dump));
    traffic.wait_for_more(2).await;
    let during = traffic.stop().await;
    relay.kill();
    run(Command::new("pg_restore")
        .args(["-d", &restored.url])
        .arg(&dump));

    check_restored(&restored.url, &before, &during).await;
    live.drop_now().await;
    restored.drop_now().await;
}
