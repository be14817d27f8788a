//! The JSON shapes of records and ledger rows, shared by the admin API and `queue --json`, so
//! a script can switch between the two without translating.

use std::collections::BTreeMap;

use super::waiting::Waiting;
use crate::store::{ActionRow, AttemptRow, DailyCounts, EventRow, MessageSummary, StoredMessage};

pub(crate) use idemrelay_model::timestamp::time_ms;

/// One listed record; `waiting` says why a queued one has not gone yet.
pub(crate) fn summary_json(s: &MessageSummary, waiting: Option<&Waiting>) -> serde_json::Value {
    serde_json::json!({
        "id": s.id,
        "scope": s.scope,
        "key": s.key,
        "state": s.state.as_str(),
        "accepted_at": time_ms(s.accepted_at_ms),
        "accepted_at_ms": s.accepted_at_ms,
        "mail_from": s.mail_from,
        "rcpt_to": s.rcpt_to,
        "message_id": s.message_id,
        "dsn_of": s.dsn_of,
        "attempts": s.attempts,
        "failed_attempts": s.failed_attempts,
        "last_outcome": s.last_outcome,
        "last_phase": s.last_phase,
        "last_code": s.last_code,
        "upstream_reply": s.upstream_reply,
        "last_reply": s.last_reply,
        "next_attempt_at": s.next_attempt_at_ms.map(time_ms),
        "next_attempt_at_ms": s.next_attempt_at_ms,
        "waiting": waiting_json(waiting),
    })
}

pub(crate) fn waiting_json(waiting: Option<&Waiting>) -> serde_json::Value {
    match waiting {
        Some(w) => serde_json::json!({ "reason": w.reason, "detail": w.detail }),
        None => serde_json::Value::Null,
    }
}

/// One operator action (who, why, when).
pub(crate) fn action_json(a: &ActionRow) -> serde_json::Value {
    serde_json::json!({
        "at": time_ms(a.at_ms),
        "at_ms": a.at_ms,
        "id": a.record_id,
        "action": a.action,
        "actor": a.actor,
        "reason": a.reason,
        "detail": a.detail,
    })
}

pub(crate) fn attempt_json(a: &AttemptRow) -> serde_json::Value {
    serde_json::json!({
        "attempt": a.attempt,
        "owner": a.owner,
        "started_at": time_ms(a.started_at_ms),
        "started_at_ms": a.started_at_ms,
        "finished_at": a.finished_at_ms.map(time_ms),
        "finished_at_ms": a.finished_at_ms,
        "duration_ms": a.finished_at_ms.map(|f| f - a.started_at_ms),
        "outcome": a.outcome,
        "phase": a.phase,
        "code": a.code,
        "reply": a.reply,
        "upstream_id": a.upstream_id,
    })
}

pub(crate) fn event_json(e: &EventRow) -> serde_json::Value {
    serde_json::json!({
        "recipient": e.recipient,
        "type": e.event_type,
        "kind": e.kind.as_str(),
        "event_time": time_ms(e.event_time_ms),
        "event_time_ms": e.event_time_ms,
        "received_at": time_ms(e.received_at_ms),
        "received_at_ms": e.received_at_ms,
        "source": e.source,
        "webhook_id": e.webhook_id,
        "index": e.index,
        "applied": e.applied,
        "stale": !e.applied,
        "evidence": e.evidence,
        "key": e.key,
        "upstream_id": e.upstream_id,
        "message_id": e.message_id,
    })
}

/// Per recipient (`*` for events about the whole message), the type of the newest applied
/// event: what the upstream last said about it.
pub(crate) fn recipient_status(events: &[EventRow]) -> BTreeMap<String, String> {
    let mut newest: BTreeMap<String, &EventRow> = BTreeMap::new();
    for e in events.iter().filter(|e| e.applied) {
        let who = e.recipient.clone().unwrap_or_else(|| "*".into());
        let slot = newest.entry(who).or_insert(e);
        if e.event_time_ms >= slot.event_time_ms {
            *slot = e;
        }
    }
    newest
        .into_iter()
        .map(|(who, e)| (who, e.event_type.clone()))
        .collect()
}

pub(crate) fn show_json(
    m: &StoredMessage,
    attempts: &[AttemptRow],
    events: &[EventRow],
    waiting: Option<&Waiting>,
) -> serde_json::Value {
    serde_json::json!({
        "id": m.id,
        "scope": m.scope,
        "key": m.key,
        "key_source": m.key_source,
        "upstream_key": m.upstream_key,
        "part": m.part,
        "fingerprint": m.fingerprint.to_hex(),
        "state": m.state.as_str(),
        "mail_from": m.mail_from,
        "rcpt_to": m.rcpt_to,
        // RET, ENVID, REQUIRETLS and NOTIFY/ORCPT by recipient, as sent; null for none.
        "requests": (!m.requests.is_empty()).then_some(&m.requests),
        "accepted_at": time_ms(m.accepted_at_ms),
        "accepted_at_ms": m.accepted_at_ms,
        "finished_at_ms": m.finished_at_ms,
        "reply": m.reply,
        "upstream_reply": m.upstream_reply,
        "queued_job": m.has_job,
        "content_stored": m.content.is_some(),
        "damage": m.damage,
        "message_id": m.message_id,
        "resolved_by": m.resolved_by,
        "dsn_of": m.dsn_of,
        "dsns": m.dsns,
        "next_attempt_at": m.next_attempt_at_ms.filter(|_| m.has_job).map(time_ms),
        "next_attempt_at_ms": m.next_attempt_at_ms.filter(|_| m.has_job),
        "leased": m.leased,
        "waiting": waiting_json(waiting),
        "history": m.history.iter().map(action_json).collect::<Vec<_>>(),
        "attempts": attempts.iter().map(attempt_json).collect::<Vec<_>>(),
        "events": events.iter().map(event_json).collect::<Vec<_>>(),
        "recipient_status": recipient_status(events),
    })
}

/// RET, ENVID and REQUIRETLS as the client sent them on MAIL.
pub(crate) fn mail_requests(r: &crate::mail::DeliveryRequests) -> String {
    let ret = r.ret.iter().map(|v| format!(" RET={v}"));
    let envid = r.envid.iter().map(|v| format!(" ENVID={v}"));
    let tls = r.require_tls.then_some(" REQUIRETLS".to_string());
    ret.chain(envid)
        .chain(tls)
        .collect::<String>()
        .trim_start()
        .to_string()
}

/// NOTIFY and ORCPT as the client sent them on this recipient's RCPT ("" for none).
pub(crate) fn rcpt_requests(r: &crate::mail::DeliveryRequests, rcpt: &str) -> String {
    let Some(q) = r.recipients.get(rcpt) else {
        return String::new();
    };
    let notify = q.notify.iter().map(|v| format!(" NOTIFY={v}"));
    notify
        .chain(q.orcpt.iter().map(|v| format!(" ORCPT={v}")))
        .collect()
}

pub(crate) fn daily_json(r: &DailyCounts) -> serde_json::Value {
    serde_json::json!({
        "day": r.day,
        "scope": r.scope,
        "accepted": r.accepted,
        "replayed": r.replayed,
        "delivered": r.delivered,
        "failed": r.failed,
        "unresolved": r.unresolved,
        "cancelled": r.cancelled,
        "resolved_by_event": r.resolved_by_event,
        "bounced": r.bounced,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn any_stored_time_prints() {
        assert_eq!(super::time_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::time_ms(i64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(super::time_ms(i64::MIN), "1970-01-01T00:00:00.000Z");
    }
}
