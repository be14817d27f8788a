//! Reading, validating and deriving the idempotency key (DESIGN §1). Pure functions.

use super::fingerprint::Hasher;
use crate::mail::{is_valid_key, Envelope, Fingerprint, MAX_KEY_CHARS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeySource {
    Header,
    MessageId,
    Content,
}

impl KeySource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            KeySource::Header => "header",
            KeySource::MessageId => "message-id",
            KeySource::Content => "content",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdemKey {
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
pub(crate) fn derive_key(
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

/// The key the upstream sees for part `part` of (scope, key) (DESIGN §1): one upstream account
/// is one key space, so it must be unique per scope and part across everything the relay sends
/// there. The client's key unchanged for part 1 of a scope that keeps its clients' keys (alone
/// on its upstream, and that upstream's key-space owner in the store: the common case);
/// otherwise `u1-<scope tag>-<part>-<key>`, where the scope tag is 16 hex digits of a
/// digest of the scope, or, when that would pass 255 characters, `u1-<64 hex digits>` of a
/// digest of all three. Derived keys are already unique per scope and never split (their
/// recipients are part of them), so they go unchanged.
pub(crate) fn upstream_key(
    scope: &str,
    key: &IdemKey,
    part: u32,
    keeps_client_key: bool,
) -> String {
    if key.source != KeySource::Header || (part == 1 && keeps_client_key) {
        return key.value.clone();
    }
    let mut tag = Hasher::new("idemrelay upstream scope tag v1");
    tag.field(scope.as_bytes());
    let readable = format!("u1-{}-{part}-{}", &tag.finish().to_hex()[..16], key.value);
    if readable.chars().count() <= MAX_KEY_CHARS {
        return readable;
    }
    let mut h = Hasher::new("idemrelay upstream key v1");
    h.field(scope.as_bytes());
    h.field(key.value.as_bytes());
    h.field(&part.to_le_bytes());
    format!("u1-{}", h.finish().to_hex())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_key_the_upstream_sees_is_unique_per_scope_and_part() {
        let header = |v: &str| IdemKey {
            value: v.into(),
            source: KeySource::Header,
        };
        const KEEPS: bool = true;
        const SHARED: bool = false;
        let k = header("welcome-customer-1");
        // The common case: the client's key, unchanged.
        assert_eq!(upstream_key("alice", &k, 1, KEEPS), "welcome-customer-1");
        let alice2 = upstream_key("alice", &k, 2, KEEPS);
        let shared_alice = upstream_key("alice", &k, 1, SHARED);
        let shared_bob = upstream_key("bob", &k, 1, SHARED);
        assert!(alice2.starts_with("u1-") && alice2.ends_with("-2-welcome-customer-1"));
        let all = [&k.value, &alice2, &shared_alice, &shared_bob];
        for (i, a) in all.iter().enumerate() {
            assert!(is_valid_key(a), "{a}");
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // Deterministic: every attempt and every retry sends the same.
        assert_eq!(upstream_key("bob", &k, 1, SHARED), shared_bob);
        // Too long for the readable form: a digest, still valid and still unique.
        let long = header(&"k".repeat(250));
        let (a, b) = (
            upstream_key("alice", &long, 2, KEEPS),
            upstream_key("alice", &long, 3, KEEPS),
        );
        assert!(is_valid_key(&a) && a.len() == 67 && a != b, "{a}");
        // Derived keys carry the scope already and never split.
        let derived = IdemKey {
            value: "d1-abc".into(),
            source: KeySource::MessageId,
        };
        assert_eq!(upstream_key("alice", &derived, 1, SHARED), "d1-abc");
    }

    use super::*;
    use crate::mail::BodyType;

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
            (
                vec![v(" 名前 ünïcödé")],
                KeyHeader::Present("名前 ünïcödé".into()),
            ),
        ];
        for c in [
            '\u{202e}',
            '\u{202a}',
            '\u{2066}',
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{200e}',
            '\u{2060}',
            '\u{feff}',
            '\u{00ad}',
            '\u{2028}',
            '\u{2029}',
            '\u{061c}',
            '\u{e0041}',
            '\u{0085}',
        ] {
            let value = format!(" order-{c}1");
            assert_eq!(read_key_header(&[v(&value)]), KeyHeader::Invalid, "{c:?}");
        }
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
