//! S34a (issue 52) through the real binary under an address-space cap: the process's
//! memory budget (`[limits] memory`) bounds what all sessions together hold. Before,
//! 2 000 pushes of 1 MiB into one session that stores nothing were all accepted and the
//! process died at its cap (3.2 GB), and 20 persistent sessions at their 64 MiB each
//! took it down in 15 s. Now work over the budget is answered 503 `over_memory` with
//! `Retry-After` before anything is accepted, the server keeps serving, reads and stops
//! go through, and once a stop frees the memory new work is accepted again.

mod common;

use common::{agent, base, stop, write_config, Job, TempDir};
use serde_json::{json, Value};

/// The address-space cap the server runs under.
const CAP: u64 = 3 << 30;
/// The budget the server is given (well under the cap).
const BUDGET: u64 = 160 << 20;

fn post(url: &str, body: &Value) -> (u16, Option<String>, Value) {
    common::post_json(url, body)
}

/// Pushes items of `size` bytes into `id` until one is refused; how many were accepted
/// and the refusal.
fn fill(url: &str, id: &str, size: usize, most: usize) -> (usize, (u16, Option<String>, Value)) {
    let text = "x".repeat(size);
    for n in 0..most {
        let r = post(
            &format!("{url}/sessions/{id}/items"),
            &json!({"item": {"id": n, "text": text}}),
        );
        if r.0 != 200 {
            return (n, r);
        }
    }
    panic!("{most} pushes of {size} bytes were all accepted under a budget of {BUDGET} bytes");
}

#[test]
fn the_process_memory_budget_refuses_new_work_and_lets_it_in_again() {
    let dir = TempDir::new("memory-budget");
    write_config(&dir.0, &format!("[limits]\nmemory = {BUDGET}\n"));
    let mut job = Job::serve_capped(&dir.0, CAP, &[]);
    let line = job.wait_for("memory budget");
    assert!(line.contains("memory budget 160 MiB"), "{line}");
    let url = base(&mut job);
    let sessions = format!("{url}/sessions");
    // A session that stores nothing, whose one turn takes ten minutes: what is pushed
    // waits in memory.
    let (s, _, v) = post(
        &sessions,
        &json!({"id": "big", "kind": "sim", "config": {"rounds": 1, "model_ms": 600_000}}),
    );
    assert_eq!(s, 201, "{v}");
    let (accepted, (status, retry, body)) = fill(&url, "big", 900_000, 2_000);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "over_memory", "{body}");
    assert_eq!(retry.as_deref(), Some("1"), "Retry-After");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("[limits] memory"), "{message}");
    assert!(
        (20..400).contains(&accepted),
        "{accepted} pushes of 900 kB accepted under a budget of 160 MiB"
    );
    // Other new work waits too: a spawn, a new event stream.
    let (s, _, v) = post(&sessions, &json!({"id": "other", "kind": "sim"}));
    assert_eq!((s, v["code"].as_str()), (503, Some("over_memory")), "{v}");
    let r = agent()
        .get(&format!("{sessions}/big/events"))
        .call()
        .expect("GET events");
    assert_eq!(r.status().as_u16(), 503);
    // Probes, reads and stops go through.
    let r = agent()
        .get(&format!("{url}/healthz"))
        .call()
        .expect("healthz");
    assert_eq!(r.status().as_u16(), 200);
    let mut r = agent()
        .get(&format!("{sessions}/big"))
        .call()
        .expect("view");
    assert_eq!(r.status().as_u16(), 200);
    let view: Value = r.body_mut().read_json().unwrap();
    assert_eq!(
        view["run"]["buffered"].as_u64(),
        Some(accepted as u64 - 1),
        "{view}"
    );
    let (s, _, v) = post(
        &format!("{sessions}/big/stop"),
        &json!({"mode": "immediate"}),
    );
    assert_eq!(s, 202, "{v}");
    // The stop freed what the session held: new work is accepted again.
    common::wait_for("a spawn accepted after the stop", 30, || {
        let (s, _, _) = post(&sessions, &json!({"id": "after", "kind": "sim"}));
        s == 201
    });
    assert!(
        job.child.try_wait().unwrap().is_none(),
        "the server is alive"
    );
    stop(job);
}
