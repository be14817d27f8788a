//! Group commit of the delivery side's one-statement writes on Postgres: the claim of the next
//! due job, the intent written before an attempt, and an outcome with nothing else to write
//! (no notice to queue, no event to match, no reply to change). Workers hand them to a few
//! writer tasks; a writer takes every write waiting and runs them in one transaction, each its
//! own statement, and answers each worker only after that COMMIT has returned (the
//! connection's `synchronous_commit` is at least `on`). One write alone runs as before, one
//! statement in its own commit: a lone worker waits no longer than it did. Claims in one
//! transaction each see the jobs the earlier ones leased and the turns they moved, as claims
//! committed one after the other do.
//!
//! Each intent and outcome is fenced by its lease token and touches its own job's row (a lease
//! has one holder, and a holder one write at a time), and a claim skips locked jobs and turns,
//! so the members of a batch never wait for each other's jobs. Final outcomes share one row, the day's count, so
//! a batch holds that row from its first final outcome to its COMMIT, as one outcome's
//! transaction did. A deadlock needs another transaction that holds a member's job and then
//! wants the day's count: an operator's or an upstream event's change to a record whose lease
//! ran out while its holder's write waited here. The server then ends one of the two; for a
//! batch that is a failure before its COMMIT (below), and the member, written alone, finds
//! its lease gone as it would have without the batch.
//!
//! A batch that fails before its COMMIT has committed nothing: each member is then written
//! alone, so one write that fails (a lock timeout behind an operator's action) never fails the
//! others. A failed COMMIT (its outcome unknown) fails every member, as it would a lone write;
//! the worker then treats it as it treats a lone write's lost answer.

use std::sync::Arc;

use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::Connection;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::ledger;
use crate::record::{AttemptResult, Settle, StoreError};

/// Two writers, so that one batch is written while the other waits for its commit's flush.
const WRITERS: usize = 2;
/// At most this many writes in one transaction.
const MAX_BATCH: usize = 64;
/// Writes waiting for a writer.
const QUEUE: usize = 1024;

/// A write of a lease holder that is one statement, fenced by the lease token. True when the
/// lease was still held (the write is in), false when it was lost (nothing written).
#[derive(Debug, Clone)]
pub(super) enum FencedWrite {
    /// The intent row, before the upstream is contacted.
    Intent {
        id: String,
        token: i64,
        attempt: u32,
    },
    /// An attempt's outcome (if one was made) and what follows, when nothing else is written
    /// with it.
    Outcome {
        id: String,
        token: i64,
        attempt: Option<(u32, AttemptResult)>,
        settle: Settle,
    },
}

impl FencedWrite {
    async fn run(&self, conn: &mut PgConnection) -> Result<bool, StoreError> {
        match self {
            FencedWrite::Intent { id, token, attempt } => {
                ledger::write_intent(conn, id, *token, *attempt).await
            }
            FencedWrite::Outcome {
                id,
                token,
                attempt,
                settle,
            } => {
                let attempt = attempt.as_ref().map(|(n, r)| (*n, r));
                ledger::write_plain_outcome(conn, id, *token, attempt, settle).await
            }
        }
    }
}

/// A write waiting for a writer, with where its answer goes.
enum Pending {
    Fenced {
        write: FencedWrite,
        answer: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// `idemrelay_claim` for `owner`: the claimed job's row, or none due.
    Claim {
        owner: String,
        lease_ms: i64,
        answer: oneshot::Sender<Result<Option<PgRow>, StoreError>>,
    },
}

/// What a write came to.
enum Done {
    Fenced(bool),
    Claim(Option<PgRow>),
}

impl Pending {
    async fn run(&self, conn: &mut PgConnection) -> Result<Done, StoreError> {
        match self {
            Pending::Fenced { write, .. } => write.run(conn).await.map(Done::Fenced),
            Pending::Claim {
                owner, lease_ms, ..
            } => ledger::claim_next(conn, owner, *lease_ms)
                .await
                .map(Done::Claim),
        }
    }

