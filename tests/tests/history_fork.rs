//! Issue 13 (4): a session keeps its last N turn-end checkpoints; they can be listed,
//! read, forked into a new session (its items and state), and deleted with the record.
//! History outlives S16's delete of the live record at a clean exit. Paused clock.

use std::sync::Arc;

use agentloop::store::history::{HistoryAnswer, HistoryQuery};
use agentloop::store::SessionStatus;
use agentloop::{
    session::ForkError, CheckpointStore, Durability, MemoryStore, SessionHandle, SessionSpec,
    SpawnError, StopOptions,
};
use agentloop_sim::{Fault, Notice, PlanPolicy, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;

type Handle = SessionHandle<SimItem, SimEvent>;

fn config(id: &str, history: usize) -> SessionSpec<SimItem> {
    SessionSpec::new(id, "default")
        .persistent(true)
        .kind("sim")
        .durability(Durability::Sync)
        .history(history)
}

fn one_per_turn(agent: SimAgent) -> SimAgent {
    agent.with_plan(PlanPolicy {
        limit: Some(1),
        ..Default::default()
    })
}

/// A session keeping `history` checkpoints, one item per turn, whose turn 0 holds item 1
/// at its first step while items 2..=`last` wait behind it.
async fn backlog(
    store: &Arc<MemoryStore<SimItem>>,
    id: &str,
    history: usize,
    last: u64,
) -> (Handle, agentloop_sim::Gate, Probe) {
    let (tx, mut probe) = probe();
    let gate = agentloop_sim::Gate::new();
    let h = spawn_on(
        config(id, history),
        one_per_turn(
            SimAgent::new(steps(1))
                .with_step_gate(gate.clone())
                .with_probe(tx),
        ),
        store.clone(),
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    for i in 2..=last {
        h.push(item(i)).await.unwrap();
    }
    (h, gate, probe)
}

async fn turns(store: &MemoryStore<SimItem>, id: &str) -> Vec<u64> {
    match store.history(id, HistoryQuery::List).await.unwrap() {
        HistoryAnswer::List(l) => l.into_iter().map(|e| e.turn).collect(),
        other => panic!("{other:?}"),
    }
}

/// Five turns with a history of 3: exactly the last three turn ends are kept, each
/// with what waited after it; they outlive the clean exit, which leaves a final record
/// that says how the session ended and holds nothing to resume (S26a, in place of
/// S16's delete).
#[tokio::test(start_paused = true)]
async fn history_keeps_exactly_n_and_outlives_the_clean_exit() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (h, gate, mut probe) = backlog(&store, "hist", 3, 5).await;
    gate.open_all();
    probe
        .until("turn 4 done", |n| matches!(n, Notice::TurnDone { turn: 4 }))
        .await;
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    let end = store
        .get("hist")
        .expect("a session that keeps history keeps a final record at its clean end (S26a)");
    assert_eq!(end.status, SessionStatus::Stopped, "it ended by a stop");
    assert!(
        end.unhandled_items.is_empty() && end.interrupted_items.is_empty(),
        "nothing is left to resume: {end:?}"
    );
    assert!(end.state.is_none(), "no state is kept");
    assert_eq!(
        turns(&store, "hist").await,
        vec![2, 3, 4],
        "the newest three"
    );
    match store.history("hist", HistoryQuery::Load(2)).await.unwrap() {
        HistoryAnswer::Load(Some(r)) => {
            assert_eq!(r.header.turn_index, 3, "the record after turn 2's end");
            assert_eq!(r.items.len(), 2, "items 4 and 5 still waited");
        }
        other => panic!("{other:?}"),
    }
}

/// A fork from a turn end gets the items that waited at that point; the source is
/// untouched; forking onto an existing id and from an unknown checkpoint are typed
/// errors that write nothing.
#[tokio::test(start_paused = true)]
async fn fork_yields_the_saved_items_and_bad_forks_are_typed() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let dyn_store = || Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>);
    let (h, gate, mut probe) = backlog(&store, "source", 10, 4).await;
    gate.open(1);
    probe
        .until("turn 0 done", |n| matches!(n, Notice::TurnDone { turn: 0 }))
        .await;
    // Turn 0's end left 2, 3, 4 waiting.
    let agent = SimAgent::new(steps(1));
    let ledger = agent.ledger();
    let fork: Handle =
        SessionHandle::fork(config("fork", 0), Arc::new(agent), dyn_store(), "source", 0)
            .await
            .expect("the fork starts");
    fork.stop(StopOptions::drain()).await.unwrap();
    within("the fork's exit", fork.wait()).await;
    assert_eq!(
        ledger.lock().delivered_ids(),
        vec![2, 3, 4],
        "the saved items"
    );

    // Onto an existing id: refused, the record unchanged.
    let before = store.get_stored("source");
    match SessionHandle::<SimItem, SimEvent>::fork(
        config("source", 0),
        Arc::new(SimAgent::new(steps(1))),
        dyn_store(),
        "source",
        0,
    )
    .await
    {
        Err(e @ ForkError::Exists { .. }) => assert!(e.to_string().contains("another id"), "{e}"),
        other => panic!("expected Exists, got {other:?}"),
    }
    assert_eq!(store.get_stored("source"), before);
    // An unknown checkpoint.
    match SessionHandle::<SimItem, SimEvent>::fork(
        config("fork-2", 0),
        Arc::new(SimAgent::new(steps(1))),
        dyn_store(),
        "source",
        99,
    )
    .await
    {
        Err(e @ ForkError::UnknownCheckpoint { .. }) => {
            assert!(e.to_string().contains("sessions history source"), "{e}")
        }
        other => panic!("expected UnknownCheckpoint, got {other:?}"),
    }
    assert!(store.get_stored("fork-2").is_none(), "nothing written");
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
}

