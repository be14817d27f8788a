//! The relay's human log, as the built binary writes it to a pipe, under what an
//! unauthenticated client and an operator can put into it: values that hold line breaks and
//! escape sequences stay on their record's line, escaped; a huge value is cut; a flood of
//! refused requests writes a bounded number of lines.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::http::{send, Body};
use common::process::{serve_args, RelayProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "log-test-admin-token-0123";
const SOURCES: &str = r#"webhook_listen = "127.0.0.1:0"
[webhooks.upstream]
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
[webhooks.upstream.fields]
event_type = "/type"
event_time = "/timestamp"
key = "/idempotency_key"
upstream_id = "/message_id"
recipient = "/rcpt_to"
[webhooks.upstream.types]
accepted = ["delivery"]
bounced = ["bounce"]
"#;
/// What a forged record would begin with: a timestamp the relay's own never has (they carry
/// fractions of a second).
const FORGED_TIME: &str = "2026-12-04T00:00:00Z";

async fn relay(dir: &tempfile::TempDir) -> RelayProcess {
    let config = dir.path().join("relay.toml");
    std::fs::write(&config, SOURCES).unwrap();
    let config = config.display().to_string();
    let args = serve_args(&dir.path().join("relay.db"), &["--config", config.as_str()]);
    RelayProcess::spawn_with_env(&args, &[("IDEMRELAY_ADMIN_TOKEN", TOKEN.to_string())])
        .ready()
        .await
}

/// A request whose declared body is too large: refused before anything is read, so the
/// path is all that reaches the log.
async fn too_large(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 2000000\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Waits until the log holds `count` lines containing `what`.
async fn wait_for(relay: &RelayProcess, what: &str, count: usize) -> String {
    for _ in 0..200 {
        let log = relay.log();
        if log.lines().filter(|l| l.contains(what)).count() >= count {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never {count} lines with {what:?}:\n{}", relay.log());
}

fn no_forged_records(log: &str) {
    for line in log.lines() {
        assert!(
            !line.starts_with(FORGED_TIME) && !line.starts_with("INFO"),
            "a forged record: {line:?}\n{log}"
        );
        assert!(!line.contains('\x1b'), "a raw ESC: {line:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_from_clients_and_operators_cannot_forge_records() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&dir).await;
    let webhooks = relay.webhooks();
    let forged = format!(
        "/webhooks/nosuch%0A{FORGED_TIME}%20INFO%20idemrelay::webhook:%20resolved%20delivered%0D%1B[2K"
    );
    let answer = too_large(webhooks, &forged).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let signed_nothing = send(
        webhooks,
        "POST",
        &forged,
        &[("Content-Type", "application/json")],
        Body::Bytes(b"{}"),
    )
    .await;
    assert_eq!(signed_nothing.status, 401, "{signed_nothing:?}");
    // An operator's reason, through the admin API.
    let bearer = format!("Bearer {TOKEN}");
    let reason = format!("hold\n{FORGED_TIME} INFO idemrelay::operator: forged\r\x1b[31mred");
    let body = serde_json::json!({ "reason": reason }).to_string();
    let paused = send(
        relay.admin(),
        "POST",
        "/api/v1/queue/pause",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", bearer.as_str()),
        ],
        Body::Bytes(body.as_bytes()),
    )
    .await;
    assert_eq!(paused.status, 200, "{paused:?}");

    wait_for(&relay, "operator action", 1).await;
    let log = wait_for(&relay, "webhook refused", 2).await;
    no_forged_records(&log);
    // Each value stays on its record's line, escaped, and still says what it held.
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("webhook refused"))
        .collect();
    assert_eq!(refused.len(), 2, "{log}");
    for line in refused {
        assert!(
            line.contains(r"nosuch\n2026-12-04T00:00:00Z INFO"),
            "{line}"
        );
    }
    let action = log.lines().find(|l| l.contains("operator action")).unwrap();
    assert!(
        action.contains(
            r#"reason="hold\n2026-12-04T00:00:00Z INFO idemrelay::operator: forged\r\u{1b}[31mred""#
        ),
        "{action}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_value_is_cut_and_a_flood_of_refusals_writes_few_lines() {
    let dir = tempfile::tempdir().unwrap();
    let relay = relay(&dir).await;
    let webhooks = relay.webhooks();
    // 12 KiB: near the longest request head the listener takes (16 KiB; 431 beyond), and
    // far over what one value may take in the log.
    let huge = format!("/webhooks/{}", "n".repeat(12 * 1024));
    let answer = too_large(webhooks, &huge).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let log = wait_for(&relay, "webhook refused", 1).await;
    let line = log.lines().find(|l| l.contains("webhook refused")).unwrap();
    assert!(line.len() < 1024, "{} bytes: {line}", line.len());
    assert!(
        line.contains("12288 bytes"),
        "the cut says how long it was: {line}"
    );

    // A thousand unsigned requests on one keep-alive connection.
    let mut stream = TcpStream::connect(webhooks).await.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let one = format!(
        "POST /webhooks/upstream HTTP/1.1\r\nHost: {webhooks}\r\nwebhook-id: msg_1\r\nwebhook-timestamp: {now}\r\nwebhook-signature: v1,AAAA\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    const FLOOD: usize = 1000;
    let (mut reader, mut writer) = stream.split();
    let write = async {
        for _ in 0..FLOOD {
            writer.write_all(one.as_bytes()).await.unwrap();
        }
    };
    let read = async {
        let mut seen = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while String::from_utf8_lossy(&seen)
            .matches("HTTP/1.1 401")
            .count()
            < FLOOD
        {
            let n = tokio::time::timeout(Duration::from_secs(30), reader.read(&mut buf))
                .await
                .expect("answers keep coming")
                .unwrap();
            assert!(n > 0, "the connection closed early");
            seen.extend_from_slice(&buf[..n]);
        }
    };
    tokio::join!(write, read);
    let flood_lines = relay
        .log()
        .lines()
        .filter(|l| l.contains("webhook refused"))
        .count()
        - 1;
    assert!(
        flood_lines <= 50,
        "{flood_lines} lines for {FLOOD} refusals:\n{}",
        relay.log()
    );
    // Once the flood is over, a line says how many were left out.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let _ = send(
        webhooks,
        "POST",
        "/webhooks/upstream",
        &[
            ("webhook-id", "msg_2"),
            ("webhook-timestamp", &now.to_string()),
        ],
        Body::Bytes(b"{}"),
    )
    .await;
    let log = wait_for(&relay, "suppressed", 1).await;
    let said = log.lines().find(|l| l.contains("suppressed")).unwrap();
    assert!(said.contains("suppressed="), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_api_without_a_token_is_a_warning_at_start_even_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let args = serve_args(&dir.path().join("relay.db"), &[]);
    let relay = RelayProcess::spawn(&args).ready().await;
    let log = relay.log();
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("the admin API has no admin_token"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        warning.contains("operator actions are refused"),
        "{warning}"
    );
    drop(relay);
    let with_token = serve_args(&dir.path().join("relay.db"), &[]);
    let quiet =
        RelayProcess::spawn_with_env(&with_token, &[("IDEMRELAY_ADMIN_TOKEN", TOKEN.to_string())]);
    let quiet = quiet.ready().await;
    assert!(
        !quiet.log().contains("has no admin_token"),
        "{}",
        quiet.log()
    );
}

/// One line as logfmt, by go-logfmt's grammar (what Loki's `| logfmt`, Grafana and most
/// logfmt tools use): space-separated pairs; a key is a run of bytes above space other than
/// `=` and `"`; a value is bare (the same bytes) or double-quoted with backslash escapes; a
/// key may stand alone (the time, level, target and words of the message do).
fn logfmt_pairs(line: &str) -> Result<Vec<(String, Option<String>)>, String> {
    let bytes = line.as_bytes();
    let ident = |b: u8| b > b' ' && b != b'=' && b != b'"';
    let (mut i, mut pairs) = (0, Vec::new());
    while i < bytes.len() {
        if bytes[i] == b' ' {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && ident(bytes[i]) {
            i += 1;
        }
        if i == start {
            return Err(format!(
                "byte {i}: {:?} cannot start a key",
                bytes[i] as char
            ));
        }
        let key = line[start..i].to_string();
        if i == bytes.len() || bytes[i] == b' ' {
            pairs.push((key, None));
            continue;
        }
        if bytes[i] != b'=' {
            return Err(format!(
                "byte {i}: {:?} inside key {key:?}",
                bytes[i] as char
            ));
        }
        i += 1;
        if i < bytes.len() && bytes[i] == b'"' {
            i += 1;
            let mut value = String::new();
            loop {
                match bytes.get(i) {
                    None => return Err(format!("unterminated quote in {key:?}")),
                    Some(b'"') => break,
                    Some(b'\\') => {
                        value.push(*bytes.get(i + 1).ok_or("dangling escape")? as char);
                        i += 2;
                    }
                    Some(_) => {
                        let c = line[i..].chars().next().unwrap();
                        value.push(c);
                        i += c.len_utf8();
                    }
                }
            }
            i += 1;
            if i < bytes.len() && bytes[i] != b' ' {
                return Err(format!(
                    "byte {i}: no space after the quoted value of {key:?}"
                ));
            }
            pairs.push((key, Some(value)));
        } else {
            let start = i;
            while i < bytes.len() && ident(bytes[i]) {
                i += 1;
            }
            if i < bytes.len() && bytes[i] != b' ' {
                return Err(format!(
                    "byte {i}: {:?} inside the value of {key:?}",
                    bytes[i] as char
                ));
            }
            pairs.push((key, Some(line[start..i].to_string())));
        }
    }
    Ok(pairs)
}

#[test]
fn the_logfmt_reader_is_strict() {
    let pairs =
        logfmt_pairs(r#"2026-12-04T00:00:00.1Z  INFO a::b: words id=x reason="a \"b\"" n=1"#)
            .unwrap();
    assert_eq!(pairs[3], ("words".into(), None));
    assert_eq!(pairs[5], ("reason".into(), Some("a \"b\"".into())));
    for bad in [r#"key=a"b"#, r#"a "quoted" message"#, "a=b=c", r#"a="open"#] {
        assert!(logfmt_pairs(bad).is_err(), "{bad}");
    }
}

/// A day of a relay's life as the built binary logs it: a delivery, a bounce, a message whose
/// reply is lost until it is parked, an operator action by a person whose name has spaces,
/// a refused request. Every line parses as logfmt; every message ends with its `status=`
/// line, the parked one included; with `log_recipients` those lines carry the envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_is_logfmt_and_every_message_ends_with_its_status() {
    use common::Client;
    use idemrelay_sink::{FaultRule, FaultStage};

    let sink = common::start_sink().await;
    sink.set_faults(vec![
        FaultRule::reply(FaultStage::Rcpt, 550, "5.1.1 no such user").with_rcpt("nobody@"),
        FaultRule::delay(FaultStage::Dot, Duration::from_secs(5)).with_rcpt("lost@"),
    ])
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        "log_recipients = true\n[delivery]\nretry_base = \"50ms\"\nupstream_window = \"4s\"\n\
         window_margin = \"1s\"\n[delivery.timeouts]\ndot = \"1s\"\n",
    )
    .unwrap();
    let (config, upstream) = (
        config.display().to_string(),
        format!("smtp://{}?tls=none", sink.smtp_addr()),
    );
    let args = serve_args(
        &dir.path().join("relay.db"),
        &["--config", &config, "--upstream", &upstream],
    );
    let relay =
        RelayProcess::spawn_with_env(&args, &[("IDEMRELAY_ADMIN_TOKEN", TOKEN.to_string())])
            .ready()
            .await;

    let mut ids = Vec::new();
    for (to, key) in [
        ("ann@example.com", "day-ok"),
        ("nobody@example.com", "day-bounce"),
        ("lost@example.com", "day-lost"),
    ] {
        let mut c = Client::ready(relay.addr).await;
        let msg = common::message(Some(key), "a day", "body");
        let answer = c.submit("app@example.com", &[to], &msg).await;
        c.quit().await;
        ids.push((answer.queue_id().expect("accepted"), to));
    }
    for (status, (id, _)) in ["delivered", "bounced", "unresolved"].iter().zip(&ids) {
        let log = wait_for(&relay, &format!("id={id} key="), 1).await;
        let _ = log;
        for _ in 0..400 {
            if relay.log().lines().any(|l| {
                l.contains(&format!("id={id} ")) && l.contains(&format!("status={status}"))
            }) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // An operator with a name as people write them, and a refused request.
    let answer = send(
        relay.admin(),
        "POST",
        &format!("/api/v1/messages/{}/resolve", ids[2].0),
        &[
            ("Authorization", &format!("Bearer {TOKEN}")),
            ("Content-Type", "application/json"),
            ("X-Idemrelay-Operator", "Ann O'Neil (on call)"),
        ],
        Body::Bytes(br#"{"as": "delivered", "reason": "Bird log: \"250 ok\" = seen"}"#),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let _ = send(
        relay.admin(),
        "GET",
        "/api/v1/messages",
        &[],
        Body::Bytes(b""),
    )
    .await;
    let log = wait_for(&relay, "action=resolve", 1).await;

    for line in log.lines() {
        if let Err(why) = logfmt_pairs(line) {
            panic!("not logfmt: {why}\n{line}\n\n{log}");
        }
    }
    let field = |line: &str, name: &str| {
        logfmt_pairs(line)
            .unwrap()
            .into_iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v)
    };
    for (status, (id, to)) in ["delivered", "bounced", "unresolved"].iter().zip(&ids) {
        let end = log
            .lines()
            .find(|l| {
                field(l, "id").as_deref() == Some(id.as_str()) && field(l, "status").is_some()
            })
            .unwrap_or_else(|| panic!("no status line for {id}:\n{log}"));
        assert!(end.contains("idemrelay::delivery"), "{end}");
        assert_eq!(field(end, "status").as_deref(), Some(*status), "{end}");
        assert_eq!(field(end, "to").as_deref(), Some(*to), "{end}");
        assert_eq!(
            field(end, "from").as_deref(),
            Some("app@example.com"),
            "{end}"
        );
        let submission = log
            .lines()
            .find(|l| {
                l.contains("idemrelay::submission")
                    && field(l, "id").as_deref() == Some(id.as_str())
            })
            .unwrap();
        assert_eq!(
            field(submission, "to").as_deref(),
            Some(*to),
            "{submission}"
        );
    }
    let action = log.lines().find(|l| l.contains("action=resolve")).unwrap();
    assert_eq!(
        field(action, "actor").as_deref(),
        Some("admin_token (Ann O'Neil (on call))"),
        "{action}"
    );
    assert_eq!(
        field(action, "reason").as_deref(),
        Some(r#"Bird log: "250 ok" = seen"#),
        "{action}"
    );
}
