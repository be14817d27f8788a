//! A strict RFC 5322 reader of the header section, for the idempotency key alone. The key the
//! relay deduplicates on must be the key the upstream finds in the bytes it is sent (docs/concepts/contract.md "What the relay answers at the end of DATA"),
//! and the upstream is an RFC 5322 reader: a line starting with white space continues the field
//! above it (§2.2.3), a field is `name:` with printable ASCII in the name (§2.2; §4.5 allows
//! white space before the colon). mail-parser is lenient in ways that disagree with that (it
//! reads an indented line after a line that is not a field as a field of its own), so it is not
//! used for the key. Pure functions.

use std::ops::Range;

use crate::mail::KEY_HEADER;

/// The key fields of a header section, as an RFC 5322 reader finds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyFields {
    /// Raw values (the bytes after the colon, folding intact) of every key field, in order.
    pub values: Vec<Vec<u8>>,
    /// Where each of those fields is, name to final CRLF, in order.
    pub fields: Vec<Range<usize>>,
    /// Something that looks like a key field is not one to an RFC 5322 reader, or the section
    /// is malformed (a line that is neither a field nor a continuation of one, a bare CR or LF)
    /// and holds something that looks like a key field. Readers disagree about such sections:
    /// no key the relay picks is sure to be the one the upstream sees.
    pub ambiguous: bool,
}

/// Reads `section` (the header section, its empty line included or not).
pub(crate) fn read_key_fields(section: &[u8]) -> KeyFields {
    let mut out = KeyFields::default();
    let mut malformed = false;
    // The field being read: its start, where its value starts, and whether it is a key field.
    let mut open: Option<(usize, usize, bool)> = None;
    let mut pos = 0;
    let close = |open: &mut Option<(usize, usize, bool)>, end: usize, out: &mut KeyFields| {
        if let Some((start, value_start, true)) = open.take() {
            let value_end = if section[..end].ends_with(b"\r\n") {
                end - 2
            } else {
                end
            };
            out.values.push(section[value_start..value_end].to_vec());
            out.fields.push(start..end);
        }
        *open = None;
    };
    while pos < section.len() {
        let (line, next) = match section[pos..].windows(2).position(|w| w == b"\r\n") {
            Some(at) => (&section[pos..pos + at], pos + at + 2),
            None => (&section[pos..], section.len()),
        };
        if line.is_empty() {
            break;
        }
        malformed |= line.iter().any(|&b| b == b'\r' || b == b'\n');
        if is_wsp(line[0]) {
            // A continuation: it belongs to the open field, or to nothing.
            malformed |= open.is_none();
            pos = next;
            continue;
        }
        close(&mut open, pos, &mut out);
        match field_name(line) {
            Some((name, colon)) => {
                open = Some((
                    pos,
                    pos + colon + 1,
                    name.eq_ignore_ascii_case(KEY_HEADER.as_bytes()),
                ));
            }
            None => malformed = true,
        }
        pos = next;
    }
    close(&mut open, pos, &mut out);
    // `pos` is now the end of the header section proper: the body does not count.
    let lookalikes = section[..pos]
        .split(|&b| b == b'\r' || b == b'\n')
        .filter(|segment| looks_like_key_field(segment))
        .count();
    out.ambiguous = lookalikes != out.fields.len() || (malformed && lookalikes > 0);
    out
}

/// The name of the field `line` starts and the position of its colon, or `None` when the line
/// is not a field.
fn field_name(line: &[u8]) -> Option<(&[u8], usize)> {
    let colon = line.iter().position(|&b| b == b':')?;
    let name = trim_wsp_end(&line[..colon]);
    let printable = !name.is_empty() && name.iter().all(|&b| (33..=126).contains(&b));
    printable.then_some((name, colon))
}

/// A line (split at any CR or LF) that a lenient reader could take for a key field: the key
/// name, after any white space, then optional white space and a colon.
fn looks_like_key_field(segment: &[u8]) -> bool {
    let rest = trim_wsp_start(segment);
    let name = KEY_HEADER.as_bytes();
    rest.len() > name.len()
        && rest[..name.len()].eq_ignore_ascii_case(name)
        && trim_wsp_start(&rest[name.len()..]).first() == Some(&b':')
}

