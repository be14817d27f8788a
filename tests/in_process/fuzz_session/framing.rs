//! Line framing against a whole-input reference, on every split.

use super::*;

#[derive(Debug, PartialEq, Eq)]
struct Framed {
    /// Complete lines, CRLF removed (a long line handed out in `Partial`s is joined again).
    lines: Vec<Vec<u8>>,
    /// Stream offset of the first bare line ending, if one was found.
    bare: Option<usize>,
}

/// The obviously correct version: look at the whole input at once.
fn reference_framing(input: &[u8]) -> Framed {
    let bare = first_bare(input);
    let (lines, _) = crlf_lines(&input[..bare.unwrap_or(input.len())]);
    Framed {
        lines: lines.into_iter().map(<[u8]>::to_vec).collect(),
        bare,
    }
}

/// `next_piece` as a reader uses it: buffer what arrived, take pieces off the front.
fn drive_next_piece(chunks: &[&[u8]], max: usize) -> Result<Framed, TestCaseError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut base = 0;
    let mut current = Vec::new();
    let mut lines = Vec::new();
    let has_ending = |b: &[u8]| b.iter().any(|&c| c == b'\r' || c == b'\n');
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match next_piece(&buf, max) {
                Piece::NeedMore => {
                    // Bounded buffering: an undecided rest never exceeds the limit.
                    prop_assert!(buf.len() <= max, "kept {} bytes, max {}", buf.len(), max);
                    break;
                }
                Piece::Partial(n) => {
                    prop_assert!(n >= 1 && n <= buf.len(), "Partial({}) of {}", n, buf.len());
                    prop_assert!(n >= max, "Partial({}) under max {}", n, max);
                    prop_assert!(!has_ending(&buf[..n]));
                    current.extend(buf.drain(..n));
                    base += n;
                }
                Piece::Line(n) => {
                    prop_assert!(n >= 2 && n <= buf.len());
                    prop_assert_eq!(&buf[n - 2..n], b"\r\n");
                    prop_assert!(!has_ending(&buf[..n - 2]));
                    current.extend_from_slice(&buf[..n - 2]);
                    buf.drain(..n);
                    base += n;
                    lines.push(std::mem::take(&mut current));
                }
                Piece::BareLineEnding => {
                    let i = buf
                        .iter()
                        .position(|&c| c == b'\r' || c == b'\n')
                        .expect("BareLineEnding without a CR or LF");
                    return Ok(Framed {
                        lines,
                        bare: Some(base + i),
                    });
                }
            }
        }
    }
    // Nothing lost: the lines, the open line and the kept rest are the whole input.
    prop_assert_eq!(
        base + buf.len(),
        chunks.iter().map(|c| c.len()).sum::<usize>()
    );
    Ok(Framed { lines, bare: None })
}

fn framing_bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(
        prop_oneof![
            6 => select(vec![b'a', b'b', b'.', b' ', 0u8]),
            3 => Just(b'\r'),
            3 => Just(b'\n'),
        ],
        0..300,
    )
    .prop_flat_map(|bytes| {
        // Mostly well-formed: turn most lone endings into CRLF, keep a few bare ones.
        (
            Just(bytes.clone()),
            vec(prop::bool::weighted(0.85), bytes.len()),
        )
    })
    .prop_map(|(bytes, fix)| {
        let mut out = Vec::with_capacity(bytes.len() * 2);
        for (b, fix) in bytes.into_iter().zip(fix) {
            if fix && (b == b'\r' || b == b'\n') {
                out.extend_from_slice(b"\r\n");
            } else {
                out.push(b);
            }
        }
        out
    })
}

#[test]
fn next_piece_agrees_with_a_whole_input_framer_on_every_split() {
    let mut runner = TestRunner::new(config(2048));
    let strategy = (
        framing_bytes(),
        prop_oneof![1usize..40, Just(2048)],
        vec(any::<Index>(), 0..24),
    );
    runner
        .run(&strategy, |(input, max, cuts)| {
            let want = reference_framing(&input);
            prop_assert_eq!(&drive_next_piece(&[&input], max)?, &want);
            prop_assert_eq!(&drive_next_piece(&split(&input, &cuts), max)?, &want);
            // One byte at a time is the harshest split.
            let bytes: Vec<&[u8]> = input.chunks(1).collect();
            prop_assert_eq!(&drive_next_piece(&bytes, max)?, &want);
            Ok(())
        })
        .unwrap();
}
