//! What a TurnLoop holds between messages: the session's core and what performing its
//! effects needs (the agent, the store, the subscribers, the writes in flight, the
//! running turn's task), and what a killed actor still owes: its destructor hands
//! every item back through the exit state. Shared by the actor's shell (`turn_loop`),
//! its effects (`effects`) and its exit (`teardown`); it decides nothing.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::session::session_ref::SessionRef;

use crate::events::Subscribers;
use crate::exit::ExitState;
use crate::session::core::{Core, Effect};
use crate::session::messages::{Internal, InternalMsg, TurnLoopMsg};
use crate::store::{CheckpointStore, StoreError};
use crate::turn::agent::Agent;

/// The TurnLoop's state: the core and what performing its effects needs.
pub(crate) struct LoopState<A: Agent> {
    pub(super) core: Core<A>,
    pub(super) agent: Arc<A>,
    pub(super) store: Option<Arc<dyn CheckpointStore<A::Item>>>,
    pub(super) subscribers: Arc<Subscribers<A::Event>>,
    /// Store operations issued and not yet reported, by number; each task returns its
    /// operation's result, so the teardown can await exactly those.
    pub(super) writes: VecDeque<(
        u64,
        tokio::sync::oneshot::Receiver<Result<bool, StoreError>>,
    )>,
    /// The running turn's task (aborted if the actor dies).
    pub(super) turn_task: Option<tokio::task::AbortHandle>,
    /// Delayed preempts' timers by number (S7): canceled when their turn ends, and
    /// when the actor ends (issue 52).
    pub(super) preempt_timers: std::collections::HashMap<u64, tokio::task::AbortHandle>,
    /// The exit state from the moment the teardown computed it until it is published,
    /// so an actor killed mid-teardown still hands every item back.
    pub(super) final_exit: Option<Box<ExitState<A::Item>>>,
    /// The exit state is published.
    pub(super) published: bool,
    /// The effects of the event being handled (its capacity is kept between events).
    pub(super) effects: Vec<Effect<A>>,
    /// Session-end hooks (S21) and the bound on each.
    pub(super) end_hooks: Vec<crate::session::EndHook>,
    pub(super) hook_timeout: std::time::Duration,
    pub(super) span: tracing::Span,
    /// Where turns are counted (S35).
    pub(super) metrics: Option<Arc<crate::metrics::RuntimeMetrics>>,
    /// Its supervisor's restart decision (S26): `Restarting` instead of `Ended`.
    pub(super) restart_oracle: Option<Arc<crate::session::restart::RestartOracle>>,
}

impl<A: Agent> Drop for LoopState<A> {
    fn drop(&mut self) {
        // The actor was killed or failed before its teardown finished (ractor skips
        // post_stop then). Hand everything back through the exit state so nothing is
        // lost and `wait` returns; stop the turn task.
        if self.published {
            return;
        }
        if let Some(t) = &self.turn_task {
            t.abort();
        }
        for (_, t) in self.preempt_timers.drain() {
            t.abort();
        }
        // Pushes waiting for a write were accepted: they are in the exit state, and
        // their callers must hear that, not a silence that looks like a lost item.
        self.core
            .abandon_writes("the session actor stopped before the write was confirmed");
        let exit = match self.final_exit.take() {
            // The teardown had computed the exit (and done the checkpoint): publish it.
            Some(exit) => *exit,
            None => self.core.salvage(),
        };
        self.subscribers.end(self.last(exit.summary()));
        self.core.shared.fire_stopped();
        self.core.shared.publish_exit(exit);
    }
}

impl<A: Agent> LoopState<A> {
    /// How the streams end: `Restarting` when the supervisor starts the session again
    /// (S26, issue 53), else `Ended`.
    pub(super) fn last(&self, summary: crate::session::ExitSummary) -> crate::events::Last {
        let restarting = self
            .restart_oracle
            .as_ref()
            .and_then(|o| o.foresee(&summary));
        crate::events::Last {
            summary,
            restarting,
        }
    }
}

/// The actor's own reference.
/// Where the session's own tasks and timers report to.
pub(super) type Myself<A> = SessionRef<<A as Agent>::Item, <A as Agent>::Event>;

/// Wraps an internal message (a task or timer reporting back).
pub(super) fn internal<A: Agent>(msg: InternalMsg<A::Item>) -> TurnLoopMsg<A::Item, A::Event> {
    TurnLoopMsg::Internal(Internal(msg))
}
