use std::time::Duration;

use super::*;
use crate::delivery::outcome::{Heard, Phase};
use crate::mail::requests::RecipientRequests;
use crate::mail::DeliveryRequests;

const ACCEPTED_MS: i64 = 1_700_000_000_000;
const HOUR_MS: i64 = 3_600_000;

fn job(requests: DeliveryRequests) -> Claimed {
    Claimed {
        id: "01HZX".into(),
        scope: "team-a".into(),
        key: Some("k-1".into()),
        mail_from: "alice@example.com".into(),
        rcpt_to: vec!["bob@example.org".into(), "carol@example.net".into()],
        eight_bit: false,
        smtputf8: false,
        requests,
        content: b"From: alice@example.com\r\nSubject: figures\r\n\r\nTHE BODY LINE\r\n".to_vec(),
        accepted_at_ms: ACCEPTED_MS,
        attempts: 3,
        first_attempt_at_ms: Some(ACCEPTED_MS),
        any_unknown: false,
        recovered: false,
        now_ms: ACCEPTED_MS + 5 * HOUR_MS,
        token: 7,
    }
}

fn notify(pairs: &[(&str, &str, Option<&str>)]) -> DeliveryRequests {
    let mut r = DeliveryRequests::default();
    for (rcpt, notify, orcpt) in pairs {
        r.recipients.insert(
            rcpt.to_string(),
            RecipientRequests {
                notify: Some(notify.to_string()),
                orcpt: orcpt.map(str::to_string),
            },
        );
    }
    r
}

fn deferred(reply: &str) -> Outcome {
    Outcome::Transient {
        phase: Phase::Rcpt,
        heard: Heard::Reply(451),
        reply: reply.into(),
    }
}

fn notice(j: &Claimed, outcome: &Outcome, waited_ms: i64) -> Option<NewRecord> {
    delay_dsn_for(
        j,
        outcome,
        &RetryPolicy::default(),
        "relay.example.com",
        "D3".into(),
        ACCEPTED_MS + waited_ms,
    )
}

fn text(record: &NewRecord) -> String {
    String::from_utf8(record.content.clone().unwrap()).unwrap()
}

#[test]
fn names_only_the_recipients_that_asked_with_the_fields_of_a_delay() {
    let mut requests = notify(&[(
        "bob@example.org",
        "DELAY,FAILURE",
        Some("rfc822;bob@example.org"),
    )]);
    requests.envid = Some("batch-7".into());
    let j = job(requests);
    let n = notice(&j, &deferred("451 4.2.1 mailbox busy"), 5 * HOUR_MS).expect("a notice");
    let t = text(&n);
    assert_eq!(n.envelope.mail_from, "", "sent from the null sender");
    assert_eq!(n.envelope.rcpt_to, ["alice@example.com"]);
    assert_eq!(n.dsn_of.as_deref(), Some("01HZX"));
    assert_eq!(
        n.key.as_deref(),
        Some(delayed_dsn_key("team-a", "01HZX").as_str())
    );
    assert!(
        t.contains("Subject: Delivery Status Notification (Delay)\r\n"),
        "{t}"
    );
    assert!(
        t.contains("Final-Recipient: rfc822; bob@example.org\r\n"),
        "{t}"
    );
    assert!(
        !t.contains("carol@example.net"),
        "carol sent no NOTIFY: {t}"
    );
    assert!(t.contains("Action: delayed\r\n"), "{t}");
    assert!(t.contains("Status: 4.2.1\r\n"), "{t}");
    assert!(t.contains("Original-Envelope-Id: batch-7\r\n"), "{t}");
    assert!(
        t.contains("Original-Recipient: rfc822; bob@example.org\r\n"),
        "{t}"
    );
    // Accepted plus the default deadline of 48 hours.
    let until = super::super::report::rfc822_date(ACCEPTED_MS / 1000 + 48 * 3600);
    assert!(t.contains(&format!("Will-Retry-Until: {until}\r\n")), "{t}");
    assert!(t.contains("Content-Type: text/rfc822-headers"), "{t}");
    assert!(!t.contains("THE BODY LINE"), "headers only: {t}");
}

#[test]
fn a_reply_without_a_4xx_enhanced_code_reads_4_0_0() {
    let j = job(notify(&[("carol@example.net", "DELAY", None)]));
    for reply in ["451 try later", "451 5.1.1 odd", "connection refused"] {
        let t = text(&notice(&j, &deferred(reply), 5 * HOUR_MS).unwrap());
        assert!(t.contains("Status: 4.0.0\r\n"), "{reply}: {t}");
        assert!(t.contains("Final-Recipient: rfc822; carol@example.net\r\n"));
        assert!(!t.contains("bob@example.org"));
    }
}

#[test]
fn only_when_asked_after_long_enough_and_never_to_the_null_sender() {
    let late = 4 * HOUR_MS;
    let asked = job(notify(&[("bob@example.org", "DELAY", None)]));
    let o = deferred("451 4.2.1 busy");
    assert!(
        notice(&asked, &o, late).is_some(),
        "exactly delay_notice_after"
    );
    assert!(notice(&asked, &o, late - 1).is_none(), "not yet");
    // No NOTIFY at all, or NOTIFY without DELAY: none.
    assert!(notice(&job(DeliveryRequests::default()), &o, late).is_none());
    let failure_only = job(notify(
        &[
            ("bob@example.org", "FAILURE"),
            ("carol@example.net", "SUCCESS,FAILURE"),
        ]
        .map(|(r, n)| (r, n, None)),
    ));
    assert!(notice(&failure_only, &o, late).is_none());
    let mut null = asked.clone();
    null.mail_from.clear();
    assert!(notice(&null, &o, late).is_none());
    // Zero turns delay notices off.
    let off = RetryPolicy {
        delay_notice_after: Duration::ZERO,
        ..RetryPolicy::default()
    };
    let n = delay_dsn_for(
        &asked,
        &o,
        &off,
        "relay.example.com",
        "D".into(),
        ACCEPTED_MS + 100 * HOUR_MS,
    );
    assert!(n.is_none());
}

#[test]
fn its_key_is_the_records_and_apart_from_the_other_notices() {
    let k = delayed_dsn_key("team-a", "01HZX");
    assert_eq!(k, delayed_dsn_key("team-a", "01HZX"));
    assert_ne!(k, delayed_dsn_key("team-a", "01HZY"));
    assert_ne!(k, delayed_dsn_key("team-b", "01HZX"));
    assert_ne!(k, super::super::report::dsn_key("team-a", "01HZX"));
    assert_ne!(k, super::super::notice::relayed_dsn_key("team-a", "01HZX"));
    // Two attempts build the same key: the second insert is a no-op in the store.
    let j = job(notify(&[("bob@example.org", "DELAY", None)]));
    let o = deferred("451 4.2.1 busy");
    let first = notice(&j, &o, 5 * HOUR_MS).unwrap();
    let second = notice(&j, &o, 6 * HOUR_MS).unwrap();
    assert_eq!(first.key, second.key);
}
