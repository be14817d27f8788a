//! The Postgres backend's own tests (the contract both backends keep is in
//! tests/postgres/store_contract.rs).

use super::*;
use crate::*;

/// A connection to a new store at `url` made by the first `migrations` migrations only, as
/// an earlier release left it.
async fn store_made_by(url: &str, migrations: usize) -> PgConnection {
    let mut conn = PgConnection::connect(url).await.unwrap();
    Migrator::new(Embedded(&migrate::POSTGRES[..migrations]))
        .await
        .unwrap()
        .run(&mut conn)
        .await
        .unwrap();
    conn
}

#[test]
fn commit_levels_are_at_least_on_and_remote_apply_is_kept() {
    for (server, set) in [
        ("off", "SET synchronous_commit = on"),
        ("local", "SET synchronous_commit = on"),
        ("on", "SET synchronous_commit = on"),
        // Weaker than `on` on the standby's side: written there, not yet flushed.
        ("remote_write", "SET synchronous_commit = on"),
        ("remote_apply", "SET synchronous_commit = remote_apply"),
    ] {
        assert_eq!(durable_commit_statement(server), set, "{server}");
    }
}

/// An empty schema of its own for `test` in the database `IDEMRELAY_TEST_POSTGRES` names:
/// an admin connection, the schema's name and a URL whose connections use it. `None` (the
/// test is skipped) without the variable.
async fn fresh_test_schema(test: &str, prefix: &str) -> Option<(PgConnection, String, String)> {
    let Some(base) = std::env::var("IDEMRELAY_TEST_POSTGRES")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("SKIPPED {test}: set IDEMRELAY_TEST_POSTGRES");
        return None;
    };
    let schema = format!("{prefix}_{}", fastrand::u32(..));
    let mut admin = PgConnection::connect(&base).await.unwrap();
    admin
        .execute(format!("CREATE SCHEMA {schema}").as_str())
        .await
        .unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options[search_path]={schema}");
    Some((admin, schema, url))
}

/// Ends a test of `fresh_test_schema`: the store is dropped, not closed (closing its pool waits
/// for every connection, and the intake's writers keep theirs until the store is dropped),
/// then its schema goes.
async fn drop_test_schema(store: PostgresStore, mut admin: PgConnection, schema: &str) {
    drop(store);
    admin
        .execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
        .await
        .unwrap();
}

/// A level the session set itself is not changed by a later reload of the server's
/// configuration; one it only inherited is.
#[tokio::test]
async fn every_connection_sets_its_commit_level_itself() {
    let Some((admin, schema, url)) = fresh_test_schema(
        "every_connection_sets_its_commit_level_itself",
        "t_commit_level",
    )
    .await
    else {
        return;
    };
    let store = PostgresStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut conn = store.pool.acquire().await.unwrap();
        let (setting, source): (String, String) = sqlx::query_as(
            "SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        assert_eq!((setting.as_str(), source.as_str()), ("on", "session"));
        held.push(conn);
    }
    drop(held);
    drop_test_schema(store, admin, &schema).await;
}

/// A store made by the schema before delivery requests (migrations up to 14) upgrades:
/// the claim function is made again with the new column, and a job queued before is
/// claimed with no requests.
#[tokio::test]
async fn a_store_from_before_delivery_requests_upgrades_and_keeps_its_queue() {
    let Some((admin, schema, url)) = fresh_test_schema(
        "a_store_from_before_delivery_requests_upgrades",
        "t_requests_upgrade",
    )
    .await
    else {
        return;
    };
    let before = migrate::POSTGRES.iter().take_while(|m| m.0 < 15).count();
    assert_eq!(migrate::POSTGRES[before - 1].0, 14);
    {
        let mut old = store_made_by(&url, before).await;
        old.execute(
            "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at)
             VALUES ('old', 's', 'k', 'header', '\\x00', 'a@example.com',
                'b@example.com', '7BIT', false, 4, '\\x41420d0a', 'queued', '250 ok', 1);
             INSERT INTO delivery_jobs (message_id, scope, due_at) VALUES ('old', 's', 1);
             INSERT INTO scope_turns (scope, turn) VALUES ('s', 0);",
        )
        .await
        .unwrap();
        old.close().await.unwrap();
    }
    let store = PostgresStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let claimed = store
        .claim("w", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the old job");
    assert_eq!(claimed.id, "old");
    assert!(claimed.requests.is_empty());
    drop_test_schema(store, admin, &schema).await;
}

/// A store made by the release before the lean intake schema (migrations up to 15), with
/// a record in every state, opens under the current one: the queue figures, the state
/// filters and the key lookup without a scope find the same records as before.
#[tokio::test]
async fn a_store_from_before_the_lean_intake_keeps_every_record_findable() {
    let Some((admin, schema, url)) =
        fresh_test_schema("a_store_from_before_the_lean_intake", "t_lean_upgrade").await
    else {
        return;
    };
    let before = migrate::POSTGRES.iter().take_while(|m| m.0 < 16).count();
    assert_eq!(migrate::POSTGRES[before - 1].0, 15);
    {
        let mut old = store_made_by(&url, before).await;
        for (i, state) in State::ALL.into_iter().enumerate() {
            let state = state.as_str();
            let scope = if i % 2 == 0 { "even" } else { "odd" };
            sqlx::query(
                "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint,
                    mail_from, rcpt_to, body_type, smtputf8, size, content, state, reply,
                    accepted_at, finished_at, upstream_key, header_message_id)
                 VALUES ($1, $2, $3, 'header', '\\x00', 'a@example.com', 'b@example.com',
                    '7BIT', false, 4, '\\x41420d0a', $4, '250 ok', $5,
                    CASE WHEN $4 = 'queued' THEN NULL ELSE $5 + 1 END, $3, 'mid-' || $4 || '@example.com')",
            )
            .bind(format!("r{i}"))
            .bind(scope)
            .bind(format!("key-{state}"))
            .bind(state)
            .bind(1_000 + i as i64)
            .execute(&mut old)
            .await
            .unwrap();
            if state == "queued" {
                sqlx::query(
                    "INSERT INTO delivery_jobs (message_id, scope, due_at) VALUES ($1, $2, 1)",
                )
                .bind(format!("r{i}"))
                .bind(scope)
                .execute(&mut old)
                .await
                .unwrap();
            }
        }
        old.close().await.unwrap();
    }
    let store = PostgresStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap();
    crate::test_checks::assert_one_record_per_state_is_findable(&store).await;
    drop_test_schema(store, admin, &schema).await;
}

