//! A push's answer (DESIGN S7, S14, S15a): the preempt acknowledgement, the rejection
//! that hands the item back, and the guards that make sure every push is answered and
//! no item vanishes with an unprocessed message. Vocabulary shared by handles, the
//! supervisor, the turn control block and the session; it decides nothing.

use std::fmt;

use ractor::RpcReplyPort;

use crate::options::OptionsError;
use crate::store::codec::PayloadError;

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
    /// The item was accepted and the preempt waits (its delay, or its planning target
    /// to start running): asked for with [`crate::options::PushOptions::answer_at_acceptance`]
    /// (the HTTP front, S34a). What it does shows in the session's events: `Preempted`
    /// when the cancel lands, nothing when the target ends first.
    Scheduled {
        /// The target turn.
        turn: u64,
    },
    /// The push carried an idempotency key the session already accepted a push with
    /// (the same fingerprint): a retry; nothing was delivered again (S34a).
    Duplicate,
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
    /// The session holds as many items or bytes as its bound allows (S34a,
    /// [`crate::session::BufferBound`]): nothing was accepted, the item is handed back; retry
    /// once its turns have taken some.
    Full {
        /// The item, handed back.
        item: I,
        /// What the session holds and its bound.
        full: BufferFull,
    },
    /// The push's idempotency key was used before for a push that carried something
    /// else (S34a): nothing was accepted, the item is handed back.
    KeyReused {
        /// The item, handed back.
        item: I,
    },
    /// The session persists and the item cannot be stored: it does not encode, or it
    /// does not read back as it was written (S15a). Nothing was acknowledged; the item
    /// is handed back.
    NotStorable {
        /// The item, handed back.
        item: I,
        /// The type, the field and serde's reason.
        error: PayloadError,
    },
}

impl<I> PushError<I> {
    /// The item that was not accepted (`None` for `NotDurable`: that item was accepted).
    pub fn into_item(self) -> Option<I> {
        match self {
            PushError::Late { item }
            | PushError::InvalidOptions { item, .. }
            | PushError::Full { item, .. }
            | PushError::KeyReused { item }
            | PushError::NotStorable { item, .. } => Some(item),
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
            PushError::NotStorable { error, .. } => write!(
                f,
                "push refused: the session persists and {error}; the item was not accepted and \
                 is handed back"
            ),
            PushError::KeyReused { .. } => f.write_str(
                "push refused: its idempotency key was used before for a push that carried \
                 something else; use a new key for a new push (the item is handed back)",
            ),
            PushError::Full { full, .. } => write!(
                f,
                "push refused: {full}; the item was not accepted and is handed back: retry \
                 once its turns have taken some"
            ),
            PushError::NotDurable { error } => write!(
                f,
                "push accepted but not durable: the checkpoint write failed ({error}); the item \
                 stays in the session and in its exit state; check the store"
            ),
        }
    }
}

impl<I> std::error::Error for PushError<I> {}

/// What a session held when it refused a push for its buffer bound (S34a), and the
/// bound. It crosses nodes as JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BufferFull {
    /// Items held (waiting or in a turn).
    pub items: usize,
    /// Their stored bytes.
    pub bytes: usize,
    /// The bound on items.
    pub max_items: usize,
    /// The bound on bytes.
    pub max_bytes: usize,
}

impl fmt::Display for BufferFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.items >= self.max_items {
            write!(
                f,
                "the session holds {} items, its bound ([limits] session_items)",
                self.items
            )
        } else {
            write!(
                f,
                "the session holds {} bytes of items and this one would take it over its \
                 bound of {} ([limits] session_bytes)",
                self.bytes, self.max_bytes
            )
        }
    }
}

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
