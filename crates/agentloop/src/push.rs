//! A push's answer (DESIGN S7, S14, S15a): the preempt acknowledgement, the rejection
//! that hands the item back, and the guards that make sure every push is answered and
//! no item vanishes with an unprocessed message. Vocabulary shared by handles, the
//! supervisor, the turn control block and the session; it decides nothing.

use std::fmt;

use ractor::RpcReplyPort;

use futures::future::BoxFuture;

use crate::options::{OptionsError, PushOptions};
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

/// A push that was not accepted, by handle or by id, here or on another node: the one
/// error of the push operation (issue 54). The item always comes back (S14), except for
/// `NotDurable`, whose item was accepted.
///
/// The first six variants are the session's own answer; the others say why a push by
/// id reached no session that could take it.
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
    /// No live session has this id, and none is stored under it; the item is handed
    /// back.
    UnknownSession {
        /// The session asked for.
        id: String,
        /// The item.
        item: I,
    },
    /// A session is stored under this id but is not live yet: it is being recovered,
    /// resumed or moved, or waits for its dead owner's lease (issue 28). The item is
    /// handed back; push it again after `retry_after`.
    NotLive {
        /// The session.
        id: String,
        /// The item.
        item: I,
        /// When to retry.
        retry_after: std::time::Duration,
        /// What is happening to it.
        why: String,
    },
    /// A session is stored under this id but nothing runs it (stopped, interrupted,
    /// ended or waiting for an answer); `hint` says what to do. The item is handed back.
    NotRunning {
        /// The session.
        id: String,
        /// The item.
        item: I,
        /// Its stored status.
        status: String,
        /// What to do.
        hint: String,
    },
    /// Another node owns the session and the push cannot cross nodes: it carries an S9
    /// strategy (a closure) (issue 18, S36). The item is handed back; send it to the
    /// owner node, or without the strategy.
    NotForwardable {
        /// The session.
        id: String,
        /// The item.
        item: I,
    },
    /// Another node owns the session and could not be reached (down, not joined, or it
    /// did not answer in time). The item is handed back: it may or may not have been
    /// taken when the error is a timeout.
    OwnerUnreachable {
        /// The session.
        id: String,
        /// The owner node, as its record names it.
        node: String,
        /// The item.
        item: I,
        /// What happened.
        error: String,
    },
    /// Another node owns the session and refused the push (invalid options there, or
    /// an item it cannot store); the item is handed back.
    RefusedByOwner {
        /// The session.
        id: String,
        /// The owner node.
        node: String,
        /// The item.
        item: I,
        /// The owner's reason.
        error: String,
    },
}

/// The name the by-id push's error had before there was one push error (issue 54).
#[deprecated(
    note = "a push has one error type now: use `agentloop::PushError`, whose \
                     variants include the by-id ones (`UnknownSession`, `NotLive`, ...)"
)]
pub type RoutedPushError<I> = PushError<I>;

impl<I> PushError<I> {
    /// The item that was not accepted (`None` for `NotDurable`: that item was accepted).
    pub fn into_item(self) -> Option<I> {
        match self {
            PushError::Late { item }
            | PushError::InvalidOptions { item, .. }
            | PushError::Full { item, .. }
            | PushError::KeyReused { item }
            | PushError::NotStorable { item, .. }
            | PushError::UnknownSession { item, .. }
            | PushError::NotLive { item, .. }
            | PushError::NotRunning { item, .. }
            | PushError::NotForwardable { item, .. }
            | PushError::OwnerUnreachable { item, .. }
            | PushError::RefusedByOwner { item, .. } => Some(item),
            PushError::NotDurable { .. } => None,
        }
    }

