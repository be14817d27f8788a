//! SASL PLAIN (RFC 4616) and LOGIN (draft-murchison-sasl-login) as a pure state machine.
//!
//! The session feeds it the `AUTH` arguments and each continuation line and sends whatever
//! [`SaslStep`] asks for; checking the credentials is the relay's job (its `auth` module).

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;

/// Decoded responses larger than this are refused before anything else looks at them.
pub const MAX_DECODED_LEN: usize = 1024;

/// Base64 of `Username:`, the first LOGIN challenge.
const LOGIN_USERNAME_CHALLENGE: &str = "VXNlcm5hbWU6";
/// Base64 of `Password:`, the second LOGIN challenge.
const LOGIN_PASSWORD_CHALLENGE: &str = "UGFzc3dvcmQ6";

/// RFC 4954 requires padded base64, but some deployed clients strip the padding; accepting
/// both costs nothing and never changes what a well-formed response decodes to.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Credentials a client presented.
#[derive(Clone, PartialEq, Eq)]
pub struct Presented {
    /// Authorization identity; only ever `None` or equal to `user` (no proxy auth).
    pub authzid: Option<String>,
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Presented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presented")
            .field("authzid", &self.authzid)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// What the session does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaslStep {
    /// Send `334 <challenge base64>` (challenge may be empty: "334 ") and wait for the next line.
    Challenge(String),
    Done(Presented),
    /// Malformed: base64, missing NULs, non-UTF-8, empty user, empty password, authzid != user
    /// (we do not support proxy auth; an authzid equal to the user is fine), too long
    /// (> 1024 bytes decoded).
    Malformed,
    /// The client sent "*".
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    Login,
}

impl Mechanism {
    #[cfg(test)]
    /// Case-insensitive, as RFC 4422 mechanism names are.
    pub fn parse(name: &str) -> Option<Self> {
        if name.eq_ignore_ascii_case("PLAIN") {
            Some(Mechanism::Plain)
        } else if name.eq_ignore_ascii_case("LOGIN") {
            Some(Mechanism::Login)
        } else {
            None
        }
    }

    #[cfg(test)]
    /// The name as advertised in EHLO.
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Login => "LOGIN",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    PlainResponse,
    LoginUser,
    LoginPassword {
        user: String,
    },
    /// Done, malformed or cancelled: any further line is a protocol error.
    Finished,
}

/// A SASL exchange in progress.
#[derive(Debug)]
pub struct SaslExchange {
    #[cfg_attr(not(test), allow(dead_code))]
    mechanism: Mechanism,
    state: Stage,
}

impl SaslExchange {
    /// `AUTH <mech> [initial-response]` ("=" means an empty initial response, RFC 4954).
    ///
    /// An initial response of "*" is read as a cancel: RFC 4954 only defines "*" for
    /// continuation lines, but a client sending it means nothing else.
    pub fn start(mechanism: Mechanism, initial: Option<&str>) -> (SaslExchange, SaslStep) {
        let state = match mechanism {
            Mechanism::Plain => Stage::PlainResponse,
            Mechanism::Login => Stage::LoginUser,
        };
        let mut exchange = SaslExchange { mechanism, state };
        let step = match initial {
            None => match mechanism {
                Mechanism::Plain => SaslStep::Challenge(String::new()),
                Mechanism::Login => SaslStep::Challenge(LOGIN_USERNAME_CHALLENGE.to_string()),
            },
            // "=" is only the initial-response spelling of "empty"; in a continuation line
            // an empty response is an empty line, so translate before sharing the path.
            Some(response) if response.trim() == "=" => exchange.next(""),
            Some(response) => exchange.next(response),
        };
        (exchange, step)
    }

    /// The client's next line (without CRLF).
    pub fn next(&mut self, line: &str) -> SaslStep {
        let line = line.trim_matches([' ', '\t']);
        let state = std::mem::replace(&mut self.state, Stage::Finished);
        match state {
            Stage::Finished => SaslStep::Malformed,
            _ if line == "*" => SaslStep::Cancelled,
            Stage::PlainResponse => match decode(line).and_then(|bytes| parse_plain(&bytes)) {
                Some(presented) => SaslStep::Done(presented),
                None => SaslStep::Malformed,
            },
            Stage::LoginUser => match decode_field(line) {
                Some(user) => {
                    self.state = Stage::LoginPassword { user };
                    SaslStep::Challenge(LOGIN_PASSWORD_CHALLENGE.to_string())
                }
                None => SaslStep::Malformed,
            },
            Stage::LoginPassword { user } => match decode_field(line) {
                Some(password) => SaslStep::Done(Presented {
                    authzid: None,
                    user,
                    password,
                }),
                None => SaslStep::Malformed,
            },
        }
    }

    #[cfg(test)]
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    #[cfg(test)]
    /// True once the exchange produced its final step.
    pub fn is_finished(&self) -> bool {
        self.state == Stage::Finished
    }
}

