//! S34a through the real binary (issue 29): what a client asks for is bounded before
//! anything is accepted, and the operator sets the bounds in `[limits]`. A simulated
//! agent asking for a billion rounds (its script is built at spawn: ~48 GB) or a year
//! per step, a replay buffer of `usize::MAX` events, a preempt delay of a billion
//! hours: each is a 400 that names the bound and the key that raises it, and the server
//! keeps serving.

mod common;

use common::{agent, base, get_status, post, stop, write_config, Job, TempDir};
use serde_json::{json, Value};

fn refused(url: &str, body: Value, names: &str) {
    let (s, v) = post(url, body.clone());
    assert_eq!(s, 400, "{body} -> {v}");
    assert_eq!(v["code"], "bad_request", "{v}");
    let message = v["message"].as_str().unwrap_or("");
    assert!(message.contains(names), "{body}: {message}");
}

#[test]
fn what_a_client_asks_for_is_bounded_by_the_servers_limits() {
    let dir = TempDir::new("bounds");
    write_config(
        &dir.0,
        "[limits]\nsim_rounds = 50\nsim_step = \"2s\"\nreplay = 1000\nduration = \"1h\"\n",
    );
    let mut job = Job::serve(&dir.0, &[]);
    let url = base(&mut job);
    let sessions = format!("{url}/sessions");

    // The simulated agent's configuration.
    let sim = |config: Value| json!({"id": "p", "kind": "sim", "config": config});
    refused(
        &sessions,
        sim(json!({"rounds": 1_000_000_000u64})),
        "sim_rounds",
    );
    refused(&sessions, sim(json!({"rounds": 51})), "1 to 50");
    refused(&sessions, sim(json!({"rounds": 0})), "sim_rounds");
    refused(
        &sessions,
        sim(json!({"model_ms": 1_000_000_000_000u64})),
        "sim_step",
    );
    refused(&sessions, sim(json!({"tool_ms": 2_001})), "sim_step");
    // The replay buffer.
    refused(
        &sessions,
        json!({"id": "r", "kind": "sim", "replay": u64::MAX}),
        "[limits] replay",
    );
    // History: at most what a session may keep.
    refused(
        &sessions,
        json!({"id": "h", "kind": "sim", "persistent": true, "history": 1_001}),
        "at most 1000",
    );
    // At the bounds: accepted.
    let (s, v) = post(
        &sessions,
        json!({"id": "ok", "kind": "sim", "replay": 1000,
               "config": {"rounds": 50, "model_ms": 2000, "tool_ms": 0}}),
    );
    assert_eq!(s, 201, "{v}");

    // Durations a request carries.
    let items = format!("{url}/sessions/ok/items");
    refused(
        &items,
        json!({"item": {"id": 1, "text": "x"},
               "preempt": {"at": "any", "delay": "1000000000000h"}}),
        "[limits] duration",
    );
    refused(
        &items,
        json!({"item": {"id": 1, "text": "x"},
               "preempt": {"at": "any", "timeout": "2h"}}),
        "at most 1h",
    );
    refused(
        &format!("{url}/sessions/ok/stop"),
        json!({"mode": "idle", "idle_for": "1000000000000h"}),
        "[limits] duration",
    );
    refused(
        &format!("{url}/sessions/ok/stop"),
        json!({"mode": "graceful", "timeout": "61m"}),
        "[limits] duration",
    );
    // Nothing was accepted by a refused request, and the server still serves.
    let (s, v) = post(&items, json!({"item": {"id": 2, "text": "fine"}}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(get_status(&format!("{url}/healthz")), 200);
    let mut r = agent().get(&sessions).call().expect("list");
    let listed: Value = r.body_mut().read_json().unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(ids, ["ok"], "no refused spawn left a session");
    stop(job);
}

/// The defaults hold without a configuration file: the request that took the process
/// down on main (a billion rounds) is refused.
#[test]
fn the_default_limits_refuse_a_billion_rounds() {
    let dir = TempDir::new("bounds-default");
    let mut job = Job::serve(&dir.0, &[]);
    let url = base(&mut job);
    refused(
        &format!("{url}/sessions"),
        json!({"id": "p", "kind": "sim", "config": {"rounds": 1_000_000_000u64}}),
        "1 to 1000",
    );
    stop(job);
}

/// S34a (issue 29): slowloris. Requests whose headers never finish are closed after
/// `[http] header_read_timeout`, and at most `[http] max_connections` connections are
/// served at once: one more is closed at once instead of taking a descriptor and a task.
/// Once the half-sent requests are gone, the server answers again.
#[test]
fn half_sent_requests_time_out_and_connections_are_bounded() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let dir = TempDir::new("slowloris");
    write_config(
        &dir.0,
        "[http]\nmax_connections = 8\nheader_read_timeout = \"1s\"\n",
    );
    let mut job = Job::serve(&dir.0, &[]);
    let url = base(&mut job);
    let addr = url.trim_start_matches("http://").to_string();
    let started = Instant::now();
    let mut held: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut c = TcpStream::connect(&addr).expect("connect");
            c.write_all(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .expect("half a request");
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // A ninth connection is closed at once, unanswered.
    let mut extra = TcpStream::connect(&addr).expect("connect");
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let mut buf = [0u8; 256];
    match extra.read(&mut buf) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!(
            "a connection over the bound was served: {}",
            String::from_utf8_lossy(&buf[..n])
        ),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "checked while the slow ones still held their connections"
    );
    // The half-sent requests are closed by the header timeout (hyper may answer 408
    // first): each reaches its end, none waits forever.
    for c in &mut held {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        match c.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) => assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "a half-sent request was kept open: {e}"
            ),
        }
        let text = String::from_utf8_lossy(&rest);
        assert!(!text.contains("200 OK"), "{text}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "closed after about the 1 s header timeout: {:?}",
        started.elapsed()
    );
    // Then the server answers again.
    assert_eq!(get_status(&format!("{url}/healthz")), 200);
    stop(job);
}

