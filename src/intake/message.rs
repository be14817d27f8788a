//! Header inspection and the header lines the relay adds. Pure functions over message bytes.

use mail_parser::{HeaderName, MessageParser};

use super::fields::{read_key_fields, KeyFields};
use crate::mail::KEY_HEADER;

/// Bounds on the header section, checked before it is parsed: mail-parser allocates per
/// field, so a body-sized header section of tiny fields would cost hundreds of MB.
pub(crate) const MAX_HEADER_BYTES: usize = 256 * 1024;
pub(crate) const MAX_HEADER_FIELDS: usize = 1000;

/// Length of the header section (up to and including the empty line, or the whole message
/// when there is no body), or `None` when it exceeds the bounds.
pub(crate) fn bounded_header_section(message: &[u8]) -> Option<usize> {
    let mut pos = 0;
    let mut fields = 0;
    while pos < message.len() {
        let end = message[pos..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(message.len(), |i| pos + i + 2);
        if end - pos == 2 {
            return Some(end);
        }
        if !matches!(message[pos], b' ' | b'\t') {
            fields += 1;
        }
        pos = end;
        if pos > MAX_HEADER_BYTES || fields > MAX_HEADER_FIELDS {
            return None;
        }
    }
    Some(pos)
}

/// What intake needs to know from the header section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderScan {
    /// Raw values (folding intact) of every `X-Bird-Idempotency-Key` field, in order.
    pub key_values: Vec<Vec<u8>>,
    /// Where each of those fields is, name to final CRLF, in order.
    pub key_fields: Vec<std::ops::Range<usize>>,
    /// Readers would disagree about the key: see `fields::KeyFields::ambiguous`.
    pub key_ambiguous: bool,
    pub message_id: Option<String>,
    pub has_from: bool,
}

/// True when the message starts with a header field (`name:` with RFC 5322 ftext).
pub fn has_header_section(message: &[u8]) -> bool {
    let Some(colon) = message.iter().position(|&b| b == b':') else {
        return false;
    };
    colon > 0 && message[..colon].iter().all(|&b| (33..=126).contains(&b))
}

/// The key fields are read by the strict reader in `fields` (what the upstream sees);
/// mail-parser reads the Message-ID and whether there is a From field.
pub fn scan_headers(message: &[u8]) -> HeaderScan {
    let parser = MessageParser::new().header_id(HeaderName::MessageId);
    let KeyFields {
        values,
        fields,
        ambiguous,
    } = read_key_fields(message);
    let mut scan = HeaderScan {
        key_values: values,
        key_fields: fields,
        key_ambiguous: ambiguous,
        message_id: None,
        has_from: false,
    };
    let Some(parsed) = parser.parse_headers(message) else {
        return scan;
    };
    scan.message_id = parsed
        .message_id()
        .map(str::to_string)
        .filter(|id| !id.is_empty());
    scan.has_from = parsed
        .root_part()
        .headers()
        .iter()
        .any(|header| header.name == HeaderName::From);
    scan
}

/// The trace line this relay adds, in RFC 5321 §4.4 form.
pub(crate) struct ReceivedLine<'a> {
    pub helo: &'a str,
    pub peer: std::net::IpAddr,
    pub hostname: &'a str,
    pub protocol: &'a str,
    pub id: &'a str,
    pub unix_time: i64,
}

/// A HELO name longer than any domain (RFC 1035: 255 octets) is cut to this in the trace
/// line, so that the line stays far below the 998-octet limit of RFC 5322 §2.1.1.
const TRACE_HELO_MAX: usize = 255;

/// `text` cut to at most `max` bytes, at a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl ReceivedLine<'_> {
    pub(crate) fn render(&self) -> String {
        let date = mail_parser::DateTime::from_timestamp(self.unix_time).to_rfc822();
        // RFC 5321 §4.1.3 address literals: IPv6 ones carry a tag.
        let literal = match self.peer {
            std::net::IpAddr::V4(ip) => ip.to_string(),
            std::net::IpAddr::V6(ip) => format!("IPv6:{ip}"),
        };
        format!(
            "Received: from {} ([{}])\r\n\tby {} (idemrelay) with {} id {};\r\n\t{}\r\n",
            truncated(self.helo, TRACE_HELO_MAX),
            literal,
            self.hostname,
            self.protocol,
            self.id,
            date
        )
    }
}