/// Decodes one base64 response, refusing oversized input before allocating for it.
fn decode(line: &str) -> Option<Vec<u8>> {
    // Four base64 characters carry three bytes; anything longer cannot decode to ≤ the limit.
    if line.len() > MAX_DECODED_LEN.div_ceil(3) * 4 {
        return None;
    }
    let bytes = BASE64.decode(line).ok()?;
    (bytes.len() <= MAX_DECODED_LEN).then_some(bytes)
}

/// A LOGIN username or password: non-empty UTF-8 without NUL (RFC 4616's SAFE, so that the
/// two mechanisms accept the same credentials).
fn decode_field(line: &str) -> Option<String> {
    let text = String::from_utf8(decode(line)?).ok()?;
    (!text.is_empty() && !text.contains('\0')).then_some(text)
}

/// `[authzid] NUL authcid NUL passwd`, with authcid and passwd non-empty (RFC 4616 §2).
fn parse_plain(bytes: &[u8]) -> Option<Presented> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut fields = text.split('\0');
    let (authzid, user, password) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() || user.is_empty() || password.is_empty() {
        return None;
    }
    let authzid = match authzid {
        "" => None,
        same if same == user => Some(same.to_string()),
        _ => return None,
    };
    Some(Presented {
        authzid,
        user: user.to_string(),
        password: password.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn done(authzid: Option<&str>, user: &str, password: &str) -> SaslStep {
        SaslStep::Done(Presented {
            authzid: authzid.map(str::to_string),
            user: user.to_string(),
            password: password.to_string(),
        })
    }

    fn challenge(text: &str) -> SaslStep {
        SaslStep::Challenge(text.to_string())
    }

    /// Case name, initial response, client lines, every step expected (start's included).
    type Transcript = (&'static str, Option<String>, Vec<String>, Vec<SaslStep>);

    /// Runs a whole exchange and returns every step, so each case reads as a transcript.
    fn run(mechanism: Mechanism, initial: Option<&str>, lines: &[&str]) -> Vec<SaslStep> {
        let (mut exchange, first) = SaslExchange::start(mechanism, initial);
        let mut steps = vec![first];
        for line in lines {
            steps.push(exchange.next(line));
        }
        steps
    }

    #[test]
    fn mechanism_parse() {
        let cases: &[(&str, Option<Mechanism>)] = &[
            ("PLAIN", Some(Mechanism::Plain)),
            ("plain", Some(Mechanism::Plain)),
            ("Login", Some(Mechanism::Login)),
            ("LOGIN", Some(Mechanism::Login)),
            ("CRAM-MD5", None),
            ("PLAINX", None),
            ("", None),
        ];
        for (name, want) in cases {
            assert_eq!(Mechanism::parse(name), *want, "{name:?}");
        }
        assert_eq!(Mechanism::Plain.as_str(), "PLAIN");
        assert_eq!(Mechanism::Login.as_str(), "LOGIN");
    }

    #[test]
    fn plain_transcripts() {
        let long_password = "p".repeat(MAX_DECODED_LEN - 7);
        let too_long_password = "p".repeat(MAX_DECODED_LEN - 6);
        let long_ok = b64(format!("\0alice\0{long_password}").as_bytes());
        let long_bad = b64(format!("\0alice\0{too_long_password}").as_bytes());
        let plain = b64(b"\0alice\0secret");
        let unpadded = plain.trim_end_matches('=').to_string();
        let cases: Vec<Transcript> = vec![
            (
                "initial response",
                Some(plain.clone()),
                vec![],
                vec![done(None, "alice", "secret")],
            ),
            (
                "no initial response: empty challenge then response",
                None,
                vec![plain.clone()],
                vec![challenge(""), done(None, "alice", "secret")],
            ),
            (
                "unpadded base64 accepted",
                Some(unpadded),
                vec![],
                vec![done(None, "alice", "secret")],
            ),
            (
                "surrounding blanks ignored",
                None,
                vec![format!(" {plain}\t")],
                vec![challenge(""), done(None, "alice", "secret")],
            ),
            (
                "authzid equal to user",
                Some(b64(b"alice\0alice\0secret")),
                vec![],
                vec![done(Some("alice"), "alice", "secret")],
            ),
            (
                "authzid different from user (proxy auth)",
                Some(b64(b"bob\0alice\0secret")),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "UTF-8 user and password",
                Some(b64("\0jürgen\0pässwörd🔑".as_bytes())),
                vec![],
                vec![done(None, "jürgen", "pässwörd🔑")],
            ),
            (
                "password may contain spaces and '='",
                Some(b64(b"\0alice\0 a = b ")),
                vec![],
                vec![done(None, "alice", " a = b ")],
            ),
            (
                "exactly the size limit",
                Some(long_ok),
                vec![],
                vec![done(None, "alice", &long_password)],
            ),
            (
                "one byte over the size limit",
                Some(long_bad),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "huge line refused",
                Some("QUFB".repeat(1000)),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "'=' initial response is empty: no NULs",
                Some("=".into()),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "empty continuation line",
                None,
                vec!["".into()],
                vec![challenge(""), SaslStep::Malformed],
            ),
            (
                "malformed base64",
                Some("not base64!".into()),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "malformed base64 in continuation",
                None,
                vec!["@@@@".into()],
                vec![challenge(""), SaslStep::Malformed],
            ),
            (
                "no NUL at all",
                Some(b64(b"alice secret")),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "only one NUL",
                Some(b64(b"alice\0secret")),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "three NULs",
                Some(b64(b"\0alice\0sec\0ret")),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "empty user",
                Some(b64(b"\0\0secret")),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "empty password",
                Some(b64(b"\0alice\0")),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "non-UTF-8",
                Some(b64(b"\0alice\0\xff\xfe")),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "'*' as initial response cancels",
                Some("*".into()),
                vec![],
                vec![SaslStep::Cancelled],
            ),
            (
                "'*' after the empty challenge cancels",
                None,
                vec!["*".into()],
                vec![challenge(""), SaslStep::Cancelled],
            ),
            (
                "lines after the end are errors",
                Some(plain.clone()),
                vec![plain.clone()],
                vec![done(None, "alice", "secret"), SaslStep::Malformed],
            ),
        ];
        for (name, initial, lines, want) in cases {
            let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
            assert_eq!(
                run(Mechanism::Plain, initial.as_deref(), &lines),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn login_transcripts() {
        let user = b64(b"alice");
        let pass = b64(b"secret");
        let username = challenge("VXNlcm5hbWU6");
        let password = challenge("UGFzc3dvcmQ6");
        let cases: Vec<Transcript> = vec![
            (
                "full exchange",
                None,
                vec![user.clone(), pass.clone()],
                vec![
                    username.clone(),
                    password.clone(),
                    done(None, "alice", "secret"),
                ],
            ),
            (
                "initial response is the username",
                Some(user.clone()),
                vec![pass.clone()],
                vec![password.clone(), done(None, "alice", "secret")],
            ),
            (
                "UTF-8 username and password",
                None,
                vec![b64("jürgen".as_bytes()), b64("pässwörd🔑".as_bytes())],
                vec![
                    username.clone(),
                    password.clone(),
                    done(None, "jürgen", "pässwörd🔑"),
                ],
            ),
            (
                "'=' initial response is an empty username",
                Some("=".into()),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "empty username line",
                None,
                vec!["".into()],
                vec![username.clone(), SaslStep::Malformed],
            ),
            (
                "empty password line",
                None,
                vec![user.clone(), "".into()],
                vec![username.clone(), password.clone(), SaslStep::Malformed],
            ),
            (
                "malformed base64 username",
                None,
                vec!["%%%".into()],
                vec![username.clone(), SaslStep::Malformed],
            ),
            (
                "malformed base64 password",
                None,
                vec![user.clone(), "%%%".into()],
                vec![username.clone(), password.clone(), SaslStep::Malformed],
            ),
            (
                "malformed base64 initial response",
                Some("%%%".into()),
                vec![],
                vec![SaslStep::Malformed],
            ),
            (
                "non-UTF-8 password",
                None,
                vec![user.clone(), b64(b"\xc3\x28")],
                vec![username.clone(), password.clone(), SaslStep::Malformed],
            ),
            (
                "NUL inside the username",
                None,
                vec![b64(b"ali\0ce")],
                vec![username.clone(), SaslStep::Malformed],
            ),
            (
                "too long password",
                None,
                vec![user.clone(), b64(&[b'p'; MAX_DECODED_LEN + 1])],
                vec![username.clone(), password.clone(), SaslStep::Malformed],
            ),
            (
                "'*' as initial response",
                Some("*".into()),
                vec![],
                vec![SaslStep::Cancelled],
            ),
            (
                "'*' at the username challenge",
                None,
                vec!["*".into()],
                vec![username.clone(), SaslStep::Cancelled],
            ),
            (
                "'*' at the password challenge",
                None,
                vec![user.clone(), "*".into()],
                vec![username.clone(), password.clone(), SaslStep::Cancelled],
            ),
            (
                "'*' at the password challenge after an initial response",
                Some(user.clone()),
                vec!["*".into()],
                vec![password.clone(), SaslStep::Cancelled],
            ),
            (
                "lines after cancel are errors",
                None,
                vec!["*".into(), user.clone()],
                vec![username.clone(), SaslStep::Cancelled, SaslStep::Malformed],
            ),
        ];
        for (name, initial, lines, want) in cases {
            let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
            assert_eq!(
                run(Mechanism::Login, initial.as_deref(), &lines),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn exchange_reports_progress() {
        let (mut exchange, _) = SaslExchange::start(Mechanism::Login, None);
        assert_eq!(exchange.mechanism(), Mechanism::Login);
        assert!(!exchange.is_finished());
        exchange.next(&b64(b"alice"));
        assert!(!exchange.is_finished());
        exchange.next(&b64(b"secret"));
        assert!(exchange.is_finished());
    }

    #[test]
    fn debug_redacts_password() {
        let presented = Presented {
            authzid: None,
            user: "alice".into(),
            password: "hunter2".into(),
        };
        let cases = [
            format!("{presented:?}"),
            format!("{:?}", SaslStep::Done(presented.clone())),
            format!("{presented:#?}"),
        ];
        for text in cases {
            assert!(text.contains("alice"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }
}
