//! Crash points for the chaos test (`tests/chaos/chaos.rs`): named moments where a relay built with
//! `--features failpoints` can die as abruptly as on a power cut, so that the test can prove
//! that a crash at exactly the worst moment neither loses nor duplicates mail.
//!
//! `failpoint!("name")` expands to nothing without the feature. With it, a point fires with
//! the probability given in `IDEMRELAY_FAILPOINTS` (`name=p,name=p`, p per hit, from 0 to 1),
//! drawn from a generator seeded by `IDEMRELAY_FAILPOINT_SEED` (random when unset), and then
//! aborts the process: no destructors, no flush, no reply, exactly like SIGKILL at that line.
//!
//! The points (`NAMES`):
//! - `intake.before_commit`: the record and its job are written but not committed;
//! - `intake.after_commit`: committed, the client has not been answered yet;
//! - `delivery.after_intent`: the attempt's intent is in the ledger, nothing sent upstream;
//! - `delivery.after_upstream_ok`: the upstream answered 250, the outcome is not written.

/// A named crash point; nothing at all without the `failpoints` feature. The feature is the
/// calling crate's: each crate that places points forwards its `failpoints` to this one's.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {{
        #[cfg(feature = "failpoints")]
        $crate::failpoint::hit($name);
    }};
}

#[cfg(feature = "failpoints")]
pub use armed::{arm, hit, NAMES};

#[cfg(feature = "failpoints")]
mod armed {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    pub const NAMES: [&str; 4] = [
        "intake.before_commit",
        "intake.after_commit",
        "delivery.after_intent",
        "delivery.after_upstream_ok",
    ];

    pub(crate) const SPEC_ENV: &str = "IDEMRELAY_FAILPOINTS";
    pub(crate) const SEED_ENV: &str = "IDEMRELAY_FAILPOINT_SEED";

    struct Armed {
        odds: HashMap<&'static str, f64>,
        rng: Mutex<fastrand::Rng>,
    }

    static ARMED: OnceLock<Armed> = OnceLock::new();

    /// Reads the environment once and says loudly what is armed: a failpoints build must never
    /// pass unnoticed. A spec that cannot be read stops the relay at start, rather than letting
    /// a chaos run believe it injected faults that never fire.
    pub fn arm() {
        armed();
    }

    fn armed() -> &'static Armed {
        ARMED.get_or_init(|| match parse() {
            Ok(armed) => armed,
            Err(err) => {
                eprintln!("{SPEC_ENV}/{SEED_ENV}: {err}");
                std::process::abort();
            }
        })
    }

    fn parse() -> Result<Armed, String> {
        let spec = std::env::var(SPEC_ENV).unwrap_or_default();
        let mut odds = HashMap::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, p) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: expected name=probability"))?;
            let name = NAMES
                .iter()
                .copied()
                .find(|n| *n == name.trim())
                .ok_or_else(|| format!("unknown failpoint {name:?} (known: {NAMES:?})"))?;
            let p: f64 = p
                .trim()
                .parse()
                .map_err(|e| format!("{item:?}: probability: {e}"))?;
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{item:?}: probability must be within 0..=1"));
            }
            odds.insert(name, p);
        }
        let seed = match std::env::var(SEED_ENV) {
            Ok(s) => {
                let s = s.trim();
                s.strip_prefix("0x")
                    .map_or_else(|| s.parse(), |hex| u64::from_str_radix(hex, 16))
                    .map_err(|e| format!("seed {s:?}: {e}"))?
            }
            Err(_) => fastrand::u64(..),
        };
        if !odds.is_empty() {
            let mut armed: Vec<_> = odds.iter().map(|(n, p)| format!("{n}={p}")).collect();
            armed.sort();
            tracing::warn!(
                target: "idemrelay::failpoint",
                points = %armed.join(","),
                seed = format!("{seed:#x}"),
                "failpoints armed: this relay will abort on purpose"
            );
        }
        Ok(Armed {
            odds,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        })
    }

    /// Aborts the process when the named point is armed and its draw says so.
    pub fn hit(name: &'static str) {
        debug_assert!(NAMES.contains(&name), "failpoint {name} is not in NAMES");
        let armed = armed();
        let Some(&p) = armed.odds.get(name) else {
            return;
        };
        let draw = armed
            .rng
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .f64();
        if draw < p {
            // Straight to stderr (unbuffered), not through tracing: this is the last thing the
            // process does, and the test reads it to tell a failpoint from a SIGKILL.
            eprintln!("failpoint {name} fired: aborting");
            std::process::abort();
        }
    }
}
