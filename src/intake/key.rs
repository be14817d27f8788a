//! Reading, validating and deriving the idempotency key (DESIGN §1). Pure functions.

use serde::{Deserialize, Serialize};

use super::fingerprint::{Fingerprint, Hasher};
use crate::smtp::session::Envelope;

pub const KEY_HEADER: &str = "X-Bird-Idempotency-Key";
pub const MAX_KEY_CHARS: usize = 255;

/// What to do with a message that carries no key header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MissingKey {
    /// Derive a deterministic key (DESIGN §1) and add it to the stored message.
    #[default]
    Derive,
    /// Accept and forward without deduplication.
    Pass,
    /// Refuse the message.
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    Header,
    MessageId,
    Content,
}

impl KeySource {
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::Header => "header",
            KeySource::MessageId => "message-id",
            KeySource::Content => "content",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemKey {
    pub value: String,
    pub source: KeySource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyHeader {
    Absent,
    Present(String),
    /// Empty, too long, control characters, not UTF-8, or several differing values (E01001).
    Invalid,
}

/// Undoes header folding (RFC 5322 §2.2.3: remove CRLF before WSP) and trims the value.
fn unfold(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    Some(
        text.replace("\r\n", "")
            .trim_matches([' ', '\t'])
            .to_string(),
    )
}

pub fn is_valid_key(key: &str) -> bool {
    let count = key.chars().count();
    (1..=MAX_KEY_CHARS).contains(&count) && !key.chars().any(char::is_control)
}

/// Interprets every raw value of the key header found in a message.
pub fn read_key_header(raw_values: &[Vec<u8>]) -> KeyHeader {
    let mut found: Option<String> = None;
    for raw in raw_values {
        let Some(value) = unfold(raw).filter(|v| is_valid_key(v)) else {
            return KeyHeader::Invalid;
        };
        match &found {
            Some(previous) if *previous != value => return KeyHeader::Invalid,
            _ => found = Some(value),
        }
    }
    found.map_or(KeyHeader::Absent, KeyHeader::Present)
}

/// A derived key: `d1-` + hex(blake3(...)). With a Message-ID the envelope is bound in, since
/// one Message-ID is legitimately sent in separate transactions to different recipients.
pub fn derive_key(
    scope: &str,
    message_id: Option<&str>,
    envelope: &Envelope,
    fingerprint: &Fingerprint,
) -> IdemKey {
    match message_id {
        Some(id) => {
            let mut h = Hasher::new("idemrelay derived key from message-id v1");
            h.field(scope.as_bytes());
            h.field(id.as_bytes());
            h.field(envelope.mail_from.as_bytes());
            h.recipients(&envelope.rcpt_to);
            IdemKey {
                value: format!("d1-{}", h.finish().to_hex()),
                source: KeySource::MessageId,
            }
        }
        None => {
            let mut h = Hasher::new("idemrelay derived key from fingerprint v1");
            h.field(fingerprint.as_bytes());
            IdemKey {
                value: format!("d1-{}", h.finish().to_hex()),
                source: KeySource::Content,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smtp::session::BodyType;

    fn v(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn header_values_table() {
        let long = "k".repeat(255);
        let too_long = "k".repeat(256);
        let cases: Vec<(Vec<Vec<u8>>, KeyHeader)> = vec![
            (vec![], KeyHeader::Absent),
            (vec![v(" abc")], KeyHeader::Present("abc".into())),
            (
                vec![v(" abc\r\n def")],
                KeyHeader::Present("abc def".into()),
            ),
            (vec![v("\r\n\tabc")], KeyHeader::Present("abc".into())),
            (
                vec![v(" abc"), v(" abc ")],
                KeyHeader::Present("abc".into()),
            ),
            (vec![v(" abc"), v(" abd")], KeyHeader::Invalid),
            (vec![v(" ")], KeyHeader::Invalid),
            (
                vec![v(&format!(" {long}"))],
                KeyHeader::Present(long.clone()),
            ),
            (vec![v(&format!(" {too_long}"))], KeyHeader::Invalid),
            (vec![v(" a\x01b")], KeyHeader::Invalid),
            (vec![v(" a\tb")], KeyHeader::Invalid),
            (vec![vec![b' ', 0xff, 0xfe]], KeyHeader::Invalid),
            (vec![v(" ключ-✓")], KeyHeader::Present("ключ-✓".into())),
        ];
        for (input, want) in cases {
            assert_eq!(read_key_header(&input), want, "{input:?}");
        }
    }

    fn env(rcpts: &[&str]) -> Envelope {
        Envelope {
            mail_from: "a@example.com".into(),
            rcpt_to: rcpts.iter().map(|s| s.to_string()).collect(),
            body: BodyType::SevenBit,
            smtputf8: false,
        }
    }

    #[test]
    fn derived_keys_are_deterministic_and_bind_the_envelope() {
        let fp = Fingerprint::from_bytes([7; 32]);
        let a = derive_key("s", Some("m@x"), &env(&["b@x", "c@x"]), &fp);
        let a_again = derive_key("s", Some("m@x"), &env(&["c@x", "b@x", "b@x"]), &fp);
        let other_rcpts = derive_key("s", Some("m@x"), &env(&["b@x"]), &fp);
        let other_scope = derive_key("t", Some("m@x"), &env(&["b@x", "c@x"]), &fp);
        assert_eq!(a, a_again);
        assert_eq!(a.source, KeySource::MessageId);
        assert!(a.value.starts_with("d1-") && a.value.len() == 3 + 64);
        assert_ne!(a.value, other_rcpts.value);
        assert_ne!(a.value, other_scope.value);

        let c = derive_key("s", None, &env(&["b@x"]), &fp);
        let c2 = derive_key("s", None, &env(&["b@x"]), &Fingerprint::from_bytes([8; 32]));
        assert_eq!(c.source, KeySource::Content);
        assert_ne!(c.value, c2.value);
        assert!(is_valid_key(&c.value));
    }
}
