//! Matching upstream events to records on Postgres: the same steps as SQLite's
//! (`sqlite::webhook`), inside the caller's transaction. Several instances write at once, so two transactions that could
//! match an event to a record (an event looking for its record, a record becoming known by
//! an identifier) first take an advisory lock per identifier: the later one waits for the
//! earlier's commit and then sees its rows. Locks are taken in one sorted statement, always
//! before any row lock on `messages`, so they cannot deadlock with one another.

use sqlx::postgres::PgConnection;
use sqlx::Row;

use crate::listing;
use crate::record::StoreError;

/// The shared description of a record becoming known, for the callers of this backend.
pub(crate) use crate::webhook::Known;
use crate::webhook::{
    choose_record, evidence, is_applied, lock_names, resolution_reply, tally, Candidate,
    EventNames, Resolution, UpstreamEvent, WebhookApplied, WebhookOutcome, WebhookReceipt,
};

/// The advisory lock space of event matching (the first key of the two-key form).
pub(super) const MATCH_LOCKS: i32 = 0x1d3e;

pub(crate) async fn lock(
    conn: &mut PgConnection,
    mut names: Vec<String>,
) -> Result<(), StoreError> {
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    names.dedup();
    sqlx::query(
        "SELECT pg_advisory_xact_lock($1, h)
         FROM (SELECT DISTINCT hashtext(n) AS h FROM unnest($2::TEXT[]) n ORDER BY 1) s",
    )
    .bind(MATCH_LOCKS)
    .bind(&names)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(crate) async fn apply(
    conn: &mut PgConnection,
    receipt: &WebhookReceipt,
    now: i64,
) -> Result<WebhookApplied, StoreError> {
    let fresh = sqlx::query(
        "INSERT INTO webhook_receipts (source, webhook_id, received_at, events)
         VALUES ($1, $2, $3, $4) ON CONFLICT (source, webhook_id) DO NOTHING",
    )
    .bind(&receipt.source)
    .bind(&receipt.webhook_id)
    .bind(now)
    .bind(receipt.events.len() as i64)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if fresh == 0 {
        return Ok(WebhookApplied::Duplicate);
    }
    let names = receipt
        .events
        .iter()
        .flat_map(|e| lock_names(e.key.as_deref(), e.upstream_id.as_deref()))
        .collect();
    lock(conn, names).await?;
    let mut outcome = WebhookOutcome {
        events: receipt.events.len() as u32,
        ..WebhookOutcome::default()
    };
    for (index, event) in receipt.events.iter().enumerate() {
        apply_event(conn, receipt, index as u32, event, now, &mut outcome).await?;
    }
    Ok(WebhookApplied::Applied(outcome))
}

async fn apply_event(
    conn: &mut PgConnection,
    receipt: &WebhookReceipt,
    index: u32,
    event: &UpstreamEvent,
    now: i64,
    outcome: &mut WebhookOutcome,
) -> Result<(), StoreError> {
    let mut record = find_record(conn, &event.names()).await?;
    // The row lock holds off a settle or requeue of the record until this commit, and waits
    // for one in flight: the state read here is the state this commit changes.
    let mut state = None;
    if let Some(id) = &record {
        state =
            sqlx::query_scalar::<_, String>("SELECT state FROM messages WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?;
        if state.is_none() {
            // Purged meanwhile.
            record = None;
        }
    }
    let recipient = event.recipient.as_deref().unwrap_or("");
    let applied = match &record {
        Some(id) => is_applied(
            event.event_time_ms,
            newest_applied(conn, id, recipient).await?,
        ),
        None => false,
    };
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO upstream_events (source, webhook_id, idx, event_type, kind, event_time,
            received_at, idem_key, upstream_id, header_message_id, recipient, record_id,
            applied, body)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
         RETURNING seq",
    )
    .bind(&receipt.source)
    .bind(&receipt.webhook_id)
    .bind(i64::from(index))
    .bind(&event.event_type)
    .bind(event.kind.as_str())
    .bind(event.event_time_ms)
    .bind(now)
    .bind(&event.key)
    .bind(&event.upstream_id)
    .bind(&event.message_id)
    .bind(recipient)
    .bind(&record)
    .bind(applied)
    .bind(&event.json)
    .fetch_one(&mut *conn)
    .await?;
    let Some(id) = record else {
        outcome.unmatched += 1;
        return Ok(());
    };
    if tally(outcome, applied, event.kind, state.as_deref()) {
        let named = evidence(
            &receipt.source,
            &receipt.webhook_id,
            index,
            &event.event_type,
        );
        if resolve(conn, &id, seq, &named, event.event_time_ms, now).await? {
            outcome.resolved.push(Resolution {
                id,
                evidence: named,
            });
        }
    }
    Ok(())
}

/// The record an event belongs to (`webhook::belongs`), among those its key or upstream id
/// finds.
async fn find_record(
    conn: &mut PgConnection,
    event: &EventNames<'_>,
) -> Result<Option<String>, StoreError> {
    if event.key.is_none() && event.upstream_id.is_none() {
        return Ok(None);
    }
    let rows = sqlx::query(&format!(
        "SELECT m.id, m.upstream_key,
            (SELECT MIN(a.started_at) FROM attempts a WHERE a.message_id = m.id)
                AS first_attempt,
            EXISTS (SELECT 1 FROM attempts a
                    WHERE a.message_id = m.id AND a.upstream_id = $2) AS has_event_id,
            EXISTS (SELECT 1 FROM attempts a
                    WHERE a.message_id = m.id AND a.upstream_id IS NOT NULL) AS has_ids
         FROM messages m
         WHERE m.state <> 'rejected'
           AND ((m.upstream_key = $1::TEXT AND m.upstream_key IS DISTINCT FROM m.idem_key)
                OR (m.scope IN ({every_scope}) AND m.idem_key = $1::TEXT
                    AND m.upstream_key = m.idem_key)
                OR m.id IN (SELECT message_id FROM attempts WHERE upstream_id = $2::TEXT))",
        every_scope = listing::EVERY_SCOPE
    ))
    .bind(event.key)
    .bind(event.upstream_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut candidates = Vec::with_capacity(rows.len());
    for row in rows {
        candidates.push(Candidate {
            id: row.try_get(0)?,
            upstream_key: row.try_get(1)?,
            first_attempt_ms: row.try_get(2)?,
            has_event_upstream_id: row.try_get(3)?,
            has_upstream_ids: row.try_get(4)?,
        });
    }
    Ok(choose_record(event, &candidates).map(|c| c.id.clone()))
}

async fn newest_applied(
    conn: &mut PgConnection,
    record: &str,
    recipient: &str,
) -> Result<Option<i64>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT MAX(event_time) FROM upstream_events
         WHERE record_id = $1 AND recipient = $2 AND applied",
    )
    .bind(record)
    .bind(recipient)
    .fetch_one(&mut *conn)
    .await?)
}

