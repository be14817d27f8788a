//! The MAIL FROM and RCPT TO command lines, read from the client's bytes (RFC 5321 §4.1.1.2,
//! §4.1.1.3 and §4.1.2; RFC 1870 SIZE, RFC 6152 BODY, RFC 6531 SMTPUTF8, RFC 3461 DSN's RET,
//! ENVID, NOTIFY and ORCPT, RFC 8689 REQUIRETLS). Pure.
//!
//! smtp-proto's parser unquotes and rewrites addresses (`<"">` becomes the null sender,
//! `<postmaster>` an empty recipient, invalid mailboxes pass through): these two commands are
//! read here instead, so the path is kept exactly as sent and judged by `address`.

use idemrelay_model::mail::requests::{
    check_envid, parse_notify, parse_orcpt, parse_ret, BadValue,
};

/// A MAIL or RCPT line split into its path and parameters, nothing judged yet but the shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathCommand<'a> {
    /// The text between `<` and `>`, as sent.
    pub path: &'a str,
    /// `keyword[=value]` parameters in order; keywords are unique (case-insensitively).
    pub params: Vec<Param<'a>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param<'a> {
    pub keyword: &'a str,
    pub value: Option<&'a str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineError {
    /// Not `FROM:<...>` / `TO:<...>` followed by parameters.
    Syntax,
    /// Bytes that are not UTF-8: no address can be read from them.
    NotUtf8,
    /// A parameter that is not `esmtp-keyword ["=" esmtp-value]`.
    BadParameter(String),
    /// The same parameter twice.
    Duplicate(String),
}

/// Which command a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Mail,
    Rcpt,
}

impl Verb {
    fn prefix(self) -> &'static str {
        match self {
            Verb::Mail => "FROM:",
            Verb::Rcpt => "TO:",
        }
    }
}

/// Parses a MAIL or RCPT line (CRLF removed). `args` is what follows the verb.
pub fn parse(verb: Verb, args: &[u8]) -> Result<PathCommand<'_>, LineError> {
    let args = std::str::from_utf8(args).map_err(|_| LineError::NotUtf8)?;
    let rest = args.strip_prefix(' ').ok_or(LineError::Syntax)?;
    let prefix = verb.prefix();
    let rest = rest
        .get(..prefix.len())
        .filter(|p| p.eq_ignore_ascii_case(prefix))
        .map(|_| &rest[prefix.len()..])
        .ok_or(LineError::Syntax)?;
    // RFC 5321 has no space after the colon, but many clients send one and most servers
    // accept it; it changes nothing about the path.
    let rest = rest.trim_start_matches(' ');
    let inner = rest.strip_prefix('<').ok_or(LineError::Syntax)?;
    let close = closing_bracket(inner).ok_or(LineError::Syntax)?;
    let path = &inner[..close];
    let tail = &inner[close + 1..];
    if !(tail.is_empty() || tail.starts_with([' ', '\t'])) {
        return Err(LineError::Syntax);
    }
    let mut params: Vec<Param<'_>> = Vec::new();
    for word in tail.split([' ', '\t']).filter(|w| !w.is_empty()) {
        let (keyword, value) = match word.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (word, None),
        };
        if !is_keyword(keyword) || value.is_some_and(|v| !is_value(v)) {
            return Err(LineError::BadParameter(keyword.to_ascii_uppercase()));
        }
        if params
            .iter()
            .any(|p| p.keyword.eq_ignore_ascii_case(keyword))
        {
            return Err(LineError::Duplicate(keyword.to_ascii_uppercase()));
        }
        params.push(Param { keyword, value });
    }
    Ok(PathCommand { path, params })
}

