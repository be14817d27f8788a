//! The submission listeners with real TLS clients: swaks drives STARTTLS + AUTH on the 587-style
//! listener and implicit TLS + AUTH on the 465-style one, with a certificate made at test time.

use crate::common;

use std::net::SocketAddr;
use std::process::Command;

use common::{Client, TestRelay};
use idemrelay::auth::Users;

struct TlsRelay {
    relay: TestRelay,
    plain: SocketAddr,
    submission: SocketAddr,
    submissions: SocketAddr,
}

async fn tls_relay() -> TlsRelay {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = idemrelay::smtp::tls::generate_self_signed(
        &dir.path().join("certs"),
        &["localhost".into()],
    )
    .unwrap();
    let users = dir.path().join("users.toml");
    Users::add_user(
        &users,
        "alice",
        "correct horse",
        "tenant-alice",
        &["@example.com".into()],
    )
    .unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.submission_listen = vec!["127.0.0.1:0".parse().unwrap()];
    settings.submissions_listen = vec!["127.0.0.1:0".parse().unwrap()];
    settings.tls_cert = Some(cert);
    settings.tls_key = Some(key);
    settings.users_file = Some(users);
    settings.submission_greet_delay = std::time::Duration::ZERO;
    settings.auth_failure_delay = std::time::Duration::from_millis(50);
    let relay = TestRelay::start_in(dir, settings).await;
    let addrs = relay.relay.local_addrs().to_vec();
    TlsRelay {
        plain: addrs[0],
        submission: addrs[1],
        submissions: addrs[2],
        relay,
    }
}

