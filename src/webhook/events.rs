//! A verified request's body as events, pure: one JSON object or an array of them, each read
//! through the source's JSON Pointers (RFC 6901, `serde_json::Value::pointer`).

use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::config::WebhookSource;
use crate::store::webhook::{cap_json, normalize_message_id, normalize_recipient};
use crate::store::{EventKind, UpstreamEvent};

/// Why a body is not events (400); the text is safe to log and to answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Malformed {
    #[error("the body is not JSON: {0}")]
    Json(String),
    #[error("the body is neither an event object nor an array of them")]
    Shape,
    #[error("event {index} is not a JSON object")]
    NotAnObject { index: usize },
    #[error("event {index} has no event type (a string) at {pointer:?}")]
    NoType { index: usize, pointer: String },
    #[error("event {index}: the time at {pointer:?} is neither Unix seconds nor RFC 3339")]
    BadTime { index: usize, pointer: String },
}

/// The events of a body. `request_time_secs` (the verified `webhook-timestamp`) is the time
/// of events that carry none.
pub(crate) fn parse(
    body: &[u8],
    source: &WebhookSource,
    request_time_secs: i64,
) -> Result<Vec<UpstreamEvent>, Malformed> {
    let value: Value = serde_json::from_slice(body).map_err(|e| Malformed::Json(e.to_string()))?;
    let items = match value {
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => return Err(Malformed::Shape),
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| event(index, item, source, request_time_secs))
        .collect()
}

fn event(
    index: usize,
    item: &Value,
    source: &WebhookSource,
    request_time_secs: i64,
) -> Result<UpstreamEvent, Malformed> {
    if !item.is_object() {
        return Err(Malformed::NotAnObject { index });
    }
    let fields = &source.fields;
    let event_type = item
        .pointer(&fields.event_type)
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Malformed::NoType {
            index,
            pointer: fields.event_type.clone(),
        })?
        .to_string();
    let event_time_ms = match fields.event_time.as_deref() {
        None => None,
        Some(pointer) => match item.pointer(pointer) {
            None | Some(Value::Null) => None,
            Some(time) => Some(time_ms(time).ok_or_else(|| Malformed::BadTime {
                index,
                pointer: pointer.to_string(),
            })?),
        },
    }
    .unwrap_or(request_time_secs.saturating_mul(1000));
    let text = |pointer: &Option<String>| -> Option<String> {
        match item.pointer(pointer.as_deref()?)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let kind = if source.types.accepted.contains(&event_type) {
        EventKind::Accepted
    } else if source.types.bounced.contains(&event_type) {
        EventKind::Bounced
    } else {
        EventKind::Other
    };
    Ok(UpstreamEvent {
        kind,
        event_time_ms,
        key: text(&fields.key),
        upstream_id: text(&fields.upstream_id),
        message_id: text(&fields.message_id).and_then(|m| normalize_message_id(&m)),
        recipient: text(&fields.recipient).and_then(|r| normalize_recipient(&r)),
        json: cap_json(&item.to_string()),
        event_type,
    })
}

/// The latest event time taken: 9999-12-31T23:59:59Z, the last second RFC 3339 can write.
/// Later times (and times before 1970) are refused as malformed: no upstream reports them,
/// and a record's events must stay printable wherever they are shown.
const LATEST_SECS: i64 = 253_402_300_799;

/// Unix seconds (integer or fractional, as a number or a string of one) or RFC 3339, from
/// 1970 to the end of year 9999.
fn time_ms(value: &Value) -> Option<i64> {
    let ms = any_time_ms(value)?;
    (0..=LATEST_SECS * 1000 + 999).contains(&ms).then_some(ms)
}

