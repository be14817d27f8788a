//! The store read from outside the relay: open intents, jobs and leases, and the ledger of
//! attempts and messages.

use super::*;

pub(super) async fn pool(db: &Path) -> SqlitePool {
    SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the relay's database")
}

/// Intents written but not completed (a worker was inside an attempt): (message id, attempt).
pub(super) async fn open_intents(db: &Path) -> BTreeSet<(String, i64)> {
    let pool = pool(db).await;
    let rows = sqlx::query("SELECT message_id, attempt FROM attempts WHERE outcome IS NULL")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| (r.get("message_id"), r.get("attempt")))
        .collect()
}

/// The keys of the messages with an open intent.
pub(super) async fn open_intent_keys(db: &Path) -> BTreeSet<String> {
    let pool = pool(db).await;
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT m.idem_key FROM attempts a JOIN messages m ON m.id = a.message_id
         WHERE a.outcome IS NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    keys.into_iter().collect()
}

/// The queue and the ledger as text, for failure messages.
pub(super) async fn jobs_dump(db: &Path) -> String {
    let pool = pool(db).await;
    let jobs = sqlx::query(
        "SELECT j.message_id, m.idem_key, j.due_at, j.lease_owner, j.lease_until
         FROM delivery_jobs j JOIN messages m ON m.id = j.message_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut out = String::new();
    for r in &jobs {
        let (id, key, due, owner, until): (
            String,
            Option<String>,
            i64,
            Option<String>,
            Option<i64>,
        ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        out.push_str(&format!(
            "\n  job {id} {key:?} due {due} lease {owner:?} until {until:?}"
        ));
    }
    let attempts =
        sqlx::query("SELECT message_id, attempt, owner, started_at, outcome, reply FROM attempts")
            .fetch_all(&pool)
            .await
            .unwrap();
    for r in &attempts {
        let (id, n, owner, started, outcome, reply): (
            String,
            i64,
            String,
            i64,
            Option<String>,
            Option<String>,
        ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
        out.push_str(&format!(
            "\n  attempt {id} #{n} by {owner} at {started}: {outcome:?} {reply:?}"
        ));
    }
    pool.close().await;
    out
}

/// Jobs held under a lease that has not run out.
pub(super) async fn leased_jobs(db: &Path) -> i64 {
    let pool = pool(db).await;
    let now = common::now_ms();
    let n = sqlx::query_scalar("SELECT COUNT(*) FROM delivery_jobs WHERE lease_until > ?")
        .bind(now)
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

#[derive(Debug, Clone)]
pub(super) struct AttemptRow {
    pub(super) attempt: i64,
    pub(super) outcome: Option<String>,
    pub(super) phase: Option<String>,
    pub(super) code: Option<i64>,
    pub(super) reply: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) struct MessageRow {
    pub(super) id: String,
    pub(super) key: Option<String>,
    pub(super) state: String,
    pub(super) content: Option<Vec<u8>>,
    pub(super) upstream_reply: Option<String>,
}

pub(super) struct Ledger {
    pub(super) messages: Vec<MessageRow>,
    pub(super) attempts: BTreeMap<String, Vec<AttemptRow>>,
    pub(super) jobs: i64,
}

impl Ledger {
    pub(super) async fn read(db: &Path) -> Ledger {
        let pool = pool(db).await;
        let messages = sqlx::query(
            "SELECT id, idem_key, state, content, upstream_reply FROM messages ORDER BY id",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| MessageRow {
            id: r.get("id"),
            key: r.get("idem_key"),
            state: r.get("state"),
            content: r.get("content"),
            upstream_reply: r.get("upstream_reply"),
        })
        .collect();
        let rows = sqlx::query(
            "SELECT message_id, attempt, outcome, phase, code, reply FROM attempts
             ORDER BY message_id, attempt",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let mut attempts: BTreeMap<String, Vec<AttemptRow>> = BTreeMap::new();
        for r in &rows {
            attempts
                .entry(r.get("message_id"))
                .or_default()
                .push(AttemptRow {
                    attempt: r.get("attempt"),
                    outcome: r.get("outcome"),
                    phase: r.get("phase"),
                    code: r.get("code"),
                    reply: r.get("reply"),
                });
        }
        let jobs = sqlx::query_scalar("SELECT COUNT(*) FROM delivery_jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        Ledger {
            messages,
            attempts,
            jobs,
        }
    }

    pub(super) fn attempts_of(&self, id: &str) -> &[AttemptRow] {
        self.attempts.get(id).map_or(&[], Vec::as_slice)
    }

    pub(super) fn by_id(&self, id: &str) -> &MessageRow {
        self.messages
            .iter()
            .find(|m| m.id == id)
            .unwrap_or_else(|| panic!("no record {id}"))
    }
}
