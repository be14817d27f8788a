//! Fuzz-style properties over the pure SMTP side (no I/O), on stable with proptest:
//!
//! (a) byte soup mixed with SMTP keywords, line endings, dots, NULs and BDAT sizes, fed to a
//!     `Session` in random chunk splits: no panic, every submitted message is strict CRLF,
//!     nothing follows a `521`, the limits hold, every reply is well formed, and the split
//!     does not change what the client sees or what intake is handed;
//! (b) `framing::next_piece`, driven over random splits, agrees with a whole-input reference
//!     framer on the complete lines and on the first bare line ending;
//! (c) `BodyReceiver::feed_dotted` (DATA), fed in random chunks, agrees with a whole-input
//!     reference dot-unstuffer and terminator finder;
//! (d) `BodyReceiver::feed_raw` (BDAT) likewise against a whole-input reference;
//! (e) `smtp::address` against a reference made of regular expressions transcribed from the
//!     ABNF of RFC 5321 §4.1.2-4.1.3 (and RFC 6531): addresses generated from that grammar are
//!     accepted and reach intake unchanged through a session; mutated and arbitrary strings
//!     are accepted exactly when the reference accepts them.
//!
//! `cargo test --test in_process fuzz_session::`. Case counts are fixed per property (PROPTEST_CASES does
//! not change them); failures are not persisted, the failing input is printed instead.

use std::cell::Cell;
use std::sync::Arc;

use idemrelay::mail::Submission;
use idemrelay::reply::Reply;
use idemrelay::smtp::address;
use idemrelay::smtp::framing::{
    next_piece, BodyFault, BodyLimits, BodyReceiver, BodyStatus, Piece,
};
use idemrelay::smtp::session::{Output, Session, SessionConfig};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{Config, TestCaseError, TestRunner};

fn config(cases: u32) -> Config {
    Config {
        cases,
        // Only the two new files: no regression files written next to them.
        failure_persistence: None,
        ..Config::default()
    }
}

/// Cuts `input` at the given points (any number, any order, duplicates allowed).
fn split<'a>(input: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
    points.sort_unstable();
    points.dedup();
    let mut chunks = Vec::new();
    let mut start = 0;
    for p in points {
        chunks.push(&input[start..p]);
        start = p;
    }
    chunks.push(&input[start..]);
    chunks
}

/// Position of the first bare line ending in the whole input: a LF not preceded by CR, or a
/// CR followed by anything but LF. A CR that is the very last byte is undecided, not bare.
fn first_bare(input: &[u8]) -> Option<usize> {
    (0..input.len()).find(|&i| match input[i] {
        b'\n' => i == 0 || input[i - 1] != b'\r',
        b'\r' => i + 1 < input.len() && input[i + 1] != b'\n',
        _ => false,
    })
}

/// Every `\r` is followed by `\n` and every `\n` preceded by `\r`.
fn strict_crlf(bytes: &[u8]) -> bool {
    bytes.iter().enumerate().all(|(i, &b)| match b {
        b'\r' => bytes.get(i + 1) == Some(&b'\n'),
        b'\n' => i > 0 && bytes[i - 1] == b'\r',
        _ => true,
    })
}

/// The CRLF-terminated lines of `bytes` (without CRLF) and the unterminated rest.
fn crlf_lines(bytes: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let mut lines = Vec::new();
    let mut pos = 0;
    while let Some(k) = bytes[pos..].windows(2).position(|w| w == b"\r\n") {
        lines.push(&bytes[pos..pos + k]);
        pos += k + 2;
    }
    (lines, &bytes[pos..])
}

// =============================================================================================
// (a) the session over byte soup
// =============================================================================================

