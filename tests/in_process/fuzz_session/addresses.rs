//! Addresses from the RFC 5321 grammar, and mutations of them.

use super::*;

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

fn edit() -> impl Strategy<Value = Edit> {
    let c = prop_oneof![4 => select(EDIT_CHARS), 1 => any::<char>()];
    prop_oneof![
        (any::<Index>(), c.clone()).prop_map(|(i, c)| Edit::Insert(i, c)),
        (any::<Index>(), c).prop_map(|(i, c)| Edit::Replace(i, c)),
        any::<Index>().prop_map(Edit::Delete),
    ]
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
