//! S16–S18 on the in-memory store: the save/delete decision at exit, resume from a
//! mid-turn or between-turns record, and never destroying resumability by accident.
//! (The sled store and the checkpoint actor come with the checkpoint issue.)

use std::sync::Arc;

use agentloop::{
    exit::CheckpointOutcome, store::SessionRecord, store::SessionStatus, ExitReason, MemoryStore,
    StopOptions,
};
use agentloop_sim::{Fault, Gate, SimAgent, SimItem, SimState};
use agentloop_tests::*;

fn store() -> Arc<MemoryStore<SimItem>> {
    Arc::new(MemoryStore::new())
}

fn stale_record(id: &str) -> SessionRecord<SimItem> {
    SessionRecord {
        session_id: id.into(),
        agent_kind: "sim".into(),
        agent_config: vec![],
        status: SessionStatus::Stopped,
        turn_index: 4,
        unhandled_items: vec![],
        interrupted_items: vec![],
        state: None,
        stop_cause: None,
        last_error: None,
        owner: None,
        heartbeat_ms: 1,
        created_at_ms: 1,
        updated_at_ms: 1,
        version: 1,
        lease_epoch: 0,
        last_event_seq: 0,
        interrupt: None,
        awaiting_answer: false,
        answer: None,
        settings: None,
        journal: None,
        state_carried: false,
        agent_version: 1,
    }
}

/// S16: a bare stop with buffered items saves them; the record is `Stopped`.
#[tokio::test(start_paused = true)]
async fn s16_stop_with_items_saves() {
    let store = store();
    let (h, gate, _probe) =
        running_persistent("save", SimAgent::new(steps(2)), store.clone()).await;
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::bare().cause("night")).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.checkpoint, CheckpointOutcome::Saved);
    let rec = store.get("save").unwrap();
    assert_eq!(rec.status, SessionStatus::Stopped);
    assert_eq!(ids(&rec.unhandled_items), vec![2]);
    assert!(rec.interrupted_items.is_empty() && rec.state.is_none());
    assert_eq!(rec.turn_index, 1);
    assert_eq!(rec.stop_cause.as_deref(), Some("night"));
}

/// S16: a clean exit (drain, nothing left) deletes a stale record.
#[tokio::test(start_paused = true)]
async fn s16_clean_exit_deletes_the_stale_record() {
    let store = store();
    store.insert(stale_record("clean"));
    let h = spawn_persistent("clean", SimAgent::new(steps(1)), store.clone()).await;
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(exit.checkpoint, CheckpointOutcome::Deleted);
    assert!(store.get("clean").is_none());
}

/// S16: a save error lands in the checkpoint outcome, never in the reason; the items are
/// still in the exit state.
#[tokio::test(start_paused = true)]
async fn s16_save_error_goes_to_the_outcome_not_the_reason() {
    let store = store();
    let (h, gate, _probe) =
        running_persistent("save-fails", SimAgent::new(steps(2)), store.clone()).await;
    store.fail_saves(true);
    h.stop(StopOptions::graceful()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert!(
        matches!(&exit.checkpoint, CheckpointOutcome::Failed(e) if e.contains("injected save failure")),
        "{:?}",
        exit.checkpoint
    );
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
}

/// S17: a mid-turn record makes the first turn a resume turn: the agent gets the saved
/// state and the interrupted items; new items wait behind them; completing the resumed
/// turn replaces the record so the state is never resumed twice.
#[tokio::test(start_paused = true)]
async fn s17_resume_mid_turn_then_new_items_and_no_second_resume() {
    let store = store();
    let (h, gate, mut probe) =
        running_persistent("resume", SimAgent::new(steps(3)), store.clone()).await;
    gate.open(1);
    probe.at_step(0, 1).await; // step 0 done and recorded at its safe point
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.checkpoint, CheckpointOutcome::Saved);
    let rec = store.get("resume").unwrap();
    assert!(rec.is_mid_turn());
    assert_eq!(rec.turn_index, 0);

    // Resume: the first turn continues from step 1 with item 1; item 2 waits behind.
    let gate = Gate::new();
    let (tx, probe2) = agentloop_tests::probe();
    let mut probe = probe2;
    let agent = SimAgent::new(steps(3))
        .with_step_gate(gate.clone())
        .with_probe(tx);
    let ledger = agent.ledger();
    let h = spawn_persistent("resume", agent, store.clone()).await;
    h.push(item(2)).await.unwrap();
    let (items, resumed) = probe.turn_begins(0).await;
    assert_eq!((items, resumed), (vec![1], true));
    probe.at_step(0, 1).await; // it skips step 0: the saved state had it done
    gate.open(2); // steps 1 and 2 of the resumed turn
    let (items, resumed) = probe.turn_begins(1).await;
    assert_eq!((items, resumed), (vec![2], false));
    // The resumed turn completed: its mid-turn state is gone from the store (replaced
    // by a between-turns record holding what was buffered, or deleted).
    let rec = store.get("resume");
    assert!(rec.as_ref().is_none_or(|r| !r.is_mid_turn()), "{rec:?}");
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(ledger.lock().delivered_ids(), vec![1, 2]);
    assert!(store.get("resume").is_none(), "clean exit deletes");
}

