//! What the sink has seen, shared by the SMTP connections, the HTTP API and the handle: the
//! accepted messages, every transaction that reached the final dot, the ledger and the fault
//! rules, behind one lock that is never held across an await.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::TlsAcceptor;

use super::config::SinkConfig;
use super::faults::{
    Context, FaultAction, FaultError, FaultRule, FaultSet, FaultStage, RuleStatus,
};
use super::key::SinkKey;
use super::ledger::{fingerprint, KeyStats, ReplayLedger, Verdict};
use super::life::{unix_ms, Down, Life};
use super::webhook::{self, Accepted};
use super::webhook_sender::{AttemptLog, AttemptOutcome, Sender, WebhookAttempt, WebhookStats};
use idemrelay_model::reply::Reply;
use idemrelay_smtp::framing::BodyFault;

/// A message the sink accepted (once per operation: replays are not messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    /// The sink's id, as given in `250 2.0.0 OK <id>`.
    pub id: String,
    /// The `X-Bird-Idempotency-Key` value, unfolded; `None` when the message had none.
    pub key: Option<String>,
    pub mail_from: String,
    /// In RCPT order, repeated recipients once.
    pub rcpt_to: Vec<String>,
    pub eightbitmime: bool,
    pub smtputf8: bool,
    /// The message exactly as received, after dot-unstuffing.
    pub bytes: Vec<u8>,
    /// Hex blake3 of `bytes`.
    pub blake3: String,
    pub received_at_ms: u64,
    pub tls: bool,
    pub auth_user: Option<String>,
    /// The MAIL FROM command line exactly as received (without its CRLF): what proves the
    /// parameters a client passed on.
    pub mail_command: String,
    /// The RCPT TO command lines as received, in order (repeated recipients included).
    pub rcpt_commands: Vec<String>,
}

/// How the sink decided a transaction that reached the final dot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DotDecision {
    /// Committed as a new message (even when a `drop` rule then withheld the reply).
    Accepted,
    /// Same key and request within the window: answered with the original id.
    Replayed,
    /// Same key, different request: E01005.
    KeyReuse,
    /// The first transaction under the key had not produced its reply yet: E01004.
    InProgress,
    /// The key header was empty, too long, had control characters or differing copies: E01001.
    InvalidKey,
    /// A line over 998 octets, a NUL, over SIZE, or the maildir write failed.
    Rejected,
    /// A `reply` or `disconnect` rule answered instead of the sink; nothing was committed.
    Faulted,
}

/// One transaction that reached the final dot, whatever became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    /// Order of arrival at the dot, from 1; not reset by `clear`.
    pub seq: u64,
    pub key: Option<String>,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub eightbitmime: bool,
    pub smtputf8: bool,
    /// The bytes as received after dot-unstuffing (empty when over SIZE).
    pub bytes: Vec<u8>,
    pub outcome: DotDecision,
    /// The sink id accepted or replayed.
    pub message_id: Option<String>,
    /// The reply line sent (or, for a delayed reply, about to be sent once the delay is
    /// over); `None` when the connection was closed without one.
    pub reply: Option<String>,
    /// The rule that fired at the dot, in CLI syntax.
    pub fault: Option<String>,
    pub received_at_ms: u64,
    pub tls: bool,
    pub auth_user: Option<String>,
    pub mail_command: String,
    pub rcpt_commands: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SinkStats {
    pub keys: BTreeMap<String, KeyStats>,
    /// Accepted messages.
    pub messages: usize,
    /// Transactions that reached the final dot.
    pub transactions: usize,
    /// TCP connections accepted.
    pub connections: u64,
    /// Event batches posted to `--webhook` (all zero without one).
    pub webhooks: WebhookStats,
}

pub(crate) enum Control {
    /// Open (rebind) or close the SMTP listening socket.
    Listen(bool, oneshot::Sender<std::io::Result<()>>),
}

