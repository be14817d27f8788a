//! How an upstream attempt ended, coarsely, as the replies counter labels it.

use super::outcome::{Heard, Outcome, Phase, Silence};

/// How an upstream attempt ended, coarsely, for the replies counter an operator alerts on: a
/// run of `connect` or `auth` says something different from a run of `4xx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyClass {
    /// 2xx: the message was taken (only 250 after the dot is; another 2xx there is `unknown`).
    Positive,
    /// A 4xx reply in a message phase (MAIL onward), or at connect/greeting/EHLO.
    Transient,
    /// A 5xx reply in a message phase (MAIL onward), or at connect/greeting/EHLO.
    Permanent,
    /// No reply: refused, reset or closed before the final dot.
    Connect,
    /// A phase deadline passed before the final dot.
    Timeout,
    /// STARTTLS refused or the TLS handshake failed.
    Tls,
    /// The upstream refused our credentials (any reply at AUTH).
    Auth,
    /// The final dot was sent and no usable answer came.
    Unknown,
}

impl ReplyClass {
    pub(crate) const ALL: [ReplyClass; 8] = [
        ReplyClass::Positive,
        ReplyClass::Transient,
        ReplyClass::Permanent,
        ReplyClass::Connect,
        ReplyClass::Timeout,
        ReplyClass::Tls,
        ReplyClass::Auth,
        ReplyClass::Unknown,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReplyClass::Positive => "2xx",
            ReplyClass::Transient => "4xx",
            ReplyClass::Permanent => "5xx",
            ReplyClass::Connect => "connect",
            ReplyClass::Timeout => "timeout",
            ReplyClass::Tls => "tls",
            ReplyClass::Auth => "auth",
            ReplyClass::Unknown => "unknown",
        }
    }

    pub(crate) fn of(outcome: &Outcome) -> ReplyClass {
        match outcome {
            Outcome::Accepted { .. } => ReplyClass::Positive,
            Outcome::Unknown { .. } => ReplyClass::Unknown,
            Outcome::Permanent { phase, code, .. } => by_phase(*phase, Heard::Reply(*code)),
            Outcome::Transient { phase, heard, .. } => by_phase(*phase, *heard),
        }
    }
}

/// A failure before the dot, by where it happened and whether a reply came.
fn by_phase(phase: Phase, heard: Heard) -> ReplyClass {
    match (phase, heard) {
        (Phase::Auth, _) => ReplyClass::Auth,
        (Phase::StartTls, _) => ReplyClass::Tls,
        (_, Heard::Reply(500..=599)) => ReplyClass::Permanent,
        (_, Heard::Reply(_)) => ReplyClass::Transient,
        // The TLS handshake of smtps:// fails in the connect phase: the silence, not the
        // phase, tells it apart.
        (_, Heard::Nothing(Silence::Tls)) => ReplyClass::Tls,
        (_, Heard::Nothing(Silence::Timeout)) => ReplyClass::Timeout,
        (_, Heard::Nothing(Silence::ConnectionLost | Silence::Other)) => ReplyClass::Connect,
    }
}
