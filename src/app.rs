//! Wires the store, intake and listeners together and owns shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::admin;
use crate::config::Settings;
use crate::intake::Intake;
use crate::shutdown::{Shutdown, Stop};
use crate::smtp::server::{serve, ListenerKind};
use crate::store::{self, Store, StoreHealth};

mod reload;
mod scopes;
mod wiring;
use reload::reload_loop;
pub(crate) use wiring::relay_label_values;
use wiring::{announce_admin, hangup_signal, Wiring};

/// A relay that is running. `shutdown` stops it in order; dropping it only tells every task
/// to stop, with no drain and no wait.
pub struct Relay {
    addrs: Vec<SocketAddr>,
    intake: Arc<Intake>,
    shutdown: Shutdown,
    tasks: Vec<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    grace: Duration,
    admin_addr: Option<SocketAddr>,
    admin_task: Option<JoinHandle<()>>,
    webhook_addr: Option<SocketAddr>,
}

impl Relay {
    /// Opens the store and binds the configured listeners.
    pub async fn start(settings: &Settings) -> anyhow::Result<Relay> {
        // First, so that even a start that fails says which build failed.
        tracing::info!(
            version = %crate::build_info::VERSION,
            commit = %crate::build_info::GIT_COMMIT,
            "idemrelay {} starting",
            crate::build_info::LONG_VERSION
        );
        #[cfg(feature = "failpoints")]
        crate::failpoint::arm();
        let mut listeners = Vec::new();
        let kinds = [
            (ListenerKind::Plain, &settings.listen),
            (ListenerKind::StartTls, &settings.submission_listen),
            (ListenerKind::ImplicitTls, &settings.submissions_listen),
        ];
        for (kind, addrs) in kinds {
            for addr in addrs {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
                listeners.push((kind, listener));
            }
        }
        // Plain listeners whose clients hear the upstream's verdict (docs/guides/before-queue.md).
        let mut before_queue = Vec::new();
        for addr in &settings.before_queue.listen {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (before-queue): {e}"))?;
            before_queue.push(listener);
        }
        let admin = match settings.admin.0 {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (admin): {e}"))?,
            ),
            None => None,
        };
        let webhooks = match settings.webhook_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (webhooks): {e}"))?,
            ),
            None => None,
        };
        let store = store::open(settings.store.expose(), settings.store_busy_timeout).await?;
        let listeners = listeners
            .into_iter()
            .map(|(kind, listener)| (kind, listener, false))
            .chain(
                before_queue
                    .into_iter()
                    .map(|listener| (ListenerKind::Plain, listener, true)),
            )
            .collect();
        Relay::assemble(settings, store, listeners, admin, webhooks)
    }

    /// Starts on listeners and a store the caller made (tests bind port 0), without the
    /// admin listener.
    pub fn with_parts(
        settings: &Settings,
        store: Arc<dyn Store>,
        listeners: Vec<(ListenerKind, TcpListener)>,
    ) -> anyhow::Result<Relay> {
        Relay::with_admin_parts(settings, store, listeners, None)
    }

    /// `with_parts` plus the admin HTTP listener, if one is given.
    pub(crate) fn with_admin_parts(
        settings: &Settings,
        store: Arc<dyn Store>,
        listeners: Vec<(ListenerKind, TcpListener)>,
        admin: Option<TcpListener>,
    ) -> anyhow::Result<Relay> {
        Relay::with_all_parts(settings, store, listeners, admin, None)
    }

    /// `with_admin_parts` plus the webhook listener, if one is given.
    pub fn with_all_parts(
        settings: &Settings,
        store: Arc<dyn Store>,
        listeners: Vec<(ListenerKind, TcpListener)>,
        admin: Option<TcpListener>,
        webhooks: Option<TcpListener>,
    ) -> anyhow::Result<Relay> {
        let listeners = listeners
            .into_iter()
            .map(|(kind, listener)| (kind, listener, false))
            .collect();
        Relay::assemble(settings, store, listeners, admin, webhooks)
    }

    /// `with_all_parts`, each listener with whether its clients wait for the upstream's
    /// verdict (before-queue mode).
    fn assemble(
        settings: &Settings,
        store: Arc<dyn Store>,
        listeners: Vec<(ListenerKind, TcpListener, bool)>,
        admin: Option<TcpListener>,
        webhooks: Option<TcpListener>,
    ) -> anyhow::Result<Relay> {
        let started = Instant::now();
        if let Some(addr) = admin.as_ref().and_then(|l| l.local_addr().ok()) {
            announce_admin(settings, addr);
        }
        let wiring = Wiring::new(settings, store)?;
        let shutdown = Shutdown::new();
        let hup = hangup_signal();
        let mut tasks = Vec::new();
        // Started before the SMTP listeners log "listening on": by then every listener is up.
        let mut webhook_addr = None;
        if let Some(listener) = webhooks {
            let (addr, task) = wiring.serve_webhooks(settings, listener, shutdown.stop_signal())?;
            webhook_addr = Some(addr);
            tasks.push(task);
        }
        let mut addrs = Vec::new();
        for (kind, listener, waits) in listeners {
            if let Ok(addr) = listener.local_addr() {
                if waits {
                    tracing::info!("listening on {addr} ({kind:?}, before-queue)");
                } else {
                    tracing::info!("listening on {addr} ({kind:?})");
                }
                addrs.push(addr);
            }
            tasks.push(tokio::spawn(serve(
                listener,
                wiring.smtp_context(settings, kind, waits),
                shutdown.stop_signal(),
                shutdown.sessions(),
            )));
        }
        tasks.push(tokio::spawn(reload_loop(
            wiring.reloadable(settings),
            hup,
            settings.tls_reload_interval,
            shutdown.stop_signal(),
        )));
        tasks.push(tokio::spawn(store_health_loop(
            wiring.store.clone(),
            wiring.store_health.clone(),
            settings.store_probe_interval,
            shutdown.stop_signal(),
        )));
        let workers = wiring.start_delivery(settings, shutdown.stop_signal())?;
        tasks.push(tokio::spawn(purge_loop(
            wiring.store.clone(),
            settings.retention_policy(),
            settings.purge_interval,
            shutdown.stop_signal(),
        )));
        let mut admin_addr = None;
        let mut admin_task = None;
        if let Some(listener) = admin {
            admin_addr = Some(listener.local_addr()?);
            admin_task = Some(tokio::spawn(admin::serve(
                listener,
                Arc::new(wiring.admin_state(settings, &shutdown, started)),
                settings.http_limits(),
                shutdown.last_signal(),
            )));
        }
        Ok(Relay {
            addrs,
            intake: wiring.intake,
            shutdown,
            tasks,
            workers,
            grace: settings.shutdown_grace,
            admin_addr,
            admin_task,
            webhook_addr,
        })
    }

    /// Where the webhook listener listens, if it runs.
    pub fn webhook_addr(&self) -> Option<SocketAddr> {
        self.webhook_addr
    }

    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Where the admin API listens, if it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    pub fn intake(&self) -> &Arc<Intake> {
        &self.intake
    }

    /// Stops accepting, tells idle sessions 421, lets sessions inside a message finish within
    /// the grace period, then returns.
    pub async fn shutdown(mut self) {
        self.shutdown.begin();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        let workers = std::mem::take(&mut self.workers);
        let aborts: Vec<_> = workers.iter().map(JoinHandle::abort_handle).collect();
        let drained = async {
            self.shutdown.sessions_ended().await;
            for worker in workers {
                let _ = worker.await;
            }
        };
        if tokio::time::timeout(self.grace, drained).await.is_err() {
            // An attempt cut off here has its intent open: the next start treats it as
            // UNKNOWN, never as not sent.
            tracing::warn!(
                "shutdown grace period over; closing remaining connections and attempts"
            );
            for abort in aborts {
                abort.abort();
            }
        }
        self.shutdown.finish();
        if let Some(task) = self.admin_task.take() {
            let _ = task.await;
        }
    }
}

/// Probes the store so that an outage is noticed (and its end too) without waiting for a
/// submission to fail.
async fn store_health_loop(
    store: Arc<dyn Store>,
    health: Arc<StoreHealth>,
    every: Duration,
    stop: Stop,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => { health.probe(store.as_ref()).await; }
            _ = stop.stopped() => return,
        }
    }
}

async fn purge_loop(
    store: Arc<dyn Store>,
    retention: crate::store::Retention,
    every: Duration,
    stop: Stop,
) {
    let mut ticker = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = ticker.tick() => match store.purge_expired(retention).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "expired records purged"),
                Err(err) => tracing::warn!(error = %err, "retention purge failed; will retry"),
            },
            _ = stop.stopped() => return,
        }
    }
}
