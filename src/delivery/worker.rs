//! The delivery workers: claim a due message under a lease, write the intent, attempt it
//! upstream, classify, and write the outcome with what follows, in one commit.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::breaker::{
    Admit, Attempted, Breaker, BreakerPolicy, BreakerState, Candidate, Transition, Why,
};
use super::decide::{
    before_attempt, breaker_input, decide, BreakerInput, Decision, JobFacts, PaceInput, Start,
    WINDOW_OVER,
};
use super::dsn::notice_for;
use super::immediate::{answer_for_waiting_client, Answering};
use super::outcome::{EnhancedCode, Outcome};
use super::ratelimit::TokenBucket;
use super::retry::{Next, RetryPolicy};
use super::upstream::{
    PhaseTimeouts, ReplyClass, UpstreamClient, UpstreamEnvelope, UpstreamTarget,
};
use crate::mail::new_queue_id;
use crate::shutdown::Stop;
use crate::store::{AttemptResult, Claimed, Phase, Settle, Store};

mod immediate_send;
mod lease;
mod liveness;
pub(crate) mod pool;
use lease::{release_with_retry, settle_with_retry, HeldLease};
use liveness::Liveness;
pub(crate) use liveness::STALE_AFTER;

#[derive(Debug, Clone)]
pub(crate) struct DeliverySettings {
    pub target: UpstreamTarget,
    /// Scopes whose users have an upstream of their own (the users file), and that upstream.
    pub scope_targets: std::collections::HashMap<String, UpstreamTarget>,
    pub ca_file: Option<std::path::PathBuf>,
    /// Our name in EHLO and in DSNs.
    pub hostname: String,
    pub timeouts: PhaseTimeouts,
    pub retry: RetryPolicy,
    /// Concurrent upstream connections (one per worker).
    pub workers: usize,
    pub scan_interval: Duration,
    pub rate_per_second: f64,
    pub burst: f64,
    pub breaker: BreakerPolicy,
    pub pause_probe_interval: Duration,
    pub max_per_connection: usize,
    pub idle_close: Duration,
    /// `log_recipients`: the last delivery line carries the envelope.
    pub log_recipients: bool,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The before-queue mode, when a listener or scope uses it: its immediate sends run on
    /// connections of their own (`run_immediate`).
    pub before_queue: Option<Arc<super::immediate::BeforeQueue>>,
}

/// One attempt whose outcome is in the store: what its metrics and log line report.
struct WrittenAttempt<'a> {
    attempt: u32,
    decision: &'a Decision,
    settle: &'a Settle,
    /// The kind of answer the upstream gave (or did not).
    class: ReplyClass,
    /// From the start of the send to the upstream's last answer.
    latency: Duration,
    /// From the record's acceptance to now: the delivery delay when it was delivered.
    since_accepted: Duration,
}

/// State every worker shares: the upstream's health and pace are relay-wide.
struct Shared {
    store: Arc<dyn Store>,
    settings: DeliverySettings,
    breaker: Mutex<Breaker>,
    bucket: Mutex<TokenBucket>,
    hint: Arc<Notify>,
    lease: Duration,
    /// Until when this process's last heartbeat keeps it alive in the store's eyes.
    liveness: Arc<Liveness>,
}

fn upstream_client(
    settings: &DeliverySettings,
    target: &UpstreamTarget,
) -> anyhow::Result<UpstreamClient> {
    let mut client = UpstreamClient::new(
        target.clone(),
        &settings.hostname,
        settings.timeouts,
        settings.ca_file.as_deref(),
    )?;
    client.max_per_connection = settings.max_per_connection;
    client.idle_close = settings.idle_close;
    Ok(client)
}

struct Worker {
    shared: Arc<Shared>,
    /// Lease owner: process and worker, so a takeover is visible in the ledger.
    owner: String,
    /// The relay's upstream.
    client: UpstreamClient,
    /// The upstreams of scopes that have their own, by scope.
    scoped: std::collections::HashMap<String, UpstreamClient>,
    /// One worker probes the upstream while the queue is paused.
    prober: bool,
    last_probe: Option<Instant>,
    /// Dropped when the worker ends: the heartbeat stops after the last one.
    _working: tokio::sync::mpsc::Sender<()>,
}

