//! The console's browser session: a signed cookie, and the CSRF token its forms carry.
//!
//! A browser cannot send `Authorization: Bearer` from a link, so the console takes the admin
//! token once through a login form and answers with a cookie. The cookie is signed
//! (HMAC-SHA256) with a random key this process drew at start: nothing about the admin token
//! can be guessed offline from a cookie, and a restart ends every session. Logging out
//! revokes the session in this process (a list of revoked sessions, each kept until it would
//! have expired anyway). Each form carries a second HMAC of the same session (the CSRF
//! token); `SameSite=Strict` already keeps other sites' forms from sending the cookie, and
//! the token also stops a form posted from a page that could read no console page. Wrong
//! tokens at the login form are throttled (`admin::login_throttle`).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

pub(crate) const COOKIE: &str = "idemrelay_console";
/// How long a login lasts.
pub(crate) const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The signing key: random, drawn once per process. Not derived from the admin token: a
/// cookie signed with the token (or a fast function of it) would let whoever holds one cookie
/// test guesses of the token offline.
pub(crate) fn key() -> hmac::Key {
    static PROCESS_KEY: OnceLock<[u8; 32]> = OnceLock::new();
    hmac::Key::new(
        hmac::HMAC_SHA256,
        PROCESS_KEY.get_or_init(random_bytes::<32>),
    )
}

/// Sessions logged out before their `LIFETIME` ended: nonce → when it would have expired.
fn revoked() -> &'static Mutex<HashMap<String, i64>> {
    static REVOKED: OnceLock<Mutex<HashMap<String, i64>>> = OnceLock::new();
    REVOKED.get_or_init(|| Mutex::new(HashMap::new()))
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    SystemRandom::new()
        .fill(&mut out)
        .expect("the system's random source");
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A name as given at login, if it is one: up to 64 characters, none of them a control
/// character. People write their names as they do ("Ann O'Neil (on call)"); the cookie
/// carries it hex-encoded, pages escape it, and the log's formatter quotes it, so nothing
/// else needs refusing.
pub(crate) fn valid_operator(name: &str) -> bool {
    name.chars().count() <= 64 && !name.chars().any(char::is_control)
}

fn tag(key: &hmac::Key, purpose: &str, issued_ms: i64, nonce: &str) -> String {
    let signed = hmac::sign(key, format!("{purpose}|{issued_ms}|{nonce}").as_bytes());
    hex(signed.as_ref())
}

/// A verified session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsoleLogin {
    issued_ms: i64,
    /// Random, then the person's name in hex: what the signature covers.
    nonce: String,
    /// The name the person gave at login, recorded with their actions ("" when none).
    pub operator: String,
}

impl ConsoleLogin {
    pub(crate) fn new(now_ms: i64, operator: &str) -> ConsoleLogin {
        ConsoleLogin {
            issued_ms: now_ms,
            nonce: format!(
                "{}-{}",
                hex(&random_bytes::<16>()),
                hex(operator.as_bytes())
            ),
            operator: operator.to_string(),
        }
    }

    /// The cookie's value: `issued.nonce.mac` (the nonce carries the name).
    pub(crate) fn cookie_value(&self, key: &hmac::Key) -> String {
        let mac = tag(key, "session", self.issued_ms, &self.nonce);
        format!("{}.{}.{mac}", self.issued_ms, self.nonce)
    }

    /// Checks a cookie's value: the signature, and that it is not older than `LIFETIME`.
    pub(crate) fn verify(value: &str, key: &hmac::Key, now_ms: i64) -> Option<ConsoleLogin> {
        let mut parts = value.split('.');
        let (issued, nonce, mac) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let issued_ms: i64 = issued.parse().ok()?;
        let expected = tag(key, "session", issued_ms, nonce);
        if !crate::admin::state::constant_time_eq(expected.as_bytes(), mac.as_bytes()) {
            return None;
        }
        let age = now_ms - issued_ms;
        if !(0..LIFETIME.as_millis() as i64).contains(&age) {
            return None;
        }
        if revoked()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(nonce)
        {
            return None;
        }
        let (_, name_hex) = nonce.split_once('-')?;
        let operator = String::from_utf8(unhex(name_hex)?).ok()?;
        Some(ConsoleLogin {
            issued_ms,
            nonce: nonce.to_string(),
            operator,
        })
    }

    /// Ends this session in this process: its cookie is refused from now on. Entries are
    /// dropped once the session would have expired anyway, so the list stays small.
    pub(crate) fn revoke(&self, now_ms: i64) {
        let mut revoked = revoked().lock().unwrap_or_else(|e| e.into_inner());
        revoked.retain(|_, until| *until > now_ms);
        revoked.insert(
            self.nonce.clone(),
            self.issued_ms + LIFETIME.as_millis() as i64,
        );
    }

