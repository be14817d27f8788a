//! A bound on the log lines that unauthenticated requests cause. Anyone who can reach a
//! listener can have requests refused as fast as the listener answers them; a line for each
//! would let one client fill the disk the store lives on. Each listener gets a few lines a
//! second; past that, refusals are only counted (they are in the metrics in full), and the
//! next line after the second is over says how many were left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines per second a listener writes about refused unauthenticated requests.
pub const LINES_PER_SECOND: u32 = 10;
const WINDOW: Duration = Duration::from_secs(1);

pub struct LogBudget {
    /// The listener's name in the "suppressed" line.
    listener: &'static str,
    window: Mutex<Window>,
}

struct Window {
    started: Instant,
    written: u32,
    suppressed: u64,
}

impl LogBudget {
    pub fn new(listener: &'static str) -> LogBudget {
        LogBudget {
            listener,
            window: Mutex::new(Window {
                started: Instant::now(),
                written: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether the caller may write its line now. At the first call after a second in which
    /// lines were held back, writes the line that says how many first.
    pub fn allow(&self) -> bool {
        let suppressed = {
            let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let mut ended = 0;
            if now.duration_since(w.started) >= WINDOW {
                ended = std::mem::take(&mut w.suppressed);
                w.started = now;
                w.written = 0;
            }
            if w.written >= LINES_PER_SECOND {
                w.suppressed += 1;
                return false;
            }
            w.written += 1;
            ended
        };
        if suppressed > 0 {
            tracing::warn!(
                target: "idemrelay::log",
                listener = self.listener,
                suppressed,
                "lines about refused unauthenticated requests were suppressed (at most {LINES_PER_SECOND} a second are written; the metrics count every refusal)"
            );
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_gets_its_lines_and_the_rest_is_counted() {
        let budget = LogBudget::new("test");
        let allowed = (0..1000).filter(|_| budget.allow()).count();
        assert_eq!(allowed, LINES_PER_SECOND as usize);
        assert_eq!(budget.window.lock().unwrap().suppressed, 1000 - 10);
        budget.window.lock().unwrap().started -= WINDOW;
        assert!(budget.allow());
        assert_eq!(budget.window.lock().unwrap().suppressed, 0);
    }
}
