//! RFC 3464 delivery status notification for a permanently failed message (docs/concepts/delivery.md).
//!
//! The DSN is built as bytes from its inputs alone (no clock, no randomness): the relay sends
//! it exactly once under [`dsn_key`], and a retry must carry byte-identical content, so the
//! same input must always give the same message.
//!
//! Everything the relay writes is 7-bit ASCII with CRLF line endings and lines of at most 998
//! octets, whatever the upstream's reply or the original message contained; the only
//! exception is the `To:` header of a sender with a non-ASCII address, who can only be reached
//! over SMTPUTF8 anyway.

use mail_builder::headers::raw::Raw;
use mail_builder::mime::MimePart;
use mail_parser::DateTime;

use super::outcome::{leading_code, reply_line, EnhancedCode};

pub(crate) struct DsnInput<'a> {
    pub reporting_mta: &'a str,
    pub original_id: &'a str,
    pub original_envelope_from: &'a str,
    pub recipients: &'a [String],
    pub phase: &'a str,
    pub remote_code: u16,
    pub remote_reply: &'a str,
    pub arrival_unix: i64,
    pub now_unix: i64,
    /// CRLF bytes, may be large; only its header section is used.
    pub original_message: &'a [u8],
    /// Without `<>`.
    pub dsn_message_id: &'a str,
}

/// Folding aims for this width, as RFC 5322 recommends.
const SOFT_WIDTH: usize = 78;
/// A word longer than this is split across lines; with the longest field name this keeps every
/// line under RFC 5322's hard limit of 998 octets.
const MAX_WORD: usize = 900;
/// A longer upstream reply is cut: the diagnostic is for a person, not an archive.
const MAX_REPLY: usize = 4000;
/// The returned header section is cut (at a field boundary) beyond this, so a message without a
/// header/body separator cannot make the DSN as large as itself.
const MAX_HEADERS: usize = 64 * 1024;
/// RFC 2045 limit for quoted-printable lines, excluding the soft-break `=`.
const QP_WIDTH: usize = 75;

/// The complete DSN message (CRLF line endings): headers, then a multipart/report with a
/// human-readable explanation (never quoting the body), the message/delivery-status report and
/// the original's header section as text/rfc822-headers.
pub(crate) fn build_dsn(input: &DsnInput<'_>) -> Vec<u8> {
    let human = human_part(input);
    let report = delivery_status_part(input);
    let original = OriginalHeaders::from_message(input.original_message);
    let boundary = pick_boundary(
        input.dsn_message_id,
        &[human.as_bytes(), report.as_bytes(), &original.body],
    );

    let mta = clean(input.reporting_mta);
    let mut out = String::new();
    out += &fold("From", &format!("MAILER-DAEMON@{mta}"));
    out += &fold(
        "To",
        &format!("<{}>", clean_keep_utf8(input.original_envelope_from)),
    );
    out += &fold("Subject", "Undelivered Mail Returned to Sender");
    out += &fold("Date", &rfc822_date(input.now_unix));
    out += &fold(
        "Message-ID",
        &format!("<{}>", message_id(input.dsn_message_id)),
    );
    out += &fold("Auto-Submitted", "auto-replied");
    out += &fold("MIME-Version", "1.0");
    let mut bytes = out.into_bytes();
    // Every part is 7-bit already (or quoted-printable, for the original's headers) and says
    // so: the crate then writes it as is, and the boundary is ours, so the DSN stays
    // deterministic.
    MimePart::raw(vec![
        leaf(
            "text/plain; charset=us-ascii",
            "7bit",
            "Notification",
            human.as_bytes(),
        ),
        leaf(
            "message/delivery-status",
            "7bit",
            "Delivery report",
            report.as_bytes(),
        ),
        leaf(
            original.content_type,
            original.transfer_encoding,
            "Undelivered message headers",
            &original.body,
        ),
    ])
    .header(
        "Content-Type",
        Raw::new(format!(
            "multipart/report; report-type=delivery-status; boundary=\"{boundary}\""
        )),
    )
    .write_part(&mut bytes);
    bytes
}

/// One part of the report, written verbatim under its headers.
fn leaf<'a>(
    content_type: &'a str,
    transfer_encoding: &'a str,
    description: &'a str,
    body: &'a [u8],
) -> MimePart<'a> {
    MimePart::raw(body)
        .header("Content-Type", Raw::new(content_type))
        .header("Content-Description", Raw::new(description))
        .transfer_encoding(transfer_encoding)
}

/// The idempotency key of the DSN for a message key: deterministic, so the DSN is itself sent
/// once. Length-prefixed fields under a derive-key context keep ("a", "bc") and ("ab", "c")
/// apart, and keep these keys apart from every other blake3 use in the relay.
pub(crate) fn dsn_key(scope: &str, original_key: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key("idemrelay 2025 dsn idempotency key v1");
    for field in [scope, original_key] {
        h.update(&(field.len() as u64).to_le_bytes());
        h.update(field.as_bytes());
    }
    format!("dsn-{}", &h.finalize().to_hex()[..40])
}

