//! S20–S21: the event stream, backpressure, the teardown order, and the terminal-event
//! guarantee (`Ended` last for every attached subscriber, no buffer capacity needed,
//! teardown never waits on a subscriber). Paused clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    CheckpointStore, ExitReason, MemoryStore, SessionEvent, SessionHandle, SessionSpec,
    StopOptions, TurnEnd,
};
use agentloop_sim::{Gate, Notice, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;

fn kinds(evs: &[SessionEvent<SimEvent>]) -> Vec<String> {
    evs.iter()
        .map(|e| match e {
            SessionEvent::TurnStarted { turn, .. } => format!("start{turn}"),
            SessionEvent::Agent {
                turn,
                event: SimEvent::StepDone { step, .. },
            } => format!("step{turn}.{step}"),
            SessionEvent::Agent {
                event: SimEvent::Model { .. },
                ..
            } => "model".into(),
            SessionEvent::Preempted { turn } => format!("preempted{turn}"),
            SessionEvent::TurnEnded { turn, .. } => format!("end{turn}"),
            SessionEvent::StopRequested { .. } => "stop".into(),
            SessionEvent::Ended(_) => "Ended".into(),
            SessionEvent::Restarting { attempt, .. } => format!("restarting{attempt}"),
            SessionEvent::Lagged { missed } => format!("lagged{missed}"),
            SessionEvent::StepStarted { key, .. } => format!("stepstart{}", key.occurrence),
            SessionEvent::StepFinished { key, .. } => format!("stepend{}", key.occurrence),
        })
        .collect()
}

/// S20: the stream carries turn started, agent events, turn ended, stop requested and
/// finally Ended, in order; `None` follows Ended.
#[tokio::test(start_paused = true)]
async fn s20_events_arrive_in_order_and_end_with_ended() {
    let (tx, mut probe) = probe();
    let h = spawn("events", SimAgent::new(steps(2)).with_probe(tx)).await;
    let events = h.subscribe();
    h.push(item(1)).await.unwrap();
    probe
        .until("turn 0 done", |n| matches!(n, Notice::TurnDone { turn: 0 }))
        .await;
    tokio::task::yield_now().await;
    h.stop(StopOptions::bare().cause("bye")).await.unwrap();
    let evs = collect(events).await;
    assert_eq!(
        kinds(&evs),
        vec!["start0", "step0.0", "step0.1", "end0", "stop", "Ended"]
    );
    assert!(matches!(
        evs[3],
        SessionEvent::TurnEnded {
            turn: 0,
            outcome: TurnEnd::Completed,
            durable: false,
        }
    ));
    match evs.last() {
        Some(SessionEvent::Ended(s)) => {
            assert_eq!(s.stop_cause.as_deref(), Some("bye"));
            assert_eq!(s.reason, ExitReason::Completed);
        }
        e => panic!("expected Ended last, got {e:?}"),
    }
}

/// S21: a subscriber that stopped reading with a full buffer does not delay the exit;
/// when it reads again it still gets everything that was queued or in flight, then
/// Ended last.
#[tokio::test(start_paused = true)]
async fn s21_stuck_subscriber_does_not_delay_exit() {
    let (tx, mut probe) = probe();
    let h = spawn("stuck", SimAgent::new(steps(1)).with_probe(tx)).await;
    // Capacity 2: TurnStarted and the step event fill it; TurnEnded stays in flight
    // (backpressure: a lagging subscriber has nothing in flight).
    let mut stuck = h.subscribe_with_backpressure(2);
    h.push(item(1)).await.unwrap();
    probe
        .until("turn 0 done", |n| matches!(n, Notice::TurnDone { turn: 0 }))
        .await;
    let start = tokio::time::Instant::now();
    h.stop(StopOptions::bare()).await.unwrap();
    let exit = within("exit despite a stuck subscriber", h.wait()).await;
    assert_eq!(start.elapsed(), Duration::ZERO, "teardown waited on nobody");
    assert_eq!(exit.counters.turns_completed, 1);
    // The subscriber wakes up later: queued events, the in-flight TurnEnded, then Ended.
    let mut evs = Vec::new();
    while let Some(e) = within("stuck stream", stuck.next()).await {
        evs.push(e);
    }
    let k = kinds(&evs);
    assert_eq!(k.first().map(String::as_str), Some("start0"));
    assert!(k.contains(&"end0".to_string()), "{k:?}");
    assert_eq!(k.last().map(String::as_str), Some("Ended"), "{k:?}");
    assert!(stuck.next().await.is_none());
}

/// S20/S21: a slow but live subscriber that asked for backpressure slows the agent
/// down (the agent waits for it), receives every event in order, and Ended last.
#[tokio::test(start_paused = true)]
async fn s21_slow_subscriber_gets_everything_and_ended_last() {
    let h = spawn("slow", SimAgent::new(steps(3))).await;
    let mut slow = h.subscribe_with_backpressure(1);
    let reader = tokio::spawn(async move {
        let mut evs = Vec::new();
        while let Some(e) = slow.next().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
            evs.push(e);
        }
        evs
    });
    h.push(item(1)).await.unwrap();
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    let evs = within("reader", reader).await.unwrap();
    let k: Vec<String> = kinds(&evs)
        .into_iter()
        .filter(|k| k != "stop") // best effort by design when the buffer is full
        .collect();
    let mut expected = Vec::new();
    let turns = evs
        .iter()
        .filter(|e| matches!(e, SessionEvent::TurnStarted { .. }))
        .count();
    assert!(turns >= 1);
    for t in 0..turns {
        expected.extend([
            format!("start{t}"),
            format!("step{t}.0"),
            format!("step{t}.1"),
            format!("step{t}.2"),
            format!("end{t}"),
        ]);
    }
    expected.push("Ended".into());
    assert_eq!(k, expected);
}

