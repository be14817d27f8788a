//! In a real browser: the sink's inbox shows subjects, text and sandboxed HTML.

use super::*;

/// A message with a text part and an HTML part whose script would mark the page it runs in
/// and whose image would load from `pixel`.
fn html_message(key: &str, subject: &str, pixel: SocketAddr) -> Vec<u8> {
    format!(
        "From: Sender <sender@example.com>\r\nTo: rcpt@example.com\r\n\
         X-Bird-Idempotency-Key: {key}\r\nSubject: {subject}\r\nMIME-Version: 1.0\r\n\
         Content-Type: multipart/alternative; boundary=\"b1\"\r\n\r\n\
         --b1\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Transfer-Encoding: quoted-printable\r\n\r\n\
         Plain words, Gr=C3=BC=C3=9Fe.\r\n\
         --b1\r\nContent-Type: text/html; charset=utf-8\r\n\r\n\
         <h1 id=\"hello\" style=\"color:#a00\">Hello HTML</h1>\r\n\
         <script>document.body.setAttribute('data-ran','yes');parent.document.title='pwned';</script>\r\n\
         <img src=\"http://{pixel}/pixel.png\">\r\n\
         --b1--\r\n"
    )
    .into_bytes()
}

/// Counts the connections a page's remote resources would open.
async fn pixel_server() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((_stream, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (addr, hits)
}

/// The test upstream's inbox as a developer uses it after a test run: subjects in the list,
/// a filter that narrows the per-key counts and transactions too, and a message's text part
/// and HTML part, the HTML rendered in a sandbox where its script does not run and its remote
/// image is not fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_inbox_shows_subjects_text_and_sandboxed_html_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser_programs() else {
        println!("SKIPPED: chromium or chromedriver not found (apt-get install chromium chromium-driver)");
        return;
    };
    let sink = sink_with_api().await;
    let relay = relay_for(&sink, |_| {}).await;
    let (pixel, hits) = pixel_server().await;
    let from = "ops@example.com";
    let report = submit(
        &relay,
        from,
        &["a@example.com"],
        &html_message("report-key", "Quarterly report", pixel),
    )
    .await;
    let other = submit(
        &relay,
        from,
        &["b@example.com"],
        &message(Some("other-key"), "Unrelated note", "nothing to see"),
    )
    .await;
    wait_state(&relay, &report, State::Delivered).await;
    wait_state(&relay, &other, State::Delivered).await;
    let sink_ui = format!("http://{}/ui", sink.api_addr().unwrap());

    let driver = start_driver(&chromedriver).await;
    let browser = open_browser(&driver, &chromium).await;
    let mut shots = Screenshots::new("sink");
    browser.goto(&sink_ui).await.unwrap();
    let messages = text(&browser, "#messages").await;
    assert!(
        messages.contains("Quarterly report") && messages.contains("Unrelated note"),
        "{messages}"
    );
    let keys = text(&browser, "#keys").await;
    assert!(
        keys.contains("report-key") && keys.contains("other-key"),
        "{keys}"
    );
    shots.take(&browser, "sink-inbox").await;

    // The filter narrows every table.
    let form = browser.form(Locator::Css("#search")).await.unwrap();
    form.set_by_name("text", "quarterly").await.unwrap();
    submit_form(&browser, &form).await;
    let messages = text(&browser, "#messages").await;
    assert!(
        messages.contains("Quarterly report") && !messages.contains("Unrelated"),
        "{messages}"
    );
    let keys = text(&browser, "#keys").await;
    assert!(
        keys.contains("report-key") && !keys.contains("other-key"),
        "{keys}"
    );
    let transactions = text(&browser, "#transactions").await;
    assert!(
        transactions.contains("report-key") && !transactions.contains("other-key"),
        "{transactions}"
    );
    shots.take(&browser, "sink-filtered").await;

    // The message: its subject, its text part decoded, its HTML rendered in a sandbox.
    click(
        &browser,
        browser
            .find(Locator::LinkText("Quarterly report"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(text(&browser, "#subject").await, "Quarterly report");
    let plain = text(&browser, ".text-part").await;
    assert!(plain.contains("Plain words, Grüße."), "{plain}");
    let frame = element(&browser, "iframe.html-part").await;
    assert_eq!(frame.attr("sandbox").await.unwrap().as_deref(), Some(""));
    frame.clone().enter_frame().await.unwrap();
    let hello = element(&browser, "#hello").await.text().await.unwrap();
    assert_eq!(hello, "Hello HTML");
    let body = element(&browser, "body").await;
    assert_eq!(
        body.attr("data-ran").await.unwrap(),
        None,
        "the HTML part's script ran"
    );
    browser.enter_parent_frame().await.unwrap();
    let title = browser.title().await.unwrap();
    assert!(!title.contains("pwned"), "{title}");
    // Give an image load time to arrive, had it been let out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the HTML part's remote image was fetched"
    );
    shots.take(&browser, "sink-html-message").await;

    browser.close().await.unwrap();
    shots.print();
}
