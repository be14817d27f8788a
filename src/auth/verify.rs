//! Password checks against argon2id PHC strings, in a fixed set of reusable memory blocks.
//!
//! argon2 with the default parameters works in 19 MiB. Allocating that per check and freeing
//! it afterwards leaves it with the allocator: glibc raises its mmap threshold after the first
//! such free and then serves the next ones from per-thread arenas, which it does not give back,
//! so every failed AUTH used to leave about 19 MiB behind. Here the working memory
//! is allocated once per permitted concurrent check and reused: what a stream of failures can
//! cost is `slots × the largest m_cost`, whatever the number of attempts.

use std::sync::{Condvar, Mutex};

use argon2::password_hash::phc::Output;
use argon2::{Algorithm, Argon2, Block, Params, PasswordHash, Version};

/// How many password checks may run at once: one per CPU (argon2 is CPU-bound), which is
/// also how many memory blocks the pool ever holds.
pub(crate) fn concurrent_checks() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// The process's pool: every users file loaded shares it, so the bound holds across reloads.
pub(crate) fn pool() -> &'static MemoryPool {
    static POOL: std::sync::OnceLock<MemoryPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| MemoryPool::new(concurrent_checks()))
}

/// The memory blocks, handed to one check at a time.
pub(crate) struct MemoryPool {
    slots: usize,
    state: Mutex<PoolState>,
    returned: Condvar,
}

struct PoolState {
    free: Vec<Vec<Block>>,
    /// Blocks in existence, free or in use; never more than `slots`.
    created: usize,
}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().expect("argon2 pool");
        f.debug_struct("MemoryPool")
            .field("slots", &self.slots)
            .field("created", &state.created)
            .finish()
    }
}

impl MemoryPool {
    pub(crate) fn new(slots: usize) -> Self {
        MemoryPool {
            slots: slots.max(1),
            state: Mutex::new(PoolState {
                free: Vec::new(),
                created: 0,
            }),
            returned: Condvar::new(),
        }
    }

