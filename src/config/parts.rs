//! The settings each component is made with, turned from the relay's `Settings` in one place
//! per component, so that wiring the relay (app.rs) copies no field by hand.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;

use super::Settings;
use crate::auth::throttle::{ThrottleLimits, DEFAULT_MAX_ENTRIES};
use crate::delivery::immediate::BeforeQueue;
use crate::delivery::upstream::UpstreamTarget;
use crate::delivery::worker::DeliverySettings;
use crate::intake::{IntakeSettings, KeySpaces};
use crate::metrics::Metrics;
use crate::secret::SecretUrl;
use crate::smtp::server::{ListenerKind, ListenerPolicy, SessionTimeouts};
use crate::smtp::session::SessionConfig;

/// Intake's settings; `key_spaces` say which scope owns which upstream account's keys.
pub(crate) fn intake(settings: &Settings, key_spaces: KeySpaces) -> IntakeSettings {
    IntakeSettings {
        hostname: settings.hostname.clone(),
        missing_key: settings.missing_key,
        retention: settings.retention_policy(),
        in_progress_wait: settings.in_progress_wait,
        log_recipients: settings.log_recipients,
        key_spaces,
    }
}

/// AUTH failures counted per (client, user name), with a looser cap per client
/// (docs/guides/tls-auth-relay.md).
pub(crate) fn auth_limits(settings: &Settings) -> ThrottleLimits {
    ThrottleLimits {
        per_user: settings.max_auth_failures_per_user,
        per_address: settings.max_auth_failures_per_ip,
        window: settings.auth_failure_window,
        max_entries: DEFAULT_MAX_ENTRIES,
    }
}

/// The session machine's settings on a listener of `kind`; `auth` when a users file is set.
pub(crate) fn session(settings: &Settings, kind: ListenerKind, auth: bool) -> SessionConfig {
    SessionConfig {
        hostname: settings.hostname.clone(),
        max_message_size: settings.max_message_size,
        max_recipients: settings.max_recipients,
        max_transactions: settings.max_transactions,
        max_errors: settings.max_errors,
        starttls: kind == ListenerKind::StartTls,
        require_tls: kind != ListenerKind::Plain,
        auth,
        max_auth_failures: settings.max_auth_failures,
        ..SessionConfig::default()
    }
}

/// Who may connect to a listener of `kind`, and how it greets: the TLS listeners
/// (submission) have settings of their own.
pub(crate) fn listener_policy(settings: &Settings, kind: ListenerKind) -> ListenerPolicy {
    let submission = kind != ListenerKind::Plain;
    ListenerPolicy {
        kind,
        scope: settings.scope.clone(),
        allow_networks: if submission {
            settings.submission_allow_networks.clone()
        } else {
            settings.allow_networks.clone()
        },
        greet_delay: if submission {
            settings.submission_greet_delay
        } else {
            settings.greet_delay
        },
        proxy_from: if submission {
            settings.submission_proxy_protocol_from.clone()
        } else {
            settings.proxy_protocol_from.clone()
        },
    }
}

pub(crate) fn session_timeouts(settings: &Settings) -> SessionTimeouts {
    SessionTimeouts {
        read: settings.read_timeout,
        session: settings.session_timeout,
        min_data_rate: settings.min_data_rate,
        data_rate_grace: settings.data_rate_grace,
    }
}

/// The delivery workers' settings for delivering to `upstream`: `[delivery]`, the relay's
/// name and log choice, each scope's own upstream (`scope_upstreams`, from the users
/// file), and `IDEMRELAY_UPSTREAM_PASSWORD`, which wins over the URL's password.
pub(crate) fn delivery(
    settings: &Settings,
    upstream: &SecretUrl,
    scope_upstreams: &BTreeMap<String, Option<String>>,
    metrics: Arc<Metrics>,
    before_queue: Option<Arc<BeforeQueue>>,
) -> anyhow::Result<DeliverySettings> {
    let password = std::env::var("IDEMRELAY_UPSTREAM_PASSWORD").ok();
    let mut scope_targets = std::collections::HashMap::new();
    for (scope, own) in scope_upstreams {
        if let Some(own) = own {
            let target = UpstreamTarget::parse(own, None)
                .with_context(|| format!("the upstream of scope {scope:?}"))?;
            scope_targets.insert(scope.clone(), target);
        }
    }
    let d = &settings.delivery;
    Ok(DeliverySettings {
        target: UpstreamTarget::parse(upstream.expose(), password)?,
        scope_targets,
        ca_file: d.ca_file.clone(),
        hostname: settings.hostname.clone(),
        timeouts: d.timeouts,
        retry: d.retry_policy(),
        workers: d.connections,
        scan_interval: d.scan_interval,
        rate_per_second: d.rate,
        burst: d.burst,
        breaker: d.breaker_policy(),
        pause_probe_interval: d.pause_probe_interval,
        max_per_connection: d.max_messages_per_connection,
        idle_close: d.idle_close,
        log_recipients: settings.log_recipients,
        metrics,
        before_queue,
    })
}
