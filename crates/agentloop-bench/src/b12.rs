//! B12: 100 000 durable timers due within 60 s (S39; DESIGN §10, issue 34): p99
//! lateness ≤ 100 ms, each fired exactly once.
//!
//! Setup: a runtime on sled (a temp dir) with 1 000 persistent `sync` sessions of an
//! agent that records, for each item a turn receives, when it received it. 100 timers
//! per session are armed (`RuntimeHandle::wake_at`, concurrently, each durable before
//! it is answered), due evenly between 10 s and 60 s after the arming started; each
//! timer's item is its own number. Lateness is when the agent's turn received the item
//! minus the timer's due time (what a user of the timer sees: the fire, the write that
//! accepts the item and removes the timer, and the turn's start). A timer delivered
//! twice or never fails the figure, whatever its lateness.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentloop::{
    Agent, AgentError, Durability, Runtime, SessionSpec, StopOptions, Turn, TurnCx, TurnOutcome,
};
use parking_lot::Mutex;

use crate::tempdir::TempDir;

/// Sessions.
const SESSIONS: usize = 1_000;
/// Timers in all.
const TIMERS: usize = 100_000;
/// The first due time, after the arming started.
const FIRST_DUE: Duration = Duration::from_secs(10);
/// The last due time, after the arming started.
const LAST_DUE: Duration = Duration::from_secs(60);
/// The target: p99 lateness, ms.
const TARGET_MS: f64 = 100.0;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Records each item its turns receive, with when.
struct Recorder {
    seen: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl Agent for Recorder {
    type Item = u64;
    type Event = ();
    type State = ();

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        let at = now_ms();
        self.seen
            .lock()
            .extend(turn.items.iter().map(|item| (*item, at)));
        Ok(TurnOutcome::Completed)
    }
}

/// Runs B12 and prints its table and verdict.
pub async fn run() {
    println!(
        "B12: {TIMERS} durable timers over {SESSIONS} sync sessions on sled, due evenly from \
         {FIRST_DUE:?} to {LAST_DUE:?} after the arming started; lateness = received by \
         the turn - due"
    );
    let dir = TempDir::new("b12", "store");
    let seen: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let s = seen.clone();
    let (rt, _) = Runtime::<u64, ()>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("recorder", move |_cfg: &[u8]| {
            Ok(Recorder { seen: s.clone() })
        })
        .start()
        .await
        .expect("starting the B12 runtime");
    for i in 0..SESSIONS {
        rt.supervisor()
            .spawn(
                SessionSpec::new(format!("b12-{i}"), "recorder")
                    .persistent(true)
                    .durability(Durability::Sync),
            )
            .await
            .expect("spawning a B12 session");
    }
    let start_ms = now_ms();
    let t0 = Instant::now();
    let span = (LAST_DUE - FIRST_DUE).as_millis() as u64;
    let due_of =
        |n: usize| start_ms + FIRST_DUE.as_millis() as u64 + n as u64 * span / TIMERS as u64;
    // Armed concurrently (one task per session), each durable before it is answered.
    let mut arming = tokio::task::JoinSet::new();
    for i in 0..SESSIONS {
        let rt = (*rt).clone();
        let dues: Vec<(usize, u64)> = (0..TIMERS / SESSIONS)
            .map(|k| {
                let n = k * SESSIONS + i;
                (n, due_of(n))
            })
            .collect();
        arming.spawn(async move {
            for (n, due) in dues {
                let when = SystemTime::UNIX_EPOCH + Duration::from_millis(due);
                rt.wake_at(&format!("b12-{i}"), when, n as u64)
                    .await
                    .expect("arming a B12 timer");
            }
        });
    }
    while let Some(r) = arming.join_next().await {
        r.expect("an arming task");
    }
    let armed_in = t0.elapsed();
    assert!(
        armed_in < FIRST_DUE,
        "B12: arming took {armed_in:?}, past the first due time"
    );
    // Until every timer fired, or well past the last due time.
    let deadline = t0 + LAST_DUE + Duration::from_secs(30);
    while seen.lock().len() < TIMERS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A little longer: a timer fired twice would show now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = seen.lock().clone();
    let mut count = vec![0u32; TIMERS];
    let mut late: Vec<f64> = Vec::with_capacity(TIMERS);
    for (n, at) in &seen {
        let n = *n as usize;
        count[n] += 1;
        if count[n] == 1 {
            late.push(at.saturating_sub(due_of(n)) as f64);
        }
    }
    let missing = count.iter().filter(|c| **c == 0).count();
    let twice = count.iter().filter(|c| **c > 1).count();
    let left: usize = {
        let mut left = 0;
        for i in 0..SESSIONS {
            left += rt.timers(&format!("b12-{i}")).await.map_or(0, |t| t.len());
        }
        left
    };
    rt.supervisor().stop_all(StopOptions::bare()).await;
    let _ = rt.shutdown().await;
    late.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let pct = |p: f64| -> f64 {
        if late.is_empty() {
            f64::INFINITY
        } else {
            late[((late.len() as f64 * p) as usize).min(late.len() - 1)]
        }
    };
    println!(
        "B12: armed {TIMERS} timers in {:.2} s",
        armed_in.as_secs_f64()
    );
    println!("| lateness | ms |");
    println!("|---|---:|");
    for (name, p) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)] {
        println!("| {name} | {:.1} |", pct(p));
    }
    println!(
        "| max | {:.1} |",
        late.last().copied().unwrap_or(f64::INFINITY)
    );
    println!(
        "fired: {} of {TIMERS} once, {missing} never, {twice} more than once; {left} still armed",
        late.len()
    );
    let p99 = pct(0.99);
    let ok = p99 <= TARGET_MS && missing == 0 && twice == 0 && left == 0;
    println!(
        "B12 p99_lateness_ms={p99:.1} target<={TARGET_MS} once={} {}",
        missing == 0 && twice == 0,
        if ok { "ok" } else { "FAIL" }
    );
}
