//! One mail transaction: MAIL opens it, RCPT adds recipients, DATA or BDAT chunks carry the
//! message, and the finished message goes to intake as a `Submission`.

use super::guards::{has_control_chars, line_error_reply};
use super::{Answer, Mode, Output, Progress, Session, Transaction};
use crate::address;
use crate::framing::{BodyFault, BodyLimits, BodyReceiver, BodyStatus};
use crate::mail_rcpt::{self, ParamError, Verb};
use idemrelay_model::mail::requests::RecipientRequests;
use idemrelay_model::mail::{
    merge_same_mailbox, same_mailbox, BodyType, DeliveryRequests, Envelope, Submission,
};
use idemrelay_model::reply::Reply;

impl Session {
    pub(super) fn mail(&mut self, args: &[u8], out: &mut Vec<Output>) -> Answer {
        let command = match mail_rcpt::parse(Verb::Mail, args) {
            Ok(command) => command,
            Err(e) => {
                return Answer::Error(line_error_reply(
                    e,
                    "MAIL FROM:<reverse-path> [parameters]",
                    Reply::bad_sender_address,
                ))
            }
        };
        // A malformed parameter is a syntax error, answered before the session's state is
        // looked at; an unimplemented one only once the path has been judged.
        let params = match mail_rcpt::mail_params(&command.params) {
            Ok(params) => Ok(params),
            Err(ParamError::Invalid(param)) => {
                return Answer::Error(Reply::syntax(&format!("invalid {param}")))
            }
            Err(ParamError::Malformed(usage)) => return Answer::Error(Reply::syntax(usage)),
            Err(ParamError::Unsupported(param)) => Err(param),
        };
        if self.helo.is_none() {
            return Answer::Error(Reply::need_helo());
        }
        if self.config.require_tls && !self.tls {
            return Answer::Error(Reply::starttls_first());
        }
        if !self.may_submit && self.user.is_none() {
            return Answer::Error(Reply::auth_required());
        }
        if self.txn.is_some() {
            return Answer::Error(Reply::nested_mail());
        }
        // RFC 9422 MAILMAX, as advertised: the client opens a new session for the rest.
        if self.transactions >= self.config.max_transactions {
            self.close_with(out, Reply::too_many_transactions());
            return Answer::Done;
        }
        let smtputf8 = params.as_ref().is_ok_and(|p| p.smtputf8);
        let path = command.path;
        if has_control_chars(path) {
            return Answer::Error(Reply::bad_characters());
        }
        if !smtputf8 && !path.is_ascii() {
            return Answer::Error(Reply::non_ascii_address());
        }
        let Some(mailbox) = address::reverse_path(path, smtputf8) else {
            return Answer::Error(Reply::bad_sender_address());
        };
        if let Some(user) = &self.user {
            if !user.may_send_as(mailbox) {
                return Answer::Error(Reply::sender_not_allowed());
            }
        }
        let params = match params {
            Ok(params) => params,
            Err(param) => return Answer::Error(Reply::unsupported_parameter(&param)),
        };
        // RFC 8689: REQUIRETLS only over TLS (it is advertised only there).
        if params.require_tls && !self.tls {
            return Answer::Error(Reply::requiretls_needs_tls());
        }
        if params
            .size
            .as_deref()
            .is_some_and(|size| mail_rcpt::size_exceeds(size, self.config.max_message_size))
        {
            return Answer::Error(Reply::message_too_big());
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
            requests: DeliveryRequests {
                ret: params.ret,
                envid: params.envid,
                require_tls: params.require_tls,
                recipients: Default::default(),
            },
            bdat: None,
        });
        self.transactions += 1;
        Answer::Reply(Reply::sender_ok())
    }

    pub(super) fn rcpt(&mut self, args: &[u8]) -> Answer {
        let command = match mail_rcpt::parse(Verb::Rcpt, args) {
            Ok(command) => command,
            Err(e) => {
                return Answer::Error(line_error_reply(
                    e,
                    "RCPT TO:<forward-path> [parameters]",
                    Reply::bad_recipient_address,
                ))
            }
        };
        // A malformed parameter is a syntax error, answered before the session's state is
        // looked at (as at MAIL); an unimplemented one only once the path has been judged.
        let params = match mail_rcpt::rcpt_params(&command.params) {
            Ok(params) => Ok(params),
            Err(ParamError::Malformed(usage) | ParamError::Invalid(usage)) => {
                return Answer::Error(Reply::syntax(usage))
            }
            Err(ParamError::Unsupported(param)) => Err(param),
        };
        let max = self.config.max_recipients;
        let Some(txn) = self.txn.as_mut() else {
            return Answer::Error(Reply::need_mail());
        };
        let path = command.path;
        if has_control_chars(path) {
            return Answer::Error(Reply::bad_characters());
        }
        if !txn.smtputf8 && !path.is_ascii() {
            return Answer::Error(Reply::non_ascii_address());
        }
        let Some(mailbox) = address::forward_path(path, txn.smtputf8) else {
            return Answer::Error(Reply::bad_recipient_address());
        };
        let params = match params {
            Ok(params) => params,
            Err(param) => return Answer::Error(Reply::unsupported_parameter(&param)),
        };
        // A mailbox already named (its domain perhaps in another case): 250, as Postfix
        // answers, but one recipient, not counted again towards the limit. The first RCPT's
        // NOTIFY and ORCPT stay, under whichever spelling the envelope keeps.
        if let Some(i) = txn.rcpt_to.iter().position(|r| same_mailbox(r, mailbox)) {
            let before = txn.rcpt_to[i].clone();
            merge_same_mailbox(&mut txn.rcpt_to, mailbox);
            if txn.rcpt_to[i] != before {
                if let Some(first) = txn.requests.recipients.remove(&before) {
                    txn.requests
                        .recipients
                        .insert(txn.rcpt_to[i].clone(), first);
                }
            }
            return Answer::Reply(Reply::recipient_ok());
        }
        if txn.rcpt_to.len() >= max {
            // Not a client error: RFC 5321 §4.5.3.1.10 has the client send the rest later.
            return Answer::Reply(Reply::too_many_recipients());
        }
        if params.notify.is_some() || params.orcpt.is_some() {
            txn.requests.recipients.insert(
                mailbox.to_string(),
                RecipientRequests {
                    notify: params.notify,
                    orcpt: params.orcpt,
                },
            );
        }
        txn.rcpt_to.push(mailbox.to_string());
        Answer::Reply(Reply::recipient_ok())
    }

    pub(super) fn data(&mut self) -> Answer {
        let limits = self.body_limits();
        let Some(txn) = self.txn.as_ref() else {
            return Answer::Error(Reply::need_mail());
        };
        if txn.bdat.is_some() {
            return Answer::Error(Reply::mixed_data_bdat());
        }
        if txn.rcpt_to.is_empty() {
            return Answer::Error(Reply::no_valid_recipients());
        }
        self.mode = Mode::Data(BodyReceiver::new(limits));
        Answer::Reply(Reply::start_data())
    }

    /// The chunk is always read, even when refused, so the session stays in step with the
    /// client; the reply comes once it has been read.
    pub(super) fn bdat(&mut self, size: usize, last: bool) -> Answer {
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
        Answer::Done
    }

    /// The bytes of a BDAT chunk; at its end, the chunk's reply (or the message's).
    pub(super) fn bdat_input(&mut self, rest: &[u8], out: &mut Vec<Output>) -> Progress {
        let Mode::BdatChunk {
            remaining,
            size,
            last,
            reject,
        } = &mut self.mode
        else {
            unreachable!("bdat_input runs in BdatChunk mode")
        };
        let take = (*remaining).min(rest.len());
        let chunk = &rest[..take];
        *remaining -= take;
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
                return Progress::Stalled(take);
            }
        }
        if !done {
            if let Mode::BdatChunk { reject: r, .. } = &mut self.mode {
                *r = reject;
            }
            return Progress::Stalled(take);
        }
        self.mode = Mode::Command;
        if let Some(reply) = reject {
            self.error(out, reply);
        } else if last {
            let rx = self
                .txn
                .as_mut()
                .and_then(|t| t.bdat.take())
                .expect("a last chunk ends an accepted BDAT transaction");
            self.finish_message(rx, true, out);
        } else if self.bdat_fault() == Some(BodyFault::TooBig) {
            // RFC 3030: a failed chunk fails the transaction.
            self.txn = None;
            out.push(Output::Reply(Reply::message_too_big()));
        } else {
            out.push(Output::Reply(Reply::chunk_ok(size)));
        }
        Progress::Consumed(take)
    }

    /// The end of a message: refused for a fault found while reading it, or handed to intake
    /// (the session then waits for `submission_done`).
    pub(super) fn finish_message(
        &mut self,
        rx: BodyReceiver,
        chunked: bool,
        out: &mut Vec<Output>,
    ) {
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
                requests: txn.requests,
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
}
