//! From what a program writes to sendmail's standard input to the envelope and bytes that are
//! submitted. Pure: no I/O, no clock, no randomness, so the same input and options give the
//! same bytes every time, and a caller's retry is a replay at the relay (its derived key is a
//! digest of the message).

use std::ops::Range;

use base64::Engine as _;
use mail_parser::{Address, HeaderName, MessageParser};

/// Reads standard input line by line with sendmail's rules:
/// - a leading mbox `From ` line (also `>From `) is dropped, as Postfix's sendmail does;
/// - without `-i`, a line holding a lone `.` ends the message;
/// - every line ends in CRLF, whatever it ended in (LF, CRLF, or nothing at the end of the
///   input); a CR inside a line also ends it, because the relay refuses bare CRs (SMTP
///   smuggling) and a program's progress output is full of them.
pub(crate) struct Input {
    dot_ends_input: bool,
    limit: usize,
    leading: bool,
    message: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fed {
    More,
    /// A lone dot: the message is complete (the rest of the input is not read).
    End,
    /// The message has grown past the limit.
    TooLarge,
}

impl Input {
    pub(crate) fn new(dot_ends_input: bool, limit: usize) -> Input {
        Input {
            dot_ends_input,
            limit,
            leading: true,
            message: Vec::new(),
        }
    }

    /// One line as read, with its LF if it had one.
    pub(crate) fn feed_line(&mut self, line: &[u8]) -> Fed {
        let mut line = line.strip_suffix(b"\n").unwrap_or(line);
        while let Some(rest) = line.strip_suffix(b"\r") {
            line = rest;
        }
        if self.leading {
            let unquoted = &line[line.iter().take_while(|&&b| b == b'>').count()..];
            if unquoted.starts_with(b"From ") {
                return Fed::More;
            }
            self.leading = false;
        }
        if self.dot_ends_input && line == b"." {
            return Fed::End;
        }
        for piece in line.split(|&b| b == b'\r') {
            self.message.extend_from_slice(piece);
            self.message.extend_from_slice(b"\r\n");
        }
        if self.message.len() > self.limit {
            return Fed::TooLarge;
        }
        Fed::More
    }

    pub(crate) fn into_message(self) -> Vec<u8> {
        self.message
    }
}

/// The header section of a CRLF message, as fields with their byte ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeaderSection {
    /// Lowercased name and range (continuation lines and the final CRLF included).
    fields: Vec<(String, Range<usize>)>,
    /// Where the body starts (after the empty line, when there is one).
    body: usize,
    /// The header section ended with an empty line.
    separated: bool,
}

/// The field name of a header line (`Name:` or the obsolete `Name :`), if it is one.
fn field_name(line: &[u8]) -> Option<&[u8]> {
    let colon = line.iter().position(|&b| b == b':')?;
    let name = line[..colon].trim_ascii_end();
    let ftext = |b: &u8| (33..=126).contains(b) && *b != b':';
    (!name.is_empty()
        && name.iter().all(ftext)
        && line[name.len()..colon]
            .iter()
            .all(|&b| b == b' ' || b == b'\t'))
    .then_some(name)
}

/// Splits off the header section. A line that is neither a field, a continuation nor empty
/// ends it (the body starts there without an empty line); a message without fields is all
/// body.
fn header_section(message: &[u8]) -> HeaderSection {
    let mut fields: Vec<(String, Range<usize>)> = Vec::new();
    let mut pos = 0;
    while pos < message.len() {
        let end = message[pos..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(message.len(), |i| pos + i + 2);
        let line = &message[pos..end];
        if line == b"\r\n" {
            return HeaderSection {
                fields,
                body: end,
                separated: true,
            };
        }
        let continuation = matches!(line.first(), Some(b' ' | b'\t'));
        match fields.last_mut() {
            Some((_, range)) if continuation => range.end = end,
            _ => match field_name(line) {
                Some(name) if !continuation => {
                    fields.push((String::from_utf8_lossy(name).to_ascii_lowercase(), pos..end))
                }
                _ => break,
            },
        }
        pos = end;
    }
    HeaderSection {
        fields,
        body: pos,
        separated: false,
    }
}

/// A bare name (`root`) is how local users are addressed on a sendmail command line and in
/// cron's `To: root`; mail-parser reads it as a display name without an address.
fn is_local_part(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "()<>[]:;@\\,\"".contains(c))
}

