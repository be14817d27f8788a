//! Command lines: the guards, the dispatch to one function per command, and the commands
//! that change no transaction (HELO/EHLO, RSET, NOOP, QUIT, VRFY, HELP).

use std::borrow::Cow;

use smtp_proto::Request;

use super::guards::{control_in_arguments, overflowing_number, proto_error_reply};
use super::{Answer, Output, Session};
use crate::address;
use idemrelay_model::reply::{EhloLimits, Reply};

impl Session {
    /// Answers one complete command line (CRLF included).
    pub(super) fn command(&mut self, line: &[u8], out: &mut Vec<Output>) {
        match self.answer(line, out) {
            Answer::Reply(reply) => out.push(Output::Reply(reply)),
            Answer::Error(reply) => self.error(out, reply),
            Answer::Done => {}
        }
    }

    fn answer(&mut self, line: &[u8], out: &mut Vec<Output>) -> Answer {
        if let Some(reply) = overflowing_number(line).or_else(|| control_in_arguments(line)) {
            return Answer::Error(reply);
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
        if is("MAIL") {
            self.mail(args, out)
        } else if is("RCPT") {
            self.rcpt(args)
        } else if is("EHLO") || is("HELO") {
            self.hello(args, is("EHLO"))
        } else if is("STARTTLS") && args.iter().any(|&b| b != b' ') {
            // RFC 3207: STARTTLS takes no parameters.
            Answer::Error(Reply::syntax("STARTTLS (no parameters)"))
        } else {
            match Request::parse(&mut line.iter()) {
                Ok(request) => self.request(request, out),
                Err(err) => Answer::Error(proto_error_reply(&err)),
            }
        }
    }

    /// The commands smtp-proto parses.
    fn request(&mut self, request: Request<Cow<'_, str>>, out: &mut Vec<Output>) -> Answer {
        match request {
            Request::Data => self.data(),
            Request::Bdat {
                chunk_size,
                is_last,
            } => self.bdat(chunk_size, is_last),
            Request::Rset => self.rset(),
            Request::Noop { .. } => Answer::Reply(Reply::ok()),
            Request::Quit => self.quit(out),
            Request::Vrfy { .. } => Answer::Reply(Reply::cannot_vrfy()),
            Request::StartTls => self.starttls(out),
            Request::Auth {
                mechanism,
                initial_response,
            } => self.auth(mechanism, &initial_response, out),
            Request::Help { .. } => Answer::Reply(Reply::help()),
            other => Answer::Error(Reply::not_implemented(other.name())),
        }
    }

    /// `args` is what follows the verb: SP and the client's name; anything after the name
    /// is ignored, as most servers do.
    fn hello(&mut self, args: &[u8], esmtp: bool) -> Answer {
        let name = args.strip_prefix(b" ").and_then(|a| {
            a.split(|&b| b == b' ' || b == b'\t')
                .find(|w| !w.is_empty())
        });
        let Some(name) = name else {
            return Answer::Error(Reply::syntax(if esmtp {
                "EHLO domain"
            } else {
                "HELO domain"
            }));
        };
        // Only an ASCII domain or address literal reaches the Received: line (docs/guides/tls-auth-relay.md).
        let Some(host) = std::str::from_utf8(name)
            .ok()
            .filter(|h| address::is_helo_name(h))
        else {
            return Answer::Error(Reply::bad_helo_name());
        };
        self.txn = None;
        self.helo = Some((host.to_string(), esmtp));
        Answer::Reply(if esmtp {
            let limits = EhloLimits {
                max_size: self.config.max_message_size,
                max_transactions: self.config.max_transactions,
                max_recipients: self.config.max_recipients,
            };
            let mut reply = Reply::ehlo(&self.config.hostname, host, &limits);
            if self.config.starttls && !self.tls {
                reply.lines.push("STARTTLS".into());
            }
            // RFC 8689 §2: offered only on a session under TLS.
            if self.tls {
                reply.lines.push("REQUIRETLS".into());
            }
            if self.auth_offered() {
                reply.lines.push("AUTH PLAIN LOGIN".into());
            }
            reply
        } else {
            Reply::helo(&self.config.hostname, host)
        })
    }

    fn rset(&mut self) -> Answer {
        self.txn = None;
        Answer::Reply(Reply::reset_ok())
    }

    fn quit(&mut self, out: &mut Vec<Output>) -> Answer {
        self.close_with(out, Reply::bye());
        Answer::Done
    }
}
