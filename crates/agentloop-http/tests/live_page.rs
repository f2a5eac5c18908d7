//! The live page at `/` in a real headless browser (issue 17, S35): Debian's Chromium
//! driven through chromedriver (WebDriver, by fantoccini) against the router on a real
//! socket. The page loads and lists a session; a message pushed from the page shows
//! its events streaming in; cancel from the page changes the session's status.
//! Screenshots go to `target/live-page/` for review.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian's `chromium` and
//! `chromium-driver`; `.ci/run` installs them when missing); without them the test
//! fails and says so.

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentloop::StopOptions;
use agentloop_http::{router, HttpOptions};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

mod common;
use common::*;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// chromedriver on a free loopback port, killed on drop.
struct Driver(Child, u16);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn start_driver() -> Driver {
    for path in [CHROMEDRIVER, CHROMIUM] {
        assert!(
            std::path::Path::new(path).exists(),
            "{path} is missing: install Debian's chromium and chromium-driver \
             (`apt-get install -y chromium chromium-driver`; .ci/run does this)"
        );
    }
    let port = free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    Driver(child, port)
}

async fn connect(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,900"]
        }),
    );
    let url = format!("http://127.0.0.1:{}", driver.1);
    // chromedriver takes a moment to listen.
    for _ in 0..100 {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(c) => return c,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("cannot open a browser session through chromedriver at {url}");
}

fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/live-page");
    std::fs::create_dir_all(&dir).expect("target/live-page");
    dir
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    std::fs::write(shots().join(name), png).expect("write the screenshot");
}

/// Waits until `check` holds on the page's text of `css` (at most 20 s).
async fn wait_text(c: &Client, css: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..200 {
        if let Ok(el) = c.find(Locator::Css(css)).await {
            last = el.text().await.unwrap_or_default();
            if check(&last) {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    screenshot(c, "failure.png").await;
    panic!("{what}: `{css}` reads {last:?} (screenshot target/live-page/failure.png)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_lists_streams_pushes_and_cancels() {
    let driver = start_driver();
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = Rt::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("sim", |_cfg: &[u8]| {
            Ok(agentloop_sim::SimAgent::new(agentloop_sim::Script::react(
                1,
                Duration::from_millis(20),
                Duration::from_millis(20),
            )))
        })
        .start()
        .await
        .unwrap();
    let app = router(&rt, HttpOptions::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let base = format!("http://{addr}");
    // A persistent session to find on the page (its record shows its status).
    let direct = router(&rt, HttpOptions::default());
    let (s, v) = call(
        &direct,
        "POST",
        "/sessions",
        Some(json!({"id": "demo", "kind": "sim", "persistent": true})),
    )
    .await;
    assert_eq!(s.as_u16(), 201, "{v}");

    let c = connect(&driver).await;
    c.goto(&format!("{base}/")).await.expect("the page loads");
    let row = r#"#sessions tr[data-id="demo"]"#;
    wait_text(&c, row, "the session is listed", |t| t.contains("demo")).await;
    screenshot(&c, "1-loaded.png").await;

    // Select it: its event stream opens; push a message from the page.
    c.find(Locator::Css(row))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#selected-id", "the session is selected", |t| {
        t == "demo"
    })
    .await;
    let input = c.find(Locator::Css("#push-text")).await.unwrap();
    input.send_keys("hello from the page").await.unwrap();
    c.find(Locator::Css("#push"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let log = wait_text(&c, "#events", "the pushed message's turn appears", |t| {
        t.contains("turn_started") && t.contains("turn_ended")
    })
    .await;
    assert!(log.contains("\"completed\""), "{log}");
    screenshot(&c, "2-events.png").await;

    // Cancel from the page: the stream ends, the status turns canceled, not live.
    c.find(Locator::Css("#cancel"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#events", "the stream ends with ended", |t| {
        t.contains("ended")
    })
    .await;
    wait_text(
        &c,
        &format!("{row} td.status"),
        "the status turns canceled",
        |t| t == "canceled",
    )
    .await;
    wait_text(
        &c,
        &format!("{row} td:last-child"),
        "the session is no longer live",
        |t| t == "no",
    )
    .await;
    screenshot(&c, "3-canceled.png").await;

    c.close().await.expect("close the browser");
    server.abort();
    rt.stop(StopOptions::immediate()).await.unwrap();
}
