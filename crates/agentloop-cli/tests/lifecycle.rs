//! One lifecycle at every door (S26a, issue 53 point 1), against the real `agentloop
//! serve`: a session that ended stays known with one status, the same in the HTTP
//! list, the HTTP get, the list filter and the CLI's `sessions list --server`, with what
//! is kept of it; 404 only when nothing is kept. Each session is also carried across a
//! restart of the server (a SIGTERM and a new process on the same store).

mod common;

use std::time::Duration;

use common::{agent, base, get, post_json, wait_for, Job, TempDir};
use serde_json::{json, Value};

fn list(url: &str, query: &str) -> Vec<Value> {
    let (status, v) = get(&format!("{url}/sessions{query}"));
    assert_eq!(status, 200, "GET /sessions{query}: {v}");
    v.as_array().cloned().expect("a list")
}

fn row(rows: &[Value], id: &str) -> Option<Value> {
    rows.iter().find(|r| r["id"] == json!(id)).cloned()
}

fn spawn(url: &str, body: Value) {
    let (status, _, v) = post_json(&format!("{url}/sessions"), &body);
    assert_eq!(status, 201, "spawn {body}: {v}");
}

fn push(url: &str, id: &str, n: u64) {
    let (status, _, v) = post_json(
        &format!("{url}/sessions/{id}/items"),
        &json!({"item": {"id": n, "text": format!("m{n}")}}),
    );
    assert_eq!(status, 200, "push to {id}: {v}");
}

/// Waits until `GET /sessions/{id}` says `status`.
fn wait_status(url: &str, id: &str, status: &str) -> Value {
    let mut last = Value::Null;
    wait_for(&format!("{id} to be {status}"), 30, || {
        let (code, v) = get(&format!("{url}/sessions/{id}"));
        last = v.clone();
        code == 200 && v["status"] == json!(status)
    });
    last
}

