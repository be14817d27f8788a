//! DATA bodies (dot-unstuffing and the terminator) and BDAT bodies, on every split.

use super::*;

#[derive(Debug, PartialEq, Eq)]
enum DataEnd {
    /// The terminator ended at `used`; the message or the most serious fault.
    Complete {
        used: usize,
        message: Result<Vec<u8>, BodyFault>,
    },
    BareLineEnding,
    NeedMore,
}

/// The most serious of the faults seen decides the reply: too big, then a long line, then NUL.
fn rank(f: BodyFault) -> u8 {
    match f {
        BodyFault::Nul => 0,
        BodyFault::LineTooLong => 1,
        BodyFault::TooBig => 2,
    }
}

fn worst(seen: Option<BodyFault>, new: BodyFault) -> Option<BodyFault> {
    match seen {
        Some(f) if rank(f) >= rank(new) => Some(f),
        _ => Some(new),
    }
}

/// The obviously correct version: split the whole input into CRLF lines up to the first bare
/// line ending, stop at the first line that is exactly ".", unstuff one leading dot, and apply
/// the limits per line (length as sent, NUL, size); the most serious fault is the answer.
fn reference_data(input: &[u8], limits: BodyLimits) -> DataEnd {
    let bare = first_bare(input);
    let (lines, _) = crlf_lines(&input[..bare.unwrap_or(input.len())]);
    let mut used = 0;
    let mut message = Vec::new();
    let mut fault = None;
    for line in lines {
        used += line.len() + 2;
        if line == b"." {
            return DataEnd::Complete {
                used,
                message: fault.map_or(Ok(message), Err),
            };
        }
        let content = line.strip_prefix(b".").unwrap_or(line);
        if line.len() > limits.max_line {
            fault = worst(fault, BodyFault::LineTooLong);
        }
        if content.contains(&0) {
            fault = worst(fault, BodyFault::Nul);
        }
        message.extend_from_slice(content);
        message.extend_from_slice(b"\r\n");
        if message.len() > limits.max_size {
            fault = worst(fault, BodyFault::TooBig);
        }
    }
    match bare {
        Some(_) => DataEnd::BareLineEnding,
        None => DataEnd::NeedMore,
    }
}

fn drive_dotted(chunks: &[&[u8]], limits: BodyLimits) -> Result<DataEnd, TestCaseError> {
    let mut rx = BodyReceiver::new(limits);
    let mut pending: Vec<u8> = Vec::new();
    let mut consumed = 0;
    for chunk in chunks {
        pending.extend_from_slice(chunk);
        let (used, status) = rx.feed_dotted(&pending);
        prop_assert!(used <= pending.len());
        consumed += used;
        pending.drain(..used);
        match status {
            BodyStatus::NeedMore => {
                prop_assert!(
                    pending.len() <= limits.max_line + 2,
                    "kept {} bytes of an unfinished line",
                    pending.len()
                );
            }
            BodyStatus::Complete => {
                return Ok(DataEnd::Complete {
                    used: consumed,
                    message: rx.into_message(),
                })
            }
            BodyStatus::BareLineEnding => return Ok(DataEnd::BareLineEnding),
        }
    }
    Ok(DataEnd::NeedMore)
}

fn body_line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => "[a-z:. ]{0,12}".prop_map(String::into_bytes),
        2 => select(vec![&b"."[..], b"..", b"...", b".x", b"", b"From: a@x"]).prop_map(<[u8]>::to_vec),
        1 => (0usize..120, select(vec![b'x', b'.'])).prop_map(|(n, b)| vec![b; n]),
        1 => ("[a-z]{0,5}", "[a-z]{0,5}").prop_map(|(a, b)| {
            let mut v = a.into_bytes();
            v.push(0);
            v.extend_from_slice(b.as_bytes());
            v
        }),
    ]
}

/// Lines with mostly-correct endings; sometimes a terminator somewhere, sometimes garbage
/// after it.
fn dotted_body() -> impl Strategy<Value = Vec<u8>> {
    (vec((body_line(), ending()), 0..24), vec(any::<u8>(), 0..8)).prop_map(|(lines, tail)| {
        let mut out = Vec::new();
        for (line, end) in lines {
            out.extend_from_slice(&line);
            out.extend_from_slice(end);
        }
        out.extend_from_slice(&tail);
        out
    })
}

