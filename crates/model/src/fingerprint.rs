//! The request fingerprint (docs/concepts/contract.md "What the relay answers at the end of DATA"): blake3 over a canonical, length-prefixed encoding of
//! everything that makes two submissions "the same request", the delivery requests (DSN
//! parameters, REQUIRETLS) included when there are any.

use crate::mail::requests::{parse_notify, parse_orcpt};
use crate::mail::{DeliveryRequests, Envelope, Fingerprint};

/// Domain-separated, length-prefixed hashing so that no two field lists encode alike.
pub struct Hasher(blake3::Hasher);

impl Hasher {
    pub fn new(domain: &str) -> Self {
        let mut h = Hasher(blake3::Hasher::new());
        h.field(domain.as_bytes());
        h
    }

    pub fn field(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    /// The recipient set: sorted, each mailbox once (a domain in another case is the same
    /// mailbox: `mail::recipient_set`), so order and repeats do not matter.
    pub fn recipients(&mut self, rcpts: &[String]) {
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

    pub fn finish(&self) -> Fingerprint {
        Fingerprint::from_bytes(*self.0.finalize().as_bytes())
    }
}

pub fn fingerprint(scope: &str, envelope: &Envelope, message: &[u8]) -> Fingerprint {
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
pub fn key_fingerprint(scope: &str, envelope: &Envelope, message: &[u8]) -> Fingerprint {
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
pub fn message_fingerprint(scope: &str, envelope: &Envelope, message: &[u8]) -> Fingerprint {
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

/// Length of the leading trace fields (`Received:`, `Return-Path:`, continuation lines
/// included). They change from hop to hop, so the fingerprint leaves them out.
pub fn trace_prefix_len(message: &[u8]) -> usize {
    let mut pos = 0;
    let mut in_trace = false;
    while pos < message.len() {
        let line_end = message[pos..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(message.len(), |i| pos + i + 2);
        let line = &message[pos..line_end];
        let continuation = matches!(line.first(), Some(b' ' | b'\t'));
        let is_trace =
            starts_with_field(line, b"received") || starts_with_field(line, b"return-path");
        if (continuation && in_trace) || is_trace {
            in_trace = true;
            pos = line_end;
        } else {
            break;
        }
    }
    pos
}

fn starts_with_field(line: &[u8], name: &[u8]) -> bool {
    line.len() > name.len()
        && line[..name.len()].eq_ignore_ascii_case(name)
        && line[name.len()..]
            .iter()
            .find(|&&b| b != b' ' && b != b'\t')
            == Some(&b':')
}
