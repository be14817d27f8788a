//! Delivery status notifications and REQUIRETLS on the delivery side, over real sockets with
//! `idemrelay sink` as the upstream (docs/concepts/delivery.md, "Delivery status
//! notifications"; docs/guides/tls-auth-relay.md, "REQUIRETLS").
//!
//! Records are queued through the store with their delivery requests set, as intake stores
//! them. Every test here needs the store to keep those requests (its `requests` column comes
//! with the intake side of DSN): until both are merged they are ignored; remove the `ignore`
//! attributes with the merge.

use crate::common;

use std::time::Duration;

use common::{eventually, relay_for, wait_state, TestRelay};
use idemrelay::mail::requests::RecipientRequests;
use idemrelay::mail::{BodyType, DeliveryRequests, Envelope, Fingerprint};
use idemrelay::store::{KeySource, NewRecord, Retention, State};
use idemrelay_sink::{FaultRule, FaultStage, Sink, SinkConfig, SinkHandle};

const LIMIT: Duration = Duration::from_secs(20);

const RETENTION: Retention = Retention {
    replay: Duration::from_secs(3600),
    upstream_window: Duration::from_secs(3600),
    parked: Duration::from_secs(3600),
};

fn content(key: &str) -> Vec<u8> {
    format!(
        "From: sender@example.com\r\nTo: bob@example.org\r\nSubject: figures\r\n\
         X-Bird-Idempotency-Key: {key}\r\n\r\nTHE BODY LINE\r\n"
    )
    .into_bytes()
}

/// Queues a message from sender@example.com to `rcpts` with `requests`, as intake would.
async fn queue(relay: &TestRelay, key: &str, rcpts: &[&str], requests: DeliveryRequests) -> String {
    let id = format!("DSN{}", key.replace('-', "").to_ascii_uppercase());
    let bytes = content(key);
    let seed = blake3::hash(key.as_bytes());
    let record = NewRecord {
        id: id.clone(),
        scope: "default".into(),
        key: Some(key.into()),
        key_source: Some(KeySource::Header),
        fingerprint: Fingerprint::from_bytes(*seed.as_bytes()),
        envelope: Envelope {
            mail_from: "sender@example.com".into(),
            rcpt_to: rcpts.iter().map(|r| r.to_string()).collect(),
            body: BodyType::SevenBit,
            smtputf8: false,
            requests,
        },
        size: bytes.len(),
        content: Some(bytes),
        state: State::Queued,
        reply: format!("250 2.0.0 OK queued as {id}"),
        dsn_of: None,
        part: 1,
        message_fp: Fingerprint::from_bytes(*seed.as_bytes()),
        upstream_key: Some(key.into()),
        message_id: None,
    };
    relay.store().insert(&record, RETENTION).await.unwrap();
    id
}

fn notify(rcpt: &str, notify: &str, orcpt: Option<&str>) -> DeliveryRequests {
    let mut r = DeliveryRequests::default();
    r.recipients.insert(
        rcpt.into(),
        RecipientRequests {
            notify: Some(notify.into()),
            orcpt: orcpt.map(str::to_string),
        },
    );
    r
}

/// bob@example.org is refused for good; the notices to the sender go through.
fn refusing(sink: &SinkHandle) {
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Rcpt,
        550,
        "5.1.1 no such user",
    )
    .with_rcpt("bob@example.org")])
        .unwrap();
}

/// The notices the sink received (null sender), after a moment for any late one.
async fn notices(sink: &SinkHandle) -> Vec<idemrelay_sink::ReceivedMessage> {
    tokio::time::sleep(Duration::from_millis(500)).await;
    sink.messages()
        .into_iter()
        .filter(|m| m.mail_from.is_empty())
        .collect()
}

