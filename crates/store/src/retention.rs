//! How long records keep their keys (docs/concepts/contract.md "What the relay answers at the end of DATA"), decided once for the purge, the
//! insert's takeover of an expired key and the lookups, in Rust and as SQL.

use std::time::Duration;

use super::record::{retention_ms, State};

/// How long a terminal record keeps its key and replays (docs/concepts/contract.md "What the relay answers at the end of DATA").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A `delivered` or `rejected` record replays for at least this long after acceptance.
    pub replay: Duration,
    /// Any record's key stays taken until the upstream's window has closed on its last
    /// attempt: until then the upstream may still hold the key, and a new operation under it
    /// (other bytes: a new `Received:` line at least) would be refused there as a reuse.
    pub upstream_window: Duration,
    /// `failed` and `unresolved` records are parked for an operator this long after they
    /// were parked.
    pub parked: Duration,
}

impl Retention {
    /// One duration for everything and no upstream window (store tests).
    pub fn flat(d: Duration) -> Self {
        Retention {
            replay: d,
            upstream_window: Duration::ZERO,
            parked: d,
        }
    }

    /// Whether a record has expired: its key is free for a new operation and the record may
    /// be purged. Queued records never expire.
    pub(crate) fn expired(
        &self,
        state: State,
        accepted_at_ms: i64,
        finished_at_ms: Option<i64>,
        last_attempt_at_ms: Option<i64>,
        now_ms: i64,
    ) -> bool {
        let after = |from: i64, d: Duration| from.saturating_add(retention_ms(d)) <= now_ms;
        let own = match Kept::of(state) {
            None => return false,
            Some(Kept::Replayed) => after(accepted_at_ms, self.replay),
            Some(Kept::Parked) => after(finished_at_ms.unwrap_or(accepted_at_ms), self.parked),
        };
        own && last_attempt_at_ms.is_none_or(|at| after(at, self.upstream_window))
    }

    /// `expired` as an SQL condition on `messages m`, given the SQL text of its parameters
    /// (`?1` or `$1` style): now, replay, parked and upstream window, in milliseconds.
    /// The state lists come from `Kept::of`, the rule `expired` applies, so the two cannot
    /// disagree about a state.
    pub(crate) fn expired_sql(now: &str, replay: &str, parked: &str, window: &str) -> String {
        let [replayed, parked] = Self::expired_by_kind_sql(now, replay, parked, window);
        format!("(({replayed}) OR ({parked}))")
    }

    /// `expired_sql` as one condition per way a record is kept (replayed, then parked), for
    /// the purge, which deletes each kind alone: each condition is bounded by an index on its
    /// own. `accepted_at` stands alone on its side so that the index on `(state, accepted_at)`
    /// bounds the replayed records: written `accepted_at + replay`, the purge read every
    /// finished record, 1 s on a million-record SQLite store, in the writer, every
    /// `purge_interval`; and joined by OR, Postgres's planner read them all too (0.9 s and
    /// 200,000 buffers on a million records, beside intake).
    pub(crate) fn expired_by_kind_sql(
        now: &str,
        replay: &str,
        parked: &str,
        window: &str,
    ) -> [String; 2] {
        // Outside the upstream's window on its last attempt.
        let quiet = format!(
            "NOT EXISTS (SELECT 1 FROM attempts a
                         WHERE a.message_id = m.id AND a.started_at + {window} > {now})"
        );
        // `state <> 'queued'` is implied, and said for the planner: the state indexes hold
        // finished records only.
        [
            format!(
                "m.state <> 'queued' AND m.state IN ({}) AND m.accepted_at <= {now} - {replay}
                 AND {quiet}",
                Kept::Replayed.sql_states()
            ),
            format!(
                "m.state <> 'queued' AND m.state IN ({})
                 AND COALESCE(m.finished_at, m.accepted_at) + {parked} <= {now} AND {quiet}",
                Kept::Parked.sql_states()
            ),
        ]
    }

    /// The parameters of `expired_sql`, in its order.
    pub(crate) fn sql_params(&self) -> [i64; 3] {
        [
            retention_ms(self.replay),
            retention_ms(self.parked),
            retention_ms(self.upstream_window),
        ]
    }
}

/// Which clock a terminal record's retention runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// Replayed to retries for `replay` after acceptance.
    Replayed,
    /// Parked for an operator for `parked` after it was finished.
    Parked,
}

impl Kept {
    /// `None` for a queued record: it never expires.
    fn of(state: State) -> Option<Kept> {
        match state {
            State::Queued => None,
            State::Delivered | State::Rejected => Some(Kept::Replayed),
            State::Failed | State::Unresolved | State::Cancelled => Some(Kept::Parked),
        }
    }

    /// The terminal states kept this way, as an SQL list of string literals.
    fn sql_states(self) -> String {
        State::sql_list(
            State::TERMINAL
                .into_iter()
                .filter(|s| Kept::of(*s) == Some(self)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_expire_by_state_and_never_inside_the_upstream_window() {
        const H: i64 = 3_600_000;
        let r = Retention {
            replay: Duration::from_secs(3 * 3600),
            upstream_window: Duration::from_secs(3 * 3600),
            parked: Duration::from_secs(30 * 24 * 3600),
        };
        // (state, accepted, finished, last attempt, now, expired)
        let table = [
            (State::Queued, 0, None, None, 1000 * H, false),
            (State::Delivered, 0, Some(H), Some(H), 3 * H, false),
            // Replayed for 3 h, and the last attempt's window is over too.
            (State::Delivered, 0, Some(H), Some(0), 3 * H, true),
            // A late delivery: the key stays taken until its attempt's window closed.
            (State::Delivered, 0, Some(2 * H), Some(2 * H), 4 * H, false),
            (State::Delivered, 0, Some(2 * H), Some(2 * H), 5 * H, true),
            (State::Rejected, 0, None, None, 3 * H, true),
            (State::Rejected, 0, None, None, 3 * H - 1, false),
            // Parked at 2h50m: not gone ten minutes later, gone 30 days after parking.
            (
                State::Unresolved,
                0,
                Some(170 * 60_000),
                Some(0),
                3 * H,
                false,
            ),
            (
                State::Unresolved,
                0,
                Some(3 * H),
                Some(0),
                3 * H + 720 * H,
                true,
            ),
            (State::Failed, 0, Some(48 * H), Some(48 * H), 50 * H, false),
            (
                State::Failed,
                0,
                Some(48 * H),
                Some(48 * H),
                48 * H + 720 * H,
                true,
            ),
            (State::Failed, 0, None, None, 720 * H, true),
        ];
        for (state, accepted, finished, last, now, expired) in table {
            assert_eq!(
                r.expired(state, accepted, finished, last, now),
                expired,
                "{state:?} accepted {accepted} finished {finished:?} last {last:?} now {now}"
            );
        }
    }

    #[test]
    fn every_terminal_state_expires_on_exactly_one_clock() {
        for state in State::TERMINAL {
            assert!(Kept::of(state).is_some(), "{state:?}");
        }
        assert_eq!(Kept::of(State::Queued), None);
        assert_eq!(Kept::Replayed.sql_states(), "'delivered', 'rejected'");
        assert_eq!(
            Kept::Parked.sql_states(),
            "'failed', 'unresolved', 'cancelled'"
        );
    }
}