#[test]
fn feed_dotted_agrees_with_a_whole_input_unstuffer_on_every_split() {
    let completes = Cell::new(0usize);
    let faults = Cell::new(0usize);
    let bares = Cell::new(0usize);
    let mut runner = TestRunner::new(config(2048));
    let strategy = (dotted_body(), limits(), vec(any::<Index>(), 0..24));
    runner
        .run(&strategy, |(input, limits, cuts)| {
            let want = reference_data(&input, limits);
            prop_assert_eq!(&drive_dotted(&[&input], limits)?, &want);
            prop_assert_eq!(&drive_dotted(&split(&input, &cuts), limits)?, &want);
            let bytes: Vec<&[u8]> = input.chunks(1).collect();
            prop_assert_eq!(&drive_dotted(&bytes, limits)?, &want);
            match &want {
                DataEnd::Complete { message, .. } => {
                    bump(&completes, true);
                    bump(&faults, message.is_err());
                    if let Ok(m) = message {
                        prop_assert!(strict_crlf(m));
                    }
                }
                DataEnd::BareLineEnding => bump(&bares, true),
                DataEnd::NeedMore => {}
            }
            Ok(())
        })
        .unwrap();
    assert!(completes.get() > 100, "{} complete bodies", completes.get());
    assert!(faults.get() > 30, "{} faulty bodies", faults.get());
    assert!(bares.get() > 100, "{} bare endings", bares.get());
}

/// A well-formed body is always taken back out unchanged: dot-stuff it, add the terminator and
/// any trailing bytes, split it anywhere.
#[test]
fn feed_dotted_round_trips_dot_stuffing() {
    let mut runner = TestRunner::new(config(512));
    let strategy = (
        vec(body_line(), 0..20),
        vec(any::<u8>(), 0..16),
        vec(any::<Index>(), 0..16),
    );
    runner
        .run(&strategy, |(lines, tail, cuts)| {
            let mut message = Vec::new();
            let mut wire = Vec::new();
            for line in &lines {
                message.extend_from_slice(line);
                message.extend_from_slice(b"\r\n");
                if line.first() == Some(&b'.') {
                    wire.push(b'.');
                }
                wire.extend_from_slice(line);
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b".\r\n");
            let used = wire.len();
            wire.extend_from_slice(&tail);
            let limits = BodyLimits {
                max_line: 1000,
                max_size: 1_000_000,
            };
            let want = if message.contains(&0) {
                Err(BodyFault::Nul)
            } else {
                Ok(message)
            };
            let got = drive_dotted(&split(&wire, &cuts), limits)?;
            prop_assert_eq!(
                got,
                DataEnd::Complete {
                    used,
                    message: want
                }
            );
            Ok(())
        })
        .unwrap();
}

// =============================================================================================
// (d) BDAT bodies
// =============================================================================================

#[derive(Debug, PartialEq, Eq)]
enum RawEnd {
    Complete(Result<Vec<u8>, BodyFault>),
    BareLineEnding,
}

/// All the faults a raw body has (the receiver reports the most serious one).
fn raw_faults(input: &[u8], limits: BodyLimits) -> Vec<BodyFault> {
    let mut faults = Vec::new();
    let (lines, rest) = crlf_lines(input);
    let mut size = 0;
    for (i, line) in lines.iter().chain(std::iter::once(&rest)).enumerate() {
        if line.len() > limits.max_line && !faults.contains(&BodyFault::LineTooLong) {
            faults.push(BodyFault::LineTooLong);
        }
        if line.contains(&0) && !faults.contains(&BodyFault::Nul) {
            faults.push(BodyFault::Nul);
        }
        size += line.len() + if i < lines.len() { 2 } else { 0 };
        if size > limits.max_size && !faults.contains(&BodyFault::TooBig) {
            faults.push(BodyFault::TooBig);
        }
    }
    faults
}

/// The whole chunk at once: bare anywhere (a final lone CR included, since LAST ends it) is
/// refused, otherwise the bytes are the message as they are, or the most serious fault.
fn reference_raw(input: &[u8], limits: BodyLimits) -> RawEnd {
    if first_bare(input).is_some() || input.last() == Some(&b'\r') {
        return RawEnd::BareLineEnding;
    }
    match raw_faults(input, limits)
        .into_iter()
        .max_by_key(|&f| rank(f))
    {
        Some(f) => RawEnd::Complete(Err(f)),
        None => RawEnd::Complete(Ok(input.to_vec())),
    }
}

