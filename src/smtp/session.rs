//! The SMTP session as a pure state machine: bytes in, replies and actions out. No I/O.
//!
//! The server feeds whatever it read; the session answers every complete command (pipelining
//! falls out of this) and, at the end of a message, emits `Output::Submit` and stops consuming
//! input until the server reports the intake's reply through `submission_done`. Keeping the
//! wait inside the machine is what makes replies come out in command order.

use std::borrow::Cow;
use std::sync::Arc;

use smtp_proto::{Error as ProtoError, Request, AUTH_LOGIN, AUTH_PLAIN};

use super::address;
use super::framing::{next_piece, BodyFault, BodyLimits, BodyReceiver, BodyStatus, Piece};
use super::mail_rcpt::{self, LineError, ParamError, Verb};
use super::reply::Reply;
use super::sasl::{Mechanism as SaslMechanism, Presented, SaslExchange, SaslStep};
use crate::auth::Authenticated;

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
        let classes: [(fn() -> Reply, RefusalReason); 20] = [
            (Reply::store_unavailable_at_connect, RefusalReason::Store),
            (Reply::store_unavailable, RefusalReason::Store),
            (Reply::too_many_connections, RefusalReason::Caps),
            (Reply::early_talker, RefusalReason::Policy),
            (Reply::auth_required, RefusalReason::Policy),
            (Reply::starttls_first, RefusalReason::Policy),
            (Reply::encryption_required_for_auth, RefusalReason::Policy),
            (Reply::sender_not_allowed, RefusalReason::Policy),
            (Reply::bare_line_ending, RefusalReason::Smuggling),
            (Reply::line_too_long, RefusalReason::Limits),
            (Reply::data_line_too_long, RefusalReason::Limits),
            (Reply::message_too_big, RefusalReason::Limits),
            (Reply::too_many_recipients, RefusalReason::Limits),
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
    /// The authenticated user's idempotency scope; `None` for allow-listed clients.
    pub auth_scope: Option<String>,
    /// The authenticated user's name, for the submission's log line.
    pub auth_user: Option<String>,
    pub tls: bool,
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
    /// A SASL exchange: the next line is the client's response.
    Sasl(SaslExchange),
    AwaitingAuth,
    AwaitingTls,
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
    tls: bool,
    user: Option<Authenticated>,
    auth_failures: usize,
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

    /// The TLS handshake after STARTTLS succeeded: RFC 3207 says forget everything learnt
    /// in plaintext, starting with EHLO.
    pub fn tls_started(&mut self) {
        if matches!(self.mode, Mode::AwaitingTls) {
            self.tls = true;
            self.helo = None;
            self.txn = None;
            self.user = None;
            self.inbuf.clear();
            self.mode = Mode::Command;
        }
    }

    /// The credential check's answer to the last `Output::Authenticate`.
    pub fn auth_result(&mut self, user: Option<Authenticated>) -> Vec<Output> {
        let mut out = Vec::new();
        if !matches!(self.mode, Mode::AwaitingAuth) {
            return out;
        }
        self.mode = Mode::Command;
        match user {
            Some(user) => {
                self.user = Some(user);
                out.push(Output::Reply(Reply::auth_ok()));
            }
            None => {
                self.auth_failures += 1;
                if self.auth_failures >= self.config.max_auth_failures {
                    self.close_with(&mut out, Reply::too_many_auth_failures());
                    return out;
                }
                out.push(Output::Reply(Reply::auth_failed()));
            }
        }
        self.process(&mut out);
        out
    }

    pub fn authenticated(&self) -> Option<&Authenticated> {
        self.user.as_ref()
    }

    /// Over TLS; in cleartext only on the plain listener and only to allow-listed clients,
    /// so a password never crosses an untrusted network unencrypted.
    fn auth_offered(&self) -> bool {
        self.config.auth && (self.tls || (!self.config.require_tls && self.may_submit))
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

    fn process(&mut self, out: &mut Vec<Output>) {
        let mut pos = 0;
        loop {
            let rest = &self.inbuf[pos..];
            match &mut self.mode {
                Mode::Closed | Mode::AwaitingIntake | Mode::AwaitingAuth | Mode::AwaitingTls => {
                    break
                }
                Mode::Sasl(exchange) => match next_piece(rest, self.config.max_command_line) {
                    Piece::NeedMore => break,
                    Piece::BareLineEnding => {
                        self.close_with(out, Reply::bare_line_ending());
                        break;
                    }
                    Piece::Partial(_) => {
                        self.mode = Mode::DiscardingLongLine;
                    }
                    Piece::Line(n) if n > self.config.max_command_line => {
                        pos += n;
                        self.mode = Mode::Command;
                        self.error(out, Reply::line_too_long());
                    }
                    Piece::Line(n) => {
                        pos += n;
                        let line = String::from_utf8_lossy(&rest[..n - 2]).into_owned();
                        let step = exchange.next(&line);
                        self.sasl_step(step, out);
                    }
                },
                Mode::Command => match next_piece(rest, self.config.max_command_line) {
                    Piece::NeedMore => break,
                    Piece::BareLineEnding => {
                        self.close_with(out, Reply::bare_line_ending());
                        break;
                    }
                    Piece::Partial(n) => {
                        pos += n;
                        self.mode = Mode::DiscardingLongLine;
                    }
                    Piece::Line(n) => {
                        let line = rest[..n].to_vec();
                        pos += n;
                        // A BDAT transaction already under way may still finish.
                        if self.shutting_down && !self.in_message() {
                            self.close_with(out, Reply::shutting_down());
                            break;
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
                        break;
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
                            break;
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
                            break;
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
        if self.shutting_down && !self.is_closed() && !self.in_message() {
            self.close_with(out, Reply::shutting_down());
        }
        if self.is_closed() {
            self.inbuf = Vec::new();
        } else {
            self.inbuf.drain(..pos);
        }
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
            auth_scope: self.user.as_ref().map(|u| u.scope.clone()),
            auth_user: self.user.as_ref().map(|u| u.name.clone()),
            tls: self.tls,
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
        if let Some(reply) = overflowing_number(line).or_else(|| control_in_arguments(line)) {
            self.error(out, reply);
            return;
        }
        // MAIL, RCPT and HELO/EHLO are read from the raw line: smtp-proto rewrites their
        // arguments (see `mail_rcpt`). Everything else goes through its parser.
        let body = line.strip_suffix(b"\r\n").unwrap_or(line);
        let verb_end = body
            .iter()
            .position(u8::is_ascii_whitespace)
            .unwrap_or(body.len());
        let (verb, args) = body.split_at(verb_end);
        let is = |name: &str| verb.eq_ignore_ascii_case(name.as_bytes());
        let reply = if is("MAIL") {
            Some(self.mail(args))
        } else if is("RCPT") {
            Some(self.rcpt(args))
        } else if is("EHLO") || is("HELO") {
            Some(self.hello(args, is("EHLO")))
        } else if is("STARTTLS") && args.iter().any(|&b| b != b' ') {
            // RFC 3207: STARTTLS takes no parameters.
            Some(Err(Reply::syntax("STARTTLS (no parameters)")))
        } else {
            match Request::parse(&mut line.iter()) {
                Ok(request) => self.request(request, out),
                Err(err) => Some(Err(proto_error_reply(&err))),
            }
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
            Request::StartTls => return self.starttls(out),
            Request::Auth {
                mechanism,
                initial_response,
            } => return self.auth(mechanism, &initial_response, out),
            Request::Help { .. } => Ok(Reply::help()),
            other => Err(Reply::not_implemented(other.name())),
        })
    }

    /// `args` is what follows the verb: SP and the client's name; anything after the name
    /// is ignored, as most servers do.
    fn hello(&mut self, args: &[u8], esmtp: bool) -> Result<Reply, Reply> {
        let name = args.strip_prefix(b" ").and_then(|a| {
            a.split(|&b| b == b' ' || b == b'\t')
                .find(|w| !w.is_empty())
        });
        let Some(name) = name else {
            return Err(Reply::syntax(if esmtp {
                "EHLO domain"
            } else {
                "HELO domain"
            }));
        };
        // Only an ASCII domain or address literal reaches the Received: line (DESIGN §3).
        let Some(host) = std::str::from_utf8(name)
            .ok()
            .filter(|h| address::is_helo_name(h))
        else {
            return Err(Reply::bad_helo_name());
        };
        self.txn = None;
        self.helo = Some((host.to_string(), esmtp));
        Ok(if esmtp {
            let mut reply = Reply::ehlo(&self.config.hostname, host, self.config.max_message_size);
            if self.config.starttls && !self.tls {
                reply.lines.push("STARTTLS".into());
            }
            if self.auth_offered() {
                reply.lines.push("AUTH PLAIN LOGIN".into());
            }
            reply
        } else {
            Reply::helo(&self.config.hostname, host)
        })
    }

    fn mail(&mut self, args: &[u8]) -> Result<Reply, Reply> {
        let command = mail_rcpt::parse(Verb::Mail, args).map_err(|e| {
            line_error_reply(
                e,
                "MAIL FROM:<reverse-path> [parameters]",
                Reply::bad_sender_address,
            )
        })?;
        // A malformed parameter is a syntax error, answered before the session's state is
        // looked at; an unimplemented one only once the path has been judged.
        let params = match mail_rcpt::mail_params(&command.params) {
            Ok(params) => Ok(params),
            Err(ParamError::Invalid(param)) => {
                return Err(Reply::syntax(&format!("invalid {param}")))
            }
            Err(ParamError::Unsupported(param)) => Err(param),
        };
        if self.helo.is_none() {
            return Err(Reply::need_helo());
        }
        if self.config.require_tls && !self.tls {
            return Err(Reply::starttls_first());
        }
        if !self.may_submit && self.user.is_none() {
            return Err(Reply::auth_required());
        }
        if self.txn.is_some() {
            return Err(Reply::nested_mail());
        }
        let smtputf8 = params.as_ref().is_ok_and(|p| p.smtputf8);
        let path = command.path;
        if has_control_chars(path) {
            return Err(Reply::bad_characters());
        }
        if !smtputf8 && !path.is_ascii() {
            return Err(Reply::non_ascii_address());
        }
        let Some(mailbox) = address::reverse_path(path, smtputf8) else {
            return Err(Reply::bad_sender_address());
        };
        if let Some(user) = &self.user {
            if !user.may_send_as(mailbox) {
                return Err(Reply::sender_not_allowed());
            }
        }
        let params = params.map_err(|param| Reply::unsupported_parameter(&param))?;
        if params
            .size
            .as_deref()
            .is_some_and(|size| mail_rcpt::size_exceeds(size, self.config.max_message_size))
        {
            return Err(Reply::message_too_big());
        }
        self.txn = Some(Transaction {
            mail_from: mailbox.to_string(),
            body: if params.eight_bit {
                BodyType::EightBitMime
            } else {
                BodyType::SevenBit
            },
            smtputf8,
            rcpt_to: Vec::new(),
            bdat: None,
        });
        Ok(Reply::sender_ok())
    }

    fn rcpt(&mut self, args: &[u8]) -> Result<Reply, Reply> {
        let command = mail_rcpt::parse(Verb::Rcpt, args).map_err(|e| {
            line_error_reply(
                e,
                "RCPT TO:<forward-path> [parameters]",
                Reply::bad_recipient_address,
            )
        })?;
        let max = self.config.max_recipients;
        let Some(txn) = self.txn.as_mut() else {
            return Err(Reply::need_mail());
        };
        let path = command.path;
        if has_control_chars(path) {
            return Err(Reply::bad_characters());
        }
        if !txn.smtputf8 && !path.is_ascii() {
            return Err(Reply::non_ascii_address());
        }
        let Some(mailbox) = address::forward_path(path, txn.smtputf8) else {
            return Err(Reply::bad_recipient_address());
        };
        if let Some(param) = command.params.first() {
            return Err(Reply::unsupported_parameter(
                &param.keyword.to_ascii_uppercase(),
            ));
        }
        if txn.rcpt_to.iter().any(|r| r == mailbox) {
            return Ok(Reply::recipient_ok());
        }
        if txn.rcpt_to.len() >= max {
            // Not a client error: RFC 5321 §4.5.3.1.10 has the client send the rest later.
            return Ok(Reply::too_many_recipients());
        }
        txn.rcpt_to.push(mailbox.to_string());
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

    fn starttls(&mut self, out: &mut Vec<Output>) -> Option<Result<Reply, Reply>> {
        if !self.config.starttls {
            return Some(Err(Reply::not_implemented("STARTTLS")));
        }
        if self.tls {
            return Some(Err(Reply::tls_already_active()));
        }
        out.push(Output::Reply(Reply::ready_for_tls()));
        out.push(Output::StartTls);
        // Anything pipelined after STARTTLS arrived in plaintext: it must not be obeyed
        // once encrypted (the CVE-2011-0411 class). The buffer is dropped in tls_started.
        self.mode = Mode::AwaitingTls;
        None
    }

    fn auth(
        &mut self,
        mechanism: u64,
        initial: &str,
        out: &mut Vec<Output>,
    ) -> Option<Result<Reply, Reply>> {
        if !self.config.auth {
            return Some(Err(Reply::not_implemented("AUTH")));
        }
        if !self.auth_offered() {
            return Some(Err(Reply::encryption_required_for_auth()));
        }
        if self.user.is_some() {
            return Some(Err(Reply::already_authenticated()));
        }
        if self.txn.is_some() {
            return Some(Err(Reply::auth_during_transaction()));
        }
        let mechanism = if mechanism == AUTH_PLAIN {
            SaslMechanism::Plain
        } else if mechanism == AUTH_LOGIN {
            SaslMechanism::Login
        } else {
            return Some(Err(Reply::unsupported_mechanism()));
        };
        let initial = (!initial.is_empty()).then_some(initial);
        let (exchange, step) = SaslExchange::start(mechanism, initial);
        self.mode = Mode::Sasl(exchange);
        self.sasl_step(step, out);
        None
    }

    fn sasl_step(&mut self, step: SaslStep, out: &mut Vec<Output>) {
        match step {
            SaslStep::Challenge(challenge) => out.push(Output::Reply(Reply::new(334, challenge))),
            SaslStep::Done(presented) => {
                self.mode = Mode::AwaitingAuth;
                out.push(Output::Authenticate(presented));
            }
            SaslStep::Malformed => {
                self.mode = Mode::Command;
                self.error(out, Reply::bad_sasl_response());
            }
            SaslStep::Cancelled => {
                self.mode = Mode::Command;
                self.error(out, Reply::auth_cancelled());
            }
        }
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

/// smtp-proto 0.2 turns an overflowing number into its last digit (`...99995` reads as 5),
/// which would let BDAT framing disagree with the client's; such numbers are refused here.
/// (MAIL's SIZE is read by `mail_rcpt`, which has no such limit.)
fn overflowing_number(line: &[u8]) -> Option<Reply> {
    let text = std::str::from_utf8(line).ok()?;
    let mut words = text.split_ascii_whitespace();
    let verb = words.next()?;
    let overflows = |v: &str| {
        !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && v.parse::<usize>().is_err()
    };
    (verb.eq_ignore_ascii_case("BDAT") && words.next().is_some_and(overflows))
        .then(|| Reply::syntax("BDAT chunk-size [LAST]"))
}

/// The reply to a MAIL or RCPT line that could not be read.
fn line_error_reply(error: LineError, usage: &str, bad_address: fn() -> Reply) -> Reply {
    match error {
        LineError::Syntax => Reply::syntax(usage),
        LineError::NotUtf8 => bad_address(),
        LineError::BadParameter(param) => Reply::syntax(&format!("invalid {param}")),
        LineError::Duplicate(param) => Reply::duplicate_parameter(&param),
    }
}

/// Control characters in a name or address are refused as such, before smtp-proto's parser
/// would call them a syntax error of another kind.
fn control_in_arguments(line: &[u8]) -> Option<Reply> {
    let body = line.strip_suffix(b"\r\n").unwrap_or(line);
    let verb_end = body.iter().position(|&b| b == b' ').unwrap_or(body.len());
    let verb = &body[..verb_end];
    let checked = [&b"MAIL"[..], b"RCPT", b"HELO", b"EHLO"]
        .iter()
        .any(|v| verb.eq_ignore_ascii_case(v));
    let control = body[verb_end..]
        .iter()
        .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f);
    (checked && control).then(Reply::bad_characters)
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

    use proptest::prelude::*;

    fn session() -> Session {
        Session::new(
            Arc::new(SessionConfig {
                hostname: "relay.test".into(),
                max_message_size: 10_000,
                max_recipients: 3,
                max_errors: 5,
                ..SessionConfig::default()
            }),
            true,
        )
    }

    /// Everything a client would observe, plus what intake was handed. Intake answers each
    /// submission with a queued reply numbered in order.
    #[derive(Debug, Default, PartialEq, Eq)]
    struct Transcript {
        replies: Vec<String>,
        submissions: Vec<Submission>,
        closed: bool,
        starttls: usize,
    }

    fn absorb(s: &mut Session, mut outputs: Vec<Output>, t: &mut Transcript) {
        while !outputs.is_empty() {
            let mut next = Vec::new();
            for o in outputs {
                match o {
                    Output::Reply(r) => t.replies.push(r.line()),
                    Output::Close => t.closed = true,
                    Output::Submit(sub) => {
                        t.submissions.push(sub);
                        let id = format!("T{}", t.submissions.len());
                        next = s.submission_done(Reply::queued(&id));
                    }
                    Output::StartTls => {
                        t.starttls += 1;
                        s.tls_started();
                    }
                    Output::Authenticate(p) => {
                        let ok = p.user == "good" && p.password == "pw";
                        next = s.auth_result(ok.then(|| Authenticated {
                            name: "good".into(),
                            scope: "scope-good".into(),
                            allowed_senders: vec!["@allowed.example".into()],
                        }));
                    }
                }
            }
            outputs = next;
        }
    }

    fn run_chunks(chunks: &[&[u8]]) -> Transcript {
        let mut s = session();
        let mut t = Transcript::default();
        for chunk in chunks {
            let out = s.feed(chunk);
            absorb(&mut s, out, &mut t);
        }
        t
    }

    fn run(input: &[u8]) -> Transcript {
        run_chunks(&[input])
    }

    fn codes(t: &Transcript) -> Vec<u16> {
        t.replies.iter().map(|r| r[..3].parse().unwrap()).collect()
    }

    #[test]
    fn a_whole_transaction() {
        let t = run(b"EHLO c\r\nMAIL FROM:<a@x> SIZE=100 BODY=8BITMIME SMTPUTF8\r\nRCPT TO:<b@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nSubject: s\r\n\r\n..dot\r\n.\r\nQUIT\r\n");
        assert_eq!(codes(&t), vec![250, 250, 250, 250, 354, 250, 221]);
        assert!(t.closed);
        let sub = &t.submissions[0];
        assert_eq!(sub.message, b"Subject: s\r\n\r\n.dot\r\n");
        assert_eq!(sub.envelope.rcpt_to, vec!["b@x"]);
        assert_eq!(sub.envelope.body, BodyType::EightBitMime);
        assert!(sub.envelope.smtputf8 && sub.esmtp && !sub.chunked);
        assert_eq!(sub.helo, "c");
    }

    #[test]
    fn sequence_errors() {
        let t = run(b"MAIL FROM:<a@x>\r\nHELO c\r\nRCPT TO:<b@x>\r\nDATA\r\nMAIL FROM:<a@x>\r\nMAIL FROM:<a@x>\r\nDATA\r\n");
        assert_eq!(codes(&t), vec![503, 250, 503, 503, 250, 503, 554]);
        assert!(t.replies[0].starts_with("503 5.5.1"));
        assert!(t.replies[6].starts_with("554 5.5.1"));
    }

    #[test]
    fn simple_commands() {
        let t = run(b"EHLO c\r\nNOOP\r\nVRFY x\r\nHELP\r\nRSET\r\nEXPN x\r\nFOO\r\nSTARTTLS\r\n");
        assert_eq!(codes(&t), vec![250, 250, 252, 214, 250, 502, 500, 502]);
        assert!(t.replies[0].contains("relay.test greets c"));
    }

    #[test]
    fn ehlo_advertises_the_extensions() {
        let mut s = session();
        let out = s.feed(b"EHLO c\r\n");
        let Output::Reply(r) = &out[0] else { panic!() };
        for ext in [
            "PIPELINING",
            "SIZE 10000",
            "8BITMIME",
            "SMTPUTF8",
            "ENHANCEDSTATUSCODES",
            "CHUNKING",
        ] {
            assert!(r.lines.iter().any(|l| l == ext), "{ext} missing");
        }
    }

    #[test]
    fn parameter_and_limit_errors() {
        let t = run(b"EHLO c\r\nMAIL FROM:<a@x> SIZE=20000\r\nMAIL FROM:<a@x> BODY=BINARYMIME\r\nMAIL FROM:<a@x> RET=FULL\r\nMAIL FROM:<a@x>\r\nRCPT TO:<1@x>\r\nRCPT TO:<2@x>\r\nRCPT TO:<3@x>\r\nRCPT TO:<4@x>\r\nRCPT TO:<b@x> NOTIFY=NEVER\r\n");
        assert_eq!(
            t.replies[1],
            "552 5.3.4 Message size exceeds fixed maximum message size"
        );
        assert!(t.replies[2].starts_with("555 5.5.4"));
        assert!(t.replies[3].starts_with("555 5.5.4"));
        assert_eq!(t.replies[8], "452 4.5.3 Too many recipients");
        assert!(t.replies[9].starts_with("555 5.5.4"));
    }

    #[test]
    fn control_characters_in_names() {
        let t = run(b"HELO a\x01b\r\nEHLO c\r\nMAIL FROM:<a\x7f@x>\r\n");
        assert_eq!(
            t.replies[0],
            "501 5.5.2 Control characters are not allowed here"
        );
        assert_eq!(codes(&t)[1], 250);
        assert_eq!(codes(&t)[2], 501);
    }

    #[test]
    fn unauthenticated_clients_get_530() {
        let mut s = Session::new(Arc::new(SessionConfig::default()), false);
        let mut t = Transcript::default();
        let out = s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\n");
        absorb(&mut s, out, &mut t);
        assert_eq!(t.replies[1], "530 5.7.0 Authentication required");
    }

    #[test]
    fn long_command_lines_are_refused_and_the_session_goes_on() {
        let mut input = b"EHLO c\r\nNOOP ".to_vec();
        input.extend(std::iter::repeat_n(b'x', 3000));
        input.extend_from_slice(b"\r\nNOOP\r\n");
        let t = run(&input);
        assert_eq!(t.replies[1], "500 5.5.2 Line too long");
        assert_eq!(codes(&t)[2], 250);
        // 2048 octets including CRLF is still fine.
        let mut ok = b"NOOP ".to_vec();
        ok.extend(std::iter::repeat_n(b'x', 2048 - 7));
        ok.extend_from_slice(b"\r\n");
        assert_eq!(codes(&run(&ok)), vec![250]);
    }

    #[test]
    fn bare_line_endings_close_the_session() {
        for input in [
            &b"EHLO c\nNOOP\r\n"[..],
            b"EHLO c\r\nNO\rOP\r\n",
            b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n\n.\n",
            b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n.\r\r\n",
            b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 6 LAST\r\nA: b\nx",
        ] {
            let t = run(input);
            assert!(t.closed, "{input:?}");
            assert!(t.submissions.is_empty());
            assert_eq!(
                t.replies.last().unwrap(),
                "521 5.5.2 Bare CR or LF not allowed; lines must end with CRLF; closing connection"
            );
        }
    }

    #[test]
    fn body_faults_are_answered_at_the_end_and_the_session_goes_on() {
        let mut big = b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\n".to_vec();
        for _ in 0..200 {
            big.extend_from_slice(&[b'y'; 98]);
            big.extend_from_slice(b"\r\n");
        }
        big.extend_from_slice(b".\r\nNOOP\r\n");
        let t = run(&big);
        assert_eq!(&codes(&t)[3..], &[354, 552, 250]);
        let t = run(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: \0\r\n.\r\nMAIL FROM:<a@x>\r\n");
        assert_eq!(&codes(&t)[3..], &[354, 554, 250]);
        assert!(t.submissions.is_empty());
    }

    #[test]
    fn bdat_chunks_make_one_message() {
        let t = run(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 5\r\nA: b\rBDAT 0\r\nBDAT 8 LAST\r\n\n\r\nbody.NOOP\r\n");
        assert_eq!(codes(&t), vec![250, 250, 250, 250, 250, 250, 250]);
        assert_eq!(t.submissions[0].message, b"A: b\r\n\r\nbody.");
        assert!(t.submissions[0].chunked);
        // A chunk without a transaction is read and refused; DATA after BDAT is refused.
        let t = run(b"EHLO c\r\nBDAT 4\r\nxxxxNOOP\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 3\r\nA: DATA\r\n");
        assert_eq!(codes(&t), vec![250, 503, 250, 250, 250, 250, 503]);
    }

    #[test]
    fn too_many_errors_end_the_session() {
        let t = run(&b"FOO\r\n".repeat(10));
        assert_eq!(t.replies.len(), 6);
        assert_eq!(
            t.replies[5],
            "421 4.7.0 Too many errors; closing connection"
        );
        assert!(t.closed);
    }

    #[test]
    fn shutdown_is_immediate_when_idle_and_waits_for_a_message() {
        let mut s = session();
        let out = s.begin_shutdown();
        assert_eq!(
            out,
            vec![Output::Reply(Reply::shutting_down()), Output::Close]
        );

        let mut s = session();
        let mut t = Transcript::default();
        let out = s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n");
        absorb(&mut s, out, &mut t);
        assert!(s.begin_shutdown().is_empty());
        let out = s.feed(b"\r\nbody\r\n.\r\n");
        absorb(&mut s, out, &mut t);
        assert_eq!(t.submissions.len(), 1);
        assert_eq!(&codes(&t)[4..], &[250, 421]);
        assert!(t.closed);
    }

    #[test]
    fn replies_wait_for_intake() {
        let mut s = session();
        let out =
            s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n.\r\nNOOP\r\n");
        assert!(matches!(out.last(), Some(Output::Submit(_))));
        // Pipelined NOOP is held until the end-of-data reply is known.
        assert!(s.feed(b"NOOP\r\n").is_empty());
        let out = s.submission_done(Reply::queued("X"));
        assert_eq!(
            out,
            vec![
                Output::Reply(Reply::queued("X")),
                Output::Reply(Reply::ok()),
                Output::Reply(Reply::ok())
            ]
        );
    }

    #[test]
    fn too_many_recipients_is_not_a_session_error() {
        let mut input = b"EHLO c\r\nMAIL FROM:<a@x>\r\n".to_vec();
        for i in 0..20 {
            input.extend_from_slice(format!("RCPT TO:<r{i}@x>\r\n").as_bytes());
        }
        input.extend_from_slice(b"DATA\r\nA: b\r\n.\r\n");
        let t = run(&input);
        assert!(!t.closed);
        assert_eq!(t.submissions[0].envelope.rcpt_to.len(), 3);
        assert_eq!(
            t.replies
                .iter()
                .filter(|r| r.starts_with("452 4.5.3"))
                .count(),
            17
        );
    }

    #[test]
    fn overflowing_numbers_are_refused_not_misread() {
        let t = run(b"EHLO c\r\nMAIL FROM:<a@x> SIZE=99999999999999999999999\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 999999999999999999995 LAST\r\nNOOP\r\n");
        assert!(t.replies[1].starts_with("552 5.3.4"), "{t:?}");
        assert!(t.replies[4].starts_with("501 5.5.4"), "{t:?}");
        assert_eq!(codes(&t)[5], 250);
        assert!(t.submissions.is_empty());
    }

    #[test]
    fn non_ascii_addresses_need_smtputf8() {
        let t = run("EHLO c\r\nMAIL FROM:<jös@x>\r\nMAIL FROM:<a@x>\r\nRCPT TO:<ö@x>\r\nRSET\r\nMAIL FROM:<jös@x> SMTPUTF8\r\nRCPT TO:<ö@x>\r\n".as_bytes());
        assert_eq!(codes(&t), vec![250, 553, 250, 553, 250, 250, 250]);
        assert!(t.replies[1].starts_with("553 5.6.7"));
    }

    #[test]
    fn a_bdat_transaction_may_finish_during_shutdown() {
        let mut s = session();
        let mut t = Transcript::default();
        let out = s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 6\r\nA: b\r\n");
        absorb(&mut s, out, &mut t);
        assert!(s.begin_shutdown().is_empty());
        let out = s.feed(b"BDAT 4 LAST\r\nbody");
        absorb(&mut s, out, &mut t);
        assert_eq!(t.submissions.len(), 1);
        assert_eq!(t.submissions[0].message, b"A: b\r\nbody");
        assert_eq!(&codes(&t)[4..], &[250, 421]);
        assert!(t.closed);
    }

    #[test]
    fn a_refused_message_during_shutdown_ends_the_session() {
        let mut s = session();
        let mut t = Transcript::default();
        let out = s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: \0\r\n");
        absorb(&mut s, out, &mut t);
        assert!(s.begin_shutdown().is_empty());
        let out = s.feed(b".\r\n");
        absorb(&mut s, out, &mut t);
        assert_eq!(&codes(&t)[4..], &[554, 421]);
        assert!(t.closed);
    }

    fn tls_session(starttls: bool, may_submit: bool) -> Session {
        Session::new(
            Arc::new(SessionConfig {
                hostname: "relay.test".into(),
                starttls,
                require_tls: true,
                auth: true,
                max_auth_failures: 2,
                ..SessionConfig::default()
            }),
            may_submit,
        )
    }

    fn run_on(mut s: Session, input: &[u8]) -> (Session, Transcript) {
        let mut t = Transcript::default();
        let out = s.feed(input);
        absorb(&mut s, out, &mut t);
        (s, t)
    }

    // "good\0good\0pw" and "good\0good\0bad" in base64.
    const GOOD: &str = "Z29vZABnb29kAHB3";
    const BAD: &str = "Z29vZABnb29kAGJhZA==";

    #[test]
    fn starttls_listener_needs_tls_before_mail_and_auth() {
        let (_, t) = run_on(
            tls_session(true, false),
            format!("EHLO c\r\nMAIL FROM:<a@x>\r\nAUTH PLAIN {GOOD}\r\n").as_bytes(),
        );
        assert!(t.replies[0].contains("STARTTLS"));
        assert_eq!(
            t.replies[1],
            "530 5.7.0 Must issue a STARTTLS command first"
        );
        assert_eq!(
            t.replies[2],
            "538 5.7.11 Encryption required for requested authentication mechanism"
        );
    }

    #[test]
    fn plaintext_pipelined_after_starttls_is_discarded() {
        let (s, t) = run_on(
            tls_session(true, false),
            format!("EHLO c\r\nSTARTTLS\r\nAUTH PLAIN {GOOD}\r\nMAIL FROM:<a@x>\r\n").as_bytes(),
        );
        assert_eq!(t.starttls, 1);
        assert_eq!(t.replies.len(), 2, "{t:?}");
        assert_eq!(t.replies[1], "220 2.0.0 Ready to start TLS");
        assert!(s.authenticated().is_none());
        // After the handshake, EHLO must be sent again; AUTH is now offered.
        let (_, t) = run_on(s, b"MAIL FROM:<a@x>\r\nEHLO c\r\n");
        assert!(t.replies[0].starts_with("503 5.5.1"));
        assert!(t.replies[1].contains("AUTH PLAIN LOGIN"));
        assert!(!t.replies[1].contains("STARTTLS"));
    }

    #[test]
    fn auth_plain_and_login_then_submission_under_the_user_scope() {
        let s = Session::new_tls(tls_session(false, false).config.clone(), false);
        let (s, t) = run_on(
            s,
            format!("EHLO c\r\nAUTH PLAIN {GOOD}\r\nMAIL FROM:<x@other.example>\r\nMAIL FROM:<me@allowed.example>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n.\r\n").as_bytes(),
        );
        assert_eq!(&codes(&t)[1..], &[235, 550, 250, 250, 354, 250]);
        assert_eq!(
            t.replies[2],
            "550 5.7.1 Sender address not allowed for this user"
        );
        assert_eq!(t.submissions[0].auth_scope.as_deref(), Some("scope-good"));
        assert!(t.submissions[0].tls);
        assert_eq!(s.authenticated().unwrap().name, "good");

        // LOGIN: two challenges, then the same outcome.
        let s = Session::new_tls(tls_session(false, false).config.clone(), false);
        let (_, t) = run_on(s, b"EHLO c\r\nAUTH LOGIN\r\nZ29vZA==\r\ncHc=\r\n");
        assert_eq!(
            &t.replies[1..],
            &[
                "334 VXNlcm5hbWU6",
                "334 UGFzc3dvcmQ6",
                "235 2.7.0 Authentication successful"
            ]
        );
    }

    #[test]
    fn auth_failures_then_421() {
        let s = Session::new_tls(tls_session(false, false).config.clone(), false);
        let (_, t) = run_on(
            s,
            format!("EHLO c\r\nAUTH PLAIN {BAD}\r\nAUTH PLAIN !!!\r\nAUTH PLAIN\r\n*\r\nAUTH PLAIN {BAD}\r\nNOOP\r\n").as_bytes(),
        );
        assert_eq!(t.replies[1], "535 5.7.8 Authentication credentials invalid");
        assert!(t.replies[2].starts_with("501 5.5.2"));
        assert_eq!(t.replies[3], "334 ");
        assert_eq!(t.replies[4], "501 5.7.0 Authentication cancelled");
        assert_eq!(
            t.replies[5],
            "421 4.7.0 Too many authentication failures; closing connection"
        );
        assert!(t.closed);
    }

    #[test]
    fn without_auth_configured_mail_needs_the_allow_list() {
        let t = run(b"EHLO c\r\nAUTH PLAIN Z29vZABnb29kAHB3\r\nSTARTTLS\r\n");
        assert!(!t.replies[0].contains("AUTH"));
        assert!(t.replies[1].starts_with("502 5.5.1"));
        assert!(t.replies[2].starts_with("502 5.5.1"));
    }

    fn script() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            "[ -~]{0,40}",
            "\\.[ -~]{0,10}",
            Just(".".to_string()),
            Just("..".to_string()),
        ];
        (
            proptest::collection::vec(line, 0..12),
            proptest::collection::vec(any::<u8>(), 0..40),
            any::<bool>(),
        )
            .prop_map(|(lines, chunk, bdat_after)| {
                let mut s = b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nSubject: p\r\n"
                    .to_vec();
                for l in &lines {
                    if l.starts_with('.') {
                        s.push(b'.');
                    }
                    s.extend_from_slice(l.as_bytes());
                    s.extend_from_slice(b"\r\n");
                }
                s.extend_from_slice(b".\r\nNOOP\r\n");
                if bdat_after {
                    s.extend_from_slice(b"MAIL FROM:<a@x>\r\nRCPT TO:<c@x>\r\n");
                    s.extend_from_slice(format!("BDAT {} LAST\r\n", chunk.len()).as_bytes());
                    s.extend_from_slice(&chunk);
                }
                s.extend_from_slice(b"RSET\r\nQUIT\r\n");
                s
            })
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_replies_and_messages(
            input in script(),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..12),
        ) {
            let whole = run(&input);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
            points.sort_unstable();
            points.dedup();
            let mut chunks = Vec::new();
            let mut start = 0;
            for p in points {
                chunks.push(&input[start..p]);
                start = p;
            }
            chunks.push(&input[start..]);
            prop_assert_eq!(run_chunks(&chunks), whole);
        }

        #[test]
        fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..600)) {
            let t = run(&input);
            for sub in &t.submissions {
                prop_assert!(!sub.message.windows(2).any(|w| w[0] == b'\r' && w[1] != b'\n'));
            }
        }
    }
}
