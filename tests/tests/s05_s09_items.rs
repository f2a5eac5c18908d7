//! S5–S9: buffer and plan, abort restores order, preempt and its acknowledgement, what
//! a preemption does, dynamic push options. Paused clock; gates and probes only.

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    options::TurnPhase, AgentError, ExitReason, Plan, Preempt, PreemptAck, PushOptions, SafePoint,
    StopOptions, TurnEnd,
};
use agentloop_sim::{Gate, PlanPolicy, SimAgent};
use agentloop_tests::*;

/// S5: a plan's remaining items go back to the front, ahead of items pushed later.
#[tokio::test(start_paused = true)]
async fn s5_remaining_items_go_to_the_front() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn(
        "s5",
        SimAgent::new(steps(1))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_plan(PlanPolicy {
                limit: Some(1),
                ..Default::default()
            }),
    )
    .await;
    h.push(item(1)).await.unwrap();
    assert_eq!(probe.turn_begins(0).await.0, vec![1]);
    for id in 2..=4 {
        h.push(item(id)).await.unwrap();
    }
    gate.open(1);
    assert_eq!(probe.turn_begins(1).await.0, vec![2]);
    h.push(item(5)).await.unwrap(); // pushed after 3 and 4 were handed back
    gate.open(1);
    assert_eq!(probe.turn_begins(2).await.0, vec![3]);
    gate.open(1);
    assert_eq!(probe.turn_begins(3).await.0, vec![4]);
    gate.open(1);
    assert_eq!(probe.turn_begins(4).await.0, vec![5]);
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_delivered, 5);
    assert!(exit.unhandled_items.is_empty());
}

/// S5: items in neither list are dropped by the agent's decision and counted.
#[tokio::test(start_paused = true)]
async fn s5_items_dropped_by_plan_are_counted() {
    let agent = SimAgent::new(steps(1)).with_plan(PlanPolicy {
        drop_prefix: Some("spam".into()),
        ..Default::default()
    });
    let ledger = agent.ledger();
    let h = spawn("s5-drop", agent).await;
    h.push(agentloop_sim::SimItem::new(1, "spam offer"))
        .await
        .unwrap();
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_dropped_by_plan, 1);
    assert_eq!(ledger.lock().dropped, vec![1]);
    assert_eq!(exit.counters.items_delivered, 1);
}

/// S5: a plan that returns more items than offered is an error (S6 restores the order).
#[tokio::test(start_paused = true)]
async fn s5_plan_returning_extra_items_fails_and_restores() {
    let h = spawn(
        "s5-extra",
        SimAgent::new(steps(1)).with_plan_fn(Arc::new(|offer| {
            let mut consumed = offer.into_items();
            consumed.push(item(999));
            Ok(Plan {
                consumed,
                remaining: vec![],
            })
        })),
    )
    .await;
    h.push(item(1)).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("offered")),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.unhandled_items), vec![1]);
}

/// S6: a failed plan puts every offered item back in original push order (preempted
/// items first), whatever the plan did with them; the session exits Failed.
#[tokio::test(start_paused = true)]
async fn s6_plan_error_restores_original_order() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn(
        "s6-plan-error",
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_plan_fn(Arc::new(|offer| {
                if offer.turn_index == 0 {
                    return Ok(offer.consume_all());
                }
                // Reorders and drops before failing: none of it may stick.
                let mut items = offer.into_items();
                items.reverse();
                items.pop();
                Err(AgentError::failed("planner unavailable"))
            })),
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    // Preempt turn 0 so item 1 is offered again as `preempted`, then 2, 3, 4 buffered.
    h.push(item(2))
        .options(PushOptions::preempt(Preempt::any_safe_point()))
        .await
        .unwrap();
    h.push(item(3)).await.unwrap();
    h.push(item(4)).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("planner unavailable")),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.unhandled_items), vec![1, 2, 3, 4]);
    assert!(exit.interrupted_items.is_empty());
}

/// S6: a stop that commits while a turn is still planning aborts it; the offered items
/// return to the front in their original order and become unhandled.
#[tokio::test(start_paused = true)]
async fn s6_stop_during_planning_restores_original_order() {
    let step_gate = Gate::new();
    let plan_gate = Gate::new();
    let (tx, mut probe) = probe();
    let agent = SimAgent::new(steps(1))
        .with_step_gate(step_gate.clone())
        .with_plan_gate(plan_gate.clone())
        .with_probe(tx);
    let ledger = agent.ledger();
    let h = spawn("s6-stop-planning", agent).await;
    plan_gate.open(1);
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.push(item(3)).await.unwrap();
    step_gate.open_all();
    // Turn 1 plans over [2, 3] and waits at the plan gate: stop now.
    probe.plan_begins(1).await;
    h.push(item(4)).await.unwrap();
    h.stop(StopOptions::graceful()).await.unwrap();
    plan_gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed, "no turn was cut");
    assert_eq!(ids(&exit.unhandled_items), vec![2, 3, 4]);
    assert_eq!(ledger.lock().delivered_ids(), vec![1]);
}

