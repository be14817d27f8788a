//! Standard Webhooks verification (https://www.standardwebhooks.com/), pure: the headers
//! `webhook-id`, `webhook-timestamp` and `webhook-signature` (space-separated `v1,<base64>`
//! entries), the signed content `<id>.<timestamp>.<body>`, HMAC-SHA256 under the key that is
//! the base64 after a secret's `whsec_`. Any configured key may match any `v1` entry; the
//! comparison is constant-time (`subtle`).
//!
//! The listener faces the internet, so what an unauthenticated request may cost is bounded:
//! the timestamp is checked first (free), the header's length and its number of entries are
//! capped, and each configured key's HMAC over the body is computed once, however many
//! entries there are, then compared with each entry.

use base64::Engine;
use ring::hmac;
use subtle::ConstantTimeEq;

/// How far a request's timestamp may be from now, either way: an old signed request replayed
/// later is refused, as is one from a clock far off.
pub(crate) const TOLERANCE_SECS: i64 = 5 * 60;

/// The longest `webhook-id` taken (svix ids are about 30 characters).
const MAX_ID: usize = 255;

/// The most `v1,` entries a `webhook-signature` may carry: a sender signs with one secret,
/// two while it rotates them; a few more leave room. More is refused as unsigned.
pub(crate) const MAX_ENTRIES: usize = 8;

/// The longest `webhook-signature` taken: `MAX_ENTRIES` entries of an HMAC-SHA256 (47
/// characters each with their version), with room for other versions' entries.
pub(crate) const MAX_SIGNATURE_LEN: usize = 1024;

/// Why a request is refused before its body is read as events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `webhook-id` or `webhook-timestamp` missing or not of their form: 400.
    Headers,
    /// No `webhook-signature`, or no entry that any key produces: 401.
    Signature,
    /// Signed, but the timestamp is more than `TOLERANCE_SECS` from now: 400.
    Timestamp,
}

/// The three headers as received (`None`: absent or not text).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Headers<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// What a verified request carries besides its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verified {
    pub id: String,
    /// Unix seconds.
    pub timestamp: i64,
}

/// Checks a request: its headers' form, its age, then its signature under any of `keys`.
/// The age comes before the signature because it costs nothing: a stale request is refused
/// without an HMAC over its body.
pub(crate) fn verify(
    keys: &[Vec<u8>],
    headers: Headers<'_>,
    body: &[u8],
    now_secs: i64,
) -> Result<Verified, Refusal> {
    let id = headers
        .id
        .filter(|id| valid_id(id))
        .ok_or(Refusal::Headers)?;
    let stamp = headers.timestamp.ok_or(Refusal::Headers)?;
    let timestamp = parse_timestamp(stamp).ok_or(Refusal::Headers)?;
    if (now_secs - timestamp).abs() > TOLERANCE_SECS {
        return Err(Refusal::Timestamp);
    }
    let signature = headers
        .signature
        .filter(|s| s.len() <= MAX_SIGNATURE_LEN)
        .ok_or(Refusal::Signature)?;
    let entries: Vec<&str> = signature.split(' ').filter(|e| !e.is_empty()).collect();
    if entries.len() > MAX_ENTRIES {
        return Err(Refusal::Signature);
    }
    let tags: Vec<Vec<u8>> = entries
        .iter()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .collect();
    if tags.is_empty() {
        return Err(Refusal::Signature);
    }
    let content = signed_content(id, stamp, body);
    let matched = keys.iter().any(|key| {
        let expected = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), &content);
        tags.iter()
            .any(|tag| bool::from(tag.as_slice().ct_eq(expected.as_ref())))
    });
    if !matched {
        return Err(Refusal::Signature);
    }
    Ok(Verified {
        id: id.to_string(),
        timestamp,
    })
}

/// The `v1,<base64>` entry for `key` (tests sign their requests with it).
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let content = signed_content(id, &timestamp.to_string(), body);
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), &content);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
    )
}