    /// Runs `work` with at least `blocks` blocks of memory, waiting for a free slot when all
    /// are in use (callers are blocking threads). A slot grows to the largest request it has
    /// served and never shrinks, so memory stays at `slots × the largest m_cost` in use.
    fn with_blocks<R>(&self, blocks: usize, work: impl FnOnce(&mut [Block]) -> R) -> R {
        let mut memory = {
            let mut state = self.state.lock().expect("argon2 pool");
            loop {
                if let Some(memory) = state.free.pop() {
                    break memory;
                }
                if state.created < self.slots {
                    state.created += 1;
                    break Vec::new();
                }
                state = self.returned.wait(state).expect("argon2 pool");
            }
        };
        if memory.len() < blocks {
            memory.resize(blocks, Block::default());
        }
        // Returned even if `work` panics, so a slot is never lost.
        struct Return<'a>(&'a MemoryPool, Option<Vec<Block>>);
        impl Drop for Return<'_> {
            fn drop(&mut self) {
                if let Some(memory) = self.1.take() {
                    if let Ok(mut state) = self.0.state.lock() {
                        state.free.push(memory);
                    }
                    self.0.returned.notify_one();
                }
            }
        }
        let mut guard = Return(self, Some(memory));
        let memory = guard.1.as_mut().expect("memory present");
        work(&mut memory[..blocks])
    }

    #[cfg(test)]
    /// How many blocks exist now (free or in use), for tests.
    pub(crate) fn created(&self) -> usize {
        self.state.lock().expect("argon2 pool").created
    }

    /// Whether `password` hashes to what `phc` holds. The comparison of the two outputs is
    /// constant-time (`Output`'s equality); the parameters, salt and algorithm come from
    /// the PHC string, as `PasswordVerifier` would take them.
    pub(crate) fn password_matches(&self, phc: &str, password: &str) -> bool {
        let Ok(hash) = PasswordHash::new(phc) else {
            return false;
        };
        let (Some(salt), Some(expected)) = (&hash.salt, &hash.hash) else {
            return false;
        };
        let Ok(algorithm) = Algorithm::try_from(hash.algorithm.as_str()) else {
            return false;
        };
        let version = match hash.version.map(Version::try_from).transpose() {
            Ok(version) => version.unwrap_or_default(),
            Err(_) => return false,
        };
        let Ok(params) = Params::try_from(&hash) else {
            return false;
        };
        let blocks = params.block_count();
        let argon2 = Argon2::new(algorithm, version, params);
        let mut buffer = [0u8; Output::MAX_LENGTH];
        let Some(out) = buffer.get_mut(..expected.len()) else {
            return false;
        };
        let hashed = self.with_blocks(blocks, |memory| {
            argon2.hash_password_into_with_memory(password.as_bytes(), salt, out, memory)
        });
        hashed.is_ok() && Output::new(out).is_ok_and(|computed| computed == *expected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argon2::{CustomizedPasswordHasher as _, PasswordHasher as _, PasswordVerifier as _};
    use std::sync::Arc;

    fn hash(password: &str, m_cost: u32) -> String {
        let params = Params::new(m_cost, 1, 1, None).expect("params");
        Argon2::default()
            .hash_password_with_params(password.as_bytes(), b"fixed-test-salt", params)
            .expect("hash")
            .to_string()
    }

    #[test]
    fn agrees_with_the_crates_own_verifier_on_reused_memory() {
        let pool = MemoryPool::new(1);
        // Bigger first, so later checks run on a slot full of another hash's state.
        let hashes = [
            hash("pw", 64),
            hash("pw", 8),
            hash("other", 32),
            hash("pw", 16),
        ];
        for phc in &hashes {
            for password in ["pw", "other", "", "pw "] {
                let parsed = PasswordHash::new(phc).unwrap();
                let want = Argon2::default()
                    .verify_password(password.as_bytes(), &parsed)
                    .is_ok();
                assert_eq!(
                    pool.password_matches(phc, password),
                    want,
                    "{phc} {password:?}"
                );
            }
        }
        assert_eq!(pool.created(), 1);
        // Other algorithms and versions are verified as the string says.
        let argon2i = Argon2::new(
            Algorithm::Argon2i,
            Version::V0x10,
            Params::new(8, 1, 1, None).unwrap(),
        )
        .hash_password_with_salt(b"pw", b"fixed-test-salt")
        .unwrap()
        .to_string();
        assert!(pool.password_matches(&argon2i, "pw"));
        assert!(!pool.password_matches(&argon2i, "px"));
        assert!(!pool.password_matches("not a hash", "pw"));
        assert!(!pool.password_matches("$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ", "pw"));
    }

    #[test]
    fn a_check_waits_while_every_slot_is_busy() {
        let pool = Arc::new(MemoryPool::new(2));
        let phc = hash("pw", 16);
        let (entered, inside) = std::sync::mpsc::channel();
        let release = Arc::new(std::sync::Barrier::new(3));
        let holders: Vec<_> = (0..2)
            .map(|_| {
                let (pool, entered, release) = (pool.clone(), entered.clone(), release.clone());
                std::thread::spawn(move || {
                    pool.with_blocks(8, |_| {
                        entered.send(()).unwrap();
                        release.wait();
                    })
                })
            })
            .collect();
        inside.recv().unwrap();
        inside.recv().unwrap();
        let third = {
            let (pool, phc) = (pool.clone(), phc.clone());
            std::thread::spawn(move || pool.password_matches(&phc, "pw"))
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !third.is_finished(),
            "a third check ran beside two busy slots"
        );
        release.wait();
        assert!(third.join().unwrap());
        for h in holders {
            h.join().unwrap();
        }
        assert_eq!(pool.created(), 2);

        // Many threads, many checks: still two blocks at most.
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (pool, phc) = (pool.clone(), phc.clone());
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        let password = if i % 2 == 0 { "pw" } else { "no" };
                        assert_eq!(pool.password_matches(&phc, password), i % 2 == 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(pool.created(), 2);
    }
}
