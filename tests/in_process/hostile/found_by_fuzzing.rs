//! What black-box fuzzing found: AUTH memory, large messages on open connections, addresses,
//! HELO names, MAIL parameters and invisible characters in keys.

use super::*;

const MIB: u64 = 1024 * 1024;
/// argon2id's working memory with the default parameters (m = 19456 KiB), as `user add` uses.
const ARGON2_MEMORY: u64 = 19 * MIB;

/// One connection from `src` that fails AUTH `times` times (alternating a known user with
/// unknown names, which cost the same work), each answered 535.
async fn fail_auth(addr: SocketAddr, src: IpAddr, names: &[String]) {
    let mut raw = held(src, addr).await;
    raw.send(b"EHLO client.test\r\n").await;
    while let Some(line) = raw.line_in_time().await {
        if line.starts_with("250 ") {
            break;
        }
        assert!(line.starts_with("250-"), "{line:?}");
    }
    for name in names {
        raw.send(format!("{}\r\n", common::auth_plain(name, "wrong password")).as_bytes())
            .await;
        let line = tokio::time::timeout(Duration::from_secs(120), raw.line())
            .await
            .expect("AUTH answered in time")
            .expect("AUTH answered");
        assert_eq!(line, Reply::auth_failed().line());
    }
    raw.send(b"QUIT\r\n").await;
}

/// The built relay with one default-cost argon2id user; AUTH on the plain listener (allowed
/// for loopback), a short failure delay, and room for 5 failures per connection (the 6th
/// would close it).
async fn relay_with_a_user(dir: &std::path::Path) -> common::process::RelayProcess {
    let users = dir.join("users.toml");
    idemrelay::auth::Users::add_user(&users, "alice", "correct horse", "alice", &[]).unwrap();
    let config = dir.join("relay.toml");
    std::fs::write(
        &config,
        "auth_failure_delay = \"10ms\"\nmax_auth_failures = 6\n",
    )
    .unwrap();
    let mut args = common::process::serve_args(&dir.join("relay.db"), &[]);
    args.extend([
        "--users-file".into(),
        users.display().to_string(),
        "--config".into(),
        config.display().to_string(),
    ]);
    common::process::RelayProcess::spawn(&args).ready().await
}

/// Each failed password check used to leave its 19 MiB argon2 block with the allocator:
/// 20 failures took the relay from 15 to 357 MB. Now the blocks are a fixed pool, one per
/// concurrent check: 20 failures from 4 parallel clients cost at most `min(4, CPUs)` blocks
/// over the baseline (plus a margin for sockets and buffers), and 20 more cost nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_auth_leaves_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay_with_a_user(dir.path()).await;
    let addr = relay.addr;
    let baseline = relay.rss();
    let parallel = 4u8;
    let slots = (parallel as u64).min(std::thread::available_parallelism().unwrap().get() as u64);
    let bound = baseline + slots * ARGON2_MEMORY + 16 * MIB;
    let mut after = Vec::new();
    for round in 0..2u8 {
        let clients: Vec<_> = (0..parallel)
            .map(|i| {
                // Distinct sources keep each under the per-client throttles.
                let src = loopback(10 + round * parallel + i);
                let names: Vec<String> = (0..5)
                    .map(|n| {
                        if n % 2 == 0 {
                            "alice".to_string()
                        } else {
                            format!("nobody{round}-{i}-{n}")
                        }
                    })
                    .collect();
                tokio::spawn(async move { fail_auth(addr, src, &names).await })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        after.push(relay.rss());
    }
    eprintln!(
        "RSS: baseline {} MiB, after 20 failed AUTHs {} MiB, after 40 {} MiB (bound {} MiB)",
        baseline / MIB,
        after[0] / MIB,
        after[1] / MIB,
        bound / MIB
    );
    assert!(
        after[0] <= bound,
        "20 failed AUTHs: RSS {} MiB over the bound {} MiB",
        after[0] / MIB,
        bound / MIB
    );
    assert!(
        after[1] <= after[0] + 4 * MIB,
        "20 more failed AUTHs grew RSS from {} to {} MiB",
        after[0] / MIB,
        after[1] / MIB
    );
    assert_eq!(
        relay.log().matches("authentication failed").count(),
        40,
        "{}",
        relay.log()
    );
}

/// AUTH as an operator reads it: a failed AUTH is a refusal (counted, and logged with the
/// client), and a submission after AUTH names its user on the submission line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failures_are_counted_and_the_submission_line_names_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay_with_a_user(dir.path()).await;
    let mut c = Client::ready(relay.addr).await;
    let failed = c.cmd(&common::auth_plain("alice", "wrong password")).await;
    assert_reply(&failed, &Reply::auth_failed(), "535 5.7.8");
    let ok = c.cmd(&common::auth_plain("alice", "correct horse")).await;
    assert_eq!(ok.code, 235, "{ok:?}");
    let id = c
        .submit(
            "sender@example.com",
            &["rcpt@example.com"],
            &message(Some("auth-log-1"), "s", "b"),
        )
        .await
        .queue_id()
        .expect("queued");
    c.quit().await;
    let log = common::eventually(Duration::from_secs(10), "the submission line", || {
        let log = relay.log();
        let found = log.contains(&format!("id={id} "));
        async move { found.then_some(log) }
    })
    .await;
    let submission = log
        .lines()
        .find(|l| l.contains(&format!("id={id} ")) && l.contains("submission"))
        .unwrap();
    for field in [
        "user=alice",
        "scope=alice",
        "client=127.0.0.1",
        "helo=client.test",
    ] {
        assert!(submission.contains(field), "{field} missing: {submission}");
    }
    assert!(
        log.lines().any(|l| l.contains("command refused")
            && l.contains("reason=auth")
            && l.contains("reply=\"535 5.7.8")),
        "{log}"
    );
    assert!(!log.contains("wrong password") && !log.contains("correct horse"));
    let page = common::http::get(relay.admin(), "/metrics", None)
        .await
        .body;
    assert_eq!(
        common::http::sample(
            &page,
            "idemrelay_smtp_commands_refused_total{reason=\"auth\"}"
        ),
        Some(1.0),
        "{page}"
    );
}

