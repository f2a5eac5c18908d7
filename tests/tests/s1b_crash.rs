//! S1b (issue 32) under SIGKILL: a child process (`steps_child`) runs `sync` sessions
//! whose turns make five durable steps (three `Retry`, two `NoRetry`, a safe point
//! after the second) against a local HTTP service that counts its calls per
//! `Idempotency-Key`; the child is killed at random moments 200 times, each run resuming
//! what the last one left, and a last run drains every session.
//!
//! Checked against the service's counts and the child's lines:
//! * a finished step is replayed, never run again: once a `ran` or `replayed` line for a
//!   key is out, every later line for it is `replayed` with the same body, and the body
//!   (`charge <key> #<n>`) is the service's last answer for that key (`n` is its count);
//! * so a `Retry` key called more than once was never reported finished before its last
//!   call (the earlier calls were cut by a kill);
//! * a `NoRetry` key is called at most once; once it is `unknown` it never runs;
//! * every call the service counted is accounted for by a line by the end;
//! * S10: every acknowledged push is delivered by a completed turn by the end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::store::{Backend, Engine};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use parking_lot::Mutex;

use agentloop_tests::TempDir;

const KILLS: u64 = 200;
/// The child's sessions' lease timeout (`steps_child`): a dead run's lease is expired
/// after this.
const LEASE: Duration = Duration::from_millis(100);
/// The `NoRetry` steps of the child's turn (by name).
const NO_RETRY: [&str; 2] = ["reserve", "capture"];

type Calls = Arc<Mutex<HashMap<String, u32>>>;

/// The counting service: POST `/charge` with an `Idempotency-Key` counts a call for
/// that key and answers `charge <key> #<count>`. It runs on its own thread and runtime;
/// dropping it stops both.
struct Service {
    url: String,
    calls: Calls,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn charge(State(calls): State<Calls>, headers: HeaderMap) -> (StatusCode, String) {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key".into());
    };
    let mut c = calls.lock();
    let n = c.entry(key.to_string()).or_default();
    *n += 1;
    (StatusCode::OK, format!("charge {key} #{n}"))
}

