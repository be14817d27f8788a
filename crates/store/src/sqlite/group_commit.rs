//! Group commit for SQLite: one writer thread owns the write connection and runs every write
//! operation that is waiting, each under its own savepoint, in one `BEGIN IMMEDIATE ...
//! COMMIT`. One fsync then makes a whole batch durable, and each caller hears its result only
//! after that commit, so a 250 still follows its own row's durability. A failed operation is
//! rolled back to its savepoint without touching the others; a failed commit fails them all.
//!
//! One writer also means writers never queue on SQLite's lock inside the busy handler, whose
//! sleeps (up to 100 ms each) dominated latency under concurrency. The writer is a thread of
//! its own with a synchronous connection (rusqlite) because an async driver hands every
//! statement to another thread and back: those handoffs, not SQLite, bounded throughput.

use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::record::StoreError;

/// Operations that wait longer than this join the next batch: it bounds the time one
/// transaction holds the write lock.
const MAX_BATCH: usize = 256;

/// A queued operation with its reply channel, type-erased for the queue.
trait Queued: Send {
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn Ran>;
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

impl<T, F> Queued for Pending<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn Ran> {
        let Pending { op, reply } = *self;
        Box::new(Done {
            result: op(conn),
            reply,
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

/// What the writer does around each batch besides SQL (the spool's sync and sealing).
pub(crate) trait BatchHooks: Send {
    /// Just before COMMIT; an error fails the whole batch.
    fn before_commit(&mut self) -> Result<(), String>;
    /// After the batch ended, committed or not.
    fn after_batch(&mut self);
}

#[derive(Clone)]
pub(crate) struct Writer {
    queue: mpsc::Sender<Box<dyn Queued>>,
}

impl Writer {
    /// Starts the writer thread on `conn`, which it owns from now on. The thread ends when
    /// the last `Writer` is dropped.
    pub(crate) fn start(
        conn: Connection,
        hooks: Option<Box<dyn BatchHooks>>,
    ) -> std::io::Result<Writer> {
        let (queue, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || run(conn, rx, hooks))?;
        Ok(Writer { queue })
    }

    /// Runs `op` in the next batch; its result is returned once the batch is committed.
    pub(crate) async fn write<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Box::new(Pending { op, reply }))
            .map_err(|_| StoreError::WriterGone)?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }
}

fn run(
    conn: Connection,
    rx: mpsc::Receiver<Box<dyn Queued>>,
    mut hooks: Option<Box<dyn BatchHooks>>,
) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        commit_batch(&conn, batch, hooks.as_deref_mut());
        if let Some(hooks) = hooks.as_deref_mut() {
            hooks.after_batch();
        }
    }
}

