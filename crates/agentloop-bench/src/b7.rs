//! B7: resume with an answer (issue 13). From the call that gives the answer (it spawns
//! the session: `SessionHandle::resume_with_answer`) to the resumed turn's
//! `TurnEnded { durable: true }`, against the least durable work a resume needs, done on
//! raw sled in the same run: one load of the record, one insert + flush holding the
//! answer and the claim, one insert + flush of the turn end. Target: median ratio ≤ 1.5.
//!
//! Setup: one `CheckpointActor` on sled (a temp dir) for agentloop, one raw sled
//! database (another temp dir) for the baseline. Before each round, untimed, `SESSIONS`
//! records are written on each side: agentloop's are `Stopped` records awaiting an
//! answer (one interrupted item, the interrupt and its question); the baseline's are
//! values of the same encoded size. The agentloop side then resumes them one after
//! another, each timed from the call to its `TurnEnded { durable: true }` (the agent's
//! resumed turn completes at once, without a safe point); each session is stopped after
//! its timing (untimed). The baseline side does, per record, `get` + `insert` (the
//! value with an answer) + `flush` + `insert` (the turn end) + `flush`, values varied so
//! sled writes them. Sides alternate which goes first every round; one warm-up round is
//! discarded; each round's sample is the mean per resume; the figure is the ratio of
//! the medians over rounds.
//!
//! Issue 51: the figure is measured at the default level, `power` (agentloop's sled
//! store fsyncs its data file after each flush; the baseline's two flushes are each
//! followed by an fsync of its data file), then at `crash` (flush alone on both sides)
//! as a second line.
//!
//! Diagnostics (not the figure): `B7_PHASES=1` prints, per resume, when the call
//! returned (answer and claim durable, session spawned), when `TurnStarted` and when the
//! durable `TurnEnded` arrived; `B7_PROBE=1` first times the store path's pieces (a load
//! and a whole-record save through the checkpoint actor, a `spawn_blocking` hop, a raw
//! sled insert + flush, and `SledBackend`'s apply and flush without the actor).

use std::sync::Arc;
use std::time::Instant;

use agentloop::{
    store::SessionRecord, Agent, AgentError, CheckpointStore, Durability, InterruptInfo,
    SessionEvent, SessionHandle, SessionSpec, StopOptions, Turn, TurnCx, TurnOutcome,
};
use agentloop_sim::SimItem;

use agentloop::store::{Engine, StoreDurability};

use crate::harness::{in_turn, micros_per_op, stop_and_wait, Paired, TempStore};
use crate::raw::RawSled;
use crate::report::ratio_line_max;
use crate::tempdir::TempDir;

/// Timed rounds (after one warm-up round).
const ROUNDS: usize = 7;
/// Resumes per side per round.
const SESSIONS: usize = 50;
/// The target: agentloop / raw sled median ≤ 1.5.
const TARGET: f64 = 1.5;

/// An agent whose resumed turn completes at once: it reads the answer and returns.
struct Approver;

impl Agent for Approver {
    type Item = SimItem;
    type Event = ();
    type State = ();

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        match &turn.answer {
            Some(a) if a.text == "approve" => Ok(TurnOutcome::Completed),
            other => Err(AgentError::failed(format!(
                "B7 expects an approval, got {other:?}"
            ))),
        }
    }
}

fn record(id: &str) -> SessionRecord<SimItem> {
    let mut r = SessionRecord::new(id, "approver", 3);
    r.interrupted_items = vec![SimItem::new(1, "delete the staging database")];
    r.interrupt = Some(InterruptInfo::asking(
        "approval required",
        serde_json::json!({"tool": "drop_database", "args": {"name": "staging"}}),
    ));
    r.awaiting_answer = true;
    r
}

/// Writes `SESSIONS` records awaiting an answer (untimed).
async fn prepare(store: &Arc<dyn CheckpointStore<SimItem>>, round: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        let id = format!("b7-r{round}-{i}");
        store.save(record(&id)).await.expect("writing a B7 record");
        ids.push(id);
    }
    ids
}

/// Resumes each session with an answer; returns the mean µs per resume.
async fn agentloop_round(store: &Arc<dyn CheckpointStore<SimItem>>, ids: &[String]) -> f64 {
    let agent = Arc::new(Approver);
    let mut total = 0.0;
    for id in ids {
        let t0 = Instant::now();
        let (h, mut events) = SessionHandle::<SimItem, ()>::resume_with_answer(
            SessionSpec::new(id.clone(), "default")
                .persistent(true)
                .kind("approver")
                .durability(Durability::Sync),
            agent.clone(),
            Some(store.clone()),
            SimItem::new(2, "approve"),
            16,
        )
        .await
        .expect("a B7 answer");
        let t_spawned = t0.elapsed().as_secs_f64() * 1e6;
        let mut t_started = 0.0;
        loop {
            match events.next().await {
                Some(SessionEvent::TurnEnded {
                    durable: true,
                    outcome: agentloop::TurnEnd::Completed,
                    ..
                }) => break,
                Some(SessionEvent::TurnEnded { outcome, .. }) => {
                    panic!("B7: the resumed turn ended {outcome:?}, not durably completed")
                }
                Some(SessionEvent::TurnStarted { .. }) => {
                    t_started = t0.elapsed().as_secs_f64() * 1e6
                }
                Some(_) => {}
                None => panic!("B7: the session ended before its resumed turn"),
            }
        }
        total += t0.elapsed().as_secs_f64() * 1e6;
        if std::env::var_os("B7_PHASES").is_some() {
            eprintln!(
                "spawned {t_spawned:.0} started {t_started:.0} ended {:.0}",
                t0.elapsed().as_secs_f64() * 1e6
            );
        }
        stop_and_wait(&h, StopOptions::bare(), "stopping a B7 session").await;
    }
    total / ids.len() as f64
}

