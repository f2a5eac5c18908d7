//! S34a (issue 52) through the real binary under an address-space cap: what a client
//! may make the runtime hold through the doors added after issue 29. Each test is one
//! finding of the probe on 401895f:
//!
//! - timers had no count or byte bound and sat outside the session's byte budget (300
//!   timers of 900 KB and four reads of the session took the process past 4 GB), an
//!   `every 1ms` schedule was accepted, and each arm listed every timer;
//! - forks got past `[limits] sessions` (64 227 forks live against 1 000);
//! - a replay loaded every kept event into memory per subscriber (64 reconnects with
//!   `Last-Event-ID: 0` to a session keeping many events took the process down).

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{agent, base, get, stop, write_config, Job, TempDir};
use serde_json::{json, Value};

/// The address-space cap the servers run under.
const CAP: u64 = 4 << 30;

fn post(url: &str, body: &Value) -> (u16, Option<String>, Value) {
    common::post_json(url, body)
}

fn alive(job: &mut Job, url: &str) {
    assert!(job.child.try_wait().unwrap().is_none(), "the server died");
    assert_eq!(get(&format!("{url}/healthz")).0, 200);
}

/// The server's resident set, in bytes.
fn rss(job: &Job) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", job.child.id())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

#[test]
fn a_sessions_timers_are_bounded_in_count_size_and_period() {
    let dir = TempDir::new("timer-bounds");
    let mut job = Job::serve_capped(&dir.0, CAP, &[]);
    let url = base(&mut job);
    let (s, _, v) = post(
        &format!("{url}/sessions"),
        &json!({"id": "t", "kind": "sim", "persistent": true}),
    );
    assert_eq!(s, 201, "{v}");
    let timers = format!("{url}/sessions/t/timers");
    // A 900 KB item: over `timer_bytes` (64 KiB), nothing armed.
    let big = json!({"item": {"id": 1, "text": "x".repeat(900_000)}, "in": "1h"});
    let (s, _, v) = post(&timers, &big);
    assert_eq!((s, v["code"].as_str()), (413, Some("too_large")), "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("[limits] timer_bytes"),
        "{v}"
    );
    // `every 1ms`: more often than `timer_period` (1 s).
    let (s, _, v) = post(
        &timers,
        &json!({"item": {"id": 2, "text": "x"}, "schedule": "every 1ms"}),
    );
    assert_eq!((s, v["code"].as_str()), (400, Some("bad_request")), "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("[limits] timer_period"),
        "{v}"
    );
    // 300 timers of 30 KB: 256 armed (`session_timers`), then 429 with Retry-After.
    let text = "y".repeat(30_000);
    let mut armed = 0;
    let mut refused = None;
    for n in 0..300 {
        let (s, retry, v) = post(
            &timers,
            &json!({"item": {"id": n, "text": text}, "in": "1h"}),
        );
        match s {
            201 => armed += 1,
            _ => {
                refused = Some((s, retry, v));
                break;
            }
        }
    }
    assert_eq!(armed, 256, "`session_timers` armed, no more");
    let (s, retry, v) = refused.expect("the 257th refused");
    assert_eq!(
        (s, v["code"].as_str()),
        (429, Some("too_many_timers")),
        "{v}"
    );
    assert!(retry.is_some(), "Retry-After");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("[limits] session_timers"),
        "{v}"
    );
    // The session and its timers read, four times: bounded by 256 × 64 KiB.
    for _ in 0..4 {
        let (s, v) = get(&format!("{url}/sessions/t"));
        assert_eq!(s, 200, "{v}");
        let (s, v) = get(&timers);
        assert_eq!(s, 200);
        assert_eq!(v["timers"].as_array().map(Vec::len), Some(256));
    }
    alive(&mut job, &url);
    // A canceled timer's place is free again.
    let r = agent()
        .delete(&format!("{timers}/1"))
        .call()
        .expect("DELETE");
    assert_eq!(r.status().as_u16(), 204);
    let (s, _, v) = post(
        &timers,
        &json!({"item": {"id": 999, "text": "z"}, "in": "1h"}),
    );
    assert_eq!(s, 201, "{v}");
    stop(job);
}

