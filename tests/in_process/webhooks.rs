//! Upstream events over real HTTP (docs/concepts/webhooks.md): the relay's webhook listener on port
//! 0, requests signed here the Standard Webhooks way (the sink's own sender is an independent
//! implementation), and what they change seen through the store, the admin API and metrics.

use crate::common;

use std::time::Duration;

use base64::Engine;
use common::backend::WriteLock;
use common::http::{get, sample, send, Body, HttpResponse};
use common::{message, relay_for, start_sink, wait_state, TestRelay};
use idemrelay::config::{Secret, Settings, WebhookFields, WebhookSource, WebhookTypes};
use idemrelay::store::State;
use idemrelay::webhook::signature::sign;
use idemrelay_sink::FaultRule;
use serde_json::json;

/// The current secret and the one being rotated out: both must be taken.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OLD_SECRET: &str = "whsec_b2xkIHNlY3JldCBiZWluZyByb3RhdGVkIG91dA==";

fn key_of(secret: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap()
}

/// The worked example of docs/concepts/webhooks.md: the sink's event shape.
fn with_webhooks(s: &mut Settings) {
    s.webhook_listen = Some("127.0.0.1:0".parse().unwrap());
    s.webhooks.insert(
        "upstream".into(),
        WebhookSource {
            secrets: vec![Secret(SECRET.into()), Secret(OLD_SECRET.into())],
            fields: WebhookFields {
                event_type: "/type".into(),
                event_time: Some("/timestamp".into()),
                key: Some("/idempotency_key".into()),
                upstream_id: Some("/message_id".into()),
                message_id: Some("/headers/message-id".into()),
                recipient: Some("/rcpt_to".into()),
            },
            types: WebhookTypes {
                accepted: vec!["injection".into(), "delivery".into()],
                bounced: vec!["bounce".into()],
            },
        },
    );
}

fn now_secs() -> i64 {
    common::now_ms() / 1000
}

/// An event time in RFC 3339 with milliseconds, `ms` after the Unix epoch. Events that are to
/// belong to a record must not predate its first attempt: tests give them times from now on.
fn time_at(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap());
    humantime::format_rfc3339_millis(at).to_string()
}

/// An event as the sink sends it.
fn event(kind: &str, at: &str, key: Option<&str>, rcpt: &str) -> serde_json::Value {
    json!({
        "type": kind,
        "timestamp": at,
        "idempotency_key": key,
        "message_id": null,
        "rcpt_to": rcpt,
        "headers": {"message-id": null},
    })
}

/// POSTs `body` to /webhooks/`source`, signed with `secret` (None: unsigned) at `ts`.
async fn post_signed(
    relay: &TestRelay,
    source: &str,
    id: &str,
    ts: i64,
    secret: Option<&str>,
    body: &[u8],
) -> HttpResponse {
    let stamp = ts.to_string();
    let signature = secret.map(|s| sign(&key_of(s), id, ts, body));
    let mut headers = vec![
        ("webhook-id", id),
        ("webhook-timestamp", stamp.as_str()),
        ("Content-Type", "application/json"),
    ];
    if let Some(sig) = &signature {
        headers.push(("webhook-signature", sig.as_str()));
    }
    let addr = relay.relay.webhook_addr().expect("webhook listener runs");
    send(
        addr,
        "POST",
        &format!("/webhooks/{source}"),
        &headers,
        Body::Bytes(body),
    )
    .await
}

async fn post(relay: &TestRelay, id: &str, body: &serde_json::Value) -> HttpResponse {
    let body = serde_json::to_vec(body).unwrap();
    post_signed(relay, "upstream", id, now_secs(), Some(SECRET), &body).await
}

async fn metrics(relay: &TestRelay) -> String {
    let page = get(relay.admin(), "/metrics", None).await;
    assert_eq!(page.status, 200);
    page.body
}

fn metric(page: &str, series: &str) -> f64 {
    sample(page, series).unwrap_or_else(|| panic!("{series} missing:\n{page}"))
}

