//! What the sink's webhook sender posts, and how it signs it: Standard Webhooks
//! (<https://www.standardwebhooks.com/>) with HMAC-SHA256, the event JSON of docs/guides/sink.md's
//! worked example, and the retry schedule. Pure: no I/O, no clock (times come in).
//!
//! The relay verifies these signatures with its own code; this one is written separately on
//! purpose, so that the sink stays an independent oracle of the relay.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use mail_parser::{HeaderName, MessageParser};
use serde::Serialize;

const SECRET_PREFIX: &str = "whsec_";

/// A signing secret: the bytes behind `whsec_<base64>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("whsec_<redacted>")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid webhook secret: {0}")]
pub struct SecretError(&'static str);

impl FromStr for Secret {
    type Err = SecretError;

    /// `whsec_` followed by standard base64; the prefix may be left out, as svix's verifiers
    /// allow.
    fn from_str(s: &str) -> Result<Self, SecretError> {
        let encoded = s.trim();
        let encoded = encoded.strip_prefix(SECRET_PREFIX).unwrap_or(encoded);
        let key = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| SecretError("expected whsec_ followed by base64"))?;
        if key.is_empty() {
            return Err(SecretError("the key is empty"));
        }
        Ok(Secret(key))
    }
}

/// The `webhook-signature` header: one `v1,<base64 HMAC-SHA256>` entry per secret, over
/// `<id>.<timestamp>.<body>`, separated by spaces (several while a secret is being rotated).
pub(crate) fn signature_header(
    secrets: &[Secret],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    let mut signed = Vec::with_capacity(id.len() + body.len() + 24);
    signed.extend_from_slice(id.as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(timestamp.to_string().as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(body);
    secrets
        .iter()
        .map(|secret| {
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret.0);
            let tag = ring::hmac::sign(&key, &signed);
            format!(
                "v1,{}",
                base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What an event says became of the message for one recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    /// The upstream accepted the message (sent at the commit of the final dot).
    Injection,
    /// The recipient's server took it (a moment later).
    Delivery,
    /// The recipient's server refused it (instead of delivery, for `--webhook-bounce`).
    Bounce,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Injection => "injection",
            EventType::Delivery => "delivery",
            EventType::Bounce => "bounce",
        }
    }
}

/// The `reason` of every bounce event the sink sends.
pub(crate) const BOUNCE_REASON: &str = "5.1.1 user unknown";

/// One event, with its fields in the documented order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Event<'a> {
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// RFC 3339, UTC, milliseconds.
    pub timestamp: String,
    pub idempotency_key: Option<&'a str>,
    /// The sink's own id, as in its `250 2.0.0 OK <id>`.
    pub message_id: &'a str,
    pub rcpt_to: &'a str,
    pub headers: EventHeaders<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct EventHeaders<'a> {
    #[serde(rename = "message-id")]
    pub message_id: Option<&'a str>,
}

/// An accepted message, as far as its events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Accepted {
    pub id: String,
    pub key: Option<String>,
    /// The Message-ID header's value as sent (angle brackets included).
    pub message_id: Option<String>,
    pub rcpt_to: Vec<String>,
    /// When the message was committed, Unix milliseconds.
    pub accepted_at_ms: u64,
}

/// One webhook request: the events of one type for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    pub event_type: EventType,
    /// `msg_<sink id>_<type>`: deterministic, so every post of the batch carries the same one.
    pub webhook_id: String,
    /// How long after acceptance the batch is due (before any `late` fault).
    pub due: Duration,
    /// A JSON array of events, one per recipient.
    pub body: Vec<u8>,
    pub events: usize,
}

/// True when `rcpt` contains one of `bounce` (ASCII case-insensitive).
pub(crate) fn bounces(rcpt: &str, bounce: &[String]) -> bool {
    let rcpt = rcpt.to_ascii_lowercase();
    bounce
        .iter()
        .any(|b| rcpt.contains(b.to_ascii_lowercase().as_str()))
}

/// The batch types an accepted message gets, in the order they are planned: injection, then
/// delivery for the recipients that do not bounce, then bounce for those that do.
pub(crate) fn event_types(rcpt_to: &[String], bounce: &[String]) -> Vec<EventType> {
    let bounced = rcpt_to.iter().filter(|r| bounces(r, bounce)).count();
    let mut types = vec![EventType::Injection];
    if bounced < rcpt_to.len() {
        types.push(EventType::Delivery);
    }
    if bounced > 0 {
        types.push(EventType::Bounce);
    }
    types
}

