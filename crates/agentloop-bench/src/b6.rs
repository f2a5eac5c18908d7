//! B6: `sync` push acknowledgement latency with 1 000 items waiting, against the same
//! with 10 waiting, in the same run (DESIGN §10; issue 12). Target: p50 ratio ≤ 1.2
//! (the cost of a push does not depend on the backlog). p99 is reported.
//!
//! Setup: one `CheckpointActor` on sled (a temp dir) for the whole run. Each round
//! spawns two persistent `sync` sessions of the simulated agent whose first turn is
//! held at a closed step gate (so everything pushed after the first item waits), and
//! fills them untimed: `small` with 10 items, `large` with 1 000 (sequential pushes,
//! each acknowledged). The timed part: 100 sequential `push().await` to each (the
//! backlogs go 10 → 110 and 1 000 → 1 100), each push timed from the call to its
//! acknowledgement (which comes after the flush of the write holding the item, S16a).
//! The two sides alternate which goes first every round; after the round both sessions
//! are stopped (immediate, skip checkpoint: their records are deleted). One warm-up
//! round is discarded. Each side's p50 and p99 are over all its timed pushes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::store::Engine;
use agentloop::{CheckpointStore, Durability, SessionHandle, SessionSpec, StopOptions};
use agentloop_sim::{Gate, Script, SimAgent, SimItem, SimStep};

use crate::harness::{in_turn, stop_and_wait, SimHandle, TempStore};
use crate::report::ratio_line_max;

/// Timed rounds (after one warm-up round).
const ROUNDS: usize = 7;
/// The two backlogs, before the timed pushes.
const SMALL: usize = 10;
const LARGE: usize = 1_000;
/// Timed pushes per side per round.
const PUSHES: usize = 100;
/// The target: large / small p50 ≤ 1.2.
const TARGET: f64 = 1.2;

fn held_script() -> Script {
    Script {
        steps: vec![SimStep::ModelCall {
            latency: Duration::ZERO,
            input_tokens: 1,
        }],
    }
}

/// A persistent `sync` session whose first turn waits at a gate that never opens,
/// holding `backlog` items (acknowledged) behind it.
async fn held_session(
    store: &Arc<dyn CheckpointStore<SimItem>>,
    id: String,
    backlog: usize,
) -> SimHandle {
    let gate = Gate::new();
    let h = SessionHandle::spawn(
        SessionSpec::new(id, "default")
            .persistent(true)
            .kind("sim")
            .durability(Durability::Sync),
        Arc::new(SimAgent::new(held_script()).with_step_gate(gate)),
        Some(store.clone()),
    )
    .await
    .expect("spawning a B6 session");
    // The first item starts the turn (held); the rest wait.
    for i in 0..=backlog {
        h.push(SimItem::new(i as u64, format!("fill {i}")))
            .await
            .expect("a B6 fill push");
    }
    h
}

/// Times `PUSHES` sequential pushes; returns their latencies in µs.
async fn timed_pushes(h: &SimHandle, base: u64) -> Vec<f64> {
    let mut out = Vec::with_capacity(PUSHES);
    for i in 0..PUSHES {
        let item = SimItem::new(
            base + i as u64,
            format!("message {i}: a user message of typical length"),
        );
        let t0 = Instant::now();
        h.push(item).await.expect("a B6 timed push");
        out.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    out
}

async fn stop(h: SimHandle) {
    let options = StopOptions::immediate().skip_checkpoint();
    stop_and_wait(&h, options, "stopping a B6 session").await;
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("a NaN latency"));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Runs B6 and prints its table and verdict.
pub async fn run() {
    println!(
        "B6: sync push acknowledgement latency, {LARGE} items waiting vs {SMALL} (sequential pushes, \
         {PUSHES} per side per round, {ROUNDS} interleaved rounds after a warm-up; sled)"
    );
    let store = TempStore::<SimItem>::open("b6", Engine::SLED).await;
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut small_firsts = Vec::new();
    for round in 0..=ROUNDS {
        let s = held_session(&store.store, format!("b6-small-r{round}"), SMALL).await;
        let l = held_session(&store.store, format!("b6-large-r{round}"), LARGE).await;
        let (rs, rl) = in_turn(
            round,
            timed_pushes(&s, 1_000_000),
            timed_pushes(&l, 1_000_000),
        )
        .await;
        if round > 0 {
            small_firsts.push(percentile(&rs, 0.5));
            small.extend(rs);
            large.extend(rl);
        }
        stop(s).await;
        stop(l).await;
    }
    store.client.close().await.expect("closing the B6 store");
    let (s50, s99) = (percentile(&small, 0.5), percentile(&small, 0.99));
    let (l50, l99) = (percentile(&large, 0.5), percentile(&large, 0.99));
    println!("| side | backlog while timed | pushes | p50 µs | p99 µs |");
    println!("|---|---|---:|---:|---:|");
    println!(
        "| baseline: {SMALL} waiting | {SMALL}–{} | {} | {s50:.1} | {s99:.1} |",
        SMALL + PUSHES,
        small.len()
    );
    println!(
        "| agentloop: {LARGE} waiting | {LARGE}–{} | {} | {l50:.1} | {l99:.1} |",
        LARGE + PUSHES,
        large.len()
    );
    println!(
        "per-round p50 of the small side (µs): {}",
        small_firsts
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("p99 ratio (not the figure)={:.2}", l99 / s99);
    println!("{}", ratio_line_max("B6", l50 / s50, TARGET));
}
