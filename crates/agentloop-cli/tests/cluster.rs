//! Three nodes, one PostgreSQL (issue 18, S36–S38): `agentloop serve --node nX
//! --postgres URL` three times, 30 persistent sessions spread over them, clients
//! pushing to whichever node runs each session, node n0 SIGKILLed mid-turn. Its
//! sessions are adopted by the survivors after its lease (3 s by default) and go on.
//! The S10 audit over the three item logs: every acknowledged push is delivered by a
//! completed turn, and an item delivered twice was delivered by the killed node in a
//! turn whose end was not yet durable (docs/operations.md, "Crash safety").

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop_postgres::local_server::LocalServer;
use common::{agent, base, delivered, open_events, spawn_sim, stop, wait_for, Job, TempDir};
use parking_lot::Mutex;
use serde_json::{json, Value};

const SESSIONS: usize = 30;
const NODES: usize = 3;
const CLIENTS: u64 = 4;

enum Push {
    Accepted,
    /// Not this node's session (404), or draining (503): not accepted, send elsewhere.
    NotHere,
    /// No answer: the node may or may not have taken it.
    Unknown,
}

fn push(url: &str, session: &str, id: u64) -> Push {
    match agent()
        .post(&format!("{url}/sessions/{session}/items"))
        .send_json(json!({"item": {"id": id, "text": "cluster"}}))
    {
        Ok(r) if r.status().is_success() => Push::Accepted,
        Ok(r) if matches!(r.status().as_u16(), 404 | 503 | 409) => Push::NotHere,
        Ok(mut r) => panic!(
            "unexpected {}: {}",
            r.status(),
            r.body_mut().read_to_string().unwrap_or_default()
        ),
        // Refused before anything was sent: the node is down; not accepted.
        Err(ureq::Error::ConnectionFailed) => Push::NotHere,
        Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Push::NotHere
        }
        Err(_) => Push::Unknown,
    }
}

fn live_sessions(url: &str) -> Option<Vec<String>> {
    let mut r = agent().get(&format!("{url}/sessions")).call().ok()?;
    let rows: Value = r.body_mut().read_json().ok()?;
    Some(
        rows.as_array()?
            .iter()
            .filter(|r| r["live"] == true)
            .filter_map(|r| r["id"].as_str().map(str::to_string))
            .collect(),
    )
}

