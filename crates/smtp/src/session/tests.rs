//! The session as a client sees it: transcripts of replies, submissions and closes.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use idemrelay_model::Authenticated;

fn session() -> Session {
    Session::new(
        Arc::new(SessionConfig {
            hostname: "relay.test".into(),
            max_message_size: 10_000,
            max_recipients: 3,
            max_errors: 5,
            ..SessionConfig::default()
        }),
        true,
    )
}

/// Everything a client would observe, plus what intake was handed. Intake answers each
/// submission with a queued reply numbered in order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Transcript {
    replies: Vec<String>,
    submissions: Vec<Submission>,
    closed: bool,
    starttls: usize,
}

fn absorb(s: &mut Session, mut outputs: Vec<Output>, t: &mut Transcript) {
    while !outputs.is_empty() {
        let mut next = Vec::new();
        for o in outputs {
            match o {
                Output::Reply(r) => t.replies.push(r.line()),
                Output::Close => t.closed = true,
                Output::Submit(sub) => {
                    t.submissions.push(sub);
                    let id = format!("T{}", t.submissions.len());
                    next = s.submission_done(Reply::queued(&id));
                }
                Output::StartTls => {
                    t.starttls += 1;
                    s.tls_started();
                }
                Output::Authenticate(p) => {
                    let ok = p.user == "good" && p.password == "pw";
                    next = s.auth_result(ok.then(|| Authenticated {
                        name: "good".into(),
                        scope: "scope-good".into(),
                        allowed_senders: vec!["@allowed.example".into()],
                    }));
                }
            }
        }
        outputs = next;
    }
}

fn run_chunks(chunks: &[&[u8]]) -> Transcript {
    let mut s = session();
    let mut t = Transcript::default();
    for chunk in chunks {
        let out = s.feed(chunk);
        absorb(&mut s, out, &mut t);
    }
    t
}

fn run(input: &[u8]) -> Transcript {
    run_chunks(&[input])
}

fn codes(t: &Transcript) -> Vec<u16> {
    t.replies.iter().map(|r| r[..3].parse().unwrap()).collect()
}

#[test]
fn a_whole_transaction() {
    let t = run(b"EHLO c\r\nMAIL FROM:<a@x> SIZE=100 BODY=8BITMIME SMTPUTF8\r\nRCPT TO:<b@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nSubject: s\r\n\r\n..dot\r\n.\r\nQUIT\r\n");
    assert_eq!(codes(&t), vec![250, 250, 250, 250, 354, 250, 221]);
    assert!(t.closed);
    let sub = &t.submissions[0];
    assert_eq!(sub.message, b"Subject: s\r\n\r\n.dot\r\n");
    assert_eq!(sub.envelope.rcpt_to, vec!["b@x"]);
    assert_eq!(sub.envelope.body, BodyType::EightBitMime);
    assert!(sub.envelope.smtputf8 && sub.esmtp && !sub.chunked);
    assert_eq!(sub.helo, "c");
}