/// The envelope addresses in a parsed address field, in order.
fn envelope_addresses(address: &Address<'_>) -> Vec<String> {
    address
        .iter()
        .filter_map(|a| match (a.name.as_deref(), a.address.as_deref()) {
            // mail-parser splits `"john doe"@example.com` into a name and `@example.com`.
            (Some(name), Some(addr)) if addr.starts_with('@') => Some(format!(
                "\"{}\"{addr}",
                name.replace('\\', "\\\\").replace('"', "\\\"")
            )),
            (_, Some(addr)) => Some(addr.trim().to_string()),
            (Some(name), None) if is_local_part(name.trim()) => Some(name.trim().to_string()),
            _ => None,
        })
        .filter(|a| !a.is_empty())
        .collect()
}

/// Addresses from one command-line argument, read as the value of an address field
/// (`a@x, "B" <b@y>`), as sendmail does.
fn argument_addresses(arg: &str) -> Vec<String> {
    let field = format!("To: {arg}\r\n\r\n");
    let parsed = MessageParser::new()
        .header_address(HeaderName::To)
        .parse_headers(field.as_bytes());
    parsed
        .as_ref()
        .and_then(|m| m.to())
        .map(envelope_addresses)
        .unwrap_or_default()
}

/// `user` → `user@domain`; qualified addresses stay as they are.
fn qualify(address: String, domain: &str) -> String {
    if address.contains('@') {
        address
    } else {
        format!("{address}@{domain}")
    }
}

/// The `-f` value: `<>` or empty is the null sender; otherwise its first address.
fn parse_sender(value: &str) -> Result<String, PrepareError> {
    let value = value.trim();
    if value.is_empty() || value == "<>" {
        return Ok(String::new());
    }
    argument_addresses(value)
        .into_iter()
        .next()
        .ok_or_else(|| PrepareError::BadSender(value.to_string()))
}

/// What the command line says about the message.
#[derive(Debug, Clone, Default)]
pub(crate) struct Draft<'a> {
    /// `-t`
    pub extract_recipients: bool,
    /// Command-line recipients (each possibly a list).
    pub recipients: &'a [String],
    /// `-f`/`-r` as given.
    pub sender: Option<&'a str>,
    /// `-F`
    pub full_name: Option<&'a str>,
    /// `-B`
    pub eight_bit: Option<bool>,
    /// The domain for unqualified addresses (the configuration's `hostname`).
    pub domain: &'a str,
    /// The login name of the user running sendmail, when it is known.
    pub login: Option<&'a str>,
}

/// The submission: envelope and exact bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prepared {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub message: Vec<u8>,
    /// BODY=8BITMIME
    pub eight_bit: bool,
    /// SMTPUTF8 (an envelope address is not ASCII)
    pub smtputf8: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PrepareError {
    /// No recipient on the command line, nor (with `-t`) in the header.
    NoRecipients {
        extract: bool,
    },
    /// The sender has to be `login@domain` and the login name is unknown.
    NoLogin,
    BadSender(String),
}

impl std::fmt::Display for PrepareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrepareError::NoRecipients { extract: true } => {
                f.write_str("no recipients: none on the command line and no To, Cc or Bcc address in the message")
            }
            PrepareError::NoRecipients { extract: false } => {
                f.write_str("no recipients given (name them as arguments, or use -t to read To, Cc and Bcc)")
            }
            PrepareError::NoLogin => f.write_str(
                "cannot tell who is sending: no -f, no From: field, and no login name for this user id",
            ),
            PrepareError::BadSender(s) => write!(f, "-f {s:?} holds no address"),
        }
    }
}

/// The From: field sendmail adds to a message without one: `From: "Full Name" <address>`
/// with `-F`, `From: address` without.
fn from_field(address: &str, full_name: Option<&str>) -> String {
    match full_name.map(str::trim).filter(|n| !n.is_empty()) {
        Some(name) if name.is_ascii() => format!(
            "From: \"{}\" <{address}>\r\n",
            name.replace('\\', "\\\\").replace('"', "\\\"")
        ),
        // RFC 2047: a header field is ASCII unless the message says otherwise.
        Some(name) => format!(
            "From: =?UTF-8?B?{}?= <{address}>\r\n",
            base64::engine::general_purpose::STANDARD.encode(name)
        ),
        None => format!("From: {address}\r\n"),
    }
}

