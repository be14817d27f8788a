//! What the relay does about one message, as data (docs/concepts/delivery.md): before an attempt, whether it
//! may be sent at all; after it, the ledger row, what becomes of the message, the account
//! pause, what the breaker and the pace learn, and the metric label. The worker only carries
//! these out (claim, intent, send, settle), so the exactly-once policy is read here, not in
//! async code.
//!
//! As in [`super::retry`], nothing here reads a clock or a random source: the store's time and
//! the jitter's unit are passed in, so every branch is a row of a table test.

use std::time::Duration;

use super::outcome::{
    is_account_problem, is_slow_down, Heard, Outcome, OutcomeKind, Phase, Silence,
};
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
        Outcome::Transient { phase, heard, .. } => {
            let (_, replied, silent) = BLAME
                .iter()
                .find(|(p, _, _)| p == phase)
                .copied()
                .unwrap_or((*phase, Blame::Message, Blame::Message));
            let blame = match heard {
                Heard::Reply(code) if SESSION_CODES.contains(code) && replied == Blame::Message => {
                    Blame::Upstream(Unwell::Closing)
                }
                Heard::Reply(_) => replied,
                // Implicit TLS fails in the connect phase: the silence tells it apart.
                Heard::Nothing(Silence::Tls) => Blame::Upstream(Unwell::Tls),
                Heard::Nothing(_) => silent,
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
mod tests;
