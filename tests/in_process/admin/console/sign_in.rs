//! The token, the session cookie and the CSRF token, over plain HTTP.

use super::*;

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

/// `name=value` of the session cookie a login answered with.
fn session_cookie(login: &HttpResponse) -> String {
    let set = login
        .headers
        .iter()
        .find(|(n, v)| n.eq_ignore_ascii_case("set-cookie") && v.starts_with("idemrelay_console="))
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no session cookie: {login:?}"));
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(set.contains(attribute), "{set}");
    }
    set.split(';').next().unwrap().to_string()
}

/// The CSRF token of the first form on a page.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[at..at + page[at..].find('"').unwrap()].to_string()
}

/// Logging out ends the session for good: the cookie, replayed, no longer opens a page. The
/// login form stops comparing tokens after a few wrong ones a minute, the right one included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_revokes_the_session_and_wrong_tokens_are_throttled() {
    let relay = TestRelay::start_with(|s| s.admin_token = Some(Secret(TOKEN.into()))).await;
    let admin = relay.admin();
    let login = http(
        admin,
        "POST",
        "/console/login",
        &[FORM],
        &format!("token={TOKEN}&name=Ada"),
    )
    .await;
    assert_eq!(login.status, 303, "{login:?}");
    let cookie = session_cookie(&login);
    let page = http(admin, "GET", "/console", &[("Cookie", &cookie)], "").await;
    assert_eq!(page.status, 200, "{page:?}");
    let csrf = csrf_of(&page.body);
    let out = http(
        admin,
        "POST",
        "/console/logout",
        &[("Cookie", &cookie), FORM],
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(out.status, 303, "{out:?}");
    let replayed = http(admin, "GET", "/console", &[("Cookie", &cookie)], "").await;
    assert_eq!(
        (replayed.status, replayed.header("location")),
        (303, Some("/console/login")),
        "the logged-out cookie still opens the console"
    );

    for n in 0..10 {
        let wrong = http(
            admin,
            "POST",
            "/console/login",
            &[FORM],
            &format!("token=guess-{n}"),
        )
        .await;
        assert_eq!(wrong.status, 401, "guess {n}");
    }
    let throttled = http(
        admin,
        "POST",
        "/console/login",
        &[FORM],
        &format!("token={TOKEN}"),
    )
    .await;
    assert_eq!(throttled.status, 429, "{throttled:?}");
    assert!(throttled.header("set-cookie").is_none());
    assert!(throttled.header("retry-after").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_needs_the_token_a_session_and_its_csrf_token() {
    let sink = sink_with_api().await;
    let relay = relay_for(&sink, |s| s.admin_token = Some(Secret(TOKEN.into()))).await;
    let admin = relay.admin();
    let hostile = submit(
        &relay,
        "ops@example.com",
        &["a@example.com"],
        &message(Some(HOSTILE_KEY), "<i>markup</i> subject", "body"),
    )
    .await;
    wait_state(&relay, &hostile, State::Delivered).await;

    // Without credentials, a page sends the browser to the login form; a form post is refused.
    let page = http(admin, "GET", "/console", &[], "").await;
    assert_eq!(page.status, 303, "{page:?}");
    assert_eq!(page.header("location"), Some("/console/login"));
    let post = http(admin, "POST", "/console/pause", &[FORM], "reason=x").await;
    assert_eq!(post.status, 403, "{post:?}");
    assert!(relay.store().paused().await.unwrap().is_none());

    let wrong = http(admin, "POST", "/console/login", &[FORM], "token=nope").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert!(wrong.body.contains("not the admin token"), "{}", wrong.body);

    let login = http(
        admin,
        "POST",
        "/console/login",
        &[FORM],
        &format!("token={TOKEN}"),
    )
    .await;
    assert_eq!(login.status, 303, "{login:?}");
    let cookie = session_cookie(&login);
    let with_cookie = ("Cookie", cookie.as_str());

    let overview = http(admin, "GET", "/console", &[with_cookie], "").await;
    assert_eq!(overview.status, 200, "{overview:?}");
    assert!(overview
        .header("content-type")
        .is_some_and(|v| v.starts_with("text/html")));
    let csp = overview.header("content-security-policy").unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(!overview.body.contains("<script"));
    let csrf = csrf_of(&overview.body);

    // A forged cookie is no session.
    let forged = cookie.replace(|c: char| c.is_ascii_digit(), "7");
    let page = http(admin, "GET", "/console", &[("Cookie", forged.as_str())], "").await;
    assert_eq!(page.status, 303);

    // A form post needs its session's CSRF token.
    for body in [
        "reason=drill".to_string(),
        "reason=drill&csrf=0000".to_string(),
    ] {
        let refused = http(admin, "POST", "/console/pause", &[with_cookie, FORM], &body).await;
        assert_eq!(refused.status, 403, "{body}: {refused:?}");
    }
    assert!(relay.store().paused().await.unwrap().is_none());
    let paused = http(
        admin,
        "POST",
        "/console/pause",
        &[with_cookie, FORM],
        &format!("reason=drill&csrf={csrf}"),
    )
    .await;
    assert_eq!(paused.status, 303, "{paused:?}");
    assert_eq!(
        relay.store().paused().await.unwrap().unwrap().reason,
        "drill"
    );

    // While paused, a new message waits; the console flushes it (due now) and then cancels
    // it, each with its reason in the record's history.
    let waiting = submit(
        &relay,
        "ops@example.com",
        &["w@example.com"],
        &message(Some("console-waits"), "s", "b"),
    )
    .await;
    let page = http(
        admin,
        "GET",
        &format!("/console/messages/{waiting}"),
        &[with_cookie],
        "",
    )
    .await;
    assert!(page.body.contains("paused"), "{}", page.body);
    for (action, reason) in [("flush", "customer asked"), ("cancel", "sent by mistake")] {
        let done = http(
            admin,
            "POST",
            &format!("/console/messages/{waiting}/{action}"),
            &[with_cookie, FORM],
            &format!("reason={}&csrf={csrf}", reason.replace(' ', "+")),
        )
        .await;
        assert_eq!(done.status, 303, "{action}: {done:?}");
    }
    let cancelled = relay.stored(&waiting).await;
    assert_eq!(cancelled.state, State::Cancelled);
    let history: Vec<(&str, &str)> = cancelled
        .history
        .iter()
        .map(|a| (a.action.as_str(), a.reason.as_str()))
        .collect();
    assert_eq!(
        history,
        [("flush", "customer asked"), ("cancel", "sent by mistake")]
    );
    assert!(
        cancelled.history[0].actor.ends_with("via console"),
        "{:?}",
        cancelled.history
    );
    // A second cancel is refused with the API's reason, as a page.
    let again = http(
        admin,
        "POST",
        &format!("/console/messages/{waiting}/cancel"),
        &[with_cookie, FORM],
        &format!("reason=x&csrf={csrf}"),
    )
    .await;
    assert_eq!(again.status, 409, "{again:?}");
    assert!(
        again.body.contains("only queued records can be cancelled"),
        "{}",
        again.body
    );

    // The bearer header works as on the API, for scripts (no CSRF token: a browser cannot be
    // made to send it).
    let bearer = format!("Bearer {TOKEN}");
    let resumed = http(
        admin,
        "POST",
        "/console/resume",
        &[("Authorization", bearer.as_str()), FORM],
        "",
    )
    .await;
    assert_eq!(resumed.status, 303, "{resumed:?}");
    assert!(relay.store().paused().await.unwrap().is_none());

    // Keys and header fields are user input: shown as text, never as markup.
    let shown = http(
        admin,
        "GET",
        &format!("/console/messages/{hostile}"),
        &[("Authorization", bearer.as_str())],
        "",
    )
    .await;
    assert_eq!(shown.status, 200, "{shown:?}");
    assert!(
        !shown.body.contains("<b id=\"injected\">"),
        "{}",
        shown.body
    );
    assert!(shown
        .body
        .contains("&lt;b id=&quot;injected&quot;&gt;k&lt;/b&gt;&amp;amp;"));
    assert!(shown.body.contains("&lt;i&gt;markup&lt;/i&gt; subject"));
    assert!(!shown.body.contains("<i>markup"));

    let unknown = http(
        admin,
        "GET",
        "/console/search?state=bogus",
        &[with_cookie],
        "",
    )
    .await;
    assert_eq!(unknown.status, 400);
    // Unknown filters are refused as the API refuses them, never ignored.
    let typo = http(admin, "GET", "/console/search?rcpt=x", &[with_cookie], "").await;
    assert_eq!(typo.status, 400, "{typo:?}");
    let missing = http(admin, "GET", "/console/messages/nope", &[with_cookie], "").await;
    assert_eq!(missing.status, 404);
    // `refresh=off` stops a list's auto-refresh and is no filter; the bare search form does
    // not reload itself.
    let refresh = r#"<meta http-equiv="refresh" content="15">"#;
    for (path, reloads) in [
        ("/console", true),
        ("/console?refresh=off", false),
        ("/console/unresolved", true),
        ("/console/search?state=deferred", true),
        ("/console/search?state=deferred&refresh=off", false),
        ("/console/search", false),
    ] {
        let page = http(admin, "GET", path, &[with_cookie], "").await;
        assert_eq!(page.status, 200, "{path}: {page:?}");
        assert_eq!(page.body.contains(refresh), reloads, "{path}");
        assert!(!page.body.contains("<script"), "{path}");
    }
    let typo = http(
        admin,
        "GET",
        "/console/search?rcpt=x&refresh=off",
        &[with_cookie],
        "",
    )
    .await;
    assert_eq!(typo.status, 400, "{typo:?}");

    // The sink's view escapes too, and says 404 for an unknown message.
    let api = sink.api_addr().unwrap();
    let inbox = http(api, "GET", "/ui", &[], "").await;
    assert_eq!(inbox.status, 200, "{inbox:?}");
    assert!(!inbox.body.contains("<b id=\"injected\">"));
    assert!(inbox.body.contains("&lt;b id=&quot;injected&quot;&gt;"));
    assert_eq!(
        http(api, "GET", "/ui/messages/nope", &[], "").await.status,
        404
    );
    assert_eq!(http(api, "GET", "/ui?bogus=1", &[], "").await.status, 400);
    let filtered = http(api, "GET", "/ui?key=nothing-like-it&rcpt=&text=", &[], "").await;
    assert_eq!(filtered.status, 200);
    assert!(inbox.body.contains("1 message(s)."), "{}", inbox.body);
    assert!(filtered.body.contains("0 message(s)."), "{}", filtered.body);
}
