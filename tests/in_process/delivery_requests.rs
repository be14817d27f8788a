//! The intake side of DSN (RFC 3461), REQUIRETLS (RFC 8689) and LIMITS (RFC 9422) over real
//! sockets: what EHLO offers, each parameter taken or refused, the requests stored with the
//! record and handed to delivery in the claim, replays and conflicts, split messages, and
//! MAILMAX. msmtp drives its DSN options as a real client would.

use crate::common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{message, Answer, Client, TestRelay};
use idemrelay::mail::requests::{NotifyOn, RecipientRequests, Ret};
use idemrelay::mail::DeliveryRequests;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const E01005: &str = "554 5.6.0 X-Bird-Idempotency-Key already used for a different message (E01005 IdempotencyKeyReuse); use a new key";
const REQUIRETLS_BEFORE_TLS: &str =
    "530 5.7.10 REQUIRETLS needs a TLS session; send STARTTLS first";

/// MAIL (with its parameters), RCPTs (each with its own), DATA; every step but the last must
/// be 250. Returns the answer to the final dot.
async fn submit_with(c: &mut Client, mail: &str, rcpts: &[&str], msg: &[u8]) -> Answer {
    let m = c.cmd(&format!("MAIL FROM:<app@example.com>{mail}")).await;
    assert_eq!(m.code, 250, "{mail}: {m:?}");
    for rcpt in rcpts {
        let r = c.cmd(&format!("RCPT TO:{rcpt}")).await;
        assert_eq!(r.code, 250, "{rcpt}: {r:?}");
    }
    c.data(msg).await
}

async fn submit_once(relay: &TestRelay, mail: &str, rcpts: &[&str], msg: &[u8]) -> Answer {
    let mut c = Client::ready(relay.addr).await;
    let answer = submit_with(&mut c, mail, rcpts, msg).await;
    c.quit().await;
    answer
}

fn ehlo_has(answer: &Answer, line: &str) -> bool {
    answer.lines.iter().any(|l| l == line)
}

#[tokio::test]
async fn ehlo_offers_dsn_and_limits_as_enforced() {
    let relay = TestRelay::start_with(|s| {
        s.max_recipients = 7;
        s.max_transactions = 12;
    })
    .await;
    let (mut c, _) = Client::connect(relay.addr).await;
    let ehlo = c.cmd("EHLO client.test").await;
    assert!(ehlo_has(&ehlo, "DSN"), "{ehlo:?}");
    assert!(ehlo_has(&ehlo, "LIMITS MAILMAX=12 RCPTMAX=7"), "{ehlo:?}");
    assert!(!ehlo_has(&ehlo, "REQUIRETLS"), "not before TLS: {ehlo:?}");
    // RCPTMAX is the limit the relay enforces.
    assert_eq!(c.cmd("MAIL FROM:<app@example.com>").await.code, 250);
    for n in 0..7 {
        assert_eq!(
            c.cmd(&format!("RCPT TO:<r{n}@example.net>")).await.code,
            250
        );
    }
    assert_eq!(
        c.cmd("RCPT TO:<r7@example.net>").await.line(),
        "452 4.5.3 Too many recipients"
    );
    c.quit().await;
}

