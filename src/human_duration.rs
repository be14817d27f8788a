//! Durations are written the human way in files and flags: `3h`, `500ms`.

use serde::{Deserialize, Deserializer, Serializer};
use std::time::Duration;

pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "{text:?} is not a duration like 500ms, 30s or 3h ({e})"
        ))
    })
}
