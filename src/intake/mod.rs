//! Intake: a finished message becomes exactly one durable record, or a replay of one.

pub(crate) mod fields;
pub(crate) use idemrelay_model::fingerprint;
pub mod key;
pub mod message;
pub mod parts;
mod waiting;

#[cfg(test)]
mod fingerprint_tests;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::mail::Submission;
use crate::mail::{Fingerprint, MissingKey};
use crate::metrics::Metrics;
use crate::reply::Reply;
use crate::store::{Existing, Insert, NewRecord, State, Store, StoreHealth};
use fingerprint::{fingerprint, key_fingerprint, message_fingerprint};
use key::{derive_key, key_field, read_key_header, upstream_key, IdemKey, KeyHeader, KeySource};
use message::{
    bounded_header_section, has_header_section, scan_headers, with_relay_headers, ReceivedLine,
};
use parts::{choose_part, PartChoice};

#[derive(Debug, Clone)]
pub(crate) struct IntakeSettings {
    pub hostname: String,
    pub missing_key: MissingKey,
    pub retention: crate::store::Retention,
    /// How long a submission waits for a concurrent one with the same key to commit.
    pub in_progress_wait: Duration,
    /// Each scope's upstream key space (`KeySpaces`): at start; a users file reload
    /// replaces it (`Intake::set_key_spaces`).
    pub key_spaces: KeySpaces,
    /// `log_recipients`: the submission line carries the envelope.
    pub log_recipients: bool,
}

/// Where each scope's mail goes, as the key the upstream sees needs it: `Some(key space)` for
/// a scope alone on its upstream in this instance's config, which may then send its clients'
/// keys unchanged if the store says it owns that key space (`Store::claim_key_space`); `None`
/// for a scope sharing its upstream with another here, whose keys always carry the scope.
/// A scope missing from the map is treated as sharing.
pub(crate) type KeySpaces = std::collections::BTreeMap<String, Option<String>>;

/// Who submitted: decides the scope and the trace line.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub scope: String,
    pub peer: IpAddr,
}

/// What happened to a submission, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubmissionResult {
    Accepted,
    Replayed,
    Conflict,
    InProgress,
    InvalidKey,
    Rejected,
    Unavailable,
}

impl SubmissionResult {
    pub(crate) const ALL: [SubmissionResult; 7] = [
        SubmissionResult::Accepted,
        SubmissionResult::Replayed,
        SubmissionResult::Conflict,
        SubmissionResult::InProgress,
        SubmissionResult::InvalidKey,
        SubmissionResult::Unavailable,
        SubmissionResult::Rejected,
    ];

    /// The metric's `result` label: underscores, as Prometheus label values conventionally
    /// use (the log's `as_str` has hyphens).
    pub(crate) fn label(self) -> &'static str {
        match self {
            SubmissionResult::Accepted => "accepted",
            SubmissionResult::Replayed => "replayed",
            SubmissionResult::Conflict => "conflict",
            SubmissionResult::InProgress => "in_progress",
            SubmissionResult::InvalidKey => "invalid_key",
            SubmissionResult::Unavailable => "unavailable",
            SubmissionResult::Rejected => "rejected",
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SubmissionResult::Accepted => "accepted",
            SubmissionResult::Replayed => "replayed",
            SubmissionResult::Conflict => "conflict",
            SubmissionResult::InProgress => "in-progress",
            SubmissionResult::InvalidKey => "invalid-key",
            SubmissionResult::Rejected => "rejected",
            SubmissionResult::Unavailable => "unavailable",
        }
    }
}

pub struct Intake {
    store: Arc<dyn Store>,
    settings: IntakeSettings,
    /// Keys being committed by this process; the sender half is dropped when the attempt ends.
    in_flight: Mutex<HashMap<(String, String), watch::Receiver<()>>>,
    /// Set by every commit's result; read by the listeners and `/readyz`.
    store_health: Arc<StoreHealth>,
    /// Wakes the delivery workers after a commit.
    delivery_hint: Arc<Notify>,
    metrics: Arc<Metrics>,
    /// `settings.key_spaces`, or the latest from a users file reload.
    key_spaces: std::sync::RwLock<KeySpaces>,
    /// The store's answers to `claim_key_space`, per (scope, key space): they never change,
    /// so each is asked once per process.
    key_space_owned: Mutex<HashMap<(String, String), bool>>,
    /// The before-queue mode's clients waiting for a verdict here: a retry of one of their
    /// records waits for that answer and replays it (docs/guides/before-queue.md).
    before_queue: Option<Arc<crate::delivery::immediate::BeforeQueue>>,
}