struct Inner {
    ledger: ReplayLedger,
    faults: FaultSet,
    messages: Vec<ReceivedMessage>,
    transactions: Vec<Transaction>,
    connections: u64,
    next_message: u64,
    next_transaction: u64,
    webhook_attempts: Vec<WebhookAttempt>,
    /// `pending` is not kept here: the sender knows it.
    webhook_stats: WebhookStats,
    next_webhook_attempt: u64,
}

/// A transaction at its final dot, as the connection hands it over.
pub(crate) struct DotHandover {
    pub key: SinkKey,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub eightbitmime: bool,
    pub smtputf8: bool,
    pub bytes: Vec<u8>,
    pub body_fault: Option<BodyFault>,
    pub tls: bool,
    pub auth_user: Option<String>,
    pub mail_command: String,
    pub rcpt_commands: Vec<String>,
}

/// What the connection does after the dot.
pub(crate) struct DotPlan {
    /// `None`: close without replying.
    pub reply: Option<Reply>,
    pub delay: Option<Duration>,
    /// Held through a delayed reply: until it is dropped, retries under the key get E01004.
    pub running: Option<Running>,
}

/// A committed message whose reply is still being held back.
pub(crate) struct Running {
    shared: Arc<Shared>,
    key: String,
    id: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shared.lock().ledger.settle(&self.key, &self.id);
    }
}

pub(crate) struct Shared {
    pub config: SinkConfig,
    pub tls: Option<TlsAcceptor>,
    pub life: watch::Sender<Life>,
    /// How the sink last went down, for sessions that see it only after a resume.
    pub last_down: Mutex<Down>,
    pub control: mpsc::Sender<Control>,
    /// Bumped on every change, for the handle's `wait_for_*`.
    pub version: watch::Sender<u64>,
    /// Posts events for accepted messages, with `--webhook`.
    hooks: Option<Sender>,
    state: Mutex<Inner>,
    /// The maildir files this sink wrote and has not removed: the only ones a reset removes
    /// (the directory may hold anyone's files; a request must never delete those).
    written: Mutex<Vec<std::path::PathBuf>>,
}

fn body_fault_reply(fault: BodyFault) -> Reply {
    match fault {
        BodyFault::LineTooLong => Reply::new(550, "5.6.0 Message line longer than 998 octets"),
        BodyFault::Nul => Reply::new(554, "5.6.0 NUL octet in message"),
        BodyFault::TooBig => Reply::new(552, "5.3.4 Message size exceeds fixed maximum"),
    }
}

pub(crate) fn e01005() -> Reply {
    Reply::new(
        554,
        "5.6.0 X-Bird-Idempotency-Key already used for a different message \
         (E01005 IdempotencyKeyReuse)",
    )
}

pub(crate) fn e01004() -> Reply {
    Reply::new(
        451,
        "4.3.0 a message with this X-Bird-Idempotency-Key is still being processed \
         (E01004 RequestInProgress); retry later",
    )
}

pub(crate) fn e01001() -> Reply {
    Reply::new(
        554,
        "5.6.0 X-Bird-Idempotency-Key must be 1-255 printable characters (E01001); \
         message not accepted",
    )
}

