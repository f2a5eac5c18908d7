//! Regression tests for `sync` durability and the checkpoint actor (second review): each
//! failed before its fix (S16a, S17, S18, S10).

use std::sync::Arc;
use std::time::Duration;

use agentloop::store::{codec, RecordWrite, Stored, StoredEntry, WriteCondition};
use agentloop::{
    store::CasOutcome, store::SessionRecord, store::SessionStatus, store::StatusKind,
    CheckpointStore, Durability, ExitReason, MemoryStore, Preempt, PushOptions, SessionSpec,
    StopOptions, StoreError,
};
use agentloop_sim::{Fault, Notice, SimAgent, SimItem, SimState};
use agentloop_tests::*;
use futures::future::BoxFuture;
use parking_lot::Mutex;

/// MemoryStore that logs the whole record after every write (in call order).
struct Rec {
    inner: MemoryStore<SimItem>,
    log: Mutex<Vec<SessionRecord<SimItem>>>,
}
impl Rec {
    fn new() -> Arc<Self> {
        Arc::new(Rec {
            inner: MemoryStore::new(),
            log: Mutex::new(Vec::new()),
        })
    }
}
impl CheckpointStore<SimItem> for Rec {
    fn load_stored<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        self.inner.load_stored(id)
    }
    /// Logs the whole record as it stands after each applied write.
    fn write(&self, w: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        let id = w.session_id().to_string();
        let done = self.inner.write(w);
        if let Some(r) = self.inner.get(&id) {
            self.log.lock().push(r);
        }
        done
    }
    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.inner.delete(id)
    }
    fn list_stored(
        &self,
        s: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        self.inner.list_stored(s)
    }
    fn cas_status(
        &self,
        id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>> {
        self.inner.cas_status(id, from, to)
    }
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.flush()
    }
    fn beat(&self, i: &str, t: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.beat(i, t)
    }
    fn heartbeat(&self, i: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        self.inner.heartbeat(i)
    }
}

fn cfg(id: &str) -> SessionSpec<SimItem> {
    SessionSpec::new(id, "default")
        .persistent(true)
        .kind("sim")
        .durability(Durability::Sync)
}

fn held(r: &SessionRecord<SimItem>) -> (Vec<u64>, Vec<u64>, Option<usize>, u64) {
    let st = r.state.as_ref().map(|b| {
        codec::decode_state::<SimState>(&r.session_id, b)
            .unwrap()
            .steps_done
    });
    (
        ids(&r.unhandled_items),
        ids(&r.interrupted_items),
        st,
        r.turn_index,
    )
}

/// A resume turn still "planning" (waiting for the order gate / not yet scheduled) is
/// written by a push's sync write as a between-turns record: seed items become
/// unhandled, the saved state is dropped, turn_index is index+1.
#[tokio::test]
async fn resume_seed_state_dropped_by_sync_write() {
    let rec = Rec::new();
    let mut r = SessionRecord::new("r", "sim", 3);
    r.interrupted_items = vec![item(1)];
    r.state = Some(
        codec::encode_state(
            "r",
            &SimState {
                turn: 3,
                items: vec![1],
                steps_done: 1,
                payload: vec![],
            },
        )
        .unwrap(),
    );
    rec.inner.insert(r);
    let store: Arc<dyn CheckpointStore<SimItem>> = rec.clone();
    let gate = agentloop_sim::Gate::new();
    let h = spawn_on(
        cfg("r"),
        SimAgent::new(steps(3)).with_step_gate(gate.clone()),
        store,
    )
    .await;
    h.push(item(2)).await.unwrap();
    let log = rec.log.lock().clone();
    for r in &log {
        eprintln!("save: {:?}", held(r));
    }
    let first = &log[0];
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    assert!(
        first.state.is_some() && ids(&first.interrupted_items) == vec![1],
        "the acked push's write dropped the resume seed: {:?}",
        held(first)
    );
}

