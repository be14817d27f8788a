//! Keys and destinations: split messages, scopes, instances, and users with an upstream of
//! their own.

use super::*;

/// A split message (docs/concepts/contract.md): both parts reach the upstream, each under a key of its own
/// (the client's for part 1), so the upstream takes neither for a reuse of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_parts_of_a_split_message_are_delivered_under_their_own_keys() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| s.max_recipients = 2).await;
    let msg = message(Some("split-delivery"), "s", "one message, three recipients");
    let a = submit(
        &relay,
        "sender@example.com",
        &["a@example.com", "b@example.com"],
        &msg,
    )
    .await;
    let b = submit(&relay, "sender@example.com", &["c@example.com"], &msg).await;
    assert_ne!(a, b);
    wait_state(&relay, &a, State::Delivered).await;
    wait_state(&relay, &b, State::Delivered).await;
    let mut keys: Vec<String> = sink
        .messages()
        .iter()
        .filter_map(|m| m.key.clone())
        .collect();
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0], "split-delivery");
    assert!(keys[1].ends_with("-2-split-delivery"), "{keys:?}");
    let stats = sink.stats();
    assert!(stats.keys.values().all(|k| k.accepted == 1), "{stats:?}");
}

/// Two tenants sharing one upstream account (docs/concepts/contract.md "The key the upstream sees"): alice and
/// bob each send their own message under `welcome-customer-1`. Both are delivered, each once,
/// under keys that carry the scope; the upstream sees no reuse and no DSN is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_scopes_with_the_same_key_are_both_delivered() {
    let sink = start_sink().await;
    let relay = relay_with_alice_and_bob(&sink, |_| {}).await;
    let ids = alice_and_bob_submit(&relay, "welcome-customer-1").await;
    let keys: Vec<String> = sink
        .messages()
        .iter()
        .filter_map(|m| m.key.clone())
        .collect();
    assert_eq!(keys.len(), 2, "no DSN, no refusal: {keys:?}");
    assert_ne!(keys[0], keys[1]);
    for id in &ids {
        let stored = relay.stored(id).await;
        assert_eq!(stored.key.as_deref(), Some("welcome-customer-1"));
        let up = stored.upstream_key.unwrap();
        assert!(
            up.starts_with("u1-") && up.ends_with("-1-welcome-customer-1"),
            "{up}"
        );
        assert!(keys.contains(&up), "{up} not at the sink: {keys:?}");
    }
}

/// Two relays on one store and one upstream, each with a scope of its own (two tenants'
/// instances): whether a scope's keys reach the upstream unchanged is decided for the whole
/// deployment, in the store, not by each instance's config. `order-1` of each reaches the
/// upstream under two different keys, and both messages are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_different_scopes_on_one_store_send_different_upstream_keys() {
    let sink = start_sink().await;
    let first = relay_for(&sink, |s| s.scope = "tenant-a".into()).await;
    let mut settings = first.settings.clone();
    settings.scope = "tenant-b".into();
    let second = common::TestRelay::start_in(tempfile::tempdir().unwrap(), settings).await;
    let mut ids = Vec::new();
    for (relay, who) in [(&first, "a"), (&second, "b")] {
        let msg = message(Some("order-1"), "order", &format!("tenant {who}'s order"));
        ids.push(submit(relay, "shop@example.com", &["buyer@example.net"], &msg).await);
    }
    for id in &ids {
        wait_state(&first, id, State::Delivered).await;
    }
    let mut keys: Vec<String> = sink
        .messages()
        .iter()
        .filter_map(|m| m.key.clone())
        .collect();
    keys.sort();
    assert_eq!(
        keys.len(),
        2,
        "both messages reached the upstream: {keys:?}"
    );
    assert_ne!(keys[0], keys[1], "one upstream key for two messages");
    // The first scope to claim the upstream keeps its clients' keys; the other's carry it.
    let mut upstream_keys = Vec::new();
    for id in &ids {
        upstream_keys.push(first.stored(id).await.upstream_key.unwrap());
    }
    assert!(
        upstream_keys.contains(&"order-1".to_string()),
        "{upstream_keys:?}"
    );
    let stats = sink.stats();
    assert!(stats.keys.values().all(|k| k.accepted == 1), "{stats:?}");
}

/// A user with an upstream of their own (the users file's `upstream`): that scope's mail goes
/// there, under the client's key unchanged when the scope is alone on it, while the others
/// keep using the relay's upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_an_upstream_of_their_own_is_delivered_there() {
    let shared_sink = start_sink().await;
    let own_sink = start_sink().await;
    let own = own_sink.smtp_addr();
    let relay = relay_with_alice_and_bob(&shared_sink, |users| {
        // The upstream is set by hand in the file; a later `user add` keeps it.
        let text = std::fs::read_to_string(users).unwrap().replace(
            "[users.alice]\n",
            &format!("[users.alice]\nupstream = \"smtp://{own}?tls=none\"\n"),
        );
        std::fs::write(users, text).unwrap();
        idemrelay::auth::Users::add_user(users, "alice", "correct horse", "tenant-alice", &[])
            .unwrap();
        assert!(std::fs::read_to_string(users)
            .unwrap()
            .contains("upstream = "));
    })
    .await;
    alice_and_bob_submit(&relay, "welcome-2").await;
    let keys = |sink: &SinkHandle| -> Vec<String> {
        sink.messages()
            .iter()
            .filter_map(|m| m.key.clone())
            .collect()
    };
    // alice is alone on her upstream: her key as she sent it.
    assert_eq!(keys(&own_sink), vec!["welcome-2".to_string()]);
    // bob shares the relay's upstream with the listener's scope: his carries the scope.
    let bobs = keys(&shared_sink);
    assert_eq!(bobs.len(), 1, "{bobs:?}");
    assert!(
        bobs[0].ends_with("-1-welcome-2") && bobs[0].starts_with("u1-"),
        "{bobs:?}"
    );
}

/// A relay delivering to `sink`, with users alice (scope tenant-alice) and bob (tenant-bob)
/// who may AUTH on the plain listener; `edit` may change the users file first.
async fn relay_with_alice_and_bob(
    sink: &SinkHandle,
    edit: impl FnOnce(&std::path::Path),
) -> common::TestRelay {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    idemrelay::auth::Users::add_user(&users, "alice", "correct horse", "tenant-alice", &[])
        .unwrap();
    idemrelay::auth::Users::add_user(&users, "bob", "battery staple", "tenant-bob", &[]).unwrap();
    edit(&users);
    let mut settings = common::test_settings(dir.path());
    settings.users_file = Some(users);
    common::fast_delivery(&mut settings, sink.smtp_addr());
    common::TestRelay::start_in(dir, settings).await
}

/// alice and bob each submit their own message under `key`, and both are delivered; returns
/// the queue ids.
async fn alice_and_bob_submit(relay: &common::TestRelay, key: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for (user, password) in [("alice", "correct horse"), ("bob", "battery staple")] {
        let mut c = Client::ready(relay.addr).await;
        assert_eq!(c.cmd(&common::auth_plain(user, password)).await.code, 235);
        let msg = message(Some(key), "welcome", &format!("welcome from {user}"));
        let answer = c
            .submit(
                &format!("{user}@example.com"),
                &["customer@example.net"],
                &msg,
            )
            .await;
        ids.push(
            answer
                .queue_id()
                .unwrap_or_else(|| panic!("{user}: {answer:?}")),
        );
        c.quit().await;
    }
    for id in &ids {
        wait_state(relay, id, State::Delivered).await;
    }
    ids
}