/// The statements every batch and operation runs, prepared once: `execute_batch` would parse
/// them again each time, on the one writer thread.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn commit_batch(
    conn: &Connection,
    batch: Vec<Box<dyn Queued>>,
    hooks: Option<&mut (dyn BatchHooks + 'static)>,
) {
    let started = std::time::Instant::now();
    let ops = batch.len();
    if let Err(err) = run_cached(conn, "BEGIN IMMEDIATE") {
        let why = err.to_string();
        for op in batch {
            op.fail(StoreError::CommitFailed(why.clone()));
        }
        return;
    }
    let mut ran: Vec<Box<dyn Ran>> = Vec::with_capacity(ops);
    let mut broken = None;
    // A batch of one needs no savepoint: if its operation fails, the whole transaction is
    // rolled back, and it holds nothing else. That is two statements fewer per message when
    // clients come one at a time, where nearly every batch is single.
    let alone = ops == 1;
    for op in batch {
        if broken.is_some() {
            op.fail(StoreError::CommitFailed(
                "an earlier operation broke the batch".into(),
            ));
            continue;
        }
        let opened = if alone {
            Ok(())
        } else {
            run_cached(conn, "SAVEPOINT op")
        };
        if let Err(err) = opened {
            broken = Some(err.to_string());
            op.fail(err.into());
            continue;
        }
        // A panicking operation must not take the writer (and so every later write) with it;
        // its caller hears that the writer dropped its reply, and the batch is not committed.
        let done = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op.run(conn))) {
            Ok(done) => done,
            Err(_) => {
                broken = Some("a write operation panicked".into());
                continue;
            }
        };
        let closed = if alone {
            if !done.succeeded() {
                // Not committed; the operation keeps its own error (see `settle`).
                broken = Some("the batch's only operation failed".into());
            }
            Ok(())
        } else if done.succeeded() {
            run_cached(conn, "RELEASE op")
        } else {
            conn.execute_batch("ROLLBACK TO op; RELEASE op")
        };
        if let Err(err) = closed {
            // The savepoint cannot be closed: the transaction's state is unknown, so nothing
            // in it may be reported as committed.
            broken = Some(err.to_string());
        }
        ran.push(done);
    }
    let ready = match (broken, hooks) {
        (Some(why), _) => Err(why),
        (None, Some(hooks)) => hooks.before_commit(),
        (None, None) => Ok(()),
    };
    let commit = ready.and_then(|()| run_cached(conn, "COMMIT").map_err(|err| err.to_string()));
    if commit.is_err() {
        // End the transaction (a failed COMMIT may leave it open) so the next batch starts
        // clean; harmless when there is none.
        let _ = conn.execute_batch("ROLLBACK");
    }
    for done in ran {
        done.settle(commit.as_ref().map(|_| ()).map_err(String::as_str));
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
    use std::time::Duration;

    fn open(dir: &tempfile::TempDir) -> Connection {
        let conn = Connection::open(dir.path().join("g.db")).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL")
            .unwrap();
        conn.busy_timeout(Duration::from_millis(100)).unwrap();
        conn
    }

    fn writer(dir: &tempfile::TempDir) -> (Writer, Connection) {
        writer_with(dir, None)
    }

    fn writer_with(
        dir: &tempfile::TempDir,
        hooks: Option<Box<dyn BatchHooks>>,
    ) -> (Writer, Connection) {
        let reader = open(dir);
        reader
            .execute_batch("CREATE TABLE t (v INTEGER PRIMARY KEY)")
            .unwrap();
        (Writer::start(open(dir), hooks).unwrap(), reader)
    }

    /// Holds the writer's first batch open for 200 ms, so that everything queued meanwhile
    /// shares the next one.
    async fn hold_first_batch(w: &Writer) -> Result<(), StoreError> {
        w.write(|_: &Connection| {
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        })
        .await
    }

    fn insert(v: i64) -> impl FnOnce(&Connection) -> Result<usize, StoreError> + Send + 'static {
        move |conn: &Connection| Ok(conn.execute("INSERT INTO t (v) VALUES (?)", [v])?)
    }

    fn values(reader: &Connection) -> Vec<i64> {
        let mut stmt = reader.prepare("SELECT v FROM t ORDER BY v").unwrap();
        let rows = stmt.query_map([], |row| row.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    #[tokio::test]
    async fn a_failed_operation_is_rolled_back_alone_within_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (w, reader) = writer(&dir);
        let slow = hold_first_batch(&w);
        let (slow, one, duplicate, two) = tokio::join!(
            slow,
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                w.write(insert(1)).await
            },
            async {
                tokio::time::sleep(Duration::from_millis(60)).await;
                // Violates the primary key: fails, and takes nothing else with it.
                w.write(|conn: &Connection| {
                    conn.execute("INSERT INTO t (v) VALUES (3)", [])?;
                    conn.execute("INSERT INTO t (v) VALUES (1)", [])?;
                    Ok(())
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
            values(&reader),
            [1, 2],
            "3 was rolled back with its operation"
        );
    }

    /// A batch of one runs without a savepoint: its failure must still undo what it wrote,
    /// keep its own error, and leave the writer ready for the next batch.
    #[tokio::test]
    async fn a_failed_operation_alone_in_its_batch_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (w, reader) = writer(&dir);
        assert_eq!(w.write(insert(1)).await.unwrap(), 1);
        let duplicate = w
            .write(|conn: &Connection| {
                conn.execute("INSERT INTO t (v) VALUES (3)", [])?;
                conn.execute("INSERT INTO t (v) VALUES (1)", [])?;
                Ok(())
            })
            .await;
        assert!(
            matches!(&duplicate, Err(err) if !matches!(err, StoreError::CommitFailed(_))),
            "the operation's own error, got {duplicate:?}"
        );
        assert_eq!(w.write(insert(2)).await.unwrap(), 1);
        assert_eq!(
            values(&reader),
            [1, 2],
            "3 was rolled back with its operation"
        );
    }

    struct FailingSync;

    impl BatchHooks for FailingSync {
        fn before_commit(&mut self) -> Result<(), String> {
            Err("spool sync failed: EIO".into())
        }
        fn after_batch(&mut self) {}
    }

    #[tokio::test]
    async fn a_failed_hook_before_commit_fails_the_whole_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (w, reader) = writer_with(&dir, Some(Box::new(FailingSync)));
        let (one, two) = tokio::join!(w.write(insert(1)), w.write(insert(2)));
        for result in [one, two] {
            assert!(matches!(result, Err(StoreError::CommitFailed(why)) if why.contains("EIO")));
        }
        assert!(values(&reader).is_empty(), "nothing was committed");
    }

    #[tokio::test]
    async fn nothing_is_reported_written_when_the_batch_cannot_start() {
        let dir = tempfile::tempdir().unwrap();
        let (w, reader) = writer(&dir);
        let other = open(&dir);
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let refused = w.write(insert(7)).await;
        assert!(
            matches!(refused, Err(StoreError::CommitFailed(_))),
            "{refused:?}"
        );
        other.execute_batch("ROLLBACK").unwrap();
        assert_eq!(w.write(insert(8)).await.unwrap(), 1);
        assert_eq!(values(&reader), [8]);
    }

    #[tokio::test]
    async fn a_panicking_operation_fails_its_batch_but_not_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let (w, reader) = writer(&dir);
        let slow = hold_first_batch(&w);
        let (slow, one, boom) = tokio::join!(
            slow,
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                w.write(insert(1)).await
            },
            async {
                tokio::time::sleep(Duration::from_millis(60)).await;
                w.write(|_: &Connection| -> Result<(), StoreError> { panic!("bug") })
                    .await
            }
        );
        slow.unwrap();
        assert!(one.is_err(), "its batch was not committed");
        assert!(boom.is_err());
        assert_eq!(w.write(insert(2)).await.unwrap(), 1, "the writer lives on");
        assert_eq!(values(&reader), [2]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writers_all_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (w, reader) = writer(&dir);
        let writes = (0..200).map(|v| {
            let w = w.clone();
            tokio::spawn(async move { w.write(insert(v)).await })
        });
        for write in writes.collect::<Vec<_>>() {
            assert_eq!(write.await.unwrap().unwrap(), 1);
        }
        assert_eq!(values(&reader).len(), 200);
    }
}