/// A mailbox named twice, its domain in another case, is one recipient: the second RCPT gets
/// 250 (as Postfix answers) and counts neither as a recipient nor towards `max_recipients`
/// (3 here). Local parts that differ in case are two mailboxes. Of two spellings the one that
/// sorts first is kept, where the first came, so the envelope does not depend on their order.
#[test]
fn one_mailbox_spelled_twice_is_one_recipient() {
    let t = run(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<dup@example.net>\r\nRCPT TO:<dup@EXAMPLE.NET>\r\nRCPT TO:<Dup@example.net>\r\nRCPT TO:<c@x>\r\nRCPT TO:<c@X>\r\nRCPT TO:<d@x>\r\nDATA\r\nSubject: s\r\n\r\nb\r\n.\r\n");
    assert_eq!(
        codes(&t),
        vec![250, 250, 250, 250, 250, 250, 250, 452, 354, 250]
    );
    assert_eq!(
        t.submissions[0].envelope.rcpt_to,
        vec!["dup@EXAMPLE.NET", "Dup@example.net", "c@X"]
    );
    let t = run("EHLO c\r\nMAIL FROM:<a@x> SMTPUTF8\r\nRCPT TO:<u@bücher.example>\r\nRCPT TO:<u@BÜCHER.example>\r\nDATA\r\nSubject: s\r\n\r\nb\r\n.\r\n".as_bytes());
    assert_eq!(codes(&t), vec![250, 250, 250, 250, 354, 250]);
    assert_eq!(t.submissions[0].envelope.rcpt_to, vec!["u@BÜCHER.example"]);
}

#[test]
fn sequence_errors() {
    let t = run(b"MAIL FROM:<a@x>\r\nHELO c\r\nRCPT TO:<b@x>\r\nDATA\r\nMAIL FROM:<a@x>\r\nMAIL FROM:<a@x>\r\nDATA\r\n");
    assert_eq!(codes(&t), vec![503, 250, 503, 503, 250, 503, 554]);
    assert!(t.replies[0].starts_with("503 5.5.1"));
    assert!(t.replies[6].starts_with("554 5.5.1"));
}

#[test]
fn simple_commands() {
    let t = run(b"EHLO c\r\nNOOP\r\nVRFY x\r\nHELP\r\nRSET\r\nEXPN x\r\nFOO\r\nSTARTTLS\r\n");
    assert_eq!(codes(&t), vec![250, 250, 252, 214, 250, 502, 500, 502]);
    assert!(t.replies[0].contains("relay.test greets c"));
}

#[test]
fn ehlo_advertises_the_extensions() {
    let mut s = session();
    let out = s.feed(b"EHLO c\r\n");
    let Output::Reply(r) = &out[0] else { panic!() };
    for ext in [
        "PIPELINING",
        "SIZE 10000",
        "8BITMIME",
        "SMTPUTF8",
        "ENHANCEDSTATUSCODES",
        "CHUNKING",
        "DSN",
        "LIMITS MAILMAX=1000 RCPTMAX=3",
    ] {
        assert!(r.lines.iter().any(|l| l == ext), "{ext} missing");
    }
}

#[test]
fn parameter_and_limit_errors() {
    let t = run(b"EHLO c\r\nMAIL FROM:<a@x> SIZE=20000\r\nMAIL FROM:<a@x> BODY=BINARYMIME\r\nMAIL FROM:<a@x> MT-PRIORITY=3\r\nMAIL FROM:<a@x>\r\nRCPT TO:<1@x>\r\nRCPT TO:<2@x>\r\nRCPT TO:<3@x>\r\nRCPT TO:<4@x>\r\nRCPT TO:<b@x> X-P=1\r\n");
    assert_eq!(
        t.replies[1],
        "552 5.3.4 Message size exceeds fixed maximum message size"
    );
    assert!(t.replies[2].starts_with("555 5.5.4"));
    assert!(t.replies[3].starts_with("555 5.5.4"));
    assert_eq!(t.replies[8], "452 4.5.3 Too many recipients");
    assert!(t.replies[9].starts_with("555 5.5.4"));
}

#[test]
fn control_characters_in_names() {
    let t = run(b"HELO a\x01b\r\nEHLO c\r\nMAIL FROM:<a\x7f@x>\r\n");
    assert_eq!(
        t.replies[0],
        "501 5.5.2 Control characters are not allowed here"
    );
    assert_eq!(codes(&t)[1], 250);
    assert_eq!(codes(&t)[2], 501);
}

#[test]
fn unauthenticated_clients_get_530() {
    let mut s = Session::new(Arc::new(SessionConfig::default()), false);
    let mut t = Transcript::default();
    let out = s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\n");
    absorb(&mut s, out, &mut t);
    assert_eq!(t.replies[1], "530 5.7.0 Authentication required");
}

#[test]
fn long_command_lines_are_refused_and_the_session_goes_on() {
    let mut input = b"EHLO c\r\nNOOP ".to_vec();
    input.extend(std::iter::repeat_n(b'x', 3000));
    input.extend_from_slice(b"\r\nNOOP\r\n");
    let t = run(&input);
    assert_eq!(t.replies[1], "500 5.5.2 Line too long");
    assert_eq!(codes(&t)[2], 250);
    // 2048 octets including CRLF is still fine.
    let mut ok = b"NOOP ".to_vec();
    ok.extend(std::iter::repeat_n(b'x', 2048 - 7));
    ok.extend_from_slice(b"\r\n");
    assert_eq!(codes(&run(&ok)), vec![250]);
}

#[test]
fn bare_line_endings_close_the_session() {
    for input in [
        &b"EHLO c\nNOOP\r\n"[..],
        b"EHLO c\r\nNO\rOP\r\n",
        b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n\n.\n",
        b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n.\r\r\n",
        b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 6 LAST\r\nA: b\nx",
    ] {
        let t = run(input);
        assert!(t.closed, "{input:?}");
        assert!(t.submissions.is_empty());
        assert_eq!(
            t.replies.last().unwrap(),
            "521 5.5.2 Bare CR or LF not allowed; lines must end with CRLF; closing connection"
        );
    }
}

#[test]
fn body_faults_are_answered_at_the_end_and_the_session_goes_on() {
    let mut big = b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\n".to_vec();
    for _ in 0..200 {
        big.extend_from_slice(&[b'y'; 98]);
        big.extend_from_slice(b"\r\n");
    }
    big.extend_from_slice(b".\r\nNOOP\r\n");
    let t = run(&big);
    assert_eq!(&codes(&t)[3..], &[354, 552, 250]);
    let t = run(
        b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: \0\r\n.\r\nMAIL FROM:<a@x>\r\n",
    );
    assert_eq!(&codes(&t)[3..], &[354, 554, 250]);
    assert!(t.submissions.is_empty());
}

#[test]
fn bdat_chunks_make_one_message() {
    let t = run(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 5\r\nA: b\rBDAT 0\r\nBDAT 8 LAST\r\n\n\r\nbody.NOOP\r\n");
    assert_eq!(codes(&t), vec![250, 250, 250, 250, 250, 250, 250]);
    assert_eq!(t.submissions[0].message, b"A: b\r\n\r\nbody.");
    assert!(t.submissions[0].chunked);
    // A chunk without a transaction is read and refused; DATA after BDAT is refused.
    let t = run(b"EHLO c\r\nBDAT 4\r\nxxxxNOOP\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 3\r\nA: DATA\r\n");
    assert_eq!(codes(&t), vec![250, 503, 250, 250, 250, 250, 503]);
}

#[test]
fn too_many_errors_end_the_session() {
    let t = run(&b"FOO\r\n".repeat(10));
    assert_eq!(t.replies.len(), 6);
    assert_eq!(
        t.replies[5],
        "421 4.7.0 Too many errors; closing connection"
    );
    assert!(t.closed);
}

#[test]
fn shutdown_is_immediate_when_idle_and_waits_for_a_message() {
    let mut s = session();
    let out = s.begin_shutdown();
    assert_eq!(
        out,
        vec![Output::Reply(Reply::shutting_down()), Output::Close]
    );

    let mut s = session();
    let mut t = Transcript::default();
    let out = s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n");
    absorb(&mut s, out, &mut t);
    assert!(s.begin_shutdown().is_empty());
    let out = s.feed(b"\r\nbody\r\n.\r\n");
    absorb(&mut s, out, &mut t);
    assert_eq!(t.submissions.len(), 1);
    assert_eq!(&codes(&t)[4..], &[250, 421]);
    assert!(t.closed);
}

#[test]
fn replies_wait_for_intake() {
    let mut s = session();
    let out =
        s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n.\r\nNOOP\r\n");
    assert!(matches!(out.last(), Some(Output::Submit(_))));
    // Pipelined NOOP is held until the end-of-data reply is known.
    assert!(s.feed(b"NOOP\r\n").is_empty());
    let out = s.submission_done(Reply::queued("X"));
    assert_eq!(
        out,
        vec![
            Output::Reply(Reply::queued("X")),
            Output::Reply(Reply::ok()),
            Output::Reply(Reply::ok())
        ]
    );
}

#[test]
fn too_many_recipients_is_not_a_session_error() {
    let mut input = b"EHLO c\r\nMAIL FROM:<a@x>\r\n".to_vec();
    for i in 0..20 {
        input.extend_from_slice(format!("RCPT TO:<r{i}@x>\r\n").as_bytes());
    }
    input.extend_from_slice(b"DATA\r\nA: b\r\n.\r\n");
    let t = run(&input);
    assert!(!t.closed);
    assert_eq!(t.submissions[0].envelope.rcpt_to.len(), 3);
    assert_eq!(
        t.replies
            .iter()
            .filter(|r| r.starts_with("452 4.5.3"))
            .count(),
        17
    );
}

#[test]
fn overflowing_numbers_are_refused_not_misread() {
    let t = run(b"EHLO c\r\nMAIL FROM:<a@x> SIZE=99999999999999999999999\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 999999999999999999995 LAST\r\nNOOP\r\n");
    assert!(t.replies[1].starts_with("552 5.3.4"), "{t:?}");
    assert!(t.replies[4].starts_with("501 5.5.4"), "{t:?}");
    assert_eq!(codes(&t)[5], 250);
    assert!(t.submissions.is_empty());
}

#[test]
fn non_ascii_addresses_need_smtputf8() {
    let t = run("EHLO c\r\nMAIL FROM:<jös@x>\r\nMAIL FROM:<a@x>\r\nRCPT TO:<ö@x>\r\nRSET\r\nMAIL FROM:<jös@x> SMTPUTF8\r\nRCPT TO:<ö@x>\r\n".as_bytes());
    assert_eq!(codes(&t), vec![250, 553, 250, 553, 250, 250, 250]);
    assert!(t.replies[1].starts_with("553 5.6.7"));
}

#[test]
fn a_bdat_transaction_may_finish_during_shutdown() {
    let mut s = session();
    let mut t = Transcript::default();
    let out = s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nBDAT 6\r\nA: b\r\n");
    absorb(&mut s, out, &mut t);
    assert!(s.begin_shutdown().is_empty());
    let out = s.feed(b"BDAT 4 LAST\r\nbody");
    absorb(&mut s, out, &mut t);
    assert_eq!(t.submissions.len(), 1);
    assert_eq!(t.submissions[0].message, b"A: b\r\nbody");
    assert_eq!(&codes(&t)[4..], &[250, 421]);
    assert!(t.closed);
}

#[test]
fn a_refused_message_during_shutdown_ends_the_session() {
    let mut s = session();
    let mut t = Transcript::default();
    let out = s.feed(b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: \0\r\n");
    absorb(&mut s, out, &mut t);
    assert!(s.begin_shutdown().is_empty());
    let out = s.feed(b".\r\n");
    absorb(&mut s, out, &mut t);
    assert_eq!(&codes(&t)[4..], &[554, 421]);
    assert!(t.closed);
}

fn tls_session(starttls: bool, may_submit: bool) -> Session {
    Session::new(
        Arc::new(SessionConfig {
            hostname: "relay.test".into(),
            starttls,
            require_tls: true,
            auth: true,
            max_auth_failures: 2,
            ..SessionConfig::default()
        }),
        may_submit,
    )
}

fn run_on(mut s: Session, input: &[u8]) -> (Session, Transcript) {
    let mut t = Transcript::default();
    let out = s.feed(input);
    absorb(&mut s, out, &mut t);
    (s, t)
}

// "good\0good\0pw" and "good\0good\0bad" in base64.
const GOOD: &str = "Z29vZABnb29kAHB3";
const BAD: &str = "Z29vZABnb29kAGJhZA==";

#[test]
fn starttls_listener_needs_tls_before_mail_and_auth() {
    let (_, t) = run_on(
        tls_session(true, false),
        format!("EHLO c\r\nMAIL FROM:<a@x>\r\nAUTH PLAIN {GOOD}\r\n").as_bytes(),
    );
    assert!(t.replies[0].contains("STARTTLS"));
    assert_eq!(
        t.replies[1],
        "530 5.7.0 Must issue a STARTTLS command first"
    );
    assert_eq!(
        t.replies[2],
        "538 5.7.11 Encryption required for requested authentication mechanism"
    );
}

#[test]
fn plaintext_pipelined_after_starttls_is_discarded() {
    let (s, t) = run_on(
        tls_session(true, false),
        format!("EHLO c\r\nSTARTTLS\r\nAUTH PLAIN {GOOD}\r\nMAIL FROM:<a@x>\r\n").as_bytes(),
    );
    assert_eq!(t.starttls, 1);
    assert_eq!(t.replies.len(), 2, "{t:?}");
    assert_eq!(t.replies[1], "220 2.0.0 Ready to start TLS");
    assert!(s.authenticated().is_none());
    // After the handshake, EHLO must be sent again; AUTH is now offered.
    let (_, t) = run_on(s, b"MAIL FROM:<a@x>\r\nEHLO c\r\n");
    assert!(t.replies[0].starts_with("503 5.5.1"));
    assert!(t.replies[1].contains("AUTH PLAIN LOGIN"));
    assert!(!t.replies[1].contains("STARTTLS"));
}

#[test]
fn auth_plain_and_login_then_submission_under_the_user_scope() {
    let s = Session::new_tls(tls_session(false, false).config.clone(), false);
    let (s, t) = run_on(
        s,
        format!("EHLO c\r\nAUTH PLAIN {GOOD}\r\nMAIL FROM:<x@other.example>\r\nMAIL FROM:<me@allowed.example>\r\nRCPT TO:<b@x>\r\nDATA\r\nA: b\r\n.\r\n").as_bytes(),
    );
    assert_eq!(&codes(&t)[1..], &[235, 550, 250, 250, 354, 250]);
    assert_eq!(
        t.replies[2],
        "550 5.7.1 Sender address not allowed for this user"
    );
    assert_eq!(t.submissions[0].auth_scope.as_deref(), Some("scope-good"));
    assert!(t.submissions[0].tls);
    assert_eq!(s.authenticated().unwrap().name, "good");

    // LOGIN: two challenges, then the same outcome.
    let s = Session::new_tls(tls_session(false, false).config.clone(), false);
    let (_, t) = run_on(s, b"EHLO c\r\nAUTH LOGIN\r\nZ29vZA==\r\ncHc=\r\n");
    assert_eq!(
        &t.replies[1..],
        &[
            "334 VXNlcm5hbWU6",
            "334 UGFzc3dvcmQ6",
            "235 2.7.0 Authentication successful"
        ]
    );
}

#[test]
fn auth_failures_then_421() {
    let s = Session::new_tls(tls_session(false, false).config.clone(), false);
    let (_, t) = run_on(
        s,
        format!("EHLO c\r\nAUTH PLAIN {BAD}\r\nAUTH PLAIN !!!\r\nAUTH PLAIN\r\n*\r\nAUTH PLAIN {BAD}\r\nNOOP\r\n").as_bytes(),
    );
    assert_eq!(t.replies[1], "535 5.7.8 Authentication credentials invalid");
    assert!(t.replies[2].starts_with("501 5.5.2"));
    assert_eq!(t.replies[3], "334 ");
    assert_eq!(t.replies[4], "501 5.7.0 Authentication cancelled");
    assert_eq!(
        t.replies[5],
        "421 4.7.0 Too many authentication failures; closing connection"
    );
    assert!(t.closed);
}

#[test]
fn without_auth_configured_mail_needs_the_allow_list() {
    let t = run(b"EHLO c\r\nAUTH PLAIN Z29vZABnb29kAHB3\r\nSTARTTLS\r\n");
    assert!(!t.replies[0].contains("AUTH"));
    assert!(t.replies[1].starts_with("502 5.5.1"));
    assert!(t.replies[2].starts_with("502 5.5.1"));
}

fn script() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        "[ -~]{0,40}",
        "\\.[ -~]{0,10}",
        Just(".".to_string()),
        Just("..".to_string()),
    ];
    (
        proptest::collection::vec(line, 0..12),
        proptest::collection::vec(any::<u8>(), 0..40),
        any::<bool>(),
    )
        .prop_map(|(lines, chunk, bdat_after)| {
            let mut s =
                b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\nSubject: p\r\n".to_vec();
            for l in &lines {
                if l.starts_with('.') {
                    s.push(b'.');
                }
                s.extend_from_slice(l.as_bytes());
                s.extend_from_slice(b"\r\n");
            }
            s.extend_from_slice(b".\r\nNOOP\r\n");
            if bdat_after {
                s.extend_from_slice(b"MAIL FROM:<a@x>\r\nRCPT TO:<c@x>\r\n");
                s.extend_from_slice(format!("BDAT {} LAST\r\n", chunk.len()).as_bytes());
                s.extend_from_slice(&chunk);
            }
            s.extend_from_slice(b"RSET\r\nQUIT\r\n");
            s
        })
}

proptest! {
    #[test]
    fn any_split_gives_the_same_replies_and_messages(
        input in script(),
        cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..12),
    ) {
        let whole = run(&input);
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
        prop_assert_eq!(run_chunks(&chunks), whole);
    }

    #[test]
    fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..600)) {
        let t = run(&input);
        for sub in &t.submissions {
            prop_assert!(!sub.message.windows(2).any(|w| w[0] == b'\r' && w[1] != b'\n'));
        }
    }
}

