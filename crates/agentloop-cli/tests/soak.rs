//! S20 and S34a under attack, for a minute (issue 29): one `agentloop serve`, and at
//! once a subscriber that never reads (reconnecting whenever the server closes it), a
//! pusher that floods a session with 64 KiB items as fast as it can (ignoring 429), and
//! a slowloris client holding half-sent requests. Meanwhile a well-behaved client pushes
//! to its own session with idempotency keys. Its push latency keeps a p99 within 2× of
//! the same client's against the idle server (measured first, same pacing), the
//! server's resident memory stays under 512 MiB, and every push it had acknowledged is
//! delivered.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{agent, base, Job, TempDir};
use serde_json::{json, Value};

/// The soak's length.
const SOAK: Duration = Duration::from_secs(60);
/// The resident memory the server stays under.
const RSS_BOUND_KIB: u64 = 512 * 1024;

fn post(client: &ureq::Agent, url: &str, body: &Value, key: Option<&str>) -> u16 {
    let mut req = client.post(url);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    match req.send_json(body) {
        Ok(mut r) => {
            let _ = r.body_mut().read_to_string();
            r.status().as_u16()
        }
        Err(_) => 0,
    }
}

/// The server's resident memory, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The well-behaved client: `n` pushes to `session`, one every `pace`, each with its
/// own key, retried (same key) until it is acknowledged, over `client`'s kept-alive
/// connection (as every HTTP client library does: a client that reconnects for each
/// request waits in the listen queue behind whatever connects with it). Returns each push's latency
/// (first attempt to acknowledgement) and the acknowledged ids.
fn behave(
    client: &ureq::Agent,
    url: &str,
    session: &str,
    ids: std::ops::Range<u64>,
    pace: Duration,
) -> (Vec<Duration>, Vec<u64>) {
    let items = format!("{url}/sessions/{session}/items");
    let mut latencies = Vec::new();
    let mut acked = Vec::new();
    for id in ids {
        let body = json!({"item": {"id": id, "text": format!("well-behaved {id}")}});
        let key = format!("good-{id}");
        let start = Instant::now();
        loop {
            match post(client, &items, &body, Some(&key)) {
                200 => break,
                0 | 429 | 503 => std::thread::sleep(Duration::from_millis(5)),
                other => panic!("push {id}: {other}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "push {id} never acknowledged"
            );
        }
        latencies.push(start.elapsed());
        acked.push(id);
        std::thread::sleep(pace);
    }
    (latencies, acked)
}

/// Reads one HTTP/1.1 response (headers, then a `Content-Length` body); false when the
/// connection ended.
fn read_response(r: &mut impl std::io::BufRead) -> bool {
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0u8; length];
    std::io::Read::read_exact(r, &mut body).is_ok()
}

/// The CPU time a process has used so far (user + system), in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime are the
    // 12th and 13th of them.
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    fields.iter().sum()
}

fn p99(mut l: Vec<Duration>) -> Duration {
    l.sort();
    l[(l.len() * 99 / 100).min(l.len() - 1)]
}

fn delivered(log: &Path) -> BTreeSet<u64> {
    common::delivered(log).into_iter().collect()
}

