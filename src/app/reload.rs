//! Reloading on SIGHUP and on a timer: the TLS certificate and the users file.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::scopes::{admit_users, key_spaces, scope_upstreams};
use crate::auth::LiveUsers;
use crate::intake::Intake;
use crate::shutdown::Stop;
use crate::smtp::tls::TlsCerts;

/// What SIGHUP reloads.
pub(super) struct Reloadable {
    pub(super) tls: Option<Arc<TlsCerts>>,
    pub(super) users: Option<Arc<LiveUsers>>,
    pub(super) intake: Arc<Intake>,
    /// Where each scope's mail went at start: delivery keeps these targets until a restart.
    pub(super) scope_upstreams: BTreeMap<String, Option<String>>,
    pub(super) default_scope: String,
    /// The relay's own upstream, for the key spaces of scopes that use it.
    pub(super) relay_upstream: Option<String>,
}

impl Reloadable {
    fn reload_tls(&self, force: bool) {
        let Some(tls) = &self.tls else { return };
        match tls.reload(force) {
            Ok(true) => tracing::info!("TLS certificate reloaded"),
            Ok(false) => {}
            Err(err) => {
                tracing::error!(error = %format!("{err:#}"), "TLS certificate reload failed; the previous one stays in service")
            }
        }
    }

    fn reload_users(&self) {
        let Some(users) = &self.users else { return };
        let path = users.path().display().to_string();
        let admitted = users.reload(|new| {
            admit_users(&self.scope_upstreams, &self.default_scope, new)?;
            // Before any new user can log in, so that its very first key carries its scope.
            let wanted = scope_upstreams(&self.default_scope, Some(new));
            self.intake
                .set_key_spaces(key_spaces(&wanted, self.relay_upstream.as_deref()));
            Ok(())
        });
        match admitted {
            Ok(change) => tracing::info!(users_file = %path, "users file reloaded: {change}"),
            Err(err) => tracing::error!(
                users_file = %path,
                error = %format!("{err:#}"),
                "users file reload failed; the previous users stay in service"
            ),
        }
    }
}

/// Reloads on SIGHUP (the TLS certificate and the users file) and swaps in renewed
/// certificates when their files change.
pub(super) async fn reload_loop(
    what: Reloadable,
    mut hup: Option<tokio::signal::unix::Signal>,
    every: Duration,
    stop: Stop,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => what.reload_tls(false),
            Some(()) = async { hup.as_mut()?.recv().await } => {
                if what.tls.is_none() && what.users.is_none() {
                    tracing::info!("SIGHUP: nothing to reload (no TLS certificate, no users file)");
                }
                what.reload_tls(true);
                what.reload_users();
            }
            _ = stop.stopped() => return,
        }
    }
}
