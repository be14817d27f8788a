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

/// Suffix appended to a stored reply when a retry is answered from the record.
pub const REPLAY_SUFFIX: &str = " (idempotent replay)";

impl Reply {
    pub(crate) fn new(code: u16, text: impl Into<String>) -> Self {
        Reply {
            code,
            lines: vec![text.into()],
        }
    }

    pub(crate) fn multi(code: u16, lines: Vec<String>) -> Self {
        Reply { code, lines }
    }

    /// Parses a single stored reply line such as `250 2.0.0 OK queued as X`.
    pub(crate) fn from_line(line: &str) -> Option<Self> {
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

    pub(crate) fn is_positive(&self) -> bool {
        (200..400).contains(&self.code)
    }

    /// The stored original reply, answered again to a retry.
    pub(crate) fn replayed(&self) -> Self {
        let mut lines = self.lines.clone();
        if let Some(last) = lines.last_mut() {
            last.push_str(REPLAY_SUFFIX);
        }
        Reply::multi(self.code, lines)
    }

    pub(crate) fn write_to(&self, out: &mut Vec<u8>) {
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

    pub(crate) fn greeting(hostname: &str) -> Self {
        Reply::new(220, format!("{hostname} ESMTP idemrelay ready"))
    }

    pub(crate) fn ehlo(hostname: &str, client: &str, max_size: usize) -> Self {
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
                "HELP".into(),
            ],
        )
    }

    pub(crate) fn helo(hostname: &str, client: &str) -> Self {
        Reply::new(250, format!("{hostname} greets {client}"))
    }

    pub fn bye() -> Self {
        Reply::new(221, "2.0.0 Bye")
    }

    pub(crate) fn shutting_down() -> Self {
        Reply::new(421, "4.3.0 idemrelay is shutting down; try again later")
    }

    pub fn timeout() -> Self {
        Reply::new(421, "4.4.2 Timeout waiting for input; closing connection")
    }

    pub fn too_many_errors() -> Self {
        Reply::new(421, "4.7.0 Too many errors; closing connection")
    }

    pub(crate) fn store_unavailable_at_connect() -> Self {
        Reply::new(
            421,
            "4.3.2 idempotency store unavailable; try again later (E01033 IdempotencyUnavailable)",
        )
    }

    pub fn bare_line_ending() -> Self {
        Reply::new(
            521,
            "5.5.2 Bare CR or LF not allowed; lines must end with CRLF; closing connection",
        )
    }

    // --- commands -----------------------------------------------------------------------

    pub fn ok() -> Self {
        Reply::new(250, "2.0.0 OK")
    }

    pub fn reset_ok() -> Self {
        Reply::new(250, "2.0.0 Reset OK")
    }

    pub fn sender_ok() -> Self {
        Reply::new(250, "2.1.0 Sender OK")
    }

    pub fn recipient_ok() -> Self {
        Reply::new(250, "2.1.5 Recipient OK")
    }

    pub(crate) fn start_data() -> Self {
        Reply::new(354, "Start mail input; end with <CRLF>.<CRLF>")
    }

    pub(crate) fn chunk_ok(size: usize) -> Self {
        Reply::new(250, format!("2.0.0 {size} octets received"))
    }

    pub(crate) fn cannot_vrfy() -> Self {
        Reply::new(
            252,
            "2.5.0 Cannot VRFY user; send the message and delivery will be attempted",
        )
    }

    pub(crate) fn help() -> Self {
        Reply::new(
            214,
            "2.0.0 Commands: EHLO HELO MAIL RCPT DATA BDAT RSET NOOP QUIT VRFY HELP",
        )
    }

    pub fn line_too_long() -> Self {
        Reply::new(500, "5.5.2 Line too long")
    }

    pub fn unknown_command() -> Self {
        Reply::new(500, "5.5.1 Command unrecognized")
    }

    pub(crate) fn not_implemented(command: &str) -> Self {
        Reply::new(502, format!("5.5.1 {command} not implemented"))
    }

    pub(crate) fn syntax(usage: &str) -> Self {
        Reply::new(501, format!("5.5.4 Syntax: {usage}"))
    }

    pub fn bad_characters() -> Self {
        Reply::new(501, "5.5.2 Control characters are not allowed here")
    }

    pub fn bad_sender_address() -> Self {
        Reply::new(501, "5.1.7 Bad sender address syntax")
    }

    pub fn bad_recipient_address() -> Self {
        Reply::new(553, "5.1.3 Bad recipient address syntax")
    }

    pub(crate) fn bad_helo_name() -> Self {
        Reply::new(
            501,
            "5.5.2 HELO/EHLO needs a domain name or address literal",
        )
    }

    pub(crate) fn duplicate_parameter(param: &str) -> Self {
        Reply::new(501, format!("5.5.4 Duplicate parameter {param}"))
    }

    pub fn non_ascii_address() -> Self {
        Reply::new(
            553,
            "5.6.7 Non-ASCII address requires the SMTPUTF8 parameter",
        )
    }

    pub(crate) fn header_section_too_large() -> Self {
        Reply::new(550, "5.6.0 Header section too large; message not accepted")
    }

    pub(crate) fn unsupported_parameter(param: &str) -> Self {
        Reply::new(555, format!("5.5.4 Parameter {param} not supported"))
    }

    pub fn need_helo() -> Self {
        Reply::new(503, "5.5.1 Send EHLO or HELO first")
    }

    pub fn need_mail() -> Self {
        Reply::new(503, "5.5.1 Need MAIL command first")
    }

