use super::*;
use crate::delivery::outcome::{after_dot, classify, Failure};

const M: u64 = 60;
const H: u64 = 3600;
/// The store's clock at every decision.
const NOW: i64 = 1_750_000_000_000;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ago(age: Duration) -> i64 {
    NOW - age.as_millis() as i64
}

/// A message with `attempts` finished attempts, accepted `accepted` ago, first tried
/// `first` ago.
fn job(attempts: u32, accepted: Duration, first: Option<Duration>, any_unknown: bool) -> JobFacts {
    JobFacts {
        attempts,
        accepted_at_ms: ago(accepted),
        first_attempt_at_ms: first.map(ago),
        any_unknown,
        recovered: false,
        keyed: true,
    }
}

fn unkeyed(j: JobFacts) -> JobFacts {
    JobFacts { keyed: false, ..j }
}

fn recovered(j: JobFacts) -> JobFacts {
    JobFacts {
        recovered: true,
        ..j
    }
}

fn accepted(reply: &str) -> Outcome {
    Outcome::Accepted {
        reply: reply.into(),
    }
}

fn transient(phase: Phase, code: u16, reply: &str) -> Outcome {
    Outcome::Transient {
        phase,
        heard: Heard::Reply(code),
        reply: reply.into(),
    }
}

fn permanent(phase: Phase, code: u16, reply: &str) -> Outcome {
    Outcome::Permanent {
        phase,
        code,
        reply: reply.into(),
    }
}

fn unknown(reason: &str) -> Outcome {
    Outcome::Unknown {
        phase: Phase::Dot,
        reason: reason.into(),
    }
}

#[test]
fn before_attempt_table() {
    let p = RetryPolicy::default();
    let limit = secs(170 * M);
    let early = job(1, secs(H), Some(secs(H)), true);
    let cases: &[(&str, JobFacts, Start)] = &[
        (
            "no unknown before: sent, the body unbounded",
            job(3, secs(5 * H), Some(secs(5 * H)), false),
            Start::Send { body_within: None },
        ),
        (
            "no unknown before, no key: sent",
            unkeyed(job(3, secs(5 * H), Some(secs(5 * H)), false)),
            Start::Send { body_within: None },
        ),
        (
            "unknown before, an hour in: the body must leave within the rest of the window",
            early,
            Start::Send {
                body_within: Some(limit - secs(H)),
            },
        ),
        (
            "an attempt recovered as unknown at this claim counts as unknown",
            recovered(job(1, secs(10 * M), Some(secs(10 * M)), false)),
            Start::Send {
                body_within: Some(limit - secs(10 * M)),
            },
        ),
        (
            "recovered with no first attempt on record: the window starts now",
            recovered(job(0, secs(M), None, false)),
            Start::Send {
                body_within: Some(limit),
            },
        ),
        (
            "unknown before, no key: the upstream cannot collapse a second copy",
            unkeyed(early),
            Start::Park,
        ),
        (
            "recovered, no key",
            unkeyed(recovered(job(1, secs(M), Some(secs(M)), false))),
            Start::Park,
        ),
        (
            "unknown before, exactly at window - margin",
            job(2, limit, Some(limit), true),
            Start::Park,
        ),
        (
            "unknown before, a millisecond before window - margin",
            job(
                2,
                limit - Duration::from_millis(1),
                Some(limit - Duration::from_millis(1)),
                true,
            ),
            Start::Send {
                body_within: Some(Duration::from_millis(1)),
            },
        ),
        (
            "unknown before, past the window",
            job(4, secs(5 * H), Some(secs(4 * H)), true),
            Start::Park,
        ),
        (
            "unknown before, no first attempt on record: the window starts now",
            job(1, Duration::ZERO, None, true),
            Start::Send {
                body_within: Some(limit),
            },
        ),
    ];
    for (name, facts, want) in cases {
        assert_eq!(before_attempt(&p, facts, NOW), *want, "{name}");
    }
    // The store's clock behind the first attempt: no time has passed.
    let future_first = JobFacts {
        first_attempt_at_ms: Some(NOW + 5_000),
        ..early
    };
    assert_eq!(
        before_attempt(&p, &future_first, NOW),
        Start::Send {
            body_within: Some(limit)
        }
    );
}