#[test]
fn forks_count_against_the_session_limit() {
    let dir = TempDir::new("fork-bounds");
    write_config(&dir.0, "[limits]\nsessions = 3\n");
    let mut job = Job::serve_capped(&dir.0, CAP, &[]);
    let url = base(&mut job);
    let sessions = format!("{url}/sessions");
    let (s, _, v) = post(
        &sessions,
        &json!({"id": "src", "kind": "sim", "persistent": true, "history": 2,
                "config": {"rounds": 1, "model_ms": 1, "tool_ms": 1}}),
    );
    assert_eq!(s, 201, "{v}");
    let (s, _, v) = post(
        &format!("{sessions}/src/items"),
        &json!({"item": {"id": 1, "text": "x"}}),
    );
    assert_eq!(s, 200, "{v}");
    // Turn 0's checkpoint is kept once its turn ended.
    let fork = |to: &str| {
        post(
            &format!("{sessions}/src/history/0/fork"),
            &json!({"id": to}),
        )
    };
    common::wait_for("turn 0's checkpoint", 30, || {
        get(&format!("{sessions}/src/history"))
            .1
            .as_array()
            .is_some_and(|c| !c.is_empty())
    });
    for to in ["f1", "f2"] {
        let (s, _, v) = fork(to);
        assert_eq!(s, 201, "{to}: {v}");
    }
    // src, f1, f2: the bound. A fork is a new live session: 429, nothing written.
    let (s, retry, v) = fork("f3");
    assert_eq!(
        (s, v["code"].as_str()),
        (429, Some("too_many_sessions")),
        "{v}"
    );
    assert!(retry.is_some(), "Retry-After");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("nothing was written"),
        "{v}"
    );
    assert_eq!(
        get(&format!("{sessions}/f3")).0,
        404,
        "no record of the refused fork"
    );
    // A stop frees a place: the fork goes through.
    let (s, _, v) = post(
        &format!("{sessions}/f1/stop"),
        &json!({"mode": "immediate"}),
    );
    assert!(s == 200 || s == 202, "{v}");
    common::wait_for("the fork once a place is free", 30, || fork("f3").0 == 201);
    alive(&mut job, &url);
    stop(job);
}

/// Opens `GET path` with `Last-Event-ID: 0` and reads only the response head: the
/// body stays unread (a client that reconnects from the start and stalls).
fn stalled_replay(addr: &str, path: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nLast-Event-ID: 0\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = [0u8; 64];
    let n = s.read(&mut head).unwrap();
    assert!(
        std::str::from_utf8(&head[..n])
            .unwrap()
            .starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    s
}

#[test]
fn a_replay_storm_holds_a_page_per_client_not_every_kept_event() {
    let dir = TempDir::new("replay-storm");
    // `crash`: the thousands of durable steps that make the events need no fsync each.
    let mut job = Job::serve_capped(&dir.0, CAP, &["--durability", "crash"]);
    let url = base(&mut job);
    let addr = url.trim_start_matches("http://").to_string();
    let sessions = format!("{url}/sessions");
    // A session keeping (up to) a million events; each turn runs a thousand rounds.
    let (s, _, v) = post(
        &sessions,
        &json!({"id": "many", "kind": "sim", "persistent": true, "durability": "turn",
                "events": {"count": 1_000_000},
                "config": {"rounds": 1000, "model_ms": 0, "tool_ms": 0}}),
    );
    assert_eq!(s, 201, "{v}");
    // One turn per push (a turn takes every waiting item): about 6 000 events each.
    let started = Instant::now();
    let idle = || {
        let (_, v) = get(&format!("{sessions}/many"));
        v["run"]["buffered"].as_u64() == Some(0) && v["run"]["phase"] == "idle"
    };
    for n in 0..25 {
        let (s, _, v) = post(
            &format!("{sessions}/many/items"),
            &json!({"item": {"id": n, "text": "x"}}),
        );
        assert_eq!(s, 200, "{v}");
        while !idle() {
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "the turns ran"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    eprintln!("replay storm: 25 turns in {:?}", started.elapsed());
    let before = rss(&job);
    // 64 clients reconnect from the start and stall after the response head.
    let storm: Vec<_> = (0..64)
        .map(|_| stalled_replay(&addr, "/sessions/many/events"))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let during = rss(&job);
    alive(&mut job, &url);
    let grown = during.saturating_sub(before);
    eprintln!(
        "replay storm: rss {} MiB before, {} MiB with 64 stalled replays (+{} MiB)",
        before >> 20,
        during >> 20,
        grown >> 20
    );
    // A page (about 1 MiB of bodies, whole store pages, decoded beside) per client, and
    // the connection's buffers: a few MiB each, whatever the session keeps; 64 copies
    // of every kept event (150 000 of them, ~250 bytes each read and decoded) came to
    // gigabytes.
    assert!(
        grown < 800 << 20,
        "64 stalled replays grew the server by {} MiB",
        grown >> 20
    );
    drop(storm);
    // A client that reads gets every kept event from the first, in order.
    let events = common::open_events(&format!("{sessions}/many/events"), Some(0));
    std::thread::sleep(Duration::from_secs(1));
    let (s, _, _) = post(&format!("{sessions}/many/stop"), &json!({"mode": "drain"}));
    assert!(s == 200 || s == 202);
    let events = events.join().unwrap();
    eprintln!("replay storm: {} events replayed from 0", events.len());
    assert!(
        events.len() > 120_000,
        "{} events replayed: {:?}",
        events.len(),
        events.iter().take(5).collect::<Vec<_>>()
    );
    common::check_gap_free(0, &events);
    stop(job);
}
