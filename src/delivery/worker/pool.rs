//! The worker pool: the state every worker shares, the heartbeat that keeps this process alive
//! in the store's eyes, the ordinary workers, and the before-queue mode's own. It sits beside
//! the worker it starts, so that the worker's loop names neither this file nor the
//! before-queue sender's.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::liveness::{keep_alive, Liveness, ProcessId};
use super::{immediate_send, upstream_client, DeliverySettings, Shared, Worker};
use crate::delivery::breaker::Breaker;
use crate::delivery::ratelimit::TokenBucket;
use crate::shutdown::Stop;
use crate::store::Store;

/// Starts the workers; they stop when `stop` is given. `hint` wakes them when intake commits.
pub(crate) fn start(
    store: Arc<dyn Store>,
    settings: DeliverySettings,
    hint: Arc<Notify>,
    stop: Stop,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let lease = settings.timeouts.lease();
    let shared = Arc::new(Shared {
        breaker: Mutex::new(Breaker::new(settings.breaker)),
        bucket: Mutex::new(TokenBucket::new(
            settings.rate_per_second,
            settings.burst,
            Instant::now(),
        )),
        store,
        hint,
        lease,
        settings,
        liveness: Arc::new(Liveness::default()),
    });
    let process = ProcessId::current();
    // Every worker holds a sender; the heartbeat goes on until the last one has ended, so
    // an attempt still running after the stop signal (within the shutdown grace) is never
    // taken for a dead process's and cut off.
    let (working, workers_ended) = tokio::sync::mpsc::channel::<()>(1);
    let mut tasks = vec![tokio::spawn(keep_alive(
        shared.store.clone(),
        shared.liveness.clone(),
        process.clone(),
        workers_ended,
    ))];
    for n in 0..shared.settings.workers.max(1) {
        let client = upstream_client(&shared.settings, &shared.settings.target)?;
        let mut scoped = std::collections::HashMap::new();
        for (scope, target) in &shared.settings.scope_targets {
            scoped.insert(scope.clone(), upstream_client(&shared.settings, target)?);
        }
        let worker = Worker {
            shared: shared.clone(),
            owner: format!("{}-{n}", process.0),
            client,
            scoped,
            prober: n == 0,
            last_probe: None,
            _working: working.clone(),
        };
        tasks.push(tokio::spawn(worker.run(stop.clone())));
    }
    // The before-queue mode's immediate sends, on connections of their own.
    immediate_send::start(&shared, &process.0, &working, stop, &mut tasks)?;
    Ok(tasks)
}
