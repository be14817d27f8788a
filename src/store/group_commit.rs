//! Group commit for SQLite: one writer task owns the write connection and runs every write
//! operation that is waiting, each under its own savepoint, in one `BEGIN IMMEDIATE ...
//! COMMIT`. One fsync then makes a whole batch durable, and each caller hears its result only
//! after that commit, so a 250 still follows its own row's durability. A failed operation is
//! rolled back to its savepoint without touching the others; a failed commit fails them all.
//!
//! One writer also means writers never queue on SQLite's lock inside the busy handler, whose
//! sleeps (up to 100 ms each) dominated latency under concurrency.

use std::future::Future;
use std::pin::Pin;

use sqlx::{Executor, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::StoreError;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Operations that wait longer than this join the next batch: it bounds the time one
/// transaction holds the write lock.
const MAX_BATCH: usize = 128;

/// A write operation: statements run on the writer's connection inside the batch.
pub trait Operation<T>:
    for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, StoreError>> + Send + 'static
{
}

impl<T, F> Operation<T> for F where
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, StoreError>>
        + Send
        + 'static
{
}

/// A queued operation with its reply channel, type-erased for the queue.
trait Queued: Send {
    fn run<'c>(self: Box<Self>, conn: &'c mut SqliteConnection) -> BoxFuture<'c, Box<dyn Ran>>;
    fn fail(self: Box<Self>, err: StoreError);
}

/// An operation that ran, holding its result until the batch's commit decides it.
trait Ran: Send {
    fn succeeded(&self) -> bool;
    fn settle(self: Box<Self>, commit: Result<(), &str>);
}

struct Pending<T, F> {
    op: F,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

struct Done<T> {
    result: Result<T, StoreError>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T: Send + 'static, F: Operation<T>> Queued for Pending<T, F> {
    fn run<'c>(self: Box<Self>, conn: &'c mut SqliteConnection) -> BoxFuture<'c, Box<dyn Ran>> {
        let Pending { op, reply } = *self;
        Box::pin(async move {
            let result = op(conn).await;
            Box::new(Done { result, reply }) as Box<dyn Ran>
        })
    }

    fn fail(self: Box<Self>, err: StoreError) {
        let _ = self.reply.send(Err(err));
    }
}

impl<T: Send> Ran for Done<T> {
    fn succeeded(&self) -> bool {
        self.result.is_ok()
    }

    fn settle(self: Box<Self>, commit: Result<(), &str>) {
        let result = match (self.result, commit) {
            (Ok(_), Err(why)) => Err(StoreError::CommitFailed(why.to_string())),
            (result, _) => result,
        };
        // The caller may have gone (its client hung up); what was committed stays committed.
        let _ = self.reply.send(result);
    }
}

#[derive(Clone)]
pub struct Writer {
    queue: mpsc::Sender<Box<dyn Queued>>,
}

impl Writer {
    /// Starts the writer task on `conn`, which it owns from now on.
    pub fn start(conn: SqliteConnection) -> Writer {
        let (queue, rx) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(run(conn, rx));
        Writer { queue }
    }

    /// Runs `op` in the next batch; its result is returned once the batch is committed.
    pub async fn write<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        // Spelled out (not `Operation<T>`) so that closures get their signature from it.
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, StoreError>>
            + Send
            + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Box::new(Pending { op, reply }))
            .await
            .map_err(|_| StoreError::WriterGone)?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }
}

async fn run(mut conn: SqliteConnection, mut rx: mpsc::Receiver<Box<dyn Queued>>) {
    let mut batch: Vec<Box<dyn Queued>> = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        commit_batch(&mut conn, std::mem::take(&mut batch)).await;
    }
}

