//! The SMTP session as a pure state machine: bytes in, replies and actions out. No I/O.
//!
//! The server feeds whatever it read; the session answers every complete command (pipelining
//! falls out of this) and, at the end of a message, emits `Output::Submit` and stops consuming
//! input until the server reports the intake's reply through `submission_done`. Keeping the
//! wait inside the machine is what makes replies come out in command order.

use std::borrow::Cow;
use std::sync::Arc;

use smtp_proto::{
    Error as ProtoError, MailFrom, RcptTo, Request, MAIL_BODY_7BIT, MAIL_BODY_8BITMIME,
    MAIL_BODY_BINARYMIME, MAIL_SMTPUTF8,
};

use super::framing::{next_piece, BodyFault, BodyLimits, BodyReceiver, BodyStatus, Piece};
use super::reply::Reply;

/// What a session enforces; built once per listener.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub hostname: String,
    pub max_message_size: usize,
    pub max_recipients: usize,
    /// Longest command line, CRLF included.
    pub max_command_line: usize,
    /// Longest message line, CRLF excluded.
    pub max_data_line: usize,
    /// Syntax and sequence errors tolerated before the connection is dropped.
    pub max_errors: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            hostname: "localhost".into(),
            max_message_size: 25 * 1024 * 1024,
            max_recipients: 100,
            max_command_line: 2048,
            max_data_line: 998,
            max_errors: 20,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyType {
    SevenBit,
    EightBitMime,
}

impl BodyType {
    pub fn as_str(self) -> &'static str {
        match self {
            BodyType::SevenBit => "7BIT",
            BodyType::EightBitMime => "8BITMIME",
        }
    }
}

/// The envelope of one mail transaction. RCPTs are de-duplicated in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub body: BodyType,
    pub smtputf8: bool,
}

/// A finished message handed to intake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    pub envelope: Envelope,
    pub message: Vec<u8>,
    pub helo: String,
    pub esmtp: bool,
    pub chunked: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Reply(Reply),
    Submit(Submission),
    Close,
}

#[derive(Debug)]
enum Mode {
    Command,
    /// Reading the rest of a command line that is already too long.
    DiscardingLongLine,
    Data(BodyReceiver),
    /// `remaining` bytes of a BDAT chunk still to read; `keep` is false when the chunk is read
    /// only to stay in step after an error reply is already decided.
    BdatChunk {
        remaining: usize,
        size: usize,
        last: bool,
        reject: Option<Reply>,
    },
    AwaitingIntake,
    Closed,
}

#[derive(Debug)]
struct Transaction {
    mail_from: String,
    body: BodyType,
    smtputf8: bool,
    rcpt_to: Vec<String>,
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
    errors: usize,
    shutting_down: bool,
}