    /// The token this session's forms carry.
    pub(crate) fn csrf(&self, key: &hmac::Key) -> String {
        tag(key, "csrf", self.issued_ms, &self.nonce)
    }

    pub(crate) fn csrf_matches(&self, key: &hmac::Key, presented: &str) -> bool {
        crate::admin::state::constant_time_eq(self.csrf(key).as_bytes(), presented.as_bytes())
    }
}

/// `Set-Cookie` for a session. No `Secure`: the admin listener speaks plain HTTP (put it
/// behind a TLS proxy to reach it from elsewhere than the host).
pub(crate) fn set_cookie(value: &str) -> String {
    format!(
        "{COOKIE}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
        LIFETIME.as_secs()
    )
}

pub(crate) fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The console cookie's value in a `Cookie` request header, if there is one.
pub(crate) fn from_cookie_header(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn a_session_verifies_under_its_key_only_and_expires() {
        let key = key();
        let session = ConsoleLogin::new(NOW, "Ada");
        let value = session.cookie_value(&key);
        assert_eq!(
            ConsoleLogin::verify(&value, &key, NOW).map(|s| s.operator),
            Some("Ada".to_string())
        );
        let renamed = value.replace(&hex(b"Ada"), &hex(b"Bob"));
        assert_eq!(ConsoleLogin::verify(&renamed, &key, NOW), None);
        let anonymous = ConsoleLogin::new(NOW, "").cookie_value(&key);
        assert_eq!(
            ConsoleLogin::verify(&anonymous, &key, NOW)
                .unwrap()
                .operator,
            ""
        );
        assert_eq!(
            ConsoleLogin::verify(&value, &key, NOW + 1000),
            Some(session.clone())
        );

        let other = hmac::Key::new(hmac::HMAC_SHA256, b"another process's key");
        assert_eq!(ConsoleLogin::verify(&value, &other, NOW), None);
        let late = NOW + LIFETIME.as_millis() as i64;
        assert_eq!(ConsoleLogin::verify(&value, &key, late), None);
        assert_eq!(ConsoleLogin::verify(&value, &key, NOW - 1), None);

        let forged_time = value.replacen(&NOW.to_string(), &(NOW + 5).to_string(), 1);
        assert_eq!(ConsoleLogin::verify(&forged_time, &key, NOW + 10), None);
        for bad in ["", "1.2", "1.2.3.4", "x.y.z", &format!("{value}.")] {
            assert_eq!(ConsoleLogin::verify(bad, &key, NOW), None, "{bad:?}");
        }
    }

    #[test]
    fn the_csrf_token_belongs_to_one_session() {
        let key = key();
        let a = ConsoleLogin::new(NOW, "");
        let b = ConsoleLogin::new(NOW, "");
        let token = a.csrf(&key);
        assert!(a.csrf_matches(&key, &token));
        assert!(!b.csrf_matches(&key, &token));
        assert!(!a.csrf_matches(&key, ""));
        // The CSRF token is not the cookie's signature: a page that learns one does not have
        // the other.
        assert!(!a.cookie_value(&key).contains(&token));
    }

    #[test]
    fn a_revoked_session_is_refused() {
        let key = key();
        let session = ConsoleLogin::new(NOW, "Ada");
        let value = session.cookie_value(&key);
        let other = ConsoleLogin::new(NOW, "Bob").cookie_value(&key);
        session.revoke(NOW + 5);
        assert_eq!(ConsoleLogin::verify(&value, &key, NOW + 10), None);
        assert!(ConsoleLogin::verify(&other, &key, NOW + 10).is_some());
    }

    #[test]
    fn operator_names() {
        assert!(valid_operator("Ada Lovelace"));
        assert!(valid_operator("ops-1@example"));
        assert!(valid_operator(""));
        assert!(!valid_operator("a\nb"));
        assert!(valid_operator("Ann O'Neil (on call)"));
        assert!(valid_operator("<b>"), "pages escape it");
        assert!(!valid_operator("a\tb"));
        assert!(!valid_operator(&"x".repeat(65)));
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        assert_eq!(
            from_cookie_header("a=1; idemrelay_console=v.w.x; b=2"),
            Some("v.w.x")
        );
        assert_eq!(from_cookie_header("idemrelay_consoleX=1"), None);
        assert_eq!(from_cookie_header(""), None);
        let set = set_cookie("v");
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
    }
}