fn rejected(page: &str, reason: &str) -> f64 {
    metric(
        page,
        &format!("idemrelay_webhook_rejected_total{{reason=\"{reason}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_stores_nothing_and_is_counted_by_reason() {
    let relay = TestRelay::start_with(with_webhooks).await;
    let body = serde_json::to_vec(&event(
        "delivery",
        "2026-12-02T06:00:00.000Z",
        Some("k"),
        "a@x",
    ))
    .unwrap();
    let now = now_secs();
    let page = metrics(&relay).await;
    for reason in [
        "signature",
        "timestamp",
        "too_large",
        "malformed",
        "unknown_source",
        "store",
    ] {
        assert_eq!(rejected(&page, reason), 0.0, "{reason} present at 0");
    }

    let unsigned = post_signed(&relay, "upstream", "msg_1", now, None, &body).await;
    assert_eq!(unsigned.status, 401, "{}", unsigned.body);
    assert_eq!(unsigned.json()["code"], "signature");
    let forged = post_signed(
        &relay,
        "upstream",
        "msg_1",
        now,
        Some("whsec_Zm9yZ2Vk"),
        &body,
    )
    .await;
    assert_eq!(forged.status, 401);
    // Signed over other bytes than those sent.
    let stamp = now.to_string();
    let sig = sign(&key_of(SECRET), "msg_1", now, b"{}");
    let tampered = send(
        relay.relay.webhook_addr().unwrap(),
        "POST",
        "/webhooks/upstream",
        &[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", &stamp),
            ("webhook-signature", &sig),
        ],
        Body::Bytes(&body),
    )
    .await;
    assert_eq!(tampered.status, 401);

    let stale = post_signed(&relay, "upstream", "msg_1", now - 301, Some(SECRET), &body).await;
    assert_eq!(stale.status, 400, "{}", stale.body);
    assert_eq!(stale.json()["code"], "timestamp");
    let future = post_signed(&relay, "upstream", "msg_1", now + 400, Some(SECRET), &body).await;
    assert_eq!(future.status, 400);

    let not_json = post_signed(
        &relay,
        "upstream",
        "msg_1",
        now,
        Some(SECRET),
        b"{\"type\":",
    )
    .await;
    assert_eq!(not_json.status, 400);
    assert_eq!(not_json.json()["code"], "malformed");
    let no_type = post_signed(
        &relay,
        "upstream",
        "msg_1",
        now,
        Some(SECRET),
        b"[{\"kind\":\"x\"}]",
    )
    .await;
    assert_eq!(no_type.status, 400);
    assert!(no_type.json()["error"].as_str().unwrap().contains("/type"));
    let no_id = send(
        relay.relay.webhook_addr().unwrap(),
        "POST",
        "/webhooks/upstream",
        &[("webhook-timestamp", &stamp), ("webhook-signature", &sig)],
        Body::Bytes(&body),
    )
    .await;
    assert_eq!(no_id.status, 400);

    // A name that is not configured gets the very answer a bad signature gets: the listener
    // does not tell which source names exist.
    let unknown = post_signed(&relay, "nobody", "msg_1", now, Some(SECRET), &body).await;
    assert_eq!(
        (unknown.status, unknown.body.as_str()),
        (unsigned.status, unsigned.body.as_str())
    );

    // Over 1 MiB: declared (refused before it is read) and undeclared (refused as it passes
    // the limit), even when correctly signed.
    let mut big = b"[".to_vec();
    while big.len() <= 1024 * 1024 {
        big.extend_from_slice(b"{\"type\":\"open\",\"idempotency_key\":\"padding\"},");
    }
    big.pop();
    big.push(b']');
    let declared = post_signed(&relay, "upstream", "msg_big", now, Some(SECRET), &big).await;
    assert_eq!(declared.status, 413, "{}", declared.body);
    let sig = sign(&key_of(SECRET), "msg_big", now, &big);
    let chunked = send(
        relay.relay.webhook_addr().unwrap(),
        "POST",
        "/webhooks/upstream",
        &[
            ("webhook-id", "msg_big"),
            ("webhook-timestamp", &stamp),
            ("webhook-signature", &sig),
        ],
        Body::Chunked(&big, 64 * 1024),
    )
    .await;
    assert_eq!(chunked.status, 413, "{}", chunked.body);

    assert_eq!(relay.count("webhook_receipts").await, 0);
    assert_eq!(relay.count("upstream_events").await, 0);
    let page = metrics(&relay).await;
    assert_eq!(rejected(&page, "signature"), 3.0);
    assert_eq!(rejected(&page, "timestamp"), 2.0);
    assert_eq!(rejected(&page, "malformed"), 3.0);
    assert_eq!(rejected(&page, "unknown_source"), 1.0);
    assert_eq!(rejected(&page, "too_large"), 2.0);
    assert_eq!(metric(&page, "idemrelay_webhook_requests_total"), 0.0);

    // The secret being rotated out is still taken, and so is a just-under-the-limit body.
    let old = post_signed(&relay, "upstream", "msg_old", now, Some(OLD_SECRET), &body).await;
    assert_eq!(old.status, 200, "{}", old.body);
    assert_eq!(old.json()["unmatched"], 1);
    assert_eq!(relay.count("webhook_receipts").await, 1);
    relay.relay.shutdown().await;
}

/// The webhook listener faces the internet: a request whose `webhook-signature` carries
/// thousands of entries over a large body costs the relay one HMAC per configured secret at
/// most, off the threads that serve SMTP. Two such requests in flight leave SMTP greeting at
/// once, and each is refused without reading its entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_signature_entries_is_refused_at_once_and_smtp_keeps_greeting() {
    let relay = TestRelay::start_with(with_webhooks).await;
    let addr = relay.relay.webhook_addr().unwrap();
    let body = vec![b' '; 512 * 1024];
    // 250 well-formed entries (about 12 KB, under the HTTP listeners' 16 KiB head limit, so
    // the signature check is what meets them), none of them right.
    let entry = format!("v1,{}", "A".repeat(43) + "=");
    let flood = vec![entry; 250].join(" ");
    let stamp = now_secs().to_string();
    let mut requests = Vec::new();
    for n in 0..2 {
        let (flood, body, stamp) = (flood.clone(), body.clone(), stamp.clone());
        requests.push(tokio::spawn(async move {
            let id = format!("msg_flood_{n}");
            send(
                addr,
                "POST",
                "/webhooks/upstream",
                &[
                    ("webhook-id", id.as_str()),
                    ("webhook-timestamp", stamp.as_str()),
                    ("webhook-signature", flood.as_str()),
                ],
                Body::Bytes(&body),
            )
            .await
        }));
    }
    // The SMTP client is an OS thread with the wall clock: a timer of the relay's own runtime
    // would stall with it and measure nothing.
    let smtp = relay.addr;
    let greeted = std::thread::spawn(move || {
        use std::io::BufRead;
        std::thread::sleep(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let stream = std::net::TcpStream::connect(smtp).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut line = String::new();
        let _ = std::io::BufReader::new(stream).read_line(&mut line);
        (line, started.elapsed())
    });
    let (greeting, waited) = tokio::task::spawn_blocking(move || greeted.join().unwrap())
        .await
        .unwrap();
    assert!(
        greeting.starts_with("220 ") && waited < Duration::from_secs(1),
        "SMTP greeted {greeting:?} after {waited:?} while the flood was checked"
    );
    for request in requests {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 401, "{}", answer.body);
    }
    assert_eq!(relay.count("webhook_receipts").await, 0);
    relay.relay.shutdown().await;
}

/// An event time RFC 3339 cannot write (the year 10000, or before 1970) is refused as
/// malformed: stored, it would make its record unprintable wherever times are shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_time_past_the_year_9999_is_refused() {
    let relay = TestRelay::start_with(with_webhooks).await;
    for (n, at) in ["253402300800", "10000-01-01T00:00:00Z", "-1"]
        .iter()
        .enumerate()
    {
        let answer = post(
            &relay,
            &format!("msg_far_{n}"),
            &json!(event("delivery", at, Some("far-key"), "a@x")),
        )
        .await;
        assert_eq!(answer.status, 400, "{at}: {}", answer.body);
        assert_eq!(answer.json()["code"], "malformed", "{at}");
    }
    let last = post(
        &relay,
        "msg_far_ok",
        &json!(event(
            "delivery",
            "9999-12-31T23:59:59Z",
            Some("far-key"),
            "a@x"
        )),
    )
    .await;
    assert_eq!(last.status, 200, "{}", last.body);
    assert_eq!(relay.count("upstream_events").await, 1);
    relay.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_webhook_id_is_answered_200_and_changes_nothing() {
    let relay = TestRelay::start_with(with_webhooks).await;
    let first = json!([event("bounce", "1764655200", Some("dup-key"), "a@x")]);
    let answer = post(&relay, "msg_dup", &first).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["duplicate"], false);
    // The sender's retry of the same id, whatever it carries now.
    let retry = json!([
        event("delivery", "1764655300", Some("dup-key"), "a@x"),
        event("open", "1", None, "b@x")
    ]);
    let again = post(&relay, "msg_dup", &retry).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.json()["duplicate"], true);
    assert_eq!(relay.count("webhook_receipts").await, 1);
    assert_eq!(relay.count("upstream_events").await, 1);
    let page = metrics(&relay).await;
    assert_eq!(metric(&page, "idemrelay_webhook_requests_total"), 1.0);
    assert_eq!(metric(&page, "idemrelay_webhook_duplicates_total"), 1.0);
    assert_eq!(metric(&page, "idemrelay_upstream_events_unmatched"), 1.0);
    relay.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_out_of_order_lands_on_its_record_and_an_event_from_before_it_does_not() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, with_webhooks).await;
    // An event from before the message was even submitted: kept, and never attached to the
    // record that later takes its key (it cannot be about an attempt not yet made).
    let before = common::now_ms() - 60_000;
    let early = json!(event(
        "injection",
        &time_at(before),
        Some("wh-batch"),
        "rcpt@example.com"
    ));
    let answer = post(&relay, "msg_early", &early).await;
    assert_eq!(answer.json()["unmatched"], 1, "{}", answer.body);

    let id = common::submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com", "other@example.com"],
        &message(Some("wh-batch"), "batch", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Delivered).await;
    // The sink's reply named its id: stored with the attempt.
    let attempts = relay.store().attempts(&id).await.unwrap();
    let upstream_id = attempts[0].upstream_id.clone().expect("the sink's id");
    assert!(upstream_id.starts_with('S'), "{upstream_id}");

    // One batch: the delivery (by the upstream's id) and a bounce for the other recipient;
    // then, out of order, an injection older than the delivery.
    let after = common::now_ms();
    let mut delivery = event("delivery", &time_at(after + 2000), None, "rcpt@example.com");
    delivery["message_id"] = json!(upstream_id);
    let bounce = event(
        "bounce",
        &time_at(after + 1000),
        Some("wh-batch"),
        "Other@Example.com",
    );
    let answer = post(&relay, "msg_batch", &json!([delivery, bounce])).await;
    let outcome = answer.json();
    assert_eq!(
        (outcome["events"].as_u64(), outcome["matched"].as_u64()),
        (Some(2), Some(2)),
        "{outcome}"
    );
    assert_eq!(outcome["bounced"], 1);
    let older = event(
        "injection",
        &time_at(after + 1500),
        Some("wh-batch"),
        "rcpt@example.com",
    );
    let answer = post(&relay, "msg_older", &json!(older)).await;
    assert_eq!(answer.json()["stale"], 1, "{}", answer.body);

    let events = relay.store().events(&id).await.unwrap();
    let seen: Vec<(String, String, bool)> = events
        .iter()
        .map(|e| {
            (
                e.recipient.clone().unwrap_or_default(),
                e.event_type.clone(),
                e.applied,
            )
        })
        .collect();
    let row = |r: &str, t: &str, applied| (r.to_string(), t.to_string(), applied);
    assert_eq!(
        seen,
        [
            row("other@example.com", "bounce", true),
            row("rcpt@example.com", "injection", false),
            row("rcpt@example.com", "delivery", true),
        ]
    );
    assert_eq!(relay.stored(&id).await.state, State::Delivered);
    let page = metrics(&relay).await;
    assert_eq!(metric(&page, "idemrelay_webhook_bounces_total"), 1.0);
    assert_eq!(metric(&page, "idemrelay_upstream_events_unmatched"), 1.0);
    relay.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_unavailable_gets_503_and_the_retry_succeeds() {
    let relay = TestRelay::start_with(|s| {
        with_webhooks(s);
        s.store_busy_timeout = Duration::from_millis(300);
    })
    .await;
    let body = json!(event("delivery", "1764655200", Some("k-503"), "a@x"));
    let lock = WriteLock::hold(relay.settings.store.expose()).await;
    let refused = post(&relay, "msg_503", &body).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.json()["code"], "store");
    lock.release().await;
    assert_eq!(relay.count("webhook_receipts").await, 0);
    let retried = post(&relay, "msg_503", &body).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(
        retried.json()["duplicate"],
        false,
        "the failed request left nothing behind"
    );
    assert_eq!(relay.count("upstream_events").await, 1);
    assert_eq!(rejected(&metrics(&relay).await, "store"), 1.0);
    relay.relay.shutdown().await;
}

