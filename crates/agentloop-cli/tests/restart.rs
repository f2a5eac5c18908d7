//! A restarted server serves its sessions at once, and a reconnecting client loses
//! nothing (issue 28): the real `agentloop serve`, SIGKILLed or SIGTERMed and started
//! again at once on the same address and store (what systemd or Kubernetes do), driven
//! by a real HTTP client that retries its pushes (same `Idempotency-Key`) while the
//! server cannot be reached or answers `503 not_live`.
//!
//! - sled and fjall: the data directory is locked by one process, so the restarted
//!   server recovers the killed one's session before it listens; the first push is
//!   accepted within 2 s of the restart, every acknowledged item is delivered, and an
//!   item is delivered twice only when the killed process ran its turn but died before
//!   that turn's end was durable (the documented at-least-once window, docs/operations.md
//!   "Crash safety"), never otherwise.
//! - PostgreSQL, one runtime: the killed process's lease must run out; meanwhile pushes
//!   are answered `503 not_live` with `Retry-After` (also to `agentloop push`, which
//!   waits), and the recovery sweep takes the session within the lease and one sweep.
//! - An event stream that reconnects across a SIGTERM and a restart with its last id gets
//!   every event after it, without a gap or `lagged`: the resumed session kept its replay
//!   buffer.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{agent, free_addr, open_events, spawn_sim, stop, write_config, Job, TempDir};
use serde_json::{json, Value};

/// How one push went: when it was accepted and how many `503 not_live` it met first.
struct Pushed {
    accepted_at: Instant,
    not_live: u32,
}