/// S20: a dropped subscriber costs nothing: the session runs on unhindered.
#[tokio::test(start_paused = true)]
async fn s20_dropped_subscriber_costs_nothing() {
    let h = spawn("dropped", SimAgent::new(steps(5))).await;
    drop(h.subscribe_with_capacity(1));
    let start = tokio::time::Instant::now();
    for id in 0..10 {
        h.push(item(id)).await.unwrap();
    }
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_delivered, 10);
    // Zero-latency steps: any wait on the dropped subscriber would show up as time
    // (or hang: `within` fails on a paused clock).
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// S21: teardown order: final checkpoint → session-end hooks (bounded, isolated: a
/// failing, a panicking and a hanging hook do not stop the next) → Ended → stream end.
#[tokio::test(start_paused = true)]
async fn s21_teardown_order_and_isolated_bounded_hooks() {
    let store: Arc<MemoryStore<SimItem>> = Arc::new(MemoryStore::new());
    let last_hook_ran = Arc::new(AtomicBool::new(false));
    let saw_record = Arc::new(AtomicBool::new(false));
    let config = {
        let store = store.clone();
        let last = last_hook_ran.clone();
        let saw = saw_record.clone();
        SessionSpec::new("hooks", "default")
            .persistent(true)
            .hook_timeout(Duration::from_secs(2))
            .on_end(|_| async { Err("hook 1 fails".to_string()) })
            .on_end(|_| async { panic!("hook 2 panics") })
            .on_end(|_| async {
                std::future::pending::<()>().await;
                Ok(())
            })
            .on_end(move |summary| {
                let store = store.clone();
                let last = last.clone();
                let saw = saw.clone();
                async move {
                    // The final checkpoint is already written.
                    saw.store(store.get(&summary.session_id).is_some(), Ordering::SeqCst);
                    last.store(true, Ordering::SeqCst);
                    Ok(())
                }
            })
    };
    let dyn_store: Arc<dyn CheckpointStore<SimItem>> = store.clone();
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h: Handle = SessionHandle::spawn(
        config,
        Arc::new(
            SimAgent::new(steps(2))
                .with_step_gate(gate.clone())
                .with_probe(tx),
        ),
        Some(dyn_store),
    )
    .await
    .unwrap();
    let mut events = h.subscribe();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    gate.open_all();
    let start = tokio::time::Instant::now();
    loop {
        match within("events", events.next()).await {
            Some(SessionEvent::Ended(_)) => {
                assert!(
                    last_hook_ran.load(Ordering::SeqCst),
                    "hooks run before Ended"
                );
                break;
            }
            Some(_) => assert!(!last_hook_ran.load(Ordering::SeqCst)),
            None => panic!("stream ended without Ended"),
        }
    }
    assert!(events.next().await.is_none(), "None after Ended");
    assert!(saw_record.load(Ordering::SeqCst), "checkpoint before hooks");
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "the hanging hook was waited for up to its bound"
    );
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.checkpoint, agentloop::exit::CheckpointOutcome::Saved);
}

