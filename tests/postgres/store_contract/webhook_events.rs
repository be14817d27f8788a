//! Upstream events (webhooks): received once, ordered, matched to their record, and resolving
//! only the record they name.

use super::*;

/// Event times below are offsets from an hour after the first event was made: later than
/// every attempt these tests make, as a real event follows the attempt it reports on. Tests
/// of events from before an attempt give their times from `common::now_ms()` instead.
fn event(kind: EventKind, event_type: &str, at_ms: i64) -> UpstreamEvent {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| common::now_ms() + 3_600_000);
    UpstreamEvent {
        event_type: event_type.into(),
        kind,
        event_time_ms: base + at_ms,
        key: None,
        upstream_id: None,
        message_id: None,
        recipient: Some("b@example.com".into()),
        json: format!("{{\"type\":\"{event_type}\"}}"),
    }
}

fn by_key(mut e: UpstreamEvent, key: &str) -> UpstreamEvent {
    e.key = Some(key.into());
    e
}

fn receipt(webhook_id: &str, events: Vec<UpstreamEvent>) -> WebhookReceipt {
    WebhookReceipt {
        source: "upstream".into(),
        webhook_id: webhook_id.into(),
        events,
    }
}

fn applied(result: WebhookApplied) -> WebhookOutcome {
    match result {
        WebhookApplied::Applied(outcome) => outcome,
        WebhookApplied::Duplicate => panic!("not expected as a duplicate"),
    }
}

/// Inserts `id` under `key` and ends its one attempt UNKNOWN, past the window: unresolved.
async fn unresolved_record(store: &Arc<dyn Store>, id: &str, key: &str) {
    store.insert(&record(id, key, 1), RETENTION).await.unwrap();
    let unknown = AttemptResult {
        outcome: OutcomeKind::Unknown,
        phase: Some(Phase::Dot),
        code: None,
        reply: "connection lost after the final dot".into(),
    };
    let settle = Settle::Unresolved {
        upstream_reply: "unknown past the window".into(),
    };
    attempt_once(store, id, unknown, settle).await;
}

on_both_backends!(a_webhook_id_is_received_once);
/// The same (source, webhook id) again changes nothing, whatever its events say; another
/// source may use the same id.
async fn a_webhook_id_is_received_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances_with_urls(&dir, backend)
        .await
        .into_iter()
        .map(|(n, a, b, _)| (n, a, b))
    {
        unresolved_record(&a, "r1", "k1").await;
        let first = receipt(
            "msg_1",
            vec![by_key(event(EventKind::Bounced, "bounce", 1000), "k1")],
        );
        let outcome = applied(a.apply_webhook(&first).await.unwrap());
        assert_eq!((outcome.matched, outcome.bounced), (1, 1), "{name}");
        // The retry carries an accepted event this time: still a duplicate, nothing changes.
        let again = receipt(
            "msg_1",
            vec![by_key(event(EventKind::Accepted, "delivery", 2000), "k1")],
        );
        assert_eq!(
            b.apply_webhook(&again).await.unwrap(),
            WebhookApplied::Duplicate,
            "{name}"
        );
        assert_eq!(b.events("r1").await.unwrap().len(), 1, "{name}");
        assert_eq!(
            b.message("r1").await.unwrap().unwrap().state,
            State::Unresolved,
            "{name}"
        );
        let other_source = WebhookReceipt {
            source: "other".into(),
            ..again
        };
        assert!(matches!(
            b.apply_webhook(&other_source).await.unwrap(),
            WebhookApplied::Applied(_)
        ));
        let report = b.report(None).await.unwrap();
        assert_eq!(report.iter().map(|d| d.bounced).sum::<u64>(), 1, "{name}");
    }
}

