//! The sink's own reading of the `X-Bird-Idempotency-Key` header: the key as the upstream sees
//! it (docs/concepts/contract.md "What the relay answers at the end of DATA"). Written apart from the relay's intake on purpose: the sink is the oracle the
//! tests check the relay against, so a bug in how the relay reads keys must show up as a
//! disagreement instead of being repeated here. Pure functions over the message bytes.

const KEY_HEADER: &[u8] = b"X-Bird-Idempotency-Key";
const MAX_KEY_CHARS: usize = 255;

/// What the sink makes of a message's key header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SinkKey {
    Absent,
    Present(String),
    /// Empty, longer than 255 characters, control characters, not UTF-8, or several copies
    /// that differ (E01001).
    Invalid,
}

impl SinkKey {
    pub(crate) fn value(&self) -> Option<&str> {
        match self {
            SinkKey::Present(key) => Some(key),
            SinkKey::Absent | SinkKey::Invalid => None,
        }
    }
}

/// The key of a message (CRLF lines, after dot-unstuffing). Only the header section counts;
/// identical copies of the header count as one.
pub(crate) fn read_key(message: &[u8]) -> SinkKey {
    let mut found: Option<String> = None;
    for field in fields(header_section(message)) {
        if !field.name.eq_ignore_ascii_case(KEY_HEADER) {
            continue;
        }
        let Some(value) = key_value(&field.value) else {
            return SinkKey::Invalid;
        };
        match &found {
            Some(previous) if *previous != value => return SinkKey::Invalid,
            _ => found = Some(value),
        }
    }
    found.map_or(SinkKey::Absent, SinkKey::Present)
}

/// Everything before the first empty line (RFC 5322 §2.1), the CRLF of the last field
/// included; the whole message when it has no empty line.
fn header_section(message: &[u8]) -> &[u8] {
    if message.starts_with(b"\r\n") {
        return &[];
    }
    match message.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => &message[..at + 2],
        None => message,
    }
}

/// One header field: its name and its unfolded value (the text after the colon).
struct Field<'a> {
    name: &'a [u8],
    value: Vec<u8>,
}

/// The fields of a header section, unfolded: a line that starts with a space or a tab continues
/// the field above it, and unfolding removes only the CRLF before it (RFC 5322 §2.2.3). A line
/// that is neither a field nor a continuation is skipped, and so are the continuations after it.
fn fields(section: &[u8]) -> Vec<Field<'_>> {
    let mut out: Vec<Field<'_>> = Vec::new();
    let mut continuing = false;
    for line in crlf_lines(section) {
        if line.first().is_some_and(|&b| is_wsp(b)) {
            if continuing {
                if let Some(field) = out.last_mut() {
                    field.value.extend_from_slice(line);
                }
            }
            continue;
        }
        continuing = false;
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        // RFC 5322 §4.5 (obsolete syntax, which a reader must accept): space before the colon.
        let name = trim_wsp_end(&line[..colon]);
        if name.is_empty() || !name.iter().all(|&b| (33..=126).contains(&b)) {
            continue;
        }
        out.push(Field {
            name,
            value: line[colon + 1..].to_vec(),
        });
        continuing = true;
    }
    out
}

/// The key in an unfolded value: surrounding white space removed, then 1-255 characters of
/// UTF-8 without control characters.
fn key_value(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    let key = text.trim_matches([' ', '\t']);
    let chars = key.chars().count();
    if !(1..=MAX_KEY_CHARS).contains(&chars) || key.chars().any(char::is_control) {
        return None;
    }
    Some(key.to_string())
}

fn is_wsp(b: u8) -> bool {
    b == b' ' || b == b'\t'
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

/// The lines of a header section without their CRLF; a last line without CRLF counts too.
fn crlf_lines(mut rest: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let line;
        (line, rest) = match rest.windows(2).position(|w| w == b"\r\n") {
            Some(at) => (&rest[..at], &rest[at + 2..]),
            None => (rest, &[][..]),
        };
        Some(line)
    })
}

#[cfg(test)]
mod tests {
    use super::{read_key, SinkKey};

    fn key(message: &str) -> SinkKey {
        read_key(message.as_bytes())
    }

    fn present(k: &str) -> SinkKey {
        SinkKey::Present(k.to_string())
    }

    #[test]
    fn plain_header() {
        assert_eq!(
            key("From: a@b\r\nX-Bird-Idempotency-Key: inv-42\r\n\r\nbody\r\n"),
            present("inv-42")
        );
        assert_eq!(key("From: a@b\r\n\r\nbody\r\n"), SinkKey::Absent);
        assert_eq!(key(""), SinkKey::Absent);
    }

    #[test]
    fn name_is_case_insensitive() {
        for name in [
            "x-bird-idempotency-key",
            "X-BIRD-IDEMPOTENCY-KEY",
            "x-Bird-idempotency-KEY",
        ] {
            assert_eq!(key(&format!("{name}: k1\r\n\r\n")), present("k1"), "{name}");
        }
        // Neither a prefix nor a longer name is the header.
        assert_eq!(key("X-Bird-Idempotency: k1\r\n\r\n"), SinkKey::Absent);
        assert_eq!(key("X-Bird-Idempotency-Keys: k1\r\n\r\n"), SinkKey::Absent);
        assert_eq!(key("XX-Bird-Idempotency-Key: k1\r\n\r\n"), SinkKey::Absent);
    }

