//! S11–S14: every stop option alone, how stops combine, the exit state, late items.
//! Paused clock; gates and probes only.

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    cancel::CancelMode, Agent, AgentError, ExitReason, PushError, SafePoint, SessionHandle,
    SessionSpec, StopOptions, Turn, TurnCx, TurnOutcome,
};
use agentloop_sim::{Gate, SimAgent, SimItem};
use agentloop_tests::*;

/// S11 bare stop: no cancel; the running turn completes; the loop exits at the
/// boundary; buffered items become unhandled.
#[tokio::test(start_paused = true)]
async fn s11_bare_stop_completes_the_turn_and_leaves_the_buffer_unhandled() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let agent = SimAgent::new(steps(3))
        .with_step_gate(gate.clone())
        .with_probe(tx);
    let ledger = agent.ledger();
    let h = spawn("bare", agent).await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.push(item(3)).await.unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(
        ledger.lock().delivered_ids(),
        vec![1],
        "the running turn completed"
    );
    assert_eq!(ids(&exit.unhandled_items), vec![2, 3]);
    assert!(exit.interrupted_items.is_empty());
    assert_eq!(exit.counters.turns_completed, 1);
}

/// S11 graceful: cancel at the next safe point of any kind.
#[tokio::test(start_paused = true)]
async fn s11_graceful_stop_cuts_at_the_next_safe_point() {
    let (h, gate, _probe) = running("graceful", SimAgent::new(steps(3))).await;
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::graceful()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    match exit.reason {
        ExitReason::Canceled(info) => {
            assert_eq!(info.mode, CancelMode::At(SafePoint::AnySafePoint));
            assert_eq!(info.at, Some(SafePoint::AfterModelCall));
        }
        r => panic!("expected Canceled, got {r:?}"),
    }
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert_eq!(ids(&exit.unhandled_items), vec![2]);
}

/// S11 graceful_timeout: like graceful, escalating to Immediate after the timeout (the
/// escalation itself is pinned in s01_s04_turns); when a safe point comes first the
/// turn ends there and nothing is escalated.
#[tokio::test(start_paused = true)]
async fn s11_graceful_timeout_ends_at_a_safe_point_when_one_comes_in_time() {
    let (h, gate, _probe) = running("graceful-timeout", SimAgent::new(steps(3))).await;
    h.stop(StopOptions::graceful_timeout(Duration::from_secs(30)))
        .await
        .unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    match exit.reason {
        ExitReason::Canceled(info) => {
            assert_eq!(info.at, Some(SafePoint::AfterModelCall));
            assert!(!info.escalated && !info.timed_out);
        }
        r => panic!("expected Canceled, got {r:?}"),
    }
}

/// S11 immediate: the running turn is dropped now.
#[tokio::test(start_paused = true)]
async fn s11_immediate_stop_drops_the_turn() {
    let (h, _gate, _probe) = running("immediate", SimAgent::new(steps(3))).await;
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(matches!(exit.reason, ExitReason::Canceled(i) if i.mode == CancelMode::Immediate));
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert!(!exit.has_mid_turn_state, "no safe point was reached");
}

/// S11 drain: every accepted item is finished (turns run as usual), nothing unhandled;
/// pushes after the drain are late.
#[tokio::test(start_paused = true)]
async fn s11_drain_leaves_nothing_unhandled() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let agent = SimAgent::new(steps(2))
        .with_step_gate(gate.clone())
        .with_probe(tx)
        .with_plan(agentloop_sim::PlanPolicy {
            limit: Some(1),
            ..Default::default()
        });
    let ledger = agent.ledger();
    let h = spawn("drain", agent).await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    for id in 2..=4 {
        h.push(item(id)).await.unwrap();
    }
    h.stop(StopOptions::drain()).await.unwrap();
    let late = h.push(item(5)).await.unwrap_err();
    assert!(matches!(late, PushError::Late { ref item } if item.id == 5));
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert!(exit.unhandled_items.is_empty());
    assert!(exit.interrupted_items.is_empty());
    assert_eq!(ledger.lock().delivered_ids(), vec![1, 2, 3, 4]);
    assert_eq!(ids(&exit.late_items), vec![5]);
}

/// S11 until_idle_for: never cancels a running turn, resets when an item arrives, exits
/// once idle for the whole duration; cancel options in the same call are ignored.
#[tokio::test(start_paused = true)]
async fn s11_until_idle_for_waits_for_continuous_idleness() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let agent = SimAgent::new(steps(2))
        .with_step_gate(gate.clone())
        .with_probe(tx);
    let ledger = agent.ledger();
    let h = spawn("idle", agent).await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    let start = tokio::time::Instant::now();
    let mut idle = StopOptions::until_idle_for(Duration::from_secs(10));
    idle.cancel = StopOptions::immediate().cancel; // must be ignored
    h.stop(idle).await.unwrap();
    // The running turn is not canceled, however long it takes.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(h.exit_state().is_none());
    gate.open_all();
    probe
        .until("turn 0 done", |n| {
            matches!(n, agentloop_sim::Notice::TurnDone { turn: 0 })
        })
        .await;
    // Idle now; an item after 6 s resets the timer.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(h.exit_state().is_none());
    h.push(item(2)).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(ledger.lock().delivered_ids(), vec![1, 2]);
    assert!(
        start.elapsed() >= Duration::from_secs(60 + 6 + 10),
        "the item reset the idle timer"
    );
}

