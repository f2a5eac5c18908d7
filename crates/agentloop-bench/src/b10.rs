//! B10: a turn of 10 durable steps (S1b) under `sync` on sled, against raw sled doing 10
//! sequential `insert` + `flush` in the same run (DESIGN §10; issue 32). Target: ratio
//! ≤ 1.3.
//!
//! Issue 51: the figure is measured at the default level, `power` (agentloop's sled
//! store fsyncs its data file after each flush; the baseline does the same after each
//! of its flushes: `insert` + `flush` + fsync), and again at `crash` (flush alone on
//! both sides) as a second line.
//!
//! Setup: one `CheckpointActor` on sled (a temp dir) and, beside it, a raw sled
//! database in another directory of the same file system. The agentloop side is one
//! persistent `sync` session whose every turn runs 10 durable steps, each returning a
//! tool result of 64 bytes; the agent times its 10 steps (from before the first `step`
//! to after the tenth returned: each returned only once its journal entry was written
//! and flushed). The push that starts the turn and the turn's end write are outside the
//! timed part: a turn makes them with or without steps. The baseline writes 10 entries
//! of the same size with `insert`, each followed by `flush`. Each round times one turn
//! and one baseline run, alternating which goes first; a warm-up round is discarded.
//! The figure is the ratio of the medians.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{
    Agent, AgentError, CheckpointStore, Durability, SessionHandle, SessionSpec, StopOptions, Turn,
    TurnCx, TurnOutcome,
};
use tokio::sync::mpsc;

use agentloop::store::{Engine, StoreDurability};

use crate::harness::{in_turn, ms, stop_and_wait, Paired, TempStore};
use crate::raw::RawSled;
use crate::report::ratio_line_max;
use crate::tempdir::TempDir;

/// Timed rounds (after one warm-up round).
const ROUNDS: usize = 40;
/// Durable steps per turn.
const STEPS: usize = 10;
/// A step's result, in bytes (a short tool result).
const RESULT: usize = 64;
/// The target: agentloop / baseline ≤ 1.3.
const TARGET: f64 = 1.3;

/// An agent whose every turn runs `STEPS` durable steps and reports how long they took.
struct Stepper {
    took: mpsc::UnboundedSender<Duration>,
    /// Diagnostic (`B10_SIDE=in-turn`): the turn writes its 10 entries with
    /// `store.write` itself instead of running durable steps.
    raw: Option<Arc<dyn CheckpointStore<u64>>>,
}

impl Agent for Stepper {
    type Item = u64;
    type Event = ();
    type State = ();

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        let t0 = Instant::now();
        if let Some(store) = &self.raw {
            for _ in 0..STEPS {
                let mut h = store
                    .load_stored("b10-raw")
                    .await
                    .ok()
                    .flatten()
                    .and_then(|r| match r {
                        agentloop::store::Stored::Current(r) => Some(r.header),
                        _ => None,
                    })
                    .unwrap_or_default();
                h.session_id = "b10-raw".into();
                h.status = agentloop::store::SessionStatus::Running;
                let w = agentloop::store::RecordWrite {
                    header: h,
                    items: Vec::new(),
                    state: agentloop::store::StateChange::Keep,
                    journal: Vec::new(),
                    replace: false,
                    condition: agentloop::store::WriteCondition::NotFinal,
                    history: None,
                    timers: Vec::new(),
                };
                store
                    .write(w)
                    .await
                    .map_err(|e| AgentError::failed(e.to_string()))?;
            }
            let _ = self.took.send(t0.elapsed());
            return Ok(TurnOutcome::Completed);
        }
        for s in 0..STEPS {
            let _: String = cx
                .step(&format!("tool-{s}"), |_key| async move {
                    let mut r = format!("result of tool {s} in turn {}: ", turn.index);
                    r.extend(std::iter::repeat_n('x', RESULT.saturating_sub(r.len())));
                    r
                })
                .await?;
        }
        let _ = self.took.send(t0.elapsed());
        Ok(TurnOutcome::Completed)
    }
}

/// One baseline run: `STEPS` × (insert + flush, + fsync at `power`) on raw sled.
fn baseline(raw: &RawSled, tree: &sled::Tree, round: usize) -> Duration {
    let t0 = Instant::now();
    for s in 0..STEPS {
        let key = format!("b10/{round}/{s}/tool-{s}");
        let value = vec![b'x'; RESULT];
        tree.insert(key.as_bytes(), value)
            .expect("a B10 baseline insert");
        raw.flush();
    }
    t0.elapsed()
}

