//! Upstream events on SQLite, run by the group-commit writer like every write: a request's
//! receipt, events, matches and effects in one savepoint of one commit. The one writer also
//! serializes an event looking for its record with the record becoming known, so neither can
//! miss the other.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

use super::SqliteStore;
use crate::backend::WebhookStore;

use crate::listing;
use crate::record::{now_ms, StoreError};
/// The shared description of a record becoming known, for the callers of this backend.
pub(crate) use crate::webhook::Known;
use crate::webhook::{
    choose_record, evidence, is_applied, resolution_reply, tally, Candidate, EventNames,
    Resolution, UpstreamEvent, WebhookApplied, WebhookOutcome, WebhookReceipt,
};

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn apply_webhook(&self, receipt: &WebhookReceipt) -> Result<WebhookApplied, StoreError> {
        let receipt = receipt.clone();
        self.writer.write(move |conn| apply(conn, &receipt)).await
    }
}

pub(crate) fn apply(
    conn: &Connection,
    receipt: &WebhookReceipt,
) -> Result<WebhookApplied, StoreError> {
    let now = now_ms();
    let fresh = conn
        .prepare_cached(
            "INSERT INTO webhook_receipts (source, webhook_id, received_at, events)
             VALUES (?, ?, ?, ?) ON CONFLICT (source, webhook_id) DO NOTHING",
        )?
        .execute(params![
            receipt.source,
            receipt.webhook_id,
            now,
            receipt.events.len() as i64
        ])?;
    if fresh == 0 {
        return Ok(WebhookApplied::Duplicate);
    }
    let mut outcome = WebhookOutcome {
        events: receipt.events.len() as u32,
        ..WebhookOutcome::default()
    };
    for (index, event) in receipt.events.iter().enumerate() {
        apply_event(conn, receipt, index as u32, event, now, &mut outcome)?;
    }
    Ok(WebhookApplied::Applied(outcome))
}

