//! Building a delivery status notification (RFC 3464) as bytes from its inputs alone: the
//! failure, relayed and delay notices' parts, headers and returned content.

use mail_builder::headers::raw::Raw;
use mail_builder::mime::MimePart;
use mail_parser::DateTime;

use crate::delivery::outcome::{leading_code, reply_line, EnhancedCode};
use crate::mail::requests::{parse_orcpt, xtext_decode};
use crate::mail::DeliveryRequests;

/// What the notice reports for its recipients (RFC 3464 §2.3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Failed,
    /// Taken by an upstream that will not report success itself.
    Relayed,
    /// Still queued after long, to be retried until `will_retry_until` (Unix seconds).
    Delayed {
        will_retry_until: Option<i64>,
    },
}

/// What of the original message the notice carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Returned {
    /// Its header section, as text/rfc822-headers.
    Headers,
    /// All of it, as message/rfc822 (RET=FULL).
    Full,
    /// RET=FULL, but over [`MAX_RETURNED`]: its header section, and the notice says why.
    HeadersTooLarge,
    /// RET=FULL, but not fit to travel inside another message as it is (over-long lines,
    /// stray CR or LF, 8-bit text the notice cannot declare): its header section.
    HeadersUnfit,
}

pub(crate) struct DsnInput<'a> {
    pub action: Action,
    pub returned: Returned,
    pub reporting_mta: &'a str,
    pub original_id: &'a str,
    pub original_envelope_from: &'a str,
    pub recipients: &'a [String],
    pub phase: &'a str,
    pub remote_code: u16,
    pub remote_reply: &'a str,
    pub arrival_unix: i64,
    pub now_unix: i64,
    /// CRLF bytes, may be large; only its header section is used unless `returned` is `Full`.
    pub original_message: &'a [u8],
    /// Without `<>`.
    pub dsn_message_id: &'a str,
    /// The relay itself declined to send (a REQUIRETLS message the upstream cannot take so):
    /// the notice says so instead of quoting the upstream.
    pub refused_by_relay: bool,
    /// ENVID and ORCPT as the client sent them: `Original-Envelope-Id` and
    /// `Original-Recipient`.
    pub requests: &'a DeliveryRequests,
}

/// The largest original a notice returns whole (RET=FULL); a larger one is returned as its
/// headers. Postfix returns at most 50 000 bytes; a notice is for a person to recognise the
/// message, not a backup of it.
pub(crate) const MAX_RETURNED: usize = 256 * 1024;

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
    let original = match input.returned {
        Returned::Full => OriginalHeaders::whole(input.original_message),
        _ => OriginalHeaders::from_message(input.original_message),
    };
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
    let subject = match input.action {
        Action::Failed => "Undelivered Mail Returned to Sender",
        Action::Relayed => "Delivery Status Notification (Relayed)",
        Action::Delayed { .. } => DELAY_SUBJECT,
    };
    out += &fold("Subject", subject);
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
            match (input.action, input.returned) {
                (Action::Failed, Returned::Full) => "Undelivered message",
                (Action::Failed, _) => "Undelivered message headers",
                (Action::Relayed, _) => "Relayed message headers",
                (Action::Delayed { .. }, _) => "Delayed message headers",
            },
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
    if input.action == Action::Relayed {
        return relayed_human_part(input);
    }
    if let Action::Delayed { will_retry_until } = input.action {
        return delay_human_part(input, will_retry_until);
    }
    let phase = clean(input.phase).to_ascii_uppercase();
    let diagnostic = diagnostic_text(input);
    let mut out = opening_lines(input, "could not be delivered to");
    if input.refused_by_relay {
        out += &wrap(
            "The relay did not send it: it was submitted with REQUIRETLS, and the upstream \
             server cannot take it over verified TLS with REQUIRETLS (RFC 8689). It will not \
             be tried again.",
            "",
        );
        out += "\r\n";
        out += &wrap(&diagnostic, "    ");
    } else {
        out += &upstream_said(input, &phase, &diagnostic);
    }
    out += &closing_lines(input);
    out
}

/// The start of every notice's human part: who reports, what happened to the message (`what`:
/// "could not be delivered to", ...) and for which recipients.
fn opening_lines(input: &DsnInput<'_>, what: &str) -> String {
    let mta = clean(input.reporting_mta);
    let mut out = String::new();
    out += &wrap(&format!("This is the mail delivery system at {mta}."), "");
    out += "\r\n";
    out += &format!("Your message {what} the following recipients:\r\n\r\n");
    for r in input.recipients {
        out += &wrap(&recipient_for_humans(r), "    ");
    }
    out += "\r\n";
    out
}