/// The baseline's records: `SESSIONS` values of `size` bytes (untimed).
fn prepare_raw(db: &sled::Db, round: usize, size: usize) -> Vec<Vec<u8>> {
    (0..SESSIONS)
        .map(|i| {
            let key = format!("b7-r{round}-{i}").into_bytes();
            db.insert(&key, vec![round as u8; size])
                .expect("writing a B7 baseline record");
            key
        })
        .collect()
}

/// Per record: load, save + flush (answer and claim), save + flush (turn end); each
/// flush followed by an fsync at `power`.
fn raw_round(raw: &RawSled, keys: &[Vec<u8>], size: usize) -> f64 {
    let db = &raw.db;
    let mut total = 0.0;
    for (i, key) in keys.iter().enumerate() {
        let t0 = Instant::now();
        let loaded = db
            .get(key)
            .expect("a B7 baseline load")
            .expect("the record");
        let mut claimed = loaded.to_vec();
        claimed[0] = claimed[0].wrapping_add(1);
        claimed[size / 2] = i as u8;
        db.insert(key, claimed.clone()).expect("a B7 baseline save");
        raw.flush();
        claimed[1] = claimed[1].wrapping_add(1);
        db.insert(key, claimed).expect("a B7 baseline save");
        raw.flush();
        total += t0.elapsed().as_secs_f64() * 1e6;
    }
    total / keys.len() as f64
}

/// Runs B7 and prints its tables and verdict: the figure at `power` (the default),
/// then the same at `crash`.
pub async fn run() {
    println!(
        "B7: resume with an answer, from the call to the resumed turn's durable TurnEnded \
         ({SESSIONS} resumes per side per round, {ROUNDS} interleaved rounds after a warm-up; \
         sled, sync; at power (the figure) and at crash)"
    );
    let ratio = measure(StoreDurability::Power).await;
    let crash = measure(StoreDurability::Crash).await;
    println!("B7 at crash (second line, not the figure) ratio={crash:.2}");
    println!("{}", ratio_line_max("B7", ratio, TARGET));
}

/// Diagnostic (`B7_PROBE`): prints `label` and the mean µs per one of `ids`
/// operations since `t`.
fn probe_line(label: &str, t: Instant, ids: usize) {
    eprintln!("{label} {:.0} µs", micros_per_op(t.elapsed(), ids as u64));
}

/// B7 at `level` on both sides; the ratio of the medians.
async fn measure(level: StoreDurability) -> f64 {
    let temp = TempStore::<SimItem>::open("b7", Engine::Sled(level)).await;
    let store = &temp.store;
    let raw_dir = TempDir::new("b7", "raw");
    let raw = RawSled::open(raw_dir.path(), level);
    let db = &raw.db;
    // The baseline's values are as large as agentloop's stored record.
    let probe = prepare(store, usize::MAX).await;
    let size = match store.load_stored(&probe[0]).await {
        Ok(Some(agentloop::store::Stored::Current(r))) => {
            let header = agentloop::store::codec::encode_header(&r.header).map_or(0, |b| b.len());
            header + r.items.iter().map(|(_, b)| b.len()).sum::<usize>()
        }
        _ => 512,
    };
    for id in &probe {
        let _ = store.delete(id).await;
    }
    println!("record size: {size} bytes");
    if std::env::var_os("B7_PROBE").is_some() {
        let ids = prepare(store, 999).await;
        let t = Instant::now();
        for id in &ids {
            store.load_stored(id).await.unwrap();
        }
        probe_line("load_stored", t, ids.len());
        let t = Instant::now();
        for id in &ids {
            let mut r = record(id);
            r.stop_cause = Some(format!("x{}", t.elapsed().as_nanos()));
            store.save(r).await.unwrap();
        }
        probe_line("save", t, ids.len());
        let t = Instant::now();
        for _ in &ids {
            tokio::task::spawn_blocking(|| ()).await.unwrap();
        }
        probe_line("spawn_blocking", t, ids.len());
        let t = Instant::now();
        tokio::task::block_in_place(|| {
            for (i, id) in ids.iter().enumerate() {
                db.insert(id.as_bytes(), vec![i as u8; size]).unwrap();
                raw.flush();
            }
        });
        probe_line("raw insert+flush", t, ids.len());
        let bdir = TempDir::new("b7", "backend");
        let backend = agentloop::store::SledBackend::open_at(bdir.path(), level).unwrap();
        let mut tw = 0.0;
        tokio::task::block_in_place(|| {
            for (i, id) in ids.iter().enumerate() {
                let mut r = record(id);
                r.stop_cause = Some(format!("x{i}"));
                let w = r
                    .to_write(agentloop::store::WriteCondition::Always)
                    .unwrap();
                let t = Instant::now();
                backend.write(w).unwrap();
                tw += t.elapsed().as_secs_f64() * 1e6;
            }
        });
        eprintln!("backend write and flush {:.0} µs", tw / ids.len() as f64);
    }
    let mut s = Paired::default();
    for round in 0..=ROUNDS {
        let ids = prepare(store, round).await;
        let keys = prepare_raw(db, round, size);
        raw.flush();
        let (a, b) = in_turn(round, agentloop_round(store, &ids), async {
            tokio::task::block_in_place(|| raw_round(&raw, &keys, size))
        })
        .await;
        s.record(round, b, a);
    }
    temp.client.close().await.expect("closing the B7 store");
    s.table(
        &format!("µs per resume at {level} (mean per round)"),
        "µs",
        &format!(
            "baseline: raw sled load + 2 × (insert + {})",
            RawSled::flush_words(level)
        ),
        "agentloop: resume_with_answer → durable TurnEnded",
    )
}