/// The worker's window check used to add the margin to the message's age, a panic on
/// overflow for a huge margin (the `(3h, MAX)` row), and its body limit subtracted the
/// margin from the window without saturating; both now read the saturating
/// `RetryPolicy::unknown_retry_limit`.
#[test]
fn a_margin_at_least_the_window_parks_every_unknown_without_panicking() {
    let early = job(1, secs(M), Some(secs(M)), true);
    for (window, margin) in [
        (secs(60), secs(600)),
        (secs(600), secs(600)),
        (secs(3 * H), Duration::MAX),
        (Duration::MAX, Duration::MAX),
    ] {
        let p = RetryPolicy {
            window,
            window_margin: margin,
            ..RetryPolicy::default()
        };
        assert_eq!(
            before_attempt(&p, &early, NOW),
            Start::Park,
            "{window:?} {margin:?}"
        );
        let first_try = job(0, Duration::ZERO, None, true);
        assert_eq!(before_attempt(&p, &first_try, NOW), Start::Park);
    }
    let endless = RetryPolicy {
        window: Duration::MAX,
        ..RetryPolicy::default()
    };
    let old = job(1, secs(100_000 * H), Some(secs(100_000 * H)), true);
    assert!(matches!(
        before_attempt(&endless, &old, NOW),
        Start::Send {
            body_within: Some(_)
        }
    ));
}

/// What a decision should come to; the row's phase, code and reply are the outcome's own
/// (checked separately).
#[derive(Debug, PartialEq)]
struct Want {
    recorded: &'static str,
    next: Next,
    pause: bool,
    breaker: BreakerInput,
    pace: PaceInput,
}

fn want(
    recorded: &'static str,
    next: Next,
    pause: bool,
    breaker: BreakerInput,
    pace: PaceInput,
) -> Want {
    Want {
        recorded,
        next,
        pause,
        breaker,
        pace,
    }
}

