//! Issue 16 (3): the simulated agent can run without a ledger, keeping only shared
//! counts, so a long-running job's memory does not grow with its turns; tests keep the
//! full ledger by default.

use std::sync::Arc;

use agentloop::{SessionHandle, SessionSpec, StopOptions};
use agentloop_sim::{Script, SimAgent, SimCounters, SimEvent, SimItem};

type Handle = SessionHandle<SimItem, SimEvent>;

async fn run(agent: SimAgent, id: &str, items: u64) -> agentloop::ExitState<SimItem> {
    let h: Handle = SessionHandle::spawn(SessionSpec::new(id, "default"), Arc::new(agent), None)
        .await
        .unwrap();
    for i in 0..items {
        h.push(SimItem::new(i, "x")).await.unwrap();
    }
    h.stop(StopOptions::drain()).await.unwrap();
    h.wait().await
}

#[tokio::test(start_paused = true)]
async fn without_a_ledger_only_counts_grow() {
    let counters = Arc::new(SimCounters::default());
    let a = SimAgent::new(Script::noop())
        .without_ledger()
        .with_counters(counters.clone());
    let b = SimAgent::new(Script::noop()).with_counters(counters.clone());
    let (ledger_a, ledger_b) = (a.ledger(), b.ledger());
    let exit_a = run(a, "counted-a", 50).await;
    let exit_b = run(b, "counted-b", 30).await;
    // Every item was delivered to a completed turn, and counted across both agents.
    assert_eq!(counters.items(), 80);
    assert_eq!(
        counters.turns(),
        exit_a.counters.turns_completed + exit_b.counters.turns_completed
    );
    // The agent without a ledger kept nothing per turn; the default one kept it all.
    assert_eq!(*ledger_a.lock(), agentloop_sim::Ledger::default());
    assert_eq!(ledger_b.lock().delivered_ids().len(), 30);
}