    /// When to push again, for a session that is stored but not live yet.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            PushError::NotLive { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether the session itself answered (it was reached and refused the push, or
    /// took it without making it durable), as opposed to a push by id that reached no
    /// session able to take it.
    pub fn is_session_answer(&self) -> bool {
        matches!(
            self,
            PushError::Late { .. }
                | PushError::NotDurable { .. }
                | PushError::InvalidOptions { .. }
                | PushError::Full { .. }
                | PushError::KeyReused { .. }
                | PushError::NotStorable { .. }
        )
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
            PushError::UnknownSession { id, .. } => write!(
                f,
                "no live session has id `{id}`; the item is handed back in this error"
            ),
            PushError::NotLive {
                id,
                retry_after,
                why,
                ..
            } => write!(
                f,
                "session `{id}` is stored but not live yet: {why}; push again in {}; the item \
                 is handed back",
                agentloop_core::duration_text::format_duration(*retry_after)
            ),
            PushError::NotRunning {
                id, status, hint, ..
            } => write!(
                f,
                "session `{id}` is stored ({status}) but not running: {hint}; the item is \
                 handed back"
            ),
            PushError::NotForwardable { id, .. } => write!(
                f,
                "session `{id}` runs on another node and this push carries a strategy (a \
                 closure), which cannot cross nodes; push it on the owner node, or without \
                 the strategy; the item is handed back"
            ),
            PushError::RefusedByOwner {
                id, node, error, ..
            } => write!(
                f,
                "session `{id}` runs on node `{node}`, which refused the push: {error}; the \
                 item is handed back"
            ),
            PushError::OwnerUnreachable {
                id, node, error, ..
            } => write!(
                f,
                "session `{id}` runs on node `{node}`, which could not be reached ({error}); \
                 retry, or push to that node directly; the item is handed back"
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

/// A push by id being made: `runtime.push(id, item)` (wherever the session runs: here,
/// or on a cluster node at its owner) or `supervisor.push(id, item)` (a bare supervisor:
/// here only). Chain [`PushById::options`], then await it; the answer is the one a push
/// by handle gets, or why no session could take it ([`PushError::UnknownSession`],
/// [`PushError::NotLive`], ...). Nothing is sent before it is awaited.
#[must_use = "a push by id is sent when it is awaited"]
pub struct PushById<'a, T, I> {
    to: &'a T,
    id: &'a str,
    item: I,
    options: PushOptions<I>,
}

impl<'a, T, I> PushById<'a, T, I> {
    /// A push of `item` to session `id` through `to`, without options.
    pub(crate) fn new(to: &'a T, id: &'a str, item: I) -> Self {
        PushById {
            to,
            id,
            item,
            options: PushOptions::new(),
        }
    }

    /// The push's options (S7 preempt, S9 strategy, S34a idempotency key, S39 timer).
    pub fn options(mut self, options: PushOptions<I>) -> Self {
        self.options = options;
        self
    }
}

impl<'a, T, I> std::future::IntoFuture for PushById<'a, T, I>
where
    T: PushTarget<I>,
    I: Send + 'a,
{
    type Output = Result<PreemptAck, PushError<I>>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        self.to.push_by_id(self.id, self.item, self.options)
    }
}

/// What a push by id can be sent through: the runtime's handle and the supervisor's.
/// Sealed: the runtime implements it, nothing else.
pub trait PushTarget<I>: sealed::Sealed {
    /// Pushes `item` to session `id` with `options`.
    #[doc(hidden)]
    fn push_by_id<'a>(
        &'a self,
        id: &'a str,
        item: I,
        options: PushOptions<I>,
    ) -> BoxFuture<'a, Result<PreemptAck, PushError<I>>>;
}

pub(crate) mod sealed {
    /// Keeps [`super::PushTarget`] to the runtime's own handles.
    pub trait Sealed {}
}

#[cfg(test)]
mod push_error_tests {
    use super::*;

    /// The push's one error is a `std::error::Error` (it goes into `anyhow` and `?`);
    /// a by-id push that reached no session says so and is not the session's answer,
    /// and every variant that refuses hands the item back.
    #[test]
    fn one_push_error_for_a_push_by_handle_and_by_id() {
        let e: Box<dyn std::error::Error> = Box::new(PushError::UnknownSession {
            id: "s".to_string(),
            item: 1u32,
        });
        assert!(e.to_string().contains("no live session has id `s`"));
        let unknown = PushError::UnknownSession {
            id: "s".to_string(),
            item: 1u32,
        };
        assert!(!unknown.is_session_answer());
        assert_eq!(unknown.into_item(), Some(1));
        let late = PushError::Late { item: 2u32 };
        assert!(late.is_session_answer());
        assert_eq!(late.into_item(), Some(2));
        let not_live = PushError::NotLive {
            id: "s".to_string(),
            item: 3u32,
            retry_after: std::time::Duration::from_millis(250),
            why: "it is being resumed".to_string(),
        };
        assert_eq!(
            not_live.retry_after(),
            Some(std::time::Duration::from_millis(250))
        );
        assert!(!not_live.is_session_answer());
        assert_eq!(not_live.into_item(), Some(3));
        let not_durable = PushError::<u32>::NotDurable {
            error: "disk".to_string(),
        };
        assert!(not_durable.is_session_answer());
        assert_eq!(not_durable.into_item(), None);
    }
}
