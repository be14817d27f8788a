//! The request fingerprint (the model's `fingerprint`) as intake uses it, with the keys it
//! derives from it.

use crate::mail::{BodyType, DeliveryRequests, Envelope, Fingerprint};
use idemrelay_model::fingerprint::*;

fn env() -> Envelope {
    Envelope {
        mail_from: "a@x".into(),
        rcpt_to: vec!["b@x".into(), "c@x".into()],
        body: BodyType::SevenBit,
        smtputf8: false,
        requests: Default::default(),
    }
}

#[test]
fn what_changes_the_fingerprint() {
    let msg = b"Subject: s\r\n\r\nbody\r\n";
    let base = fingerprint("s", &env(), msg);
    let mut reordered = env();
    reordered.rcpt_to = vec!["c@x".into(), "b@x".into(), "c@x".into()];
    assert_eq!(base, fingerprint("s", &reordered, msg));
    let traced =
        b"Received: from a\r\n\tby b; now\r\nReturn-Path: <a@x>\r\nSubject: s\r\n\r\nbody\r\n";
    assert_eq!(base, fingerprint("s", &env(), traced));

    assert_ne!(base, fingerprint("t", &env(), msg));
    assert_ne!(
        base,
        fingerprint("s", &env(), b"Subject: s\r\n\r\nbodY\r\n")
    );
    let mut e = env();
    e.body = BodyType::EightBitMime;
    assert_ne!(base, fingerprint("s", &e, msg));
    let mut e = env();
    e.smtputf8 = true;
    assert_ne!(base, fingerprint("s", &e, msg));
    let mut e = env();
    e.mail_from = String::new();
    assert_ne!(base, fingerprint("s", &e, msg));
    let mut e = env();
    e.rcpt_to.pop();
    assert_ne!(base, fingerprint("s", &e, msg));
    assert_eq!(base.to_hex().len(), 64);
    assert_eq!(Fingerprint::from_slice(base.as_bytes()), Some(base));
}

/// The requests change the fingerprint when there are any; without them it is the value
/// it always was (the fixed values below predate them). The derived key never covers
/// them: a retry with other requests is the same key, answered as a conflict.
#[test]
fn what_the_requests_change() {
    use crate::intake::key::derive_key;
    use crate::mail::requests::RecipientRequests;
    let msg = b"Subject: s\r\n\r\nbody\r\n";
    let plain = env();
    let base = fingerprint("s", &plain, msg);
    let base_message = message_fingerprint("s", &plain, msg);
    assert_eq!(base, key_fingerprint("s", &plain, msg));
    let with = |f: &dyn Fn(&mut DeliveryRequests)| {
        let mut e = env();
        f(&mut e.requests);
        e
    };
    let notify = |v: &str| {
        with(&|r: &mut DeliveryRequests| {
            r.recipients.insert(
                "b@x".into(),
                RecipientRequests {
                    notify: Some(v.into()),
                    orcpt: None,
                },
            );
        })
    };
    let ret = |v: &str| with(&|r: &mut DeliveryRequests| r.ret = Some(v.into()));
    // Spelled otherwise, the same request.
    assert_eq!(
        fingerprint("s", &notify("SUCCESS,FAILURE"), msg),
        fingerprint("s", &notify("failure,success"), msg)
    );
    assert_eq!(
        fingerprint("s", &ret("hdrs"), msg),
        fingerprint("s", &ret("HDRS"), msg)
    );
    // Asked otherwise, another request.
    let variants = [
        notify("SUCCESS"),
        notify("NEVER"),
        ret("HDRS"),
        ret("FULL"),
        with(&|r: &mut DeliveryRequests| r.envid = Some("e1".into())),
        with(&|r: &mut DeliveryRequests| r.require_tls = true),
        with(&|r: &mut DeliveryRequests| {
            r.recipients.insert(
                "b@x".into(),
                RecipientRequests {
                    notify: None,
                    orcpt: Some("rfc822;b@x".into()),
                },
            );
        }),
    ];
    let mut seen = vec![base];
    for e in &variants {
        let fp = fingerprint("s", e, msg);
        assert!(!seen.contains(&fp), "{:?}", e.requests);
        seen.push(fp);
        for message_id in [Some("m@x"), None] {
            let derived = derive_key("s", message_id, e, &key_fingerprint("s", e, msg)).value;
            assert_eq!(
                derived,
                derive_key("s", message_id, &plain, &base).value,
                "the derived key ignores the requests"
            );
        }
    }
    // Parts share MAIL's requests, not their recipients'.
    assert_eq!(
        message_fingerprint("s", &notify("SUCCESS"), msg),
        base_message
    );
    assert_ne!(message_fingerprint("s", &ret("HDRS"), msg), base_message);
}

fn env_to(rcpts: &[&str]) -> Envelope {
    Envelope {
        mail_from: "App@Example.COM".into(),
        rcpt_to: rcpts.iter().map(|r| r.to_string()).collect(),
        body: BodyType::SevenBit,
        smtputf8: true,
        requests: Default::default(),
    }
}

/// Envelopes without two spellings of one mailbox hash as they always have (the value is
/// what earlier versions computed), so a retry of a record they stored still replays after
/// an upgrade. Local parts that differ only in case are two mailboxes.
#[test]
fn the_fingerprint_of_an_envelope_without_case_duplicates_is_unchanged() {
    let msg = b"Subject: s\r\n\r\nbody\r\n";
    let e = env_to(&[
        "b@Example.NET",
        "a@example.net",
        "b@Example.NET",
        "B@example.net",
        "u@Bücher.example",
    ]);
    let fp = fingerprint("default", &e, msg);
    assert_eq!(
        fp.to_hex(),
        "dbda7880f8bbfa8d50963e41c697959c8df8c53c2b73e708a0ef9ebcf471012a"
    );
    let derived = crate::intake::key::derive_key("default", Some("m@x"), &e, &fp);
    assert_eq!(
        derived.value,
        "d1-66873cd78f650d305f53f950273bdad89fa7e2e341fab865d3e94a452cc509fe"
    );
}

/// Two spellings of one mailbox (the domain in another case) are one recipient, and the
/// spelling kept is the one the SMTP session keeps: the one that sorts first, whatever the
/// order they came in. The derived key's recipient set follows the same rule.
#[test]
fn spellings_of_one_mailbox_are_one_recipient() {
    let msg = b"Subject: s\r\n\r\nbody\r\n";
    let fp = |rcpts: &[&str]| fingerprint("s", &env_to(rcpts), msg);
    let derived = |rcpts: &[&str]| {
        let e = env_to(rcpts);
        crate::intake::key::derive_key("s", Some("m@x"), &e, &fingerprint("s", &e, msg)).value
    };
    let forwarded = ["dup@EXAMPLE.NET", "u@BÜCHER.example"];
    for sent in [
        &[
            "dup@example.net",
            "dup@EXAMPLE.NET",
            "u@bücher.example",
            "u@BÜCHER.example",
        ][..],
        &[
            "u@BÜCHER.example",
            "dup@EXAMPLE.NET",
            "u@Bücher.example",
            "dup@Example.Net",
        ],
    ] {
        assert_eq!(fp(sent), fp(&forwarded), "{sent:?}");
        assert_eq!(derived(sent), derived(&forwarded), "{sent:?}");
    }
    assert_ne!(fp(&["Dup@example.net"]), fp(&["dup@example.net"]));
}