async fn resolve(
    conn: &mut PgConnection,
    id: &str,
    seq: i64,
    named: &str,
    event_time_ms: i64,
    now: i64,
) -> Result<bool, StoreError> {
    let changed = sqlx::query(
        "UPDATE messages SET state = 'delivered', finished_at = $1, upstream_reply = $2,
            resolved_by = $3
         WHERE id = $4 AND state = 'unresolved'",
    )
    .bind(now)
    .bind(resolution_reply(named, event_time_ms))
    .bind(named)
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(false);
    }
    sqlx::query("UPDATE upstream_events SET evidence = true WHERE seq = $1")
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    Ok(true)
}

impl Known<'_> {
    /// The advisory locks to take before the record's row is written.
    pub(crate) fn lock_names(&self) -> Vec<String> {
        lock_names(self.upstream_key, self.upstream_id)
    }
}

/// Late matching (see `sqlite::webhook::attach_unmatched`); the caller holds `lock_names`.
pub(crate) async fn attach_unmatched(
    conn: &mut PgConnection,
    known: &Known<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let found = sqlx::query(
        "SELECT seq, event_time, recipient, idem_key, upstream_id FROM upstream_events
             WHERE record_id IS NULL AND idem_key = $1
         UNION SELECT seq, event_time, recipient, idem_key, upstream_id FROM upstream_events
             WHERE record_id IS NULL AND upstream_id = $2
         ORDER BY event_time, seq",
    )
    .bind(known.upstream_key)
    .bind(known.upstream_id)
    .fetch_all(&mut *conn)
    .await?;
    for row in found {
        let seq: i64 = row.try_get(0)?;
        let event_time: i64 = row.try_get(1)?;
        let recipient: String = row.try_get(2)?;
        let key: Option<String> = row.try_get(3)?;
        let upstream_id: Option<String> = row.try_get(4)?;
        let names = EventNames {
            key: key.as_deref(),
            upstream_id: upstream_id.as_deref(),
            event_time_ms: event_time,
        };
        if find_record(conn, &names).await?.as_deref() != Some(known.id) {
            continue;
        }
        let applied = is_applied(
            event_time,
            newest_applied(conn, known.id, &recipient).await?,
        );
        sqlx::query("UPDATE upstream_events SET record_id = $1, applied = $2 WHERE seq = $3")
            .bind(known.id)
            .bind(applied)
            .bind(seq)
            .execute(&mut *conn)
            .await?;
    }
    if known.unresolved {
        resolve_from_attached(conn, known.id, now).await?;
    }
    Ok(())
}

async fn resolve_from_attached(
    conn: &mut PgConnection,
    id: &str,
    now: i64,
) -> Result<(), StoreError> {
    let first = sqlx::query(
        "SELECT seq, source, webhook_id, idx, event_type, event_time FROM upstream_events
         WHERE record_id = $1 AND kind = 'accepted' ORDER BY event_time, seq LIMIT 1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = first else {
        return Ok(());
    };
    let index: i64 = row.try_get("idx")?;
    let named = evidence(
        &row.try_get::<String, _>("source")?,
        &row.try_get::<String, _>("webhook_id")?,
        index as u32,
        &row.try_get::<String, _>("event_type")?,
    );
    let seq: i64 = row.try_get("seq")?;
    let event_time: i64 = row.try_get("event_time")?;
    if resolve(conn, id, seq, &named, event_time, now).await? {
        crate::webhook::log_resolution(id, &named);
    }
    Ok(())
}
