//! In a real browser: an operator finds and retries a message.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_and_retries_a_message_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser_programs() else {
        println!("SKIPPED: chromium or chromedriver not found (apt-get install chromium chromium-driver)");
        return;
    };
    let sink = sink_with_api().await;
    let (relay, hostile, ok, unresolved) = relay_with_records(&sink).await;
    let console = format!("http://{}", relay.admin());
    let sink_ui = format!("http://{}/ui", sink.api_addr().unwrap());

    let driver = start_driver(&chromedriver).await;
    let browser = open_browser(&driver, &chromium).await;
    let mut shots = Screenshots::new("operator-round");

    // Login.
    browser.goto(&format!("{console}/console")).await.unwrap();
    element(&browser, "input[name=token]").await;
    assert!(browser.current_url().await.unwrap().path() == "/console/login");
    shots.take(&browser, "login").await;
    let form = browser
        .form(Locator::Css("form[action='/console/login']"))
        .await
        .unwrap();
    form.set_by_name("token", TOKEN).await.unwrap();
    form.set_by_name("name", "Ada").await.unwrap();
    submit_form(&browser, &form).await;

    // Overview: counts by state and by scope, with links.
    let by_state = text(&browser, "#by-state").await;
    assert!(by_state.contains("delivered 2"), "{by_state}");
    assert!(by_state.contains("unresolved 1"), "{by_state}");
    let by_scope = text(&browser, "#by-scope").await;
    assert!(by_scope.contains("default"), "{by_scope}");
    // The parked record's failures are the ledger's newest, but nothing waits on them and
    // the breaker is closed: the last error is told, not an outage.
    let last = text(&browser, "#last-error").await;
    assert!(last.contains("No delivery since"), "{last}");
    assert_eq!(text(&browser, "#last-error a").await, unresolved);
    assert!(browser
        .find(Locator::Css("#upstream-failing"))
        .await
        .is_err());
    assert!(text(&browser, "#deferred").await.starts_with("0 deferred"));
    shots.take(&browser, "overview").await;

    // Search by key: the hostile key, typed into the form, comes back as text.
    browser
        .goto(&format!("{console}/console/search"))
        .await
        .unwrap();
    let form = browser.form(Locator::Css("#search")).await.unwrap();
    form.set_by_name("key", HOSTILE_KEY).await.unwrap();
    submit_form(&browser, &form).await;
    let results = text(&browser, "#results").await;
    assert!(results.contains(HOSTILE_KEY), "{results}");
    assert!(results.contains(&hostile), "{results}");
    assert!(!results.contains(&ok), "{results}");
    assert!(browser.find(Locator::Css("#injected")).await.is_err());
    shots.take(&browser, "search").await;

    // By state, from the overview's link; by recipient, newest first.
    browser
        .goto(&format!("{console}/console/search?state=delivered"))
        .await
        .unwrap();
    let results = text(&browser, "#results").await;
    assert!(
        results.contains(&ok) && results.contains(&hostile),
        "{results}"
    );
    assert!(!results.contains(&unresolved), "{results}");
    let form = browser.form(Locator::Css("#search")).await.unwrap();
    form.set_by_name("state", "").await.unwrap();
    form.set_by_name("recipient", "B@example.com")
        .await
        .unwrap();
    form.set_by_name("order", "newest").await.unwrap();
    submit_form(&browser, &form).await;
    let results = text(&browser, "#results").await;
    assert!(results.contains(&ok), "{results}");
    assert!(
        !results.contains(&hostile) && !results.contains(&unresolved),
        "{results}"
    );

    // The message page: envelope, headers (never the body), the ledger.
    let link = browser.find(Locator::LinkText(&ok)).await.unwrap();
    click(&browser, link).await;
    let envelope = text(&browser, "#envelope").await;
    assert!(
        envelope.contains(OK_KEY) && envelope.contains("b@example.com"),
        "{envelope}"
    );
    let headers = text(&browser, "#headers").await;
    assert!(
        headers.contains("Subject") && headers.contains("hello"),
        "{headers}"
    );
    let page = browser.source().await.unwrap();
    assert!(!page.contains("the body is never shown"));
    let attempts = text(&browser, "#attempts").await;
    assert!(
        attempts.contains("accepted") && attempts.contains("250"),
        "{attempts}"
    );
    assert!(text(&browser, "#state").await.contains("delivered"));
    shots.take(&browser, "message").await;

    // The sink's view, while its fault rule still holds: the unresolved key's transactions
    // show the rule that fired.
    browser.goto(&sink_ui).await.unwrap();
    let transactions = text(&browser, "#transactions").await;
    assert!(
        transactions.contains("phase=dot") && transactions.contains("drop"),
        "{transactions}"
    );
    assert!(text(&browser, "#faults").await.contains(UNRESOLVED_KEY));
    let keys = text(&browser, "#keys").await;
    assert!(
        keys.contains(OK_KEY) && keys.contains(UNRESOLVED_KEY),
        "{keys}"
    );
    shots.take(&browser, "sink-inbox").await;
    // Its filters are the JSON API's: the decoded subject or body text.
    let form = browser.form(Locator::Css("#search")).await.unwrap();
    form.set_by_name("text", "LOST reply").await.unwrap();
    submit_form(&browser, &form).await;
    let filtered = text(&browser, "#messages").await;
    assert!(filtered.contains(UNRESOLVED_KEY), "{filtered}");
    assert!(!filtered.contains(OK_KEY), "{filtered}");
    // The filtered list's message (the three arrive in any order).
    let first = sink
        .messages()
        .into_iter()
        .find(|m| m.key.as_deref() == Some(UNRESOLVED_KEY))
        .unwrap()
        .id;
    let link = browser.find(Locator::LinkText(&first)).await.unwrap();
    click(&browser, link).await;
    let raw = text(&browser, "#raw").await;
    assert!(raw.contains("X-Bird-Idempotency-Key"), "{raw}");
    shots.take(&browser, "sink-message").await;

    // The upstream is fixed; the operator retries the unresolved record through its
    // confirmation.
    sink.set_faults(vec![]).unwrap();
    browser
        .goto(&format!("{console}/console/unresolved"))
        .await
        .unwrap();
    let listed = text(&browser, "#unresolved").await;
    assert!(
        listed.contains(&unresolved) && listed.contains(UNRESOLVED_KEY),
        "{listed}"
    );
    shots.take(&browser, "unresolved").await;
    click(&browser, element(&browser, "#unresolved a.retry").await).await;
    let warning = text(&browser, "#duplicate-risk").await;
    assert!(
        warning.contains("may already have") && warning.contains("second copy"),
        "{warning}"
    );
    // Nothing happens until the operator confirms.
    assert_eq!(relay.stored(&unresolved).await.state, State::Unresolved);
    let form = browser.form(Locator::Css("#confirm-retry")).await.unwrap();
    form.set_by_name("reason", "upstream support: not received")
        .await
        .unwrap();
    shots.take(&browser, "retry-confirm").await;
    submit_form(&browser, &form).await;
    // Back on the record's page, which shows it queued and then delivered.
    let at = browser.current_url().await.unwrap();
    assert!(
        at.path().ends_with(&unresolved),
        "{at}: {}",
        browser.source().await.unwrap()
    );
    reload_until(&browser, "#state", "delivered").await;
    assert_eq!(relay.stored(&unresolved).await.state, State::Delivered);
    let history = text(&browser, "#history").await;
    assert!(
        history.contains("retry")
            && history.contains("admin_token (Ada) via console")
            && history.contains("upstream support: not received")
            && history.contains("duplicate risk confirmed"),
        "{history}"
    );
    shots.take(&browser, "retried").await;
    browser
        .goto(&format!("{console}/console/unresolved"))
        .await
        .unwrap();
    element(&browser, "#none").await;

    // Pause and resume delivery, each from the overview's link to its form (the overview
    // reloads itself, which would wipe a reason being typed there).
    browser.goto(&format!("{console}/console")).await.unwrap();
    click(&browser, element(&browser, "a#pause").await).await;
    let form = browser
        .form(Locator::Css("form[action='/console/pause']"))
        .await
        .unwrap();
    form.set_by_name("reason", "upstream maintenance")
        .await
        .unwrap();
    submit_form(&browser, &form).await;
    let paused = text(&browser, "p.warn").await;
    assert!(paused.contains("upstream maintenance"), "{paused}");
    let stored = relay.store().paused().await.unwrap().expect("paused");
    assert_eq!(stored.reason, "upstream maintenance");
    shots.take(&browser, "paused").await;
    click(&browser, element(&browser, "a#resume").await).await;
    let form = browser
        .form(Locator::Css("form[action='/console/resume']"))
        .await
        .unwrap();
    form.set_by_name("reason", "maintenance over")
        .await
        .unwrap();
    submit_form(&browser, &form).await;
    element(&browser, "a#pause").await;
    assert!(relay.store().paused().await.unwrap().is_none());
    let actions = text(&browser, "#relay-actions").await;
    assert!(
        actions.contains("pause") && actions.contains("upstream maintenance"),
        "{actions}"
    );
    assert!(
        actions.contains("resume") && actions.contains("maintenance over"),
        "{actions}"
    );
    shots.take(&browser, "resumed").await;

    browser.close().await.unwrap();
    shots.print();
    assert_eq!(shots.taken.len(), 11);
}
