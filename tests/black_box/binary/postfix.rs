//! A real Postfix as the relay's client: its own private instance (config, queue, log), mail
//! handed to its sendmail, relayed to the relay under test.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::common;
use super::common::process::{serve_args, RelayProcess};
use super::{queue_json, run_checked, text};
/// The tests that start Postfix run as root, as CI does (`postfix start` requires it).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `postconf`'s path, or `None` (the caller returns) where Postfix cannot run: not installed,
/// or not root. CI installs Postfix (.ci/run) and runs as root: there, the test must run.
fn postfix_or_skip(name: &str) -> Option<std::path::PathBuf> {
    let postconf = find_postconf();
    let missing = match (&postconf, running_as_root()) {
        (None, _) => Some("postfix is not installed (apt-get install -y postfix)"),
        (Some(_), false) => Some("postfix start needs root"),
        (Some(_), true) => None,
    };
    if let Some(why) = missing {
        assert!(std::env::var_os("CI").is_none(), "{name}: {why}");
        eprintln!("SKIPPED {name}: {why}");
        return None;
    }
    postconf
}

/// `postconf` on the PATH or where Debian puts it (a test's PATH may lack the sbin dirs).
fn find_postconf() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(std::path::PathBuf::from))
        .map(|dir| dir.join("postconf"))
        .find(|p| p.is_file())
}

/// A private Postfix instance in `root`: its own config, queue and data directories and log
/// file, no listener of its own (mail goes in through its sendmail), everything relayed to
/// `relayhost`. `postfix stop` on drop, so a failing test leaves no master running.
struct Postfix {
    conf: std::path::PathBuf,
    maillog: std::path::PathBuf,
    postfix: std::path::PathBuf,
    postqueue: std::path::PathBuf,
    sendmail: std::path::PathBuf,
    running: bool,
}

impl Postfix {
    fn start(postconf: &Path, root: &Path, relayhost: SocketAddr) -> Postfix {
        let conf = root.join("conf");
        let queue = root.join("queue");
        let maillog = root.join("maillog");
        for dir in [&conf, &queue] {
            std::fs::create_dir_all(dir).unwrap();
        }
        // The daemons run as the postfix user and must reach their queue directory, inside
        // `root` inside the test's tempdir (made 0700).
        use std::os::unix::fs::PermissionsExt;
        for d in [Some(root), root.parent()].into_iter().flatten() {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // The whole main.cf, so nothing of the host's /etc/postfix counts (Debian's package,
        // installed with "No configuration", has none).
        // Recipient limit 50 is Postfix's default, spelled out because the test is about it;
        // concurrency stays at its default, so the two parts go out in parallel as they do in
        // production. The short backoffs make a deferral show up in seconds, not minutes.
        let main_cf = format!(
            "compatibility_level = 3.6
queue_directory = {queue}
data_directory = {data}
mail_owner = postfix
setgid_group = postdrop
myhostname = postfix.test
mydomain = postfix.test
myorigin = $myhostname
mydestination =
relay_domains =
local_recipient_maps =
alias_maps =
alias_database =
inet_interfaces = loopback-only
inet_protocols = ipv4
relayhost = [{ip}]:{port}
smtp_destination_recipient_limit = 50
smtp_tls_security_level = none
smtp_helo_name = postfix.test
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 2s
maillog_file = {maillog}
maillog_file_prefixes = {root}
",
            queue = queue.display(),
            data = root.join("data").display(),
            ip = relayhost.ip(),
            port = relayhost.port(),
            maillog = maillog.display(),
            root = root.display(),
        );
        std::fs::write(conf.join("main.cf"), main_cf).unwrap();
        // What sendmail → pickup → cleanup → qmgr → smtp needs, and postlogd for maillog_file;
        // no smtpd, no local delivery, no chroot.
        let master_cf = "\
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
";
        std::fs::write(conf.join("master.cf"), master_cf).unwrap();
        let out = run_checked(
            Command::new(postconf).arg("-c").arg(&conf).args([
                "-h",
                "command_directory",
                "sendmail_path",
            ]),
            None,
        );
        let values = text(&out.stdout);
        let mut values = values.lines();
        let commands = std::path::PathBuf::from(values.next().expect("command_directory"));
        let sendmail = std::path::PathBuf::from(values.next().expect("sendmail_path"));
        let mut postfix = Postfix {
            conf,
            maillog,
            postfix: commands.join("postfix"),
            postqueue: commands.join("postqueue"),
            sendmail,
            running: false,
        };
        // `postfix start` creates the queue's subdirectories (post-install create-missing).
        let mut cmd = Command::new(&postfix.postfix);
        cmd.arg("-c").arg(&postfix.conf).arg("start");
        let out = cmd.output().expect("run postfix start");
        assert!(
            out.status.success(),
            "postfix start: {}\n{}{}\nmaillog:\n{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr),
            postfix.log()
        );
        postfix.running = true;
        postfix
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.maillog).unwrap_or_default()
    }

