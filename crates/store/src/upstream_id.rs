//! The upstream's own id for a message, read from its reply to the final dot. Upstream events
//! (webhooks) often name a message by that id alone, so it is stored with every accepted
//! attempt. Replies are free text: this knows the common shapes and otherwise takes the first
//! word that looks like an id (it holds a digit), never a status code or an "OK".

/// Words that are never the id, compared case-insensitively.
const NOT_AN_ID: &[&str] = &[
    "ok", "queued", "as", "id", "message", "accepted", "mail", "sent", "queue", "with",
];

/// The longest id kept: anything longer is not an id we can match on.
const MAX_ID: usize = 255;

/// The upstream's message id in a reply line such as `250 2.0.0 Ok: queued as 4F2C81234`,
/// `250 2.0.0 OK S000001 (idempotent replay)`, `250 OK id=1abc-2def` or
/// `250 Ok 0100018c...-000000`; `None` when the reply names none.
pub(crate) fn parse(reply: &str) -> Option<String> {
    let text = strip_codes(reply.lines().last().unwrap_or(""));
    let lower = text.to_ascii_lowercase();
    // Explicit markers first: whatever follows them is the id.
    for marker in ["queued as ", "id=", "id: ", "message-id: "] {
        if let Some(at) = lower.find(marker) {
            if let Some(id) = text[at + marker.len()..]
                .split_whitespace()
                .next()
                .and_then(clean)
            {
                return Some(id);
            }
        }
    }
    text.split_whitespace()
        .take_while(|word| !word.starts_with('('))
        .filter(|word| {
            let bare = word.trim_matches(|c: char| matches!(c, ':' | ',' | ';' | '.'));
            !NOT_AN_ID.iter().any(|w| bare.eq_ignore_ascii_case(w))
        })
        .filter_map(clean)
        .find(|word| word.bytes().any(|b| b.is_ascii_digit()))
}

/// The reply text without its basic code (`250`, `250-`) and enhanced code (`2.0.0`).
fn strip_codes(line: &str) -> &str {
    let line = line.trim();
    let rest = match line.get(..3) {
        Some(code) if code.bytes().all(|b| b.is_ascii_digit()) => {
            line[3..].trim_start_matches(['-', ' '])
        }
        _ => line,
    };
    let first = rest.split_whitespace().next().unwrap_or("");
    let enhanced = first.split('.').count() == 3
        && first
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if enhanced {
        rest[first.len()..].trim_start()
    } else {
        rest
    }
}

/// The word without surrounding brackets and punctuation, if it can be an id.
fn clean(word: &str) -> Option<String> {
    let id = word
        .trim_matches(|c: char| matches!(c, '<' | '>' | '[' | ']' | '(' | ')' | '"' | '\''))
        .trim_end_matches(['.', ',', ';', ':']);
    let plausible = !id.is_empty()
        && id.len() <= MAX_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@=+/:".contains(&b));
    plausible.then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn ids_in_the_replies_of_common_upstreams() {
        let table: &[(&str, Option<&str>)] = &[
            // Postfix
            ("250 2.0.0 Ok: queued as 4F2C81234", Some("4F2C81234")),
            ("250 2.0.0 Ok: queued as 4F2C81234.", Some("4F2C81234")),
            // idemrelay's sink (and idemrelay itself)
            ("250 2.0.0 OK S00000112AB34CD", Some("S00000112AB34CD")),
            (
                "250 2.0.0 OK S00000112AB34CD (idempotent replay)",
                Some("S00000112AB34CD"),
            ),
            ("250 2.0.0 OK <S000001>", Some("S000001")),
            ("250 2.0.0 OK queued as 0191ABCDEF", Some("0191ABCDEF")),
            // id= and SES
            ("250 OK id=1rX7ab-0004Kq-2c", Some("1rX7ab-0004Kq-2c")),
            (
                "250 Ok 0100018c4b5a1e2f-1a2b3c4d-5e6f-000000",
                Some("0100018c4b5a1e2f-1a2b3c4d-5e6f-000000"),
            ),
            // Exim
            ("250 OK id=1kXyZ9-000AbC-Qr", Some("1kXyZ9-000AbC-Qr")),
            // Multi-line reply: the last line
            (
                "250-first\r\n250 2.0.0 Ok: queued as ABC123",
                Some("ABC123"),
            ),
            // No id
            ("250 ok", None),
            ("250 2.0.0 OK", None),
            ("250 2.0.0 Message accepted for delivery", None),
            ("", None),
            ("250 2.0.0 OK (idempotent replay)", None),
        ];
        for (reply, id) in table {
            assert_eq!(parse(reply).as_deref(), *id, "{reply:?}");
        }
    }

    #[test]
    fn status_codes_are_never_taken_for_ids() {
        assert_eq!(parse("250 2.6.0 OK"), None);
        assert_eq!(parse("250 2.6.0 Queued 123abc").as_deref(), Some("123abc"));
    }
}
