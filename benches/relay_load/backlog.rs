//! `--backlog N`: a store filled by SQL with N records as intake would leave them (half
//! queued with their delivery jobs, due now; half delivered; keys of about 40 characters,
//! recipients and ~1.1 KB bodies of the usual shapes; no body checksum, which SQL cannot
//! compute: such a row is taken as written before checksums were kept), written while no
//! relay runs on the store. And the delivery switch, which the bench turns by SQL on the
//! store (as `idemrelay queue pause --direct` would).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::{Connection, Executor};

/// Fills a migrated SQLite store at `path`. One transaction, one statement (a recursive
/// series): the schema's triggers add each queued record's delivery job and scope turn and
/// count it, as for any insert. `synchronous = OFF` only for the fill itself: it is not
/// measured, and the file is complete once the connection closes.
pub fn fill_sqlite(path: &Path, records: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut conn = rusqlite::Connection::open(path)?;
    // A large cache: keys go into three indexes in random order.
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF; PRAGMA cache_size = -262144;",
    )?;
    let tx = conn.transaction()?;
    // Keys: a counter and 24 hex digits of multiplicative hashes of it (deterministic, since
    // the key is written twice, and in no particular order for the unique index, as from an
    // app); bodies: a subject line and 16 lines of 64 hex digits.
    tx.execute(
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1),
              h(n, hash) AS (SELECT n, printf('%08x%08x%08x', (n * 2654435761) % 4294967296,
                    (n * 2246822519) % 4294967296, (n * 3266489917) % 4294967296) FROM g),
              r(n, key, body) AS (SELECT n, 'app-order-' || n || '-' || hash,
                    'Subject: backlog ' || n || char(13, 10) || char(13, 10)
                    || replace(printf('%.16c', '~'), '~',
                        substr(hash || hash || hash, 1, 64) || char(13, 10)) FROM h)
         INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
            rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at,
            finished_at, content_hash, part, message_fp, upstream_key, header_message_id)
         SELECT printf('B%023d', n), 'default', key, 'header', randomblob(32),
            'app@example.com', 'user' || (n % 1000) || '@example.com', '7BIT', 0,
            length(body), CAST(body AS BLOB),
            CASE WHEN n % 2 = 0 THEN 'queued' ELSE 'delivered' END,
            '250 2.0.0 OK queued as B' || n, ?2 - 3600000 + n / 1000,
            CASE WHEN n % 2 = 1 THEN ?2 END, NULL, 1, randomblob(32), key,
            n || '@app.example.com'
         FROM r",
        rusqlite::params![i64::try_from(records)?, now_ms()],
    )?;
    // No ANALYZE by default: the relay never runs it, so a store that grew in service has no
    // statistics. With them (sqlite_stat4; the bundled SQLite has STAT4) every execution of a
    // statement with bound parameters is planned again, which halved the claim rate on this
    // store (perf: the writer in the SQL parser and planner). BENCH_SQLITE_ANALYZE=1 measures
    // that case.
    if std::env::var_os("BENCH_SQLITE_ANALYZE").is_some() {
        tx.execute_batch("ANALYZE")?;
    }
    tx.commit()?;
    conn.close().map_err(|(_, e)| e)?;
    println!(
        "  (SQLite store filled with {records} records in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Fills a migrated Postgres store in bulk SQL: the counting triggers are off while it runs,
/// and the tables are analyzed, vacuumed and checkpointed after, as a running server would soon do.
pub async fn fill_postgres(store_url: &str, records: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut conn = sqlx::PgConnection::connect(store_url).await?;
    conn.execute("ALTER TABLE messages DISABLE TRIGGER USER")
        .await?;
    sqlx::query(
        "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
            rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at,
            finished_at, content_hash, part, message_fp, upstream_key, header_message_id)
         SELECT 'B' || lpad(g::TEXT, 23, '0'), 'default',
            'app-order-' || g || '-' || left(md5(g::TEXT), 24), 'header', sha256(g::TEXT::BYTEA),
            'app@example.com', 'user' || (g % 1000) || '@example.com', '7BIT', false, 1100,
            convert_to('Subject: backlog ' || g || E'\r\n\r\n'
                || repeat(md5(g::TEXT) || md5(g::TEXT) || E'\r\n', 16), 'UTF8'),
            CASE WHEN g % 2 = 0 THEN 'queued' ELSE 'delivered' END,
            '250 2.0.0 OK queued as B' || g, idemrelay_now_ms() - 3600000 + g / 1000,
            CASE WHEN g % 2 = 1 THEN idemrelay_now_ms() END, NULL, 1,
            sha256(('m' || g)::BYTEA), 'app-order-' || g || '-' || left(md5(g::TEXT), 24),
            g || '@app.example.com'
         FROM generate_series(1, $1) g",
    )
    .bind(i64::try_from(records)?)
    .execute(&mut conn)
    .await?;
    conn.execute(
        "INSERT INTO delivery_jobs (message_id, scope, due_at)
            SELECT id, scope, accepted_at FROM messages WHERE state = 'queued';
         INSERT INTO scope_turns (scope, turn) VALUES ('default', 0) ON CONFLICT DO NOTHING;
         ALTER TABLE messages ENABLE TRIGGER USER;
         ANALYZE messages;
         ANALYZE delivery_jobs;",
    )
    .await?;
    // As a store that has held its records for a while: vacuumed (hint bits and the
    // visibility map set, not by the measured run's first reads) and checkpointed (the fill's
    // WAL not flushed inside the measured run). VACUUM cannot run in a transaction block,
    // which a multi-statement query is.
    for statement in ["VACUUM messages", "VACUUM delivery_jobs", "CHECKPOINT"] {
        conn.execute(statement).await?;
    }
    conn.close().await?;
    println!(
        "  (Postgres store filled with {records} records in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Pauses or resumes delivery on the store at `url` (an operator's pause: no probe lifts
/// it). A running relay sees it at its next claim: the claim itself checks the switch.
pub async fn set_paused(url: &str, paused: bool) -> anyhow::Result<()> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        let conn = rusqlite::Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.execute(
            "UPDATE delivery_control SET paused_at = CASE WHEN ?1 THEN ?2 END,
                reason = CASE WHEN ?1 THEN 'bench' END, probe = 0 WHERE id = 1",
            rusqlite::params![paused, now_ms()],
        )
        .context("set the delivery switch")?;
        return Ok(());
    }
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::query(
        "UPDATE delivery_control SET paused_at = CASE WHEN $1 THEN idemrelay_now_ms() END,
            reason = CASE WHEN $1 THEN 'bench' END, probe = false WHERE id = 1",
    )
    .bind(paused)
    .execute(&mut conn)
    .await?;
    conn.close().await?;
    Ok(())
}

/// The process ids of the Postgres backends serving the database of `url`, but for this
/// connection's own (read from the same machine's /proc for their CPU time).
pub async fn postgres_backends(url: &str) -> anyhow::Result<Vec<u32>> {
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    Ok(pids
        .into_iter()
        .filter_map(|p| u32::try_from(p).ok())
        .collect())
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("milliseconds fit")
}
