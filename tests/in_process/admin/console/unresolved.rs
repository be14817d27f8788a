//! In a real browser: an operator resolves an unresolved record.

use super::*;

/// An operator who has checked the upstream closes an unresolved record from its page, logged
/// in under a name as people write it (spaces, an apostrophe, parentheses): the record is
/// delivered without a new attempt, and its history says who and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolves_an_unresolved_record_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser_programs() else {
        println!("SKIPPED: chromium or chromedriver not found (apt-get install chromium chromium-driver)");
        return;
    };
    let sink = sink_with_api().await;
    let (relay, _hostile, _ok, unresolved) = relay_with_records(&sink).await;
    sink.set_faults(vec![]).unwrap();
    let attempts = relay.store().attempts(&unresolved).await.unwrap().len();
    let console = format!("http://{}", relay.admin());
    let driver = start_driver(&chromedriver).await;
    let browser = open_browser(&driver, &chromium).await;
    let mut shots = Screenshots::new("resolve");

    browser.goto(&format!("{console}/console")).await.unwrap();
    let form = browser
        .form(Locator::Css("form[action='/console/login']"))
        .await
        .unwrap();
    form.set_by_name("token", TOKEN).await.unwrap();
    form.set_by_name("name", "Ann O'Neil (on call)")
        .await
        .unwrap();
    submit_form(&browser, &form).await;
    element(&browser, "a#pause").await;

    browser
        .goto(&format!("{console}/console/messages/{unresolved}"))
        .await
        .unwrap();
    let form = browser.form(Locator::Css("form#resolve")).await.unwrap();
    form.set_by_name("reason", "Bird message log: 250 at 10:02")
        .await
        .unwrap();
    // A radio button: the page stays.
    element(&browser, "form#resolve input[value=delivered]")
        .await
        .click()
        .await
        .unwrap();
    shots.take(&browser, "resolve-form").await;
    submit_form(&browser, &form).await;
    reload_until(&browser, "#state", "delivered").await;
    assert_eq!(relay.stored(&unresolved).await.state, State::Delivered);
    let history = text(&browser, "#history").await;
    assert!(
        history.contains("resolve")
            && history.contains("admin_token (Ann O'Neil (on call)) via console")
            && history.contains("Bird message log: 250 at 10:02")
            && history.contains("delivered"),
        "{history}"
    );
    shots.take(&browser, "resolved").await;
    // No resolve form once it is no longer unresolved, and nothing was sent again.
    assert!(browser.find(Locator::Css("form#resolve")).await.is_err());
    assert_eq!(
        relay.store().attempts(&unresolved).await.unwrap().len(),
        attempts
    );
    browser.close().await.unwrap();
    shots.print();
}