/// Bad input: subscribing after the exit gets Ended at once, then None.
#[tokio::test(start_paused = true)]
async fn s21_subscribe_after_exit_gets_ended_at_once() {
    let h = spawn("late-sub", SimAgent::new(steps(1))).await;
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
    let evs = collect(h.subscribe()).await;
    assert_eq!(kinds(&evs), vec!["Ended"]);
}

fn resumable_record(id: &str) -> agentloop::store::SessionRecord<SimItem> {
    let mut rec = agentloop::store::SessionRecord::new(id, "sim", 3);
    rec.status = agentloop::store::SessionStatus::Interrupted;
    rec.interrupted_items = vec![item(1)];
    rec
}

/// Issue 13 (2): a subscriber attached at spawn through the supervisor sees the resume
/// turn's `TurnStarted`, which a subscriber attached after the spawn returned has
/// already missed by the time the turn is under way.
#[tokio::test(start_paused = true)]
async fn s20_a_subscriber_attached_at_spawn_sees_the_resume_turn_start() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    mem.insert(resumable_record("resumed"));
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let mut kinds = std::collections::HashMap::new();
    let (g, t) = (gate.clone(), tx.clone());
    kinds.insert(
        "sim".to_string(),
        agentloop::supervisor::agent_kind("sim", move |_: &[u8]| {
            Ok(SimAgent::new(steps(1))
                .with_step_gate(g.clone())
                .with_probe(t.clone()))
        }),
    );
    let sup = agentloop::SupervisorHandle::<SimItem, SimEvent>::start(agentloop::SupervisorArgs {
        kinds,
        store: Some(mem.clone() as Arc<dyn CheckpointStore<SimItem>>),
        owner: Some("me".into()),
        budget: agentloop::supervisor::RestartBudget::default(),
        heartbeat: agentloop::store::DEFAULT_HEARTBEAT,
        metrics: None,
        limits: Default::default(),
    })
    .await
    .unwrap();
    let (h, mut at_spawn) = sup
        .spawn(
            agentloop::SessionSpec::new("resumed", "sim")
                .persistent(true)
                .restart(agentloop::RestartPolicy::Never),
        )
        .subscribed(64, agentloop::EventFilter::all())
        .await
        .unwrap();
    // The resume turn is under way (its TurnStarted already sent) before anyone else
    // subscribes.
    probe
        .until("the resume turn's first step", |n| {
            matches!(n, Notice::StepBegin { step: 0, .. })
        })
        .await;
    let mut late = h.subscribe();
    gate.open_all();
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
    let mut seen = Vec::new();
    while let Some(ev) = at_spawn.next().await {
        seen.push(ev);
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
        "the first event at spawn: {:?}",
        kinds_of(&seen)
    );
    assert!(matches!(seen.last(), Some(SessionEvent::Ended(_))));
    let mut late_seen = Vec::new();
    while let Some(ev) = late.next().await {
        late_seen.push(ev);
    }
    assert!(
        !late_seen
            .iter()
            .any(|e| matches!(e, SessionEvent::TurnStarted { .. })),
        "a subscriber after the spawn cannot see the resume turn start: {:?}",
        kinds_of(&late_seen)
    );
}

