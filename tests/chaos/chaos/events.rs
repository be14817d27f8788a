//! The upstream's events: the webhooks the sink posted, and what the relays made of them.

use super::*;

#[derive(Debug, Default)]
pub(super) struct HookCounts {
    pub(super) batches: u64,
    pub(super) posts: usize,
    /// Posts without a 2xx (no relay up, one killed mid-request, a locked store's 503),
    /// each retried.
    pub(super) refused_posts: usize,
    /// Batches posted twice on purpose (`duplicate`), and 2xx treated as lost (`lose_ack`).
    pub(super) duplicated: usize,
    pub(super) acks_lost: usize,
    /// Posts the relays answered `{"duplicate":true}`.
    pub(super) duplicate_answers: usize,
    pub(super) receipts: usize,
    pub(super) events: i64,
    /// Stored, not applied: older than an event already applied to the same record and
    /// recipient (a reordered injection).
    pub(super) stale: i64,
    /// Records an event resolved from `unresolved` to `delivered`.
    pub(super) resolved: usize,
    /// Records settled unresolved, as `report` counts them.
    pub(super) settled_unresolved: u64,
}

/// What the relay answered a 2xx post: `Some(true)` for a webhook-id it had received before.
pub(super) fn duplicate_answer(post: &WebhookAttempt) -> Option<bool> {
    let body = post.response.as_deref()?;
    if body.contains(r#""duplicate":true"#) {
        Some(true)
    } else if body.contains(r#""duplicate":false"#) {
        Some(false)
    } else {
        None
    }
}

/// The upstream's truth against the store, once the sink has posted every batch to the end:
/// each webhook-id received once (a receipt for each id that got a 2xx, nothing else; every
/// later post of it answered as a duplicate; as many events stored as those batches hold), no
/// event left without its record, a record the sink accepted never left `unresolved`, and a
/// record resolved only by an event about a message the sink accepted with its key and bytes.
pub(super) async fn check_webhooks(
    store_url: &str,
    reader: &dyn Store,
    sink: &SinkHandle,
    stored: &BTreeMap<Unit, (&store::MessageSummary, store::StoredMessage)>,
    violations: &mut Vec<String>,
) -> HookCounts {
    let stats = sink.stats();
    let posts = sink.webhooks();
    let messages: BTreeMap<String, idemrelay_sink::ReceivedMessage> = sink
        .messages()
        .into_iter()
        .map(|m| (m.id.clone(), m))
        .collect();
    let mut h = HookCounts {
        batches: stats.webhooks.batches,
        posts: posts.len(),
        ..HookCounts::default()
    };
    if stats.webhooks.failed > 0 || stats.webhooks.dropped > 0 {
        violations.push(format!(
            "the sink gave up on webhook batches: {:?}",
            stats.webhooks
        ));
    }

    let mut by_id: BTreeMap<&str, Vec<&WebhookAttempt>> = BTreeMap::new();
    for p in &posts {
        by_id.entry(p.webhook_id.as_str()).or_default().push(p);
    }
    let mut through: BTreeSet<String> = BTreeSet::new();
    let mut batch_events: i64 = 0;
    for (id, mut ps) in by_id {
        ps.sort_by_key(|p| p.seq);
        let ok: Vec<&WebhookAttempt> = ps
            .iter()
            .copied()
            .filter(|p| p.status.is_some_and(|s| (200..300).contains(&s)))
            .collect();
        h.refused_posts += ps.len() - ok.len();
        h.duplicated += usize::from(ps.iter().any(|p| p.copy == 2));
        h.acks_lost += ps
            .iter()
            .filter(|p| p.outcome == AttemptOutcome::AckLost)
            .count();
        let Some(first) = ok.first() else {
            violations.push(format!("webhook {id}: never answered 2xx: {ps:?}"));
            continue;
        };
        through.insert(id.to_string());
        batch_events += first.events as i64;
        h.duplicate_answers += ok
            .iter()
            .filter(|p| duplicate_answer(p) == Some(true))
            .count();
        // The first 2xx may itself be a duplicate (an earlier post was committed, and the
        // relay died before answering); every one after it must be.
        if duplicate_answer(first).is_none()
            || ok[1..].iter().any(|p| duplicate_answer(p) != Some(true))
        {
            violations.push(format!(
                "webhook {id}: received more than once: {:?}",
                ok.iter()
                    .map(|p| (p.copy, p.attempt, p.response.clone()))
                    .collect::<Vec<_>>()
            ));
        }
    }
    let receipts: BTreeSet<String> =
        backend::strings(store_url, "SELECT webhook_id FROM webhook_receipts")
            .await
            .into_iter()
            .collect();
    h.receipts = receipts.len();
    if receipts != through {
        violations.push(format!(
            "webhook receipts: {} stored, {} ids got a 2xx; stored only: {:?}; 2xx only: {:?}",
            receipts.len(),
            through.len(),
            receipts.difference(&through).take(5).collect::<Vec<_>>(),
            through.difference(&receipts).take(5).collect::<Vec<_>>()
        ));
    }
    h.events = backend::count(store_url, "upstream_events").await;
    if h.events != batch_events {
        violations.push(format!(
            "{} upstream events stored, the {} batches received hold {batch_events}",
            h.events,
            through.len()
        ));
    }
    let unmatched = backend::scalar(
        store_url,
        "SELECT COUNT(*) FROM upstream_events WHERE record_id IS NULL",
    )
    .await;
    if unmatched > 0 {
        violations.push(format!("{unmatched} upstream events matched no record"));
    }
    h.stale = backend::scalar(
        store_url,
        "SELECT COUNT(*) FROM upstream_events WHERE record_id IS NOT NULL AND NOT applied",
    )
    .await;

    // The sink's truth per record: which upstream keys it holds a message for.
    let accepted: BTreeSet<&str> = stats
        .keys
        .iter()
        .filter(|(_, k)| k.accepted >= 1)
        .map(|(up, _)| up.as_str())
        .collect();
    for (unit, (record, m)) in stored {
        let up = m.upstream_key.as_deref().unwrap_or_default();
        if accepted.contains(up) && record.state == State::Unresolved {
            violations.push(format!(
                "{unit} ({}): the sink accepted it and sent its events, yet it stays unresolved",
                record.id
            ));
        }
        let Some(evidence) = &m.resolved_by else {
            continue;
        };
        h.resolved += 1;
        // `upstream/msg_<sink id>_<type>#<index> <type>`
        let sink_id = evidence
            .strip_prefix(&format!("{HOOK_SOURCE}/msg_"))
            .and_then(|rest| rest.split('_').next());
        let proven = sink_id.and_then(|id| messages.get(id)).is_some_and(|sm| {
            sm.key.as_deref() == Some(up) && m.content.as_deref() == Some(sm.bytes.as_slice())
        });
        if record.state != State::Delivered || !proven {
            violations.push(format!(
                "{unit} ({}): {:?} by {evidence}, which names no message the sink accepted \
                 with its key and bytes",
                record.id, record.state
            ));
        }
    }
    let report = reader.report(None).await.unwrap();
    h.settled_unresolved = report.iter().map(|d| d.unresolved).sum();
    let by_event: u64 = report.iter().map(|d| d.resolved_by_event).sum();
    if by_event != h.resolved as u64 {
        violations.push(format!(
            "report counts {by_event} resolved by event, {} records name their event",
            h.resolved
        ));
    }
    h
}
