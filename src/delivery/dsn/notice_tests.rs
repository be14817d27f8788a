use super::*;
use crate::delivery::outcome::Phase;
use crate::mail::requests::RecipientRequests;

const ORIGINAL: &[u8] = b"From: alice@example.com\r\n\
Subject: figures\r\n\
\r\n\
THE BODY LINE\r\n";

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
        content: ORIGINAL.to_vec(),
        accepted_at_ms: 1_700_000_000_000,
        attempts: 1,
        first_attempt_at_ms: Some(1_700_000_000_000),
        any_unknown: false,
        recovered: false,
        now_ms: 1_700_003_600_000,
        token: 7,
    }
}

fn notify(pairs: &[(&str, &str)]) -> DeliveryRequests {
    let mut r = DeliveryRequests::default();
    for (rcpt, notify) in pairs {
        r.recipients.insert(
            rcpt.to_string(),
            RecipientRequests {
                notify: Some(notify.to_string()),
                orcpt: None,
            },
        );
    }
    r
}

fn refused() -> Outcome {
    Outcome::Permanent {
        phase: Phase::Rcpt,
        code: 550,
        reply: "550 5.1.1 user unknown".into(),
    }
}

fn text(record: &NewRecord) -> String {
    String::from_utf8(record.content.clone().unwrap()).unwrap()
}

fn failure(j: &Claimed) -> Option<NewRecord> {
    dsn_for(
        j,
        &refused(),
        "relay.example.com",
        "D1".into(),
        1_700_003_600,
    )
}

fn relayed(j: &Claimed, upstream_offers_dsn: bool) -> Option<NewRecord> {
    relayed_dsn_for(
        j,
        "250 2.0.0 OK S7",
        upstream_offers_dsn,
        "relay.example.com",
        "D2".into(),
        1_700_003_600,
    )
}

#[test]
fn who_is_notified_follows_notify() {
    let j = job(notify(&[
        ("bob@example.org", "NEVER"),
        ("carol@example.net", "success"),
    ]));
    assert!(notified(&j, Action::Failed).is_empty());
    assert_eq!(notified(&j, Action::Relayed), ["carol@example.net"]);
    // No NOTIFY: failures only.
    let plain = job(DeliveryRequests::default());
    assert_eq!(notified(&plain, Action::Failed), plain.rcpt_to);
    assert!(notified(&plain, Action::Relayed).is_empty());
    let mixed = job(notify(&[("bob@example.org", "NEVER")]));
    assert_eq!(notified(&mixed, Action::Failed), ["carol@example.net"]);
}

#[test]
fn no_failure_notice_when_every_recipient_declined_it() {
    let j = job(notify(&[
        ("bob@example.org", "NEVER"),
        ("carol@example.net", "SUCCESS,DELAY"),
    ]));
    assert!(failure(&j).is_none());
    let one = job(notify(&[("bob@example.org", "NEVER")]));
    let t = text(&failure(&one).unwrap());
    assert!(
        t.contains("Final-Recipient: rfc822; carol@example.net\r\n"),
        "{t}"
    );
    assert!(
        !t.contains("Final-Recipient: rfc822; bob@example.org"),
        "{t}"
    );
}

