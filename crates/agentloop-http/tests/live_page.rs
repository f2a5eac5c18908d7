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
    connect_with(driver, &[]).await
}

/// A browser session with `extra` arguments for Chromium.
async fn connect_with(driver: &Driver, extra: &[String]) -> Client {
    let mut args: Vec<String> = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().cloned());
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": args,
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
    screenshot_in(shots(), c, name).await;
}

/// Writes a screenshot of the page to `dir/name`.
async fn screenshot_in(dir: PathBuf, c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    std::fs::write(dir.join(name), png).expect("write the screenshot");
}

/// Clicks the element at `css` (found once: not one the page re-renders).
async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Types `text` into the element at `css`.
async fn type_into(c: &Client, css: &str, text: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .send_keys(text)
        .await
        .unwrap();
}

/// A browser session on the page at `base`, loaded.
async fn open_page(driver: &Driver, base: &str) -> Client {
    let c = connect(driver).await;
    c.goto(&format!("{base}/")).await.expect("the page loads");
    c
}

/// Closes the browser, stops the server's task and the runtime: a test's end.
async fn finish<T>(c: Client, server: tokio::task::JoinHandle<T>, rt: Rt) {
    c.close().await.expect("close the browser");
    server.abort();
    rt.stop(StopOptions::immediate()).await.unwrap();
}

