//! B11: a `sync` push to a sleeping session until acknowledged, with 1 000 000 sessions
//! asleep on sled, against a push to a live session in the same run (p50): ≤ 3×; and
//! ≤ 200 B of RSS per sleeping session, measured against the process before the
//! sessions existed (S39; DESIGN §10, issue 34).
//!
//! Setup: a runtime on sled (a temp dir); persistent `sync` sessions of an agent that
//! does nothing, each with `idle_after` 500 ms, spawned in waves of 10 000 (a wave is
//! spawned, then waited for until it sleeps); one more session, the live baseline,
//! with an `idle_after` of a day. RSS is read (after handing free heap pages back to
//! the kernel) before the first session and after the last fell asleep. Then 1 000
//! rounds, each a push to a different sleeping session (it wakes: its record read,
//! its actor started, the item written) and a push to the live session, both until
//! acknowledged (durable).

use std::time::{Duration, Instant};

use agentloop::{Runtime, SessionSpec};

use crate::b2::{release_free_memory, rss_kib};
use crate::harness::{ms, NoopAgent};
use crate::tempdir::TempDir;

/// Sessions asleep (`B11_SESSIONS` overrides it for a quick look; the figure is 1 000 000).
const SESSIONS: usize = 1_000_000;
/// Sessions spawned per wave.
const WAVE: usize = 10_000;
/// Rounds of the latency comparison.
const ROUNDS: usize = 1_000;
/// The latency target: sleeping ≤ 3 × live (p50).
const TARGET: f64 = 3.0;
/// The memory target: bytes of RSS per sleeping session.
const RSS_TARGET_B: f64 = 200.0;

fn id(i: usize) -> String {
    format!("b11-{i:07}")
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// Runs B11 and prints its table and verdicts.
pub async fn run() {
    let n: usize = std::env::var("B11_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SESSIONS);
    println!(
        "B11: {n} sync sessions asleep on sled (idle_after 500 ms, spawned in waves of \
         {WAVE}); {ROUNDS} rounds of a push to a sleeping session vs a push to a live one, \
         each until acknowledged"
    );
    let dir = TempDir::new("b11", "store");
    let (rt, _) = Runtime::<u64, ()>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("idle", |_cfg: &[u8]| Ok(NoopAgent::<u64, ()>::new()))
        .start()
        .await
        .expect("starting the B11 runtime");
    let sup = rt.supervisor().clone();
    release_free_memory();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let mut made = 0;
    while made < n {
        let wave = WAVE.min(n - made);
        let specs: Vec<SessionSpec<u64>> = (made..made + wave)
            .map(|i| {
                SessionSpec::new(id(i), "idle")
                    .persistent(true)
                    .idle_after(Duration::from_millis(500))
            })
            .collect();
        for r in sup.spawn_batch(specs).await {
            r.expect("spawning a B11 session");
        }
        made += wave;
        let waited = Instant::now();
        while sup.counts().await.sleeping < made {
            assert!(
                waited.elapsed() < Duration::from_secs(120),
                "B11: a wave never fell asleep ({:?})",
                sup.counts().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if std::env::var("B11_TRACE").is_ok() {
            release_free_memory();
            eprintln!("B11: {made} asleep, RSS {:.1} MiB", rss_kib() / 1024.0);
        }
    }
    let asleep_in = t0.elapsed();
    release_free_memory();
    let rss1 = rss_kib();
    let per_session = (rss1 - rss0) * 1024.0 / n as f64;
    println!(
        "B11: {n} sessions asleep in {:.1} s; RSS {:.1} MiB before, {:.1} MiB after: {:.1} B per sleeping session",
        asleep_in.as_secs_f64(),
        rss0 / 1024.0,
        rss1 / 1024.0,
        per_session
    );

    sup.spawn(
        SessionSpec::new("b11-live", "idle")
            .persistent(true)
            .idle_after(Duration::from_secs(86_400)),
    )
    .await
    .expect("spawning the live session");
    // Warm both paths.
    for k in 0..10 {
        sup.push("b11-live", k).await.expect("a live push");
    }
    let mut sleeping = Vec::with_capacity(ROUNDS);
    let mut live = Vec::with_capacity(ROUNDS);
    let stride = (n / ROUNDS).max(1);
    for k in 0..ROUNDS.min(n) {
        let target = id(k * stride);
        let t = Instant::now();
        sup.push(&target, k as u64)
            .await
            .expect("a push to a sleeping session");
        sleeping.push(ms(t.elapsed()));
        let t = Instant::now();
        sup.push("b11-live", k as u64)
            .await
            .expect("a push to the live session");
        live.push(ms(t.elapsed()));
    }
    let (s50, l50) = (p50(&mut sleeping), p50(&mut live));
    let ratio = s50 / l50;
    let _ = rt.shutdown().await;
    println!("| push until acknowledged | p50 ms | p90 ms |");
    println!("|---|---:|---:|");
    println!(
        "| to a sleeping session (wakes it) | {s50:.3} | {:.3} |",
        sleeping[sleeping.len() * 9 / 10]
    );
    println!(
        "| to a live session | {l50:.3} | {:.3} |",
        live[live.len() * 9 / 10]
    );
    let full = n == SESSIONS;
    let verdict = |ok: bool| match (ok, full) {
        (true, true) => "ok",
        (false, _) => "FAIL",
        (true, false) => "ok (fewer sessions than the figure's)",
    };
    println!(
        "B11 ratio={ratio:.2} target<={TARGET} {}",
        verdict(ratio <= TARGET)
    );
    println!(
        "B11 rss_per_sleeping_session_b={per_session:.1} target<={RSS_TARGET_B} {}",
        verdict(per_session <= RSS_TARGET_B)
    );
}
