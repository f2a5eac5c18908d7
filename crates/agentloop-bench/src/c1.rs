//! C1 (issue 18): failover. A node process (this binary, `c1-node`) runs 1 000
//! sessions on a PostgreSQL store, each in the middle of a turn (work waiting); two
//! survivor nodes run in this process. The node is SIGKILLed; the figure is the time
//! from the kill to the last of its sessions running a turn on a survivor, at the
//! default cluster settings (1 s heartbeat, 3 s lease). Target: at most 5 s, in the
//! worst of the rounds; the distribution over sessions is reported.
//!
//! PostgreSQL is a throwaway server on loopback at its default settings (fsync on),
//! started here (`agentloop-postgres`'s `local-server`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{store::StatusKind, CheckpointStore, Runtime, SessionSpec, StopOptions};
use agentloop_postgres::local_server::LocalServer;
use agentloop_postgres::{PostgresOptions, PostgresStore};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem, SimStep};
use parking_lot::Mutex;

const SESSIONS: u64 = 1_000;
const ROUNDS: usize = 3;
const TARGET_S: f64 = 5.0;

type Rt = Runtime<SimItem, SimEvent>;

async fn store(url: &str) -> Arc<PostgresStore<SimItem>> {
    Arc::new(
        PostgresStore::connect(PostgresOptions::new(url))
            .await
            .expect("connect to the local PostgreSQL"),
    )
}

/// The doomed node (a child process): `c1-node URL NAME N`. Spawns N persistent
/// sessions whose turns wait in an hour-long model call, prints `ready`, and runs
/// until it is killed.
pub async fn node_main(url: &str, name: &str, n: u64) {
    let (rt, _) = Rt::builder()
        .store(store(url).await)
        .node(name)
        .register_agent("sim", |_cfg: &[u8]| {
            Ok(SimAgent::new(Script {
                steps: vec![SimStep::ModelCall {
                    latency: Duration::from_secs(3600),
                    input_tokens: 1,
                }],
            }))
        })
        .start()
        .await
        .expect("the node starts");
    let specs: Vec<_> = (0..n)
        .map(|i| {
            SessionSpec::new(format!("c1-{i}"), "sim")
                .persistent(true)
                .initial_items(vec![SimItem::new(i, "waiting")])
        })
        .collect();
    let spawned = rt.supervisor().spawn_batch(specs).await;
    drop(spawned);
    println!("ready");
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// A survivor: finishes every turn at once and notes when each item's turn ran.
async fn survivor(url: &str, name: &str, ran: Arc<Mutex<HashMap<u64, Instant>>>) -> Rt {
    let (rt, _) = Rt::builder()
        .store(store(url).await)
        .node(name)
        .register_agent("sim", move |_cfg: &[u8]| {
            let ran = ran.clone();
            Ok(
                SimAgent::new(Script::noop()).with_turn_hook(Arc::new(move |_turn, ids| {
                    let now = Instant::now();
                    let mut ran = ran.lock();
                    for id in ids {
                        ran.entry(*id).or_insert(now);
                    }
                })),
            )
        })
        .start()
        .await
        .expect("a survivor starts");
    rt
}

/// One round: seconds from the kill to each session's turn on a survivor, sorted.
async fn round(server: &LocalServer, r: usize) -> Vec<f64> {
    let url =
        tokio::task::block_in_place(|| server.database(&format!("c1_{r}"))).expect("a database");
    let mut child = Command::new(std::env::current_exe().expect("this binary"))
        .args(["c1-node", &url, "doomed", &SESSIONS.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the node process starts");
    let out = child.stdout.take().expect("its stdout");
    tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(out).lines();
        while let Some(Ok(line)) = lines.next() {
            if line == "ready" {
                return;
            }
        }
        panic!("the node process ended before it was ready");
    })
    .await
    .expect("the reader");
    let ran: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let a = survivor(&url, "survivor-a", ran.clone()).await;
    let b = survivor(&url, "survivor-b", ran.clone()).await;
    // Every session of the doomed node is `Running` in the store, mid-turn.
    let check = store(&url).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let running = check
            .list_stored(Some(vec![StatusKind::Running]))
            .await
            .expect("list")
            .len() as u64;
        if running == SESSIONS {
            break;
        }
        assert!(Instant::now() < deadline, "only {running} sessions running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Steady state: the survivors have seen the doomed node beat.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        ran.lock().is_empty(),
        "a survivor ran a live node's session"
    );
    let killed = Instant::now();
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let deadline = killed + Duration::from_secs(60);
    while (ran.lock().len() as u64) < SESSIONS {
        assert!(
            Instant::now() < deadline,
            "only {} of {SESSIONS} sessions ran on a survivor within 60 s",
            ran.lock().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut secs: Vec<f64> = ran
        .lock()
        .values()
        .map(|t| t.saturating_duration_since(killed).as_secs_f64())
        .collect();
    secs.sort_by(|x, y| x.partial_cmp(y).expect("no NaN"));
    a.stop(StopOptions::immediate().shutdown())
        .await
        .expect("stop a");
    b.stop(StopOptions::immediate().shutdown())
        .await
        .expect("stop b");
    secs
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs C1 and prints its table and verdict line (the last line).
pub async fn run() {
    let server = tokio::task::block_in_place(|| LocalServer::start(&[]))
        .expect("a local PostgreSQL server (Debian's postgresql package)");
    println!("C1 failover: {SESSIONS} sessions of a SIGKILLed node, 2 survivors, defaults (1 s heartbeat, 3 s lease)");
    println!("| round | first | p50 | p90 | p99 | last (s) |");
    println!("|---|---|---|---|---|---|");
    let mut worst: f64 = 0.0;
    for r in 0..ROUNDS {
        let secs = round(&server, r).await;
        let last = *secs.last().expect("sessions");
        worst = worst.max(last);
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r + 1,
            secs[0],
            pct(&secs, 0.5),
            pct(&secs, 0.9),
            pct(&secs, 0.99),
            last
        );
    }
    println!();
    println!(
        "C1 failover_last_s={worst:.2} target<={TARGET_S} {}",
        if worst <= TARGET_S { "ok" } else { "FAIL" }
    );
}
