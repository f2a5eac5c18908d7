//! What an inspection of a session answers ([`SessionInfo`]): a snapshot the core
//! builds and the actor hands back. Plain data.

use crate::options::TurnPhase;

/// A snapshot of a session (answer to [`TurnLoopMsg::Inspect`](crate::session::TurnLoopMsg::Inspect)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session's id.
    pub session_id: String,
    /// The current turn's phase (Idle between turns).
    pub phase: TurnPhase,
    /// The current turn's index, or the next one when idle.
    pub turn_index: u64,
    /// Items waiting in the buffer (not counting items of a preempted turn).
    pub buffered: usize,
    /// Items of a preempted turn waiting for the next plan.
    pub preempted: usize,
    /// Whether a stop has committed.
    pub stop_committed: bool,
    /// Whether the session has exited.
    pub exited: bool,
}