/// The retention purge bounds the replayed records by the `(state, accepted_at)` index, as on
/// SQLite. It runs at start and every `purge_interval`, beside intake: reading every finished
/// record took 0.9 s and 200,000 buffers on a million-record store.
#[tokio::test]
async fn the_purge_reads_only_expired_records() {
    let Some((admin, schema, url)) =
        fresh_test_schema("the_purge_reads_only_expired_records", "t_purge_plan").await
    else {
        return;
    };
    let store = PostgresStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let mut conn = store.pool.acquire().await.unwrap();
    // Planned as for a large table: an empty one is read whole whatever the condition.
    conn.execute("SET enable_seqscan = off").await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {}", operator::purge_sql()))
        .bind(0i64)
        .bind(0i64)
        .bind(0i64)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert!(
        plan.iter()
            .any(|line| line.contains("Index Cond") && line.contains("accepted_at <=")),
        "{plan:#?}"
    );
    // Joined by OR, the two kinds were planned as one scan of every finished record with the
    // OR as its filter (on a million records; an empty table still shows the OR).
    assert!(
        !plan
            .iter()
            .any(|line| line.contains("Filter") && line.contains(" OR ")),
        "{plan:#?}"
    );
    drop(conn);
    drop_test_schema(store, admin, &schema).await;
}

/// The relay's connections never JIT-compile a plan: the retention purge on a million-record
/// store spent 240 ms of CPU compiling a statement that runs in 0.3 ms.
#[tokio::test]
async fn connections_do_not_compile_plans() {
    let Some((admin, schema, url)) =
        fresh_test_schema("connections_do_not_compile_plans", "t_jit").await
    else {
        return;
    };
    let store = PostgresStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(jit, "off");
    drop_test_schema(store, admin, &schema).await;
}

/// Claims, intents and plain outcomes of several workers are written in one transaction; one
/// that fails there (here a lock timeout behind another session holding its job) is written alone
/// again, and so are the others: they do not fail with it.
#[tokio::test]
async fn a_delivery_write_that_fails_in_a_batch_does_not_fail_the_others() {
    let Some((admin, schema, url)) = fresh_test_schema(
        "a_delivery_write_that_fails_in_a_batch_does_not_fail_the_others",
        "t_ledger_batch",
    )
    .await
    else {
        return;
    };
    let store = PostgresStore::open(&url, Duration::from_millis(500))
        .await
        .unwrap();
    let retention = Retention::flat(Duration::from_secs(3600));
    for n in 1..=3 {
        let record = crate::test_record(&format!("m{n}"), &format!("k{n}"));
        assert_eq!(
            store.insert(&record, retention).await.unwrap(),
            Insert::Inserted
        );
    }
    // Three claims in one batch: each sees the jobs the ones before it leased.
    let lease = Duration::from_secs(60);
    let (a, b, c) = tokio::join!(
        store.claim("w1", lease),
        store.claim("w2", lease),
        store.claim("w3", lease),
    );
    let jobs = [a, b, c].map(|claimed| claimed.unwrap().expect("a job for each claim"));
    let mut ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["m1", "m2", "m3"]);
    // Another session holds the second job's row.
    let mut holder = PgConnection::connect(&url).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    sqlx::query("SELECT 1 FROM delivery_jobs WHERE message_id = $1 FOR UPDATE")
        .bind(&jobs[1].id)
        .execute(&mut holder)
        .await
        .unwrap();
    // The test's runtime runs one task at a time: the three writes are all waiting before a
    // writer takes them, so they make one batch.
    let (first, second, third) = tokio::join!(
        store.begin_attempt(&jobs[0].id, jobs[0].token, 1),
        store.begin_attempt(&jobs[1].id, jobs[1].token, 1),
        store.begin_attempt(&jobs[2].id, jobs[2].token, 1),
    );
    assert!(first.unwrap());
    assert!(second.is_err(), "{second:?}");
    assert!(third.unwrap());
    holder.execute("ROLLBACK").await.unwrap();
    for (job, intents) in jobs.iter().zip([1, 0, 1]) {
        assert_eq!(store.attempts(&job.id).await.unwrap().len(), intents);
    }
    // Outcomes likewise, all in.
    let delivered = Settle::Delivered {
        upstream_reply: "250 ok".into(),
        dsn: None,
    };
    let accepted = AttemptResult {
        outcome: OutcomeKind::Accepted,
        phase: Some(Phase::Dot),
        code: Some(250),
        reply: "250 ok".into(),
    };
    let (first, third) = tokio::join!(
        store.settle(&jobs[0].id, jobs[0].token, Some((1, &accepted)), &delivered),
        store.settle(&jobs[2].id, jobs[2].token, Some((1, &accepted)), &delivered),
    );
    assert!(first.unwrap() && third.unwrap());
    for job in [&jobs[0], &jobs[2]] {
        assert_eq!(
            store.message(&job.id).await.unwrap().unwrap().state,
            State::Delivered
        );
    }
    drop_test_schema(store, admin, &schema).await;
}
