//! The TurnLoop's public message type and its replies (DESIGN S7, S11, S14, S25).
//!
//! Other actors can `cast!` and `call!` a session with these messages; most users go
//! through [`crate::session::SessionHandle`] instead. This module only defines shapes; the
//! behaviour is in `turn_loop.rs`.

use std::fmt;

use ractor::RpcReplyPort;

use crate::events::EventStream;
use crate::options::{OptionsError, PushOptions, StopOptions};
pub use crate::push::{PreemptAck, PushError, PushReply};
pub use crate::session::info::SessionInfo;

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
    /// Write the session's record now (a persistent session), answered once it is
    /// durable: what a durable timer armed for a session not written yet needs (S39).
    Checkpoint {
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

// A local message (with the `cluster` feature ractor needs the impl; `local_message!`).
#[cfg(feature = "cluster")]
impl<I: Send + Sync + 'static, E: Send + Sync + 'static> ractor::Message for TurnLoopMsg<I, E> {}

impl<I, E> fmt::Debug for TurnLoopMsg<I, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TurnLoopMsg::Push { options, .. } => write!(f, "Push({options:?})"),
            TurnLoopMsg::Stop { options, .. } => write!(f, "Stop({options:?})"),
            TurnLoopMsg::Subscribe { .. } => f.write_str("Subscribe"),
            TurnLoopMsg::Inspect { .. } => f.write_str("Inspect"),
            TurnLoopMsg::Detach { .. } => f.write_str("Detach"),
            TurnLoopMsg::Checkpoint { .. } => f.write_str("Checkpoint"),
            TurnLoopMsg::Internal(i) => write!(f, "Internal({:?})", i.0.name()),
        }
    }
}

/// An internal message (opaque outside the crate).
pub struct Internal<I>(pub(crate) InternalMsg<I>);

pub(crate) enum InternalMsg<I> {
    /// The turn task of `turn` is done; its ending is in the control block. `finals`
    /// delivers the turn's final events when the turn task leaves them to the session:
    /// the session delivers them before it decides anything else, so they come in the
    /// same order, and the turn's end wakes one task instead of two (B1).
    TurnFinished {
        turn: u64,
        finals: Option<FinalEvents>,
    },
    /// A timer the core set is due: a delayed preempt (S7), an idle period (S11
    /// `until_idle_for`) or a detached session's poll (S24).
    Due(crate::session::core::Timed<I>),
    /// The store operation with this number finished (`Ok(false)`: a delete found
    /// nothing).
    Written {
        seq: u64,
        result: Result<bool, crate::store::StoreError>,
    },
    /// `sync` durability: the running turn recorded a new state at a safe point, or its
    /// plan changed stored entries: write it.
    TurnProgress { turn: u64 },
    /// A detached session read its record's status.
    Polled {
        status: Option<crate::store::SessionStatus>,
    },
    /// Somebody subscribed while the session was about to sleep (S39).
    SleepRefused,
}

/// A turn's final events, to deliver once (type-erased over the event type, which the
/// internal messages do not name). Dropped undelivered (the message was refused or
/// dropped with a killed session's mailbox), it delivers them then, so a subscriber
/// never misses a turn's end that happened.
pub(crate) struct FinalEvents(Option<Box<dyn FnOnce() + Send>>);

impl FinalEvents {
    /// Wraps the delivery.
    pub(crate) fn new(deliver: impl FnOnce() + Send + 'static) -> Self {
        FinalEvents(Some(Box::new(deliver)))
    }

    /// Delivers the events now.
    pub(crate) fn deliver(mut self) {
        if let Some(deliver) = self.0.take() {
            deliver();
        }
    }
}

impl Drop for FinalEvents {
    fn drop(&mut self) {
        if let Some(deliver) = self.0.take() {
            deliver();
        }
    }
}

impl<I> InternalMsg<I> {
    fn name(&self) -> &'static str {
        match self {
            InternalMsg::TurnFinished { .. } => "TurnFinished",
            InternalMsg::Due(t) => t.name(),
            InternalMsg::Written { .. } => "Written",
            InternalMsg::TurnProgress { .. } => "TurnProgress",
            InternalMsg::Polled { .. } => "Polled",
            InternalMsg::SleepRefused => "SleepRefused",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::FinalEvents;

    fn counting() -> (FinalEvents, Arc<AtomicUsize>) {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        let finals = FinalEvents::new(move || {
            m.fetch_add(1, Ordering::SeqCst);
        });
        (finals, n)
    }

    /// A turn's final events are delivered once when the session takes the report.
    #[test]
    fn final_events_are_delivered_once() {
        let (finals, n) = counting();
        finals.deliver();
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    /// A report the session never takes (refused, or dropped with a killed session's
    /// mailbox) still delivers its turn's final events, once.
    #[test]
    fn final_events_dropped_undelivered_are_delivered_then() {
        let (finals, n) = counting();
        drop(finals);
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }
}
