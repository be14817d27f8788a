//! Every reply line the relay can send, in one place.
//!
//! Enhanced status codes (RFC 2034) are carried on every 2xx/4xx/5xx reply except the greeting
//! and the HELO/EHLO answers, which RFC 2034 exempts.

use std::fmt;
use std::io::Write as _;

/// One SMTP reply: a code and one or more text lines (the text already carries the enhanced
/// status code where one applies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    pub lines: Vec<String>,
}

/// The limits EHLO advertises (SIZE, and LIMITS' MAILMAX and RCPTMAX).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EhloLimits {
    pub max_size: usize,
    pub max_transactions: usize,
    pub max_recipients: usize,
}

/// Suffix appended to a stored reply when a retry is answered from the record.
pub const REPLAY_SUFFIX: &str = " (idempotent replay)";

impl Reply {
    pub fn new(code: u16, text: impl Into<String>) -> Self {
        Reply {
            code,
            lines: vec![text.into()],
        }
    }

    pub fn multi(code: u16, lines: Vec<String>) -> Self {
        Reply { code, lines }
    }

    /// Parses a single stored reply line such as `250 2.0.0 OK queued as X`.
    pub fn from_line(line: &str) -> Option<Self> {
        let (code, text) = line.split_once(' ')?;
        let code: u16 = code.parse().ok()?;
        if !(200..600).contains(&code) {
            return None;
        }
        Some(Reply::new(code, text))
    }

    /// The reply as one line without CRLF (only meaningful for single-line replies, which is
    /// what the store keeps).
    pub fn line(&self) -> String {
        format!("{} {}", self.code, self.lines.join(" "))
    }

    pub fn is_positive(&self) -> bool {
        (200..400).contains(&self.code)
    }

    /// The stored original reply, answered again to a retry.
    pub fn replayed(&self) -> Self {
        let mut lines = self.lines.clone();
        if let Some(last) = lines.last_mut() {
            last.push_str(REPLAY_SUFFIX);
        }
        Reply::multi(self.code, lines)
    }

    pub fn write_to(&self, out: &mut Vec<u8>) {
        let last = self.lines.len().saturating_sub(1);
        for (i, line) in self.lines.iter().enumerate() {
            let sep = if i == last { ' ' } else { '-' };
            // Straight into `out`: a formatted String per line was an allocation per reply.
            write!(out, "{}{}", self.code, sep).expect("writing to a Vec cannot fail");
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out);
        out
    }

    // --- connection level -------------------------------------------------------------

    /// The greeting, when a session starts (after `greet_delay` / `submission_greet_delay`).
    pub fn greeting(hostname: &str) -> Self {
        Reply::new(220, format!("{hostname} ESMTP idemrelay ready"))
    }

    /// The answer to EHLO: the relay's name, then its extensions (SIZE is `max_message_size`;
    /// LIMITS is RFC 9422's, MAILMAX `max_transactions` and RCPTMAX
    /// `max_recipients`; STARTTLS, REQUIRETLS and AUTH are added where the session offers
    /// them).
    pub fn ehlo(hostname: &str, client: &str, limits: &EhloLimits) -> Self {
        let EhloLimits {
            max_size,
            max_transactions,
            max_recipients,
        } = *limits;
        Reply::multi(
            250,
            vec![
                format!("{hostname} greets {client}"),
                "PIPELINING".into(),
                format!("SIZE {max_size}"),
                "8BITMIME".into(),
                "SMTPUTF8".into(),
                "ENHANCEDSTATUSCODES".into(),
                "CHUNKING".into(),
                "DSN".into(),
                format!("LIMITS MAILMAX={max_transactions} RCPTMAX={max_recipients}"),
                "HELP".into(),
            ],
        )
    }

    /// The answer to HELO.
    pub fn helo(hostname: &str, client: &str) -> Self {
        Reply::new(250, format!("{hostname} greets {client}"))
    }

    /// The answer to QUIT; the connection is closed.
    pub fn bye() -> Self {
        Reply::new(221, "2.0.0 Bye")
    }

    /// The relay is stopping (SIGTERM): idle sessions at once, a session inside a message after
    /// `shutdown_grace`, and new connections; the connection is closed.
    pub fn shutting_down() -> Self {
        Reply::new(421, "4.3.0 idemrelay is shutting down; try again later")
    }

    /// No command or DATA read within `read_timeout`; the connection is closed.
    pub fn timeout() -> Self {
        Reply::new(421, "4.4.2 Timeout waiting for input; closing connection")
    }

