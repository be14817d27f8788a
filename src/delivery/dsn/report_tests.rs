//! The DSN's bytes and the failed record's notice.

use super::super::notice::dsn_for;
use super::*;
use crate::store::KeySource;
use mail_parser::{MessageParser, MimeHeaders};

const ORIGINAL: &[u8] = b"From: Alice <alice@example.com>\r\n\
To: bob@example.org\r\n\
Subject: quarterly\r\n\
\x20report\r\n\
Message-ID: <m1@example.com>\r\n\
X-Bird-Idempotency-Key: k-1\r\n\
\r\n\
SECRET BODY LINE\r\n\
more body\r\n";

static NO_REQUESTS: DeliveryRequests = DeliveryRequests {
    ret: None,
    envid: None,
    require_tls: false,
    recipients: std::collections::BTreeMap::new(),
};

fn recipients() -> Vec<String> {
    vec![
        "bob@example.org".to_string(),
        "carol@example.net".to_string(),
    ]
}

fn input<'a>(recipients: &'a [String], original: &'a [u8], reply: &'a str) -> DsnInput<'a> {
    DsnInput {
        action: Action::Failed,
        returned: Returned::Headers,
        requests: &NO_REQUESTS,
        refused_by_relay: false,
        reporting_mta: "relay.example.com",
        original_id: "01HZX",
        original_envelope_from: "alice@example.com",
        recipients,
        phase: "rcpt",
        remote_code: 550,
        remote_reply: reply,
        arrival_unix: 1_700_000_000,
        now_unix: 1_700_003_600,
        original_message: original,
        dsn_message_id: "dsn.01HZX@relay.example.com",
    }
}

/// Every line CRLF-terminated, no bare CR or LF, none over 998 octets.
fn assert_crlf_discipline(msg: &[u8]) {
    assert!(msg.ends_with(b"\r\n"));
    for (i, &b) in msg.iter().enumerate() {
        if b == b'\n' {
            assert!(i > 0 && msg[i - 1] == b'\r', "bare LF at {i}");
        }
        if b == b'\r' {
            assert_eq!(msg.get(i + 1), Some(&b'\n'), "bare CR at {i}");
        }
    }
    for line in split_crlf(msg) {
        assert!(line.len() <= 998, "line of {} octets", line.len());
    }
}

fn text(msg: &[u8]) -> String {
    String::from_utf8(msg.to_vec()).unwrap()
}

fn part_bodies(msg: &[u8]) -> Vec<(String, String)> {
    let parsed = MessageParser::new().parse(msg).expect("parses");
    let root = parsed.root_part();
    let ids = root.sub_parts().expect("multipart").to_vec();
    ids.iter()
        .map(|&id| {
            let part = parsed.part(id).unwrap();
            let ct = part.content_type().unwrap();
            let name = format!("{}/{}", ct.ctype(), ct.subtype().unwrap_or(""));
            let body = String::from_utf8_lossy(part.contents()).into_owned();
            (name, body)
        })
        .collect()
}

#[test]
fn structure_parses_back() {
    let rcpts = recipients();
    let msg = build_dsn(&input(&rcpts, ORIGINAL, "5.1.1 user unknown"));
    assert_crlf_discipline(&msg);
    assert!(msg.is_ascii());
    let parsed = MessageParser::new().parse(&msg[..]).expect("parses");
    let ct = parsed.root_part().content_type().unwrap();
    assert_eq!(ct.ctype(), "multipart");
    assert_eq!(ct.subtype(), Some("report"));
    assert_eq!(ct.attribute("report-type"), Some("delivery-status"));
    assert_eq!(
        parsed.subject(),
        Some("Undelivered Mail Returned to Sender")
    );
    assert_eq!(parsed.message_id(), Some("dsn.01HZX@relay.example.com"));
    assert_eq!(
        parsed.from().unwrap().first().unwrap().address(),
        Some("MAILER-DAEMON@relay.example.com")
    );
    assert_eq!(
        parsed.to().unwrap().first().unwrap().address(),
        Some("alice@example.com")
    );
    assert_eq!(parsed.date().unwrap().to_timestamp(), 1_700_003_600);
    assert_eq!(
        parsed.header_raw("Auto-Submitted").map(str::trim),
        Some("auto-replied")
    );

    let parts = part_bodies(&msg);
    let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "text/plain",
            "message/delivery-status",
            "text/rfc822-headers"
        ]
    );

    let human = &parts[0].1;
    assert!(human.contains("bob@example.org"), "{human}");
    assert!(human.contains("550 5.1.1 user unknown"), "{human}");
    assert!(human.contains("(RCPT)"), "{human}");

    let report = &parts[1].1;
    assert!(
        report.starts_with(
            "Reporting-MTA: dns; relay.example.com\r\n\
             Arrival-Date: Tue, 14 Nov 2023 22:13:20 +0000\r\n\
             X-Idemrelay-Id: 01HZX\r\n\r\n"
        ),
        "the extension field after the standard per-message ones: {report}"
    );
    for r in &rcpts {
        let group = format!(
            "\r\n\r\nFinal-Recipient: rfc822; {r}\r\nAction: failed\r\nStatus: 5.1.1\r\n\
             Diagnostic-Code: smtp; 550 5.1.1 user unknown\r\n"
        );
        assert!(report.contains(&group), "{report}");
    }
    assert!(!report.contains("Remote-MTA"));

    let headers = &parts[2].1;
    assert!(
        headers.starts_with("From: Alice <alice@example.com>\r\n"),
        "{headers}"
    );
    assert!(
        headers.contains("Subject: quarterly\r\n report\r\n"),
        "{headers}"
    );
    assert!(
        headers.contains("X-Bird-Idempotency-Key: k-1\r\n"),
        "{headers}"
    );
    assert!(!text(&msg).contains("SECRET BODY"));
    assert!(!text(&msg).contains("more body"));
}