/// The `>` that closes the path. Two parts of a valid path may hold a `>` of their own: a
/// quoted local part (where a backslash escapes the next character) and an address literal
/// (General-address-literal's dcontent includes `>`, and `"` there means nothing).
fn closing_bracket(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = 0;
    // A source route (`@a,@b:`) holds neither; the local part starts after its colon.
    if bytes.first() == Some(&b'@') {
        i = bytes.iter().position(|&b| b == b':' || b == b'>')?;
        if bytes[i] == b'>' {
            return Some(i);
        }
        i += 1;
    }
    if bytes.get(i) == Some(&b'"') {
        i += 1;
        loop {
            match bytes.get(i)? {
                b'\\' => i += 2,
                b'"' => break,
                _ => i += 1,
            }
        }
        i += 1;
    }
    let mut in_literal = false;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'[' => in_literal = true,
            b']' => in_literal = false,
            b'>' if !in_literal => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// esmtp-keyword = (ALPHA / DIGIT) *(ALPHA / DIGIT / "-")
fn is_keyword(text: &str) -> bool {
    text.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// esmtp-value = 1*(%d33-60 / %d62-126), and UTF-8 under RFC 6531.
fn is_value(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| matches!(c, '!'..='<' | '>'..='~') || (!c.is_ascii() && !c.is_control()))
}

/// The MAIL parameters the relay implements.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MailParams {
    /// SIZE as sent (all digits; may exceed any integer type).
    pub size: Option<String>,
    pub eight_bit: bool,
    pub smtputf8: bool,
    /// RET's value as sent (RFC 3461 §4.3), validated.
    pub ret: Option<String>,
    /// ENVID's value as sent (RFC 3461 §4.4), validated.
    pub envid: Option<String>,
    /// REQUIRETLS (RFC 8689 §2); whether the session may carry it is the session's call.
    pub require_tls: bool,
}

