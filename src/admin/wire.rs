//! What the admin API and its client (`idemrelay queue`) both speak: the listing's query
//! parameters, the operator header, the percent-encoding of paths and queries. A leaf, so the
//! server side and the client side each import it and never each other.

use serde::Deserialize;

use crate::store::{Cursor, ListFilter, StateFilter};

const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// The header a client may name its person with (`idemrelay queue` sends the local user): it
/// is recorded beside the token's name, as the caller's claim.
pub(crate) const OPERATOR_HEADER: &str = "x-idemrelay-operator";

/// The response header every admin answer names its relay with (the relay's `hostname`).
pub(crate) const INSTANCE_HEADER: &str = "idemrelay-instance";

/// Percent-encodes one path segment or query value.
pub(crate) fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The filters of `GET /api/v1/messages`; any other parameter is refused (400), so a typo
/// never returns an unrelated listing.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    pub state: Option<String>,
    pub scope: Option<String>,
    pub key: Option<String>,
    pub sender: Option<String>,
    pub recipient: Option<String>,
    pub message_id: Option<String>,
    /// RFC 3339, or a duration meaning that long ago (`2h`).
    pub since: Option<String>,
    pub until: Option<String>,
    /// `newest` (newest first) or `oldest` (the default).
    pub order: Option<String>,
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

impl ListQuery {
    /// The query string this listing is asked for with (without the `?`).
    pub(crate) fn to_query_string(&self) -> String {
        let limit = self.limit.map(|l| l.to_string());
        [
            ("state", &self.state),
            ("scope", &self.scope),
            ("key", &self.key),
            ("sender", &self.sender),
            ("recipient", &self.recipient),
            ("message_id", &self.message_id),
            ("since", &self.since),
            ("until", &self.until),
            ("order", &self.order),
            ("limit", &limit),
            ("cursor", &self.cursor),
        ]
        .iter()
        .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name}={}", encode(v))))
        .collect::<Vec<_>>()
        .join("&")
    }

    pub(crate) fn into_filter(self, now_ms: i64) -> Result<ListFilter, (&'static str, String)> {
        let state = match self.state.as_deref() {
            None => None,
            Some(name) => Some(StateFilter::parse(name).ok_or_else(|| {
                (
                    "bad_state",
                    format!("unknown state {name:?} ({})", StateFilter::names()),
                )
            })?),
        };
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(("bad_limit", format!("limit must be 1 to {MAX_PAGE}")));
        }
        let newest_first = match self.order.as_deref() {
            None | Some("oldest") => false,
            Some("newest") => true,
            Some(other) => {
                return Err((
                    "bad_order",
                    format!("order={other:?}: the orders are newest and oldest"),
                ))
            }
        };
        let time = |text: Option<String>| {
            text.map(|t| parse_time(&t, now_ms))
                .transpose()
                .map_err(|e| ("bad_time", e))
        };
        let cursor = self
            .cursor
            .map(|c| Cursor::decode(&c))
            .transpose()
            .map_err(|e| ("bad_cursor", e))?;
        Ok(ListFilter {
            state,
            scope: self.scope,
            key: self.key,
            sender: self.sender,
            recipient: self.recipient,
            message_id: self.message_id,
            since_ms: time(self.since)?,
            until_ms: time(self.until)?,
            newest_first,
            limit,
            cursor,
        })
    }
}

/// An RFC 3339 time, or a duration before `now_ms` (`90m`, `2h`, `1d`), as Unix milliseconds.
pub(crate) fn parse_time(text: &str, now_ms: i64) -> Result<i64, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        let since_epoch = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("{text:?} is before 1970"))?;
        return Ok(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX));
    }
    match humantime::parse_duration(text) {
        Ok(ago) => Ok(now_ms.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX))),
        Err(_) => Err(format!(
            "{text:?} is neither an RFC 3339 time (2026-12-02T10:00:00Z) nor a duration ago (2h)"
        )),
    }
}