/// The end of every notice's human part: which message, when it arrived, what is returned.
fn closing_lines(input: &DsnInput<'_>) -> String {
    let mut out = String::from("\r\n");
    out += &wrap(
        &format!("Relay message id: {}", clean(input.original_id)),
        "",
    );
    out += &wrap(
        &format!("Received by the relay: {}", rfc822_date(input.arrival_unix)),
        "",
    );
    out += "\r\n";
    out += &wrap(returned_text(input.returned), "");
    out
}

/// Why the upstream's answer ends the message, and the answer.
fn upstream_said(input: &DsnInput<'_>, phase: &str, diagnostic: &str) -> String {
    let mut out = String::new();
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
        out += &wrap(diagnostic, "    ");
    }
    out
}

fn returned_text(returned: Returned) -> &'static str {
    match returned {
        Returned::Headers => "The headers of your message are attached; its body is not.",
        Returned::Full => "Your message is attached.",
        Returned::HeadersTooLarge => {
            "You asked for the whole message back, but it is larger than the relay returns \
             (262144 bytes): its headers are attached; its body is not."
        }
        Returned::HeadersUnfit => {
            "You asked for the whole message back, but it cannot travel inside a notice as \
             it is: its headers are attached; its body is not."
        }
    }
}

fn relayed_human_part(input: &DsnInput<'_>) -> String {
    let mut out = opening_lines(input, "was relayed to");
    out += &wrap(
        "You asked to be told of its delivery. The upstream server took the message but does \
         not offer delivery notifications, so this is the last notice you will get about it: \
         it says the message was passed on, not that it reached the mailbox.",
        "",
    );
    let diagnostic = diagnostic_text(input);
    if !diagnostic.is_empty() {
        out += "\r\n";
        out += &wrap("The upstream server replied:", "");
        out += &wrap(&diagnostic, "    ");
    }
    out += &closing_lines(input);
    out
}

fn delivery_status_part(input: &DsnInput<'_>) -> String {
    let mut out = String::new();
    // RFC 3464 §2.2: the envelope id comes first among the per-message fields.
    if let Some(envid) = &input.requests.envid {
        out += &fold("Original-Envelope-Id", &original_envelope_id(envid));
    }
    out += &fold(
        "Reporting-MTA",
        &format!("dns; {}", clean(input.reporting_mta)),
    );
    out += &fold("Arrival-Date", &rfc822_date(input.arrival_unix));
    // An extension field: the ABNF puts these after the standard per-message fields.
    out += &fold("X-Idemrelay-Id", &clean(input.original_id));
    let (action, status) = match input.action {
        Action::Failed => ("failed", status_code(input.remote_code, input.remote_reply)),
        Action::Relayed => ("relayed", success_code(input.remote_reply)),
        Action::Delayed { .. } => ("delayed", delay_status_code(input.remote_reply)),
    };
    let diagnostic = diagnostic_text(input);
    let last_attempt = rfc822_date(input.now_unix);
    for r in input.recipients {
        out += "\r\n";
        if let Some(orcpt) = input.requests.orcpt(r).and_then(original_recipient) {
            out += &fold("Original-Recipient", &orcpt);
        }
        out += &fold("Final-Recipient", &final_recipient(r));
        out += &fold("Action", action);
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
        out += &will_retry_until_field(input.action);
    }
    out
}

/// The status of a relayed notice: the upstream's own 2.x.x enhanced code, else 2.0.0.
pub(crate) fn success_code(reply: &str) -> String {
    match EnhancedCode::from_reply(reply) {
        Some(e) if e.class == 2 => e.to_string(),
        _ => "2.0.0".to_string(),
    }
}

/// RFC 3461 §4.4 / RFC 3464 §2.2.1: the envelope id as the sender chose it, decoded from the
/// xtext it travels in over SMTP. Kept as sent (still xtext) when the decoded text is not
/// printable ASCII, which a report field cannot carry as is.
pub(crate) fn original_envelope_id(envid: &str) -> String {
    match xtext_decode(envid) {
        Some(text) if text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') => clean(&text),
        _ => clean(envid),
    }
}