#[test]
fn header_section_comes_first() {
    let rcpts = recipients();
    let msg = text(&build_dsn(&input(&rcpts, ORIGINAL, "5.1.1 nope")));
    let (head, _) = msg.split_once("\r\n\r\n").unwrap();
    for name in [
        "From:",
        "To:",
        "Subject:",
        "Date:",
        "Message-ID:",
        "Auto-Submitted:",
        "MIME-Version:",
        "Content-Type: multipart/report",
    ] {
        assert!(head.contains(name), "{name} missing from\n{head}");
    }
    assert!(msg.starts_with("From: MAILER-DAEMON@relay.example.com\r\n"));
}

#[test]
fn status_code_table() {
    let cases: &[(u16, &str, &str)] = &[
        (550, "5.1.1 user unknown", "5.1.1"),
        (550, "550 5.1.1 user unknown", "5.1.1"),
        (554, "5.7.26 unauthenticated", "5.7.26"),
        (552, "message too large", "5.0.0"),
        (550, "", "5.0.0"),
        (550, "4.2.2 inconsistent", "5.0.0"),
        (451, "4.3.0 try later", "5.4.7"),
        (421, "", "5.4.7"),
        (0, "timed out", "5.4.7"),
        (0, "5.1.2 bad domain", "5.1.2"),
    ];
    for &(code, reply, want) in cases {
        assert_eq!(status_code(code, reply), want, "{code} {reply}");
    }
}

#[test]
fn diagnostic_kinds() {
    let rcpts = vec!["bob@example.org".to_string()];
    let reports = |code: u16, reply: &str| {
        let mut i = input(&rcpts, ORIGINAL, reply);
        i.remote_code = code;
        let msg = build_dsn(&i);
        assert_crlf_discipline(&msg);
        part_bodies(&msg)[1].1.clone()
    };
    let r = reports(451, "4.3.0 queue full");
    assert!(r.contains("Status: 5.4.7\r\n"), "{r}");
    assert!(
        r.contains("Diagnostic-Code: smtp; 451 4.3.0 queue full\r\n"),
        "{r}"
    );
    let r = reports(0, "timed out");
    assert!(
        r.contains("Diagnostic-Code: X-Idemrelay; timed out\r\n"),
        "{r}"
    );
    let r = reports(0, "");
    assert!(!r.contains("Diagnostic-Code"), "{r}");
    let r = reports(554, "554 5.7.1 multi\r\n554 5.7.1 line");
    assert!(
        r.contains("Diagnostic-Code: smtp; 554 5.7.1 multi 554 5.7.1 line\r\n"),
        "{r}"
    );
}

