//! Bad input at the session API (issue "TurnLoop", S12, S14, S32): each gets a clear,
//! typed result; none panics; nothing accepted is lost.

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    options::OptionsError, Preempt, PushError, PushOptions, SessionError, SessionHandle,
    SessionSpec, SpawnError, StopOptions,
};
use agentloop_sim::{SimAgent, SimEvent, SimItem};
use agentloop_tests::*;

#[tokio::test(start_paused = true)]
async fn zero_durations_in_stop_options_are_refused() {
    let h = spawn("zero-stop", SimAgent::new(steps(1))).await;
    for opts in [
        StopOptions::graceful_timeout(Duration::ZERO),
        StopOptions::until_idle_for(Duration::ZERO),
    ] {
        let e = h.stop(opts).await.unwrap_err();
        assert!(
            matches!(
                e,
                SessionError::InvalidOptions(OptionsError::NonPositiveDuration { .. })
            ),
            "{e}"
        );
    }
    // The refused stops changed nothing: the session still takes items.
    h.push(item(1)).await.unwrap();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_delivered, 1);
}

#[tokio::test(start_paused = true)]
async fn zero_durations_in_preempt_options_hand_the_item_back() {
    let h = spawn("zero-preempt", SimAgent::new(steps(1))).await;
    let e = h
        .push(item(1))
        .options(PushOptions::preempt(
            Preempt::any_safe_point().timeout(Duration::ZERO),
        ))
        .await
        .unwrap_err();
    match e {
        PushError::InvalidOptions { item, error } => {
            assert_eq!(item.id, 1);
            assert!(error.to_string().contains("preempt.timeout"), "{error}");
        }
        e => panic!("expected InvalidOptions, got {e}"),
    }
    // A strategy returning bad options is refused the same way.
    let e = h
        .push(item(2))
        .options(PushOptions::strategy(|_| {
            Some(Preempt::any_safe_point().delay(Duration::ZERO))
        }))
        .await
        .unwrap_err();
    assert!(matches!(e, PushError::InvalidOptions { ref item, .. } if item.id == 2));
    h.stop(StopOptions::bare()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(
        exit.counters.items_accepted, 0,
        "refused items were not accepted"
    );
}

#[tokio::test(start_paused = true)]
async fn push_to_a_stopped_session_is_late_and_stop_is_idempotent() {
    let h = spawn("stopped", SimAgent::new(steps(1))).await;
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
    let e = h.push(item(9)).await.unwrap_err();
    assert!(matches!(e, PushError::Late { ref item } if item.id == 9));
    assert!(e.to_string().contains("late list"), "{e}");
    h.stop(StopOptions::immediate()).await.unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    assert_eq!(ids(&h.take_late_items()), vec![9]);
}

#[tokio::test(start_paused = true)]
async fn invalid_session_ids_are_refused_at_spawn() {
    for id in ["".to_string(), "x".repeat(129), "a\u{7}b".to_string()] {
        let r: Result<SessionHandle<SimItem, SimEvent>, _> = SessionHandle::spawn(
            SessionSpec::new(id.clone(), "default"),
            Arc::new(SimAgent::new(steps(1))),
            None,
        )
        .await;
        let e = r.unwrap_err();
        assert!(matches!(e, SpawnError::InvalidId(_)), "{id:?}: {e}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_persistent_session_without_a_store_is_refused() {
    let r: Result<SessionHandle<SimItem, SimEvent>, _> = SessionHandle::spawn(
        SessionSpec::new("no-store", "default").persistent(true),
        Arc::new(SimAgent::new(steps(1))),
        None,
    )
    .await;
    let e = r.unwrap_err();
    assert!(matches!(e, SpawnError::NoStore(_)));
    assert!(e.to_string().contains("pass a store"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn inspect_reports_and_after_exit_says_exited() {
    let h = spawn("inspect", SimAgent::new(steps(1))).await;
    let info = h.inspect().await.unwrap();
    assert_eq!(info.session_id, "inspect");
    assert!(!info.exited && !info.stop_committed);
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
    // The actor drains and stops; a later inspect is a clear error, not a hang.
    let mut tries = 0;
    loop {
        match h.inspect().await {
            Err(SessionError::Exited(id)) => {
                assert_eq!(id, "inspect");
                break;
            }
            Ok(info) => assert!(info.exited),
            Err(e) => panic!("{e}"),
        }
        tries += 1;
        assert!(tries < 100, "the actor never stopped");
        tokio::task::yield_now().await;
    }
}

/// S10 even when the actor is killed (ractor kill skips post_stop): the state's
/// destructor publishes an exit state holding every item, `wait` returns, subscribers
/// get Ended, and later pushes come back late.
#[tokio::test(start_paused = true)]
async fn a_killed_session_still_hands_back_every_item() {
    let gate = agentloop_sim::Gate::new();
    let (tx, mut probe) = probe();
    let h = spawn(
        "killed",
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_probe(tx),
    )
    .await;
    let events = h.subscribe();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.actor().kill();
    let exit = within("exit after kill", h.wait()).await;
    assert!(matches!(exit.reason, agentloop::ExitReason::Failed(ref e) if e.contains("killed")));
    assert_eq!(ids(&exit.interrupted_items), vec![1]);
    assert_eq!(ids(&exit.unhandled_items), vec![2]);
    let evs = collect(events).await;
    assert!(matches!(
        evs.last(),
        Some(agentloop::SessionEvent::Ended(_))
    ));
    let e = within("late push", h.push(item(3))).await.unwrap_err();
    assert!(matches!(e, PushError::Late { ref item } if item.id == 3));
}