/// Fields the bytes sent never carry: blind copies stay blind, with or without `-t`, as
/// sendmail does.
fn is_blind(name: &str) -> bool {
    name == "bcc" || name == "resent-bcc"
}

pub(crate) fn prepare(message: &[u8], draft: &Draft<'_>) -> Result<Prepared, PrepareError> {
    let section = header_section(message);
    let fields_end = section.fields.last().map_or(0, |(_, r)| r.end);
    let parsed_fields = {
        let mut bytes = message[..fields_end].to_vec();
        bytes.extend_from_slice(b"\r\n");
        bytes
    };
    let parsed = MessageParser::new()
        .with_address_headers()
        .parse_headers(&parsed_fields);
    let field_addresses = |name: HeaderName<'static>| -> Vec<String> {
        let Some(parsed) = &parsed else {
            return Vec::new();
        };
        parsed
            .header_values(name)
            .filter_map(|v| v.as_address())
            .flat_map(envelope_addresses)
            .collect()
    };
    let has_from = section.fields.iter().any(|(name, _)| name == "from");
    let login_address = || {
        draft
            .login
            .map(|login| format!("{login}@{}", draft.domain))
            .ok_or(PrepareError::NoLogin)
    };

    let mail_from = match draft.sender {
        Some(value) => parse_sender(value)?,
        None => match field_addresses(HeaderName::From).into_iter().next() {
            Some(from) => from,
            None => login_address()?,
        },
    };
    let mail_from = if mail_from.is_empty() {
        mail_from
    } else {
        qualify(mail_from, draft.domain)
    };

    let mut rcpt_to: Vec<String> = Vec::new();
    let mut add = |address: String| {
        let address = qualify(address, draft.domain);
        if !rcpt_to.contains(&address) {
            rcpt_to.push(address);
        }
    };
    for arg in draft.recipients {
        argument_addresses(arg).into_iter().for_each(&mut add);
    }
    if draft.extract_recipients {
        // With Resent- fields the message is being resent: its recipients are those.
        let resent = section
            .fields
            .iter()
            .any(|(n, _)| matches!(n.as_str(), "resent-to" | "resent-cc" | "resent-bcc"));
        let names = if resent {
            [
                HeaderName::ResentTo,
                HeaderName::ResentCc,
                HeaderName::ResentBcc,
            ]
        } else {
            [HeaderName::To, HeaderName::Cc, HeaderName::Bcc]
        };
        for name in names {
            field_addresses(name).into_iter().for_each(&mut add);
        }
    }
    if rcpt_to.is_empty() {
        return Err(PrepareError::NoRecipients {
            extract: draft.extract_recipients,
        });
    }

    let mut out = Vec::with_capacity(message.len() + 128);
    for (name, range) in &section.fields {
        if !is_blind(name) {
            out.extend_from_slice(&message[range.clone()]);
        }
    }
    if !has_from {
        let address = if mail_from.is_empty() {
            login_address()?
        } else {
            mail_from.clone()
        };
        out.extend_from_slice(from_field(&address, draft.full_name).as_bytes());
    }
    let body = &message[section.body..];
    // A body that followed the fields without an empty line gets one: the message the
    // relay sees must say where its header ends.
    if section.separated || !body.is_empty() {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(body);

    let eight_bit = draft.eight_bit.unwrap_or(!out.is_ascii());
    let smtputf8 = !mail_from.is_ascii() || rcpt_to.iter().any(|r| !r.is_ascii());
    Ok(Prepared {
        mail_from,
        rcpt_to,
        message: out,
        eight_bit,
        smtputf8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(input: &[u8], dot_ends_input: bool) -> (Vec<u8>, Fed) {
        let mut reader = Input::new(dot_ends_input, 1 << 20);
        let mut last = Fed::More;
        for line in input.split_inclusive(|&b| b == b'\n') {
            last = reader.feed_line(line);
            if last != Fed::More {
                break;
            }
        }
        (reader.into_message(), last)
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).unwrap()
    }

    #[test]
    fn input_rules() {
        // (input, -i given, message)
        let rows: &[(&[u8], bool, &[u8])] = &[
            (b"a\nb\n", false, b"a\r\nb\r\n"),
            (b"a\r\nb\r\n", false, b"a\r\nb\r\n"),
            (b"a\nb", false, b"a\r\nb\r\n"),
            (b"a\r\r\nb\n", false, b"a\r\nb\r\n"),
            (b"50%\r100%\n", false, b"50%\r\n100%\r\n"),
            (b"a\n.\nafter\n", false, b"a\r\n"),
            (b"a\r\n.\r\nafter\r\n", false, b"a\r\n"),
            (b"a\n.", false, b"a\r\n"),
            (b"a\n.\nafter\n", true, b"a\r\n.\r\nafter\r\n"),
            (b"a\n..\nb\n", false, b"a\r\n..\r\nb\r\n"),
            (b"a\n. \nb\n", false, b"a\r\n. \r\nb\r\n"),
            (
                b"From me@x Mon Jan  1 00:00:00 2026\nSubject: s\n",
                false,
                b"Subject: s\r\n",
            ),
            (
                b">From me@x\nFrom x\nSubject: s\nFrom y\n",
                false,
                b"Subject: s\r\nFrom y\r\n",
            ),
            (b"", false, b""),
            (b".\n", false, b""),
        ];
        for (input, i_flag, want) in rows {
            let (got, _) = read(input, !i_flag);
            assert_eq!(text(&got), text(want), "{:?}", text(input));
        }
        assert_eq!(read(b"a\n.\nb\n", false).1, Fed::More);
        assert_eq!(read(b"a\n.\nb\n", true).1, Fed::End);
        let mut small = Input::new(true, 8);
        assert_eq!(small.feed_line(b"0123\n"), Fed::More);
        assert_eq!(small.feed_line(b"4567\n"), Fed::TooLarge);
    }

    fn draft<'a>(recipients: &'a [String]) -> Draft<'a> {
        Draft {
            recipients,
            domain: "host.example",
            login: Some("www-data"),
            ..Default::default()
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn recipients_from_arguments() {
        let args = strings(&[
            "a@example.com",
            "Bee <b@example.com>, c@example.com",
            "root",
            "a@example.com",
        ]);
        let p = prepare(b"From: s@example.com\r\n\r\nhi\r\n", &draft(&args)).unwrap();
        assert_eq!(
            p.rcpt_to,
            [
                "a@example.com",
                "b@example.com",
                "c@example.com",
                "root@host.example"
            ]
        );
        assert_eq!(p.mail_from, "s@example.com");
        assert_eq!(text(&p.message), "From: s@example.com\r\n\r\nhi\r\n");
        assert!(!p.eight_bit && !p.smtputf8);
    }

    #[test]
    fn t_reads_to_cc_and_bcc_and_drops_bcc() {
        let msg = b"From: App <app@example.com>\r\n\
To: Ann <ann@example.com>,\r\n  \"Doe, Bob\" <bob@example.com>\r\n\
Cc: team: carl@example.com, dora@example.com;\r\n\
Bcc: hidden@example.com,\r\n\tsecret@example.com\r\n\
Subject: s\r\n\
To: root\r\n\
bcc: third@example.com\r\n\
\r\n\
Bcc: in the body stays\r\n";
        let args = strings(&["extra@example.com"]);
        let mut d = draft(&args);
        d.extract_recipients = true;
        let p = prepare(msg, &d).unwrap();
        assert_eq!(
            p.rcpt_to,
            [
                "extra@example.com",
                "ann@example.com",
                "bob@example.com",
                "root@host.example",
                "carl@example.com",
                "dora@example.com",
                "hidden@example.com",
                "secret@example.com",
                "third@example.com",
            ]
        );
        assert_eq!(p.mail_from, "app@example.com");
        assert_eq!(
            text(&p.message),
            "From: App <app@example.com>\r\n\
To: Ann <ann@example.com>,\r\n  \"Doe, Bob\" <bob@example.com>\r\n\
Cc: team: carl@example.com, dora@example.com;\r\n\
Subject: s\r\n\
To: root\r\n\
\r\n\
Bcc: in the body stays\r\n"
        );
    }

    #[test]
    fn bcc_is_dropped_without_t_too() {
        let args = strings(&["a@example.com"]);
        let p = prepare(
            b"From: s@example.com\r\nBcc: b@example.com\r\n\r\nx\r\n",
            &draft(&args),
        )
        .unwrap();
        assert_eq!(p.rcpt_to, ["a@example.com"]);
        assert_eq!(text(&p.message), "From: s@example.com\r\n\r\nx\r\n");
    }

    #[test]
    fn resent_fields_name_the_recipients_of_a_resent_message() {
        let mut d = draft(&[]);
        d.extract_recipients = true;
        let p = prepare(
            b"From: s@example.com\r\nTo: old@example.com\r\nResent-To: new@example.com\r\nResent-Bcc: b@example.com\r\n\r\n",
            &d,
        )
        .unwrap();
        assert_eq!(p.rcpt_to, ["new@example.com", "b@example.com"]);
        assert!(!text(&p.message).contains("b@example.com"));
    }

    #[test]
    fn t_without_addresses_is_an_error() {
        let mut d = draft(&[]);
        d.extract_recipients = true;
        for msg in [
            &b"From: s@example.com\r\nSubject: x\r\n\r\n"[..],
            b"From: s@example.com\r\nTo: undisclosed-recipients:;\r\n\r\n",
        ] {
            assert_eq!(
                prepare(msg, &d),
                Err(PrepareError::NoRecipients { extract: true })
            );
        }
        assert_eq!(
            prepare(b"From: s@example.com\r\n\r\n", &draft(&[])),
            Err(PrepareError::NoRecipients { extract: false })
        );
    }

    #[test]
    fn sender_and_from_field() {
        let args = strings(&["r@example.com"]);
        // (-f, -F, message, MAIL FROM, From: field sent)
        type Row<'a> = (Option<&'a str>, Option<&'a str>, &'a str, &'a str, &'a str);
        let rows: &[Row] = &[
            // The message's From: is kept and, without -f, is the envelope sender.
            (
                None,
                Some("Ignored"),
                "From: Ann <ann@example.com>\r\n\r\n",
                "ann@example.com",
                "From: Ann <ann@example.com>",
            ),
            (
                Some("bounce@example.com"),
                None,
                "From: ann@example.com\r\n\r\n",
                "bounce@example.com",
                "From: ann@example.com",
            ),
            // No From: it is added from -f, with -F as its display name.
            (
                Some("app@example.com"),
                Some("The App"),
                "Subject: s\r\n\r\n",
                "app@example.com",
                "From: \"The App\" <app@example.com>",
            ),
            (
                Some("app@example.com"),
                None,
                "Subject: s\r\n\r\n",
                "app@example.com",
                "From: app@example.com",
            ),
            (
                Some("<app@example.com>"),
                None,
                "Subject: s\r\n\r\n",
                "app@example.com",
                "From: app@example.com",
            ),
            (
                Some("App <app@example.com>"),
                None,
                "Subject: s\r\n\r\n",
                "app@example.com",
                "From: app@example.com",
            ),
            (
                Some("cron"),
                Some("CronDaemon"),
                "Subject: s\r\n\r\n",
                "cron@host.example",
                "From: \"CronDaemon\" <cron@host.example>",
            ),
            (
                Some("a@example.com"),
                Some("Say \"hi\""),
                "Subject: s\r\n\r\n",
                "a@example.com",
                "From: \"Say \\\"hi\\\"\" <a@example.com>",
            ),
            (
                Some("a@example.com"),
                Some("Jörg"),
                "Subject: s\r\n\r\n",
                "a@example.com",
                "From: =?UTF-8?B?SsO2cmc=?= <a@example.com>",
            ),
            // Neither: the user running sendmail, at the configured host name.
            (
                None,
                None,
                "Subject: s\r\n\r\n",
                "www-data@host.example",
                "From: www-data@host.example",
            ),
            (
                None,
                Some("Web"),
                "Subject: s\r\n\r\n",
                "www-data@host.example",
                "From: \"Web\" <www-data@host.example>",
            ),
            // The null sender still needs a From: field.
            (
                Some("<>"),
                None,
                "Subject: s\r\n\r\n",
                "",
                "From: www-data@host.example",
            ),
            (
                Some(""),
                None,
                "From: a@example.com\r\n\r\n",
                "",
                "From: a@example.com",
            ),
            (
                None,
                None,
                "From: root\r\n\r\n",
                "root@host.example",
                "From: root",
            ),
        ];
        for (sender, name, msg, mail_from, from) in rows {
            let mut d = draft(&args);
            d.sender = *sender;
            d.full_name = *name;
            let p = prepare(msg.as_bytes(), &d).unwrap();
            assert_eq!(p.mail_from, *mail_from, "{sender:?} {msg:?}");
            let sent = text(&p.message);
            let got = sent.lines().find(|l| l.starts_with("From:")).unwrap();
            assert_eq!(got, *from, "{sender:?} {name:?} {msg:?}");
        }
        let mut d = draft(&args);
        d.login = None;
        assert_eq!(
            prepare(b"Subject: s\r\n\r\n", &d),
            Err(PrepareError::NoLogin)
        );
        d.sender = Some("Ann Smith");
        assert!(matches!(
            prepare(b"Subject: s\r\n\r\n", &d),
            Err(PrepareError::BadSender(_))
        ));
    }

    #[test]
    fn header_and_body_boundaries() {
        let args = strings(&["r@example.com"]);
        let d = draft(&args);
        // (input, sent)
        let rows: &[(&str, &str)] = &[
            // No header at all (`echo hi | sendmail r@example.com`).
            ("hi\r\n", "From: www-data@host.example\r\n\r\nhi\r\n"),
            ("", "From: www-data@host.example\r\n"),
            // The added From: goes after the last field, before the empty line.
            (
                "Subject: s\r\n\r\nbody\r\n",
                "Subject: s\r\nFrom: www-data@host.example\r\n\r\nbody\r\n",
            ),
            (
                "Subject: s\r\n",
                "Subject: s\r\nFrom: www-data@host.example\r\n",
            ),
            // A body line straight after the fields gets its empty line.
            (
                "Subject: s\r\nbody text\r\n",
                "Subject: s\r\nFrom: www-data@host.example\r\n\r\nbody text\r\n",
            ),
            (
                "From: a@example.com\r\nbody text\r\n",
                "From: a@example.com\r\n\r\nbody text\r\n",
            ),
            // Folded fields and the obsolete `Name :` form are fields.
            (
                "From : a@example.com\r\nSubject: a\r\n b\r\n\r\nx\r\n",
                "From : a@example.com\r\nSubject: a\r\n b\r\n\r\nx\r\n",
            ),
            // Untouched otherwise: same bytes out.
            (
                "From: a@example.com\r\n\r\n\r\n.\r\n..\r\n",
                "From: a@example.com\r\n\r\n\r\n.\r\n..\r\n",
            ),
        ];
        for (input, sent) in rows {
            let p = prepare(input.as_bytes(), &d).unwrap();
            assert_eq!(text(&p.message), *sent, "{input:?}");
        }
    }

    #[test]
    fn body_and_utf8_parameters() {
        let args = strings(&["r@example.com"]);
        let mut d = draft(&args);
        let p = prepare("From: a@example.com\r\n\r\nsmørrebrød\r\n".as_bytes(), &d).unwrap();
        assert!(p.eight_bit && !p.smtputf8);
        d.eight_bit = Some(false);
        let p = prepare("From: a@example.com\r\n\r\nsmørrebrød\r\n".as_bytes(), &d).unwrap();
        assert!(!p.eight_bit);
        d.eight_bit = Some(true);
        let p = prepare(b"From: a@example.com\r\n\r\nascii\r\n", &d).unwrap();
        assert!(p.eight_bit);
        let args = strings(&["jörg@bücher.example"]);
        let p = prepare(b"From: a@example.com\r\n\r\nx\r\n", &draft(&args)).unwrap();
        assert!(p.smtputf8);
    }

    #[test]
    fn same_input_same_bytes() {
        let args = strings(&["r@example.com"]);
        let mut d = draft(&args);
        d.full_name = Some("App");
        d.extract_recipients = true;
        let msg = b"To: x@example.com\r\nBcc: y@example.com\r\n\r\nbody\r\n";
        assert_eq!(prepare(msg, &d).unwrap(), prepare(msg, &d).unwrap());
    }
}
