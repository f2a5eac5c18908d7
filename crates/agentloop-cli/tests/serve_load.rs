//! Load and restart (issue 17): `agentloop serve` with 50 persistent sessions, 8
//! concurrent clients pushing for about 10 s with an `Idempotency-Key` per item and
//! retries, a SIGTERM in the middle, a restart on the same directory, then a drain.
//! Audit (S10 over HTTP): every push that got a 2xx is delivered by a completed turn
//! (the server's `--item-log`), and no item is delivered twice.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{agent, base, spawn_sim, stop, Job, TempDir};
use parking_lot::Mutex;
use serde_json::{json, Value};

const SESSIONS: usize = 50;
const CLIENTS: u64 = 8;

/// One push with its key: `Ok(true)` on a 2xx, `Ok(false)` when refused (503 while
/// draining: not accepted, safe to send again later), `Err` when the server could not
/// be reached (nothing was processed: the server is down).
fn push(url: &str, session: &str, id: u64) -> Result<bool, String> {
    let resp = agent()
        .post(&format!("{url}/sessions/{session}/items"))
        .header("Idempotency-Key", &format!("item-{id}"))
        .send_json(json!({"item": {"id": id, "text": "load"}}));
    match resp {
        Ok(mut r) => {
            let status = r.status().as_u16();
            match status {
                200..=299 => Ok(true),
                503 => Ok(false),
                other => Err(format!(
                    "unexpected {other}: {}",
                    r.body_mut().read_to_string().unwrap_or_default()
                )),
            }
        }
        Err(e) => Err(format!("unreachable: {e}")),
    }
}

#[test]
fn fifty_sessions_under_load_survive_a_sigterm_and_a_restart() {
    let dir = TempDir::new("serve-load");
    let log = dir.0.join("items.log");
    let args = ["--item-log", log.to_str().unwrap()];
    let mut job = Job::serve(&dir.0, &args);
    let url = Arc::new(Mutex::new(base(&mut job)));
    for s in 0..SESSIONS {
        let url = url.lock().clone();
        spawn_sim(
            &url,
            &format!("s{s}"),
            json!({"rounds": 1, "model_ms": 3, "tool_ms": 3}),
        );
    }

    // Clients: each pushes its own ids round the sessions; an item refused or not
    // answered is sent again (same key) until it is accepted or the run ends.
    let acked: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let unexpected: Arc<Mutex<Vec<String>>> = Arc::default();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (url, acked, done, unexpected) =
                (url.clone(), acked.clone(), done.clone(), unexpected.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let id = c * 1_000_000_000 + i;
                    let session = format!("s{}", (id % SESSIONS as u64));
                    loop {
                        if done.load(Ordering::Relaxed) {
                            return;
                        }
                        let u = url.lock().clone();
                        match push(&u, &session, id) {
                            Ok(true) => {
                                acked.lock().insert(id);
                                break;
                            }
                            Ok(false) => std::thread::sleep(Duration::from_millis(50)),
                            Err(e) if e.starts_with("unreachable") => {
                                std::thread::sleep(Duration::from_millis(50))
                            }
                            Err(e) => {
                                unexpected.lock().push(e);
                                std::thread::sleep(Duration::from_millis(50));
                            }
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();

    std::thread::sleep(Duration::from_secs(5));
    let before = acked.lock().len();
    assert!(before > 0, "no push was acknowledged before the signal");
    stop(job);
    // Restart on the same directory: every session resumes; clients move to it.
    let mut job = Job::serve(&dir.0, &args);
    let line = job.wait_for("agentloop: resumed");
    assert!(
        line.contains(&format!("resumed {SESSIONS} sessions")),
        "{line}"
    );
    *url.lock() = base(&mut job);
    std::thread::sleep(Duration::from_secs(5));
    done.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client");
    }
    assert!(unexpected.lock().is_empty(), "{:?}", unexpected.lock());
    let after = acked.lock().len();
    assert!(after > before, "no push was acknowledged after the restart");

    // Drain every session, then stop the server.
    let u = url.lock().clone();
    for s in 0..SESSIONS {
        let r = agent()
            .post(&format!("{u}/sessions/s{s}/stop"))
            .send_json(json!({"mode": "drain"}))
            .expect("stop");
        assert_eq!(r.status().as_u16(), 202);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut r = agent().get(&format!("{u}/sessions")).call().expect("list");
        let rows: Value = r.body_mut().read_json().expect("JSON");
        let live = rows
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["live"] == true)
            .count();
        let stored = rows.as_array().unwrap().len();
        if live == 0 {
            // S26a: a drained session that keeps its events (the default over HTTP)
            // keeps a final record saying it stopped, with nothing left to resume.
            assert_eq!(
                stored, SESSIONS,
                "every drained session stays listed: {rows}"
            );
            for row in rows.as_array().unwrap() {
                assert_eq!(row["status"], json!("stopped"), "{row}");
                let id = row["id"].as_str().expect("an id");
                let mut r = agent()
                    .get(&format!("{u}/sessions/{id}"))
                    .call()
                    .expect("get");
                let v: Value = r.body_mut().read_json().expect("JSON");
                assert_eq!(
                    v["unhandled_items"],
                    json!([]),
                    "a drain leaves nothing: {v}"
                );
                assert_eq!(v["interrupted_items"], json!([]), "{v}");
                assert!(v["state"].is_null(), "{v}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{live} sessions still live after the drain"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(job);

    // The audit.
    let text = std::fs::read_to_string(&log).expect("the item log");
    let mut delivered: HashMap<u64, u32> = HashMap::new();
    for line in text.lines().filter(|l| l.starts_with("turn")) {
        for id in line.split_whitespace().skip(1) {
            *delivered.entry(id.parse().expect("an id")).or_default() += 1;
        }
    }
    let acked = acked.lock();
    let lost: Vec<_> = acked
        .iter()
        .filter(|id| !delivered.contains_key(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged pushes never delivered: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    eprintln!(
        "load and restart: {} pushes acknowledged ({before} before the SIGTERM), {} delivered, none twice",
        acked.len(),
        delivered.len()
    );
}