const COMMANDS: &[&[u8]] = &[
    b"EHLO c\r\n",
    b"HELO c\r\n",
    b"MAIL FROM:<a@x>\r\n",
    b"MAIL FROM:<a@x> SIZE=40 BODY=8BITMIME\r\n",
    b"MAIL FROM:<> SMTPUTF8\r\n",
    b"MAIL FROM:<a@x> RET=HDRS ENVID=e1 REQUIRETLS\r\n",
    b"MAIL FROM:<a@x> RET=BAD\r\n",
    b"RCPT TO:<b@x>\r\n",
    b"RCPT TO:<b@X> NOTIFY=SUCCESS,DELAY ORCPT=rfc822;b@X\r\n",
    b"RCPT TO:<c@x> NOTIFY=NEVER,FAILURE\r\n",
    b"RCPT TO:<c@x>\r\n",
    b"RCPT TO:<d@x>\r\n",
    b"DATA\r\n",
    b"RSET\r\n",
    b"NOOP\r\n",
    b"QUIT\r\n",
    b"STARTTLS\r\n",
    b"AUTH PLAIN AGEAYg==\r\n",
    b"AUTH LOGIN\r\n",
    b"YQ==\r\n",
    b"*\r\n",
    b"VRFY x\r\n",
    b"HELP\r\n",
    b"From: a@x\r\n",
    b"Subject: s\r\n",
    b"\r\n",
    b".\r\n",
    b"..\r\n",
    b"\r\n.\r\n",
];

/// Pieces that break lines or bodies: dots, lone endings, the smuggling sequences, NUL.
const HOSTILE: &[&[u8]] = &[
    b".",
    b"..",
    b"\r",
    b"\n",
    b"\0",
    b"\n.\n",
    b"\n.\r\n",
    b"\r\n.\n",
    b"\r.\r",
    b"\r\n.\r\r\n",
    b" ",
    b":",
    b"MAIL",
    b"BDAT",
];

fn happy_data() -> Vec<u8> {
    b"MAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nFrom: a@x\r\n\r\n..dotted\r\nbody\r\n.\r\n"
        .to_vec()
}

fn happy_bdat(last: bool) -> Vec<u8> {
    let chunk = b"From: a@x\r\n\r\nchunked body\r\n";
    let mut s = b"MAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\n".to_vec();
    let tail = if last { " LAST" } else { "" };
    s.extend_from_slice(format!("BDAT {}{tail}\r\n", chunk.len()).as_bytes());
    s.extend_from_slice(chunk);
    s
}

fn token() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        14 => select(COMMANDS).prop_map(<[u8]>::to_vec),
        3 => select(HOSTILE).prop_map(<[u8]>::to_vec),
        3 => (0usize..1200, any::<bool>()).prop_map(|(n, last)| {
            format!("BDAT {n}{}\r\n", if last { " LAST" } else { "" }).into_bytes()
        }),
        1 => Just(b"BDAT 999999999999999999999 LAST\r\n".to_vec()),
        1 => vec(any::<u8>(), 0..12),
        3 => "[ -~]{0,24}".prop_map(String::into_bytes),
        1 => (1usize..2500, select(vec![b'x', b'.', 0u8, b' ']))
            .prop_map(|(n, b)| vec![b; n]),
        3 => Just(happy_data()),
        2 => any::<bool>().prop_map(happy_bdat),
        // Transactions left open, so that what follows becomes a body or a chunk.
        3 => Just(b"MAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nFrom: a@x\r\n\r\n".to_vec()),
        2 => Just(b"MAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\n".to_vec()),
        1 => Just(b"EHLO c\r\nAUTH PLAIN AGEAYg==\r\n".to_vec()),
        1 => Just(b"EHLO c\r\nSTARTTLS\r\nEHLO c\r\n".to_vec()),
    ]
}

fn soup() -> impl Strategy<Value = Vec<u8>> {
    (prop::bool::weighted(0.8), vec(token(), 0..40)).prop_map(|(greet, tokens)| {
        let mut input = if greet {
            b"EHLO c\r\n".to_vec()
        } else {
            Vec::new()
        };
        for t in tokens {
            input.extend_from_slice(&t);
        }
        input
    })
}

