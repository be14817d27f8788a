//! Whether the store was writable when this process last wrote to it or probed it. Intake
//! records every commit's result, a periodic probe notices an outage (and its end) without
//! waiting for a submission, the SMTP listeners refuse new connections while it is down (fail
//! closed), and `/readyz` shows it.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::backend::Store;

#[derive(Debug)]
pub struct StoreHealth {
    writable: AtomicBool,
}

impl Default for StoreHealth {
    /// Writable until a write or a probe says otherwise: the store was just opened.
    fn default() -> Self {
        StoreHealth {
            writable: AtomicBool::new(true),
        }
    }
}

impl StoreHealth {
    pub fn is_writable(&self) -> bool {
        self.writable.load(Ordering::Relaxed)
    }

    /// Records what a write or a probe found; returns what was known before.
    pub fn record(&self, writable: bool) -> bool {
        self.writable.swap(writable, Ordering::Relaxed)
    }

    /// Probes `store` and records the result; returns whether it is writable.
    pub async fn probe(&self, store: &dyn Store) -> bool {
        let ok = match store.probe().await {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(target: "idemrelay::store", error = %err, "store probe failed");
                false
            }
        };
        let was = self.record(ok);
        if ok && !was {
            tracing::info!(target: "idemrelay::store", "store writable again; accepting connections");
        }
        ok
    }
}