/// A fork of an interrupted turn's checkpoint resumes the cut turn from its state.
#[tokio::test(start_paused = true)]
async fn fork_of_an_interrupted_turn_resumes_its_state() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let h = spawn_on(
        config("asks", 5),
        SimAgent::new(steps(3)).with_fault(Some(0), 2, Fault::Interrupt, true),
        store.clone(),
    )
    .await;
    h.push(item(7)).await.unwrap();
    within("the interrupt", h.wait()).await;
    assert_eq!(
        turns(&store, "asks").await,
        vec![0],
        "the final write kept turn 0"
    );
    let (tx, mut probe) = probe();
    let fork: Handle = SessionHandle::fork(
        config("asks-fork", 0),
        Arc::new(SimAgent::new(steps(3)).with_probe(tx)),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
        "asks",
        0,
    )
    .await
    .unwrap();
    let begin = probe
        .until("the fork's first turn", |n| {
            matches!(n, Notice::TurnBegin { .. })
        })
        .await;
    assert_eq!(
        begin,
        Notice::TurnBegin {
            turn: 0,
            items: vec![7],
            resumed: true
        },
        "the cut turn with its items and state"
    );
    // It resumed after the safe points it had passed.
    probe.at_step(0, 2).await;
    fork.stop(StopOptions::drain()).await.unwrap();
    within("exit", fork.wait()).await;
    let rec = store.get("asks").expect("the source is untouched");
    assert!(rec.awaiting_answer);
}

/// Bad input: a history over the bound, or one that nothing would write.
#[tokio::test(start_paused = true)]
async fn history_bounds_are_typed_spawn_errors() {
    let store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(MemoryStore::<SimItem>::new());
    for (cfg, needle) in [
        (config("big", 1_001), "over the bound of 1000"),
        (
            config("exit", 3).durability(Durability::Exit),
            "durability Turn or Sync",
        ),
        (SessionSpec::new("mem", "default").history(3), "persistent"),
    ] {
        match SessionHandle::<SimItem, SimEvent>::spawn(
            cfg,
            Arc::new(SimAgent::new(steps(1))),
            Some(store.clone()),
        )
        .await
        {
            Err(e @ SpawnError::History { .. }) => {
                assert!(e.to_string().contains(needle), "{e}")
            }
            other => panic!("expected SpawnError::History, got {other:?}"),
        }
    }
}

/// An explicit delete removes the record and its history (`purge`); the runtime
/// refuses it while the session runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_removes_record_and_history_and_waits_for_a_stop() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (rt, _) = agentloop::Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone())
        .flush_logs(None)
        .register_agent("sim", |_: &[u8]| {
            Ok(SimAgent::new(steps(1)).with_fault(Some(1), 0, Fault::Interrupt, true))
        })
        .start()
        .await
        .unwrap();
    let h = rt
        .supervisor()
        .spawn(
            agentloop::SessionSpec::new("gone", "sim")
                .persistent(true)
                .history(5),
        )
        .await
        .unwrap();
    h.push(item(1)).await.unwrap();
    assert!(matches!(
        rt.delete("gone").await,
        Err(agentloop::SupervisorError::Running(_))
    ));
    h.push(item(2)).await.unwrap();
    within("the interrupt", h.wait()).await;
    assert_eq!(
        rt.history("gone")
            .await
            .unwrap()
            .iter()
            .map(|e| e.turn)
            .collect::<Vec<_>>(),
        vec![0, 1]
    );
    let view = rt
        .checkpoint("gone", 1)
        .await
        .unwrap()
        .expect("turn 1's end");
    assert_eq!(view.interrupted_items.len(), 1);
    // Forked through the runtime.
    let f = rt.fork("gone", 1, "gone-fork", 0).await.unwrap();
    f.stop(StopOptions::drain()).await.unwrap();
    within("fork exit", f.wait()).await;
    assert!(rt.delete("gone").await.unwrap());
    assert!(store.get_stored("gone").is_none());
    assert!(rt.history("gone").await.unwrap().is_empty());
    assert!(!rt.delete("gone").await.unwrap(), "nothing left");
    rt.stop(StopOptions::bare()).await.unwrap();
}
