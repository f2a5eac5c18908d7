//! S1–S4: safe points, cancel modes and escalation, the merge of cancels, business
//! interrupts. Every test runs on tokio's paused clock and synchronises on the sim
//! agent's gates and probe, never on sleeps.

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    cancel::CancelMode, exit::CheckpointOutcome, CheckpointStore, Durability, ExitReason,
    MemoryStore, Preempt, PushOptions, SafePoint, SessionEvent, SessionSpec, StopOptions, TurnEnd,
};
use agentloop_sim::{CancelHandling, Fault, Gate, SimAgent, SimItem};
use agentloop_tests::*;

/// S1: a cancel At(AfterToolCalls) is not honoured at an AfterModelCall safe point, and
/// is at the next AfterToolCalls one; the state recorded there is the resumable state.
#[tokio::test(start_paused = true)]
async fn s1_safe_point_honours_only_matching_kinds() {
    let (h, gate, mut probe) = running("s1", SimAgent::new(steps(4))).await;
    h.stop(StopOptions::at(SafePoint::AfterToolCalls))
        .await
        .unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    match &exit.reason {
        ExitReason::Canceled(info) => {
            assert_eq!(info.at, Some(SafePoint::AfterToolCalls));
            assert_eq!(info.mode, CancelMode::At(SafePoint::AfterToolCalls));
            assert!(!info.escalated && !info.timed_out);
        }
        r => panic!("expected Canceled, got {r:?}"),
    }
    // Step 0 (model call) passed its safe point; step 1 (tool round) was the cut.
    let notices = probe.drain();
    assert!(notices
        .iter()
        .any(|n| matches!(n, agentloop_sim::Notice::StepBegin { turn: 0, step: 1 })));
    assert!(!notices
        .iter()
        .any(|n| matches!(n, agentloop_sim::Notice::StepBegin { turn: 0, step: 2 })));
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert!(exit.has_mid_turn_state);
}

/// S1: an agent that swallows the Canceled error does not hide the cancel: the runtime
/// captured it, the turn counts as canceled, its items are interrupted.
#[tokio::test(start_paused = true)]
async fn s1_swallowed_cancel_is_still_captured() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn(
        "s1-swallow",
        SimAgent::new(steps(3))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_cancel_handling(CancelHandling::Swallow),
    )
    .await;
    h.push(item(7)).await.unwrap();
    probe.at_step(0, 0).await;
    h.stop(StopOptions::graceful()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(ref i) if i.at == Some(SafePoint::AfterModelCall)),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.interrupted_items), vec![7]);
    assert_eq!(exit.counters.turns_completed, 0);
}

/// S13/S1: a custom error returned by the agent after a stop-cancel still leaves the
/// cancel captured and interrupted_items set.
#[tokio::test(start_paused = true)]
async fn s13_custom_error_after_stop_cancel_keeps_the_cancel() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn(
        "s13-custom",
        SimAgent::new(steps(3))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_cancel_handling(CancelHandling::CustomError("model client gave up".into())),
    )
    .await;
    h.push(item(3)).await.unwrap();
    probe.at_step(0, 0).await;
    h.stop(StopOptions::graceful()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.interrupted_items), vec![3]);
}

