//! The header fields of a stored message, for the message page. Only the header section is
//! handed to the parser: the console never shows a body.

use mail_parser::MessageParser;

/// The bytes up to the blank line that ends the header section (all of them when there is
/// none, as in a message without a body).
pub(crate) fn header_section(content: &[u8]) -> &[u8] {
    let end = content
        .windows(2)
        .enumerate()
        .find_map(|(i, pair)| match pair {
            b"\n\n" => Some(i + 1),
            b"\n\r" if content.get(i + 2) == Some(&b'\n') => Some(i + 1),
            _ => None,
        })
        .unwrap_or(content.len());
    &content[..end]
}

/// Each field as (name, value) in message order, the value unfolded onto one line; bytes
/// that are not UTF-8 are shown replaced rather than dropped.
pub(crate) fn fields(content: &[u8]) -> Vec<(String, String)> {
    let section = header_section(content);
    let Some(parsed) = MessageParser::new().parse_headers(section) else {
        return Vec::new();
    };
    parsed
        .headers()
        .iter()
        .map(|h| {
            let raw = section
                .get(h.offset_start as usize..h.offset_end as usize)
                .unwrap_or_default();
            (
                h.name.as_str().to_string(),
                unfold(&String::from_utf8_lossy(raw)),
            )
        })
        .collect()
}

fn unfold(value: &str) -> String {
    value
        .split('\n')
        .map(|line| line.trim_end_matches('\r').trim())
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_come_unfolded_and_the_body_is_never_read() {
        let message =
            b"Subject: a long\r\n subject\r\nX-Key: <b>k</b>\r\n\r\nFrom: not-a-header\r\nbody\r\n";
        assert_eq!(
            fields(message),
            vec![
                ("Subject".to_string(), "a long subject".to_string()),
                ("X-Key".to_string(), "<b>k</b>".to_string()),
            ]
        );
        assert_eq!(
            header_section(message),
            b"Subject: a long\r\n subject\r\nX-Key: <b>k</b>\r\n"
        );
    }

    #[test]
    fn bare_lf_and_no_body() {
        assert_eq!(header_section(b"A: 1\nB: 2\n\nbody"), b"A: 1\nB: 2\n");
        assert_eq!(header_section(b"A: 1\r\n"), b"A: 1\r\n");
        let odd = fields(b"A: caf\xe9\r\n\r\n");
        assert_eq!(odd, vec![("A".to_string(), "caf\u{fffd}".to_string())]);
        assert!(fields(b"").is_empty());
    }
}
