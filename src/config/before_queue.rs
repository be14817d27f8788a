//! `[before_queue]`: listeners whose clients hear the upstream's verdict at the end of DATA
//! (docs/guides/before-queue.md).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};

/// The before-queue mode: opt-in, per listener.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BeforeQueueConfig {
    /// Plain listeners (the same clients as `listen`: `allow_networks`, or AUTH) whose
    /// clients wait at the end of DATA for the upstream's answer.
    pub listen: Vec<SocketAddr>,
    /// How long a client waits for the upstream's answer before it is told `250 queued`.
    #[serde(with = "crate::human_duration")]
    pub wait: Duration,
    /// Upstream connections kept for these immediate sends, besides `delivery.connections`.
    pub connections: usize,
}

/// SMTP clients wait 10 minutes for the reply to the final dot (RFC 5321 4.5.3.2.6); the
/// bound stays well inside it.
const MAX_WAIT: Duration = Duration::from_secs(300);

impl Default for BeforeQueueConfig {
    fn default() -> Self {
        BeforeQueueConfig {
            listen: Vec::new(),
            wait: Duration::from_secs(30),
            connections: 4,
        }
    }
}

impl BeforeQueueConfig {
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.wait.is_zero() || self.wait > MAX_WAIT {
            bail!("before_queue.wait must be positive and at most 5m (clients wait 10m for the reply to the final dot)");
        }
        if self.connections == 0 {
            bail!("before_queue.connections must be positive");
        }
        Ok(())
    }

    /// True when some listener uses the mode.
    pub(crate) fn in_use(&self) -> bool {
        !self.listen.is_empty()
    }
}
