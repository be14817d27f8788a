//! What the relay does about one message, as data (docs/concepts/delivery.md): before an attempt, whether it
//! may be sent at all; after it, the ledger row, what becomes of the message, the account
//! pause, what the breaker and the pace learn, and the metric label. The worker only carries
//! these out (claim, intent, send, settle), so the exactly-once policy is read here, not in
//! async code.
//!
//! As in [`super::retry`], nothing here reads a clock or a random source: the store's time and
//! the jitter's unit are passed in, so every branch is a row of a table test.

use std::time::Duration;

use super::outcome::{is_account_problem, is_slow_down, Outcome, OutcomeKind, Phase};
use super::retry::{next_step, Ledger, Next, RetryPolicy};
use crate::store::{AttemptResult, Claimed, NewRecord, Settle};

/// What the claim tells about a message's past, in the store's clock (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JobFacts {
    /// Finished attempts so far (a recovered one included).
    pub attempts: u32,
    pub accepted_at_ms: i64,
    pub first_attempt_at_ms: Option<i64>,
    /// An earlier attempt ended UNKNOWN.
    pub any_unknown: bool,
    /// The claim closed an attempt left open by a worker that lost its lease, as UNKNOWN.
    pub recovered: bool,
    /// The message has an idempotency key the upstream honours.
    pub keyed: bool,
}

impl JobFacts {
    pub(crate) fn of(job: &Claimed) -> Self {
        JobFacts {
            attempts: job.attempts,
            accepted_at_ms: job.accepted_at_ms,
            first_attempt_at_ms: job.first_attempt_at_ms,
            any_unknown: job.any_unknown,
            recovered: job.recovered,
            keyed: job.key.is_some(),
        }
    }

    /// How long the message has been with us at `now_ms`.
    pub(crate) fn since_accepted(&self, now_ms: i64) -> Duration {
        ms(now_ms.saturating_sub(self.accepted_at_ms))
    }

    fn ledger(&self, attempts: u32, any_unknown: bool, now_ms: i64) -> Ledger {
        Ledger {
            attempts,
            since_accepted: self.since_accepted(now_ms),
            since_first_attempt: ms(
                now_ms.saturating_sub(self.first_attempt_at_ms.unwrap_or(now_ms))
            ),
            any_unknown,
            keyed: self.keyed,
        }
    }
}

/// The ledger's reply for a message parked without an attempt.
pub(crate) const WINDOW_OVER: &str =
    "earlier attempt outcome unknown; upstream idempotency window over";

/// Whether the claimed message is sent now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Send it. After an earlier UNKNOWN, `body_within` (counted from the decision) is when the
    /// upstream's window closes: no body byte may leave after it.
    Send { body_within: Option<Duration> },
    /// An earlier attempt may have been accepted upstream and the upstream's window is (nearly)
    /// over, or the message has no key the upstream could collapse a second copy with: another
    /// try could be a second copy, so the message is parked for an operator, unsent. Its ledger
    /// reply is [`WINDOW_OVER`]; its label is [`Next::Unresolved`]'s.
    Park,
}

/// Decided at the moment of sending, not when the retry was planned: the queue may have held
/// the message past the planned time.
pub(crate) fn before_attempt(policy: &RetryPolicy, job: &JobFacts, now_ms: i64) -> Start {
    let unknown_before = job.any_unknown || job.recovered;
    if !unknown_before {
        return Start::Send { body_within: None };
    }
    let since_first = job.ledger(job.attempts, true, now_ms).since_first_attempt;
    let limit = policy.unknown_retry_limit();
    if !job.keyed || since_first >= limit {
        return Start::Park;
    }
    Start::Send {
        body_within: Some(limit - since_first),
    }
}

/// What the attempt tells the relay-wide circuit breaker (docs/concepts/delivery.md,
/// "Circuit breaker").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerInput {
    /// The upstream took the message.
    Success,
    /// The upstream judged this message (a 5xx), which says nothing about its health.
    Neutral,
    /// The upstream itself is unwell: it could not hold a session up to the answer to MAIL
    /// FROM. A run of these opens the breaker.
    Unwell(Unwell),
    /// This message failed on its own after the upstream had answered the session up to MAIL
    /// FROM (a 4xx at MAIL/RCPT/DATA/the dot, an UNKNOWN after the dot). It opens the breaker
    /// only as part of many different messages failing (the breaker's window).
    MessageFailure,
}

/// Why the upstream is judged unwell: the class a breaker log line names when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unwell {
    /// TCP connect refused, unreachable or timed out.
    Connect,
    /// No usable greeting or EHLO answer (a 421 greeting included).
    Greeting,
    /// STARTTLS refused or the TLS handshake failed.
    Tls,
    /// The upstream refused our credentials, or AUTH got no answer.
    Auth,
    /// A timeout or lost connection before MAIL FROM was answered.
    Lost,
    /// A 421 after MAIL FROM: the upstream said it is closing the session, whatever the message.
    Closing,
}

impl Unwell {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unwell::Connect => "connect",
            Unwell::Greeting => "greeting",
            Unwell::Tls => "tls",
            Unwell::Auth => "auth",
            Unwell::Lost => "lost",
            Unwell::Closing => "closing",
        }
    }
}

/// Whom a failed attempt blames, by the phase it ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    Upstream(Unwell),
    Message,
}