on_both_backends!(an_event_older_than_the_newest_applied_is_stored_not_applied);
/// Out of order per (record, recipient): a delivery, then the older injection.
async fn an_event_older_than_the_newest_applied_is_stored_not_applied(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("r1", "k1", 1), RETENTION).await.unwrap();
        attempt_once(
            &a,
            "r1",
            accepted(),
            Settle::Delivered {
                upstream_reply: "250 ok".into(),
                dsn: None,
            },
        )
        .await;
        let newer = receipt(
            "d",
            vec![by_key(event(EventKind::Accepted, "delivery", 2000), "k1")],
        );
        let older = receipt(
            "i",
            vec![by_key(event(EventKind::Accepted, "injection", 1000), "k1")],
        );
        assert_eq!(applied(a.apply_webhook(&newer).await.unwrap()).stale, 0);
        let outcome = applied(b.apply_webhook(&older).await.unwrap());
        assert_eq!((outcome.matched, outcome.stale), (1, 1), "{name}");
        // Another recipient has a newest event of its own.
        let mut other = by_key(event(EventKind::Bounced, "bounce", 500), "k1");
        other.recipient = Some("c@example.com".into());
        let outcome = applied(b.apply_webhook(&receipt("c", vec![other])).await.unwrap());
        assert_eq!(outcome.stale, 0, "{name}");
        let events = b.events("r1").await.unwrap();
        let seen: Vec<(&str, &str, bool)> = events
            .iter()
            .map(|e| {
                (
                    e.recipient.as_deref().unwrap_or("-"),
                    e.event_type.as_str(),
                    e.applied,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("b@example.com", "injection", false),
                ("b@example.com", "delivery", true),
                ("c@example.com", "bounce", true),
            ],
            "{name}"
        );
    }
}

on_both_backends!(a_batch_is_one_receipt_and_each_event_finds_its_record);
/// One request, several events: matched by upstream id, by key; one naming only a
/// Message-ID and one naming an unknown key match nothing.
async fn a_batch_is_one_receipt_and_each_event_finds_its_record(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        a.insert(&record("r1", "k1", 1), RETENTION).await.unwrap();
        let ok = AttemptResult {
            reply: "250 2.0.0 Ok: queued as 4F2C81234".into(),
            ..accepted()
        };
        let delivered = Settle::Delivered {
            upstream_reply: ok.reply.clone(),
            dsn: None,
        };
        attempt_once(&a, "r1", ok, delivered).await;
        assert_eq!(
            a.attempts("r1").await.unwrap()[0].upstream_id.as_deref(),
            Some("4F2C81234"),
            "{name}"
        );
        // Two parts of one message share its Message-ID; each holds its own recipient.
        for (id, key, rcpt) in [
            ("p1", "kp1", "x@example.com"),
            ("p2", "kp2", "y@example.com"),
        ] {
            let mut part = record(id, key, 2);
            part.envelope.rcpt_to = vec![rcpt.into()];
            part.message_id = Some("shared@example.com".into());
            a.insert(&part, RETENTION).await.unwrap();
        }
        let mut by_id = event(EventKind::Accepted, "delivery", 1000);
        by_id.upstream_id = Some("4F2C81234".into());
        let mut by_mid = event(EventKind::Bounced, "bounce", 1000);
        by_mid.message_id = Some("shared@example.com".into());
        by_mid.recipient = Some("y@example.com".into());
        let nothing = by_key(event(EventKind::Other, "open", 1000), "nobody");
        let batch = receipt(
            "batch",
            vec![
                by_id,
                by_key(event(EventKind::Other, "open", 900), "k1"),
                by_mid,
                nothing,
            ],
        );
        let outcome = applied(b.apply_webhook(&batch).await.unwrap());
        assert_eq!(
            (
                outcome.events,
                outcome.matched,
                outcome.unmatched,
                outcome.bounced
            ),
            (4, 2, 2, 0),
            "{name}"
        );
        assert_eq!(b.events("r1").await.unwrap().len(), 2, "{name}");
        // A Message-ID alone names no record: kept unmatched, whichever part holds the
        // recipient.
        assert_eq!(b.events("p1").await.unwrap().len(), 0, "{name}");
        assert_eq!(b.events("p2").await.unwrap().len(), 0, "{name}");
        assert_eq!(b.queue_stats().await.unwrap().unmatched_events, 2, "{name}");
    }
}

