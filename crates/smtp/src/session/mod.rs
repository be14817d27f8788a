//! The SMTP session as a pure state machine: bytes in, replies and actions out. No I/O.
//!
//! The server feeds whatever it read; the session answers every complete command (pipelining
//! falls out of this) and, at the end of a message, emits `Output::Submit` and stops consuming
//! input until the server reports the intake's reply through `submission_done`. Keeping the
//! wait inside the machine is what makes replies come out in command order.
//!
//! Files: this one holds the session's state, its public calls and the input loop (which
//! piece of input each mode reads); `commands` answers command lines, `transaction` MAIL,
//! RCPT, DATA and BDAT, `auth` AUTH and STARTTLS, `guards` the checks made on a line before
//! any parser sees it; `refusal` classifies replies for counters and logs.

mod auth;
mod commands;
mod guards;
mod refusal;
#[cfg(test)]
mod tests;
mod transaction;

use std::sync::Arc;

use super::framing::{next_piece, BodyReceiver, BodyStatus, Piece};
use super::sasl::{Presented, SaslExchange};
use idemrelay_model::mail::{BodyType, Submission};
use idemrelay_model::reply::Reply;
use idemrelay_model::Authenticated;

pub use refusal::RefusalReason;

/// What a session enforces; built once per listener.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub hostname: String,
    pub max_message_size: usize,
    pub max_recipients: usize,
    /// Mail transactions (accepted MAIL commands) in one session: RFC 9422's MAILMAX, advertised
    /// in EHLO; the MAIL after the last is answered 421 and the connection closed.
    pub max_transactions: usize,
    /// Longest command line, CRLF included.
    pub max_command_line: usize,
    /// Longest message line, CRLF excluded.
    pub max_data_line: usize,
    /// Syntax and sequence errors tolerated before the connection is dropped.
    pub max_errors: usize,
    /// STARTTLS is offered (a TLS listener that is not already implicit TLS).
    pub starttls: bool,
    /// MAIL and AUTH need TLS first (the submission listener).
    pub require_tls: bool,
    /// AUTH PLAIN/LOGIN is offered (users are configured); only over TLS unless
    /// `require_tls` is off (an allow-listed plain listener).
    pub auth: bool,
    /// Failed AUTH attempts before the connection is dropped with 421 4.7.0.
    pub max_auth_failures: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            hostname: "localhost".into(),
            max_message_size: 25 * 1024 * 1024,
            max_recipients: 100,
            max_transactions: 1000,
            max_command_line: 2048,
            max_data_line: 998,
            max_errors: 20,
            starttls: false,
            require_tls: false,
            auth: false,
            max_auth_failures: 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Reply(Reply),
    Submit(Submission),
    /// Upgrade the connection, then call `tls_started`. Input buffered so far is dropped.
    StartTls,
    /// Check these credentials, then call `auth_result`.
    Authenticate(Presented),
    Close,
}

/// What a command comes to.
#[derive(Debug)]
enum Answer {
    /// An ordinary reply.
    Reply(Reply),
    /// A reply that counts as a client error, towards `max_errors`.
    Error(Reply),
    /// The command pushed its own outputs (or has none yet) and set the mode that follows.
    Done,
}

/// How far one step of the input loop got.
enum Progress {
    /// Consumed this many bytes; the next step may go on.
    Consumed(usize),
    /// Consumed this many bytes; nothing more until new input, or the server's answer.
    Stalled(usize),
}

#[derive(Debug)]
enum Mode {
    Command,
    /// Reading the rest of a command line that is already too long.
    DiscardingLongLine,
    Data(BodyReceiver),
    /// `remaining` bytes of a BDAT chunk still to read; with a `reject` reply already decided,
    /// the chunk is read only to stay in step with the client.
    BdatChunk {
        remaining: usize,
        size: usize,
        last: bool,
        reject: Option<Reply>,
    },
    AwaitingIntake,
    /// A SASL exchange: the next line is the client's response.
    Sasl(SaslExchange),
    AwaitingAuth,
    AwaitingTls,
    Closed,
}