    /// A session reached `max_errors` client errors; the connection is closed.
    pub fn too_many_errors() -> Self {
        Reply::new(421, "4.7.0 Too many errors; closing connection")
    }

    /// A new connection while the store is not writable (see `store_probe_interval`); the
    /// connection is closed.
    pub fn store_unavailable_at_connect() -> Self {
        Reply::new(
            421,
            "4.3.2 idempotency store unavailable; try again later (E01033 IdempotencyUnavailable)",
        )
    }

    /// A bare CR or LF in a command or in the message (the shape of SMTP smuggling); the connection
    /// is closed.
    pub fn bare_line_ending() -> Self {
        Reply::new(
            521,
            "5.5.2 Bare CR or LF not allowed; lines must end with CRLF; closing connection",
        )
    }

    // --- commands -----------------------------------------------------------------------

    /// The answer to NOOP.
    pub fn ok() -> Self {
        Reply::new(250, "2.0.0 OK")
    }

    /// The answer to RSET.
    pub fn reset_ok() -> Self {
        Reply::new(250, "2.0.0 Reset OK")
    }

    /// MAIL FROM accepted.
    pub fn sender_ok() -> Self {
        Reply::new(250, "2.1.0 Sender OK")
    }

    /// RCPT TO accepted (also for a mailbox already named in the transaction, which is not added
    /// twice).
    pub fn recipient_ok() -> Self {
        Reply::new(250, "2.1.5 Recipient OK")
    }

    /// The answer to DATA: the client sends the message.
    pub fn start_data() -> Self {
        Reply::new(354, "Start mail input; end with <CRLF>.<CRLF>")
    }

    /// A BDAT chunk that is not the last was received (the number is the chunk's size).
    pub fn chunk_ok(size: usize) -> Self {
        Reply::new(250, format!("2.0.0 {size} octets received"))
    }

    /// The answer to VRFY: the relay does not say whether an address exists.
    pub fn cannot_vrfy() -> Self {
        Reply::new(
            252,
            "2.5.0 Cannot VRFY user; send the message and delivery will be attempted",
        )
    }

    /// The answer to HELP.
    pub fn help() -> Self {
        Reply::new(
            214,
            "2.0.0 Commands: EHLO HELO MAIL RCPT DATA BDAT RSET NOOP QUIT VRFY HELP",
        )
    }

    /// A command line (or an AUTH response) longer than the relay reads.
    pub fn line_too_long() -> Self {
        Reply::new(500, "5.5.2 Line too long")
    }

    /// A command the relay does not know.
    pub fn unknown_command() -> Self {
        Reply::new(500, "5.5.1 Command unrecognized")
    }

    /// A known command the relay does not do (e.g. ETRN), STARTTLS on a listener without it, or
    /// AUTH where no users are configured.
    pub fn not_implemented(command: &str) -> Self {
        Reply::new(502, format!("5.5.1 {command} not implemented"))
    }

    /// A command with a syntax error; the text shows the command's usage (e.g. `EHLO domain`, `BDAT
    /// chunk-size [LAST]`) or names the invalid parameter.
    pub fn syntax(usage: &str) -> Self {
        Reply::new(501, format!("5.5.4 Syntax: {usage}"))
    }

    /// Control characters in a command's arguments or in an address.
    pub fn bad_characters() -> Self {
        Reply::new(501, "5.5.2 Control characters are not allowed here")
    }

    /// MAIL FROM with an address that is not a valid reverse-path.
    pub fn bad_sender_address() -> Self {
        Reply::new(501, "5.1.7 Bad sender address syntax")
    }

    /// RCPT TO with an address that is not a valid forward-path.
    pub fn bad_recipient_address() -> Self {
        Reply::new(553, "5.1.3 Bad recipient address syntax")
    }

    /// HELO/EHLO with a name that is neither a domain name nor an address literal.
    pub fn bad_helo_name() -> Self {
        Reply::new(
            501,
            "5.5.2 HELO/EHLO needs a domain name or address literal",
        )
    }

    /// A MAIL FROM parameter given twice.
    pub fn duplicate_parameter(param: &str) -> Self {
        Reply::new(501, format!("5.5.4 Duplicate parameter {param}"))
    }

    /// A non-ASCII address in a transaction without the SMTPUTF8 parameter.
    pub fn non_ascii_address() -> Self {
        Reply::new(
            553,
            "5.6.7 Non-ASCII address requires the SMTPUTF8 parameter",
        )
    }