/// What `submit_inner` decided, with what it read on the way.
struct Handled {
    answer: ClientAnswer,
    key: Option<IdemKey>,
    waiter: Option<crate::delivery::immediate::Waiter>,
    seen: MessageIdSeen,
}

impl Handled {
    /// Refused before the header section could be read.
    fn refused_unscanned(reply: Reply) -> Self {
        Handled {
            answer: ClientAnswer::refused(reply, SubmissionResult::Rejected),
            key: None,
            waiter: None,
            seen: MessageIdSeen::NotScanned,
        }
    }
}

/// The Message-ID as the decision's header scan found it, so the log line does not parse the
/// headers a second time.
enum MessageIdSeen {
    /// Refused before the scan: the log line reads the header section itself (bounded).
    NotScanned,
    Scanned(Option<String>),
}

/// Removes the in-flight entry (waking the waiters) however the attempt ends.
struct InFlight<'a> {
    intake: &'a Intake,
    slot: (String, String),
    _done: watch::Sender<()>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.intake.in_flight.lock() {
            map.remove(&self.slot);
        }
    }
}

enum Claim<'a> {
    Mine(InFlight<'a>),
    Wait(watch::Receiver<()>),
}

/// The key a submission is stored under, with why.
enum Resolved {
    Keyed(IdemKey),
    Unkeyed,
    Refused(Reply, SubmissionResult),
}

