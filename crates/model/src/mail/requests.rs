//! What a client asks of delivery beyond the envelope: the DSN parameters of RFC 3461 (RET and
//! ENVID on MAIL, NOTIFY and ORCPT on RCPT) and RFC 8689's REQUIRETLS. Pure.
//!
//! Values are kept exactly as the client sent them (validated once, at intake): they are passed
//! upstream byte for byte, and they are part of the request a retry is compared against. The
//! typed views (`Ret`, `NotifyOn`) are read from that text when delivery needs them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The requests of one transaction. Empty for almost all mail, and then stored as nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryRequests {
    /// RET's value as sent (`FULL` or `HDRS`, any case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ret: Option<String>,
    /// ENVID's value as sent: xtext, at most 100 characters (RFC 3461 §4.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envid: Option<String>,
    /// MAIL FROM carried REQUIRETLS (RFC 8689 §4.1).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_tls: bool,
    /// NOTIFY and ORCPT, by recipient (the spelling the envelope keeps); only recipients that
    /// carried one of them are here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub recipients: BTreeMap<String, RecipientRequests>,
}

/// NOTIFY and ORCPT of one recipient, as sent.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecipientRequests {
    /// `NEVER`, or a comma-separated list of `SUCCESS`, `FAILURE`, `DELAY` (any case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<String>,
    /// `addr-type;xtext`, e.g. `rfc822;bob@example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orcpt: Option<String>,
}

/// RET (RFC 3461 §4.3): what a failure DSN returns of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ret {
    Full,
    Hdrs,
}

/// When a recipient wants a DSN (RFC 3461 §4.1). Without NOTIFY, a server acts as if
/// `FAILURE` (and perhaps `DELAY`) had been asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NotifyOn {
    pub success: bool,
    pub failure: bool,
    pub delay: bool,
}

impl NotifyOn {
    /// What a recipient without NOTIFY gets: failures only (this relay sends no delay notices
    /// unless asked).
    pub const DEFAULT: NotifyOn = NotifyOn {
        success: false,
        failure: true,
        delay: false,
    };
    pub const NEVER: NotifyOn = NotifyOn {
        success: false,
        failure: false,
        delay: false,
    };
}

/// Why a DSN or REQUIRETLS parameter's value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadValue {
    Ret,
    Envid,
    Notify,
    Orcpt,
    RequireTls,
}

impl BadValue {
    pub fn keyword(self) -> &'static str {
        match self {
            BadValue::Ret => "RET",
            BadValue::Envid => "ENVID",
            BadValue::Notify => "NOTIFY",
            BadValue::Orcpt => "ORCPT",
            BadValue::RequireTls => "REQUIRETLS",
        }
    }
}

impl DeliveryRequests {
    pub fn is_empty(&self) -> bool {
        *self == DeliveryRequests::default()
    }

    pub fn ret(&self) -> Option<Ret> {
        self.ret.as_deref().and_then(|v| parse_ret(v).ok())
    }

    /// The recipient's NOTIFY, or `NotifyOn::DEFAULT` when it sent none.
    pub fn notify_on(&self, rcpt: &str) -> NotifyOn {
        self.recipients
            .get(rcpt)
            .and_then(|r| r.notify.as_deref())
            .and_then(|v| parse_notify(v).ok())
            .unwrap_or(NotifyOn::DEFAULT)
    }

    pub fn orcpt(&self, rcpt: &str) -> Option<&str> {
        self.recipients.get(rcpt)?.orcpt.as_deref()
    }

    /// Whether any DSN parameter was given (REQUIRETLS aside): the upstream must then offer
    /// DSN for them to be passed on.
    pub fn has_dsn_parameters(&self) -> bool {
        self.ret.is_some()
            || self.envid.is_some()
            || self
                .recipients
                .values()
                .any(|r| r.notify.is_some() || r.orcpt.is_some())
    }

    /// The requests that concern `rcpts` only: a part of a split message keeps its own.
    pub fn for_recipients(&self, rcpts: &[String]) -> DeliveryRequests {
        DeliveryRequests {
            recipients: self
                .recipients
                .iter()
                .filter(|(r, _)| rcpts.contains(r))
                .map(|(r, q)| (r.clone(), q.clone()))
                .collect(),
            ..self.clone()
        }
    }

    /// The stored form: `None` for no requests (nothing written for ordinary mail), else JSON.
    pub fn to_stored(&self) -> Option<String> {
        (!self.is_empty()).then(|| serde_json::to_string(self).expect("plain data serializes"))
    }

    pub fn from_stored(text: Option<&str>) -> Result<DeliveryRequests, serde_json::Error> {
        text.map_or(Ok(DeliveryRequests::default()), serde_json::from_str)
    }
}

/// RET=FULL|HDRS, any case.
pub fn parse_ret(value: &str) -> Result<Ret, BadValue> {
    if value.eq_ignore_ascii_case("FULL") {
        Ok(Ret::Full)
    } else if value.eq_ignore_ascii_case("HDRS") {
        Ok(Ret::Hdrs)
    } else {
        Err(BadValue::Ret)
    }
}

/// ENVID: xtext of at most 100 characters (RFC 3461 §4.4), which decodes to printable ASCII
/// and spaces only (§4.4 again): an encoded CR or LF would otherwise reach the header fields
/// of a DSN that names it.
pub fn check_envid(value: &str) -> Result<(), BadValue> {
    match xtext_decode(value) {
        Some(decoded)
            if (1..=100).contains(&value.len())
                && decoded.bytes().all(|b| (b' '..=b'~').contains(&b)) =>
        {
            Ok(())
        }
        _ => Err(BadValue::Envid),
    }
}

