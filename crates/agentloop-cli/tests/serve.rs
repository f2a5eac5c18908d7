//! `agentloop serve` end to end (issue 17, S33–S35): the real binary on a free loopback
//! port and a temporary data directory, driven by a real HTTP client. A SIGTERM drains
//! (the event stream of a busy session ends with `ended`, reason `shutdown`), saves the
//! session `Interrupted`, the process exits 0; the next `serve` on the directory
//! resumes it and its items are delivered.

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::{Job, TempDir};
use serde_json::{json, Value};

/// The base URL the server printed.
fn base(job: &mut Job) -> String {
    let line = job.wait_for("serving on http://");
    let url = line
        .split("serving on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the address");
    url.to_string()
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

fn get(url: &str) -> (u16, Value) {
    let mut r = agent().get(url).call().expect("GET");
    let status = r.status().as_u16();
    (status, r.body_mut().read_json().unwrap_or(Value::Null))
}

fn post(url: &str, body: Value) -> (u16, Value) {
    let mut r = agent().post(url).send_json(body).expect("POST");
    let status = r.status().as_u16();
    (status, r.body_mut().read_json().unwrap_or(Value::Null))
}

/// Reads an event stream until `ended` (or EOF); returns `(event, data)` in order.
fn read_events(url: String) -> std::thread::JoinHandle<Vec<(String, Value)>> {
    std::thread::spawn(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let resp = agent.get(&url).call().expect("the event stream");
        let reader = BufReader::new(resp.into_body().into_reader());
        let mut out = Vec::new();
        let mut name = String::new();
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line.strip_prefix("event:") {
                name = n.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                let data: Value = serde_json::from_str(d.trim()).unwrap_or(Value::Null);
                let end = name == "ended";
                out.push((name.clone(), data));
                if end {
                    break;
                }
            }
        }
        out
    })
}

#[test]
fn serve_drains_on_sigterm_and_the_next_serve_resumes() {
    let dir = TempDir::new("serve");
    let mut job = Job::serve(&dir.0, &[]);
    job.wait_for("resumed 0 sessions");
    let url = base(&mut job);
    assert_eq!(get(&format!("{url}/healthz")).0, 200);
    assert_eq!(get(&format!("{url}/readyz")).0, 200);
    let (s, page) = {
        let mut r = agent().get(&format!("{url}/")).call().expect("the page");
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    };
    assert_eq!(s, 200);
    assert!(
        page.contains("<html") && page.contains("/sessions"),
        "the live page"
    );

    // A busy persistent session: slow turns, several items waiting.
    let (s, v) = post(
        &format!("{url}/sessions"),
        json!({"id": "busy", "kind": "sim", "persistent": true,
               "config": {"rounds": 1, "model_ms": 150, "tool_ms": 150}}),
    );
    assert_eq!(s, 201, "{v}");
    let events = read_events(format!("{url}/sessions/busy/events"));
    for i in 0..5 {
        let (s, v) = post(
            &format!("{url}/sessions/busy/items"),
            json!({"item": {"id": i, "text": format!("m{i}")}}),
        );
        assert_eq!(s, 200, "{v}");
    }
    // The first turn runs before the signal.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = get(&format!("{url}/sessions/busy"));
        if v["run"]["phase"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "no turn started: {v}");
        std::thread::sleep(Duration::from_millis(10));
    }
    job.signal(libc::SIGTERM);
    let seen = events.join().expect("the reader");
    let (last, data) = seen.last().cloned().expect("some events");
    assert_eq!(last, "ended", "{seen:?}");
    assert_eq!(data["reason"]["kind"], "shutdown", "{data}");
    let (status, out) = job.finish();
    assert!(status.success(), "{out}");
    assert!(out.contains("saved Interrupted"), "{out}");

    // The next serve resumes the session; its items are delivered.
    let mut job = Job::serve(&dir.0, &[]);
    let line = job.wait_for("agentloop: resumed");
    assert!(line.contains("resumed 1 session"), "{line}");
    let url = base(&mut job);
    let (s, v) = get(&format!("{url}/sessions/busy"));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["live"], true, "{v}");
    let (s, v) = post(
        &format!("{url}/sessions/busy/stop"),
        json!({"mode": "drain"}),
    );
    assert_eq!(s, 202, "{v}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, v) = get(&format!("{url}/sessions/busy"));
        if s == 404 || v["live"] == false {
            break;
        }
        assert!(Instant::now() < deadline, "the drain did not end: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
    job.signal(libc::SIGTERM);
    let (status, out) = job.finish();
    assert!(status.success(), "{out}");
}

#[test]
fn serve_refuses_a_public_address_without_a_token() {
    let dir = TempDir::new("serve-public");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.0.join("data"))
        .env_remove("AGENTLOOP_TOKEN")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without a token"), "{err}");
}
