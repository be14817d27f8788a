//! What each change of a record's state writes, decided once for both backends: given the
//! facts a backend read (under its lock) and the request, these pure functions say what the
//! record, its job and its ledger become, or why nothing changes. Each backend only turns the
//! decision into its own SQL, so the two cannot drift apart on what a transition means.

use std::time::Duration;

use super::record::{
    accepted_upstream_id, report_damage, AttemptResult, Flush, NewRecord, Operator, Requeue,
    Resolution, Resolve, Settle, State,
};

/// The reply a cancelled record keeps.
pub(crate) const CANCELLED_REPLY: &str = "cancelled by an operator";

/// A record leaving the queue for good: its new state and the reply it keeps. The job row
/// always goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finish {
    pub state: State,
    pub upstream_reply: String,
    /// An intent left open by a dead worker is closed as UNKNOWN first (docs/concepts/delivery.md): the
    /// ledger must not claim it was never sent.
    pub close_open_intents: bool,
}

/// The writes of one attempt's outcome (fenced by the lease token by the backend).
#[derive(Debug, Clone)]
pub(crate) struct Settled<'a> {
    /// `Some(after)`: the job stays, due again after this; `None`: the job row goes.
    pub retry_after: Option<Duration>,
    /// The record's terminal state and the upstream's reply; `None` while it stays queued.
    pub finish: Option<(State, &'a str)>,
    /// The upstream's id for the message, kept on the attempt's ledger row.
    pub upstream_id: Option<String>,
    /// A DSN queued in the same commit (an existing one under its key is left as it is).
    pub dsn: Option<&'a NewRecord>,
    /// The record is now unresolved: upstream events already kept may resolve it.
    pub unresolved: bool,
}

impl Settled<'_> {
    /// Kept upstream events may match the record now: it is known by more (its upstream id,
    /// or its being unresolved).
    pub(crate) fn late_match(&self) -> bool {
        self.upstream_id.is_some() || self.unresolved
    }
}

pub(crate) fn settle<'a>(attempt: Option<&AttemptResult>, settle: &'a Settle) -> Settled<'a> {
    let upstream_id = attempt.and_then(accepted_upstream_id);
    let (retry_after, finish, dsn) = match settle {
        Settle::Retry { after, dsn } => (Some(*after), None, dsn.as_deref()),
        Settle::Delivered {
            upstream_reply,
            dsn,
        } => (
            None,
            Some((State::Delivered, upstream_reply.as_str())),
            dsn.as_deref(),
        ),
        Settle::Unresolved { upstream_reply } => (
            None,
            Some((State::Unresolved, upstream_reply.as_str())),
            None,
        ),
        Settle::Failed {
            upstream_reply,
            dsn,
        } => (
            None,
            Some((State::Failed, upstream_reply.as_str())),
            dsn.as_deref(),
        ),
    };
    Settled {
        retry_after,
        finish,
        upstream_id,
        dsn,
        unresolved: matches!(settle, Settle::Unresolved { .. }),
    }
}

/// What a requeue reads about the record (under its lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequeueFacts {
    pub state: State,
    /// The record's bytes are still stored (inline or spooled).
    pub has_content: bool,
    /// The ledger holds an attempt whose outcome is unknown.
    pub any_unknown: bool,
    /// The first attempt ever made, if any.
    pub first_attempt_at_ms: Option<i64>,
}

/// A requeue's writes: the record back to `queued` (its reply, finish time and damage mark
/// cleared), any stray job replaced by a new one due now, and an operator action row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Requeued {
    /// The first-attempt time the new job starts with.
    pub first_attempt_at_ms: Option<i64>,
    /// The action row's detail.
    pub detail: String,
}

/// The fencing token a requeued record's new job row starts from. A record's job row is
/// deleted when it ends and made anew by a requeue; starting again at 0 would hand the next
/// claim a token that a worker of an earlier round may still hold (frozen, then woken), and
/// its writes would pass the fence. Tokens grow by one per claim, far fewer than 2^20 per
/// millisecond, so a row started at `now_ms << 20` starts above every token an earlier row of
/// the same record reached (until the year 2248).
pub(crate) fn requeued_token_base(now_ms: i64) -> i64 {
    now_ms.max(0) << 20
}

