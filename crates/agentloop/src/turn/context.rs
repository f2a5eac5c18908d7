//! The turn context handed to agent code (DESIGN S1, S1a, S8, S13).
//!
//! [`TurnCx`] is the agent's only window on the runtime during a turn: emit events,
//! mark safe points, log steps before they start, run durable steps (S1b, in
//! `turn/steps.rs`), and watch the stopped / preempted signals. It reads and writes the turn's control block and the session's shared
//! state; it never talks to the actor directly.

use crate::cancel::{Canceled, SafePoint};
use crate::events::SessionEvent;
use crate::turn::agent::{Agent, AgentError, InterruptInfo, TurnCx, TurnOutcome};

/// The kind of step a turn is about to take (S1a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A model call.
    ModelCall,
    /// A round of tool calls.
    ToolCalls,
}

impl<A: Agent> TurnCx<A> {
    /// The session's id.
    pub fn session_id(&self) -> &str {
        &self.session.id
    }

    /// The turn's index.
    pub fn turn_index(&self) -> u64 {
        self.turn
    }

    /// Emits an agent event to every subscriber. Waits while a live subscriber's buffer
    /// is full (backpressure); never waits on a dropped subscriber.
    pub async fn emit(&self, event: A::Event) {
        if !self.subscribers.wants(|f| f.agent) {
            // Nobody receives it, but it still has its place in the sequence.
            self.subscribers.skip();
            return;
        }
        self.subscribers
            .send(SessionEvent::Agent {
                turn: self.turn,
                event,
            })
            .await;
    }

    /// A safe point (S1): records `state` as the turn's last resumable state and
    /// returns `Err(Canceled)` when a pending cancel matches `kind`. Propagate it with
    /// `?`. The runtime captures the cancel itself, so swallowing the error does not
    /// hide it.
    pub fn safe_point(&self, kind: SafePoint, state: &A::State) -> Result<(), Canceled> {
        let r = self.control.safe_point(kind, state);
        if let Err(c) = &r {
            tracing::debug!(session = %self.session.id, turn = self.turn, at = %c.at, "cancel captured at safe point");
        }
        r
    }

    /// Puts a step on record before it runs (S1a), so work cut short by a forced
    /// cancel or a kill still shows up in cost audits.
    pub fn begin_step(&self, step: Step, attributes: &[(&str, i64)]) {
        tracing::info!(
            target: "agentloop::audit",
            session = %self.session.id,
            turn = self.turn,
            step = ?step,
            attributes = ?attributes,
            "step begins"
        );
    }

    /// Whether a stop has committed.
    pub fn is_stopped(&self) -> bool {
        *self.stopped.borrow()
    }

    /// Resolves once a stop has committed (S13).
    pub async fn stopped(&self) {
        let mut rx = self.stopped.clone();
        // An error means the session is gone, which also counts as stopped.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The business cause of the stop: the first non-empty one (S11). `None` until
    /// [`TurnCx::stopped`] has fired, and when no stop carried a cause.
    pub fn stop_cause(&self) -> Option<String> {
        if self.is_stopped() {
            self.session.cause()
        } else {
            None
        }
    }

    /// Resolves once a cancel is in force for this turn (a stop's cancel or a
    /// preemption) that a safe point of kind `kind` would capture. A turn doing long
    /// work before such a safe point (streaming a model's answer before
    /// `AfterModelCall`) selects on it to drop that work at once, then passes the safe
    /// point, which captures the cancel. Never resolves for a stop without a cancel (a
    /// bare or drain stop lets the turn finish), nor for a cancel that waits for
    /// another kind of safe point.
    pub async fn cancel_requested(&self, kind: SafePoint) {
        self.control.cancel_requested(kind).await
    }

    /// Whether this turn has been preempted (S8).
    pub fn is_preempted(&self) -> bool {
        self.control.is_preempted()
    }

    /// Resolves once this turn is preempted (S8).
    pub async fn preempted(&self) {
        self.control.preempted().await
    }

    /// Whether a cancel was captured at one of this turn's safe points.
    pub fn is_canceled(&self) -> bool {
        self.control.is_captured()
    }

    /// Ends the turn with a business interrupt (S4): return this from `run_turn`.
    pub fn interrupt(
        &self,
        reason: impl Into<String>,
        state: A::State,
    ) -> Result<TurnOutcome<A::State>, AgentError> {
        Ok(TurnOutcome::Interrupted {
            info: InterruptInfo::new(reason),
            state,
        })
    }

    /// Ends the turn with a business interrupt that asks `question` (S4), e.g. the
    /// tool call a human must approve: return this from `run_turn`. A persistent
    /// session keeps the question in its record and waits for an answer
    /// (`resume_with_answer`); the resumed turn reads it in [`crate::turn::agent::Turn::answer`].
    pub fn ask(
        &self,
        reason: impl Into<String>,
        question: serde_json::Value,
        state: A::State,
    ) -> Result<TurnOutcome<A::State>, AgentError> {
        Ok(TurnOutcome::Interrupted {
            info: InterruptInfo::asking(reason, question),
            state,
        })
    }
}
