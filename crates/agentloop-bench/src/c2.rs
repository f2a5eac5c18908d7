//! C2 (issue 18): a planned move of one busy session (a turn of ten 10 ms steps: a
//! safe point every 10 ms, items always waiting) from one node to another, from the
//! request to the first turn starting on the new owner, against a stop + resume of the
//! same session on one node (the baseline), both on the same PostgreSQL store. Target:
//! median move / median baseline ≤ 2 over 30 of each.
//!
//! Both nodes run in this process, connected in process (`agentloop_cluster::peers`: the move's
//! hand-over request is a direct call instead of a loopback RPC, a few hundred
//! microseconds less than across processes); each has its own PostgreSQL connections.
//! PostgreSQL is a throwaway server on loopback at its defaults (fsync on).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{Runtime, SessionSpec, StopOptions};
use agentloop_cluster::peers::connect_in_process;
use agentloop_postgres::local_server::LocalServer;
use agentloop_postgres::{PostgresOptions, PostgresStore};
use agentloop_sim::{Notice, Script, SimAgent, SimEvent, SimItem, SimStep};
use tokio::sync::mpsc;

use crate::report::{print_table, ratio_line_max, summarize};

const ROUNDS: usize = 30;
const TARGET: f64 = 2.0;
const ID: &str = "c2-busy";

type Rt = Runtime<SimItem, SimEvent>;

fn busy_agent(probe: mpsc::UnboundedSender<Notice>) -> SimAgent {
    let steps = (0..10)
        .map(|i| {
            if i % 2 == 0 {
                SimStep::ModelCall {
                    latency: Duration::from_millis(10),
                    input_tokens: 1,
                }
            } else {
                SimStep::ToolRound {
                    latency: Duration::from_millis(10),
                    calls: 1,
                }
            }
        })
        .collect();
    SimAgent::new(Script { steps }).with_probe(probe)
}

async fn node(url: &str, name: &str, probe: mpsc::UnboundedSender<Notice>) -> Rt {
    let store = PostgresStore::<SimItem>::connect(PostgresOptions::new(url))
        .await
        .expect("connect to the local PostgreSQL");
    Runtime::builder()
        .store(Arc::new(store))
        .node(name)
        .register_agent("sim", move |_cfg: &[u8]| Ok(busy_agent(probe.clone())))
        .start()
        .await
        .expect("a node starts")
        .0
}

/// Waits for the next turn to begin (after everything seen so far is drained).
async fn next_turn(rx: &mut mpsc::UnboundedReceiver<Notice>) -> Instant {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(Notice::TurnBegin { .. })) => return Instant::now(),
            Ok(Some(_)) => {}
            _ => panic!("no turn began within 30 s"),
        }
    }
}

fn drain(rx: &mut mpsc::UnboundedReceiver<Notice>) {
    while rx.try_recv().is_ok() {}
}

async fn wait_gone(rt: &Rt) {
    while rt.supervisor().inspect(ID).await.is_ok() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Runs C2 and prints its table and verdict line (the last line).
pub async fn run() {
    let server = tokio::task::block_in_place(|| LocalServer::start(&[]))
        .expect("a local PostgreSQL server (Debian's postgresql package)");
    let url = tokio::task::block_in_place(|| server.database("c2")).expect("a database");
    let (tx_a, mut rx_a) = mpsc::unbounded_channel();
    let (tx_b, mut rx_b) = mpsc::unbounded_channel();
    let a = node(&url, "c2-a", tx_a).await;
    let b = node(&url, "c2-b", tx_b).await;
    connect_in_process(&[("c2-a", &a.handle()), ("c2-b", &b.handle())]);
    a.supervisor()
        .spawn(SessionSpec::new(ID, "sim").persistent(true))
        .await
        .expect("spawn");
    // Items always waiting: a push every 20 ms (a turn takes 100 ms), wherever it runs.
    let pushing = a.handle();
    let pusher = tokio::spawn(async move {
        let mut i = 0u64;
        loop {
            i += 1;
            let _ = pushing.push(ID, SimItem::new(i, "busy")).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    next_turn(&mut rx_a).await;
    let (mut here, mut there) = ((&a, &mut rx_a, "c2-a"), (&b, &mut rx_b, "c2-b"));
    let mut baseline = Vec::with_capacity(ROUNDS);
    let mut moves = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        // Mid-turn, then the baseline: stop at the next safe point and resume in place.
        tokio::time::sleep(Duration::from_millis(35)).await;
        drain(here.1);
        let t0 = Instant::now();
        here.0
            .supervisor()
            .stop(
                ID,
                StopOptions::graceful_timeout(Duration::from_secs(1)).shutdown(),
            )
            .await
            .expect("stop");
        wait_gone(here.0).await;
        here.0
            .resume_handed_over(ID)
            .await
            .expect("resume in place");
        let began = next_turn(here.1).await;
        baseline.push(began.duration_since(t0).as_secs_f64() * 1e3);
        // Mid-turn, then the move to the other node.
        tokio::time::sleep(Duration::from_millis(35)).await;
        drain(there.1);
        let t0 = Instant::now();
        here.0
            .migrate(ID, there.2, Duration::from_secs(1))
            .await
            .expect("the move");
        let began = next_turn(there.1).await;
        moves.push(began.duration_since(t0).as_secs_f64() * 1e3);
        std::mem::swap(&mut here, &mut there);
    }
    pusher.abort();
    let (m, s) = (summarize(&moves), summarize(&baseline));
    print_table(
        "C2 planned move of a busy session (safe point every 10 ms), request to first turn on the new owner",
        "ms",
        &[("stop + resume on one node", s), ("move to another node", m)],
    );
    let _ = a.stop(StopOptions::immediate().shutdown()).await;
    let _ = b.stop(StopOptions::immediate().shutdown()).await;
    println!();
    println!("{}", ratio_line_max("C2", m.median / s.median, TARGET));
}
