//! The request fingerprint (docs/concepts/contract.md "What the relay answers at the end of DATA"): blake3 over a canonical, length-prefixed encoding of
//! everything that makes two submissions "the same request".

use crate::mail::{Envelope, Fingerprint};

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

    pub(crate) fn finish(&self) -> Fingerprint {
        Fingerprint::from_bytes(*self.0.finalize().as_bytes())
    }
}

pub(crate) fn fingerprint(scope: &str, envelope: &Envelope, message: &[u8]) -> Fingerprint {
    let mut h = Hasher::new("idemrelay fingerprint v1");
    h.field(scope.as_bytes());
    h.field(envelope.mail_from.as_bytes());
    h.recipients(&envelope.rcpt_to);
    h.field(envelope.body.as_str().as_bytes());
    h.field(&[u8::from(envelope.smtputf8)]);
    h.field(&message[trace_prefix_len(message)..]);
    h.finish()
}

/// The fingerprint without the recipient set: the parts of one message split across
/// transactions (docs/concepts/contract.md "Split transactions") share it.
pub(crate) fn message_fingerprint(scope: &str, envelope: &Envelope, message: &[u8]) -> Fingerprint {
    let mut h = Hasher::new("idemrelay message fingerprint v1");
    h.field(scope.as_bytes());
    h.field(envelope.mail_from.as_bytes());
    h.field(envelope.body.as_str().as_bytes());
    h.field(&[u8::from(envelope.smtputf8)]);
    h.field(&message[trace_prefix_len(message)..]);
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
