//! Why the relay turned a client or a command away: one class per reply, for the refusal
//! counters and the log line every refused or cut session gets.

use idemrelay_model::reply::Reply;

/// Why the relay turned a client or one of its commands away, for the refusal counters and
/// the log line every refused or cut session gets. Syntax errors are not refusals: a client
/// that cannot speak SMTP shows up as `too many errors` (limits) once it persists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// The store cannot be written (421 4.3.2 at connect, 451 4.3.0 at the dot).
    Store,
    /// The connection caps (421 4.7.0 too many connections).
    Caps,
    /// Who may do what: relay not allowed, AUTH or STARTTLS required, sender not allowed, an
    /// early talker, a PROXY header from the wrong place.
    Policy,
    /// Bare CR or LF (521 5.5.2): the shape of an SMTP smuggling attempt.
    Smuggling,
    /// Size, line length, recipients, deadlines, data rate, too many errors.
    Limits,
    /// Failed AUTH (535 5.7.8), and the 421 4.7.0 that ends a run of them.
    Auth,
    /// The relay is stopping (421 4.3.0).
    Shutdown,
}

impl RefusalReason {
    /// Refusals that happen before a session starts (the connection counter's label values).
    pub const AT_CONNECT: [RefusalReason; 4] = [
        RefusalReason::Store,
        RefusalReason::Caps,
        RefusalReason::Policy,
        RefusalReason::Shutdown,
    ];
    /// Refusals of commands inside a session, or of the session itself.
    pub const IN_SESSION: [RefusalReason; 6] = [
        RefusalReason::Store,
        RefusalReason::Policy,
        RefusalReason::Smuggling,
        RefusalReason::Limits,
        RefusalReason::Auth,
        RefusalReason::Shutdown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Store => "store",
            RefusalReason::Caps => "caps",
            RefusalReason::Policy => "policy",
            RefusalReason::Smuggling => "smuggling",
            RefusalReason::Limits => "limits",
            RefusalReason::Auth => "auth",
            RefusalReason::Shutdown => "shutdown",
        }
    }

    /// The refusal a reply stands for, or None for an ordinary answer (or a syntax error).
    /// Compared with the reply constructors themselves, so a reworded reply cannot fall out
    /// of its class.
    pub fn of(reply: &Reply) -> Option<RefusalReason> {
        let classes: [(fn() -> Reply, RefusalReason); 22] = [
            (Reply::store_unavailable_at_connect, RefusalReason::Store),
            (Reply::store_unavailable, RefusalReason::Store),
            (Reply::too_many_connections, RefusalReason::Caps),
            (Reply::early_talker, RefusalReason::Policy),
            (Reply::auth_required, RefusalReason::Policy),
            (Reply::starttls_first, RefusalReason::Policy),
            (Reply::encryption_required_for_auth, RefusalReason::Policy),
            (Reply::sender_not_allowed, RefusalReason::Policy),
            (Reply::requiretls_needs_tls, RefusalReason::Policy),
            (Reply::bare_line_ending, RefusalReason::Smuggling),
            (Reply::line_too_long, RefusalReason::Limits),
            (Reply::data_line_too_long, RefusalReason::Limits),
            (Reply::message_too_big, RefusalReason::Limits),
            (Reply::too_many_recipients, RefusalReason::Limits),
            (Reply::too_many_transactions, RefusalReason::Limits),
            (Reply::too_many_errors, RefusalReason::Limits),
            (Reply::timeout, RefusalReason::Limits),
            (Reply::session_too_long, RefusalReason::Limits),
            (Reply::too_slow, RefusalReason::Limits),
            (Reply::auth_failed, RefusalReason::Auth),
            (Reply::too_many_auth_failures, RefusalReason::Auth),
            (Reply::shutting_down, RefusalReason::Shutdown),
        ];
        classes
            .iter()
            .find(|(make, _)| make() == *reply)
            .map(|(_, why)| *why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_classified_by_the_reply_itself() {
        use RefusalReason as R;
        let table: &[(Reply, Option<RefusalReason>)] = &[
            (Reply::bare_line_ending(), Some(R::Smuggling)),
            (Reply::store_unavailable_at_connect(), Some(R::Store)),
            (Reply::store_unavailable(), Some(R::Store)),
            (Reply::too_many_connections(), Some(R::Caps)),
            (Reply::auth_required(), Some(R::Policy)),
            (Reply::early_talker(), Some(R::Policy)),
            (Reply::message_too_big(), Some(R::Limits)),
            (Reply::too_many_recipients(), Some(R::Limits)),
            (Reply::too_many_transactions(), Some(R::Limits)),
            (Reply::requiretls_needs_tls(), Some(R::Policy)),
            (Reply::timeout(), Some(R::Limits)),
            (Reply::too_many_errors(), Some(R::Limits)),
            (Reply::auth_failed(), Some(R::Auth)),
            (Reply::too_many_auth_failures(), Some(R::Auth)),
            (Reply::shutting_down(), Some(R::Shutdown)),
            // Answers and syntax errors are not refusals.
            (Reply::queued("X"), None),
            (Reply::unknown_command(), None),
            (Reply::bye(), None),
            (Reply::key_invalid(), None),
        ];
        for (reply, want) in table {
            assert_eq!(RefusalReason::of(reply), *want, "{reply:?}");
        }
        for reason in RefusalReason::AT_CONNECT
            .iter()
            .chain(&RefusalReason::IN_SESSION)
        {
            assert!(!reason.as_str().is_empty());
        }
    }
}
