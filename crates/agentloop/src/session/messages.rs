//! The TurnLoop's public message type and its replies (DESIGN S7, S11, S14, S25).
//!
//! Other actors can `cast!` and `call!` a session with these messages; most users go
//! through [`crate::SessionHandle`] instead. This module only defines shapes; the
//! behaviour is in `turn_loop.rs`.

use std::fmt;

use ractor::RpcReplyPort;

use crate::events::EventStream;
use crate::options::{OptionsError, PushOptions, StopOptions, TurnPhase};

/// What a push's preempt did (S7). A push without a preempt answers `NotRequested`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreemptAck {
    /// The push carried no preempt; the item was buffered.
    NotRequested,
    /// No turn was planning or running: the item was only buffered.
    NoTarget,
    /// The cancel was submitted to this turn (at once, when a planning turn started
    /// running, or when a delay elapsed).
    Submitted {
        /// The target turn.
        turn: u64,
    },
    /// The target turn ended before the cancel could be submitted (a delayed preempt,
    /// or a planning turn that never ran); nothing was canceled.
    TargetEnded {
        /// The target turn.
        turn: u64,
    },
}

/// A push that was not accepted. The item always comes back (S14).
#[derive(Clone, PartialEq)]
pub enum PushError<I> {
    /// The stop already committed (or the session exited): the push is late. A copy is
    /// also kept in the session's late list.
    Late {
        /// The item, handed back.
        item: I,
    },
    /// `sync` durability: the item was accepted and stays in the session (it shows up in
    /// the exit state), but the write that would have made it durable failed.
    NotDurable {
        /// The store's error.
        error: String,
    },
    /// The push options were invalid; the item was not accepted and is handed back.
    InvalidOptions {
        /// The item, handed back.
        item: I,
        /// What was wrong.
        error: OptionsError,
    },
}

impl<I> PushError<I> {
    /// The item that was not accepted (`None` for `NotDurable`: that item was accepted).
    pub fn into_item(self) -> Option<I> {
        match self {
            PushError::Late { item } | PushError::InvalidOptions { item, .. } => Some(item),
            PushError::NotDurable { .. } => None,
        }
    }
}

impl<I> fmt::Debug for PushError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<I> fmt::Display for PushError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Late { .. } => f.write_str(
                "push rejected: the session is stopping or has exited; the item is handed back \
                 in this error and kept in the session's late list",
            ),
            PushError::InvalidOptions { error, .. } => {
                write!(f, "push rejected: {error}; the item is handed back")
            }
            PushError::NotDurable { error } => write!(
                f,
                "push accepted but not durable: the checkpoint write failed ({error}); the item \
                 stays in the session and in its exit state; check the store"
            ),
        }
    }
}

impl<I> std::error::Error for PushError<I> {}

/// The reply port of a push: resolves with the preempt acknowledgement (S7) or the
/// rejection (S14).
pub type PushReply<I> = RpcReplyPort<Result<PreemptAck, PushError<I>>>;

/// The acknowledgement of an accepted push whose preempt is still pending (a planning
/// target or a delay). Invariant: the item is already accepted, so the caller must hear
/// `Ok`: if this is dropped unanswered (the session exited or was killed first), it
/// answers `TargetEnded`, so the caller never mistakes an accepted item for a lost one.
pub(crate) struct PendingAck<I> {
    port: Option<PushReply<I>>,
    turn: u64,
}

impl<I> PendingAck<I> {
    pub(crate) fn new(port: PushReply<I>, turn: u64) -> Self {
        PendingAck {
            port: Some(port),
            turn,
        }
    }

    /// Answers with `ack`.
    pub(crate) fn answer(mut self, ack: PreemptAck) {
        if let Some(p) = self.port.take() {
            let _ = p.send(Ok(ack));
        }
    }
}

impl<I> Drop for PendingAck<I> {
    fn drop(&mut self) {
        if let Some(p) = self.port.take() {
            let _ = p.send(Ok(PreemptAck::TargetEnded { turn: self.turn }));
        }
    }
}

/// Carried by a push sent without a reply (`SessionHandle::push_nowait`). Invariant:
/// if the message is dropped without being processed (the actor was killed with it
/// queued), the item goes to the session's late list instead of vanishing (S10, S14).
pub struct UnprocessedPush<I> {
    item: Option<I>,
    shared: std::sync::Arc<crate::session::shared::SessionShared<I>>,
}