#[derive(Debug, Clone)]
struct Setup {
    config: SessionConfig,
    may_submit: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        (
            any::<bool>(),
            any::<bool>(),
            prop::bool::weighted(0.3),
            prop::bool::weighted(0.8),
        ),
        (
            1usize..4,
            prop_oneof![Just(25 * 1024 * 1024), 1usize..600],
            prop_oneof![Just(998), 1usize..60],
            prop_oneof![Just(2048), 16usize..80],
        ),
        (1usize..30, 1usize..4, prop_oneof![Just(1000), 1usize..4]),
    )
        .prop_map(
            |(
                (starttls, auth, require_tls, may_submit),
                (max_recipients, max_message_size, max_data_line, max_command_line),
                (max_errors, max_auth_failures, max_transactions),
            )| Setup {
                config: SessionConfig {
                    hostname: "relay.test".into(),
                    max_message_size,
                    max_recipients,
                    max_transactions,
                    max_command_line,
                    max_data_line,
                    max_errors,
                    starttls,
                    require_tls,
                    auth,
                    max_auth_failures,
                },
                may_submit,
            },
        )
}

/// What a session said and did, with every invariant checked on the way.
#[derive(Debug, Default, PartialEq, Eq)]
struct Transcript {
    replies: Vec<String>,
    submissions: Vec<Submission>,
    closed: bool,
    starttls: usize,
    authenticate: usize,
    saw_521: bool,
}

/// Checks one reply line by line: a real code, no line breaks in the text, and an enhanced
/// status code of the right class except where RFC 2034 exempts (HELO/EHLO) or a
/// continuation is asked for (354, 334).
fn check_reply(r: &Reply) -> Result<(), TestCaseError> {
    prop_assert!((200..600).contains(&r.code), "code {}", r.code);
    prop_assert!(!r.lines.is_empty());
    for l in &r.lines {
        prop_assert!(!l.contains('\r') && !l.contains('\n'), "{:?}", r);
    }
    let first = &r.lines[0];
    let exempt = r.code == 354 || r.code == 334 || (r.code == 250 && first.contains(" greets "));
    if !exempt {
        let enhanced = first.split(' ').next().unwrap_or("");
        let parts: Vec<&str> = enhanced.split('.').collect();
        prop_assert!(
            parts.len() == 3
                && parts[0] == (r.code / 100).to_string()
                && parts[1..].iter().all(|p| !p.is_empty()
                    && p.len() <= 3
                    && p.bytes().all(|b| b.is_ascii_digit())),
            "no enhanced status code: {}",
            r.line()
        );
    }
    if r.code == 521 {
        prop_assert_eq!(r, &Reply::bare_line_ending());
    }
    Ok(())
}

fn check_submission(setup: &Setup, sub: &Submission) -> Result<(), TestCaseError> {
    let m = &sub.message;
    let c = &setup.config;
    prop_assert!(strict_crlf(m), "bare CR/LF in a submitted message: {:?}", m);
    prop_assert!(!m.contains(&0), "NUL in a submitted message");
    prop_assert!(
        m.len() <= c.max_message_size,
        "{} > {}",
        m.len(),
        c.max_message_size
    );
    let (lines, rest) = crlf_lines(m);
    for line in lines.iter().chain(std::iter::once(&rest)) {
        prop_assert!(line.len() <= c.max_data_line, "line of {}", line.len());
    }
    if !sub.chunked {
        prop_assert!(m.is_empty() || m.ends_with(b"\r\n"), "DATA message {:?}", m);
    }
    let env = &sub.envelope;
    prop_assert!(
        address::reverse_path(&env.mail_from, env.smtputf8) == Some(env.mail_from.as_str()),
        "invalid sender reached intake: {:?}",
        env.mail_from
    );
    for r in &env.rcpt_to {
        prop_assert!(
            address::forward_path(r, env.smtputf8) == Some(r.as_str()),
            "invalid recipient reached intake: {:?}",
            r
        );
    }
    let rcpts = &sub.envelope.rcpt_to;
    prop_assert!(!rcpts.is_empty() && rcpts.len() <= c.max_recipients);
    let mut dedup = rcpts.clone();
    dedup.sort();
    dedup.dedup();
    prop_assert_eq!(dedup.len(), rcpts.len(), "repeated recipient");
    // auth_result is only ever answered None here, so only allow-listed sessions submit.
    prop_assert!(setup.may_submit && sub.auth_scope.is_none());
    if c.require_tls {
        prop_assert!(sub.tls);
    }
    // The requests concern this envelope's recipients only, and REQUIRETLS came over TLS.
    let requests = &sub.envelope.requests;
    prop_assert!(requests.recipients.keys().all(|r| rcpts.contains(r)));
    if requests.require_tls {
        prop_assert!(sub.tls);
    }
    Ok(())
}