/// The breaker's policy as data: for each phase, whom a failure there blames when the upstream
/// replied (a 4xx, or a 5xx before MAIL that `classify` keeps transient) and when it did not
/// (timeout, connection lost, TLS error). Up to and including the answer to MAIL FROM nothing
/// names a recipient, so a failure there is the upstream's; once MAIL FROM was answered, the
/// upstream has shown it holds sessions, and what follows is about this message. A reply to MAIL
/// FROM is the message's (its sender), a silence there the upstream's.
const BLAME: [(Phase, Blame, Blame); 9] = {
    use Blame::{Message, Upstream};
    [
        // (phase, with a reply, without one)
        (
            Phase::Connect,
            Upstream(Unwell::Greeting),
            Upstream(Unwell::Connect),
        ),
        (
            Phase::Greeting,
            Upstream(Unwell::Greeting),
            Upstream(Unwell::Greeting),
        ),
        (
            Phase::Ehlo,
            Upstream(Unwell::Greeting),
            Upstream(Unwell::Greeting),
        ),
        (
            Phase::StartTls,
            Upstream(Unwell::Tls),
            Upstream(Unwell::Tls),
        ),
        (Phase::Auth, Upstream(Unwell::Auth), Upstream(Unwell::Auth)),
        (Phase::Mail, Message, Upstream(Unwell::Lost)),
        (Phase::Rcpt, Message, Message),
        (Phase::Data, Message, Message),
        (Phase::Dot, Message, Message),
    ]
};

/// Reply codes that speak for the whole session wherever they come (RFC 5321: 421 "service not
/// available, closing transmission channel").
const SESSION_CODES: &[u16] = &[421];

/// What an outcome tells the breaker (for an attempt, and for the connection check a half-open
/// breaker may probe with: a refused `MAIL FROM:<>` there means the upstream answered).
pub(crate) fn breaker_input(outcome: &Outcome) -> BreakerInput {
    match outcome {
        Outcome::Accepted { .. } => BreakerInput::Success,
        Outcome::Permanent { .. } => BreakerInput::Neutral,
        // Only ever after the dot: the upstream answered everything before it.
        Outcome::Unknown { .. } => BreakerInput::MessageFailure,
        Outcome::Transient { phase, code, reply } => {
            let (_, replied, silent) = BLAME
                .iter()
                .find(|(p, _, _)| p == phase)
                .copied()
                .unwrap_or((*phase, Blame::Message, Blame::Message));
            let blame = match code {
                Some(code) if SESSION_CODES.contains(code) && replied == Blame::Message => {
                    Blame::Upstream(Unwell::Closing)
                }
                Some(_) => replied,
                // Implicit TLS fails in the connect phase: the wording tells it apart
                // (`outcome::describe`).
                None if reply.starts_with("TLS error") => Blame::Upstream(Unwell::Tls),
                None => silent,
            };
            match blame {
                Blame::Upstream(why) => BreakerInput::Unwell(why),
                Blame::Message => BreakerInput::MessageFailure,
            }
        }
    }
}

/// What the attempt tells the relay-wide sending pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PaceInput {
    /// The upstream asked the relay to slow down.
    SlowDown,
    /// The upstream took the message at this pace.
    Success,
    Keep,
}

/// Everything that follows one finished attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The attempt's row in the ledger.
    pub row: AttemptResult,
    /// What becomes of the message; [`Next::label`] names it in metrics and logs.
    pub next: Next,
    /// The upstream refused our account: delivery pauses with this reason, and a probe resumes it.
    pub pause: Option<String>,
    pub breaker: BreakerInput,
    pub pace: PaceInput,
}

impl Decision {
    /// The store's write for this decision. `dsn` is the sender's notice, queued in the same
    /// commit as a failure, a delivery or a retry (a delay notice; ignored otherwise).
    pub(crate) fn settle(&self, dsn: Option<NewRecord>) -> Settle {
        let upstream_reply = self.row.reply.clone();
        match self.next {
            Next::Delivered => Settle::Delivered {
                upstream_reply,
                dsn: dsn.map(Box::new),
            },
            Next::RetryAfter(after) => Settle::Retry {
                after,
                dsn: dsn.map(Box::new),
            },
            Next::Unresolved => Settle::Unresolved { upstream_reply },
            Next::Failed => Settle::Failed {
                upstream_reply,
                dsn: dsn.map(Box::new),
            },
        }
    }
}

/// From an attempt's outcome to everything that follows it. `now_ms` is the store's time when
/// the attempt ended; `jitter` is the retry delay's random unit in [0,1).
pub(crate) fn decide(
    policy: &RetryPolicy,
    job: &JobFacts,
    outcome: &Outcome,
    now_ms: i64,
    jitter: f64,
) -> Decision {
    let kind = outcome.kind();
    let account = is_account_problem(outcome);
    let ledger = job.ledger(
        job.attempts.saturating_add(1),
        job.any_unknown || kind == OutcomeKind::Unknown,
        now_ms,
    );
    let next = if account {
        // Not this message's fault: it stays queued while everything pauses.
        Next::RetryAfter(policy.base)
    } else {
        next_step(policy, kind, &ledger, jitter)
    };
    let row = AttemptResult {
        // An account-level refusal says nothing about this message: it stays transient.
        outcome: if account {
            OutcomeKind::Transient
        } else {
            kind
        },
        phase: outcome.phase(),
        code: outcome.code(),
        reply: outcome.reply_text(),
    };
    let breaker = breaker_input(outcome);
    let pace = if is_slow_down(outcome) {
        PaceInput::SlowDown
    } else if kind == OutcomeKind::Accepted {
        PaceInput::Success
    } else {
        PaceInput::Keep
    };
    Decision {
        pause: account.then(|| row.reply.clone()),
        row,
        next,
        breaker,
        pace,
    }
}

fn ms(millis: i64) -> Duration {
    Duration::from_millis(millis.max(0) as u64)
}

#[cfg(test)]
mod tests {
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
    fn job(
        attempts: u32,
        accepted: Duration,
        first: Option<Duration>,
        any_unknown: bool,
    ) -> JobFacts {
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
            code: Some(code),
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
}