impl Intake {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        settings: IntakeSettings,
        delivery_hint: Arc<Notify>,
        store_health: Arc<StoreHealth>,
    ) -> Self {
        Intake {
            store,
            key_spaces: std::sync::RwLock::new(settings.key_spaces.clone()),
            key_space_owned: Mutex::new(HashMap::new()),
            settings,
            delivery_hint,
            in_flight: Mutex::new(HashMap::new()),
            store_health,
            metrics: Arc::new(Metrics::default()),
            before_queue: None,
        }
    }

    /// Counts submissions into the relay's registry instead of a private one.
    pub(crate) fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Takes the key spaces of a reloaded users file. A scope that shares its upstream in
    /// either the old or the new map shares it from now on: a session authenticated before
    /// the reload may still submit under a scope the new file dropped, and its keys must stay
    /// apart too.
    pub(crate) fn set_key_spaces(&self, new: KeySpaces) {
        let mut current = self.key_spaces.write().unwrap_or_else(|e| e.into_inner());
        for (scope, space) in new {
            let kept = match current.get(&scope) {
                Some(None) => None,
                Some(Some(old)) if Some(old) != space.as_ref() => None,
                _ => space,
            };
            current.insert(scope, kept);
        }
    }

    /// Whether part 1 of `scope`'s header keys reaches its upstream unchanged: the scope is
    /// alone on its upstream here, and the store records it as the owner of that upstream's
    /// key space (the first scope of the whole deployment to claim it). Decided per scope for
    /// every instance alike, never from one instance's config alone.
    async fn keeps_client_keys(&self, scope: &str) -> Result<bool, crate::store::StoreError> {
        let space = self
            .key_spaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(scope)
            .cloned()
            .flatten();
        let Some(space) = space else {
            return Ok(false);
        };
        let slot = (scope.to_string(), space);
        if let Some(owned) = self.key_space_owned.lock().expect("key spaces").get(&slot) {
            return Ok(*owned);
        }
        let owner = self.store.claim_key_space(&slot.1, scope).await?;
        let owned = owner == scope;
        if !owned {
            tracing::info!(target: "idemrelay::intake", scope, key_space = %slot.1, owner = %owner, "another scope sends its keys to this upstream unchanged; this scope's keys carry the scope");
        }
        self.key_space_owned
            .lock()
            .expect("key spaces")
            .insert(slot, owned);
        Ok(owned)
    }

    /// Decides the reply to the end of DATA. A positive reply is returned only after the
    /// record is committed.
    pub(crate) async fn submit(
        &self,
        origin: &Origin,
        sub: &Submission,
    ) -> (Reply, SubmissionResult) {
        let (reply, outcome, _) = self.submit_with(origin, sub, false).await;
        (reply, outcome)
    }

    async fn submit_with(
        &self,
        origin: &Origin,
        sub: &Submission,
        waiting: bool,
    ) -> (
        Reply,
        SubmissionResult,
        Option<crate::delivery::immediate::Waiter>,
    ) {
        let Handled {
            answer,
            key,
            waiter,
            seen,
        } = self.submit_inner(origin, sub, waiting).await;
        let ClientAnswer { reply, outcome, id } = answer;
        // The Message-ID identifies the message to its sender's people. The decision's own
        // scan of the header section gives it; a message refused before that scan has its
        // header section read here (bounded). Parsing the headers twice per message was a
        // measurable share of the relay's CPU.
        let message_id = match seen {
            MessageIdSeen::Scanned(message_id) => message_id,
            MessageIdSeen::NotScanned => bounded_header_section(&sub.message)
                .and_then(|len| scan_headers(&sub.message[..len]).message_id),
        }
        .unwrap_or_else(|| "-".to_string());
        // Display (`%`) for every value: the human format then writes `id=X`, never
        // `id="X"`, so `grep 'id=X'` finds this line and every delivery line alike.
        tracing::info!(
            target: "idemrelay::submission",
            id = %id.as_deref().unwrap_or("-"),
            scope = %origin.scope,
            key = %key.as_ref().map_or("-", |k| k.value.as_str()),
            key_source = %key.as_ref().map_or("none", |k| k.source.as_str()),
            result = %outcome.as_str(),
            client = %origin.peer,
            helo = %sub.helo,
            user = %sub.auth_user.as_deref().unwrap_or("-"),
            message_id = %message_id,
            size = sub.message.len(),
            recipients = sub.envelope.rcpt_to.len(),
            from = self
                .settings
                .log_recipients
                .then(|| tracing::field::display(&sub.envelope.mail_from)),
            to = self
                .settings
                .log_recipients
                .then(|| tracing::field::display(sub.envelope.rcpt_to.join(","))),
            code = reply.code,
            reply = %reply.line(),
            "submission"
        );
        self.metrics.submission(outcome.label());
        if outcome == SubmissionResult::Replayed {
            self.count_replay(&origin.scope).await;
        }
        (reply, outcome, waiter)
    }

    /// Bookkeeping for `idemrelay report`: bounded in time and never able to turn the
    /// replay, already decided, into an error.
    async fn count_replay(&self, scope: &str) {
        let limit = self.settings.in_progress_wait.min(Duration::from_secs(1));
        let write = self.store.record_replay(scope, crate::store::now_ms());
        let failure = match tokio::time::timeout(limit, write).await {
            Ok(Ok(())) => return,
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {limit:?}"),
        };
        self.metrics.replay_count_failed();
        tracing::warn!(target: "idemrelay::store", scope, error = %failure, "replay answered but not counted for the report");
    }

    async fn submit_inner(&self, origin: &Origin, sub: &Submission, waiting: bool) -> Handled {
        if !has_header_section(&sub.message) {
            return Handled::refused_unscanned(Reply::no_header_section());
        }
        let Some(header_len) = bounded_header_section(&sub.message) else {
            return Handled::refused_unscanned(Reply::header_section_too_large());
        };
        let scan = scan_headers(&sub.message[..header_len]);
        let seen = MessageIdSeen::Scanned(scan.message_id.clone());
        let fp = fingerprint(&origin.scope, &sub.envelope, &sub.message);
        let key = match self.resolve_key(origin, sub, &scan, &fp) {
            Resolved::Refused(reply, outcome) => {
                return Handled {
                    answer: ClientAnswer::refused(reply, outcome),
                    key: None,
                    waiter: None,
                    seen,
                }
            }
            Resolved::Keyed(key) => Some(key),
            Resolved::Unkeyed => None,
        };
        let id = crate::mail::new_queue_id(crate::store::now_ms());
        // Registered before the commit: whoever sees the record sees that its client waits.
        let mut waiter = match &self.before_queue {
            Some(before_queue) if waiting => Some(before_queue.registry.register(&id)),
            _ => None,
        };
        let message_fp = message_fingerprint(&origin.scope, &sub.envelope, &sub.message);
        let facts = RecordFacts {
            origin,
            sub,
            scan: &scan,
            fingerprint: fp,
            message_fp,
            key: key.as_ref(),
            id: &id,
        };
        let mut decision = match &key {
            None => self.insert_unkeyed(&self.record(&facts, 1, false)).await,
            Some(key) => self.insert_keyed(&facts, key).await,
        };
        // Only a failed write or a committed one says anything about the store's health.
        match decision.outcome {
            SubmissionResult::Unavailable => {
                self.store_health.record(false);
            }
            SubmissionResult::Accepted => {
                failpoint!("intake.after_commit");
                self.store_health.record(true);
                if waiter.is_none() {
                    self.delivery_hint.notify_waiters();
                }
            }
            SubmissionResult::Replayed => {
                decision = self
                    .after_verdict(&origin.scope, key.as_ref(), decision)
                    .await;
            }
            _ => {}
        }
        if decision.outcome != SubmissionResult::Accepted {
            // Not this submission's record: its slot goes (dropping it answers nothing).
            waiter = None;
        }
        Handled {
            answer: decision,
            key,
            waiter,
            seen,
        }
    }

    fn resolve_key(
        &self,
        origin: &Origin,
        sub: &Submission,
        scan: &message::HeaderScan,
        fp: &Fingerprint,
    ) -> Resolved {
        if scan.key_ambiguous {
            return Resolved::Refused(
                Reply::key_in_malformed_header_section(),
                SubmissionResult::InvalidKey,
            );
        }
        match read_key_header(&scan.key_values) {
            KeyHeader::Invalid => {
                Resolved::Refused(Reply::key_invalid(), SubmissionResult::InvalidKey)
            }
            KeyHeader::Present(value) => {
                Resolved::Keyed(IdemKey::from_header(value, &scan.key_values))
            }
            KeyHeader::Absent => match self.settings.missing_key {
                MissingKey::Derive => Resolved::Keyed(derive_key(
                    &origin.scope,
                    scan.message_id.as_deref(),
                    &sub.envelope,
                    // Without the delivery requests: other requests are a conflict, not a
                    // second message.
                    &if sub.envelope.requests.is_empty() {
                        *fp
                    } else {
                        key_fingerprint(&origin.scope, &sub.envelope, &sub.message)
                    },
                )),
                MissingKey::Pass => Resolved::Unkeyed,
                MissingKey::Reject => {
                    Resolved::Refused(Reply::key_required(), SubmissionResult::InvalidKey)
                }
            },
        }
    }

    /// The record for part `part` of the submission: the stored bytes carry that part's
    /// upstream key, so each part number renders its own. `keeps_client_key`: part 1 of a
    /// header key reaches the upstream unchanged (`keeps_client_keys`).
    fn record(&self, facts: &RecordFacts<'_>, part: u32, keeps_client_key: bool) -> NewRecord {
        let RecordFacts {
            origin, sub, scan, ..
        } = *facts;
        let upstream_key = facts
            .key
            .map(|k| upstream_key(&origin.scope, k, part, keeps_client_key));
        let (state, reply, content) = if scan.has_from {
            let received = ReceivedLine {
                helo: &sub.helo,
                peer: origin.peer,
                hostname: &self.settings.hostname,
                protocol: &protocol_name(sub),
                id: facts.id,
                unix_time: crate::store::now_ms() / 1000,
            }
            .render();
            // The upstream sees its own key whenever it is not the client's header as sent.
            let client_fields = scan.key_fields.as_slice();
            let (key_line, replaced) = match (facts.key, upstream_key.as_deref()) {
                (Some(k), Some(up)) if k.source != KeySource::Header => {
                    (Some(up.to_string()), &[][..])
                }
                (Some(k), Some(up)) if up != k.value => {
                    (Some(key_field(up, k.encoded)), client_fields)
                }
                // The client's key in encoded words: written plain when it can be (ASCII), so
                // that every reader finds it, whether it decodes encoded words or not. A
                // non-ASCII key could only be written encoded again: the client's field stays.
                (Some(k), Some(_)) if k.encoded && key_field(&k.value, true) == k.value => {
                    (Some(k.value.clone()), client_fields)
                }
                _ => (None, &[][..]),
            };
            let content =
                with_relay_headers(&sub.message, &received, key_line.as_deref(), replaced);
            (State::Queued, Reply::queued(facts.id), Some(content))
        } else {
            // Stored (not only answered) so a retry replays it and the key stays bound to it.
            (State::Rejected, Reply::no_from_header(), None)
        };
        NewRecord {
            id: facts.id.to_string(),
            scope: origin.scope.clone(),
            key: facts.key.map(|k| k.value.clone()),
            key_source: facts.key.map(|k| k.source),
            fingerprint: facts.fingerprint,
            envelope: sub.envelope.clone(),
            size: content.as_ref().map_or(sub.message.len(), Vec::len),
            content,
            state,
            reply: reply.line(),
            dsn_of: None,
            part,
            message_fp: facts.message_fp,
            upstream_key,
            message_id: scan
                .message_id
                .as_deref()
                .and_then(crate::store::webhook::normalize_message_id),
        }
    }

    async fn insert_unkeyed(&self, record: &NewRecord) -> ClientAnswer {
        if record.state == State::Rejected {
            return ClientAnswer::refused(Reply::no_from_header(), SubmissionResult::Rejected);
        }
        let started = std::time::Instant::now();
        match self.store.insert(record, self.settings.retention).await {
            Ok(_) => {
                self.metrics.intake_commit(started.elapsed());
                ClientAnswer::inserted(record)
            }
            Err(err) => unavailable(&err),
        }
    }

    /// Becomes the one attempt in this process for the key, or learns whom to wait for.
    fn claim(&self, slot: &(String, String)) -> Claim<'_> {
        let mut map = self.in_flight.lock().expect("in-flight map poisoned");
        if let Some(rx) = map.get(slot) {
            return Claim::Wait(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        map.insert(slot.clone(), rx);
        Claim::Mine(InFlight {
            intake: self,
            slot: slot.clone(),
            _done: tx,
        })
    }

    async fn insert_keyed(&self, facts: &RecordFacts<'_>, key: &IdemKey) -> ClientAnswer {
        let mut part = 1;
        // Before encoded words were decoded, a key spelled in them was stored as spelled. A
        // retry of such a record must replay it and another message under it is a reuse, as
        // before the upgrade; one more part of a split message (disjoint recipients) is stored
        // under the decoded key. Costs a lookup only for encoded keys, and finds nothing once
        // the records from before have expired.
        if let Some(spelled) = &key.undecoded {
            let record = self.record(facts, 1, false);
            match self
                .store
                .lookup(&record.scope, spelled, self.settings.retention)
                .await
            {
                Ok(parts) if !parts.is_empty() => {
                    if let Ok(decision) = self.choose(&record, key, &parts) {
                        return decision;
                    }
                }
                Ok(_) => {}
                Err(err) => return unavailable(&err),
            }
        }
        let slot = (facts.origin.scope.clone(), key.value.clone());
        // A few rounds: the other attempt may end without a record, and parts racing on other
        // instances may take the part number we tried.
        for _ in 0..4 {
            let mut rx = match self.claim(&slot) {
                Claim::Mine(_guard) => {
                    // Asked of the store once this submission holds the key here, so that a
                    // retry of it waits for it (E01004) instead of for the store.
                    let keeps = match key.source {
                        KeySource::Header => match self.keeps_client_keys(&slot.0).await {
                            Ok(keeps) => keeps,
                            Err(err) => return unavailable(&err),
                        },
                        _ => false,
                    };
                    let mut record = self.record(facts, part, keeps);
                    // Each round may lose its part number to a part another instance commits
                    // meanwhile (`choose` then names the next one). Eight rounds outlast any
                    // number of instances racing one split message; past them the client is
                    // told to retry (E01004), never given a wrong answer.
                    for _ in 0..8 {
                        let started = std::time::Instant::now();
                        match self.store.insert(&record, self.settings.retention).await {
                            Ok(Insert::Inserted) => {
                                self.metrics.intake_commit(started.elapsed());
                                return ClientAnswer::inserted(&record);
                            }
                            Ok(Insert::Existing(parts)) => {
                                match self.choose(&record, key, &parts) {
                                    Ok(decision) => return decision,
                                    Err(next) => {
                                        part = next;
                                        record = self.record(facts, part, keeps);
                                    }
                                }
                            }
                            Err(err) => return unavailable(&err),
                        }
                    }
                    return ClientAnswer::refused(
                        Reply::key_in_progress(),
                        SubmissionResult::InProgress,
                    );
                }
                Claim::Wait(rx) => rx,
            };
            let finished = tokio::time::timeout(self.settings.in_progress_wait, rx.changed()).await;
            // What `choose` compares (fingerprints, recipients) is the same whatever the
            // upstream key, so this rendering's is not asked of the store.
            let record = self.record(facts, part, false);
            match self
                .store
                .lookup(&record.scope, &key.value, self.settings.retention)
                .await
            {
                Ok(parts) if parts.is_empty() => {
                    if finished.is_err() {
                        return ClientAnswer::refused(
                            Reply::key_in_progress(),
                            SubmissionResult::InProgress,
                        );
                    }
                }
                Ok(parts) => match self.choose(&record, key, &parts) {
                    Ok(decision) => return decision,
                    Err(next) => part = next,
                },
                Err(err) => return unavailable(&err),
            }
        }
        ClientAnswer::refused(Reply::key_in_progress(), SubmissionResult::InProgress)
    }

    /// The answer for a submission under a taken key, or the part number to store it as.
    fn choose(
        &self,
        record: &NewRecord,
        key: &IdemKey,
        parts: &[Existing],
    ) -> Result<ClientAnswer, u32> {
        match choose_part(
            &record.fingerprint,
            &record.message_fp,
            &record.envelope.rcpt_to,
            parts,
        ) {
            PartChoice::Replay(existing) => Ok(replay(existing)),
            PartChoice::Reuse => Ok(ClientAnswer::refused(
                Reply::key_reuse(key.source == KeySource::MessageId),
                SubmissionResult::Conflict,
            )),
            PartChoice::New(part) => Err(part),
        }
    }
}

