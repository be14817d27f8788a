//! The web console (`/console` on the admin listener, `/ui` on the sink's API): its access
//! rules over raw HTTP, and an operator's round through its pages in a real headless Chromium
//! driven over WebDriver, with a screenshot of each page under
//! `target/console-screenshots/<test>/` (or `$IDEMRELAY_SCREENSHOT_DIR/<test>/`); each test
//! prints where its screenshots are.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use idemrelay::config::Secret;
use idemrelay::store::State;
use idemrelay_sink::{FaultRule, SinkConfig, SinkHandle};

use crate::common::http::{send, Body, HttpResponse};
use crate::common::{
    message, relay_for, submit, wait_state, TestRelay, UNKNOWN_WINDOW, UNKNOWN_WINDOW_MARGIN,
};

// The tests, by subject; each module reads this file's helpers with `use super::*`.
mod cross_site;
mod inbox;
mod outage;
mod retry;
mod sign_in;
mod unresolved;

const TOKEN: &str = "console-test-token-0123";
/// A key a client chose to look like markup: every page must show it as text.
const HOSTILE_KEY: &str = "<b id=\"injected\">k</b>&amp;";
const OK_KEY: &str = "console-ok";
const UNRESOLVED_KEY: &str = "console-unresolved";

async fn sink_with_api() -> SinkHandle {
    idemrelay_sink::Sink::start(SinkConfig {
        api: Some("127.0.0.1:0".parse().unwrap()),
        ..SinkConfig::default()
    })
    .await
    .expect("sink")
}

/// One delivered record (under a key that looks like markup), one more delivered, and one
/// unresolved: the sink keeps the unresolved one's message but drops the connection after
/// its final dot, every time, until the relay's short upstream window closes.
async fn relay_with_records(sink: &SinkHandle) -> (TestRelay, String, String, String) {
    sink.set_faults(vec![FaultRule::drop_after_dot().with_key(UNRESOLVED_KEY)])
        .unwrap();
    let relay = relay_for(sink, |s| {
        s.admin_token = Some(Secret(TOKEN.into()));
        s.delivery.timeouts.dot = Duration::from_secs(1);
        s.delivery.upstream_window = UNKNOWN_WINDOW;
        s.delivery.window_margin = UNKNOWN_WINDOW_MARGIN;
    })
    .await;
    let from = "ops@example.com";
    let hostile = submit(
        &relay,
        from,
        &["a@example.com"],
        &message(Some(HOSTILE_KEY), "<i>markup</i> subject", "body"),
    )
    .await;
    let ok = submit(
        &relay,
        from,
        &["b@example.com"],
        &message(Some(OK_KEY), "hello", "the body is never shown"),
    )
    .await;
    let unresolved = submit(
        &relay,
        from,
        &["c@example.com"],
        &message(Some(UNRESOLVED_KEY), "lost reply", "body"),
    )
    .await;
    wait_state(&relay, &hostile, State::Delivered).await;
    wait_state(&relay, &ok, State::Delivered).await;
    wait_state(&relay, &unresolved, State::Unresolved).await;
    (relay, hostile, ok, unresolved)
}

async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpResponse {
    send(addr, method, path, headers, Body::Bytes(body.as_bytes())).await
}

/// chromedriver on a free port, ended with the test.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_program(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// chromium and chromedriver, or None (the test then skips, except under CI).
fn browser_programs() -> Option<(PathBuf, PathBuf)> {
    let chromium = find_program(
        "IDEMRELAY_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    );
    let driver = find_program("IDEMRELAY_CHROMEDRIVER", &["chromedriver"]);
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("chromium and chromedriver are needed for the console's browser test (apt-get install chromium chromium-driver)")
        }
        _ => None,
    }
}

async fn start_driver(program: &PathBuf) -> Driver {
    // Port 0 cannot be handed to chromedriver: take a free port and give it back.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(program)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver { child, port };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return driver;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not listen on {port}");
}

async fn open_browser(driver: &Driver, chromium: &std::path::Path) -> Browser {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1600", "--no-first-run"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a WebDriver session")
}

struct Screenshots {
    dir: PathBuf,
    taken: Vec<PathBuf>,
}

impl Screenshots {
    /// A directory of its own per test (they run at once): under `$IDEMRELAY_SCREENSHOT_DIR`
    /// when set, else `target/console-screenshots`.
    fn new(test: &str) -> Screenshots {
        let base = match std::env::var_os("IDEMRELAY_SCREENSHOT_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
                .join("console-screenshots"),
        };
        let dir = base.join(test);
        // Only this run's pages: none left over from a run that took others.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Screenshots { dir, taken: vec![] }
    }

    fn print(&self) {
        for shot in &self.taken {
            println!("screenshot: {}", shot.display());
        }
    }

    async fn take(&mut self, browser: &Browser, name: &str) {
        let png = browser.screenshot().await.expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
        let path = self
            .dir
            .join(format!("{:02}-{name}.png", self.taken.len() + 1));
        std::fs::write(&path, png).unwrap();
        self.taken.push(path);
    }
}

const WAIT: Duration = Duration::from_secs(10);

async fn element(browser: &Browser, css: &str) -> fantoccini::elements::Element {
    browser
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
}

/// Runs `act` (a click or a form submission that loads another page) and waits until the
/// page it was on is gone, so that what is read next comes from the new one.
async fn navigate<F, Fut>(browser: &Browser, act: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), fantoccini::error::CmdError>>,
{
    let old = browser.find(Locator::Css("html")).await.unwrap();
    act().await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while old.tag_name().await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page did not change"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn submit_form(browser: &Browser, form: &fantoccini::elements::Form) {
    navigate(browser, || form.submit()).await;
}

async fn click(browser: &Browser, element: fantoccini::elements::Element) {
    navigate(browser, || element.click()).await;
}

/// An element's text with each run of whitespace made one space.
async fn text(browser: &Browser, css: &str) -> String {
    let text = element(browser, css).await.text().await.unwrap();
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Reloads the page until `css`'s text contains `wanted`.
async fn reload_until(browser: &Browser, css: &str, wanted: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = text(browser, css).await;
        if now.contains(wanted) {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{css} never showed {wanted:?} (last: {now:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        browser.refresh().await.unwrap();
    }
}
