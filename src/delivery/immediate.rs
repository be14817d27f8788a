//! The before-queue mode (docs/guides/before-queue.md): after intake has committed a record,
//! its client waits (up to `before_queue_wait`) while the record is sent at once, and hears
//! the upstream's verdict instead of `250 queued`.
//!
//! The attempt is the delivery worker's own (intent, lease, decision, settle); this module
//! only decides, once and under one lock per record, whether the client still waits when the
//! verdict comes:
//!
//! - the verdict came first: it is stored (delivered, or failed without a bounce, with the
//!   reply the client hears as the record's reply) and only then told to the client;
//! - the bound passed first: the client hears `250 queued` (what the record says already) and
//!   the verdict, when it comes, takes the ordinary path (a failure gets its bounce).
//!
//! A retry of the same request in this process waits until that decision is made and then
//! replays what the record says, so it hears what the first client heard.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Notify};

use super::decide::Decision;
use super::outcome::EnhancedCode;
use super::retry::Next;
use crate::reply::Reply;
use crate::store::{AttemptResult, Claimed, OutcomeKind, Phase, Store};

/// What the client of a before-queue submission hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The upstream's verdict, stored as the record's reply.
    Answered(Reply),
    /// Ordinary delivery owns the message: the client hears `250 queued`, as stored.
    Queued,
    /// A verdict was taken but its write was not confirmed: the client hears what the store
    /// says.
    Unsure,
    /// A verdict was taken and is still being written when the client stops waiting for it:
    /// the client hears a 4xx (never `250 queued`: the verdict may yet be stored without a
    /// bounce), and its retry replays what was stored.
    NotYet,
}

/// How long a client whose verdict was taken waits for its write, at least: normally one
/// commit, but the write is retried while the lease lasts, which can be many minutes.
const WRITE_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// Registered; no worker of this process holds the record yet.
    Waiting,
    /// A worker of this process holds the record's lease and will send it.
    Claimed,
    /// The worker has a final verdict for the waiting client and is storing it.
    Taken,
    /// The client was answered `250 queued`; the attempt (if any) is an ordinary one.
    GaveUp,
    /// The verdict was stored and told.
    Done,
}

/// One record whose client waits for the upstream's verdict.
pub(crate) struct Slot {
    id: String,
    state: Mutex<SlotState>,
    verdict: watch::Sender<Option<Verdict>>,
    /// True once the client's answer is settled: retries replay the record after it.
    finished: watch::Sender<bool>,
}

/// The records of this process whose clients wait for a verdict, by id.
#[derive(Default)]
pub(crate) struct Registry {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waiting = self.slots.lock().map(|s| s.len()).unwrap_or(0);
        f.debug_struct("Registry")
            .field("waiting", &waiting)
            .finish()
    }
}

impl Registry {
    /// Registers `id` before its record is committed, so that no retry and no worker can see
    /// the record without seeing that its client waits.
    pub(crate) fn register(self: &Arc<Self>, id: &str) -> Waiter {
        let slot = Arc::new(Slot {
            id: id.to_string(),
            state: Mutex::new(SlotState::Waiting),
            verdict: watch::channel(None).0,
            finished: watch::channel(false).0,
        });
        self.slots
            .lock()
            .expect("before-queue registry")
            .insert(id.to_string(), slot.clone());
        Waiter {
            registry: self.clone(),
            slot,
        }
    }

    /// For a retry that found record `id`: what to wait for before replaying it, when its
    /// first client is still waiting for the upstream's verdict here.
    pub(crate) fn pending(&self, id: &str) -> Option<watch::Receiver<bool>> {
        let slots = self.slots.lock().expect("before-queue registry");
        slots.get(id).map(|slot| slot.finished.subscribe())
    }

    /// A worker of this process holds record `id`'s lease: when its client still waits, the
    /// worker answers it.
    pub(crate) fn claim(self: &Arc<Self>, id: &str) -> Option<Answering> {
        let slot = self
            .slots
            .lock()
            .expect("before-queue registry")
            .get(id)
            .cloned()?;
        let mut state = slot.state.lock().expect("before-queue slot");
        if *state != SlotState::Waiting {
            return None;
        }
        *state = SlotState::Claimed;
        drop(state);
        Some(Answering {
            registry: self.clone(),
            slot,
            answered: false,
        })
    }

