//! The supervisor's errors: a spawn or a request by id refused ([`SupervisorError`]).
//! A push by id that was not accepted is a [`PushError`](crate::push::PushError), the
//! push's one error. Each message says what to do; this module decides nothing.

use crate::error::{SessionError, SpawnError};
use crate::session::SessionIdError;

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

/// The supervisor is gone.
pub(super) fn gone() -> SupervisorError {
    SupervisorError::Session(SessionError::Exited("the session supervisor".into()))
}