/// S7: with no turn planning or running, a preempt has no target: the item is only
/// buffered and the acknowledgement says so.
#[tokio::test(start_paused = true)]
async fn s7_preempt_when_idle_has_no_target() {
    let h = spawn("s7-idle", SimAgent::new(steps(1))).await;
    let ack = h
        .push(item(1))
        .options(PushOptions::preempt(Preempt::any_safe_point()))
        .await
        .unwrap();
    assert_eq!(ack, PreemptAck::NoTarget);
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_delivered, 1);
    assert_eq!(exit.counters.turns_preempted, 0);
}

/// S7: a push landing on a running turn answers Submitted once the cancel is in.
#[tokio::test(start_paused = true)]
async fn s7_preempt_running_turn_is_submitted() {
    let (h, gate, _probe) = running("s7-running", SimAgent::new(steps(2))).await;
    let ack = h
        .push(item(2))
        .options(PushOptions::preempt(Preempt::after_model_call()))
        .await
        .unwrap();
    assert_eq!(ack, PreemptAck::Submitted { turn: 0 });
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.turns_preempted, 1);
    assert_eq!(exit.counters.items_delivered, 2);
}

/// S7: a preempt landing on a planning turn is submitted the moment that turn becomes
/// active: its acknowledgement resolves then, and the turn ends at its first safe point.
#[tokio::test(start_paused = true)]
async fn s7_preempt_during_planning_cancels_the_turn_when_it_starts() {
    let step_gate = Gate::new();
    let plan_gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn(
        "s7-planning",
        SimAgent::new(steps(3))
            .with_step_gate(step_gate.clone())
            .with_plan_gate(plan_gate.clone())
            .with_probe(tx),
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.plan_begins(0).await;
    let h2 = h.clone();
    let ack = tokio::spawn(async move {
        h2.push(item(2))
            .options(PushOptions::preempt(Preempt::any_safe_point()))
            .await
    });
    // The acknowledgement waits for the turn to become active.
    tokio::task::yield_now().await;
    assert!(!ack.is_finished());
    plan_gate.open_all();
    assert_eq!(
        within("ack", ack).await.unwrap().unwrap(),
        PreemptAck::Submitted { turn: 0 }
    );
    step_gate.open_all();
    let (items, _) = probe.turn_begins(1).await;
    assert_eq!(items, vec![1, 2]);
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.turns_preempted, 1);
}

/// S7: a delayed preempt whose target turn has ended does nothing: it never cancels a
/// later turn.
#[tokio::test(start_paused = true)]
async fn s7_delayed_preempt_after_target_ended_does_nothing() {
    let (h, gate, mut probe) = running("s7-delay", SimAgent::new(steps(2))).await;
    let h2 = h.clone();
    let ack = tokio::spawn(async move {
        h2.push(item(2))
            .options(PushOptions::preempt(
                Preempt::any_safe_point().delay(Duration::from_secs(10)),
            ))
            .await
    });
    tokio::task::yield_now().await;
    // Turn 0 finishes before the delay; turn 1 (with item 2) waits at its gate.
    gate.open(2);
    let _ = probe.turn_begins(1).await;
    let ack = within("ack", ack).await.unwrap().unwrap();
    assert_eq!(ack, PreemptAck::TargetEnded { turn: 0 });
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(
        exit.counters.turns_preempted, 0,
        "turn 1 must not be canceled"
    );
    assert_eq!(exit.counters.turns_completed, 2);
}

/// S7: a delayed preempt whose target is still running is submitted after the delay.
#[tokio::test(start_paused = true)]
async fn s7_delayed_preempt_is_submitted_after_the_delay() {
    let (h, gate, _probe) = running("s7-delay-run", SimAgent::new(steps(2))).await;
    let start = tokio::time::Instant::now();
    let ack = h
        .push(item(2))
        .options(PushOptions::preempt(
            Preempt::any_safe_point().delay(Duration::from_secs(3)),
        ))
        .await
        .unwrap();
    assert_eq!(ack, PreemptAck::Submitted { turn: 0 });
    assert!(start.elapsed() >= Duration::from_secs(3));
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.turns_preempted, 1);
}

