//! Regression tests for defects found in review: each would hang, panic or lose an
//! item without its fix (S10, S13, S14, S21).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    Agent, AgentError, ExitReason, Plan, PlanInput, Preempt, PushOptions, SafePoint, SessionEvent,
    SessionHandle, SessionSpec, StopOptions, Turn, TurnCx, TurnOutcome,
};
use agentloop_sim::{Gate, PlanPolicy, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;

/// An agent whose `plan` panics before it returns a future (turn 0), and whose turn
/// future panics when dropped.
struct Exploding {
    plan_panics: bool,
    gate: Gate,
}

struct PanicOnDrop;
impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("the turn future's destructor panicked");
        }
    }
}

impl Agent for Exploding {
    type Item = SimItem;
    type Event = SimEvent;
    type State = u8;

    #[allow(clippy::manual_async_fn)]
    fn plan(
        &self,
        offer: PlanInput<SimItem>,
    ) -> impl Future<Output = Result<Plan<SimItem>, AgentError>> + Send {
        if self.plan_panics {
            panic!("plan exploded before its future existed");
        }
        async move { Ok(offer.consume_all()) }
    }

    async fn run_turn(
        &self,
        _turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<u8>, AgentError> {
        let _bomb = PanicOnDrop;
        self.gate.clone().open(0);
        std::future::pending::<()>().await;
        Ok(TurnOutcome::Completed)
    }
}

async fn spawn_agent<A: Agent<Item = SimItem, Event = SimEvent>>(id: &str, agent: A) -> Handle {
    SessionHandle::spawn(SessionSpec::new(id, "default"), Arc::new(agent), None)
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_plan_that_panics_before_its_future_exists_fails_the_session_cleanly() {
    let h = spawn_agent(
        "plan-panic",
        Exploding {
            plan_panics: true,
            gate: Gate::new(),
        },
    )
    .await;
    h.push(item(1)).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("plan panicked")),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.unhandled_items), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn a_turn_future_whose_destructor_panics_still_reports_the_turn() {
    let h = spawn_agent(
        "drop-panic",
        Exploding {
            plan_panics: false,
            gate: Gate::new(),
        },
    )
    .await;
    h.push(item(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await; // the turn is running
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("turn task panicked")),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn a_huge_timeout_means_no_deadline_not_a_panic() {
    let gate = Gate::new();
    let plan_gate = Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn(
        "huge-timeout",
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_plan_gate(plan_gate.clone())
            .with_probe(tx),
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.plan_begins(0).await;
    // On a planning turn (activated by the turn task) ...
    let h2 = h.clone();
    let ack = tokio::spawn(async move {
        h2.push(item(2))
            .options(PushOptions::preempt(
                Preempt::after_tool_calls().timeout(Duration::MAX),
            ))
            .await
    });
    plan_gate.open_all();
    assert!(within("ack", ack).await.unwrap().is_ok());
    // ... and on a running turn (merged by the actor).
    probe.at_step(0, 0).await;
    h.stop(StopOptions::graceful_timeout(Duration::MAX))
        .await
        .unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(ref i) if i.at == Some(SafePoint::AfterModelCall)),
        "{:?}",
        exit.reason
    );
}

/// Subscribing from a handle while the session tears down must never miss `Ended`:
/// several tasks subscribe in a tight loop across the moment the session ends.
#[test]
fn subscribing_during_teardown_always_gets_ended() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for round in 0..100 {
            let h = spawn(&format!("race-{round}"), SimAgent::new(steps(0))).await;
            let subscribers: Vec<_> = (0..3)
                .map(|_| {
                    let h = h.clone();
                    tokio::spawn(async move {
                        let mut streams = Vec::new();
                        // Keep subscribing until the exit is published, then a few more.
                        let mut after = 0;
                        while after < 20 {
                            streams.push(h.subscribe());
                            if h.exit_state().is_some() {
                                after += 1;
                            }
                            tokio::task::yield_now().await;
                        }
                        streams
                    })
                })
                .collect();
            tokio::task::yield_now().await;
            h.stop(StopOptions::bare()).await.unwrap();
            for s in subscribers {
                for mut stream in s.await.unwrap() {
                    let ended = loop {
                        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
                            Ok(Some(SessionEvent::Ended(_))) => break true,
                            Ok(Some(_)) => continue,
                            Ok(None) | Err(_) => break false,
                        }
                    };
                    assert!(ended, "round {round}: a stream never got Ended");
                }
            }
        }
    });
}