impl Worker {
    async fn run(mut self, stop: Stop) {
        let hint = self.shared.hint.clone();
        loop {
            let notified = hint.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let busy = match self.step().await {
                Ok(busy) => {
                    self.shared.settings.metrics.delivery_heartbeat();
                    busy
                }
                Err(err) => {
                    tracing::warn!(target: "idemrelay::delivery", error = %err, "delivery step failed; will retry");
                    false
                }
            };
            if busy {
                if stop.is_stopping() {
                    return;
                }
                continue;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(self.shared.settings.scan_interval) => {}
                _ = stop.stopped() => return,
            }
            self.client.close_idle().await;
            for client in self.scoped.values_mut() {
                client.close_idle().await;
            }
        }
    }

    /// One unit of work; true when something was done and the worker should look again.
    async fn step(&mut self) -> anyhow::Result<bool> {
        let store = self.shared.store.clone();
        if self.shared.liveness.alive_deadline() <= Instant::now() {
            // Our heartbeat is not known to be fresh: what we claimed could be taken over.
            return Ok(false);
        }
        // The token is taken before the claim: waited for under a lease, the wait would eat
        // into the time the lease grants the attempt.
        self.take_token().await;
        // The claim itself takes nothing while delivery is paused; the pause is read only when
        // nothing was claimed, to probe the upstream if the relay paused itself.
        let claimed = store.claim(&self.owner, self.shared.lease).await;
        let Some(job) = claimed.inspect_err(|_| self.give_back_token())? else {
            self.give_back_token();
            if let Some(pause) = store.paused().await? {
                if pause.probe {
                    self.probe_while_paused(&pause.reason).await?;
                }
            }
            return Ok(false);
        };
        // A message that has failed before must not be the half-open probe: it may well be
        // failing on its own, and would reopen the breaker for everyone.
        let candidate = Candidate {
            id: &job.id,
            failed_before: job.attempts > 0 || job.recovered,
        };
        let admit = {
            let now = Instant::now();
            let mut breaker = self.shared.breaker.lock().expect("breaker lock");
            let admit = breaker.admit(now, candidate);
            self.breaker_moved(&mut breaker, now, None);
            admit
        };
        match admit {
            Admit::Send | Admit::Probe => {}
            Admit::Wait(wait) => {
                self.give_back_token();
                store.release(&job.id, job.token, wait).await?;
                return Ok(false);
            }
            Admit::CheckConnection => {
                self.give_back_token();
                let closed = self.check_connection(&job.scope).await;
                // The message was not sent. Handed back due now when the check closed the
                // breaker (the next claim sends it), else for the new cooldown.
                let after = if closed {
                    Duration::ZERO
                } else {
                    self.shared.settings.breaker.cooldown
                };
                store.release(&job.id, job.token, after).await?;
                return Ok(closed);
            }
        }
        let answering = self.answering(&job.id);
        self.deliver(job, answering).await?;
        Ok(true)
    }

    /// The half-open probe when no message that never failed is at hand: connect, greeting,
    /// STARTTLS, AUTH and a `MAIL FROM:<>` that is reset, never sent, on the upstream the
    /// claimed message would use. True when the breaker is closed afterwards.
    async fn check_connection(&mut self, scope: &str) -> bool {
        let client = match self.scoped.get_mut(scope) {
            Some(own) => own,
            None => &mut self.client,
        };
        let checked = client.probe().await;
        let (input, last) = match &checked {
            Ok(()) => (
                BreakerInput::Success,
                "connection check: the upstream answered up to MAIL FROM".to_string(),
            ),
            Err(outcome) => (breaker_input(outcome), outcome.reply_text()),
        };
        let now = Instant::now();
        let mut breaker = self.shared.breaker.lock().expect("breaker lock");
        breaker.on_check(now, input);
        self.breaker_moved(&mut breaker, now, Some(&last));
        breaker.state(now) == BreakerState::Closed
    }

