//! The store's queue counts for `/metrics`, and the console overview's health read, each read
//! at most once per `STATS_MAX_AGE`.
//!
//! Counting records by state reads an index of every record: 109 ms on a Postgres store of a
//! million records (and SQLite's count is of the same order), at every scrape, from every
//! scraper (a Prometheus pair, a dashboard). The counts are gauges a scrape samples anyway;
//! ten seconds old is as good for an alert as fresh, so they are cached rather than kept
//! up to date by every write (counters maintained in the intake's and the settle's commits
//! would cost every message a row lock for a figure read a few times a minute). The oldest
//! queued record's age is still computed at each scrape from its cached acceptance time.

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::store::{QueueStats, RelayHealth, Store, StoreError};

/// How old the counts shown may be.
pub(crate) const STATS_MAX_AGE: Duration = Duration::from_secs(10);

pub(crate) struct StatsCache {
    max_age: Duration,
    /// Held while the counts are read: scrapes that arrive meanwhile wait for that read
    /// instead of starting their own.
    last: Mutex<Option<(Instant, QueueStats)>>,
    /// The console overview's health read (`Store::relay_health`): it reads the whole attempt
    /// ledger (about 0.4 s for a million attempts on Postgres), and every open overview reloads
    /// itself every 15 s; one read per `max_age` serves them all.
    health: Mutex<Option<(Instant, RelayHealth)>>,
}

impl StatsCache {
    pub(crate) fn new(max_age: Duration) -> Self {
        StatsCache {
            max_age,
            last: Mutex::new(None),
            health: Mutex::new(None),
        }
    }

    /// The counts read at most `max_age` ago; a failed read is not cached.
    pub(crate) async fn get(&self, store: &dyn Store) -> Result<QueueStats, StoreError> {
        let mut last = self.last.lock().await;
        if let Some((at, stats)) = last.as_ref() {
            if at.elapsed() < self.max_age {
                return Ok(stats.clone());
            }
        }
        let stats = store.queue_stats().await?;
        *last = Some((Instant::now(), stats.clone()));
        Ok(stats)
    }

    /// After an operator changed a record's state: the next scrape counts afresh, so that
    /// an alert on the old count (an unresolved record just resolved) clears at once.
    pub(crate) async fn forget(&self) {
        *self.last.lock().await = None;
    }

    /// The relay's health read at most `max_age` ago, and how long ago: ages shown from it
    /// count on from its `read_at_ms` by that much, while whether a process was alive is told
    /// at the read.
    pub(crate) async fn health(
        &self,
        store: &dyn Store,
    ) -> Result<(RelayHealth, Duration), StoreError> {
        let mut last = self.health.lock().await;
        match last.as_ref() {
            Some((at, health)) if at.elapsed() < self.max_age => Ok((health.clone(), at.elapsed())),
            _ => {
                let health = store.relay_health().await?;
                *last = Some((Instant::now(), health.clone()));
                Ok((health, Duration::ZERO))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{test_record, Retention, State};

    fn queued(stats: &QueueStats) -> u64 {
        stats
            .by_state
            .iter()
            .find(|(state, _)| *state == State::Queued)
            .map_or(0, |(_, n)| *n)
    }

    #[tokio::test]
    async fn counts_are_read_again_only_once_older_than_the_max_age() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = crate::store::open(&url, Duration::from_secs(5))
            .await
            .unwrap();
        let retention = Retention::flat(Duration::from_secs(3600));
        let cache = StatsCache::new(Duration::from_millis(500));
        store
            .insert(&test_record("a", "a"), retention)
            .await
            .unwrap();
        assert_eq!(queued(&cache.get(store.as_ref()).await.unwrap()), 1);
        store
            .insert(&test_record("b", "b"), retention)
            .await
            .unwrap();
        assert_eq!(
            queued(&cache.get(store.as_ref()).await.unwrap()),
            1,
            "cached"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            queued(&cache.get(store.as_ref()).await.unwrap()),
            2,
            "read again"
        );
    }

    #[tokio::test]
    async fn the_health_read_is_cached_and_says_how_old_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = crate::store::open(&url, Duration::from_secs(5))
            .await
            .unwrap();
        let cache = StatsCache::new(Duration::from_millis(500));
        let (first, age) = cache.health(store.as_ref()).await.unwrap();
        assert_eq!(age, Duration::ZERO);
        store.heartbeat("host/1/abc").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (cached, age) = cache.health(store.as_ref()).await.unwrap();
        assert_eq!(cached, first, "cached");
        assert!(age >= Duration::from_millis(100), "{age:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (again, _) = cache.health(store.as_ref()).await.unwrap();
        assert_eq!(again.processes.len(), 1, "read again");
    }
}