/// The savepoint statements ride along with their neighbours (`RELEASE op; SAVEPOINT op`):
/// each statement sent costs a round trip to the connection's thread.
async fn commit_batch(conn: &mut SqliteConnection, batch: Vec<Box<dyn Queued>>) {
    let started = std::time::Instant::now();
    let ops = batch.len();
    if let Err(err) = conn.execute("BEGIN IMMEDIATE; SAVEPOINT op").await {
        // Ends a transaction that began before the savepoint failed; harmless otherwise.
        let _ = conn.execute("ROLLBACK").await;
        let why = err.to_string();
        for op in batch {
            op.fail(StoreError::CommitFailed(why.clone()));
        }
        return;
    }
    let mut ran: Vec<Box<dyn Ran>> = Vec::with_capacity(ops);
    for (n, op) in batch.into_iter().enumerate() {
        let done = op.run(conn).await;
        let close = match (done.succeeded(), n + 1 == ops) {
            (true, false) => "RELEASE op; SAVEPOINT op",
            (false, false) => "ROLLBACK TO op; RELEASE op; SAVEPOINT op",
            (true, true) => "RELEASE op; COMMIT",
            (false, true) => "ROLLBACK TO op; RELEASE op; COMMIT",
        };
        ran.push(done);
        if let Err(err) = conn.execute(close).await {
            // A savepoint that cannot be closed, or a failed COMMIT: nothing in this batch may
            // be reported as committed. End the transaction so the next batch starts clean.
            let _ = conn.execute("ROLLBACK").await;
            let why = err.to_string();
            for done in ran {
                done.settle(Err(&why));
            }
            return;
        }
    }
    for done in ran {
        done.settle(Ok(()));
    }
    tracing::debug!(
        target: "idemrelay::store",
        ops,
        micros = started.elapsed().as_micros() as u64,
        "group commit"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use sqlx::ConnectOptions;
    use std::time::Duration;

    fn options(dir: &tempfile::TempDir) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(dir.path().join("g.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_millis(100))
    }

    async fn writer(dir: &tempfile::TempDir) -> (Writer, SqliteConnection) {
        let mut reader = options(dir).connect().await.unwrap();
        reader
            .execute("CREATE TABLE t (v INTEGER PRIMARY KEY)")
            .await
            .unwrap();
        (Writer::start(options(dir).connect().await.unwrap()), reader)
    }

    fn insert(
        v: i64,
    ) -> impl for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<u64, StoreError>>
           + Send
           + 'static {
        move |tx: &mut SqliteConnection| {
            Box::pin(async move {
                Ok(sqlx::query("INSERT INTO t (v) VALUES (?)")
                    .bind(v)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected())
            })
        }
    }

    async fn values(reader: &mut SqliteConnection) -> Vec<i64> {
        sqlx::query_scalar("SELECT v FROM t ORDER BY v")
            .fetch_all(reader)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_failed_operation_is_rolled_back_alone_within_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (w, mut reader) = writer(&dir).await;
        // The first batch is held open, so everything queued meanwhile shares the next one.
        let slow = w.write(|_: &mut SqliteConnection| {
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(())
            })
        });
        let (slow, one, duplicate, two) = tokio::join!(
            slow,
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                w.write(insert(1)).await
            },
            async {
                tokio::time::sleep(Duration::from_millis(60)).await;
                // Violates the primary key: fails, and takes nothing else with it.
                w.write(|tx: &mut SqliteConnection| {
                    Box::pin(async move {
                        sqlx::query("INSERT INTO t (v) VALUES (3)")
                            .execute(&mut *tx)
                            .await?;
                        sqlx::query("INSERT INTO t (v) VALUES (1)")
                            .execute(&mut *tx)
                            .await?;
                        Ok(())
                    })
                })
                .await
            },
            async {
                tokio::time::sleep(Duration::from_millis(70)).await;
                w.write(insert(2)).await
            }
        );
        slow.unwrap();
        assert_eq!(one.unwrap(), 1);
        assert!(duplicate.is_err());
        assert_eq!(two.unwrap(), 1);
        assert_eq!(
            values(&mut reader).await,
            [1, 2],
            "3 was rolled back with its operation"
        );
    }

    #[tokio::test]
    async fn nothing_is_reported_written_when_the_batch_cannot_start() {
        let dir = tempfile::tempdir().unwrap();
        let (w, mut reader) = writer(&dir).await;
        let mut other = options(&dir).connect().await.unwrap();
        other.execute("BEGIN IMMEDIATE").await.unwrap();
        let refused = w.write(insert(7)).await;
        assert!(
            matches!(refused, Err(StoreError::CommitFailed(_))),
            "{refused:?}"
        );
        other.execute("ROLLBACK").await.unwrap();
        assert_eq!(w.write(insert(8)).await.unwrap(), 1);
        assert_eq!(values(&mut reader).await, [8]);
    }

    #[tokio::test]
    async fn concurrent_writers_all_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (w, mut reader) = writer(&dir).await;
        let writes = (0..200).map(|v| {
            let w = w.clone();
            tokio::spawn(async move { w.write(insert(v)).await })
        });
        for write in writes.collect::<Vec<_>>() {
            assert_eq!(write.await.unwrap().unwrap(), 1);
        }
        assert_eq!(values(&mut reader).await.len(), 200);
    }
}
