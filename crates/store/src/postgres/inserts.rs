//! The statements that write a new record: its message row and its delivery job. Intake's
//! writers run them, and so do a settle that queues a delivery status notice and an
//! operator's requeue.

use sqlx::postgres::PgConnection;

use crate::record::{body_checksum, KeySource, NewRecord, StoreError};

/// Binds a new record's columns as $1..$21, in the order of `messages`' insert statements
/// (`insert_message` here, the batch's in `intake_writers.rs`).
pub(super) fn bind_new_record<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    record: &'q NewRecord,
    now: i64,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(&record.id)
        .bind(&record.scope)
        .bind(&record.key)
        .bind(KeySource::stored(record.key_source))
        .bind(&record.fingerprint.as_bytes()[..])
        .bind(&record.envelope.mail_from)
        .bind(record.envelope.rcpt_to.join("\n"))
        .bind(record.envelope.body.as_str())
        .bind(record.envelope.smtputf8)
        .bind(i64::try_from(record.size).unwrap_or(i64::MAX))
        .bind(record.content.as_deref())
        .bind(record.state.as_str())
        .bind(&record.reply)
        .bind(now)
        .bind(&record.dsn_of)
        .bind(
            record
                .content
                .as_deref()
                .map(|body| body_checksum(body).to_vec()),
        )
        .bind(i64::from(record.part))
        .bind(&record.message_fp.as_bytes()[..])
        .bind(&record.upstream_key)
        .bind(&record.message_id)
        .bind(record.envelope.requests.to_stored())
}

/// Inserts a message row unless its (scope, key) is taken; returns the rows inserted.
pub(super) async fn insert_message(
    conn: &mut PgConnection,
    record: &NewRecord,
    now: i64,
) -> Result<u64, StoreError> {
    Ok(bind_new_record(
        sqlx::query(
            "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
            rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at, dsn_of,
            content_hash, part, message_fp, upstream_key, header_message_id, requests)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
            $18, $19, $20, $21)
         ON CONFLICT (scope, idem_key, part) DO NOTHING",
        ),
        record,
        now,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// A job due `now`, filed under its message's scope, which gets a turn row if it is new.
pub(super) async fn insert_job(
    conn: &mut PgConnection,
    id: &str,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "WITH job AS (
            INSERT INTO delivery_jobs (message_id, scope, due_at)
                SELECT id, scope, $2 FROM messages WHERE id = $1
                RETURNING scope)
         INSERT INTO scope_turns (scope, turn) SELECT scope, 0 FROM job
             ON CONFLICT (scope) DO NOTHING",
    )
    .bind(id)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