    /// `sendmail -C DIR -f FROM -i -- TO...` with `message` on stdin (LF line ends, as a local
    /// program hands it over).
    fn sendmail(&self, from: &str, to: &[String], message: &[u8]) {
        self.sendmail_with(from, &[], to, message);
    }

    /// `sendmail` with more options before `--` (`-N success -V envid`, ...).
    fn sendmail_with(&self, from: &str, options: &[&str], to: &[String], message: &[u8]) {
        run_checked(
            Command::new(&self.sendmail)
                .arg("-C")
                .arg(&self.conf)
                .args(["-f", from, "-i"])
                .args(options)
                .arg("--")
                .args(to),
            Some(message),
        );
    }

    /// `postqueue -p`: "Mail queue is empty" or the listing.
    fn queue(&self) -> String {
        let out = run_checked(
            Command::new(&self.postqueue)
                .arg("-c")
                .arg(&self.conf)
                .arg("-p"),
            None,
        );
        text(&out.stdout).trim().to_string()
    }

    /// `postqueue -f`: attempt deferred mail now.
    fn flush(&self) {
        run_checked(
            Command::new(&self.postqueue)
                .arg("-c")
                .arg(&self.conf)
                .arg("-f"),
            None,
        );
    }

    fn stop(mut self) {
        self.running = false;
        run_checked(
            Command::new(&self.postfix)
                .arg("-c")
                .arg(&self.conf)
                .arg("stop"),
            None,
        );
        // `postfix status` fails once the master is gone (`stop` waits for it).
        let status = Command::new(&self.postfix)
            .arg("-c")
            .arg(&self.conf)
            .arg("status")
            .output()
            .expect("run postfix status");
        assert!(!status.status.success(), "postfix still running after stop");
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        if self.running {
            let _ = Command::new(&self.postfix)
                .arg("-c")
                .arg(&self.conf)
                .arg("stop")
                .output();
        }
    }
}

/// `postfix/smtp[..]: QID: to=<RCPT>, relay=..., status=STATUS (REPLY)` lines of the maillog:
/// (recipient, status, reply).
fn postfix_deliveries(log: &str) -> Vec<(String, String, String)> {
    log.lines()
        .filter_map(|line| {
            let rcpt = line.split_once(" to=<")?.1.split_once('>')?.0;
            let status = line.split_once(" status=")?.1;
            let (status, reply) = status.split_once(' ').unwrap_or((status, ""));
            let reply = reply.trim().trim_start_matches('(').trim_end_matches(')');
            Some((rcpt.to_string(), status.to_string(), reply.to_string()))
        })
        .collect()
}

