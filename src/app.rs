//! Wires the store, intake and listeners together and owns shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::admin::{self, AdminState};
use crate::auth::{AuthGate, LiveUsers};
use crate::config::{parts, Settings};
use crate::delivery::immediate::BeforeQueue;
use crate::delivery::worker;
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::shutdown::{Shutdown, Stop};
use crate::smtp::server::{serve, ConnectionLimits, ListenerKind, ServerContext};
use crate::smtp::tls::TlsCerts;
use crate::store::{self, Store, StoreHealth};
use crate::webhook::{self, WebhookState};

mod reload;
mod scopes;
use reload::{reload_loop, Reloadable};
use scopes::{key_spaces, scope_upstreams};

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
            // Said at every start without a token, loopback included: any program on the
            // host can connect to loopback, and so can a browser's pages (the Host and Origin
            // checks stop those, but the operator should know what the listener holds).
            if settings.admin_token.is_none() {
                if settings.admin_allow_changes_without_token {
                    tracing::warn!(%addr, "the admin API has no admin_token and admin_allow_changes_without_token is on: anyone who can connect may read the ledger, pause delivery, requeue or cancel mail");
                } else {
                    tracing::warn!(%addr, "the admin API has no admin_token: anyone who can connect may read the ledger; operator actions are refused until admin_token is set (or admin_allow_changes_without_token = true)");
                }
            }
            // Logged before the SMTP "listening on" lines, which tell a supervisor (and the
            // tests) that the relay is up; "listening on" itself is kept for SMTP.
            tracing::info!("admin API at http://{addr}/");
        }
        let metrics = Arc::new(Metrics::new(&relay_label_values()));
        let hint = Arc::new(Notify::new());
        // With a users file, any user may be given `before_queue = true` (a reload included).
        let before_queue_used = settings.before_queue.in_use() || settings.users_file.is_some();
        let before_queue = before_queue_used.then(|| {
            Arc::new(BeforeQueue::new(
                settings.before_queue.wait,
                settings.before_queue.connections,
                store.clone(),
                hint.clone(),
            ))
        });

        let tls = match (&settings.tls_cert, &settings.tls_key) {
            (Some(cert), Some(key)) => Some(Arc::new(TlsCerts::load(cert, key)?)),
            _ => None,
        };
        let users = match &settings.users_file {
            Some(path) => Some(Arc::new(LiveUsers::load(path)?)),
            None => None,
        };
        // Where each scope's mail goes: the relay's upstream, or a user's own.
        let scope_upstreams = scope_upstreams(
            &settings.scope,
            users.as_ref().map(|u| u.current()).as_deref(),
        );
        let store_health = Arc::new(StoreHealth::default());
        let intake = Intake::new(
            store.clone(),
            parts::intake(
                settings,
                key_spaces(
                    &scope_upstreams,
                    settings.upstream.as_ref().map(|u| u.expose()),
                ),
            ),
            hint.clone(),
            store_health.clone(),
        )
        .with_metrics(metrics.clone());
        let intake = Arc::new(match &before_queue {
            Some(before_queue) => intake.with_before_queue(before_queue.clone()),
            None => intake,
        });
        let auth = Arc::new(AuthGate::new(
            parts::auth_limits(settings),
            users.clone(),
            settings.auth_failure_delay,
        ));
        let limits = Arc::new(ConnectionLimits::new(
            settings.max_connections,
            settings.max_connections_per_ip,
        ));
        let context = |kind: ListenerKind, waits: bool| {
            Arc::new(ServerContext {
                intake: intake.clone(),
                store_health: store_health.clone(),
                metrics: metrics.clone(),
                session: Arc::new(parts::session(settings, kind, users.is_some())),
                policy: parts::listener_policy(settings, kind),
                limits: limits.clone(),
                timeouts: parts::session_timeouts(settings),
                tls: tls.clone(),
                users: users.clone(),
                auth: auth.clone(),
                before_queue: before_queue.clone(),
                before_queue_listener: waits,
            })
        };
        let shutdown = Shutdown::new();
        // Installed before the "listening on" lines: from then on SIGHUP reloads, it never
        // takes the default action (ending the process).
        let hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hup) => Some(hup),
            Err(err) => {
                tracing::warn!(error = %err, "cannot handle SIGHUP; reloads happen only when the TLS files change");
                None
            }
        };
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        // Started before the SMTP listeners log "listening on": by then every listener is up.
        let mut webhook_addr = None;
        if let Some(listener) = webhooks {
            let addr = listener.local_addr()?;
            let state = Arc::new(WebhookState::new(
                store.clone(),
                &settings.webhooks,
                metrics.clone(),
            )?);
            let scheme = if tls.is_some() { "https" } else { "http" };
            let names: Vec<&str> = settings.webhooks.keys().map(String::as_str).collect();
            tracing::info!(
                "webhooks at {scheme}://{addr}/webhooks/{{name}} for {}",
                names.join(", ")
            );
            webhook_addr = Some(addr);
            tasks.push(tokio::spawn(webhook::serve(
                listener,
                tls.clone(),
                state,
                settings.http_limits(),
                shutdown.stop_signal(),
            )));
        }
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
                context(kind, waits),
                shutdown.stop_signal(),
                shutdown.sessions(),
            )));
        }
        tasks.push(tokio::spawn(reload_loop(
            Reloadable {
                tls,
                users,
                intake: intake.clone(),
                scope_upstreams: scope_upstreams.clone(),
                default_scope: settings.scope.clone(),
                relay_upstream: settings.upstream.as_ref().map(|u| u.expose().to_string()),
            },
            hup,
            settings.tls_reload_interval,
            shutdown.stop_signal(),
        )));
        tasks.push(tokio::spawn(store_health_loop(
            store.clone(),
            store_health.clone(),
            settings.store_probe_interval,
            shutdown.stop_signal(),
        )));
        let mut workers = Vec::new();
        match &settings.upstream {
            Some(url) => {
                let delivery = parts::delivery(
                    settings,
                    url,
                    &scope_upstreams,
                    metrics.clone(),
                    before_queue.clone(),
                )?;
                tracing::info!(upstream = %url.redacted(), "delivering upstream");
                workers = worker::start(
                    store.clone(),
                    delivery,
                    hint.clone(),
                    shutdown.stop_signal(),
                )?;
            }
            None => tracing::warn!("no upstream configured: accepted messages stay queued"),
        }
        tasks.push(tokio::spawn(purge_loop(
            store.clone(),
            settings.retention_policy(),
            settings.purge_interval,
            shutdown.stop_signal(),
        )));
        let mut admin_addr = None;
        let mut admin_task = None;
        if let Some(listener) = admin {
            let addr = listener.local_addr()?;
            let state = Arc::new(AdminState {
                store,
                store_health: store_health.clone(),
                metrics,
                limits: limits.clone(),
                stopping: shutdown.stop_signal(),
                token: settings
                    .admin_token
                    .as_ref()
                    .map(|t| t.expose().to_string()),
                allow_changes_without_token: settings.admin_allow_changes_without_token,
                hosts: std::iter::once(&settings.hostname)
                    .chain(&settings.admin_hosts)
                    .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
                    .collect(),
                wedged_after: settings.upstream.as_ref().map(|_| wedge_limit(settings)),
                started,
                delivery_hint: hint,
                retention: settings.retention_policy(),
                store_url: settings.store.redacted(),
                stats: admin::stats_cache::StatsCache::new(admin::stats_cache::STATS_MAX_AGE),
                log_budget: crate::log_budget::LogBudget::new("admin"),
                login_throttle: Default::default(),
                ready_probe: admin::ready_probe::ReadyProbe::new(
                    admin::ready_probe::READY_PROBE_MAX_AGE,
                ),
            });
            admin_addr = Some(addr);
            admin_task = Some(tokio::spawn(admin::serve(
                listener,
                state,
                settings.http_limits(),
                shutdown.last_signal(),
            )));
        }
        Ok(Relay {
            addrs,
            intake,
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

/// How long delivery may make no progress before `/readyz` calls it wedged. A worker reports
/// after every queue look (at least every `scan_interval`) and every lease renewal during an
/// attempt (a third of the lease), so only a stuck worker stays silent longer than this.
fn wedge_limit(settings: &Settings) -> Duration {
    let d = &settings.delivery;
    d.timeouts.lease() / 3 + d.scan_interval * 3 + Duration::from_secs(30)
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

/// Every label value the relay's metrics can take, from the types that produce them.
pub(crate) fn relay_label_values() -> crate::metrics::LabelValues {
    use crate::delivery::{outcome, retry::Next, upstream::ReplyClass};
    use crate::intake::SubmissionResult;
    use crate::smtp::session::RefusalReason;
    crate::metrics::LabelValues {
        submission_results: SubmissionResult::ALL.map(SubmissionResult::label).to_vec(),
        decisions: Next::LABELS.to_vec(),
        connection_refusals: RefusalReason::AT_CONNECT
            .map(RefusalReason::as_str)
            .to_vec(),
        command_refusals: RefusalReason::IN_SESSION
            .map(RefusalReason::as_str)
            .to_vec(),
        upstream_reply_classes: ReplyClass::ALL.map(ReplyClass::as_str).to_vec(),
        attempt_endings: outcome::attempt_endings(),
    }
}
