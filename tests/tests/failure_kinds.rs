//! S26's input: a `Failed` exit says what kind of failure it was, decided where the
//! failure happened (the supervisor's restart policy reads this, never the error text).

use std::sync::Arc;

use agentloop::{exit::FailureKind, MemoryStore, StopOptions};
use agentloop_sim::{Fault, PlanPolicy, SimAgent};
use agentloop_tests::*;

#[tokio::test(start_paused = true)]
async fn failed_exits_carry_their_kind() {
    let kind = |agent: SimAgent, id: &'static str| async move {
        let h = spawn(id, agent).await;
        h.push(item(1)).await.unwrap();
        within("exit", h.wait()).await.failure
    };
    assert_eq!(
        kind(
            SimAgent::new(steps(2)).with_fault(Some(0), 1, Fault::Fail, true),
            "agent"
        )
        .await,
        Some(FailureKind::Agent)
    );
    assert_eq!(
        kind(
            SimAgent::new(steps(2)).with_fault(Some(0), 1, Fault::Panic, true),
            "panic"
        )
        .await,
        Some(FailureKind::Panic)
    );
    assert_eq!(
        kind(
            SimAgent::new(steps(1)).with_plan(PlanPolicy {
                fail: true,
                ..Default::default()
            }),
            "plan"
        )
        .await,
        Some(FailureKind::Agent)
    );

    // A record that cannot be loaded.
    let store = Arc::new(MemoryStore::new());
    store.fail_loads(true);
    let h = spawn_persistent("record", SimAgent::new(steps(1)), store).await;
    assert_eq!(
        within("exit", h.wait()).await.failure,
        Some(FailureKind::Record)
    );

    // The actor killed under the session.
    let (h, _gate, _probe) = running("killed", SimAgent::new(steps(2))).await;
    h.actor().kill();
    assert_eq!(
        within("exit", h.wait()).await.failure,
        Some(FailureKind::Internal)
    );

    // A clean end has none.
    let h = spawn("clean", SimAgent::new(steps(1))).await;
    h.stop(StopOptions::bare()).await.unwrap();
    assert_eq!(within("exit", h.wait()).await.failure, None);
}