/// A write landing after the turn task classified a preempted turn but before the
/// actor handled TurnFinished omits the turn's consumed items.
#[tokio::test]
async fn preempted_items_missing_from_window_write() {
    let rec = Rec::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = rec.clone();
    let gate = agentloop_sim::Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn_on(
        cfg("p"),
        SimAgent::new(steps(3))
            .with_step_gate(gate.clone())
            .with_probe(tx),
        store,
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    let ack = h
        .push(item(2))
        .options(PushOptions::preempt(Preempt::any_safe_point()))
        .await
        .unwrap();
    eprintln!("preempt ack {ack:?}");
    // Let the turn reach its next safe point and be cut; push 3 is queued first.
    gate.open(1);
    h.push(item(3)).no_wait();
    probe
        .until("turn 1", |n| matches!(n, Notice::TurnBegin { turn: 1, .. }))
        .await;
    let log = rec.log.lock().clone();
    for r in &log {
        eprintln!("save: {:?}", held(r));
    }
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    let w3 = log
        .iter()
        .find(|r| ids(&r.unhandled_items).contains(&3))
        .expect("write of push 3");
    let (u, i, _, _) = held(w3);
    assert!(
        u.contains(&1) || i.contains(&1),
        "the write that acknowledged push 3 does not hold item 1 (acked, undelivered): {:?}",
        held(w3)
    );
}

/// A push whose sync write failed is acknowledged Ok by teardown because a later flush
/// succeeded.
#[tokio::test]
async fn teardown_acks_push_whose_write_failed() {
    let rec = Rec::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = rec.clone();
    let gate = agentloop_sim::Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn_on(
        cfg("t"),
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_fault(Some(0), 1, Fault::Fail, true),
        store,
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    gate.open(1);
    probe.at_step(0, 1).await;
    rec.inner.fail_saves(true);
    gate.open(1);
    let r = h.push(item(2)).await;
    let exit = within("exit", h.wait()).await;
    let stored = rec.inner.get("t");
    eprintln!(
        "push 2 -> {r:?}; exit {:?}; stored {:?}",
        exit.reason,
        stored.as_ref().map(held)
    );
    assert!(matches!(exit.reason, ExitReason::Failed(_)));
    assert!(
        r.is_err(),
        "push 2 acknowledged durable although its only write failed; stored record: {:?}",
        stored.as_ref().map(held)
    );
}

/// The SafePointReached of a turn's last step is handled after the turn completed: the
/// sync write then records the completed turn as a cut turn (state, no items, index not
/// advanced).
#[tokio::test]
async fn completed_turn_written_as_cut_turn() {
    let rec = Rec::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = rec.clone();
    let (tx, mut probe) = probe();
    let h = spawn_on(cfg("c"), SimAgent::new(steps(2)).with_probe(tx), store).await;
    h.push(item(1)).await.unwrap();
    probe
        .until("done", |n| matches!(n, Notice::TurnDone { turn: 0 }))
        .await;
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    let log = rec.log.lock().clone();
    for r in &log {
        eprintln!("save: {:?}", held(r));
    }
    assert!(
        !log.iter()
            .any(|r| held(r).2 == Some(2) && r.interrupted_items.is_empty()),
        "a record holds the final state of a completed turn as a cut turn"
    );
}

/// A record over the 64 MiB decode limit is refused at encode, so it never replaces a
/// good record with one that cannot be read back (S18).
#[test]
fn oversized_record_is_refused_at_encode() {
    let mut r = SessionRecord::new("big", "sim", 0);
    r.unhandled_items = vec![SimItem::new(1, "x".repeat(65 << 20))];
    let e = r.to_write(WriteCondition::Always).unwrap_err();
    assert!(matches!(e, StoreError::Encode { .. }), "{e}");
}

/// close() while another task keeps writing: every write is answered (none waits
/// forever), truthfully (none answered `Closed` ends up stored), and the directory opens
/// again as soon as close() returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_with_concurrent_writers() {
    let dir = TempDir::new("close");
    for round in 0..10u64 {
        let c = agentloop::store::CheckpointActor::<SimItem>::spawn(dir.path())
            .await
            .unwrap();
        let c2 = c.clone();
        let writer = tokio::spawn(async move {
            let mut futs = Vec::new();
            for i in 0..1000u64 {
                let mut r = SessionRecord::new(format!("w{round}-{i}"), "sim", i);
                r.unhandled_items = vec![item(i)];
                futs.push(c2.save(r));
                if i % 20 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            let mut closed = Vec::new();
            for (i, f) in futs.into_iter().enumerate() {
                // Bounded: a write whose send raced the actor's stop once stayed in
                // its mailbox unanswered, and this waited forever.
                let Ok(answer) = tokio::time::timeout(Duration::from_secs(20), f).await else {
                    panic!("round {round}: save {i} was never answered")
                };
                match answer {
                    Ok(()) => {}
                    Err(StoreError::Closed) => closed.push(i),
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            closed
        });
        tokio::time::sleep(Duration::from_micros(300 * round)).await;
        tokio::time::timeout(Duration::from_secs(20), c.close())
            .await
            .expect("close() answers")
            .unwrap();
        let p = dir.path().to_path_buf();
        let reopened = tokio::task::spawn_blocking(move || agentloop::store::SledBackend::open(p))
            .await
            .unwrap();
        let b = match reopened {
            Ok(b) => b,
            Err(e) => panic!("round {round}: the directory is still locked after close(): {e}"),
        };
        let closed = writer.await.unwrap();
        let stored: Vec<usize> = closed
            .iter()
            .copied()
            .filter(|i| b.load(&format!("w{round}-{i}")).unwrap().is_some())
            .collect();
        assert!(
            stored.is_empty(),
            "round {round}: writes answered Closed are in the store: {stored:?}"
        );
        tokio::task::spawn_blocking(move || drop(b)).await.unwrap();
    }
}

/// S18 in sync mode: a failed plan whose TurnFinished is handled after a push leaves a
/// stored record that no longer holds the plan's offered items (not only a crash window:
/// it is the record left after the exit).
#[tokio::test]
async fn failed_plan_window_write_drops_offered_items_for_good() {
    let rec = Rec::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = rec.clone();
    let pg = agentloop_sim::Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn_on(
        cfg("pf"),
        SimAgent::new(steps(1))
            .with_plan_gate(pg.clone())
            .with_probe(tx)
            .with_plan_fn(Arc::new(|_| {
                Err(agentloop::AgentError::failed("planner down"))
            })),
        store,
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.plan_begins(0).await;
    pg.open(1);
    h.push(item(2)).no_wait();
    let exit = within("exit", h.wait()).await;
    let stored = rec.inner.get("pf");
    eprintln!(
        "exit {:?} unhandled {:?}; stored {:?}",
        exit.reason,
        ids(&exit.unhandled_items),
        stored.as_ref().map(held)
    );
    let s = stored.expect("record kept");
    assert!(
        ids(&s.unhandled_items).contains(&1),
        "stored record lost item 1: {:?}",
        held(&s)
    );
}

/// Same for a failed turn: the window write drops the consumed items and keeps the state.
#[tokio::test]
async fn failed_turn_window_write_drops_interrupted_items_for_good() {
    let rec = Rec::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = rec.clone();
    let gate = agentloop_sim::Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn_on(
        cfg("ft"),
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_fault(Some(0), 1, Fault::Fail, true),
        store,
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    gate.open(1);
    probe.at_step(0, 1).await;
    gate.open(1);
    h.push(item(2)).no_wait();
    let exit = within("exit", h.wait()).await;
    let stored = rec.inner.get("ft").expect("record kept");
    eprintln!("exit {:?}; stored {:?}", exit.reason, held(&stored));
    assert!(
        ids(&stored.interrupted_items).contains(&1) || ids(&stored.unhandled_items).contains(&1),
        "stored record after a failed turn lost item 1: {:?}",
        held(&stored)
    );
}

/// No concurrent push needed: safe point then an immediate failure.
#[tokio::test]
async fn safe_point_then_failure_drops_items_from_record() {
    let rec = Rec::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = rec.clone();
    let h = spawn_on(
        cfg("sf"),
        SimAgent::new(steps(2)).with_fault(Some(0), 1, Fault::Fail, true),
        store,
    )
    .await;
    h.push(item(1)).await.unwrap();
    let exit = within("exit", h.wait()).await;
    let stored = rec.inner.get("sf").expect("record kept");
    for r in rec.log.lock().iter() {
        eprintln!("save: {:?}", held(r));
    }
    eprintln!(
        "exit {:?} interrupted {:?}; stored {:?}",
        exit.reason,
        ids(&exit.interrupted_items),
        held(&stored)
    );
    assert!(
        ids(&stored.interrupted_items).contains(&1) || ids(&stored.unhandled_items).contains(&1),
        "stored record after a failed turn lost item 1: {:?}",
        held(&stored)
    );
}
