//! What the listeners, the workers and the admin API share, built once from the settings, and
//! how each of them is started from it. `Relay::assemble` calls these in the order the log
//! lines promise: the admin API's warnings, the webhook listener, then the SMTP listeners'
//! "listening on", then delivery.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::reload::Reloadable;
use super::scopes::{key_spaces, scope_upstreams};
use crate::admin::{self, AdminState};
use crate::auth::{AuthGate, LiveUsers};
use crate::config::{parts, Settings};
use crate::delivery::immediate::BeforeQueue;
use crate::delivery::worker;
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::shutdown::{Shutdown, Stop};
use crate::smtp::server::{ConnectionLimits, ListenerKind, ServerContext};
use crate::smtp::tls::TlsCerts;
use crate::store::{Store, StoreHealth};
use crate::webhook::{self, WebhookState};

pub(super) struct Wiring {
    pub(super) store: Arc<dyn Store>,
    pub(super) metrics: Arc<Metrics>,
    /// Wakes the workers when intake commits.
    pub(super) hint: Arc<Notify>,
    pub(super) before_queue: Option<Arc<BeforeQueue>>,
    pub(super) tls: Option<Arc<TlsCerts>>,
    pub(super) users: Option<Arc<LiveUsers>>,
    /// Where each scope's mail goes: the relay's upstream (`None`), or a user's own.
    pub(super) scope_upstreams: BTreeMap<String, Option<String>>,
    pub(super) store_health: Arc<StoreHealth>,
    pub(super) intake: Arc<Intake>,
    pub(super) auth: Arc<AuthGate>,
    pub(super) limits: Arc<ConnectionLimits>,
}

impl Wiring {
    pub(super) fn new(settings: &Settings, store: Arc<dyn Store>) -> anyhow::Result<Wiring> {
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
        Ok(Wiring {
            store,
            metrics,
            hint,
            before_queue,
            tls,
            users,
            scope_upstreams,
            store_health,
            intake,
            auth,
            limits,
        })
    }

    /// What an SMTP listener of `kind` serves its sessions with; `waits`: its clients hear
    /// the upstream's verdict (before-queue mode).
    pub(super) fn smtp_context(
        &self,
        settings: &Settings,
        kind: ListenerKind,
        waits: bool,
    ) -> Arc<ServerContext> {
        Arc::new(ServerContext {
            intake: self.intake.clone(),
            store_health: self.store_health.clone(),
            metrics: self.metrics.clone(),
            session: Arc::new(parts::session(settings, kind, self.users.is_some())),
            policy: parts::listener_policy(settings, kind),
            limits: self.limits.clone(),
            timeouts: parts::session_timeouts(settings),
            tls: self.tls.clone(),
            users: self.users.clone(),
            auth: self.auth.clone(),
            before_queue: self.before_queue.clone(),
            before_queue_listener: waits,
        })
    }

    /// Serves upstream events on `listener`; its address, and its task.
    pub(super) fn serve_webhooks(
        &self,
        settings: &Settings,
        listener: TcpListener,
        stop: Stop,
    ) -> anyhow::Result<(SocketAddr, JoinHandle<()>)> {
        let addr = listener.local_addr()?;
        let state = Arc::new(WebhookState::new(
            self.store.clone(),
            &settings.webhooks,
            self.metrics.clone(),
        )?);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let names: Vec<&str> = settings.webhooks.keys().map(String::as_str).collect();
        tracing::info!(
            "webhooks at {scheme}://{addr}/webhooks/{{name}} for {}",
            names.join(", ")
        );
        let task = tokio::spawn(webhook::serve(
            listener,
            self.tls.clone(),
            state,
            settings.http_limits(),
            stop,
        ));
        Ok((addr, task))
    }

    /// What SIGHUP (and a changed TLS file) reloads.
    pub(super) fn reloadable(&self, settings: &Settings) -> Reloadable {
        Reloadable {
            tls: self.tls.clone(),
            users: self.users.clone(),
            intake: self.intake.clone(),
            scope_upstreams: self.scope_upstreams.clone(),
            default_scope: settings.scope.clone(),
            relay_upstream: settings.upstream.as_ref().map(|u| u.expose().to_string()),
        }
    }

    /// The delivery workers, when an upstream is configured; none (and a warning) otherwise.
    pub(super) fn start_delivery(
        &self,
        settings: &Settings,
        stop: Stop,
    ) -> anyhow::Result<Vec<JoinHandle<()>>> {
        let Some(url) = &settings.upstream else {
            tracing::warn!("no upstream configured: accepted messages stay queued");
            return Ok(Vec::new());
        };
        let delivery = parts::delivery(
            settings,
            url,
            &self.scope_upstreams,
            self.metrics.clone(),
            self.before_queue.clone(),
        )?;
        tracing::info!(upstream = %url.redacted(), "delivering upstream");
        worker::pool::start(self.store.clone(), delivery, self.hint.clone(), stop)
    }

    /// The admin API's state; `started` is when the relay began, for its uptime.
    pub(super) fn admin_state(
        &self,
        settings: &Settings,
        shutdown: &Shutdown,
        started: Instant,
    ) -> AdminState {
        AdminState {
            store: self.store.clone(),
            store_health: self.store_health.clone(),
            metrics: self.metrics.clone(),
            limits: self.limits.clone(),
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
            delivery_hint: self.hint.clone(),
            retention: settings.retention_policy(),
            store_url: settings.store.redacted(),
            stats: admin::stats_cache::StatsCache::new(admin::stats_cache::STATS_MAX_AGE),
            log_budget: crate::log_budget::LogBudget::new("admin"),
            login_throttle: Default::default(),
            ready_probe: admin::ready_probe::ReadyProbe::new(
                admin::ready_probe::READY_PROBE_MAX_AGE,
            ),
        }
    }
}

/// Said at every start without a token, loopback included: any program on the host can
/// connect to loopback, and so can a browser's pages (the Host and Origin checks stop those,
/// but the operator should know what the listener holds).
pub(super) fn announce_admin(settings: &Settings, addr: SocketAddr) {
    if settings.admin_token.is_none() {
        if settings.admin_allow_changes_without_token {
            tracing::warn!(%addr, "the admin API has no admin_token and admin_allow_changes_without_token is on: anyone who can connect may read the ledger, pause delivery, requeue or cancel mail");
        } else {
            tracing::warn!(%addr, "the admin API has no admin_token: anyone who can connect may read the ledger; operator actions are refused until admin_token is set (or admin_allow_changes_without_token = true)");
        }
    }
    // Logged before the SMTP "listening on" lines, which tell a supervisor (and the tests)
    // that the relay is up; "listening on" itself is kept for SMTP.
    tracing::info!("admin API at http://{addr}/");
}

/// SIGHUP's stream. Installed before the "listening on" lines: from then on SIGHUP reloads, it
/// never takes the default action (ending the process).
pub(super) fn hangup_signal() -> Option<tokio::signal::unix::Signal> {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hup) => Some(hup),
        Err(err) => {
            tracing::warn!(error = %err, "cannot handle SIGHUP; reloads happen only when the TLS files change");
            None
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
