//! The request fingerprint (DESIGN §1): blake3 over a canonical, length-prefixed encoding of
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

    /// The recipient set: sorted and de-duplicated, so order and repeats do not matter.
    pub(crate) fn recipients(&mut self, rcpts: &[String]) {
        let mut set: Vec<&str> = rcpts.iter().map(String::as_str).collect();
        set.sort_unstable();
        set.dedup();
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
/// transactions (DESIGN §1 "Split transactions") share it.
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
}
