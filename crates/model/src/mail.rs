//! The nouns every layer shares: a transaction's envelope, which recipients are one mailbox, its
//! body type, the request fingerprint, the idempotency key's header and validity rule, queue
//! ids. A leaf: it imports nothing from the crate, so the SMTP session, intake, the store and
//! delivery can all name these without importing each other.

use serde::{Deserialize, Serialize};

pub mod requests;
pub use requests::DeliveryRequests;

pub const KEY_HEADER: &str = "X-Bird-Idempotency-Key";
pub const MAX_KEY_CHARS: usize = 255;

/// 1-255 characters, none of them invisible: control characters, format characters (Unicode
/// category Cf: bidi overrides, zero-width spaces and joiners, the BOM) and the line and
/// paragraph separators (Zl, Zp). Those let two keys that differ look the same to a person
/// reading a log or the admin API, or reorder what is shown around them.
pub fn is_valid_key(key: &str) -> bool {
    let count = key.chars().count();
    (1..=MAX_KEY_CHARS).contains(&count) && !key.chars().any(is_invisible)
}

fn is_invisible(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory as _};
    c.is_control()
        || matches!(
            c.general_category(),
            GeneralCategory::Format
                | GeneralCategory::LineSeparator
                | GeneralCategory::ParagraphSeparator
        )
}

/// What to do with a message that carries no key header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum MissingKey {
    /// Derive a deterministic key (docs/concepts/contract.md "What the relay answers at the end of DATA") and add it to the stored message.
    #[default]
    Derive,
    /// Accept and forward without deduplication.
    Pass,
    /// Refuse the message.
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyType {
    SevenBit,
    EightBitMime,
}

impl BodyType {
    pub fn as_str(self) -> &'static str {
        match self {
            BodyType::SevenBit => "7BIT",
            BodyType::EightBitMime => "8BITMIME",
        }
    }
}

/// A recipient split into what makes it a mailbox: the local part exactly as sent (RFC 5321
/// §2.4: it may be case-sensitive, and only its own domain may say otherwise), and the domain
/// (or address literal: everything after the last `@`, which a quoted local part may also
/// contain), compared without case: ASCII case, and Unicode case (`folded`) for U-labels under
/// SMTPUTF8.
fn split_mailbox(rcpt: &str) -> (&str, Option<&str>) {
    match rcpt.rsplit_once('@') {
        Some((local, domain)) => (local, Some(domain)),
        None => (rcpt, None),
    }
}

/// A domain without case, character by character: the one folding both `merge_same_mailbox`
/// and `recipient_set` use, so that the session and the fingerprint never disagree.
fn folded(domain: &str) -> impl Iterator<Item = char> + '_ {
    domain.chars().flat_map(char::to_lowercase)
}

pub fn same_mailbox(a: &str, b: &str) -> bool {
    match (split_mailbox(a), split_mailbox(b)) {
        ((la, Some(da)), (lb, Some(db))) => la == lb && (da == db || folded(da).eq(folded(db))),
        _ => a == b,
    }
}

/// Records `rcpt` in `rcpts` if it names a mailbox already there, and says whether it did. Of
/// two spellings of one mailbox the one that sorts first (byte order) is kept, in the place of
/// the first: the envelope is then the same whatever order a client sends them in, so a retry
/// that reorders them is the same request (the fingerprint and a derived key cover the
/// recipients' spellings).
pub fn merge_same_mailbox(rcpts: &mut [String], rcpt: &str) -> bool {
    let Some(kept) = rcpts.iter_mut().find(|r| same_mailbox(r, rcpt)) else {
        return false;
    };
    if rcpt < kept.as_str() {
        *kept = rcpt.to_string();
    }
    true
}

