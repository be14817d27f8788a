//! The PROXY protocol header (HAProxy's spec, v1 text and v2 binary) that a load balancer puts
//! in front of the client's bytes. No I/O: `frame` says where a header ends in the bytes seen
//! so far (so the server can consume exactly the header and leave the SMTP or TLS stream
//! intact), `parse` says which client it names. The field parsing is the `ppp` crate's; the
//! framing and size bounds are ours, because they decide how much a peer can make us read.

use std::fmt;
use std::net::SocketAddr;

use ppp::v1;
use ppp::v2;

/// Longest v1 line, CRLF included (the spec's worst case, `PROXY UNKNOWN` with two IPv6
/// addresses and ports).
pub const V1_MAX: usize = 107;
const V1_PREFIX: &[u8] = b"PROXY ";

/// The fixed part of a v2 header: signature, version/command, family/protocol, length.
const V2_FIXED: usize = 16;
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// Longest v2 header accepted, fixed part included. The length field allows 64 KiB; the
/// addresses take at most 216 bytes (AF_UNIX) and what HAProxy adds as TLVs (ALPN, authority,
/// unique id, TLS details) fits easily, so anything larger is refused instead of buffered.
pub const V2_MAX: usize = 2048;

/// The most bytes `frame` ever needs to see.
pub const MAX_HEADER: usize = V2_MAX;

/// Why a connection that had to start with a header is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The first bytes are neither `PROXY ` nor the v2 signature.
    Missing,
    /// No CRLF within the first 107 bytes of a v1 line.
    V1TooLong,
    /// A v2 length field announcing more than `V2_MAX` bytes in all.
    V2TooLong(usize),
    /// Framed, but not a valid header; the parser's reason.
    Malformed(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Missing => {
                f.write_str("no PROXY header: the connection did not start with one")
            }
            Refusal::V1TooLong => write!(f, "PROXY v1 header longer than {V1_MAX} bytes"),
            Refusal::V2TooLong(len) => {
                write!(f, "PROXY v2 header of {len} bytes (more than {V2_MAX})")
            }
            Refusal::Malformed(why) => write!(f, "malformed PROXY header: {why}"),
        }
    }
}

/// Where the header ends in the bytes seen so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// The header is the first this many bytes.
    Complete(usize),
    /// Every byte seen so far belongs to the header, and it goes on.
    Incomplete,
    Refused(Refusal),
}

/// Finds the end of the header at the front of `start`: a v1 line ends at its LF, a v2
/// header is its fixed part plus its length field. Never asks for more than `MAX_HEADER`.
pub fn frame(start: &[u8]) -> Framing {
    if starts_as(start, V2_SIGNATURE) {
        if start.len() < V2_FIXED {
            return Framing::Incomplete;
        }
        let total = V2_FIXED + usize::from(u16::from_be_bytes([start[14], start[15]]));
        return if total > V2_MAX {
            Framing::Refused(Refusal::V2TooLong(total))
        } else if start.len() >= total {
            Framing::Complete(total)
        } else {
            Framing::Incomplete
        };
    }
    if starts_as(start, V1_PREFIX) {
        let window = &start[..start.len().min(V1_MAX)];
        return match window.iter().position(|&b| b == b'\n') {
            Some(lf) => Framing::Complete(lf + 1),
            None if window.len() >= V1_MAX => Framing::Refused(Refusal::V1TooLong),
            None => Framing::Incomplete,
        };
    }
    Framing::Refused(Refusal::Missing)
}

/// True when `bytes` and `marker` agree on their common length, and `bytes` is not empty.
fn starts_as(bytes: &[u8], marker: &[u8]) -> bool {
    let n = bytes.len().min(marker.len());
    n > 0 && bytes[..n] == marker[..n]
}