/// Issue 13 (2): `SessionHandle::spawn_subscribed` attaches before the actor starts;
/// the stream gets the first turn's events and `Ended`.
#[tokio::test(start_paused = true)]
async fn s20_spawn_subscribed_without_a_supervisor() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    mem.insert(resumable_record("direct"));
    let (h, mut events) = SessionHandle::spawn(
        SessionSpec::new("direct", "default")
            .persistent(true)
            .kind("sim")
            .owner("me"),
        Arc::new(SimAgent::new(steps(1))),
        Some(mem.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .subscribed(8, agentloop::EventFilter::all())
    .await
    .unwrap();
    let mut seen = Vec::new();
    // The resume turn runs to its end, then the session is stopped.
    while let Some(ev) = within("the resume turn's end", events.next()).await {
        let ended = matches!(ev, SessionEvent::TurnEnded { .. });
        seen.push(ev);
        if ended {
            break;
        }
    }
    h.stop(StopOptions::graceful()).await.unwrap();
    within("exit", h.wait()).await;
    while let Some(ev) = events.next().await {
        seen.push(ev);
    }
    assert!(
        matches!(
            seen.first(),
            Some(SessionEvent::TurnStarted { resumed: true, .. })
        ),
        "{:?}",
        kinds_of(&seen)
    );
    assert!(seen.iter().any(|e| matches!(
        e,
        SessionEvent::TurnEnded {
            outcome: TurnEnd::Completed,
            ..
        }
    )));
    assert!(matches!(seen.last(), Some(SessionEvent::Ended(_))));
}

fn kinds_of(evs: &[SessionEvent<SimEvent>]) -> Vec<String> {
    kinds(evs)
}

/// Issue 13 (2): the subscriber asked for at spawn belongs to the first incarnation
/// only. A restarted incarnation registers none, so nothing unread holds its turn
/// events back (with a one-event buffer, a stray reserved stream would stall the
/// restarted session's first turn at its second event).
#[tokio::test(start_paused = true)]
async fn s20_a_restarted_incarnation_has_no_subscriber_at_spawn() {
    use std::sync::atomic::AtomicBool;

    let first = Arc::new(AtomicBool::new(true));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u64>>();
    let mut kinds = std::collections::HashMap::new();
    kinds.insert(
        "sim".to_string(),
        agentloop::supervisor::agent_kind("sim", move |_: &[u8]| {
            let tx = done_tx.clone();
            let agent = SimAgent::new(steps(3)).with_turn_hook(Arc::new(move |_, ids: &[u64]| {
                let _ = tx.send(ids.to_vec());
            }));
            Ok(if first.swap(false, Ordering::SeqCst) {
                agent.with_fault(Some(0), 0, agentloop_sim::Fault::Fail, true)
            } else {
                agent
            })
        }),
    );
    let sup = agentloop::SupervisorHandle::<SimItem, SimEvent>::start(agentloop::SupervisorArgs {
        kinds,
        store: None,
        owner: None,
        budget: agentloop::supervisor::RestartBudget::default(),
        heartbeat: agentloop::store::DEFAULT_HEARTBEAT,
        metrics: None,
        limits: Default::default(),
    })
    .await
    .unwrap();
    let (_h, mut first_events) = sup
        .spawn(
            agentloop::SessionSpec::new("restarts", "sim")
                .restart(agentloop::RestartPolicy::Permanent)
                .initial_items(vec![item(1), item(2)]),
        )
        .subscribed(1, agentloop::EventFilter::all())
        .await
        .unwrap();
    // The first incarnation fails its first turn; its stream ends with `Restarting`,
    // not `Ended`: the session runs again (issue 53).
    let mut seen = Vec::new();
    while let Some(ev) = within("the first incarnation's events", first_events.next()).await {
        seen.push(ev);
    }
    assert!(
        matches!(
            seen.last(),
            Some(SessionEvent::Restarting { attempt: 1, .. })
        ),
        "{:?}",
        kinds_of(&seen)
    );
    // The restarted incarnation runs the handed-back items through turns of three
    // steps (several events each) with nobody subscribed.
    let mut delivered = Vec::new();
    while delivered.len() < 2 {
        let ids = within("the restarted incarnation's turns", done_rx.recv())
            .await
            .expect("the hook's sender lives in the kind");
        delivered.extend(ids);
    }
    delivered.sort_unstable();
    assert_eq!(delivered, vec![1, 2]);
    sup.stop_all(StopOptions::bare()).await;
}

/// S20 (changed): a subscriber that stops reading never slows the session. Zero-latency
/// steps on a paused clock: a session that waited for the stuck reader would hang.
/// When the reader comes back it gets what its buffer held, `Lagged` with the count of
/// what no buffer holds any more (no replay buffer here), and `Ended` last, with
/// numbers that only go up.
#[tokio::test(start_paused = true)]
async fn s20_stuck_subscriber_lags_and_never_slows_the_session() {
    let h = spawn("lagging", SimAgent::new(steps(4))).await;
    let mut stuck = h.subscribe_with_capacity(3);
    let start = tokio::time::Instant::now();
    for id in 0..50 {
        h.push(item(id)).await.unwrap();
    }
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit with a stuck subscriber", h.wait()).await;
    assert_eq!(exit.counters.items_delivered, 50);
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the session waited on nobody"
    );
    let mut evs = Vec::new();
    while let Some(e) = within("stuck stream", stuck.next_sequenced()).await {
        evs.push(e);
    }
    let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let plain: Vec<_> = evs.iter().map(|e| e.event.clone()).collect();
    let k = kinds(&plain);
    assert_eq!(&k[..3], &["start0", "step0.0", "step0.1"], "{k:?}");
    let missed = match &plain[3] {
        SessionEvent::Lagged { missed } => *missed,
        e => panic!("expected Lagged after the buffer, got {e:?}"),
    };
    // Everything between the buffered events and `Ended` was missed and counted.
    let ended = evs.last().unwrap();
    assert!(matches!(ended.event, SessionEvent::Ended(_)), "{k:?}");
    assert_eq!(evs.len(), 5, "{k:?}");
    assert_eq!(evs[2].seq + missed, ended.seq - 1, "{k:?}");
    assert_eq!(evs[3].seq, ended.seq - 1);
}