fn get_json(url: &str) -> Value {
    let mut r = agent().get(url).call().expect("GET");
    r.body_mut().read_json().unwrap_or(Value::Null)
}

/// Opens `GET path` on a raw socket and never reads it (a client that stopped reading,
/// `agentloop watch` under Ctrl+Z).
fn stalled_reader(addr: &str, path: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    write!(c, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("request");
    c
}

/// S20 (changed) and S34a (issue 29): an event stream whose client stops reading does
/// not hold the session back: its turns go on at full speed while the reader's socket
/// is full, the server closes that connection after `[http] write_timeout`, and a
/// SIGTERM with a stalled reader attached still shuts down at once (on main: the turn
/// index stood still for 38 s, the SIGTERM took 20.7 s).
#[test]
fn a_client_that_stops_reading_events_never_slows_the_session() {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let dir = TempDir::new("stalled-reader");
    write_config(&dir.0, "[http]\nwrite_timeout = \"1s\"\n");
    let mut job = Job::serve(&dir.0, &[]);
    let url = base(&mut job);
    let addr = url.trim_start_matches("http://").to_string();
    // 2 001 events a turn, no store, no latency: a stream fills any socket buffer.
    let (s, v) = post(
        &format!("{url}/sessions"),
        json!({"id": "chatty", "kind": "sim",
               "config": {"rounds": 1000, "model_ms": 0, "tool_ms": 0}}),
    );
    assert_eq!(s, 201, "{v}");
    let mut stalled = stalled_reader(&addr, "/sessions/chatty/events");
    let items = format!("{url}/sessions/chatty/items");
    let view = format!("{url}/sessions/chatty");
    let started = Instant::now();
    let mut pushed = 0u64;
    // Keep it busy for a while, well past the point where the reader's socket is full.
    while started.elapsed() < Duration::from_secs(4) {
        let (s, v) = post(&items, json!({"item": {"id": pushed, "text": "x"}}));
        assert_eq!(s, 200, "{v}");
        pushed += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    // The turns kept up with the pushes: nothing piled up behind a stalled turn.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = get_json(&view);
        let idle = v["run"]["phase"] == "idle" && v["run"]["buffered"] == 0;
        if idle {
            let turns = v["run"]["turn_index"].as_u64().unwrap_or(0);
            assert!(
                turns >= 20,
                "only {turns} turns ran for {pushed} pushes: {v}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the session stalled: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The stalled connection was closed by the server: reading it now reaches its end
    // (what the buffers held, then EOF or a reset) instead of a live stream.
    stalled
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let closed = loop {
        match stalled.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false
            }
            Err(_) => break true,
        }
    };
    assert!(
        closed,
        "the stalled stream was kept open after the write timeout"
    );
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{}",
        &text[..text.len().min(200)]
    );
    assert!(!text.contains("event: ended"), "the session did not end");
    assert!(
        got.len() > 100_000,
        "the stream had filled the socket before it was closed ({} bytes)",
        got.len()
    );
    // A SIGTERM with a stalled reader attached (and a busy session) is not held up.
    let _stalled_again = stalled_reader(&addr, "/sessions/chatty/events");
    for id in 0..20u64 {
        let (s, _) = post(&items, json!({"item": {"id": 10_000 + id, "text": "y"}}));
        assert_eq!(s, 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    stop(job);
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "the shutdown waited on a stalled reader: {:?}",
        t.elapsed()
    );
}

/// S34a (issue 29): a request body sent a byte at a time is refused with 408
/// `body_timeout` after `[http] body_read_timeout`, so slow bodies cannot hold the
/// request slots; the health probes answer meanwhile.
#[test]
fn a_slow_body_times_out() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let dir = TempDir::new("slow-body");
    write_config(
        &dir.0,
        "[http]\nbody_read_timeout = \"1s\"\nmax_requests = 4\n",
    );
    let mut job = Job::serve(&dir.0, &[]);
    let url = base(&mut job);
    let addr = url.trim_start_matches("http://").to_string();
    let body = br#"{"id": "slow", "kind": "sim"}"#;
    let mut slow: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(&addr).expect("connect");
            write!(
                c,
                "POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .unwrap();
            c.write_all(&body[..3]).unwrap();
            c
        })
        .collect();
    let started = Instant::now();
    // Every request slot is held by a slow body, the probes still answer.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(get_status(&format!("{url}/healthz")), 200);
    for c in &mut slow {
        // A byte now and then: still slower than the timeout allows in all.
        let _ = c.write_all(&body[3..4]);
    }
    for c in &mut slow {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = c.read(&mut buf).expect("an answer");
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("body_timeout"), "{text}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    // The slots are free again; nothing was spawned from a half body.
    let (s, v) = post(
        &format!("{url}/sessions"),
        json!({"id": "fast", "kind": "sim"}),
    );
    assert_eq!(s, 201, "{v}");
    let listed = get_json(&format!("{url}/sessions"));
    assert!(!listed.to_string().contains("\"slow\""), "{listed}");
    stop(job);
}

/// S34a (issue 29): the sessions a server runs and what each holds are bounded by
/// `[limits] sessions`, `session_items` (429 with `Retry-After`, nothing accepted);
/// `GET /sessions` answers a page at a time with a `Link` to the next; a body that does
/// not fit names the field and no Rust type.
#[test]
fn sessions_and_what_each_holds_are_bounded_and_listed_by_page() {
    let dir = TempDir::new("session-bounds");
    // A short grace: the minute-long turn is cut at the SIGTERM.
    write_config(
        &dir.0,
        "[limits]\nsessions = 3\nsession_items = 2\n[shutdown]\ngrace = \"1s\"\n",
    );
    let mut job = Job::serve(&dir.0, &[]);
    let url = base(&mut job);
    let sessions = format!("{url}/sessions");
    for id in ["a", "b"] {
        let (s, v) = post(&sessions, json!({"id": id, "kind": "sim"}));
        assert_eq!(s, 201, "{v}");
    }
    let (s, v) = post(
        &sessions,
        json!({"id": "slow", "kind": "sim", "config": {"rounds": 1, "model_ms": 60_000}}),
    );
    assert_eq!(s, 201, "{v}");
    // A fourth session: 429, Retry-After, nothing spawned.
    let mut r = agent()
        .post(&sessions)
        .send_json(json!({"id": "d", "kind": "sim"}))
        .expect("POST");
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().get("retry-after").is_some(), "Retry-After");
    let v: Value = r.body_mut().read_json().unwrap();
    assert_eq!(v["code"], "too_many_sessions", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("[limits] sessions"),
        "{v}"
    );
    // The slow session holds two items (one in its minute-long turn): a third is 429.
    let items = format!("{url}/sessions/slow/items");
    for id in 1..=2 {
        let (s, v) = post(&items, json!({"item": {"id": id, "text": "x"}}));
        assert_eq!(s, 200, "{v}");
    }
    let mut r = agent()
        .post(&items)
        .send_json(json!({"item": {"id": 3, "text": "x"}}))
        .expect("POST");
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().get("retry-after").is_some(), "Retry-After");
    let v: Value = r.body_mut().read_json().unwrap();
    assert_eq!(v["code"], "session_full", "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("session_items"),
        "{v}"
    );
    // Field-level messages, no Rust type names.
    let (s, v) = post(&items, json!({"item": "not an item"}));
    assert_eq!(s, 400, "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("expected an object"), "{message}");
    assert!(
        !message.contains("SimItem") && !message.contains("struct"),
        "{message}"
    );
    let (s, v) = post(&items, json!({"item": {"id": -1, "text": "x"}}));
    assert_eq!(s, 400, "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("id: "), "{message}");
    assert!(!message.contains("u64"), "{message}");
    // A page at a time.
    let mut r = agent()
        .get(&format!("{sessions}?limit=2"))
        .call()
        .expect("list");
    let link = r
        .headers()
        .get("link")
        .map(|v| v.to_str().unwrap().to_string())
        .expect("a Link to the next page");
    let page: Value = r.body_mut().read_json().unwrap();
    let ids: Vec<&str> = page
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(link, "</sessions?limit=2&after=b>; rel=\"next\"");
    let mut r = agent()
        .get(&format!("{sessions}?limit=2&after=b"))
        .call()
        .expect("list");
    assert!(r.headers().get("link").is_none(), "the last page");
    let page: Value = r.body_mut().read_json().unwrap();
    assert_eq!(page.as_array().unwrap().len(), 1, "{page}");
    assert_eq!(get_status(&format!("{sessions}?limit=0")), 400);
    stop(job);
}

/// S34a (issue 29): `[http] access_log = true` logs every answered request at INFO on
/// stderr through `tower_http::trace`: its method, path, status and latency, never its
/// query (which may carry `?access_token=`).
#[test]
fn the_access_log_names_each_request_and_never_its_query() {
    let dir = TempDir::new("access-log");
    write_config(&dir.0, "[http]\naccess_log = true\n");
    let log = dir.0.join("stderr.log");
    let mut job = Job::command(
        &dir.0,
        "serve",
        &["--listen", "127.0.0.1:0"],
        std::fs::File::create(&log).unwrap().into(),
    );
    let url = base(&mut job);
    assert_eq!(
        get_status(&format!(
            "{url}/no-such-route?access_token=sekrit-query-value"
        )),
        404
    );
    let (s, _) = post(
        &format!("{url}/sessions"),
        json!({"id": "logged", "kind": "sim"}),
    );
    assert_eq!(s, 201);
    stop(job);
    let text = std::fs::read_to_string(&log).unwrap();
    let line = |path: &str, status: &str| {
        text.lines().any(|l| {
            l.contains(&format!("path={path}"))
                && l.contains(&format!("status={status}"))
                && l.contains("latency=")
        })
    };
    assert!(line("/no-such-route", "404"), "{text}");
    assert!(line("/sessions", "201"), "{text}");
    assert!(text.contains("method=POST"), "{text}");
    assert!(
        !text.contains("sekrit-query-value"),
        "the query reached the log: {text}"
    );
}