/// The client a complete header names: `Some(source)` for a proxied TCP connection over IPv4
/// or IPv6; `None` when the connection's own address stands (v1 `UNKNOWN`, v2 `LOCAL`, and
/// the v2 families and protocols a TCP listener has no use for: the spec has receivers fall
/// back to the real endpoints for those). TLVs are ignored.
pub fn parse(header: &[u8]) -> Result<Option<SocketAddr>, Refusal> {
    let malformed = |why: String| Refusal::Malformed(why);
    if header.starts_with(V2_SIGNATURE) {
        let parsed = v2::Header::try_from(header).map_err(|e| malformed(e.to_string()))?;
        if parsed.len() != header.len() {
            return Err(malformed("length field disagrees with the header".into()));
        }
        if parsed.command == v2::Command::Local || parsed.protocol != v2::Protocol::Stream {
            return Ok(None);
        }
        return Ok(match parsed.addresses {
            v2::Addresses::IPv4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
            v2::Addresses::IPv6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
            v2::Addresses::Unspecified | v2::Addresses::Unix(_) => None,
        });
    }
    // The spec: a lone CR or LF must not end the line.
    if !header.ends_with(b"\r\n") {
        return Err(malformed("line does not end in CRLF".into()));
    }
    let parsed = v1::Header::try_from(header).map_err(|e| malformed(e.to_string()))?;
    if parsed.header.len() != header.len() {
        return Err(malformed("CR inside the line".into()));
    }
    Ok(match parsed.addresses {
        v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v1::Addresses::Unknown => None,
    })
}

