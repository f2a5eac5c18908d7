//! The supervisor's errors: a spawn or a request by id refused ([`SupervisorError`]),
//! and a push routed by id that was not accepted ([`RoutedPushError`], which hands the
//! item back). Each message says what to do; this module decides nothing.

use crate::error::{SessionError, SpawnError};
use crate::session::{PushError, SessionIdError};
use std::fmt;

/// A supervisor request that could not be served. Every variant says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The id is invalid.
    #[error("invalid session id: {0}")]
    InvalidId(#[from] SessionIdError),
    /// A live session already has this id.
    #[error("a session with id `{0}` is already running; pick another id or stop it first")]
    Duplicate(String),
    /// The session runs: the operation needs it stopped.
    #[error("session `{0}` is running; stop it first, then retry")]
    Running(String),
    /// No live session has this id.
    #[error("no live session has id `{0}`; list sessions to see the live ones")]
    UnknownSession(String),
    /// No agent kind is registered under this name.
    #[error("no agent kind named `{kind}` is registered (known: {known}); register it when building the runtime")]
    UnknownKind {
        /// The kind asked for.
        kind: String,
        /// The registered kinds.
        known: String,
    },
    /// The session's record was written by a version of its kind this runtime cannot
    /// run or could not migrate (S40); the record is kept.
    #[error(transparent)]
    Version(#[from] crate::supervisor::versions::VersionError),
    /// The kind's factory refused the configuration.
    #[error("agent kind `{kind}` refused its configuration: {reason}")]
    BadConfig {
        /// The kind.
        kind: String,
        /// Why.
        reason: String,
    },
    /// A [`SupervisorMsg::SpawnBatch`](super::SupervisorMsg::SpawnBatch) carried more specs than [`MAX_SPAWN_BATCH`](super::MAX_SPAWN_BATCH).
    #[error("a spawn batch carried {len} specs, more than the {max} one message may carry; split it (SupervisorHandle::spawn_batch does) and send the specs again")]
    BatchTooLarge {
        /// How many specs the batch carried.
        len: usize,
        /// The most one batch may carry.
        max: usize,
    },
    /// The runtime runs as many sessions as its bound allows (S34a, `[limits]
    /// sessions`): nothing was spawned.
    #[error("`{id}` was not spawned: this runtime already runs {max} sessions, its bound ([limits] sessions); retry once some have ended, or raise the bound")]
    TooManySessions {
        /// The id asked for.
        id: String,
        /// The bound.
        max: usize,
    },
    /// The runtime is shutting down: the drain gate refuses new sessions (S27).
    #[error("the runtime is shutting down and accepts no new sessions (`{0}` was not spawned); spawn it on the next start")]
    ShuttingDown(String),
    /// A persistent session was asked for but the supervisor has no store.
    #[error("session `{0}` is persistent but the supervisor has no checkpoint store; build the runtime with a store or spawn it non-persistent")]
    NoStore(String),
    /// Spawning failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The session refused the request.
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// A push routed by id that was not accepted; the item comes back when it was not.
#[derive(Debug)]
pub enum RoutedPushError<I> {
    /// No live session has this id; the item is handed back.
    UnknownSession {
        /// The session asked for.
        id: String,
        /// The item.
        item: I,
    },
    /// The session rejected it.
    Push(PushError<I>),
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

impl<I> RoutedPushError<I> {
    /// When to push again, for a session that is stored but not live yet.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            RoutedPushError::NotLive { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// An `UnknownSession` for a session that is stored after all, told as what it is.
    pub(crate) fn stored(id: String, item: I, absence: crate::liveness::Absence) -> Self {
        match absence {
            crate::liveness::Absence::NotLive { retry_after, why } => RoutedPushError::NotLive {
                id,
                item,
                retry_after,
                why,
            },
            crate::liveness::Absence::NotRunning { status, hint } => RoutedPushError::NotRunning {
                id,
                item,
                status,
                hint,
            },
        }
    }
}

/// The session's own refusal is the source of [`RoutedPushError::Push`].
impl<I: fmt::Debug + 'static> std::error::Error for RoutedPushError<I> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RoutedPushError::Push(e) => Some(e),
            _ => None,
        }
    }
}

impl<I> fmt::Display for RoutedPushError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoutedPushError::UnknownSession { id, .. } => write!(
                f,
                "no live session has id `{id}`; the item is handed back in this error"
            ),
            RoutedPushError::Push(e) => fmt::Display::fmt(e, f),
            RoutedPushError::NotLive {
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
            RoutedPushError::NotRunning {
                id, status, hint, ..
            } => write!(
                f,
                "session `{id}` is stored ({status}) but not running: {hint}; the item is \
                 handed back"
            ),
            RoutedPushError::NotForwardable { id, .. } => write!(
                f,
                "session `{id}` runs on another node and this push carries a strategy (a \
                 closure), which cannot cross nodes; push it on the owner node, or without \
                 the strategy; the item is handed back"
            ),
            RoutedPushError::RefusedByOwner {
                id, node, error, ..
            } => write!(
                f,
                "session `{id}` runs on node `{node}`, which refused the push: {error}; the \
                 item is handed back"
            ),
            RoutedPushError::OwnerUnreachable {
                id, node, error, ..
            } => write!(
                f,
                "session `{id}` runs on node `{node}`, which could not be reached ({error}); \
                 retry, or push to that node directly; the item is handed back"
            ),
        }
    }
}

/// The supervisor is gone.
pub(super) fn gone() -> SupervisorError {
    SupervisorError::Session(SessionError::Exited("the session supervisor".into()))
}

#[cfg(test)]
mod routed_push_error_tests {
    use super::*;

    /// A routed push's error is a `std::error::Error` (it goes into `anyhow` and `?`),
    /// and a session's own refusal is its source.
    #[test]
    fn a_routed_push_error_is_an_error_with_the_sessions_refusal_as_source() {
        let e: Box<dyn std::error::Error> = Box::new(RoutedPushError::UnknownSession {
            id: "s".to_string(),
            item: 1u32,
        });
        assert!(e.to_string().contains("no live session has id `s`"));
        assert!(e.source().is_none());
        let e: Box<dyn std::error::Error> =
            Box::new(RoutedPushError::Push(PushError::Late { item: 2u32 }));
        assert!(e.source().is_some(), "the session's refusal is the source");
    }
}
