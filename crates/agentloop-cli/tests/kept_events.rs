//! Streams that survive restarts (S20a, issue 33): the real `agentloop serve`, stopped
//! with SIGTERM or SIGKILL and started again on the same address and store, followed
//! by real HTTP clients (SSE with `Last-Event-ID`) and by `agentloop watch`.
//!
//! What every test checks of what the clients saw: an id is never given to two
//! different events (a client that records every `(id, event)` pair, across both
//! processes), and a reconnecting client gets every event after its last id in order,
//! each once, with a `lagged { missed }` exactly where numbers are missing (events the
//! killed process gave but did not write, or numbers it reserved), never a silent gap.
//! A `lagged` across a SIGKILL says its count is an upper bound (`upper_bound: true`:
//! some of the numbers may never have been given), and the count stays near what the
//! killed process could have lost, far under its old 1024-number reservation block.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    agent, check_gap_free, check_gap_free_but, free_addr, open_events, record, Job, Sse, TempDir,
};
use serde_json::{json, Value};

/// Spawns a persistent session over HTTP (it keeps its events by default) with slow
/// turns (several events each).
fn spawn_session(url: &str, id: &str) {
    common::spawn(
        url,
        json!({"id": id, "kind": "sim", "persistent": true, "replay": 8,
               "config": {"rounds": 2, "model_ms": 15, "tool_ms": 15}}),
    );
}