#[test]
fn long_reply_text_is_folded() {
    let rcpts = recipients();
    let long_word = "x".repeat(3000);
    let reply = format!("5.7.1 {} {long_word} tail", "blah ".repeat(2000));
    let msg = build_dsn(&input(&rcpts, ORIGINAL, &reply));
    assert_crlf_discipline(&msg);
    let parts = part_bodies(&msg);
    assert_eq!(parts.len(), 3);
    let report = &parts[1].1;
    assert!(report.contains("Status: 5.7.1\r\n"));
    assert!(report.contains("Diagnostic-Code: smtp; 550 5.7.1 blah blah"));
    assert!(report.contains("[...]"), "cut at MAX_REPLY");
    for line in report.split("\r\n") {
        assert!(
            line.len() <= SOFT_WIDTH || !line.trim().contains(' '),
            "{line}"
        );
    }
    // The long word survives, split: the diagnostic is cut only at MAX_REPLY.
    let short = format!("5.7.1 {long_word}");
    let msg = build_dsn(&input(&rcpts, ORIGINAL, &short));
    assert_crlf_discipline(&msg);
    let report = &part_bodies(&msg)[1].1;
    let unfolded: String = report.replace("\r\n ", "");
    assert!(unfolded.contains(&long_word));
}

#[test]
fn message_without_separator() {
    let rcpts = recipients();
    let cases: &[(&[u8], &str)] = &[
        (
            b"Subject: only headers\r\nFrom: a@b\r\n",
            "Subject: only headers\r\nFrom: a@b\r\n",
        ),
        (b"Subject: no final crlf", "Subject: no final crlf\r\n"),
        (b"\r\nbody only", ""),
        (b"", ""),
    ];
    for &(original, want) in cases {
        let msg = build_dsn(&input(&rcpts, original, "5.1.1 x"));
        assert_crlf_discipline(&msg);
        let parts = part_bodies(&msg);
        assert_eq!(parts.len(), 3, "{original:?}");
        assert_eq!(parts[2].0, "text/rfc822-headers");
        assert_eq!(parts[2].1.trim_end(), want.trim_end(), "{original:?}");
        assert!(!text(&msg).contains("body only"));
    }
}

#[test]
fn header_section_limits() {
    let mut big = Vec::new();
    for i in 0..5000 {
        big.extend_from_slice(format!("X-Field-{i}: value\r\n continued\r\n").as_bytes());
    }
    big.extend_from_slice(b"\r\nbody");
    let s = header_section(&big);
    assert!(s.len() <= MAX_HEADERS);
    assert!(s.ends_with(b"continued\r\n"), "cut between fields");
    // No separator at all and no CRLF in reach: cut at the limit.
    let blob = vec![b'a'; MAX_HEADERS * 3];
    assert_eq!(header_section(&blob).len(), MAX_HEADERS);
    assert_eq!(header_section(b"A: b\r\n\r\n"), b"A: b\r\n");
}

#[test]
fn eight_bit_headers_travel_as_quoted_printable() {
    let rcpts = recipients();
    let long = format!("X-Long: {}\r\n", "y".repeat(1200));
    let original = [
        "Subject: Gr\u{fc}\u{df}e = hello \r\n".as_bytes(),
        b"X-Bare: a\rb\nc\r\n",
        long.as_bytes(),
        b"\r\nbody",
    ]
    .concat();
    let msg = build_dsn(&input(&rcpts, &original, "5.1.1 x"));
    assert_crlf_discipline(&msg);
    assert!(msg.is_ascii());
    let parsed = MessageParser::new().parse(&msg[..]).unwrap();
    let id = parsed.root_part().sub_parts().unwrap()[2];
    let part = parsed.part(id).unwrap();
    assert_eq!(part.content_transfer_encoding(), Some("quoted-printable"));
    let decoded = part.text_contents().unwrap();
    assert!(
        decoded.contains("Subject: Gr\u{fc}\u{df}e = hello \r\n"),
        "{decoded:?}"
    );
    assert!(decoded.contains("X-Bare: a\rb\nc\r\n"), "{decoded:?}");
    assert!(decoded.contains(&long), "long line survives");
}

#[test]
fn quoted_printable_table() {
    let cases: &[(&[u8], &[u8])] = &[
        (b"", b""),
        (b"abc\r\n", b"abc\r\n"),
        (b"a=b\r\n", b"a=3Db\r\n"),
        (b"trailing \r\n", b"trailing=20\r\n"),
        (b"tab\there\r\n", b"tab\there\r\n"),
        (b"\xc3\xbc\r\n", b"=C3=BC\r\n"),
        (b"bare\rcr\r\n", b"bare=0Dcr\r\n"),
        (b"no newline", b"no newline\r\n"),
    ];
    for &(input, want) in cases {
        assert_eq!(quoted_printable(input), want, "{:?}", text(input));
    }
    let long = quoted_printable(&[b'='; 100]);
    for line in split_crlf(&long) {
        assert!(line.len() <= 76);
    }
}