/// S13/S1 (issue 13, 6b): the agent's own error after a captured cancel is kept: in
/// the exit state, in the `TurnEnded` event and in the stored record's `last_error`,
/// while the session still ends `Canceled`.
#[tokio::test(start_paused = true)]
async fn s13_the_agents_error_after_a_captured_cancel_is_kept() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn_on(
        SessionSpec::new("s13-kept", "default")
            .persistent(true)
            .kind("sim")
            .durability(Durability::Sync),
        SimAgent::new(steps(3))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_cancel_handling(CancelHandling::CustomError("model client gave up".into())),
        mem.clone() as Arc<dyn CheckpointStore<SimItem>>,
    )
    .await;
    let mut events = h.subscribe();
    h.push(item(3)).await.unwrap();
    probe.at_step(0, 0).await;
    h.stop(StopOptions::graceful()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    let ExitReason::Canceled(info) = &exit.reason else {
        panic!("{:?}", exit.reason)
    };
    assert_eq!(info.agent_error.as_deref(), Some("model client gave up"));
    let mut seen = None;
    while let Some(ev) = events.next().await {
        if let SessionEvent::TurnEnded { outcome, .. } = ev {
            seen = Some(outcome);
        }
    }
    match seen {
        Some(TurnEnd::Canceled(i)) => {
            assert_eq!(i.agent_error.as_deref(), Some("model client gave up"))
        }
        other => panic!("TurnEnded carried {other:?}"),
    }
    let rec = mem
        .get("s13-kept")
        .expect("the stop leaves a record (item 3 was cut)");
    assert_eq!(rec.last_error.as_deref(), Some("model client gave up"));
}

/// S2: Immediate drops the turn's future at its await point, now: the step never
/// finishes and no later safe point is reached.
#[tokio::test(start_paused = true)]
async fn s2_immediate_drops_the_future_now() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let agent = SimAgent::new(steps(3))
        .with_step_gate(gate.clone())
        .with_probe(tx);
    let ledger = agent.ledger();
    let h = spawn("s2-imm", agent).await;
    h.push(item(1)).await.unwrap();
    gate.open(1); // step 0 passes
    probe.at_step(0, 1).await;
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    match exit.reason {
        ExitReason::Canceled(info) => {
            assert_eq!(info.mode, CancelMode::Immediate);
            assert_eq!(
                info.at, None,
                "Immediate ends at an await point, not a safe point"
            );
        }
        r => panic!("expected Canceled, got {r:?}"),
    }
    // The gate is still closed for step 1: the agent was dropped while waiting there.
    assert!(ledger.lock().completed.is_empty());
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert!(
        exit.has_mid_turn_state,
        "state of the step-0 safe point is kept"
    );
}

/// S2: a cancel with a timeout escalates to Immediate when the turn has not reached a
/// matching safe point in time; the info records escalated and timed_out.
#[tokio::test(start_paused = true)]
async fn s2_graceful_timeout_escalates_to_immediate() {
    let (h, _gate, _probe) = running("s2-timeout", SimAgent::new(steps(3))).await;
    let start = tokio::time::Instant::now();
    h.stop(StopOptions::graceful_timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    // The gate never opens: only the timeout can end the turn.
    let exit = within("exit", h.wait()).await;
    assert!(start.elapsed() >= Duration::from_secs(5));
    match exit.reason {
        ExitReason::Canceled(info) => {
            assert_eq!(info.mode, CancelMode::Immediate);
            assert!(info.escalated, "{info:?}");
            assert!(info.timed_out, "{info:?}");
            assert_eq!(info.at, None);
        }
        r => panic!("expected Canceled, got {r:?}"),
    }
}

/// S12: graceful_timeout followed by an explicit immediate stop escalates (escalated,
/// not timed out); a bare stop after that does not de-escalate.
#[tokio::test(start_paused = true)]
async fn s12_escalation_graceful_then_immediate_and_no_deescalation() {
    let (h, _gate, _probe) = running("s12", SimAgent::new(steps(3))).await;
    h.stop(StopOptions::graceful_timeout(Duration::from_secs(60)))
        .await
        .unwrap();
    h.stop(StopOptions::immediate()).await.unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    match exit.reason {
        ExitReason::Canceled(info) => {
            assert_eq!(info.mode, CancelMode::Immediate);
            assert!(info.escalated);
            assert!(!info.timed_out);
        }
        r => panic!("expected Canceled, got {r:?}"),
    }
}

/// S12: later, weaker stops never weaken the cancel in force: an At(AfterToolCalls)
/// stop followed by a bare stop still ends the turn at the tool-calls safe point with
/// the same mode (the bare stop is "no cancel intent").
#[tokio::test(start_paused = true)]
async fn s12_bare_after_a_cancel_does_not_deescalate() {
    let (h, gate, _probe) = running("s12-bare", SimAgent::new(steps(4))).await;
    h.stop(StopOptions::at(SafePoint::AfterToolCalls))
        .await
        .unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    match exit.reason {
        ExitReason::Canceled(info) => {
            assert_eq!(info.mode, CancelMode::At(SafePoint::AfterToolCalls));
            assert_eq!(info.at, Some(SafePoint::AfterToolCalls));
            assert!(!info.escalated);
        }
        r => panic!("expected Canceled, got {r:?}"),
    }
}

/// S12: an Immediate stop followed by a weaker graceful one stays Immediate.
#[tokio::test(start_paused = true)]
async fn s12_graceful_after_immediate_does_not_deescalate() {
    let (h, _gate, _probe) = running("s12-imm-grace", SimAgent::new(steps(2))).await;
    h.stop(StopOptions::immediate()).await.unwrap();
    h.stop(StopOptions::graceful()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(ref i) if i.mode == CancelMode::Immediate && i.at.is_none()),
        "{:?}",
        exit.reason
    );
}