/// The CLI's list of a server's sessions, as text.
fn cli_list(dir: &std::path::Path, url: &str, extra: &[&str]) -> String {
    let mut args = vec!["sessions", "list", "--server", url];
    args.extend_from_slice(extra);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(&args)
        .current_dir(dir)
        .output()
        .expect("the agentloop binary runs");
    assert!(
        out.status.success(),
        "sessions list --server: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The case: a `persistent: true, history: 5` session stopped gracefully was
/// 404 at `GET /sessions/{id}` and missing from `GET /sessions` while its history and
/// events remained. Now it is `stopped` at every door, with what is kept, across a
/// restart of the server; a session that kept nothing beyond its record is unknown
/// after a clean end (404), and a delete makes the stopped one unknown too.
#[test]
fn an_ended_session_stays_known_with_one_status_at_every_door() {
    let dir = TempDir::new("lifecycle");
    let mut job = Job::serve(&dir.0, &[]);
    let url = base(&mut job);
    // Kept: history and events (sessions spawned over HTTP keep their events).
    spawn(
        &url,
        json!({"id": "kept", "kind": "sim", "persistent": true, "history": 5,
               "config": {"rounds": 1, "model_ms": 1, "tool_ms": 1}}),
    );
    // Kept nothing beyond its record: no history, events not kept.
    spawn(
        &url,
        json!({"id": "bare", "kind": "sim", "persistent": true,
               "events": false,
               "config": {"rounds": 1, "model_ms": 1, "tool_ms": 1}}),
    );
    // Runs on.
    spawn(
        &url,
        json!({"id": "runs", "kind": "sim", "persistent": true,
               "config": {"rounds": 1, "model_ms": 1, "tool_ms": 1}}),
    );
    for id in ["kept", "bare"] {
        push(&url, id, 1);
    }
    // Both finish their turn, then stop gracefully with nothing left to resume.
    wait_for("kept's turn to be checkpointed", 30, || {
        let (code, v) = get(&format!("{url}/sessions/kept/history"));
        code == 200 && v.as_array().is_some_and(|a| !a.is_empty())
    });
    // A timer of `kept`, due later: its clean end removes it with its final record.
    let (status, _, v) = post_json(
        &format!("{url}/sessions/kept/timers"),
        &json!({"item": {"id": 9, "text": "later"}, "in": "1h"}),
    );
    assert_eq!(status, 201, "arm: {v}");
    for id in ["kept", "bare"] {
        let (status, _, v) = post_json(
            &format!("{url}/sessions/{id}/stop"),
            &json!({"mode": "graceful"}),
        );
        assert_eq!(status, 202, "stop {id}: {v}");
    }
    let view = wait_status(&url, "kept", "stopped");
    assert_eq!(view["live"], json!(false), "{view}");
    assert_eq!(view["kept"]["record"], json!(true), "{view}");
    assert!(view["kept"]["history"].as_u64().unwrap_or(0) >= 1, "{view}");
    assert!(view["kept"]["events"].as_u64().unwrap_or(0) > 0, "{view}");
    assert_eq!(
        view["timers"],
        json!([]),
        "no timer outlives a clean end: {view}"
    );
    let (code, timers) = get(&format!("{url}/sessions/kept/timers"));
    assert_eq!((code, timers), (200, json!({"timers": []})));
    wait_for("bare to be unknown", 30, || {
        get(&format!("{url}/sessions/bare")).0 == 404
    });
    let (_, gone) = get(&format!("{url}/sessions/bare"));
    assert_eq!(gone["code"], json!("unknown_session"), "{gone}");

    let check_doors = |url: &str, dir: &std::path::Path| {
        // The list and its filter agree with the get.
        let rows = list(url, "");
        let kept = row(&rows, "kept").expect("the stopped session is listed");
        assert_eq!(kept["status"], json!("stopped"), "{kept}");
        assert!(
            row(&rows, "bare").is_none(),
            "nothing of `bare` is kept: {rows:?}"
        );
        let runs = row(&rows, "runs").expect("the running session is listed");
        assert_eq!(runs["status"], json!("running"), "{runs}");
        let stopped = list(url, "?status=stopped,completed");
        assert!(row(&stopped, "kept").is_some(), "{stopped:?}");
        assert!(row(&stopped, "runs").is_none(), "{stopped:?}");
        let running = list(url, "?status=running");
        assert!(row(&running, "kept").is_none(), "{running:?}");
        assert!(row(&running, "runs").is_some(), "{running:?}");
        // The CLI reads the same list.
        let text = cli_list(dir, url, &[]);
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some("kept"))
            .unwrap_or_else(|| panic!("`kept` in the CLI's list:\n{text}"));
        assert!(line.contains("stopped"), "{line}");
    };
    check_doors(&url, &dir.0);
    let (status, v) = get(&format!("{url}/sessions?status=asleep"));
    assert_eq!(status, 400, "{v}");
    assert!(
        v["message"].as_str().unwrap_or("").contains("sleeping"),
        "the error names the statuses: {v}"
    );

    // Across a restart of the server on the same store: the same at every door.
    job.signal(libc::SIGTERM);
    let _ = job.finish();
    let mut job = Job::serve(&dir.0, &[]);
    let url = base(&mut job);
    wait_status(&url, "runs", "running");
    check_doors(&url, &dir.0);
    assert_eq!(
        get(&format!("{url}/sessions/kept")).1["status"],
        json!("stopped")
    );

    // Spawned again, it runs (its final record does not stand in the way), and it
    // ends stopped again.
    spawn(
        &url,
        json!({"id": "kept", "kind": "sim", "persistent": true, "history": 5,
               "config": {"rounds": 1, "model_ms": 1, "tool_ms": 1}}),
    );
    wait_status(&url, "kept", "running");
    push(&url, "kept", 2);
    std::thread::sleep(Duration::from_millis(50));
    let (status, _, v) = post_json(
        &format!("{url}/sessions/kept/stop"),
        &json!({"mode": "drain"}),
    );
    assert_eq!(status, 202, "stop: {v}");
    wait_status(&url, "kept", "stopped");

    // A delete removes what is kept: then, and only then, it is unknown.
    let r = agent()
        .delete(&format!("{url}/sessions/kept"))
        .call()
        .expect("DELETE");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(get(&format!("{url}/sessions/kept")).0, 404);
    assert!(row(&list(&url, ""), "kept").is_none());
    job.signal(libc::SIGTERM);
    let _ = job.finish();
}