#[test]
fn delivery_requests_reach_the_submission() {
    let s = Session::new_tls(session().config.clone(), true);
    let (_, t) = run_on(
        s,
        b"EHLO c\r\nMAIL FROM:<a@x> RET=HDRS ENVID=e+2B1 REQUIRETLS\r\nRCPT TO:<b@X> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;b@X\r\nRCPT TO:<b@x> NOTIFY=NEVER\r\nRCPT TO:<c@x>\r\nDATA\r\nSubject: s\r\n\r\nx\r\n.\r\n",
    );
    assert_eq!(codes(&t), vec![250, 250, 250, 250, 250, 354, 250]);
    let e = &t.submissions[0].envelope;
    // The smaller spelling is kept, with the first RCPT's parameters.
    assert_eq!(e.rcpt_to, vec!["b@X".to_string(), "c@x".to_string()]);
    let r = &e.requests;
    assert_eq!(r.ret.as_deref(), Some("HDRS"));
    assert_eq!(r.envid.as_deref(), Some("e+2B1"));
    assert!(r.require_tls);
    assert_eq!(r.recipients.len(), 1);
    assert_eq!(
        r.recipients["b@X"].notify.as_deref(),
        Some("SUCCESS,FAILURE")
    );
    assert_eq!(r.orcpt("b@X"), Some("rfc822;b@X"));

    // The other order: the first RCPT's parameters move to the spelling kept.
    let (_, t) = run_on(
        Session::new(session().config.clone(), true),
        b"EHLO c\r\nMAIL FROM:<a@x>\r\nRCPT TO:<b@x> NOTIFY=NEVER\r\nRCPT TO:<b@X> NOTIFY=SUCCESS\r\nDATA\r\nSubject: s\r\n\r\nx\r\n.\r\n",
    );
    let e = &t.submissions[0].envelope;
    assert_eq!(e.rcpt_to, vec!["b@X".to_string()]);
    assert_eq!(
        e.requests.recipients["b@X"].notify.as_deref(),
        Some("NEVER")
    );
    assert!(e.requests.ret.is_none() && !e.requests.require_tls);
}

