//! The sink's idempotency record: the upstream side of the contract the relay relies on
//! (docs/guides/sink.md). Pure: the caller passes the clock in.
//!
//! A key's first transaction reserves the record before anything is committed, so a second
//! transaction under the same key sees "in progress" (E01004) until the first has committed and
//! its reply has been produced, the way Bird answers a request that overlaps a running one.
//! After that the record replays for `window` from acceptance; a different request under the
//! key is E01005. Once the window has passed the key starts a new operation.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;

pub(crate) type Fingerprint = [u8; 32];

/// What identifies one request: the envelope (MAIL FROM, the recipient set, the BODY=8BITMIME
/// and SMTPUTF8 parameters) and the message bytes, byte for byte. The recipients are a set:
/// the order of RCPT commands does not change the request.
pub(crate) fn fingerprint(
    mail_from: &str,
    rcpt_to: &[String],
    eightbitmime: bool,
    smtputf8: bool,
    message: &[u8],
) -> Fingerprint {
    let mut rcpts: Vec<&str> = rcpt_to.iter().map(String::as_str).collect();
    rcpts.sort_unstable();
    rcpts.dedup();
    let mut h = blake3::Hasher::new_derive_key("idemrelay sink request fingerprint v1");
    // Length prefixes keep field boundaries unambiguous.
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(mail_from.as_bytes());
    field(&(rcpts.len() as u64).to_le_bytes());
    for rcpt in rcpts {
        field(rcpt.as_bytes());
    }
    field(&[u8::from(eightbitmime), u8::from(smtputf8)]);
    field(message);
    *h.finalize().as_bytes()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No live record: the caller now holds a reservation under `id` and must `commit` or
    /// `abort` it.
    New,
    /// Same request within the window: answer with the original id, count nothing new.
    Replay { id: String },
    /// Same key, different request (E01005).
    KeyReuse,
    /// The first transaction under this key has not produced its reply yet (E01004).
    InProgress,
}

/// Per-key counts, as reported by `GET /stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KeyStats {
    /// Transactions that were committed as new messages (more than 1 only across windows).
    pub accepted: u64,
    /// Transactions answered from the record.
    pub replayed: u64,
    /// Every transaction under this key that reached the final dot, faulted ones included.
    pub transactions: u64,
    /// E01005 answers.
    pub conflicts: u64,
    /// E01004 answers.
    pub in_progress: u64,
}

#[derive(Debug, Clone)]
struct Record {
    id: String,
    fingerprint: Fingerprint,
    accepted_at: Instant,
    /// Reserved or committed, but the reply has not been produced yet.
    running: bool,
    committed: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct ReplayLedger {
    window: Duration,
    records: HashMap<String, Record>,
    keys: BTreeMap<String, KeyStats>,
}

impl ReplayLedger {
    pub(crate) fn new(window: Duration) -> Self {
        ReplayLedger {
            window,
            records: HashMap::new(),
            keys: BTreeMap::new(),
        }
    }

    fn live(&self, record: &Record, now: Instant) -> bool {
        record.running
            || record
                .accepted_at
                .checked_add(self.window)
                .is_none_or(|end| now < end)
    }

    /// Decides a transaction under `key`. On `New` a reservation under `id` is held.
    pub(crate) fn check(
        &mut self,
        key: &str,
        fingerprint: Fingerprint,
        id: &str,
        now: Instant,
    ) -> Verdict {
        let verdict = match self.records.get(key) {
            Some(rec) if self.live(rec, now) => {
                if rec.running {
                    Verdict::InProgress
                } else if rec.fingerprint == fingerprint {
                    Verdict::Replay { id: rec.id.clone() }
                } else {
                    Verdict::KeyReuse
                }
            }
            _ => Verdict::New,
        };
        let stats = self.keys.entry(key.to_string()).or_default();
        match &verdict {
            Verdict::New => {
                self.records.insert(
                    key.to_string(),
                    Record {
                        id: id.to_string(),
                        fingerprint,
                        accepted_at: now,
                        running: true,
                        committed: false,
                    },
                );
            }
            Verdict::Replay { .. } => stats.replayed += 1,
            Verdict::KeyReuse => stats.conflicts += 1,
            Verdict::InProgress => stats.in_progress += 1,
        }
        verdict
    }

    fn own(&mut self, key: &str, id: &str) -> Option<&mut Record> {
        self.records.get_mut(key).filter(|rec| rec.id == id)
    }

    /// The reserved message is stored: it counts as accepted from now on.
    pub(crate) fn commit(&mut self, key: &str, id: &str) {
        if let Some(rec) = self.own(key, id).filter(|rec| !rec.committed) {
            rec.committed = true;
            self.keys.entry(key.to_string()).or_default().accepted += 1;
        }
    }

    /// The reply for the committed message has been produced; retries now replay.
    pub(crate) fn settle(&mut self, key: &str, id: &str) {
        if let Some(rec) = self.own(key, id) {
            rec.running = false;
        }
    }

