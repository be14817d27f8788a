//! The relay's shutdown, in the order `app::Relay::shutdown` runs it: the stop signal (SMTP
//! and webhook listeners, background loops and delivery workers), the drain of the SMTP
//! sessions in flight, and last the admin listener, which outlives the drain so health checks
//! see it. A leaf: the modules that stop with the relay take their handle from here, not
//! from `app`.

use std::future::Future;

use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Owned by the running relay; hands out the signals and the session tracker.
pub(crate) struct Shutdown {
    /// Cancelled by `finish`; `stop` is its child, so it covers both.
    last: CancellationToken,
    stop: CancellationToken,
    /// This handle's own hold on the drain, let go when the drain is waited for.
    sessions: Option<Sessions>,
    /// Yields `None` once every `Sessions` clone (and every task holding one) is gone.
    sessions_gone: mpsc::Receiver<()>,
    /// A relay dropped without `shutdown` still stops everything (without a drain): its
    /// tasks must not outlive it serving with nobody to stop them.
    _stop_on_drop: DropGuard,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}

impl Shutdown {
    pub(crate) fn new() -> Shutdown {
        let last = CancellationToken::new();
        let stop = last.child_token();
        // Nothing is ever sent: the channel only counts its senders.
        let (held, sessions_gone) = mpsc::channel(1);
        Shutdown {
            _stop_on_drop: last.clone().drop_guard(),
            last,
            stop,
            sessions: Some(Sessions { _held: held }),
            sessions_gone,
        }
    }

    /// For everything that stops when shutdown begins.
    pub(crate) fn stop_signal(&self) -> Stop {
        Stop(self.stop.clone())
    }

    /// For the admin listener: it stops at `finish`, after the drain.
    pub(crate) fn last_signal(&self) -> Stop {
        Stop(self.last.clone())
    }

    /// For the SMTP listeners: `sessions_ended` waits for what they spawn through it.
    pub(crate) fn sessions(&self) -> Sessions {
        self.sessions
            .clone()
            .expect("sessions are handed out before the drain")
    }

    /// Listeners stop accepting, idle sessions are told 421, loops and workers return.
    pub(crate) fn begin(&self) {
        self.stop.cancel();
    }

    /// Resolves once every listener holding a `Sessions` and every session it spawned has
    /// ended. Only meaningful after `begin`: listeners hold theirs until then.
    pub(crate) async fn sessions_ended(&mut self) {
        self.sessions = None;
        self.sessions_gone.recv().await;
    }

    /// Stops the admin listener.
    pub(crate) fn finish(&self) {
        self.last.cancel();
    }
}

/// A stop signal: cheap to clone, one per task that watches it.
#[derive(Clone, Debug)]
pub(crate) struct Stop(CancellationToken);

impl Stop {
    /// Whether the signal has been given (health turns 503, a new connection gets 421).
    pub(crate) fn is_stopping(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once the signal is given, at once if it already was.
    pub(crate) async fn stopped(&self) {
        self.0.cancelled().await
    }
}

/// Held by each task the drain waits for.
#[derive(Clone, Debug)]
pub(crate) struct Sessions {
    /// Never sent on: only dropped, which is what the drain counts.
    _held: mpsc::Sender<()>,
}

impl Sessions {
    /// Spawns `task`; the drain waits for it to end.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let held = self.clone();
        tokio::spawn(async move {
            let _held = held;
            task.await
        });
    }
}

/// Installs the SIGTERM/SIGINT handlers now; the returned future resolves on either signal.
pub(crate) fn termination_signal() -> std::io::Result<impl Future<Output = ()>> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_admin_signal_outlives_the_stop_signal() {
        let shutdown = Shutdown::new();
        let (stop, last) = (shutdown.stop_signal(), shutdown.last_signal());
        assert!(!stop.is_stopping() && !last.is_stopping());
        shutdown.begin();
        assert!(stop.is_stopping());
        assert!(!last.is_stopping());
        stop.stopped().await;
        shutdown.finish();
        assert!(last.is_stopping());
        last.stopped().await;
    }

    #[tokio::test]
    async fn a_dropped_handle_stops_everything() {
        let shutdown = Shutdown::new();
        let (stop, last) = (shutdown.stop_signal(), shutdown.last_signal());
        drop(shutdown);
        assert!(stop.is_stopping() && last.is_stopping());
    }

    #[tokio::test]
    async fn the_drain_waits_for_every_session() {
        let mut shutdown = Shutdown::new();
        let sessions = shutdown.sessions();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        sessions.spawn(async move {
            let _ = rx.await;
        });
        drop(sessions);
        shutdown.begin();
        let waited = tokio::time::timeout(Duration::from_millis(50), shutdown.sessions_ended());
        assert!(waited.await.is_err(), "a session is still running");
        tx.send(()).unwrap();
        shutdown.sessions_ended().await;
    }

    #[tokio::test]
    async fn the_drain_of_nothing_ends_at_once() {
        let mut shutdown = Shutdown::new();
        shutdown.begin();
        shutdown.sessions_ended().await;
    }
}