#[test]
fn requiretls_is_offered_and_taken_only_under_tls() {
    let t = run(b"EHLO c\r\nMAIL FROM:<a@x> REQUIRETLS\r\nMAIL FROM:<a@x> RET=FULL\r\n");
    assert!(!t.replies[0].contains("REQUIRETLS"), "{:?}", t.replies[0]);
    assert_eq!(
        t.replies[1],
        "530 5.7.10 REQUIRETLS needs a TLS session; send STARTTLS first"
    );
    assert_eq!(codes(&t)[2], 250);
    let (_, t) = run_on(
        Session::new_tls(session().config.clone(), true),
        b"EHLO c\r\nMAIL FROM:<a@x> REQUIRETLS\r\n",
    );
    assert_eq!(codes(&t), vec![250, 250]);
}

#[test]
fn mailmax_closes_the_session_after_the_last_transaction() {
    let config = Arc::new(SessionConfig {
        max_transactions: 2,
        ..(*session().config).clone()
    });
    let (_, t) = run_on(
        Session::new(config, true),
        b"EHLO c\r\nMAIL FROM:<a@x>\r\nRSET\r\nMAIL FROM:<a@x>\r\nRSET\r\nMAIL FROM:<a@x>\r\nNOOP\r\n",
    );
    assert!(
        t.replies[0].contains("LIMITS MAILMAX=2 RCPTMAX=3"),
        "{:?}",
        t.replies[0]
    );
    assert_eq!(codes(&t), vec![250, 250, 250, 250, 250, 421]);
    assert!(t.closed);
}
