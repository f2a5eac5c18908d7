//! Sleeping sessions (S39, issue 34) through the real `agentloop serve --idle-after` and
//! a real HTTP client: sessions fall asleep (listed `sleeping`, counted in `/metrics`,
//! viewed from their records without being woken); pushes to sleeping sessions wake
//! them; a SIGKILL while they wake loses nothing: every push that was acknowledged is
//! delivered, and an item is delivered twice only when the killed process's turn
//! delivered it and its end was not durable yet (docs/operations.md, "Crash safety");
//! after the restart the sessions still asleep are listed `sleeping` and wake on a push.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{agent, free_addr, Job, TempDir};
use serde_json::{json, Value};

const SESSIONS: u64 = 12;

/// How many times each item id was delivered, from the item log.
fn deliveries(log: &Path) -> std::collections::HashMap<u64, usize> {
    let mut out = std::collections::HashMap::new();
    for l in std::fs::read_to_string(log).unwrap_or_default().lines() {
        if let Some(rest) = l.strip_prefix("turn") {
            for w in rest.split_whitespace() {
                if let Ok(id) = w.parse::<u64>() {
                    *out.entry(id).or_insert(0) += 1;
                }
            }
        }
    }
    out
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn get(url: &str) -> (u16, Value) {
    match agent().get(url).call() {
        Ok(mut r) => (
            r.status().as_u16(),
            r.body_mut().read_json().unwrap_or(Value::Null),
        ),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

fn push(url: &str, id: &str, item: u64) -> Result<u16, String> {
    agent()
        .post(&format!("{url}/sessions/{id}/items"))
        .send_json(json!({"item": {"id": item, "text": "wake up"}}))
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}

/// The state `GET /sessions` lists for each session.
fn states(url: &str) -> Vec<(String, String)> {
    let (s, v) = get(&format!("{url}/sessions"));
    assert_eq!(s, 200, "{v}");
    v.as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap_or_default().to_string(),
                r["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn all_sleeping(url: &str) -> bool {
    let s = states(url);
    s.len() == SESSIONS as usize && s.iter().all(|(_, st)| st == "sleeping")
}

/// Reads the event stream of `id` (after `last` when given, as `Last-Event-ID`) until
/// its first `turn_ended`, then hangs up: the events read.
fn events_until_turn_ended(url: &str, id: &str, last: Option<u64>) -> Vec<common::Sse> {
    use std::io::BufRead as _;
    let mut req = agent().get(&format!("{url}/sessions/{id}/events"));
    if let Some(n) = last {
        req = req.header("Last-Event-ID", n.to_string());
    }
    let resp = req.call().expect("the event stream");
    let reader = std::io::BufReader::new(resp.into_body().into_reader());
    let (mut out, mut seq, mut name) = (Vec::new(), None, String::new());
    for line in reader.lines() {
        let line = line.expect("a line");
        if let Some(n) = line.strip_prefix("id:") {
            seq = n.trim().parse().ok();
        } else if let Some(n) = line.strip_prefix("event:") {
            name = n.trim().to_string();
        } else if let Some(d) = line.strip_prefix("data:") {
            let done = name == "turn_ended";
            out.push(common::Sse {
                id: seq.take(),
                name: name.clone(),
                data: serde_json::from_str(d.trim()).unwrap_or(Value::Null),
            });
            if done {
                break;
            }
        }
    }
    out
}

fn serve(dir: &Path, addr: &str, log: &str) -> Job {
    let mut job = Job::serve_at(dir, addr, &["--item-log", log, "--idle-after", "1s"]);
    job.wait_for("serving on http://");
    job
}

#[test]
fn sessions_sleep_wake_and_lose_nothing_to_a_sigkill_during_a_wake() {
    let dir = TempDir::new("sleep");
    let log = dir.0.join("turns.log");
    let log_arg = log.display().to_string();
    let addr = free_addr();
    let url = format!("http://{addr}");
    let job = serve(&dir.0, &addr, &log_arg);
    for i in 0..SESSIONS {
        let r = agent()
            .post(&format!("{url}/sessions"))
            .send_json(
                json!({"id": format!("z{i}"), "kind": "sim", "persistent": true,
                              "config": {"rounds": 1, "model_ms": 1, "tool_ms": 1}}),
            )
            .expect("spawned");
        assert_eq!(r.status().as_u16(), 201);
        assert_eq!(push(&url, &format!("z{i}"), i), Ok(200));
    }
    wait_until("every session asleep", || all_sleeping(&url));
    let (_, metrics) = {
        let mut r = agent()
            .get(&format!("{url}/metrics"))
            .call()
            .expect("metrics");
        (r.status(), r.body_mut().read_to_string().expect("text"))
    };
    assert!(
        metrics.contains(&format!(
            "agentloop_sessions{{status=\"sleeping\"}} {SESSIONS}"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("agentloop_sessions{status=\"live\"} 0"),
        "{metrics}"
    );
    // A view is answered from the record, without waking it.
    let (s, v) = get(&format!("{url}/sessions/z0"));
    assert_eq!(
        (s, v["presence"].as_str(), v["live"].as_bool()),
        (200, Some("sleeping"), Some(false)),
        "{v}"
    );
    assert!(all_sleeping(&url), "the view did not wake it");

    // Pushes wake them; the server is killed while they do.
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut pushers = Vec::new();
    for i in 0..SESSIONS {
        let (url, acked) = (url.clone(), acked.clone());
        pushers.push(std::thread::spawn(move || {
            for k in 0..5u64 {
                let item = 1_000 + i * 10 + k;
                match push(&url, &format!("z{i}"), item) {
                    Ok(200) => acked.lock().unwrap().push(item),
                    _ => return,
                }
            }
        }));
    }
    wait_until("a push acknowledged", || !acked.lock().unwrap().is_empty());
    let _ = job.kill();
    for p in pushers {
        let _ = p.join();
    }
    let acked = acked.lock().unwrap().clone();
    let before = deliveries(&log);

    let job = serve(&dir.0, &addr, &log_arg);
    wait_until("every acknowledged push delivered", || {
        let d = deliveries(&log);
        acked.iter().all(|i| d.get(i).copied().unwrap_or(0) >= 1)
    });
    wait_until("every session asleep again", || all_sleeping(&url));
    let d = deliveries(&log);
    for (item, n) in &d {
        let by_killed = before.get(item).copied().unwrap_or(0);
        assert!(
            *n == 1 || (*n == 2 && by_killed == 1),
            "item {item} delivered {n} times ({by_killed} by the killed process)"
        );
    }
    for item in &acked {
        assert!(
            d.contains_key(item),
            "acknowledged item {item} never delivered"
        );
    }
    // Asleep after the restart too, and a push still wakes them.
    assert_eq!(push(&url, "z3", 9_999), Ok(200));
    wait_until("the woken session's turn", || {
        deliveries(&log).contains_key(&9_999)
    });
    assert_eq!(deliveries(&log)[&9_999], 1);

    // An SSE client across a sleep (S20a): it reads a turn's events, hangs up, the
    // session sleeps and is woken by a push; reconnecting with its last event id, it
    // gets the new turn's events, nothing reported missed.
    let url2 = url.clone();
    let first = std::thread::spawn(move || events_until_turn_ended(&url2, "z5", None));
    wait_until("the subscription woke z5", || {
        states(&url)
            .iter()
            .any(|(id, st)| id == "z5" && st == "live")
    });
    assert_eq!(push(&url, "z5", 5_555), Ok(200));
    let first = first.join().expect("the first stream");
    let last = first
        .iter()
        .rev()
        .find_map(|e| e.id)
        .expect("numbered events");
    wait_until("z5 asleep again", || {
        states(&url)
            .iter()
            .any(|(id, st)| id == "z5" && st == "sleeping")
    });
    assert_eq!(push(&url, "z5", 5_556), Ok(200));
    wait_until("the woken turn", || deliveries(&log).contains_key(&5_556));
    let again = events_until_turn_ended(&url, "z5", Some(last));
    assert!(
        again.iter().all(|e| e.name != "lagged"),
        "nothing was missed across the sleep: {again:?}"
    );
    assert!(
        again.iter().any(|e| e.name == "turn_started"),
        "the woken turn's events: {again:?}"
    );
    let _ = job.kill();
}

/// `--idle-after` takes the configuration file's bounds (1 s to 30 days): outside them
/// the server does not start, and says why.
#[test]
fn an_idle_after_out_of_range_is_refused_at_start() {
    let dir = TempDir::new("sleep-flag");
    for bad in ["500ms", "400days"] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
            .current_dir(&dir.0)
            .args(["serve", "--listen", "127.0.0.1:0", "--idle-after", bad])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the CLI runs");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().expect("waited") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("`serve --idle-after {bad}` started instead of refusing");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        use std::io::Read as _;
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("read");
        assert!(!status.success(), "{bad}: {err}");
        assert!(
            err.contains("--idle-after") && err.contains("at least 1s and at most 30 days"),
            "{bad}: {err}"
        );
    }
}
