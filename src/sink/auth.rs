//! SASL PLAIN and LOGIN as the sink sees them, with the base64 they need (the crate has no
//! base64 dependency and these few lines do not justify one). Pure.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Strict standard base64 with padding, as RFC 4954 requires; `None` on anything else.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (i, quad) in bytes.chunks(4).enumerate() {
        let last = i == bytes.len() / 4 - 1;
        let pad = quad.iter().rev().take_while(|&&b| b == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n: u32 = 0;
        for &b in &quad[..4 - pad] {
            let v = ALPHABET.iter().position(|&a| a == b)?;
            n = n << 6 | v as u32;
        }
        n <<= 6 * pad as u32;
        let [_, a, b, c] = n.to_be_bytes();
        out.extend_from_slice(&[a, b, c][..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
fn encode_base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let mut n = [0u8; 3];
        n[..chunk.len()].copy_from_slice(chunk);
        let n = u32::from(n[0]) << 16 | u32::from(n[1]) << 8 | u32::from(n[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One base64 SASL response line; `=` is the empty response (RFC 4954).
pub fn decode_response(line: &str) -> Option<Vec<u8>> {
    match line.trim() {
        "=" => Some(Vec::new()),
        other => decode_base64(other),
    }
}

/// PLAIN: `authzid NUL authcid NUL password`. An authzid other than empty or the user itself
/// would be a request to act as someone else, which the sink does not grant.
pub fn decode_plain(response: &[u8]) -> Option<(String, String)> {
    let mut parts = response.split(|&b| b == 0);
    let (authz, user, pass) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || (!authz.is_empty() && authz != user) {
        return None;
    }
    Some((
        String::from_utf8(user.to_vec()).ok()?,
        String::from_utf8(pass.to_vec()).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_is_strict() {
        for input in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            b"\0\xff\x10",
        ] {
            let text = encode_base64(input);
            assert_eq!(decode_base64(&text).as_deref(), Some(input), "{text}");
        }
        assert_eq!(encode_base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(encode_base64(b"fo"), "Zm8=");
        for bad in ["Zm9", "Zm=v", "Z===", "Zm9v!A==", "Zg==Zg==", "Zm 9v"] {
            assert_eq!(decode_base64(bad), None, "{bad}");
        }
    }

    #[test]
    fn plain_responses() {
        assert_eq!(
            decode_plain(b"\0user\0secret"),
            Some(("user".into(), "secret".into()))
        );
        assert_eq!(
            decode_plain(b"user\0user\0secret"),
            Some(("user".into(), "secret".into()))
        );
        assert_eq!(decode_plain(b"admin\0user\0secret"), None);
        assert_eq!(decode_plain(b"\0user"), None);
        assert_eq!(decode_plain(b"\0user\0pw\0x"), None);
        assert_eq!(decode_response("="), Some(Vec::new()));
    }
}