    /// The reservation failed before commit: the key is free again.
    pub(crate) fn abort(&mut self, key: &str, id: &str) {
        if self.own(key, id).is_some_and(|rec| !rec.committed) {
            self.records.remove(key);
        }
    }

    pub(crate) fn count_transaction(&mut self, key: &str) {
        self.keys.entry(key.to_string()).or_default().transactions += 1;
    }

    pub(crate) fn stats(&self) -> &BTreeMap<String, KeyStats> {
        &self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn fp(body: &str) -> Fingerprint {
        fingerprint("a@x", &["b@y".into()], false, false, body.as_bytes())
    }

    fn accept(ledger: &mut ReplayLedger, key: &str, body: &str, id: &str, now: Instant) {
        assert_eq!(ledger.check(key, fp(body), id, now), Verdict::New);
        ledger.commit(key, id);
        ledger.settle(key, id);
    }

    #[test]
    fn replay_conflict_and_window() {
        let t0 = Instant::now();
        let mut l = ReplayLedger::new(3 * HOUR);
        accept(&mut l, "k", "one", "S1", t0);
        assert_eq!(
            l.check("k", fp("one"), "S2", t0 + HOUR),
            Verdict::Replay { id: "S1".into() }
        );
        assert_eq!(l.check("k", fp("two"), "S3", t0 + HOUR), Verdict::KeyReuse);
        // The window runs from acceptance, not from the last replay.
        assert_eq!(
            l.check(
                "k",
                fp("one"),
                "S4",
                t0 + 3 * HOUR - Duration::from_millis(1)
            ),
            Verdict::Replay { id: "S1".into() }
        );
        accept(&mut l, "k", "two", "S5", t0 + 3 * HOUR);
        assert_eq!(
            l.check("k", fp("two"), "S6", t0 + 3 * HOUR),
            Verdict::Replay { id: "S5".into() }
        );
        assert_eq!(
            l.stats()["k"],
            KeyStats {
                accepted: 2,
                replayed: 3,
                transactions: 0,
                conflicts: 1,
                in_progress: 0
            }
        );
    }

    #[test]
    fn in_progress_until_settled_even_past_the_window() {
        let t0 = Instant::now();
        let mut l = ReplayLedger::new(Duration::from_secs(1));
        assert_eq!(l.check("k", fp("one"), "S1", t0), Verdict::New);
        assert_eq!(l.check("k", fp("one"), "S2", t0), Verdict::InProgress);
        l.commit("k", "S1");
        let later = t0 + Duration::from_secs(10);
        assert_eq!(l.check("k", fp("other"), "S3", later), Verdict::InProgress);
        // A stranger's id does not settle someone else's record.
        l.settle("k", "S3");
        assert_eq!(l.check("k", fp("one"), "S3", t0), Verdict::InProgress);
        l.settle("k", "S1");
        assert_eq!(
            l.check("k", fp("one"), "S4", t0),
            Verdict::Replay { id: "S1".into() }
        );
        assert_eq!(l.stats()["k"].in_progress, 3);
        assert_eq!(l.stats()["k"].accepted, 1);
    }

    #[test]
    fn abort_frees_the_key_and_counts_nothing() {
        let t0 = Instant::now();
        let mut l = ReplayLedger::new(HOUR);
        assert_eq!(l.check("k", fp("one"), "S1", t0), Verdict::New);
        l.abort("k", "S1");
        assert_eq!(l.check("k", fp("two"), "S2", t0), Verdict::New);
        l.commit("k", "S2");
        // Abort after commit is ignored: a committed message stays committed.
        l.abort("k", "S2");
        assert_eq!(l.check("k", fp("two"), "S3", t0), Verdict::InProgress);
        assert_eq!(l.stats()["k"].accepted, 1);
    }

    #[test]
    fn fingerprint_covers_envelope_and_every_byte() {
        let base = fingerprint("a@x", &["b@y".into(), "c@y".into()], false, false, b"m\r\n");
        assert_eq!(
            base,
            fingerprint("a@x", &["c@y".into(), "b@y".into()], false, false, b"m\r\n"),
            "recipient order is not part of the request"
        );
        for other in [
            fingerprint("a@z", &["b@y".into(), "c@y".into()], false, false, b"m\r\n"),
            fingerprint("a@x", &["b@y".into()], false, false, b"m\r\n"),
            fingerprint("a@x", &["b@y".into(), "c@y".into()], true, false, b"m\r\n"),
            fingerprint("a@x", &["b@y".into(), "c@y".into()], false, true, b"m\r\n"),
            fingerprint("a@x", &["b@y".into(), "c@y".into()], false, false, b"M\r\n"),
            // Field boundaries cannot be shifted between MAIL FROM and recipients.
            fingerprint("a@xb@y", &["c@y".into()], false, false, b"m\r\n"),
        ] {
            assert_ne!(base, other);
        }
    }
}