/// S17: a between-turns record puts its unhandled items back at the front of the
/// buffer, ahead of new ones, in order.
#[tokio::test(start_paused = true)]
async fn s17_resume_between_turns_preserves_order() {
    let store = store();
    let mut rec = stale_record("between");
    rec.unhandled_items = vec![item(1), item(2)];
    store.insert(rec);
    let (h, gate, mut probe) =
        gated_persistent("between", SimAgent::new(steps(1)), store.clone()).await;
    let (items, resumed) = probe.turn_begins(4).await;
    assert_eq!(
        (items, resumed),
        (vec![1, 2], false),
        "turn index continues"
    );
    h.push(item(3)).await.unwrap();
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_delivered, 3);
}

/// S18: a failed load leaves the stored record as it was and reports the error.
#[tokio::test(start_paused = true)]
async fn s18_load_error_keeps_the_record() {
    let store = store();
    let mut rec = stale_record("load-fails");
    rec.unhandled_items = vec![item(1)];
    store.insert(rec.clone());
    store.fail_loads(true);
    let h = spawn_persistent("load-fails", SimAgent::new(steps(1)), store.clone()).await;
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("injected load failure")),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.checkpoint, CheckpointOutcome::NotAttempted);
    store.fail_loads(false);
    assert_eq!(store.get("load-fails"), Some(rec));
}

/// S18: a corrupt state in the record is reported as corrupt and the record is kept.
#[tokio::test(start_paused = true)]
async fn s18_corrupt_record_is_kept() {
    let store = store();
    let mut rec = stale_record("corrupt");
    rec.interrupted_items = vec![item(1)];
    rec.state = Some(vec![0xff, 0xff, 0xff]);
    store.insert(rec.clone());
    let h = spawn_persistent("corrupt", SimAgent::new(steps(1)), store.clone()).await;
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("corrupt")),
        "{:?}",
        exit.reason
    );
    assert_eq!(store.get("corrupt"), Some(rec));
}

/// S18: a failed resume turn leaves the record as it was.
#[tokio::test(start_paused = true)]
async fn s18_failed_resume_turn_keeps_the_record() {
    let store = store();
    let mut rec = stale_record("resume-fails");
    rec.turn_index = 2;
    rec.interrupted_items = vec![item(1)];
    rec.state = Some(
        agentloop::store::codec::encode_state(
            "resume-fails",
            &SimState {
                turn: 2,
                items: vec![1],
                steps_done: 1,
                payload: vec![],
            },
        )
        .unwrap(),
    );
    store.insert(rec.clone());
    let h = spawn_persistent(
        "resume-fails",
        SimAgent::new(steps(3)).with_fault(Some(2), 1, Fault::Fail, true),
        store.clone(),
    )
    .await;
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Failed(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.checkpoint, CheckpointOutcome::NotAttempted);
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert_eq!(store.get("resume-fails"), Some(rec));
}

/// S17/S18: a loaded between-turns record is replaced once a turn completes, so a
/// later failure (which leaves the record alone) cannot replay delivered items.
#[tokio::test(start_paused = true)]
async fn s17_loaded_record_is_replaced_after_a_completed_turn() {
    let store = store();
    let mut rec = stale_record("stale");
    rec.turn_index = 0;
    rec.unhandled_items = vec![item(1)];
    store.insert(rec);
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn_persistent(
        "stale",
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_fault(Some(1), 0, Fault::Fail, true),
        store.clone(),
    )
    .await;
    assert_eq!(probe.turn_begins(0).await.0, vec![1]);
    h.push(item(2)).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Failed(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.interrupted_items), vec![2]);
    // Item 1 was delivered: the record must not offer it again.
    let rec = store.get("stale");
    assert!(
        rec.as_ref()
            .is_none_or(|r| !ids(&r.unhandled_items).contains(&1)),
        "{rec:?}"
    );
}