/// The recipient set of `rcpts`, sorted: each mailbox once, under the spelling
/// `merge_same_mailbox` keeps. For a list without two spellings of one mailbox, that is the
/// list sorted and de-duplicated exactly, as before the domain's case counted: fingerprints and
/// derived keys of records stored earlier are unchanged.
pub fn recipient_set(rcpts: &[String]) -> Vec<&str> {
    let mut by_mailbox: Vec<_> = rcpts
        .iter()
        .map(|r| {
            let (local, domain) = split_mailbox(r);
            (
                (local, domain.map(|d| folded(d).collect::<String>())),
                r.as_str(),
            )
        })
        .collect();
    // Sorted by mailbox, then spelling: the first of each mailbox is its smallest spelling.
    by_mailbox.sort_unstable();
    by_mailbox.dedup_by(|later, first| later.0 == first.0);
    let mut set: Vec<&str> = by_mailbox.into_iter().map(|(_, r)| r).collect();
    set.sort_unstable();
    set
}

/// The envelope of one mail transaction. RCPTs are de-duplicated in arrival order, one per
/// mailbox (`merge_same_mailbox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub body: BodyType,
    pub smtputf8: bool,
    /// DSN parameters and REQUIRETLS (`requests`); empty for most mail.
    pub requests: DeliveryRequests,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }

    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Fingerprint)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }
}

/// A finished message handed to intake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    pub envelope: Envelope,
    pub message: Vec<u8>,
    pub helo: String,
    pub esmtp: bool,
    pub chunked: bool,
    /// The authenticated user's idempotency scope; `None` for allow-listed clients.
    pub auth_scope: Option<String>,
    /// The authenticated user's name, for the submission's log line.
    pub auth_user: Option<String>,
    pub tls: bool,
}

/// A record's queue id: the time in hex, then 52 random bits. Ids sort by acceptance time,
/// which the store's listings rely on (`store::listing`) to bound a time range by an id range.
pub fn new_queue_id(now_ms: i64) -> String {
    format!("{:011X}{:013X}", now_ms, fastrand::u64(..1 << 52))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The SMTP session (one RCPT at a time) and the fingerprint (the whole list) keep the
        /// same recipients, whatever the order they came in.
        #[test]
        fn the_session_and_the_fingerprint_keep_the_same_recipients(
            picks in proptest::collection::vec(0usize..8, 0..12),
        ) {
            const SPELLINGS: [&str; 8] = [
                "a@x.example",
                "a@X.example",
                "A@x.example",
                "a@X.EXAMPLE",
                "\"a@b\"@x.example",
                "\"a@B\"@X.example",
                "u@bücher.example",
                "u@BÜCHER.example",
            ];
            let sent: Vec<String> = picks.iter().map(|&i| SPELLINGS[i].to_string()).collect();
            let mut session: Vec<String> = Vec::new();
            for rcpt in &sent {
                if !merge_same_mailbox(&mut session, rcpt) {
                    session.push(rcpt.clone());
                }
            }
            let mut kept: Vec<&str> = session.iter().map(String::as_str).collect();
            kept.sort_unstable();
            proptest::prop_assert_eq!(&recipient_set(&sent), &kept);
            proptest::prop_assert_eq!(&recipient_set(&session), &kept);
            let reversed: Vec<String> = sent.iter().rev().cloned().collect();
            proptest::prop_assert_eq!(recipient_set(&reversed), recipient_set(&sent));
        }
    }

    #[test]
    fn which_recipients_are_one_mailbox() {
        assert!(same_mailbox("dup@example.net", "dup@EXAMPLE.NET"));
        assert!(same_mailbox("u@bücher.example", "u@BÜCHER.example"));
        assert!(same_mailbox("a@[IPv6:::A]", "a@[ipv6:::a]"));
        assert!(!same_mailbox("Dup@example.net", "dup@example.net"));
        assert!(!same_mailbox("\"a@b\"@x", "\"a@B\"@x"));
        assert!(!same_mailbox("\"dup\"@example.net", "dup@example.net"));
    }
}