/// The stored message: the relay's lines, then the submitted bytes, untouched but for the
/// client's key fields in `replaced` (when the upstream is to see another key than the
/// client's: `key_line` is then that key).
pub(crate) fn with_relay_headers(
    message: &[u8],
    received: &str,
    key_line: Option<&str>,
    replaced: &[std::ops::Range<usize>],
) -> Vec<u8> {
    let key_line = key_line.map(|k| format!("{KEY_HEADER}: {k}\r\n"));
    let extra = received.len() + key_line.as_ref().map_or(0, String::len);
    let mut out = Vec::with_capacity(extra + message.len());
    out.extend_from_slice(received.as_bytes());
    if let Some(line) = key_line {
        out.extend_from_slice(line.as_bytes());
    }
    let mut pos = 0;
    for field in replaced {
        out.extend_from_slice(&message[pos..field.start]);
        pos = field.end;
    }
    out.extend_from_slice(&message[pos..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemrelay_model::fingerprint::trace_prefix_len;

    #[test]
    fn header_section_detection() {
        assert!(has_header_section(b"From: a@b\r\n\r\nhi\r\n"));
        assert!(!has_header_section(b"\r\nbody only\r\n"));
        assert!(!has_header_section(b"just text without colon\r\n"));
        assert!(!has_header_section(b"two words: here\r\n"));
        assert!(!has_header_section(b""));
    }

    #[test]
    fn scan_finds_key_values_message_id_and_from() {
        let msg = b"From: a@example.com\r\nMessage-ID: <m1@example.com>\r\nX-Bird-Idempotency-Key: k1\r\nx-bird-idempotency-key:\r\n k2\r\n\r\nX-Bird-Idempotency-Key: body\r\n";
        let scan = scan_headers(msg);
        assert!(scan.has_from);
        assert_eq!(scan.message_id.as_deref(), Some("m1@example.com"));
        assert_eq!(scan.key_values.len(), 2);
        assert_eq!(scan.key_values[0].trim_ascii(), b"k1");
    }

    #[test]
    fn header_section_bounds() {
        assert_eq!(
            bounded_header_section(b"A: b\r\n C\r\n\r\nbody\r\n"),
            Some(12)
        );
        assert_eq!(bounded_header_section(b"A: b\r\n"), Some(6));
        let many = b"a:\r\n".repeat(MAX_HEADER_FIELDS + 1);
        assert_eq!(bounded_header_section(&many), None);
        let mut fine = b"a:\r\n".repeat(MAX_HEADER_FIELDS);
        fine.extend_from_slice(b"\r\n");
        assert_eq!(bounded_header_section(&fine), Some(fine.len()));
        let mut long = b"A: ".to_vec();
        for _ in 0..4000 {
            long.extend_from_slice(b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n ");
        }
        assert_eq!(bounded_header_section(&long), None);
    }

    #[test]
    fn ipv6_peers_are_tagged_in_the_trace_line() {
        let line = ReceivedLine {
            helo: "h",
            peer: "::1".parse().unwrap(),
            hostname: "r",
            protocol: "ESMTP",
            id: "I",
            unix_time: 0,
        }
        .render();
        assert!(line.starts_with("Received: from h ([IPv6:::1])"), "{line}");
    }

    #[test]
    fn a_long_helo_is_cut_so_every_trace_line_fits_998_octets() {
        let helo = format!("{}.example", "é".repeat(1000));
        let line = ReceivedLine {
            helo: &helo,
            peer: "192.0.2.1".parse().unwrap(),
            hostname: "relay.example",
            protocol: "ESMTP",
            id: "I",
            unix_time: 0,
        }
        .render();
        for part in line.split("\r\n") {
            assert!(part.len() <= 998, "{} octets", part.len());
        }
        assert!(line.starts_with(&format!("Received: from {} ", "é".repeat(127))));
    }

    #[test]
    fn the_clients_key_fields_are_replaced_by_the_upstream_key() {
        let msg = b"Subject: s\r\nX-Bird-Idempotency-Key: k1\r\nTo: t\r\nx-bird-idempotency-key:\r\n k1\r\n\r\nX-Bird-Idempotency-Key: body\r\n";
        let scan = scan_headers(msg);
        assert_eq!(scan.key_fields.len(), 2);
        let out = with_relay_headers(msg, "Received: r\r\n", Some("u1-t-2-k1"), &scan.key_fields);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Received: r\r\nX-Bird-Idempotency-Key: u1-t-2-k1\r\nSubject: s\r\nTo: t\r\n\r\nX-Bird-Idempotency-Key: body\r\n"
        );
    }

    #[test]
    fn trace_prefix_covers_only_leading_trace_fields() {
        let msg = b"Received: from x\r\n\tby y; date\r\nReturn-Path: <a@b>\r\nSubject: s\r\nReceived: later\r\n\r\n";
        let n = trace_prefix_len(msg);
        assert_eq!(&msg[n..n + 8], b"Subject:");
        assert_eq!(trace_prefix_len(b"Subject: s\r\n\r\n"), 0);
        assert_eq!(trace_prefix_len(b"Received-SPF: pass\r\n\r\n"), 0);
    }

    #[test]
    fn relay_headers_are_prepended_and_the_rest_is_untouched() {
        let msg = b"Subject: s\r\n\r\nbody";
        let out = with_relay_headers(msg, "Received: r\r\n", Some("d1-abc"), &[]);
        assert_eq!(
            out,
            b"Received: r\r\nX-Bird-Idempotency-Key: d1-abc\r\nSubject: s\r\n\r\nbody"
        );
        let line = ReceivedLine {
            helo: "client.example",
            peer: "127.0.0.1".parse().unwrap(),
            hostname: "relay.example",
            protocol: "ESMTP",
            id: "ID1",
            unix_time: 0,
        }
        .render();
        assert!(line.starts_with("Received: from client.example ([127.0.0.1])\r\n\tby relay.example (idemrelay) with ESMTP id ID1;\r\n\t"));
        assert!(line.ends_with("\r\n"));
        assert_eq!(trace_prefix_len(line.as_bytes()), line.len());
    }
}
