//! The `Agent` trait and the values that cross it: plans, turns, outcomes, agent errors
//! (DESIGN §2, S4, S5), and the context a turn runs with ([`TurnCx`], whose methods
//! live in `context.rs`, `steps.rs` and `wake.rs`). Published as `agentloop::agent`.
//!
//! This module owns the contract between user code and the runtime. The trait and the
//! context name each other, so they live in one file of the turn's module. It must not
//! know about actors or stores: the TurnLoop calls these methods from a turn task it
//! owns.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use agentloop_core::plan::{Plan, PlanInput};
pub use agentloop_core::turn::AgentError;

use tokio::sync::watch;

use crate::events::Subscribers;
use crate::shared::SessionShared;
use crate::turn::control::TurnControl;

/// An agent: user code that plans and runs turns over pushed items.
///
/// One runtime hosts many agent kinds that share one item type and one event type;
/// their state types may differ (records hold the state as encoded bytes).
pub trait Agent: Send + Sync + Sized + 'static {
    /// What clients push: a user message, a tool result, a task.
    type Item: Clone + Send + Sync + Serialize + DeserializeOwned + Debug + 'static;
    /// What the agent emits while running a turn (streamed to subscribers).
    type Event: Clone + Send + Sync + Debug + 'static;
    /// The turn's resumable state, recorded at safe points and saved in checkpoints.
    type State: Clone + Send + Sync + Serialize + DeserializeOwned + Debug + 'static;

    /// Chooses what the next turn consumes (S5). The default consumes everything
    /// offered, preempted items first, then the buffer, in order.
    ///
    /// Items in neither `consumed` nor `remaining` are dropped by the agent's decision:
    /// the runtime counts and traces them. Returning more items than offered is an
    /// error. A failed plan puts every offered item back in its original order (S6).
    fn plan(
        &self,
        offer: PlanInput<Self::Item>,
    ) -> impl Future<Output = Result<Plan<Self::Item>, AgentError>> + Send {
        async move { Ok(offer.consume_all()) }
    }

    /// Runs one turn. Call `cx.safe_point(..)` after every model call and after every
    /// round of tool calls and propagate its error with `?`; emit events with
    /// `cx.emit(..)`.
    fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> impl Future<Output = Result<TurnOutcome<Self::State>, AgentError>> + Send;
}

/// A turn as handed to [`Agent::run_turn`].
pub struct Turn<A: Agent> {
    /// The turn's index within the session (counts from 0, continues across resumes).
    pub index: u64,
    /// The items this turn consumes.
    pub items: Vec<A::Item>,
    /// Whether some of the items come from a preempted turn (S8).
    pub has_preempted_items: bool,
    /// When this is a resume turn (S17): the state saved at the cut turn's last safe
    /// point. The agent continues from it.
    pub resume: Option<A::State>,
    /// When this turn resumes a business interrupt (S4) that a caller answered
    /// (`resume_with_answer`): the answer, a value of the item type (LangGraph's
    /// `Command(resume=…)`). Given to the resumed turn only; `None` otherwise.
    pub answer: Option<A::Item>,
    /// The state the session's last completed turn left
    /// ([`TurnOutcome::CompletedWith`]), when this turn does not resume from a safe
    /// point's state (`resume` is `None`); `None` when no turn left one. A turn cut
    /// mid-way resumes from its own state instead, which holds whatever it carried.
    pub state: Option<A::State>,
}

impl<A: Agent> Debug for Turn<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("index", &self.index)
            .field("items", &self.items)
            .field("has_preempted_items", &self.has_preempted_items)
            .field("resume", &self.resume)
            .field("answer", &self.answer)
            .field("state", &self.state)
            .finish()
    }
}

pub use agentloop_core::interrupt::InterruptInfo;

/// How a turn ended from the agent's point of view.
#[derive(Clone, Debug)]
pub enum TurnOutcome<S> {
    /// The turn finished its work. A state an earlier turn carried
    /// ([`CompletedWith`](Self::CompletedWith)) stays as it was.
    Completed,
    /// The turn finished its work and leaves `state` to the session's next turn
    /// ([`Turn::state`]): the session carries it between turns, in its record when it
    /// persists (across stops, restarts, sleeps and moves), until a later turn completes
    /// with another. What an agent keeps between turns, a conversation for example,
    /// belongs here, not in the agent's own fields (which a restart or a sleep loses).
    /// Keep it bounded: it is written with the session's record.
    CompletedWith {
        /// What the next turn starts from.
        state: S,
    },
    /// The agent ended the turn with a business interrupt (S4): the loop exits with
    /// `ExitReason::Interrupted`, the consumed items become `interrupted_items`, and the
    /// state is checkpointed so a later resume continues the turn.
    Interrupted {
        /// Why.
        info: InterruptInfo,
        /// Where to continue from.
        state: S,
    },
    /// The turn finished its work and ends with a wake-up time (S39): when the turn ends
    /// completed, a durable timer is armed that at its time pushes its item into the
    /// session (waking it if it sleeps), once, also after restarts. Build it with
    /// [`TurnCx::end_and_wake_at`]; see there for what it guarantees.
    WakeAt(WakeUp),
}

/// The wake-up a turn ends with ([`TurnOutcome::WakeAt`]): a due time and the item the
/// timer pushes then, encoded by the session's codec. Made by
/// [`TurnCx::end_and_wake_at`], which knows the session's item type.
#[derive(Clone, Debug)]
pub struct WakeUp {
    pub(crate) timer: crate::store::StoredTimer,
}

impl<S> TurnOutcome<S> {
    /// What the turn's state machine classifies (`agentloop_core::turn::Outcome`): a
    /// wake-up's timer was armed by the turn task before the turn ended (its last
    /// durable step), so it is a completed turn.
    pub(crate) fn into_outcome(self) -> agentloop_core::turn::Outcome<S> {
        use agentloop_core::turn::Outcome;
        match self {
            TurnOutcome::Completed | TurnOutcome::WakeAt(_) => Outcome::Completed,
            TurnOutcome::CompletedWith { state } => Outcome::CompletedWith(state),
            TurnOutcome::Interrupted { info, state } => Outcome::Interrupted(info, state),
        }
    }
}

impl WakeUp {
    /// When the timer is due.
    pub fn due(&self) -> std::time::SystemTime {
        crate::timers::at(self.timer.due_ms)
    }
}

/// The context of one running turn.
pub struct TurnCx<A: Agent> {
    pub(crate) turn: u64,
    pub(crate) session: Arc<SessionShared<A::Item>>,
    pub(crate) control: Arc<TurnControl<A::Item, A::State>>,
    pub(crate) subscribers: Arc<Subscribers<A::Event>>,
    pub(crate) stopped: watch::Receiver<bool>,
    /// The runtime's metrics (steps count into them), when the session has them.
    pub(crate) metrics: Option<Arc<crate::metrics::RuntimeMetrics>>,
}

impl<A: Agent> Clone for TurnCx<A> {
    fn clone(&self) -> Self {
        TurnCx {
            turn: self.turn,
            session: self.session.clone(),
            control: self.control.clone(),
            subscribers: self.subscribers.clone(),
            stopped: self.stopped.clone(),
            metrics: self.metrics.clone(),
        }
    }
}
