//! What a supervisor is built with (its agent kinds, store, owner, restart budget,
//! heartbeat and metrics) and the bounds it applies to its sessions (S34a). Plain
//! data: nothing here runs.

use super::kind::AgentKind;
use crate::session::restart::RestartBudget;
use crate::store::CheckpointStore;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What the supervisor is built with.
pub struct SupervisorArgs<I, E> {
    /// Agent kinds by name.
    pub kinds: HashMap<String, Arc<dyn AgentKind<I, E>>>,
    /// The checkpoint store for persistent sessions.
    pub store: Option<Arc<dyn CheckpointStore<I>>>,
    /// The runtime instance that owns the sessions (recorded in their records).
    pub owner: Option<String>,
    /// The restart budget per session.
    pub budget: RestartBudget,
    /// The instance heartbeat: how often a detached session re-reads its record, so a
    /// cancel written by another process is noticed within one heartbeat (S24). The
    /// runtime passes its own; [`DEFAULT_HEARTBEAT`](crate::store::DEFAULT_HEARTBEAT) otherwise.
    pub heartbeat: Duration,
    /// Where the supervisor and its sessions count turns, routed pushes and restarts
    /// (S35); `None` counts nothing.
    pub metrics: Option<Arc<crate::metrics::RuntimeMetrics>>,
    /// How many sessions it runs and how much each holds (S34a); unbounded by default.
    pub limits: SessionLimits,
}

/// The bounds a supervisor applies to its sessions (S34a, `[limits]` in
/// agentloop.toml): how many run at once, and what each holds before it refuses a push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// Live sessions at most: a spawn over it is refused with
    /// [`SupervisorError::TooManySessions`](super::SupervisorError::TooManySessions). Sessions the runtime resumes or adopts
    /// from their records are never refused for it (they are the runtime's own).
    pub max_sessions: usize,
    /// What each session holds before it refuses a push ([`PushError::Full`](crate::session::PushError::Full)).
    pub buffer: crate::session::BufferBound,
    /// What each session's durable timers may hold (count, item size, shortest
    /// period; issue 52).
    pub timers: crate::timers::TimerBounds,
}

impl SessionLimits {
    /// No bounds (an embedded runtime whose callers are trusted).
    pub const UNBOUNDED: SessionLimits = SessionLimits {
        max_sessions: usize::MAX,
        buffer: crate::session::BufferBound::UNBOUNDED,
        timers: crate::timers::TimerBounds::UNBOUNDED,
    };
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}