/// S20 (changed): a subscriber that falls behind catches up from the replay buffer:
/// every event once, in order, no `Lagged` while the buffer still holds what it missed;
/// and it catches up live, not only at the end.
#[tokio::test(start_paused = true)]
async fn s20_lagging_subscriber_catches_up_from_the_replay_buffer() {
    let (tx, mut probe) = probe();
    let h = SessionHandle::spawn(
        SessionSpec::new("catch-up", "default").replay(1000),
        Arc::new(SimAgent::new(steps(2)).with_probe(tx)),
        None,
    )
    .await
    .expect("spawn");
    let mut slow = h.subscribe_with_capacity(2);
    for id in 0..10 {
        h.push(item(id)).await.unwrap();
    }
    probe
        .until("items taken", |n| matches!(n, Notice::TurnDone { .. }))
        .await;
    // Read while the session still runs: the catch-up happens now.
    let first = within("first", slow.next_sequenced()).await.unwrap();
    let mut evs = vec![first];
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    while let Some(e) = within("slow stream", slow.next_sequenced()).await {
        evs.push(e);
    }
    let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (seqs[0]..seqs[0] + seqs.len() as u64).collect::<Vec<_>>(),
        "every number once, in order"
    );
    let plain: Vec<_> = evs.iter().map(|e| e.event.clone()).collect();
    let k = kinds(&plain);
    assert!(!k.iter().any(|k| k.starts_with("lagged")), "{k:?}");
    let turns = k.iter().filter(|k| k.starts_with("start")).count();
    assert!(turns >= 2, "{k:?}");
    assert_eq!(k.last().map(String::as_str), Some("Ended"));
}

/// S20: an in-process reader can still ask for backpressure: with no replay buffer it
/// sees every event, because the session waits for it.
#[tokio::test(start_paused = true)]
async fn s20_backpressure_is_explicit() {
    let h = spawn("explicit", SimAgent::new(steps(2))).await;
    let mut reader = h.subscribe_with_backpressure(1);
    for id in 0..20 {
        h.push(item(id)).await.unwrap();
    }
    h.stop(StopOptions::drain()).await.unwrap();
    let mut evs = Vec::new();
    while let Some(e) = within("reader", reader.next()).await {
        evs.push(e);
    }
    let k = kinds(&evs);
    assert!(!k.iter().any(|k| k.starts_with("lagged")), "{k:?}");
    let ends = k.iter().filter(|k| k.starts_with("end")).count();
    assert!(ends >= 1);
    assert_eq!(
        k.iter().filter(|k| k.starts_with("step")).count(),
        ends * 2,
        "{k:?}"
    );
    within("exit", h.wait()).await;
}