#[tokio::test]
async fn each_parameter_is_taken_stored_and_handed_to_delivery() {
    let relay = TestRelay::start().await;
    let msg = message(Some("dsn-all-1"), "hello", "body");
    let answer = submit_once(
        &relay,
        " RET=HDRS ENVID=QQ+2B314",
        &[
            "<a@example.net> NOTIFY=SUCCESS,DELAY ORCPT=rfc822;a+2Bx@example.net",
            "<b@example.net> NOTIFY=NEVER",
            "<c@example.net>",
        ],
        &msg,
    )
    .await;
    let id = answer.queue_id().unwrap_or_else(|| panic!("{answer:?}"));
    let stored = relay.stored(&id).await;
    let want = {
        let mut r = DeliveryRequests {
            ret: Some("HDRS".into()),
            envid: Some("QQ+2B314".into()),
            ..Default::default()
        };
        r.recipients.insert(
            "a@example.net".into(),
            RecipientRequests {
                notify: Some("SUCCESS,DELAY".into()),
                orcpt: Some("rfc822;a+2Bx@example.net".into()),
            },
        );
        r.recipients.insert(
            "b@example.net".into(),
            RecipientRequests {
                notify: Some("NEVER".into()),
                orcpt: None,
            },
        );
        r
    };
    assert_eq!(stored.requests, want);
    // An operator sees them on the message (admin API); ordinary mail shows null (below).
    let shown = common::http::get(relay.admin(), &format!("/api/v1/messages/{id}"), None)
        .await
        .json();
    assert_eq!(shown["requests"]["ret"], "HDRS", "{shown}");
    assert_eq!(shown["requests"]["envid"], "QQ+2B314");
    assert_eq!(
        shown["requests"]["recipients"]["a@example.net"]["orcpt"],
        "rfc822;a+2Bx@example.net"
    );
    // What delivery is handed: the same requests, read back from the store's column.
    let job = relay
        .store()
        .claim("test-worker", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the message is claimed");
    assert_eq!(job.id, id);
    assert_eq!(job.requests, want);
    assert_eq!(job.requests.ret(), Some(Ret::Hdrs));
    assert_eq!(
        job.requests.notify_on("a@example.net"),
        NotifyOn {
            success: true,
            failure: false,
            delay: true
        }
    );
    assert_eq!(job.requests.notify_on("b@example.net"), NotifyOn::NEVER);
    assert_eq!(job.requests.notify_on("c@example.net"), NotifyOn::DEFAULT);

    // Ordinary mail stores nothing: the column stays NULL.
    let plain = submit_once(
        &relay,
        "",
        &["<d@example.net>"],
        &message(Some("dsn-none-1"), "hello", "body"),
    )
    .await;
    let plain_id = plain.queue_id().unwrap();
    assert!(relay.stored(&plain_id).await.requests.is_empty());
    let shown = common::http::get(relay.admin(), &format!("/api/v1/messages/{plain_id}"), None)
        .await
        .json();
    assert!(shown["requests"].is_null(), "{shown}");
    let nulls = common::backend::scalar(
        relay.settings.store.expose(),
        &format!("SELECT COUNT(*) FROM messages WHERE id = '{plain_id}' AND requests IS NULL"),
    )
    .await;
    assert_eq!(nulls, 1);
}

/// Submissions arriving together are written together (one group commit, one multi-row
/// insert on Postgres): each record still gets its own requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_written_together_stay_with_their_records() {
    let relay = TestRelay::start().await;
    let notify = ["SUCCESS", "FAILURE", "DELAY", "NEVER", "SUCCESS,DELAY"];
    let tasks: Vec<_> = (0..20)
        .map(|n| {
            let addr = relay.addr;
            tokio::spawn(async move {
                let msg = message(Some(&format!("dsn-together-{n}")), "hello", "body");
                let mut c = Client::ready(addr).await;
                let mail = if n % 2 == 0 {
                    format!(" ENVID=env{n}")
                } else {
                    String::new()
                };
                let rcpt = format!("<r{n}@example.net> NOTIFY={}", notify[n % notify.len()]);
                let answer = submit_with(&mut c, &mail, &[&rcpt], &msg).await;
                c.quit().await;
                (n, answer.queue_id().expect("queued"))
            })
        })
        .collect();
    for task in tasks {
        let (n, id) = task.await.unwrap();
        let stored = relay.stored(&id).await;
        let r = &stored.requests;
        assert_eq!(r.envid, (n % 2 == 0).then(|| format!("env{n}")), "{n}");
        assert_eq!(
            r.recipients[&format!("r{n}@example.net")].notify.as_deref(),
            Some(notify[n % notify.len()]),
            "{n}"
        );
        assert_eq!(r.recipients.len(), 1);
    }
}

