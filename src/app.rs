//! Wires the store, intake and listeners together and owns shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::Settings;
use crate::intake::{Intake, IntakeSettings};
use crate::smtp::server::{serve, ListenerPolicy, ServerContext};
use crate::smtp::session::SessionConfig;
use crate::store::{self, Store};

/// A relay that is running; dropping it does not stop it, `shutdown` does.
pub struct Relay {
    addrs: Vec<SocketAddr>,
    intake: Arc<Intake>,
    stop: watch::Sender<bool>,
    alive_rx: mpsc::Receiver<()>,
    tasks: Vec<JoinHandle<()>>,
    grace: Duration,
}

impl Relay {
    /// Opens the store and binds the configured listeners.
    pub async fn start(settings: &Settings) -> anyhow::Result<Relay> {
        let mut listeners = Vec::new();
        for addr in &settings.listen {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
            listeners.push(listener);
        }
        let store = store::open(&settings.store, settings.store_busy_timeout).await?;
        Ok(Relay::with_parts(settings, store, listeners))
    }

    /// Starts on listeners and a store the caller made (tests bind port 0).
    pub fn with_parts(
        settings: &Settings,
        store: Arc<dyn Store>,
        listeners: Vec<TcpListener>,
    ) -> Relay {
        let intake = Arc::new(Intake::new(
            store.clone(),
            IntakeSettings {
                hostname: settings.hostname.clone(),
                missing_key: settings.missing_key,
                retention: settings.retention,
                in_progress_wait: settings.in_progress_wait,
            },
        ));
        let ctx = Arc::new(ServerContext {
            intake: intake.clone(),
            session: Arc::new(SessionConfig {
                hostname: settings.hostname.clone(),
                max_message_size: settings.max_message_size,
                max_recipients: settings.max_recipients,
                max_errors: settings.max_errors,
                ..SessionConfig::default()
            }),
            policy: ListenerPolicy {
                scope: settings.scope.clone(),
                allow_networks: settings.allow_networks.clone(),
            },
            read_timeout: settings.read_timeout,
        });
        let (stop, stop_rx) = watch::channel(false);
        let (alive, alive_rx) = mpsc::channel(1);
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for listener in listeners {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!("listening on {addr}");
                addrs.push(addr);
            }
            tasks.push(tokio::spawn(serve(
                listener,
                ctx.clone(),
                stop_rx.clone(),
                alive.clone(),
            )));
        }
        tasks.push(tokio::spawn(store_health_loop(
            intake.clone(),
            settings.store_probe_interval,
            stop_rx.clone(),
        )));
        tasks.push(tokio::spawn(purge_loop(
            store,
            settings.retention,
            settings.purge_interval,
            stop_rx,
        )));
        Relay {
            addrs,
            intake,
            stop,
            alive_rx,
            tasks,
            grace: settings.shutdown_grace,
        }
    }

    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn intake(&self) -> &Arc<Intake> {
        &self.intake
    }

    /// Stops accepting, tells idle sessions 421, lets sessions inside a message finish within
    /// the grace period, then returns.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        // Every connection task holds a sender clone; recv() is None once all have ended.
        if tokio::time::timeout(self.grace, self.alive_rx.recv())
            .await
            .is_err()
        {
            tracing::warn!("shutdown grace period over; closing remaining connections");
        }
    }
}

/// Probes the store so that an outage is noticed (and its end too) without waiting for a
/// submission to fail.
async fn store_health_loop(intake: Arc<Intake>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => { intake.check_store().await; }
            _ = stopped(&mut stop) => return,
        }
    }
}

async fn purge_loop(
    store: Arc<dyn Store>,
    retention: Duration,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = ticker.tick() => match store.purge_expired(retention).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "expired records purged"),
                Err(err) => tracing::warn!(error = %err, "retention purge failed; will retry"),
            },
            _ = stopped(&mut stop) => return,
        }
    }
}

/// Resolves once the stop flag is set (the watch guard is not held across awaits).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Installs the SIGTERM/SIGINT handlers now; the returned future resolves on either signal.
pub fn termination_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
