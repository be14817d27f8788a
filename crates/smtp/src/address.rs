//! Address and host-name syntax as RFC 5321 §4.1.2 and §4.1.3 define it, extended by RFC 6531
//! for SMTPUTF8 (UTF-8 in atext, qtext and sub-domains). Pure functions over the text a client
//! sent between `<` and `>`; nothing is unquoted, folded or rewritten: what is accepted is kept
//! byte for byte, except a source route, which RFC 5321 §3.3 and Appendix C tell servers to
//! accept and ignore.
//!
//! Limits: a path is at most 256 octets with its angle brackets (§4.5.3.1.3), so the text
//! inside is at most 254. The 64-octet local-part figure of §4.5.3.1.1 is a minimum that
//! receivers must support, not a maximum, and real VERP addresses exceed it: it is not enforced.

/// Longest text between `<` and `>`: a path is at most 256 octets including the brackets.
pub const MAX_PATH_INNER: usize = 254;
/// Longest domain (RFC 5321 §4.5.3.1.2).
pub const MAX_DOMAIN: usize = 255;

/// The mailbox of a reverse-path (MAIL FROM), or `Some("")` for the null path `<>`.
/// `inner` is the text between the brackets; `utf8` is true under SMTPUTF8.
pub fn reverse_path(inner: &str, utf8: bool) -> Option<&str> {
    if inner.is_empty() {
        return Some(inner);
    }
    forward_path(inner, utf8)
}

/// The mailbox of a forward-path (RCPT TO); the null path is not one.
pub fn forward_path(inner: &str, utf8: bool) -> Option<&str> {
    if inner.len() > MAX_PATH_INNER {
        return None;
    }
    let mailbox = match inner.strip_prefix('@') {
        // A-d-l = At-domain *( "," At-domain ), then ":" and the mailbox.
        Some(_) => {
            let (route, mailbox) = inner.split_once(':')?;
            let domains_ok = route
                .split(',')
                .all(|hop| hop.strip_prefix('@').is_some_and(|d| is_domain(d, utf8)));
            if !domains_ok {
                return None;
            }
            mailbox
        }
        None => inner,
    };
    is_mailbox(mailbox, utf8).then_some(mailbox)
}

/// Mailbox = Local-part "@" ( Domain / address-literal ).
pub fn is_mailbox(text: &str, utf8: bool) -> bool {
    if text.len() > MAX_PATH_INNER {
        return false;
    }
    let Some(domain) = local_part_end(text, utf8).and_then(|end| text[end..].strip_prefix('@'))
    else {
        return false;
    };
    is_domain(domain, utf8) || is_address_literal(domain)
}

/// Where the local part (Dot-string or Quoted-string) at the start of `text` ends.
fn local_part_end(text: &str, utf8: bool) -> Option<usize> {
    if let Some(quoted) = text.strip_prefix('"') {
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => return Some(i + 2),
                // quoted-pairSMTP = %d92 %d32-126
                '\\' => match chars.next() {
                    Some((_, ' '..='~')) => {}
                    _ => return None,
                },
                // qtextSMTP = %d32-33 / %d35-91 / %d93-126, UTF-8 too under RFC 6531
                ' '..='~' => {}
                c if utf8 && !c.is_ascii() => {}
                _ => return None,
            }
        }
        return None;
    }
    let end = text.find('@').unwrap_or(text.len());
    let dot_string = &text[..end];
    dot_string
        .split('.')
        .all(|atom| !atom.is_empty() && atom.chars().all(|c| is_atext(c, utf8)))
        .then_some(end)
}

fn is_atext(c: char, utf8: bool) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c) || (utf8 && !c.is_ascii())
}

/// Domain = sub-domain *("." sub-domain); sub-domain = Let-dig [Ldh-str], or a U-label under
/// SMTPUTF8 (non-ASCII characters counted as letters; IDNA2008's finer rules are the
/// upstream's to apply).
pub fn is_domain(text: &str, utf8: bool) -> bool {
    let let_dig = |c: char| c.is_ascii_alphanumeric() || (utf8 && !c.is_ascii());
    let ldh = |c: char| let_dig(c) || c == '-';
    text.len() <= MAX_DOMAIN
        && text.split('.').all(|label| {
            label.chars().next().is_some_and(let_dig)
                && label.chars().next_back().is_some_and(let_dig)
                && label.chars().all(ldh)
        })
}

