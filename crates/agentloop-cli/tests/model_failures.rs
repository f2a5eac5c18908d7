//! `ended` means ended (S26, issue 53 point 2), against the real `agentloop serve
//! --model-url` and a model server of the test's own on loopback that answers every
//! request with one HTTP error:
//!
//! - `401` is permanent: one model call, the stream ends with `ended` (failed), the
//!   session is not restarted and its status is `failed` at every door;
//! - `500` is transient: the chat client retries it (with `Retry-After: 0`), the
//!   supervisor restarts the session within its budget, each incarnation's stream ends
//!   with `restarting {attempt, after_ms, error}`, never `ended`, the budget and its use
//!   are in the view, and once the budget is spent the session is `failed`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{agent, base, wait_for, Job, Sse, TempDir};
use serde_json::{json, Value};

/// A model server that answers every request with `status` and counts the requests.
struct Failing {
    url: String,
    requests: Arc<AtomicUsize>,
}

impl Failing {
    fn start(status: u16) -> Failing {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let requests = Arc::new(AtomicUsize::new(0));
        let r = requests.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let r = r.clone();
                std::thread::spawn(move || answer(conn, status, &r));
            }
        });
        Failing { url, requests }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn answer(mut conn: TcpStream, status: u16, requests: &AtomicUsize) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone the socket"));
    if common::read_request(&mut reader).is_none() {
        return;
    }
    requests.fetch_add(1, Ordering::SeqCst);
    if status == 500 {
        // Each incarnation lives a while (6 calls), so the test sees it run.
        std::thread::sleep(Duration::from_millis(30));
    }
    let body = match status {
        401 => {
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#
        }
        _ => r#"{"error":{"message":"The server had an error","type":"server_error"}}"#,
    };
    let reason = if status == 401 {
        "Unauthorized"
    } else {
        "Internal Server Error"
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 0\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn
        .write_all(head.as_bytes())
        .and_then(|_| conn.write_all(body.as_bytes()));
}

/// Reads an event stream until `ended` or `restarting` (or its end): every event.
fn read_stream(resp: ureq::http::Response<ureq::Body>) -> Vec<Sse> {
    let mut reader = BufReader::new(resp.into_body().into_reader());
    let mut out = Vec::new();
    let (mut name, mut id) = (String::new(), None);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = line.trim_end();
        if let Some(n) = line.strip_prefix("event:") {
            name = n.trim().to_string();
        } else if let Some(i) = line.strip_prefix("id:") {
            id = i.trim().parse().ok();
        } else if let Some(d) = line.strip_prefix("data:") {
            let data: Value = serde_json::from_str(d.trim()).unwrap_or(Value::Null);
            let last = name == "ended" || name == "restarting";
            out.push(Sse {
                id: id.take(),
                name: std::mem::take(&mut name),
                data,
            });
            if last {
                break;
            }
        }
    }
    out
}

/// Spawns a persistent chat session, opens its stream, pushes one message: the events
/// until the stream's `ended` or `restarting`.
fn chat_once(url: &str, id: &str) -> Vec<Sse> {
    let r = agent()
        .post(&format!("{url}/sessions"))
        .send_json(json!({"id": id, "kind": "chat", "persistent": true}))
        .expect("spawned");
    assert_eq!(r.status().as_u16(), 201, "spawn {id}");
    let resp = agent()
        .get(&format!("{url}/sessions/{id}/events"))
        .call()
        .expect("the event stream");
    assert_eq!(resp.status().as_u16(), 200, "events of {id}");
    let reader = std::thread::spawn(move || read_stream(resp));
    let r = agent()
        .post(&format!("{url}/sessions/{id}/items"))
        .send_json(json!({"item": {"id": 1, "text": "hello"}}))
        .expect("pushed");
    assert!(r.status().is_success(), "push to {id}: {}", r.status());
    reader.join().expect("the watcher")
}

fn view(url: &str, id: &str) -> (u16, Value) {
    let mut r = agent()
        .get(&format!("{url}/sessions/{id}"))
        .call()
        .expect("GET");
    let status = r.status().as_u16();
    (status, r.body_mut().read_json().unwrap_or(Value::Null))
}

fn serve(dir: &TempDir, model: &Failing) -> (Job, String) {
    let mut job = Job::serve(
        &dir.0,
        &["--model-url", model.url.as_str(), "--model", "fake"],
    );
    let url = base(&mut job);
    (job, url)
}

/// A model server answering 401 (a bad key) fails the turn permanently: one model
/// call, the stream ends with `ended` (failed, the 401 named), nothing restarts it.
#[test]
fn a_permanent_model_error_ends_the_session_once() {
    let dir = TempDir::new("model-401");
    let model = Failing::start(401);
    let (job, url) = serve(&dir, &model);
    let events = chat_once(&url, "c401");
    let last = events.last().expect("events");
    assert_eq!(last.name, "ended", "{events:?}");
    assert!(!events.iter().any(|e| e.name == "restarting"), "{events:?}");
    let text = last.data.to_string();
    assert!(text.contains("failed") && text.contains("401"), "{text}");
    wait_for("the session to be failed", 30, || {
        view(&url, "c401").1["status"] == json!("failed")
    });
    // A restart would call the model again at once: give it the time to.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(model.requests(), 1, "one call for a permanent error");
    let (code, v) = view(&url, "c401");
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["live"], json!(false), "{v}");
    assert!(
        v["last_error"].as_str().unwrap_or("").contains("permanent"),
        "the record says the failure was permanent: {v}"
    );
    common::stop(job);
}

/// A model server answering 500 is transient: the session is restarted within its
/// budget (3 in 60 s by default); each stream of an incarnation ends with
/// `restarting`, the view shows the budget's use, and past the budget the session is
/// `failed` without another call.
#[test]
fn a_transient_model_error_restarts_within_the_budget_then_ends() {
    let dir = TempDir::new("model-500");
    let model = Failing::start(500);
    let (job, url) = serve(&dir, &model);
    let events = chat_once(&url, "c500");
    let last = events.last().expect("events");
    assert_eq!(last.name, "restarting", "{events:?}");
    assert!(
        !events.iter().any(|e| e.name == "ended"),
        "`ended` is never sent for a session that runs again: {events:?}"
    );
    assert_eq!(last.data["attempt"], json!(1), "{}", last.data);
    assert!(last.data["after_ms"].is_u64(), "{}", last.data);
    assert!(
        last.data["error"].as_str().unwrap_or("").contains("500"),
        "{}",
        last.data
    );
    // While it runs, the view shows its budget and the use of it.
    let mut seen_use = None;
    wait_for("the session to be failed", 60, || {
        let (_, v) = view(&url, "c500");
        if let Some(r) = v["run"].get("restarts") {
            seen_use = Some(r.clone());
        }
        v["status"] == json!("failed")
    });
    let seen = seen_use.expect("the view showed the restart budget while the session ran");
    assert_eq!(seen["limit"], json!(3), "{seen}");
    assert_eq!(seen["policy"], json!("permanent"), "{seen}");
    assert!(seen["used"].as_u64().is_some_and(|u| u <= 3), "{seen}");
    // 1 + 3 incarnations, each making one call with its 5 retries.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(model.requests(), 4 * 6, "no call past the budget");
    let (_, v) = view(&url, "c500");
    assert_eq!(v["live"], json!(false), "{v}");
    common::stop(job);
}