impl Service {
    fn start() -> Self {
        let calls = Calls::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let app = Router::new()
            .route("/charge", post(charge))
            .with_state(calls.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the service's runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("a loopback port");
                addr_tx
                    .send(listener.local_addr().expect("its address"))
                    .expect("the test waits for the address");
                // Stopping drops the server and, with the runtime, every connection.
                tokio::select! {
                    r = axum::serve(listener, app) => r.expect("the service runs"),
                    _ = stopped => {}
                }
            });
        });
        let addr = addr_rx.recv().expect("the service's address");
        Service {
            url: format!("http://{addr}"),
            calls,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn counts(&self) -> HashMap<String, u32> {
        self.calls.lock().clone()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A child that is killed and reaped when dropped (a failing test leaves none behind).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One line of a child's output.
#[derive(Clone, Debug)]
enum Line {
    Push(u64),
    Turn(Vec<u64>),
    Ran(String, String),
    Replayed(String, String),
    Unknown(String),
    Ready,
    Drained,
    /// `mismatch`, `ended`, `refused`: the test fails on it.
    Wrong(String),
}

/// Reads the complete lines (a kill may cut the last one: it is dropped).
fn read_lines(out: impl std::io::Read) -> Vec<Line> {
    let mut reader = BufReader::new(out);
    let mut lines = Vec::new();
    let mut buf = String::new();
    loop {
        buf.clear();
        match reader.read_line(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) if !buf.ends_with('\n') => break,
            Ok(_) => {}
        }
        let line = buf.trim_end();
        let words: Vec<&str> = line.split(' ').collect();
        let parsed = match words.as_slice() {
            ["push", _, id] => Line::Push(id.parse().expect("push line")),
            ["turn", _, ids @ ..] => Line::Turn(
                ids.iter()
                    .filter(|w| !w.is_empty())
                    .map(|w| w.parse().expect("turn line"))
                    .collect(),
            ),
            ["step", "ran", key, body @ ..] => Line::Ran(key.to_string(), body.join(" ")),
            ["step", "replayed", key, body @ ..] => Line::Replayed(key.to_string(), body.join(" ")),
            ["step", "unknown", key] => Line::Unknown(key.to_string()),
            ["ready"] => Line::Ready,
            ["drained"] => Line::Drained,
            _ => Line::Wrong(line.to_string()),
        };
        lines.push(parsed);
    }
    lines
}

/// A small deterministic generator, so a failure is reproducible.
fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

/// What the lines said about one key, in order.
#[derive(Default, Debug)]
struct KeyLog {
    /// The body of the first `ran` or `replayed` line, and the run that printed it.
    finished: Option<(String, u64)>,
    ran: u32,
    replayed: u32,
    unknown: u32,
}

fn name_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// The call number in a body `charge <key> #<n>` for `key`; `None` if it is not one.
fn call_number(key: &str, body: &str) -> Option<u32> {
    body.strip_prefix(&format!("charge {key} #"))?.parse().ok()
}

#[test]
fn s1b_sigkill_at_random_moments_replays_finished_steps_and_never_reruns_no_retry() {
    let started = Instant::now();
    let dir = TempDir::new("s1b-crash");
    let bin = env!("CARGO_BIN_EXE_steps_child");
    let service = Service::start();
    let seed0 = 0x51b_c4a5_u64;
    eprintln!("S1b crash: seed {seed0:#x}, service at {}", service.url);
    let mut seed = seed0;
    // Every run's lines, in order (runs run one after another).
    let mut runs: Vec<Vec<Line>> = Vec::new();
    let mut readies = 0;
    for run in 0..KILLS {
        let mut child = Reaped(
            Command::new(bin)
                .arg(dir.path())
                .arg(run.to_string())
                .arg(&service.url)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start the child"),
        );
        let out = child.0.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || read_lines(out));
        // Kill at a random moment: 20–200 ms into the run (startup and resume included).
        std::thread::sleep(Duration::from_millis(20 + next(&mut seed) % 181));
        let exited = child.0.try_wait().expect("poll the child");
        assert!(
            exited.is_none(),
            "run {run}: the child ended on its own: {exited:?} (see its stderr)"
        );
        child.0.kill().expect("SIGKILL");
        let status = child.0.wait().expect("reap");
        assert_eq!(
            status.signal(),
            Some(9),
            "run {run}: the child must die by the signal"
        );
        let lines = reader.join().expect("reader");
        if lines.iter().any(|l| matches!(l, Line::Ready)) {
            readies += 1;
        }
        runs.push(lines);
        // Every record decodes after the kill (a kill before the first open leaves no
        // database yet).
        if Backend::detect(dir.path()).is_some() {
            let backend = Backend::open(dir.path(), Engine::SLED).expect("the data dir opens");
            for entry in backend.list(None).expect("list") {
                if let Err(e) = entry.record.and_then(|r| r.decode::<u64>()) {
                    panic!(
                        "run {run}: record {} does not decode: {e}",
                        entry.session_id
                    );
                }
            }
        }
        // Let the dead run's lease expire before the next run resumes its sessions.
        std::thread::sleep(LEASE + Duration::from_millis(20));
    }

    // A last run resumes every session and drains it.
    let out = Command::new(bin)
        .arg(dir.path())
        .arg(KILLS.to_string())
        .arg(&service.url)
        .arg("--drain")
        .stderr(Stdio::inherit())
        .output()
        .expect("run the drain");
    assert!(
        out.status.success(),
        "the drain run failed: {:?}",
        out.status
    );
    let last = read_lines(&out.stdout[..]);
    assert!(
        last.iter().any(|l| matches!(l, Line::Drained)),
        "the drain run did not finish"
    );
    runs.push(last);
    let counts = service.counts();
    drop(service);

    // The lines, run after run.
    let mut keys: BTreeMap<String, KeyLog> = BTreeMap::new();
    let mut pushed = BTreeSet::new();
    let mut delivered = BTreeSet::new();
    let mut problems: Vec<String> = Vec::new();
    for (run, lines) in runs.iter().enumerate() {
        let run = run as u64;
        for line in lines {
            match line {
                Line::Push(id) => {
                    pushed.insert(*id);
                }
                Line::Turn(ids) => delivered.extend(ids.iter().copied()),
                Line::Ran(key, body) | Line::Replayed(key, body) => {
                    let ran = matches!(line, Line::Ran(..));
                    let log = keys.entry(key.clone()).or_default();
                    if call_number(key, body).is_none() {
                        problems.push(format!("run {run}: {key}: not a service answer: {body:?}"));
                    }
                    match &log.finished {
                        Some((first, at)) if ran => problems.push(format!(
                            "run {run}: {key} ran again ({body:?}) after run {at} reported it \
                             finished ({first:?}): a finished step was not replayed"
                        )),
                        Some((first, at)) if first != body => problems.push(format!(
                            "run {run}: {key} replayed {body:?}, but run {at} had {first:?}"
                        )),
                        Some(_) => {}
                        None => {
                            if log.unknown > 0 {
                                problems.push(format!(
                                    "run {run}: {key} finished ({body:?}) after it was unknown"
                                ));
                            }
                            log.finished = Some((body.clone(), run));
                        }
                    }
                    if ran {
                        log.ran += 1;
                    } else {
                        log.replayed += 1;
                    }
                }
                Line::Unknown(key) => {
                    let log = keys.entry(key.clone()).or_default();
                    if !NO_RETRY.contains(&name_of(key)) {
                        problems.push(format!("run {run}: the Retry step {key} is unknown"));
                    }
                    if let Some((body, at)) = &log.finished {
                        problems.push(format!(
                            "run {run}: {key} is unknown after run {at} reported it finished \
                             ({body:?})"
                        ));
                    }
                    log.unknown += 1;
                }
                Line::Wrong(l) => problems.push(format!("run {run}: {l}")),
                Line::Ready | Line::Drained => {}
            }
        }
    }
    // Against the service's counts.
    for (key, &n) in &counts {
        let no_retry = NO_RETRY.contains(&name_of(key));
        if no_retry && n > 1 {
            problems.push(format!("the NoRetry step {key} was called {n} times"));
        }
        match keys.get(key) {
            None => problems.push(format!(
                "{key}: the service counted {n} call(s), but no line accounts for them"
            )),
            Some(KeyLog {
                finished: Some((body, at)),
                ..
            }) => {
                // The finished result is the last call: nothing ran after it.
                if call_number(key, body) != Some(n) {
                    problems.push(format!(
                        "{key}: reported finished by run {at} with {body:?}, but the service \
                         counted {n} call(s): it ran again after its result was journaled"
                    ));
                }
            }
            Some(_) => {} // unknown: checked above (NoRetry, at most one call)
        }
    }
    for (key, log) in &keys {
        if log.finished.is_some() && !counts.contains_key(key) {
            problems.push(format!("{key}: finished, but the service never saw it"));
        }
        if log.finished.is_none() && log.unknown == 0 {
            problems.push(format!("{key}: neither finished nor unknown"));
        }
    }
    // S10: every acknowledged push is delivered by a completed turn.
    let lost: Vec<u64> = pushed.difference(&delivered).copied().collect();
    if !lost.is_empty() {
        problems.push(format!(
            "{} acknowledged items were never delivered (first: {:?}); {} acked, {} delivered",
            lost.len(),
            &lost[..lost.len().min(10)],
            pushed.len(),
            delivered.len()
        ));
    }
    assert!(
        problems.is_empty(),
        "seed {seed0:#x}: {} problem(s):\n{}",
        problems.len(),
        problems[..problems.len().min(40)].join("\n")
    );

    // Nothing is left behind: the drain deleted every record.
    let backend = Backend::open(dir.path(), Engine::SLED).expect("open");
    assert!(backend.list(None).unwrap().is_empty());
    let ran: u32 = keys.values().map(|l| l.ran).sum();
    let replays: u32 = keys.values().map(|l| l.replayed).sum();
    let unknowns = keys.values().filter(|l| l.unknown > 0).count();
    let reruns = counts.values().filter(|&&n| n > 1).count();
    let calls: u32 = counts.values().sum();
    eprintln!(
        "S1b crash: {} runs ({readies} reached ready), {} keys, {calls} calls, {ran} ran, \
         {replays} replays, {unknowns} unknown, {reruns} Retry keys rerun, {} pushes all \
         delivered, in {:.1?}",
        KILLS + 1,
        keys.len(),
        pushed.len(),
        started.elapsed()
    );
    assert!(
        pushed.len() > 100 && keys.len() > 100 && replays > 0,
        "the runs did too little to test anything: {} pushes, {} keys, {replays} replays",
        pushed.len(),
        keys.len()
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "keep it under two minutes"
    );
}
