//! The upstream circuit breaker's state as a noun: the delivery workers move it, the metrics
//! count it and the admin pages show it, so it lives below all three.

/// The upstream circuit breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BreakerState {
    #[default]
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    /// Every state, the one at start first (the metrics' label values).
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];

    pub fn parse(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == label)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}