fn is_wsp(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim_wsp_start(mut bytes: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = bytes {
        if !is_wsp(*first) {
            break;
        }
        bytes = rest;
    }
    bytes
}

fn trim_wsp_end(mut bytes: &[u8]) -> &[u8] {
    while let [rest @ .., last] = bytes {
        if !is_wsp(*last) {
            break;
        }
        bytes = rest;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::read_key_fields;
    use crate::intake::key::{read_key_header, KeyHeader};

    /// What intake makes of a header section's key: `refused`, `absent`, `invalid` or the key.
    fn outcome(message: &[u8]) -> String {
        let read = read_key_fields(message);
        if read.ambiguous {
            return "refused".into();
        }
        match read_key_header(&read.values) {
            KeyHeader::Present(key) => key,
            KeyHeader::Absent => "absent".into(),
            KeyHeader::Invalid => "invalid".into(),
        }
    }

    #[test]
    fn header_shapes_table() {
        let cases: &[(&[u8], &str)] = &[
            (b"From: a\r\nX-Bird-Idempotency-Key: k1\r\n\r\nbody", "k1"),
            (b"x-bird-IDEMPOTENCY-key:k1\r\n\r\n", "k1"),
            (b"X-Bird-Idempotency-Key: k1", "k1"),
            (b"From: a\r\n\r\nbody", "absent"),
            (b"", "absent"),
            // The brief's case: the indented line continues `garbage`, which is no field.
            (
                b"From: <s@x>\r\ngarbage\r\n X-Bird-Idempotency-Key: lead-2\r\nSubject: s\r\n\r\nbody",
                "refused",
            ),
            // An indented key line as the first line, with a space or a tab.
            (b" X-Bird-Idempotency-Key: k1\r\nFrom: a\r\n\r\n", "refused"),
            (b"\tX-Bird-Idempotency-Key: k1\r\nFrom: a\r\n\r\n", "refused"),
            // A key line folded into the field above: to RFC 5322 part of the Subject.
            (b"Subject: s\r\n X-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            (b"Subject: s\r\n\tX-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            // Obsolete syntax (RFC 5322 §4.5): white space before the colon.
            (b"X-Bird-Idempotency-Key : k1\r\n\r\n", "k1"),
            (b"X-Bird-Idempotency-Key\t: k1\r\n\r\n", "k1"),
            // A line without a colon, or with a name that is no field name, before or after
            // the key: readers that stop there or fold it in would see another key.
            (b"From: a\r\ngarbage\r\nX-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            (b"X-Bird-Idempotency-Key: k1\r\ngarbage\r\n\r\n", "refused"),
            (b"Bad Name: x\r\nX-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            (b": x\r\nX-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            // A malformed section without a key: the relay derives one and its own key line
            // comes first, so every reader sees it.
            (b"From: a\r\ngarbage\r\n indented\r\n\r\n", "absent"),
            // Folding, obs-fold included (a line of white space only).
            (b"X-Bird-Idempotency-Key:\r\n k1\r\n\r\n", "k1"),
            (b"X-Bird-Idempotency-Key:\r\n\tk1\r\n\r\n", "k1"),
            (b"X-Bird-Idempotency-Key: k1\r\n \r\nFrom: a\r\n\r\n", "k1"),
            (b"X-Bird-Idempotency-Key: a\r\n b\r\n\r\n", "a b"),
            (b"X-Bird-Idempotency-Key: a\r\n\tb\r\n\r\n", "invalid"),
            (b"X-Bird-Idempotency-Key:\r\n \r\n\r\n", "invalid"),
            // Bare CR or LF inside the header section.
            (b"Subject: s\rX-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            (b"Subject: s\nX-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            (b"Subject: s\n\nX-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            (b"X-Bird-Idempotency-Key: k1\rk2\r\n\r\n", "refused"),
            (b"X-Bird-Idempotency-Key: a\rb\r\n\r\n", "refused"),
            (b"Subject: s\rt\r\nX-Bird-Idempotency-Key: k1\r\n\r\n", "refused"),
            (b"Subject: s\rt\r\n\r\n", "absent"),
            // Names that only resemble the key's, and the name inside a value.
            (b"X-Bird-Idempotency-Keys: k1\r\n\r\n", "absent"),
            (b"XX-Bird-Idempotency-Key: k1\r\n\r\n", "absent"),
            (b"Subject: X-Bird-Idempotency-Key: k1\r\n\r\n", "absent"),
            // Only the header section counts, however the body looks.
            (b"From: a\r\n\r\nX-Bird-Idempotency-Key: k1\r\n garbage\r\n", "absent"),
            (b"\r\nX-Bird-Idempotency-Key: k1\r\n", "absent"),
            // Duplicates.
            (b"X-Bird-Idempotency-Key: k1\r\nx-bird-idempotency-key:  k1\r\n\r\n", "k1"),
            (b"X-Bird-Idempotency-Key: k1\r\nX-Bird-Idempotency-Key: k2\r\n\r\n", "invalid"),
        ];
        for (message, want) in cases {
            let shown = String::from_utf8_lossy(message);
            assert_eq!(outcome(message), *want, "{shown:?}");
        }
    }

    #[test]
    fn key_fields_span_name_to_final_crlf() {
        let msg = b"A: b\r\nX-Bird-Idempotency-Key : k1\r\n c\r\nD: e\r\nx-bird-idempotency-key:k2";
        let read = read_key_fields(msg);
        assert_eq!(read.fields, vec![6..39, 45..msg.len()]);
        assert_eq!(read.values, vec![b" k1\r\n c".to_vec(), b"k2".to_vec()]);
        assert!(!read.ambiguous);
    }
}