/// The RCPT parameters the relay implements (RFC 3461 §4.1, §4.2), values as sent, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RcptParams {
    pub notify: Option<String>,
    pub orcpt: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamError {
    /// A known parameter with a value it cannot have (501), by keyword.
    Invalid(&'static str),
    /// A DSN or REQUIRETLS parameter with a value it cannot have (501); the text is the
    /// parameter's usage, which names it.
    Malformed(&'static str),
    /// A parameter this relay does not implement (555).
    Unsupported(String),
}

/// The usage a malformed DSN or REQUIRETLS parameter is answered with (501 5.5.4: RFC 3461
/// has a syntax error in a parameter's value answered 501; 5.5.4 is RFC 3463's "invalid
/// command arguments").
fn usage(bad: BadValue) -> &'static str {
    match bad {
        BadValue::Ret => "RET=FULL or RET=HDRS",
        BadValue::Envid => "ENVID=xtext (1 to 100 characters, printable ASCII once decoded)",
        BadValue::Notify => {
            "NOTIFY=NEVER or NOTIFY=SUCCESS,FAILURE,DELAY (one or more of the three)"
        }
        BadValue::Orcpt => "ORCPT=addr-type;xtext",
        BadValue::RequireTls => "REQUIRETLS (no value)",
    }
}

fn checked(
    value: Option<&str>,
    check: impl Fn(&str) -> Result<(), BadValue>,
    bad: BadValue,
) -> Result<String, ParamError> {
    let value = value.ok_or(ParamError::Malformed(usage(bad)))?;
    check(value).map_err(|b| ParamError::Malformed(usage(b)))?;
    Ok(value.to_string())
}

/// Reads MAIL's parameters: SIZE (RFC 1870), BODY=7BIT/8BITMIME (RFC 6152), SMTPUTF8, RET and
/// ENVID (RFC 3461) and REQUIRETLS (RFC 8689).
pub fn mail_params(params: &[Param<'_>]) -> Result<MailParams, ParamError> {
    let mut out = MailParams::default();
    for p in params {
        let keyword = p.keyword.to_ascii_uppercase();
        match (keyword.as_str(), p.value) {
            ("RET", v) => out.ret = Some(checked(v, |v| parse_ret(v).map(drop), BadValue::Ret)?),
            ("ENVID", v) => out.envid = Some(checked(v, check_envid, BadValue::Envid)?),
            ("REQUIRETLS", None) => out.require_tls = true,
            ("REQUIRETLS", Some(_)) => {
                return Err(ParamError::Malformed(usage(BadValue::RequireTls)))
            }
            ("SIZE", Some(v)) if v.bytes().all(|b| b.is_ascii_digit()) => {
                out.size = Some(v.to_string())
            }
            ("SIZE", _) => return Err(ParamError::Invalid("SIZE")),
            ("BODY", Some(v)) if v.eq_ignore_ascii_case("7BIT") => out.eight_bit = false,
            ("BODY", Some(v)) if v.eq_ignore_ascii_case("8BITMIME") => out.eight_bit = true,
            ("BODY", Some(v)) if v.eq_ignore_ascii_case("BINARYMIME") => {
                return Err(ParamError::Unsupported("BODY=BINARYMIME".into()))
            }
            ("BODY", _) => return Err(ParamError::Invalid("BODY")),
            ("SMTPUTF8", None) => out.smtputf8 = true,
            ("SMTPUTF8", Some(_)) => return Err(ParamError::Invalid("SMTPUTF8")),
            _ => return Err(ParamError::Unsupported(keyword)),
        }
    }
    Ok(out)
}

/// Reads RCPT's parameters: NOTIFY and ORCPT (RFC 3461). Every value is checked before an
/// unknown parameter is named, so a malformed value is a syntax error wherever it stands.
pub fn rcpt_params(params: &[Param<'_>]) -> Result<RcptParams, ParamError> {
    let mut out = RcptParams::default();
    let mut unsupported = None;
    for p in params {
        let keyword = p.keyword.to_ascii_uppercase();
        match keyword.as_str() {
            "NOTIFY" => {
                out.notify = Some(checked(
                    p.value,
                    |v| parse_notify(v).map(drop),
                    BadValue::Notify,
                )?)
            }
            "ORCPT" => {
                out.orcpt = Some(checked(
                    p.value,
                    |v| parse_orcpt(v).map(drop),
                    BadValue::Orcpt,
                )?)
            }
            _ => {
                unsupported.get_or_insert(keyword);
            }
        }
    }
    match unsupported {
        Some(keyword) => Err(ParamError::Unsupported(keyword)),
        None => Ok(out),
    }
}

/// Whether a SIZE value (all digits) exceeds `max`; a number too large for any integer type
/// exceeds every limit.
pub fn size_exceeds(size: &str, max: usize) -> bool {
    size.parse::<usize>().map_or(true, |n| n > max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(args: &str) -> Result<PathCommand<'_>, LineError> {
        parse(Verb::Mail, args.as_bytes())
    }

    #[test]
    fn shapes() {
        let c = mail(" FROM:<a@x>").unwrap();
        assert_eq!(c.path, "a@x");
        assert!(c.params.is_empty());
        assert_eq!(mail(" from:<>").unwrap().path, "");
        assert_eq!(mail(" FROM: <a@x>").unwrap().path, "a@x");
        assert_eq!(mail(" FROM:<\"a>b\"@x>").unwrap().path, "\"a>b\"@x");
        assert_eq!(mail(" FROM:<\"a\\\">\"@x>").unwrap().path, "\"a\\\">\"@x");
        assert_eq!(
            mail(" FROM:<app@\"\"\"\"\"\">").unwrap().path,
            "app@\"\"\"\"\"\""
        );
        // Quotes mean something only in the local part; `>` may sit in an address literal.
        assert_eq!(mail(" FROM:<\"\"@[a:\"]>").unwrap().path, "\"\"@[a:\"]");
        assert_eq!(mail(" FROM:<a@[x:>]> SIZE=1").unwrap().path, "a@[x:>]");
        assert_eq!(mail(" FROM:<@r:\">\"@x>").unwrap().path, "@r:\">\"@x");
        assert_eq!(mail(" FROM:<@r>").unwrap().path, "@r");
        assert_eq!(mail(" FROM:<a\"b>").unwrap().path, "a\"b");
        assert_eq!(mail(" FROM:<\"a>"), Err(LineError::Syntax));
        let c = mail(" FROM:<a@x> SIZE=10  body=8BITMIME\tSMTPUTF8 ").unwrap();
        assert_eq!(
            c.params,
            vec![
                Param {
                    keyword: "SIZE",
                    value: Some("10")
                },
                Param {
                    keyword: "body",
                    value: Some("8BITMIME")
                },
                Param {
                    keyword: "SMTPUTF8",
                    value: None
                },
            ]
        );
        for bad in [
            "",
            " FROM:",
            " FROM:a@x",
            " FROM:<a@x",
            " FROM:<a@x>SIZE=1",
            "FROM:<a@x>",
            " TO:<a@x>",
        ] {
            assert_eq!(mail(bad), Err(LineError::Syntax), "{bad:?}");
        }
        assert_eq!(parse(Verb::Rcpt, b" To:<b@x>").unwrap().path, "b@x");
        assert_eq!(
            parse(Verb::Mail, b" FROM:<\xff@x>"),
            Err(LineError::NotUtf8)
        );
    }

    #[test]
    fn parameters() {
        assert_eq!(
            mail(" FROM:<a@x> SIZE=1 size=2"),
            Err(LineError::Duplicate("SIZE".into()))
        );
        assert_eq!(
            mail(" FROM:<a@x> BODY=7BIT BODY=8BITMIME"),
            Err(LineError::Duplicate("BODY".into()))
        );
        assert_eq!(
            mail(" FROM:<a@x> SMTPUTF8 SMTPUTF8"),
            Err(LineError::Duplicate("SMTPUTF8".into()))
        );
        assert_eq!(
            mail(" FROM:<a@x> -X=1"),
            Err(LineError::BadParameter("-X".into()))
        );
        assert_eq!(
            mail(" FROM:<a@x> SIZE="),
            Err(LineError::BadParameter("SIZE".into()))
        );
        assert_eq!(
            mail(" FROM:<a@x> X=a=b"),
            Err(LineError::BadParameter("X".into()))
        );
        let p = |args| mail_params(&mail(args).unwrap().params);
        assert_eq!(
            p(" FROM:<a@x> SIZE=18446744073709551616 BODY=8bitmime SMTPUTF8"),
            Ok(MailParams {
                size: Some("18446744073709551616".into()),
                eight_bit: true,
                smtputf8: true,
                ..MailParams::default()
            })
        );
        assert_eq!(p(" FROM:<a@x> SIZE=12a"), Err(ParamError::Invalid("SIZE")));
        assert_eq!(p(" FROM:<a@x> SIZE=-1"), Err(ParamError::Invalid("SIZE")));
        assert_eq!(p(" FROM:<a@x> BODY=9BIT"), Err(ParamError::Invalid("BODY")));
        assert_eq!(
            p(" FROM:<a@x> SMTPUTF8=1"),
            Err(ParamError::Invalid("SMTPUTF8"))
        );
        assert_eq!(
            p(" FROM:<a@x> BODY=BINARYMIME"),
            Err(ParamError::Unsupported("BODY=BINARYMIME".into()))
        );
        assert_eq!(
            p(" FROM:<a@x> MT-PRIORITY=3"),
            Err(ParamError::Unsupported("MT-PRIORITY".into()))
        );
    }

    #[test]
    fn dsn_and_requiretls_parameters() {
        let p = |args| mail_params(&mail(args).unwrap().params);
        assert_eq!(
            p(" FROM:<a@x> ret=hdrs ENVID=QQ+2B1 REQUIRETLS"),
            Ok(MailParams {
                ret: Some("hdrs".into()),
                envid: Some("QQ+2B1".into()),
                require_tls: true,
                ..MailParams::default()
            })
        );
        for (args, usage) in [
            (" FROM:<a@x> RET=ALL", "RET=FULL or RET=HDRS"),
            (" FROM:<a@x> RET", "RET=FULL or RET=HDRS"),
            (
                " FROM:<a@x> ENVID=a+2",
                "ENVID=xtext (1 to 100 characters, printable ASCII once decoded)",
            ),
            (
                " FROM:<a@x> ENVID",
                "ENVID=xtext (1 to 100 characters, printable ASCII once decoded)",
            ),
            (" FROM:<a@x> REQUIRETLS=yes", "REQUIRETLS (no value)"),
        ] {
            assert_eq!(p(args), Err(ParamError::Malformed(usage)), "{args}");
        }
        let r = |args| rcpt_params(&parse(Verb::Rcpt, args).unwrap().params);
        assert_eq!(
            r(b" TO:<b@x> NOTIFY=success,delay ORCPT=rfc822;b+40x"),
            Ok(RcptParams {
                notify: Some("success,delay".into()),
                orcpt: Some("rfc822;b+40x".into()),
            })
        );
        assert_eq!(r(b" TO:<b@x>"), Ok(RcptParams::default()));
        assert_eq!(
            r(b" TO:<b@x> NOTIFY=NEVER,FAILURE"),
            Err(ParamError::Malformed(usage(BadValue::Notify)))
        );
        assert_eq!(
            r(b" TO:<b@x> ORCPT=b@x"),
            Err(ParamError::Malformed(usage(BadValue::Orcpt)))
        );
        // A malformed value is a syntax error even after a parameter the relay lacks.
        assert_eq!(
            r(b" TO:<b@x> X-Y=1 NOTIFY=ALWAYS"),
            Err(ParamError::Malformed(usage(BadValue::Notify)))
        );
        assert_eq!(
            r(b" TO:<b@x> X-Y=1 NOTIFY=NEVER"),
            Err(ParamError::Unsupported("X-Y".into()))
        );
    }

    #[test]
    fn size_limits() {
        assert!(!size_exceeds("0", 10));
        assert!(!size_exceeds("10", 10));
        assert!(!size_exceeds("0000000000000000000000010", 10));
        assert!(size_exceeds("11", 10));
        assert!(size_exceeds("18446744073709551615", 10));
        assert!(size_exceeds("18446744073709551616", usize::MAX));
        assert!(size_exceeds("99999999999999999999999", 10));
    }
}
