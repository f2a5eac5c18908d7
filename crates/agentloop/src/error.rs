//! Errors at the session API boundary (spawn, stop, inspect). Push rejections have their
//! own type (`PushError`) because they hand the item back; store errors live in
//! `store`; option errors in `options`.

use crate::options::OptionsError;
use agentloop_core::ids::SessionIdError;

/// A session could not be spawned.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The id is invalid.
    #[error("cannot spawn session: {0}")]
    InvalidId(#[from] SessionIdError),
    /// The persistent session has no store.
    #[error("cannot spawn session `{0}`: it is persistent but no checkpoint store was given; pass a store or turn persistence off")]
    NoStore(String),
    /// The checkpoint history asked for cannot be kept.
    #[error("cannot spawn session `{id}`: {why}")]
    History {
        /// The session.
        id: String,
        /// What is wrong and what to do.
        why: String,
    },
    /// The session asks to keep its events (S20a) and cannot.
    #[error("cannot spawn session `{id}`: {why}")]
    Events {
        /// The session.
        id: String,
        /// What is wrong and what to do.
        why: String,
    },
    /// The actor system refused the spawn.
    #[error("cannot spawn session `{id}`: the actor did not start ({reason})")]
    Actor {
        /// The session.
        id: String,
        /// ractor's reason.
        reason: String,
    },
}

/// A request to a session failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The options were invalid.
    #[error("invalid options: {0}")]
    InvalidOptions(#[from] OptionsError),
    /// Detach needs a persistent session with a store (S23).
    #[error("session `{0}` cannot be detached: it has no checkpoint store (spawn it persistent, with a store)")]
    DetachNeedsStore(String),
    /// The session is not persistent: it has no record to write.
    #[error(
        "session `{0}` is not persistent: it has no record (spawn it persistent, with a store)"
    )]
    NotPersistent(String),
    /// A store operation failed.
    #[error("checkpoint store: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The session has exited; read its exit state with `SessionHandle::wait`.
    #[error("session `{0}` has exited; read its exit state with `wait()`")]
    Exited(String),
}