#[tokio::test]
async fn malformed_values_get_501_naming_the_parameter() {
    let relay = TestRelay::start().await;
    let mut c = Client::ready(relay.addr).await;
    for (mail, want) in [
        (" RET=ALL", "501 5.5.4 Syntax: RET=FULL or RET=HDRS"),
        (" RET", "501 5.5.4 Syntax: RET=FULL or RET=HDRS"),
        (
            " ENVID=a+2",
            "501 5.5.4 Syntax: ENVID=xtext (1 to 100 characters, printable ASCII once decoded)",
        ),
        (" REQUIRETLS=YES", "501 5.5.4 Syntax: REQUIRETLS (no value)"),
        // An encoded line break, which would reach a DSN's header fields.
        (
            " ENVID=a+0D+0AX-Evil:+20y",
            "501 5.5.4 Syntax: ENVID=xtext (1 to 100 characters, printable ASCII once decoded)",
        ),
    ] {
        let got = c.cmd(&format!("MAIL FROM:<app@example.com>{mail}")).await;
        assert_eq!(got.line(), want, "{mail}");
    }
    let long_envid = format!(" ENVID={}", "e".repeat(101));
    assert_eq!(
        c.cmd(&format!("MAIL FROM:<app@example.com>{long_envid}"))
            .await
            .line(),
        "501 5.5.4 Syntax: ENVID=xtext (1 to 100 characters, printable ASCII once decoded)"
    );
    assert_eq!(c.cmd("MAIL FROM:<app@example.com>").await.code, 250);
    let notify =
        "501 5.5.4 Syntax: NOTIFY=NEVER or NOTIFY=SUCCESS,FAILURE,DELAY (one or more of the three)";
    let orcpt = "501 5.5.4 Syntax: ORCPT=addr-type;xtext";
    for (rcpt, want) in [
        (" NOTIFY=ALWAYS", notify),
        (" NOTIFY=NEVER,SUCCESS", notify),
        (" NOTIFY=SUCCESS,SUCCESS", notify),
        (" NOTIFY", notify),
        (" ORCPT=b@example.net", orcpt),
        (" ORCPT=rfc822;b+zz@example.net", orcpt),
        (" ORCPT=rfc822;b+0D+0A@example.net", orcpt),
    ] {
        let got = c.cmd(&format!("RCPT TO:<b@example.net>{rcpt}")).await;
        assert_eq!(got.line(), want, "{rcpt}");
    }
    // An unknown parameter is still 555, and the transaction is intact.
    assert_eq!(
        c.cmd("RCPT TO:<b@example.net> X-PRIORITY=1").await.line(),
        "555 5.5.4 Parameter X-PRIORITY not supported"
    );
    let done = c
        .cmd("RCPT TO:<b@example.net> notify=failure orcpt=RFC822;b@example.net")
        .await;
    assert_eq!(done.code, 250);
    let answer = c.data(&message(Some("dsn-bad-1"), "hello", "body")).await;
    let id = answer.queue_id().unwrap();
    let stored = relay.stored(&id).await;
    assert_eq!(
        stored.requests.recipients["b@example.net"]
            .notify
            .as_deref(),
        Some("failure"),
        "kept as sent"
    );
    c.quit().await;
}

/// The console's message page shows them, as text (they are the client's input).
#[tokio::test]
async fn the_console_shows_the_requests_as_text() {
    let relay = TestRelay::start_with(|s| {
        s.admin_token = Some(idemrelay::config::Secret("console-token".into()));
    })
    .await;
    let msg = message(Some("dsn-console-1"), "hello", "body");
    let answer = submit_once(
        &relay,
        " RET=FULL ENVID=a<b>",
        &["<a@example.net> NOTIFY=DELAY ORCPT=rfc822;a@example.net"],
        &msg,
    )
    .await;
    let id = answer.queue_id().unwrap_or_else(|| panic!("{answer:?}"));
    let page = common::http::get(
        relay.admin(),
        &format!("/console/messages/{id}"),
        Some("console-token"),
    )
    .await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body.contains("RET=FULL ENVID=a&lt;b&gt;"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("a@example.net NOTIFY=DELAY ORCPT=rfc822;a@example.net"),
        "{}",
        page.body
    );
}

