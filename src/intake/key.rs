//! Reading, validating and deriving the idempotency key (docs/concepts/contract.md "What the relay answers at the end of DATA"). Pure functions.

use crate::mail::{is_valid_key, Envelope, Fingerprint, MAX_KEY_CHARS};
pub(crate) use crate::store::KeySource;
use idemrelay_model::fingerprint::Hasher;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdemKey {
    pub value: String,
    pub source: KeySource,
    /// The client's key field spelled the key in RFC 2047 encoded words (`read_key_header`).
    pub encoded: bool,
    /// When `encoded`: the key as spelled (unfolded, not decoded), if that spelling is itself a
    /// valid key. Earlier versions stored such keys as spelled; see `Intake::insert_keyed`.
    pub undecoded: Option<String>,
}

impl IdemKey {
    /// A key the relay made (derived), never spelled by a client.
    fn derived(value: String, source: KeySource) -> Self {
        IdemKey {
            value,
            source,
            encoded: false,
            undecoded: None,
        }
    }

    /// The key of a `KeyHeader::Present` read from `raw_values`.
    pub(crate) fn from_header(value: String, raw_values: &[Vec<u8>]) -> Self {
        let as_spelled = read_key_as_spelled(raw_values);
        // Decoding changes every value that has an encoded word (it drops at least `=?`, the
        // charset and `?=`), and no other value: so this says whether a field was encoded.
        let encoded = as_spelled.as_deref() != Some(value.as_str());
        IdemKey {
            value,
            source: KeySource::Header,
            encoded,
            undecoded: as_spelled.filter(|_| encoded),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyHeader {
    Absent,
    /// The key: unfolded, encoded words decoded, validated.
    Present(String),
    /// Empty, too long, control or invisible characters, not UTF-8, an encoded word that
    /// cannot be decoded, or several differing values (E01001).
    Invalid,
}

/// Undoes header folding (RFC 5322 §2.2.3: remove CRLF before WSP) and trims the value.
fn unfold(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    Some(
        text.replace("\r\n", "")
            .trim_matches([' ', '\t'])
            .to_string(),
    )
}

/// The key one field's raw value spells: unfolded, then its encoded words decoded, then
/// trimmed again (white space around a key is never part of it, however it is spelled; and a
/// key written plain for the upstream could not carry it).
fn field_key(raw: &[u8]) -> Option<String> {
    let text = unfold(raw)?;
    Some(decode_words(&text)?.trim_matches([' ', '\t']).to_string())
}

/// Interprets every raw value of the key header found in a message. Values that decode to the
/// same key are one key, however each is spelled.
pub fn read_key_header(raw_values: &[Vec<u8>]) -> KeyHeader {
    read_values(raw_values, field_key).map_or(KeyHeader::Invalid, |found| {
        found.map_or(KeyHeader::Absent, KeyHeader::Present)
    })
}

/// The key as spelled, encoded words left as they are: how earlier versions read the field.
fn read_key_as_spelled(raw_values: &[Vec<u8>]) -> Option<String> {
    read_values(raw_values, unfold).ok().flatten()
}

/// Every value read with `read`: `Err` when one is not a valid key or two differ.
fn read_values(
    raw_values: &[Vec<u8>],
    read: fn(&[u8]) -> Option<String>,
) -> Result<Option<String>, ()> {
    let mut found: Option<String> = None;
    for raw in raw_values {
        let value = read(raw).filter(|v| is_valid_key(v)).ok_or(())?;
        match &found {
            Some(previous) if *previous != value => return Err(()),
            _ => found = Some(value),
        }
    }
    Ok(found)
}

/// Decodes the RFC 2047 encoded words of an unfolded, unstructured value (RFC 2047 §5 (1)).
/// A word (text between white space) that begins with `=?` is an encoded word,
/// `=?charset?encoding?text?=`; `None` when one cannot be decoded exactly: not that shape, an
/// encoding other than B or Q, text that is not valid in it, a charset the relay has no table
/// for, or bytes the charset does not define. Such a value is refused (E01001) rather than
/// taken as spelled: the client meant a key it did not spell, and storing the spelling is what
/// makes a lookup by the application's key find nothing. Nor is it read leniently: two keys that
/// differ must not decode to one.
///
/// White space between two encoded words is dropped (RFC 2047 §6.2), and the bytes of adjacent
/// words in one charset are joined before they are decoded, so a character an encoder cut in
/// two is whole again. Everything else, spacing included, is kept as it is.
///
/// mail-parser's own reader of unstructured values (`MessageStream::parse_unstructured`) is not
/// used: it collapses the white space between plain words (which would change keys already
/// stored), replaces undecodable bytes with U+FFFD, drops a base64 quantum without padding, and
/// takes a malformed encoded word as spelled. Its charset tables are used.
fn decode_words(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    // Decoded bytes not yet turned into text, and their charset.
    let mut pending: Option<(String, Vec<u8>)> = None;
    let mut rest = text;
    while !rest.is_empty() {
        let after_space = rest.trim_start_matches([' ', '\t']);
        let space = &rest[..rest.len() - after_space.len()];
        let end = after_space.find([' ', '\t']).unwrap_or(after_space.len());
        let word = &after_space[..end];
        rest = &after_space[end..];
        if !word.starts_with("=?") {
            flush(&mut pending, &mut out)?;
            out.push_str(space);
            out.push_str(word);
            continue;
        }
        let (charset, bytes) = encoded_word(word)?;
        match &mut pending {
            Some((open, buffer)) if *open == charset => buffer.extend_from_slice(&bytes),
            Some(_) => {
                flush(&mut pending, &mut out)?;
                pending = Some((charset, bytes));
            }
            None => {
                out.push_str(space);
                pending = Some((charset, bytes));
            }
        }
    }
    flush(&mut pending, &mut out)?;
    Some(out)
}

fn flush(pending: &mut Option<(String, Vec<u8>)>, out: &mut String) -> Option<()> {
    if let Some((charset, bytes)) = pending.take() {
        out.push_str(&decode_charset(&charset, &bytes)?);
    }
    Some(())
}

/// `=?charset?encoding?text?=`: the charset (lowercase, an RFC 2231 `*language` removed) and
/// the bytes the text stands for.
fn encoded_word(word: &str) -> Option<(String, Vec<u8>)> {
    let inner = word.strip_prefix("=?")?.strip_suffix("?=")?;
    let mut parts = inner.split('?');
    let (charset, encoding, text) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let charset = charset.split_once('*').map_or(charset, |(name, _)| name);
    if charset.is_empty() {
        return None;
    }
    let bytes = match encoding {
        "B" | "b" => {
            use base64::Engine as _;
            // Canonical padding and no stray bits: one text per byte string.
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .ok()?
        }
        "Q" | "q" => decode_q(text)?,
        _ => return None,
    };
    Some((charset.to_ascii_lowercase(), bytes))
}

/// The Q encoding (RFC 2047 §4.2): `_` is a space, `=XX` a byte, other printable ASCII itself.
fn decode_q(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' => out.push(b' '),
            b'=' => {
                let hex = bytes.get(i + 1..i + 3)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b @ b'!'..=b'~' => out.push(b),
            _ => return None,
        }
        i += 1;
    }
    Some(out)
}

/// The labels of UTF-8 (WHATWG's list); mail-parser has no table for them, UTF-8 being its own
/// text.
const UTF8_LABELS: [&str; 6] = [
    "utf-8",
    "utf8",
    "unicode-1-1-utf-8",
    "unicode11utf8",
    "unicode20utf8",
    "x-unicode20utf8",
];

/// `bytes` as text in `charset`, exactly, or `None`.
fn decode_charset(charset: &str, bytes: &[u8]) -> Option<String> {
    use mail_parser::decoders::charsets::map::charset_decoder;
    if UTF8_LABELS.contains(&charset) {
        return String::from_utf8(bytes.to_vec()).ok();
    }
    let text = charset_decoder(charset.as_bytes())?(bytes);
    // U+FFFD stands for a byte the charset does not define. And without its `full_encoding`
    // feature (and the encoding_rs tables it brings) mail-parser reads the multi-byte charsets
    // (Shift_JIS, GB18030, Big5, EUC-KR, ...) as if they were UTF-8: a guess, refused like an
    // unknown charset. A real single-byte table turns n non-ASCII bytes into n characters, so
    // its text is never the UTF-8 reading of them unless that holds U+FFFD too.
    let guessed = !bytes.is_ascii() && text == String::from_utf8_lossy(bytes);
    (!text.contains('\u{fffd}') && !guessed).then_some(text)
}

/// How the relay writes `key` in the key field it adds to the stored message: as it is when an
/// RFC 5322 reader finds exactly the key there (an ASCII key; a non-ASCII one the client itself
/// wrote unencoded, so the message already carries such a header), else in UTF-8 B encoded
/// words, folded: valid in any message, and read back as the key by the rule above.
pub(crate) fn key_field(key: &str, client_encoded: bool) -> String {
    let plain_reads_back = field_key(key.as_bytes()).as_deref() == Some(key);
    if plain_reads_back && (key.is_ascii() || !client_encoded) {
        return key.to_string();
    }
    encode_words(key)
}

/// `text` in UTF-8 B encoded words of at most 30 bytes (52 characters), one per line, so the
/// first line of the field stays within 78 characters (RFC 5322 §2.1.1).
fn encode_words(text: &str) -> String {
    use base64::Engine as _;
    const WORD_BYTES: usize = 30;
    let mut words = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(WORD_BYTES);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let chunk = &rest[..end];
        rest = &rest[end..];
        let encoded = base64::engine::general_purpose::STANDARD.encode(chunk);
        words.push(format!("=?utf-8?b?{encoded}?="));
    }
    words.join("\r\n ")
}

/// A derived key: `d1-` + hex(blake3(...)). With a Message-ID the envelope is bound in, since
/// one Message-ID is legitimately sent in separate transactions to different recipients.
/// Neither form covers the delivery requests (DSN parameters, REQUIRETLS): without a Message-ID
/// the caller passes `fingerprint::key_fingerprint`, so a retry asking for other requests is
/// the same key, answered as a conflict.
pub(crate) fn derive_key(
    scope: &str,
    message_id: Option<&str>,
    envelope: &Envelope,
    fingerprint: &Fingerprint,
) -> IdemKey {
    match message_id {
        Some(id) => {
            let mut h = Hasher::new("idemrelay derived key from message-id v1");
            h.field(scope.as_bytes());
            h.field(id.as_bytes());
            h.field(envelope.mail_from.as_bytes());
            h.recipients(&envelope.rcpt_to);
            IdemKey::derived(format!("d1-{}", h.finish().to_hex()), KeySource::MessageId)
        }
        None => {
            let mut h = Hasher::new("idemrelay derived key from fingerprint v1");
            h.field(fingerprint.as_bytes());
            IdemKey::derived(format!("d1-{}", h.finish().to_hex()), KeySource::Content)
        }
    }
}

/// The key the upstream sees for part `part` of (scope, key) (docs/concepts/contract.md "What the relay answers at the end of DATA"): one upstream account
/// is one key space, so it must be unique per scope and part across everything the relay sends
/// there. The client's key unchanged for part 1 of a scope that keeps its clients' keys (alone
/// on its upstream, and that upstream's key-space owner in the store: the common case);
/// otherwise `u1-<scope tag>-<part>-<key>`, where the scope tag is 16 hex digits of a
/// digest of the scope, or, when that would pass 255 characters, `u1-<64 hex digits>` of a
/// digest of all three. Derived keys are already unique per scope and never split (their
/// recipients are part of them), so they go unchanged.
pub(crate) fn upstream_key(
    scope: &str,
    key: &IdemKey,
    part: u32,
    keeps_client_key: bool,
) -> String {
    if key.source != KeySource::Header || (part == 1 && keeps_client_key) {
        return key.value.clone();
    }
    let mut tag = Hasher::new("idemrelay upstream scope tag v1");
    tag.field(scope.as_bytes());
    let readable = format!("u1-{}-{part}-{}", &tag.finish().to_hex()[..16], key.value);
    if readable.chars().count() <= MAX_KEY_CHARS {
        return readable;
    }
    let mut h = Hasher::new("idemrelay upstream key v1");
    h.field(scope.as_bytes());
    h.field(key.value.as_bytes());
    h.field(&part.to_le_bytes());
    format!("u1-{}", h.finish().to_hex())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_key_the_upstream_sees_is_unique_per_scope_and_part() {
        let header = |v: &str| IdemKey::from_header(v.into(), &[format!(" {v}").into_bytes()]);
        const KEEPS: bool = true;
        const SHARED: bool = false;
        let k = header("welcome-customer-1");
        // The common case: the client's key, unchanged.
        assert_eq!(upstream_key("alice", &k, 1, KEEPS), "welcome-customer-1");
        let alice2 = upstream_key("alice", &k, 2, KEEPS);
        let shared_alice = upstream_key("alice", &k, 1, SHARED);
        let shared_bob = upstream_key("bob", &k, 1, SHARED);
        assert!(alice2.starts_with("u1-") && alice2.ends_with("-2-welcome-customer-1"));
        let all = [&k.value, &alice2, &shared_alice, &shared_bob];
        for (i, a) in all.iter().enumerate() {
            assert!(is_valid_key(a), "{a}");
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // Deterministic: every attempt and every retry sends the same.
        assert_eq!(upstream_key("bob", &k, 1, SHARED), shared_bob);
        // Too long for the readable form: a digest, still valid and still unique.
        let long = header(&"k".repeat(250));
        let (a, b) = (
            upstream_key("alice", &long, 2, KEEPS),
            upstream_key("alice", &long, 3, KEEPS),
        );
        assert!(is_valid_key(&a) && a.len() == 67 && a != b, "{a}");
        // Derived keys carry the scope already and never split.
        let derived = IdemKey::derived("d1-abc".into(), KeySource::MessageId);
        assert_eq!(upstream_key("alice", &derived, 1, SHARED), "d1-abc");
    }

    use super::*;
    use crate::mail::BodyType;

    fn v(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn header_values_table() {
        let long = "k".repeat(255);
        let too_long = "k".repeat(256);
        let cases: Vec<(Vec<Vec<u8>>, KeyHeader)> = vec![
            (vec![], KeyHeader::Absent),
            (vec![v(" abc")], KeyHeader::Present("abc".into())),
            (
                vec![v(" abc\r\n def")],
                KeyHeader::Present("abc def".into()),
            ),
            (vec![v("\r\n\tabc")], KeyHeader::Present("abc".into())),
            (
                vec![v(" abc"), v(" abc ")],
                KeyHeader::Present("abc".into()),
            ),
            (vec![v(" abc"), v(" abd")], KeyHeader::Invalid),
            (vec![v(" ")], KeyHeader::Invalid),
            (
                vec![v(&format!(" {long}"))],
                KeyHeader::Present(long.clone()),
            ),
            (vec![v(&format!(" {too_long}"))], KeyHeader::Invalid),
            (vec![v(" a\x01b")], KeyHeader::Invalid),
            (vec![v(" a\tb")], KeyHeader::Invalid),
            (vec![vec![b' ', 0xff, 0xfe]], KeyHeader::Invalid),
            (vec![v(" ключ-✓")], KeyHeader::Present("ключ-✓".into())),
            (
                vec![v(" 名前 ünïcödé")],
                KeyHeader::Present("名前 ünïcödé".into()),
            ),
        ];
        for c in [
            '\u{202e}',
            '\u{202a}',
            '\u{2066}',
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{200e}',
            '\u{2060}',
            '\u{feff}',
            '\u{00ad}',
            '\u{2028}',
            '\u{2029}',
            '\u{061c}',
            '\u{e0041}',
            '\u{0085}',
        ] {
            let value = format!(" order-{c}1");
            assert_eq!(read_key_header(&[v(&value)]), KeyHeader::Invalid, "{c:?}");
        }
        for (input, want) in cases {
            assert_eq!(read_key_header(&input), want, "{input:?}");
        }
    }

    /// Mail libraries RFC 2047-encode a key header that is long or not ASCII (Python's
    /// `EmailMessage` past 77 characters or with non-ASCII text, nodemailer for non-ASCII): the
    /// key is what the encoded words say, not their spelling.
    #[test]
    fn encoded_words_are_decoded_before_validation() {
        let receipt = format!(
            "receipt-2026-11-29-{}",
            (0..100).map(|i| format!("{i:04}-")).collect::<String>()
        )[..205]
            .to_string();
        let present = |k: &str| KeyHeader::Present(k.to_string());
        let cases: Vec<(Vec<Vec<u8>>, KeyHeader)> = vec![
            // Python 3.11, `policy=email.policy.SMTP`, byte for byte: a 205-character key in Q
            // words folded over four lines (over 255 characters as spelled)...
            (
                vec![v(" =?utf-8?q?receipt-2026-11-29-0000-0001-0002-0003-000?=\r\n =?utf-8?q?4-0005-0006-0007-0008-0009-0010-0011-0012-0013-0014-0015-0016-001?=\r\n =?utf-8?q?7-0018-0019-0020-0021-0022-0023-0024-0025-0026-0027-0028-0029-003?=\r\n =?utf-8?q?0-0031-0032-0033-0034-0035-0036-0?=")],
                present(&receipt),
            ),
            // ...a Cyrillic key as a B word and a Q word...
            (
                vec![v(" =?utf-8?b?0LfQsNC60LDQty0xMjM0LdC60LLQuNGC0LDQvdGG?=\r\n =?utf-8?q?=D0=B8=D1=8F?=")],
                present("заказ-1234-квитанция"),
            ),
            // ...and a key of words, only one of them encoded: the spaces next to plain text
            // are the key's own.
            (
                vec![v(" order 1234 =?utf-8?b?w7xuw69jw7Zkw6k=?= receipt")],
                present("order 1234 ünïcödé receipt"),
            ),
            // Case of charset and encoding, `_` for a space, a language tag (RFC 2231).
            (vec![v(" =?UTF-8?Q?a_b?=")], present("a b")),
            (vec![v(" =?Utf-8?B?w6k=?=")], present("é")),
            (vec![v(" =?utf-8*en?q?abc?=")], present("abc")),
            // Other charsets.
            (vec![v(" =?ISO-8859-1?Q?caf=E9?=")], present("café")),
            (vec![v(" =?koi8-r?b?y8zA3g==?=")], present("ключ")),
            // White space between adjacent encoded words is not part of the text (RFC 2047
            // §6.2), however it is folded; next to plain text it is.
            (vec![v(" =?utf-8?q?ab?=\r\n\t=?utf-8?q?cd?=")], present("abcd")),
            (vec![v(" =?utf-8?q?ab?=   =?utf-8?q?cd?=")], present("abcd")),
            (vec![v(" =?utf-8?q?ab?= cd")], present("ab cd")),
            (vec![v(" ab =?utf-8?q?cd?=")], present("ab cd")),
            // An encoder that cut a character between two words.
            (vec![v(" =?utf-8?q?=D0?= =?utf-8?q?=B8?=")], present("и")),
            // The same key spelled two ways is one key.
            (
                vec![v(" abc"), v(" =?utf-8?q?abc?=")],
                present("abc"),
            ),
            (vec![v(" abc"), v(" =?utf-8?q?abd?=")], KeyHeader::Invalid),
            // Only a whole word is an encoded word; plain text keeps its spacing.
            (vec![v(" a=?utf-8?q?b?=")], present("a=?utf-8?q?b?=")),
            (vec![v(" a  b")], present("a  b")),
            (vec![v(" 50%=?")], present("50%=?")),
            // What is decoded is validated like any key.
            (vec![v(" =?utf-8?q?a=0Ab?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?b?YeKArmI=?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?q??=")], KeyHeader::Invalid),
            (
                vec![v(&format!(" =?utf-8?q?{}?=", "k".repeat(256)))],
                KeyHeader::Invalid,
            ),
            // An encoded word that cannot be read exactly is refused, never taken literally
            // (the client meant a key it did not spell) nor guessed at.
            (vec![v(" =?x-unknown?q?abc?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?x?abc?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?q?a=ZZ?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?q?abc=?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?b?YWJjZA?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?b?YW Jj?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?q?=FF?=")], KeyHeader::Invalid),
            (vec![v(" =?abc?=")], KeyHeader::Invalid),
            (vec![v(" =?utf-8?q?a?b?=")], KeyHeader::Invalid),
            // A multi-byte charset the relay has no table for: refused, even when its bytes
            // happen to be UTF-8 (E3 81 82, "あ" in UTF-8).
            (vec![v(" =?shift_jis?b?gqA=?=")], KeyHeader::Invalid),
            (vec![v(" =?shift_jis?b?44GC?=")], KeyHeader::Invalid),
        ];
        for (input, want) in cases {
            let shown: Vec<_> = input.iter().map(|r| String::from_utf8_lossy(r)).collect();
            assert_eq!(read_key_header(&input), want, "{shown:?}");
        }
    }

    /// What the relay writes for the upstream: ASCII plain; a non-ASCII key plain only when the
    /// client wrote it so, else in B words; and read back, it is the key.
    #[test]
    fn the_key_field_the_relay_writes_reads_back_as_the_key() {
        assert_eq!(key_field("order-1", true), "order-1");
        assert_eq!(key_field("order-1", false), "order-1");
        assert_eq!(key_field("ключ", false), "ключ");
        assert_eq!(key_field("ключ", true), "=?utf-8?b?0LrQu9GO0Yc=?=");
        // An ASCII key whose plain spelling would read as an encoded word (the client encoded
        // that text itself).
        assert_eq!(
            read_key_header(&[v(" =?utf-8?q?=3D=3Fx=3Fq=3Fy=3F=3D?=")]),
            KeyHeader::Present("=?x?q?y?=".into())
        );
        assert_eq!(key_field("=?x?q?y?=", true), "=?utf-8?b?PT94P3E/eT89?=");
        let long = "é".repeat(255);
        let written = key_field(&long, true);
        assert!(written.is_ascii());
        let line = format!("{}: {written}", crate::mail::KEY_HEADER);
        assert!(line.split("\r\n").all(|l| l.len() <= 78), "{line}");
        assert_eq!(
            read_key_header(&[format!(" {written}").into_bytes()]),
            KeyHeader::Present(long)
        );
    }

    proptest::proptest! {
        #[test]
        fn every_written_key_reads_back(
            key in "[ -~а-яё名前✓😀]{1,255}",
            client_encoded in proptest::bool::ANY,
        ) {
            let key = key.trim_matches(' ');
            proptest::prop_assume!(read_key_header(&[format!(" {key}").into_bytes()])
                == KeyHeader::Present(key.to_string()));
            let written = key_field(key, client_encoded);
            proptest::prop_assert_eq!(
                read_key_header(&[format!(" {written}").into_bytes()]),
                KeyHeader::Present(key.to_string())
            );
            if client_encoded {
                proptest::prop_assert!(written.is_ascii());
            }
        }
    }

    fn env(rcpts: &[&str]) -> Envelope {
        Envelope {
            mail_from: "a@example.com".into(),
            rcpt_to: rcpts.iter().map(|s| s.to_string()).collect(),
            body: BodyType::SevenBit,
            smtputf8: false,
            requests: Default::default(),
        }
    }

    #[test]
    fn derived_keys_are_deterministic_and_bind_the_envelope() {
        let fp = Fingerprint::from_bytes([7; 32]);
        let a = derive_key("s", Some("m@x"), &env(&["b@x", "c@x"]), &fp);
        let a_again = derive_key("s", Some("m@x"), &env(&["c@x", "b@x", "b@x"]), &fp);
        let other_rcpts = derive_key("s", Some("m@x"), &env(&["b@x"]), &fp);
        let other_scope = derive_key("t", Some("m@x"), &env(&["b@x", "c@x"]), &fp);
        assert_eq!(a, a_again);
        assert_eq!(a.source, KeySource::MessageId);
        assert!(a.value.starts_with("d1-") && a.value.len() == 3 + 64);
        assert_ne!(a.value, other_rcpts.value);
        assert_ne!(a.value, other_scope.value);

        let c = derive_key("s", None, &env(&["b@x"]), &fp);
        let c2 = derive_key("s", None, &env(&["b@x"]), &Fingerprint::from_bytes([8; 32]));
        assert_eq!(c.source, KeySource::Content);
        assert_ne!(c.value, c2.value);
        assert!(is_valid_key(&c.value));
    }
}