/// RFC 3464 §2.3.1 `addr-type; address`, the address decoded from the xtext ORCPT travels in
/// (RFC 3461 §4.2). An address that is not printable ASCII (an `rfc822` one with UTF-8 in it,
/// or any `utf-8` one, whose decoded text is itself RFC 6533 utf-8-addr-xtext and may carry
/// raw UTF-8 as well) is written as RFC 6533's `utf-8` type with `\x{HEX}` escapes, which
/// keeps the report 7-bit. Anything else that cannot be decoded keeps its xtext, still with
/// the one space. `None` without an addr-type at all: the field is left out rather than made up.
pub(crate) fn original_recipient(orcpt: &str) -> Option<String> {
    let printable = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    let Ok((addr_type, address)) = parse_orcpt(orcpt) else {
        let (addr_type, raw) = orcpt.split_once(';')?;
        let (addr_type, raw) = (clean(addr_type.trim()), clean(raw.trim()));
        return (!addr_type.is_empty() && !raw.is_empty()).then(|| format!("{addr_type}; {raw}"));
    };
    if addr_type.eq_ignore_ascii_case("utf-8") {
        // Undo the sender's own `\x{HEX}` escapes first so they are not escaped twice.
        let plain = utf8_addr_unescape(&address).unwrap_or(address);
        return Some(format!("utf-8; {}", utf8_addr_xtext(&plain)));
    }
    if printable(&address) {
        Some(format!("{addr_type}; {}", clean(&address)))
    } else if addr_type.eq_ignore_ascii_case("rfc822") {
        Some(format!("utf-8; {}", utf8_addr_xtext(&address)))
    } else {
        // No 7-bit form of its own for another type: the xtext as sent.
        let (_, raw) = orcpt.split_once(';')?;
        Some(format!("{addr_type}; {}", clean(raw)))
    }
}

/// The inverse of [`utf8_addr_xtext`]: `\x{HEX}` escapes back to their characters, anything
/// else as is. `None` when an escape is malformed (then the text is taken literally).
fn utf8_addr_unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out += &rest[..at];
        let tail = rest[at..].strip_prefix("\\x{")?;
        let end = tail.find('}')?;
        let hex = &tail[..end];
        if hex.is_empty() || hex.len() > 6 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
        rest = &tail[end + 1..];
    }
    out += rest;
    Some(out)
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
pub(super) fn rfc822_date(unix: i64) -> String {
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
    /// The whole message as message/rfc822 (the caller checked it is fit: see
    /// `notice::returned`), declared 8bit when it has 8-bit bytes.
    fn whole(message: &[u8]) -> Self {
        let mut body = message.to_vec();
        if !body.ends_with(b"\r\n") {
            body.extend_from_slice(b"\r\n");
        }
        OriginalHeaders {
            content_type: "message/rfc822",
            transfer_encoding: if body.is_ascii() { "7bit" } else { "8bit" },
            body,
        }
    }

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
pub(super) fn header_section(message: &[u8]) -> &[u8] {
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
pub(super) fn is_clean_7bit(section: &[u8]) -> bool {
    split_crlf(section)
        .iter()
        .all(|line| line.len() <= 998 && line.iter().all(|&b| b == b'\t' || (32..127).contains(&b)))
}

/// Splits on CRLF only; a bare CR or LF stays inside its line.
pub(super) fn split_crlf(data: &[u8]) -> Vec<&[u8]> {
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

/// The delay notice's wording (RFC 3461 §4.1 NOTIFY=DELAY): its subject, status, retry
/// deadline and human part; which messages get one is `notice`'s.
const DELAY_SUBJECT: &str = "Delivery Status Notification (Delay)";

/// The status of a delay notice: the reply's own 4.x.x enhanced code, else 4.0.0.
fn delay_status_code(reply: &str) -> String {
    match EnhancedCode::from_reply(reply) {
        Some(e) if e.class == 4 => e.to_string(),
        _ => "4.0.0".to_string(),
    }
}

/// The per-recipient `Will-Retry-Until` field of a delay notice (RFC 3464 §2.3.9); nothing
/// for the other notices, or when the deadline is not known.
fn will_retry_until_field(action: Action) -> String {
    match action {
        Action::Delayed {
            will_retry_until: Some(until),
        } => fold("Will-Retry-Until", &rfc822_date(until)),
        _ => String::new(),
    }
}

fn delay_human_part(input: &DsnInput<'_>, will_retry_until: Option<i64>) -> String {
    let mut out = opening_lines(input, "has not yet been delivered to");
    let until = match will_retry_until {
        Some(at) => format!(" until {}", rfc822_date(at)),
        None => String::new(),
    };
    out += &wrap(
        &format!(
            "You asked to be told of delays. The relay keeps trying{until}; this is only a \
             warning, and you do not need to send the message again. This is the only delay \
             notice you will get about it."
        ),
        "",
    );
    let diagnostic = diagnostic_text(input);
    if !diagnostic.is_empty() {
        out += "\r\n";
        out += &wrap("The last attempt ended with:", "");
        out += &wrap(&diagnostic, "    ");
    }
    out += &closing_lines(input);
    out
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