fn has_control_chars(s: &str) -> bool {
    s.chars().any(|c| c.is_control())
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
            errors: 0,
            shutting_down: false,
        }
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
        if self.shutting_down && matches!(self.mode, Mode::Command) {
            self.close_with(&mut out, Reply::shutting_down());
        }
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
        self.inbuf.clear();
    }

    fn process(&mut self, out: &mut Vec<Output>) {
        let mut pos = 0;
        loop {
            let rest = &self.inbuf[pos..];
            match &mut self.mode {
                Mode::Closed | Mode::AwaitingIntake => break,
                Mode::Command => match next_piece(rest, self.config.max_command_line) {
                    Piece::NeedMore => break,
                    Piece::BareLineEnding => {
                        self.close_with(out, Reply::bare_line_ending());
                        return;
                    }
                    Piece::Partial(n) => {
                        pos += n;
                        self.mode = Mode::DiscardingLongLine;
                    }
                    Piece::Line(n) => {
                        let line = rest[..n].to_vec();
                        pos += n;
                        if self.shutting_down {
                            self.close_with(out, Reply::shutting_down());
                            return;
                        }
                        if n > self.config.max_command_line {
                            self.error(out, Reply::line_too_long());
                        } else {
                            self.command(&line, out);
                        }
                    }
                },
                Mode::DiscardingLongLine => match next_piece(rest, 1) {
                    Piece::NeedMore => break,
                    Piece::BareLineEnding => {
                        self.close_with(out, Reply::bare_line_ending());
                        return;
                    }
                    Piece::Partial(n) => pos += n,
                    Piece::Line(n) => {
                        pos += n;
                        self.mode = Mode::Command;
                        self.error(out, Reply::line_too_long());
                    }
                },
                Mode::Data(rx) => {
                    let (used, status) = rx.feed_dotted(rest);
                    pos += used;
                    match status {
                        BodyStatus::NeedMore => break,
                        BodyStatus::BareLineEnding => {
                            self.close_with(out, Reply::bare_line_ending());
                            return;
                        }
                        BodyStatus::Complete => {
                            let Mode::Data(rx) = std::mem::replace(&mut self.mode, Mode::Command)
                            else {
                                unreachable!()
                            };
                            self.finish_message(rx, false, out);
                        }
                    }
                }
                Mode::BdatChunk {
                    remaining,
                    size,
                    last,
                    reject,
                } => {
                    let take = (*remaining).min(rest.len());
                    let chunk = &rest[..take];
                    *remaining -= take;
                    pos += take;
                    let (size, last, done, reject) = (*size, *last, *remaining == 0, reject.take());
                    if reject.is_none() {
                        let rx = self
                            .txn
                            .as_mut()
                            .and_then(|t| t.bdat.as_mut())
                            .expect("BDAT chunk without receiver");
                        if rx.feed_raw(chunk) == BodyStatus::BareLineEnding
                            || (done && last && rx.finish_raw() == BodyStatus::BareLineEnding)
                        {
                            self.close_with(out, Reply::bare_line_ending());
                            return;
                        }
                    }
                    if !done {
                        if let Mode::BdatChunk { reject: r, .. } = &mut self.mode {
                            *r = reject;
                        }
                        break;
                    }
                    self.mode = Mode::Command;
                    if let Some(reply) = reject {
                        self.error(out, reply);
                    } else if last {
                        let rx = self.txn.as_mut().and_then(|t| t.bdat.take()).unwrap();
                        self.finish_message(rx, true, out);
                    } else if self.bdat_fault() == Some(BodyFault::TooBig) {
                        // RFC 3030: a failed chunk fails the transaction.
                        self.txn = None;
                        out.push(Output::Reply(Reply::message_too_big()));
                    } else {
                        out.push(Output::Reply(Reply::chunk_ok(size)));
                    }
                }
            }
        }
        self.inbuf.drain(..pos.min(self.inbuf.len()));
    }

    fn error(&mut self, out: &mut Vec<Output>, reply: Reply) {
        self.errors += 1;
        if self.errors > self.config.max_errors {
            self.close_with(out, Reply::too_many_errors());
        } else {
            out.push(Output::Reply(reply));
        }
    }

    fn finish_message(&mut self, rx: BodyReceiver, chunked: bool, out: &mut Vec<Output>) {
        let Some(txn) = self.txn.take() else {
            return;
        };
        let message = match rx.into_message() {
            Ok(message) => message,
            Err(fault) => {
                out.push(Output::Reply(match fault {
                    BodyFault::LineTooLong => Reply::data_line_too_long(),
                    BodyFault::Nul => Reply::nul_in_data(),
                    BodyFault::TooBig => Reply::message_too_big(),
                }));
                return;
            }
        };
        let (helo, esmtp) = self.helo.clone().unwrap_or_default();
        out.push(Output::Submit(Submission {
            envelope: Envelope {
                mail_from: txn.mail_from,
                rcpt_to: txn.rcpt_to,
                body: txn.body,
                smtputf8: txn.smtputf8,
            },
            message,
            helo,
            esmtp,
            chunked,
        }));
        self.mode = Mode::AwaitingIntake;
    }

    fn bdat_fault(&self) -> Option<BodyFault> {
        self.txn.as_ref()?.bdat.as_ref()?.fault()
    }

    fn body_limits(&self) -> BodyLimits {
        BodyLimits {
            max_line: self.config.max_data_line,
            max_size: self.config.max_message_size,
        }
    }

    fn command(&mut self, line: &[u8], out: &mut Vec<Output>) {
        let request = Request::parse(&mut line.iter());
        let reply = match request {
            Ok(request) => self.request(request, out),
            Err(err) => Some(Err(proto_error_reply(&err))),
        };
        match reply {
            Some(Ok(reply)) => out.push(Output::Reply(reply)),
            Some(Err(reply)) => self.error(out, reply),
            None => {}
        }
    }

    /// `None` when the request produced its own outputs; `Err` for replies that count as
    /// client errors.
    fn request(
        &mut self,
        request: Request<Cow<'_, str>>,
        out: &mut Vec<Output>,
    ) -> Option<Result<Reply, Reply>> {
        Some(match request {
            Request::Ehlo { host } => self.hello(&host, true),
            Request::Helo { host } => self.hello(&host, false),
            Request::Mail { from } => self.mail(from),
            Request::Rcpt { to } => self.rcpt(to),
            Request::Data => self.data(),
            Request::Bdat {
                chunk_size,
                is_last,
            } => {
                self.bdat(chunk_size, is_last);
                return None;
            }
            Request::Rset => {
                self.txn = None;
                Ok(Reply::reset_ok())
            }
            Request::Noop { .. } => Ok(Reply::ok()),
            Request::Quit => {
                self.close_with(out, Reply::bye());
                return None;
            }
            Request::Vrfy { .. } => Ok(Reply::cannot_vrfy()),
            Request::Help { .. } => Ok(Reply::help()),
            other => Err(Reply::not_implemented(other.name())),
        })
    }

    fn hello(&mut self, host: &str, esmtp: bool) -> Result<Reply, Reply> {
        if host.is_empty() || host.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(Reply::bad_characters());
        }
        self.txn = None;
        self.helo = Some((host.to_string(), esmtp));
        Ok(if esmtp {
            Reply::ehlo(&self.config.hostname, host, self.config.max_message_size)
        } else {
            Reply::helo(&self.config.hostname, host)
        })
    }

    fn mail(&mut self, from: MailFrom<Cow<'_, str>>) -> Result<Reply, Reply> {
        if self.helo.is_none() {
            return Err(Reply::need_helo());
        }
        if !self.may_submit {
            return Err(Reply::auth_required());
        }
        if self.txn.is_some() {
            return Err(Reply::nested_mail());
        }
        if has_control_chars(&from.address) {
            return Err(Reply::bad_characters());
        }
        if from.flags & MAIL_BODY_BINARYMIME != 0 {
            return Err(Reply::unsupported_parameter("BODY=BINARYMIME"));
        }
        let supported = MAIL_BODY_7BIT | MAIL_BODY_8BITMIME | MAIL_SMTPUTF8;
        if from.flags & !supported != 0
            || from.env_id.is_some()
            || from.auth.is_some()
            || from.trans_id.is_some()
            || from.mtrk.is_some()
            || from.solicit.is_some()
            || from.by != 0
            || from.hold_for != 0
            || from.hold_until != 0
            || from.mt_priority != 0
        {
            return Err(Reply::unsupported_parameter("in MAIL FROM"));
        }
        if from.size > self.config.max_message_size {
            return Err(Reply::message_too_big());
        }
        self.txn = Some(Transaction {
            mail_from: from.address.into_owned(),
            body: if from.flags & MAIL_BODY_8BITMIME != 0 {
                BodyType::EightBitMime
            } else {
                BodyType::SevenBit
            },
            smtputf8: from.flags & MAIL_SMTPUTF8 != 0,
            rcpt_to: Vec::new(),
            bdat: None,
        });
        Ok(Reply::sender_ok())
    }

    fn rcpt(&mut self, to: RcptTo<Cow<'_, str>>) -> Result<Reply, Reply> {
        let max = self.config.max_recipients;
        let Some(txn) = self.txn.as_mut() else {
            return Err(Reply::need_mail());
        };
        if to.address.is_empty() {
            return Err(Reply::bad_recipient_address());
        }
        if has_control_chars(&to.address) {
            return Err(Reply::bad_characters());
        }
        if to.flags != 0 || to.orcpt.is_some() || to.rrvs != 0 {
            return Err(Reply::unsupported_parameter("in RCPT TO"));
        }
        if txn.rcpt_to.iter().any(|r| *r == to.address) {
            return Ok(Reply::recipient_ok());
        }
        if txn.rcpt_to.len() >= max {
            return Err(Reply::too_many_recipients());
        }
        txn.rcpt_to.push(to.address.into_owned());
        Ok(Reply::recipient_ok())
    }

    fn data(&mut self) -> Result<Reply, Reply> {
        let limits = self.body_limits();
        let Some(txn) = self.txn.as_ref() else {
            return Err(Reply::need_mail());
        };
        if txn.bdat.is_some() {
            return Err(Reply::mixed_data_bdat());
        }
        if txn.rcpt_to.is_empty() {
            return Err(Reply::no_valid_recipients());
        }
        self.mode = Mode::Data(BodyReceiver::new(limits));
        Ok(Reply::start_data())
    }

    fn bdat(&mut self, size: usize, last: bool) {
            let limits = self.body_limits();
        let reject = match self.txn.as_mut() {
            None => Some(Reply::need_mail()),
            Some(txn) if txn.rcpt_to.is_empty() => Some(Reply::no_valid_recipients()),
            Some(txn) => {
                txn.bdat.get_or_insert_with(|| BodyReceiver::new(limits));
                None
            }
        };
        self.mode = Mode::BdatChunk {
            remaining: size,
            size,
            last,
            reject,
        };
    }
}

fn proto_error_reply(err: &ProtoError) -> Reply {
    match err {
        ProtoError::UnknownCommand => Reply::unknown_command(),
        ProtoError::InvalidSenderAddress => Reply::bad_sender_address(),
        ProtoError::InvalidRecipientAddress => Reply::bad_recipient_address(),
        ProtoError::SyntaxError { syntax } => Reply::syntax(syntax),
        ProtoError::InvalidParameter { param } => Reply::syntax(&format!("invalid {param}")),
        ProtoError::UnsupportedParameter { param } => Reply::unsupported_parameter(param),
        ProtoError::ResponseTooLong => Reply::line_too_long(),
        ProtoError::NeedsMoreData { .. } | ProtoError::InvalidResponse { .. } => {
            Reply::syntax("command")
        }
    }
}
