//! A bench-only shell (feature `bench-shell`): the same session core, effects, turn
//! task and subscribers as a TurnLoop actor, driven by a plain tokio task reading an
//! unbounded channel instead of by ractor. B1 runs it beside the actor to measure
//! ractor's share of a turn's round trip (issue 54, DESIGN §10).
//!
//! A diagnostic, not the product: sessions are ractor actors that users link into
//! their own trees, and nothing but the bench uses this. It supports what B1 does
//! (a session without a store: push without a reply, subscribe, stop, wait) and owns
//! no decision: every message goes through the same `handle_message` as the actor's.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::events::{EventFilter, EventStream, Subscribers};
use crate::options::{PushOptions, StopOptions};
use crate::session::messages::TurnLoopMsg;
use crate::session::session_ref::SessionRef;
use crate::session::turn_loop::{handle_message, start, start_state, TurnLoopArgs};
use crate::session::{ExitState, SessionSpec};
use crate::shared::{SessionShared, UnprocessedPush};
use crate::turn::agent::Agent;

/// A session without a store run by a plain tokio task (see the module docs).
pub struct TaskShell<I, E> {
    tx: mpsc::UnboundedSender<TurnLoopMsg<I, E>>,
    subscribers: Arc<Subscribers<E>>,
    shared: Arc<SessionShared<I>>,
    task: tokio::task::JoinHandle<()>,
}

/// Starts a session of `agent` without a store on a plain task.
pub async fn spawn<A: Agent>(
    spec: SessionSpec<A::Item>,
    agent: Arc<A>,
) -> TaskShell<A::Item, A::Event> {
    let shared = Arc::new(SessionShared::new(spec.id.clone()));
    let subscribers = Arc::new(Subscribers::new(
        shared.event_seq.clone(),
        spec.replay,
        None,
    ));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let me = SessionRef::Task(tx.clone());
    let args = TurnLoopArgs {
        config: spec,
        agent,
        store: None,
        shared: shared.clone(),
        subscribers: subscribers.clone(),
        preloaded: None,
    };
    let task = tokio::spawn(async move {
        let mut state = start_state(me.clone(), args).await;
        start(&me, &mut state).await;
        // The shell holds a sender itself: it ends when the session's exit is
        // published, like the actor does after its teardown.
        while !state.published {
            let Some(msg) = rx.recv().await else { break };
            handle_message(&me, msg, &mut state).await;
        }
    });
    TaskShell {
        tx,
        subscribers,
        shared,
        task,
    }
}

impl<I, E> TaskShell<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Pushes `item` without waiting, as `handle.push(item).no_wait()` does.
    pub fn push_nowait(&self, item: I) {
        let mut options = PushOptions::new();
        options.unprocessed = Some(UnprocessedPush::new(item.clone(), self.shared.clone()));
        // A session that is gone drops the message, and its guard puts the item on the
        // late list.
        drop(self.tx.send(TurnLoopMsg::Push {
            item,
            options,
            reply: None,
        }));
    }

    /// Subscribes, as `SessionHandle::subscribe_filtered` does (the shell answers
    /// subscriptions itself instead of through a message).
    pub fn subscribe_filtered(&self, capacity: usize, filter: EventFilter) -> EventStream<E> {
        self.subscribers.subscribe(capacity, filter)
    }

    /// Stops the session with `options` and returns its exit state once published
    /// (`None`: the shell's task ended without publishing one).
    pub async fn stop(self, options: StopOptions) -> Option<ExitState<I>> {
        drop(self.tx.send(TurnLoopMsg::Stop {
            options,
            reply: None,
        }));
        let mut rx = self.shared.exit_signal();
        let exit = rx
            .wait_for(|e| e.is_some())
            .await
            .ok()
            .and_then(|e| e.clone());
        // The task ends right after publishing; a panic in it is the bench's to see.
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "the bench shell's task failed");
        }
        exit.map(|e| (*e).clone())
    }
}
