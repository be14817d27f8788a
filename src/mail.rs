//! The nouns every layer shares: a transaction's envelope, its body type, the request
//! fingerprint, the idempotency key's header and validity rule, queue ids. A leaf: it imports
//! nothing from the crate, so the SMTP session, intake, the store and delivery can all name these
//! without importing each other.

use serde::{Deserialize, Serialize};

pub(crate) const KEY_HEADER: &str = "X-Bird-Idempotency-Key";
pub(crate) const MAX_KEY_CHARS: usize = 255;

/// 1-255 characters, none of them invisible: control characters, format characters (Unicode
/// category Cf: bidi overrides, zero-width spaces and joiners, the BOM) and the line and
/// paragraph separators (Zl, Zp). Those let two keys that differ look the same to a person
/// reading a log or the admin API, or reorder what is shown around them.
pub(crate) fn is_valid_key(key: &str) -> bool {
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
pub enum BodyType {
    SevenBit,
    EightBitMime,
}

impl BodyType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BodyType::SevenBit => "7BIT",
            BodyType::EightBitMime => "8BITMIME",
        }
    }
}

/// The envelope of one mail transaction. RCPTs are de-duplicated in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub body: BodyType,
    pub smtputf8: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }

    pub(crate) fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Fingerprint)
    }

    pub(crate) fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub(crate) fn to_hex(self) -> String {
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
pub(crate) fn new_queue_id(now_ms: i64) -> String {
    format!("{:011X}{:013X}", now_ms, fastrand::u64(..1 << 52))
}