fn absorb(
    setup: &Setup,
    s: &mut Session,
    mut outputs: Vec<Output>,
    t: &mut Transcript,
) -> Result<(), TestCaseError> {
    while !outputs.is_empty() {
        prop_assert!(!t.closed, "output after Close: {:?}", outputs);
        let mut next = Vec::new();
        let mut previous_was_reply = false;
        for o in outputs {
            prop_assert!(!t.closed, "output after Close: {:?}", o);
            let is_reply = matches!(o, Output::Reply(_));
            match o {
                Output::Reply(r) => {
                    check_reply(&r)?;
                    if r.code == 521 {
                        t.saw_521 = true;
                    }
                    t.replies.push(r.line());
                }
                Output::Close => {
                    prop_assert!(previous_was_reply, "Close without a reply");
                    prop_assert!(s.is_closed());
                    t.closed = true;
                }
                Output::Submit(sub) => {
                    prop_assert!(!t.saw_521, "a submission after 521");
                    check_submission(setup, &sub)?;
                    t.submissions.push(sub);
                    next = s.submission_done(Reply::queued("T"));
                }
                Output::StartTls => {
                    t.starttls += 1;
                    s.tls_started();
                }
                Output::Authenticate(_) => {
                    t.authenticate += 1;
                    next = s.auth_result(None);
                }
            }
            previous_was_reply = is_reply;
        }
        if t.saw_521 {
            prop_assert!(t.closed, "521 without closing");
        }
        outputs = next;
    }
    Ok(())
}

fn run_session(setup: &Setup, chunks: &[&[u8]]) -> Result<Transcript, TestCaseError> {
    let mut s = Session::new(Arc::new(setup.config.clone()), setup.may_submit);
    let mut t = Transcript::default();
    for chunk in chunks {
        let closed_before = t.closed;
        let out = s.feed(chunk);
        if closed_before {
            prop_assert!(out.is_empty(), "a closed session answered: {:?}", out);
        }
        absorb(setup, &mut s, out, &mut t)?;
    }
    Ok(t)
}

#[derive(Default)]
struct SoupStats {
    cases: Cell<usize>,
    with_submission: Cell<usize>,
    with_bdat_submission: Cell<usize>,
    with_521: Cell<usize>,
    with_body_fault: Cell<usize>,
    with_starttls: Cell<usize>,
    with_auth: Cell<usize>,
    compared_splits: Cell<usize>,
}

fn bump(c: &Cell<usize>, yes: bool) {
    c.set(c.get() + usize::from(yes));
}

/// Runs the soup property over `cases` generated sessions.
fn soup_property(cases: u32) -> SoupStats {
    let stats = SoupStats::default();
    let mut runner = TestRunner::new(config(cases));
    let strategy = (setup(), soup(), vec(any::<Index>(), 0..16));
    runner
        .run(&strategy, |(setup, input, cuts)| {
            let parts = run_session(&setup, &split(&input, &cuts))?;
            let whole = run_session(&setup, &[&input])?;
            // Plaintext pipelined after STARTTLS is dropped with the buffer it came in, so
            // there the split may matter; everywhere else the client must see the same
            // replies and intake the same submissions whatever the segmentation.
            if parts.starttls == 0 && whole.starttls == 0 {
                prop_assert_eq!(&parts, &whole);
                bump(&stats.compared_splits, true);
            }
            for t in [&parts, &whole] {
                bump(&stats.cases, true);
                bump(&stats.with_submission, !t.submissions.is_empty());
                bump(
                    &stats.with_bdat_submission,
                    t.submissions.iter().any(|s| s.chunked),
                );
                bump(&stats.with_521, t.saw_521);
                bump(
                    &stats.with_body_fault,
                    t.replies.iter().any(|r| is_body_fault(r)),
                );
                bump(&stats.with_starttls, t.starttls > 0);
                bump(&stats.with_auth, t.authenticate > 0);
            }
            Ok(())
        })
        .unwrap();
    stats
}

