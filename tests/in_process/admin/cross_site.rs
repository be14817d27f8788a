//! What another web page in the operator's browser can make of the admin listener, tried over
//! a real socket with the headers a browser sends: a form posted from another origin, a
//! `no-cors` fetch, a DNS rebinding (a name the attacker controls, resolved to the relay, so
//! the browser sends that name as Host), and actions without a token. None of them may change
//! or read anything; the relay's own clients (JSON with the right Host) still work.

use crate::common;

use common::http::{send, Body, HttpResponse};
use common::TestRelay;
use idemrelay::config::Secret;

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");
const JSON: (&str, &str) = ("Content-Type", "application/json");
const TOKEN: &str = "cross-site-test-token-0123";

async fn post(relay: &TestRelay, path: &str, headers: &[(&str, &str)], body: &str) -> HttpResponse {
    send(
        relay.admin(),
        "POST",
        path,
        headers,
        Body::Bytes(body.as_bytes()),
    )
    .await
}

async fn paused(relay: &TestRelay) -> bool {
    relay.store().paused().await.unwrap().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_or_no_cors_fetch_from_another_origin_changes_nothing() {
    // Even with changes allowed without a token (the harness's setting), a browser's
    // cross-site requests are refused: the checks do not depend on the token.
    let relay = TestRelay::start().await;
    let evil = ("Origin", "http://evil.example");
    let cross = ("Sec-Fetch-Site", "cross-site");
    // What an auto-submitted <form method=post> sends.
    let form = post(
        &relay,
        "/api/v1/queue/pause?reason=evil",
        &[FORM, evil, cross],
        "reason=evil",
    )
    .await;
    assert_eq!(form.status, 403, "{form:?}");
    assert_eq!(form.json()["code"], "cross_origin", "{}", form.body);
    // A no-cors fetch: text/plain body, its Origin.
    let fetch = post(
        &relay,
        "/api/v1/queue/pause",
        &[("Content-Type", "text/plain;charset=UTF-8"), evil, cross],
        r#"{"reason": "evil"}"#,
    )
    .await;
    assert_eq!(fetch.status, 403, "{fetch:?}");
    // The same form without Origin (an old browser, or stripped): still no JSON body, refused.
    let bare = post(&relay, "/api/v1/queue/pause?reason=evil", &[FORM], "").await;
    assert_eq!(bare.status, 415, "{bare:?}");
    assert_eq!(bare.json()["code"], "json_required", "{}", bare.body);
    // Query parameters are refused even with a JSON body: they are how a form carries them.
    let query = post(&relay, "/api/v1/queue/pause?reason=evil", &[JSON], "{}").await;
    assert_eq!(query.status, 400, "{query:?}");
    // JSON from a same-site but other origin (another port of the same host) is refused too.
    let sibling = post(
        &relay,
        "/api/v1/queue/pause",
        &[
            JSON,
            ("Origin", "http://127.0.0.1:1"),
            ("Sec-Fetch-Site", "same-site"),
        ],
        r#"{"reason": "evil"}"#,
    )
    .await;
    assert_eq!(sibling.status, 403, "{sibling:?}");
    assert!(
        !paused(&relay).await,
        "a cross-site request paused delivery"
    );

    // The relay's own page (same origin) and a script (no Origin) with a JSON body work.
    let origin = format!("http://{}", relay.admin());
    let own = post(
        &relay,
        "/api/v1/queue/pause",
        &[
            JSON,
            ("Origin", origin.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        r#"{"reason": "maintenance"}"#,
    )
    .await;
    assert_eq!(own.status, 200, "{own:?}");
    assert_eq!(own.json()["reason"], "maintenance");
    let resumed = post(&relay, "/api/v1/queue/resume", &[JSON], "").await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    assert!(!paused(&relay).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_name_reads_and_changes_nothing() {
    // DNS rebinding: the attacker's name now points at the relay; the browser sends it as Host
    // and treats the answer as its own origin's, so Origin checks alone would not stop it.
    let relay = TestRelay::start().await;
    let admin = relay.admin();
    let rebound = format!("rebind.evil.example:{}", admin.port());
    let host = ("Host", rebound.as_str());
    let origin = format!("http://{rebound}");
    for path in [
        "/api/v1/messages",
        "/api/v1/queue/status",
        "/metrics",
        "/console",
    ] {
        let read = send(admin, "GET", path, &[host], Body::Bytes(b"")).await;
        assert_eq!(read.status, 421, "{path}: {read:?}");
        assert!(!read.body.contains("messages\""), "{path}: {}", read.body);
    }
    let act = post(
        &relay,
        "/api/v1/queue/pause",
        &[host, JSON, ("Origin", origin.as_str())],
        r#"{"reason": "rebound"}"#,
    )
    .await;
    assert_eq!(act.status, 421, "{act:?}");
    assert_eq!(act.json()["code"], "unknown_host", "{}", act.body);
    assert!(!paused(&relay).await, "a rebound name paused delivery");
    // The names the relay serves: its address, localhost, and its configured names.
    for name in [
        admin.to_string(),
        format!("localhost:{}", admin.port()),
        "LOCALHOST".to_string(),
    ] {
        let read = send(
            admin,
            "GET",
            "/api/v1/queue/status",
            &[("Host", &name)],
            Body::Bytes(b""),
        )
        .await;
        assert_eq!(read.status, 200, "{name}: {read:?}");
    }
    let named = TestRelay::start_with(|s| s.admin_hosts = vec!["relay.internal".into()]).await;
    let read = send(
        named.admin(),
        "GET",
        "/api/v1/queue/status",
        &[("Host", "relay.internal:8025")],
        Body::Bytes(b""),
    )
    .await;
    assert_eq!(read.status, 200, "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_changes_are_refused_unless_allowed() {
    let relay = TestRelay::start_with(|s| s.admin_allow_changes_without_token = false).await;
    let refused = post(&relay, "/api/v1/queue/pause", &[JSON], r#"{"reason": "x"}"#).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    let body = refused.json();
    assert_eq!(body["code"], "changes_need_token", "{body}");
    let text = body["error"].as_str().unwrap();
    assert!(
        text.contains("admin_token") && text.contains("admin_allow_changes_without_token"),
        "{text}"
    );
    let delete = send(
        relay.admin(),
        "DELETE",
        "/api/v1/messages/X",
        &[],
        Body::Bytes(b""),
    )
    .await;
    assert_eq!(delete.status, 403, "{delete:?}");
    assert!(!paused(&relay).await);
    // Reads stay open (the listener is loopback; a token closes them too).
    let status = send(
        relay.admin(),
        "GET",
        "/api/v1/queue/status",
        &[],
        Body::Bytes(b""),
    )
    .await;
    assert_eq!(status.status, 200, "{status:?}");
    // The console's forms are refused the same way, with a page that says why.
    let page = send(relay.admin(), "GET", "/console", &[], Body::Bytes(b"")).await;
    assert_eq!(page.status, 200, "{page:?}");
    let cookie = page
        .headers
        .iter()
        .find(|(n, v)| n.eq_ignore_ascii_case("set-cookie") && v.starts_with("idemrelay_console="))
        .map(|(_, v)| v.split(';').next().unwrap().to_string())
        .expect("a session cookie");
    let at = page.body.find("name=\"csrf\" value=\"").expect("a form") + 19;
    let csrf = &page.body[at..at + page.body[at..].find('"').unwrap()];
    let form = post(
        &relay,
        "/console/pause",
        &[FORM, ("Cookie", cookie.as_str())],
        &format!("reason=x&csrf={csrf}"),
    )
    .await;
    assert_eq!(form.status, 403, "{form:?}");
    assert!(
        form.body.contains("admin_allow_changes_without_token"),
        "{}",
        form.body
    );
    assert!(!paused(&relay).await);

    // With a token, the token decides.
    let guarded = TestRelay::start_with(|s| {
        s.admin_token = Some(Secret(TOKEN.into()));
        s.admin_allow_changes_without_token = false;
    })
    .await;
    let bearer = format!("Bearer {TOKEN}");
    let done = post(
        &guarded,
        "/api/v1/queue/pause",
        &[JSON, ("Authorization", bearer.as_str())],
        r#"{"reason": "x"}"#,
    )
    .await;
    assert_eq!(done.status, 200, "{done:?}");
    assert!(paused(&guarded).await);
}