/// One baseline run on a blocking thread.
async fn baseline_run(raw: &Arc<RawSled>, tree: &sled::Tree, round: usize) -> Duration {
    let (raw, tree) = (raw.clone(), tree.clone());
    tokio::task::spawn_blocking(move || baseline(&raw, &tree, round))
        .await
        .expect("the B10 baseline run panicked")
}

/// The diagnostics `B10_SIDE` selects (not the figure), each against the figure's
/// baseline. (`B10_SIDE=in-turn` is another: the figure's rounds, with the turn
/// writing its entries itself; see [`Stepper`].)
#[derive(Clone, Copy, PartialEq, Eq)]
enum Diagnostic {
    /// `store`: the store's own path for the same writes, without a session: 10
    /// sequential journal-entry writes through the checkpoint client (each answered
    /// after its flush).
    Store,
    /// `backend`: the same writes straight to a `SledBackend`, on a blocking thread.
    Backend,
    /// `async-baseline`: raw sled driven from async code as an application must (never
    /// blocking a tokio worker): one `spawn_blocking` per insert + flush, against the
    /// figure's baseline (all ten on one blocking thread).
    AsyncBaseline,
}

impl Diagnostic {
    /// The diagnostic `B10_SIDE` names, if any.
    fn from_env() -> Option<Self> {
        match std::env::var("B10_SIDE").as_deref() {
            Ok("store") => Some(Diagnostic::Store),
            Ok("backend") => Some(Diagnostic::Backend),
            Ok("async-baseline") => Some(Diagnostic::AsyncBaseline),
            _ => None,
        }
    }

    /// Its table's title, the baseline's and its side's labels, and its ratio's name.
    fn labels(self) -> [&'static str; 4] {
        match self {
            Diagnostic::Store | Diagnostic::Backend => [
                "diagnostic: the store's path alone (ms per 10 writes)",
                "baseline",
                "store.write x 10",
                "store-only",
            ],
            Diagnostic::AsyncBaseline => [
                "diagnostic: raw sled from async code (ms per 10 insert + flush)",
                "baseline (one thread)",
                "spawn_blocking each",
                "async-baseline",
            ],
        }
    }

    /// Its rounds: `side` (which times itself), then the figure's baseline, in that
    /// order every round, round 0 a warm-up. Prints their table and the ratio line
    /// `B10 <name> ratio`.
    async fn against_baseline(
        self,
        raw: &Arc<RawSled>,
        tree: &sled::Tree,
        mut side: impl AsyncFnMut(usize) -> Duration,
    ) {
        let [title, base, label, name] = self.labels();
        let mut s = Paired::default();
        for round in 0..=ROUNDS {
            let a = side(round).await;
            let b = baseline_run(raw, tree, round).await;
            s.record(round, ms(b), ms(a));
        }
        let ratio = s.table(title, "ms", base, label);
        println!("B10 {name} ratio {ratio:.2}");
    }
}

/// Diagnostics `store` and `backend` (`d`): the same writes as a turn's, through the
/// checkpoint client or straight to a backend.
async fn store_only(
    d: Diagnostic,
    store: &Arc<dyn CheckpointStore<u64>>,
    raw: &Arc<RawSled>,
    tree: &sled::Tree,
) {
    use agentloop::store::{
        JournalChange, Payload, RecordHeader, RecordWrite, StateChange, WriteCondition,
    };
    let direct = d == Diagnostic::Backend;
    let backend_dir = TempDir::new("b10", "backend");
    let backend =
        Arc::new(agentloop::store::SledBackend::open(backend_dir.path()).expect("a backend"));
    d.against_baseline(raw, tree, async |round| {
        let mut writes = Vec::new();
        for s in 0..STEPS {
            let entry = agentloop::store::codec::encode_journal_entry(
                "b10-store",
                &agentloop_core::steps::JournalEntry {
                    occurrence: s as u32,
                    name: format!("tool-{s}"),
                    result: Some(vec![b'x'; RESULT]),
                },
            )
            .expect("an entry");
            let w = RecordWrite {
                header: RecordHeader {
                    session_id: "b10-store".into(),
                    agent_kind: "stepper".into(),
                    status: agentloop::store::SessionStatus::Running,
                    turn_index: round as u64,
                    journal: Some(agentloop_core::steps::JournalMark {
                        turn: round as u64,
                        covered: 0,
                    }),
                    ..RecordHeader::default()
                },
                items: Vec::new(),
                state: StateChange::Keep,
                journal: vec![JournalChange::Put(s as u32, Payload::from(entry))],
                replace: false,
                condition: WriteCondition::NotFinal,
                history: None,
                timers: Vec::new(),
            };
            writes.push(w);
        }
        let t0 = Instant::now();
        if direct {
            let backend = backend.clone();
            tokio::task::spawn_blocking(move || {
                for w in writes {
                    backend.write(w).expect("a backend write");
                }
            })
            .await
            .expect("the backend writes");
        } else {
            for w in writes {
                store.write(w).await.expect("a store write");
            }
        }
        t0.elapsed()
    })
    .await;
}