#[test]
fn hostile_inputs_cannot_inject_headers() {
    let rcpts = vec!["bob@example.org\r\nBcc: victim@example.com".to_string()];
    let mut i = input(&rcpts, ORIGINAL, "5.1.1 x\r\nX-Injected: yes\n.\r\n");
    i.original_envelope_from = "alice@example.com>\r\nBcc: evil@example.com";
    i.reporting_mta = "relay\rexample";
    i.dsn_message_id = "<id\nX: y>";
    i.phase = "rcpt\r\n";
    let msg = build_dsn(&i);
    assert_crlf_discipline(&msg);
    let t = text(&msg);
    for line in t.split("\r\n") {
        assert!(!line.starts_with("Bcc:"), "{line}");
        assert!(!line.starts_with("X-Injected:"), "{line}");
        assert!(!line.starts_with("X: "), "{line}");
    }
    assert!(t.contains("Message-ID: <idX:y>\r\n"), "{t}");
    assert_eq!(part_bodies(&msg).len(), 3);
}

#[test]
fn internationalized_addresses() {
    let rcpts = vec!["j\u{f6}rg@b\u{fc}cher.example".to_string()];
    let mut i = input(&rcpts, ORIGINAL, "5.1.1 x");
    i.original_envelope_from = "\u{e9}lodie@example.fr";
    let msg = build_dsn(&i);
    assert_crlf_discipline(&msg);
    let t = text(&msg);
    assert!(t.contains("To: <\u{e9}lodie@example.fr>\r\n"));
    let (_, after_headers) = t.split_once("\r\n\r\n").unwrap();
    assert!(
        after_headers.is_ascii(),
        "only the To: header may carry UTF-8"
    );
    assert!(
        t.contains("Final-Recipient: utf-8; j\\x{F6}rg@b\\x{FC}cher.example\r\n"),
        "{t}"
    );
    assert_eq!(
        utf8_addr_xtext("a+b=c\\d e"),
        "a\\x{2B}b\\x{3D}c\\x{5C}d\\x{20}e"
    );
}

#[test]
fn deterministic_and_boundary_free() {
    let rcpts = recipients();
    let a = build_dsn(&input(&rcpts, ORIGINAL, "5.1.1 x"));
    let b = build_dsn(&input(&rcpts, ORIGINAL, "5.1.1 x"));
    assert_eq!(a, b);
    // An original that contains the boundary we would pick first gets another one.
    let first = pick_boundary("dsn.01HZX@relay.example.com", &[]);
    let hostile = format!("Subject: x\r\nX-Trap: --{first}\r\n\r\n");
    let msg = build_dsn(&input(&rcpts, hostile.as_bytes(), "5.1.1 x"));
    assert_crlf_discipline(&msg);
    assert!(!text(&msg).contains(&format!("boundary=\"{first}\"")));
    let parts = part_bodies(&msg);
    assert_eq!(parts.len(), 3);
    assert!(parts[2].1.contains(&format!("X-Trap: --{first}")));
}

#[test]
fn dsn_key_is_deterministic_and_distinct() {
    let k = dsn_key("user@scope", "key-1");
    assert_eq!(k, dsn_key("user@scope", "key-1"));
    assert!(k.starts_with("dsn-"));
    assert_eq!(k.len(), 44);
    assert!(k.bytes().all(|b| b.is_ascii_graphic()));
    let others = [
        dsn_key("user@scope", "key-2"),
        dsn_key("other", "key-1"),
        dsn_key("key-1", "user@scope"),
        dsn_key("a", "bc"),
        dsn_key("ab", "c"),
        dsn_key("", ""),
    ];
    for (i, o) in others.iter().enumerate() {
        assert_ne!(&k, o);
        for p in &others[i + 1..] {
            assert_ne!(o, p);
        }
    }
    let long = "k".repeat(255);
    assert!(dsn_key(&long, &long).len() <= 255);
}