/// Only `failed`, `unresolved` and `cancelled` records can be requeued, only while their
/// bytes are kept, and only with the operator's confirmation of the duplicate risk whenever
/// the ledger holds an UNKNOWN attempt (an `unresolved` record always does; a `failed` one
/// may, e.g. cancelled with a dead worker's intent open). A confirmed duplicate risk starts a
/// new upstream window (the operator accepted a second copy); otherwise the window still
/// counts from the first attempt ever made, so that an UNKNOWN in the new round is not
/// retried past the upstream's window.
pub(crate) fn requeue(facts: RequeueFacts, confirmed: bool) -> Result<Requeued, Requeue> {
    let state = facts.state;
    let risky = facts.any_unknown || state == State::Unresolved;
    let refusal = match state {
        State::Failed | State::Unresolved | State::Cancelled => {
            (risky && !confirmed).then_some(Requeue::NeedsConfirmation(state))
        }
        other => Some(Requeue::WrongState(other)),
    };
    if let Some(refusal) = refusal.or((!facts.has_content).then_some(Requeue::ContentGone)) {
        return Err(refusal);
    }
    let mut detail = format!("requeued from {}", state.as_str());
    if confirmed {
        detail.push_str("; duplicate risk confirmed");
    }
    Ok(Requeued {
        first_attempt_at_ms: if risky {
            None
        } else {
            facts.first_attempt_at_ms
        },
        detail,
    })
}

/// What a cancel reads: the record's state and, when it has a job, whether a worker holds
/// the job's lease right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CancelFacts {
    pub state: State,
    /// `None`: no job row (or, on Postgres, one locked by a claim or settle right now).
    pub leased: Option<bool>,
}

/// Only a queued record whose job no worker holds is cancelled (no DSN); `None` otherwise.
pub(crate) fn cancel(found: Option<CancelFacts>) -> Option<Finish> {
    let facts = found?;
    (facts.state == State::Queued && facts.leased == Some(false)).then(|| Finish {
        state: State::Cancelled,
        upstream_reply: CANCELLED_REPLY.to_string(),
        close_open_intents: true,
    })
}

/// Only an `unresolved` record is resolved by an operator: it ends in the resolution's state,
/// its reply saying who closed it and why (the ledger keeps the attempts' own replies). Its
/// job row is long gone (parking removed it), so no worker can be delivering it.
pub(crate) fn resolve(
    found: Option<State>,
    resolution: Resolution,
    by: &Operator,
) -> Result<Finish, Resolve> {
    match found {
        None => Err(Resolve::NotFound),
        Some(State::Unresolved) => Ok(Finish {
            state: resolution.state(),
            upstream_reply: format!(
                "resolved as {} by an operator ({}), not sent again: {}",
                resolution.as_str(),
                by.actor,
                by.reason
            ),
            close_open_intents: true,
        }),
        Some(other) => Err(Resolve::WrongState(other)),
    }
}

/// A record whose body cannot be used is failed with the reason, so that it never blocks the
/// queue and is never forwarded. Logs the ALERT an operator acts on.
pub(crate) fn damaged(id: &str, reason: &str) -> Finish {
    Finish {
        state: State::Failed,
        upstream_reply: report_damage(id, reason),
        close_open_intents: true,
    }
}

/// What a flush reads about the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlushFacts {
    pub state: State,
    /// The job's due time, when the record has a job.
    pub due_at_ms: Option<i64>,
    /// A worker holds the job right now.
    pub leased: bool,
}

/// A flush's writes: the job due at `due_at_ms` and an action row saying `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Flushed {
    pub was_due_at_ms: i64,
    pub due_at_ms: i64,
    pub detail: String,
}

/// Only a queued record that no worker holds is made due now (never later than it was).
pub(crate) fn flush(found: Option<FlushFacts>, now_ms: i64) -> Result<Flushed, Flush> {
    let facts = found.ok_or(Flush::NotFound)?;
    let Some(due_at) = facts.due_at_ms.filter(|_| facts.state == State::Queued) else {
        return Err(Flush::NotQueued(facts.state));
    };
    if facts.leased {
        return Err(Flush::Leased);
    }
    Ok(Flushed {
        was_due_at_ms: due_at,
        due_at_ms: due_at.min(now_ms),
        detail: flush_detail(due_at, now_ms),
    })
}

/// What the one action row of a flush of every waiting record says beyond who and why.
pub fn flush_all_detail(count: usize) -> String {
    format!("flushed {count} record(s) (all)")
}