/// S11: only the first until_idle_for counts (a later one neither replaces nor
/// postpones it); a later non-idle stop commits at once.
#[tokio::test(start_paused = true)]
async fn s11_first_idle_request_counts_and_a_later_stop_commits_at_once() {
    let h = spawn("idle-first", SimAgent::new(steps(1))).await;
    let start = tokio::time::Instant::now();
    h.stop(StopOptions::until_idle_for(Duration::from_secs(5)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    h.stop(StopOptions::until_idle_for(Duration::from_secs(500)))
        .await
        .unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(5),
        "exits on the first timer"
    );
    assert_eq!(exit.reason, ExitReason::Completed);

    let h = spawn("idle-then-bare", SimAgent::new(steps(1))).await;
    let start = tokio::time::Instant::now();
    h.stop(StopOptions::until_idle_for(Duration::from_secs(500)))
        .await
        .unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// S11: skip_checkpoint set by an early stop survives a later stop without it (sticky);
/// a persistent session then saves nothing and deletes a stale record.
#[tokio::test(start_paused = true)]
async fn s11_skip_checkpoint_is_sticky_across_stops() {
    let store = Arc::new(agentloop::MemoryStore::new());
    let (h, _gate, _probe) =
        running_persistent("skip", SimAgent::new(steps(3)), store.clone()).await;
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::bare().skip_checkpoint()).await.unwrap();
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(matches!(exit.reason, ExitReason::Canceled(_)));
    assert_eq!(ids(&exit.unhandled_items), vec![2]);
    assert_ne!(exit.checkpoint, agentloop::exit::CheckpointOutcome::Saved);
    assert!(store.get("skip").is_none(), "nothing persisted");
    assert_eq!(store.save_count(), 0);
}

/// S11: the first non-empty cause wins across all stops: an empty cause does not
/// count, later causes do not overwrite.
#[tokio::test(start_paused = true)]
async fn s11_first_non_empty_cause_wins() {
    let (h, _gate, _probe) = running("cause", SimAgent::new(steps(2))).await;
    h.stop(StopOptions::bare().cause("")).await.unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    h.stop(StopOptions::bare().cause("quota exceeded"))
        .await
        .unwrap();
    h.stop(StopOptions::immediate().cause("user left"))
        .await
        .unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.stop_cause.as_deref(), Some("quota exceeded"));
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "the mechanism is kept apart"
    );
}

/// S13: the cause is readable through TurnCx::stop_cause() once stopped() fired.
#[tokio::test(start_paused = true)]
async fn s13_stop_cause_readable_after_stopped_fires() {
    struct Reader {
        seen: Arc<parking_lot::Mutex<Option<Option<String>>>>,
    }
    impl Agent for Reader {
        type Item = SimItem;
        type Event = agentloop_sim::SimEvent;
        type State = u8;
        async fn run_turn(
            &self,
            _turn: Turn<Self>,
            cx: TurnCx<Self>,
        ) -> Result<TurnOutcome<u8>, AgentError> {
            cx.stopped().await;
            *self.seen.lock() = Some(cx.stop_cause());
            Ok(TurnOutcome::Completed)
        }
    }
    let seen = Arc::new(parking_lot::Mutex::new(None));
    let h: Handle = SessionHandle::spawn(
        SessionSpec::new("cause-cx", "default"),
        Arc::new(Reader { seen: seen.clone() }),
        None,
    )
    .await
    .unwrap();
    h.push(item(1)).await.unwrap();
    h.stop(StopOptions::bare().cause("maintenance"))
        .await
        .unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(seen.lock().clone(), Some(Some("maintenance".to_string())));
}

/// S14: a push after the stop committed is rejected with the item in the error, and a
/// copy goes to the late list, even for a caller that ignores the result.
#[tokio::test(start_paused = true)]
async fn s14_late_pushes_come_back_and_are_listed() {
    let (h, gate, _probe) = running("late", SimAgent::new(steps(2))).await;
    h.stop(StopOptions::bare()).await.unwrap();
    match h.push(item(2)).await {
        Err(PushError::Late { item }) => assert_eq!(item.id, 2),
        r => panic!("expected Late, got {r:?}"),
    }
    let _ignored = h.push(item(3)).await;
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(ids(&exit.late_items), vec![2, 3]);
    assert_eq!(exit.counters.items_late, 2);
    // After the exit: still late, still listed, item handed back.
    let err = h.push(item(4)).await.unwrap_err();
    assert_eq!(err.into_item().map(|i| i.id), Some(4));
    assert_eq!(ids(&h.take_late_items()), vec![2, 3, 4]);
    assert!(h.take_late_items().is_empty(), "taken");
}

/// S13: the exit state keeps the mechanism, the cause, the checkpoint outcome and the
/// counters apart.
#[tokio::test(start_paused = true)]
async fn s13_exit_state_fields_are_independent() {
    let h = spawn("exit-fields", SimAgent::new(steps(1))).await;
    h.push(item(1)).await.unwrap();
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::drain().cause("done for today"))
        .await
        .unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.session_id, "exit-fields");
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(exit.stop_cause.as_deref(), Some("done for today"));
    assert_eq!(
        exit.checkpoint,
        agentloop::exit::CheckpointOutcome::NotAttempted
    );
    assert_eq!(exit.counters.items_accepted, 2);
    assert_eq!(exit.counters.items_delivered, 2);
    assert!(exit.counters.turns_completed >= 1);
    assert_eq!(exit.next_turn_index, exit.counters.turns_completed);
}