/// A large message's buffers are given back once it is committed, while its connection is
/// still open: 3 idle connections that each sent 24 MB used to hold 15 → 100+ MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_leave_nothing_behind_on_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let args = common::process::serve_args(&dir.path().join("relay.db"), &[]);
    let relay = common::process::RelayProcess::spawn(&args).ready().await;
    let baseline = relay.rss();
    let mut body = VALID_HEADERS.to_vec();
    let line = [b'x'; 98];
    while body.len() < 24_000_000 {
        body.extend_from_slice(&line);
        body.extend_from_slice(b"\r\n");
    }
    let mut open = Vec::new();
    let mut seen = Vec::new();
    for i in 0..3 {
        let mut c = Client::ready(relay.addr).await;
        mail_rcpt(&mut c).await;
        let mut message = format!("X-Bird-Idempotency-Key: big-{i}\r\n").into_bytes();
        message.extend_from_slice(&body);
        let answer = c.data(&message).await;
        assert!(answer.queue_id().is_some(), "{answer:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        seen.push(relay.rss());
        open.push(c);
    }
    eprintln!(
        "RSS: baseline {} MiB, after each 24 MB message on its still open connection {:?} MiB",
        baseline / MIB,
        seen.iter().map(|r| r / MIB).collect::<Vec<_>>()
    );
    let bound = baseline + 16 * MIB;
    assert!(
        seen.iter().all(|&r| r <= bound),
        "RSS over {} MiB: {:?} MiB",
        bound / MIB,
        seen.iter().map(|r| r / MIB).collect::<Vec<_>>()
    );
    for c in open {
        c.quit().await;
    }
}

/// A reply that must carry this code and enhanced code (for the replies of the input rules).
fn assert_code(answer: &Answer, code_and_enhanced: &str) {
    assert_eq!(answer.lines.len(), 1, "{answer:?}");
    assert!(
        answer.line().starts_with(&format!("{code_and_enhanced} ")),
        "{answer:?} is not {code_and_enhanced}"
    );
}

