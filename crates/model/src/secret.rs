//! Settings that hold secrets (a URL with a password, the admin token): they never reach
//! logs, Debug output or `check-config`. A leaf, so that anything showing such a value
//! (a user's own upstream, the store's URL) can redact it without depending on the settings.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A URL that may carry a password (upstream, Postgres store): the password never reaches
/// logs, Debug output or `check-config`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(pub String);

impl SecretUrl {
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its password replaced by `********`; a URL without one is shown as written.
    pub fn redacted(&self) -> String {
        let text = &self.0;
        match url::Url::parse(text) {
            Ok(mut url) if url.password().is_some() => match url.set_password(Some("********")) {
                Ok(()) => url.to_string(),
                Err(()) => redact_userinfo(text),
            },
            Ok(_) => text.clone(),
            // Unparseable, yet it may hold a password (one with `/`, `?` or `#` in it cuts the
            // authority short): everything before the last `@` goes.
            Err(_) => redact_userinfo(text),
        }
    }
}

fn redact_userinfo(text: &str) -> String {
    match (text.split_once("://"), text.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://********@{}", &text[at + 1..]),
        (None, Some(at)) => format!("********@{}", &text[at + 1..]),
        (_, None) => text.to_string(),
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

/// A secret setting (the admin bearer token): never shown by Debug, logs or `check-config`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"********\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("********")
    }
}