/// A hook that panics before its future exists is isolated, and the exit state keeps
/// every item.
#[tokio::test(start_paused = true)]
async fn a_hook_panicking_synchronously_is_isolated_and_loses_nothing() {
    let next_ran = Arc::new(AtomicBool::new(false));
    let flag = next_ran.clone();
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let config = SessionSpec::new("hook-sync-panic", "default")
        .on_end(|_| -> std::future::Ready<Result<(), String>> {
            panic!("hook exploded before its future existed")
        })
        .on_end(move |_| {
            let flag = flag.clone();
            async move {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            }
        });
    let h: Handle = SessionHandle::spawn(
        config,
        Arc::new(
            SimAgent::new(steps(2))
                .with_step_gate(gate.clone())
                .with_probe(tx),
        ),
        None,
    )
    .await
    .unwrap();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert_eq!(ids(&exit.unhandled_items), vec![2]);
    assert!(next_ran.load(Ordering::SeqCst), "the next hook ran");
}

/// An actor killed while a hook hangs still publishes the computed exit state.
#[tokio::test(start_paused = true)]
async fn a_kill_during_a_hanging_hook_loses_nothing() {
    let config = SessionSpec::new("hook-hang-kill", "default")
        .hook_timeout(Duration::from_secs(3600))
        .on_end(|_| async {
            std::future::pending::<()>().await;
            Ok(())
        });
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h: Handle = SessionHandle::spawn(
        config,
        Arc::new(
            SimAgent::new(steps(2))
                .with_step_gate(gate.clone())
                .with_probe(tx),
        ),
        None,
    )
    .await
    .unwrap();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::immediate()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await; // teardown is in the hook now
    assert!(h.exit_state().is_none());
    h.actor().kill();
    let exit = within("exit", h.wait()).await;
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert_eq!(ids(&exit.unhandled_items), vec![2]);
}

/// A cast push queued when the actor is killed goes to the late list, not nowhere.
#[tokio::test(start_paused = true)]
async fn push_nowait_queued_at_a_kill_is_not_lost() {
    let (h, _gate, _probe) = running("nowait-kill", SimAgent::new(steps(2))).await;
    h.push(item(2)).no_wait(); // queued: the actor has not run since
    h.actor().kill();
    let exit = within("exit", h.wait()).await;
    let late = ids(&h.take_late_items());
    let held: Vec<u64> = ids(&exit.unhandled_items)
        .into_iter()
        .chain(ids(&exit.interrupted_items))
        .collect();
    assert!(
        late.contains(&2) ^ held.contains(&2),
        "item 2 must be in exactly one place: late {late:?}, held {held:?}"
    );
    // After the exit a cast push is refused and listed too.
    h.push(item(3)).no_wait();
    assert_eq!(ids(&h.take_late_items()), vec![3]);
}

/// A kill reports a running turn's items by what its plan did: consumed items are
/// interrupted, handed-back items unhandled, dropped items counted once.
#[tokio::test(start_paused = true)]
async fn a_kill_classifies_the_running_turn_by_its_plan() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let plan_gate = Gate::new();
    let h = spawn(
        "kill-plan",
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_plan_gate(plan_gate.clone())
            .with_probe(tx)
            .with_plan(PlanPolicy {
                limit: Some(1),
                drop_prefix: Some("drop".into()),
                ..Default::default()
            }),
    )
    .await;
    h.push(item(1)).await.unwrap(); // turn 0 plans over [1] and waits at the plan gate
    probe.plan_begins(0).await;
    plan_gate.open_all();
    probe.at_step(0, 0).await;
    h.actor().kill();
    let exit = within("exit", h.wait()).await;
    assert_eq!(ids(&exit.interrupted_items), vec![1]);

    // Now with a plan that consumes one, drops one and hands one back.
    let gate = Gate::new();
    let plan_gate = Gate::new();
    let (tx, mut probe) = agentloop_tests::probe();
    let h = spawn(
        "kill-plan-2",
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_plan_gate(plan_gate.clone())
            .with_probe(tx)
            .with_plan(PlanPolicy {
                limit: Some(1),
                drop_prefix: Some("drop".into()),
                ..Default::default()
            }),
    )
    .await;
    plan_gate.open(1);
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(SimItem::new(2, "drop me")).await.unwrap();
    h.push(item(3)).await.unwrap();
    h.push(item(4)).await.unwrap();
    gate.open(2); // turn 0 completes; turn 1 plans over [2, 3, 4]
    probe.plan_begins(1).await;
    plan_gate.open_all();
    probe.at_step(1, 0).await; // turn 1 runs [3]; 2 dropped; 4 handed back
    h.actor().kill();
    let exit = within("exit", h.wait()).await;
    assert_eq!(ids(&exit.interrupted_items), vec![3]);
    assert_eq!(ids(&exit.unhandled_items), vec![4]);
    assert_eq!(exit.counters.items_dropped_by_plan, 1);
    assert_eq!(exit.counters.items_delivered, 1);
}