/// S7/S2: a preempt with a timeout escalates to Immediate when no safe point comes.
#[tokio::test(start_paused = true)]
async fn s7_preempt_timeout_escalates() {
    let (h, gate, mut probe) = gated("s7-timeout", SimAgent::new(steps(2))).await;
    let mut events = h.subscribe();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2))
        .options(PushOptions::preempt(
            Preempt::after_tool_calls().timeout(Duration::from_secs(2)),
        ))
        .await
        .unwrap();
    // Turn 1 starts after the escalation dropped turn 0.
    let (items, _) = probe.turn_begins(1).await;
    assert_eq!(items, vec![1, 2]);
    let mut saw = None;
    while let Some(ev) = within("event", events.next()).await {
        if let agentloop::SessionEvent::TurnEnded {
            turn: 0, outcome, ..
        } = ev
        {
            saw = Some(outcome);
            break;
        }
    }
    match saw {
        Some(TurnEnd::Preempted(info)) => {
            assert!(info.timed_out && info.escalated, "{info:?}");
            assert_eq!(info.at, None);
        }
        o => panic!("expected Preempted, got {o:?}"),
    }
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
}

/// S8: a preempted turn's items are offered to the next plan as `preempted`; the turn
/// context's preempted() signal fires; the preemption sets no exit reason and no
/// interrupted items, even when a stop cuts the next turn.
#[tokio::test(start_paused = true)]
async fn s8_preempted_turn_never_sets_interrupted_items() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let seen_preempted = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen = seen_preempted.clone();
    let h = spawn(
        "s8",
        SimAgent::new(steps(3))
            .with_step_gate(gate.clone())
            .with_probe(tx)
            .with_plan_fn(Arc::new(move |offer| {
                seen.lock().push((offer.turn_index, ids(&offer.preempted)));
                Ok(offer.consume_all())
            })),
    )
    .await;
    let events = h.subscribe();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2))
        .options(PushOptions::preempt(Preempt::any_safe_point()))
        .await
        .unwrap();
    gate.open(1);
    assert_eq!(probe.turn_begins(1).await.0, vec![1, 2]);
    // A stop now cuts turn 1, which holds items 1 and 2: those are turn 1's
    // interrupted items; turn 0 (preempted) contributed nothing of its own.
    probe.at_step(1, 0).await;
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(matches!(exit.reason, ExitReason::Canceled(_)));
    assert_eq!(ids(&exit.interrupted_items), vec![1, 2]);
    assert_eq!(exit.counters.turns_preempted, 1);
    assert_eq!(
        seen_preempted.lock().clone(),
        vec![(0, vec![]), (1, vec![1])]
    );
    let evs = collect(events).await;
    assert!(evs
        .iter()
        .any(|e| matches!(e, agentloop::SessionEvent::Preempted { turn: 0 })));
}

/// S8: the turn context's preempted() signal fires when the preempt is submitted.
#[tokio::test(start_paused = true)]
async fn s8_preempted_signal_fires() {
    use agentloop::{Agent, Turn, TurnCx, TurnOutcome};
    struct WaitsForPreempt;
    impl Agent for WaitsForPreempt {
        type Item = agentloop_sim::SimItem;
        type Event = agentloop_sim::SimEvent;
        type State = u32;
        async fn run_turn(
            &self,
            _turn: Turn<Self>,
            cx: TurnCx<Self>,
        ) -> Result<TurnOutcome<u32>, AgentError> {
            assert!(!cx.is_preempted());
            cx.preempted().await;
            assert!(cx.is_preempted());
            cx.safe_point(SafePoint::AfterModelCall, &1)?;
            Ok(TurnOutcome::Completed)
        }
    }
    let h: Handle = agentloop::SessionHandle::spawn(
        agentloop::SessionSpec::new("s8-signal", "default"),
        Arc::new(WaitsForPreempt),
        None,
    )
    .await
    .unwrap();
    h.push(item(1)).await.unwrap();
    h.push(item(2))
        .options(PushOptions::preempt(Preempt::any_safe_point()))
        .await
        .unwrap();
    // Turn 1 gets [1, 2] and waits for a preempt that never comes: stop it.
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.turns_preempted, 1);
    assert_eq!(ids(&exit.interrupted_items), vec![1, 2]);
}

