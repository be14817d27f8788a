//! This process's liveness in the store's eyes: a heartbeat every second, the deadline after
//! which its workers stop acting under their leases, and the takeover of the leases of
//! processes whose heartbeat stopped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::Store;

/// How often each relay process writes its heartbeat (docs/guides/postgres.md).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// A process whose heartbeat is older than this is dead: its leases are taken over.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(10);
/// A process stops acting under its leases this long before its own heartbeat could be
/// judged stale (clock rates differ a little, and a write may be in flight).
const ALIVE_MARGIN: Duration = Duration::from_secs(2);
/// How often leases of dead processes are looked for.
const DEAD_OWNER_CHECK: Duration = Duration::from_secs(2);

/// Until when this process's last heartbeat keeps it alive in the store's eyes (its siblings
/// take over its leases once the heartbeat is stale).
#[derive(Debug)]
pub(super) struct Liveness {
    alive_until: Mutex<Instant>,
}

impl Default for Liveness {
    /// Not alive until the first heartbeat is written: no claim before it.
    fn default() -> Self {
        Liveness {
            alive_until: Mutex::new(Instant::now()),
        }
    }
}

impl Liveness {
    /// When this process must stop acting under its leases, lacking a newer heartbeat.
    pub(super) fn alive_deadline(&self) -> Instant {
        let until = *self.alive_until.lock().expect("liveness lock");
        until.checked_sub(ALIVE_MARGIN).unwrap_or(until)
    }

    /// A heartbeat asked at `asked` was written.
    fn heard(&self, asked: Instant) {
        let mut until = self.alive_until.lock().expect("liveness lock");
        *until = (*until).max(asked + STALE_AFTER);
    }
}

/// A lease owner names its process: `host/pid/nonce`, for people reading the ledger. Only
/// the nonce makes it unique; whether the process lives is told by its heartbeat alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProcessId(pub(super) String);

impl ProcessId {
    pub(super) fn current() -> Self {
        ProcessId(format!(
            "{}/{}/{:016x}",
            host_name(),
            std::process::id(),
            fastrand::u64(..)
        ))
    }
}

/// The owner's separators ('/') and the worker suffix's ('-') may not appear in the host part.
fn host_name() -> String {
    crate::hostname::system_hostname().replace(['/', '-'], "_")
}

/// Writes this process's heartbeat every second and, every few seconds, takes over the
/// leases of processes whose heartbeat went stale: instances sharing one database take over
/// a sibling that died within seconds, wherever it ran, instead of at lease expiry. Runs
/// until every worker has ended (`workers_ended` yields `None`), not until the stop signal:
/// at shutdown the workers finish their attempts under this heartbeat.
pub(super) async fn keep_alive(
    store: Arc<dyn Store>,
    liveness: Arc<Liveness>,
    me: ProcessId,
    mut workers_ended: tokio::sync::mpsc::Receiver<()>,
) {
    let mut last_check: Option<Instant> = None;
    loop {
        let asked = Instant::now();
        match store.heartbeat(&me.0).await {
            Ok(()) => {
                liveness.heard(asked);
            }
            Err(err) => {
                tracing::warn!(target: "idemrelay::delivery", error = %err, "cannot write the liveness heartbeat; delivery stops before siblings could take this process for dead")
            }
        }
        if last_check.is_none_or(|t| t.elapsed() >= DEAD_OWNER_CHECK) {
            last_check = Some(Instant::now());
            reclaim_dead_leases(store.as_ref()).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(HEARTBEAT_EVERY) => {}
            None = workers_ended.recv() => return,
        }
    }
}

async fn reclaim_dead_leases(store: &dyn Store) {
    match store.reclaim_dead_leases(STALE_AFTER).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            target: "idemrelay::delivery",
            leases = n,
            "took over leases of a relay process whose heartbeat stopped; its open attempts count as UNKNOWN"
        ),
        Err(err) => {
            tracing::warn!(target: "idemrelay::delivery", error = %err, "cannot check for leases of dead processes")
        }
    }
}
