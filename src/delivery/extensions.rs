//! What the upstream offers beyond what lettre tracks (DSN, REQUIRETLS), and the MAIL and RCPT
//! lines that follow from it and from the client's requests (docs/concepts/delivery.md). Pure.
//!
//! lettre's `ServerInfo` keeps only the EHLO keywords it knows and drops DSN and REQUIRETLS,
//! so the client learns them from an EHLO of its own, parsed here.

use super::outcome::{Outcome, Phase};
use crate::mail::DeliveryRequests;

/// The EHLO keywords delivery acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Offered {
    /// RFC 3461: RET, ENVID, NOTIFY and ORCPT may be passed on.
    pub dsn: bool,
    /// RFC 8689.
    pub requiretls: bool,
}

impl Offered {
    /// From the text lines of a 250 reply to EHLO (without their codes): the first line is the
    /// server's name and greeting, each further line a keyword and its parameters.
    pub(crate) fn from_ehlo<'a>(lines: impl IntoIterator<Item = &'a str>) -> Offered {
        let mut offered = Offered::default();
        for line in lines.into_iter().skip(1) {
            let keyword = line.split_ascii_whitespace().next().unwrap_or("");
            if keyword.eq_ignore_ascii_case("DSN") {
                offered.dsn = true;
            } else if keyword.eq_ignore_ascii_case("REQUIRETLS") {
                offered.requiretls = true;
            }
        }
        offered
    }
}

/// Whether a message needs to know what the upstream offers. Only then does the client spend
/// a round trip on its own EHLO: ordinary mail (no DSN parameter, no REQUIRETLS) is sent as
/// it always was. A NOTIFY=SUCCESS is a DSN parameter, so a message that may need a "relayed"
/// notice learns whether the upstream takes that duty.
pub(crate) fn needs_extensions(requests: &DeliveryRequests) -> bool {
    requests.require_tls || requests.has_dsn_parameters()
}

/// RFC 8689 §5's reply for a REQUIRETLS message the upstream cannot take as asked.
pub(crate) const REQUIRETLS_REFUSED: &str = "550 5.7.30 REQUIRETLS support required";

/// The outcome of an attempt that ended on [`requiretls_refusal`]: permanent, in the EHLO
/// phase (where nothing else is permanent: the upstream's own 5xx there is retried).
pub(crate) fn requiretls_refused(reply: &str) -> Outcome {
    Outcome::Permanent {
        phase: Phase::Ehlo,
        code: 550,
        reply: reply.into(),
    }
}

/// Whether an outcome is the relay's own REQUIRETLS refusal rather than the upstream's word.
pub(crate) fn is_requiretls_refusal(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Permanent { phase: Phase::Ehlo, reply, .. } if reply == REQUIRETLS_REFUSED)
}

/// Why a REQUIRETLS message may not go to this upstream (RFC 8689 §4.2.1): the session is not
/// under TLS (with a verified certificate: the client never skips verification), or the
/// upstream does not offer REQUIRETLS. `None` when it may go, or did not ask.
pub(crate) fn requiretls_refusal(
    requests: &DeliveryRequests,
    encrypted: bool,
    offered: Option<Offered>,
) -> Option<&'static str> {
    if !requests.require_tls {
        return None;
    }
    let ok = encrypted && offered.is_some_and(|o| o.requiretls);
    (!ok).then_some(REQUIRETLS_REFUSED)
}

/// The MAIL FROM command: the envelope sender as accepted, its body type, and the client's
/// requests when the upstream offers them (values exactly as the client sent them). Without
/// DSN upstream, RET and ENVID stay here: the relay itself takes over the duty they ask for.
pub(crate) fn mail_command(
    mail_from: &str,
    eight_bit: bool,
    smtputf8: bool,
    requests: &DeliveryRequests,
    offered: Option<Offered>,
) -> String {
    let mut mail = format!("MAIL FROM:<{mail_from}>");
    if eight_bit {
        mail.push_str(" BODY=8BITMIME");
    }
    if smtputf8 {
        mail.push_str(" SMTPUTF8");
    }
    let offered = offered.unwrap_or_default();
    if offered.dsn {
        if let Some(ret) = &requests.ret {
            mail.push_str(&format!(" RET={ret}"));
        }
        if let Some(envid) = &requests.envid {
            mail.push_str(&format!(" ENVID={envid}"));
        }
    }
    // Only reached with REQUIRETLS offered (`requiretls_refusal` ends the attempt otherwise).
    if requests.require_tls && offered.requiretls {
        mail.push_str(" REQUIRETLS");
    }
    mail
}