/// swaks, and its transcript. CI installs swaks; without it on a developer machine, skip.
fn swaks(args: &[&str]) -> Option<String> {
    let out = match Command::new("swaks").args(args).output() {
        Ok(out) => out,
        Err(_) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED: swaks is not installed (apt-get install -y swaks)");
            return None;
        }
        Err(err) => panic!("swaks is required in CI: {err}"),
    };
    Some(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

fn base_args(addr: SocketAddr, key: &str) -> Vec<String> {
    [
        "--server",
        &addr.to_string(),
        "--helo",
        "client.test",
        "--from",
        "app@example.com",
        "--to",
        "user@example.net",
        "--header",
        &format!("X-Bird-Idempotency-Key: {key}"),
        "--timeout",
        "20",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run(args: Vec<String>) -> Option<String> {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    swaks(&refs)
}

fn queued_id(transcript: &str) -> Option<String> {
    transcript
        .lines()
        .find_map(|l| l.split("250 2.0.0 OK queued as ").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap().to_string())
}

fn auth_args(mut args: Vec<String>) -> Vec<String> {
    args.extend(
        [
            "--auth",
            "PLAIN",
            "--auth-user",
            "alice",
            "--auth-password",
            "correct horse",
        ]
        .map(String::from),
    );
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaks_starttls_and_auth_on_the_submission_listener() {
    let r = tls_relay().await;
    let mut args = auth_args(base_args(r.submission, "tls-starttls-1"));
    args.push("--tls".into());
    let Some(out) = tokio::task::spawn_blocking(move || run(args))
        .await
        .unwrap()
    else {
        return;
    };
    let id = queued_id(&out).unwrap_or_else(|| panic!("not queued:\n{out}"));
    assert!(out.contains("STARTTLS"), "{out}");
    assert!(out.contains("235 2.7.0"), "{out}");
    let stored = r.relay.stored(&id).await;
    // The authenticated user's scope, and an ESMTPSA trace line (RFC 3848).
    assert_eq!(stored.scope, "tenant-alice");
    let content = String::from_utf8_lossy(stored.content.as_ref().unwrap()).to_string();
    assert!(content.contains("with ESMTPSA id"), "{content}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaks_implicit_tls_and_auth_on_the_submissions_listener() {
    let r = tls_relay().await;
    let mut args = auth_args(base_args(r.submissions, "tls-implicit-1"));
    args.push("--tlsc".into());
    let Some(out) = tokio::task::spawn_blocking(move || run(args))
        .await
        .unwrap()
    else {
        return;
    };
    let id = queued_id(&out).unwrap_or_else(|| panic!("not queued:\n{out}"));
    assert_eq!(r.relay.stored(&id).await.scope, "tenant-alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_open_relay_without_auth_from_outside_the_allow_list() {
    let r = tls_relay().await;
    // Over TLS but without AUTH: refused.
    let mut args = base_args(r.submission, "tls-noauth-1");
    args.push("--tls".into());
    let Some(out) = tokio::task::spawn_blocking(move || run(args))
        .await
        .unwrap()
    else {
        return;
    };
    assert!(out.contains("530 5.7.0 Authentication required"), "{out}");
    assert!(queued_id(&out).is_none());
    // Wrong password: 535 after a delay.
    let mut args = base_args(r.submission, "tls-badauth-1");
    args.extend(
        [
            "--tls",
            "--auth",
            "PLAIN",
            "--auth-user",
            "alice",
            "--auth-password",
            "wrong",
        ]
        .map(String::from),
    );
    let out = tokio::task::spawn_blocking(move || run(args))
        .await
        .unwrap()
        .unwrap();
    assert!(out.contains("535 5.7.8"), "{out}");
    // A sender the user may not use.
    let mut args = auth_args(base_args(r.submission, "tls-sender-1"));
    args.push("--tls".into());
    for a in args.iter_mut() {
        if a == "app@example.com" {
            *a = "app@elsewhere.test".into();
        }
    }
    let out = tokio::task::spawn_blocking(move || run(args))
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.contains("550 5.7.1 Sender address not allowed"),
        "{out}"
    );
    assert_eq!(r.relay.count("messages").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_tls_the_submission_listener_refuses_mail_and_auth() {
    let r = tls_relay().await;
    let mut c = Client::ready(r.submission).await;
    assert_eq!(
        c.cmd("MAIL FROM:<app@example.com>").await.line(),
        "530 5.7.0 Must issue a STARTTLS command first"
    );
    assert_eq!(
        c.cmd("AUTH PLAIN AGFsaWNlAGNvcnJlY3QgaG9yc2U=")
            .await
            .line(),
        "538 5.7.11 Encryption required for requested authentication mechanism"
    );
    c.quit().await;
    // The plain listener is for the allow-list (loopback here): no AUTH needed.
    let mut c = Client::ready(r.plain).await;
    let answer = c
        .submit(
            "app@example.com",
            &["user@example.net"],
            &common::message(Some("plain-1"), "s", "b"),
        )
        .await;
    assert_eq!(answer.code, 250);
    assert_eq!(
        r.relay.stored(&answer.queue_id().unwrap()).await.scope,
        "default"
    );
}

async fn read_reply<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    // One whole reply: lines until one with a space after the code.
    loop {
        let n = tokio::time::timeout(common::TIMEOUT, stream.read(&mut byte))
            .await
            .expect("reply in time")
            .unwrap();
        if n == 0 {
            break;
        }
        got.push(byte[0]);
        if got.ends_with(b"\r\n") {
            let text = String::from_utf8_lossy(&got).to_string();
            let last = text
                .trim_end()
                .rsplit("\r\n")
                .next()
                .unwrap_or("")
                .to_string();
            if last.as_bytes().get(3) == Some(&b' ') {
                return text;
            }
        }
    }
    String::from_utf8_lossy(&got).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_injected_after_starttls_is_not_obeyed() {
    use tokio::io::AsyncWriteExt;
    let r = tls_relay().await;
    let cert = r.relay.settings.tls_cert.clone().unwrap();
    let mut tcp = tokio::net::TcpStream::connect(r.submission).await.unwrap();
    assert!(read_reply(&mut tcp).await.starts_with("220 "));
    tcp.write_all(b"EHLO attacker.test\r\n").await.unwrap();
    assert!(read_reply(&mut tcp).await.contains("STARTTLS"));
    // The injected commands ride in the same packet as STARTTLS.
    tcp.write_all(b"STARTTLS\r\nRSET\r\nMAIL FROM:<app@example.com>\r\n")
        .await
        .unwrap();
    assert!(read_reply(&mut tcp).await.starts_with("220 2.0.0"));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = common::connector_trusting(&cert)
        .connect(name, tcp)
        .await
        .unwrap();
    tls.write_all(b"NOOP\r\n").await.unwrap();
    // Had RSET/MAIL been kept, their replies would come first.
    assert_eq!(read_reply(&mut tls).await, "250 2.0.0 OK\r\n");
    tls.write_all(b"MAIL FROM:<app@example.com>\r\n")
        .await
        .unwrap();
    assert!(
        read_reply(&mut tls).await.starts_with("503 5.5.1"),
        "EHLO is forgotten after TLS"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_served_without_a_restart() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let (cert, key) =
        idemrelay::smtp::tls::generate_self_signed(&certs, &["localhost".into()]).unwrap();
    let first = std::fs::read(&cert).unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.submissions_listen = vec!["127.0.0.1:0".parse().unwrap()];
    settings.tls_cert = Some(cert.clone());
    settings.tls_key = Some(key);
    settings.submission_greet_delay = std::time::Duration::ZERO;
    settings.tls_reload_interval = std::time::Duration::from_millis(100);
    let relay = TestRelay::start_in(dir, settings).await;
    let addr = relay.relay.local_addrs()[1];
    let handshake = |trust: std::path::PathBuf| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        common::connector_trusting(&trust).connect(name, tcp).await
    };
    let old_copy = relay.dir.path().join("old.pem");
    std::fs::write(&old_copy, &first).unwrap();
    let mut tls = handshake(old_copy.clone())
        .await
        .expect("first certificate served");
    assert!(read_reply(&mut tls).await.starts_with("220 "));
    tls.shutdown().await.ok();
    // Renew in place (as an ACME client would); the relay picks it up by itself.
    std::thread::sleep(std::time::Duration::from_millis(20));
    idemrelay::smtp::tls::generate_self_signed(
        &relay.dir.path().join("certs"),
        &["localhost".into()],
    )
    .unwrap();
    assert_ne!(std::fs::read(&cert).unwrap(), first);
    common::eventually(
        std::time::Duration::from_secs(10),
        "the new certificate",
        || {
            let cert = cert.clone();
            async move { handshake(cert).await.ok().map(|_| ()) }
        },
    )
    .await;
    assert!(
        handshake(old_copy).await.is_err(),
        "old certificate still served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleartext_auth_is_only_for_allow_listed_clients() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    Users::add_user(&users, "alice", "correct horse", "tenant-alice", &[]).unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.users_file = Some(users);
    settings.allow_networks = vec!["10.0.0.0/8".parse().unwrap()];
    let relay = TestRelay::start_in(dir, settings).await;
    let mut c = Client::ready(relay.addr).await;
    let ehlo = c.cmd("EHLO attacker.example").await;
    assert!(
        !ehlo.lines.iter().any(|l| l.starts_with("AUTH")),
        "{ehlo:?}"
    );
    assert_eq!(
        c.cmd("AUTH PLAIN AGFsaWNlAGNvcnJlY3QgaG9yc2U=")
            .await
            .line(),
        "538 5.7.11 Encryption required for requested authentication mechanism"
    );
    assert_eq!(
        c.cmd("MAIL FROM:<a@example.com>").await.line(),
        "530 5.7.0 Authentication required"
    );
    c.quit().await;
    assert_eq!(relay.count("messages").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_limited_across_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    Users::add_user(&users, "alice", "correct horse", "tenant-alice", &[]).unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.users_file = Some(users);
    settings.auth_failure_delay = std::time::Duration::from_millis(10);
    // Allow-listed loopback on the plain listener may AUTH in cleartext.
    let relay = TestRelay::start_in(dir, settings).await;
    // base64("\0alice\0wrong")
    let wrong = "AUTH PLAIN AGFsaWNlAHdyb25n";
    for _ in 0..10 {
        let mut c = Client::ready(relay.addr).await;
        assert_eq!(
            c.cmd(wrong).await.line(),
            "535 5.7.8 Authentication credentials invalid"
        );
        c.quit().await;
    }
    // A new connection does not start over: the client is turned away, even with the right
    // password, until the window passes.
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(
        c.cmd("AUTH PLAIN AGFsaWNlAGNvcnJlY3QgaG9yc2U=")
            .await
            .line(),
        "421 4.7.0 Too many authentication failures; closing connection"
    );
    assert!(c.is_closed().await);
}

/// `AUTH PLAIN` with an initial response for `user` and `password`.
use common::auth_plain;

const AUTH_FAILED: &str = "535 5.7.8 Authentication credentials invalid";
const LOCKED_OUT: &str = "421 4.7.0 Too many authentication failures; closing connection";

/// A relay on the plain listener (allow-listed loopback may AUTH in cleartext) with users
/// alice and bob; `tune` adjusts the settings.
async fn relay_with_alice_and_bob(
    tune: impl FnOnce(&mut idemrelay::config::Settings),
) -> TestRelay {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    Users::add_user(&users, "alice", "correct horse", "tenant-alice", &[]).unwrap();
    Users::add_user(&users, "bob", "battery staple", "tenant-bob", &[]).unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.users_file = Some(users);
    settings.auth_failure_delay = std::time::Duration::from_millis(10);
    tune(&mut settings);
    TestRelay::start_in(dir, settings).await
}

/// Wrong passwords for `user`, on as many connections as the per-connection limit makes
/// necessary, until an AUTH is refused before its password is checked; returns the failures
/// counted before that. A `421` is a failure when it ends a connection at `max_auth_failures`
/// attempts (the session's own limit), and the lockout when it comes earlier.
async fn fail_until_locked_out(relay: &TestRelay, user: &str) -> usize {
    let per_connection = relay.settings.max_auth_failures;
    let wrong = auth_plain(user, "wrong password");
    let mut failures = 0;
    for _ in 0..100 {
        let mut c = Client::ready(relay.addr).await;
        for attempt in 1..=per_connection {
            let line = c.cmd(&wrong).await.line();
            if line == AUTH_FAILED {
                failures += 1;
                continue;
            }
            assert_eq!(line, LOCKED_OUT, "{user} after {failures} failures");
            assert!(c.is_closed().await);
            if attempt < per_connection {
                return failures;
            }
            failures += 1;
        }
    }
    panic!("{user} was never locked out");
}

/// One program with a wrong password must not lock out every other program on
/// its host. Failures count per (client address, user name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_out_user_does_not_lock_out_other_users_on_the_same_host() {
    // The defaults: 3 failures per connection, 10 per (client, name), 50 per client.
    let relay = relay_with_alice_and_bob(|_| {}).await;
    assert_eq!(fail_until_locked_out(&relay, "alice").await, 10);

    // bob, from the same address, on a new connection, logs in and submits.
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(
        c.cmd(&auth_plain("bob", "battery staple")).await.line(),
        "235 2.7.0 Authentication successful"
    );
    let reply = c
        .submit(
            "bob@example.com",
            &["user@example.net"],
            &common::message(Some("lockout-bob-1"), "from bob", "bob still gets through"),
        )
        .await;
    assert_eq!(reply.code, 250, "{reply:?}");
    let id = reply.queue_id().expect("queue id");
    c.quit().await;
    assert_eq!(relay.stored(&id).await.scope, "tenant-bob");

    // alice is still refused, even with the right password, and bob's success changed nothing
    // for her.
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(
        c.cmd(&auth_plain("alice", "correct horse")).await.line(),
        LOCKED_OUT
    );
    assert!(c.is_closed().await);

    // bob's own wrong password now and then does not lock him out either.
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(c.cmd(&auth_plain("bob", "typo")).await.line(), AUTH_FAILED);
    assert_eq!(
        c.cmd(&auth_plain("bob", "battery staple")).await.line(),
        "235 2.7.0 Authentication successful"
    );
    c.quit().await;
}

/// The looser per-address cap: a client trying many user names (each a few times, never
/// reaching the per-name limit) is still stopped, for every name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cycling_through_user_names_is_stopped_by_the_per_address_cap() {
    let relay = relay_with_alice_and_bob(|s| {
        s.max_auth_failures_per_user = 3;
        s.max_auth_failures_per_ip = 8;
    })
    .await;
    // Two failures per name (under the per-name limit of 3), a new name every time.
    let mut failures = 0;
    let mut names = (0..).map(|i| format!("guess{i}"));
    let stopped_at = loop {
        let name = names.next().unwrap();
        let mut c = Client::ready(relay.addr).await;
        let mut refused = false;
        for _ in 0..2 {
            let line = c.cmd(&auth_plain(&name, "password1")).await.line();
            if line == LOCKED_OUT {
                refused = true;
                break;
            }
            assert_eq!(line, AUTH_FAILED, "{name} after {failures} failures");
            failures += 1;
        }
        if refused {
            assert!(c.is_closed().await);
            break failures;
        }
        c.quit().await;
        assert!(failures < 100, "never stopped");
    };
    assert_eq!(stopped_at, 8, "stopped after the per-address cap");
    // A name never tried before, and a real user with the right password: refused too, since
    // the client as a whole is over its cap.
    for (user, password) in [("fresh-name", "x"), ("bob", "battery staple")] {
        let mut c = Client::ready(relay.addr).await;
        assert_eq!(
            c.cmd(&auth_plain(user, password)).await.line(),
            LOCKED_OUT,
            "{user}"
        );
        assert!(c.is_closed().await);
    }
}

/// RFC 3207: STARTTLS takes no parameters; with one it is a syntax error, and the plain
/// session goes on (a later STARTTLS still works).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_with_a_parameter_gets_501() {
    let r = tls_relay().await;
    let mut c = Client::ready(r.submission).await;
    for line in ["STARTTLS now", "STARTTLS =", "starttls x y"] {
        let a = c.cmd(line).await;
        assert!(a.line().starts_with("501 5.5.4 "), "{line}: {a:?}");
    }
    assert_eq!(
        c.cmd("STARTTLS").await.line(),
        "220 2.0.0 Ready to start TLS"
    );
}
