//! `[webhooks.NAME]`: the upstreams that post signed events, and what the relay reads of them.

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// One upstream that posts signed events (`[webhooks.NAME]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSource {
    /// `whsec_<base64>` signing secrets; a request signed with any of them is taken, so a
    /// secret can be rotated without a gap.
    pub secrets: Vec<Secret>,
    pub fields: WebhookFields,
    #[serde(default)]
    pub types: WebhookTypes,
}

/// JSON Pointers (RFC 6901) from one event to what the relay needs of it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookFields {
    pub event_type: String,
    /// Unix seconds (integer or fractional) or RFC 3339; unset or absent: the request's
    /// `webhook-timestamp`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_time: Option<String>,
    /// The idempotency key the upstream saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The upstream's own message id (as in its reply to the final dot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<String>,
    /// The Message-ID header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipient: Option<String>,
}

/// Which event types mean what; other types are stored and shown, nothing more.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookTypes {
    /// Types that prove the upstream accepted the message: they resolve an `unresolved` record.
    pub accepted: Vec<String>,
    /// Types recorded (and counted) as bounces for their recipient.
    pub bounced: Vec<String>,
}

impl WebhookSource {
    /// The signing keys: the bytes of each secret after `whsec_`.
    pub(crate) fn keys(&self) -> anyhow::Result<Vec<Vec<u8>>> {
        use base64::Engine;
        self.secrets
            .iter()
            .enumerate()
            .map(|(i, secret)| {
                let key = secret
                    .expose()
                    .strip_prefix("whsec_")
                    .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
                    .filter(|key| !key.is_empty());
                key.ok_or_else(|| {
                    anyhow::anyhow!("secrets[{i}]: not whsec_ followed by base64 of the key")
                })
            })
            .collect()
    }

    pub(super) fn validate(&self, name: &str) -> anyhow::Result<()> {
        let ok_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok_name {
            bail!("webhooks.{name:?}: a source name is letters, digits, - and _ (it is the URL's last segment)");
        }
        if self.secrets.is_empty() {
            bail!("webhooks.{name}.secrets: at least one whsec_ secret is required");
        }
        self.keys().with_context(|| format!("webhooks.{name}"))?;
        let f = &self.fields;
        for (field, pointer) in [
            ("event_type", Some(&f.event_type)),
            ("event_time", f.event_time.as_ref()),
            ("key", f.key.as_ref()),
            ("upstream_id", f.upstream_id.as_ref()),
            ("message_id", f.message_id.as_ref()),
            ("recipient", f.recipient.as_ref()),
        ] {
            if let Some(pointer) = pointer {
                if !is_json_pointer(pointer) {
                    bail!("webhooks.{name}.fields.{field}: {pointer:?} is not a JSON Pointer (RFC 6901) like \"/type\" or \"/headers/message-id\"");
                }
            }
        }
        if f.key.is_none() && f.upstream_id.is_none() && f.message_id.is_none() {
            bail!("webhooks.{name}.fields: at least one of key, upstream_id and message_id is required (events are matched by them)");
        }
        if let Some(both) = self
            .types
            .accepted
            .iter()
            .find(|t| self.types.bounced.contains(t))
        {
            bail!("webhooks.{name}.types: {both:?} is listed as both accepted and bounced");
        }
        Ok(())
    }
}

/// RFC 6901: empty (the whole event), or `/`-separated tokens where `~` is only `~0` or `~1`.
fn is_json_pointer(pointer: &str) -> bool {
    if pointer.is_empty() {
        return true;
    }
    pointer.starts_with('/')
        && pointer
            .split('~')
            .skip(1)
            .all(|rest| rest.starts_with('0') || rest.starts_with('1'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_pointers() {
        for ok in ["", "/", "/type", "/headers/message-id", "/a~0b/c~1d", "/0"] {
            assert!(is_json_pointer(ok), "{ok}");
        }
        for bad in ["type", "/a~", "/a~2", "#/type"] {
            assert!(!is_json_pointer(bad), "{bad}");
        }
    }
}