/// Clicks the element at `css`, finding it again when the page re-rendered it between
/// the find and the click (the panels are rebuilt every second: a stale reference).
async fn click_fresh(c: &Client, css: &str) {
    let mut last = None;
    for _ in 0..50 {
        match c.find(Locator::Css(css)).await {
            Ok(el) => match el.click().await {
                Ok(_) => return,
                Err(e) => last = Some(e.to_string()),
            },
            Err(e) => last = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    screenshot(c, "failure.png").await;
    panic!("cannot click `{css}`: {last:?} (screenshot target/live-page/failure.png)");
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

/// A runtime on `dir` with one agent kind, `kind`, whose agents `factory` builds.
async fn runtime_with<A, F>(dir: &std::path::Path, kind: &str, factory: F) -> Rt
where
    A: agentloop::Agent<Item = agentloop_sim::SimItem, Event = agentloop_sim::SimEvent>,
    F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
{
    let (rt, _) = Rt::builder()
        .data_dir(dir)
        .flush_logs(None)
        .register_agent(kind, factory)
        .start()
        .await
        .unwrap();
    rt
}

/// A runtime on `dir` with kind `sim`: one model call and one tool call of 20 ms a turn.
async fn sim_runtime(dir: &std::path::Path) -> Rt {
    runtime_with(dir, "sim", |_cfg: &[u8]| {
        Ok(agentloop_sim::SimAgent::new(agentloop_sim::Script::react(
            1,
            Duration::from_millis(20),
            Duration::from_millis(20),
        )))
    })
    .await
}

/// Spawns a persistent `sim` session `id` (through a router of its own, without a
/// token), for the page to find.
async fn spawn_persistent(rt: &Rt, id: &str) {
    let direct = router(rt, HttpOptions::default());
    spawn_api(
        &direct,
        json!({"id": id, "kind": "sim", "persistent": true}),
    )
    .await;
}

/// Selects the session in `row` (its event stream opens) and pushes `text` from the page.
async fn select_and_push(c: &Client, row: &str, id: &str, text: &str) {
    click_fresh(c, row).await;
    wait_text(c, "#selected-id", "the session is selected", |t| t == id).await;
    type_into(c, "#push-text", text).await;
    click(c, "#push").await;
}

/// Selects the session in `row` (its event stream opens), pushes `text` from the
/// page, and waits for that turn's events; returns the event log's text.
async fn push_from_page(c: &Client, row: &str, id: &str, text: &str) -> String {
    select_and_push(c, row, id, text).await;
    wait_text(c, "#events", "the pushed message's turn appears", |t| {
        t.contains("turn_started") && t.contains("turn_ended")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_lists_streams_pushes_and_cancels() {
    let driver = start_driver();
    let dir = tempfile::tempdir().unwrap();
    let rt = sim_runtime(dir.path()).await;
    let (base, server, _api) = serve(&rt).await;
    // A persistent session to find on the page (its record shows its status).
    spawn_persistent(&rt, "demo").await;

    let c = open_page(&driver, &base).await;
    let row = r#"#sessions tr[data-id="demo"]"#;
    wait_text(&c, row, "the session is listed", |t| t.contains("demo")).await;
    screenshot(&c, "1-loaded.png").await;

    // Select it: its event stream opens; push a message from the page.
    let log = push_from_page(&c, row, "demo", "hello from the page").await;
    assert!(log.contains("\"completed\""), "{log}");
    screenshot(&c, "2-events.png").await;

    // Cancel from the page: the stream ends, the status turns canceled, not live.
    click(&c, "#cancel").await;
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

    finish(c, server, rt).await;
}

/// A fake OpenAI-compatible model server: asked a question (no tool result yet), it
/// calls tool `lookup`; given the result, it streams its answer slowly (300 ms a
/// chunk), so the page can be seen streaming. Returns its base URL.
async fn start_model() -> String {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|body: axum::body::Bytes| async move {
            let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let answered = req["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
            let chunk = |delta: serde_json::Value, finish: Option<&str>| {
                let c = json!({"id": "c", "object": "chat.completion.chunk", "created": 0,
                    "model": "fake", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                format!("data: {c}\n\n")
            };
            let parts: Vec<(String, u64)> = if answered {
                let mut v: Vec<(String, u64)> = ["Order ", "#42 ", "ships", " tomorrow."]
                    .iter()
                    .map(|t| (chunk(json!({"content": t}), None), 300))
                    .collect();
                v.push((chunk(json!({}), Some("stop")), 0));
                v
            } else {
                vec![
                    (
                        chunk(
                            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": "lookup", "arguments": "{\"order\": \"#42\"}"}}]}),
                            None,
                        ),
                        0,
                    ),
                    (chunk(json!({}), Some("tool_calls")), 0),
                ]
            };
            let stream = futures_util_stream(parts);
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(axum::body::Body::from_stream(stream))
                .unwrap()
        }),
    );
    let (addr, _server) = serve_loopback(app).await;
    format!("http://{addr}/v1")
}

/// The chunks, each after its pause, then `[DONE]`.
fn futures_util_stream(
    parts: Vec<(String, u64)>,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> + Send {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(8);
    tokio::spawn(async move {
        for (text, pause) in parts {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if tx.send(Ok(text)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok("data: [DONE]\n\n".to_string())).await;
    });
    tokio_stream_of(rx)
}

fn tokio_stream_of(
    mut rx: tokio::sync::mpsc::Receiver<Result<String, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    order: String,
}

/// Issue 35's inspector: a chat session's turn in the browser: the model's tokens show
/// as they stream, and the turn's timeline shows its tool call's durable step, the model
/// calls with their tokens, and the turn's end; the state panel shows the conversation
/// carried between turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_shows_tokens_streaming_and_a_step_in_the_timeline() {
    let driver = start_driver();
    let dir = tempfile::tempdir().unwrap();
    let provider = agentloop_openai::Provider::builder(start_model().await, "fake")
        .build()
        .unwrap();
    let tools = agentloop_openai::Tools::new().add(
        "lookup",
        "Looks up an order.",
        |a: Lookup, _key| async move { Ok::<_, String>(format!("{} ships tomorrow", a.order)) },
    );
    let rt =
        runtime_with(dir.path(), "chat", move |_cfg: &[u8]| {
            Ok(agentloop_openai::ChatAgent::<agentloop_sim::SimItem, agentloop_sim::SimEvent>::new(
            provider.clone(),
        )
        .tools(tools.clone()))
        })
        .await;
    let (base, server, direct) = serve(&rt).await;
    spawn_api(
        &direct,
        json!({"id": "chat", "kind": "chat", "persistent": true, "durability": "sync",
                    "history": 2}),
    )
    .await;

    let c = open_page(&driver, &base).await;
    let row = r#"#sessions tr[data-id="chat"]"#;
    wait_text(&c, row, "the session is listed", |t| t.contains("chat")).await;
    select_and_push(&c, row, "chat", "where is #42?").await;

    // Streaming: the first tokens show before the last one arrived.
    let partial = wait_text(&c, "#stream", "the first tokens show", |t| {
        t.contains("Order")
    })
    .await;
    assert!(
        !partial.contains("tomorrow."),
        "the answer was seen only once whole: {partial:?}"
    );
    screenshot(&c, "4-streaming.png").await;
    wait_text(&c, "#stream", "the whole answer shows", |t| {
        t == "Order #42 ships tomorrow."
    })
    .await;
    // Issue 53 point 4: the model call's four tokens are one log line that grew.
    let tokens = wait_text(&c, "#events li.tokens", "the tokens' one log line", |t| {
        t.contains("Order #42 ships tomorrow.")
    })
    .await;
    assert!(tokens.contains("agent tokens"), "{tokens}");
    let lines = log_lines(&c).await;
    let token_lines: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("\"token\"") || l.contains("agent tokens"))
        .collect();
    assert_eq!(
        token_lines.len(),
        1,
        "one log line for the model call's tokens: {lines:#?}"
    );
    screenshot_to(&c, "tokens-one-line.png").await;

    // The timeline: the tool call's durable step, the model calls, the turn's end.
    let timeline = wait_text(&c, "#timeline", "the turn ends in the timeline", |t| {
        t.contains("turn 0 · completed")
    })
    .await;
    assert!(timeline.contains("step tool:call_1 · done"), "{timeline}");
    assert!(timeline.contains("tool lookup("), "{timeline}");
    assert!(
        timeline.contains("→ lookup: #42 ships tomorrow"),
        "{timeline}"
    );
    assert!(timeline.contains("model call"), "{timeline}");
    wait_text(
        &c,
        "#state-kind",
        "the conversation shows as the carried state",
        |t| t.contains("carried"),
    )
    .await;
    let state = wait_text(&c, "#state", "the state shows the answer", |t| {
        t.contains("Order #42 ships tomorrow.")
    })
    .await;
    assert!(state.contains("\"messages\""), "{state}");
    screenshot(&c, "5-inspector.png").await;

    // History with fork: the turn's kept checkpoint forks into a new session, which
    // the page selects; it carries the conversation of the checkpoint.
    wait_text(&c, "#history", "the checkpoint is listed", |t| {
        t.contains("turn 0")
    })
    .await;
    click_fresh(&c, r#"#history button[data-turn="0"]"#).await;
    wait_text(&c, "#selected-id", "the fork is selected", |t| {
        t == "chat-fork-0"
    })
    .await;
    wait_text(
        &c,
        r#"#sessions tr[data-id="chat-fork-0"]"#,
        "the fork is listed",
        |t| t.contains("chat-fork-0"),
    )
    .await;
    wait_text(&c, "#state", "the fork carries the conversation", |t| {
        t.contains("Order #42 ships tomorrow.")
    })
    .await;
    screenshot(&c, "6-forked.png").await;

    finish(c, server, rt).await;
}

/// The live page over TLS with a token (S43), as it is served in production: the
/// server terminates TLS itself (`server::serve` with `ServeOptions::tls`), Chromium
/// trusts exactly the server's key (`--ignore-certificate-errors-spki-list`, the
/// SHA-256 of its public key) and speaks HTTP/2 to it; the page reads the token from
/// its address, drops it from the address bar, lists a session, and a message pushed
/// from the page shows its events streaming in over the TLS stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_works_over_tls_with_a_token() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let driver = start_driver();
    let dir = tempfile::tempdir().unwrap();
    let rt = sim_runtime(dir.path()).await;
    // The server's certificate for localhost, and the hash Chromium pins.
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let spki = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(
        rcgen::PublicKeyData::subject_public_key_info(&key),
    ));
    let token = "page-s3cr3t-m4rk3r-0123456789";
    let tls = agentloop_http::tls::server_config(&cert_path, &key_path).expect("TLS config");
    let app = router(
        &rt,
        HttpOptions {
            token: Some(token.to_string()),
            ..HttpOptions::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(agentloop_http::server::serve(
        listener,
        app,
        agentloop_http::server::ServeOptions {
            tls: Some(tls),
            ..Default::default()
        },
        std::future::pending(),
    ));
    spawn_persistent(&rt, "secure").await;

    let c = connect_with(
        &driver,
        &[format!("--ignore-certificate-errors-spki-list={spki}")],
    )
    .await;
    c.goto(&format!("https://localhost:{port}/?token={token}"))
        .await
        .expect("the page loads over TLS");
    let row = r#"#sessions tr[data-id="secure"]"#;
    wait_text(&c, row, "the session is listed over TLS", |t| {
        t.contains("secure")
    })
    .await;
    let protocol = c
        .execute(
            "return performance.getEntriesByType('navigation')[0].nextHopProtocol",
            vec![],
        )
        .await
        .expect("the protocol");
    assert_eq!(protocol, json!("h2"), "Chromium speaks HTTP/2 over TLS");
    let address = c.current_url().await.expect("the address").to_string();
    assert!(
        !address.contains(token),
        "the token left the address bar: {address}"
    );
    screenshot(&c, "tls-1-loaded.png").await;

    push_from_page(&c, row, "secure", "hello over TLS").await;
    screenshot(&c, "tls-2-events.png").await;

    finish(c, server, rt).await;
}

// ---- issue 53 point 4: the inspector shows a session's whole life ----------------

/// Where the inspector's screenshots go (not committed).
fn shots_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/live-page-screenshots");
    std::fs::create_dir_all(&dir).expect("target/live-page-screenshots");
    dir
}

async fn screenshot_to(c: &Client, name: &str) {
    screenshot_in(shots_dir(), c, name).await;
}

/// The event log's lines.
async fn log_lines(c: &Client) -> Vec<String> {
    let v = c
        .execute(
            "return [...document.querySelectorAll('#events li')].map((l) => l.textContent)",
            vec![],
        )
        .await
        .expect("the log's lines");
    serde_json::from_value(v).expect("strings")
}

/// Whether the element at `css` is disabled.
async fn disabled(c: &Client, css: &str) -> bool {
    let v = c
        .execute(
            "const e = document.querySelector(arguments[0]); return e ? e.disabled : null",
            vec![json!(css)],
        )
        .await
        .expect("the element's state");
    v.as_bool()
        .unwrap_or_else(|| panic!("`{css}` is not on the page"))
}

/// Waits until the element at `css` is disabled (or enabled) as `want` says.
async fn wait_disabled(c: &Client, css: &str, want: bool) {
    for _ in 0..200 {
        if disabled(c, css).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    screenshot_to(c, "failure.png").await;
    panic!(
        "`{css}` disabled should be {want} (screenshot target/live-page-screenshots/failure.png)"
    );
}

/// Waits (at most 20 s) until `check` holds on the router's answer to `GET uri`.
async fn wait_api(
    app: &axum::Router,
    uri: &str,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..200 {
        let (_, v) = call(app, "GET", uri, None).await;
        if check(&v) {
            return v;
        }
        last = v;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: GET {uri} reads {last}");
}

/// Serves `rt`'s router on a loopback port; returns the base URL, the server's task
/// and a router of its own for the test's API calls.
async fn serve(
    rt: &Rt,
) -> (
    String,
    tokio::task::JoinHandle<std::io::Result<()>>,
    axum::Router,
) {
    let (addr, server) = serve_loopback(router(rt, HttpOptions::default())).await;
    (
        format!("http://{addr}"),
        server,
        router(rt, HttpOptions::default()),
    )
}

/// Pushes item `n` of `text` to session `id` through the API; it is accepted.
async fn push_api(app: &axum::Router, id: &str, n: u64, text: &str) {
    let (s, v) = push(app, id, n, text).await;
    assert_eq!(s.as_u16(), 200, "{v}");
}

/// Spawns a session through the API from `body`; it is created.
async fn spawn_api(app: &axum::Router, body: serde_json::Value) {
    let (s, v) = spawn(app, body).await;
    assert_eq!(s.as_u16(), 201, "{v}");
}

/// A session that ran two turns and stopped while the page watched stays listed; its
/// controls fit it (push and stop disabled, delete enabled); selecting it again shows
/// its past turns, replayed from its kept events. Before, its checkpoints show the state
/// at a turn and the difference of two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_session_stays_listed_and_shows_its_past_and_checkpoints() {
    let driver = start_driver();
    let dir = tempfile::tempdir().unwrap();
    let rt = sim_runtime(dir.path()).await;
    let (base, server, app) = serve(&rt).await;
    spawn_api(
        &app,
        json!({"id": "past", "kind": "sim", "persistent": true, "history": 4}),
    )
    .await;
    push_api(&app, "past", 1, "first").await;
    wait_api(&app, "/sessions/past", "turn 0 ends", |v| {
        v["turn_index"] == 1
    })
    .await;
    push_api(&app, "past", 2, "second").await;
    wait_api(&app, "/sessions/past", "turn 1 ends", |v| {
        v["turn_index"] == 2
    })
    .await;

    let c = open_page(&driver, &base).await;
    let row = r#"#sessions tr[data-id="past"]"#;
    wait_text(&c, row, "the session is listed", |t| t.contains("past")).await;
    click_fresh(&c, row).await;
    // Selected while it runs: its past turns show, replayed from the start.
    wait_text(&c, "#timeline", "the past turns show", |t| {
        t.contains("turn 0 · completed") && t.contains("turn 1 · completed")
    })
    .await;
    wait_disabled(&c, "#push", false).await;

    // Its checkpoints: the state at turn 0, the difference of turns 0 and 1.
    wait_text(&c, "#history", "the checkpoints are listed", |t| {
        t.contains("turn 0") && t.contains("turn 1")
    })
    .await;
    click_fresh(&c, r#"#history button[data-view-turn="0"]"#).await;
    let cp = wait_text(&c, "#checkpoint", "the checkpoint's state shows", |t| {
        t.contains("\"turn_index\": 1")
    })
    .await;
    assert!(cp.contains("\"state\""), "{cp}");
    click_fresh(&c, r#"#history input[data-cmp-turn="0"]"#).await;
    click_fresh(&c, r#"#history input[data-cmp-turn="1"]"#).await;
    let diff = wait_text(&c, "#diff", "the difference shows", |t| {
        t.contains("~ turn_index: 1 → 2")
    })
    .await;
    assert!(!diff.contains("no difference"), "{diff}");
    wait_text(&c, "#diff-turns", "the compared turns", |t| {
        t.contains("turn 0 → turn 1")
    })
    .await;
    screenshot_to(&c, "3-checkpoint-diff.png").await;

    // It stops (gracefully, from the API): it stays listed, its buttons disabled.
    let (s, v) = call(&app, "POST", "/sessions/past/stop", None).await;
    assert_eq!(s.as_u16(), 202, "{v}");
    wait_text(&c, &format!("{row} td:last-child"), "no longer live", |t| {
        t == "no"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_text(&c, row, "the stopped session is still listed", |t| {
        t.contains("past")
    })
    .await;
    for b in ["#push", "#push-text", "#stop", "#cancel"] {
        wait_disabled(&c, b, true).await;
    }
    wait_disabled(&c, "#delete", false).await;
    wait_disabled(&c, "#respawn", false).await;
    screenshot_to(&c, "1-stopped-still-listed.png").await;

    // Selected again (its events from the store, the stream closes after `ended`).
    click_fresh(&c, row).await;
    wait_text(
        &c,
        "#timeline",
        "the past turns replay from kept events",
        |t| t.contains("turn 0 · completed") && t.contains("turn 1 · completed"),
    )
    .await;
    let log = wait_text(&c, "#events", "the replay ends with ended", |t| {
        t.contains(" ended ") && t.contains("(stream closed)")
    })
    .await;
    assert!(
        log.contains("#1 turn_started"),
        "replayed from the first event: {log}"
    );
    for b in ["#push", "#stop", "#cancel"] {
        assert!(
            disabled(&c, b).await,
            "{b} is enabled for a stopped session"
        );
    }
    screenshot_to(&c, "2-stopped-replayed.png").await;

    finish(c, server, rt).await;
}

/// With the server's listing of ended sessions (issue 53: every session whose record,
/// history or kept events remain is listed, with `status` and `kept`): a session that
/// ran and stopped before the page was opened is listed, not running, and selecting it
/// shows its past turns from its kept events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_stopped_before_the_page_opened_is_listed_with_its_past() {
    let driver = start_driver();
    let dir = tempfile::tempdir().unwrap();
    let rt = sim_runtime(dir.path()).await;
    let (base, server, app) = serve(&rt).await;
    spawn_api(
        &app,
        json!({"id": "gone", "kind": "sim", "persistent": true}),
    )
    .await;
    push_api(&app, "gone", 1, "first").await;
    wait_api(&app, "/sessions/gone", "turn 0 ends", |v| {
        v["turn_index"] == 1
    })
    .await;
    let (s, v) = call(&app, "POST", "/sessions/gone/stop", None).await;
    assert_eq!(s.as_u16(), 202, "{v}");
    wait_api(&app, "/sessions", "it stops", |v| {
        !v.as_array()
            .is_some_and(|a| a.iter().any(|r| r["id"] == "gone" && r["live"] == true))
    })
    .await;

    let c = open_page(&driver, &base).await;
    let row = r#"#sessions tr[data-id="gone"]"#;
    wait_text(&c, row, "the ended session is listed", |t| {
        t.contains("gone")
    })
    .await;
    let status = wait_text(&c, &format!("{row} td.status"), "its status", |t| {
        !t.is_empty()
    })
    .await;
    assert_ne!(status, "running", "an ended session is not running");
    click_fresh(&c, row).await;
    wait_text(&c, "#timeline", "its past turn shows", |t| {
        t.contains("turn 0 · completed")
    })
    .await;
    for b in ["#push", "#stop", "#cancel"] {
        wait_disabled(&c, b, true).await;
    }
    screenshot_to(&c, "4-listed-after-stop.png").await;

    finish(c, server, rt).await;
}

/// The spawn form sends persistence, durability, history and a config (a chat's system
/// prompt inside it); a config that is not JSON is refused before anything is sent. A
/// timer of the session is listed and canceled from the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spawn_form_sends_settings_and_a_timer_is_canceled_from_the_page() {
    let driver = start_driver();
    let dir = tempfile::tempdir().unwrap();
    let configs: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Default::default();
    let seen = configs.clone();
    let rt = runtime_with(dir.path(), "chat", move |cfg: &[u8]| {
        seen.lock()
            .unwrap()
            .push(serde_json::from_slice(cfg).unwrap_or(serde_json::Value::Null));
        Ok(react_agent())
    })
    .await;
    let (base, server, app) = serve(&rt).await;

    let c = open_page(&driver, &base).await;
    wait_text(&c, "#sessions", "the list loads", |t| {
        t.contains("no sessions")
    })
    .await;
    let kind = c.find(Locator::Css("#new-kind")).await.unwrap();
    kind.clear().await.unwrap();
    kind.send_keys("chat").await.unwrap();
    type_into(&c, "#new-id", "formed").await;
    click(&c, "#new-persistent").await;
    c.execute(
        "const d = document.getElementById('new-durability'); d.value = 'turn'; \
         d.dispatchEvent(new Event('change'));",
        vec![],
    )
    .await
    .unwrap();
    type_into(&c, "#new-history", "3").await;
    type_into(&c, "#new-system", "Be brief.").await;
    let config = c.find(Locator::Css("#new-config")).await.unwrap();
    // Not JSON: refused on the page, nothing spawned.
    config.send_keys("{\"temperature\": ").await.unwrap();
    click(&c, "#spawn").await;
    wait_text(&c, "#error", "the config is refused", |t| {
        t.contains("config is not JSON")
    })
    .await;
    let (s, _) = call(&app, "GET", "/sessions/formed", None).await;
    assert_eq!(s.as_u16(), 404, "nothing was spawned");
    config.send_keys("0.5}").await.unwrap();
    screenshot_to(&c, "5-spawn-form.png").await;
    click(&c, "#spawn").await;
    wait_text(&c, "#selected-id", "the new session is selected", |t| {
        t == "formed"
    })
    .await;
    assert_eq!(
        configs.lock().unwrap().first().cloned(),
        Some(json!({"temperature": 0.5, "system": "Be brief."})),
        "the config, with the system prompt in it"
    );
    // Durability `turn` writes the record at a turn's end.
    push_api(&app, "formed", 1, "hello").await;
    let v = wait_api(&app, "/sessions/formed", "the record is written", |v| {
        v["settings"].is_object()
    })
    .await;
    assert_eq!(v["settings"]["durability"], "turn", "{v}");
    assert_eq!(v["settings"]["history"], 3, "{v}");
    assert_eq!(v["agent_kind"], "chat", "{v}");

    // A timer, armed through the API, listed on the page and canceled from it.
    let (s, v) = call(
        &app,
        "POST",
        "/sessions/formed/timers",
        Some(json!({"item": {"id": 7, "text": "later"}, "in": "1h"})),
    )
    .await;
    assert!(s.is_success(), "{s} {v}");
    wait_text(&c, "#timers", "the timer is listed", |t| {
        t.contains("later")
    })
    .await;
    screenshot_to(&c, "6-timer.png").await;
    click_fresh(&c, "#timers button[data-cancel-timer]").await;
    wait_api(
        &app,
        "/sessions/formed/timers",
        "the timer is canceled",
        |v| v["timers"].as_array().is_some_and(|a| a.is_empty()),
    )
    .await;
    wait_text(&c, "#timers", "the page shows no timer", |t| t == "none").await;

    finish(c, server, rt).await;
}

/// An interrupted session shows its question; the answer typed into the page resumes it
/// (its resumed turn shows in the timeline, the interrupt leaves the page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_shows_its_question_and_the_page_answers_it() {
    let driver = start_driver();
    let dir = tempfile::tempdir().unwrap();
    let built = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rt = runtime_with(dir.path(), "asks", move |_cfg: &[u8]| {
        let a = react_agent();
        // The first agent asks at turn 0; the one resumed with the answer does not.
        Ok(
            if built.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                a.with_fault(Some(0), 0, agentloop_sim::Fault::Interrupt, true)
            } else {
                a
            },
        )
    })
    .await;
    let (base, server, app) = serve(&rt).await;
    spawn_api(
        &app,
        json!({"id": "ask", "kind": "asks", "persistent": true}),
    )
    .await;
    push_api(&app, "ask", 1, "may I?").await;
    wait_api(&app, "/sessions/ask", "the interrupt", |v| {
        v["interrupt"]["awaiting_answer"] == true && v["live"] == false
    })
    .await;

    let c = open_page(&driver, &base).await;
    let row = r#"#sessions tr[data-id="ask"]"#;
    wait_text(&c, row, "the session is listed", |t| t.contains("ask")).await;
    click_fresh(&c, row).await;
    wait_text(&c, "#interrupt-reason", "the interrupt's reason", |t| {
        t.contains("simulated approval required") && t.contains("awaiting an answer")
    })
    .await;
    let q = wait_text(&c, "#interrupt-question", "the question", |t| {
        t.contains("\"turn\": 0")
    })
    .await;
    assert!(q.contains("\"items\""), "{q}");
    for b in ["#push", "#stop"] {
        wait_disabled(&c, b, true).await;
    }
    type_into(&c, "#answer-text", "approved").await;
    screenshot_to(&c, "7-interrupt.png").await;
    click(&c, "#answer").await;
    wait_api(&app, "/sessions/ask", "the answer resumed it", |v| {
        v["interrupt"].is_null() && v["status"] == "running"
    })
    .await;
    let timeline = wait_text(&c, "#timeline", "the resumed turn shows", |t| {
        t.contains("turn 0 · completed · resumed")
    })
    .await;
    assert!(timeline.contains("(before: interrupted"), "{timeline}");
    let mut hidden = json!(false);
    for _ in 0..100 {
        hidden = c
            .execute("return document.getElementById('interrupt').hidden", vec![])
            .await
            .unwrap();
        if hidden == json!(true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        hidden,
        json!(true),
        "the answered interrupt leaves the page"
    );
    screenshot_to(&c, "8-answered.png").await;

    finish(c, server, rt).await;
}