/// Pushes item `id` to `session` with key `k<id>` until it is accepted: a connection
/// failure (the server is restarting) and `503 not_live` (with `Retry-After`) are
/// retried every 20 ms; anything else fails the test.
fn push_until_accepted(url: &str, session: &str, id: u64) -> Pushed {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut not_live = 0;
    loop {
        assert!(Instant::now() < deadline, "push {id} not accepted in 60 s");
        let r = agent()
            .post(&format!("{url}/sessions/{session}/items"))
            .header("Idempotency-Key", &format!("k{id}"))
            .send_json(json!({"item": {"id": id, "text": format!("m{id}")}}));
        match r {
            Err(_) => {} // not listening (yet)
            Ok(mut resp) => {
                let status = resp.status().as_u16();
                let retry = resp.headers().get("retry-after").cloned();
                let v: Value = resp.body_mut().read_json().unwrap_or(Value::Null);
                match status {
                    200 => {
                        return Pushed {
                            accepted_at: Instant::now(),
                            not_live,
                        }
                    }
                    503 if v["code"] == "not_live" => {
                        assert!(retry.is_some(), "not_live without Retry-After: {v}");
                        not_live += 1;
                    }
                    _ => panic!("push {id}: {status} {v}"),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_session(url: &str, id: &str) {
    spawn_sim(url, id, json!({"rounds": 1, "model_ms": 30, "tool_ms": 30}));
}

/// Waits (at most 60 s) until the turns in `logs` delivered every id in `ids`.
fn wait_delivered(logs: &[&Path], ids: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen: BTreeSet<u64> = logs
            .iter()
            .flat_map(|l| common::turn_lines(l))
            .flatten()
            .collect();
        let missing: Vec<u64> = ids.iter().copied().filter(|i| !seen.contains(i)).collect();
        if missing.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "never delivered: {missing:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every acknowledged item delivered; none delivered twice by one process; and an item
/// delivered by both the killed and the restarted process only when it belongs to the
/// killed process's last turns, from the first such turn on (those whose ends had not
/// reached the store: once one turn's end was not durable, no later one's was).
fn check_deliveries(killed: &Path, restarted: &Path, acked: &[u64]) {
    let (before, after) = (common::turn_lines(killed), common::turn_lines(restarted));
    let mut count: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
    for id in before.iter().flatten() {
        count.entry(*id).or_default().0 += 1;
    }
    for id in after.iter().flatten() {
        count.entry(*id).or_default().1 += 1;
    }
    for id in acked {
        assert!(
            count.contains_key(id),
            "acknowledged item {id} was never delivered"
        );
    }
    for (id, (b, a)) in &count {
        assert!(
            *b <= 1 && *a <= 1,
            "item {id} delivered twice by one process"
        );
        assert!(
            acked.contains(id),
            "item {id} delivered but never acknowledged"
        );
    }
    let twice: BTreeSet<u64> = count
        .iter()
        .filter(|(_, (b, a))| *b == 1 && *a == 1)
        .map(|(id, _)| *id)
        .collect();
    if let Some(first) = before
        .iter()
        .position(|t| t.iter().any(|i| twice.contains(i)))
    {
        let tail: BTreeSet<u64> = before[first..].iter().flatten().copied().collect();
        assert_eq!(
            twice, tail,
            "only the killed process's last turns (ends not yet durable) run again"
        );
    }
}

/// `agentloop serve` at `addr` on the store `store` names (engine flags, or
/// `--postgres URL`), logging delivered items to `log`.
fn serve(dir: &Path, addr: &str, store: &[String], log: &Path) -> Job {
    let mut args: Vec<&str> = store.iter().map(String::as_str).collect();
    let log = log.display().to_string();
    args.extend(["--item-log", &log]);
    Job::serve_at(dir, addr, &args)
}

/// The run that will be killed: a server on `store`, session `session` spawned over HTTP
/// and items `1..=n` pushed, each acknowledged; then SIGKILL. Returns the acknowledged
/// ids.
fn run_then_sigkill(
    dir: &Path,
    addr: &str,
    store: &[String],
    log: &Path,
    session: &str,
    n: u64,
) -> Vec<u64> {
    let url = format!("http://{addr}");
    let mut job = serve(dir, addr, store, log);
    job.wait_for("serving on http://");
    spawn_session(&url, session);
    let mut acked = Vec::new();
    for id in 1..=n {
        push_until_accepted(&url, session, id);
        acked.push(id);
    }
    // Slow turns: some items still wait in the session when it dies.
    job.kill();
    acked
}

fn sigkill_and_restart_at_once(tag: &str, engine: &[&str]) {
    let dir = TempDir::new(tag);
    let addr = free_addr();
    let url = format!("http://{addr}");
    let (log1, log2) = (dir.0.join("turns-1.log"), dir.0.join("turns-2.log"));
    let store: Vec<String> = engine.iter().map(|s| s.to_string()).collect();
    let mut acked = run_then_sigkill(&dir.0, &addr, &store, &log1, "s1", 40);
    let restarted = Instant::now();
    let mut job = serve(&dir.0, &addr, &store, &log2);
    // Pushes go on at once: refused connections are retried until the new process
    // listens, and by then it runs the session again.
    let first = push_until_accepted(&url, "s1", 41);
    acked.push(41);
    let took = first.accepted_at - restarted;
    assert!(
        took <= Duration::from_secs(2),
        "the first push after the restart was accepted {took:?} after it"
    );
    let line = job.wait_for("agentloop: resumed");
    assert!(
        line.contains("resumed 1 session") && line.contains("1 recovered"),
        "recovered at start, not left for its lease: {line}"
    );
    for id in 42..=60 {
        push_until_accepted(&url, "s1", id);
        acked.push(id);
    }
    // Retries, with their keys, of pushes the killed process acknowledged (its
    // in-memory idempotency cache died with it): the session's record kept the keys
    // with the items, so each is answered `duplicate` and delivers nothing (S34a; on
    // main the retry delivered the item a second time).
    for id in 36..=40 {
        let mut r = agent()
            .post(&format!("{url}/sessions/s1/items"))
            .header("Idempotency-Key", &format!("k{id}"))
            .send_json(json!({"item": {"id": id, "text": format!("m{id}")}}))
            .expect("a retry");
        let status = r.status().as_u16();
        let v: Value = r.body_mut().read_json().unwrap_or(Value::Null);
        assert_eq!(
            (status, v["preempt"]["kind"].as_str()),
            (200, Some("duplicate")),
            "retry of k{id}: {v}"
        );
        // The same key with another item is refused.
        let mut r = agent()
            .post(&format!("{url}/sessions/s1/items"))
            .header("Idempotency-Key", &format!("k{id}"))
            .send_json(json!({"item": {"id": 1000 + id, "text": "other"}}))
            .expect("a reuse");
        let status = r.status().as_u16();
        let v: Value = r.body_mut().read_json().unwrap_or(Value::Null);
        assert_eq!(
            (status, v["code"].as_str()),
            (409, Some("idempotency_mismatch")),
            "{v}"
        );
    }
    wait_delivered(&[&log1, &log2], &acked);
    let out = stop(job);
    assert!(!out.contains("not resumed"), "{out}");
    check_deliveries(&log1, &log2, &acked);
}

#[test]
fn sled_sigkill_and_an_immediate_restart_serve_the_session_at_once() {
    sigkill_and_restart_at_once("restart-sled", &[]);
}

#[test]
fn fjall_sigkill_and_an_immediate_restart_serve_the_session_at_once() {
    sigkill_and_restart_at_once("restart-fjall", &["--engine", "fjall"]);
}

/// On a shared store a restarted (new) instance cannot know the old one is gone: it
/// waits out the lease, answering `503 not_live` meanwhile, and its recovery sweep takes
/// the session within the lease and one sweep, without another restart.
#[test]
fn postgres_one_runtime_recovers_after_the_lease_and_answers_not_live_meanwhile() {
    use agentloop_postgres::local_server::LocalServer;
    const HEARTBEAT: Duration = Duration::from_millis(200);
    const LEASE: Duration = Duration::from_secs(3);
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("restart").expect("a database");
    let dir = TempDir::new("restart-pg");
    write_config(
        &dir.0,
        "[supervisor]\nheartbeat = \"200ms\"\nlease_timeout = \"3s\"\n",
    );
    let addr = free_addr();
    let url = format!("http://{addr}");
    let (log1, log2) = (dir.0.join("turns-1.log"), dir.0.join("turns-2.log"));
    // The test server runs with fsync = off: it gives durability crash only (S15b).
    let store = vec![
        "--postgres".to_string(),
        db.clone(),
        "--durability".into(),
        "crash".into(),
    ];
    let mut acked = run_then_sigkill(&dir.0, &addr, &store, &log1, "s3", 20);
    let killed = Instant::now();
    let mut job = serve(&dir.0, &addr, &store, &log2);
    let line = job.wait_for("agentloop: not resumed");
    assert!(
        line.contains("s3") && line.contains("lease expires in"),
        "{line}"
    );
    job.wait_for("serving on http://");
    // `agentloop watch` follows the session through it: told not_live, it waits as the
    // stream's `retry:` says and follows the recovered session, also across the server's
    // shutdown below (it waits for the server to come back, S20a).
    let mut watch = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["watch", "s3", "--server", &url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("agentloop watch runs");
    // `agentloop push` waits on not_live (Retry-After) with its own key...
    let cli = {
        let url = url.clone();
        std::thread::spawn(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
                .args(["push", "s3", r#"{"id": 22, "text": "by the CLI"}"#])
                .args(["--server", &url])
                .output()
                .expect("agentloop push runs")
        })
    };
    // ...and a client polling fast sees when the session is live again.
    let first = push_until_accepted(&url, "s3", 21);
    acked.push(21);
    assert!(first.not_live > 0, "answered not_live while the lease ran");
    let took = first.accepted_at - killed;
    assert!(
        took <= LEASE + HEARTBEAT + Duration::from_secs(1),
        "accepted {took:?} after the kill: more than the lease and one sweep"
    );
    let out = cli.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "agentloop push: {err}");
    assert!(err.contains("not_live"), "it waited on not_live: {err}");
    acked.push(22);
    for id in 23..=30 {
        push_until_accepted(&url, "s3", id);
        acked.push(id);
    }
    wait_delivered(&[&log1, &log2], &acked);
    stop(job);
    check_deliveries(&log1, &log2, &acked);
    // The server is gone for good: watch still waits for it (its `ended` said
    // `shutdown`), until it is stopped.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        watch.try_wait().expect("watch").is_none(),
        "watch keeps following a session whose server shut down"
    );
    let _ = watch.kill();
    let watched = watch.wait_with_output().expect("watch's output");
    let (said, err) = (
        String::from_utf8_lossy(&watched.stdout),
        String::from_utf8_lossy(&watched.stderr),
    );
    assert!(err.contains("not live yet"), "it waited: {err}");
    assert!(
        err.contains("following s3 after it restarts"),
        "it waits for the restart: {err}"
    );
    assert!(
        said.contains(" turn_started ")
            && said.lines().last().is_some_and(|l| l.contains(" ended ")),
        "it followed the recovered session to the shutdown: {said}"
    );
}

/// An EventSource-like client follows a session through a graceful SIGTERM (its stream
/// ends with `ended`) and reconnects to the restarted server with its last id: it gets
/// every event after that id, numbered on without a gap, and no `lagged`, although the
/// resumed session ran turns before the client came back (its replay buffer, 256 for a
/// session spawned over HTTP, was kept in the record).
#[test]
fn an_event_stream_reconnecting_across_sigterm_and_a_restart_misses_nothing() {
    let dir = TempDir::new("restart-sse");
    let addr = free_addr();
    let url = format!("http://{addr}");
    let log = dir.0.join("turns.log");
    let args = ["--item-log", log.to_str().unwrap()];
    let mut job = Job::serve_at(&dir.0, &addr, &args);
    job.wait_for("serving on http://");
    spawn_session(&url, "s2");
    let events = format!("{url}/sessions/s2/events");
    let first = open_events(&events, None);
    for id in 1..=10 {
        push_until_accepted(&url, "s2", id);
    }
    job.signal(libc::SIGTERM);
    let seen = first.join().expect("the reader");
    let (status, out) = job.finish();
    assert!(status.success(), "{out}");
    let ended = seen.last().expect("events");
    assert_eq!(ended.name, "ended", "{seen:?}");
    let last = ended.id.expect("an id");
    let ids: Vec<u64> = seen.iter().filter_map(|e| e.id).collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "in order, `ended` last: {ids:?}"
    );

    // The restart resumes it; it runs its saved items and new ones before the client
    // reconnects.
    let mut job = Job::serve_at(&dir.0, &addr, &args);
    job.wait_for("serving on http://");
    for id in 11..=15 {
        push_until_accepted(&url, "s2", id);
    }
    wait_delivered(&[&log], &(1..=15).collect::<Vec<_>>());
    let again = open_events(&events, Some(last));
    let mut r = agent()
        .post(&format!("{url}/sessions/s2/stop"))
        .send_json(json!({"mode": "drain"}))
        .expect("stop");
    assert_eq!(
        r.status().as_u16(),
        202,
        "{:?}",
        r.body_mut().read_to_string()
    );
    let rest = again.join().expect("the reader");
    assert!(
        !rest.iter().any(|e| e.name == "lagged"),
        "nothing lost: {rest:?}"
    );
    let ids: Vec<u64> = rest.iter().filter_map(|e| e.id).collect();
    let want: Vec<u64> = (last + 1..=last + ids.len() as u64).collect();
    assert_eq!(ids, want, "every event after {last}, in order: {rest:?}");
    assert!(
        rest.iter().filter(|e| e.name == "turn_started").count() >= 2,
        "the resumed session's turns: {rest:?}"
    );
    assert_eq!(rest.last().map(|e| e.name.as_str()), Some("ended"));
    stop(job);
}
