//! How the human log writes a record's fields: one record, one line, whatever the values.
//!
//! Many values come from outside: a webhook path (no authentication needed), a Message-ID, an
//! operator's reason, an error text. tracing-subscriber's default field formatter writes them
//! raw, so a `\n` in one starts what looks like a record of its own and an ESC drives the
//! operator's terminal. Here every value is written logfmt-style: bare when it is a plain
//! word, otherwise in double quotes with `"` and `\` escaped and every control character as
//! `\n`, `\r`, `\t` or `\u{1b}`; and each is cut to a bounded length, with the length it had.
//! The message is escaped the same way but not quoted (it is prose). The rest of the line
//! (time, level, target) is the relay's own.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// The longest field value written, in characters; the rest is replaced by its length.
pub const MAX_VALUE_CHARS: usize = 256;
/// The longest message written, in characters.
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// The field formatter of the human log (see the module's description).
#[derive(Debug, Default, Clone, Copy)]
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = Visitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Visitor<'writer> {
    writer: Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl Visitor<'_> {
    fn write(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // tracing-log's metadata fields, which the default formatter leaves out too.
        if name.starts_with("log.") {
            return;
        }
        let mut out = String::new();
        if !self.first {
            out.push(' ');
        }
        self.first = false;
        if name == "message" {
            escape_into(&mut out, value, MAX_MESSAGE_CHARS);
        } else {
            // A raw identifier's `r#` is no part of the name a reader greps for.
            out.push_str(name.strip_prefix("r#").unwrap_or(name));
            out.push('=');
            quote_into(&mut out, value);
        }
        self.result = self.writer.write_str(&out);
    }
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.write(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        self.write(field, &text);
    }
}

/// A value as a logfmt token: bare when it is a plain word, else quoted and escaped. A value
/// that already is one well-formed quoted token (what `?` gives a string: Debug quotes and
/// escapes it) is kept as it is rather than quoted twice.
pub fn quote_into(out: &mut String, value: &str) {
    let short = value.chars().count() <= MAX_VALUE_CHARS;
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '=' | '\\'));
    if short && (plain || is_quoted_token(value)) {
        out.push_str(value);
    } else {
        out.push('"');
        escape_into(out, value, MAX_VALUE_CHARS);
        out.push('"');
    }
}

/// `"..."` with every `"` and `\` inside escaped and no control character: one token that a
/// logfmt reader takes whole.
fn is_quoted_token(value: &str) -> bool {
    let Some(inner) = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .filter(|_| value.len() >= 2)
    else {
        return false;
    };
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.next().is_none_or(char::is_control) => return false,
            '"' => return false,
            c if c.is_control() => return false,
            _ => {}
        }
    }
    true
}

/// `value` with `"` and `\` escaped and control characters spelled out, cut after `max`
/// characters with a note of the whole length in bytes.
pub fn escape_into(out: &mut String, value: &str, max: usize) {
    for (i, c) in value.chars().enumerate() {
        if i == max {
            let _ = write!(out, "…(cut, {} bytes)", value.len());
            return;
        }
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // Other C0 and C1 controls, DEL, and the line and paragraph separators that some
            // viewers break lines at.
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quoted(value: &str) -> String {
        let mut out = String::new();
        quote_into(&mut out, value);
        out
    }

    #[test]
    fn values_are_bare_quoted_or_kept() {
        assert_eq!(quoted("01ABC"), "01ABC");
        assert_eq!(quoted("a b"), r#""a b""#);
        assert_eq!(quoted(""), r#""""#);
        assert_eq!(quoted("k=v"), r#""k=v""#);
        assert_eq!(
            quoted("x\n2026-12-04T00:00:00Z INFO forged\r\x1b[2K"),
            r#""x\n2026-12-04T00:00:00Z INFO forged\r\u{1b}[2K""#
        );
        assert_eq!(quoted(r#"say "hi" \ bye"#), r#""say \"hi\" \\ bye""#);
        // What `?` makes of a string is kept; a look-alike that is not one token is quoted.
        assert_eq!(quoted(r#""a\nb""#), r#""a\nb""#);
        assert_eq!(quoted(r#""a" b="c""#), r#""\"a\" b=\"c\"""#);
        assert_eq!(quoted("\"a\\\n\""), r#""\"a\\\n\"""#);
        assert_eq!(quoted("\u{85}"), r#""\u{85}""#);
    }

    #[test]
    fn long_values_are_cut_with_their_length() {
        let long = "n".repeat(70_000);
        let out = quoted(&long);
        assert!(out.len() < MAX_VALUE_CHARS + 40, "{}", out.len());
        assert!(out.ends_with("…(cut, 70000 bytes)\""), "{out}");
        let mut message = String::new();
        escape_into(&mut message, &"é".repeat(2000), MAX_MESSAGE_CHARS);
        assert_eq!(
            message.chars().filter(|c| *c == 'é').count(),
            MAX_MESSAGE_CHARS
        );
        assert!(message.ends_with("(cut, 4000 bytes)"));
    }
}