#[test]
fn a_minute_under_attack_keeps_latency_memory_and_every_acknowledged_item() {
    let dir = TempDir::new("soak");
    std::fs::write(
        dir.0.join("agentloop.toml"),
        "[http]\nwrite_timeout = \"1s\"\nheader_read_timeout = \"2s\"\nbody_read_timeout = \"2s\"\nmax_connections = 512\n\
         [limits]\nsession_items = 100\nsession_bytes = 8388608\n",
    )
    .unwrap();
    let log = dir.0.join("turns.log");
    let log_arg = log.display().to_string();
    let mut job = Job::serve(&dir.0, &["--item-log", &log_arg]);
    let url = base(&mut job);
    let addr = url.trim_start_matches("http://").to_string();
    let pid = job.child.id();
    for (id, config) in [
        ("good", json!({"rounds": 1, "model_ms": 1, "tool_ms": 1})),
        // Slow turns: the flood piles up until the session's bound refuses it (spawned
        // as HTTP spawns by default: not persistent, so bounded by its item count).
        (
            "flood",
            json!({"rounds": 1, "model_ms": 500, "tool_ms": 500}),
        ),
    ] {
        let s = post(
            &agent(),
            &format!("{url}/sessions"),
            &json!({"id": id, "kind": "sim", "persistent": id == "good", "config": config}),
            None,
        );
        assert_eq!(s, 201, "spawn {id}");
    }
    let pace = Duration::from_millis(10);
    let good = agent();
    // The idle server first: the same client, the same pacing, for as long as the soak
    // (about as many pushes as the soak's, so both p99s are read off samples of one
    // size and one slow moment of the machine weighs the same in either).
    let (idle_cpu_before, idle_started) = (cpu_ticks(pid), Instant::now());
    let (mut idle, mut acked) = (Vec::new(), Vec::new());
    let mut next_id = 0;
    while idle_started.elapsed() < SOAK {
        let (l, a) = behave(&good, &url, "good", next_id..next_id + 100, pace);
        next_id += 100;
        idle.extend(l);
        acked.extend(a);
    }
    let idle_cpu = (cpu_ticks(pid) - idle_cpu_before) as f64 / idle_started.elapsed().as_secs_f64();
    let idle_p99 = p99(idle.clone());

    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    // A subscriber that never reads, on each session, reconnecting when closed.
    for session in ["good", "flood"] {
        let (stop, addr) = (stop.clone(), addr.clone());
        attackers.push(std::thread::spawn(move || {
            let mut opened = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut c) = TcpStream::connect(&addr) {
                    let _ = write!(
                        c,
                        "GET /sessions/{session}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                    );
                    opened += 1;
                    // Never read; wait until the server gives up on it (its writes stall).
                    let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                    let mut probe = [0u8; 1];
                    while !stop.load(Ordering::Relaxed) {
                        match c.peek(&mut probe) {
                            Ok(0) => break,
                            Ok(_) | Err(_) => std::thread::sleep(Duration::from_millis(500)),
                        }
                        if c.take_error().ok().flatten().is_some() {
                            break;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            opened
        }));
    }
    // A flooding pusher: 64 KiB items as fast as it can, ignoring 429, on one raw
    // keep-alive connection (an attacker's request is built once and costs it nothing
    // to send again: the load is the server's, not this test's HTTP client's).
    let flooded = Arc::new(AtomicU64::new(0));
    {
        let (stop, addr, flooded) = (stop.clone(), addr.clone(), flooded.clone());
        attackers.push(std::thread::spawn(move || {
            let body = json!({"item": {"id": 1, "text": "x".repeat(64 * 1024)}}).to_string();
            let request = format!(
                "POST /sessions/flood/items HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut c) = TcpStream::connect(&addr) else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let mut reader = std::io::BufReader::new(c.try_clone().unwrap());
                while !stop.load(Ordering::Relaxed) {
                    if c.write_all(request.as_bytes()).is_err() || !read_response(&mut reader) {
                        break;
                    }
                    flooded.fetch_add(1, Ordering::Relaxed);
                }
            }
            0
        }));
    }
    // Slowloris: up to 300 half-sent requests, reopened as the server closes them.
    {
        let (stop, addr) = (stop.clone(), addr.clone());
        attackers.push(std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                held.retain_mut(|c| c.write_all(b"X").is_ok());
                while held.len() < 300 {
                    match TcpStream::connect(&addr) {
                        Ok(mut c) => {
                            let _ = c.write_all(
                                b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
                            );
                            held.push(c);
                        }
                        Err(_) => break,
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            held.len() as u64
        }));
    }
    // The soak: the well-behaved client goes on, memory is sampled.
    let started = Instant::now();
    let cpu_before = cpu_ticks(pid);
    let mut loaded = Vec::new();
    let mut max_rss = 0;
    while started.elapsed() < SOAK {
        let (l, a) = behave(&good, &url, "good", next_id..next_id + 100, pace);
        next_id += 100;
        loaded.extend(l);
        acked.extend(a);
        max_rss = max_rss.max(rss_kib(pid));
    }
    let server_cpu = (cpu_ticks(pid) - cpu_before) as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.join();
    }
    let loaded_p99 = p99(loaded.clone());
    eprintln!(
        "soak: idle p99 {idle_p99:?} over {} pushes, loaded p99 {loaded_p99:?} over {} pushes; flood requests {}; max RSS {} MiB; server CPU {idle_cpu:.0}% idle, {server_cpu:.0}% loaded",
        idle.len(),
        loaded.len(),
        flooded.load(Ordering::Relaxed),
        max_rss / 1024
    );
    assert!(
        loaded_p99 <= idle_p99 * 2,
        "the well-behaved client's p99 went from {idle_p99:?} (idle) to {loaded_p99:?} under attack"
    );
    assert!(
        max_rss < RSS_BOUND_KIB,
        "the server reached {} MiB",
        max_rss / 1024
    );
    // Nothing acknowledged is lost: the session delivers every acknowledged item.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = delivered(&log);
        let missing: Vec<&u64> = acked.iter().filter(|id| !seen.contains(id)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "acknowledged but never delivered: {} items, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    job.signal(libc::SIGTERM);
    let (status, out) = job.finish();
    assert!(status.success(), "{out}");
}
