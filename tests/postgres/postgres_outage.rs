//! Postgres going away under load: the relay's role loses its login and its sessions are
//! terminated while clients keep submitting. No 250 may be given for anything not committed,
//! clients get E01033 (451 at the dot, 421 4.3.2 at connect), and service comes back by itself
//! when the database does.
//!
//! Skips (saying so) unless `IDEMRELAY_TEST_POSTGRES` names a database whose user may create
//! roles.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{backend, message, Client, TestRelay};
use sqlx::{Connection, Executor};

pub(crate) const E01033_AT_DOT: &str = "451 4.3.0 idempotency store unavailable; message not accepted, retry later (E01033 IdempotencyUnavailable)";
pub(crate) const E01033_AT_CONNECT: &str =
    "421 4.3.2 idempotency store unavailable; try again later (E01033 IdempotencyUnavailable)";

async fn admin(base: &str) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(base).await.unwrap()
}

/// A role of its own that owns a fresh schema; returns (role, URL connecting as it).
async fn own_role(base: &str) -> (String, String) {
    let role = format!("idemrelay_t_{}_{}", std::process::id(), fastrand::u32(..));
    let mut conn = admin(base).await;
    conn.execute(format!("CREATE ROLE {role} LOGIN").as_str())
        .await
        .unwrap();
    conn.execute(format!("CREATE SCHEMA {role} AUTHORIZATION {role}").as_str())
        .await
        .unwrap();
    let mut url = url::Url::parse(base).unwrap();
    url.set_username(&role).unwrap();
    url.set_password(None).unwrap();
    url.query_pairs_mut()
        .append_pair("options[search_path]", &role);
    (role, url.to_string())
}

async fn cut_off(base: &str, role: &str) {
    let mut conn = admin(base).await;
    conn.execute(format!("ALTER ROLE {role} NOLOGIN").as_str())
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1")
        .bind(role)
        .execute(&mut conn)
        .await
        .unwrap();
}

async fn restore(base: &str, role: &str) {
    admin(base)
        .await
        .execute(format!("ALTER ROLE {role} LOGIN").as_str())
        .await
        .unwrap();
}

/// The relay keeps a connection per intake writer between batches. Postgres ending those
/// connections while they are idle (a server restart, a cut link, an administrator) costs no
/// client a refusal: the next message on each is written on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idemrelay_test_postgres),
    ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
)]
async fn connections_postgres_ended_while_idle_cost_no_client_a_refusal() {
    let Some(base) = backend::postgres_or_skip("postgres_outage") else {
        return;
    };
    let (role, url) = own_role(&base).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.store = idemrelay::config::SecretUrl(url);
    let relay = TestRelay::start_in(dir, settings).await;
    let submit = |key: String| async move {
        let msg = message(Some(&key), "idle", "body");
        Client::try_submit(
            relay.addr,
            "sender@example.com",
            &["rcpt@example.com"],
            &msg,
        )
        .await
        .map(|a| a.line())
    };
    // One after another, so that every intake writer has taken (and keeps) a connection.
    for n in 0..6 {
        let line = submit(format!("idle-before-{n}")).await.expect("a reply");
        assert!(line.starts_with("250 "), "{line}");
    }
    let mut conn = admin(&base).await;
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
    )
    .bind(&role)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(ended.len() >= 2, "the relay's connections: {ended:?}");
    for n in 0..6 {
        let line = submit(format!("idle-after-{n}")).await.expect("a reply");
        assert!(
            line.starts_with("250 "),
            "message {n} after the cut: {line}"
        );
    }
}

#[derive(Debug, Default)]
struct Seen {
    /// key → queue id, for every 250.
    accepted: BTreeMap<String, String>,
    /// Replies to the final dot that were not 250, and greetings that were not 220.
    refused: Vec<String>,
    /// Connections that failed or closed before a reply.
    dropped: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(idemrelay_test_postgres),
    ignore = "set IDEMRELAY_TEST_POSTGRES=postgres://USER@HOST/DB to run it"
)]
async fn losing_postgres_under_load_gives_no_250_without_a_commit_and_recovers() {
    let Some(base) = backend::postgres_or_skip("postgres_outage") else {
        return;
    };
    let (role, url) = own_role(&base).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.store = idemrelay::config::SecretUrl(url);
    settings.store_busy_timeout = Duration::from_millis(500);
    settings.store_probe_interval = Duration::from_millis(100);
    let relay = TestRelay::start_in(dir, settings).await;

    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..6 {
        let (seen, stop, addr) = (seen.clone(), stop.clone(), relay.addr);
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let key = format!("outage-{c}-{n}");
                let msg = message(Some(&key), "outage", "body");
                let answer =
                    Client::try_submit(addr, "sender@example.com", &["rcpt@example.com"], &msg)
                        .await;
                {
                    let mut seen = seen.lock().unwrap();
                    match answer {
                        Some(a) if a.code == 250 => {
                            let id = a.queue_id().expect("queue id");
                            seen.accepted.insert(key, id);
                        }
                        Some(a) => seen.refused.push(a.line()),
                        None => seen.dropped += 1,
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(800)).await;
    let before = seen.lock().unwrap().accepted.len();
    assert!(before > 0, "nothing accepted before the outage");
    cut_off(&base, &role).await;
    let cut_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let during = {
        let seen = seen.lock().unwrap();
        (seen.accepted.len(), seen.refused.clone())
    };
    restore(&base, &role).await;

    // Service resumes by itself: new connections are greeted again and accepted.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_c, greeting) = Client::connect(relay.addr).await;
        if greeting.code == 220 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {greeting:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let seen = Arc::try_unwrap(seen).unwrap().into_inner().unwrap();
    assert!(
        seen.accepted.len() > during.0,
        "nothing accepted after the database came back"
    );

    // The clients were told the store was unavailable, at the dot and at connect.
    assert!(
        during.1.iter().any(|l| l == E01033_AT_DOT),
        "no E01033 at the dot during the outage: {:?}",
        during.1
    );
    assert!(
        during.1.iter().any(|l| l == E01033_AT_CONNECT),
        "no 421 4.3.2 at connect during the outage: {:?}",
        during.1
    );
    for line in &seen.refused {
        assert!(
            line == E01033_AT_DOT || line == E01033_AT_CONNECT,
            "unexpected refusal {line:?}"
        );
    }

    // Every 250 has its committed record, under the id the client was given.
    let mut conn = admin(&base).await;
    let stored: Vec<(String, String)> =
        sqlx::query_as(&format!("SELECT idem_key, id FROM {role}.messages"))
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let stored: BTreeMap<String, String> = stored.into_iter().collect();
    for (key, id) in &seen.accepted {
        assert_eq!(
            stored.get(key),
            Some(id),
            "{key} was answered 250 but not committed"
        );
    }
    // Anything else stored was refused (or cut off) after its commit: a retry replays it.
    let unanswered = stored.len() - seen.accepted.len();
    eprintln!(
        "postgres_outage: {} accepted ({before} before the cut, {} while it was being made, \
         the rest after the restore), outage {:?}, {} refused with E01033, \
         {} connections dropped, {unanswered} committed without a 250",
        seen.accepted.len(),
        during.0 - before,
        cut_at.elapsed(),
        seen.refused.len(),
        seen.dropped
    );
}