#[test]
fn decide_table() {
    use BreakerInput as B;
    use PaceInput as P;
    let p = RetryPolicy::default();
    let half = 0.5;
    let fresh = job(0, secs(5), None, false);
    let limit = 170 * M;
    let ok = accepted("250 2.0.0 OK id=1");
    let user_unknown = permanent(Phase::Rcpt, 550, "550 5.1.1 user unknown");
    let try_later = transient(Phase::Rcpt, 451, "451 4.3.0 try again later");
    let lost = unknown("timed out");
    let bad_login = transient(Phase::Auth, 535, "535 5.7.8 authentication failed");
    let suspended = permanent(Phase::Mail, 550, "550 5.7.1 account suspended");
    let cases: &[(&str, JobFacts, &Outcome, f64, Want)] = &[
        (
            "accepted: delivered",
            fresh,
            &ok,
            half,
            want("accepted", Next::Delivered, false, B::Success, P::Success),
        ),
        (
            "accepted after an unknown: delivered",
            job(2, secs(H), Some(secs(H)), true),
            &ok,
            half,
            want("accepted", Next::Delivered, false, B::Success, P::Success),
        ),
        (
            "permanent: bounced, the breaker unmoved",
            fresh,
            &user_unknown,
            half,
            want("permanent", Next::Failed, false, B::Neutral, P::Keep),
        ),
        (
            "permanent after an unknown: an earlier copy may be delivered",
            job(1, secs(M), Some(secs(M)), true),
            &user_unknown,
            half,
            want("permanent", Next::Unresolved, false, B::Neutral, P::Keep),
        ),
        (
            "first transient: retried within [0, base]",
            fresh,
            &try_later,
            half,
            want(
                "transient",
                Next::RetryAfter(secs(15)),
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "third transient: retried within [0, 4 base]",
            job(2, secs(10 * M), Some(secs(10 * M)), false),
            &try_later,
            1.0,
            want(
                "transient",
                Next::RetryAfter(secs(120)),
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "transient, the last allowed attempt: bounced",
            job(19, secs(H), Some(secs(H)), false),
            &try_later,
            0.0,
            want("transient", Next::Failed, false, B::MessageFailure, P::Keep),
        ),
        (
            "transient, the last allowed attempt after an unknown: parked",
            job(19, secs(H), Some(secs(H)), true),
            &try_later,
            0.0,
            want(
                "transient",
                Next::Unresolved,
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "transient, the retry would land past the deadline: bounced",
            job(3, secs(48 * H - 30), Some(secs(48 * H - 30)), false),
            &try_later,
            1.0,
            want("transient", Next::Failed, false, B::MessageFailure, P::Keep),
        ),
        (
            "transient without unknowns ignores the upstream window",
            job(2, secs(5 * H), Some(secs(5 * H)), false),
            &try_later,
            half,
            want(
                "transient",
                Next::RetryAfter(secs(60)),
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "transient after an unknown, past the window: parked",
            job(3, secs(3 * H), Some(secs(3 * H)), true),
            &try_later,
            0.0,
            want(
                "transient",
                Next::Unresolved,
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "transient asking to slow down: retried, the pace lowered",
            fresh,
            &transient(Phase::Rcpt, 421, "421 4.7.0 rate limit exceeded"),
            half,
            want(
                "transient",
                Next::RetryAfter(secs(15)),
                false,
                B::Unwell(Unwell::Closing),
                P::SlowDown,
            ),
        ),
        (
            "too many connections from the account is a rate, not an account problem",
            fresh,
            &transient(
                Phase::Connect,
                421,
                "421 4.7.0 too many connections from your account",
            ),
            half,
            want(
                "transient",
                Next::RetryAfter(secs(15)),
                false,
                B::Unwell(Unwell::Greeting),
                P::SlowDown,
            ),
        ),
        (
            "unknown, keyed, first attempt: retried",
            fresh,
            &lost,
            half,
            want(
                "unknown",
                Next::RetryAfter(secs(15)),
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "unknown, keyed, the retry would land at window - margin: parked",
            job(2, secs(limit - 60), Some(secs(limit - 60)), true),
            &lost,
            half,
            want(
                "unknown",
                Next::Unresolved,
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "unknown, keyed, the retry lands just before window - margin: retried",
            job(2, secs(limit - 61), Some(secs(limit - 61)), true),
            &lost,
            half,
            want(
                "unknown",
                Next::RetryAfter(secs(60)),
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "unknown, no key: parked at once",
            unkeyed(fresh),
            &lost,
            0.0,
            want(
                "unknown",
                Next::Unresolved,
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "an odd reply to the dot is unknown: retried while the window lasts",
            fresh,
            &unknown("251 2.1.5 will forward"),
            0.0,
            want(
                "unknown",
                Next::RetryAfter(Duration::ZERO),
                false,
                B::MessageFailure,
                P::Keep,
            ),
        ),
        (
            "account: credentials refused at AUTH, queued at base and paused",
            fresh,
            &bad_login,
            0.0,
            want(
                "transient",
                Next::RetryAfter(secs(30)),
                true,
                B::Unwell(Unwell::Auth),
                P::Keep,
            ),
        ),
        (
            "account: a 5xx at MAIL about the account is recorded transient, not bounced",
            fresh,
            &suspended,
            0.0,
            want(
                "transient",
                Next::RetryAfter(secs(30)),
                true,
                B::Neutral,
                P::Keep,
            ),
        ),
        (
            "account: no attempt limit applies, the message waits out the pause",
            job(19, secs(H), Some(secs(H)), false),
            &bad_login,
            half,
            want(
                "transient",
                Next::RetryAfter(secs(30)),
                true,
                B::Unwell(Unwell::Auth),
                P::Keep,
            ),
        ),
        (
            "account after an unknown: waits out the pause too",
            job(1, secs(M), Some(secs(M)), true),
            &suspended,
            half,
            want(
                "transient",
                Next::RetryAfter(secs(30)),
                true,
                B::Neutral,
                P::Keep,
            ),
        ),
        (
            "account: our sending quota, even at RCPT",
            fresh,
            &transient(Phase::Rcpt, 452, "452 4.5.3 sending quota exceeded"),
            half,
            want(
                "transient",
                Next::RetryAfter(secs(30)),
                true,
                B::MessageFailure,
                P::Keep,
            ),
        ),
    ];
    for (name, facts, outcome, jitter, expected) in cases {
        let d = decide(&p, facts, outcome, NOW, *jitter);
        let got = want(
            d.row.outcome.as_str(),
            d.next,
            d.pause.is_some(),
            d.breaker,
            d.pace,
        );
        assert_eq!(got, *expected, "{name}");
        assert_eq!(d.row.phase, outcome.phase(), "{name}");
        assert_eq!(d.row.code, outcome.code(), "{name}");
        assert_eq!(d.row.reply, outcome.reply_text(), "{name}");
        if let Some(reason) = &d.pause {
            assert_eq!(reason, &d.row.reply, "{name}");
        }
    }
}

/// Who is blamed for a failure, as the operator's report needs it: a busy mailbox or a
/// dropped reply to the dot is the message's, a dead or refusing session the upstream's.
#[test]
fn what_the_breaker_learns_from_each_ending() {
    use BreakerInput::{MessageFailure, Neutral, Success, Unwell as U};
    let silent = |phase, failure: Failure| classify(phase, failure);
    let replied = |phase, code: u16, text: &str| {
        classify(
            phase,
            Failure::Reply {
                code,
                text: text.into(),
            },
        )
    };
    let refused = Failure::ConnectionLost("Connection refused (os error 111)".into());
    let reset = || Failure::ConnectionLost("reset by peer".into());
    let cases: Vec<(&str, Outcome, BreakerInput)> = vec![
        ("accepted", after_dot(250, "2.0.0 OK"), Success),
        (
            "5xx at RCPT",
            replied(Phase::Rcpt, 550, "5.1.1 no such user"),
            Neutral,
        ),
        (
            "5xx after the dot",
            after_dot(554, "5.6.0 rejected"),
            Neutral,
        ),
        (
            "connect refused",
            silent(Phase::Connect, refused),
            U(Unwell::Connect),
        ),
        (
            "connect timed out",
            silent(Phase::Connect, Failure::Timeout),
            U(Unwell::Connect),
        ),
        (
            "implicit TLS handshake failed (connect phase)",
            silent(Phase::Connect, Failure::Tls("bad certificate".into())),
            U(Unwell::Tls),
        ),
        (
            "a reply in the connect phase is the implicit-TLS greeting's",
            replied(Phase::Connect, 421, "4.3.2 shutting down"),
            U(Unwell::Greeting),
        ),
        (
            "421 greeting",
            replied(Phase::Greeting, 421, "4.3.2 busy"),
            U(Unwell::Greeting),
        ),
        (
            "no greeting",
            silent(Phase::Greeting, Failure::Timeout),
            U(Unwell::Greeting),
        ),
        (
            "EHLO refused",
            replied(Phase::Ehlo, 554, "5.5.0 no"),
            U(Unwell::Greeting),
        ),
        (
            "STARTTLS refused",
            replied(Phase::StartTls, 454, "4.7.0 TLS not available"),
            U(Unwell::Tls),
        ),
        (
            "TLS handshake",
            silent(Phase::StartTls, Failure::Tls("eof".into())),
            U(Unwell::Tls),
        ),
        (
            "AUTH refused",
            replied(Phase::Auth, 535, "5.7.8 bad credentials"),
            U(Unwell::Auth),
        ),
        ("AUTH lost", silent(Phase::Auth, reset()), U(Unwell::Auth)),
        (
            "MAIL FROM not answered",
            silent(Phase::Mail, Failure::Timeout),
            U(Unwell::Lost),
        ),
        (
            "connection lost at MAIL FROM",
            silent(Phase::Mail, reset()),
            U(Unwell::Lost),
        ),
        (
            "MAIL FROM answered 451: about this sender",
            replied(Phase::Mail, 451, "4.3.0 try later"),
            MessageFailure,
        ),
        (
            "the operator's busy mailbox",
            replied(Phase::Rcpt, 451, "4.2.1 mailbox busy"),
            MessageFailure,
        ),
        (
            "RCPT timed out",
            silent(Phase::Rcpt, Failure::Timeout),
            MessageFailure,
        ),
        (
            "DATA refused",
            replied(Phase::Data, 451, "4.3.0 later"),
            MessageFailure,
        ),
        (
            "the operator's dropped reply to the dot",
            silent(Phase::Dot, reset()),
            MessageFailure,
        ),
        (
            "dot timed out",
            silent(Phase::Dot, Failure::Timeout),
            MessageFailure,
        ),
        (
            "4xx after the dot",
            after_dot(452, "4.3.1 storage full"),
            MessageFailure,
        ),
        (
            "an odd reply to the dot",
            after_dot(251, "2.1.5 will forward"),
            MessageFailure,
        ),
        (
            "421 at RCPT: the upstream closes the session",
            replied(Phase::Rcpt, 421, "4.3.2 shutting down"),
            U(Unwell::Closing),
        ),
        (
            "421 after the dot",
            after_dot(421, "4.3.2 shutting down"),
            U(Unwell::Closing),
        ),
    ];
    for (name, outcome, expected) in cases {
        assert_eq!(breaker_input(&outcome), expected, "{name}: {outcome:?}");
    }
    // Every phase has its row.
    for phase in Phase::ALL {
        assert!(BLAME.iter().any(|(p, _, _)| *p == phase), "{phase}");
    }
}

#[test]
fn the_ledger_row_reads_as_the_upstream_said() {
    let p = RetryPolicy::default();
    let fresh = job(0, secs(5), None, false);
    let d = decide(&p, &fresh, &accepted("250 2.0.0 OK id=1"), NOW, 0.5);
    assert_eq!(
        d.row,
        AttemptResult {
            outcome: OutcomeKind::Accepted,
            phase: Some(Phase::Dot),
            code: Some(250),
            reply: "250 2.0.0 OK id=1".into(),
        }
    );
    let d = decide(&p, &fresh, &unknown("connection lost: reset"), NOW, 0.5);
    assert_eq!(
        d.row,
        AttemptResult {
            outcome: OutcomeKind::Unknown,
            phase: Some(Phase::Dot),
            code: None,
            reply: "connection lost: reset".into(),
        }
    );
}

#[test]
fn each_decision_settles_as_the_store_expects() {
    let p = RetryPolicy::default();
    let fresh = job(0, secs(5), None, false);
    let settle =
        |outcome: &Outcome, jitter: f64| decide(&p, &fresh, outcome, NOW, jitter).settle(None);
    assert!(matches!(
        settle(&accepted("250 ok"), 0.0),
        Settle::Delivered { upstream_reply, dsn: None } if upstream_reply == "250 ok"
    ));
    assert!(matches!(
        settle(&transient(Phase::Rcpt, 451, "451 later"), 1.0),
        Settle::Retry { after, dsn: None } if after == secs(30)
    ));
    assert!(matches!(
        settle(&unknown("no"), 0.0),
        Settle::Retry { after, dsn: None } if after == Duration::ZERO
    ));
    assert!(matches!(
        decide(&p, &unkeyed(fresh), &unknown("timed out"), NOW, 0.0).settle(None),
        Settle::Unresolved { upstream_reply } if upstream_reply == "timed out"
    ));
    assert!(matches!(
        settle(&permanent(Phase::Rcpt, 550, "550 no"), 0.0),
        Settle::Failed { upstream_reply, dsn: None } if upstream_reply == "550 no"
    ));
}