#[tokio::test]
async fn invalid_addresses_are_refused_and_valid_ones_stored_as_sent() {
    let relay = TestRelay::start_with(|s| s.max_errors = 100).await;
    let mut c = Client::ready(relay.addr).await;
    for from in [
        "app@",
        "app@\"\"\"\"\"\"",
        "\"\"",
        "@example.com",
        "app",
        "a..b@example.com",
        "app@example..com",
        "app@-example.com",
        "app@exa_mple.com",
        "app@[192.0.2.300]",
        "app@[IPv6:nonsense]",
        "app@example.com.",
        "app @example.com",
        "postmaster",
    ] {
        let a = c.cmd(&format!("MAIL FROM:<{from}>")).await;
        assert_reply(&a, &Reply::bad_sender_address(), "501 5.1.7");
    }
    // 8-bit bytes that are not UTF-8 are not an address either, even under SMTPUTF8.
    c.send(b"MAIL FROM:<j\xf6rg@example.com> SMTPUTF8\r\n")
        .await;
    expect(&mut c, &Reply::bad_sender_address(), "501 5.1.7").await;

    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    for rcpt in [
        "user@",
        "",
        "\"\"",
        "postmaster",
        "user@exam ple.com",
        "@x:user@",
    ] {
        let a = c.cmd(&format!("RCPT TO:<{rcpt}>")).await;
        assert_reply(&a, &Reply::bad_recipient_address(), "553 5.1.3");
    }
    assert_reply(&c.cmd("RSET").await, &Reply::reset_ok(), "250 2.0.0");

    // Unusual but valid: accepted, and stored exactly as sent (a source route is dropped,
    // as RFC 5321 tells servers to do).
    let from = "\"john q. public\"@example.com";
    let rcpts = [
        "\"a@b\"@example.com",
        "user@[192.0.2.1]",
        "user@[IPv6:2001:db8::1]",
        "Mixed.Case+tag@Example.COM",
        "x@y",
    ];
    let a = c.cmd(&format!("MAIL FROM:<{from}>")).await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    for rcpt in rcpts {
        let a = c.cmd(&format!("RCPT TO:<{rcpt}>")).await;
        assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    }
    let a = c
        .cmd("RCPT TO:<@relay.example,@other.example:routed@example.com>")
        .await;
    assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    let answer = c.data(&message(Some("addr-1"), "addresses", "b")).await;
    let stored = relay.stored(&answer.queue_id().unwrap()).await;
    assert_eq!(stored.mail_from, from);
    let mut want: Vec<&str> = rcpts.to_vec();
    want.push("routed@example.com");
    assert_eq!(stored.rcpt_to, want);

    // The null sender is only `<>`.
    let a = c.cmd("MAIL FROM:<>").await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    let a = c.cmd(&format!("RCPT TO:<{RCPT}>")).await;
    assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    let answer = c.data(&message(Some("addr-2"), "bounce", "b")).await;
    assert_eq!(
        relay.stored(&answer.queue_id().unwrap()).await.mail_from,
        ""
    );

    // UTF-8 needs SMTPUTF8, and then is kept as sent.
    let a = c.cmd("MAIL FROM:<jörg@bücher.example>").await;
    assert_reply(&a, &Reply::non_ascii_address(), "553 5.6.7");
    let a = c.cmd("MAIL FROM:<jörg@bücher.example> SMTPUTF8").await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    let a = c.cmd("RCPT TO:<δοκιμή@παράδειγμα.δοκιμή>").await;
    assert_reply(&a, &Reply::recipient_ok(), "250 2.1.5");
    let a = c.cmd("RCPT TO:<user@bücher.>").await;
    assert_reply(&a, &Reply::bad_recipient_address(), "553 5.1.3");
    let answer = c.data(&message(Some("addr-3"), "utf8", "b")).await;
    let stored = relay.stored(&answer.queue_id().unwrap()).await;
    assert_eq!(stored.mail_from, "jörg@bücher.example");
    assert_eq!(stored.rcpt_to, vec!["δοκιμή@παράδειγμα.δοκιμή"]);
    assert_eq!(relay.count("messages").await, 3);
    still_usable(&relay, &mut c, "addr-after").await;
}