async fn one_notice(sink: &SinkHandle) -> String {
    eventually(LIMIT, "a notice", || async {
        sink.messages()
            .iter()
            .any(|m| m.mail_from.is_empty())
            .then_some(())
    })
    .await;
    let got = notices(sink).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].rcpt_to, ["sender@example.com"]);
    String::from_utf8(got[0].bytes.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dsn_parameters_reach_a_dsn_upstream_and_the_relay_sends_no_success_notice() {
    let sink = Sink::start(SinkConfig {
        dsn: true,
        ..SinkConfig::default()
    })
    .await
    .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let mut requests = notify(
        "bob@example.org",
        "SUCCESS,Delay",
        Some("rfc822;b+2Bob@example.org"),
    );
    requests.ret = Some("Full".into());
    requests.envid = Some("env+2B1".into());
    let id = queue(&relay, "dsn-pass-1", &["bob@example.org"], requests).await;
    wait_state(&relay, &id, State::Delivered).await;
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].mail_command,
        "MAIL FROM:<sender@example.com> RET=Full ENVID=env+2B1"
    );
    assert_eq!(
        got[0].rcpt_commands,
        ["RCPT TO:<bob@example.org> NOTIFY=SUCCESS,Delay ORCPT=rfc822;b+2Bob@example.org"]
    );
    assert!(notices(&sink).await.is_empty(), "the upstream has the duty");
    assert!(relay.stored(&id).await.dsns.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_success_to_an_upstream_without_dsn_brings_one_relayed_notice() {
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    // The first answer to the dot is lost: the message is sent again (the upstream replays
    // it), and still one notice follows.
    sink.set_faults(vec![FaultRule::drop_after_dot().with_times(1)])
        .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let requests = notify("bob@example.org", "SUCCESS", None);
    let id = queue(
        &relay,
        "dsn-relayed-1",
        &["bob@example.org", "carol@example.net"],
        requests,
    )
    .await;
    wait_state(&relay, &id, State::Delivered).await;
    let got = sink.transactions();
    assert!(
        got.iter()
            .all(|t| t.mail_command == "MAIL FROM:<sender@example.com>" || t.mail_from.is_empty()),
        "no DSN parameter to this upstream: {got:?}"
    );
    let text = one_notice(&sink).await;
    assert!(
        text.contains("Subject: Delivery Status Notification (Relayed)"),
        "{text}"
    );
    assert!(
        text.contains(
            "Final-Recipient: rfc822; bob@example.org\r\nAction: relayed\r\nStatus: 2.0.0\r\n"
        ),
        "{text}"
    );
    assert!(
        !text.contains("carol@example.net"),
        "only who asked: {text}"
    );
    let stored = relay.stored(&id).await;
    assert_eq!(stored.dsns.len(), 1);
    let notice = relay.stored(&stored.dsns[0]).await;
    wait_state(&relay, &notice.id, State::Delivered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_never_suppresses_the_failure_notice() {
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    refusing(&sink);
    let relay = relay_for(&sink, |_| {}).await;
    let id = queue(
        &relay,
        "dsn-never-1",
        &["bob@example.org"],
        notify("bob@example.org", "NEVER", None),
    )
    .await;
    wait_state(&relay, &id, State::Failed).await;
    assert!(
        relay.stored(&id).await.dsns.is_empty(),
        "no notice record at all"
    );
    sink.set_faults(vec![]).unwrap();
    assert!(notices(&sink).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_notice_returns_what_ret_asks_with_the_envelope_id() {
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    refusing(&sink);
    let relay = relay_for(&sink, |_| {}).await;
    let full = DeliveryRequests {
        ret: Some("FULL".into()),
        envid: Some("QQ+2B314".into()),
        ..notify("bob@example.org", "FAILURE", Some("rfc822;bob@example.org"))
    };
    let hdrs = DeliveryRequests {
        ret: Some("HDRS".into()),
        ..Default::default()
    };
    let a = queue(&relay, "dsn-full-1", &["bob@example.org"], full).await;
    let b = queue(&relay, "dsn-hdrs-1", &["bob@example.org"], hdrs).await;
    wait_state(&relay, &a, State::Failed).await;
    wait_state(&relay, &b, State::Failed).await;
    eventually(LIMIT, "two notices", || async {
        (sink
            .messages()
            .iter()
            .filter(|m| m.mail_from.is_empty())
            .count()
            == 2)
            .then_some(())
    })
    .await;
    let got = notices(&sink).await;
    let of = |id: &str| {
        got.iter()
            .map(|m| String::from_utf8(m.bytes.clone()).unwrap())
            .find(|t| t.contains(&format!("X-Idemrelay-Id: {id}")))
            .unwrap()
    };
    let full = of(&a);
    assert!(full.contains("Original-Envelope-Id: QQ+314\r\n"), "{full}");
    assert!(
        full.contains("Original-Recipient: rfc822; bob@example.org\r\n"),
        "{full}"
    );
    assert!(full.contains("Content-Type: message/rfc822"), "{full}");
    assert!(full.contains("THE BODY LINE"), "{full}");
    let hdrs = of(&b);
    assert!(hdrs.contains("Content-Type: text/rfc822-headers"), "{hdrs}");
    assert!(!hdrs.contains("THE BODY LINE"), "{hdrs}");
    assert!(!hdrs.contains("Original-Envelope-Id"), "{hdrs}");
}

/// A REQUIRETLS message to an upstream reached in the clear: nothing is sent, the message
/// fails with 5.7.30, and its notice (itself REQUIRETLS) cannot go either: it fails in turn,
/// and from the null sender nothing follows. Both stay parked as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiretls_never_leaves_in_the_clear_nor_does_its_notice() {
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let requests = DeliveryRequests {
        require_tls: true,
        ..Default::default()
    };
    let id = queue(&relay, "dsn-tls-1", &["bob@example.org"], requests).await;
    wait_state(&relay, &id, State::Failed).await;
    let stored = relay.stored(&id).await;
    assert_eq!(
        stored.upstream_reply.as_deref(),
        Some("550 5.7.30 REQUIRETLS support required")
    );
    assert_eq!(stored.dsns.len(), 1);
    wait_state(&relay, &stored.dsns[0], State::Failed).await;
    let notice = relay.stored(&stored.dsns[0]).await;
    assert!(notice.dsns.is_empty(), "no notice of a notice");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sink.transactions().is_empty(), "nothing left in the clear");
}

async fn tls_sink(requiretls: bool) -> (SinkHandle, tempfile::TempDir) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let sink = Sink::start(SinkConfig {
        tls: Some((cert, key)),
        requiretls,
        ..SinkConfig::default()
    })
    .await
    .unwrap();
    (sink, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiretls_goes_over_verified_tls_to_an_upstream_that_offers_it() {
    let (sink, dir) = tls_sink(true).await;
    let port = sink.smtp_addr().port();
    let relay = relay_for(&sink, |s| {
        s.upstream = Some(idemrelay::config::SecretUrl(format!(
            "smtp://localhost:{port}"
        )));
        s.delivery.ca_file = Some(dir.path().join("cert.pem"));
    })
    .await;
    let requests = DeliveryRequests {
        require_tls: true,
        ..Default::default()
    };
    let id = queue(&relay, "dsn-tls-2", &["bob@example.org"], requests).await;
    wait_state(&relay, &id, State::Delivered).await;
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert!(got[0].tls);
    assert_eq!(
        got[0].mail_command,
        "MAIL FROM:<sender@example.com> REQUIRETLS"
    );
}

/// Under TLS, but the upstream does not offer REQUIRETLS: failed, and the notice, which needs
/// REQUIRETLS too, fails the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiretls_is_not_sent_to_a_tls_upstream_without_it() {
    let (sink, dir) = tls_sink(false).await;
    let port = sink.smtp_addr().port();
    let relay = relay_for(&sink, |s| {
        s.upstream = Some(idemrelay::config::SecretUrl(format!(
            "smtp://localhost:{port}"
        )));
        s.delivery.ca_file = Some(dir.path().join("cert.pem"));
    })
    .await;
    let requests = DeliveryRequests {
        require_tls: true,
        ..Default::default()
    };
    let id = queue(&relay, "dsn-tls-3", &["bob@example.org"], requests).await;
    wait_state(&relay, &id, State::Failed).await;
    let dsn = relay.stored(&id).await.dsns[0].clone();
    wait_state(&relay, &dsn, State::Failed).await;
    assert!(sink.transactions().is_empty());
}

/// From the client's session to the upstream's: what a client sends on MAIL and RCPT reaches
/// a DSN upstream byte for byte (needs the intake side: the session taking the parameters).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_from_the_client_session_reach_the_upstream_byte_for_byte() {
    use common::{message, Client};
    let sink = Sink::start(SinkConfig {
        dsn: true,
        ..SinkConfig::default()
    })
    .await
    .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let mut c = Client::ready(relay.addr).await;
    let mail = "MAIL FROM:<sender@example.com> RET=hdrs ENVID=Q+2B1";
    let rcpt = "RCPT TO:<bob@example.org> NOTIFY=success,DELAY ORCPT=rfc822;Bob+2B1@example.org";
    assert_eq!(c.cmd(mail).await.code, 250);
    assert_eq!(c.cmd(rcpt).await.code, 250);
    let answer = c.data(&message(Some("dsn-session-1"), "s", "b")).await;
    c.quit().await;
    let id = answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"));
    wait_state(&relay, &id, State::Delivered).await;
    let got = sink.messages();
    assert_eq!(got[0].mail_command, mail);
    assert_eq!(got[0].rcpt_commands, [rcpt]);
    assert!(notices(&sink).await.is_empty());
}

/// The relayed notice is a record of its own, queued with the delivery: a relay restarted
/// before the notice could leave sends it once, and the message is not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_before_the_relayed_notice_leaves_still_sends_it_once() {
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    // The notice (to the sender) is deferred until the restart.
    sink.set_faults(vec![FaultRule::reply(
        FaultStage::Rcpt,
        451,
        "4.3.0 try later",
    )
    .with_rcpt("sender@example.com")])
        .unwrap();
    let first = relay_for(&sink, |_| {}).await;
    let requests = notify("bob@example.org", "SUCCESS", None);
    let id = queue(&first, "dsn-restart-1", &["bob@example.org"], requests).await;
    wait_state(&first, &id, State::Delivered).await;
    let dsns = first.stored(&id).await.dsns;
    assert_eq!(dsns.len(), 1);
    let settings = first.settings.clone();
    first.relay.shutdown().await;
    let second = TestRelay::start_in(tempfile::tempdir().unwrap(), settings).await;
    sink.set_faults(vec![]).unwrap();
    wait_state(&second, &dsns[0], State::Delivered).await;
    let text = one_notice(&sink).await;
    assert!(text.contains("Action: relayed"), "{text}");
    let originals = sink
        .messages()
        .iter()
        .filter(|m| m.mail_from == "sender@example.com")
        .count();
    assert_eq!(originals, 1);
    assert_eq!(second.stored(&id).await.dsns, dsns);
}

/// The session, not the store, files the requests: a client's RET, ENVID and each recipient's
/// NOTIFY and ORCPT, sent over a socket, decide the failure notice when the upstream refuses
/// both recipients for good. The NEVER recipient is in no notice; the other one's notice
/// carries the envelope id and its original recipient decoded, and the headers only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_from_the_client_session_decide_the_failure_notice() {
    use common::{message, Client};
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    // Refused at RCPT only, so the notice to the sender goes through.
    let refuse =
        |rcpt: &str| FaultRule::reply(FaultStage::Rcpt, 550, "5.1.1 no such user").with_rcpt(rcpt);
    sink.set_faults(vec![
        refuse("never@example.org"),
        refuse("kept@example.org"),
    ])
    .unwrap();
    let relay = relay_for(&sink, |_| {}).await;
    let mut c = Client::ready(relay.addr).await;
    let mail = c
        .cmd("MAIL FROM:<s@example.com> RET=HDRS ENVID=env+2B1")
        .await;
    assert_eq!(mail.code, 250, "{mail:?}");
    for rcpt in [
        "RCPT TO:<never@example.org> NOTIFY=NEVER",
        "RCPT TO:<kept@example.org> NOTIFY=FAILURE ORCPT=rfc822;Kept+2Bx@example.org",
    ] {
        let answer = c.cmd(rcpt).await;
        assert_eq!(answer.code, 250, "{rcpt}: {answer:?}");
    }
    let answer = c
        .data(&message(
            Some("dsn-session-2"),
            "figures",
            "THE ORIGINAL BODY",
        ))
        .await;
    c.quit().await;
    let id = answer
        .queue_id()
        .unwrap_or_else(|| panic!("not queued: {answer:?}"));
    wait_state(&relay, &id, State::Failed).await;
    eventually(LIMIT, "a notice", || async {
        sink.messages()
            .iter()
            .any(|m| m.mail_from.is_empty())
            .then_some(())
    })
    .await;
    let got = notices(&sink).await;
    assert_eq!(got.len(), 1, "exactly one notice: {got:?}");
    assert_eq!(got[0].rcpt_to, ["s@example.com"]);
    let text = String::from_utf8(got[0].bytes.clone()).unwrap();
    assert!(
        text.contains("Final-Recipient: rfc822; kept@example.org\r\n"),
        "{text}"
    );
    assert!(
        !text.contains("never@example.org"),
        "NOTIFY=NEVER names no one: {text}"
    );
    assert!(
        text.contains("\r\nOriginal-Envelope-Id: env+1\r\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "\r\nOriginal-Recipient: rfc822; Kept+x@example.org\r\n\
             Final-Recipient: rfc822; kept@example.org\r\n"
        ),
        "{text}"
    );
    assert!(text.contains("Content-Type: text/rfc822-headers"), "{text}");
    assert!(
        text.contains("X-Bird-Idempotency-Key: dsn-session-2"),
        "{text}"
    );
    assert!(!text.contains("message/rfc822"), "{text}");
    assert!(!text.contains("THE ORIGINAL BODY"), "{text}");
    assert_eq!(relay.stored(&id).await.dsns.len(), 1);
}
