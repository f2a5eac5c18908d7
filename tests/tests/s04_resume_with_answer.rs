//! S4 (issue 13, 1): a business interrupt asks a question; a persistent session's record
//! keeps it, `Stopped` and awaiting an answer (also when the interrupt happens during a
//! shutdown); nothing resumes it by itself; a caller answers through `Runtime`,
//! `SupervisorHandle` (by id) or `SessionHandle`, also after a process restart; the
//! answer and the claim are one durable write; the resumed turn gets the answer.
//! Typed errors hand the answer back and change nothing.

use std::sync::Arc;

use agentloop::{
    session::AnswerError, store::SessionStatus, CheckpointStore, Durability, ExitReason,
    MemoryStore, Runtime, SessionEvent, SessionHandle, SessionSpec, StopOptions, TurnEnd,
};
use agentloop_sim::{Fault, Gate, Ledger, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use parking_lot::Mutex;
use serde_json::json;

fn persistent(id: &str) -> SessionSpec<SimItem> {
    SessionSpec::new(id, "default")
        .persistent(true)
        .kind("sim")
        .durability(Durability::Sync)
}

fn asks_at_first_step() -> SimAgent {
    SimAgent::new(steps(2)).with_fault(Some(0), 0, Fault::Interrupt, true)
}

/// Runs `id` on `store` until its first turn asks; returns the exit state.
async fn interrupted(id: &str, store: Arc<MemoryStore<SimItem>>) -> agentloop::ExitState<SimItem> {
    let h = spawn_on(persistent(id), asks_at_first_step(), store).await;
    h.push(item(1)).await.unwrap();
    within("the interrupt", h.wait()).await
}

/// The headline: an approval interrupted under a runtime, the runtime shut down and
/// started again (a new process would do the same: the record is all it needs), the
/// runtime does not resume it by itself, the answer goes through the supervisor by
/// id, and the resumed turn sees it beside its saved state and items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s04_an_approval_is_answered_through_the_supervisor_after_a_restart() {
    let dir = TempDir::new("s04-answer");
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("sim", |_cfg: &[u8]| Ok(asks_at_first_step()))
        .start()
        .await
        .unwrap();
    let h = rt
        .supervisor()
        .spawn(SessionSpec::new("approve", "sim").persistent(true))
        .await
        .unwrap();
    h.push(item(1)).await.unwrap();
    let exit = within("the interrupt", h.wait()).await;
    match &exit.reason {
        ExitReason::Interrupted(info) => {
            assert_eq!(info.reason, "simulated approval required");
            assert_eq!(info.question, json!({"turn": 0, "step": 0, "items": [1]}));
        }
        other => panic!("expected Interrupted, got {other:?}"),
    }
    rt.shutdown().await.unwrap();

    let ledger: Arc<Mutex<Option<Arc<Mutex<Ledger>>>>> = Arc::default();
    let l = ledger.clone();
    let (rt, report) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("sim", move |_cfg: &[u8]| {
            let a = SimAgent::new(steps(2));
            *l.lock() = Some(a.ledger());
            Ok(a)
        })
        .start()
        .await
        .unwrap();
    assert!(
        report.resumed.is_empty(),
        "a session awaiting an answer is never resumed by itself: {report:?}"
    );
    let store = rt.store().unwrap();
    let rec = store.load("approve").await.unwrap().expect("the record");
    assert_eq!(rec.status, SessionStatus::Stopped);
    assert!(rec.awaiting_answer);
    assert_eq!(
        rec.interrupt.as_ref().map(|i| i.question.clone()),
        Some(json!({"turn": 0, "step": 0, "items": [1]}))
    );

    let (h, mut events) = rt
        .supervisor()
        .resume_with_answer(
            "approve",
            SimItem::new(99, "approved"),
            Durability::Sync,
            64,
        )
        .await
        .expect("the answer is taken");
    // The answer and the claim are on record before the call returned.
    let rec = store.load("approve").await.unwrap().expect("the record");
    assert!(!rec.awaiting_answer);
    assert_eq!(rec.owner.as_deref(), Some(rt.instance_id()));
    let mut seen = Vec::new();
    while let Some(ev) = within("events", events.next()).await {
        let end = matches!(ev, SessionEvent::TurnEnded { .. });
        seen.push(ev);
        if end {
            break;
        }
    }
    assert!(
        matches!(
            seen.first(),
            Some(SessionEvent::TurnStarted {
                resumed: true,
                items: 1,
                ..
            })
        ),
        "{seen:?}"
    );
    assert!(matches!(
        seen.last(),
        Some(SessionEvent::TurnEnded {
            outcome: TurnEnd::Completed,
            durable: true,
            ..
        })
    ));
    let ledger = ledger.lock().clone().expect("the agent was built");
    assert_eq!(
        ledger.lock().answers,
        vec![(0, 99, "approved".to_string())],
        "the resumed turn got the answer"
    );
    assert_eq!(ledger.lock().delivered_ids(), vec![1]);
    // Answering again: typed, the answer comes back.
    match rt
        .resume_with_answer("approve", SimItem::new(100, "again"))
        .await
    {
        Err(AnswerError::NotAwaiting { answer, .. }) => assert_eq!(answer.id, 100),
        other => panic!("expected NotAwaiting, got {other:?}"),
    }
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
    rt.shutdown().await.unwrap();
}