#[tokio::test]
async fn helo_names_must_be_domains_or_address_literals() {
    let relay = TestRelay::start().await;
    let (mut c, greeting) = Client::connect(relay.addr).await;
    assert_eq!(greeting.code, 220);
    for helo in [
        &b"EHLO h\xc3\xa9llo.example\r\n"[..],
        b"EHLO h\xffst\r\n",
        b"HELO b\xfccher.example\r\n",
        b"EHLO host..example\r\n",
        b"EHLO -host\r\n",
        b"EHLO [192.0.2.256]\r\n",
        b"EHLO <host>\r\n",
        b"EHLO \"host\"\r\n",
    ] {
        c.send(helo).await;
        let a = c.read_answer().await.expect("answer");
        assert_code(&a, "501 5.5.2");
    }
    let a = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_reply(&a, &Reply::need_helo(), "503 5.5.1");
    for good in [
        "HELO [192.0.2.1]",
        "EHLO [IPv6:::1]",
        "EHLO DESKTOP-42_B.corp.example",
    ] {
        let a = c.cmd(good).await;
        assert_eq!(a.code, 250, "{good}: {a:?}");
    }
    let answer = c
        .submit(FROM, &[RCPT], &message(Some("helo-1"), "helo", "b"))
        .await;
    let stored = relay.stored(&answer.queue_id().unwrap()).await;
    let content = String::from_utf8(stored.content.unwrap()).unwrap();
    assert!(
        content.starts_with("Received: from DESKTOP-42_B.corp.example "),
        "{content}"
    );
}

#[tokio::test]
async fn mail_parameters_duplicates_and_size() {
    let relay = TestRelay::start_with(|s| s.max_message_size = 1000).await;
    let mut c = Client::ready(relay.addr).await;
    for params in [
        "SIZE=10 SIZE=10",
        "SIZE=10 size=20",
        "BODY=8BITMIME BODY=8BITMIME",
        "BODY=7BIT BODY=8BITMIME",
        "SMTPUTF8 SMTPUTF8",
        "RET=FULL RET=HDRS",
    ] {
        let a = c.cmd(&format!("MAIL FROM:<{FROM}> {params}")).await;
        assert_code(&a, "501 5.5.4");
    }
    // One rule for too big: any all-digit SIZE over the limit, however long, is 552; a value
    // that is not a number is a syntax error.
    for size in [
        "1001",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999",
    ] {
        let a = c.cmd(&format!("MAIL FROM:<{FROM}> SIZE={size}")).await;
        assert_reply(&a, &Reply::message_too_big(), "552 5.3.4");
    }
    for size in ["", "1x", "-1", "0x10"] {
        let a = c.cmd(&format!("MAIL FROM:<{FROM}> SIZE={size}")).await;
        assert_code(&a, "501 5.5.4");
    }
    let a = c
        .cmd(&format!(
            "MAIL FROM:<{FROM}> SIZE=1000 BODY=8BITMIME SMTPUTF8"
        ))
        .await;
    assert_reply(&a, &Reply::sender_ok(), "250 2.1.0");
    let a = c
        .cmd(&format!("RCPT TO:<{RCPT}> NOTIFY=NEVER NOTIFY=NEVER"))
        .await;
    assert_code(&a, "501 5.5.4");
    // DSN's NOTIFY is taken (tests/in_process/delivery_requests.rs); a parameter the relay
    // lacks is still 555.
    let a = c.cmd(&format!("RCPT TO:<{RCPT}> MT-PRIORITY=1")).await;
    assert_code(&a, "555 5.5.4");
    assert_reply(&c.cmd("RSET").await, &Reply::reset_ok(), "250 2.0.0");
    assert_eq!(relay.count("messages").await, 0);
    still_usable(&relay, &mut c, "params-after").await;
}

/// Keys that could look like another key to a person: bidi controls, zero-width and other
/// format characters, line and paragraph separators, the BOM.
#[tokio::test]
async fn keys_with_invisible_characters_get_e01001() {
    let relay = TestRelay::start().await;
    let mut c = Client::ready(relay.addr).await;
    for invisible in [
        '\u{202e}', '\u{200b}', '\u{2028}', '\u{2029}', '\u{feff}', '\u{2066}', '\u{00ad}',
    ] {
        mail_rcpt(&mut c).await;
        let key = format!("order-{invisible}42");
        let answer = c.data(&message(Some(&key), "invisible", "b")).await;
        assert_reply(&answer, &Reply::key_invalid(), "554 5.6.0");
    }
    assert_eq!(relay.count("messages").await, 0);
    // Visible non-ASCII is still a key.
    still_usable(&relay, &mut c, "заказ-42-✓").await;
}