/// `t` (Unix milliseconds) as RFC 3339 UTC with milliseconds.
pub(crate) fn rfc3339_ms(unix_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(unix_ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// The batches for `message`, bodies serialized: what every post of each of them sends.
pub(crate) fn batches(
    message: &Accepted,
    bounce: &[String],
    delivery_delay: Duration,
) -> Vec<Batch> {
    event_types(&message.rcpt_to, bounce)
        .into_iter()
        .map(|event_type| {
            let due = match event_type {
                EventType::Injection => Duration::ZERO,
                EventType::Delivery | EventType::Bounce => delivery_delay,
            };
            let at_ms = message
                .accepted_at_ms
                .saturating_add(u64::try_from(due.as_millis()).unwrap_or(u64::MAX));
            let timestamp = rfc3339_ms(at_ms);
            let events: Vec<Event<'_>> = message
                .rcpt_to
                .iter()
                .filter(|rcpt| match event_type {
                    EventType::Injection => true,
                    EventType::Delivery => !bounces(rcpt, bounce),
                    EventType::Bounce => bounces(rcpt, bounce),
                })
                .map(|rcpt| Event {
                    event_type,
                    timestamp: timestamp.clone(),
                    idempotency_key: message.key.as_deref(),
                    message_id: &message.id,
                    rcpt_to: rcpt,
                    headers: EventHeaders {
                        message_id: message.message_id.as_deref(),
                    },
                    reason: (event_type == EventType::Bounce).then_some(BOUNCE_REASON),
                })
                .collect();
            Batch {
                event_type,
                webhook_id: format!("msg_{}_{}", message.id, event_type.as_str()),
                due,
                events: events.len(),
                body: serde_json::to_vec(&events).expect("events serialize"),
            }
        })
        .collect()
}

/// The raw value of the message's Message-ID field, unfolded and trimmed, or `None` when it
/// has none (or an empty one).
pub(crate) fn message_id_header(message: &[u8]) -> Option<String> {
    let parsed = MessageParser::new()
        .header_id(HeaderName::MessageId)
        .parse_headers(message)?;
    let header = parsed
        .root_part()
        .headers()
        .iter()
        .find(|h| h.name == HeaderName::MessageId)?;
    let raw = message.get(header.offset_start as usize..header.offset_end as usize)?;
    let value = String::from_utf8_lossy(raw)
        .replace("\r\n", "")
        .trim_matches([' ', '\t', '\r', '\n'])
        .to_string();
    (!value.is_empty()).then_some(value)
}

/// When to give up and how long to wait between posts of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failed post; it doubles after each further failure.
    pub first: Duration,
    /// The longest wait between two posts (before jitter).
    pub max_delay: Duration,
    /// Posts of one batch at most, the first included.
    pub max_attempts: u32,
    /// No post starts later than this after the first one.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            max_attempts: 10,
            deadline: Duration::from_secs(600),
        }
    }
}

impl RetryPolicy {
    /// The wait after `failed` posts have failed (1 for the first): exponential, capped,
    /// with "equal jitter" (between half and all of it; `random` in [0, 1)) so that the
    /// posts of many batches that failed together do not come back together. A
    /// `Retry-After` from the receiver is honoured up to `max_delay`.
    pub(crate) fn backoff(
        &self,
        failed: u32,
        random: f64,
        retry_after: Option<Duration>,
    ) -> Duration {
        let doublings = failed.saturating_sub(1).min(32);
        let base = self
            .first
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max_delay);
        let half = base / 2;
        let jittered = half + half.mul_f64(random.clamp(0.0, 1.0));
        match retry_after {
            Some(wait) => jittered.max(wait.min(self.max_delay)),
            None => jittered,
        }
    }

    /// Whether another post may follow `attempts` posts, the next one `wait` from now and
    /// `elapsed` since the first.
    pub(crate) fn may_retry(&self, attempts: u32, elapsed: Duration, wait: Duration) -> bool {
        attempts < self.max_attempts && elapsed.saturating_add(wait) <= self.deadline
    }
}