/// S9: a dynamic strategy is evaluated in the loop's own message order and sees the
/// turn the push lands on (its index, phase and consumed items).
#[tokio::test(start_paused = true)]
async fn s9_strategy_sees_the_turn_it_lands_on() {
    let (h, gate, mut probe) = gated("s9", SimAgent::new(steps(2))).await;
    let views = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let strategy = {
        let views = views.clone();
        move || {
            let views = views.clone();
            PushOptions::strategy(move |view| {
                views
                    .lock()
                    .push((view.index, view.phase, ids(view.consumed)));
                // Preempt only turns that hold item 1.
                ids(view.consumed)
                    .contains(&1)
                    .then(Preempt::any_safe_point)
            })
        }
    };
    let ack = h.push(item(1)).options(strategy()).await.unwrap();
    assert_eq!(ack, PreemptAck::NotRequested);
    probe.at_step(0, 0).await;
    let ack = h.push(item(2)).options(strategy()).await.unwrap();
    assert_eq!(ack, PreemptAck::Submitted { turn: 0 });
    gate.open(1);
    probe.at_step(1, 0).await; // turn 1 holds [1, 2]
    let ack = h.push(item(3)).options(strategy()).await.unwrap();
    assert_eq!(ack, PreemptAck::Submitted { turn: 1 });
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    let v = views.lock().clone();
    assert_eq!(v[0], (None, TurnPhase::Idle, vec![]));
    assert_eq!(v[1], (Some(0), TurnPhase::Running, vec![1]));
    assert_eq!(v[2], (Some(1), TurnPhase::Running, vec![1, 2]));
}

/// S5: a plan that consumed nothing waits for new input, but an item pushed while it
/// was planning is new input it never saw: the loop plans again for it, without
/// waiting for yet another push (found by the system conservation property).
#[tokio::test(start_paused = true)]
async fn s5_a_push_during_a_plan_that_consumed_nothing_is_planned() {
    let agent = SimAgent::new(steps(1)).with_plan(PlanPolicy {
        drop_prefix: Some("drop".into()),
        latency: Some(Duration::from_millis(10)),
        ..Default::default()
    });
    let ledger = agent.ledger();
    let h = spawn("deferred", agent).await;
    h.push(agentloop_sim::SimItem::new(1, "drop-1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await; // the plan of [1] is running
    h.push(item(2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(ledger.lock().dropped, vec![1]);
    assert_eq!(
        ledger.lock().delivered_ids(),
        vec![2],
        "item 2 waited for another push"
    );
    h.stop(StopOptions::bare()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(exit.unhandled_items.is_empty());
}

/// One `SessionSpec` for both starts: a session started alone takes its spec's initial
/// items first, in order, ahead of anything pushed after the spawn (they are not
/// silently dropped because no supervisor pushes them).
#[tokio::test(start_paused = true)]
async fn a_session_started_alone_takes_its_initial_items_first() {
    let agent = SimAgent::new(steps(1));
    let ledger = agent.ledger();
    let spec =
        agentloop::SessionSpec::new("alone-seeded", "sim").initial_items(vec![item(1), item(2)]);
    let h = agentloop::SessionHandle::spawn(spec, Arc::new(agent), None)
        .await
        .unwrap();
    h.push(item(3)).await.unwrap();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(exit.counters.items_delivered, 3);
    assert_eq!(ledger.lock().delivered_ids(), vec![1, 2, 3]);
}

/// S7, S34a (issue 52): delayed preempts whose turn ends before their delay are
/// answered `TargetEnded` at the turn's end, and their timers go with the turn. Before,
/// each kept its timer (a task holding the preempt and its answer) for its whole delay,
/// up to 24 h: 80 000 pushes kept 57 MB. Paused clock: the acks come without the clock
/// reaching the delay, and no timer task outlives the turn.
#[tokio::test(start_paused = true)]
async fn s7_delayed_preempts_go_with_their_turn() {
    let (h, gate, mut probe) = running("s7-delay-gone", SimAgent::new(steps(2))).await;
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    let start = tokio::time::Instant::now();
    let day = Duration::from_secs(24 * 3600);
    let acks: Vec<_> = (0..100)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move {
                h.push(item(100 + i))
                    .options(PushOptions::preempt(Preempt::any_safe_point().delay(day)))
                    .await
            })
        })
        .collect();
    within("the pushes to arrive", async {
        while h.inspect().await.unwrap().buffered < 100 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // Turn 0 finishes long before the delay; the next turn takes the 100 items.
    gate.open(2);
    let _ = probe.turn_begins(1).await;
    for ack in acks {
        let ack = within("ack", ack).await.unwrap().unwrap();
        assert_eq!(ack, PreemptAck::TargetEnded { turn: 0 });
    }
    assert!(
        start.elapsed() < Duration::from_secs(3600),
        "answered at the turn's end, not after the delay: {:?}",
        start.elapsed()
    );
    tokio::task::yield_now().await;
    let after = tasks();
    assert!(
        after < before + 10,
        "the delayed preempts' timers went with their turn: {before} tasks before, {after} after"
    );
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.turns_preempted, 0, "no later turn canceled");
}