#[tokio::test]
async fn requiretls_is_refused_before_tls() {
    let relay = TestRelay::start().await;
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(
        c.cmd("MAIL FROM:<app@example.com> REQUIRETLS").await.line(),
        REQUIRETLS_BEFORE_TLS
    );
    // The session goes on; the same MAIL without it is taken.
    assert_eq!(c.cmd("MAIL FROM:<app@example.com>").await.code, 250);
    c.quit().await;
    assert_eq!(relay.count("messages").await, 0);
}

#[tokio::test]
async fn a_retry_with_the_same_requests_replays_and_other_requests_are_a_conflict() {
    let relay = TestRelay::start().await;
    let rcpt = ["<a@example.net> NOTIFY=SUCCESS,FAILURE"];
    // Under a header key, under a key derived from the Message-ID, and from the content.
    let keyed = message(Some("dsn-retry-1"), "hello", "body");
    let with_id =
        b"From: app@example.com\r\nMessage-ID: <m1@example.com>\r\nSubject: s\r\n\r\nbody\r\n";
    let content_only = b"From: app@example.com\r\nSubject: s\r\n\r\nbody\r\n";
    for msg in [&keyed[..], &with_id[..], &content_only[..]] {
        let first = submit_once(&relay, " RET=HDRS", &rcpt, msg).await;
        let id = first.queue_id().unwrap_or_else(|| panic!("{first:?}"));
        // Same requests, spelled otherwise: the same request.
        let again = submit_once(
            &relay,
            " ret=hdrs",
            &["<a@example.net> NOTIFY=failure,success"],
            msg,
        )
        .await;
        assert_eq!(
            again.line(),
            format!("250 2.0.0 OK queued as {id} (idempotent replay)")
        );
        for (mail, rcpt) in [
            (" RET=HDRS", "<a@example.net> NOTIFY=NEVER"),
            (" RET=HDRS", "<a@example.net>"),
            (" RET=FULL", "<a@example.net> NOTIFY=SUCCESS,FAILURE"),
            (
                " RET=HDRS ENVID=x1",
                "<a@example.net> NOTIFY=SUCCESS,FAILURE",
            ),
            (
                " RET=HDRS",
                "<a@example.net> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;a@example.net",
            ),
        ] {
            let other = submit_once(&relay, mail, &[rcpt], msg).await;
            // (With a note when the key was derived from the Message-ID.)
            assert!(other.line().starts_with(E01005), "{mail} {rcpt}: {other:?}");
        }
    }
    assert_eq!(relay.count("messages").await, 3, "never a second message");
    // Mail without requests under a key first used with them: a conflict too.
    let plain = submit_once(&relay, "", &["<a@example.net>"], &keyed).await;
    assert_eq!(plain.line(), E01005);
}

/// docs/concepts/contract.md "Split transactions": each part keeps its own recipients'
/// NOTIFY/ORCPT and shares MAIL's requests; a part asking other MAIL requests is a conflict.
#[tokio::test]
async fn split_parts_each_keep_their_recipients_requests() {
    let relay = TestRelay::start_with(|s| s.max_recipients = 1).await;
    let msg = message(Some("dsn-split-1"), "hello", "body");
    let first = submit_once(
        &relay,
        " ENVID=env1",
        &["<a@example.net> NOTIFY=SUCCESS"],
        &msg,
    )
    .await;
    let second = submit_once(
        &relay,
        " ENVID=env1",
        &["<b@example.net> NOTIFY=NEVER"],
        &msg,
    )
    .await;
    let (one, two) = (first.queue_id().unwrap(), second.queue_id().unwrap());
    assert_ne!(one, two, "two parts: {second:?}");
    let (one, two) = (relay.stored(&one).await, relay.stored(&two).await);
    assert_eq!((one.part, two.part), (1, 2));
    assert_eq!(one.requests.envid.as_deref(), Some("env1"));
    assert_eq!(two.requests.envid.as_deref(), Some("env1"));
    assert_eq!(
        one.requests.recipients.keys().collect::<Vec<_>>(),
        ["a@example.net"]
    );
    assert_eq!(two.requests.notify_on("b@example.net"), NotifyOn::NEVER);
    // Each part replays as itself.
    let again = submit_once(
        &relay,
        " ENVID=env1",
        &["<b@example.net> NOTIFY=NEVER"],
        &msg,
    )
    .await;
    assert_eq!(
        again.line(),
        format!("250 2.0.0 OK queued as {} (idempotent replay)", two.id)
    );
    // A third part with another ENVID is not the same message.
    let other = submit_once(&relay, " ENVID=env2", &["<c@example.net>"], &msg).await;
    assert_eq!(other.line(), E01005);
    assert_eq!(relay.count("messages").await, 2);
}