fn is_body_fault(reply: &str) -> bool {
    reply.starts_with("550 5.6.0 Message line")
        || reply.starts_with("554 5.6.0 NUL")
        || reply.starts_with("552 5.3.4")
}

#[test]
fn session_survives_byte_soup_in_any_split() {
    let stats = soup_property(2048);
    // The soup must actually reach the interesting places (about 1 run in 6 submits, 1 in 4
    // ends in a 521, 1 in 20 has a body fault; 1 % is a generous floor).
    let n = stats.cases.get();
    for (what, hits) in [
        ("a submission", stats.with_submission.get()),
        ("a BDAT submission", stats.with_bdat_submission.get()),
        ("a 521", stats.with_521.get()),
        ("a body fault", stats.with_body_fault.get()),
        ("STARTTLS", stats.with_starttls.get()),
        ("AUTH", stats.with_auth.get()),
    ] {
        assert!(hits * 100 >= n, "only {hits} of {n} runs reached {what}");
    }
    let cases = n / 2;
    assert!(
        stats.compared_splits.get() * 2 >= cases,
        "only {} of {cases} splits compared",
        stats.compared_splits.get()
    );
}

// =============================================================================================
// (b) line framing
// =============================================================================================

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

// =============================================================================================
// (c) DATA bodies: dot-unstuffing and the terminator
// =============================================================================================

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

