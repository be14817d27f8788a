//! What an upstream attempt came to, decided in one place, as data (docs/concepts/delivery.md).
//!
//! The SMTP client reports *where* it stopped ([`Phase`]) and *how* ([`Failure`], or the reply
//! to the final dot); everything that depends on the meaning of a reply code lives here so the
//! worker, the ledger and the tests agree on it.
//!
//! Reply strings stored in an [`Outcome`] are whole reply lines, `"<code> <text>"`, so the
//! ledger shows what the upstream said without a second column to join.

use std::fmt;

pub(crate) use crate::store::{OutcomeKind, Phase};

/// How a phase failed, as seen by the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// `text` is the reply text; a leading copy of the code (`"550 5.1.1 ..."`) is tolerated.
    Reply {
        code: u16,
        text: String,
    },
    Timeout,
    ConnectionLost(String),
    Tls(String),
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// 250 after the final dot; `reply` is the full line, e.g. `"250 2.0.0 OK id=1"`.
    Accepted { reply: String },
    /// Definitely not accepted; retry with backoff. `reply` is the reply line, or the
    /// wording of the failure when none came (`heard` says which).
    Transient {
        phase: Phase,
        heard: Heard,
        reply: String,
    },
    /// Failed; the sender gets a DSN.
    Permanent {
        phase: Phase,
        code: u16,
        reply: String,
    },
    /// The final dot was sent and no usable answer came. `reason` is either the unusable reply
    /// line (starting with its code) or a description of the transport failure.
    Unknown { phase: Phase, reason: String },
}

/// What came back from a phase that failed before the dot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// A reply, with this code.
    Reply(u16),
    /// No reply: the phase ended this way.
    Nothing(Silence),
}

/// How a phase ended without a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Silence {
    Timeout,
    ConnectionLost,
    /// The TLS handshake failed (STARTTLS, or implicit TLS in the connect phase).
    Tls,
    /// Anything else the client reports (a refused or unreachable connection).
    Other,
}

impl Heard {
    pub(crate) fn code(self) -> Option<u16> {
        match self {
            Heard::Reply(code) => Some(code),
            Heard::Nothing(_) => None,
        }
    }
}

impl Outcome {
    pub(crate) fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Accepted { .. } => OutcomeKind::Accepted,
            Outcome::Transient { .. } => OutcomeKind::Transient,
            Outcome::Permanent { .. } => OutcomeKind::Permanent,
            Outcome::Unknown { .. } => OutcomeKind::Unknown,
        }
    }

    /// The phase the attempt ended in. Always `Some`: an accepted message ended at
    /// [`Phase::Dot`], which keeps the ledger's phase column filled for every attempt.
    pub(crate) fn phase(&self) -> Option<Phase> {
        match self {
            Outcome::Accepted { .. } => Some(Phase::Dot),
            Outcome::Transient { phase, .. }
            | Outcome::Permanent { phase, .. }
            | Outcome::Unknown { phase, .. } => Some(*phase),
        }
    }

    /// The upstream's reply code, when there was a reply.
    pub(crate) fn code(&self) -> Option<u16> {
        match self {
            Outcome::Accepted { reply } => Some(leading_code(reply).unwrap_or(250)),
            Outcome::Transient { heard, .. } => heard.code(),
            Outcome::Permanent { code, .. } => Some(*code),
            Outcome::Unknown { reason, .. } => leading_code(reason),
        }
    }

    /// The text for the ledger: the reply line, or what went wrong when there was none.
    pub(crate) fn reply_text(&self) -> String {
        match self {
            Outcome::Accepted { reply }
            | Outcome::Transient { reply, .. }
            | Outcome::Permanent { reply, .. } => reply.clone(),
            Outcome::Unknown { reason, .. } => reason.clone(),
        }
    }
}

/// An RFC 3463 enhanced status code, `class.subject.detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct EnhancedCode {
    pub class: u8,
    pub subject: u16,
    pub detail: u16,
}

impl EnhancedCode {
    /// Reads the enhanced code at the start of a reply's text. A leading basic code
    /// (`"550 5.1.1 ..."` or `"550-5.1.1 ..."`) is skipped, so both reply lines and bare texts work.
    pub(crate) fn from_reply(reply: &str) -> Option<EnhancedCode> {
        let text = strip_code(reply.trim_start());
        let token = text.split_ascii_whitespace().next()?;
        let mut it = token.splitn(3, '.');
        let class = it.next()?;
        let subject = it.next()?;
        let detail = it.next()?;
        let class = match class {
            "2" => 2,
            "4" => 4,
            "5" => 5,
            _ => return None,
        };
        Some(EnhancedCode {
            class,
            subject: small_number(subject)?,
            detail: small_number(detail)?,
        })
    }
}