impl<I> UnprocessedPush<I> {
    pub(crate) fn new(
        item: I,
        shared: std::sync::Arc<crate::session::shared::SessionShared<I>>,
    ) -> Self {
        UnprocessedPush {
            item: Some(item),
            shared,
        }
    }

    /// The actor took the message: it accounts for the item from now on.
    pub(crate) fn disarm(mut self) {
        self.item = None;
    }
}

impl<I> Drop for UnprocessedPush<I> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            self.shared.push_late_unchecked(item);
        }
    }
}

/// A snapshot of a session (answer to [`TurnLoopMsg::Inspect`]).
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

/// Messages a TurnLoop actor accepts.
pub enum TurnLoopMsg<I, E> {
    /// Push an item (S5, S7, S9). The reply resolves when the preempt (if any) was
    /// submitted or found nothing to cancel.
    Push {
        /// The item.
        item: I,
        /// Preempt options.
        options: PushOptions<I>,
        /// Where to answer; without one, a rejection is still recorded in the late list.
        reply: Option<PushReply<I>>,
    },
    /// Stop the session (S11). A stop on an exited session is a no-op that answers Ok.
    Stop {
        /// What kind of stop.
        options: StopOptions,
        /// Where to answer.
        reply: Option<RpcReplyPort<Result<(), OptionsError>>>,
    },
    /// Subscribe to the event stream (S20). After the exit the stream yields `Ended` at
    /// once.
    Subscribe {
        /// The subscriber's buffer capacity.
        capacity: usize,
        /// Which events it wants (`Ended` always comes).
        filter: crate::events::EventFilter,
        /// Where to answer.
        reply: RpcReplyPort<EventStream<E>>,
    },
    /// Hand the session to the background (S23): the record becomes `Running` with
    /// the in-flight and queued items, the session drains, and its record is finalized
    /// by compare-and-swap when it ends. Answered once the record is durable.
    Detach {
        /// Where to answer.
        reply: RpcReplyPort<Result<(), crate::error::SessionError>>,
    },
    /// Take a snapshot.
    Inspect {
        /// Where to answer.
        reply: RpcReplyPort<SessionInfo>,
    },
    /// Internal: sent by the session's own turn task and timers. Cannot be built
    /// outside this crate.
    Internal(Internal<I>),
}

impl<I, E> fmt::Debug for TurnLoopMsg<I, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TurnLoopMsg::Push { options, .. } => write!(f, "Push({options:?})"),
            TurnLoopMsg::Stop { options, .. } => write!(f, "Stop({options:?})"),
            TurnLoopMsg::Subscribe { .. } => f.write_str("Subscribe"),
            TurnLoopMsg::Inspect { .. } => f.write_str("Inspect"),
            TurnLoopMsg::Detach { .. } => f.write_str("Detach"),
            TurnLoopMsg::Internal(i) => write!(f, "Internal({:?})", i.0.name()),
        }
    }
}

/// An internal message (opaque outside the crate).
pub struct Internal<I>(pub(crate) InternalMsg<I>);

pub(crate) enum InternalMsg<I> {
    /// The turn task of `turn` is done; its ending is in the control block.
    TurnFinished { turn: u64 },
    /// A delayed preempt is due (S7).
    PreemptDue {
        turn: u64,
        preempt: crate::options::Preempt,
        reply: Option<PendingAck<I>>,
    },
    /// An idle timer fired (S11 `until_idle_for`).
    IdleDue { epoch: u64 },
    /// `sync` durability: the write with this sequence number finished.
    Synced {
        seq: u64,
        result: Result<(), crate::store::StoreError>,
    },
    /// `sync` durability: the running turn recorded a new state at a safe point, or its
    /// plan dropped items: rewrite the record.
    SafePointReached { turn: u64 },
    /// A detached session re-reads its own record (S24).
    PollRecord,
}

impl<I> InternalMsg<I> {
    fn name(&self) -> &'static str {
        match self {
            InternalMsg::TurnFinished { .. } => "TurnFinished",
            InternalMsg::PreemptDue { .. } => "PreemptDue",
            InternalMsg::IdleDue { .. } => "IdleDue",
            InternalMsg::Synced { .. } => "Synced",
            InternalMsg::SafePointReached { .. } => "SafePointReached",
            InternalMsg::PollRecord => "PollRecord",
        }
    }
}
