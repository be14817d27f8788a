//! `[delivery]`: how accepted messages are forwarded upstream.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::delivery::breaker::BreakerPolicy;
use crate::delivery::retry::RetryPolicy;
use crate::delivery::upstream::PhaseTimeouts;

/// How accepted messages are forwarded upstream (docs/concepts/delivery.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// PEM file of extra trusted CA certificates for the upstream's TLS (tests, private CAs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Concurrent upstream connections.
    pub connections: usize,
    pub max_messages_per_connection: usize,
    #[serde(with = "crate::human_duration")]
    pub idle_close: Duration,
    /// Upper bound between looks at the queue (intake also wakes the workers).
    #[serde(with = "crate::human_duration")]
    pub scan_interval: Duration,
    #[serde(with = "crate::human_duration")]
    pub retry_base: Duration,
    #[serde(with = "crate::human_duration")]
    pub retry_cap: Duration,
    pub max_attempts: u32,
    /// Give up (fail, or park as unresolved) this long after acceptance.
    #[serde(with = "crate::human_duration")]
    pub deadline: Duration,
    /// The upstream's idempotency window: an UNKNOWN outcome is retried only inside it.
    #[serde(with = "crate::human_duration")]
    pub upstream_window: Duration,
    #[serde(with = "crate::human_duration")]
    pub window_margin: Duration,
    /// A message still queued this long after acceptance sends its sender one delay notice,
    /// naming the recipients that asked for it with NOTIFY=DELAY; 0: never.
    #[serde(with = "crate::human_duration")]
    pub delay_notice_after: Duration,
    /// Upstream message rate (messages per second) and burst.
    pub rate: f64,
    pub burst: f64,
    /// Consecutive failures blaming the upstream itself (connect, greeting, TLS, AUTH, a
    /// session lost before MAIL FROM was answered, a 421) that open the circuit breaker.
    pub breaker_threshold: u32,
    #[serde(with = "crate::human_duration")]
    pub breaker_cooldown: Duration,
    /// How far back the breaker counts messages failing on their own (a 4xx after MAIL FROM,
    /// an unknown outcome after the dot).
    #[serde(with = "crate::human_duration")]
    pub breaker_window: Duration,
    /// Different messages (by recipients) that must have failed on their own within the window
    /// for the breaker to open; 0: such failures never open it.
    pub breaker_window_messages: u32,
    /// ... and the share of the messages seen within the window they must make up (0 to 1).
    pub breaker_window_ratio: f64,
    /// While paused for an account-level failure, how often the upstream is probed.
    #[serde(with = "crate::human_duration")]
    pub pause_probe_interval: Duration,
    /// One deadline per SMTP phase of the upstream conversation.
    pub timeouts: PhaseTimeouts,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        let retry = RetryPolicy::default();
        DeliveryConfig {
            ca_file: None,
            connections: 4,
            max_messages_per_connection: 100,
            idle_close: Duration::from_secs(50),
            scan_interval: Duration::from_secs(1),
            retry_base: retry.base,
            retry_cap: retry.cap,
            max_attempts: retry.max_attempts,
            deadline: retry.deadline,
            upstream_window: retry.window,
            window_margin: retry.window_margin,
            delay_notice_after: retry.delay_notice_after,
            rate: 50.0,
            burst: 50.0,
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(30),
            breaker_window: Duration::from_secs(60),
            breaker_window_messages: 10,
            breaker_window_ratio: 0.8,
            pause_probe_interval: Duration::from_secs(60),
            timeouts: PhaseTimeouts::default(),
        }
    }
}

impl DeliveryConfig {
    pub(crate) fn breaker_policy(&self) -> BreakerPolicy {
        BreakerPolicy {
            threshold: self.breaker_threshold,
            cooldown: self.breaker_cooldown,
            window: self.breaker_window,
            window_messages: self.breaker_window_messages,
            window_ratio: self.breaker_window_ratio,
        }
    }

    /// The breaker's window settings make sense together.
    pub(crate) fn validate_breaker(&self) -> anyhow::Result<()> {
        if !(0.0..=1.0).contains(&self.breaker_window_ratio) {
            anyhow::bail!("delivery: breaker_window_ratio must be between 0 and 1");
        }
        if self.breaker_window_messages > 0 && self.breaker_window.is_zero() {
            anyhow::bail!(
                "delivery: breaker_window must be positive (or breaker_window_messages 0)"
            );
        }
        Ok(())
    }

    pub(crate) fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            base: self.retry_base,
            cap: self.retry_cap,
            max_attempts: self.max_attempts,
            deadline: self.deadline,
            window: self.upstream_window,
            window_margin: self.window_margin,
            delay_notice_after: self.delay_notice_after,
        }
    }
}