on_both_backends!(an_event_kept_unmatched_is_matched_when_its_record_becomes_known);
/// The race with the final dot's reply: events that arrive before their record is known by
/// the identifier they carry are matched by the accepted attempt (the upstream's id), and
/// resolve a record the moment it is settled unresolved.
async fn an_event_kept_unmatched_is_matched_when_its_record_becomes_known(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        // By the upstream's id, once the attempt is settled.
        let mut early = event(EventKind::Accepted, "injection", 1000);
        early.upstream_id = Some("S0001".into());
        let outcome = applied(b.apply_webhook(&receipt("w1", vec![early])).await.unwrap());
        assert_eq!(outcome.unmatched, 1, "{name}");
        assert_eq!(a.queue_stats().await.unwrap().unmatched_events, 1, "{name}");
        a.insert(&record("r1", "k1", 1), RETENTION).await.unwrap();
        assert!(a.events("r1").await.unwrap().is_empty(), "{name}");
        let ok = AttemptResult {
            reply: "250 2.0.0 OK S0001".into(),
            ..accepted()
        };
        let settle = Settle::Delivered {
            upstream_reply: ok.reply.clone(),
            dsn: None,
        };
        attempt_once(&a, "r1", ok, settle).await;
        let events = b.events("r1").await.unwrap();
        assert_eq!((events.len(), events[0].applied), (1, true), "{name}");

        // By key, and the record is unresolved later: resolved at once, by that event.
        let injection = by_key(event(EventKind::Accepted, "injection", 1000), "k3");
        b.apply_webhook(&receipt("w3", vec![injection]))
            .await
            .unwrap();
        unresolved_record(&a, "r3", "k3").await;
        let r3 = b.message("r3").await.unwrap().unwrap();
        assert_eq!(r3.state, State::Delivered, "{name}");
        assert_eq!(
            r3.resolved_by.as_deref(),
            Some("upstream/w3#0 injection"),
            "{name}"
        );
        assert!(b.events("r3").await.unwrap()[0].evidence, "{name}");
        // Never by Message-ID, and never at the insert (no attempt yet: nothing to report).
        let mut by_mid = event(EventKind::Accepted, "injection", 1000);
        by_mid.message_id = Some("m2@example.com".into());
        b.apply_webhook(&receipt("w2", vec![by_mid])).await.unwrap();
        let mut r2 = record("r2", "k2", 2);
        r2.message_id = Some("m2@example.com".into());
        a.insert(&r2, RETENTION).await.unwrap();
        assert_eq!(b.events("r2").await.unwrap().len(), 0, "{name}");
        assert_eq!(b.message("r2").await.unwrap().unwrap().state, State::Queued);
        assert_eq!(b.queue_stats().await.unwrap().unmatched_events, 1, "{name}");
    }
}

on_both_backends!(an_accepted_event_resolves_an_unresolved_record_and_names_itself);
async fn an_accepted_event_resolves_an_unresolved_record_and_names_itself(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        unresolved_record(&a, "r1", "k1").await;
        // A type that proves nothing leaves it unresolved.
        let open = by_key(event(EventKind::Other, "open", 1000), "k1");
        let outcome = applied(b.apply_webhook(&receipt("o", vec![open])).await.unwrap());
        assert!(outcome.resolved.is_empty(), "{name}");
        let delivery = by_key(event(EventKind::Accepted, "delivery", 2000), "k1");
        let outcome = applied(
            b.apply_webhook(&receipt("d", vec![delivery]))
                .await
                .unwrap(),
        );
        assert_eq!(outcome.resolved.len(), 1, "{name}");
        assert_eq!(outcome.resolved[0].id, "r1");
        assert_eq!(outcome.resolved[0].evidence, "upstream/d#0 delivery");
        let m = a.message("r1").await.unwrap().unwrap();
        assert_eq!(m.state, State::Delivered, "{name}");
        assert_eq!(m.resolved_by.as_deref(), Some("upstream/d#0 delivery"));
        let reply = m.upstream_reply.unwrap();
        assert!(
            reply.starts_with("delivered by upstream event upstream/d#0 delivery"),
            "{name}: {reply}"
        );
        assert!(m.finished_at_ms.is_some());
        // A second accepted event changes nothing more.
        let again = by_key(event(EventKind::Accepted, "delivery", 3000), "k1");
        let outcome = applied(b.apply_webhook(&receipt("d2", vec![again])).await.unwrap());
        assert!(outcome.resolved.is_empty(), "{name}");
        let report = a.report(None).await.unwrap();
        let sum = |f: fn(&store::DailyCounts) -> u64| report.iter().map(f).sum::<u64>();
        assert_eq!(sum(|d| d.resolved_by_event), 1, "{name}");
        assert_eq!(sum(|d| d.unresolved), 1, "{name}");
        assert_eq!(sum(|d| d.delivered), 1, "{name}");
        assert_eq!(
            a.list(Some(State::Unresolved), 10, None)
                .await
                .unwrap()
                .len(),
            0,
            "{name}: the unresolved list shrank by itself"
        );
    }
}