    /// The immediate send could not lease record `id` (paused, or held elsewhere): unless a
    /// worker of this process holds it and will answer, the client hears `250 queued` now.
    pub(crate) fn not_sent(&self, id: &str) {
        let Some(slot) = self
            .slots
            .lock()
            .expect("before-queue registry")
            .get(id)
            .cloned()
        else {
            return;
        };
        let mut state = slot.state.lock().expect("before-queue slot");
        if *state == SlotState::Waiting {
            *state = SlotState::GaveUp;
            drop(state);
            slot.verdict.send_replace(Some(Verdict::Queued));
            self.finish(&slot);
        }
    }

    /// True while record `id`'s client still waits and no worker holds it.
    pub(crate) fn still_waiting(&self, id: &str) -> bool {
        let slots = self.slots.lock().expect("before-queue registry");
        slots.get(id).is_some_and(|slot| {
            *slot.state.lock().expect("before-queue slot") == SlotState::Waiting
        })
    }

    fn finish(&self, slot: &Arc<Slot>) {
        let mut slots = self.slots.lock().expect("before-queue registry");
        if slots.get(&slot.id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(&slot.id);
        }
        drop(slots);
        slot.finished.send_replace(true);
    }
}

/// The client's side of a slot. Dropped without an answer (the client went away, or the
/// record was not committed), the client counts as answered `250 queued`.
pub(crate) struct Waiter {
    registry: Arc<Registry>,
    slot: Arc<Slot>,
}

impl Waiter {
    /// Waits up to `bound` for the verdict. Once it has passed, the one decision is made under
    /// the slot's lock: a worker that has not taken a verdict yet gives its attempt to the
    /// ordinary path; one that has is storing it, and its answer is awaited (bounded by its
    /// lease, as every write of an attempt is).
    pub(crate) async fn verdict(&self, bound: Duration) -> Verdict {
        let mut rx = self.slot.verdict.subscribe();
        let within = tokio::time::timeout(bound, rx.wait_for(Option::is_some))
            .await
            .map(|seen| seen.map(|verdict| verdict.clone()));
        if let Ok(Ok(verdict)) = within {
            return verdict.unwrap_or(Verdict::Queued);
        }
        if self.give_up() {
            return Verdict::Queued;
        }
        let stored = tokio::time::timeout(bound.max(WRITE_WAIT), rx.wait_for(Option::is_some))
            .await
            .map(|seen| seen.map(|verdict| verdict.clone()));
        match stored {
            Ok(Ok(Some(verdict))) => verdict,
            Ok(_) => Verdict::Unsure,
            Err(_) => Verdict::NotYet,
        }
    }

    /// True when the client is answered `250 queued` now (no verdict was taken).
    fn give_up(&self) -> bool {
        let mut state = self.slot.state.lock().expect("before-queue slot");
        match *state {
            SlotState::Waiting | SlotState::Claimed => {
                *state = SlotState::GaveUp;
                drop(state);
                self.registry.finish(&self.slot);
                true
            }
            SlotState::GaveUp => true,
            SlotState::Taken | SlotState::Done => false,
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.slot.id
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // A verdict being stored finishes the slot itself once it is written.
        let _ = self.give_up();
    }
}

/// The worker's side of a slot, while it holds the record's lease.
pub(crate) struct Answering {
    registry: Arc<Registry>,
    slot: Arc<Slot>,
    answered: bool,
}

impl Answering {
    /// Called with a final verdict (delivered or failed): true when the client still waits,
    /// and the verdict is then the client's (stored with its reply, no bounce); false when
    /// the client was answered `250 queued` meanwhile, and the ordinary path applies.
    pub(crate) fn take(&self) -> bool {
        let mut state = self.slot.state.lock().expect("before-queue slot");
        if *state == SlotState::Claimed {
            *state = SlotState::Taken;
            return true;
        }
        false
    }