/// Split transactions with the real client: Postfix splits a keyed message to 60 recipients into
/// 50 + 10 (smtp_destination_recipient_limit) and sends both transactions with the same key,
/// bytes and MAIL FROM. The relay must take the second as part 2 (it answered 554 E01005 and
/// Postfix bounced ten recipients), and the upstream must see both under distinct keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postfix_splits_a_keyed_message_into_two_parts_and_nothing_bounces() {
    const NAME: &str = "postfix_splits_a_keyed_message_into_two_parts_and_nothing_bounces";
    const KEY: &str = "postfix-split-1";
    let Some(postconf) = postfix_or_skip(NAME) else {
        return;
    };
    let started = Instant::now();

    let sink = common::start_sink().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let upstream = format!("smtp://{}?tls=none", sink.smtp_addr());
    let relay = RelayProcess::spawn(&serve_args(&db, &["--upstream", &upstream]))
        .ready()
        .await;
    let postfix = tokio::task::block_in_place(|| {
        Postfix::start(&postconf, &dir.path().join("postfix"), relay.addr)
    });

    // Fixed Date, Message-Id and Subject, so every run stores the same bytes (Postfix would add
    // Date and Message-Id once per queue file: the two transactions match either way).
    let message = format!(
        "From: sender@example.com\n\
         To: undisclosed-recipients:;\n\
         Subject: Postfix split test\n\
         Date: Sun, 29 Nov 2026 10:00:00 +0000\n\
         Message-Id: <{KEY}@example.com>\n\
         X-Bird-Idempotency-Key: {KEY}\n\
         \n\
         One message to sixty recipients.\n"
    );
    let rcpts: Vec<String> = (1..=60).map(|i| format!("r{i:02}@example.com")).collect();
    tokio::task::block_in_place(|| {
        postfix.sendmail("sender@example.com", &rcpts, message.as_bytes())
    });

    // Done when every recipient has a final status and the queue file is gone. A deferral is
    // retried within seconds (short backoffs, plus a flush) so the assertions below see it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_flush = Instant::now();
    let (log, queue) = loop {
        let (log, queue) = tokio::task::block_in_place(|| (postfix.log(), postfix.queue()));
        let finished = postfix_deliveries(&log)
            .iter()
            .filter(|(_, status, _)| status != "deferred")
            .count();
        if finished >= rcpts.len() && log.contains(": removed") && queue == "Mail queue is empty" {
            break (log, queue);
        }
        assert!(
            Instant::now() < deadline,
            "Postfix did not finish within 60 s; postqueue -p:\n{queue}\nmaillog:\n{log}\nrelay:\n{}",
            relay.log()
        );
        if last_flush.elapsed() > Duration::from_secs(2) {
            tokio::task::block_in_place(|| postfix.flush());
            last_flush = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let deliveries = postfix_deliveries(&log);
    let context = format!("maillog:\n{log}\nrelay:\n{}", relay.log());
    // Each recipient once, sent: none bounced, none deferred, none expired.
    assert_eq!(deliveries.len(), rcpts.len(), "{context}");
    assert!(
        deliveries.iter().all(|(_, status, _)| status == "sent"),
        "{context}"
    );
    assert!(
        !log.contains("status=bounced") && !log.contains("E01005"),
        "{context}"
    );
    assert_eq!(queue, "Mail queue is empty", "{context}");
    // Postfix's view: two transactions, each recipient answered with its part's queue id.
    let mut by_id: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (rcpt, _, reply) in &deliveries {
        let id = reply
            .strip_prefix("250 2.0.0 OK queued as ")
            .unwrap_or_else(|| panic!("{rcpt}: reply {reply:?}\n{context}"));
        by_id.entry(id.to_string()).or_default().push(rcpt.clone());
    }
    let mut sizes: Vec<usize> = by_id.values().map(Vec::len).collect();
    sizes.sort();
    assert_eq!(sizes, vec![10, 50], "{by_id:?}\n{context}");

    // The relay's view: two records under the key, parts 1 and 2, each holding exactly the
    // recipients Postfix was told it took. Postfix sends the two in parallel, so which one
    // commits first (and is part 1) is not fixed.
    let list = queue_json(&db, &["list", "--json"]);
    let list = list["messages"].as_array().expect("a JSON array");
    assert_eq!(
        list.len(),
        2,
        "no record but the two parts (no DSN): {list:?}"
    );
    let mut records = Vec::new();
    for entry in list {
        let id = entry["id"].as_str().expect("id");
        let record = queue_json(&db, &["show", id, "--json"]);
        assert_eq!(record["key"], KEY, "{record}");
        assert_eq!(record["key_source"], "header", "{record}");
        assert_eq!(record["mail_from"], "sender@example.com", "{record}");
        let mut stored: Vec<String> = record["rcpt_to"]
            .as_array()
            .expect("rcpt_to")
            .iter()
            .map(|r| r.as_str().expect("address").to_string())
            .collect();
        stored.sort();
        let mut told = by_id.get(id).cloned().unwrap_or_default();
        told.sort();
        assert_eq!(stored, told, "record {id} vs Postfix's log\n{context}");
        records.push(record);
    }
    records.sort_by_key(|r| r["part"].as_i64());
    let parts: Vec<i64> = records
        .iter()
        .map(|r| r["part"].as_i64().unwrap())
        .collect();
    assert_eq!(parts, vec![1, 2], "{records:?}");
    assert_eq!(
        records[0]["upstream_key"], KEY,
        "part 1 keeps the client's key"
    );
    let part2_key = records[1]["upstream_key"].as_str().expect("upstream_key");
    assert_ne!(part2_key, KEY, "part 2 needs a key of its own upstream");

    // The upstream's view: 60 recipients over two messages, under the two upstream keys.
    let received = sink
        .wait_for_messages(2, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}\nrelay:\n{}", relay.log()));
    assert_eq!(received.len(), 2, "{received:?}");
    let mut upstream_rcpts: Vec<String> = Vec::new();
    for record in &records {
        let upstream_key = record["upstream_key"].as_str().unwrap();
        let message = received
            .iter()
            .find(|m| m.key.as_deref() == Some(upstream_key))
            .unwrap_or_else(|| panic!("nothing upstream under {upstream_key}: {received:?}"));
        let mut got = message.rcpt_to.clone();
        got.sort();
        let mut want: Vec<String> = record["rcpt_to"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap().to_string())
            .collect();
        want.sort();
        assert_eq!(got, want, "upstream {upstream_key}");
        assert_eq!(message.mail_from, "sender@example.com");
        assert!(
            String::from_utf8_lossy(&message.bytes).contains("One message to sixty recipients."),
            "upstream {upstream_key}: body missing"
        );
        upstream_rcpts.extend(got);
    }
    upstream_rcpts.sort();
    assert_eq!(
        upstream_rcpts, rcpts,
        "each recipient delivered once upstream"
    );
    let states = common::eventually(Duration::from_secs(20), "both parts delivered", || {
        let db = db.clone();
        async move {
            let list = tokio::task::spawn_blocking(move || queue_json(&db, &["list", "--json"]))
                .await
                .unwrap();
            let states: Vec<String> = list["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["state"].as_str().unwrap_or_default().to_string())
                .collect();
            states.iter().all(|s| s == "delivered").then_some(states)
        }
    })
    .await;
    assert_eq!(states.len(), 2);

    tokio::task::block_in_place(|| postfix.stop());
    assert_eq!(sink.messages().len(), 2, "nothing more upstream");
    eprintln!("{NAME}: {:?}", started.elapsed());
}

/// A relay on a new store forwarding to `sink`, and a private Postfix relaying to it; the
/// store is `relay.db` in the returned directory.
async fn postfix_before_relay(
    postconf: &Path,
    sink: &idemrelay_sink::SinkHandle,
) -> (tempfile::TempDir, RelayProcess, Postfix) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    let upstream = format!("smtp://{}?tls=none", sink.smtp_addr());
    let relay = RelayProcess::spawn(&serve_args(&db, &["--upstream", &upstream]))
        .ready()
        .await;
    let postfix = tokio::task::block_in_place(|| {
        Postfix::start(postconf, &dir.path().join("postfix"), relay.addr)
    });
    (dir, relay, postfix)
}

/// DSN requests from the real client: `sendmail -N success,failure -R hdrs -V ENVID` makes
/// Postfix send RET, ENVID, NOTIFY and ORCPT to the relay, which offers DSN; the relay stores them
/// with the record and passes them to an upstream that offers DSN, values byte for byte. The
/// upstream takes the duty, so the relay sends no notice of its own, and Postfix none either
/// (a DSN-capable next hop took the message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postfix_dsn_requests_reach_a_dsn_upstream_unchanged() {
    const NAME: &str = "postfix_dsn_requests_reach_a_dsn_upstream_unchanged";
    let Some(postconf) = postfix_or_skip(NAME) else {
        return;
    };
    let sink = idemrelay_sink::Sink::start(idemrelay_sink::SinkConfig {
        dsn: true,
        ..Default::default()
    })
    .await
    .expect("sink");
    let (dir, relay, postfix) = postfix_before_relay(&postconf, &sink).await;
    let db = dir.path().join("relay.db");
    let message = "From: app@example.com\n\
                   To: ops@example.org\n\
                   Subject: Postfix DSN test\n\
                   Date: Sat, 05 Dec 2026 10:00:00 +0000\n\
                   Message-Id: <postfix-dsn-1@example.com>\n\
                   X-Bird-Idempotency-Key: postfix-dsn-1\n\
                   \n\
                   Tell me when it is delivered.\n";
    tokio::task::block_in_place(|| {
        postfix.sendmail_with(
            "app@example.com",
            &["-N", "success,failure", "-R", "hdrs", "-V", "envid-42"],
            &["ops@example.org".to_string()],
            message.as_bytes(),
        )
    });
    let received = sink
        .wait_for_messages(1, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\nmaillog:\n{}\nrelay:\n{}", postfix.log(), relay.log()));
    let got = &received[0];
    eprintln!(
        "{NAME}: upstream saw {:?} then {:?}",
        got.mail_command, got.rcpt_commands
    );
    assert_eq!(
        got.mail_command,
        // Postfix adds SIZE and BODY; the relay sends BODY only for 8BITMIME and no SIZE.
        "MAIL FROM:<app@example.com> RET=HDRS ENVID=envid-42",
        "{got:?}"
    );
    assert_eq!(
        got.rcpt_commands,
        vec!["RCPT TO:<ops@example.org> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;ops@example.org"],
        "{got:?}"
    );
    // The relay's record holds what Postfix asked, and it sent no notice of its own.
    let list = queue_json(&db, &["list", "--json"]);
    let list = list["messages"].as_array().expect("messages");
    assert_eq!(list.len(), 1, "no notice of the relay's own: {list:?}");
    let record = queue_json(&db, &["show", list[0]["id"].as_str().unwrap(), "--json"]);
    assert_eq!(
        record["requests"],
        serde_json::json!({
            "ret": "HDRS",
            "envid": "envid-42",
            "recipients": {"ops@example.org": {"notify": "SUCCESS,FAILURE", "orcpt": "rfc822;ops@example.org"}}
        }),
        "{record}"
    );
    tokio::task::block_in_place(|| postfix.stop());
}

/// The same request to an upstream without DSN: the relay takes over the duty (RFC 3461's relay to
/// a non-DSN server). Nothing of DSN goes upstream, and the sender gets exactly one notice with
/// `Action: relayed`, its envelope id and the original recipient, from the null sender, through
/// the same upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postfix_dsn_requests_to_an_upstream_without_dsn_bring_one_relayed_notice() {
    const NAME: &str = "postfix_dsn_requests_to_an_upstream_without_dsn_bring_one_relayed_notice";
    let Some(postconf) = postfix_or_skip(NAME) else {
        return;
    };
    let sink = common::start_sink().await;
    let (dir, relay, postfix) = postfix_before_relay(&postconf, &sink).await;
    let db = dir.path().join("relay.db");
    let message = "From: app@example.com\n\
                   To: ops@example.org\n\
                   Subject: Postfix DSN test, no DSN upstream\n\
                   Date: Sat, 05 Dec 2026 10:00:00 +0000\n\
                   Message-Id: <postfix-dsn-2@example.com>\n\
                   X-Bird-Idempotency-Key: postfix-dsn-2\n\
                   \n\
                   Tell me when it is delivered.\n";
    tokio::task::block_in_place(|| {
        postfix.sendmail_with(
            "app@example.com",
            &["-N", "success,failure", "-V", "envid-43"],
            &["ops@example.org".to_string()],
            message.as_bytes(),
        )
    });
    let received = sink
        .wait_for_messages(2, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\nmaillog:\n{}\nrelay:\n{}", postfix.log(), relay.log()));
    let original = &received[0];
    assert_eq!(original.mail_command, "MAIL FROM:<app@example.com>");
    assert_eq!(original.rcpt_commands, vec!["RCPT TO:<ops@example.org>"]);
    let notice = &received[1];
    assert_eq!(notice.mail_command, "MAIL FROM:<>");
    assert_eq!(notice.rcpt_commands, vec!["RCPT TO:<app@example.com>"]);
    let text = String::from_utf8_lossy(&notice.bytes);
    for field in [
        "Action: relayed",
        "Original-Envelope-Id: envid-43",
        "Original-Recipient: rfc822; ops@example.org",
        "Final-Recipient: rfc822; ops@example.org",
    ] {
        assert!(text.contains(field), "{field} missing:\n{text}");
    }
    // One notice, however long we wait: the records are the message and its notice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.messages().len(), 2);
    let list = queue_json(&db, &["list", "--json"]);
    assert_eq!(list["messages"].as_array().unwrap().len(), 2, "{list}");
    tokio::task::block_in_place(|| postfix.stop());
}