/// address-literal = "[" ( IPv4-address-literal / IPv6-address-literal /
/// General-address-literal ) "]"
pub fn is_address_literal(text: &str) -> bool {
    let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else {
        return false;
    };
    match inner.split_once(':') {
        None => is_ipv4(inner),
        // The tag "IPv6" is the registered one: its content must be an IPv6 address.
        Some((tag, addr)) if tag.eq_ignore_ascii_case("IPv6") => is_ipv6(addr),
        // General-address-literal = Standardized-tag ":" 1*dcontent; dcontent excludes
        // "[", "\" and "]".
        Some((tag, content)) => {
            is_ldh_str(tag)
                && !content.is_empty()
                && content.bytes().all(|b| matches!(b, 33..=90 | 94..=126))
        }
    }
}

/// Ldh-str = *( ALPHA / DIGIT / "-" ) Let-dig
fn is_ldh_str(text: &str) -> bool {
    text.bytes()
        .last()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// IPv4-address-literal = Snum 3("." Snum); Snum = 1*3DIGIT, 0 to 255 (leading zeros allowed).
fn is_ipv4(text: &str) -> bool {
    let mut parts = 0;
    for snum in text.split('.') {
        parts += 1;
        let digits = (1..=3).contains(&snum.len()) && snum.bytes().all(|b| b.is_ascii_digit());
        if !digits || snum.parse::<u16>().map_or(true, |n| n > 255) {
            return false;
        }
    }
    parts == 4
}

/// IPv6-addr = IPv6-full / IPv6-comp / IPv6v4-full / IPv6v4-comp (RFC 5321 §4.1.3). Stricter
/// than RFC 4291 in one place: "::" stands for at least two groups, so at most 6 (or 4
/// beside an IPv4 tail) groups may be written around it.
fn is_ipv6(text: &str) -> bool {
    let hex = |g: &str| (1..=4).contains(&g.len()) && g.bytes().all(|b| b.is_ascii_hexdigit());
    // Splits `part` into hex groups and an optional IPv4 tail; None when a group is invalid.
    let groups = |part: &str, may_end_in_v4: bool| -> Option<(usize, bool)> {
        if part.is_empty() {
            return Some((0, false));
        }
        let pieces: Vec<&str> = part.split(':').collect();
        let (last, init) = pieces.split_last()?;
        let v4 = may_end_in_v4 && last.contains('.');
        if v4 && !is_ipv4(last) {
            return None;
        }
        let hexes: &[&str] = if v4 { init } else { &pieces };
        hexes.iter().all(|g| hex(g)).then_some((hexes.len(), v4))
    };
    match text.split_once("::") {
        Some((left, right)) => {
            if right.contains("::") {
                return false;
            }
            let (Some((l, false)), Some((r, v4))) = (groups(left, false), groups(right, true))
            else {
                return false;
            };
            l + r <= if v4 { 4 } else { 6 }
        }
        None => matches!(groups(text, true), Some((8, false)) | Some((6, true))),
    }
}

/// HELO/EHLO argument: a Domain or an address literal (RFC 5321 §4.1.1.1), ASCII only, with
/// one tolerance: underscores in labels, which Windows and container host names carry and
/// many real clients send. Nothing else is repaired.
pub fn is_helo_name(text: &str) -> bool {
    if text.starts_with('[') {
        return is_address_literal(text);
    }
    let let_dig = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    text.len() <= MAX_DOMAIN
        && text.split('.').all(|label| {
            let bytes = label.as_bytes();
            bytes.first().is_some_and(|&b| let_dig(b))
                && bytes.last().is_some_and(|&b| let_dig(b))
                && bytes.iter().all(|&b| let_dig(b) || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailboxes() {
        let cases: &[(&str, bool, bool)] = &[
            // (text, utf8, valid)
            ("a@x", false, true),
            ("first.last@example.com", false, true),
            ("a+tag@sub.example.co.uk", false, true),
            ("!#$%&'*+-/=?^_`{|}~@x", false, true),
            ("\"\"@x", false, true),
            ("\"a b\"@x", false, true),
            ("\"a@b\"@example.com", false, true),
            ("\"a\\\"b\\\\\"@x", false, true),
            ("user@[192.0.2.1]", false, true),
            ("user@[001.002.003.004]", false, true),
            ("user@[IPv6:2001:db8::1]", false, true),
            ("user@[ipv6:::1]", false, true),
            ("user@[IPv6:::ffff:192.0.2.1]", false, true),
            ("user@[x-tag:anything-goes]", false, true),
            ("user@xn--bcher-kva.example", false, true),
            ("1@2", false, true),
            ("jürgen@bücher.example", true, true),
            ("jürgen@example.com", false, false),
            ("\"jü rgen\"@x", true, true),
            ("app@", false, false),
            ("user@", false, false),
            ("@x", false, false),
            ("", false, false),
            ("x", false, false),
            ("app@\"\"\"\"\"\"", false, false),
            ("\"\"", false, false),
            ("a..b@x", false, false),
            (".a@x", false, false),
            ("a.@x", false, false),
            ("a b@x", false, false),
            ("a@b@x", false, false),
            ("a@x.", false, false),
            ("a@.x", false, false),
            ("a@x..y", false, false),
            ("a@-x", false, false),
            ("a@x-", false, false),
            ("a@x_y", false, false),
            ("a@x y", false, false),
            ("\"a\"b@x", false, false),
            ("\"a@x", false, false),
            ("\"a\\\u{1}\"@x", false, false),
            ("\"a\u{7f}\"@x", false, false),
            ("a@[192.0.2.256]", false, false),
            ("a@[192.0.2]", false, false),
            ("a@[1.2.3.4.5]", false, false),
            ("a@[0001.2.3.4]", false, false),
            ("a@[IPv6:2001:db8::1::2]", false, false),
            ("a@[IPv6:1:2:3:4:5:6:7::]", false, false),
            ("a@[IPv6:1:2:3:4:5:6::]", false, true),
            ("a@[IPv6:1:2:3:4:5:6:7:8]", false, true),
            ("a@[IPv6:1:2:3:4:5:6:7]", false, false),
            ("a@[IPv6:1:2:3:4:5:6:1.2.3.4]", false, true),
            ("a@[IPv6:1:2:3:4::1.2.3.4]", false, true),
            ("a@[IPv6:1:2:3:4:5::1.2.3.4]", false, false),
            ("a@[IPv6:garbage]", false, false),
            ("a@[IPv6:12345::]", false, false),
            ("a@[tag:]", false, false),
            ("a@[-:x]", false, false),
            ("a@[tag:a]b]", false, false),
            ("a@[]", false, false),
            ("a@192.0.2.1", false, true),
        ];
        for (text, utf8, want) in cases {
            assert_eq!(is_mailbox(text, *utf8), *want, "{text:?} utf8={utf8}");
        }
    }

    #[test]
    fn paths() {
        assert_eq!(reverse_path("", false), Some(""));
        assert_eq!(forward_path("", false), None);
        assert_eq!(reverse_path("a@x", false), Some("a@x"));
        // The source route is accepted and dropped; the mailbox is kept as sent.
        assert_eq!(
            forward_path("@r1.example,@r2.example:Bob@X", false),
            Some("Bob@X")
        );
        assert_eq!(forward_path("@r1.example:a@x", false), Some("a@x"));
        assert_eq!(forward_path("@:a@x", false), None);
        assert_eq!(forward_path("@r1,r2:a@x", false), None);
        assert_eq!(forward_path("@r1:", false), None);
        assert_eq!(forward_path("@r1", false), None);
        assert_eq!(reverse_path("\"\"", false), None);
        assert_eq!(forward_path("postmaster", false), None);
        let long = format!("{}@x", "a".repeat(MAX_PATH_INNER - 2));
        assert_eq!(forward_path(&long, false), Some(long.as_str()));
        let too_long = format!("{}@x", "a".repeat(MAX_PATH_INNER - 1));
        assert_eq!(forward_path(&too_long, false), None);
    }

    #[test]
    fn helo_names() {
        let cases: &[(&str, bool)] = &[
            ("c", true),
            ("mail.example.com", true),
            ("DESKTOP-4F2K9_1", true),
            ("my_host.local", true),
            ("192.0.2.1", true),
            ("[192.0.2.1]", true),
            ("[IPv6:::1]", true),
            ("xn--bcher-kva.example", true),
            ("", false),
            ("bücher.example", false),
            ("h\u{fffd}st", false),
            ("host.", false),
            (".host", false),
            ("a..b", false),
            ("-host", false),
            ("host-", false),
            ("[192.0.2.300]", false),
            ("[garbage", false),
            ("a b", false),
            ("a/b", false),
            ("<host>", false),
        ];
        for (text, want) in cases {
            assert_eq!(is_helo_name(text), *want, "{text:?}");
        }
        assert!(is_helo_name(&"a".repeat(MAX_DOMAIN)));
        assert!(!is_helo_name(&"a".repeat(MAX_DOMAIN + 1)));
    }
}