fn drive_raw(chunks: &[&[u8]], limits: BodyLimits) -> RawEnd {
    let mut rx = BodyReceiver::new(limits);
    for chunk in chunks {
        if rx.feed_raw(chunk) == BodyStatus::BareLineEnding {
            return RawEnd::BareLineEnding;
        }
    }
    match rx.finish_raw() {
        BodyStatus::BareLineEnding => RawEnd::BareLineEnding,
        _ => RawEnd::Complete(rx.into_message()),
    }
}

#[test]
fn feed_raw_agrees_with_a_whole_input_reference_on_every_split() {
    let mut runner = TestRunner::new(config(2048));
    let strategy = (dotted_body(), limits(), vec(any::<Index>(), 0..24));
    runner
        .run(&strategy, |(input, limits, cuts)| {
            let want = reference_raw(&input, limits);
            prop_assert_eq!(&drive_raw(&[&input], limits), &want);
            // The same answer (message, bare ending, or the most serious fault) on any split.
            prop_assert_eq!(&drive_raw(&split(&input, &cuts), limits), &want);
            let bytes: Vec<&[u8]> = input.chunks(1).collect();
            prop_assert_eq!(&drive_raw(&bytes, limits), &want);
            Ok(())
        })
        .unwrap();
}

/// Regression (found by (a)/(d)): the reported fault must not depend on how a BDAT chunk was
/// split into reads. It used to be the first fault met, so a NUL early in an over-long line
/// won when the line arrived in pieces (554 instead of 550), and an over-size non-LAST chunk
/// could escape its 552.
#[test]
fn bdat_fault_does_not_depend_on_the_split() {
    let limits = BodyLimits {
        max_line: 998,
        max_size: 100_000,
    };
    let mut line = b"ab\0".to_vec();
    line.extend(std::iter::repeat_n(b'x', 1000));
    line.extend_from_slice(b"\r\n");
    let whole = drive_raw(&[&line], limits);
    assert_eq!(whole, RawEnd::Complete(Err(BodyFault::LineTooLong)));
    assert_eq!(drive_raw(&[&line[..3], &line[3..]], limits), whole);

    // Over the session, with the same bytes in two reads: the replies differ.
    let config = SessionConfig {
        max_message_size: 100_000,
        ..SessionConfig::default()
    };
    let mut wire = b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\n".to_vec();
    wire.extend_from_slice(format!("BDAT {} LAST\r\n", line.len()).as_bytes());
    let cut = wire.len() + 3;
    wire.extend_from_slice(&line);
    let setup = Setup {
        config,
        may_submit: true,
    };
    let one = run_session(&setup, &[&wire]).unwrap();
    let two = run_session(&setup, &[&wire[..cut], &wire[cut..]]).unwrap();
    assert_eq!(
        one.replies.last().unwrap(),
        &Reply::data_line_too_long().line()
    );
    assert_eq!(one, two);
}

/// Regression (found by (a)): docs/guides/tls-auth-relay.md says a command line over 2048 octets gets `500 5.5.2`.
/// A SASL response is a command line too, and the answer must not depend on whether it
/// arrived in one read or several (whole, it used to be decoded: 501 Cannot decode).
#[test]
fn an_over_long_sasl_response_is_refused_whatever_the_split() {
    let setup = Setup {
        config: SessionConfig {
            auth: true,
            ..SessionConfig::default()
        },
        may_submit: false,
    };
    let mut wire = b"EHLO c\r\nAUTH LOGIN\r\n".to_vec();
    let cut = wire.len() + 2100;
    wire.extend(std::iter::repeat_n(b'Q', 3000));
    wire.extend_from_slice(b"\r\nNOOP\r\n");
    let whole = run_session(&setup, &[&wire]).unwrap();
    let parts = run_session(&setup, &[&wire[..cut], &wire[cut..]]).unwrap();
    assert_eq!(parts.replies[2], Reply::line_too_long().line());
    assert_eq!(whole.replies[2], Reply::line_too_long().line(), "{whole:?}");
    assert_eq!(whole, parts);
}
