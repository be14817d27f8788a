//! Finding messages the sink received: the filters of `GET /messages` (and of any view that
//! lists them), free of I/O.

use std::collections::BTreeMap;

use mail_parser::{MessageParser, PartType};

use super::state::ReceivedMessage;

/// Query parameters as given, refusing any name not in `allowed` and any name given twice (a
/// silently ignored filter would return unrelated messages).
pub(crate) fn query_params(
    pairs: Vec<(String, String)>,
    allowed: &[&str],
) -> Result<BTreeMap<String, String>, String> {
    let mut params = BTreeMap::new();
    for (name, value) in pairs {
        if !allowed.contains(&name.as_str()) {
            return Err(format!(
                "unknown filter {name:?} (known: {})",
                allowed.join(", ")
            ));
        }
        if params.insert(name.clone(), value).is_some() {
            return Err(format!("filter {name:?} given twice"));
        }
    }
    Ok(params)
}

/// Which messages a list shows; every filter given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MessageFilter {
    /// The `X-Bird-Idempotency-Key`, exactly.
    pub key: Option<String>,
    /// A recipient contains this, ASCII case-insensitive (as the fault rules' `rcpt`).
    pub rcpt: Option<String>,
    /// The subject or the body text contains this, case-insensitive.
    pub text: Option<String>,
}

impl MessageFilter {
    pub(super) const NAMES: &'static [&'static str] = &["key", "rcpt", "text"];

    pub(crate) fn from_query(pairs: Vec<(String, String)>) -> Result<MessageFilter, String> {
        let mut params = query_params(pairs, Self::NAMES)?;
        Ok(MessageFilter {
            key: params.remove("key"),
            rcpt: params.remove("rcpt"),
            text: params.remove("text"),
        })
    }

    /// Whether no filter is given (everything matches).
    pub(crate) fn is_empty(&self) -> bool {
        self == &MessageFilter::default()
    }

    pub(crate) fn matches(&self, m: &ReceivedMessage) -> bool {
        self.matches_parts(m.key.as_deref(), &m.rcpt_to, &m.bytes)
    }

    /// The same test on a message's parts, for transactions (which carry them too).
    pub(crate) fn matches_parts(
        &self,
        key: Option<&str>,
        rcpt_to: &[String],
        bytes: &[u8],
    ) -> bool {
        if self.key.as_deref().is_some_and(|k| key != Some(k)) {
            return false;
        }
        if let Some(rcpt) = &self.rcpt {
            let rcpt = rcpt.to_ascii_lowercase();
            if !rcpt_to
                .iter()
                .any(|r| r.to_ascii_lowercase().contains(&rcpt))
            {
                return false;
            }
        }
        match &self.text {
            Some(text) => {
                let text = text.to_lowercase();
                let content = Content::of(bytes);
                content
                    .subject
                    .is_some_and(|s| s.to_lowercase().contains(&text))
                    || content.body.to_lowercase().contains(&text)
            }
            None => true,
        }
    }
}

/// What a person reads of a message: its subject and its text, decoded (encoded words,
/// quoted-printable, base64, charsets).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Content {
    pub subject: Option<String>,
    /// The text parts (an HTML-only message: its HTML converted to text).
    pub body: String,
}

impl Content {
    pub(crate) fn of(bytes: &[u8]) -> Content {
        let Some(parsed) = MessageParser::new().parse(bytes) else {
            return Content {
                subject: None,
                body: String::from_utf8_lossy(bytes).into_owned(),
            };
        };
        let body = (0..parsed.text_body_count())
            .filter_map(|i| parsed.body_text(i))
            .collect::<Vec<_>>()
            .join("\n");
        Content {
            subject: parsed.subject().map(str::to_string),
            body,
        }
    }
}

/// A message's readable parts, as a mail client shows them: each text/plain body part and
/// each text/html body part, decoded (attachments left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rendered {
    pub text: Vec<String>,
    /// The HTML as sent: to be shown only in a sandbox, never in the sink's own origin.
    pub html: Vec<String>,
}