#[tokio::test]
async fn mailmax_closes_the_session_after_the_last_transaction() {
    let relay = TestRelay::start_with(|s| s.max_transactions = 2).await;
    let mut c = Client::ready(relay.addr).await;
    let msg = message(Some("dsn-mailmax-1"), "hello", "body");
    assert_eq!(
        submit_with(&mut c, "", &["<a@example.net>"], &msg)
            .await
            .code,
        250
    );
    // A MAIL that opens a transaction counts, whatever becomes of it.
    assert_eq!(c.cmd("MAIL FROM:<app@example.com>").await.code, 250);
    assert_eq!(c.cmd("RSET").await.code, 250);
    assert_eq!(
        c.cmd("MAIL FROM:<app@example.com>").await.line(),
        "421 4.7.0 Too many mail transactions in this session; closing connection"
    );
    assert!(c.is_closed().await);
    // A new session starts counting afresh.
    let mut c = Client::ready(relay.addr).await;
    assert_eq!(c.cmd("MAIL FROM:<app@example.com>").await.code, 250);
    c.quit().await;
}

/// msmtp as a real DSN client: it sends NOTIFY and RET because EHLO offers DSN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msmtp_dsn_options_reach_the_record() {
    if Command::new("msmtp").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "msmtp is required in CI (apt-get install -y msmtp)"
        );
        eprintln!("SKIPPED: msmtp is not installed");
        return;
    }
    let relay = TestRelay::start().await;
    let addr = relay.addr;
    let log = relay.dir.path().join("msmtp.log");
    let log_arg = format!("--logfile={}", log.display());
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("msmtp")
            .args([
                "--host=127.0.0.1",
                &format!("--port={}", addr.port()),
                "--auth=off",
                "--tls=off",
                "--from=app@example.com",
                "--dsn-notify=success,failure",
                "--dsn-return=headers",
                &log_arg,
                "--",
                "user@example.net",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("msmtp runs");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(
                b"From: app@example.com\nTo: user@example.net\nX-Bird-Idempotency-Key: dsn-msmtp-1\nSubject: s\n\nbody\n",
            )
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let id = log
        .split("OK queued as ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no queue id in the msmtp log: {log}"))
        .trim_end_matches('\'')
        .to_string();
    let stored = relay.stored(&id).await;
    assert_eq!(
        stored.requests.ret(),
        Some(Ret::Hdrs),
        "{:?}",
        stored.requests
    );
    let on = stored.requests.notify_on("user@example.net");
    assert!(
        on.success && on.failure && !on.delay,
        "{:?}",
        stored.requests
    );
}

// --- under TLS -----------------------------------------------------------------------------

struct TlsRelay {
    relay: TestRelay,
    submission: SocketAddr,
    submissions: SocketAddr,
}

