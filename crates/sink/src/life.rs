//! Whether the sink is up, down (and how) or shutting down, as every task of the sink watches
//! it; and the wall clock its records are stamped with. A leaf: the state, the SMTP side and
//! the webhook sender all read it.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// How the sink simulates an upstream that is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    /// Close the listening socket: connection attempts are refused.
    Refuse,
    /// Accept connections and greet them with `421 4.3.2`, then close.
    Greet421,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Life {
    Up,
    Down(Down),
    ShuttingDown,
}

/// Resolves once the sink has gone down since `life` was last seen, with how. A session
/// subscribes while the sink is up, so any change means it went down, also when a pause and a
/// resume came back to back and the sink is up again by the time this task looks (waiting for
/// "not up" missed those, and the connection lived through the outage). Never holds the watch
/// guard across an await (it is not `Send`).
pub(crate) async fn went_down(life: &mut watch::Receiver<Life>, last_down: &Mutex<Down>) -> Life {
    if life.changed().await.is_err() {
        return Life::ShuttingDown;
    }
    let now = *life.borrow_and_update();
    match now {
        Life::Up => Life::Down(*last_down.lock().expect("last_down")),
        down => down,
    }
}

pub(crate) async fn shutting_down(life: &mut watch::Receiver<Life>) {
    let _ = life.wait_for(|l| *l == Life::ShuttingDown).await;
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race behind a flaky `delivery_policy` test: a pause and a resume back to back, before
    /// the session's task runs. The session must still close, with the mode of the outage.
    #[tokio::test]
    async fn a_session_sees_an_outage_that_is_over_by_the_time_it_looks() {
        let life = watch::Sender::new(Life::Up);
        let last_down = Mutex::new(Down::Greet421);
        let mut session = life.subscribe();
        life.send_replace(Life::Down(Down::Greet421));
        life.send_replace(Life::Up);
        let seen = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            went_down(&mut session, &last_down),
        )
        .await
        .expect("the session missed the outage");
        assert_eq!(seen, Life::Down(Down::Greet421));

        // Still down when it looks: that mode, and the session is not woken again by nothing.
        life.send_replace(Life::Down(Down::Refuse));
        assert_eq!(
            went_down(&mut session, &last_down).await,
            Life::Down(Down::Refuse)
        );
        let quiet = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            went_down(&mut session, &last_down),
        )
        .await;
        assert!(quiet.is_err());
    }
}