/// S3: a second preempt against the same turn merges: AfterToolCalls ∪ AfterModelCall
/// ends the turn at the next safe point of either kind.
#[tokio::test(start_paused = true)]
async fn s3_second_preempt_merges_modes() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn(
        "s3-merge",
        // steps: 0 model, 1 tool, 2 model, 3 tool
        SimAgent::new(steps(4))
            .with_step_gate(gate.clone())
            .with_probe(tx),
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    // Only tool calls first: step 0 (model) would not end the turn...
    h.push(item(2))
        .options(PushOptions::preempt(Preempt::after_tool_calls()))
        .await
        .unwrap();
    // ...but merged with AfterModelCall it ends right after step 0.
    h.push(item(3))
        .options(PushOptions::preempt(Preempt::after_model_call()))
        .await
        .unwrap();
    gate.open(1);
    let (items, _) = probe.turn_begins(1).await;
    assert_eq!(
        items,
        vec![1, 2, 3],
        "preempted items first, then the buffer"
    );
    let notices = probe.drain();
    assert!(
        !notices
            .iter()
            .any(|n| matches!(n, agentloop_sim::Notice::StepBegin { turn: 0, step: 1 })),
        "turn 0 must end at the model-call safe point after step 0: {notices:?}"
    );
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(exit.counters.turns_preempted, 1);
    assert_eq!(exit.counters.items_delivered, 3);
}

/// S4: a business interrupt ends the loop with Interrupted; the consumed items become
/// interrupted_items and, for a persistent session, a checkpoint with the state is saved.
#[tokio::test(start_paused = true)]
async fn s4_business_interrupt_saves_a_checkpoint() {
    let store = std::sync::Arc::new(agentloop::MemoryStore::new());
    let h = spawn_persistent(
        "s4",
        SimAgent::new(steps(3)).with_fault(Some(0), 1, Fault::Interrupt, true),
        store.clone(),
    )
    .await;
    h.push(item(1)).await.unwrap();
    let exit = within("exit", h.wait()).await;
    match &exit.reason {
        ExitReason::Interrupted(info) => assert_eq!(info.reason, "simulated approval required"),
        r => panic!("expected Interrupted, got {r:?}"),
    }
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert_eq!(exit.checkpoint, CheckpointOutcome::Saved);
    let rec = store.get("s4").expect("record saved");
    assert_eq!(ids(&rec.interrupted_items), vec![1]);
    let st: agentloop_sim::SimState =
        agentloop::store::codec::decode_state("s4", rec.state.as_ref().expect("state")).unwrap();
    assert_eq!(st.steps_done, 1, "the interrupt came before step 1 ran");
}
