//! The exit state of a session (DESIGN S13) and the summary carried by the `Ended` event.
//!
//! This module owns the shape of "how a session ended": the mechanism (`ExitReason`),
//! the business cause, the leftover items, the checkpoint outcome and the counters. It
//! only describes; the TurnLoop fills it in at teardown.

use serde::{Deserialize, Serialize};

use crate::cancel::CancelInfo;
use agentloop_core::interrupt::InterruptInfo;
pub use agentloop_core::turn::FailureKind;

/// The mechanism by which a session ended (S13). The business reason is kept apart in
/// [`ExitState::stop_cause`]; the checkpoint result in [`ExitState::checkpoint`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitReason {
    /// A clean end: no turn was cut (bare stop at a boundary, drain, idle exit).
    Completed,
    /// A stop's cancel cut the running turn.
    Canceled(CancelInfo),
    /// The agent ended a turn with a business interrupt (S4).
    Interrupted(InterruptInfo),
    /// The agent or the runtime failed; the text says why.
    Failed(String),
    /// The process shut down (a stop from the shutdown coordinator).
    Shutdown,
    /// Not an end: the incarnation went to sleep (S39), idle past its `idle_after`.
    /// Its record holds everything; its supervisor wakes it from there at the next
    /// push, by-id operation, subscription or due timer. A handle on this incarnation
    /// is spent (its pushes come back late); go through the runtime or supervisor by id.
    Asleep,
}

/// Whether a checkpoint was attempted at exit and how it went (S13, S16). Never folded
/// into [`ExitReason`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointOutcome {
    /// No save was attempted (not persistent, nothing to resume and no stale record, or
    /// a failure that must leave the stored record as it was).
    NotAttempted,
    /// The record was saved.
    Saved,
    /// The save failed; the text says why. The session's items are still in the exit
    /// state.
    Failed(String),
    /// A stale record from a previous run was deleted (clean exit, idle exit or skip).
    Deleted,
}

/// Counters kept over a session's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitCounters {
    /// Turns that completed.
    pub turns_completed: u64,
    /// Turns that ended by preemption (S8).
    pub turns_preempted: u64,
    /// Items accepted by `push`.
    pub items_accepted: u64,
    /// Items consumed by turns that completed.
    pub items_delivered: u64,
    /// Items dropped by an explicit plan decision (S5).
    pub items_dropped_by_plan: u64,
    /// Pushes rejected as late (S14).
    pub items_late: u64,
}

/// How a session ended (S13). Every accepted item is in exactly one place by S10:
/// delivered (counted), dropped by plan (counted), `unhandled_items`,
/// `interrupted_items`, or rejected as late (`late_items`).
#[derive(Clone, Debug, PartialEq)]
pub struct ExitState<I> {
    /// The session's id.
    pub session_id: String,
    /// The mechanism of the end.
    pub reason: ExitReason,
    /// For a `Failed` end, what kind of failure it was.
    pub failure: Option<FailureKind>,
    /// The business reason: the first non-empty stop cause (S11).
    pub stop_cause: Option<String>,
    /// Accepted items never consumed by a turn, in the order they would have been
    /// offered next (preempted items first).
    pub unhandled_items: Vec<I>,
    /// The items of the turn that was cut by a stop, ended by a business interrupt, or
    /// failed.
    pub interrupted_items: Vec<I>,
    /// Pushes rejected after the stop committed, up to the exit (S14). Later ones are
    /// collected by `SessionHandle::take_late_items`.
    pub late_items: Vec<I>,
    /// Whether the cut turn left resumable mid-turn state (saved with the checkpoint).
    pub has_mid_turn_state: bool,
    /// Whether a checkpoint was attempted and how it went.
    pub checkpoint: CheckpointOutcome,
    /// Counters.
    pub counters: ExitCounters,
    /// The index the next turn would have had.
    pub next_turn_index: u64,
}

impl<I> ExitState<I> {
    /// The summary carried by the `Ended` event.
    pub fn summary(&self) -> ExitSummary {
        ExitSummary {
            session_id: self.session_id.clone(),
            reason: self.reason.clone(),
            failure: self.failure,
            stop_cause: self.stop_cause.clone(),
            unhandled: self.unhandled_items.len(),
            interrupted: self.interrupted_items.len(),
            late: self.late_items.len(),
            checkpoint: self.checkpoint.clone(),
            counters: self.counters,
        }
    }
}

/// What the `Ended` event carries: the exit state without the items.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitSummary {
    /// The session's id.
    pub session_id: String,
    /// The mechanism of the end.
    pub reason: ExitReason,
    /// For a `Failed` end, what kind of failure it was
    /// ([`FailureKind::AgentPermanent`]: permanent, never restarted). Absent in
    /// summaries written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureKind>,
    /// The business reason.
    pub stop_cause: Option<String>,
    /// How many items were left unhandled.
    pub unhandled: usize,
    /// How many items were interrupted.
    pub interrupted: usize,
    /// How many pushes were rejected as late before the exit.
    pub late: usize,
    /// The checkpoint outcome.
    pub checkpoint: CheckpointOutcome,
    /// Counters.
    pub counters: ExitCounters,
}