/// The whole point: a message whose reply to the final dot was lost past the upstream's
/// window is `unresolved`; the upstream's event says it accepted it, and the record becomes
/// `delivered` with the event named as the evidence, no person involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_event_resolves_an_unresolved_record() {
    let sink = start_sink().await;
    sink.set_faults(vec![FaultRule::drop_after_dot()]).unwrap();
    let relay = relay_for(&sink, |s| {
        with_webhooks(s);
        s.delivery.upstream_window = common::UNKNOWN_WINDOW;
        s.delivery.window_margin = common::UNKNOWN_WINDOW_MARGIN;
        s.delivery.timeouts.dot = Duration::from_secs(1);
    })
    .await;
    let id = common::submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("wh-unresolved"), "lost reply", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Unresolved).await;
    let listed = relay
        .store()
        .list(Some(State::Unresolved), 10, None)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);

    // A type that proves nothing changes nothing.
    let open = post(
        &relay,
        "msg_open",
        &json!(event(
            "open",
            &time_at(common::now_ms()),
            Some("wh-unresolved"),
            "rcpt@example.com"
        )),
    )
    .await;
    assert_eq!(open.json()["resolved"], json!([]), "{}", open.body);
    assert_eq!(relay.stored(&id).await.state, State::Unresolved);

    let injection_at = time_at(common::now_ms() + 123);
    let injection = event(
        "injection",
        &injection_at,
        Some("wh-unresolved"),
        "rcpt@example.com",
    );
    let answer = post(&relay, "msg_inj", &json!([injection])).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["resolved"], json!([id]));
    let m = relay.stored(&id).await;
    assert_eq!(m.state, State::Delivered);
    assert_eq!(
        m.resolved_by.as_deref(),
        Some("upstream/msg_inj#0 injection")
    );
    assert!(
        m.upstream_reply
            .as_deref()
            .unwrap()
            .starts_with("delivered by upstream event upstream/msg_inj#0 injection"),
        "{:?}",
        m.upstream_reply
    );
    assert!(relay
        .store()
        .list(Some(State::Unresolved), 10, None)
        .await
        .unwrap()
        .is_empty());
    let events = relay.store().events(&id).await.unwrap();
    assert!(events
        .iter()
        .any(|e| e.evidence && e.event_type == "injection"));
    let page = metrics(&relay).await;
    assert_eq!(metric(&page, "idemrelay_webhook_resolved_total"), 1.0);
    let report = relay.store().report(None).await.unwrap();
    assert_eq!(report.iter().map(|d| d.resolved_by_event).sum::<u64>(), 1);

    // Where people see it: the admin API, `queue show` (text and JSON) and `report`.
    let shown = get(relay.admin(), &format!("/api/v1/messages/{id}"), None).await;
    let m = shown.json();
    assert_eq!(m["state"], "delivered");
    assert_eq!(m["resolved_by"], "upstream/msg_inj#0 injection");
    let events = m["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{m}");
    let injection = events.iter().find(|e| e["type"] == "injection").unwrap();
    assert_eq!(injection["recipient"], "rcpt@example.com");
    assert_eq!(injection["kind"], "accepted");
    assert_eq!(injection["evidence"], true);
    assert_eq!(injection["applied"], true);
    assert_eq!(injection["event_time"], injection_at.as_str());
    assert_eq!(m["recipient_status"]["rcpt@example.com"], "injection");
    let store = relay.settings.store.expose().to_string();
    let cli = |args: &[&str]| {
        let out = tokio::task::block_in_place(|| {
            common::process::idemrelay()
                .args(args)
                // The queue commands go to the store itself, not to an admin API.
                .args((args[0] == "queue").then_some("--direct"))
                .args(["--store", &store])
                .output()
                .unwrap()
        });
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = cli(&["queue", "show", &id]);
    assert!(
        text.contains("resolved by     upstream event upstream/msg_inj#0 injection"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.contains("evidence"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.starts_with("rcpt@example.com") && row.contains("injection"),
        "{row}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&cli(&["queue", "show", &id, "--json"])).unwrap();
    assert_eq!(json["events"], m["events"]);
    let report: serde_json::Value = serde_json::from_str(&cli(&["report", "--json"])).unwrap();
    assert_eq!(report[0]["resolved_by_event"], 1, "{report}");
    relay.relay.shutdown().await;
}

/// The listener serves HTTPS with the SMTP certificates when they are configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_certificates_the_listener_is_https() {
    let Some(curl) = which("curl") else {
        assert!(std::env::var_os("CI").is_none(), "curl is needed under CI");
        eprintln!("SKIPPED with_certificates_the_listener_is_https: no curl");
        return;
    };
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = idemrelay::smtp::tls::generate_self_signed(
        certs.path(),
        &["localhost".to_string(), "127.0.0.1".to_string()],
    )
    .unwrap();
    let relay = TestRelay::start_with(|s| {
        with_webhooks(s);
        s.tls_cert = Some(cert.clone());
        s.tls_key = Some(key.clone());
    })
    .await;
    let body = serde_json::to_vec(&event("open", "1", Some("tls"), "a@x")).unwrap();
    let ts = now_secs();
    let sig = sign(&key_of(SECRET), "msg_tls", ts, &body);
    let addr = relay.relay.webhook_addr().unwrap();
    let run = |scheme: &str| {
        std::process::Command::new(&curl)
            .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--cacert"])
            .arg(&cert)
            .args(["-H", "webhook-id: msg_tls", "-H"])
            .arg(format!("webhook-timestamp: {ts}"))
            .arg("-H")
            .arg(format!("webhook-signature: {sig}"))
            .arg("--data-binary")
            .arg(String::from_utf8(body.clone()).unwrap())
            .arg(format!(
                "{scheme}://127.0.0.1:{}/webhooks/upstream",
                addr.port()
            ))
            .output()
            .unwrap()
    };
    // Blocking calls: the relay serves on the runtime's other worker.
    let out = tokio::task::block_in_place(|| run("https"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.ends_with("\n200"),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = tokio::task::block_in_place(|| run("http"));
    assert!(!String::from_utf8_lossy(&plain.stdout).ends_with("\n200"));
    relay.relay.shutdown().await;
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| std::path::Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// End to end, with the sink as the upstream and the sender of its own events (an independent
/// signer): the reply to the final dot is dropped every time, so the record ends `unresolved`
/// once the window has passed; the sink's `injection` and `delivery` events (each posted twice,
/// and in reverse order) resolve it to `delivered` with no person involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sinks_own_webhooks_resolve_an_unresolved_record() {
    use idemrelay::app::Relay;
    use idemrelay::smtp::server::ListenerKind;
    use idemrelay_sink::{SinkConfig, WebhookConfig};
    use tokio::net::TcpListener;

    // The webhook listener is bound first: the sink needs its address, the relay the sink's.
    let hooks = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks/upstream", hooks.local_addr().unwrap());
    let mut webhook = WebhookConfig::new(url.parse().unwrap(), vec![SECRET.parse().unwrap()]);
    webhook.delivery_delay = Duration::from_millis(100);
    let sink = idemrelay_sink::Sink::start(SinkConfig {
        webhook: Some(webhook),
        ..SinkConfig::default()
    })
    .await
    .unwrap();
    sink.set_faults(vec![
        FaultRule::drop_after_dot(),
        "phase=webhook,action=duplicate".parse().unwrap(),
        "phase=webhook,action=reorder".parse().unwrap(),
    ])
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = common::test_settings(dir.path());
    settings.store = common::backend::store_url(dir.path()).await;
    common::fast_delivery(&mut settings, sink.smtp_addr());
    with_webhooks(&mut settings);
    settings.delivery.upstream_window = common::UNKNOWN_WINDOW;
    settings.delivery.window_margin = common::UNKNOWN_WINDOW_MARGIN;
    settings.delivery.timeouts.dot = Duration::from_secs(1);
    let store = idemrelay::store::open(settings.store.expose(), settings.store_busy_timeout)
        .await
        .unwrap();
    let smtp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = Relay::with_all_parts(
        &settings,
        store,
        vec![(ListenerKind::Plain, smtp)],
        Some(admin),
        Some(hooks),
    )
    .unwrap();
    let addr = relay.local_addrs()[0];
    let relay = TestRelay {
        relay,
        addr,
        dir,
        settings,
    };

    let id = common::submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("wh-e2e"), "end to end", "b"),
    )
    .await;
    // Events arrive while the record is still queued (every attempt's reply is dropped): they
    // are stored, and resolve it the moment it is settled unresolved.
    wait_state(&relay, &id, State::Delivered).await;
    let m = relay.stored(&id).await;
    let evidence = m.resolved_by.clone().expect("resolved by an event");
    assert!(evidence.starts_with("upstream/msg_S"), "{evidence}");
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert!(
        ledger
            .iter()
            .all(|a| a.outcome.as_deref() == Some("unknown")),
        "{ledger:?}"
    );
    let events = relay.store().events(&id).await.unwrap();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert!(
        types.contains(&"injection") && types.contains(&"delivery"),
        "{types:?}"
    );
    // Each batch came twice: the second copy of each was a duplicate, stored once.
    common::eventually(Duration::from_secs(10), "the duplicate posts", || async {
        let page = metrics(&relay).await;
        (metric(&page, "idemrelay_webhook_duplicates_total") >= 2.0).then_some(())
    })
    .await;
    assert_eq!(relay.store().events(&id).await.unwrap().len(), 2);
    assert_eq!(sink.stats().messages, 1, "delivered once at the sink");
    // It was settled unresolved first, and resolved in that same commit.
    let report = relay.store().report(None).await.unwrap();
    let sum = |f: fn(&idemrelay::store::DailyCounts) -> u64| report.iter().map(f).sum::<u64>();
    assert_eq!(
        (sum(|d| d.unresolved), sum(|d| d.resolved_by_event)),
        (1, 1)
    );
    relay.relay.shutdown().await;
}