    /// At the end of DATA: a header section over 256 KiB or 1,000 fields (checked before parsing);
    /// nothing is stored.
    pub fn header_section_too_large() -> Self {
        Reply::new(550, "5.6.0 Header section too large; message not accepted")
    }

    /// A MAIL FROM or RCPT TO parameter the relay does not support.
    pub fn unsupported_parameter(param: &str) -> Self {
        Reply::new(555, format!("5.5.4 Parameter {param} not supported"))
    }

    /// MAIL before EHLO or HELO.
    pub fn need_helo() -> Self {
        Reply::new(503, "5.5.1 Send EHLO or HELO first")
    }

    /// RCPT, DATA or BDAT before MAIL FROM.
    pub fn need_mail() -> Self {
        Reply::new(503, "5.5.1 Need MAIL command first")
    }

    /// A second MAIL FROM inside a transaction.
    pub fn nested_mail() -> Self {
        Reply::new(503, "5.5.1 Sender already specified")
    }

    /// DATA or BDAT in a transaction without an accepted recipient.
    pub fn no_valid_recipients() -> Self {
        Reply::new(554, "5.5.1 No valid recipients")
    }

    /// DATA after BDAT (or the reverse) in one transaction.
    pub fn mixed_data_bdat() -> Self {
        Reply::new(
            503,
            "5.5.1 DATA and BDAT cannot be mixed in one transaction",
        )
    }

    /// The answer to STARTTLS: the TLS handshake follows.
    pub fn ready_for_tls() -> Self {
        Reply::new(220, "2.0.0 Ready to start TLS")
    }

    /// STARTTLS on a connection that already uses TLS.
    pub fn tls_already_active() -> Self {
        Reply::new(503, "5.5.1 TLS already active")
    }

    /// MAIL FROM with REQUIRETLS on a session that is not under TLS (RFC 8689: the relay offers
    /// REQUIRETLS only after STARTTLS or on implicit TLS).
    pub fn requiretls_needs_tls() -> Self {
        Reply::new(
            530,
            "5.7.10 REQUIRETLS needs a TLS session; send STARTTLS first",
        )
    }

    /// The MAIL FROM after `max_transactions` transactions in one session (RFC 9422
    /// MAILMAX, advertised in EHLO); the connection is closed, the client sends the rest in a new
    /// one.
    pub fn too_many_transactions() -> Self {
        Reply::new(
            421,
            "4.7.0 Too many mail transactions in this session; closing connection",
        )
    }

    /// MAIL before STARTTLS on a STARTTLS submission listener (`submission_listen`).
    pub fn starttls_first() -> Self {
        Reply::new(530, "5.7.0 Must issue a STARTTLS command first")
    }

    /// AUTH before STARTTLS on a STARTTLS submission listener.
    pub fn encryption_required_for_auth() -> Self {
        Reply::new(
            538,
            "5.7.11 Encryption required for requested authentication mechanism",
        )
    }

    /// AUTH succeeded.
    pub fn auth_ok() -> Self {
        Reply::new(235, "2.7.0 Authentication successful")
    }

    /// AUTH with a wrong user name or password, after `auth_failure_delay`.
    pub fn auth_failed() -> Self {
        Reply::new(535, "5.7.8 Authentication credentials invalid")
    }

    /// A connection reached `max_auth_failures` failed AUTHs, or AUTH from a client locked out
    /// (`max_auth_failures_per_user`, `max_auth_failures_per_ip`); the connection is closed.
    pub fn too_many_auth_failures() -> Self {
        Reply::new(
            421,
            "4.7.0 Too many authentication failures; closing connection",
        )
    }

    /// A second AUTH after one succeeded.
    pub fn already_authenticated() -> Self {
        Reply::new(503, "5.5.1 Already authenticated")
    }

    /// AUTH between MAIL FROM and the end of the message.
    pub fn auth_during_transaction() -> Self {
        Reply::new(503, "5.5.1 AUTH not allowed during a mail transaction")
    }

    /// AUTH with a mechanism other than PLAIN or LOGIN.
    pub fn unsupported_mechanism() -> Self {
        Reply::new(
            504,
            "5.5.4 Unrecognized authentication mechanism (PLAIN, LOGIN)",
        )
    }

    /// An AUTH response that is not valid base64 or not a valid PLAIN/LOGIN response.
    pub fn bad_sasl_response() -> Self {
        Reply::new(501, "5.5.2 Cannot decode the authentication response")
    }