    /// Tells the client the outcome of the write of a taken verdict: `Some(true)` it was
    /// stored, `Some(false)` the lease was lost before, `None` the write failed.
    pub(crate) fn stored(mut self, reply: Reply, written: Option<bool>) {
        let verdict = match written {
            Some(true) => Verdict::Answered(reply),
            // The new holder decides; the record's reply is still `250 queued`.
            Some(false) => Verdict::Queued,
            None => Verdict::Unsure,
        };
        self.answer(verdict);
    }

    fn answer(&mut self, verdict: Verdict) {
        self.answered = true;
        let mut state = self.slot.state.lock().expect("before-queue slot");
        if matches!(*state, SlotState::Claimed | SlotState::Taken) {
            *state = if verdict == Verdict::Queued {
                SlotState::GaveUp
            } else {
                SlotState::Done
            };
            drop(state);
            self.slot.verdict.send_replace(Some(verdict));
            self.registry.finish(&self.slot);
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if !self.answered {
            // No final verdict (retry, unknown, parked, lease lost): ordinary delivery owns it.
            let taken = *self.slot.state.lock().expect("before-queue slot") == SlotState::Taken;
            self.answer(if taken {
                Verdict::Unsure
            } else {
                Verdict::Queued
            });
        }
    }
}

/// The reply a waiting client hears for a final attempt result, or `None` when the result is
/// not one (only an accepted message or a permanent refusal is).
pub(crate) fn client_reply(id: &str, result: &AttemptResult) -> Option<Reply> {
    let upstream = one_line(&result.reply);
    match result.outcome {
        OutcomeKind::Accepted => Some(Reply::delivered_before_queue(id, &upstream)),
        // The relay itself declined to send (REQUIRETLS and an upstream that cannot honour
        // it): said as the relay's decision, not as the upstream's reply.
        OutcomeKind::Permanent
            if result.phase == Some(Phase::Ehlo)
                && result.reply == super::extensions::REQUIRETLS_REFUSED =>
        {
            Some(Reply::requiretls_refused_before_queue(id))
        }
        OutcomeKind::Permanent => {
            // After the final dot a server may answer only 550, 552 or 554 (RFC 5321 §4.3.2):
            // a refusal at MAIL or RCPT (553, 501, 555, ...) is passed on as 550 (554 after
            // the upstream's own dot), its enhanced code and text unchanged.
            let code = match result.code {
                Some(code @ (550 | 552 | 554)) => code,
                _ if result.phase == Some(Phase::Dot) => 554,
                _ => 550,
            };
            let enhanced = EnhancedCode::from_reply(&result.reply)
                .filter(|e| e.class == 5)
                .map_or_else(|| "5.0.0".to_string(), |e| e.to_string());
            Some(Reply::refused_before_queue(code, &enhanced, id, &upstream))
        }
        _ => None,
    }
}

/// The longest upstream text passed on to the client.
const MAX_UPSTREAM_TEXT: usize = 300;

/// An upstream reply as one printable ASCII line: line breaks and control characters become
/// spaces, runs of spaces one, anything else outside ASCII `?`, and at most
/// [`MAX_UPSTREAM_TEXT`] characters. The upstream's words reach our client, so they must not
/// be able to end our reply line or start another.
pub(crate) fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_UPSTREAM_TEXT));
    for c in text.chars() {
        let c = match c {
            ' '..='~' => c,
            c if c.is_control() || c.is_whitespace() => ' ',
            _ => '?',
        };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        if out.len() >= MAX_UPSTREAM_TEXT {
            break;
        }
        out.push(c);
    }
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    if out.is_empty() {
        out.push_str("(no text)");
    }
    out
}

/// The before-queue mode of one relay process: the registry, the bound, and the queue of
/// records to send at once (the immediate workers take from it).
pub(crate) struct BeforeQueue {
    pub registry: Arc<Registry>,
    /// How long a client waits for the verdict (`before_queue_wait`).
    pub wait: Duration,
    /// Upstream connections kept for immediate sends (`before_queue_connections`).
    pub connections: usize,
    requests: mpsc::Sender<String>,
    pub(crate) requests_rx: tokio::sync::Mutex<mpsc::Receiver<String>>,
    /// True once delivery workers run (an upstream is configured).
    delivering: AtomicBool,
    store: Arc<dyn Store>,
    hint: Arc<Notify>,
}