#[test]
fn extreme_times_do_not_panic() {
    for t in [i64::MIN, -1, 0, 253_402_300_799, 253_402_300_800, i64::MAX] {
        let date = rfc822_date(t);
        assert!(date.is_ascii() && date.len() < 40, "{date}");
    }
    assert_eq!(rfc822_date(0), "Thu, 1 Jan 1970 00:00:00 +0000");
    assert_eq!(rfc822_date(i64::MAX), "Fri, 31 Dec 9999 23:59:59 +0000");
    let rcpts = recipients();
    let mut i = input(&rcpts, ORIGINAL, "5.1.1 x");
    i.arrival_unix = i64::MIN;
    i.now_unix = i64::MAX;
    assert_crlf_discipline(&build_dsn(&i));
}

#[test]
fn fold_and_wrap() {
    assert_eq!(fold("Status", "5.1.1"), "Status: 5.1.1\r\n");
    assert_eq!(fold("Empty", ""), "Empty: \r\n");
    let folded = fold("Diagnostic-Code", &"word ".repeat(40));
    for line in folded.trim_end().split("\r\n") {
        assert!(line.len() <= SOFT_WIDTH, "{line}");
    }
    assert!(folded
        .split("\r\n")
        .skip(1)
        .all(|l| l.is_empty() || l.starts_with(' ')));
    assert_eq!(wrap("a b", "  "), "  a b\r\n");
    assert_eq!(clean("  a\r\n\tb  c\u{e9} "), "a b c?");
    assert_eq!(truncate("h\u{e9}llo", 2), "h [...]");
}

fn failed_job(mail_from: &str, eight_bit: bool) -> crate::store::Claimed {
    crate::store::Claimed {
        id: "01HZX".into(),
        scope: "team-a".into(),
        key: Some("k-1".into()),
        mail_from: mail_from.into(),
        rcpt_to: recipients(),
        eight_bit,
        smtputf8: false,
        requests: Default::default(),
        content: ORIGINAL.to_vec(),
        accepted_at_ms: 1_700_000_000_000,
        attempts: 1,
        first_attempt_at_ms: Some(1_700_000_000_000),
        any_unknown: false,
        recovered: false,
        now_ms: 1_700_003_600_000,
        token: 7,
    }
}

#[test]
fn a_failed_record_queues_its_notice_keyed_from_the_record() {
    use crate::delivery::outcome::{Outcome, Phase};
    let refused = Outcome::Permanent {
        phase: Phase::Rcpt,
        code: 550,
        reply: "550 5.1.1 user unknown".into(),
    };
    let job = failed_job("alice@example.com", true);
    let dsn = dsn_for(
        &job,
        &refused,
        "relay.example.com",
        "D1".into(),
        1_700_003_600,
    )
    .expect("a sender to notify");
    let key = dsn_key("team-a", "01HZX");
    assert_eq!(dsn.id, "D1");
    assert_eq!(dsn.scope, "team-a");
    assert_eq!(dsn.key.as_deref(), Some(key.as_str()));
    assert_eq!(dsn.upstream_key.as_deref(), Some(key.as_str()));
    assert_eq!(dsn.key_source, Some(KeySource::Dsn));
    assert_eq!(dsn.dsn_of.as_deref(), Some("01HZX"));
    assert_eq!(dsn.state, crate::store::State::Queued);
    assert_eq!(dsn.envelope.mail_from, "");
    assert_eq!(dsn.envelope.rcpt_to, ["alice@example.com"]);
    assert_eq!(dsn.envelope.body, crate::mail::BodyType::EightBitMime);
    let content = dsn.content.expect("queued with its bytes");
    assert_eq!(dsn.size, content.len());
    let head = format!("{}: {key}\r\n", crate::mail::KEY_HEADER);
    assert!(content.starts_with(head.as_bytes()));
    let report = &content[head.len()..];
    assert_eq!(
        report,
        build_dsn(&DsnInput {
            phase: "rcpt",
            remote_reply: "550 5.1.1 user unknown",
            dsn_message_id: "D1@relay.example.com",
            ..input(&recipients(), ORIGINAL, "")
        })
    );
    let seven_bit = dsn_for(
        &failed_job("alice@example.com", false),
        &refused,
        "relay.example.com",
        "D2".into(),
        1_700_003_600,
    )
    .expect("a sender to notify");
    assert_eq!(seven_bit.envelope.body, crate::mail::BodyType::SevenBit);
}

#[test]
fn the_null_sender_is_never_notified() {
    let lost = crate::delivery::outcome::Outcome::Unknown {
        phase: crate::delivery::outcome::Phase::Dot,
        reason: "timed out".into(),
    };
    assert!(dsn_for(
        &failed_job("", false),
        &lost,
        "relay.example.com",
        "D3".into(),
        0
    )
    .is_none());
}