/// Pushes item `id` until it is accepted (the server may be restarting).
fn push(url: &str, session: &str, id: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "push {id} not accepted in 60 s");
        let r = agent()
            .post(&format!("{url}/sessions/{session}/items"))
            .header("Idempotency-Key", &format!("k{id}"))
            .send_json(json!({"item": {"id": id, "text": format!("m{id}")}}));
        if let Ok(resp) = r {
            if resp.status().as_u16() == 200 {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Opens the event stream once the server answers it with a live stream (not
/// `not_live`), after `after`.
fn follow(url: &str, session: &str, after: Option<u64>) -> std::thread::JoinHandle<Vec<Sse>> {
    let events = format!("{url}/sessions/{session}/events");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "no live event stream in 60 s");
        // A probe first: a server not listening yet, or a session not live yet.
        let ok = agent()
            .get(&format!("{url}/sessions/{session}"))
            .call()
            .map(|r| r.status().as_u16() == 200)
            .unwrap_or(false);
        if ok {
            return open_events(&events, after);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(url: &str, session: &str) {
    let r = agent()
        .post(&format!("{url}/sessions/{session}/stop"))
        .send_json(json!({"mode": "drain"}))
        .expect("stop");
    assert_eq!(r.status().as_u16(), 202);
}

/// `agentloop ARGS...` in `dir`, to its end: success and stdout (stderr on failure).
fn agentloop(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the agentloop binary runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    match out.status.success() {
        true => (true, text),
        false => (
            false,
            format!("{text}\n{}", String::from_utf8_lossy(&out.stderr)),
        ),
    }
}

/// The keeper's slack for the events the actor numbers without waiting
/// (`events/keeper/mod.rs` `SLACK`).
const SLACK: u64 = 64;

/// The fewest numbers a keeper reserves ahead (`events/keeper/mod.rs` `MIN_BLOCK`).
const MIN_BLOCK: u64 = 2 * SLACK + 32;

/// The most numbers a killed process can leave between its last kept event and the
/// next process's first, for a session that gives at most `per_write` events between
/// two of the store's group commits: the block it reserves ahead at that pace
/// (`Keeper::block`: twice the slack and four times the pace, at least `MIN_BLOCK`).
fn reservation_bound(per_write: u64) -> u64 {
    (2 * SLACK + 4 * per_write).max(MIN_BLOCK)
}

/// The most events a turn gave in `events` (from a `turn_started` to its
/// `turn_ended`), and at least one.
fn most_per_turn(events: &[Sse]) -> u64 {
    let (mut most, mut n) = (1, 0);
    for e in events {
        match e.name.as_str() {
            "turn_started" => n = 1,
            "turn_ended" => {
                most = most.max(n + 1);
                n = 0;
            }
            _ => n += 1,
        }
    }
    most
}

/// Every `lagged` after a SIGKILL: an upper bound (the killed process's reserved
/// numbers may never have been given), and no more than the numbers it could have
/// reserved ahead of its last kept event at the session's pace: each turn's end is a
/// write (`sync`) and so are the pushes, so a group commit follows every turn; four
/// turns' events between two of them leaves room for a loaded machine.
fn check_lagged_after_kill(events: &[Sse], per_turn: u64) {
    let bound = reservation_bound(4 * per_turn);
    for e in events.iter().filter(|e| e.name == "lagged") {
        assert_eq!(
            e.data["upper_bound"],
            json!(true),
            "a lagged across a SIGKILL says it counts at most: {e:?}"
        );
        let missed = e.data["missed"].as_u64().expect("missed");
        assert!(
            missed <= bound,
            "a lagged across a SIGKILL counts at most the {bound} numbers the killed process \
             could have reserved ahead at this pace ({per_turn} events a turn), not a \
             whole reservation block: {e:?}"
        );
    }
}

fn serve(dir: &Path, addr: &str) -> Job {
    let mut job = Job::serve_at(dir, addr, &[]);
    job.wait_for("serving on http://");
    job
}

/// SIGKILLs in the middle of turns, three in a row, each followed by a restart: the
/// client reconnects each time with its last id and gets everything after it, with
/// `lagged` at exactly the numbers the killed process did not write; a client that
/// starts from 0 after the last restart gets every written event of all four processes
/// (the same event under each id the first clients saw: no number is ever given to two
/// events) and the new ones.
#[test]
fn a_stream_survives_a_sigkill_and_a_restart() {
    let dir = TempDir::new("kept-sigkill");
    let addr = free_addr();
    let url = format!("http://{addr}");
    let mut seen = BTreeMap::new();
    let mut last = 0;
    let mut ids = 1..;
    let mut given = 0;
    let mut per_turn = 1;
    for round in 0..3 {
        let job = serve(&dir.0, &addr);
        if last == 0 {
            spawn_session(&url, "k1");
        }
        let reader = follow(&url, "k1", Some(last));
        for _ in 0..6 {
            push(&url, "k1", ids.next().unwrap_or(0));
        }
        // Mid-turn: events are being given and written as the process dies.
        std::thread::sleep(Duration::from_millis(40));
        job.kill();
        let before = reader.join().expect("the reader");
        let missed = check_gap_free(last, &before);
        // After a SIGKILL the next process numbers after the reservation: what the
        // killed one reserved and did not write is reported, never skipped, and said
        // to be an upper bound, near what could have been lost.
        assert!(
            round == 0 || missed > 0,
            "a lagged after the kill: {before:?}"
        );
        per_turn = per_turn.max(most_per_turn(&before));
        if round > 0 {
            check_lagged_after_kill(&before, per_turn);
        }
        record(&mut seen, &before);
        given += before.len();
        last = before.iter().filter_map(|e| e.id).max().unwrap_or(last);
    }
    let before = given;

    let job = serve(&dir.0, &addr);
    let again = follow(&url, "k1", Some(last));
    let from_zero = follow(&url, "k1", Some(0));
    for _ in 0..4 {
        push(&url, "k1", ids.next().unwrap_or(0));
    }
    stop(&url, "k1");
    let after = again.join().expect("the reconnected reader");
    let all = from_zero.join().expect("the reader from 0");
    assert_eq!(
        after.last().map(|e| e.name.as_str()),
        Some("ended"),
        "{after:?}"
    );
    assert!(
        check_gap_free(last, &after) > 0,
        "a lagged after the kill: {after:?}"
    );
    check_lagged_after_kill(&after, per_turn.max(most_per_turn(&after)));
    check_gap_free(0, &all);
    // From 0, every gap a replay reports is one a SIGKILL left: each an upper bound.
    check_lagged_after_kill(&all, per_turn.max(most_per_turn(&all)));
    record(&mut seen, &after);
    record(&mut seen, &all);
    assert!(
        after.iter().filter(|e| e.name == "turn_started").count() >= 2,
        "the resumed session's turns: {after:?}"
    );
    // What the first client saw and the store kept agree: every event the reader
    // from 0 got under an id the first reader saw is that same event (checked by
    // `record`), and most of the first process's events were written.
    let kept_before = all
        .iter()
        .filter(|e| e.name != "lagged" && e.id.is_some_and(|i| i <= last))
        .count();
    assert!(
        kept_before * 2 >= before,
        "most of the killed processes' events were kept: {kept_before} of {before}"
    );
    let (status, out) = {
        job.signal(libc::SIGTERM);
        job.finish()
    };
    assert!(status.success(), "{out}");
}

/// SIGTERM and a restart: a client that comes back long after, from 0, gets every event
/// of both processes from the store, numbered on without a gap (the first process's
/// `Ended` for its shutdown is history, skipped), and no `lagged`; the replay buffer
/// holds only the last 8.
#[test]
fn a_stream_from_zero_after_a_graceful_restart_has_no_gap() {
    let dir = TempDir::new("kept-sigterm");
    let addr = free_addr();
    let url = format!("http://{addr}");
    let job = serve(&dir.0, &addr);
    spawn_session(&url, "k2");
    let first = follow(&url, "k2", None);
    for id in 1..=6 {
        push(&url, "k2", id);
    }
    job.signal(libc::SIGTERM);
    let before = first.join().expect("the first reader");
    let (status, out) = job.finish();
    assert!(status.success(), "{out}");
    assert_eq!(before.last().map(|e| e.name.as_str()), Some("ended"));
    let ended = before.last().and_then(|e| e.id).expect("ended's id");

    let job = serve(&dir.0, &addr);
    for id in 7..=10 {
        push(&url, "k2", id);
    }
    let all = follow(&url, "k2", Some(0));
    stop(&url, "k2");
    let all = all.join().expect("the reader from 0");
    assert_eq!(
        check_gap_free_but(0, &all, &[ended]),
        0,
        "nothing missed: {all:?}"
    );
    let ids: Vec<u64> = all.iter().filter_map(|e| e.id).collect();
    assert!(
        !ids.contains(&ended),
        "the shutdown's ended is skipped: {all:?}"
    );
    let mut seen = BTreeMap::new();
    record(&mut seen, &before);
    record(&mut seen, &all);
    assert_eq!(
        all.iter()
            .filter(|e| e.id.is_some_and(|i| i < ended))
            .count() as u64,
        ended - 1,
        "every event of the first process but its ended"
    );
    common::stop(job);
}

/// A session that ended answers a reconnect with its kept events and `ended` (it was a
/// 404), also after a restart; `agentloop sessions events` lists them offline, and
/// `agentloop sessions delete` removes them.
#[test]
fn an_ended_session_answers_a_reconnect_from_its_kept_events() {
    let dir = TempDir::new("kept-ended");
    let addr = free_addr();
    let url = format!("http://{addr}");
    let job = serve(&dir.0, &addr);
    spawn_session(&url, "k3");
    let live = follow(&url, "k3", None);
    for id in 1..=3 {
        push(&url, "k3", id);
    }
    stop(&url, "k3");
    let live = live.join().expect("the live reader");
    assert_eq!(live.last().map(|e| e.name.as_str()), Some("ended"));
    let third = live[2].id.expect("an id");
    let again = open_events(&format!("{url}/sessions/k3/events"), Some(third))
        .join()
        .unwrap();
    assert_eq!(again.as_slice(), &live[3..], "the rest, then ended");
    common::stop(job);

    let data = dir.0.join("data");
    let data = data.to_str().unwrap();
    let listed = agentloop(
        &dir.0,
        &["sessions", "events", "k3", "--json", "--data-dir", data],
    );
    assert!(listed.0, "{}", listed.1);
    let lines: Vec<Value> = listed
        .1
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(
        lines
            .iter()
            .map(|l| l["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        live.iter().filter_map(|e| e.id).collect::<Vec<_>>(),
        "every event kept, offline: {}",
        listed.1
    );
    assert!(lines.last().unwrap()["event"].get("Ended").is_some());

    // After a restart too.
    let job = serve(&dir.0, &addr);
    let again = open_events(&format!("{url}/sessions/k3/events"), Some(0))
        .join()
        .unwrap();
    assert_eq!(again, live, "all of it from the store");
    common::stop(job);
    let deleted = agentloop(&dir.0, &["sessions", "delete", "k3", "--data-dir", data]);
    assert!(deleted.0, "{}", deleted.1);
    let listed = agentloop(&dir.0, &["sessions", "events", "k3", "--data-dir", data]);
    assert!(listed.1.contains("keeps no events"), "{}", listed.1);
}

/// `agentloop watch` follows a session across a SIGTERM and a restart: its output is
/// every event, numbered on without a gap, the shutdown's `ended` and then the resumed
/// session's events, until the session's own `ended`.
#[test]
fn watch_follows_a_session_across_a_restart() {
    let dir = TempDir::new("kept-watch");
    let addr = free_addr();
    let url = format!("http://{addr}");
    let job = serve(&dir.0, &addr);
    spawn_session(&url, "k4");
    let watch = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["watch", "k4", "--server", &url])
        .current_dir(&dir.0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("agentloop watch starts");
    std::thread::sleep(Duration::from_millis(300));
    for id in 1..=3 {
        push(&url, "k4", id);
    }
    common::stop(job);
    let job = serve(&dir.0, &addr);
    for id in 4..=6 {
        push(&url, "k4", id);
    }
    stop(&url, "k4");
    let watched = watch.wait_with_output().expect("watch ends");
    let out = String::from_utf8_lossy(&watched.stdout).into_owned();
    assert!(
        watched.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&watched.stderr)
    );
    let ids: Vec<u64> = out
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(ids.len() > 10, "{out}");
    assert_eq!(
        ids,
        (ids[0]..ids[0] + ids.len() as u64).collect::<Vec<_>>(),
        "every event, numbered on: {out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.contains(" ended ")).count(),
        2,
        "the shutdown's ended, then the session's: {out}"
    );
    common::stop(job);
}