/// What every part's record is made of.
struct RecordFacts<'a> {
    origin: &'a Origin,
    sub: &'a Submission,
    scan: &'a message::HeaderScan,
    fingerprint: Fingerprint,
    message_fp: Fingerprint,
    key: Option<&'a IdemKey>,
    id: &'a str,
}

/// A retry of a stored record: its original reply, replayed.
fn replay(existing: &Existing) -> ClientAnswer {
    let Some(original) = Reply::from_line(&existing.reply) else {
        // What the client was first told is not known: fail closed, never a 250.
        tracing::error!(target: "idemrelay::store", id = %existing.id, "stored reply unreadable; retry refused as store unavailable");
        return ClientAnswer::refused(Reply::store_unavailable(), SubmissionResult::Unavailable);
    };
    ClientAnswer {
        reply: original.replayed(),
        outcome: SubmissionResult::Replayed,
        id: Some(existing.id.clone()),
    }
}

/// The reply for a submission, what it was, and the record it refers to (if any).
struct ClientAnswer {
    reply: Reply,
    outcome: SubmissionResult,
    id: Option<String>,
}

impl ClientAnswer {
    fn refused(reply: Reply, outcome: SubmissionResult) -> Self {
        ClientAnswer {
            reply,
            outcome,
            id: None,
        }
    }

    fn inserted(record: &NewRecord) -> Self {
        let (reply, outcome) = if record.state == State::Rejected {
            (Reply::no_from_header(), SubmissionResult::Rejected)
        } else {
            (Reply::queued(&record.id), SubmissionResult::Accepted)
        };
        debug_assert_eq!(reply.line(), record.reply);
        ClientAnswer {
            reply,
            outcome,
            id: Some(record.id.clone()),
        }
    }
}

fn unavailable(err: &crate::store::StoreError) -> ClientAnswer {
    tracing::error!(target: "idemrelay::store", error = %err, "store write failed; message not accepted");
    ClientAnswer::refused(Reply::store_unavailable(), SubmissionResult::Unavailable)
}

/// The `with` clause of the trace line (RFC 3848, RFC 6531).
fn protocol_name(sub: &Submission) -> String {
    if !sub.esmtp {
        return "SMTP".into();
    }
    let base = if sub.envelope.smtputf8 {
        "UTF8SMTP"
    } else {
        "ESMTP"
    };
    let tls = if sub.tls { "S" } else { "" };
    let auth = if sub.auth_scope.is_some() { "A" } else { "" };
    format!("{base}{tls}{auth}")
}