on_both_backends!(an_event_resolves_only_the_record_it_names_and_not_before_it);
/// An event belongs to a record only when its key is the record's upstream key or its
/// upstream id one of the record's attempts', nothing it names contradicts the record, and it
/// is not older than the record's first attempt: sharing a Message-ID, naming another key or
/// upstream id, or predating the record never resolves it, whether the event arrives after
/// the record parked or was kept from before.
async fn an_event_resolves_only_the_record_it_names_and_not_before_it(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let day = 86_400_000;
        let now = common::now_ms();
        // A day-old event of a key not stored yet, kept unmatched.
        let early = by_key(event(EventKind::Accepted, "delivery", 0), "order-3");
        let early = UpstreamEvent {
            event_time_ms: now - day,
            ..early
        };
        let kept = applied(
            b.apply_webhook(&receipt("early", vec![early]))
                .await
                .unwrap(),
        );
        assert_eq!(kept.unmatched, 1, "{name}");

        // order-2 parks unresolved; order-1 was delivered with an upstream id.
        let mut two = record("r2", "order-2", 2);
        two.message_id = Some("shared@example.com".into());
        a.insert(&two, RETENTION).await.unwrap();
        let unknown = AttemptResult {
            outcome: OutcomeKind::Unknown,
            phase: Some(Phase::Dot),
            code: None,
            reply: "connection lost after the final dot".into(),
        };
        let park = Settle::Unresolved {
            upstream_reply: "unknown past the window".into(),
        };
        attempt_once(&a, "r2", unknown.clone(), park.clone()).await;
        let mut one = record("r1", "order-1", 1);
        one.message_id = Some("shared@example.com".into());
        a.insert(&one, RETENTION).await.unwrap();
        let ok = AttemptResult {
            reply: "250 2.0.0 OK U0001".into(),
            ..accepted()
        };
        let delivered = Settle::Delivered {
            upstream_reply: ok.reply.clone(),
            dsn: None,
        };
        attempt_once(&a, "r1", ok, delivered).await;
        unresolved_record(&a, "r3", "order-3").await;
        for id in ["r2", "r3"] {
            assert_eq!(
                b.message(id).await.unwrap().unwrap().state,
                State::Unresolved,
                "{name}: {id} resolved by an event kept from before its first attempt"
            );
        }

        // Events that do not belong to r2, each an accepted type.
        let mut older_of_one = by_key(event(EventKind::Accepted, "delivery", 0), "order-1");
        older_of_one.event_time_ms = now - day;
        older_of_one.message_id = Some("shared@example.com".into());
        let mut only_message_id = event(EventKind::Accepted, "delivery", 10);
        only_message_id.message_id = Some("shared@example.com".into());
        let mut other_key_and_id = by_key(event(EventKind::Accepted, "delivery", 20), "order-9");
        other_key_and_id.upstream_id = Some("U0009".into());
        let mut its_key_but_ones_id = by_key(event(EventKind::Accepted, "delivery", 30), "order-2");
        its_key_but_ones_id.upstream_id = Some("U0001".into());
        let mut its_key_but_too_old = by_key(event(EventKind::Accepted, "delivery", 0), "order-2");
        its_key_but_too_old.event_time_ms = now - day;
        let outcome = applied(
            b.apply_webhook(&receipt(
                "strangers",
                vec![
                    older_of_one,
                    only_message_id,
                    other_key_and_id,
                    its_key_but_ones_id,
                    its_key_but_too_old,
                ],
            ))
            .await
            .unwrap(),
        );
        assert!(outcome.resolved.is_empty(), "{name}: {outcome:?}");
        assert_eq!(
            b.message("r2").await.unwrap().unwrap().state,
            State::Unresolved,
            "{name}"
        );
        assert!(b.events("r2").await.unwrap().is_empty(), "{name}");
        // The older event of order-1 names order-1 but predates its first attempt too.
        assert!(b.events("r1").await.unwrap().is_empty(), "{name}");

        // One that names r2's key and is newer than its first attempt resolves it.
        let mine = by_key(event(EventKind::Accepted, "delivery", 40), "order-2");
        let outcome = applied(b.apply_webhook(&receipt("mine", vec![mine])).await.unwrap());
        assert_eq!(outcome.resolved.len(), 1, "{name}: {outcome:?}");
        assert_eq!(outcome.resolved[0].id, "r2", "{name}");
        assert_eq!(
            b.message("r2").await.unwrap().unwrap().state,
            State::Delivered,
            "{name}"
        );
        assert_eq!(
            b.message("r3").await.unwrap().unwrap().state,
            State::Unresolved,
            "{name}"
        );
    }
}