/// The mail transaction under way, from MAIL to the end of its message (see `transaction`).
#[derive(Debug)]
struct Transaction {
    mail_from: String,
    body: BodyType,
    smtputf8: bool,
    rcpt_to: Vec<String>,
    /// RET, ENVID and REQUIRETLS from MAIL; NOTIFY and ORCPT by recipient (under the
    /// spelling `rcpt_to` keeps).
    requests: idemrelay_model::mail::DeliveryRequests,
    /// The message so far, once a BDAT chunk has been accepted.
    bdat: Option<BodyReceiver>,
}

#[derive(Debug)]
pub struct Session {
    config: Arc<SessionConfig>,
    /// Whether this client may submit without authentication (allow-listed network).
    may_submit: bool,
    inbuf: Vec<u8>,
    mode: Mode,
    helo: Option<(String, bool)>,
    txn: Option<Transaction>,
    /// Transactions opened so far (MAILMAX).
    transactions: usize,
    errors: usize,
    shutting_down: bool,
    tls: bool,
    user: Option<Authenticated>,
    auth_failures: usize,
}

impl Session {
    pub fn new(config: Arc<SessionConfig>, may_submit: bool) -> Self {
        Session {
            config,
            may_submit,
            inbuf: Vec::new(),
            mode: Mode::Command,
            helo: None,
            txn: None,
            transactions: 0,
            errors: 0,
            shutting_down: false,
            tls: false,
            user: None,
            auth_failures: 0,
        }
    }

    /// A session on an implicit-TLS connection.
    pub fn new_tls(config: Arc<SessionConfig>, may_submit: bool) -> Self {
        let mut session = Session::new(config, may_submit);
        session.tls = true;
        session
    }

    /// The name the client gave in HELO/EHLO, for log lines.
    pub fn helo(&self) -> Option<&str> {
        self.helo.as_ref().map(|(name, _)| name.as_str())
    }