impl std::fmt::Debug for BeforeQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeforeQueue")
            .field("wait", &self.wait)
            .field("connections", &self.connections)
            .finish()
    }
}

impl BeforeQueue {
    pub(crate) fn new(
        wait: Duration,
        connections: usize,
        store: Arc<dyn Store>,
        hint: Arc<Notify>,
    ) -> Self {
        // Room for a burst of clients: a request that finds the queue full is answered
        // `250 queued` at once rather than waiting for room.
        let (requests, requests_rx) = mpsc::channel(1024);
        BeforeQueue {
            registry: Arc::default(),
            wait,
            connections: connections.max(1),
            requests,
            requests_rx: tokio::sync::Mutex::new(requests_rx),
            delivering: AtomicBool::new(false),
            store,
            hint,
        }
    }

    /// The delivery workers run: immediate sends can be made.
    pub(crate) fn set_delivering(&self) {
        self.delivering.store(true, Ordering::Relaxed);
    }

    /// The answer for a record intake has just committed (its `queued` reply, and the
    /// client's slot): the upstream's verdict when it comes within the bound, else `queued`.
    pub(crate) async fn answer(&self, queued: Reply, waiter: Waiter) -> Reply {
        let started = Instant::now();
        let id = waiter.id().to_string();
        // No upstream, or a queue of sends so long that it is full: ordinary delivery.
        let sendable =
            self.delivering.load(Ordering::Relaxed) && self.requests.try_send(id.clone()).is_ok();
        let verdict = if sendable {
            waiter.verdict(self.wait).await
        } else {
            Verdict::Queued
        };
        drop(waiter);
        let (reply, how) = match verdict {
            Verdict::Answered(reply) => (reply, "upstream"),
            Verdict::Queued => {
                // Ordinary delivery takes over: wake the workers.
                self.hint.notify_waiters();
                (queued, "queued")
            }
            Verdict::Unsure => (self.stored_reply(&id).await, "as-stored"),
            Verdict::NotYet => (Reply::verdict_not_recorded(&id), "not-yet-stored"),
        };
        tracing::info!(
            target: "idemrelay::submission",
            id = %id,
            answer = how,
            code = reply.code,
            reply = %reply.line(),
            waited_ms = started.elapsed().as_millis() as u64,
            "before-queue answer"
        );
        reply
    }

    /// What the record says the client was told, when the write of its verdict was not
    /// confirmed.
    async fn stored_reply(&self, id: &str) -> Reply {
        match self.store.message(id).await {
            Ok(Some(record)) => {
                Reply::from_line(&record.reply).unwrap_or_else(|| Reply::verdict_not_recorded(id))
            }
            _ => Reply::verdict_not_recorded(id),
        }
    }
}