/// A plan that consumes nothing does not make the loop spin: it waits for new input;
/// a drain then exits with the handed-back items unhandled.
#[tokio::test(start_paused = true)]
async fn a_plan_that_consumes_nothing_waits_for_input() {
    let plans = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = plans.clone();
    let h = spawn(
        "defer",
        SimAgent::new(steps(1)).with_plan_fn(Arc::new(move |offer| {
            counter.fetch_add(1, Ordering::SeqCst);
            // Only act once three items are waiting.
            if offer.len() < 3 {
                return Ok(Plan {
                    consumed: vec![],
                    remaining: offer.into_items(),
                });
            }
            Ok(offer.consume_all())
        })),
    )
    .await;
    h.push(item(1)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let planned = plans.load(Ordering::SeqCst);
    assert!(
        planned <= 2,
        "the loop re-planned the same items {planned} times"
    );
    h.push(item(2)).await.unwrap();
    h.push(item(3)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.push(item(4)).await.unwrap();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    let delivered = exit.counters.items_delivered;
    assert_eq!(delivered + exit.unhandled_items.len() as u64, 4, "{exit:?}");
    assert!(delivered >= 3);
}

/// S24: a cancel written by another process (a compare-and-swap to `Canceled`) wins over
/// this session's own later writes. Under `exit` durability a session that resumed a
/// record rewrites it after each completed turn (so delivered items are not resumed
/// again); that rewrite, and the exit's save, used to put a live status back over the
/// cancel, so the next start resumed a canceled session.
#[tokio::test(start_paused = true)]
async fn s24_a_cancel_wins_over_the_sessions_own_later_writes() {
    use agentloop::{
        store::SessionRecord, store::SessionStatus, store::StatusKind, CheckpointStore, MemoryStore,
    };
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let mut rec = SessionRecord::new("raced", "sim", 0);
    rec.status = SessionStatus::Interrupted;
    rec.unhandled_items = vec![item(1), item(2)];
    store.insert(rec);
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let agent = SimAgent::new(steps(1))
        .with_plan(PlanPolicy {
            limit: Some(1),
            ..Default::default()
        })
        .with_step_gate(gate.clone())
        .with_probe(tx);
    let h = spawn_on(
        SessionSpec::new("raced", "default")
            .persistent(true)
            .kind("sim")
            .durability(agentloop::Durability::Exit),
        agent,
        store.clone(),
    )
    .await;
    probe.at_step(0, 0).await; // turn 0 holds item 1; item 2 waits
    let swapped = store
        .cas_status(
            "raced",
            vec![StatusKind::Interrupted],
            SessionStatus::Canceled,
        )
        .await
        .unwrap();
    assert!(matches!(swapped, agentloop::store::CasOutcome::Swapped(_)));
    gate.open(1); // turn 0 completes: the session would rewrite its record now
    probe.at_step(1, 0).await;
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(
        ids(&exit.interrupted_items),
        vec![2],
        "the item is handed back"
    );
    assert_eq!(
        store.get("raced").map(|r| r.status),
        Some(SessionStatus::Canceled),
        "the cancel stays on record"
    );
}