    pub fn greeting(&self) -> Reply {
        Reply::greeting(&self.config.hostname)
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.mode, Mode::Closed)
    }

    /// True while a message is being received or committed: shutdown lets these finish.
    pub fn in_message(&self) -> bool {
        matches!(
            self.mode,
            Mode::Data(_) | Mode::BdatChunk { .. } | Mode::AwaitingIntake
        ) || self.txn.as_ref().is_some_and(|t| t.bdat.is_some())
    }

    /// Feeds bytes read from the client.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Output> {
        let mut out = Vec::new();
        if self.is_closed() {
            return out;
        }
        self.inbuf.extend_from_slice(bytes);
        self.process(&mut out);
        out
    }

    /// The intake's answer to the last `Output::Submit`.
    pub fn submission_done(&mut self, reply: Reply) -> Vec<Output> {
        let mut out = Vec::new();
        if !matches!(self.mode, Mode::AwaitingIntake) {
            return out;
        }
        out.push(Output::Reply(reply));
        self.txn = None;
        self.mode = Mode::Command;
        self.process(&mut out);
        out
    }

    /// The server is stopping: idle sessions are told so now, sessions inside a message get to
    /// finish it and are told at their next command.
    pub fn begin_shutdown(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        self.shutting_down = true;
        if !self.is_closed() && !self.in_message() {
            self.close_with(&mut out, Reply::shutting_down());
        }
        out
    }

    /// Ends the session with this reply (a deadline or rate limit enforced by the server).
    pub fn close_now(&mut self, reply: Reply) -> Vec<Output> {
        let mut out = Vec::new();
        if !self.is_closed() {
            self.close_with(&mut out, reply);
        }
        out
    }

    /// The client was silent for too long.
    pub fn timed_out(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        if !self.is_closed() {
            self.close_with(&mut out, Reply::timeout());
        }
        out
    }

    fn close_with(&mut self, out: &mut Vec<Output>, reply: Reply) {
        out.push(Output::Reply(reply));
        out.push(Output::Close);
        self.mode = Mode::Closed;
    }

    fn error(&mut self, out: &mut Vec<Output>, reply: Reply) {
        self.errors += 1;
        if self.errors > self.config.max_errors {
            self.close_with(out, Reply::too_many_errors());
        } else {
            out.push(Output::Reply(reply));
        }
    }

    /// Consumes buffered input, one step at a time, until the mode waits for more input or
    /// for the server (intake, a credential check, the TLS handshake).
    fn process(&mut self, out: &mut Vec<Output>) {
        // Steps read the buffer while changing the rest of the session; nothing they call
        // touches the buffer itself.
        let input = std::mem::take(&mut self.inbuf);
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            let progress = match &self.mode {
                Mode::Closed | Mode::AwaitingIntake | Mode::AwaitingAuth | Mode::AwaitingTls => {
                    break
                }
                Mode::Command => self.command_input(rest, out),
                Mode::DiscardingLongLine => self.discard_input(rest, out),
                Mode::Sasl(_) => self.sasl_input(rest, out),
                Mode::Data(_) => self.data_input(rest, out),
                Mode::BdatChunk { .. } => self.bdat_input(rest, out),
            };
            match progress {
                Progress::Consumed(n) => pos += n,
                Progress::Stalled(n) => {
                    pos += n;
                    break;
                }
            }
        }
        if self.shutting_down && !self.is_closed() && !self.in_message() {
            self.close_with(out, Reply::shutting_down());
        }
        if !self.is_closed() {
            self.inbuf = input;
            self.inbuf.drain(..pos);
        }
    }

    /// A command line, answered; a line over the limit is read to its end and refused.
    fn command_input(&mut self, rest: &[u8], out: &mut Vec<Output>) -> Progress {
        match next_piece(rest, self.config.max_command_line) {
            Piece::NeedMore => Progress::Stalled(0),
            Piece::BareLineEnding => {
                self.close_with(out, Reply::bare_line_ending());
                Progress::Stalled(0)
            }
            Piece::Partial(n) => {
                self.mode = Mode::DiscardingLongLine;
                Progress::Consumed(n)
            }
            Piece::Line(n) => {
                // A BDAT transaction already under way may still finish.
                if self.shutting_down && !self.in_message() {
                    self.close_with(out, Reply::shutting_down());
                    return Progress::Stalled(n);
                }
                if n > self.config.max_command_line {
                    self.error(out, Reply::line_too_long());
                } else {
                    self.command(&rest[..n], out);
                }
                Progress::Consumed(n)
            }
        }
    }

    /// The rest of an over-long line (a command's or a SASL response's), then its refusal.
    fn discard_input(&mut self, rest: &[u8], out: &mut Vec<Output>) -> Progress {
        match next_piece(rest, 1) {
            Piece::NeedMore => Progress::Stalled(0),
            Piece::BareLineEnding => {
                self.close_with(out, Reply::bare_line_ending());
                Progress::Stalled(0)
            }
            Piece::Partial(n) => Progress::Consumed(n),
            Piece::Line(n) => {
                self.mode = Mode::Command;
                self.error(out, Reply::line_too_long());
                Progress::Consumed(n)
            }
        }
    }

    /// Message bytes after DATA, up to the lone dot.
    fn data_input(&mut self, rest: &[u8], out: &mut Vec<Output>) -> Progress {
        let Mode::Data(rx) = &mut self.mode else {
            unreachable!("data_input runs in Data mode")
        };
        let (used, status) = rx.feed_dotted(rest);
        match status {
            BodyStatus::NeedMore => Progress::Stalled(used),
            BodyStatus::BareLineEnding => {
                self.close_with(out, Reply::bare_line_ending());
                Progress::Stalled(used)
            }
            BodyStatus::Complete => {
                let Mode::Data(rx) = std::mem::replace(&mut self.mode, Mode::Command) else {
                    unreachable!("data_input runs in Data mode")
                };
                self.finish_message(rx, false, out);
                Progress::Consumed(used)
            }
        }
    }
}