/// A `Retry-After` in seconds; an HTTP date is ignored (the backoff applies).
pub(crate) fn retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signing test vector of the Standard Webhooks reference libraries
    /// (standard-webhooks/standard-webhooks, libraries/rust/src/lib.rs, `test_sign`).
    #[test]
    fn signs_the_standard_webhooks_test_vector() {
        let secret: Secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".parse().unwrap();
        assert_eq!(
            signature_header(
                &[secret],
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
                1649367553,
                br#"{"email":"test@example.com","username":"test_user"}"#,
            ),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn one_entry_per_secret_and_secrets_stay_out_of_debug() {
        let a: Secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".parse().unwrap();
        let b: Secret = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let header = signature_header(&[a.clone(), b.clone()], "msg_1", 1, b"{}");
        let entries: Vec<&str> = header.split(' ').collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0],
            signature_header(std::slice::from_ref(&a), "msg_1", 1, b"{}")
        );
        assert_eq!(entries[1], signature_header(&[b], "msg_1", 1, b"{}"));
        assert_ne!(
            entries[0],
            signature_header(std::slice::from_ref(&a), "msg_1", 2, b"{}")
        );
        assert_ne!(
            entries[0],
            signature_header(std::slice::from_ref(&a), "msg_2", 1, b"{}")
        );
        assert_ne!(
            entries[0],
            signature_header(std::slice::from_ref(&a), "msg_1", 1, b"{ }")
        );
        assert_eq!(format!("{a:?}"), "whsec_<redacted>");
        for bad in ["", "whsec_", "whsec_not base64!", "whsec_===="] {
            assert!(bad.parse::<Secret>().is_err(), "{bad:?}");
        }
    }

    fn accepted(rcpts: &[&str]) -> Accepted {
        Accepted {
            id: "S00000100ABCDEF".into(),
            key: Some("order-1".into()),
            message_id: Some("<m1@example.com>".into()),
            rcpt_to: rcpts.iter().map(|r| r.to_string()).collect(),
            // 2026-12-02T06:00:00.123Z
            accepted_at_ms: 1_796_191_200_123,
        }
    }

    #[test]
    fn batches_have_the_documented_shape() {
        let bounce = vec!["UNKNOWN@".to_string()];
        let message = accepted(&["a@example.net", "unknown@example.net", "b@example.net"]);
        let planned = batches(&message, &bounce, Duration::from_millis(200));
        let types: Vec<EventType> = planned.iter().map(|b| b.event_type).collect();
        assert_eq!(
            types,
            [EventType::Injection, EventType::Delivery, EventType::Bounce]
        );
        assert_eq!(
            planned[0].webhook_id,
            "msg_S00000100ABCDEF_injection".to_string()
        );
        assert_eq!(planned[1].due, Duration::from_millis(200));
        let body = String::from_utf8(planned[0].body.clone()).unwrap();
        assert!(body.starts_with(
            r#"[{"type":"injection","timestamp":"2026-12-02T06:00:00.123Z","idempotency_key":"order-1","message_id":"S00000100ABCDEF","rcpt_to":"a@example.net","headers":{"message-id":"<m1@example.com>"}},"#
        ), "{body}");
        assert_eq!(planned[0].events, 3);
        let delivery: serde_json::Value = serde_json::from_slice(&planned[1].body).unwrap();
        let rcpts: Vec<&str> = delivery
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["rcpt_to"].as_str().unwrap())
            .collect();
        assert_eq!(rcpts, ["a@example.net", "b@example.net"]);
        assert_eq!(delivery[0]["timestamp"], "2026-12-02T06:00:00.323Z");
        assert!(delivery[0].get("reason").is_none());
        let bounced: serde_json::Value = serde_json::from_slice(&planned[2].body).unwrap();
        assert_eq!(
            bounced,
            serde_json::json!([{"type": "bounce", "timestamp": "2026-12-02T06:00:00.323Z",
                "idempotency_key": "order-1", "message_id": "S00000100ABCDEF",
                "rcpt_to": "unknown@example.net", "headers": {"message-id": "<m1@example.com>"},
                "reason": "5.1.1 user unknown"}])
        );

        let mut keyless = accepted(&["a@example.net"]);
        keyless.key = None;
        keyless.message_id = None;
        let only = batches_of(&keyless);
        assert_eq!(only.len(), 2);
        let event: serde_json::Value = serde_json::from_slice(&only[0].body).unwrap();
        assert_eq!(event[0]["idempotency_key"], serde_json::Value::Null);
        assert_eq!(event[0]["headers"]["message-id"], serde_json::Value::Null);

        let all_bounce = batches(&accepted(&["unknown@x"]), &bounce, Duration::ZERO);
        let types: Vec<EventType> = all_bounce.iter().map(|b| b.event_type).collect();
        assert_eq!(types, [EventType::Injection, EventType::Bounce]);
    }

    fn batches_of(message: &Accepted) -> Vec<Batch> {
        batches(message, &[], Duration::from_millis(200))
    }

    #[test]
    fn message_id_is_the_raw_value_unfolded() {
        assert_eq!(
            message_id_header(b"From: a@b\r\nMessage-ID:\r\n <x.1@example.com> \r\n\r\nbody\r\n")
                .as_deref(),
            Some("<x.1@example.com>")
        );
        assert_eq!(
            message_id_header(b"From: a@b\r\n\r\nMessage-ID: <no>\r\n"),
            None
        );
        assert_eq!(message_id_header(b"Message-ID:  \r\n\r\n"), None);
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap_and_honours_retry_after() {
        let policy = RetryPolicy {
            first: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            max_attempts: 5,
            deadline: Duration::from_secs(10),
        };
        let ms = |d: Duration| d.as_millis();
        assert_eq!(ms(policy.backoff(1, 0.0, None)), 50);
        assert_eq!(ms(policy.backoff(1, 0.999_999, None)), 99);
        assert_eq!(ms(policy.backoff(2, 0.0, None)), 100);
        assert_eq!(ms(policy.backoff(3, 0.0, None)), 200);
        assert_eq!(ms(policy.backoff(5, 0.0, None)), 500);
        assert_eq!(ms(policy.backoff(40, 0.5, None)), 750);
        assert_eq!(
            ms(policy.backoff(1, 0.0, Some(Duration::from_millis(700)))),
            700
        );
        assert_eq!(
            ms(policy.backoff(1, 0.0, Some(Duration::from_secs(3600)))),
            1000
        );
        assert!(policy.may_retry(4, Duration::ZERO, Duration::ZERO));
        assert!(!policy.may_retry(5, Duration::ZERO, Duration::ZERO));
        assert!(!policy.may_retry(1, Duration::from_secs(9), Duration::from_secs(2)));
        assert_eq!(retry_after(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}