fn signed_content(id: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
    content.extend_from_slice(id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

/// Printable ASCII without spaces, 1 to 255 characters: the id is stored and shown.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Integer Unix seconds, digits only (the signed text must be exactly what was sent).
fn parse_timestamp(text: &str) -> Option<i64> {
    if text.is_empty() || text.len() > 12 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks specification's test vector (also svix's).
    const SECRET_KEY_B64: &str = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn key() -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .decode(SECRET_KEY_B64)
            .unwrap()
    }

    fn headers(signature: &str) -> Headers<'_> {
        Headers {
            id: Some(ID),
            timestamp: Some("1614265330"),
            signature: Some(signature),
        }
    }

    #[test]
    fn the_specifications_test_vector() {
        assert_eq!(sign(&key(), ID, TS, BODY), SIGNATURE);
        let ok = verify(&[key()], headers(SIGNATURE), BODY, TS + 10).unwrap();
        assert_eq!(
            ok,
            Verified {
                id: ID.into(),
                timestamp: TS
            }
        );
    }

    #[test]
    fn any_key_and_any_v1_entry_may_match() {
        let other = b"another key".to_vec();
        let both = format!("v1,bm9wZQ== v2,xyz {SIGNATURE}");
        assert!(verify(&[other.clone(), key()], headers(&both), BODY, TS).is_ok());
        // The right tag under a wrong version prefix does not count.
        let wrong_version = SIGNATURE.replacen("v1,", "v2,", 1);
        assert_eq!(
            verify(&[key()], headers(&wrong_version), BODY, TS),
            Err(Refusal::Signature)
        );
        assert_eq!(
            verify(&[other], headers(SIGNATURE), BODY, TS),
            Err(Refusal::Signature)
        );
    }

    #[test]
    fn a_changed_byte_anywhere_breaks_the_signature() {
        let keys = [key()];
        assert_eq!(
            verify(&keys, headers(SIGNATURE), br#"{"test": 2432232315}"#, TS),
            Err(Refusal::Signature)
        );
        let mut h = headers(SIGNATURE);
        h.id = Some("msg_p5jXN8AQM9LWM0D4loKWxJel");
        assert_eq!(verify(&keys, h, BODY, TS), Err(Refusal::Signature));
        let mut h = headers(SIGNATURE);
        h.timestamp = Some("1614265331");
        assert_eq!(verify(&keys, h, BODY, TS), Err(Refusal::Signature));
        assert_eq!(
            verify(&keys, headers("v1,not base64!"), BODY, TS),
            Err(Refusal::Signature)
        );
        assert_eq!(
            verify(&keys, headers(""), BODY, TS),
            Err(Refusal::Signature)
        );
    }

    #[test]
    fn missing_or_garbled_headers_and_stale_timestamps() {
        let keys = [key()];
        let missing = |f: fn(&mut Headers<'_>)| {
            let mut h = headers(SIGNATURE);
            f(&mut h);
            verify(&keys, h, BODY, TS)
        };
        assert_eq!(missing(|h| h.id = None), Err(Refusal::Headers));
        assert_eq!(missing(|h| h.id = Some("")), Err(Refusal::Headers));
        assert_eq!(missing(|h| h.id = Some("a b")), Err(Refusal::Headers));
        assert_eq!(missing(|h| h.timestamp = None), Err(Refusal::Headers));
        assert_eq!(
            missing(|h| h.timestamp = Some("16142653.0")),
            Err(Refusal::Headers)
        );
        assert_eq!(missing(|h| h.timestamp = Some("-5")), Err(Refusal::Headers));
        assert_eq!(missing(|h| h.signature = None), Err(Refusal::Signature));
        // The age is checked before the signature: a stale request costs no HMAC.
        assert_eq!(
            verify(&keys, headers("v1,bm9wZQ=="), BODY, TS + TOLERANCE_SECS + 1),
            Err(Refusal::Timestamp)
        );
        // Five minutes either way, not a second more.
        assert!(verify(&keys, headers(SIGNATURE), BODY, TS + TOLERANCE_SECS).is_ok());
        assert!(verify(&keys, headers(SIGNATURE), BODY, TS - TOLERANCE_SECS).is_ok());
        assert_eq!(
            verify(&keys, headers(SIGNATURE), BODY, TS + TOLERANCE_SECS + 1),
            Err(Refusal::Timestamp)
        );
        assert_eq!(
            verify(&keys, headers(SIGNATURE), BODY, TS - TOLERANCE_SECS - 1),
            Err(Refusal::Timestamp)
        );
    }

    #[test]
    fn too_many_entries_or_too_long_a_header_is_unsigned() {
        let keys = [key()];
        let wrong = "v1,bm9wZQ==";
        let at_most = format!("{} {SIGNATURE}", [wrong; MAX_ENTRIES - 1].join(" "));
        assert!(verify(&keys, headers(&at_most), BODY, TS).is_ok());
        let too_many = format!("{} {SIGNATURE}", [wrong; MAX_ENTRIES].join(" "));
        assert_eq!(
            verify(&keys, headers(&too_many), BODY, TS),
            Err(Refusal::Signature)
        );
        let too_long = format!("{}{SIGNATURE}", " ".repeat(MAX_SIGNATURE_LEN));
        assert_eq!(
            verify(&keys, headers(&too_long), BODY, TS),
            Err(Refusal::Signature)
        );
    }
}
