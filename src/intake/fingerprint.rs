//! The request fingerprint (docs/concepts/contract.md "What the relay answers at the end of DATA"): blake3 over a canonical, length-prefixed encoding of
//! everything that makes two submissions "the same request", the delivery requests (DSN
//! parameters, REQUIRETLS) included when there are any.

use crate::mail::requests::{parse_notify, parse_orcpt};
use crate::mail::{DeliveryRequests, Envelope, Fingerprint};

use super::message::trace_prefix_len;

/// Domain-separated, length-prefixed hashing so that no two field lists encode alike.
pub(crate) struct Hasher(blake3::Hasher);

impl Hasher {
    pub(crate) fn new(domain: &str) -> Self {
        let mut h = Hasher(blake3::Hasher::new());
        h.field(domain.as_bytes());
        h
    }

    pub(crate) fn field(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    /// The recipient set: sorted, each mailbox once (a domain in another case is the same
    /// mailbox: `mail::recipient_set`), so order and repeats do not matter.
    pub(crate) fn recipients(&mut self, rcpts: &[String]) {
        let set = crate::mail::recipient_set(rcpts);
        self.field(&(set.len() as u64).to_le_bytes());
        for r in set {
            self.field(r.as_bytes());
        }
    }

    /// What MAIL asked (RET, ENVID, REQUIRETLS), in a canonical form: RET's case does not
    /// matter, ENVID is compared as sent (its case is the client's data).
    fn mail_requests(&mut self, r: &DeliveryRequests) {
        self.field(
            r.ret
                .as_deref()
                .unwrap_or("")
                .to_ascii_uppercase()
                .as_bytes(),
        );
        self.field(&[u8::from(r.envid.is_some())]);
        self.field(r.envid.as_deref().unwrap_or("").as_bytes());
        self.field(&[u8::from(r.require_tls)]);
    }

    /// NOTIFY and ORCPT by recipient, canonical: NOTIFY as the set it names (order and case
    /// aside), ORCPT's address type without case and its address decoded.
    fn recipient_requests(&mut self, r: &DeliveryRequests) {
        self.field(&(r.recipients.len() as u64).to_le_bytes());
        for (rcpt, q) in &r.recipients {
            self.field(rcpt.as_bytes());
            let notify = q.notify.as_deref().map(|v| match parse_notify(v) {
                Ok(on) => [on.success, on.failure, on.delay].map(u8::from).to_vec(),
                // Not reachable from a session (it validates); hashed as sent then.
                Err(_) => v.as_bytes().to_vec(),
            });
            self.field(&[u8::from(notify.is_some())]);
            self.field(&notify.unwrap_or_default());
            let orcpt = q.orcpt.as_deref().map(|v| match parse_orcpt(v) {
                Ok((kind, address)) => format!("{};{address}", kind.to_ascii_lowercase()),
                Err(_) => v.to_string(),
            });
            self.field(&[u8::from(orcpt.is_some())]);
            self.field(orcpt.unwrap_or_default().as_bytes());
        }
    }

    pub(crate) fn finish(&self) -> Fingerprint {
        Fingerprint::from_bytes(*self.0.finalize().as_bytes())
    }
}

pub(crate) fn fingerprint(scope: &str, envelope: &Envelope, message: &[u8]) -> Fingerprint {
    let mut h = request_hasher(scope, envelope, message);
    // The delivery requests are part of the request, but only when there are any: the
    // fingerprint of ordinary mail (and of every record stored before they were read) is
    // what it always was.
    let requests = &envelope.requests;
    if !requests.is_empty() {
        h.field(b"requests");
        h.mail_requests(requests);
        h.recipient_requests(requests);
    }
    h.finish()
}

/// The fingerprint as if the envelope had no delivery requests: what a key derived from the
/// content covers, so that a retry asking for other requests is the same key (answered as a
/// conflict), never a second message. The same as `fingerprint` for ordinary mail.
pub(crate) fn key_fingerprint(scope: &str, envelope: &Envelope, message: &[u8]) -> Fingerprint {
    request_hasher(scope, envelope, message).finish()
}

fn request_hasher(scope: &str, envelope: &Envelope, message: &[u8]) -> Hasher {
    let mut h = Hasher::new("idemrelay fingerprint v1");
    h.field(scope.as_bytes());
    h.field(envelope.mail_from.as_bytes());
    h.recipients(&envelope.rcpt_to);
    h.field(envelope.body.as_str().as_bytes());
    h.field(&[u8::from(envelope.smtputf8)]);
    h.field(&message[trace_prefix_len(message)..]);
    h
}

/// The fingerprint without the recipient set: the parts of one message split across
/// transactions (docs/concepts/contract.md "Split transactions") share it. Of the delivery
/// requests it covers MAIL's (RET, ENVID, REQUIRETLS), the same for every part; NOTIFY and
/// ORCPT belong to each part's own recipients and are in its full fingerprint.
pub(crate) fn message_fingerprint(scope: &str, envelope: &Envelope, message: &[u8]) -> Fingerprint {
    let mut h = Hasher::new("idemrelay message fingerprint v1");
    h.field(scope.as_bytes());
    h.field(envelope.mail_from.as_bytes());
    h.field(envelope.body.as_str().as_bytes());
    h.field(&[u8::from(envelope.smtputf8)]);
    h.field(&message[trace_prefix_len(message)..]);
    let requests = &envelope.requests;
    if requests.ret.is_some() || requests.envid.is_some() || requests.require_tls {
        h.field(b"requests");
        h.mail_requests(requests);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::BodyType;

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
}
