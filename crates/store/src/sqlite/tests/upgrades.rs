//! Stores made by earlier releases, opened by this one: each keeps its records and they stay
//! usable.

use super::*;

/// A new store at `url` made by the first `migrations` migrations only, as an earlier
/// release left it.
async fn store_made_by(url: &str, migrations: usize) -> SqlitePool {
    let options = SqliteConnectOptions::from_str(url)
        .unwrap()
        .create_if_missing(true)
        .foreign_keys(true);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    Migrator::new(Embedded(&migrate::SQLITE[..migrations]))
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    pool
}

/// A store made before the `cancelled` state (migrations up to 10) keeps its rows, and a
/// queued record in it can be cancelled once the relay opens it; the state column still
/// refuses anything else.
#[tokio::test]
async fn a_store_from_before_the_cancelled_state_takes_it_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    {
        let pool = store_made_by(&url, 10).await;
        sqlx::query(
            "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at)
             VALUES ('old', 's', 'k', 'header', zeroblob(32), 'a@example.com', 'b@example.com',
                '7BIT', 0, 4, x'41420d0a', 'queued', '250 ok', 1)",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO attempts (message_id, attempt, owner, started_at, finished_at, outcome)
             VALUES ('old', 1, 'w', 2, 3, 'transient')",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = SqliteStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(store.cancel("old", &op()).await.unwrap());
    let m = store.message("old").await.unwrap().unwrap();
    assert_eq!(m.state, State::Cancelled);
    assert_eq!(m.history.len(), 1);
    assert_eq!(
        store.attempts("old").await.unwrap().len(),
        1,
        "the ledger kept"
    );
    let refused = store
        .writer
        .write(|conn| Ok(conn.execute("UPDATE messages SET state = 'bogus' WHERE id = 'old'", [])?))
        .await;
    assert!(refused.is_err(), "the CHECK still holds: {refused:?}");
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(check, "ok");
}

/// A store made by the release before the lean intake schema (migrations up to 15), with a
/// record in every state, opens under the current one: every record keeps its state, the
/// queue figures, the state filters and the key lookup without a scope find the same records
/// as before, and the finished records are in the state indexes the purge and the filters use.
#[tokio::test]
async fn a_store_from_before_the_lean_intake_keeps_every_record_findable() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    {
        let before = migrate::SQLITE
            .iter()
            .position(|m| m.0 == 16)
            .expect("migration 16");
        let pool = store_made_by(&url, before).await;
        for (i, state) in State::ALL.into_iter().enumerate() {
            let state = state.as_str();
            // The queued record gets its job from the trigger, as in that release.
            sqlx::query(
                "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                    rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at,
                    finished_at, upstream_key, header_message_id)
                 VALUES (?1, ?2, ?3, 'header', zeroblob(32), 'a@example.com', 'b@example.com',
                    '7BIT', 0, 4, x'41420d0a', ?4, '250 ok', ?5,
                    CASE WHEN ?4 = 'queued' THEN NULL ELSE ?5 + 1 END, ?3, 'mid-' || ?4 || '@example.com')",
            )
            .bind(format!("r{i}"))
            .bind(if i % 2 == 0 { "even" } else { "odd" })
            .bind(format!("key-{state}"))
            .bind(state)
            .bind(1_000 + i as i64)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }
    let store = SqliteStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap();
    crate::test_checks::assert_one_record_per_state_is_findable(&store).await;
    let indexed: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM messages INDEXED BY messages_state_id WHERE state <> 'queued'",
    )
    .fetch_one(&store.pool)
    .await
    .unwrap();
    assert_eq!(indexed, 5, "every finished record in the state index");
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(check, "ok");
}

/// A store made by the schema before delivery requests (migrations up to 13) upgrades: its
/// queued record is claimed with no requests (its new column NULL), and a record written after
/// the upgrade keeps its own.
#[tokio::test]
async fn a_store_from_before_delivery_requests_upgrades_and_keeps_its_queue() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let before: Vec<i64> = migrate::SQLITE
        .iter()
        .map(|m| m.0)
        .take_while(|v| *v < 15)
        .collect();
    assert_eq!(before.last(), Some(&13), "the previous schema ends at 13");
    {
        let pool = store_made_by(&url, before.len()).await;
        sqlx::query(
            "INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
                rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at)
             VALUES ('old', 's', 'k', 'header', zeroblob(32), 'a@example.com', 'b@example.com',
                '7BIT', 0, 4, x'41420d0a', 'queued', '250 ok', 1)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = SqliteStore::open(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let mut new = record("new", "k2");
    new.envelope.requests.ret = Some("HDRS".into());
    new.envelope.requests.require_tls = true;
    assert_eq!(
        store
            .insert(&new, Retention::flat(Duration::from_secs(3600)))
            .await
            .unwrap(),
        Insert::Inserted
    );
    let old = store.claim("w", LEASE).await.unwrap().expect("the old job");
    assert_eq!(old.id, "old");
    assert!(old.requests.is_empty());
    assert!(store
        .message("old")
        .await
        .unwrap()
        .unwrap()
        .requests
        .is_empty());
    let claimed = store.claim("w", LEASE).await.unwrap().expect("the new job");
    assert_eq!(claimed.id, "new");
    assert_eq!(claimed.requests, new.envelope.requests);
    assert_eq!(
        store.message("new").await.unwrap().unwrap().requests,
        new.envelope.requests
    );
}