/// STARTTLS and implicit-TLS listeners that take loopback clients without AUTH.
async fn tls_relay() -> TlsRelay {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = idemrelay::smtp::tls::generate_self_signed(
        &dir.path().join("certs"),
        &["localhost".into()],
    )
    .unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.store = common::backend::store_url(dir.path()).await;
    settings.submission_listen = vec!["127.0.0.1:0".parse().unwrap()];
    settings.submissions_listen = vec!["127.0.0.1:0".parse().unwrap()];
    settings.submission_allow_networks = vec!["127.0.0.0/8".parse().unwrap()];
    settings.tls_cert = Some(cert);
    settings.tls_key = Some(key);
    settings.submission_greet_delay = Duration::ZERO;
    let relay = TestRelay::start_in(dir, settings).await;
    let addrs = relay.relay.local_addrs().to_vec();
    TlsRelay {
        submission: addrs[1],
        submissions: addrs[2],
        relay,
    }
}

/// One whole reply (all its lines).
async fn reply<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
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
            let last = text.trim_end().rsplit("\r\n").next().unwrap_or("");
            if last.as_bytes().get(3) == Some(&b' ') {
                return text;
            }
        }
    }
    String::from_utf8_lossy(&got).to_string()
}

async fn say<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, line: &str) -> String {
    stream
        .write_all(format!("{line}\r\n").as_bytes())
        .await
        .unwrap();
    reply(stream).await
}

fn offers(ehlo: &str, ext: &str) -> bool {
    ehlo.lines().any(|l| l.get(4..) == Some(ext))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiretls_is_offered_and_taken_only_under_tls() {
    let r = tls_relay().await;
    let cert = r.relay.settings.tls_cert.clone().unwrap();
    let name = || rustls::pki_types::ServerName::try_from("localhost").unwrap();

    // STARTTLS: not offered before, offered after, and the record keeps it.
    let mut tcp = tokio::net::TcpStream::connect(r.submission).await.unwrap();
    assert!(reply(&mut tcp).await.starts_with("220 "));
    let before = say(&mut tcp, "EHLO client.test").await;
    assert!(
        offers(&before, "STARTTLS") && offers(&before, "DSN"),
        "{before}"
    );
    assert!(!offers(&before, "REQUIRETLS"), "{before}");
    assert!(say(&mut tcp, "STARTTLS").await.starts_with("220 2.0.0"));
    let mut tls = common::connector_trusting(&cert)
        .connect(name(), tcp)
        .await
        .unwrap();
    let after = say(&mut tls, "EHLO client.test").await;
    assert!(
        offers(&after, "REQUIRETLS") && offers(&after, "DSN"),
        "{after}"
    );
    assert!(
        say(&mut tls, "MAIL FROM:<app@example.com> REQUIRETLS RET=FULL")
            .await
            .starts_with("250 "),
    );
    assert!(say(&mut tls, "RCPT TO:<a@example.net> NOTIFY=FAILURE")
        .await
        .starts_with("250 "));
    assert!(say(&mut tls, "DATA").await.starts_with("354 "));
    let done = say(
        &mut tls,
        "From: app@example.com\r\nX-Bird-Idempotency-Key: dsn-tls-1\r\nSubject: s\r\n\r\nbody\r\n.",
    )
    .await;
    let id = done
        .split("OK queued as ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{done}"))
        .to_string();
    let stored = r.relay.stored(&id).await;
    assert!(stored.requests.require_tls, "{:?}", stored.requests);
    assert_eq!(stored.requests.ret(), Some(Ret::Full));
    let job = r
        .relay
        .store()
        .claim("test-worker", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("claimed");
    assert!(job.requests.require_tls);

    // Implicit TLS: offered from the first EHLO.
    let tcp = tokio::net::TcpStream::connect(r.submissions).await.unwrap();
    let mut tls = common::connector_trusting(&cert)
        .connect(name(), tcp)
        .await
        .unwrap();
    assert!(reply(&mut tls).await.starts_with("220 "));
    let ehlo = say(&mut tls, "EHLO client.test").await;
    assert!(offers(&ehlo, "REQUIRETLS"), "{ehlo}");
    assert!(offers(&ehlo, "LIMITS MAILMAX=1000 RCPTMAX=100"), "{ehlo}");
    assert!(say(&mut tls, "MAIL FROM:<app@example.com> REQUIRETLS")
        .await
        .starts_with("250 "));
}