/// The reply for a waiting client when `decision` is final (delivered, or failed for good)
/// and the client still waits: the verdict is then the client's. `None` otherwise: the
/// ordinary path applies (a failure gets its bounce).
pub(crate) fn answer_for_waiting_client(
    answering: &Answering,
    job: &Claimed,
    decision: &Decision,
) -> Option<Reply> {
    if !matches!(decision.next, Next::Delivered | Next::Failed) {
        return None;
    }
    let reply = client_reply(&job.id, &decision.row)?;
    answering.take().then_some(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(outcome: OutcomeKind, code: Option<u16>, reply: &str) -> AttemptResult {
        AttemptResult {
            outcome,
            phase: Some(Phase::Dot),
            code,
            reply: reply.into(),
        }
    }

    #[test]
    fn upstream_text_becomes_one_printable_line() {
        assert_eq!(
            one_line("550 5.1.1 no\r\n550 such\tuser \u{e9}"),
            "550 5.1.1 no 550 such user ?"
        );
        assert_eq!(one_line("\r\n"), "(no text)");
        assert_eq!(one_line(&"x".repeat(1000)).len(), MAX_UPSTREAM_TEXT);
    }

    #[test]
    fn the_client_hears_the_upstreams_code_and_enhanced_code() {
        let refused = client_reply(
            "ID",
            &result(OutcomeKind::Permanent, Some(554), "554 5.7.1 spam"),
        );
        assert_eq!(
            refused.unwrap().line(),
            "554 5.7.1 upstream refused ID (not delivered, no bounce will follow): 554 5.7.1 spam"
        );
        // A code the end of DATA may not carry: 550 before the upstream's dot, 554 after it.
        let at_rcpt = AttemptResult {
            phase: Some(Phase::Rcpt),
            ..result(OutcomeKind::Permanent, Some(553), "553 5.1.3 bad address")
        };
        assert_eq!(
            client_reply("ID", &at_rcpt).unwrap().line(),
            "550 5.1.3 upstream refused ID (not delivered, no bounce will follow): 553 5.1.3 bad address"
        );
        let odd_dot = client_reply(
            "ID",
            &result(OutcomeKind::Permanent, Some(557), "557 5.7.1 odd"),
        )
        .unwrap();
        assert!(odd_dot.line().starts_with("554 5.7.1 "), "{odd_dot:?}");
        // The relay's own REQUIRETLS refusal is worded as the relay's.
        let requiretls = AttemptResult {
            phase: Some(Phase::Ehlo),
            ..result(
                OutcomeKind::Permanent,
                Some(550),
                super::super::extensions::REQUIRETLS_REFUSED,
            )
        };
        let line = client_reply("ID", &requiretls).unwrap().line();
        assert!(
            line.starts_with("550 5.7.30 ") && !line.contains("upstream refused"),
            "{line}"
        );
        // No enhanced code, or one of the wrong class: 5.0.0.
        let bare =
            client_reply("ID", &result(OutcomeKind::Permanent, Some(550), "550 nope")).unwrap();
        assert!(bare.line().starts_with("550 5.0.0 "), "{bare:?}");
        let accepted = client_reply(
            "ID",
            &result(
                OutcomeKind::Accepted,
                Some(250),
                "250 2.0.0 Ok: queued as X",
            ),
        );
        assert_eq!(
            accepted.unwrap().line(),
            "250 2.0.0 OK delivered as ID; upstream: 250 2.0.0 Ok: queued as X"
        );
        assert!(client_reply(
            "ID",
            &result(OutcomeKind::Transient, Some(451), "451 later")
        )
        .is_none());
        assert!(client_reply("ID", &result(OutcomeKind::Unknown, None, "timeout")).is_none());
        // A stored answer replays: it parses back as the same reply.
        let line = bare.line();
        assert_eq!(Reply::from_line(&line).unwrap(), bare);
    }

    #[tokio::test]
    async fn the_bound_and_the_verdict_are_decided_once() {
        let registry = Arc::new(Registry::default());
        // The verdict is taken first: the client waits past the bound for it.
        let waiter = registry.register("A");
        let answering = registry.claim("A").expect("claimed");
        assert!(answering.take());
        let client = tokio::spawn(async move { waiter.verdict(Duration::from_millis(10)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let reply = Reply::delivered_before_queue("A", "250 ok");
        answering.stored(reply.clone(), Some(true));
        assert_eq!(client.await.unwrap(), Verdict::Answered(reply));
        assert!(registry.pending("A").is_none());

        // The bound passes first: the verdict that comes later is not the client's.
        let waiter = registry.register("B");
        let answering = registry.claim("B").expect("claimed");
        assert_eq!(
            waiter.verdict(Duration::from_millis(10)).await,
            Verdict::Queued
        );
        assert!(!answering.take());
        drop(answering);

        // Nobody claims it: not_sent answers queued at once.
        let waiter = registry.register("C");
        let pending = registry.pending("C").expect("pending");
        registry.not_sent("C");
        assert!(*pending.borrow());
        assert_eq!(
            waiter.verdict(Duration::from_secs(5)).await,
            Verdict::Queued
        );
        assert!(registry.claim("C").is_none());
    }
}