    /// The client cancelled AUTH (`*`).
    pub fn auth_cancelled() -> Self {
        Reply::new(501, "5.7.0 Authentication cancelled")
    }

    /// MAIL FROM with a sender the AUTH user's entry in `users_file` does not allow.
    pub fn sender_not_allowed() -> Self {
        Reply::new(550, "5.7.1 Sender address not allowed for this user")
    }

    /// A client that sent data before the greeting (see `greet_delay`); the connection is closed.
    pub fn early_talker() -> Self {
        Reply::new(554, "5.5.0 Protocol error: data sent before the greeting")
    }

    /// A new connection beyond `max_connections` or `max_connections_per_ip`; the connection is
    /// closed.
    pub fn too_many_connections() -> Self {
        Reply::new(421, "4.7.0 Too many connections; try again later")
    }

    /// A session longer than `session_timeout`; the connection is closed.
    pub fn session_too_long() -> Self {
        Reply::new(421, "4.4.2 Session time limit exceeded; closing connection")
    }

    /// A message arriving slower than `min_data_rate` after `data_rate_grace`; the connection is
    /// closed.
    pub fn too_slow() -> Self {
        Reply::new(421, "4.4.2 Data arriving too slowly; closing connection")
    }

    /// MAIL from a client that is neither authenticated nor in `allow_networks`
    /// (`submission_allow_networks` on the TLS listeners).
    pub fn auth_required() -> Self {
        Reply::new(530, "5.7.0 Authentication required")
    }

    /// RCPT TO beyond `max_recipients` in one transaction (not counted as a client error; the
    /// client sends the rest in another transaction).
    pub fn too_many_recipients() -> Self {
        Reply::new(452, "4.5.3 Too many recipients")
    }

    /// A SIZE parameter at MAIL, or a message, larger than `max_message_size` (the body is read to
    /// its end first).
    pub fn message_too_big() -> Self {
        Reply::new(552, "5.3.4 Message size exceeds fixed maximum message size")
    }

    // --- end of DATA ----------------------------------------------------------------------

    /// At the end of DATA: a message line over 998 octets; nothing is stored.
    pub fn data_line_too_long() -> Self {
        Reply::new(
            550,
            "5.6.0 Message line longer than 998 octets; message not accepted",
        )
    }

    /// At the end of DATA: a NUL octet in the message; nothing is stored.
    pub fn nul_in_data() -> Self {
        Reply::new(554, "5.6.0 NUL character in message; message not accepted")
    }

    /// At the end of DATA: a message without a header section; nothing is stored.
    pub fn no_header_section() -> Self {
        Reply::new(
            550,
            "5.6.0 Message has no header section; message not accepted",
        )
    }

    /// A header section whose key readers would disagree about (docs/concepts/contract.md "What the relay answers at the end of DATA"): any key the relay recorded might not be the one the upstream dedupes on.
    pub fn key_in_malformed_header_section() -> Self {
        Reply::new(
            554,
            "5.6.0 X-Bird-Idempotency-Key is in a malformed header section (a line that is not a \
             header field, an indented or folded key line, or a bare CR or LF) where readers \
             disagree about it; fix the header section; message not accepted",
        )
    }

    /// At the end of DATA: a message without a From: header field; stored under its key as a
    /// rejection, so a retry gets the same reply.
    pub fn no_from_header() -> Self {
        Reply::new(
            550,
            "5.6.0 Message has no From: header field (RFC 5322 3.6); message not accepted",
        )
    }

    /// At the end of DATA: the message was recorded under its key (the id is its queue id). A retry
    /// of the same request is answered with the same line and ` (idempotent replay)`.
    pub fn queued(id: &str) -> Self {
        Reply::new(250, format!("2.0.0 OK queued as {id}"))
    }

    /// At the end of DATA: the key was used before for a different request (E01005); with a note
    /// when the key was derived from a reused Message-ID. Nothing is stored.
    pub fn key_reuse(derived_from_message_id: bool) -> Self {
        let mut text = String::from(
            "5.6.0 X-Bird-Idempotency-Key already used for a different message (E01005 IdempotencyKeyReuse); use a new key",
        );
        if derived_from_message_id {
            text.push_str(" (key derived from the Message-ID, which was reused)");
        }
        Reply::new(554, text)
    }

    /// At the end of DATA: another session is committing a message with the same key and did not
    /// finish within `in_progress_wait` (E01004).
    pub fn key_in_progress() -> Self {
        Reply::new(
            451,
            "4.3.0 a message with this X-Bird-Idempotency-Key is still being processed (E01004 RequestInProgress); retry later",
        )
    }