/// What a flush's action row says beyond who and why.
pub(crate) fn flush_detail(was_due_at_ms: i64, now_ms: i64) -> String {
    if was_due_at_ms > now_ms {
        format!(
            "was due in {}",
            humantime::format_duration(Duration::from_secs(
                ((was_due_at_ms - now_ms + 999) / 1000) as u64
            ))
        )
    } else {
        "was already due".to_string()
    }
}

/// Why a requeue needs the operator's confirmation, for the CLI and the admin API.
pub fn confirmation_reason(id: &str, state: State) -> String {
    let what = if state == State::Unresolved {
        format!("{id} is unresolved")
    } else {
        format!(
            "{id} is {} with an attempt whose outcome is unknown",
            state.as_str()
        )
    };
    format!(
        "{what}: the upstream may already have accepted it (its reply after the final dot was \
         lost), so a retry may deliver a second copy; check with the upstream first"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::test_record;
    use crate::OutcomeKind;

    #[test]
    fn only_an_unresolved_record_is_resolved_and_its_reply_says_by_whom() {
        let by = Operator {
            actor: "admin_token (ann)".into(),
            reason: "upstream log shows 250 for it".into(),
        };
        for resolution in Resolution::ALL {
            let finish = resolve(Some(State::Unresolved), resolution, &by).unwrap();
            assert_eq!(finish.state, resolution.state());
            assert_eq!(
                finish.upstream_reply,
                format!(
                    "resolved as {} by an operator (admin_token (ann)), not sent again: \
                     upstream log shows 250 for it",
                    resolution.as_str()
                )
            );
            assert_eq!(resolve(None, resolution, &by), Err(Resolve::NotFound));
            for state in State::ALL.into_iter().filter(|s| *s != State::Unresolved) {
                assert_eq!(
                    resolve(Some(state), resolution, &by),
                    Err(Resolve::WrongState(state))
                );
            }
        }
    }

    #[test]
    fn requeue_by_state_content_and_ledger() {
        use State::*;
        let needs = Requeue::NeedsConfirmation;
        // (state, has content, any unknown, confirmed) -> refusal, or the first attempt kept
        type Row = (State, bool, bool, bool, Result<Option<i64>, Requeue>);
        let table: [Row; 14] = [
            (Queued, true, false, true, Err(Requeue::WrongState(Queued))),
            (
                Delivered,
                true,
                false,
                true,
                Err(Requeue::WrongState(Delivered)),
            ),
            (
                Rejected,
                false,
                false,
                true,
                Err(Requeue::WrongState(Rejected)),
            ),
            (Failed, true, false, false, Ok(Some(5))),
            (Failed, true, false, true, Ok(Some(5))),
            (Failed, true, true, false, Err(needs(Failed))),
            // A confirmed duplicate risk starts a new upstream window.
            (Failed, true, true, true, Ok(None)),
            (Failed, false, false, false, Err(Requeue::ContentGone)),
            (Unresolved, true, false, false, Err(needs(Unresolved))),
            (Unresolved, true, true, true, Ok(None)),
            (Unresolved, false, true, true, Err(Requeue::ContentGone)),
            (Cancelled, true, false, false, Ok(Some(5))),
            (Cancelled, true, true, false, Err(needs(Cancelled))),
            // The state's refusal comes before the missing bytes.
            (Unresolved, false, true, false, Err(needs(Unresolved))),
        ];
        for (state, has_content, any_unknown, confirmed, expected) in table {
            let facts = RequeueFacts {
                state,
                has_content,
                any_unknown,
                first_attempt_at_ms: Some(5),
            };
            let got = requeue(facts, confirmed).map(|r| r.first_attempt_at_ms);
            assert_eq!(got, expected, "{facts:?} confirmed {confirmed}");
        }
        let facts = RequeueFacts {
            state: Unresolved,
            has_content: true,
            any_unknown: true,
            first_attempt_at_ms: None,
        };
        assert_eq!(
            requeue(facts, true).unwrap().detail,
            "requeued from unresolved; duplicate risk confirmed"
        );
        let facts = RequeueFacts {
            state: Failed,
            any_unknown: false,
            ..facts
        };
        assert_eq!(
            requeue(facts, false).unwrap().detail,
            "requeued from failed"
        );
    }

    #[test]
    fn cancel_takes_only_an_unleased_queued_job() {
        let cancelled = Some(Finish {
            state: State::Cancelled,
            upstream_reply: CANCELLED_REPLY.into(),
            close_open_intents: true,
        });
        let facts = |state, leased| Some(CancelFacts { state, leased });
        let table = [
            (None, None),
            (facts(State::Queued, Some(false)), cancelled.clone()),
            (facts(State::Queued, Some(true)), None),
            (facts(State::Queued, None), None),
            (facts(State::Failed, None), None),
            (facts(State::Cancelled, None), None),
            (facts(State::Delivered, Some(false)), None),
        ];
        for (found, expected) in table {
            assert_eq!(cancel(found), expected, "{found:?}");
        }
    }

    #[test]
    fn flush_makes_an_unheld_queued_job_due_now_never_later() {
        let facts = |state, due_at_ms, leased| {
            Some(FlushFacts {
                state,
                due_at_ms,
                leased,
            })
        };
        let flushed = |was: i64, due: i64, detail: &str| {
            Ok(Flushed {
                was_due_at_ms: was,
                due_at_ms: due,
                detail: detail.into(),
            })
        };
        let table = [
            (None, Err(Flush::NotFound)),
            (
                facts(State::Failed, None, false),
                Err(Flush::NotQueued(State::Failed)),
            ),
            (
                facts(State::Queued, None, false),
                Err(Flush::NotQueued(State::Queued)),
            ),
            (facts(State::Queued, Some(5_000), true), Err(Flush::Leased)),
            (
                facts(State::Queued, Some(7_500), false),
                flushed(7_500, 1_000, "was due in 7s"),
            ),
            (
                facts(State::Queued, Some(500), false),
                flushed(500, 500, "was already due"),
            ),
        ];
        for (found, expected) in table {
            assert_eq!(flush(found, 1_000), expected, "{found:?}");
        }
    }

    #[test]
    fn settle_writes_by_outcome() {
        let accepted = AttemptResult {
            outcome: OutcomeKind::Accepted,
            phase: None,
            code: Some(250),
            reply: "250 2.0.0 Ok: queued as ABC123".into(),
        };
        let dsn = test_record("dsn", "k");
        let table = [
            (
                Settle::Retry {
                    after: Duration::from_secs(9),
                    dsn: None,
                },
                Some(Duration::from_secs(9)),
                None,
                false,
                false,
            ),
            (
                Settle::Retry {
                    after: Duration::from_secs(9),
                    dsn: Some(Box::new(dsn.clone())),
                },
                Some(Duration::from_secs(9)),
                None,
                true,
                false,
            ),
            (
                Settle::Delivered {
                    upstream_reply: "250 ok".into(),
                    dsn: None,
                },
                None,
                Some((State::Delivered, "250 ok")),
                false,
                false,
            ),
            (
                Settle::Unresolved {
                    upstream_reply: "lost".into(),
                },
                None,
                Some((State::Unresolved, "lost")),
                false,
                true,
            ),
            (
                Settle::Failed {
                    upstream_reply: "550 no".into(),
                    dsn: Some(Box::new(dsn.clone())),
                },
                None,
                Some((State::Failed, "550 no")),
                true,
                false,
            ),
        ];
        for (request, retry_after, finish, with_dsn, unresolved) in &table {
            let got = settle(None, request);
            assert_eq!(got.retry_after, *retry_after, "{request:?}");
            assert_eq!(got.finish, *finish, "{request:?}");
            assert_eq!(got.dsn.is_some(), *with_dsn, "{request:?}");
            assert_eq!(got.unresolved, *unresolved, "{request:?}");
            assert_eq!(got.upstream_id, None);
            assert_eq!(got.late_match(), *unresolved, "{request:?}");
        }
        let got = settle(Some(&accepted), &table[1].0);
        assert_eq!(
            got.upstream_id,
            accepted_upstream_id(&accepted),
            "an accepted attempt keeps the upstream's id"
        );
        assert_eq!(got.late_match(), got.upstream_id.is_some());
    }

    #[test]
    fn damaged_records_fail_and_keep_the_reason() {
        let finish = damaged("m1", "checksum mismatch");
        assert_eq!(finish.state, State::Failed);
        assert!(finish.upstream_reply.contains("checksum mismatch"));
        assert!(finish.close_open_intents);
    }

    #[test]
    fn a_requeued_job_starts_its_tokens_above_any_earlier_round() {
        let requeued_at = 1_800_000_000_000;
        let earlier_round = requeued_token_base(requeued_at - 1) + 1_000_000;
        assert!(requeued_token_base(requeued_at) > earlier_round);
        assert!(
            requeued_token_base(requeued_at) > 1_000_000,
            "above an intake row's tokens"
        );
    }
}