/// Clients pushing under load: each push goes to the node its session was spawned on,
/// then to the others on 404 (not there) or a refused connection (node down).
struct Load {
    acked: Arc<Mutex<HashSet<u64>>>,
    unknown: Arc<Mutex<HashSet<u64>>>,
    done: Arc<AtomicBool>,
    clients: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(urls: Arc<Mutex<Vec<String>>>) -> Load {
        let acked: Arc<Mutex<HashSet<u64>>> = Arc::default();
        let unknown: Arc<Mutex<HashSet<u64>>> = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let clients = (0..CLIENTS)
            .map(|c| {
                let (urls, acked, unknown, done) =
                    (urls.clone(), acked.clone(), unknown.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut i = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        let id = c * 1_000_000_000 + i;
                        let s = (id % SESSIONS as u64) as usize;
                        let session = format!("s{s}");
                        'item: loop {
                            if done.load(Ordering::Relaxed) {
                                return;
                            }
                            let nodes = urls.lock().clone();
                            for k in 0..nodes.len() {
                                match push(&nodes[(s + k) % nodes.len()], &session, id) {
                                    Push::Accepted => {
                                        acked.lock().insert(id);
                                        break 'item;
                                    }
                                    Push::Unknown => {
                                        unknown.lock().insert(id);
                                        break 'item;
                                    }
                                    Push::NotHere => {}
                                }
                            }
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        Load {
            acked,
            unknown,
            done,
            clients,
        }
    }

    fn join(self) {
        self.done.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().expect("a client");
        }
    }
}

/// Drains every session on `nodes` and waits until none is live.
fn drain(nodes: &[String]) {
    for url in nodes {
        for id in live_sessions(url).expect("a node answers") {
            let r = agent()
                .post(&format!("{url}/sessions/{id}/stop"))
                .send_json(json!({"mode": "drain"}))
                .expect("stop");
            assert_eq!(r.status().as_u16(), 202);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while nodes
        .iter()
        .any(|u| !live_sessions(u).unwrap_or_default().is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "sessions still live after the drain"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The S10 audit over the nodes' item logs: panics if an acknowledged push was never
/// delivered; returns how many items were delivered, those delivered twice, and those
/// node `killed` delivered.
fn audit(
    logs: &[std::path::PathBuf],
    killed: Option<usize>,
    acked: &HashSet<u64>,
) -> (usize, Vec<u64>, HashSet<u64>) {
    let mut delivered: HashMap<u64, u32> = HashMap::new();
    let mut by_killed: HashSet<u64> = HashSet::new();
    for (n, log) in logs.iter().enumerate() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.starts_with("turn")) {
            for id in line.split_whitespace().skip(1) {
                let id: u64 = id.parse().expect("an id");
                *delivered.entry(id).or_default() += 1;
                if Some(n) == killed {
                    by_killed.insert(id);
                }
            }
        }
    }
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
    let twice = delivered
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect();
    (delivered.len(), twice, by_killed)
}

fn start_node(dir: &std::path::Path, db: &str, n: usize, log: &std::path::Path) -> (Job, String) {
    start_node_with(dir, db, n, log, &[])
}

/// Node `n`'s directory (created) and its `serve` flags: PostgreSQL `db`, its name,
/// its item log `log`, then `extra`.
fn node_args(
    dir: &std::path::Path,
    db: &str,
    n: usize,
    log: &std::path::Path,
    extra: &[&str],
) -> (std::path::PathBuf, Vec<String>) {
    let node_dir = dir.join(format!("n{n}"));
    std::fs::create_dir_all(&node_dir).unwrap();
    let name = format!("n{n}");
    let args = [
        &[
            "--postgres",
            db,
            // The test server runs with fsync = off: it gives crash only (S15b).
            "--durability",
            "crash",
            "--node",
            &name,
            "--item-log",
            log.to_str().unwrap(),
        ][..],
        extra,
    ]
    .concat()
    .into_iter()
    .map(str::to_string)
    .collect();
    (node_dir, args)
}

/// [`start_node`] with more flags and its log (stderr) written to `stderr`.
fn start_node_logged(
    dir: &std::path::Path,
    db: &str,
    n: usize,
    log: &std::path::Path,
    extra: &[&str],
    stderr: &std::path::Path,
) -> (Job, String) {
    let (node_dir, args) = node_args(dir, db, n, log, extra);
    let args: Vec<&str> = ["--listen", "127.0.0.1:0"]
        .into_iter()
        .chain(args.iter().map(String::as_str))
        .collect();
    let file = std::fs::File::create(stderr).expect("a log file");
    let mut job = Job::command(&node_dir, "serve", &args, file.into());
    let url = base(&mut job);
    (job, url)
}

/// [`start_node`] with more flags.
fn start_node_with(
    dir: &std::path::Path,
    db: &str,
    n: usize,
    log: &std::path::Path,
    extra: &[&str],
) -> (Job, String) {
    let (node_dir, args) = node_args(dir, db, n, log, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut job = Job::serve(&node_dir, &args);
    let url = base(&mut job);
    (job, url)
}

#[test]
fn a_killed_nodes_sessions_continue_on_the_survivors_and_nothing_is_lost() {
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("cluster").expect("a database");
    let dir = TempDir::new("cluster");
    let logs: Vec<_> = (0..NODES)
        .map(|n| dir.0.join(format!("n{n}.log")))
        .collect();
    let start = |n: usize| start_node(&dir.0, &db, n, &logs[n]);
    let mut jobs = Vec::new();
    let mut urls = Vec::new();
    for n in 0..NODES {
        let (job, url) = start(n);
        jobs.push(Some(job));
        urls.push(url);
    }
    for s in 0..SESSIONS {
        spawn_sim(
            &urls[s % NODES],
            &format!("s{s}"),
            json!({"rounds": 1, "model_ms": 15, "tool_ms": 15}),
        );
    }

    let urls = Arc::new(Mutex::new(urls));
    let load = Load::start(urls.clone());
    let (acked, unknown, done) = (load.acked.clone(), load.unknown.clone(), load.done.clone());
    std::thread::sleep(Duration::from_secs(3));
    let before = acked.lock().len();
    assert!(before > 0, "no push acknowledged before the kill");
    let killed = jobs[0].take().unwrap();
    let killed_at = Instant::now();
    let _ = killed.kill();
    // The survivors adopt n0's sessions: every session is live on n1 or n2 again.
    let adopted = loop {
        let live: HashSet<String> = (1..NODES)
            .filter_map(|n| live_sessions(&urls.lock()[n]))
            .flatten()
            .collect();
        if live.len() == SESSIONS {
            break killed_at.elapsed();
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "{} of {SESSIONS} sessions live on the survivors",
            live.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(3));
    done.store(true, Ordering::Relaxed);
    load.join();
    let after = acked.lock().len();
    assert!(after > before, "no push acknowledged after the failover");

    // Drain every session where it lives, then stop the survivors.
    let survivors: Vec<String> = urls.lock()[1..].to_vec();
    drain(&survivors);
    for job in jobs.iter_mut().skip(1) {
        let job = job.take().unwrap();
        stop(job);
    }

    let (delivered, twice, by_killed) = audit(&logs, Some(0), &acked.lock());
    for id in &twice {
        assert!(
            by_killed.contains(id),
            "item {id} delivered twice, but not by the killed node's unfinished turn"
        );
    }
    let acked = acked.lock();
    eprintln!(
        "cluster failover: {} pushes acknowledged ({before} before the SIGKILL), {} delivered, \
         {} twice (turns of the killed node whose end was not durable), {} unanswered; \
         all {SESSIONS} sessions live on the survivors {:.2} s after the kill",
        acked.len(),
        delivered,
        twice.len(),
        unknown.lock().len(),
        adopted.as_secs_f64()
    );
}

/// S37 over processes: a node SIGSTOPped past its lease loses its sessions to the
/// other node; SIGCONTed, its sessions' writes are refused (fenced) and they stop; the
/// records stay the adopter's, which goes on running them.
#[test]
fn a_node_stopped_past_its_lease_is_fenced_when_it_continues() {
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("fencing").expect("a database");
    let dir = TempDir::new("fencing");
    let start = |n: usize| {
        let node_dir = dir.0.join(format!("n{n}"));
        std::fs::create_dir_all(&node_dir).unwrap();
        let name = format!("n{n}");
        let mut job = Job::serve(
            &node_dir,
            &["--postgres", &db, "--durability", "crash", "--node", &name],
        );
        let url = base(&mut job);
        (job, url)
    };
    let (paused, url0) = start(0);
    let (survivor, url1) = start(1);
    let ids: Vec<String> = (0..6).map(|s| format!("f{s}")).collect();
    for id in &ids {
        spawn_sim(
            &url0,
            id,
            json!({"rounds": 1, "model_ms": 300, "tool_ms": 300}),
        );
        let r = agent()
            .post(&format!("{url0}/sessions/{id}/items"))
            .send_json(json!({"item": {"id": 1, "text": "before the pause"}}))
            .expect("push");
        assert!(r.status().is_success());
    }
    // Mid-turn, n0 is stopped for longer than its lease (3 s).
    std::thread::sleep(Duration::from_millis(200));
    paused.signal(libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = live_sessions(&url1).unwrap_or_default();
        if ids.iter().all(|id| live.contains(id)) {
            break;
        }
        assert!(Instant::now() < deadline, "n1 adopted only {live:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    paused.signal(libc::SIGCONT);
    // n0's sessions write when their turn ends: fenced, they stop.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = live_sessions(&url0).expect("n0 answers again");
        if live.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "n0 still runs {live:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every record is n1's, at a later epoch than n0 held; n1 still runs them all.
    let mut r = agent()
        .get(&format!("{url1}/sessions"))
        .call()
        .expect("list");
    let rows: Value = r.body_mut().read_json().unwrap();
    for id in &ids {
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id.as_str())
            .unwrap_or_else(|| panic!("{id} listed on n1: {rows}"));
        assert_eq!(row["live"], true, "{row}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(["sessions", "list", "--postgres", &db, "--json"])
        .output()
        .expect("sessions list --postgres");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for id in &ids {
        let rec = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["session_id"] == id.as_str() || r["id"] == id.as_str())
            .unwrap_or_else(|| panic!("{id} in the store: {listed}"));
        assert_eq!(
            rec["owner"], "n1",
            "nothing n0 did reached the record: {rec}"
        );
    }
    // Pushes to n0 for those sessions are refused now, naming the node that runs them
    // (n0 is not joined to n1, so it cannot forward); n1 takes them.
    let mut r = agent()
        .post(&format!("{url0}/sessions/f0/items"))
        .send_json(json!({"item": {"id": 2, "text": "to the fenced node"}}))
        .expect("push");
    assert_eq!(r.status().as_u16(), 409);
    let v: Value = r.body_mut().read_json().unwrap();
    assert_eq!(v["code"], "wrong_state", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .contains("runs on node `n1`"),
        "{v}"
    );
    let r = agent()
        .post(&format!("{url1}/sessions/f0/items"))
        .send_json(json!({"item": {"id": 2, "text": "to the owner"}}))
        .expect("push");
    assert!(r.status().is_success());
    for job in [paused, survivor] {
        stop(job);
    }
}

/// A rolling restart under load: each of three nodes in turn gets SIGTERM (its
/// sessions are saved `Interrupted`) and starts again under its name, which resumes
/// them (or a survivor adopted them meanwhile). Nothing acknowledged is lost and,
/// since no node dies, nothing is delivered twice.
#[test]
fn a_rolling_restart_of_three_nodes_under_load_loses_nothing() {
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("rolling").expect("a database");
    let dir = TempDir::new("rolling");
    let logs: Vec<_> = (0..NODES)
        .map(|n| dir.0.join(format!("n{n}.log")))
        .collect();
    let mut jobs = Vec::new();
    let mut urls = Vec::new();
    for (n, log) in logs.iter().enumerate() {
        let (job, url) = start_node(&dir.0, &db, n, log);
        jobs.push(Some(job));
        urls.push(url);
    }
    for s in 0..SESSIONS {
        spawn_sim(
            &urls[s % NODES],
            &format!("s{s}"),
            json!({"rounds": 1, "model_ms": 15, "tool_ms": 15}),
        );
    }
    let urls = Arc::new(Mutex::new(urls));
    let load = Load::start(urls.clone());
    let acked = load.acked.clone();
    std::thread::sleep(Duration::from_secs(2));
    let mut last = acked.lock().len();
    for n in 0..NODES {
        let old = jobs[n].take().expect("a running node");
        old.signal(libc::SIGTERM);
        let (status, out) = old.finish();
        assert!(status.success(), "n{n}: {out}");
        let (job, url) = start_node(&dir.0, &db, n, &logs[n]);
        jobs[n] = Some(job);
        urls.lock()[n] = url;
        std::thread::sleep(Duration::from_secs(2));
        let now = acked.lock().len();
        assert!(now > last, "no push acknowledged after restarting n{n}");
        last = now;
    }
    load.join();
    let all: Vec<String> = urls.lock().clone();
    drain(&all);
    for job in jobs.into_iter().flatten() {
        stop(job);
    }
    let acked = acked.lock();
    let (delivered, twice, _) = audit(&logs, None, &acked);
    assert!(
        twice.is_empty(),
        "delivered twice without a crash: {twice:?}"
    );
    eprintln!(
        "rolling restart: {} pushes acknowledged, {delivered} delivered, none twice",
        acked.len()
    );
}

/// A node joined on ractor_cluster: `serve --postgres DB --node nN --cluster-listen
/// 127.0.0.1:ports[n] --cookie … [--join 127.0.0.1:JOIN] --item-log LOG`.
fn start_joined(
    dir: &std::path::Path,
    db: &str,
    n: usize,
    ports: &[u16],
    join: Option<u16>,
    log: &std::path::Path,
    extra: &[&str],
) -> (Job, String) {
    let node_dir = dir.join(format!("n{n}"));
    std::fs::create_dir_all(&node_dir).unwrap();
    let mut args = vec![
        "--postgres".to_string(),
        db.to_string(),
        "--durability".into(),
        "crash".into(),
        "--node".into(),
        format!("n{n}"),
        "--cluster-listen".into(),
        format!("127.0.0.1:{}", ports[n]),
        "--cookie".into(),
        "test-cookie-s3cr3t-m4rk3r".into(),
        "--item-log".into(),
        log.to_str().unwrap().to_string(),
    ];
    if let Some(p) = join {
        args.extend(["--join".to_string(), format!("127.0.0.1:{p}")]);
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut job = Job::serve(&node_dir, &args);
    let url = base(&mut job);
    (job, url)
}

/// Two nodes joined on ractor_cluster over one PostgreSQL started for the test: n0,
/// and n1 joining it. The server and directory live as long as the pair.
struct JoinedPair {
    n0: Job,
    url0: String,
    n1: Job,
    url1: String,
    logs: Vec<std::path::PathBuf>,
    _dir: TempDir,
    _pg: LocalServer,
}

impl JoinedPair {
    fn start(tag: &str) -> JoinedPair {
        let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
        let db = pg.database(tag).expect("a database");
        let dir = TempDir::new(tag);
        let logs: Vec<_> = (0..2).map(|n| dir.0.join(format!("n{n}.log"))).collect();
        let ports = [free_port(), free_port()];
        let (n0, url0) = start_joined(&dir.0, &db, 0, &ports, None, &logs[0], &[]);
        let (n1, url1) = start_joined(&dir.0, &db, 1, &ports, Some(ports[0]), &logs[1], &[]);
        JoinedPair {
            n0,
            url0,
            n1,
            url1,
            logs,
            _dir: dir,
            _pg: pg,
        }
    }
}

/// Spawns a persistent session of the simulated agent on the node at `url`.
/// Waits (at most 30 s) until a push to `session` through `url` is accepted: the node
/// reaches the session's owner (the nodes joined).
fn wait_joined(url: &str, session: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent()
        .post(&format!("{url}/sessions/{session}/items"))
        .send_json(json!({"item": {"id": 1, "text": "joined?"}}))
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
        != 200
    {
        assert!(Instant::now() < deadline, "the nodes never joined");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// S36: nodes joined on ractor_cluster (address and cookie): a push sent to a node that
/// does not run the session reaches its owner, in order, with a preempt as data; the
/// owner delivers it. Without a joined owner the push is refused with a clear error.
#[test]
fn a_push_to_any_node_reaches_the_sessions_owner() {
    let pair = JoinedPair::start("forward");
    let (n0, url0, n1, url1, logs) = (pair.n0, pair.url0, pair.n1, pair.url1, &pair.logs);
    spawn_sim(
        &url0,
        "far",
        json!({"rounds": 1, "model_ms": 1, "tool_ms": 1}),
    );
    // Until the nodes have joined, n1 cannot reach the owner (404, or 502 once the
    // record names n0).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut first = 0;
    loop {
        let mut r = agent()
            .post(&format!("{url1}/sessions/far/items"))
            .send_json(json!({"item": {"id": 1, "text": "via n1"}}))
            .expect("push");
        match r.status().as_u16() {
            200 => break,
            // Not joined yet: no node to ask (the session has no record naming n0 yet).
            404 => first += 1,
            502 => {
                let body: Value = r.body_mut().read_json().unwrap();
                assert_eq!(body["error"]["code"], "owner_unreachable", "{body}");
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("node `n0`"),
                    "{body}"
                );
                first += 1;
            }
            other => panic!("{other}: {}", r.body_mut().read_to_string().unwrap()),
        }
        assert!(Instant::now() < deadline, "n1 never reached n0");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The session's events, read at its owner and through n1 (relayed from n0).
    let at_n0 = open_events(&format!("{url0}/sessions/far/events"), None);
    let via_n1 = open_events(&format!("{url1}/sessions/far/events"), None);
    // Then every push through n1 reaches n0, in order; one carries a preempt.
    for id in 2..=20u64 {
        let body = if id == 10 {
            json!({"item": {"id": id, "text": "via n1"}, "preempt": {"at": "any"}})
        } else {
            json!({"item": {"id": id, "text": "via n1"}})
        };
        let r = agent()
            .post(&format!("{url1}/sessions/far/items"))
            .send_json(body)
            .expect("push");
        assert_eq!(r.status().as_u16(), 200, "push {id}");
    }
    // A reconnect through n1 with `Last-Event-ID` replays from n0's buffer.
    let late_via_n1 = open_events(&format!("{url1}/sessions/far/events"), Some(3));
    // A session nobody runs is unknown everywhere.
    let r = agent()
        .get(&format!("{url1}/sessions/nobody/events"))
        .call()
        .expect("events");
    assert_eq!(r.status().as_u16(), 404);
    let r = agent()
        .post(&format!("{url1}/sessions/nobody/items"))
        .send_json(json!({"item": {"id": 99, "text": "x"}}))
        .expect("push");
    assert_eq!(r.status().as_u16(), 404);
    // A stop sent to n1 reaches the owner (S11 across nodes): a slow session on n0,
    // stopped at once through n1.
    spawn_sim(
        &url0,
        "slow",
        json!({"rounds": 1, "model_ms": 60000, "tool_ms": 1}),
    );
    let r = agent()
        .post(&format!("{url0}/sessions/slow/items"))
        .send_json(json!({"item": {"id": 500, "text": "a long turn"}}))
        .expect("push");
    assert_eq!(r.status().as_u16(), 200);
    let mut r = agent()
        .post(&format!("{url1}/sessions/slow/stop"))
        .send_json(json!({"mode": "immediate"}))
        .expect("stop");
    assert_eq!(
        r.status().as_u16(),
        202,
        "{}",
        r.body_mut().read_to_string().unwrap()
    );
    // A detach sent to n1 reaches the owner too (S23): the session finishes its work in
    // the background and ends by itself.
    let mut r = agent()
        .post(&format!("{url1}/sessions/far/detach"))
        .send_json(json!({}))
        .expect("detach");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.body_mut().read_to_string().unwrap()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !live_sessions(&url0).unwrap_or_default().is_empty() {
        assert!(
            Instant::now() < deadline,
            "n0 still runs {:?}",
            live_sessions(&url0)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // S36, S20: the stream through n1 is the owner's: same numbers, names and data,
    // `ended` last; the reconnect got everything after number 3.
    let (at_n0, via_n1, late) = (
        at_n0.join().expect("n0's stream"),
        via_n1.join().expect("n1's stream"),
        late_via_n1.join().expect("the reconnect"),
    );
    assert_eq!(
        at_n0.last().map(|e| e.name.as_str()),
        Some("ended"),
        "{at_n0:?}"
    );
    // Both streams opened before items 2..=20 were pushed (turn 0 may have been on
    // its way): from n1's first event on, the two are the same.
    let from = via_n1
        .first()
        .and_then(|e| e.id)
        .expect("events through n1");
    let owner_since: Vec<_> = at_n0
        .iter()
        .filter(|e| e.id.is_some_and(|n| n >= from))
        .cloned()
        .collect();
    assert_eq!(via_n1, owner_since, "relayed as sent");
    // Items 2..=20 were pushed after the streams opened: the turns that took them
    // (several may share a turn, as items that wait together do) are all in the
    // relayed stream, each with its end.
    let taken: u64 = via_n1
        .iter()
        .filter(|e| e.name == "turn_started")
        .filter_map(|e| e.data["items"].as_u64())
        .sum();
    assert!(
        taken >= 19,
        "every item pushed after the streams opened was taken in a turn seen through n1: {via_n1:?}"
    );
    assert!(
        via_n1.iter().filter(|e| e.name == "turn_ended").count()
            >= via_n1.iter().filter(|e| e.name == "turn_started").count(),
        "every turn seen starting is seen ending: {via_n1:?}"
    );
    // The reconnect starts right after 3, gap-free, and from where n0's own stream
    // began (it may have opened after event 4) it is the same as that stream.
    let late_ids: Vec<u64> = late.iter().filter_map(|e| e.id).collect();
    assert_eq!(late_ids.len(), late.len(), "every event numbered");
    assert_eq!(late_ids.first(), Some(&4), "{late_ids:?}");
    assert!(
        late_ids.windows(2).all(|w| w[1] == w[0] + 1),
        "gap-free: {late_ids:?}"
    );
    let n0_from = at_n0.first().and_then(|e| e.id).unwrap_or(0).max(4);
    let since = |v: &[common::Sse]| -> Vec<common::Sse> {
        v.iter()
            .filter(|e| e.id.is_some_and(|n| n >= n0_from))
            .cloned()
            .collect()
    };
    assert_eq!(since(&late), since(&at_n0), "replayed after 3, then live");
    for job in [n0, n1] {
        stop(job);
    }
    let mut seen = delivered(&logs[0]);
    let order = seen.clone();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (1..=20).collect::<Vec<_>>(),
        "each forwarded item delivered once by n0"
    );
    assert_eq!(order, seen, "in the order they were pushed");
    assert!(
        delivered(&logs[1]).is_empty(),
        "n1 delivered nothing itself"
    );
    eprintln!(
        "forwarding: 20 pushes through n1 delivered by n0 in order ({first} refused before the join); {} events relayed to n1",
        via_n1.len()
    );
}

/// S38 over processes: a planned move of a busy session (a safe point every 10 ms)
/// from n0 to n1 through `POST /sessions/{id}/move`, while a client keeps pushing to
/// n0: the turn ends at a safe point, n1 resumes the session, and every push is
/// delivered once, in the order it was sent (n0's turns, then n1's).
#[test]
fn a_planned_move_over_http_delivers_every_push_once_in_order() {
    let pair = JoinedPair::start("moving");
    let (n0, url0, n1, url1, logs) = (pair.n0, pair.url0, pair.n1, pair.url1, &pair.logs);
    spawn_sim(
        &url0,
        "busy",
        json!({"rounds": 5, "model_ms": 10, "tool_ms": 10}),
    );
    // Wait until n1 reaches n0 (a push through n1 is forwarded): the nodes joined.
    wait_joined(&url1, "busy");
    let pusher = {
        let url0 = url0.clone();
        std::thread::spawn(move || {
            for id in 2..=150u64 {
                let r = agent()
                    .post(&format!("{url0}/sessions/busy/items"))
                    .send_json(json!({"item": {"id": id, "text": "to n0"}}))
                    .expect("push");
                assert_eq!(r.status().as_u16(), 200, "push {id}");
                std::thread::sleep(Duration::from_millis(4));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(250));
    let mut r = agent()
        .post(&format!("{url0}/sessions/busy/move"))
        .send_json(json!({"to": "n1", "timeout": "2s"}))
        .expect("move");
    let moved: Value = r.body_mut().read_json().unwrap();
    assert_eq!(moved["to"], "n1", "{moved}");
    pusher.join().expect("every push acknowledged");
    assert!(
        live_sessions(&url0).unwrap().is_empty(),
        "n0 runs nothing now"
    );
    assert_eq!(live_sessions(&url1).unwrap(), vec!["busy".to_string()]);
    drain(std::slice::from_ref(&url1));
    for job in [n0, n1] {
        stop(job);
    }
    let (before, after) = (delivered(&logs[0]), delivered(&logs[1]));
    assert!(
        !before.is_empty() && !after.is_empty(),
        "turns on both nodes"
    );
    let all: Vec<u64> = before.iter().chain(&after).copied().collect();
    assert_eq!(
        all,
        (1..=150).collect::<Vec<_>>(),
        "once each, in push order"
    );
    eprintln!(
        "planned move: {} items delivered on n0, {} on n1, in order; move took {} ms ({} ms to the safe point)",
        before.len(),
        after.len(),
        moved["total_ms"],
        moved["stopped_ms"]
    );
}

/// S38 over processes, `serve --rebalance`: n0 runs eight sessions alone; n1 joins;
/// once membership has settled, n0 moves the sessions placement now gives n1 to it
/// (each at a safe point) and keeps the rest; pushes sent to n0 afterwards reach each
/// session where it runs, and each is delivered once, by that node.
#[test]
fn a_node_that_joins_receives_the_sessions_placement_gives_it() {
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("rebalance").expect("a database");
    let dir = TempDir::new("rebalance");
    let logs: Vec<_> = (0..2).map(|n| dir.0.join(format!("n{n}.log"))).collect();
    let ports = [free_port(), free_port()];
    let (n0, url0) = start_joined(&dir.0, &db, 0, &ports, None, &logs[0], &["--rebalance"]);
    let ids: Vec<String> = (0..8).map(|i| format!("rb{i}")).collect();
    // Each session has a record (a session with nothing stored is not moved: it would
    // not be resumed after a restart either).
    for (i, id) in ids.iter().enumerate() {
        spawn_sim(&url0, id, json!({"rounds": 1, "model_ms": 1, "tool_ms": 1}));
        let r = agent()
            .post(&format!("{url0}/sessions/{id}/items"))
            .send_json(json!({"item": {"id": i, "text": "before the join"}}))
            .expect("push");
        assert_eq!(r.status().as_u16(), 200, "push to {id}");
    }
    let mut to_n1: Vec<String> = ids
        .iter()
        .filter(|s| agentloop::cluster::placement::owner_of(&["n0", "n1"], s) == Some("n1"))
        .cloned()
        .collect();
    to_n1.sort();
    assert!(!to_n1.is_empty() && to_n1.len() < ids.len(), "{to_n1:?}");
    let (n1, url1) = start_joined(
        &dir.0,
        &db,
        1,
        &ports,
        Some(ports[0]),
        &logs[1],
        &["--rebalance"],
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    loop {
        let mut on_n1 = live_sessions(&url1).unwrap_or_default();
        on_n1.sort();
        if on_n1 == to_n1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "n1 runs {on_n1:?}, expected {to_n1:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = started.elapsed();
    assert_eq!(
        live_sessions(&url0).unwrap().len(),
        ids.len() - to_n1.len(),
        "n0 keeps the rest"
    );
    for (i, id) in ids.iter().enumerate() {
        let r = agent()
            .post(&format!("{url0}/sessions/{id}/items"))
            .send_json(json!({"item": {"id": 100 + i, "text": "after the join"}}))
            .expect("push");
        assert_eq!(r.status().as_u16(), 200, "push to {id}");
    }
    drain(&[url0.clone(), url1.clone()]);
    for job in [n0, n1] {
        stop(job);
    }
    let (mut on0, mut on1) = (delivered(&logs[0]), delivered(&logs[1]));
    on0.sort_unstable();
    on1.sort_unstable();
    let want1: Vec<u64> = ids
        .iter()
        .enumerate()
        .filter(|(_, id)| to_n1.contains(id))
        .map(|(i, _)| 100 + i as u64)
        .collect();
    let want0: Vec<u64> = (0..ids.len() as u64)
        .chain(100..100 + ids.len() as u64)
        .filter(|i| !want1.contains(i))
        .collect();
    assert_eq!(on1, want1, "n1 delivered the moved sessions' items, once");
    assert_eq!(on0, want0, "n0 delivered the others', once");
    eprintln!(
        "rebalance: {} of {} sessions moved to n1 {:.1} s after it started",
        to_n1.len(),
        ids.len(),
        took.as_secs_f64()
    );
}

/// Opens session `id`'s event stream at `url` after `after` once the node answers it
/// with a live stream (a moved or adopted session may not be live anywhere for a
/// moment): retried until a stream whose first event is not `not_live` comes.
fn follow_events(url: &str, id: &str, after: u64) -> Vec<common::Sse> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "no live stream of {id} at {url} in 60 s"
        );
        if let Some(reader) =
            common::try_open_events(&format!("{url}/sessions/{id}/events"), Some(after))
        {
            let seen = reader.join().expect("the reader");
            if seen.first().is_none_or(|e| e.name != "not_live") {
                return seen;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// S20a on the PostgreSQL cluster: a client follows a session through the *other*
/// node (its stream relayed from the owner) across a planned move and a failover (the
/// new owner SIGKILLed, the session adopted by the survivor after its lease), each
/// time reconnecting with its last id to a node that does not run the session: it
/// sees every event after its id, in order, each once, a `lagged` exactly where the
/// killed owner's events were lost, and no id ever names two different events.
#[test]
fn a_stream_follows_a_session_across_a_move_and_a_failover_via_another_node() {
    let pair = JoinedPair::start("kept-cluster");
    let (n0, url0, n1, url1) = (pair.n0, pair.url0, pair.n1, pair.url1);
    spawn_sim(
        &url0,
        "fol",
        json!({"rounds": 2, "model_ms": 10, "tool_ms": 10}),
    );
    wait_joined(&url1, "fol");
    let push_any = |id: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut said = String::new();
        loop {
            if Instant::now() > deadline {
                let view = agent()
                    .get(&format!("{url0}/sessions/fol"))
                    .call()
                    .map(|mut r| r.body_mut().read_to_string().unwrap_or_default())
                    .unwrap_or_default();
                panic!("push {id} not accepted: {said}; n0 shows {view}");
            }
            for url in [&url0, &url1] {
                // No idempotency key: this test counts events, not deliveries.
                let r = agent()
                    .post(&format!("{url}/sessions/fol/items"))
                    .send_json(json!({"item": {"id": id, "text": "follow"}}));
                match r {
                    Ok(r) if r.status().as_u16() == 200 => return,
                    Ok(mut r) => {
                        said = format!(
                            "{url}: {} {}",
                            r.status(),
                            r.body_mut().read_to_string().unwrap_or_default()
                        )
                    }
                    Err(e) if said.is_empty() => said = format!("{url}: {e}"),
                    Err(_) => {}
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut seen = std::collections::BTreeMap::new();
    let mut ends = Vec::new();
    // 1. Followed through n1 while n0 runs it; then moved to n1 (the relayed stream
    //    ends with n0's `ended`).
    let first = common::try_open_events(&format!("{url1}/sessions/fol/events"), Some(0))
        .expect("a stream relayed by n1");
    for id in 2..=5 {
        push_any(id);
    }
    let mut r = agent()
        .post(&format!("{url0}/sessions/fol/move"))
        .send_json(json!({"to": "n1", "timeout": "5s"}))
        .expect("move");
    let moved: Value = r.body_mut().read_json().unwrap();
    assert_eq!(moved["to"], "n1", "{moved}");
    let before = first.join().expect("the first reader");
    common::check_gap_free(0, &before);
    common::record(&mut seen, &before);
    let mut last = before.iter().filter_map(|e| e.id).max().expect("events");
    ends.extend(
        before
            .iter()
            .filter(|e| e.name == "ended")
            .filter_map(|e| e.id),
    );

    // 2. Reconnected through n0 (relayed from n1, which resumed it): pushes, then n1
    //    is SIGKILLed mid-turn; the relayed stream closes.
    let second = {
        let url0 = url0.clone();
        std::thread::spawn(move || follow_events(&url0, "fol", last))
    };
    for id in 6..=12 {
        push_any(id);
    }
    std::thread::sleep(Duration::from_millis(30));
    n1.kill();
    let mid = second.join().expect("the second reader");
    common::check_gap_free_but(last, &mid, &ends);
    common::record(&mut seen, &mid);
    last = mid.iter().filter_map(|e| e.id).max().unwrap_or(last);
    ends.extend(
        mid.iter()
            .filter(|e| e.name == "ended")
            .filter_map(|e| e.id),
    );

    // 3. n0 adopts it after n1's lease; the client reconnects to n0 and follows it to
    //    its end.
    let third = {
        let url0 = url0.clone();
        std::thread::spawn(move || follow_events(&url0, "fol", last))
    };
    for id in 13..=15 {
        push_any(id);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the stop was never accepted");
        let code = agent()
            .post(&format!("{url0}/sessions/fol/stop"))
            .send_json(json!({"mode": "drain"}))
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        if code == 202 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let rest = third.join().expect("the third reader");
    assert_eq!(
        rest.last().map(|e| e.name.as_str()),
        Some("ended"),
        "{rest:?}"
    );
    common::check_gap_free_but(last, &rest, &ends);
    common::record(&mut seen, &rest);
    assert!(
        rest.iter().any(|e| e.name == "turn_started"),
        "the adopted session's turns: {rest:?}"
    );
    stop(n0);
    eprintln!(
        "followed across a move and a failover: {} events seen, {} numbers reported missed",
        seen.len(),
        before
            .iter()
            .chain(&mid)
            .chain(&rest)
            .filter(|e| e.name == "lagged")
            .map(|e| e.data["missed"].as_u64().unwrap_or(0))
            .sum::<u64>()
    );
}

/// The state `GET /sessions` on `url` lists for session `id` (`live`, `sleeping`,
/// `stored`), if it lists it.
fn state_of(url: &str, id: &str) -> Option<String> {
    let mut r = agent().get(&format!("{url}/sessions")).call().ok()?;
    let rows: Value = r.body_mut().read_json().ok()?;
    rows.as_array()?
        .iter()
        .find(|r| r["id"] == id)
        .and_then(|r| r["state"].as_str().map(str::to_string))
}

/// How many sessions the node at `url` holds asleep (`/metrics`).
fn sleeping_here(url: &str) -> Option<u64> {
    let mut r = agent().get(&format!("{url}/metrics")).call().ok()?;
    let text = r.body_mut().read_to_string().ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("agentloop_sessions{status=\"sleeping\"} "))
        .and_then(|v| v.trim().parse().ok())
}

/// S39 in a cluster (two nodes joined over one PostgreSQL, `--idle-after 1s`): a push
/// sent to the other node wakes a sleeping session on its owner; when the owner is
/// SIGKILLed, its sleeping sessions are adopted asleep by the survivor (claimed, no
/// actor: `sleeping` there); a timer armed on the survivor and one armed on the dead
/// node both fire once after the failover, on the survivor, and wake their sessions.
#[test]
fn sleeping_sessions_wake_on_their_owner_and_timers_fire_once_across_a_failover() {
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("sleepers").expect("a database");
    let dir = TempDir::new("cluster-sleep");
    let logs: Vec<_> = (0..2).map(|n| dir.0.join(format!("n{n}.log"))).collect();
    let ports = [free_port(), free_port()];
    let idle = ["--idle-after", "1s"];
    let (n0, url0) = start_joined(&dir.0, &db, 0, &ports, None, &logs[0], &idle);
    let (n1, url1) = start_joined(&dir.0, &db, 1, &ports, Some(ports[0]), &logs[1], &idle);
    let config = json!({"rounds": 1, "model_ms": 1, "tool_ms": 1});
    spawn_sim(&url0, "a", config.clone());
    spawn_sim(&url0, "b", config);
    wait_for("a asleep on n0", 30, || {
        state_of(&url0, "a").as_deref() == Some("sleeping")
    });

    // A push through n1 wakes it where it lives: on n0.
    wait_for("the push through n1 accepted", 30, || {
        matches!(push(&url1, "a", 2), Push::Accepted)
    });
    wait_for("delivered on n0", 30, || delivered(&logs[0]).contains(&2));
    assert!(!delivered(&logs[1]).contains(&2), "woken on its owner only");
    wait_for("a and b asleep on n0", 30, || {
        state_of(&url0, "a").as_deref() == Some("sleeping")
            && state_of(&url0, "b").as_deref() == Some("sleeping")
    });

    // Timers: one armed through n1 (for b), one through n0 (for a), due after the kill.
    for (url, id, item) in [(&url1, "b", 77), (&url0, "a", 88)] {
        let r = agent()
            .post(&format!("{url}/sessions/{id}/timers"))
            .send_json(json!({"item": {"id": item, "text": "later"}, "in": "8s"}))
            .expect("armed");
        assert_eq!(r.status().as_u16(), 201);
    }
    let _ = n0.kill();
    let killed_at = Instant::now();
    // Adopted after n0's lease (3 s), before the timers are due (8 s): asleep on n1.
    wait_for("n0's sleeping sessions adopted asleep by n1", 30, || {
        let d = delivered(&logs[1]);
        assert!(
            !d.contains(&77) && !d.contains(&88),
            "a timer fired before the adoption was seen"
        );
        state_of(&url1, "a").as_deref() == Some("sleeping")
            && state_of(&url1, "b").as_deref() == Some("sleeping")
            && live_sessions(&url1).is_some_and(|l| l.is_empty())
            && sleeping_here(&url1) == Some(2)
    });
    wait_for("both timers fired on n1", 60, || {
        let d = delivered(&logs[1]);
        d.contains(&77) && d.contains(&88)
    });
    assert!(
        killed_at.elapsed() >= Duration::from_secs(5),
        "not before their time"
    );
    std::thread::sleep(Duration::from_secs(3));
    let all: Vec<u64> = logs.iter().flat_map(|l| delivered(l)).collect();
    for item in [77, 88] {
        assert_eq!(
            all.iter().filter(|i| **i == item).count(),
            1,
            "timer item {item} delivered once: {all:?}"
        );
    }
    for id in ["a", "b"] {
        let mut r = agent()
            .get(&format!("{url1}/sessions/{id}/timers"))
            .call()
            .expect("listed");
        let v: Value = r.body_mut().read_json().expect("json");
        assert_eq!(v["timers"], json!([]), "{id}: {v}");
    }
    stop(n1);
}

/// S40, a rolling deploy of two nodes on one PostgreSQL: both run version 1 of kind
/// `sim`; n1 is redeployed with versions 1 and 2 (its sessions stay on version 1, new
/// ones run 2); then n1 is SIGKILLed. n0, which runs version 1 only, adopts n1's
/// version-1 sessions and none of its version-2 ones, which wait for a node that runs
/// them: n1, restarted, resumes them. No version-2 session ever runs on n0.
#[test]
fn a_rolling_deploy_moves_nothing_a_node_cannot_run() {
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("versions").expect("a database");
    let dir = TempDir::new("cluster-versions");
    let logs: Vec<_> = (0..2).map(|n| dir.0.join(format!("n{n}.log"))).collect();
    let v1 = ["--sim-versions", "1"];
    let both = ["--sim-versions", "1,2"];
    // n0's log: it must never even try to start a session it cannot run.
    let n0_log = dir.0.join("n0.stderr");
    let (n0, url0) = start_node_logged(&dir.0, &db, 0, &logs[0], &v1, &n0_log);
    let (n1, url1) = start_node_with(&dir.0, &db, 1, &logs[1], &v1);
    let config = json!({"rounds": 1, "model_ms": 1, "tool_ms": 1});
    let old: Vec<String> = (0..6).map(|i| format!("old{i}")).collect();
    for id in &old {
        spawn_sim(&url1, id, config.clone());
    }
    // The rolling deploy reaches n1: versions 1 and 2.
    stop(n1);
    let (n1, url1) = start_node_with(&dir.0, &db, 1, &logs[1], &both);
    let new: Vec<String> = (0..6).map(|i| format!("new{i}")).collect();
    for (i, id) in new.iter().enumerate() {
        spawn_sim(&url1, id, config.clone());
        wait_for("the push accepted", 30, || {
            matches!(push(&url1, id, 100 + i as u64), Push::Accepted)
        });
    }
    let version = |url: &str, id: &str| -> Option<u64> {
        let mut r = agent().get(&format!("{url}/sessions")).call().ok()?;
        let rows: Value = r.body_mut().read_json().ok()?;
        rows.as_array()?
            .iter()
            .find(|r| r["id"] == id)
            .and_then(|r| r["version"].as_u64())
    };
    for id in &new {
        assert_eq!(version(&url1, id), Some(2), "{id} runs the newest version");
    }
    wait_for("the new sessions' items delivered on n1", 30, || {
        let d = delivered(&logs[1]);
        (100..106).all(|i| d.contains(&i))
    });

    // n1 dies. n0 adopts what it can run (version 1), nothing else.
    let _ = n1.kill();
    wait_for("n0 runs every version-1 session", 30, || {
        live_sessions(&url0).is_some_and(|l| old.iter().all(|id| l.contains(id)))
    });
    // Three more beats past the adoption: the version-2 sessions stay stored.
    std::thread::sleep(Duration::from_secs(3));
    let live0 = live_sessions(&url0).expect("n0 lists");
    for id in &new {
        assert!(!live0.contains(id), "{id} (version 2) must not run on n0");
        assert_eq!(state_of(&url0, id).as_deref(), Some("stored"), "{id}");
        assert_eq!(version(&url0, id), Some(2), "{id} kept at its version");
    }
    for id in &old {
        assert_eq!(version(&url0, id), Some(1), "{id} stays on version 1");
    }

    // n1 comes back (versions 1 and 2): it resumes its version-2 sessions.
    let (n1, url1) = start_node_with(&dir.0, &db, 1, &logs[1], &both);
    wait_for("n1 runs the version-2 sessions again", 30, || {
        live_sessions(&url1).is_some_and(|l| new.iter().all(|id| l.contains(id)))
    });
    wait_for("a push to a version-2 session delivered on n1", 30, || {
        matches!(push(&url1, "new0", 200), Push::Accepted)
    });
    wait_for("item 200 delivered", 30, || {
        delivered(&logs[1]).contains(&200)
    });
    let on_n0 = delivered(&logs[0]);
    for item in (100..106).chain([200]) {
        assert!(
            !on_n0.contains(&item),
            "item {item} of a version-2 session ran on n0"
        );
    }
    for job in [n0, n1] {
        stop(job);
    }
    let n0_said = std::fs::read_to_string(&n0_log).expect("n0's log");
    for needle in [
        "did not start",
        "version 2 of agent kind",
        "loading the session record failed",
    ] {
        assert!(
            !n0_said.contains(needle),
            "n0 tried a session it cannot run ({needle:?}):\n{n0_said}"
        );
    }
}

/// What a push sent to `url` for `session` was answered (its HTTP status), or 0 when no
/// answer came.
fn push_status(url: &str, session: &str, id: u64) -> u16 {
    agent()
        .post(&format!("{url}/sessions/{session}/items"))
        .send_json(json!({"item": {"id": id, "text": "tls"}}))
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// S43: two nodes joined over mutual TLS (certificates from the cluster's CA, made by
/// the test) forward pushes to each other; a node whose certificate is from another CA,
/// and a node without TLS, cannot join: a push through them for the other nodes'
/// session stays `502 owner_unreachable`, never reaching the session.
#[test]
fn nodes_join_over_mutual_tls_and_a_node_without_the_clusters_certificate_is_refused() {
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("tls").expect("a database");
    let dir = TempDir::new("cluster-tls");
    let logs: Vec<_> = (0..4).map(|n| dir.0.join(format!("n{n}.log"))).collect();
    let ports = [free_port(), free_port(), free_port(), free_port()];
    let cluster = common::TestCa::new(&dir.0, "cluster");
    let rogue = common::TestCa::new(&dir.0, "rogue");
    // A node's certificate comes from `issuer`; it trusts `trust`.
    let tls_flags = |issuer: &common::TestCa, trust: &common::TestCa, n: usize| -> Vec<String> {
        let (cert, key) = issuer.issue(&format!("n{n}"), &["127.0.0.1"]);
        vec![
            "--cluster-tls-cert".into(),
            cert.display().to_string(),
            "--cluster-tls-key".into(),
            key.display().to_string(),
            "--cluster-ca".into(),
            trust.ca.display().to_string(),
        ]
    };
    // n2 trusts the cluster's CA (it would accept n0) but its own certificate is from
    // another CA: n0 must refuse it (both sides verify).
    let flags: Vec<Vec<String>> = vec![
        tls_flags(&cluster, &cluster, 0),
        tls_flags(&cluster, &cluster, 1),
        tls_flags(&rogue, &cluster, 2),
        Vec::new(),
    ];
    let flag_refs = |n: usize| -> Vec<&str> { flags[n].iter().map(String::as_str).collect() };
    let (n0, url0) = start_joined(&dir.0, &db, 0, &ports, None, &logs[0], &flag_refs(0));
    let (n1, url1) = start_joined(
        &dir.0,
        &db,
        1,
        &ports,
        Some(ports[0]),
        &logs[1],
        &flag_refs(1),
    );
    spawn_sim(
        &url0,
        "x",
        json!({"rounds": 1, "model_ms": 1, "tool_ms": 1}),
    );
    // Through n1, over TLS, to n0 which runs it.
    wait_for("a push through n1 reaches x on n0", 30, || {
        matches!(push(&url1, "x", 1), Push::Accepted)
    });
    wait_for("delivered on n0", 30, || delivered(&logs[0]).contains(&1));

    // A node with a certificate from another CA, and one without TLS, join n0 in vain.
    let (n2, url2) = start_joined(
        &dir.0,
        &db,
        2,
        &ports,
        Some(ports[0]),
        &logs[2],
        &flag_refs(2),
    );
    let (n3, url3) = start_joined(
        &dir.0,
        &db,
        3,
        &ports,
        Some(ports[0]),
        &logs[3],
        &flag_refs(3),
    );
    let until = Instant::now() + Duration::from_secs(4);
    let mut tries = 0;
    while Instant::now() < until {
        for url in [&url2, &url3] {
            assert_eq!(
                push_status(url, "x", 100 + tries),
                502,
                "a node outside the cluster's CA reached x"
            );
            tries += 1;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        delivered(&logs[0]).iter().all(|i| *i < 100),
        "nothing sent through the refused nodes was delivered"
    );
    // The cluster itself still works.
    wait_for("a second push through n1", 30, || {
        matches!(push(&url1, "x", 2), Push::Accepted)
    });
    wait_for("delivered on n0", 30, || delivered(&logs[0]).contains(&2));
    for job in [n3, n2, n1, n0] {
        stop(job);
    }
}

/// S43: with TLS between nodes, a node may listen beyond loopback and private ranges;
/// without it, it may not.
#[test]
fn a_node_listens_beyond_private_ranges_only_with_tls() {
    let pg = LocalServer::start(&["fsync=off"]).expect("a local PostgreSQL server");
    let db = pg.database("public").expect("a database");
    let dir = TempDir::new("cluster-public");
    let ca = common::TestCa::new(&dir.0, "cluster");
    let (cert, key) = ca.issue("n0", &["127.0.0.1"]);
    let port = free_port();
    // The flags after `serve --data-dir DIR` (Job::command adds those).
    let args = |tls: bool| -> Vec<String> {
        let mut a = vec![
            "--listen".to_string(),
            "127.0.0.1:0".into(),
            "--postgres".into(),
            db.clone(),
            "--durability".into(),
            "crash".into(),
            "--node".into(),
            "n0".into(),
            "--cluster-listen".into(),
            format!("0.0.0.0:{port}"),
            "--cookie".into(),
            "test-cookie-s3cr3t-m4rk3r".into(),
        ];
        if tls {
            a.extend([
                "--cluster-tls-cert".into(),
                cert.display().to_string(),
                "--cluster-tls-key".into(),
                key.display().to_string(),
                "--cluster-ca".into(),
                ca.ca.display().to_string(),
            ]);
        }
        a
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.0.join("data"))
        .args(args(false))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("without TLS") && err.contains("--cluster-tls-cert"),
        "{err}"
    );
    let with_tls = args(true);
    let with_tls: Vec<&str> = with_tls.iter().map(String::as_str).collect();
    let mut job = Job::command(&dir.0, "serve", &with_tls, std::process::Stdio::inherit());
    job.wait_for("serving on http://");
    stop(job);
}