fn ending() -> impl Strategy<Value = &'static [u8]> {
    prop_oneof![
        24 => Just(&b"\r\n"[..]),
        1 => Just(&b"\r"[..]),
        1 => Just(&b"\n"[..]),
        1 => Just(&b"\r\r\n"[..]),
        1 => Just(&b""[..]),
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

fn limits() -> impl Strategy<Value = BodyLimits> {
    (
        prop_oneof![1usize..30, Just(998)],
        prop_oneof![1usize..300, Just(1_000_000)],
    )
        .prop_map(|(max_line, max_size)| BodyLimits { max_line, max_size })
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

// =============================================================================================
// (e) addresses
// =============================================================================================

/// Snum 3("." Snum), Snum = 1*3DIGIT with a value of at most 255.
const IPV4: &str = r"(?:[0-9]{1,2}|[01][0-9]{2}|2[0-4][0-9]|25[0-5])(?:\.(?:[0-9]{1,2}|[01][0-9]{2}|2[0-4][0-9]|25[0-5])){3}";
/// General-address-literal = Standardized-tag ":" 1*dcontent.
const GENERAL: &str = r"[A-Za-z0-9-]*[A-Za-z0-9]:[\x21-\x5A\x5E-\x7E]+";

/// IPv6-addr of RFC 5321 §4.1.3, spelt out: IPv6-full, IPv6-comp (at most 6 groups around
/// "::"), IPv6v4-full, IPv6v4-comp (at most 4 groups around "::").
fn ipv6_pattern() -> String {
    let h = "[0-9A-Fa-f]{1,4}";
    let groups = |n: usize| match n {
        0 => String::new(),
        n => format!("{h}(?::{h}){{{}}}", n - 1),
    };
    let mut alts = vec![format!("{h}(?::{h}){{7}}"), format!("(?:{h}:){{6}}{IPV4}")];
    for l in 0..=6 {
        for r in 0..=6 - l {
            alts.push(format!("{}::{}", groups(l), groups(r)));
        }
    }
    for l in 0..=4 {
        for r in 0..=4 - l {
            let right = if r == 0 {
                String::new()
            } else {
                format!("{}:", groups(r))
            };
            alts.push(format!("{}::{right}{IPV4}", groups(l)));
        }
    }
    format!("(?:{})", alts.join("|"))
}

/// Mailbox = Local-part "@" ( Domain / address-literal ), unanchored; RFC 6531 adds
/// UTF8-non-ascii to atext, qtextSMTP and sub-domains when `utf8`.
fn mailbox_pattern(utf8: bool) -> String {
    let u = if utf8 { r"|[^\x00-\x7F]" } else { "" };
    let atext = format!(r"(?:[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~-]{u})");
    let qtext = format!(r"(?:[\x20\x21\x23-\x5B\x5D-\x7E]{u})");
    let qpair = r"\\[\x20-\x7E]";
    let local = format!(r#"(?:{atext}+(?:\.{atext}+)*|"(?:{qtext}|{qpair})*")"#);
    let let_dig = format!("(?:[A-Za-z0-9]{u})");
    let ldh = format!("(?:[A-Za-z0-9-]{u})");
    let sub = format!("{let_dig}(?:{ldh}*{let_dig})?");
    let domain = format!(r"{sub}(?:\.{sub})*");
    let literal = format!(r"\[(?:{IPV4}|(?i:IPv6):{}|{GENERAL})\]", ipv6_pattern());
    format!("{local}@(?:{domain}|{literal})")
}

struct Reference {
    mailbox: [regex_automata::meta::Regex; 2],
    ipv6: regex_automata::meta::Regex,
}

impl Reference {
    fn new() -> Reference {
        let anchored = |p: String| regex_automata::meta::Regex::new(&format!("^(?:{p})$")).unwrap();
        Reference {
            mailbox: [
                anchored(mailbox_pattern(false)),
                anchored(mailbox_pattern(true)),
            ],
            ipv6: anchored(ipv6_pattern()),
        }
    }

    /// The grammar, the 254-octet bound of a path's inside, and the one rule a regular
    /// expression does not say: a literal tagged IPv6 holds an IPv6 address.
    fn accepts(&self, text: &str, utf8: bool) -> bool {
        if text.len() > address::MAX_PATH_INNER || !self.mailbox[usize::from(utf8)].is_match(text) {
            return false;
        }
        let literal = text
            .strip_suffix(']')
            .and_then(|t| t.rfind('[').map(|at| &t[at + 1..]));
        match literal.and_then(|l| l.split_once(':')) {
            Some((tag, rest)) if tag.eq_ignore_ascii_case("IPv6") => self.ipv6.is_match(rest),
            _ => true,
        }
    }
}

fn valid_mailbox(utf8: bool) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&mailbox_pattern(utf8))
        .unwrap()
        .prop_filter("fits a path", |m| m.len() <= address::MAX_PATH_INNER)
}

/// Characters that matter to the grammar, and a few that must never be accepted.
const EDIT_CHARS: &[char] = &[
    '@', '.', '"', '\\', '[', ']', ':', '-', '_', ' ', 'a', 'Z', '0', '9', 'é', '(', ')', ',', '<',
    '>', ';', '\t', '\u{0}', '\u{7f}', '\u{80}', '\u{202e}', 'x', 'I', 'P', 'v', '6',
];

#[derive(Debug, Clone)]
enum Edit {
    Insert(Index, char),
    Replace(Index, char),
    Delete(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    let c = prop_oneof![4 => select(EDIT_CHARS), 1 => any::<char>()];
    prop_oneof![
        (any::<Index>(), c.clone()).prop_map(|(i, c)| Edit::Insert(i, c)),
        (any::<Index>(), c).prop_map(|(i, c)| Edit::Replace(i, c)),
        any::<Index>().prop_map(Edit::Delete),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        match e {
            Edit::Insert(i, c) => chars.insert(i.index(chars.len() + 1), *c),
            Edit::Replace(i, c) if !chars.is_empty() => {
                let at = i.index(chars.len());
                chars[at] = *c;
            }
            Edit::Delete(i) if !chars.is_empty() => {
                chars.remove(i.index(chars.len()));
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

/// A session that submits with these addresses; the envelope intake was handed, or the
/// replies when there was no submission.
fn submit_with(from: &str, rcpts: &[String]) -> Result<Submission, Vec<String>> {
    let setup = Setup {
        config: SessionConfig {
            max_recipients: 100,
            ..SessionConfig::default()
        },
        may_submit: true,
    };
    let mut input = format!("EHLO c\r\nMAIL FROM:<{from}> SMTPUTF8\r\n");
    for r in rcpts {
        input.push_str(&format!("RCPT TO:<{r}>\r\n"));
    }
    input.push_str("DATA\r\nSubject: s\r\n\r\nbody\r\n.\r\n");
    let t = run_session(&setup, &[input.as_bytes()]).map_err(|e| vec![e.to_string()])?;
    t.submissions.into_iter().next().ok_or(t.replies)
}

#[test]
fn addresses_from_the_grammar_are_accepted_and_reach_intake_unchanged() {
    let reference = Reference::new();
    let mut runner = TestRunner::new(config(512));
    let no_controls = |m: &String| !m.chars().any(char::is_control);
    let strategy = (
        any::<bool>(),
        valid_mailbox(true).prop_filter("no controls", no_controls),
        vec(
            valid_mailbox(true).prop_filter("no controls", no_controls),
            1..4,
        ),
        valid_mailbox(false),
    );
    runner
        .run(&strategy, |(null_sender, from, rcpts, ascii)| {
            prop_assert!(reference.accepts(&from, true));
            prop_assert!(address::is_mailbox(&from, true), "{:?}", from);
            prop_assert!(address::is_mailbox(&ascii, false), "{:?}", ascii);
            prop_assert!(address::is_mailbox(&ascii, true), "{:?}", ascii);
            let from = if null_sender { String::new() } else { from };
            let sub = submit_with(&from, &rcpts).map_err(|replies| {
                TestCaseError::fail(format!("{from:?} {rcpts:?} not submitted: {replies:?}"))
            })?;
            prop_assert_eq!(&sub.envelope.mail_from, &from);
            let mut want: Vec<String> = Vec::new();
            for r in rcpts {
                if !want.contains(&r) {
                    want.push(r);
                }
            }
            prop_assert_eq!(&sub.envelope.rcpt_to, &want);
            Ok(())
        })
        .unwrap();
}

#[test]
fn mutated_and_arbitrary_strings_are_accepted_exactly_when_the_grammar_says() {
    let reference = Reference::new();
    let mut runner = TestRunner::new(config(2048));
    let text = prop_oneof![
        3 => (any::<bool>(), vec(edit(), 1..4))
            .prop_flat_map(|(utf8, edits)| (valid_mailbox(utf8), Just(edits)))
            .prop_map(|(m, edits)| apply(&m, &edits)),
        1 => vec(prop_oneof![3 => select(EDIT_CHARS), 1 => any::<char>()], 0..24)
            .prop_map(|c| c.into_iter().collect::<String>()),
    ];
    let accepted = Cell::new(0usize);
    let refused = Cell::new(0usize);
    runner
        .run(&text, |text| {
            for utf8 in [false, true] {
                let got = address::is_mailbox(&text, utf8);
                prop_assert_eq!(
                    got,
                    reference.accepts(&text, utf8),
                    "{:?} utf8={}",
                    text,
                    utf8
                );
                bump(if got { &accepted } else { &refused }, true);
                if got {
                    let (local, domain) = text.rsplit_once('@').unwrap();
                    prop_assert!(!local.is_empty() && !domain.is_empty());
                    prop_assert!(utf8 || text.is_ascii());
                }
                // As a path: the null path only for MAIL, a source route only in front.
                prop_assert_eq!(
                    address::forward_path(&text, utf8),
                    got.then_some(text.as_str())
                );
                let route = format!("@relay.example,@[192.0.2.1]x:{text}");
                prop_assert_eq!(address::forward_path(&route, utf8), None);
                let route = format!("@relay.example,@b-1.example:{text}");
                let routed = got && route.len() <= address::MAX_PATH_INNER;
                prop_assert_eq!(
                    address::forward_path(&route, utf8),
                    routed.then_some(text.as_str())
                );
            }
            Ok(())
        })
        .unwrap();
    // Both outcomes must be common, or the comparison says little.
    let (a, r) = (accepted.get(), refused.get());
    assert!(
        a * 10 >= a + r && r * 10 >= a + r,
        "accepted {a}, refused {r}"
    );
}