/// The RFC 3464 status for the report: the reply's own 5.x.x enhanced code when it has one;
/// else 5.0.0 for a 5xx; else 5.4.7 ("delivery time expired"), since a message that failed on
/// anything but a 5xx failed because the relay stopped retrying.
pub(crate) fn status_code(remote_code: u16, remote_reply: &str) -> String {
    match EnhancedCode::from_reply(remote_reply) {
        Some(e) if e.class == 5 => e.to_string(),
        _ if (500..=599).contains(&remote_code) => "5.0.0".to_string(),
        _ => "5.4.7".to_string(),
    }
}

fn is_reply_code(code: u16) -> bool {
    (200..=599).contains(&code)
}

/// The upstream's answer as one clean line, or an empty string when there was none.
fn diagnostic_text(input: &DsnInput<'_>) -> String {
    let text = clean(input.remote_reply);
    let text = if is_reply_code(input.remote_code) {
        reply_line(input.remote_code, &text)
    } else {
        text
    };
    truncate(&text, MAX_REPLY)
}

fn human_part(input: &DsnInput<'_>) -> String {
    let mta = clean(input.reporting_mta);
    let phase = clean(input.phase).to_ascii_uppercase();
    let diagnostic = diagnostic_text(input);
    let mut out = String::new();
    out += &wrap(&format!("This is the mail delivery system at {mta}."), "");
    out += "\r\n";
    out += "Your message could not be delivered to the following recipients:\r\n\r\n";
    for r in input.recipients {
        out += &wrap(&recipient_for_humans(r), "    ");
    }
    out += "\r\n";
    let why = if (500..=599).contains(&input.remote_code) {
        "The upstream server rejected it permanently, so it will not be tried again."
    } else {
        "Delivery kept failing temporarily until the relay gave up; it will not be tried again."
    };
    out += &wrap(why, "");
    out += "\r\n";
    if diagnostic.is_empty() {
        out += &wrap(
            &format!("No reply was received from the upstream server ({phase})."),
            "",
        );
    } else {
        out += &wrap(&format!("The upstream server replied ({phase}):"), "");
        out += "\r\n";
        out += &wrap(&diagnostic, "    ");
    }
    out += "\r\n";
    out += &wrap(
        &format!("Relay message id: {}", clean(input.original_id)),
        "",
    );
    out += &wrap(
        &format!("Received by the relay: {}", rfc822_date(input.arrival_unix)),
        "",
    );
    out += "\r\n";
    out += "The headers of your message are attached; its body is not.\r\n";
    out
}

fn delivery_status_part(input: &DsnInput<'_>) -> String {
    let mut out = String::new();
    out += &fold(
        "Reporting-MTA",
        &format!("dns; {}", clean(input.reporting_mta)),
    );
    out += &fold("X-Idemrelay-Id", &clean(input.original_id));
    out += &fold("Arrival-Date", &rfc822_date(input.arrival_unix));
    let status = status_code(input.remote_code, input.remote_reply);
    let diagnostic = diagnostic_text(input);
    let last_attempt = rfc822_date(input.now_unix);
    for r in input.recipients {
        out += "\r\n";
        out += &fold("Final-Recipient", &final_recipient(r));
        out += &fold("Action", "failed");
        out += &fold("Status", &status);
        if !diagnostic.is_empty() {
            let kind = if leading_code(&diagnostic).is_some() {
                "smtp"
            } else {
                "X-Idemrelay"
            };
            out += &fold("Diagnostic-Code", &format!("{kind}; {diagnostic}"));
        }
        out += &fold("Last-Attempt-Date", &last_attempt);
    }
    out
}

/// `rfc822; addr` for an ASCII address; RFC 6533's `utf-8;` type with `\x{HEX}` escapes for an
/// internationalized one, which keeps the report 7-bit.
fn final_recipient(addr: &str) -> String {
    let addr = addr.trim();
    if addr.is_ascii() {
        format!("rfc822; {}", clean(addr))
    } else {
        format!("utf-8; {}", utf8_addr_xtext(addr))
    }
}

fn recipient_for_humans(addr: &str) -> String {
    let addr = addr.trim();
    if addr.is_ascii() {
        clean(addr)
    } else {
        utf8_addr_xtext(addr)
    }
}

/// RFC 6533 utf-8-addr-xtext: printable ASCII except `+`, `=` and `\` as is, anything else
/// as `\x{HEX}`.
fn utf8_addr_xtext(addr: &str) -> String {
    let mut out = String::new();
    for c in addr.chars() {
        if c.is_ascii_graphic() && !matches!(c, '+' | '=' | '\\') {
            out.push(c);
        } else {
            out += &format!("\\x{{{:02X}}}", c as u32);
        }
    }
    out
}

/// Clamped to 1970..=9999: mail-parser's date arithmetic works on u16 years and can overflow
/// outside that range, and a bogus clock must not stop a DSN.
fn rfc822_date(unix: i64) -> String {
    const LAST_SECOND_OF_9999: i64 = 253_402_300_799;
    DateTime::from_timestamp(unix.clamp(0, LAST_SECOND_OF_9999)).to_rfc822()
}