impl Rendered {
    pub(crate) fn of(bytes: &[u8]) -> Rendered {
        let Some(parsed) = MessageParser::new().parse(bytes) else {
            return Rendered::default();
        };
        // The body lists hold a text part where no HTML alternative exists and the reverse:
        // each part once, told apart by its own type.
        let mut ids: Vec<u32> = parsed
            .text_body
            .iter()
            .chain(&parsed.html_body)
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut rendered = Rendered::default();
        for id in ids {
            match parsed.part(id).map(|p| &p.body) {
                Some(PartType::Text(text)) => rendered.text.push(text.to_string()),
                Some(PartType::Html(html)) => rendered.html.push(html.to_string()),
                _ => {}
            }
        }
        rendered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(key: Option<&str>, rcpt: &[&str], bytes: &str) -> ReceivedMessage {
        ReceivedMessage {
            id: "S1".into(),
            key: key.map(str::to_string),
            mail_from: "a@example.com".into(),
            rcpt_to: rcpt.iter().map(|r| r.to_string()).collect(),
            eightbitmime: false,
            smtputf8: false,
            bytes: bytes.as_bytes().to_vec(),
            blake3: String::new(),
            received_at_ms: 0,
            tls: false,
            auth_user: None,
            mail_command: String::new(),
            rcpt_commands: Vec::new(),
        }
    }

    fn filter(query: &[(&str, &str)]) -> Result<MessageFilter, String> {
        MessageFilter::from_query(
            query
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn rendered_parts_are_each_body_part_once_decoded() {
        let alternative = "Subject: s\r\nMIME-Version: 1.0\r\n\
            Content-Type: multipart/alternative; boundary=b\r\n\r\n\
            --b\r\nContent-Type: text/plain; charset=utf-8\r\n\
            Content-Transfer-Encoding: quoted-printable\r\n\r\nGr=C3=BC=C3=9Fe\r\n\
            --b\r\nContent-Type: text/html\r\n\r\n<p>Hi <b>there</b></p>\r\n--b--\r\n";
        let r = Rendered::of(alternative.as_bytes());
        assert_eq!(r.text, vec!["Grüße".to_string()]);
        assert_eq!(r.html.len(), 1);
        assert!(r.html[0].contains("<b>there</b>"), "{r:?}");
        let plain = Rendered::of(b"Subject: s\r\n\r\njust text\r\n");
        assert_eq!(plain.text, vec!["just text\r\n".to_string()]);
        assert!(plain.html.is_empty());
        let html_only =
            Rendered::of(b"Subject: s\r\nContent-Type: text/html\r\n\r\n<i>only html</i>\r\n");
        assert!(html_only.text.is_empty(), "{html_only:?}");
        assert_eq!(html_only.html.len(), 1);
    }

    #[test]
    fn unknown_or_repeated_filters_are_refused() {
        assert_eq!(filter(&[]).unwrap(), MessageFilter::default());
        let err = filter(&[("recipient", "x")]).unwrap_err();
        assert!(err.contains("unknown filter \"recipient\""), "{err}");
        assert!(err.contains("key, rcpt, text"), "{err}");
        let err = filter(&[("key", "a"), ("key", "b")]).unwrap_err();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn filters_match_key_recipient_subject_and_decoded_body() {
        let plain = message(
            Some("k-1"),
            &["Bob@Example.com", "carol@example.org"],
            "Subject: Invoice 42\r\n\r\nPlease pay.\r\n",
        );
        // Subject as an encoded word, body in base64: both are searched decoded.
        let encoded = message(
            None,
            &["dave@example.net"],
            "Subject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\nMIME-Version: 1.0\r\n\
             Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n\
             aGVsbG8gd29ybGQ=\r\n",
        );
        // (query, matches the plain message, matches the encoded one)
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, bool);
        let cases: &[Case] = &[
            (&[], true, true),
            (&[("key", "k-1")], true, false),
            (&[("key", "k")], false, false),
            (&[("rcpt", "bob@example.COM")], true, false),
            (&[("rcpt", "example.")], true, true),
            (&[("rcpt", "nobody")], false, false),
            (&[("text", "invoice")], true, false),
            (&[("text", "PLEASE PAY")], true, false),
            (&[("text", "grüße")], false, true),
            (&[("text", "hello world")], false, true),
            (&[("text", "aGVsbG8")], false, false),
            (&[("key", "k-1"), ("text", "hello")], false, false),
        ];
        for (query, want_plain, want_encoded) in cases {
            let f = filter(query).unwrap();
            assert_eq!(f.matches(&plain), *want_plain, "{query:?} plain");
            assert_eq!(f.matches(&encoded), *want_encoded, "{query:?} encoded");
        }
    }
}
