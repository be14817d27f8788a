//! The attempt ledger's words: where an attempt stopped (`Phase`) and what it came to
//! (`OutcomeKind`). Delivery decides them; the store records them, as the text `as_str` gives.

use std::fmt;

/// The step of the SMTP conversation an attempt had reached.
///
/// `Dot` starts with the first body byte and ends with the reply to the final `CRLF.CRLF`: the
/// client writes the body and reads that reply in one call, so a failure while writing the body
/// cannot be told from one after the dot, and either is UNKNOWN (the upstream may have accepted
/// the message), never a failure. There is therefore no separate body phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Connect,
    Greeting,
    Ehlo,
    StartTls,
    Auth,
    Mail,
    Rcpt,
    Data,
    Dot,
}

impl Phase {
    /// Phases where the upstream judges the session or the account rather than this message
    /// (no recipient has been named yet).
    pub fn is_session_level(self) -> bool {
        matches!(
            self,
            Phase::Connect | Phase::Greeting | Phase::Ehlo | Phase::StartTls | Phase::Auth
        )
    }

    pub const ALL: [Phase; 9] = [
        Phase::Connect,
        Phase::Greeting,
        Phase::Ehlo,
        Phase::StartTls,
        Phase::Auth,
        Phase::Mail,
        Phase::Rcpt,
        Phase::Data,
        Phase::Dot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::Greeting => "greeting",
            Phase::Ehlo => "ehlo",
            Phase::StartTls => "starttls",
            Phase::Auth => "auth",
            Phase::Mail => "mail",
            Phase::Rcpt => "rcpt",
            Phase::Data => "data",
            Phase::Dot => "dot",
        }
    }

    #[cfg(test)]
    pub(crate) fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an attempt came to, as the ledger records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    Accepted,
    Transient,
    Permanent,
    Unknown,
}

impl OutcomeKind {
    pub const ALL: [OutcomeKind; 4] = [
        OutcomeKind::Accepted,
        OutcomeKind::Transient,
        OutcomeKind::Permanent,
        OutcomeKind::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Accepted => "accepted",
            OutcomeKind::Transient => "transient",
            OutcomeKind::Permanent => "permanent",
            OutcomeKind::Unknown => "unknown",
        }
    }

    #[cfg(test)]
    pub(crate) fn parse(s: &str) -> Option<Self> {
        OutcomeKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::{OutcomeKind, Phase};

    #[test]
    fn phase_and_kind_names_round_trip() {
        for p in Phase::ALL {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        for k in OutcomeKind::ALL {
            assert_eq!(OutcomeKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(Phase::parse("DOT"), None);
        assert_eq!(Phase::parse(""), None);
        assert_eq!(OutcomeKind::parse("failed"), None);
        let names: Vec<_> = Phase::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            names,
            ["connect", "greeting", "ehlo", "starttls", "auth", "mail", "rcpt", "data", "dot"]
        );
    }
}