/// The same through `SessionHandle`, and the record no longer keeps the answer once
/// the resumed turn ran.
#[tokio::test(start_paused = true)]
async fn s04_a_session_handle_answer_reaches_the_resumed_turn_first() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let exit = interrupted("h-answer", store.clone()).await;
    assert!(matches!(exit.reason, ExitReason::Interrupted(_)));
    let agent = SimAgent::new(steps(2));
    let ledger = agent.ledger();
    let (h, events) = SessionHandle::resume_with_answer(
        persistent("h-answer"),
        Arc::new(agent),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
        SimItem::new(7, "yes"),
        64,
    )
    .await
    .unwrap();
    // A new item pushed right away waits behind the resumed turn.
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    let l = ledger.lock().clone();
    assert_eq!(l.answers, vec![(0, 7, "yes".to_string())]);
    assert_eq!(
        l.completed,
        vec![(0, vec![1]), (1, vec![2])],
        "the answer's turn first"
    );
    let evs = collect(events).await;
    assert!(matches!(
        evs[0],
        SessionEvent::TurnStarted { resumed: true, .. }
    ));
    assert!(store.get("h-answer").is_none(), "drained: the record went");
}

/// Bad input: each is typed, hands the answer back and changes nothing.
#[tokio::test(start_paused = true)]
async fn s04_bad_answers_are_typed_and_change_nothing() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let dyn_store = || Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>);
    let answer = |cfg: SessionSpec<SimItem>, s| {
        SessionHandle::<SimItem, SimEvent>::resume_with_answer(
            cfg,
            Arc::new(SimAgent::new(steps(1))),
            s,
            SimItem::new(5, "a"),
            8,
        )
    };
    // Not persistent.
    match answer(SessionSpec::new("x", "default"), dyn_store()).await {
        Err(e @ AnswerError::NotPersistent { .. }) => {
            assert!(e.to_string().contains("not persistent"), "{e}");
            assert_eq!(e.into_answer().map(|a| a.id), Some(5));
        }
        other => panic!("{other:?}"),
    }
    // No record.
    match answer(persistent("nobody"), dyn_store()).await {
        Err(AnswerError::NotFound { answer, .. }) => assert_eq!(answer.id, 5),
        other => panic!("{other:?}"),
    }
    // A stopped record without an interrupt.
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn_on(
        persistent("plain"),
        SimAgent::new(steps(1))
            .with_step_gate(gate.clone())
            .with_probe(tx),
        store.clone(),
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    gate.open_all();
    within("exit", h.wait()).await;
    assert!(
        before_is_stopped(&store, "plain"),
        "item 2 waits in a stopped record"
    );
    let before = store.get("plain");
    match answer(persistent("plain"), dyn_store()).await {
        Err(e @ AnswerError::NotAwaiting { .. }) => {
            assert!(e.to_string().contains("does not await"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get("plain"), before, "unchanged");
    // Two answers at once: exactly one is taken.
    interrupted("twice", store.clone()).await;
    let (a, b) = tokio::join!(
        answer(persistent("twice"), dyn_store()),
        answer(persistent("twice"), dyn_store())
    );
    let taken = [a.is_ok(), b.is_ok()].iter().filter(|ok| **ok).count();
    assert_eq!(taken, 1, "one answer wins");
    for r in [a, b] {
        match r {
            Ok((h, _)) => {
                h.stop(StopOptions::drain()).await.unwrap();
                within("exit", h.wait()).await;
            }
            Err(AnswerError::NotAwaiting { answer, .. }) => assert_eq!(answer.id, 5),
            Err(e) => panic!("{e}"),
        }
    }
}

fn before_is_stopped(store: &MemoryStore<SimItem>, id: &str) -> bool {
    store
        .get(id)
        .is_some_and(|r| r.status == SessionStatus::Stopped && !r.awaiting_answer)
}

/// A plain spawn of a session awaiting an answer is refused and keeps the record, so
/// the question is never lost by starting it without the answer.
#[tokio::test(start_paused = true)]
async fn s04_a_plain_spawn_does_not_resume_a_session_awaiting_an_answer() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    interrupted("waits", store.clone()).await;
    let before = store.get("waits").expect("the record");
    let h = spawn_on(persistent("waits"), SimAgent::new(steps(1)), store.clone()).await;
    let exit = within("exit", h.wait()).await;
    match &exit.reason {
        ExitReason::Failed(e) => assert!(e.contains("resume_with_answer"), "{e}"),
        other => panic!("expected the start refused, got {other:?}"),
    }
    assert_eq!(
        store.get("waits"),
        Some(before),
        "the record is kept as it was"
    );
}

/// An interrupt during a shutdown still waits for its answer: `Stopped`, not the
/// `Interrupted` a shutdown gives other sessions (which `Runtime::start` resumes).
#[tokio::test(start_paused = true)]
async fn s04_an_interrupt_during_a_shutdown_awaits_its_answer() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn_on(
        persistent("shut"),
        asks_at_first_step()
            .with_step_gate(gate.clone())
            .with_probe(tx),
        store.clone(),
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.stop(StopOptions::bare().shutdown()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Interrupted(_)),
        "{:?}",
        exit.reason
    );
    let rec = store.get("shut").expect("the record");
    assert_eq!(rec.status, SessionStatus::Stopped);
    assert!(rec.awaiting_answer);
    assert_eq!(ids(&rec.interrupted_items), vec![1]);
}
