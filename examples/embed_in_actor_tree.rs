//! Embedding: your own ractor actor owns an agentloop `SessionSupervisor` (linked under
//! it), spawns sessions by message, pushes to them by id, and observes how each ended.
//!
//! Run: `cargo run --release --example embed_in_actor_tree`

use std::collections::HashMap;
use std::time::Duration;

use agentloop::{
    supervisor::agent_kind, supervisor::RestartBudget, ExitReason, SessionSpec, StopOptions,
    SupervisorArgs, SupervisorHandle,
};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

/// Your application's top actor.
struct App;

/// What your application asks of it.
enum AppMsg {
    /// Start a conversation with these messages.
    Start { id: String, messages: Vec<String> },
    /// Stop every conversation and report how each ended.
    Finish {
        reply: RpcReplyPort<Vec<(String, ExitReason, u64)>>,
    },
}

// Local: compiles with and without agentloop's `cluster` feature (docs/architecture.md).
agentloop::local_message!(AppMsg);

struct AppState {
    sessions: SupervisorHandle<SimItem, SimEvent>,
    next_item: u64,
}

impl Actor for App {
    type Msg = AppMsg;
    type State = AppState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<AppMsg>,
        _: (),
    ) -> Result<AppState, ActorProcessingErr> {
        // The agent kinds this application runs, by name.
        let mut kinds = HashMap::new();
        kinds.insert(
            "assistant".to_string(),
            agent_kind("assistant", |_config: &[u8]| {
                Ok(SimAgent::new(Script::react(
                    1,
                    Duration::from_millis(5),
                    Duration::from_millis(2),
                )))
            }),
        );
        // The supervisor is our linked child: if it ever dies we hear of it below.
        let sessions = SupervisorHandle::start_linked(
            SupervisorArgs {
                kinds,
                store: None,
                owner: None,
                budget: RestartBudget::default(),
                heartbeat: agentloop::store::DEFAULT_HEARTBEAT,
                metrics: None,
                // What a session holds and how many run: bound them when callers
                // are not trusted (S34a).
                limits: agentloop::supervisor::SessionLimits::UNBOUNDED,
            },
            myself.get_cell(),
        )
        .await?;
        Ok(AppState {
            sessions,
            next_item: 0,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<AppMsg>,
        msg: AppMsg,
        st: &mut AppState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AppMsg::Start { id, messages } => {
                let items = messages
                    .into_iter()
                    .map(|m| {
                        st.next_item += 1;
                        SimItem::new(st.next_item, m)
                    })
                    .collect();
                st.sessions
                    .spawn(SessionSpec::new(id, "assistant").initial_items(items))
                    .await?;
            }
            AppMsg::Finish { reply } => {
                let exits = st.sessions.stop_all(StopOptions::drain()).await;
                let report = exits
                    .into_iter()
                    .map(|e| (e.session_id, e.reason, e.counters.items_delivered))
                    .collect();
                let _ = reply.send(report);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<AppMsg>,
        evt: SupervisionEvent,
        _st: &mut AppState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(_, e) = evt {
            eprintln!("the session supervisor failed: {e}");
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (app, handle) = Actor::spawn(None, App, ()).await?;
    for (id, msgs) in [
        ("support-1", vec!["my order is late", "it was #42"]),
        ("support-2", vec!["how do I reset my password?"]),
    ] {
        app.cast(AppMsg::Start {
            id: id.into(),
            messages: msgs.into_iter().map(String::from).collect(),
        })?;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let report = ractor::call!(app, |reply| AppMsg::Finish { reply })?;
    for (id, reason, delivered) in report {
        println!("{id}: ended {reason:?}, {delivered} messages handled");
    }
    app.stop(None);
    handle.await?;
    Ok(())
}