fn apply_event(
    conn: &Connection,
    receipt: &WebhookReceipt,
    index: u32,
    event: &UpstreamEvent,
    now: i64,
    outcome: &mut WebhookOutcome,
) -> Result<(), StoreError> {
    let record = find_record(conn, &event.names())?;
    let state = match &record {
        Some(id) => conn
            .prepare_cached("SELECT state FROM messages WHERE id = ?")?
            .query_row([id], |row| row.get::<_, String>(0))
            .optional()?,
        None => None,
    };
    let recipient = event.recipient.as_deref().unwrap_or("");
    let applied = match &record {
        Some(id) => is_applied(event.event_time_ms, newest_applied(conn, id, recipient)?),
        None => false,
    };
    let seq = conn
        .prepare_cached(
            "INSERT INTO upstream_events (source, webhook_id, idx, event_type, kind, event_time,
                received_at, idem_key, upstream_id, header_message_id, recipient, record_id,
                applied, body)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             RETURNING seq",
        )?
        .query_row(
            params![
                receipt.source,
                receipt.webhook_id,
                index,
                event.event_type,
                event.kind.as_str(),
                event.event_time_ms,
                now,
                event.key,
                event.upstream_id,
                event.message_id,
                recipient,
                record,
                applied,
                event.json,
            ],
            |row| row.get::<_, i64>(0),
        )?;
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
        if resolve(conn, &id, seq, &named, event.event_time_ms, now)? {
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
fn find_record(conn: &Connection, event: &EventNames<'_>) -> Result<Option<String>, StoreError> {
    if event.key.is_none() && event.upstream_id.is_none() {
        return Ok(None);
    }
    let candidates = conn
        .prepare_cached(&format!(
            "SELECT m.id, m.upstream_key,
                (SELECT MIN(a.started_at) FROM attempts a WHERE a.message_id = m.id),
                EXISTS (SELECT 1 FROM attempts a
                        WHERE a.message_id = m.id AND a.upstream_id = ?2),
                EXISTS (SELECT 1 FROM attempts a
                        WHERE a.message_id = m.id AND a.upstream_id IS NOT NULL)
             FROM messages m
             WHERE m.state <> 'rejected'
               AND ((m.upstream_key = ?1 AND m.upstream_key IS DISTINCT FROM m.idem_key)
                OR (m.scope IN ({every_scope}) AND m.idem_key = ?1
                    AND m.upstream_key = m.idem_key)
                    OR m.id IN (SELECT message_id FROM attempts WHERE upstream_id = ?2))",
            every_scope = listing::EVERY_SCOPE
        ))?
        .query_map(params![event.key, event.upstream_id], |row| {
            Ok(Candidate {
                id: row.get(0)?,
                upstream_key: row.get(1)?,
                first_attempt_ms: row.get(2)?,
                has_event_upstream_id: row.get(3)?,
                has_upstream_ids: row.get(4)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(choose_record(event, &candidates).map(|c| c.id.clone()))
}

fn newest_applied(
    conn: &Connection,
    record: &str,
    recipient: &str,
) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT MAX(event_time) FROM upstream_events
             WHERE record_id = ? AND recipient = ? AND applied",
        )?
        .query_row(params![record, recipient], |row| row.get(0))?)
}

/// Resolves an `unresolved` record as delivered, naming the event; false if the record is in
/// another state by now.
fn resolve(
    conn: &Connection,
    id: &str,
    seq: i64,
    named: &str,
    event_time_ms: i64,
    now: i64,
) -> Result<bool, StoreError> {
    let changed = conn
        .prepare_cached(
            "UPDATE messages SET state = 'delivered', finished_at = ?, upstream_reply = ?,
                resolved_by = ?
             WHERE id = ? AND state = 'unresolved'",
        )?
        .execute(params![
            now,
            resolution_reply(named, event_time_ms),
            named,
            id
        ])?;
    if changed == 0 {
        return Ok(false);
    }
    conn.prepare_cached("UPDATE upstream_events SET evidence = 1 WHERE seq = ?")?
        .execute([seq])?;
    Ok(true)
}

/// Late matching: the events kept unmatched under an identifier this record is now known by
/// are matched again, by the same rule as at receipt, oldest first; those that belong to this
/// record are attached, and the record is resolved at once when it is unresolved and an
/// attached event is of an accepted type.
pub(crate) fn attach_unmatched(conn: &Connection, known: &Known<'_>) -> Result<(), StoreError> {
    let found = conn
        .prepare_cached(
            "SELECT seq, event_time, recipient, idem_key, upstream_id FROM upstream_events
                 WHERE record_id IS NULL AND idem_key = ?1
             UNION SELECT seq, event_time, recipient, idem_key, upstream_id FROM upstream_events
                 WHERE record_id IS NULL AND upstream_id = ?2
             ORDER BY event_time, seq",
        )?
        .query_map(params![known.upstream_key, known.upstream_id], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, Option<String>>(4)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (seq, event_time, recipient, key, upstream_id) in found {
        let names = EventNames {
            key: key.as_deref(),
            upstream_id: upstream_id.as_deref(),
            event_time_ms: event_time,
        };
        if find_record(conn, &names)?.as_deref() != Some(known.id) {
            continue;
        }
        let applied = is_applied(event_time, newest_applied(conn, known.id, &recipient)?);
        conn.prepare_cached("UPDATE upstream_events SET record_id = ?, applied = ? WHERE seq = ?")?
            .execute(params![known.id, applied, seq])?;
    }
    if known.unresolved {
        resolve_from_attached(conn, known.id)?;
    }
    Ok(())
}

/// An unresolved record with an accepted-type event attached is resolved by the oldest one.
fn resolve_from_attached(conn: &Connection, id: &str) -> Result<(), StoreError> {
    let first = conn
        .prepare_cached(
            "SELECT seq, source, webhook_id, idx, event_type, event_time FROM upstream_events
             WHERE record_id = ? AND kind = 'accepted' ORDER BY event_time, seq LIMIT 1",
        )?
        .query_row([id], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, i64>(3)?,
                row.get::<_, String>(4)?,
                row.get::<_, i64>(5)?,
            ))
        })
        .optional()?;
    let Some((seq, source, webhook_id, index, event_type, event_time)) = first else {
        return Ok(());
    };
    let named = evidence(&source, &webhook_id, index as u32, &event_type);
    if resolve(conn, id, seq, &named, event_time, now_ms())? {
        crate::webhook::log_resolution(id, &named);
    }
    Ok(())
}

/// A record's upstream key, for late matching after its attempt settled.
pub(crate) fn upstream_key(conn: &Connection, id: &str) -> Result<Option<String>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT upstream_key FROM messages WHERE id = ?")?
        .query_row([id], |row| row.get::<_, Option<String>>(0))
        .optional()?
        .flatten())
}