/// NOTIFY=NEVER, or one or more of SUCCESS, FAILURE, DELAY, comma-separated, each once; NEVER
/// stands alone (RFC 3461 §4.1).
pub fn parse_notify(value: &str) -> Result<NotifyOn, BadValue> {
    if value.eq_ignore_ascii_case("NEVER") {
        return Ok(NotifyOn::NEVER);
    }
    let mut on = NotifyOn::NEVER;
    for word in value.split(',') {
        let flag = if word.eq_ignore_ascii_case("SUCCESS") {
            &mut on.success
        } else if word.eq_ignore_ascii_case("FAILURE") {
            &mut on.failure
        } else if word.eq_ignore_ascii_case("DELAY") {
            &mut on.delay
        } else {
            return Err(BadValue::Notify);
        };
        if *flag {
            return Err(BadValue::Notify);
        }
        *flag = true;
    }
    Ok(on)
}

/// ORCPT=addr-type;xtext (RFC 3461 §4.2): addr-type an atom, the address xtext, 500 characters
/// at most in all. Returns the address type and the decoded address.
pub fn parse_orcpt(value: &str) -> Result<(&str, String), BadValue> {
    let (addr_type, xtext) = value.split_once(';').ok_or(BadValue::Orcpt)?;
    let atom = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~".contains(&b))
    };
    if value.len() > 500 || !atom(addr_type) || xtext.is_empty() {
        return Err(BadValue::Orcpt);
    }
    let address = xtext_decode(xtext).ok_or(BadValue::Orcpt)?;
    // No control characters once decoded: the address is written into DSNs.
    if address.chars().any(char::is_control) {
        return Err(BadValue::Orcpt);
    }
    Ok((addr_type, address))
}

/// RFC 3461 §4 xtext: printable ASCII but `+` and `=` as is, anything else as `+XX` (two
/// upper-case hex digits). `None` when the text is not xtext.
pub fn xtext_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex
                    .iter()
                    .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(b))
                {
                    return None;
                }
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 3;
            }
            b'!'..=b'~' if bytes[i] != b'=' => {
                out.push(bytes[i]);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// The inverse of `xtext_decode`, for the relay's own values (an ORCPT it makes up).
pub fn xtext_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (b'!'..=b'~').contains(&b) && b != b'+' && b != b'=' {
            out.push(b as char);
        } else {
            out.push_str(&format!("+{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(parse_ret("hdrs"), Ok(Ret::Hdrs));
        assert_eq!(parse_ret("FULL"), Ok(Ret::Full));
        assert_eq!(parse_ret("HEADERS"), Err(BadValue::Ret));
        assert_eq!(parse_notify("never"), Ok(NotifyOn::NEVER));
        assert_eq!(
            parse_notify("failure,SUCCESS"),
            Ok(NotifyOn {
                success: true,
                failure: true,
                delay: false
            })
        );
        for bad in ["", "NEVER,SUCCESS", "SUCCESS,SUCCESS", "SUCCESS,", "ALWAYS"] {
            assert_eq!(parse_notify(bad), Err(BadValue::Notify), "{bad:?}");
        }
        assert_eq!(
            parse_orcpt("rfc822;bob+2Bx@example.com"),
            Ok(("rfc822", "bob+x@example.com".to_string()))
        );
        for bad in [
            "bob@x",
            ";bob@x",
            "rfc822;",
            "rfc 822;b",
            "rfc822;b+2",
            "rfc822;b+zz",
        ] {
            assert_eq!(parse_orcpt(bad), Err(BadValue::Orcpt), "{bad:?}");
        }
        assert_eq!(check_envid("abc+20def"), Ok(()));
        assert_eq!(check_envid(&"a".repeat(101)), Err(BadValue::Envid));
        assert_eq!(check_envid("a=b"), Err(BadValue::Envid));
        assert_eq!(check_envid("a+20b"), Ok(()));
        for bad in ["a+0D+0Ab", "a+00", "a+7F", "a+C3+BC"] {
            assert_eq!(check_envid(bad), Err(BadValue::Envid), "{bad:?}");
        }
        assert_eq!(
            parse_orcpt("rfc822;b+0D+0AX-Y:+20z@x"),
            Err(BadValue::Orcpt)
        );
        assert_eq!(
            parse_orcpt("utf-8;u+C3+BC@x"),
            Ok(("utf-8", "uü@x".to_string()))
        );
        assert_eq!(xtext_decode("a+2Bb"), Some("a+b".into()));
        assert_eq!(xtext_decode("a+2bb"), None);
        assert_eq!(xtext_encode("a+b=c d"), "a+2Bb+3Dc+20d");
        assert_eq!(xtext_decode(&xtext_encode("ü x")), Some("ü x".into()));
    }

    #[test]
    fn stored_form() {
        assert_eq!(DeliveryRequests::default().to_stored(), None);
        let mut r = DeliveryRequests {
            ret: Some("HDRS".into()),
            envid: Some("e1".into()),
            require_tls: true,
            ..Default::default()
        };
        r.recipients.insert(
            "b@x".into(),
            RecipientRequests {
                notify: Some("SUCCESS,FAILURE".into()),
                orcpt: Some("rfc822;b@x".into()),
            },
        );
        let stored = r.to_stored().unwrap();
        assert_eq!(
            DeliveryRequests::from_stored(Some(&stored)).unwrap(),
            r.clone()
        );
        assert_eq!(r.notify_on("c@x"), NotifyOn::DEFAULT);
        assert!(r.notify_on("b@x").success);
        assert_eq!(r.ret(), Some(Ret::Hdrs));
        assert!(r.for_recipients(&["c@x".into()]).recipients.is_empty());
        assert!(DeliveryRequests::from_stored(Some("{\"x\":1}")).is_err());
    }
}
