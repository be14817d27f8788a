//! The token that guards the API and the metrics, and health while shutting down.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_the_api_and_metrics_but_not_health() {
    const TOKEN: &str = "test-admin-token-0123456789";
    let relay = TestRelay::start_with(|s| s.admin_token = Some(Secret(TOKEN.into()))).await;
    let admin = relay.admin();
    let id = submit(
        &relay,
        "rcpt@example.com",
        &message(Some("adm-token"), "s", "b"),
    )
    .await;
    for path in [
        "/metrics".to_string(),
        "/api/v1/messages".to_string(),
        format!("/api/v1/messages/{id}"),
        "/api/v1/keys/default/adm-token".to_string(),
    ] {
        for token in [None, Some("wrong-token-0123456789")] {
            let refused = get(admin, &path, token).await;
            assert_eq!(refused.status, 401, "{path} {token:?}");
            assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
            assert_eq!(refused.json()["code"], "unauthorized");
            assert!(!refused.body.contains(&id), "{path}: {}", refused.body);
        }
        let allowed = get(admin, &path, Some(TOKEN)).await;
        assert_eq!(allowed.status, 200, "{path}: {}", allowed.body);
    }
    for method in ["POST", "DELETE"] {
        let path = if method == "POST" {
            format!("/api/v1/messages/{id}/retry")
        } else {
            format!("/api/v1/messages/{id}")
        };
        let refused = if method == "POST" {
            post_json(admin, &path, None, "{}").await
        } else {
            request(admin, method, &path, None).await
        };
        assert_eq!(refused.status, 401);
    }
    // Nothing was cancelled by the refused DELETE.
    assert_eq!(relay.stored(&id).await.state, State::Queued);

    let health = get(admin, "/healthz", None).await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");
    // Without the token, ready or not in a word; the details with it.
    let ready = get(admin, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        ready.json(),
        serde_json::json!({ "ready": true, "status": "ready" })
    );
    let ready = get(admin, "/readyz", Some(TOKEN)).await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    let ready = ready.json();
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["store"], "writable");
    assert_eq!(ready["delivery"]["status"], "not configured");
    let unknown = get(admin, "/nothing-here", None).await;
    assert_eq!(unknown.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_503_while_shutting_down() {
    let sink = start_sink().await;
    let relay = relay_for(&sink, |s| s.shutdown_grace = Duration::from_secs(10)).await;
    let admin = relay.admin();
    let ready = get(admin, "/readyz", None).await.json();
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["delivery"]["status"], "running", "{ready}");
    relay.store().pause("operator hold", false).await.unwrap();
    let ready = get(admin, "/readyz", None).await;
    assert_eq!(ready.status, 200, "a paused queue still takes mail");
    assert_eq!(ready.json()["delivery"]["status"], "paused");
    assert_eq!(ready.json()["delivery"]["paused_reason"], "operator hold");

    // A session in the middle of a message keeps the relay draining.
    let mut client = Client::ready(relay.addr).await;
    assert_eq!(client.cmd("MAIL FROM:<sender@example.com>").await.code, 250);
    assert_eq!(client.cmd("RCPT TO:<rcpt@example.com>").await.code, 250);
    assert_eq!(client.cmd("DATA").await.code, 354);
    client
        .send(b"From: a@example.com\r\nX-Bird-Idempotency-Key: drain-1\r\n")
        .await;
    let TestRelay {
        relay, dir: _dir, ..
    } = relay;
    let stopping = tokio::spawn(relay.shutdown());
    let health = common::eventually(LIMIT, "healthz 503", || async {
        let h = get(admin, "/healthz", None).await;
        (h.status == 503).then_some(h)
    })
    .await;
    assert_eq!(health.json()["status"], "shutting down");
    let ready = get(admin, "/readyz", None).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["shutting_down"], true);

    client.send(b"Subject: s\r\n\r\nbody\r\n.\r\n").await;
    let answer = client.read_answer().await.expect("reply to the dot");
    assert_eq!(answer.code, 250, "{answer:?}");
    tokio::time::timeout(LIMIT, stopping)
        .await
        .unwrap()
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "the admin listener is closed once the relay has stopped"
    );
}