    #[test]
    fn folded_values_are_unfolded() {
        // The value starts on the next line.
        assert_eq!(
            key("X-Bird-Idempotency-Key:\r\n inv-42\r\nSubject: x\r\n\r\n"),
            present("inv-42")
        );
        // Unfolding keeps the white space that followed the CRLF, and a tab inside a key is
        // a control character.
        assert_eq!(
            key("X-Bird-Idempotency-Key: part-one\r\n\tpart-two\r\n\r\n"),
            SinkKey::Invalid
        );
        assert_eq!(
            key("X-Bird-Idempotency-Key: a\r\n  b\r\n c\r\n\r\n"),
            present("a  b c")
        );
        // A continuation line belongs to the field above it, not to the key header.
        assert_eq!(
            key("Subject: hello\r\n X-Bird-Idempotency-Key: k1\r\n\r\n"),
            SinkKey::Absent
        );
    }

    #[test]
    fn surrounding_white_space_is_not_part_of_the_key() {
        assert_eq!(
            key("X-Bird-Idempotency-Key: \t k1 \t\r\n\r\n"),
            present("k1")
        );
        assert_eq!(key("X-Bird-Idempotency-Key:k1\r\n\r\n"), present("k1"));
        // Obsolete syntax: white space before the colon.
        assert_eq!(key("X-Bird-Idempotency-Key : k1\r\n\r\n"), present("k1"));
        // Inner white space is kept.
        assert_eq!(key("X-Bird-Idempotency-Key: k 1\r\n\r\n"), present("k 1"));
    }

    #[test]
    fn duplicates() {
        let same =
            "X-Bird-Idempotency-Key: k1\r\nSubject: s\r\nx-bird-idempotency-key:  k1\r\n\r\n";
        assert_eq!(key(same), present("k1"));
        let folded_same = "X-Bird-Idempotency-Key: k1\r\nX-Bird-Idempotency-Key:\r\n k1\r\n\r\n";
        assert_eq!(key(folded_same), present("k1"));
        let differing = "X-Bird-Idempotency-Key: k1\r\nX-Bird-Idempotency-Key: k2\r\n\r\n";
        assert_eq!(key(differing), SinkKey::Invalid);
        let one_bad = "X-Bird-Idempotency-Key: k1\r\nX-Bird-Idempotency-Key: \r\n\r\n";
        assert_eq!(key(one_bad), SinkKey::Invalid);
    }

    #[test]
    fn only_the_header_section_counts() {
        assert_eq!(
            key("Subject: s\r\n\r\nX-Bird-Idempotency-Key: in-body\r\n"),
            SinkKey::Absent
        );
        assert_eq!(
            key("X-Bird-Idempotency-Key: k1\r\n\r\nX-Bird-Idempotency-Key: k2\r\n"),
            present("k1")
        );
        // A message that starts with the empty line has no header section.
        assert_eq!(key("\r\nX-Bird-Idempotency-Key: k1\r\n"), SinkKey::Absent);
        // Without an empty line the whole message is header, last line without CRLF too.
        assert_eq!(
            key("Subject: s\r\nX-Bird-Idempotency-Key: k1"),
            present("k1")
        );
    }

    #[test]
    fn lines_that_are_not_fields_are_skipped() {
        assert_eq!(
            key("Subject: s\r\nnot a field\r\nX-Bird-Idempotency-Key: k1\r\n\r\n"),
            present("k1")
        );
        // The continuation of a line that is not a field is not a key either.
        assert_eq!(
            key("garbage\r\n X-Bird-Idempotency-Key: k1\r\n\r\n"),
            SinkKey::Absent
        );
    }

    #[test]
    fn invalid_values() {
        let long = format!("X-Bird-Idempotency-Key: {}\r\n\r\n", "k".repeat(256));
        let longest = "\u{e9}".repeat(255);
        let at_limit = format!("X-Bird-Idempotency-Key: {longest}\r\n\r\n");
        let cases: &[(&[u8], SinkKey)] = &[
            (b"X-Bird-Idempotency-Key:\r\n\r\n", SinkKey::Invalid),
            (b"X-Bird-Idempotency-Key:   \r\n\r\n", SinkKey::Invalid),
            (b"X-Bird-Idempotency-Key:\r\n \r\n\r\n", SinkKey::Invalid),
            (b"X-Bird-Idempotency-Key: a\x01b\r\n\r\n", SinkKey::Invalid),
            (b"X-Bird-Idempotency-Key: a\x7fb\r\n\r\n", SinkKey::Invalid),
            (
                b"X-Bird-Idempotency-Key: \xff\xfe\r\n\r\n",
                SinkKey::Invalid,
            ),
            (long.as_bytes(), SinkKey::Invalid),
            // 255 characters is the limit, counted in characters rather than bytes.
            (at_limit.as_bytes(), SinkKey::Present(longest.clone())),
        ];
        for (message, want) in cases {
            assert_eq!(
                &read_key(message),
                want,
                "{}",
                String::from_utf8_lossy(message)
            );
        }
    }
}