impl fmt::Display for EnhancedCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.class, self.subject, self.detail)
    }
}

/// RFC 3463 allows 1-3 digits for subject and detail.
fn small_number(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 3 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The three-digit code a reply line starts with, if it is followed by nothing, a space or `-`.
pub(crate) fn leading_code(line: &str) -> Option<u16> {
    let b = line.as_bytes();
    if b.len() < 3 || !b[..3].iter().all(u8::is_ascii_digit) {
        return None;
    }
    if b.len() > 3 && b[3] != b' ' && b[3] != b'-' {
        return None;
    }
    line[..3].parse().ok()
}

fn strip_code(line: &str) -> &str {
    match leading_code(line) {
        Some(_) => line[3..].get(1..).unwrap_or(""),
        None => line,
    }
}

/// `"<code> <text>"`, without doubling a code the text already starts with.
pub(crate) fn reply_line(code: u16, text: &str) -> String {
    let text = text.trim();
    if leading_code(text) == Some(code) {
        return text.to_string();
    }
    if text.is_empty() {
        code.to_string()
    } else {
        format!("{code} {text}")
    }
}

/// The reply to the final dot.
///
/// Only 250 means accepted. Any other 2xx/3xx is not a documented answer to the dot, so the
/// upstream may or may not have taken the message: UNKNOWN (a generic client would call it
/// success; we must not, or a retry could not be reasoned about).
pub(crate) fn after_dot(code: u16, text: &str) -> Outcome {
    let reply = reply_line(code, text);
    match code {
        250 => Outcome::Accepted { reply },
        400..=499 => Outcome::Transient {
            phase: Phase::Dot,
            heard: Heard::Reply(code),
            reply,
        },
        500..=599 => Outcome::Permanent {
            phase: Phase::Dot,
            code,
            reply,
        },
        _ => Outcome::Unknown {
            phase: Phase::Dot,
            reason: reply,
        },
    }
}

/// A phase that failed.
///
/// Before the dot nothing can have been accepted, so every failure there is at worst
/// transient; a 5xx is permanent only once the upstream has judged this message (MAIL onward).
/// A 5xx while connecting, at TLS or AUTH says something about the connection or our account,
/// which a person or time can fix, so the message waits instead of bouncing.
pub(crate) fn classify(phase: Phase, failure: Failure) -> Outcome {
    match failure {
        Failure::Reply { code, text } if phase == Phase::Dot => after_dot(code, &text),
        Failure::Reply { code, text } => {
            let reply = reply_line(code, &text);
            match code {
                500..=599 if !phase.is_session_level() => Outcome::Permanent { phase, code, reply },
                _ => Outcome::Transient {
                    phase,
                    heard: Heard::Reply(code),
                    reply,
                },
            }
        }
        other => {
            let reason = describe(&other);
            if phase == Phase::Dot {
                Outcome::Unknown { phase, reason }
            } else {
                Outcome::Transient {
                    phase,
                    heard: Heard::Nothing(other.silence()),
                    reply: reason,
                }
            }
        }
    }
}

impl Failure {
    /// How a failure without a reply ended; a reply is not one (`classify` takes it apart).
    fn silence(&self) -> Silence {
        match self {
            Failure::Timeout => Silence::Timeout,
            Failure::ConnectionLost(_) => Silence::ConnectionLost,
            Failure::Tls(_) => Silence::Tls,
            Failure::Reply { .. } | Failure::Other(_) => Silence::Other,
        }
    }
}

/// Never starts with three digits, so [`Outcome::code`] cannot mistake it for a reply.
fn describe(failure: &Failure) -> String {
    match failure {
        Failure::Reply { code, text } => reply_line(*code, text),
        Failure::Timeout => "timed out".to_string(),
        Failure::ConnectionLost(s) => format!("connection lost: {s}"),
        Failure::Tls(s) => format!("TLS error: {s}"),
        Failure::Other(s) => format!("error: {s}"),
    }
}

/// The reply parts the account and slow-down rules look at.
fn reply_of(outcome: &Outcome) -> Option<(Phase, u16, &str)> {
    match outcome {
        Outcome::Transient {
            phase,
            heard: Heard::Reply(code),
            reply,
        }
        | Outcome::Permanent {
            phase, code, reply, ..
        } if (400..=599).contains(code) => Some((*phase, *code, reply.as_str())),
        _ => None,
    }
}

/// Words that, from our own upstream, only ever concern the account.
const ACCOUNT_STRONG: &[&str] = &[
    "suspend",
    "disabled",
    "deactivat",
    "quota",
    "billing",
    "payment",
    "over limit",
    "over the limit",
];

/// Words that make it clear a reply at RCPT or later is about the recipient, not us.
const RECIPIENT_WORDS: &[&str] = &[
    "recipient",
    "mailbox",
    "tried to reach",
    "user unknown",
    "unknown user",
    "no such user",
    "addressee",
];

/// Phrases that are always about our sending allowance, whatever the code.
const OUR_ALLOWANCE: &[&str] = &["sending quota", "sending limit"];

fn mentions_account(lower: &str) -> bool {
    ACCOUNT_STRONG.iter().any(|w| lower.contains(w))
        // "too many connections from your account" is a rate, not a person's job.
        || (lower.contains("account") && !mentions_slow_down(lower))
}

/// The failure concerns the account, not the message: pause the whole queue and alert.
///
/// The rule, in order (only 4xx/5xx replies count; timeouts are the network's):
/// 1. any reply at AUTH, or 530/534/535 anywhere: our credentials;
/// 2. "sending quota"/"sending limit" anywhere: our allowance;
/// 3. before a recipient is named (connect … MAIL): account words ("suspended", "disabled",
///    "quota", "billing", "account", "over limit", …) or an X.2.2 quota code: about us,
///    since nothing else has been said yet;
/// 4. at RCPT or later: only an X.7.x policy code with account words and no word pointing at
///    the recipient ("mailbox", "recipient", "tried to reach", …). A 5.2.2 at RCPT is the
///    recipient's full mailbox and a 5.1.1 is an unknown user: per-message, never account.
pub(crate) fn is_account_problem(outcome: &Outcome) -> bool {
    let Some((phase, code, reply)) = reply_of(outcome) else {
        return false;
    };
    if phase == Phase::Auth || matches!(code, 530 | 534 | 535) {
        return true;
    }
    let lower = reply.to_ascii_lowercase();
    if OUR_ALLOWANCE.iter().any(|w| lower.contains(w)) {
        return true;
    }
    let enhanced = EnhancedCode::from_reply(reply);
    if phase.is_session_level() || phase == Phase::Mail {
        let quota_code = enhanced.is_some_and(|e| e.subject == 2 && e.detail == 2);
        return quota_code || mentions_account(&lower);
    }
    let policy = enhanced.is_some_and(|e| e.subject == 7);
    policy && mentions_account(&lower) && !RECIPIENT_WORDS.iter().any(|w| lower.contains(w))
}

/// The upstream asks the whole client to slow down.
///
/// Only the transient codes servers use for rate limiting (421, 450, 451, 452) count, and
/// only with an X.7.x policy code or words about rate ("rate", "throttled", "slow down",
/// "too many …"), except "too many recipients", which is about one message.
pub(crate) fn is_slow_down(outcome: &Outcome) -> bool {
    let Outcome::Transient {
        heard: Heard::Reply(code),
        reply,
        ..
    } = outcome
    else {
        return false;
    };
    if !matches!(code, 421 | 450 | 451 | 452) {
        return false;
    }
    let policy = EnhancedCode::from_reply(reply).is_some_and(|e| e.class == 4 && e.subject == 7);
    policy || mentions_slow_down(&reply.to_ascii_lowercase())
}

/// Word-based, so "generate" or "separate" do not read as "rate".
fn mentions_slow_down(lower: &str) -> bool {
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let single = words.iter().any(|w| {
        matches!(*w, "rate" | "rates") || w.starts_with("ratelimit") || w.starts_with("throttl")
    });
    let pair = words.windows(2).any(|p| p == ["slow", "down"]);
    let too_many = words.windows(3).any(|t| {
        t[0] == "too" && t[1] == "many" && !matches!(t[2], "recipients" | "rcpt" | "rcpts")
    }) || words.ends_with(&["too", "many"]);
    single || pair || too_many
}

/// The (outcome, phase) pairs an attempt can end in, as metric labels: accepted and unknown
/// only at the dot, permanent only once the upstream judged the message (MAIL onward),
/// transient anywhere.
pub(crate) fn attempt_endings() -> Vec<(&'static str, &'static str)> {
    let mut pairs = Vec::new();
    for outcome in OutcomeKind::ALL {
        for phase in Phase::ALL {
            let possible = match outcome {
                OutcomeKind::Accepted | OutcomeKind::Unknown => phase == Phase::Dot,
                OutcomeKind::Permanent => {
                    matches!(phase, Phase::Mail | Phase::Rcpt | Phase::Data | Phase::Dot)
                }
                OutcomeKind::Transient => true,
            };
            if possible {
                pairs.push((outcome.as_str(), phase.as_str()));
            }
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use OutcomeKind as K;
    use Phase::*;

    fn reply(code: u16, text: &str) -> Failure {
        Failure::Reply {
            code,
            text: text.to_string(),
        }
    }

    #[test]
    fn after_dot_table() {
        let cases: &[(u16, &str, OutcomeKind, Option<u16>)] = &[
            (250, "2.0.0 OK id=1", K::Accepted, Some(250)),
            (250, "250 2.0.0 OK id=1", K::Accepted, Some(250)),
            (251, "2.1.5 will forward", K::Unknown, Some(251)),
            (200, "ok", K::Unknown, Some(200)),
            (220, "hello again", K::Unknown, Some(220)),
            (354, "go ahead", K::Unknown, Some(354)),
            (421, "4.4.2 closing", K::Transient, Some(421)),
            (451, "4.3.0 in progress", K::Transient, Some(451)),
            (452, "4.3.1 storage", K::Transient, Some(452)),
            (550, "5.7.1 rejected", K::Permanent, Some(550)),
            (554, "5.6.0 E01005", K::Permanent, Some(554)),
            (199, "odd", K::Unknown, Some(199)),
            (600, "odd", K::Unknown, Some(600)),
            (0, "", K::Unknown, None),
        ];
        for &(code, text, kind, want_code) in cases {
            let o = after_dot(code, text);
            assert_eq!(o.kind(), kind, "{code} {text}");
            assert_eq!(o.phase(), Some(Dot), "{code} {text}");
            assert_eq!(o.code(), want_code, "{code} {text}");
        }
    }

    #[test]
    fn accepted_keeps_the_full_line() {
        assert_eq!(
            after_dot(250, "2.0.0 OK id=1"),
            Outcome::Accepted {
                reply: "250 2.0.0 OK id=1".into()
            }
        );
        assert_eq!(
            after_dot(250, "250 2.0.0 OK id=1\r\n").reply_text(),
            "250 2.0.0 OK id=1"
        );
        assert_eq!(after_dot(250, "").reply_text(), "250");
    }

    #[test]
    fn classify_replies_table() {
        use OutcomeKind::*;
        // (phase, code, expected kind)
        let cases: &[(Phase, u16, OutcomeKind)] = &[
            (Connect, 421, Transient),
            (Connect, 554, Transient),
            (Greeting, 554, Transient),
            (Ehlo, 502, Transient),
            (StartTls, 454, Transient),
            (StartTls, 501, Transient),
            (Auth, 535, Transient),
            (Auth, 454, Transient),
            (Mail, 451, Transient),
            (Mail, 550, Permanent),
            (Mail, 552, Permanent),
            (Rcpt, 450, Transient),
            (Rcpt, 550, Permanent),
            (Data, 554, Permanent),
            (Data, 451, Transient),
            (Dot, 552, Permanent),
            (Dot, 250, Accepted),
            (Dot, 251, Unknown),
            (Dot, 421, Transient),
            (Dot, 554, Permanent),
            // An unexpected positive reply before the dot: nothing was delivered yet.
            (Rcpt, 250, Transient),
            (Data, 250, Transient),
            (Mail, 999, Transient),
        ];
        for &(phase, code, kind) in cases {
            let o = classify(phase, reply(code, "x"));
            assert_eq!(o.kind(), kind, "{phase} {code}");
            assert_eq!(o.phase(), Some(phase), "{phase} {code}");
            assert_eq!(o.code(), Some(code), "{phase} {code}");
            assert_eq!(o.reply_text(), format!("{code} x"));
        }
    }

    #[test]
    fn classify_transport_failures_table() {
        let failures = [
            Failure::Timeout,
            Failure::ConnectionLost("reset by peer".into()),
            Failure::Tls("bad certificate".into()),
            Failure::Other("500 things".into()),
        ];
        for phase in Phase::ALL {
            for f in &failures {
                let o = classify(phase, f.clone());
                let want = if phase == Dot {
                    K::Unknown
                } else {
                    K::Transient
                };
                assert_eq!(o.kind(), want, "{phase} {f:?}");
                assert_eq!(o.code(), None, "{phase} {f:?}");
                assert_eq!(o.phase(), Some(phase));
                assert!(!o.reply_text().is_empty());
            }
        }
        assert_eq!(
            classify(Dot, Failure::Timeout),
            Outcome::Unknown {
                phase: Dot,
                reason: "timed out".into()
            }
        );
        assert_eq!(
            classify(Rcpt, Failure::ConnectionLost("eof".into())),
            Outcome::Transient {
                phase: Rcpt,
                heard: Heard::Nothing(Silence::ConnectionLost),
                reply: "connection lost: eof".into()
            }
        );
    }

    #[test]
    fn classify_reply_at_dot_matches_after_dot() {
        for code in [250, 251, 354, 421, 451, 550, 554, 0, 700] {
            assert_eq!(classify(Dot, reply(code, "t")), after_dot(code, "t"));
        }
    }

    type Triple = (u8, u16, u16);

    #[test]
    fn enhanced_code_parsing() {
        let cases: &[(&str, Option<Triple>)] = &[
            ("5.1.1 user unknown", Some((5, 1, 1))),
            ("550 5.1.1 user unknown", Some((5, 1, 1))),
            ("550-5.7.1 policy", Some((5, 7, 1))),
            ("  4.7.0 later", Some((4, 7, 0))),
            ("2.0.0", Some((2, 0, 0))),
            ("5.100.999 x", Some((5, 100, 999))),
            ("5.1000.1 x", None),
            ("3.1.1 x", None),
            ("5.1 x", None),
            ("5..1 x", None),
            ("user unknown 5.1.1", None),
            ("550", None),
            ("", None),
            ("5.1.1.1 x", None),
        ];
        for &(text, want) in cases {
            let got = EnhancedCode::from_reply(text).map(|e| (e.class, e.subject, e.detail));
            assert_eq!(got, want, "{text:?}");
        }
        assert_eq!(
            EnhancedCode::from_reply("5.7.26 dmarc")
                .unwrap()
                .to_string(),
            "5.7.26"
        );
    }

    #[test]
    fn leading_code_and_reply_line() {
        assert_eq!(leading_code("250 ok"), Some(250));
        assert_eq!(leading_code("250-ok"), Some(250));
        assert_eq!(leading_code("250"), Some(250));
        assert_eq!(leading_code("2500 ok"), None);
        assert_eq!(leading_code("25"), None);
        assert_eq!(leading_code("timed out"), None);
        assert_eq!(reply_line(550, "5.1.1 nope"), "550 5.1.1 nope");
        assert_eq!(reply_line(550, "550 5.1.1 nope"), "550 5.1.1 nope");
        assert_eq!(reply_line(550, "551 odd"), "550 551 odd");
        assert_eq!(reply_line(421, "  "), "421");
    }

    fn at(phase: Phase, code: u16, text: &str) -> Outcome {
        classify(phase, reply(code, text))
    }

    #[test]
    fn account_problem_table() {
        let cases: &[(Phase, u16, &str, bool)] = &[
            // Credentials.
            (Auth, 535, "5.7.8 Authentication credentials invalid", true),
            (Auth, 534, "5.7.9 Please log in with your web browser", true),
            (Auth, 530, "5.7.0 Authentication required", true),
            (Auth, 454, "4.7.0 Temporary authentication failure", true),
            (Auth, 421, "4.7.0 too many auth failures", true),
            (Mail, 530, "5.7.0 Authentication required", true),
            (Rcpt, 535, "5.7.8 bad credentials", true),
            // Suspended, billing, quota before any recipient.
            (Connect, 554, "5.7.1 account suspended", true),
            (Greeting, 421, "4.7.0 Account disabled", true),
            (Ehlo, 554, "billing problem, contact support", true),
            (Mail, 550, "5.7.1 Your account has been suspended", true),
            (Mail, 452, "4.2.2 quota exceeded", true),
            (Mail, 452, "4.2.2 try later", true),
            (Mail, 451, "4.7.1 Account over limit", true),
            (Mail, 550, "5.4.5 Daily user sending quota exceeded", true),
            (Dot, 550, "5.4.5 Daily user sending quota exceeded", true),
            // X.7 with account words at RCPT or later, not naming the recipient.
            (Rcpt, 550, "5.7.1 account suspended for abuse", true),
            (
                Rcpt,
                452,
                "4.7.0 daily quota exceeded for this account",
                true,
            ),
            (Dot, 554, "5.7.0 account disabled: billing", true),
            (Data, 451, "4.7.1 over limit", true),
            // Per-recipient or per-message: never account-level.
            (Rcpt, 550, "5.1.1 user unknown", false),
            (
                Rcpt,
                550,
                "5.1.1 The email account that you tried to reach does not exist",
                false,
            ),
            (Rcpt, 552, "5.2.2 mailbox full", false),
            (
                Rcpt,
                452,
                "4.2.2 The email account that you tried to reach is over quota",
                false,
            ),
            (
                Rcpt,
                550,
                "5.2.1 The email account that you tried to reach is disabled",
                false,
            ),
            (Rcpt, 550, "5.7.1 recipient account disabled", false),
            (Rcpt, 550, "5.7.1 relay access denied", false),
            (Dot, 552, "5.2.2 mailbox full", false),
            (Dot, 554, "5.7.1 message rejected as spam", false),
            (Dot, 550, "5.6.0 E01005 key reused", false),
            (Mail, 550, "5.1.8 sender domain does not exist", false),
            (Mail, 550, "5.7.1 sender rejected", false),
            // A rate limit mentioning the account is a slow-down, not a person's job.
            (
                Connect,
                421,
                "4.7.0 too many connections from your account",
                false,
            ),
            (Connect, 421, "4.3.2 service not available", false),
        ];
        for &(phase, code, text, want) in cases {
            let o = at(phase, code, text);
            assert_eq!(is_account_problem(&o), want, "{phase} {code} {text}");
        }
    }

    #[test]
    fn account_problem_needs_a_reply() {
        for phase in Phase::ALL {
            assert!(!is_account_problem(&classify(phase, Failure::Timeout)));
            assert!(!is_account_problem(&classify(
                phase,
                Failure::Other("account suspended".into())
            )));
        }
        assert!(!is_account_problem(&after_dot(250, "2.0.0 account ok")));
        assert!(!is_account_problem(&after_dot(
            251,
            "5.7.1 account suspended"
        )));
    }

    #[test]
    fn slow_down_table() {
        let cases: &[(Phase, u16, &str, bool)] = &[
            (
                Connect,
                421,
                "4.7.0 Try again later, closing connection",
                true,
            ),
            (Mail, 450, "4.7.1 Rate limit exceeded", true),
            (Mail, 451, "4.7.1 Please slow down", true),
            (Rcpt, 452, "Too many messages, throttled", true),
            (Rcpt, 451, "4.3.0 Throttling in effect", true),
            (Dot, 421, "4.7.28 rate limited", true),
            (Dot, 451, "4.4.5 ratelimited, try later", true),
            (
                Connect,
                421,
                "4.7.0 too many connections from your account",
                true,
            ),
            (Connect, 421, "too many", true),
            (Mail, 451, "4.3.0 rate of sending too high", true),
            // Not about pace.
            (Rcpt, 452, "4.5.3 Too many recipients", false),
            (Rcpt, 450, "4.2.0 mailbox busy", false),
            (Dot, 451, "4.3.0 Error: queue file write error", false),
            (Mail, 451, "4.3.0 could not generate id", false),
            (Mail, 451, "4.3.0 separate error", false),
            (Connect, 421, "4.3.2 service not available", false),
            // Wrong code family even with the words.
            (Mail, 454, "4.7.0 rate limited", false),
            (Rcpt, 550, "5.7.1 too many messages", false),
            (Dot, 554, "rate limit exceeded", false),
        ];
        for &(phase, code, text, want) in cases {
            let o = at(phase, code, text);
            assert_eq!(is_slow_down(&o), want, "{phase} {code} {text}");
        }
        for phase in Phase::ALL {
            assert!(!is_slow_down(&classify(phase, Failure::Timeout)));
        }
        assert!(!is_slow_down(&after_dot(250, "rate ok")));
    }
}
