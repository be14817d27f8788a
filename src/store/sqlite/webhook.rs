//! Upstream events on SQLite, run by the group-commit writer like every write: a request's
//! receipt, events, matches and effects in one savepoint of one commit. The one writer also
//! serializes an event looking for its record with the record becoming known, so neither can
//! miss the other.

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::record::{now_ms, StoreError};
/// The shared description of a record becoming known, for the callers of this backend.
pub(crate) use crate::store::webhook::Known;
use crate::store::webhook::{
    choose_record, evidence, is_applied, late_match_fits, match_order, resolution_reply, tally,
    Candidate, MatchBy, RecordIdentifiers, Resolution, UpstreamEvent, WebhookApplied,
    WebhookOutcome, WebhookReceipt,
};

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
    let record = find_record(conn, event)?;
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

/// The record an event names: by the first of its identifiers that finds any.
fn find_record(conn: &Connection, event: &UpstreamEvent) -> Result<Option<String>, StoreError> {
    for (by, value) in match_order(event) {
        let sql = match by {
            MatchBy::UpstreamId => {
                "SELECT DISTINCT m.id, m.rcpt_to, m.accepted_at FROM attempts a
                 JOIN messages m ON m.id = a.message_id
                 WHERE a.upstream_id = ? AND m.state <> 'rejected'"
            }
            MatchBy::Key => {
                "SELECT id, rcpt_to, accepted_at FROM messages
                 WHERE upstream_key = ? AND state <> 'rejected'"
            }
            MatchBy::MessageId => {
                "SELECT id, rcpt_to, accepted_at FROM messages
                 WHERE header_message_id = ? AND state <> 'rejected'"
            }
        };
        let candidates = conn
            .prepare_cached(sql)?
            .query_map([value], |row| {
                Ok(Candidate {
                    id: row.get(0)?,
                    rcpt_to: row
                        .get::<_, String>(1)?
                        .split('\n')
                        .map(str::to_string)
                        .collect(),
                    accepted_at_ms: row.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(found) = choose_record(&candidates, event.recipient.as_deref()) {
            return Ok(Some(found.id.clone()));
        }
    }
    Ok(None)
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

/// Late matching: attaches the events kept unmatched that name this record, oldest first,
/// and resolves the record at once when it is unresolved and an attached event is of an
/// accepted type.
pub(crate) fn attach_unmatched(conn: &Connection, known: &Known<'_>) -> Result<(), StoreError> {
    let found = conn
        .prepare_cached(
            "SELECT seq, event_time, recipient FROM upstream_events
                 WHERE record_id IS NULL AND idem_key = ?1
             UNION SELECT seq, event_time, recipient FROM upstream_events
                 WHERE record_id IS NULL AND upstream_id = ?2
             UNION SELECT seq, event_time, recipient FROM upstream_events
                 WHERE record_id IS NULL AND header_message_id = ?3
             ORDER BY event_time, seq",
        )?
        .query_map(
            params![known.upstream_key, known.upstream_id, known.message_id],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, String>(2)?,
                ))
            },
        )?
        .collect::<Result<Vec<_>, _>>()?;
    for (seq, event_time, recipient) in found {
        let named = (!recipient.is_empty()).then_some(recipient.as_str());
        if !late_match_fits(known.rcpt_to, named) {
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
        crate::store::webhook::log_resolution(id, &named);
    }
    Ok(())
}

/// The identifiers of a record, for late matching after its attempt settled.
pub(crate) fn known_facts(
    conn: &Connection,
    id: &str,
) -> Result<Option<RecordIdentifiers>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT upstream_key, header_message_id, rcpt_to FROM messages WHERE id = ?",
        )?
        .query_row([id], |row| {
            Ok((
                row.get::<_, Option<String>>(0)?,
                row.get::<_, Option<String>>(1)?,
                row.get::<_, String>(2)?
                    .split('\n')
                    .map(str::to_string)
                    .collect(),
            ))
        })
        .optional()?)
}
