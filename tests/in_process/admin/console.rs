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