fn any_time_ms(value: &Value) -> Option<i64> {
    let seconds = match value {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => match s.trim().parse::<f64>() {
            Ok(secs) => secs,
            Err(_) => {
                let t = OffsetDateTime::parse(s.trim(), &Rfc3339).ok()?;
                return i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok();
            }
        },
        _ => return None,
    };
    (seconds.is_finite() && seconds.abs() < 1e12).then(|| (seconds * 1000.0).round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Secret, WebhookFields, WebhookTypes};

    fn source() -> WebhookSource {
        WebhookSource {
            secrets: vec![Secret("whsec_c2Vjb25k".into())],
            fields: WebhookFields {
                event_type: "/type".into(),
                event_time: Some("/timestamp".into()),
                key: Some("/idempotency_key".into()),
                upstream_id: Some("/message_id".into()),
                message_id: Some("/headers/message-id".into()),
                recipient: Some("/rcpt_to".into()),
            },
            types: WebhookTypes {
                accepted: vec!["injection".into(), "delivery".into()],
                bounced: vec!["bounce".into()],
            },
        }
    }

    #[test]
    fn the_sinks_shape_one_event_or_a_batch() {
        let one = br#"{"type": "injection", "timestamp": "2026-12-02T06:00:00.123Z",
            "idempotency_key": "k1", "message_id": "S0001", "rcpt_to": "User@Example.NET",
            "headers": {"message-id": "<m1@example.com>"}}"#;
        let events = parse(one, &source(), 5).unwrap();
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.event_type, "injection");
        assert_eq!(e.kind, EventKind::Accepted);
        assert_eq!(e.event_time_ms, 1_796_191_200_123);
        assert_eq!(e.key.as_deref(), Some("k1"));
        assert_eq!(e.upstream_id.as_deref(), Some("S0001"));
        assert_eq!(e.message_id.as_deref(), Some("m1@example.com"));
        assert_eq!(e.recipient.as_deref(), Some("user@example.net"));
        assert!(e.json.contains("\"injection\""));

        let batch = br#"[{"type": "bounce", "timestamp": 1764655200.5, "idempotency_key": null,
                          "headers": {"message-id": null}},
                         {"type": "open", "timestamp": 1764655201},
                         {"type": "delivery"}]"#;
        let events = parse(batch, &source(), 1_700_000_000).unwrap();
        let seen: Vec<(EventKind, i64, Option<&str>)> = events
            .iter()
            .map(|e| (e.kind, e.event_time_ms, e.key.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                (EventKind::Bounced, 1_764_655_200_500, None),
                (EventKind::Other, 1_764_655_201_000, None),
                // No time: the request's.
                (EventKind::Accepted, 1_700_000_000_000, None),
            ]
        );
        assert_eq!(parse(b"[]", &source(), 0).unwrap(), vec![]);
    }

    #[test]
    fn what_is_not_events() {
        let s = source();
        assert!(matches!(
            parse(b"{not json", &s, 0),
            Err(Malformed::Json(_))
        ));
        assert_eq!(parse(b"\"text\"", &s, 0), Err(Malformed::Shape));
        assert_eq!(
            parse(br#"[{"type": "x"}, 7]"#, &s, 0),
            Err(Malformed::NotAnObject { index: 1 })
        );
        assert_eq!(
            parse(br#"[{"kind": "x"}]"#, &s, 0),
            Err(Malformed::NoType {
                index: 0,
                pointer: "/type".into()
            })
        );
        assert_eq!(
            parse(br#"{"type": ""}"#, &s, 0),
            Err(Malformed::NoType {
                index: 0,
                pointer: "/type".into()
            })
        );
        assert_eq!(
            parse(br#"{"type": "x", "timestamp": "yesterday"}"#, &s, 0),
            Err(Malformed::BadTime {
                index: 0,
                pointer: "/timestamp".into()
            })
        );
        assert_eq!(
            parse(br#"{"type": "x", "timestamp": true}"#, &s, 0),
            Err(Malformed::BadTime {
                index: 0,
                pointer: "/timestamp".into()
            })
        );
    }

    #[test]
    fn times_in_seconds_or_rfc3339() {
        assert_eq!(time_ms(&serde_json::json!(1)), Some(1000));
        assert_eq!(time_ms(&serde_json::json!(1.2345)), Some(1235));
        assert_eq!(time_ms(&serde_json::json!("1.5")), Some(1500));
        assert_eq!(
            time_ms(&serde_json::json!("1970-01-01T00:00:01.25+00:00")),
            Some(1250)
        );
        assert_eq!(
            time_ms(&serde_json::json!("1970-01-01T01:00:00+01:00")),
            Some(0)
        );
        assert_eq!(time_ms(&serde_json::json!(1e300)), None);
        // RFC 3339's range: the year 10000 and times before 1970 are refused.
        assert_eq!(
            time_ms(&serde_json::json!("9999-12-31T23:59:59.999Z")),
            Some(253_402_300_799_999)
        );
        assert_eq!(time_ms(&serde_json::json!(253_402_300_800_i64)), None);
        assert_eq!(time_ms(&serde_json::json!(-1)), None);
        assert_eq!(time_ms(&serde_json::json!(null)), None);
    }
}