#[test]
fn ret_decides_what_returns() {
    let hdrs = job(DeliveryRequests {
        ret: Some("HDRS".into()),
        ..Default::default()
    });
    let t = text(&failure(&hdrs).unwrap());
    assert!(t.contains("Content-Type: text/rfc822-headers"), "{t}");
    assert!(!t.contains("THE BODY LINE"), "{t}");

    let full = job(DeliveryRequests {
        ret: Some("full".into()),
        ..Default::default()
    });
    assert_eq!(returned(&full, Action::Failed), Returned::Full);
    let t = text(&failure(&full).unwrap());
    assert!(t.contains("Content-Type: message/rfc822"), "{t}");
    assert!(t.contains("THE BODY LINE"), "{t}");
    assert!(t.contains("Your message is attached."), "{t}");
    // A relayed notice returns headers whatever RET says.
    let mut success = full.clone();
    success.requests = DeliveryRequests {
        ret: Some("FULL".into()),
        ..notify(&[("bob@example.org", "SUCCESS")])
    };
    assert_eq!(returned(&success, Action::Relayed), Returned::Headers);

    // REQUIRETLS: headers only (RFC 8689 §5), RET=FULL or not.
    let mut secret = full.clone();
    secret.requests.require_tls = true;
    assert_eq!(returned(&secret, Action::Failed), Returned::Headers);
    let record = failure(&secret).unwrap();
    assert!(!text(&record).contains("THE BODY LINE"));
    assert!(
        record.envelope.requests.require_tls,
        "the notice asks for REQUIRETLS too"
    );
    assert!(!failure(&full).unwrap().envelope.requests.require_tls);

    let mut big = full.clone();
    big.content = [ORIGINAL, &b"x".repeat(100).repeat(MAX_RETURNED / 100)[..]].concat();
    big.content.extend_from_slice(b"\r\n");
    assert_eq!(returned(&big, Action::Failed), Returned::HeadersTooLarge);
    let t = text(&failure(&big).unwrap());
    assert!(t.contains("larger than the relay returns"), "{t}");
    assert!(!t.contains("xxxxxxxxxx"));

    let mut long_line = full.clone();
    long_line.content = [ORIGINAL, &b"y".repeat(1200), b"\r\n"].concat();
    assert_eq!(returned(&long_line, Action::Failed), Returned::HeadersUnfit);
    let mut eight = full.clone();
    eight.content = [ORIGINAL, "gr\u{fc}\u{df}e\r\n".as_bytes()].concat();
    assert_eq!(returned(&eight, Action::Failed), Returned::HeadersUnfit);
    eight.eight_bit = true;
    assert_eq!(returned(&eight, Action::Failed), Returned::Full);
    let t = text(&failure(&eight).unwrap());
    assert!(t.contains("Content-Transfer-Encoding: 8bit"), "{t}");
}

#[test]
fn envelope_id_and_original_recipient() {
    let mut r = DeliveryRequests {
        envid: Some("QQ+2B314+20x".into()),
        ..Default::default()
    };
    r.recipients.insert(
        "bob@example.org".into(),
        RecipientRequests {
            notify: None,
            orcpt: Some("rfc822;b+2Bob@example.org".into()),
        },
    );
    let t = text(&failure(&job(r)).unwrap());
    let report = t.split("message/delivery-status").nth(1).unwrap();
    let report = report
        .split("\r\n\r\n")
        .skip(1)
        .collect::<Vec<_>>()
        .join("\r\n\r\n");
    assert!(
        report.starts_with(
            "Original-Envelope-Id: QQ+314 x\r\nReporting-MTA: dns; relay.example.com\r\n"
        ),
        "{report}"
    );
    assert!(
        report.contains(
            "\r\nOriginal-Recipient: rfc822; b+ob@example.org\r\nFinal-Recipient: rfc822; bob@example.org\r\n"
        ),
        "{report}"
    );
    assert!(
        report.contains("\r\n\r\nFinal-Recipient: rfc822; carol@example.net\r\n"),
        "{report}"
    );
    assert_eq!(super::super::report::original_envelope_id("a+0Ab"), "a+0Ab");
}

/// RFC 3464 §2.3.1 / RFC 3461 §4.2 / RFC 6533 §3: always `addr-type; address` with one space,
/// the address out of its xtext, and 7-bit (`utf-8` with `\x{HEX}` escapes) when it is not
/// printable ASCII.
#[test]
fn original_recipient_is_type_space_decoded_address() {
    let table: &[(&str, Option<&str>)] = &[
        ("rfc822;bob@example.org", Some("rfc822; bob@example.org")),
        (
            "RFC822;b+2Bob@example.org",
            Some("RFC822; b+ob@example.org"),
        ),
        ("rfc822;j+C3+B6rg@x", Some("utf-8; j\\x{F6}rg@x")),
        // utf-8 with raw UTF-8 in its xtext (as an 8-bit client would send it).
        ("utf-8;u+C3+BC@x", Some("utf-8; u\\x{FC}@x")),
        ("UTF-8;u+C3+BC@x", Some("utf-8; u\\x{FC}@x")),
        // utf-8-addr-xtext inside xtext: the sender's escapes kept, not escaped twice.
        ("utf-8;u+5Cx{FC}@x", Some("utf-8; u\\x{FC}@x")),
        ("utf-8;u+5Cx{fc}+C3+A9@x", Some("utf-8; u\\x{FC}\\x{E9}@x")),
        ("utf-8;plain@x", Some("utf-8; plain@x")),
        // A `+` is no QCHAR of utf-8-addr-xtext.
        ("utf-8;a+2Bb@x", Some("utf-8; a\\x{2B}b@x")),
        // A malformed escape is a backslash like any other.
        (
            "utf-8;u+5Cx{ZZ}+C3+BC@x",
            Some("utf-8; u\\x{5C}x{ZZ}\\x{FC}@x"),
        ),
        // An emoji beyond the BMP.
        ("rfc822;+F0+9F+93+A7@x", Some("utf-8; \\x{1F4E7}@x")),
        ("x400;c+3Dde", Some("x400; c=de")),
        // Another type that is not ASCII has no 7-bit form of its own: its xtext.
        ("x400;c+C3+BC", Some("x400; c+C3+BC")),
        // Not xtext: as sent, still `type; address`.
        ("x400;c=de", Some("x400; c=de")),
        ("rfc822;bad+zz@x", Some("rfc822; bad+zz@x")),
        ("no-type-at-all", None),
        (";x@y", None),
    ];
    for (orcpt, want) in table {
        assert_eq!(
            super::super::report::original_recipient(orcpt).as_deref(),
            *want,
            "{orcpt}"
        );
    }
}

