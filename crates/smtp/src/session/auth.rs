//! Who the client is and how it is reached: STARTTLS, AUTH and its SASL exchange, and the
//! server's answers to both (the handshake, the credential check).

use smtp_proto::{AUTH_LOGIN, AUTH_PLAIN};

use super::{Answer, Mode, Output, Progress, Session};
use crate::framing::{next_piece, Piece};
use crate::sasl::{Mechanism as SaslMechanism, SaslExchange, SaslStep};
use idemrelay_model::reply::Reply;
use idemrelay_model::Authenticated;

impl Session {
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
    pub(super) fn auth_offered(&self) -> bool {
        self.config.auth && (self.tls || (!self.config.require_tls && self.may_submit))
    }

    pub(super) fn starttls(&mut self, out: &mut Vec<Output>) -> Answer {
        if !self.config.starttls {
            return Answer::Error(Reply::not_implemented("STARTTLS"));
        }
        if self.tls {
            return Answer::Error(Reply::tls_already_active());
        }
        out.push(Output::Reply(Reply::ready_for_tls()));
        out.push(Output::StartTls);
        // Anything pipelined after STARTTLS arrived in plaintext: it must not be obeyed
        // once encrypted (the CVE-2011-0411 class). The buffer is dropped in tls_started.
        self.mode = Mode::AwaitingTls;
        Answer::Done
    }

    pub(super) fn auth(&mut self, mechanism: u64, initial: &str, out: &mut Vec<Output>) -> Answer {
        if !self.config.auth {
            return Answer::Error(Reply::not_implemented("AUTH"));
        }
        if !self.auth_offered() {
            return Answer::Error(Reply::encryption_required_for_auth());
        }
        if self.user.is_some() {
            return Answer::Error(Reply::already_authenticated());
        }
        if self.txn.is_some() {
            return Answer::Error(Reply::auth_during_transaction());
        }
        let mechanism = if mechanism == AUTH_PLAIN {
            SaslMechanism::Plain
        } else if mechanism == AUTH_LOGIN {
            SaslMechanism::Login
        } else {
            return Answer::Error(Reply::unsupported_mechanism());
        };
        let initial = (!initial.is_empty()).then_some(initial);
        let (exchange, step) = SaslExchange::start(mechanism, initial);
        self.mode = Mode::Sasl(exchange);
        self.sasl_step(step, out);
        Answer::Done
    }

    /// The client's response line in a SASL exchange.
    pub(super) fn sasl_input(&mut self, rest: &[u8], out: &mut Vec<Output>) -> Progress {
        match next_piece(rest, self.config.max_command_line) {
            Piece::NeedMore => Progress::Stalled(0),
            Piece::BareLineEnding => {
                self.close_with(out, Reply::bare_line_ending());
                Progress::Stalled(0)
            }
            // Nothing taken: the discarding mode reads the line from its start.
            Piece::Partial(_) => {
                self.mode = Mode::DiscardingLongLine;
                Progress::Consumed(0)
            }
            Piece::Line(n) if n > self.config.max_command_line => {
                self.mode = Mode::Command;
                self.error(out, Reply::line_too_long());
                Progress::Consumed(n)
            }
            Piece::Line(n) => {
                let Mode::Sasl(exchange) = &mut self.mode else {
                    unreachable!("sasl_input runs in Sasl mode")
                };
                let line = String::from_utf8_lossy(&rest[..n - 2]);
                let step = exchange.next(&line);
                self.sasl_step(step, out);
                Progress::Consumed(n)
            }
        }
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
}