/// Writes `<dir>/<id>.eml`; returns its path.
fn write_atomically(dir: &Path, id: &str, bytes: &[u8]) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write;
    // A reader listing `*.eml` never sees a half-written file.
    let tmp = dir.join(format!(".{id}.eml.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    let path = dir.join(format!("{id}.eml"));
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

impl AttemptLog for Shared {
    fn record(&self, mut attempt: WebhookAttempt) {
        let mut st = self.lock();
        attempt.seq = st.next_webhook_attempt;
        st.next_webhook_attempt += 1;
        st.webhook_stats.attempts += 1;
        match attempt.outcome {
            AttemptOutcome::Delivered => st.webhook_stats.delivered += 1,
            AttemptOutcome::GaveUp => st.webhook_stats.failed += 1,
            AttemptOutcome::AckLost | AttemptOutcome::Retrying => {}
        }
        st.webhook_attempts.push(attempt);
        drop(st);
        self.changed();
    }

    fn notify(&self) {
        self.changed();
    }

    fn life(&self) -> watch::Receiver<Life> {
        self.life.subscribe()
    }
}

impl Shared {
    pub(crate) fn new(
        config: SinkConfig,
        tls: Option<TlsAcceptor>,
        control: mpsc::Sender<Control>,
        hooks: Option<Sender>,
    ) -> Result<Self, FaultError> {
        let faults = FaultSet::new(config.faults.clone())?;
        Ok(Shared {
            tls,
            life: watch::Sender::new(Life::Up),
            last_down: Mutex::new(Down::Refuse),
            control,
            version: watch::Sender::new(0),
            hooks,
            state: Mutex::new(Inner {
                ledger: ReplayLedger::new(config.window),
                faults,
                messages: Vec::new(),
                transactions: Vec::new(),
                connections: 0,
                next_message: 1,
                next_transaction: 1,
                webhook_attempts: Vec::new(),
                webhook_stats: WebhookStats::default(),
                next_webhook_attempt: 1,
            }),
            written: Mutex::new(Vec::new()),
            config,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state stays consistent across a panicking holder: every update is one push or
        // one counter, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn changed(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    pub(crate) fn messages(&self) -> Vec<ReceivedMessage> {
        self.lock().messages.clone()
    }

    pub(crate) fn message(&self, id: &str) -> Option<ReceivedMessage> {
        self.lock().messages.iter().find(|m| m.id == id).cloned()
    }

    pub(crate) fn transactions(&self) -> Vec<Transaction> {
        self.lock().transactions.clone()
    }

    pub(crate) fn stats(&self) -> SinkStats {
        let st = self.lock();
        SinkStats {
            keys: st.ledger.stats().clone(),
            messages: st.messages.len(),
            transactions: st.transactions.len(),
            connections: st.connections,
            webhooks: WebhookStats {
                pending: self.hooks.as_ref().map_or(0, Sender::pending),
                ..st.webhook_stats.clone()
            },
        }
    }

    pub(crate) fn webhook_attempts(&self) -> Vec<WebhookAttempt> {
        self.lock().webhook_attempts.clone()
    }

    /// Accepted messages, transactions that reached the dot, and connections.
    pub(crate) fn counts(&self) -> (usize, usize, u64) {
        let st = self.lock();
        (st.messages.len(), st.transactions.len(), st.connections)
    }

    pub(crate) fn faults(&self) -> Vec<RuleStatus> {
        self.lock().faults.status()
    }

    pub(crate) fn set_faults(&self, rules: Vec<FaultRule>) -> Result<(), FaultError> {
        let set = FaultSet::new(rules)?;
        self.lock().faults = set;
        self.changed();
        Ok(())
    }

    /// Adds rules after the active ones (their fire counts go on). Refuses rules that could
    /// never fire, and then adds none.
    pub(crate) fn add_faults(&self, rules: Vec<FaultRule>) -> Result<(), FaultError> {
        self.lock().faults.extend(rules)?;
        self.changed();
        Ok(())
    }

    /// Removes the `.eml` files this sink wrote to the maildir (with `--maildir`), and no
    /// other file: the directory may be shared, and a reset is one HTTP request. Returns how
    /// many.
    pub(crate) fn clear_maildir(&self) -> std::io::Result<usize> {
        let written = std::mem::take(&mut *self.written.lock().unwrap_or_else(|e| e.into_inner()));
        let mut removed = 0;
        for path in written {
            match std::fs::remove_file(&path) {
                Ok(()) => removed += 1,
                // Removed by someone else meanwhile: nothing left to do.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }

    /// Forgets messages, transactions, idempotency records and counts; ids keep counting up
    /// so an id never names two messages.
    pub(crate) fn clear(&self) {
        let mut st = self.lock();
        st.ledger = ReplayLedger::new(self.config.window);
        st.messages.clear();
        st.transactions.clear();
        st.connections = 0;
        st.webhook_attempts.clear();
        st.webhook_stats = WebhookStats::default();
        drop(st);
        self.changed();
    }

    async fn listen(&self, open: bool) -> anyhow::Result<()> {
        let (ack, done) = oneshot::channel();
        let gone = || anyhow::anyhow!("the sink has shut down");
        self.control
            .send(Control::Listen(open, ack))
            .await
            .map_err(|_| gone())?;
        done.await.map_err(|_| gone())??;
        Ok(())
    }

    /// Sessions are woken only by a real change: a resume of a sink that is up must not look
    /// like an outage to them.
    fn set_life(&self, to: Life) -> anyhow::Result<()> {
        let mut refused = false;
        self.life.send_if_modified(|life| {
            if *life == Life::ShuttingDown {
                refused = true;
                return false;
            }
            let changed = *life != to;
            *life = to;
            changed
        });
        anyhow::ensure!(!refused, "the sink is shutting down");
        Ok(())
    }

    /// Open connections are closed first (they watch `life`), then the listener follows the
    /// mode: closed for `Refuse`, open for `Greet421`.
    pub(crate) async fn pause(&self, down: Down) -> anyhow::Result<()> {
        *self.last_down.lock().expect("last_down") = down;
        self.set_life(Life::Down(down))?;
        self.listen(down == Down::Greet421).await
    }

    pub(crate) async fn resume(&self) -> anyhow::Result<()> {
        self.listen(true).await?;
        self.set_life(Life::Up)
    }

    pub(crate) fn count_connection(&self) {
        self.lock().connections += 1;
        self.changed();
    }

    pub(crate) fn fire(&self, phase: FaultStage, ctx: &Context<'_>) -> Option<FaultAction> {
        let rule = self.lock().faults.fire(phase, ctx)?;
        tracing::info!(phase = phase.as_str(), rule = %rule, "sink fault fired");
        Some(rule.action)
    }

    fn record(
        st: &mut Inner,
        sub: DotHandover,
        outcome: DotDecision,
        id: Option<String>,
        reply: Option<&Reply>,
        fault: Option<String>,
    ) {
        let key = sub.key.value().map(str::to_string);
        if let Some(k) = &key {
            st.ledger.count_transaction(k);
        }
        let seq = st.next_transaction;
        st.next_transaction += 1;
        tracing::info!(
            seq,
            id = id.as_deref().unwrap_or("-"),
            key = key.as_deref().unwrap_or("-"),
            outcome = ?outcome,
            size = sub.bytes.len(),
            rcpts = sub.rcpt_to.len(),
            reply = reply.map_or(0, |r| r.code),
            fault = fault.as_deref().unwrap_or("-"),
            "sink transaction"
        );
        st.transactions.push(Transaction {
            seq,
            key,
            mail_from: sub.mail_from,
            rcpt_to: sub.rcpt_to,
            eightbitmime: sub.eightbitmime,
            smtputf8: sub.smtputf8,
            bytes: sub.bytes,
            outcome,
            message_id: id,
            reply: reply.map(Reply::line),
            fault,
            received_at_ms: unix_ms(),
            tls: sub.tls,
            auth_user: sub.auth_user,
            mail_command: sub.mail_command,
            rcpt_commands: sub.rcpt_commands,
        });
    }

    /// Decides a transaction at its final dot: fault rules first, then the message's own
    /// faults, then the idempotency record; commits a new message (maildir file included)
    /// before returning, so a 250 is only ever sent for something already stored.
    pub(crate) async fn dot(self: &Arc<Self>, sub: DotHandover) -> DotPlan {
        let new = match self.decide(sub) {
            Decided::Done(plan) => return plan,
            Decided::Store(new) => new,
        };
        // Parsed before the lock is taken; only events carry it.
        let message_id = self
            .hooks
            .as_ref()
            .and_then(|_| webhook::message_id_header(&new.sub.bytes));
        let stored = match &self.config.maildir {
            None => Ok(()),
            Some(dir) => {
                let (dir, id, bytes) = (dir.clone(), new.id.clone(), new.sub.bytes.clone());
                let written =
                    tokio::task::spawn_blocking(move || write_atomically(&dir, &id, &bytes))
                        .await
                        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                written.map(|path| {
                    self.written
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(path);
                })
            }
        };
        self.commit(new, stored, message_id)
    }

    fn finish(&self, st: MutexGuard<'_, Inner>, reply: Reply, how: &How) -> DotPlan {
        drop(st);
        self.changed();
        DotPlan {
            reply: (!how.withhold).then_some(reply),
            delay: how.delay,
            running: None,
        }
    }

    fn decide(&self, sub: DotHandover) -> Decided {
        let now = Instant::now();
        let mut st = self.lock();
        let key = sub.key.value().map(str::to_string);
        let ctx = Context {
            key: key.as_deref(),
            rcpts: &sub.rcpt_to,
            event: None,
        };
        let rule = st.faults.fire(FaultStage::Dot, &ctx);
        if let Some(rule) = &rule {
            tracing::info!(phase = "dot", rule = %rule, "sink fault fired");
        }
        let fault = rule.as_ref().map(ToString::to_string);
        let how = match rule.map(|r| r.action) {
            Some(FaultAction::Reply { code, text, .. }) => {
                let reply = Reply::new(code, text);
                Self::record(
                    &mut st,
                    sub,
                    DotDecision::Faulted,
                    None,
                    Some(&reply),
                    fault,
                );
                return Decided::Done(self.finish(st, reply, &How::default()));
            }
            Some(FaultAction::Disconnect { .. }) => {
                Self::record(&mut st, sub, DotDecision::Faulted, None, None, fault);
                drop(st);
                self.changed();
                return Decided::Done(DotPlan {
                    reply: None,
                    delay: None,
                    running: None,
                });
            }
            Some(FaultAction::DropAfterDot) => How {
                withhold: true,
                delay: None,
            },
            Some(FaultAction::DelayReply { delay, .. }) => How {
                withhold: false,
                delay: Some(delay),
            },
            Some(FaultAction::Webhook(_)) | None => How::default(),
        };
        let refusal = if let Some(body_fault) = sub.body_fault {
            Some((DotDecision::Rejected, body_fault_reply(body_fault)))
        } else if sub.key == SinkKey::Invalid {
            Some((DotDecision::InvalidKey, e01001()))
        } else {
            None
        };
        if let Some((outcome, reply)) = refusal {
            Self::record(
                &mut st,
                sub,
                outcome,
                None,
                how.given(&reply).as_ref(),
                fault,
            );
            return Decided::Done(self.finish(st, reply, &how));
        }
        let id = format!("S{:06}{:08X}", st.next_message, fastrand::u32(..));
        st.next_message += 1;
        if let Some(k) = &key {
            let fp = fingerprint(
                &sub.mail_from,
                &sub.rcpt_to,
                sub.eightbitmime,
                sub.smtputf8,
                &sub.bytes,
            );
            let (outcome, reply, original) = match st.ledger.check(k, fp, &id, now) {
                Verdict::New => {
                    return Decided::Store(NewMessage {
                        sub,
                        key,
                        id,
                        how,
                        fault,
                    })
                }
                Verdict::Replay { id } => (
                    DotDecision::Replayed,
                    Reply::new(250, format!("2.0.0 OK {id} (idempotent replay)")),
                    Some(id),
                ),
                Verdict::KeyReuse => (DotDecision::KeyReuse, e01005(), None),
                Verdict::InProgress => (DotDecision::InProgress, e01004(), None),
            };
            Self::record(
                &mut st,
                sub,
                outcome,
                original,
                how.given(&reply).as_ref(),
                fault,
            );
            return Decided::Done(self.finish(st, reply, &how));
        }
        Decided::Store(NewMessage {
            sub,
            key,
            id,
            how,
            fault,
        })
    }

    fn commit(
        self: &Arc<Self>,
        new: NewMessage,
        stored: std::io::Result<()>,
        message_id: Option<String>,
    ) -> DotPlan {
        let NewMessage {
            sub,
            key,
            id,
            how,
            fault,
        } = new;
        let mut st = self.lock();
        if let Err(err) = stored {
            tracing::error!(%id, error = %err, "sink could not write the maildir file; message refused");
            if let Some(k) = &key {
                st.ledger.abort(k, &id);
            }
            let reply = Reply::new(451, "4.3.0 sink could not store the message; retry later");
            Self::record(
                &mut st,
                sub,
                DotDecision::Rejected,
                None,
                how.given(&reply).as_ref(),
                fault,
            );
            return self.finish(st, reply, &how);
        }
        st.messages.push(ReceivedMessage {
            id: id.clone(),
            key: key.clone(),
            mail_from: sub.mail_from.clone(),
            rcpt_to: sub.rcpt_to.clone(),
            eightbitmime: sub.eightbitmime,
            smtputf8: sub.smtputf8,
            bytes: sub.bytes.clone(),
            blake3: blake3::hash(&sub.bytes).to_hex().to_string(),
            received_at_ms: unix_ms(),
            tls: sub.tls,
            auth_user: sub.auth_user.clone(),
            mail_command: sub.mail_command.clone(),
            rcpt_commands: sub.rcpt_commands.clone(),
        });
        // The events' faults are decided with the commit, under the same lock, so that
        // `times=` counts batches in the order messages are accepted.
        let events = self.hooks.as_ref().map(|hooks| {
            let faults: Vec<Option<FaultRule>> = hooks
                .event_types(&sub.rcpt_to)
                .into_iter()
                .map(|event| {
                    let ctx = Context {
                        key: key.as_deref(),
                        rcpts: &sub.rcpt_to,
                        event: Some(event.as_str()),
                    };
                    st.faults.fire(FaultStage::Webhook, &ctx)
                })
                .collect();
            st.webhook_stats.batches += faults.len() as u64;
            let accepted = Accepted {
                id: id.clone(),
                key: key.clone(),
                message_id,
                rcpt_to: sub.rcpt_to.clone(),
                accepted_at_ms: unix_ms(),
            };
            (hooks, accepted, faults)
        });
        let mut running = None;
        if let Some(k) = key {
            st.ledger.commit(&k, &id);
            if how.delay.is_some() {
                running = Some(Running {
                    shared: self.clone(),
                    key: k,
                    id: id.clone(),
                });
            } else {
                st.ledger.settle(&k, &id);
            }
        }
        let reply = Reply::new(250, format!("2.0.0 OK {id}"));
        Self::record(
            &mut st,
            sub,
            DotDecision::Accepted,
            Some(id),
            how.given(&reply).as_ref(),
            fault,
        );
        let mut plan = self.finish(st, reply, &how);
        plan.running = running;
        if let Some((hooks, accepted, faults)) = events {
            let dropped = hooks.schedule(self, accepted, faults);
            if dropped > 0 {
                self.lock().webhook_stats.dropped += dropped as u64;
                self.changed();
            }
        }
        plan
    }
}

/// How the reply to this dot goes out, as the fault rule (if any) has it.
#[derive(Default)]
struct How {
    /// `drop`: no reply at all.
    withhold: bool,
    delay: Option<Duration>,
}

impl How {
    /// The reply as the client gets it, for the transaction record.
    fn given(&self, reply: &Reply) -> Option<Reply> {
        (!self.withhold).then(|| reply.clone())
    }
}

enum Decided {
    Done(DotPlan),
    Store(NewMessage),
}

/// A new message, reserved in the ledger, not yet committed.
struct NewMessage {
    sub: DotHandover,
    key: Option<String>,
    id: String,
    how: How,
    fault: Option<String>,
}