/// One RCPT TO command, with the recipient's NOTIFY and ORCPT when the upstream offers DSN.
pub(crate) fn rcpt_command(
    rcpt: &str,
    requests: &DeliveryRequests,
    offered: Option<Offered>,
) -> String {
    let mut line = format!("RCPT TO:<{rcpt}>");
    if offered.is_some_and(|o| o.dsn) {
        if let Some(r) = requests.recipients.get(rcpt) {
            if let Some(notify) = &r.notify {
                line.push_str(&format!(" NOTIFY={notify}"));
            }
            if let Some(orcpt) = &r.orcpt {
                line.push_str(&format!(" ORCPT={orcpt}"));
            }
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::requests::RecipientRequests;

    #[test]
    fn ehlo_keywords() {
        let cases: &[(&[&str], Offered)] = &[
            (&["up greets relay"], Offered::default()),
            (
                &["up", "PIPELINING", "DSN", "SIZE 100"],
                Offered {
                    dsn: true,
                    requiretls: false,
                },
            ),
            (
                &["up", "dsn", "requiretls"],
                Offered {
                    dsn: true,
                    requiretls: true,
                },
            ),
            // The greeting line names the server; a server called DSN offers nothing.
            (&["DSN"], Offered::default()),
            // Keywords are whole words.
            (
                &["up", "DSNX", "X-REQUIRETLS", "AUTH DSN"],
                Offered::default(),
            ),
            (
                &["up", "  REQUIRETLS  "],
                Offered {
                    dsn: false,
                    requiretls: true,
                },
            ),
            (&[], Offered::default()),
        ];
        for (lines, want) in cases {
            assert_eq!(
                Offered::from_ehlo(lines.iter().copied()),
                *want,
                "{lines:?}"
            );
        }
    }

    fn requests() -> DeliveryRequests {
        let mut r = DeliveryRequests {
            ret: Some("hdrs".into()),
            envid: Some("QQ+2B314".into()),
            ..Default::default()
        };
        r.recipients.insert(
            "b@x".into(),
            RecipientRequests {
                notify: Some("success,Failure".into()),
                orcpt: Some("rfc822;b+2Bx@x".into()),
            },
        );
        r
    }

    const DSN: Offered = Offered {
        dsn: true,
        requiretls: false,
    };

    #[test]
    fn command_lines() {
        let r = requests();
        assert_eq!(
            mail_command("a@x", true, false, &r, Some(DSN)),
            "MAIL FROM:<a@x> BODY=8BITMIME RET=hdrs ENVID=QQ+2B314"
        );
        assert_eq!(
            mail_command("a@x", false, true, &r, Some(Offered::default())),
            "MAIL FROM:<a@x> SMTPUTF8"
        );
        assert_eq!(
            mail_command("a@x", false, false, &r, None),
            "MAIL FROM:<a@x>"
        );
        assert_eq!(
            rcpt_command("b@x", &r, Some(DSN)),
            "RCPT TO:<b@x> NOTIFY=success,Failure ORCPT=rfc822;b+2Bx@x"
        );
        assert_eq!(rcpt_command("c@x", &r, Some(DSN)), "RCPT TO:<c@x>");
        assert_eq!(rcpt_command("b@x", &r, None), "RCPT TO:<b@x>");
        let tls = DeliveryRequests {
            require_tls: true,
            ..Default::default()
        };
        let both = Offered {
            dsn: true,
            requiretls: true,
        };
        assert_eq!(
            mail_command("", false, false, &tls, Some(both)),
            "MAIL FROM:<> REQUIRETLS"
        );
    }

    #[test]
    fn requiretls_needs_tls_and_the_keyword() {
        let tls = DeliveryRequests {
            require_tls: true,
            ..Default::default()
        };
        let offers = Offered {
            dsn: false,
            requiretls: true,
        };
        assert_eq!(requiretls_refusal(&tls, true, Some(offers)), None);
        assert_eq!(
            requiretls_refusal(&tls, false, Some(offers)),
            Some(REQUIRETLS_REFUSED)
        );
        assert_eq!(
            requiretls_refusal(&tls, true, Some(Offered::default())),
            Some(REQUIRETLS_REFUSED)
        );
        assert_eq!(
            requiretls_refusal(&tls, true, None),
            Some(REQUIRETLS_REFUSED)
        );
        assert_eq!(
            requiretls_refusal(&DeliveryRequests::default(), false, None),
            None
        );
        assert!(needs_extensions(&tls));
        assert!(needs_extensions(&requests()));
        assert!(!needs_extensions(&DeliveryRequests::default()));
    }
}
