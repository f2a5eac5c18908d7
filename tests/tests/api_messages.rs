//! Issue 13 (7): the public message enums work with ractor's `cast!` / `call!` through
//! the re-exported `agentloop::ractor` (the version agentloop runs on), so an embedder's
//! own actors can talk to a session and to the supervisor by message.

use std::collections::HashMap;

use agentloop::prelude::*;
use agentloop::ractor::{call, cast};
use agentloop::{
    session::TurnLoopMsg, supervisor::agent_kind, supervisor::RestartBudget,
    supervisor::SupervisorMsg, SupervisorArgs,
};
use agentloop_sim::{SimAgent, SimEvent, SimItem};
use agentloop_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_and_supervisor_messages_work_with_cast_and_call() {
    let mut kinds = HashMap::new();
    kinds.insert(
        "sim".to_string(),
        agent_kind("sim", |_: &[u8]| Ok(SimAgent::new(steps(1)))),
    );
    let sup = SupervisorHandle::<SimItem, SimEvent>::start(SupervisorArgs {
        kinds,
        store: None,
        owner: None,
        budget: RestartBudget::default(),
        heartbeat: agentloop::store::DEFAULT_HEARTBEAT,
        metrics: None,
        limits: Default::default(),
    })
    .await
    .unwrap();

    // Spawn and list through call!.
    let spawned = call!(sup.actor(), |reply| SupervisorMsg::Spawn {
        spec: Box::new(SessionSpec::new("by-message", "sim")),
        reply,
    })
    .unwrap();
    let session = spawned.unwrap();
    let listed = call!(sup.actor(), |reply| SupervisorMsg::List { reply }).unwrap();
    assert_eq!(
        listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["by-message"]
    );

    // Push with cast! (no reply), then drain-stop with call!: the item is delivered.
    cast!(
        session.actor(),
        TurnLoopMsg::Push {
            item: item(1),
            options: PushOptions::default(),
            reply: None
        }
    )
    .unwrap();
    let info = call!(session.actor(), |reply| TurnLoopMsg::Inspect { reply }).unwrap();
    assert_eq!(info.session_id, "by-message");
    call!(session.actor(), |reply| TurnLoopMsg::Stop {
        options: StopOptions::drain(),
        reply: Some(reply)
    })
    .unwrap()
    .unwrap();
    let exit = within("the drained exit", session.wait()).await;
    assert_eq!(exit.counters.items_delivered, 1);
    assert!(exit.unhandled_items.is_empty() && exit.late_items.is_empty());
}
