//! Queue statistics, listings, operator actions, bulk cancels, and inserts arriving together.

use super::*;

on_both_backends!(queue_stats_count_queued_records_per_scope);
/// The per-scope queue depth behind `idemrelay_queued_by_scope`: queued records only, each
/// scope once, scopes with nothing queued left out.
async fn queue_stats_count_queued_records_per_scope(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, _b) in instances(&dir, backend).await {
        let in_scope = |id: &str, scope: &str, fp: u8| NewRecord {
            scope: scope.into(),
            ..record(id, &format!("k-{id}"), fp)
        };
        // Delivered records in "t" and "u" first: only queued ones count.
        for (id, scope, fp) in [("done", "t", 1), ("gone", "u", 5)] {
            a.insert(&in_scope(id, scope, fp), RETENTION).await.unwrap();
            attempt_once(
                &a,
                id,
                accepted(),
                Settle::Delivered {
                    upstream_reply: "250 ok".into(),
                    dsn: None,
                },
            )
            .await;
        }
        for (id, scope, fp) in [("s1", "s", 2), ("s2", "s", 3), ("t1", "t", 4)] {
            a.insert(&in_scope(id, scope, fp), RETENTION).await.unwrap();
        }
        let mut by_scope = a.queue_stats().await.unwrap().queued_by_scope;
        by_scope.sort();
        assert_eq!(
            by_scope,
            vec![("s".to_string(), 2), ("t".to_string(), 1)],
            "{name}"
        );
    }
}

/// A record with an id in the relay's form (acceptance time first), so that listings order
/// and bound it as they do real ones.
fn listed_record(n: u8, scope: &str, from: &str, rcpt: &[&str]) -> NewRecord {
    let mut r = record(
        &format!("{:011X}{:013X}", common::now_ms(), n),
        &format!("k{n}"),
        n,
    );
    r.scope = scope.into();
    r.envelope.mail_from = from.into();
    r.envelope.rcpt_to = rcpt.iter().map(|s| s.to_string()).collect();
    r.message_id = Some(format!("m{n}@example.com"));
    r
}

fn ids(page: &store::Page) -> Vec<String> {
    page.records.iter().map(|r| r.id.clone()).collect()
}