fn message_id(id: &str) -> String {
    let id = clean(id);
    let id = id.trim_start_matches('<').trim_end_matches('>');
    id.replace(' ', "")
}

/// One line of printable ASCII: controls (CR and LF included, so nothing can start a new
/// header) become spaces, runs of whitespace collapse, anything else non-ASCII becomes `?`.
fn clean(s: &str) -> String {
    clean_with(s, |c| if c.is_ascii() { c } else { '?' })
}

/// As [`clean`], but keeps non-ASCII characters (for an internationalized address).
fn clean_keep_utf8(s: &str) -> String {
    clean_with(s, |c| c)
}

fn clean_with(s: &str, map: impl Fn(char) -> char) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_whitespace() || c.is_control() {
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(map(c));
        }
    }
    let len = out.trim_end().len();
    out.truncate(len);
    out
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [...]", &s[..end])
}

/// Splits an over-long word at char boundaries: a split word is better than a line a
/// receiving MTA must reject.
fn chunks(word: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = word;
    while rest.len() > max {
        let mut end = max;
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out.push(rest);
    out
}

/// Lays words out in lines of about [`SOFT_WIDTH`]; the first line starts with `first`, the
/// others with `next`. Every line ends with CRLF.
fn lay_out(value: &str, first: &str, next: &str) -> String {
    let mut out = String::new();
    let mut line = first.to_string();
    let mut has_word = false;
    for word in value.split(' ').filter(|w| !w.is_empty()) {
        for chunk in chunks(word, MAX_WORD) {
            let sep = usize::from(has_word);
            if has_word && line.len() + sep + chunk.len() > SOFT_WIDTH {
                out += &line;
                out += "\r\n";
                line = next.to_string();
                has_word = false;
            }
            if has_word {
                line.push(' ');
            }
            line += chunk;
            has_word = true;
        }
    }
    out += &line;
    out += "\r\n";
    out
}

/// A header-style field, folded with leading whitespace on continuation lines (RFC 5322 §2.2.3;
/// RFC 3464 fields fold the same way). The value must already be one clean line.
fn fold(name: &str, value: &str) -> String {
    lay_out(value, &format!("{name}: "), " ")
}

/// Running text for the human part, with `indent` on every line.
fn wrap(text: &str, indent: &str) -> String {
    lay_out(text, indent, indent)
}

/// A boundary that occurs in none of the parts; derived from the message id, so the DSN stays
/// deterministic.
fn pick_boundary(seed: &str, parts: &[&[u8]]) -> String {
    let mut n: u64 = 0;
    loop {
        let mut h = blake3::Hasher::new();
        h.update(b"idemrelay dsn boundary\0");
        h.update(seed.as_bytes());
        h.update(&n.to_le_bytes());
        let boundary = format!("=_idemrelay_{}", &h.finalize().to_hex()[..24]);
        let delimiter = format!("--{boundary}");
        if !parts.iter().any(|p| contains(p, delimiter.as_bytes())) {
            return boundary;
        }
        n += 1;
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The text/rfc822-headers part: its type, its transfer encoding and its body, ready to write.
struct OriginalHeaders {
    content_type: &'static str,
    transfer_encoding: &'static str,
    body: Vec<u8>,
}

impl OriginalHeaders {
    fn from_message(message: &[u8]) -> Self {
        let section = header_section(message);
        if is_clean_7bit(section) {
            let mut body = section.to_vec();
            if !body.is_empty() && !body.ends_with(b"\r\n") {
                body.extend_from_slice(b"\r\n");
            }
            return OriginalHeaders {
                content_type: "text/rfc822-headers",
                transfer_encoding: "7bit",
                body,
            };
        }
        // Non-ASCII, stray CR/LF or over-long lines: quoted-printable carries them unchanged
        // through 7-bit transport.
        OriginalHeaders {
            content_type: "text/rfc822-headers; charset=utf-8",
            transfer_encoding: "quoted-printable",
            body: quoted_printable(section),
        }
    }
}

/// The original's header section including the CRLF of its last field, without the blank
/// line; the whole message when it has no separator (all header, RFC 5322 §2.1); cut at a field
/// boundary beyond [`MAX_HEADERS`]. Only the first `MAX_HEADERS` bytes are searched, so a huge
/// message costs no more than a small one.
fn header_section(message: &[u8]) -> &[u8] {
    if message.starts_with(b"\r\n") {
        return &[];
    }
    let window = &message[..message.len().min(MAX_HEADERS + 4)];
    let section = match find(window, b"\r\n\r\n") {
        Some(i) => &message[..i + 2],
        None => message,
    };
    if section.len() <= MAX_HEADERS {
        return section;
    }
    let head = &section[..MAX_HEADERS];
    // The last CRLF within the limit that is not followed by folding whitespace ends a field.
    let field_end = (0..head.len().saturating_sub(1)).rev().find(|&i| {
        head[i..].starts_with(b"\r\n")
            && section
                .get(i + 2)
                .is_some_and(|b| *b != b' ' && *b != b'\t')
    });
    match field_end.or_else(|| find_last(head, b"\r\n")) {
        Some(i) => &section[..i + 2],
        None => head,
    }
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// Lines of printable ASCII and tabs, CRLF-terminated, none over 998 octets.
fn is_clean_7bit(section: &[u8]) -> bool {
    split_crlf(section)
        .iter()
        .all(|line| line.len() <= 998 && line.iter().all(|&b| b == b'\t' || (32..127).contains(&b)))
}

/// Splits on CRLF only; a bare CR or LF stays inside its line.
fn split_crlf(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(i) = find(rest, b"\r\n") {
        out.push(&rest[..i]);
        rest = &rest[i + 2..];
    }
    out.push(rest);
    out
}

/// RFC 2045 §6.7 quoted-printable; the output ends with CRLF.
fn quoted_printable(data: &[u8]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(data.len() + data.len() / 4);
    let lines = split_crlf(data);
    for (i, line) in lines.iter().enumerate() {
        let mut col = 0;
        for (j, &b) in line.iter().enumerate() {
            let at_end = j + 1 == line.len();
            let literal =
                (b.is_ascii_graphic() && b != b'=') || (matches!(b, b' ' | b'\t') && !at_end);
            let width = if literal { 1 } else { 3 };
            if col + width > QP_WIDTH {
                out.extend_from_slice(b"=\r\n");
                col = 0;
            }
            if literal {
                out.push(b);
            } else {
                out.extend_from_slice(&[b'=', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
            }
            col += width;
        }
        if i + 1 < lines.len() {
            out.extend_from_slice(b"\r\n");
        }
    }
    if !out.is_empty() && !out.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The RFC 3464 notice for `job`'s permanent failure, as the record queued in the failure's
/// commit, keyed from the original so that it is itself sent once. None for the null sender
/// (never notify a notification). Its queue id and the time of the failure come in from the
/// caller, as everything else here does.
pub(crate) fn dsn_for(
    job: &crate::store::Claimed,
    outcome: &super::outcome::Outcome,
    reporting_mta: &str,
    id: String,
    now_unix: i64,
) -> Option<crate::store::NewRecord> {
    use crate::intake::fingerprint::{fingerprint, message_fingerprint};
    use crate::mail::KEY_HEADER;
    use crate::mail::{BodyType, Envelope};
    use crate::reply::Reply;
    use crate::store::{NewRecord, State};

    if job.mail_from.is_empty() {
        return None;
    }
    // Per record, not per key: a key reused after retention may fail again and deserves its
    // own notice.
    let key = dsn_key(&job.scope, &job.id);
    let report = build_dsn(&DsnInput {
        reporting_mta,
        original_id: &job.id,
        original_envelope_from: &job.mail_from,
        recipients: &job.rcpt_to,
        phase: outcome.phase().map_or("dot", |p| p.as_str()),
        remote_code: outcome.code().unwrap_or(550),
        remote_reply: &outcome.reply_text(),
        arrival_unix: job.accepted_at_ms / 1000,
        now_unix,
        original_message: &job.content,
        dsn_message_id: &format!("{id}@{reporting_mta}"),
    });
    let mut content = format!("{KEY_HEADER}: {key}\r\n").into_bytes();
    content.extend_from_slice(&report);
    let envelope = Envelope {
        mail_from: String::new(),
        rcpt_to: vec![job.mail_from.clone()],
        body: if job.eight_bit {
            BodyType::EightBitMime
        } else {
            BodyType::SevenBit
        },
        smtputf8: job.smtputf8,
        requests: Default::default(),
    };
    Some(NewRecord {
        fingerprint: fingerprint(&job.scope, &envelope, &content),
        message_fp: message_fingerprint(&job.scope, &envelope, &content),
        reply: Reply::queued(&id).line(),
        id,
        scope: job.scope.clone(),
        // Unique per failed record and scope already: the upstream sees it as it is.
        upstream_key: Some(key.clone()),
        part: 1,
        key: Some(key),
        key_source: "dsn",
        envelope,
        size: content.len(),
        content: Some(content),
        state: State::Queued,
        dsn_of: Some(job.id.clone()),
        // Events name the message the DSN reports on, not the DSN.
        message_id: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mail_parser::{MessageParser, MimeHeaders};

    const ORIGINAL: &[u8] = b"From: Alice <alice@example.com>\r\n\
To: bob@example.org\r\n\
Subject: quarterly\r\n\
\x20report\r\n\
Message-ID: <m1@example.com>\r\n\
X-Bird-Idempotency-Key: k-1\r\n\
\r\n\
SECRET BODY LINE\r\n\
more body\r\n";

    fn recipients() -> Vec<String> {
        vec![
            "bob@example.org".to_string(),
            "carol@example.net".to_string(),
        ]
    }

    fn input<'a>(recipients: &'a [String], original: &'a [u8], reply: &'a str) -> DsnInput<'a> {
        DsnInput {
            reporting_mta: "relay.example.com",
            original_id: "01HZX",
            original_envelope_from: "alice@example.com",
            recipients,
            phase: "rcpt",
            remote_code: 550,
            remote_reply: reply,
            arrival_unix: 1_700_000_000,
            now_unix: 1_700_003_600,
            original_message: original,
            dsn_message_id: "dsn.01HZX@relay.example.com",
        }
    }

    /// Every line CRLF-terminated, no bare CR or LF, none over 998 octets.
    fn assert_crlf_discipline(msg: &[u8]) {
        assert!(msg.ends_with(b"\r\n"));
        for (i, &b) in msg.iter().enumerate() {
            if b == b'\n' {
                assert!(i > 0 && msg[i - 1] == b'\r', "bare LF at {i}");
            }
            if b == b'\r' {
                assert_eq!(msg.get(i + 1), Some(&b'\n'), "bare CR at {i}");
            }
        }
        for line in split_crlf(msg) {
            assert!(line.len() <= 998, "line of {} octets", line.len());
        }
    }

    fn text(msg: &[u8]) -> String {
        String::from_utf8(msg.to_vec()).unwrap()
    }

    fn part_bodies(msg: &[u8]) -> Vec<(String, String)> {
        let parsed = MessageParser::new().parse(msg).expect("parses");
        let root = parsed.root_part();
        let ids = root.sub_parts().expect("multipart").to_vec();
        ids.iter()
            .map(|&id| {
                let part = parsed.part(id).unwrap();
                let ct = part.content_type().unwrap();
                let name = format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or(""));
                let body = String::from_utf8_lossy(part.contents()).into_owned();
                (name, body)
            })
            .collect()
    }

    #[test]
    fn structure_parses_back() {
        let rcpts = recipients();
        let msg = build_dsn(&input(&rcpts, ORIGINAL, "5.1.1 user unknown"));
        assert_crlf_discipline(&msg);
        assert!(msg.is_ascii());
        let parsed = MessageParser::new().parse(&msg[..]).expect("parses");
        let ct = parsed.root_part().content_type().unwrap();
        assert_eq!(ct.ctype(), "multipart");
        assert_eq!(ct.subtype(), Some("report"));
        assert_eq!(ct.attribute("report-type"), Some("delivery-status"));
        assert_eq!(
            parsed.subject(),
            Some("Undelivered Mail Returned to Sender")
        );
        assert_eq!(parsed.message_id(), Some("dsn.01HZX@relay.example.com"));
        assert_eq!(
            parsed.from().unwrap().first().unwrap().address(),
            Some("MAILER-DAEMON@relay.example.com")
        );
        assert_eq!(
            parsed.to().unwrap().first().unwrap().address(),
            Some("alice@example.com")
        );
        assert_eq!(parsed.date().unwrap().to_timestamp(), 1_700_003_600);
        assert_eq!(
            parsed.header_raw("Auto-Submitted").map(str::trim),
            Some("auto-replied")
        );

        let parts = part_bodies(&msg);
        let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "text/plain",
                "message/delivery-status",
                "text/rfc822-headers"
            ]
        );

        let human = &parts[0].1;
        assert!(human.contains("bob@example.org"), "{human}");
        assert!(human.contains("550 5.1.1 user unknown"), "{human}");
        assert!(human.contains("(RCPT)"), "{human}");

        let report = &parts[1].1;
        assert!(
            report.starts_with("Reporting-MTA: dns; relay.example.com\r\n"),
            "{report}"
        );
        assert!(
            report.contains("Arrival-Date: Tue, 14 Nov 2023 22:13:20 +0000\r\n"),
            "{report}"
        );
        for r in &rcpts {
            let group = format!(
                "\r\n\r\nFinal-Recipient: rfc822; {r}\r\nAction: failed\r\nStatus: 5.1.1\r\n\
                 Diagnostic-Code: smtp; 550 5.1.1 user unknown\r\n"
            );
            assert!(report.contains(&group), "{report}");
        }
        assert!(!report.contains("Remote-MTA"));

        let headers = &parts[2].1;
        assert!(
            headers.starts_with("From: Alice <alice@example.com>\r\n"),
            "{headers}"
        );
        assert!(
            headers.contains("Subject: quarterly\r\n report\r\n"),
            "{headers}"
        );
        assert!(
            headers.contains("X-Bird-Idempotency-Key: k-1\r\n"),
            "{headers}"
        );
        assert!(!text(&msg).contains("SECRET BODY"));
        assert!(!text(&msg).contains("more body"));
    }

    #[test]
    fn header_section_comes_first() {
        let rcpts = recipients();
        let msg = text(&build_dsn(&input(&rcpts, ORIGINAL, "5.1.1 nope")));
        let (head, _) = msg.split_once("\r\n\r\n").unwrap();
        for name in [
            "From:",
            "To:",
            "Subject:",
            "Date:",
            "Message-ID:",
            "Auto-Submitted:",
            "MIME-Version:",
            "Content-Type: multipart/report",
        ] {
            assert!(head.contains(name), "{name} missing from\n{head}");
        }
        assert!(msg.starts_with("From: MAILER-DAEMON@relay.example.com\r\n"));
    }

    #[test]
    fn status_code_table() {
        let cases: &[(u16, &str, &str)] = &[
            (550, "5.1.1 user unknown", "5.1.1"),
            (550, "550 5.1.1 user unknown", "5.1.1"),
            (554, "5.7.26 unauthenticated", "5.7.26"),
            (552, "message too large", "5.0.0"),
            (550, "", "5.0.0"),
            (550, "4.2.2 inconsistent", "5.0.0"),
            (451, "4.3.0 try later", "5.4.7"),
            (421, "", "5.4.7"),
            (0, "timed out", "5.4.7"),
            (0, "5.1.2 bad domain", "5.1.2"),
        ];
        for &(code, reply, want) in cases {
            assert_eq!(status_code(code, reply), want, "{code} {reply}");
        }
    }

    #[test]
    fn diagnostic_kinds() {
        let rcpts = vec!["bob@example.org".to_string()];
        let reports = |code: u16, reply: &str| {
            let mut i = input(&rcpts, ORIGINAL, reply);
            i.remote_code = code;
            let msg = build_dsn(&i);
            assert_crlf_discipline(&msg);
            part_bodies(&msg)[1].1.clone()
        };
        let r = reports(451, "4.3.0 queue full");
        assert!(r.contains("Status: 5.4.7\r\n"), "{r}");
        assert!(
            r.contains("Diagnostic-Code: smtp; 451 4.3.0 queue full\r\n"),
            "{r}"
        );
        let r = reports(0, "timed out");
        assert!(
            r.contains("Diagnostic-Code: X-Idemrelay; timed out\r\n"),
            "{r}"
        );
        let r = reports(0, "");
        assert!(!r.contains("Diagnostic-Code"), "{r}");
        let r = reports(554, "554 5.7.1 multi\r\n554 5.7.1 line");
        assert!(
            r.contains("Diagnostic-Code: smtp; 554 5.7.1 multi 554 5.7.1 line\r\n"),
            "{r}"
        );
    }

    #[test]
    fn long_reply_text_is_folded() {
        let rcpts = recipients();
        let long_word = "x".repeat(3000);
        let reply = format!("5.7.1 {} {long_word} tail", "blah ".repeat(2000));
        let msg = build_dsn(&input(&rcpts, ORIGINAL, &reply));
        assert_crlf_discipline(&msg);
        let parts = part_bodies(&msg);
        assert_eq!(parts.len(), 3);
        let report = &parts[1].1;
        assert!(report.contains("Status: 5.7.1\r\n"));
        assert!(report.contains("Diagnostic-Code: smtp; 550 5.7.1 blah blah"));
        assert!(report.contains("[...]"), "cut at MAX_REPLY");
        for line in report.split("\r\n") {
            assert!(
                line.len() <= SOFT_WIDTH || !line.trim().contains(' '),
                "{line}"
            );
        }
        // The long word survives, split: the diagnostic is cut only at MAX_REPLY.
        let short = format!("5.7.1 {long_word}");
        let msg = build_dsn(&input(&rcpts, ORIGINAL, &short));
        assert_crlf_discipline(&msg);
        let report = &part_bodies(&msg)[1].1;
        let unfolded: String = report.replace("\r\n ", "");
        assert!(unfolded.contains(&long_word));
    }

    #[test]
    fn message_without_separator() {
        let rcpts = recipients();
        let cases: &[(&[u8], &str)] = &[
            (
                b"Subject: only headers\r\nFrom: a@b\r\n",
                "Subject: only headers\r\nFrom: a@b\r\n",
            ),
            (b"Subject: no final crlf", "Subject: no final crlf\r\n"),
            (b"\r\nbody only", ""),
            (b"", ""),
        ];
        for &(original, want) in cases {
            let msg = build_dsn(&input(&rcpts, original, "5.1.1 x"));
            assert_crlf_discipline(&msg);
            let parts = part_bodies(&msg);
            assert_eq!(parts.len(), 3, "{original:?}");
            assert_eq!(parts[2].0, "text/rfc822-headers");
            assert_eq!(parts[2].1.trim_end(), want.trim_end(), "{original:?}");
            assert!(!text(&msg).contains("body only"));
        }
    }

    #[test]
    fn header_section_limits() {
        let mut big = Vec::new();
        for i in 0..5000 {
            big.extend_from_slice(format!("X-Field-{i}: value\r\n continued\r\n").as_bytes());
        }
        big.extend_from_slice(b"\r\nbody");
        let s = header_section(&big);
        assert!(s.len() <= MAX_HEADERS);
        assert!(s.ends_with(b"continued\r\n"), "cut between fields");
        // No separator at all and no CRLF in reach: cut at the limit.
        let blob = vec![b'a'; MAX_HEADERS * 3];
        assert_eq!(header_section(&blob).len(), MAX_HEADERS);
        assert_eq!(header_section(b"A: b\r\n\r\n"), b"A: b\r\n");
    }

    #[test]
    fn eight_bit_headers_travel_as_quoted_printable() {
        let rcpts = recipients();
        let long = format!("X-Long: {}\r\n", "y".repeat(1200));
        let original = [
            "Subject: Gr\u{fc}\u{df}e = hello \r\n".as_bytes(),
            b"X-Bare: a\rb\nc\r\n",
            long.as_bytes(),
            b"\r\nbody",
        ]
        .concat();
        let msg = build_dsn(&input(&rcpts, &original, "5.1.1 x"));
        assert_crlf_discipline(&msg);
        assert!(msg.is_ascii());
        let parsed = MessageParser::new().parse(&msg[..]).unwrap();
        let id = parsed.root_part().sub_parts().unwrap()[2];
        let part = parsed.part(id).unwrap();
        assert_eq!(part.content_transfer_encoding(), Some("quoted-printable"));
        let decoded = part.text_contents().unwrap();
        assert!(
            decoded.contains("Subject: Gr\u{fc}\u{df}e = hello \r\n"),
            "{decoded:?}"
        );
        assert!(decoded.contains("X-Bare: a\rb\nc\r\n"), "{decoded:?}");
        assert!(decoded.contains(&long), "long line survives");
    }

    #[test]
    fn quoted_printable_table() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"", b""),
            (b"abc\r\n", b"abc\r\n"),
            (b"a=b\r\n", b"a=3Db\r\n"),
            (b"trailing \r\n", b"trailing=20\r\n"),
            (b"tab\there\r\n", b"tab\there\r\n"),
            (b"\xc3\xbc\r\n", b"=C3=BC\r\n"),
            (b"bare\rcr\r\n", b"bare=0Dcr\r\n"),
            (b"no newline", b"no newline\r\n"),
        ];
        for &(input, want) in cases {
            assert_eq!(quoted_printable(input), want, "{:?}", text(input));
        }
        let long = quoted_printable(&[b'='; 100]);
        for line in split_crlf(&long) {
            assert!(line.len() <= 76);
        }
    }

    #[test]
    fn hostile_inputs_cannot_inject_headers() {
        let rcpts = vec!["bob@example.org\r\nBcc: victim@example.com".to_string()];
        let mut i = input(&rcpts, ORIGINAL, "5.1.1 x\r\nX-Injected: yes\n.\r\n");
        i.original_envelope_from = "alice@example.com>\r\nBcc: evil@example.com";
        i.reporting_mta = "relay\rexample";
        i.dsn_message_id = "<id\nX: y>";
        i.phase = "rcpt\r\n";
        let msg = build_dsn(&i);
        assert_crlf_discipline(&msg);
        let t = text(&msg);
        for line in t.split("\r\n") {
            assert!(!line.starts_with("Bcc:"), "{line}");
            assert!(!line.starts_with("X-Injected:"), "{line}");
            assert!(!line.starts_with("X: "), "{line}");
        }
        assert!(t.contains("Message-ID: <idX:y>\r\n"), "{t}");
        assert_eq!(part_bodies(&msg).len(), 3);
    }

    #[test]
    fn internationalized_addresses() {
        let rcpts = vec!["j\u{f6}rg@b\u{fc}cher.example".to_string()];
        let mut i = input(&rcpts, ORIGINAL, "5.1.1 x");
        i.original_envelope_from = "\u{e9}lodie@example.fr";
        let msg = build_dsn(&i);
        assert_crlf_discipline(&msg);
        let t = text(&msg);
        assert!(t.contains("To: <\u{e9}lodie@example.fr>\r\n"));
        let (_, after_headers) = t.split_once("\r\n\r\n").unwrap();
        assert!(
            after_headers.is_ascii(),
            "only the To: header may carry UTF-8"
        );
        assert!(
            t.contains("Final-Recipient: utf-8; j\\x{F6}rg@b\\x{FC}cher.example\r\n"),
            "{t}"
        );
        assert_eq!(
            utf8_addr_xtext("a+b=c\\d e"),
            "a\\x{2B}b\\x{3D}c\\x{5C}d\\x{20}e"
        );
    }

    #[test]
    fn deterministic_and_boundary_free() {
        let rcpts = recipients();
        let a = build_dsn(&input(&rcpts, ORIGINAL, "5.1.1 x"));
        let b = build_dsn(&input(&rcpts, ORIGINAL, "5.1.1 x"));
        assert_eq!(a, b);
        // An original that contains the boundary we would pick first gets another one.
        let first = pick_boundary("dsn.01HZX@relay.example.com", &[]);
        let hostile = format!("Subject: x\r\nX-Trap: --{first}\r\n\r\n");
        let msg = build_dsn(&input(&rcpts, hostile.as_bytes(), "5.1.1 x"));
        assert_crlf_discipline(&msg);
        assert!(!text(&msg).contains(&format!("boundary=\"{first}\"")));
        let parts = part_bodies(&msg);
        assert_eq!(parts.len(), 3);
        assert!(parts[2].1.contains(&format!("X-Trap: --{first}")));
    }

    #[test]
    fn dsn_key_is_deterministic_and_distinct() {
        let k = dsn_key("user@scope", "key-1");
        assert_eq!(k, dsn_key("user@scope", "key-1"));
        assert!(k.starts_with("dsn-"));
        assert_eq!(k.len(), 44);
        assert!(k.bytes().all(|b| b.is_ascii_graphic()));
        let others = [
            dsn_key("user@scope", "key-2"),
            dsn_key("other", "key-1"),
            dsn_key("key-1", "user@scope"),
            dsn_key("a", "bc"),
            dsn_key("ab", "c"),
            dsn_key("", ""),
        ];
        for (i, o) in others.iter().enumerate() {
            assert_ne!(&k, o);
            for p in &others[i + 1..] {
                assert_ne!(o, p);
            }
        }
        let long = "k".repeat(255);
        assert!(dsn_key(&long, &long).len() <= 255);
    }

    #[test]
    fn extreme_times_do_not_panic() {
        for t in [i64::MIN, -1, 0, 253_402_300_799, 253_402_300_800, i64::MAX] {
            let date = rfc822_date(t);
            assert!(date.is_ascii() && date.len() < 40, "{date}");
        }
        assert_eq!(rfc822_date(0), "Thu, 1 Jan 1970 00:00:00 +0000");
        assert_eq!(rfc822_date(i64::MAX), "Fri, 31 Dec 9999 23:59:59 +0000");
        let rcpts = recipients();
        let mut i = input(&rcpts, ORIGINAL, "5.1.1 x");
        i.arrival_unix = i64::MIN;
        i.now_unix = i64::MAX;
        assert_crlf_discipline(&build_dsn(&i));
    }

    #[test]
    fn fold_and_wrap() {
        assert_eq!(fold("Status", "5.1.1"), "Status: 5.1.1\r\n");
        assert_eq!(fold("Empty", ""), "Empty: \r\n");
        let folded = fold("Diagnostic-Code", &"word ".repeat(40));
        for line in folded.trim_end().split("\r\n") {
            assert!(line.len() <= SOFT_WIDTH, "{line}");
        }
        assert!(folded
            .split("\r\n")
            .skip(1)
            .all(|l| l.is_empty() || l.starts_with(' ')));
        assert_eq!(wrap("a b", "  "), "  a b\r\n");
        assert_eq!(clean("  a\r\n\tb  c\u{e9} "), "a b c?");
        assert_eq!(truncate("h\u{e9}llo", 2), "h [...]");
    }

    fn failed_job(mail_from: &str, eight_bit: bool) -> crate::store::Claimed {
        crate::store::Claimed {
            id: "01HZX".into(),
            scope: "team-a".into(),
            key: Some("k-1".into()),
            mail_from: mail_from.into(),
            rcpt_to: recipients(),
            eight_bit,
            smtputf8: false,
            requests: Default::default(),
            content: ORIGINAL.to_vec(),
            accepted_at_ms: 1_700_000_000_000,
            attempts: 1,
            first_attempt_at_ms: Some(1_700_000_000_000),
            any_unknown: false,
            recovered: false,
            now_ms: 1_700_003_600_000,
            token: 7,
        }
    }

    #[test]
    fn a_failed_record_queues_its_notice_keyed_from_the_record() {
        use crate::delivery::outcome::{Outcome, Phase};
        let refused = Outcome::Permanent {
            phase: Phase::Rcpt,
            code: 550,
            reply: "550 5.1.1 user unknown".into(),
        };
        let job = failed_job("alice@example.com", true);
        let dsn = dsn_for(
            &job,
            &refused,
            "relay.example.com",
            "D1".into(),
            1_700_003_600,
        )
        .expect("a sender to notify");
        let key = dsn_key("team-a", "01HZX");
        assert_eq!(dsn.id, "D1");
        assert_eq!(dsn.scope, "team-a");
        assert_eq!(dsn.key.as_deref(), Some(key.as_str()));
        assert_eq!(dsn.upstream_key.as_deref(), Some(key.as_str()));
        assert_eq!(dsn.key_source, "dsn");
        assert_eq!(dsn.dsn_of.as_deref(), Some("01HZX"));
        assert_eq!(dsn.state, crate::store::State::Queued);
        assert_eq!(dsn.envelope.mail_from, "");
        assert_eq!(dsn.envelope.rcpt_to, ["alice@example.com"]);
        assert_eq!(dsn.envelope.body, crate::mail::BodyType::EightBitMime);
        let content = dsn.content.expect("queued with its bytes");
        assert_eq!(dsn.size, content.len());
        let head = format!("{}: {key}\r\n", crate::mail::KEY_HEADER);
        assert!(content.starts_with(head.as_bytes()));
        let report = &content[head.len()..];
        assert_eq!(
            report,
            build_dsn(&DsnInput {
                phase: "rcpt",
                remote_reply: "550 5.1.1 user unknown",
                dsn_message_id: "D1@relay.example.com",
                ..input(&recipients(), ORIGINAL, "")
            })
        );
        let seven_bit = dsn_for(
            &failed_job("alice@example.com", false),
            &refused,
            "relay.example.com",
            "D2".into(),
            1_700_003_600,
        )
        .expect("a sender to notify");
        assert_eq!(seven_bit.envelope.body, crate::mail::BodyType::SevenBit);
    }

    #[test]
    fn the_null_sender_is_never_notified() {
        let lost = crate::delivery::outcome::Outcome::Unknown {
            phase: crate::delivery::outcome::Phase::Dot,
            reason: "timed out".into(),
        };
        assert!(dsn_for(
            &failed_job("", false),
            &lost,
            "relay.example.com",
            "D3".into(),
            0
        )
        .is_none());
    }
}