    /// Waits for a token, then takes it: other workers may take the one we waited for.
    async fn take_token(&self) {
        loop {
            let taken = self
                .shared
                .bucket
                .lock()
                .expect("bucket lock")
                .try_take(Instant::now());
            match taken {
                Ok(()) => return,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    fn give_back_token(&self) {
        self.shared.bucket.lock().expect("bucket lock").give_back();
    }

    async fn probe_while_paused(&mut self, reason: &str) -> anyhow::Result<()> {
        let due = self
            .last_probe
            .is_none_or(|t| t.elapsed() >= self.shared.settings.pause_probe_interval);
        if !self.prober || !due {
            return Ok(());
        }
        self.last_probe = Some(Instant::now());
        match self.client.probe().await {
            // An operator may have paused while the probe ran: then the pause stays theirs.
            Ok(()) => {
                if self.shared.store.resume_after_probe().await? {
                    tracing::warn!(target: "idemrelay::delivery", "upstream answered the probe normally; delivery resumed");
                } else {
                    tracing::info!(target: "idemrelay::delivery", "upstream answered the probe normally; delivery stays paused by an operator");
                }
            }
            Err(outcome) => {
                tracing::error!(
                    target: "idemrelay::alert",
                    reason,
                    probe = %outcome.reply_text(),
                    "ALERT delivery paused: account-level upstream failure persists"
                );
            }
        }
        Ok(())
    }

    /// `answering`: the record's client waits for the verdict (before-queue mode).
    async fn deliver(&mut self, job: Claimed, answering: Option<Answering>) -> anyhow::Result<()> {
        let store = self.shared.store.clone();
        let policy = self.shared.settings.retry;
        let claimed_at = Instant::now();
        let facts = JobFacts::of(&job);
        // The store's clock, read at the claim and carried on by ours.
        let store_now = || job.now_ms + claimed_at.elapsed().as_millis() as i64;
        let body_within = match before_attempt(&policy, &facts, store_now()) {
            Start::Send { body_within } => body_within,
            Start::Park => return self.park(&job).await,
        };
        let attempt = job.attempts + 1;
        if !self.open_intent(&job, attempt, claimed_at).await? {
            return Ok(());
        }
        failpoint!("delivery.after_intent");
        let started = Instant::now();
        let data_by = body_within.map(|left| claimed_at + left);
        let mut held = HeldLease::new(claimed_at, self.shared.lease);
        let Some(outcome) = self.send_under_lease(&job, data_by, &mut held).await else {
            // Dropping the send abandons the connection; the new holder has already recorded
            // this attempt as UNKNOWN.
            tracing::warn!(target: "idemrelay::attempt", id = %job.id, attempt, "lease lost during the attempt; abandoned");
            return Ok(());
        };
        let latency = started.elapsed();
        let decision = decide(&policy, &facts, &outcome, store_now(), fastrand::f64());
        self.observe(&job, &decision);
        let class = ReplyClass::of(&outcome);
        self.shared.settings.metrics.upstream_reply(class.as_str());
        if matches!(decision.next, Next::Delivered) {
            failpoint!("delivery.after_upstream_ok");
        }
        // What the upstream offered, learnt by this attempt (only asked when it mattered).
        let client = self.scoped.get(&job.scope).unwrap_or(&self.client);
        let offers_dsn = client.last_offered().is_some_and(|o| o.dsn);
        let now_ms = crate::store::now_ms();
        let (mta, dsn_id) = (&self.shared.settings.hostname, new_queue_id(now_ms));
        let dsn = notice_for(
            &job,
            decision.next,
            &outcome,
            &policy,
            offers_dsn,
            mta,
            dsn_id,
            now_ms,
        );
        let answer = answering
            .as_ref()
            .and_then(|a| answer_for_waiting_client(a, &job, &decision));
        // The client heard the refusal itself: no bounce.
        let dsn = dsn.filter(|_| answer.is_none() || decision.next != Next::Failed);
        let settle = decision.settle(dsn);
        let result = &decision.row;
        // The outcome is known now; losing it to a passing store error would turn it into
        // UNKNOWN and a resend, so the write is retried while the lease lasts, as renewed.
        let settled = settle_with_retry(
            store.as_ref(),
            &job.id,
            job.token,
            Some((attempt, result)),
            &settle,
            answer.as_ref(),
            held.settle_by(),
        )
        .await;
        let settled = match (answering, answer) {
            // Told only once written, and as written.
            (Some(answering), Some(reply)) => {
                answering.stored(reply, settled.as_ref().ok().copied());
                settled?
            }
            _ => settled?,
        };
        if let Some(reason) = &decision.pause {
            store.pause(reason, true).await?;
            tracing::error!(
                target: "idemrelay::alert",
                id = %job.id,
                reply = %reason,
                "ALERT delivery paused: the upstream refused the account; queue kept, probing"
            );
        }
        if settled {
            let since_accepted = facts.since_accepted(store_now());
            self.record_attempt(
                &job,
                WrittenAttempt {
                    attempt,
                    decision: &decision,
                    settle: &settle,
                    class,
                    latency,
                    since_accepted,
                },
            );
        } else {
            tracing::warn!(target: "idemrelay::attempt", id = %job.id, attempt, "lease lost before the outcome was written; the new holder decides");
        }
        Ok(())
    }

    /// Writes the attempt's intent under the job's lease. False when the lease was lost
    /// meanwhile; on a store error the job is handed back at once.
    async fn open_intent(
        &self,
        job: &Claimed,
        attempt: u32,
        claimed_at: Instant,
    ) -> anyhow::Result<bool> {
        let store = self.shared.store.as_ref();
        match store.begin_attempt(&job.id, job.token, attempt).await {
            Ok(begun) => Ok(begun),
            Err(err) => {
                // Nothing was sent: hand the job back now. Kept, the lease would hold it for
                // the worst-case attempt time, and an earlier UNKNOWN's window could run out
                // meanwhile, parking a message that was simply not sent yet. Should the intent
                // have got in after all (its commit's answer lost), the next claim closes it as
                // UNKNOWN: the safe reading.
                release_with_retry(
                    store,
                    &job.id,
                    job.token,
                    self.shared.settings.retry.base,
                    claimed_at + self.shared.lease,
                )
                .await;
                Err(err.into())
            }
        }
    }

    /// Sends `job` upstream, renewing its lease while the attempt runs: a slow upstream (a
    /// tarpit on every RCPT) must not let a second worker take the job and send it again
    /// meanwhile. None when the lease was lost (the send is dropped, abandoning the
    /// connection).
    async fn send_under_lease(
        &mut self,
        job: &Claimed,
        data_by: Option<Instant>,
        held: &mut HeldLease,
    ) -> Option<Outcome> {
        let store = self.shared.store.clone();
        let lease = self.shared.lease;
        let envelope = UpstreamEnvelope {
            mail_from: &job.mail_from,
            rcpt_to: &job.rcpt_to,
            eight_bit: job.eight_bit,
            smtputf8: job.smtputf8,
            requests: &job.requests,
        };
        let client = match self.scoped.get_mut(&job.scope) {
            Some(own) => own,
            None => &mut self.client,
        };
        let send = client.send(&envelope, &job.content, data_by);
        tokio::pin!(send);
        let mut renew = tokio::time::interval(lease / 3);
        renew.tick().await;
        loop {
            let deadline = held.abandon_at().min(self.shared.liveness.alive_deadline());
            tokio::select! {
                outcome = &mut send => return Some(outcome),
                // Renewals or heartbeats kept failing: the lease may pass to another worker
                // or process now (a heartbeat that landed meanwhile moves it).
                _ = tokio::time::sleep_until(deadline.into()) => {
                    if held.abandon_at().min(self.shared.liveness.alive_deadline()) <= Instant::now() {
                        return None;
                    }
                }
                _ = renew.tick() => {
                    self.shared.settings.metrics.delivery_heartbeat();
                    let asked = Instant::now();
                    match store.renew_lease(&job.id, job.token, lease).await {
                        Ok(true) => held.renewed(asked),
                        Ok(false) => return None,
                        // Not known to be held: kept only as long as the last renewal lasts.
                        Err(err) => tracing::warn!(target: "idemrelay::store", error = %err, id = %job.id, "cannot renew the delivery lease; the attempt stops before it could expire"),
                    }
                }
            }
        }
    }

    /// A written attempt's metrics and log line (and the message's last line when it ended).
    fn record_attempt(&self, job: &Claimed, written: WrittenAttempt<'_>) {
        let WrittenAttempt {
            attempt,
            decision,
            settle,
            class,
            latency,
            since_accepted,
        } = written;
        let result = &decision.row;
        if matches!(settle, Settle::Delivered { .. }) {
            // Before the attempt's counters: a scrape that sees it delivered sees this too.
            self.shared.settings.metrics.delivered_after(since_accepted);
        }
        self.shared.settings.metrics.attempt(
            result.outcome.as_str(),
            result.phase.map(Phase::as_str),
            decision.next.label(),
            latency,
        );
        // Everything about one message carries `id=<id>` (Display, never quoted), so one
        // grep finds its whole life, as Postfix's queue id does in maillog.
        tracing::info!(
            target: "idemrelay::attempt",
            id = %job.id,
            key = %job.key.as_deref().unwrap_or("-"),
            attempt,
            outcome = %result.outcome,
            class = %class.as_str(),
            phase = %result.phase.map_or("-", Phase::as_str),
            code = result.code.unwrap_or(0),
            reply = %result.reply,
            decision = %decision.next.label(),
            retry_in_ms = match settle {
                Settle::Retry { after, .. } => after.as_millis() as u64,
                _ => 0,
            },
            latency_ms = latency.as_millis() as u64,
            "attempt"
        );
        self.log_final(job, attempt, Some(result), settle, since_accepted);
    }

    /// Parks a message whose earlier attempt may already be delivered, unsent (the reason is
    /// on [`Start::Park`]).
    async fn park(&self, job: &Claimed) -> anyhow::Result<()> {
        let settle = Settle::Unresolved {
            upstream_reply: WINDOW_OVER.into(),
        };
        self.shared
            .store
            .settle(&job.id, job.token, None, &settle)
            .await?;
        let decision = Next::Unresolved.label();
        self.shared.settings.metrics.decision(decision);
        tracing::warn!(
            target: "idemrelay::attempt",
            id = %job.id,
            key = %job.key.as_deref().unwrap_or("-"),
            decision = %decision,
            "outcome unknown and the upstream window is over: parked for an operator"
        );
        // Parked without a new attempt, it still ends with its `status=` line like any other.
        let since_accepted = JobFacts::of(job).since_accepted(job.now_ms);
        self.log_final(job, job.attempts, None, &settle, since_accepted);
        Ok(())
    }

    /// The relay-wide reactions to an attempt: breaker and pace.
    fn observe(&self, job: &Claimed, decision: &Decision) {
        let now = Instant::now();
        let to = job.rcpt_to.join(",");
        let mut breaker = self.shared.breaker.lock().expect("breaker lock");
        breaker.on_attempt(
            now,
            Attempted {
                id: &job.id,
                to: &to,
            },
            decision.breaker,
        );
        self.breaker_moved(&mut breaker, now, Some(&decision.row.reply));
        drop(breaker);
        let mut bucket = self.shared.bucket.lock().expect("bucket lock");
        match decision.pace {
            PaceInput::SlowDown => {
                bucket.slow_down(now);
                tracing::warn!(target: "idemrelay::delivery", rate = bucket.current_rate(), "upstream asked to slow down; relay-wide rate lowered");
            }
            PaceInput::Success => bucket.on_success(),
            PaceInput::Keep => {}
        }
    }

    /// Logs and counts a change of the breaker's state, with why. `last` is the upstream's
    /// answer (or the failure) that moved it, when an attempt did.
    fn breaker_moved(&self, breaker: &mut Breaker, now: Instant, last: Option<&str>) {
        let metrics = &self.shared.settings.metrics;
        let Some(Transition { from, to }) = breaker.transition(now) else {
            return;
        };
        metrics.breaker_transition(to);
        let policy = &self.shared.settings.breaker;
        let cooldown_ms = policy.cooldown.as_millis() as u64;
        let last = last.unwrap_or("-");
        // `class` says what opened it: connect, greeting, tls, auth, lost, closing (the
        // upstream itself), or messages (many different messages failing on their own).
        let why = breaker.why();
        let class = why.map_or("-", Why::class);
        match (to, why) {
            (BreakerState::Open, _) if from == BreakerState::HalfOpen => tracing::warn!(
                target: "idemrelay::breaker",
                from = %from.as_str(),
                to = %to.as_str(),
                class,
                last = %last,
                cooldown_ms,
                "circuit breaker open: the probe failed; attempts stop for the cooldown"
            ),
            (BreakerState::Open, Some(Why::Messages { failing, seen })) => tracing::warn!(
                target: "idemrelay::breaker",
                from = %from.as_str(),
                to = %to.as_str(),
                class,
                failing,
                seen,
                window_ms = policy.window.as_millis() as u64,
                last = %last,
                cooldown_ms,
                "circuit breaker open: many different messages failed within the window although the upstream answered their sessions; attempts stop for the cooldown"
            ),
            (BreakerState::Open, _) => tracing::warn!(
                target: "idemrelay::breaker",
                from = %from.as_str(),
                to = %to.as_str(),
                class,
                failures = policy.threshold.max(1),
                last = %last,
                cooldown_ms,
                "circuit breaker open: the upstream itself failed that many times in a row; attempts stop for the cooldown"
            ),
            (BreakerState::HalfOpen, _) => tracing::info!(
                target: "idemrelay::breaker",
                from = %from.as_str(),
                to = %to.as_str(),
                class,
                probe = %breaker.probe_name().unwrap_or("-"),
                "circuit breaker half-open: cooldown over; one probe let through (a message that has not failed before, else a connection check)"
            ),
            (BreakerState::Closed, _) => tracing::info!(
                target: "idemrelay::breaker",
                from = %from.as_str(),
                to = %to.as_str(),
                last = %last,
                "circuit breaker closed: the upstream answered; attempts resume"
            ),
        }
    }

    /// The line that closes a record's story (Postfix's `status=sent` / `status=bounced`):
    /// what the upstream said last, and how long the message was with us. A retry has none:
    /// its attempt line says when the next one is.
    fn log_final(
        &self,
        job: &Claimed,
        attempts: u32,
        result: Option<&AttemptResult>,
        settle: &Settle,
        since_accepted: Duration,
    ) {
        let key = job.key.as_deref().unwrap_or("-");
        let delay_ms = since_accepted.as_millis() as u64;
        // Only with `log_recipients` (personal data: see docs/operations/logs.md).
        let envelope = self.shared.settings.log_recipients;
        let from = envelope.then(|| tracing::field::display(job.mail_from.as_str()));
        let to = envelope.then(|| tracing::field::display(job.rcpt_to.join(",")));
        match settle {
            Settle::Delivered { upstream_reply, .. } => {
                tracing::info!(
                    target: "idemrelay::delivery",
                    id = %job.id,
                    key = %key,
                    status = %"delivered",
                    attempts,
                    delay_ms,
                    from,
                    to,
                    reply = %upstream_reply,
                    "delivered"
                );
            }
            Settle::Failed {
                upstream_reply,
                dsn,
            } => {
                let enhanced = EnhancedCode::from_reply(upstream_reply)
                    .map_or_else(|| "-".to_string(), |e| e.to_string());
                let dsn_id = dsn.as_ref().map_or("-", |d| d.id.as_str());
                tracing::warn!(
                    target: "idemrelay::delivery",
                    id = %job.id,
                    key = %key,
                    status = %"bounced",
                    attempts,
                    delay_ms,
                    from,
                    to,
                    phase = %result.and_then(|r| r.phase).map_or("-", Phase::as_str),
                    code = result.and_then(|r| r.code).unwrap_or(0),
                    enhanced = %enhanced,
                    reply = %upstream_reply,
                    dsn_id = %dsn_id,
                    "bounced: the upstream refused the message for good"
                );
            }
            Settle::Unresolved { upstream_reply } => tracing::warn!(
                target: "idemrelay::delivery",
                id = %job.id,
                key = %key,
                status = %"unresolved",
                attempts,
                delay_ms,
                from,
                to,
                reply = %upstream_reply,
                "unresolved: the upstream may or may not have the message; parked for an operator"
            ),
            Settle::Retry { .. } => {}
        }
    }
}
