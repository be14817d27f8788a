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

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod addresses;
mod data_bodies;
mod framing;
mod soup;

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

#[derive(Debug, Clone)]
struct Setup {
    config: SessionConfig,
    may_submit: bool,
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

fn bump(c: &Cell<usize>, yes: bool) {
    c.set(c.get() + usize::from(yes));
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

fn limits() -> impl Strategy<Value = BodyLimits> {
    (
        prop_oneof![1usize..30, Just(998)],
        prop_oneof![1usize..300, Just(1_000_000)],
    )
        .prop_map(|(max_line, max_size)| BodyLimits { max_line, max_size })
}

#[derive(Debug, Clone)]
enum Edit {
    Insert(Index, char),
    Replace(Index, char),
    Delete(Index),
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