on_both_backends!(listings_filter_page_and_say_when_more_follow);
/// `queue list` / `GET /api/v1/messages`: every filter, both orders, and a cursor that walks
/// the pages once; a cursor is opaque and belongs to its order.
async fn listings_filter_page_and_say_when_more_follow(backend: Backend) {
    use store::{Cursor, ListFilter, StateFilter};
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let r1 = listed_record(1, "s", "a@example.com", &["b@example.com"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let r2 = listed_record(2, "t", "x@example.com", &["C@Example.com", "d@example.com"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let r3 = listed_record(3, "s", "y@example.com", &["b@example.com"]);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let r4 = listed_record(4, "s", "z@example.com", &["e@example.com"]);
        for r in [&r1, &r2, &r3, &r4] {
            a.insert(r, RETENTION).await.unwrap();
        }
        let all = vec![r1.id.clone(), r2.id.clone(), r3.id.clone(), r4.id.clone()];
        // r4 fails once (transient) and waits an hour: deferred.
        let mut job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        while job.id != r4.id {
            a.release(&job.id, job.token, Duration::ZERO).await.unwrap();
            job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        }
        assert!(a.begin_attempt(&r4.id, job.token, 1).await.unwrap());
        let transient = AttemptResult {
            outcome: OutcomeKind::Transient,
            phase: Some(Phase::Connect),
            code: None,
            reply: "connection refused".into(),
        };
        let retry = Settle::Retry {
            after: Duration::from_secs(3600),
            dsn: None,
        };
        assert!(a
            .settle(&r4.id, job.token, Some((1, &transient)), &retry)
            .await
            .unwrap());

        let find = |f: ListFilter| {
            let b = b.clone();
            async move { b.list_page(&ListFilter { limit: 100, ..f }).await.unwrap() }
        };
        let everything = find(ListFilter::default()).await;
        assert_eq!(ids(&everything), all, "{name}");
        assert_eq!(everything.next_cursor, None, "{name}");
        let by = |f: ListFilter| {
            let find = &find;
            async move { ids(&find(f).await) }
        };
        let state = |s| ListFilter {
            state: Some(s),
            ..ListFilter::default()
        };
        assert_eq!(
            by(state(StateFilter::Is(State::Queued))).await,
            all,
            "{name}"
        );
        assert_eq!(
            by(state(StateFilter::Deferred)).await,
            std::slice::from_ref(&r4.id),
            "{name}"
        );
        assert_eq!(
            by(state(StateFilter::Is(State::Delivered))).await,
            Vec::<String>::new(),
            "{name}"
        );
        let filters = [
            (
                ListFilter {
                    scope: Some("t".into()),
                    ..ListFilter::default()
                },
                vec![&r2],
            ),
            (
                ListFilter {
                    key: Some("k3".into()),
                    ..ListFilter::default()
                },
                vec![&r3],
            ),
            (
                ListFilter {
                    sender: Some("A@EXAMPLE.COM".into()),
                    ..ListFilter::default()
                },
                vec![&r1],
            ),
            (
                ListFilter {
                    recipient: Some("c@example.com".into()),
                    ..ListFilter::default()
                },
                vec![&r2],
            ),
            (
                ListFilter {
                    recipient: Some("b@example.com".into()),
                    scope: Some("s".into()),
                    ..ListFilter::default()
                },
                vec![&r1, &r3],
            ),
            // A recipient matches a whole address, never a part of one.
            (
                ListFilter {
                    recipient: Some("example.com".into()),
                    ..ListFilter::default()
                },
                vec![],
            ),
            (
                ListFilter {
                    message_id: Some("<m3@example.com>".into()),
                    ..ListFilter::default()
                },
                vec![&r3],
            ),
        ];
        for (filter, want) in filters {
            let want: Vec<String> = want.iter().map(|r| r.id.clone()).collect();
            assert_eq!(by(filter.clone()).await, want, "{name}: {filter:?}");
        }
        // Time ranges on acceptance.
        let at: Vec<i64> = everything
            .records
            .iter()
            .map(|r| r.accepted_at_ms)
            .collect();
        let range = ListFilter {
            since_ms: Some(at[1]),
            until_ms: Some(at[2] + 1),
            ..ListFilter::default()
        };
        // Records accepted in the same millisecond as the third fall inside the range too.
        let in_range: Vec<String> = everything
            .records
            .iter()
            .filter(|r| r.accepted_at_ms >= at[1] && r.accepted_at_ms < at[2] + 1)
            .map(|r| r.id.clone())
            .collect();
        assert!(
            in_range.contains(&all[1]) && in_range.contains(&all[2]),
            "{name}: {at:?}"
        );
        assert!(
            !in_range.contains(&all[0]) || at[0] == at[1],
            "{name}: {at:?}"
        );
        assert_eq!(by(range).await, in_range, "{name}: {at:?}");

        // What a listing tells about a record.
        let r4_row = &everything.records[3];
        assert_eq!(r4_row.failed_attempts, 1, "{name}");
        assert_eq!(r4_row.rcpt_to, ["e@example.com"], "{name}");
        assert_eq!(
            r4_row.message_id.as_deref(),
            Some("m4@example.com"),
            "{name}"
        );
        let due = r4_row.next_attempt_at_ms.unwrap();
        assert!(due > r4_row.read_at_ms + 3_500_000, "{name}: {due}");
        assert!(!r4_row.leased, "{name}");

        // Pages of two, both orders; the cursor survives being a string.
        for newest_first in [false, true] {
            let mut seen = Vec::new();
            let mut cursor = None;
            for _ in 0..4 {
                let filter = ListFilter {
                    newest_first,
                    limit: 2,
                    cursor: cursor.clone(),
                    ..ListFilter::default()
                };
                let page = b.list_page(&filter).await.unwrap();
                seen.extend(ids(&page));
                match page.next_cursor {
                    Some(next) => cursor = Some(Cursor::decode(&next.encode()).unwrap()),
                    None => break,
                }
            }
            let mut want = all.clone();
            if newest_first {
                want.reverse();
            }
            assert_eq!(seen, want, "{name}: newest first {newest_first}");
        }
        let oldest_cursor = b
            .list_page(&ListFilter::all(1))
            .await
            .unwrap()
            .next_cursor
            .unwrap();
        let mixed = ListFilter {
            newest_first: true,
            cursor: Some(oldest_cursor),
            ..ListFilter::all(1)
        };
        assert!(
            matches!(
                b.list_page(&mixed).await,
                Err(store::StoreError::InvalidFilter(_))
            ),
            "{name}"
        );
        assert!(Cursor::decode("not-a-cursor").is_err());
        // The compatibility listing by state and id still pages.
        assert_eq!(
            b.list(None, 2, Some(&all[1])).await.unwrap().len(),
            2,
            "{name}"
        );
    }
}

on_both_backends!(operator_actions_are_recorded_with_the_change_they_made);
/// Cancel, retry and flush write their action row (who, why) in the same commit as the
/// change; relay-wide actions are kept apart; a DSN and its record link both ways.
async fn operator_actions_are_recorded_with_the_change_they_made(backend: Backend) {
    use store::{Action, Flush, Requeue};
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let by = operator();
        a.insert(&record("q1", "k1", 1), RETENTION).await.unwrap();
        a.insert(&record("q2", "k2", 2), RETENTION).await.unwrap();
        let job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        let (held, free) = if job.id == "q1" {
            ("q1", "q2")
        } else {
            ("q2", "q1")
        };
        assert_eq!(b.flush(held, &by).await.unwrap(), Flush::Leased, "{name}");
        assert!(b.message(held).await.unwrap().unwrap().leased, "{name}");
        assert!(matches!(
            b.flush(free, &by).await.unwrap(),
            Flush::Flushed { .. }
        ));
        // The held one fails once and waits an hour; a flush makes it due now.
        assert!(a.begin_attempt(held, job.token, 1).await.unwrap());
        let transient = AttemptResult {
            outcome: OutcomeKind::Transient,
            phase: Some(Phase::Connect),
            code: None,
            reply: "connection refused".into(),
        };
        let hour = Settle::Retry {
            after: Duration::from_secs(3600),
            dsn: None,
        };
        assert!(a
            .settle(held, job.token, Some((1, &transient)), &hour)
            .await
            .unwrap());
        let waiting = b.message(held).await.unwrap().unwrap();
        let due = waiting.next_attempt_at_ms.unwrap();
        assert!(due > common::now_ms() + 3_500_000, "{name}");
        match b.flush(held, &by).await.unwrap() {
            Flush::Flushed { was_due_at_ms } => assert_eq!(was_due_at_ms, due, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        let now_due = b.message(held).await.unwrap().unwrap();
        assert!(
            now_due.next_attempt_at_ms.unwrap() <= common::now_ms(),
            "{name}"
        );
        // The refused flush (leased) left no row.
        let history = &now_due.history;
        assert_eq!(history.len(), 1, "{name}: {history:?}");
        assert_eq!(
            (history[0].action.as_str(), history[0].actor.as_str()),
            ("flush", "local user tester"),
            "{name}"
        );
        assert!(
            history[0]
                .detail
                .as_deref()
                .unwrap_or_default()
                .starts_with("was due in"),
            "{name}: {history:?}"
        );
        assert_eq!(history[0].reason, "contract test", "{name}");
        assert_eq!(history[0].record_id.as_deref(), Some(held), "{name}");

        // flush --all takes what is not due yet and not leased.
        let job = a.claim("w", LONG_LEASE).await.unwrap().unwrap();
        assert!(a.settle(&job.id, job.token, None, &hour).await.unwrap());
        assert_eq!(
            b.flush_all(&by).await.unwrap(),
            std::slice::from_ref(&job.id),
            "{name}"
        );
        assert_eq!(
            b.flush_all(&by).await.unwrap(),
            Vec::<String>::new(),
            "{name}"
        );

        // Cancel: a state of its own, counted apart, retryable, all on record.
        assert!(b.cancel(free, &by).await.unwrap(), "{name}");
        let cancelled = b.message(free).await.unwrap().unwrap();
        assert_eq!(cancelled.state, State::Cancelled, "{name}");
        assert_eq!(
            b.flush(free, &by).await.unwrap(),
            Flush::NotQueued(State::Cancelled),
            "{name}"
        );
        assert_eq!(
            b.flush("nope", &by).await.unwrap(),
            Flush::NotFound,
            "{name}"
        );
        let stats = b.queue_stats().await.unwrap();
        assert!(
            stats.by_state.contains(&(State::Cancelled, 1)),
            "{name}: {stats:?}"
        );
        let today = b.report(None).await.unwrap();
        assert_eq!(
            (today[0].cancelled, today[0].failed),
            (1, 0),
            "{name}: {today:?}"
        );
        assert_eq!(
            b.requeue(free, false, &by).await.unwrap(),
            Requeue::Requeued,
            "{name}"
        );
        let actions: Vec<(String, Option<String>)> = b
            .message(free)
            .await
            .unwrap()
            .unwrap()
            .history
            .into_iter()
            .map(|h| (h.action, h.detail))
            .collect();
        let want: Vec<(String, Option<String>)> = vec![
            ("flush".into(), Some("was already due".into())),
            ("cancel".into(), None),
            ("retry".into(), Some("requeued from cancelled".into())),
        ];
        // flush_all may have taken this one too (it was the one not due yet).
        let actions: Vec<_> = actions
            .into_iter()
            .filter(|(a, d)| !(a == "flush" && d.as_deref() != Some("was already due")))
            .collect();
        assert_eq!(actions, want, "{name}");

        // Relay-wide actions are not any record's.
        b.record_action(Action::Pause, &by, None).await.unwrap();
        b.record_action(Action::Purge, &by, Some("purged 0 expired record(s)"))
            .await
            .unwrap();
        let relay: Vec<String> = a
            .relay_actions(10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.action)
            .collect();
        // The two flushes of every waiting record are one relay-wide action each.
        assert_eq!(
            relay,
            ["purge", "pause", "flush", "flush"],
            "{name}: newest first"
        );

        // A DSN and the record it reports on.
        let mut dsn = record("dsn1", "k-dsn", 9);
        dsn.dsn_of = Some(held.into());
        a.insert(&dsn, RETENTION).await.unwrap();
        assert_eq!(
            b.message(held).await.unwrap().unwrap().dsns,
            ["dsn1"],
            "{name}"
        );
        assert_eq!(
            b.message("dsn1").await.unwrap().unwrap().dsn_of.as_deref(),
            Some(held),
            "{name}"
        );

        // Relay-wide actions are kept as long as parked records, then purged.
        b.purge_expired(RETENTION).await.unwrap();
        assert_eq!(a.relay_actions(10).await.unwrap().len(), 4, "{name}");
        tokio::time::sleep(Duration::from_millis(5)).await;
        b.purge_expired(Retention::flat(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(a.relay_actions(10).await.unwrap(), [], "{name}");
        assert!(
            !b.message(held).await.unwrap().unwrap().history.is_empty(),
            "{name}: a queued record keeps its history"
        );
    }
}

on_both_backends!(a_bulk_cancel_is_one_action_and_leaves_what_it_cannot_cancel);
/// `cancel_all` cancels the queued records no worker holds, in one commit with ONE relay-wide
/// action row carrying the count, and none per record.
async fn a_bulk_cancel_is_one_action_and_leaves_what_it_cannot_cancel(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let by = operator();
        for (n, id) in ["q1", "q2", "q3"].iter().enumerate() {
            a.insert(&record(id, &format!("k{n}"), n as u8), RETENTION)
                .await
                .unwrap();
        }
        let held = a.claim("w", LONG_LEASE).await.unwrap().unwrap().id;
        let ids: Vec<String> = ["q1", "q2", "q3", "nope"].map(String::from).to_vec();
        let cancelled = b
            .cancel_all(&ids, &by, "matching state=queued")
            .await
            .unwrap();
        let want: Vec<String> = ["q1", "q2", "q3"]
            .iter()
            .filter(|id| **id != held)
            .map(|id| id.to_string())
            .collect();
        assert_eq!(cancelled, want, "{name}");
        for id in &want {
            let m = b.message(id).await.unwrap().unwrap();
            assert_eq!(m.state, State::Cancelled, "{name}");
            assert!(m.history.is_empty(), "{name}: {:?}", m.history);
        }
        assert_eq!(
            b.message(&held).await.unwrap().unwrap().state,
            State::Queued,
            "{name}"
        );
        let relay = a.relay_actions(10).await.unwrap();
        assert_eq!(relay.len(), 1, "{name}: {relay:?}");
        assert_eq!(relay[0].action, "cancel", "{name}");
        assert_eq!(
            relay[0].detail.as_deref(),
            Some("cancelled 2 record(s) matching state=queued"),
            "{name}"
        );
    }
}

on_both_backends!(inserts_arriving_together_behave_as_one_after_another);
/// Many sessions' inserts at once (on Postgres they share commits: several records in one
/// transaction): each key is inserted once, and every other insert of it, whether in the same
/// batch or not, finds that record as a sequential insert would, with the same fingerprint
/// (a replay) or not (a reuse of the key).
async fn inserts_arriving_together_behave_as_one_after_another(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, _) in instances(&dir, backend).await {
        let mut tasks = Vec::new();
        for k in 0..30 {
            for copy in 0..3u8 {
                let store = a.clone();
                tasks.push(tokio::spawn(async move {
                    // Copies 0 and 1 are the same message; copy 2 reuses the key.
                    let rec = record(&format!("r{k}-{copy}"), &format!("key-{k}"), copy / 2);
                    (k, store.insert(&rec, RETENTION).await.unwrap())
                }));
            }
        }
        let mut inserted = vec![Vec::new(); 30];
        let mut found = vec![Vec::new(); 30];
        for t in tasks {
            let (k, result) = t.await.unwrap();
            match result {
                Insert::Inserted => inserted[k].push(()),
                Insert::Existing(e) => found[k].push(e),
            }
        }
        for k in 0..30 {
            assert_eq!(inserted[k].len(), 1, "{name}: key-{k}");
            let kept = a.lookup("s", &format!("key-{k}"), RETENTION).await.unwrap();
            assert_eq!(kept.len(), 1, "{name}: key-{k}");
            for existing in &found[k] {
                assert_eq!(existing.len(), 1, "{name}: key-{k}");
                assert_eq!(existing[0].id, kept[0].id, "{name}: key-{k}");
                assert_eq!(existing[0].fingerprint, kept[0].fingerprint, "{name}");
            }
            let job = a.message(&kept[0].id).await.unwrap().unwrap();
            assert!(job.has_job, "{name}: key-{k} is queued with its job");
        }
        assert_eq!(a.list(None, 1000, None).await.unwrap().len(), 30, "{name}");
        // Counted once each, whichever transaction and counter shard they went in with.
        let days = a.report(None).await.unwrap();
        let accepted: u64 = days.iter().map(|d| d.accepted).sum();
        assert_eq!(accepted, 30, "{name}");
    }
}

on_both_backends!(a_record_the_database_refuses_fails_alone);
/// A record Postgres refuses (text with a NUL byte) among others arriving at the same time:
/// it fails, and only it; every other is inserted and stays. SQLite stores such text, so
/// there all are inserted.
async fn a_record_the_database_refuses_fails_alone(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    for (name, a, b) in instances(&dir, backend).await {
        let mut tasks = Vec::new();
        for k in 0..20 {
            let store = a.clone();
            tasks.push(tokio::spawn(async move {
                let mut rec = record(&format!("r{k}"), &format!("key-{k}"), 1);
                if k == 10 {
                    rec.envelope.mail_from = "nul\0@example.com".into();
                }
                (k, store.insert(&rec, RETENTION).await)
            }));
        }
        for t in tasks {
            let (k, result) = t.await.unwrap();
            let refused = k == 10 && name == "postgres";
            assert_eq!(result.is_err(), refused, "{name}: r{k}: {result:?}");
            let stored = b.message(&format!("r{k}")).await.unwrap();
            assert_eq!(stored.is_none(), refused, "{name}: r{k}");
        }
    }
}
