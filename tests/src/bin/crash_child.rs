//! The child process of the S31 crash test: runs `sync` sessions of the simulated agent
//! on a sled data directory and prints an ack line for every acknowledged push and
//! every completed turn (written by the agent's turn hook before the turn returns),
//! until it is killed.
//!
//! Usage: `crash_child <data-dir> <run-number> [--drain] [--fjall]` (`--fjall`: the
//! fjall engine at the `crash` level instead of sled, issue 15)
//!
//! Lines (flushed one by one):
//! * `push <session> <item-id>`: the push was acknowledged (durable, S16a);
//! * `turn <session> <item-id>...`: a turn holding these items completed;
//! * `ready` once the sessions run; `drained` when `--drain` finished.
//!
//! With `--drain` it pushes nothing: it resumes every session, drains it and exits 0.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use agentloop::store::{Engine, StoreDurability};
use agentloop::{
    store::CheckpointActor, store::InstanceLease, CheckpointStore, Durability, SessionHandle,
    SessionSpec, StopOptions,
};
use agentloop_sim::{Script, SimAgent, SimItem, SimStep};

const SESSIONS: u64 = 4;

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(run)) = (args.get(1), args.get(2).and_then(|r| r.parse::<u64>().ok()))
    else {
        eprintln!("usage: crash_child <data-dir> <run-number> [--drain] [--fjall]");
        std::process::exit(2);
    };
    let drain = args.iter().any(|a| a == "--drain");
    let engine = if args.iter().any(|a| a == "--fjall") {
        Engine::Fjall(StoreDurability::Crash)
    } else {
        // A SIGKILL test: the level that promises exactly that (S15b).
        Engine::Sled(StoreDurability::Crash)
    };
    let client = match CheckpointActor::<SimItem>::spawn_engine(dir, engine).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crash_child: {e}");
            std::process::exit(1);
        }
    };
    let store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(client.clone());
    let lease = match InstanceLease::start(store.clone(), Duration::from_millis(50)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("crash_child: {e}");
            std::process::exit(1);
        }
    };
    let script = Script {
        steps: vec![
            SimStep::ModelCall {
                latency: Duration::from_millis(2),
                input_tokens: 10,
            },
            SimStep::ToolRound {
                latency: Duration::from_millis(1),
                calls: 1,
            },
            SimStep::ModelCall {
                latency: Duration::from_millis(2),
                input_tokens: 10,
            },
        ],
    };
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let name = format!("crash-{s}");
        // Completed turns are reported by the agent itself, synchronously, before the
        // turn returns: so the line is out before the record can drop those items
        // (`TurnEnded` comes only after that write, S16a, and a kill in between would
        // lose the line).
        let reporter_name = name.clone();
        let agent = SimAgent::new(script.clone())
            .with_state_payload(256)
            .with_turn_hook(Arc::new(move |_turn, ids| {
                let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
                say(format!("turn {reporter_name} {}", ids.join(" ")));
            }));
        let config = SessionSpec::new(name.clone(), "default")
            .persistent(true)
            .kind("sim")
            .durability(Durability::Sync)
            .owner(lease.id())
            .lease_timeout(Duration::from_millis(200));
        let h: SessionHandle<SimItem, agentloop_sim::SimEvent> =
            match SessionHandle::spawn(config, Arc::new(agent), Some(store.clone())).await {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("crash_child: {e}");
                    std::process::exit(1);
                }
            };
        tasks.push((h, name, s));
    }
    say("ready".into());
    if drain {
        for (h, _, _) in tasks {
            let _ = h.stop(StopOptions::drain()).await;
            let exit = h.wait().await;
            if !exit.unhandled_items.is_empty() || !exit.interrupted_items.is_empty() {
                eprintln!("crash_child: drain left items: {exit:?}");
                std::process::exit(1);
            }
        }
        let _ = client.close().await;
        say("drained".into());
        return;
    }
    let mut pushers = Vec::new();
    for (h, name, s) in tasks {
        pushers.push(tokio::spawn(async move {
            for k in 0.. {
                let id = run * 1_000_000 + s * 100_000 + k;
                match h.push(SimItem::new(id, format!("m{id}"))).await {
                    Ok(_) => say(format!("push {name} {id}")),
                    Err(e) => {
                        eprintln!("crash_child: push {id}: {e}");
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    for p in pushers {
        let _ = p.await;
    }
}
