//! Checks on a command line before its parser sees it, and the replies for what the parsers
//! refused. Pure functions of the line.

use smtp_proto::Error as ProtoError;

use crate::mail_rcpt::LineError;
use idemrelay_model::reply::Reply;

pub(super) fn has_control_chars(s: &str) -> bool {
    s.chars().any(|c| c.is_control())
}

/// smtp-proto 0.2 turns an overflowing number into its last digit (`...99995` reads as 5),
/// which would let BDAT framing disagree with the client's; such numbers are refused here.
/// (MAIL's SIZE is read by `mail_rcpt`, which has no such limit.)
pub(super) fn overflowing_number(line: &[u8]) -> Option<Reply> {
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
pub(super) fn line_error_reply(error: LineError, usage: &str, bad_address: fn() -> Reply) -> Reply {
    match error {
        LineError::Syntax => Reply::syntax(usage),
        LineError::NotUtf8 => bad_address(),
        LineError::BadParameter(param) => Reply::syntax(&format!("invalid {param}")),
        LineError::Duplicate(param) => Reply::duplicate_parameter(&param),
    }
}

/// Control characters in a name or address are refused as such, before smtp-proto's parser
/// would call them a syntax error of another kind.
pub(super) fn control_in_arguments(line: &[u8]) -> Option<Reply> {
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

pub(super) fn proto_error_reply(err: &ProtoError) -> Reply {
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
    fn only_bdat_sizes_that_overflow_are_refused() {
        let table: &[(&[u8], bool)] = &[
            (b"BDAT 999999999999999999995 LAST\r\n", true),
            (b"bdat 99999999999999999999999\r\n", true),
            (b"BDAT 4294967295\r\n", false),
            (b"BDAT 5 LAST\r\n", false),
            // Not a number at all: smtp-proto's parser refuses it with its own reply.
            (b"BDAT x\r\n", false),
            (b"BDAT\r\n", false),
            // Only BDAT: MAIL's SIZE is read by `mail_rcpt`.
            (b"MAIL FROM:<a@x> SIZE=99999999999999999999999\r\n", false),
            (b"NOOP 99999999999999999999999\r\n", false),
        ];
        for &(line, refused) in table {
            let got = overflowing_number(line);
            assert_eq!(
                got.is_some(),
                refused,
                "{:?}",
                String::from_utf8_lossy(line)
            );
            if let Some(reply) = got {
                assert!(reply.line().starts_with("501 5.5.4"), "{reply:?}");
            }
        }
    }

    #[test]
    fn control_characters_are_refused_in_names_and_addresses_only() {
        let table: &[(&[u8], bool)] = &[
            (b"HELO a\x01b\r\n", true),
            (b"ehlo a\x00\r\n", true),
            (b"MAIL FROM:<a\x7f@x>\r\n", true),
            (b"RCPT TO:<a\x1b@x>\r\n", true),
            // A tab separates parameters; it is not a control character here.
            (b"MAIL FROM:<a@x>\tSIZE=1\r\n", false),
            (b"MAIL FROM:<a@x>\r\n", false),
            // Other commands go to their parser as they are.
            (b"NOOP \x01\r\n", false),
            (b"VRFY a\x7f\r\n", false),
        ];
        for &(line, refused) in table {
            assert_eq!(
                control_in_arguments(line),
                refused.then(Reply::bad_characters),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }
}