    pub(crate) fn nested_mail() -> Self {
        Reply::new(503, "5.5.1 Sender already specified")
    }

    pub(crate) fn no_valid_recipients() -> Self {
        Reply::new(554, "5.5.1 No valid recipients")
    }

    pub(crate) fn mixed_data_bdat() -> Self {
        Reply::new(
            503,
            "5.5.1 DATA and BDAT cannot be mixed in one transaction",
        )
    }

    pub(crate) fn ready_for_tls() -> Self {
        Reply::new(220, "2.0.0 Ready to start TLS")
    }

    pub(crate) fn tls_already_active() -> Self {
        Reply::new(503, "5.5.1 TLS already active")
    }

    pub(crate) fn starttls_first() -> Self {
        Reply::new(530, "5.7.0 Must issue a STARTTLS command first")
    }

    pub(crate) fn encryption_required_for_auth() -> Self {
        Reply::new(
            538,
            "5.7.11 Encryption required for requested authentication mechanism",
        )
    }

    pub(crate) fn auth_ok() -> Self {
        Reply::new(235, "2.7.0 Authentication successful")
    }

    pub fn auth_failed() -> Self {
        Reply::new(535, "5.7.8 Authentication credentials invalid")
    }

    pub(crate) fn too_many_auth_failures() -> Self {
        Reply::new(
            421,
            "4.7.0 Too many authentication failures; closing connection",
        )
    }

    pub(crate) fn already_authenticated() -> Self {
        Reply::new(503, "5.5.1 Already authenticated")
    }

    pub(crate) fn auth_during_transaction() -> Self {
        Reply::new(503, "5.5.1 AUTH not allowed during a mail transaction")
    }

    pub(crate) fn unsupported_mechanism() -> Self {
        Reply::new(
            504,
            "5.5.4 Unrecognized authentication mechanism (PLAIN, LOGIN)",
        )
    }

    pub(crate) fn bad_sasl_response() -> Self {
        Reply::new(501, "5.5.2 Cannot decode the authentication response")
    }

    pub(crate) fn auth_cancelled() -> Self {
        Reply::new(501, "5.7.0 Authentication cancelled")
    }

    pub(crate) fn sender_not_allowed() -> Self {
        Reply::new(550, "5.7.1 Sender address not allowed for this user")
    }

    pub fn early_talker() -> Self {
        Reply::new(554, "5.5.0 Protocol error: data sent before the greeting")
    }

    pub fn too_many_connections() -> Self {
        Reply::new(421, "4.7.0 Too many connections; try again later")
    }

    pub fn session_too_long() -> Self {
        Reply::new(421, "4.4.2 Session time limit exceeded; closing connection")
    }

    pub fn too_slow() -> Self {
        Reply::new(421, "4.4.2 Data arriving too slowly; closing connection")
    }

    pub fn auth_required() -> Self {
        Reply::new(530, "5.7.0 Authentication required")
    }

    pub fn too_many_recipients() -> Self {
        Reply::new(452, "4.5.3 Too many recipients")
    }

    pub fn message_too_big() -> Self {
        Reply::new(552, "5.3.4 Message size exceeds fixed maximum message size")
    }

    // --- end of DATA ----------------------------------------------------------------------

    pub fn data_line_too_long() -> Self {
        Reply::new(
            550,
            "5.6.0 Message line longer than 998 octets; message not accepted",
        )
    }

    pub fn nul_in_data() -> Self {
        Reply::new(554, "5.6.0 NUL character in message; message not accepted")
    }

    pub fn no_header_section() -> Self {
        Reply::new(
            550,
            "5.6.0 Message has no header section; message not accepted",
        )
    }

    /// A header section whose key readers would disagree about (README "What the relay answers at the end of DATA"): any key the relay recorded might not be the one the upstream dedupes on.
    pub(crate) fn key_in_malformed_header_section() -> Self {
        Reply::new(
            554,
            "5.6.0 X-Bird-Idempotency-Key is in a malformed header section (a line that is not a \
             header field, an indented or folded key line, or a bare CR or LF) where readers \
             disagree about it; fix the header section; message not accepted",
        )
    }

    pub(crate) fn no_from_header() -> Self {
        Reply::new(
            550,
            "5.6.0 Message has no From: header field (RFC 5322 3.6); message not accepted",
        )
    }

    pub fn queued(id: &str) -> Self {
        Reply::new(250, format!("2.0.0 OK queued as {id}"))
    }

    pub(crate) fn key_reuse(derived_from_message_id: bool) -> Self {
        let mut text = String::from(
            "5.6.0 X-Bird-Idempotency-Key already used for a different message (E01005 IdempotencyKeyReuse); use a new key",
        );
        if derived_from_message_id {
            text.push_str(" (key derived from the Message-ID, which was reused)");
        }
        Reply::new(554, text)
    }

    pub(crate) fn key_in_progress() -> Self {
        Reply::new(
            451,
            "4.3.0 a message with this X-Bird-Idempotency-Key is still being processed (E01004 RequestInProgress); retry later",
        )
    }

    pub fn key_invalid() -> Self {
        Reply::new(
            554,
            "5.6.0 X-Bird-Idempotency-Key must be 1-255 printable characters (E01001); message not accepted",
        )
    }

    pub(crate) fn key_required() -> Self {
        Reply::new(
            554,
            "5.6.0 X-Bird-Idempotency-Key header required on this relay; message not accepted",
        )
    }

    pub(crate) fn store_unavailable() -> Self {
        Reply::new(
            451,
            "4.3.0 idempotency store unavailable; message not accepted, retry later (E01033 IdempotencyUnavailable)",
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
