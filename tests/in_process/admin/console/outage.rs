//! In a real browser: an upstream outage shows its last error, its age and the deferred.

use super::*;

/// An age as the console prints it ("1m 5s", "0s"), in seconds.
fn age_seconds(age: &str) -> u64 {
    age.split_whitespace()
        .map(|part| {
            let (n, unit) = part.split_at(part.find(|c: char| !c.is_ascii_digit()).unwrap());
            let n: u64 = n.parse().unwrap_or_else(|_| panic!("age {age:?}"));
            match unit {
                "s" => n,
                "m" => n * 60,
                "h" => n * 3600,
                "days" | "day" => n * 86_400,
                other => panic!("age {age:?}: unit {other:?}"),
            }
        })
        .sum()
}

/// The height of the first element `css` selects, in CSS pixels.
async fn height(browser: &Browser, css: &str) -> f64 {
    element(browser, css).await.rectangle().await.unwrap().3
}

const OUTAGE_REPLY: &str = "421 4.3.2 Upstream closed for maintenance";

/// An upstream outage as an operator sees it: the overview says the upstream has been failing
/// since the first failed attempt after the last delivery, with the last error's reply and
/// age, how many records are deferred, which relay process serves the page and that a sibling
/// on the same store is alive; it reloads itself until told to stop. The deferred list shows
/// each record's last reply on one line, ids unwrapped. Screenshots of both pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_outage_shows_the_last_error_its_age_and_the_deferred_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser_programs() else {
        println!("SKIPPED: chromium or chromedriver not found (apt-get install chromium chromium-driver)");
        return;
    };
    let sink = sink_with_api().await;
    let relay = relay_for(&sink, |s| {
        s.admin_token = Some(Secret(TOKEN.into()));
        s.delivery.retry_base = Duration::from_secs(2);
        s.delivery.retry_cap = Duration::from_secs(4);
        s.delivery.breaker_threshold = 3;
        s.delivery.breaker_cooldown = Duration::from_secs(120);
    })
    .await;
    let from = "ops@example.com";
    let before = submit(
        &relay,
        from,
        &["a@example.com"],
        &message(Some("before-outage"), "fine", "body"),
    )
    .await;
    wait_state(&relay, &before, State::Delivered).await;
    let delivered_at = relay.stored(&before).await.finished_at_ms.unwrap();

    // The upstream goes down: every transaction is refused with a 421 (at MAIL, so that a
    // connection the relay kept open from the delivery above is refused too).
    let (code, words) = OUTAGE_REPLY.split_at(3);
    sink.set_faults(vec![FaultRule::reply(
        idemrelay_sink::FaultStage::Mail,
        code.parse().unwrap(),
        words.trim(),
    )])
    .unwrap();
    let mut deferred = Vec::new();
    for n in 1..=3 {
        deferred.push(
            submit(
                &relay,
                from,
                &[&format!("r{n}@example.com")],
                &message(Some(&format!("outage-{n}")), "during the outage", "body"),
            )
            .await,
        );
    }
    // A sibling relay on the same store: its heartbeat shows it alive.
    let mut sibling_settings = relay.settings.clone();
    sibling_settings.listen = vec!["127.0.0.1:0".parse().unwrap()];
    let sibling = TestRelay::start_in(tempfile::tempdir().unwrap(), sibling_settings).await;
    crate::common::eventually(Duration::from_secs(20), "3 deferred records", || async {
        let page = relay
            .store()
            .list_page(&idemrelay::store::ListFilter {
                state: Some(idemrelay::store::StateFilter::Deferred),
                ..idemrelay::store::ListFilter::all(10)
            })
            .await
            .unwrap();
        (page.records.len() == 3).then_some(())
    })
    .await;
    crate::common::eventually(Duration::from_secs(20), "two live processes", || async {
        let health = relay.store().relay_health().await.unwrap();
        (health.processes.len() == 2).then_some(())
    })
    .await;
    // The run of failures began with the first failed attempt after the delivery.
    let mut first_failure = i64::MAX;
    for id in &deferred {
        for a in relay.store().attempts(id).await.unwrap() {
            assert_eq!(a.outcome.as_deref(), Some("transient"), "{a:?}");
            assert_eq!(a.reply.as_deref(), Some(OUTAGE_REPLY), "{a:?}");
            first_failure = first_failure.min(a.started_at_ms);
        }
    }
    let time = |ms: i64| {
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms as u64))
            .to_string()
    };

    let console = format!("http://{}", relay.admin());
    let driver = start_driver(&chromedriver).await;
    let browser = open_browser(&driver, &chromium).await;
    let mut shots = Screenshots::new("outage");
    browser.goto(&format!("{console}/console")).await.unwrap();
    let form = browser
        .form(Locator::Css("form[action='/console/login']"))
        .await
        .unwrap();
    form.set_by_name("token", TOKEN).await.unwrap();
    submit_form(&browser, &form).await;

    let delivering = reload_until(&browser, "#delivering", "open").await;
    assert!(delivering.contains("circuit breaker: open"), "{delivering}");
    let failing = text(&browser, "#upstream-failing").await;
    for wanted in [
        "Upstream failing since",
        &time(first_failure),
        "ago",
        "Last delivery:",
        &time(delivered_at),
        "Last error",
        "transient at mail",
        OUTAGE_REPLY,
    ] {
        assert!(failing.contains(wanted), "{wanted:?} not in {failing:?}");
    }
    let last_error_id = text(&browser, "#last-error a").await;
    assert!(deferred.contains(&last_error_id), "{last_error_id}");
    // The ages are the store's, read at each load: they grow.
    let age = text(&browser, "#upstream-failing .age").await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    navigate(&browser, || browser.refresh()).await;
    let later = text(&browser, "#upstream-failing .age").await;
    assert!(
        age_seconds(&later) >= age_seconds(&age) + 2,
        "{age:?} then {later:?}"
    );
    assert_eq!(text(&browser, "#deferred a").await, "3 deferred");
    let this = text(&browser, "#this-instance").await;
    assert!(this.contains("relay relay.test"), "{this}");
    assert_eq!(text(&browser, "#siblings").await, "1");
    let instances = text(&browser, "#instances").await;
    assert!(instances.contains("(this one)"), "{instances}");
    assert_eq!(instances.matches("alive").count(), 2, "{instances}");
    let prefix = format!("/{}/", std::process::id());
    assert_eq!(instances.matches(&prefix).count(), 2, "{instances}");
    // It reloads itself, until told to stop.
    let meta = element(&browser, "meta[http-equiv=refresh]").await;
    assert_eq!(meta.attr("content").await.unwrap().as_deref(), Some("15"));
    assert!(!browser.source().await.unwrap().contains("<script"));
    shots.take(&browser, "outage-overview").await;
    click(&browser, element(&browser, "#refresh-off").await).await;
    element(&browser, "#refresh-on").await;
    assert!(browser
        .find(Locator::Css("meta[http-equiv=refresh]"))
        .await
        .is_err());
    click(&browser, element(&browser, "#refresh-on").await).await;
    element(&browser, "meta[http-equiv=refresh]").await;

    // The deferred list, from the overview's count.
    click(&browser, element(&browser, "#deferred a").await).await;
    assert!(browser
        .current_url()
        .await
        .unwrap()
        .as_str()
        .ends_with("/console/search?state=deferred"));
    let results = text(&browser, "#results").await;
    for id in &deferred {
        assert!(results.contains(id.as_str()), "{id} not in {results}");
    }
    assert!(!results.contains(&before), "{results}");
    let replies = browser
        .find_all(Locator::Css("#results .last-reply"))
        .await
        .unwrap();
    assert_eq!(replies.len(), 3);
    for cell in replies {
        assert_eq!(
            cell.attr("title").await.unwrap().as_deref(),
            Some(OUTAGE_REPLY)
        );
        assert!(cell.text().await.unwrap().contains("421 4.3.2"));
    }
    // One line each: an id and a reply no taller than the state badge beside them.
    let line = height(&browser, "#results span.state").await;
    for css in ["#results td.id code", "#results .last-reply code"] {
        let h = height(&browser, css).await;
        assert!(h < line * 1.5, "{css} is {h}px tall, a line is {line}px");
    }
    element(&browser, "meta[http-equiv=refresh]").await;
    shots.take(&browser, "deferred-list").await;

    browser.close().await.unwrap();
    shots.print();
    drop(sibling);
}
