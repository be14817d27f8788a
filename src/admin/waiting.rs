//! Why a queued record is waiting: from what the store knows (its job's
//! due time, its lease, its last attempt, the relay's pause) and what only the running relay
//! knows (its circuit breaker). Pure, so every case has a table test.

use crate::delivery::breaker::BreakerState;
use crate::store::{Pause, State};

/// Relay-wide facts that decide whether anything is sent now.
#[derive(Debug, Clone, Default)]
pub(crate) struct RelayFacts {
    pub pause: Option<Pause>,
    /// `None` when not known: read from the store directly, without the running relay.
    pub breaker: Option<BreakerState>,
}

/// What one queued record's facts are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordFacts<'a> {
    pub state: State,
    pub next_attempt_at_ms: Option<i64>,
    pub leased: bool,
    /// The outcome of the record's newest attempt.
    pub last_outcome: Option<&'a str>,
    pub now_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// delivering, paused, account_paused, breaker_open, backoff, held_by_breaker, due.
    pub reason: &'static str,
    pub detail: String,
}

fn wait(reason: &'static str, detail: impl Into<String>) -> Option<Waiting> {
    Some(Waiting {
        reason,
        detail: detail.into(),
    })
}

fn seconds(ms: i64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(
        (ms.max(0) as u64).div_ceil(1000),
    ))
    .to_string()
}

/// `None` for a record that does not wait (not queued).
pub(crate) fn why_waiting(record: &RecordFacts, relay: &RelayFacts) -> Option<Waiting> {
    let mut waiting = store_reason(record, relay)?;
    if relay.breaker.is_none() && matches!(waiting.reason, "due" | "held_by_breaker") {
        waiting
            .detail
            .push_str(" (read from the store: the relay's circuit breaker is not known here)");
    }
    Some(waiting)
}

fn store_reason(record: &RecordFacts, relay: &RelayFacts) -> Option<Waiting> {
    if record.state != State::Queued {
        return None;
    }
    if record.leased {
        return wait("delivering", "a worker holds it: an attempt is under way");
    }
    match &relay.pause {
        Some(p) if p.probe => {
            return wait(
                "account_paused",
                format!(
                    "delivery is paused after an account-level upstream failure ({}); it \
                     resumes after a normal probe, or `queue resume`",
                    p.reason
                ),
            )
        }
        Some(p) => {
            return wait(
                "paused",
                format!(
                    "delivery is paused by an operator ({}); `queue resume` ends it",
                    p.reason
                ),
            )
        }
        None => {}
    }
    if relay.breaker == Some(BreakerState::Open) {
        return wait(
            "breaker_open",
            "the upstream circuit breaker is open: the upstream itself failed (connection, \
             greeting, TLS, AUTH) or many different messages failed at once; one probe \
             follows its cooldown",
        );
    }
    let due_in = record
        .next_attempt_at_ms
        .map_or(0, |due| due - record.now_ms);
    if due_in <= 0 {
        return wait(
            "due",
            "due now: waits for a free delivery worker (the upstream rate limit paces them)",
        );
    }
    let failed = matches!(record.last_outcome, Some("transient" | "unknown"));
    if failed {
        wait(
            "backoff",
            format!(
                "retry backoff after a failed attempt: next attempt in {}",
                seconds(due_in)
            ),
        )
    } else {
        wait(
            "held_by_breaker",
            format!(
                "handed back without an attempt while the circuit breaker was open: next \
                 attempt in {}",
                seconds(due_in)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_a_record_waits_for() {
        let paused = |probe| Pause {
            reason: "r".into(),
            since_ms: 0,
            probe,
        };
        let record = |state, due, leased, last| RecordFacts {
            state,
            next_attempt_at_ms: due,
            leased,
            last_outcome: last,
            now_ms: 10_000,
        };
        let relay = |pause, breaker| RelayFacts { pause, breaker };
        let closed = Some(BreakerState::Closed);
        let open = Some(BreakerState::Open);
        // (record, relay, reason)
        let table = [
            (
                record(State::Delivered, None, false, None),
                relay(None, closed),
                None,
            ),
            (
                record(State::Queued, Some(0), true, None),
                relay(Some(paused(false)), open),
                Some("delivering"),
            ),
            (
                record(State::Queued, Some(0), false, None),
                relay(Some(paused(false)), open),
                Some("paused"),
            ),
            (
                record(State::Queued, Some(0), false, None),
                relay(Some(paused(true)), None),
                Some("account_paused"),
            ),
            (
                record(State::Queued, Some(0), false, None),
                relay(None, open),
                Some("breaker_open"),
            ),
            (
                record(State::Queued, Some(10_000), false, None),
                relay(None, closed),
                Some("due"),
            ),
            (
                record(State::Queued, Some(20_000), false, Some("transient")),
                relay(None, None),
                Some("backoff"),
            ),
            (
                record(State::Queued, Some(20_000), false, Some("unknown")),
                relay(None, closed),
                Some("backoff"),
            ),
            (
                record(State::Queued, Some(20_000), false, None),
                relay(None, closed),
                Some("held_by_breaker"),
            ),
        ];
        for (r, relay, reason) in table {
            assert_eq!(
                why_waiting(&r, &relay).map(|w| w.reason),
                reason,
                "{r:?} {relay:?}"
            );
        }
        let backoff = why_waiting(
            &record(State::Queued, Some(40_000), false, Some("transient")),
            &relay(None, closed),
        )
        .unwrap();
        assert!(backoff.detail.contains("in 30s"), "{}", backoff.detail);
        let unknown = why_waiting(
            &record(State::Queued, Some(0), false, None),
            &relay(None, None),
        )
        .unwrap();
        assert!(unknown.detail.contains("not known"), "{}", unknown.detail);
    }
}
