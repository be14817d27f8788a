//! In a real browser: a page of another origin cannot pause delivery.

use super::*;

/// A page on another origin (a local server on another port) that, once loaded, sends a
/// `no-cors` fetch and then auto-submits a form to the admin API: the two requests a hostile
/// page makes. The form carries its parameters in the query string and no body, as a form
/// that wants to look like an API call would.
async fn hostile_page(admin: SocketAddr) -> SocketAddr {
    let page = format!(
        r#"<!doctype html><title>cute cats</title>
<form id="f" method="post" action="http://{admin}/api/v1/queue/pause?reason=cross-site-form"></form>
<script>
fetch("http://{admin}/api/v1/queue/pause", {{method: "POST", mode: "no-cors",
      body: JSON.stringify({{reason: "cross-site-fetch"}})}})
  .finally(() => document.getElementById("f").submit());
</script>"#
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_origin_cannot_pause_delivery_in_a_real_browser() {
    let Some((chromium, chromedriver)) = browser_programs() else {
        println!("SKIPPED: chromium or chromedriver not found (apt-get install chromium chromium-driver)");
        return;
    };
    // Changes allowed without a token (the harness's setting): only the Host, Origin and
    // JSON-body checks stand between the page and the queue.
    let relay = TestRelay::start().await;
    let admin = relay.admin();
    let evil = hostile_page(admin).await;
    let driver = start_driver(&chromedriver).await;
    let browser = open_browser(&driver, &chromium).await;
    browser.goto(&format!("http://{evil}/")).await.unwrap();
    // The form's submission takes the browser to the admin API's answer.
    let deadline = tokio::time::Instant::now() + WAIT;
    let target = format!("http://{admin}/api/v1/queue/pause");
    loop {
        let url = browser.current_url().await.unwrap();
        if url.as_str().starts_with(&target) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the form was not submitted (still at {url})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = browser.source().await.unwrap();
    assert!(answer.contains("cross_origin"), "{answer}");
    // Give the no-cors fetch time to land too, had it been let in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        relay.store().paused().await.unwrap(),
        None,
        "a page of another origin paused delivery"
    );
    let _ = browser.close().await;
}