    /// At the end of DATA: the X-Bird-Idempotency-Key header is invalid (empty, too long, control
    /// or invisible characters, an encoded word that does not decode, or two key headers that
    /// differ) (E01001).
    pub fn key_invalid() -> Self {
        Reply::new(
            554,
            "5.6.0 X-Bird-Idempotency-Key must be 1-255 printable characters (E01001); message not accepted",
        )
    }

    /// At the end of DATA: a message without a key header while `missing_key = "reject"`.
    pub fn key_required() -> Self {
        Reply::new(
            554,
            "5.6.0 X-Bird-Idempotency-Key header required on this relay; message not accepted",
        )
    }

    /// At the end of DATA: the store could not be written within `store_busy_timeout` (E01033);
    /// nothing was recorded.
    pub fn store_unavailable() -> Self {
        Reply::new(
            451,
            "4.3.0 idempotency store unavailable; message not accepted, retry later (E01033 IdempotencyUnavailable)",
        )
    }

    /// At the end of DATA in the before-queue mode: the upstream accepted the message while the
    /// client waited (`upstream` is its reply, made one printable line). The record is
    /// delivered and keeps this line: a retry of the same request replays it.
    pub fn delivered_before_queue(id: &str, upstream: &str) -> Self {
        Reply::new(
            250,
            format!("2.0.0 OK delivered as {id}; upstream: {upstream}"),
        )
    }

    /// At the end of DATA in the before-queue mode: the upstream refused the message for good
    /// (a 5xx at MAIL, RCPT, DATA or the final dot) while the client waited. Its code and
    /// enhanced code (`5.0.0` when it gave none), then its reply as one printable line. The
    /// record is failed without a bounce and keeps this line: a retry replays it.
    pub fn refused_before_queue(code: u16, enh: &str, id: &str, up: &str) -> Self {
        Reply::new(
            code,
            format!("{enh} upstream refused {id} (not delivered, no bounce will follow): {up}"),
        )
    }

    /// At the end of DATA in the before-queue mode: the message asked for REQUIRETLS and the
    /// upstream cannot honour it (no verified TLS, or no REQUIRETLS offered), so the relay did not
    /// send it (RFC 8689). The record is failed without a bounce and keeps this line.
    pub fn requiretls_refused_before_queue(id: &str) -> Self {
        Reply::new(
            550,
            format!("5.7.30 {id} not sent: REQUIRETLS was asked and the upstream does not offer it over verified TLS (no bounce will follow)"),
        )
    }

    /// At the end of DATA in the before-queue mode: the upstream answered but the store did not
    /// confirm recording it in time, or could not be read back. The message is recorded; a retry of
    /// the same request replays what was recorded and sends nothing again.
    pub fn verdict_not_recorded(id: &str) -> Self {
        Reply::new(
            451,
            format!("4.3.0 {id} is recorded but the upstream's answer is not yet; retry the same message to learn it"),
        )
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_line_uses_dash_continuations() {
        let r = Reply::multi(250, vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(r.to_bytes(), b"250-a\r\n250-b\r\n250 c\r\n");
    }

    #[test]
    fn stored_line_round_trips_and_replays_with_suffix() {
        let r = Reply::queued("ABC");
        let back = Reply::from_line(&r.line()).unwrap();
        assert_eq!(back, r);
        assert_eq!(
            back.replayed().line(),
            "250 2.0.0 OK queued as ABC (idempotent replay)"
        );
        assert!(Reply::from_line("nonsense").is_none());
        assert!(Reply::from_line("999 x").is_none());
    }

    #[test]
    fn design_table_lines_are_word_for_word() {
        assert_eq!(
            Reply::key_reuse(false).line(),
            "554 5.6.0 X-Bird-Idempotency-Key already used for a different message (E01005 IdempotencyKeyReuse); use a new key"
        );
        assert_eq!(
            Reply::key_in_progress().line(),
            "451 4.3.0 a message with this X-Bird-Idempotency-Key is still being processed (E01004 RequestInProgress); retry later"
        );
        assert_eq!(
            Reply::key_invalid().line(),
            "554 5.6.0 X-Bird-Idempotency-Key must be 1-255 printable characters (E01001); message not accepted"
        );
        assert_eq!(
            Reply::store_unavailable().line(),
            "451 4.3.0 idempotency store unavailable; message not accepted, retry later (E01033 IdempotencyUnavailable)"
        );
    }
}
