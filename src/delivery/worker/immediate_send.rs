//! The delivery worker's part in the before-queue mode (docs/guides/before-queue.md): a few
//! workers of their own, with their own upstream connections, send a record the moment its
//! client's intake committed it, through the ordinary attempt (`Worker::deliver`: intent,
//! lease, decision, settle), and hand the verdict to the waiting client. Whatever would hold
//! the message back (breaker, pause, rate limit, no free connection) answers the client
//! `250 queued` at once and leaves the message to the ordinary workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::{upstream_client, Shared, Worker};
use crate::delivery::breaker::{Admit, BreakerState, Candidate};
use crate::delivery::immediate::{Answering, BeforeQueue, Registry};
use crate::delivery::upstream::UpstreamClient;
use crate::shutdown::Stop;

/// How long a record the immediate send could not lease is given to be taken by a worker of
/// this process (which then answers its client), or let go, before its client hears
/// `250 queued`.
const HANDOVER: Duration = Duration::from_secs(1);

/// Starts `before_queue_connections` immediate workers, when the mode is on.
pub(super) fn start(
    shared: &Arc<Shared>,
    process: &str,
    working: &tokio::sync::mpsc::Sender<()>,
    stop: Stop,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<()> {
    let Some(before_queue) = shared.settings.before_queue.clone() else {
        return Ok(());
    };
    for n in 0..before_queue.connections {
        let worker = Worker {
            shared: shared.clone(),
            // `<process>-…`: a dead process's immediate leases are taken over like any.
            owner: format!("{process}-bq{n}"),
            client: upstream_client(&shared.settings, &shared.settings.target)?,
            scoped: scoped_clients(shared)?,
            prober: false,
            last_probe: None,
            _working: working.clone(),
        };
        tasks.push(tokio::spawn(
            worker.run_immediate(before_queue.clone(), stop.clone()),
        ));
    }
    before_queue.set_delivering();
    Ok(())
}

fn scoped_clients(
    shared: &Shared,
) -> anyhow::Result<std::collections::HashMap<String, UpstreamClient>> {
    let settings = &shared.settings;
    let mut scoped = std::collections::HashMap::new();
    for (scope, target) in &settings.scope_targets {
        scoped.insert(scope.clone(), upstream_client(settings, target)?);
    }
    Ok(scoped)
}

impl Worker {
    /// The slot of a record whose client waits for the verdict in this process, when this
    /// worker has just leased it (an ordinary worker may lease it before the immediate one).
    pub(super) fn answering(&self, id: &str) -> Option<Answering> {
        let before_queue = self.shared.settings.before_queue.as_ref()?;
        before_queue.registry.claim(id)
    }

    /// Takes records to send at once until the stop signal.
    pub(super) async fn run_immediate(mut self, before_queue: Arc<BeforeQueue>, stop: Stop) {
        let idle = self
            .shared
            .settings
            .idle_close
            .max(Duration::from_millis(100));
        loop {
            let next = tokio::select! {
                id = async { before_queue.requests_rx.lock().await.recv().await } => id,
                _ = tokio::time::sleep(idle) => {
                    self.client.close_idle().await;
                    for client in self.scoped.values_mut() {
                        client.close_idle().await;
                    }
                    continue;
                }
                _ = stop.stopped() => None,
            };
            let Some(id) = next else {
                return;
            };
            if let Err(err) = self.send_now(&before_queue.registry, &id).await {
                before_queue.registry.not_sent(&id);
                tracing::warn!(target: "idemrelay::delivery", id = %id, error = %err, "immediate send failed; left to ordinary delivery");
            }
        }
    }

    /// One record, sent now if nothing holds it back; otherwise its client hears `queued`.
    async fn send_now(&mut self, registry: &Arc<Registry>, id: &str) -> anyhow::Result<()> {
        if !registry.still_waiting(id) {
            // Answered already (the bound passed while it waited for a connection), or an
            // ordinary worker here holds it and answers.
            return Ok(());
        }
        let now = Instant::now();
        let breaker_closed = {
            let breaker = self.shared.breaker.lock().expect("breaker lock");
            breaker.state(now) == BreakerState::Closed
        };
        if self.shared.liveness.alive_deadline() <= now || !breaker_closed {
            registry.not_sent(id);
            return Ok(());
        }
        // A token now or never: a client waiting for the rate limit would wait for nothing
        // the ordinary path does not do as well.
        let token = self
            .shared
            .bucket
            .lock()
            .expect("bucket lock")
            .try_take(now);
        if token.is_err() {
            registry.not_sent(id);
            return Ok(());
        }
        // Nothing while delivery is paused, or while anyone holds the record.
        let store = self.shared.store.clone();
        // Paused, or someone holds it: often an ordinary worker here that leased it a moment
        // ago and either takes the client's slot (it then answers) or lets the lease go
        // without an attempt (pacing): the lease by id is tried again until one of the two.
        let until = Instant::now() + HANDOVER;
        let job = loop {
            match store.claim_id(id, &self.owner, self.shared.lease).await {
                Ok(Some(job)) => break job,
                Ok(None) if registry.still_waiting(id) && Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(None) => {
                    self.give_back_token();
                    registry.not_sent(id);
                    return Ok(());
                }
                Err(err) => {
                    self.give_back_token();
                    return Err(err.into());
                }
            }
        };
        // `None` when the bound passed meanwhile: sent now all the same, as an ordinary attempt.
        let answering = registry.claim(id);
        let admit = {
            let now = Instant::now();
            let mut breaker = self.shared.breaker.lock().expect("breaker lock");
            let admit = breaker.admit(
                now,
                Candidate {
                    id: &job.id,
                    failed_before: job.attempts > 0 || job.recovered,
                },
            );
            self.breaker_moved(&mut breaker, now, None);
            admit
        };
        match admit {
            Admit::Send | Admit::Probe => self.deliver(job, answering).await,
            // The breaker opened since: the ordinary workers take it (dropping the slot
            // answers the client `queued`).
            Admit::Wait(after) => {
                self.give_back_token();
                store.release(&job.id, job.token, after).await?;
                Ok(())
            }
            Admit::CheckConnection => {
                self.give_back_token();
                store.release(&job.id, job.token, Duration::ZERO).await?;
                Ok(())
            }
        }
    }
}
