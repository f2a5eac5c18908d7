//! Issue 13 (3): durable turn ends. Under `Durability::Turn` the record is written at
//! every turn end; under `Turn` and `Sync`, `TurnEnded { durable: true }` is sent only
//! after the write holding that turn's end, and events keep their order. Under `Exit`
//! and without a store, `durable` is false. A store whose writes land only when the
//! test opens its gate shows what a subscriber can observe. Paused clock.

use std::sync::Arc;
use std::time::Duration;

use agentloop::store::{RecordWrite, Stored, StoredEntry};
use agentloop::{
    store::CasOutcome, store::SessionStatus, store::StatusKind, CheckpointStore, Durability,
    EventStream, MemoryStore, SessionEvent, SessionSpec, StopOptions, StoreError, TurnEnd,
};
use agentloop_sim::{Fault, PlanPolicy, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use futures::future::BoxFuture;

/// An operation issued and not landed yet.
enum Op {
    Write(Box<RecordWrite>),
    Delete(String),
}

/// A store whose writes are applied only when the gate is open (a write issued while
/// it is closed waits, then lands): what it holds is what a flushed write made durable.
/// Operations land in the order they were issued (the store's ordering contract).
struct LandingGate {
    inner: Arc<MemoryStore<SimItem>>,
    open: tokio::sync::watch::Sender<bool>,
    queue: Arc<parking_lot::Mutex<std::collections::VecDeque<Op>>>,
}

impl LandingGate {
    fn new() -> Arc<Self> {
        Arc::new(LandingGate {
            inner: Arc::new(MemoryStore::new()),
            open: tokio::sync::watch::Sender::new(false),
            queue: Arc::default(),
        })
    }

    /// Queues `op` now; the future lands every queued operation, in order, once the
    /// gate is open.
    fn issue(&self, op: Op) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.queue.lock().push_back(op);
        let mut rx = self.open.subscribe();
        let (inner, queue) = (self.inner.clone(), self.queue.clone());
        Box::pin(async move {
            let _ = rx.wait_for(|open| *open).await;
            let ops: Vec<Op> = queue.lock().drain(..).collect();
            let mut last = Ok(true);
            for op in ops {
                last = match op {
                    Op::Write(w) => inner.write(*w).await.map(|()| true),
                    Op::Delete(id) => inner.delete(&id).await,
                };
            }
            last
        })
    }

    fn holds(&self, id: &str) -> Vec<u64> {
        self.inner
            .get(id)
            .map(|r| {
                ids(&r.unhandled_items)
                    .into_iter()
                    .chain(ids(&r.interrupted_items))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl CheckpointStore<SimItem> for LandingGate {
    fn load_stored<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        self.inner.load_stored(id)
    }
    fn write(&self, w: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        let landed = self.issue(Op::Write(Box::new(w)));
        Box::pin(async move { landed.await.map(|_| ()) })
    }
    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.issue(Op::Delete(id.to_string()))
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
        Box::pin(async { Ok(()) })
    }
    fn beat(&self, i: &str, t: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.beat(i, t)
    }
    fn heartbeat(&self, i: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        self.inner.heartbeat(i)
    }
}

fn config(id: &str, d: Durability) -> SessionSpec<SimItem> {
    SessionSpec::new(id, "default")
        .persistent(true)
        .kind("sim")
        .durability(d)
}

/// The next `TurnEnded`, or `None` if none comes within a second of (paused) time.
async fn next_turn_end(events: &mut EventStream<SimEvent>) -> Option<(u64, TurnEnd, bool)> {
    tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(ev) = events.next().await {
            if let SessionEvent::TurnEnded {
                turn,
                outcome,
                durable,
            } = ev
            {
                return Some((turn, outcome, durable));
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

async fn turn_end_waits_for_its_write(d: Durability) {
    let gated = LandingGate::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = gated.clone();
    let id = format!("durable-{d:?}");
    let gate = agentloop_sim::Gate::new();
    let h = spawn_on(
        config(&id, d),
        SimAgent::new(steps(1)).with_step_gate(gate.clone()),
        store,
    )
    .await;
    let mut events = h.subscribe();
    let h2 = h.clone();
    // Under `sync` the push itself waits for its write; under `turn` it is answered at
    // once.
    let push = tokio::spawn(async move { h2.push(item(1)).await });
    if d == Durability::Sync {
        gated.open.send_replace(true);
        within("the push", push).await.unwrap().unwrap();
        gated.open.send_replace(false);
    } else {
        within("the push", push).await.unwrap().unwrap();
    }
    // The turn runs to its end; its end's write must wait.
    gate.open_all();
    assert_eq!(
        next_turn_end(&mut events).await,
        None,
        "TurnEnded came before the write holding the turn's end"
    );
    assert!(
        gated.inner.get(&id).is_none_or(|r| r.turn_index == 0),
        "the turn end is not on record yet"
    );
    gated.open.send_replace(true);
    let (turn, outcome, durable) = next_turn_end(&mut events).await.expect("TurnEnded");
    // Observed: the record holds the turn's end (its item left, the turn counted).
    let rec = gated.inner.get(&id).expect("a record");
    assert_eq!((turn, outcome, durable), (0, TurnEnd::Completed, true));
    assert!(
        gated.holds(&id).is_empty(),
        "the consumed item left the record"
    );
    assert_eq!(rec.turn_index, 1, "the record is past turn 0");
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
}

/// Issue 13 (3): under `turn`, `TurnEnded { durable: true }` is never observed before
/// the record holds that turn's end.
#[tokio::test(start_paused = true)]
async fn turn_durability_sends_turn_ended_after_its_write() {
    turn_end_waits_for_its_write(Durability::Turn).await;
}

/// Issue 13 (3): the same under `sync`.
#[tokio::test(start_paused = true)]
async fn sync_durability_sends_turn_ended_after_its_write() {
    turn_end_waits_for_its_write(Durability::Sync).await;
}

/// Issue 13 (3): under `turn`, a push writes nothing (it is answered at once); the
/// turn end writes the record.
#[tokio::test(start_paused = true)]
async fn turn_durability_writes_at_turn_ends_not_at_pushes() {
    let gated = LandingGate::new();
    gated.open.send_replace(true);
    let store: Arc<dyn CheckpointStore<SimItem>> = gated.clone();
    let gate = agentloop_sim::Gate::new();
    let h = spawn_on(
        config("turn-writes", Durability::Turn),
        SimAgent::new(steps(1)).with_step_gate(gate.clone()),
        store,
    )
    .await;
    let mut events = h.subscribe();
    h.push(item(1)).await.unwrap();
    h.push(item(2)).await.unwrap();
    assert!(
        gated.inner.get("turn-writes").is_none(),
        "a push under `turn` writes nothing"
    );
    gate.open(1);
    let (turn, _, durable) = next_turn_end(&mut events).await.expect("turn 0 ends");
    assert_eq!((turn, durable), (0, true));
    assert_eq!(
        gated.holds("turn-writes"),
        vec![2],
        "the turn end wrote what waits"
    );
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
}

/// Issue 13 (3): `TurnStarted` of turn n+1 never comes before `TurnEnded` of turn n,
/// although turn n+1 is ready while turn n's write waits.
#[tokio::test(start_paused = true)]
async fn the_next_turn_starts_after_the_durable_turn_end() {
    let gated = LandingGate::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = gated.clone();
    let h = spawn_on(
        config("order", Durability::Turn),
        SimAgent::new(steps(1)).with_plan(PlanPolicy {
            limit: Some(1),
            ..Default::default()
        }),
        store,
    )
    .await;
    let events = h.subscribe();
    h.push(item(1)).await.unwrap();
    h.push(item(2)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    gated.open.send_replace(true);
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    let evs = collect(events).await;
    let order: Vec<String> = evs
        .iter()
        .filter_map(|e| match e {
            SessionEvent::TurnStarted { turn, .. } => Some(format!("start{turn}")),
            SessionEvent::TurnEnded { turn, durable, .. } => Some(format!("end{turn}:{durable}")),
            SessionEvent::Ended(_) => Some("Ended".into()),
            _ => None,
        })
        .collect();
    assert_eq!(
        order,
        vec!["start0", "end0:true", "start1", "end1:true", "Ended"]
    );
}

/// Issue 13 (3): a turn that ends the session (an interrupt) is durable once the final
/// write lands; its `TurnEnded` still comes before `Ended`.
#[tokio::test(start_paused = true)]
async fn a_turn_that_ends_the_session_is_durable_with_the_final_write() {
    let gated = LandingGate::new();
    let store: Arc<dyn CheckpointStore<SimItem>> = gated.clone();
    let h = spawn_on(
        config("ends", Durability::Turn),
        SimAgent::new(steps(1)).with_fault(Some(0), 0, Fault::Interrupt, true),
        store,
    )
    .await;
    let mut events = h.subscribe();
    h.push(item(1)).await.unwrap();
    assert_eq!(
        next_turn_end(&mut events).await,
        None,
        "the final write waits"
    );
    gated.open.send_replace(true);
    let (_, outcome, durable) = next_turn_end(&mut events).await.expect("TurnEnded");
    assert!(matches!(outcome, TurnEnd::Interrupted(_)));
    assert!(durable);
    assert_eq!(
        gated.holds("ends"),
        vec![1],
        "the interrupted item is on record"
    );
    assert!(matches!(events.next().await, Some(SessionEvent::Ended(_))));
    assert!(events.next().await.is_none());
}

/// Issue 13 (3): under `exit`, `durable` is false (nothing is written at turn ends).
#[tokio::test(start_paused = true)]
async fn exit_durability_turn_ends_are_not_durable() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let h = spawn_persistent("exit-durable", SimAgent::new(steps(1)), store.clone()).await;
    let mut events = h.subscribe();
    h.push(item(1)).await.unwrap();
    let (_, outcome, durable) = next_turn_end(&mut events).await.expect("TurnEnded");
    assert_eq!((outcome, durable), (TurnEnd::Completed, false));
    assert!(store.get("exit-durable").is_none(), "nothing written");
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
}
