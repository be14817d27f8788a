//! One AUTH attempt, from the credentials a client presented to the verdict: the lockout of a
//! client that keeps failing, the password check in a bounded pool, the failure counts, the
//! delay after a failure and the log line. The SMTP server hands it what the session's SASL
//! exchange produced and acts on the verdict; no socket here.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemrelay_smtp::sasl::Presented;

use super::live::LiveUsers;
use super::throttle::{client_key, AuthFailures, ThrottleLimits, Verdict};
use super::verify;
use idemrelay_model::Authenticated;

/// What the server does with an AUTH attempt.
#[derive(Debug)]
pub(crate) enum AuthVerdict {
    /// The client failed too often: refused before its password was checked, and the
    /// connection is closed.
    LockedOut,
    Authenticated(Authenticated),
    /// A wrong name or password (or no users file), after `failure_delay`.
    Failed,
}

/// Password checks are argon2 (tens of MB and ~100 ms each): at most a few run at once, and
/// failures are counted across reconnects per (client, user name) and per client, so that a
/// client that keeps failing is turned away for a while (see `throttle`).
pub(crate) struct AuthGate {
    running: tokio::sync::Semaphore,
    failures: Mutex<AuthFailures>,
    /// The users file in service (SIGHUP reloads it).
    users: Option<Arc<LiveUsers>>,
    /// Delay before answering a failed AUTH (slows password guessing).
    failure_delay: Duration,
}

impl AuthGate {
    pub(crate) fn new(
        limits: ThrottleLimits,
        users: Option<Arc<LiveUsers>>,
        failure_delay: Duration,
    ) -> Self {
        AuthGate {
            running: tokio::sync::Semaphore::new(verify::concurrent_checks()),
            failures: Mutex::new(AuthFailures::new(limits)),
            users,
            failure_delay,
        }
    }

    /// Checks `presented` for the client at `peer`.
    pub(crate) async fn attempt(&self, peer: IpAddr, presented: Presented) -> AuthVerdict {
        // Only names of existing users reach the log: a failed name may be a password typed
        // into the wrong field.
        let name = presented.user.clone();
        let known = self
            .users
            .as_ref()
            .is_some_and(|users| users.current().get(&name).is_some());
        let shown = if known { name.as_str() } else { "<unknown>" };
        let client = client_key(peer);
        if let Some(what) = lockout_reason(self.failures().check(client, &name, Instant::now())) {
            tracing::warn!(target: "idemrelay::auth", %peer, user = shown, "{what}");
            return AuthVerdict::LockedOut;
        }
        let user = match self.users.as_ref().map(|u| u.current()) {
            Some(users) => {
                let _turn = self.running.acquire().await.ok();
                tokio::task::spawn_blocking(move || {
                    users.verify(&presented.user, &presented.password)
                })
                .await
                .ok()
                .flatten()
            }
            None => None,
        };
        match user {
            Some(user) => {
                self.failures()
                    .record_success(client, &name, Instant::now());
                tracing::info!(target: "idemrelay::auth", user = %user.name, %peer, "authenticated");
                AuthVerdict::Authenticated(user)
            }
            None => {
                self.failures()
                    .record_failure(client, &name, Instant::now());
                tracing::warn!(target: "idemrelay::auth", %peer, user = shown, "authentication failed");
                tokio::time::sleep(self.failure_delay).await;
                AuthVerdict::Failed
            }
        }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, AuthFailures> {
        self.failures.lock().expect("auth failures")
    }
}

/// Why an AUTH attempt is refused before its password is checked, for the log line; `None`
/// when it may go ahead.
fn lockout_reason(verdict: Verdict) -> Option<&'static str> {
    match verdict {
        Verdict::Allowed => None,
        Verdict::UserLocked => {
            Some("too many failed logins for this user from this client; refused")
        }
        Verdict::AddressLocked => {
            Some("too many failed logins from this client, across user names; refused")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{lockout_reason, Verdict};

    #[test]
    fn lockouts_are_logged_with_their_reason() {
        let table = [
            (Verdict::Allowed, None),
            (Verdict::UserLocked, Some("for this user")),
            (Verdict::AddressLocked, Some("across user names")),
        ];
        for (verdict, want) in table {
            let got = lockout_reason(verdict);
            assert_eq!(got.is_some(), want.is_some(), "{verdict:?}");
            if let (Some(got), Some(want)) = (got, want) {
                assert!(got.contains(want), "{verdict:?}: {got}");
            }
        }
    }
}