    /// Gives the worker its answer; a worker that gave up meanwhile finds its lease or
    /// intent in the store as if it had heard.
    fn answer(self, done: Result<Done, StoreError>) {
        match (self, done) {
            (Pending::Fenced { answer, .. }, Ok(Done::Fenced(wrote))) => {
                let _ = answer.send(Ok(wrote));
            }
            (Pending::Claim { answer, .. }, Ok(Done::Claim(row))) => {
                let _ = answer.send(Ok(row));
            }
            (Pending::Fenced { answer, .. }, Err(why)) => {
                let _ = answer.send(Err(why));
            }
            (Pending::Claim { answer, .. }, Err(why)) => {
                let _ = answer.send(Err(why));
            }
            (_, Ok(_)) => unreachable!("a write answered with another kind's result"),
        }
    }
}

/// The workers' side of the writers.
pub(super) struct GroupCommit {
    queue: mpsc::Sender<Pending>,
}

impl GroupCommit {
    /// Starts the writers on the current runtime; they stop when the `GroupCommit` is dropped.
    pub(super) fn start(pool: PgPool) -> GroupCommit {
        let (queue, waiting) = mpsc::channel(QUEUE);
        let waiting = Arc::new(Mutex::new(waiting));
        for _ in 0..WRITERS {
            tokio::spawn(writer(pool.clone(), waiting.clone()));
        }
        GroupCommit { queue }
    }

    /// Writes `write` in the next batch; answers after its commit.
    pub(super) async fn write(&self, write: FencedWrite) -> Result<bool, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Pending::Fenced { write, answer })
            .await
            .map_err(|_| StoreError::WriterGone)?;
        answered.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Claims the next due job for `owner` in the next batch; answers after its commit.
    pub(super) async fn claim(
        &self,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<PgRow>, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Pending::Claim {
                owner: owner.to_string(),
                lease_ms,
                answer,
            })
            .await
            .map_err(|_| StoreError::WriterGone)?;
        answered.await.map_err(|_| StoreError::WriterGone)?
    }
}

async fn writer(pool: PgPool, waiting: Arc<Mutex<mpsc::Receiver<Pending>>>) {
    while let Some(batch) = next_batch(&waiting, MAX_BATCH).await {
        write_batch(&pool, batch).await;
    }
}

/// The next batch for one of several writers sharing `waiting`: the first item to arrive and
/// every item waiting behind it, up to `max`. `None` once the senders are gone.
pub(super) async fn next_batch<T>(
    waiting: &Mutex<mpsc::Receiver<T>>,
    max: usize,
) -> Option<Vec<T>> {
    let mut waiting = waiting.lock().await;
    let first = waiting.recv().await?;
    let mut batch = vec![first];
    while batch.len() < max {
        match waiting.try_recv() {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
    Some(batch)
}

async fn write_batch(pool: &PgPool, mut batch: Vec<Pending>) {
    if batch.len() == 1 {
        let pending = batch.remove(0);
        let alone = write_alone(pool, &pending).await;
        pending.answer(alone);
        return;
    }
    match write_together(pool, &batch).await {
        Ok(results) => {
            for (pending, done) in batch.into_iter().zip(results) {
                pending.answer(Ok(done));
            }
        }
        Err(Failed::Uncommitted(why)) => {
            tracing::debug!(
                target: "idemrelay::store",
                writes = batch.len(),
                error = %why,
                "a batch of delivery writes failed before its commit; each is written alone"
            );
            for pending in batch {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let alone = write_alone(&pool, &pending).await;
                    pending.answer(alone);
                });
            }
        }
        Err(Failed::Commit(why)) => {
            let why = why.to_string();
            for pending in batch {
                pending.answer(Err(StoreError::CommitFailed(why.clone())));
            }
        }
    }
}

/// How a batch failed.
enum Failed {
    /// Before COMMIT: rolled back, nothing of it is in.
    Uncommitted(StoreError),
    /// At COMMIT: it may or may not be in.
    Commit(StoreError),
}

/// One write in its own commit: one statement, no transaction around it.
async fn write_alone(pool: &PgPool, pending: &Pending) -> Result<Done, StoreError> {
    let mut conn = pool.acquire().await?;
    pending.run(&mut conn).await
}

async fn write_together(pool: &PgPool, batch: &[Pending]) -> Result<Vec<Done>, Failed> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| Failed::Uncommitted(e.into()))?;
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| Failed::Uncommitted(e.into()))?;
    let mut results = Vec::with_capacity(batch.len());
    for pending in batch {
        match pending.run(&mut tx).await {
            Ok(result) => results.push(result),
            Err(why) => {
                // Rolled back when `tx` is dropped; nothing of the batch is in.
                return Err(Failed::Uncommitted(why));
            }
        }
    }
    tx.commit().await.map_err(|e| Failed::Commit(e.into()))?;
    Ok(results)
}