#[test]
fn relayed_notice_only_when_the_upstream_cannot_tell() {
    let j = job(notify(&[("bob@example.org", "SUCCESS,FAILURE")]));
    assert!(relayed(&j, true).is_none(), "a DSN upstream has the duty");
    assert!(relayed(&job(DeliveryRequests::default()), false).is_none());
    let mut null_sender = j.clone();
    null_sender.mail_from = String::new();
    assert!(relayed(&null_sender, false).is_none());
    assert!(failure(&null_sender).is_none());

    let record = relayed(&j, false).unwrap();
    let key = relayed_dsn_key("team-a", "01HZX");
    assert_eq!(record.key.as_deref(), Some(key.as_str()));
    assert_ne!(key, dsn_key("team-a", "01HZX"));
    assert_eq!(record.dsn_of.as_deref(), Some("01HZX"));
    assert_eq!(record.envelope.rcpt_to, ["alice@example.com"]);
    let t = text(&record);
    assert!(
        t.contains("Subject: Delivery Status Notification (Relayed)\r\n"),
        "{t}"
    );
    assert!(
        t.contains(
            "Final-Recipient: rfc822; bob@example.org\r\nAction: relayed\r\nStatus: 2.0.0\r\n\
             Diagnostic-Code: smtp; 250 2.0.0 OK S7\r\n"
        ),
        "{t}"
    );
    assert!(!t.contains("carol@example.net"), "only who asked: {t}");
    assert!(!t.contains("THE BODY LINE"));
    // Deterministic: the same inputs give the same bytes.
    assert_eq!(relayed(&j, false).unwrap().content, record.content);
}

#[test]
fn a_requiretls_refusal_is_a_message_failure_not_an_account_one() {
    use crate::delivery::decide::{decide, BreakerInput, JobFacts};
    use crate::delivery::extensions::REQUIRETLS_REFUSED;
    use crate::delivery::retry::{Next, RetryPolicy};
    let refusal = crate::delivery::extensions::requiretls_refused(REQUIRETLS_REFUSED);
    assert!(crate::delivery::extensions::is_requiretls_refusal(&refusal));
    assert!(!crate::delivery::extensions::is_requiretls_refusal(
        &refused()
    ));
    let j = job(DeliveryRequests {
        require_tls: true,
        ..Default::default()
    });
    let d = decide(
        &RetryPolicy::default(),
        &JobFacts::of(&j),
        &refusal,
        j.now_ms,
        0.5,
    );
    assert_eq!(d.next, Next::Failed);
    assert_eq!(d.pause, None);
    assert_eq!(d.breaker, BreakerInput::Neutral);
    let t = text(&dsn_for(&j, &refusal, "relay.example.com", "D3".into(), 0).unwrap());
    assert!(t.contains("Status: 5.7.30\r\n"), "{t}");
    assert!(t.contains("The relay did not send it"), "{t}");
    assert!(!t.contains("The upstream server replied"), "{t}");
    assert!(
        t.contains("Diagnostic-Code: smtp; 550 5.7.30 REQUIRETLS support required"),
        "{t}"
    );
}