/// True when a client's first bytes look like a PROXY header (v1's `PROXY` or the start of
/// the v2 signature, whose NUL on its third line no SMTP client sends): for connections that
/// were not to send one. No SMTP command starts this way, so nothing legitimate is caught.
pub fn looks_like_header(first: &[u8]) -> bool {
    first.starts_with(b"PROXY") || first.starts_with(&V2_SIGNATURE[..5])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(ver_cmd);
        h.push(fam);
        h.extend_from_slice(&(body.len() as u16).to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    fn v2_tcp4(src: [u8; 4], sport: u16) -> Vec<u8> {
        let mut body = src.to_vec();
        body.extend_from_slice(&[10, 0, 0, 1]);
        body.extend_from_slice(&sport.to_be_bytes());
        body.extend_from_slice(&25u16.to_be_bytes());
        v2(0x21, 0x11, &body)
    }

    /// Both versions end exactly at their last byte, whatever follows.
    #[test]
    fn framing_stops_at_the_end_of_the_header() {
        let line = b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 25\r\n";
        let mut stream = line.to_vec();
        stream.extend_from_slice(b"EHLO x\r\n");
        assert_eq!(frame(&stream), Framing::Complete(line.len()));
        let header = v2_tcp4([192, 0, 2, 7], 40000);
        let mut stream = header.clone();
        stream.extend_from_slice(b"\x16\x03\x01");
        assert_eq!(frame(&stream), Framing::Complete(header.len()));
        assert_eq!(header.len(), 28);
    }

    /// Any prefix of a header is incomplete, never refused: TCP may split it anywhere.
    #[test]
    fn every_prefix_is_incomplete() {
        let line = b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 25\r\n";
        let header = v2_tcp4([192, 0, 2, 7], 40000);
        for whole in [&line[..], &header[..]] {
            for cut in 1..whole.len() {
                assert_eq!(frame(&whole[..cut]), Framing::Incomplete, "{cut}");
            }
        }
    }

    #[test]
    fn other_first_bytes_are_a_missing_header() {
        for start in [
            &b"EHLO client\r\n"[..],
            b"\x16\x03\x01\x02\x00",
            b"PROXZ",
            b"proxy TCP4",
            b"\r\n\r\nQUIT",
        ] {
            assert_eq!(
                frame(start),
                Framing::Refused(Refusal::Missing),
                "{start:?}"
            );
        }
    }

    #[test]
    fn sizes_are_bounded() {
        let mut long = b"PROXY UNKNOWN ".to_vec();
        long.resize(V1_MAX, b'f');
        assert_eq!(frame(&long), Framing::Refused(Refusal::V1TooLong));
        long.truncate(V1_MAX - 1);
        assert_eq!(frame(&long), Framing::Incomplete);
        long.extend_from_slice(b"\n");
        assert_eq!(frame(&long), Framing::Complete(V1_MAX));
        // The spec's worst case is exactly 107 bytes.
        let worst = format!(
            "PROXY UNKNOWN {0} {0} 65535 65535\r\n",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        );
        assert_eq!(worst.len(), V1_MAX);
        assert_eq!(frame(worst.as_bytes()), Framing::Complete(V1_MAX));
        assert_eq!(parse(worst.as_bytes()), Ok(None));

        let big = v2(0x21, 0x11, &vec![0; V2_MAX - V2_FIXED + 1]);
        assert_eq!(
            frame(&big[..V2_FIXED]),
            Framing::Refused(Refusal::V2TooLong(V2_MAX + 1))
        );
        let most = v2(0x20, 0x00, &vec![0; V2_MAX - V2_FIXED]);
        assert_eq!(frame(&most), Framing::Complete(V2_MAX));
        let mut max_field = v2(0x21, 0x11, &[]);
        max_field[14..16].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(
            frame(&max_field),
            Framing::Refused(Refusal::V2TooLong(V2_FIXED + 65535))
        );
    }

    #[test]
    fn v1_addresses() {
        assert_eq!(
            parse(b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 25\r\n"),
            Ok(Some("192.0.2.7:40000".parse().unwrap()))
        );
        assert_eq!(
            parse(b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 587\r\n"),
            Ok(Some("[2001:db8::7]:40000".parse().unwrap()))
        );
        assert_eq!(parse(b"PROXY UNKNOWN\r\n"), Ok(None));
        assert_eq!(parse(b"PROXY UNKNOWN 1.2.3.4 whatever\r\n"), Ok(None));
    }

    #[test]
    fn malformed_v1_lines_are_refused() {
        for line in [
            &b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 25\n"[..],
            b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 25\r\r\n",
            b"PROXY TCP4 192.0.2.7\r10.0.0.1 40000 25\r\n",
            b"PROXY TCP4 2001:db8::7 10.0.0.1 40000 25\r\n",
            b"PROXY TCP6 192.0.2.7 10.0.0.1 40000 25\r\n",
            b"PROXY TCP4 192.0.2.7 10.0.0.1 040000 25\r\n",
            b"PROXY TCP4 192.0.2.7 10.0.0.1 70000 25\r\n",
            b"PROXY TCP4 192.0.2.7 10.0.0.1 40000\r\n",
            b"PROXY TCP4 192.0.2.256 10.0.0.1 40000 25\r\n",
            b"PROXY UDP4 192.0.2.7 10.0.0.1 40000 25\r\n",
            b"PROXY  TCP4 192.0.2.7 10.0.0.1 40000 25\r\n",
            b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 25 \r\n",
            b"PROXY \xff\xfe\r\n",
            b"PROXY \r\n",
        ] {
            assert!(
                matches!(frame(line), Framing::Complete(n) if n == line.len()),
                "{line:?}"
            );
            assert!(
                matches!(parse(line), Err(Refusal::Malformed(_))),
                "{:?} → {:?}",
                String::from_utf8_lossy(line),
                parse(line)
            );
        }
    }

    #[test]
    fn v2_commands_and_families() {
        assert_eq!(
            parse(&v2_tcp4([192, 0, 2, 7], 40000)),
            Ok(Some("192.0.2.7:40000".parse().unwrap()))
        );
        let mut body = vec![0x20, 0x01, 0x0d, 0xb8];
        body.extend_from_slice(&[0; 11]);
        body.push(7);
        body.extend_from_slice(&[0; 16]);
        body.extend_from_slice(&40000u16.to_be_bytes());
        body.extend_from_slice(&587u16.to_be_bytes());
        assert_eq!(
            parse(&v2(0x21, 0x21, &body)),
            Ok(Some("[2001:db8::7]:40000".parse().unwrap()))
        );
        // TLVs after the addresses (here PP2_TYPE_AUTHORITY and a NOOP) change nothing.
        let mut with_tlvs = body.clone();
        with_tlvs.extend_from_slice(&[0x02, 0x00, 0x04, b'm', b'x', b'.', b't']);
        with_tlvs.extend_from_slice(&[0x04, 0x00, 0x00]);
        assert_eq!(
            parse(&v2(0x21, 0x21, &with_tlvs)),
            Ok(Some("[2001:db8::7]:40000".parse().unwrap()))
        );
        // LOCAL: the connection's own address, whatever the block holds.
        assert_eq!(parse(&v2(0x20, 0x00, &[])), Ok(None));
        assert_eq!(parse(&v2(0x20, 0x21, &body)), Ok(None));
        // UNSPEC, UDP and AF_UNIX: fall back to the connection's own address.
        assert_eq!(parse(&v2(0x21, 0x00, &[])), Ok(None));
        assert_eq!(parse(&v2(0x21, 0x22, &body)), Ok(None));
        assert_eq!(parse(&v2(0x21, 0x31, &[0; 216])), Ok(None));
    }

    #[test]
    fn malformed_v2_headers_are_refused() {
        for header in [
            v2(0x11, 0x11, &[0; 12]), // version 1 in a v2 header
            v2(0x22, 0x11, &[0; 12]), // command 2
            v2(0x21, 0x41, &[0; 12]), // family 4
            v2(0x21, 0x13, &[0; 12]), // protocol 3
            v2(0x21, 0x11, &[0; 11]), // too short for two IPv4 addresses and ports
            v2(0x21, 0x21, &[0; 12]), // too short for IPv6
        ] {
            assert!(
                matches!(frame(&header), Framing::Complete(n) if n == header.len()),
                "{header:?}"
            );
            assert!(
                matches!(parse(&header), Err(Refusal::Malformed(_))),
                "{header:?} → {:?}",
                parse(&header)
            );
        }
    }

    #[test]
    fn sniffing_unexpected_headers() {
        assert!(looks_like_header(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"));
        assert!(looks_like_header(b"PROXY"));
        assert!(looks_like_header(&v2_tcp4([1, 2, 3, 4], 5)));
        assert!(looks_like_header(b"\r\n\r\n\0"));
        for ordinary in [
            &b"EHLO client\r\n"[..],
            b"HELO x\r\n",
            b"\r\n",
            b"PRO",
            b"QUIT\r\n",
            b"\x16\x03\x01",
        ] {
            assert!(!looks_like_header(ordinary), "{ordinary:?}");
        }
    }

    /// No input makes the framing or the parser panic, and a complete frame is never longer
    /// than the input or the bounds.
    #[test]
    fn arbitrary_bytes_never_panic() {
        use proptest::prelude::*;
        let prefixes: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"PROXY ".to_vec(),
            b"PROXY TCP4 ".to_vec(),
            b"PROXY TCP6 ".to_vec(),
            V2_SIGNATURE.to_vec(),
            V2_SIGNATURE.iter().copied().chain([0x21, 0x11]).collect(),
        ];
        proptest!(|(which in 0..prefixes.len(), tail in proptest::collection::vec(any::<u8>(), 0..300))| {
            let mut input = prefixes[which].clone();
            input.extend_from_slice(&tail);
            match frame(&input) {
                Framing::Complete(n) => {
                    prop_assert!(n <= input.len() && n <= MAX_HEADER);
                    let _ = parse(&input[..n]);
                }
                Framing::Incomplete => prop_assert!(input.len() < MAX_HEADER),
                Framing::Refused(_) => {}
            }
        });
    }
}