/// Diagnostic `async-baseline`: one `spawn_blocking` per insert + flush.
async fn async_baseline(raw: &Arc<RawSled>, tree: &sled::Tree) {
    let d = Diagnostic::AsyncBaseline;
    d.against_baseline(raw, tree, async |round| {
        let t0 = Instant::now();
        for s in 0..STEPS {
            let (raw, tree) = (raw.clone(), tree.clone());
            tokio::task::spawn_blocking(move || {
                let key = format!("b10a/{round}/{s}");
                tree.insert(key.as_bytes(), vec![b'x'; RESULT])
                    .expect("insert");
                raw.flush();
            })
            .await
            .expect("a blocking insert + flush");
        }
        t0.elapsed()
    })
    .await;
}

/// Runs B10 and prints its tables and verdicts: the figure at `power` (the default),
/// then the same at `crash`.
pub async fn run() {
    println!(
        "B10: a turn of {STEPS} durable steps under sync (each result journaled and made durable \
         before the step returns) vs raw sled {STEPS} x (insert + flush, + fsync at power); \
         {ROUNDS} interleaved rounds after a warm-up; sled, at power (the figure) and at crash"
    );
    let figure = measure(StoreDurability::Power).await;
    if let Some(ratio) = figure {
        let crash = measure(StoreDurability::Crash).await;
        println!("{}", ratio_line_max("B10", ratio, TARGET));
        if let Some(crash) = crash {
            println!("B10 at crash (second line, not the figure) ratio={crash:.2}");
        }
    }
}

/// B10 at `level` on both sides; the ratio of the medians (`None` for a diagnostic).
async fn measure(level: StoreDurability) -> Option<f64> {
    let temp = TempStore::<u64>::open("b10", Engine::Sled(level)).await;
    let store = &temp.store;
    let raw_dir = TempDir::new("b10", "raw");
    let (tx, mut took) = mpsc::unbounded_channel();
    let h: SessionHandle<u64, ()> = SessionHandle::spawn(
        SessionSpec::new("b10", "default")
            .persistent(true)
            .kind("stepper")
            .durability(Durability::Sync),
        Arc::new(Stepper {
            took: tx,
            raw: (std::env::var("B10_SIDE").as_deref() == Ok("in-turn")).then(|| store.clone()),
        }),
        Some(store.clone()),
    )
    .await
    .expect("spawning the B10 session");
    let raw = tokio::task::spawn_blocking({
        let path = raw_dir.path().to_path_buf();
        move || Arc::new(RawSled::open(&path, level))
    })
    .await
    .expect("opening raw sled");
    let tree = raw.db.open_tree("b10").expect("the raw tree");
    match Diagnostic::from_env() {
        Some(Diagnostic::AsyncBaseline) => {
            async_baseline(&raw, &tree).await;
            return None;
        }
        Some(d) => {
            store_only(d, store, &raw, &tree).await;
            return None;
        }
        None => {}
    }
    let mut s = Paired::default();
    for round in 0..=ROUNDS {
        // The baseline first in even rounds; the agent times its turn's steps.
        let (b, a) = in_turn(round, baseline_run(&raw, &tree, round), async {
            h.push(round as u64).await.expect("a B10 push");
            took.recv().await.expect("the turn's time")
        })
        .await;
        s.record(round, ms(b), ms(a));
    }
    stop_and_wait(&h, StopOptions::drain(), "stopping B10").await;
    temp.client.close().await.expect("closing the B10 store");
    Some(s.table(
        &format!("time for {STEPS} durable writes at {level} (ms per turn)"),
        "ms",
        &format!(
            "baseline: raw sled insert + {}",
            RawSled::flush_words(level)
        ),
        &format!("agentloop: durable steps, sync, {level}"),
    ))
}
