//! C3 (issue 18; reported, not a gate): scale-out. Acknowledged `sync` pushes per
//! second with 1, 2 and 3 cluster nodes on this machine sharing one PostgreSQL: 60
//! persistent sessions spread over the nodes (each node runs the ones it spawned),
//! 64 pushers, each pushing to its session on that session's node and waiting for the
//! acknowledgement (durable in PostgreSQL), for 5 s per node count.
//!
//! The nodes run in this process (each with its own runtime and connections), so they
//! share its 2 cores with PostgreSQL: the curve shows where this machine flattens, not
//! what separate machines would do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{Runtime, SessionSpec, StopOptions};
use agentloop_postgres::local_server::LocalServer;
use agentloop_postgres::{PostgresOptions, PostgresStore};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};

const SESSIONS: usize = 60;
const PUSHERS: usize = 64;
const RUN: Duration = Duration::from_secs(5);

type Rt = Runtime<SimItem, SimEvent>;

async fn rate(url: &str, nodes: usize) -> f64 {
    let mut rts: Vec<Rt> = Vec::new();
    for n in 0..nodes {
        let store = PostgresStore::<SimItem>::connect(PostgresOptions::new(url))
            .await
            .expect("connect");
        let rt = Runtime::builder()
            .store(Arc::new(store))
            .node(format!("c3-{nodes}-{n}"))
            .register_agent("sim", |_cfg: &[u8]| {
                Ok(SimAgent::new(Script::noop()).without_ledger())
            })
            .start()
            .await
            .expect("a node")
            .0;
        rts.push(rt);
    }
    for s in 0..SESSIONS {
        rts[s % nodes]
            .supervisor()
            .spawn(SessionSpec::new(format!("c3-{nodes}-s{s}"), "sim").persistent(true))
            .await
            .expect("spawn");
    }
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for p in 0..PUSHERS {
        let s = p % SESSIONS;
        let handle = rts[s % nodes].handle();
        let (acked, stop) = (acked.clone(), stop.clone());
        let id = format!("c3-{nodes}-s{s}");
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                if handle
                    .supervisor()
                    .push(&id, SimItem::new(i, "c3"))
                    .await
                    .is_ok()
                {
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let t0 = Instant::now();
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    let n = acked.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64();
    for t in tasks {
        let _ = t.await;
    }
    for rt in rts {
        let _ = rt.stop(StopOptions::immediate().shutdown()).await;
    }
    n
}

/// Runs C3 and prints its table and a report line (the last line; not a gate).
pub async fn run() {
    let server = tokio::task::block_in_place(|| LocalServer::start(&[]))
        .expect("a local PostgreSQL server (Debian's postgresql package)");
    println!("C3 scale-out: acknowledged sync pushes/s, {SESSIONS} sessions, {PUSHERS} pushers, one PostgreSQL (fsync on), 2 cores");
    println!("| nodes | pushes/s | vs 1 node |");
    println!("|---:|---:|---:|");
    let mut rates = Vec::new();
    for nodes in 1..=3 {
        let url = tokio::task::block_in_place(|| server.database(&format!("c3_{nodes}")))
            .expect("a database");
        let r = rate(&url, nodes).await;
        rates.push(r);
        println!("| {nodes} | {r:.0} | {:.2} |", r / rates[0]);
    }
    println!();
    println!(
        "C3 pushes_per_s 1={:.0} 2={:.0} 3={:.0} (reported)",
        rates[0], rates[1], rates[2]
    );
}
