//! How a turn ends: the agent's error ([`AgentError`]), the turn's end as the session's
//! events report it ([`TurnEnd`]) and the kind of failure a failed session reports
//! ([`FailureKind`], S26).
//!
//! Plain data shared by the turn's state machine ([`super::TurnMachine`]), which
//! classifies a turn, and the runtime, which reports it. It must not decide anything.

use serde::{Deserialize, Serialize};

use crate::cancel::{CancelInfo, Canceled};
use crate::interrupt::InterruptInfo;

/// An error returned by agent code.
///
/// A failure is *transient* (calling again later may succeed: a server error, a rate
/// limit, a timeout, a connection that broke) or *permanent* (it would come back the
/// same: a refusal such as a model server's 401/403/404/422, a bad configuration, an
/// answer that cannot be decoded). The supervisor restarts a session whose agent
/// failed transiently, as its restart policy and budget allow; it never restarts one
/// whose agent failed permanently, whatever its policy: the session ends `Failed` at
/// once and its exit says [`FailureKind::AgentPermanent`] (S26).
/// [`AgentError::failed`] builds a transient failure (what every agent returned
/// before the classification), [`AgentError::permanent`] a permanent one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// A safe point reported a matching cancel; propagate it with `?`.
    #[error(transparent)]
    Canceled(#[from] Canceled),
    /// The agent failed, transiently (a restart may succeed); the message says why (it
    /// is kept in the exit state and in the session record).
    #[error("agent failed: {0}")]
    Failed(String),
    /// The agent failed permanently: a restart would fail the same way, so none is
    /// made. The message says why.
    #[error("agent failed permanently: {0}")]
    Permanent(String),
}

impl AgentError {
    /// A transient failure with this message.
    pub fn failed(msg: impl Into<String>) -> Self {
        AgentError::Failed(msg.into())
    }

    /// A permanent failure with this message: the session is not restarted.
    pub fn permanent(msg: impl Into<String>) -> Self {
        AgentError::Permanent(msg.into())
    }

    /// Whether this is a permanent failure (never restarted).
    pub fn is_permanent(&self) -> bool {
        matches!(self, AgentError::Permanent(_))
    }

    /// The failure's message (`None` for a cancel).
    pub fn message(&self) -> Option<&str> {
        match self {
            AgentError::Canceled(_) => None,
            AgentError::Failed(m) | AgentError::Permanent(m) => Some(m),
        }
    }
}

/// How a turn ended, as reported by the session's `TurnEnded` event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TurnEnd {
    /// The turn completed its work.
    Completed,
    /// A preemption ended the turn (S8); its items are offered to the next plan.
    Preempted(CancelInfo),
    /// A stop's cancel ended the turn.
    Canceled(CancelInfo),
    /// The agent ended the turn with a business interrupt (S4).
    Interrupted(InterruptInfo),
    /// The agent returned an error or panicked.
    Failed(String),
    /// The plan failed or a stop arrived while planning; the offered items went back to
    /// the buffer in their original order (S6). No `TurnStarted` preceded this.
    PlanAborted(String),
}

/// What kind of failure ended a `Failed` session: decided where the failure happened,
/// so a supervisor's restart policy reads it instead of parsing error text (S26).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The agent returned a transient error (from `plan` or `run_turn`).
    Agent,
    /// The agent returned a permanent error ([`AgentError::Permanent`]): no
    /// restart policy restarts it, the session ends `Failed` at once (S26).
    AgentPermanent,
    /// Agent code panicked.
    Panic,
    /// The session's stored record could not be used (load error, corrupt, refused).
    Record,
    /// The runtime failed (a turn task or the session actor died unexpectedly).
    Internal,
}
