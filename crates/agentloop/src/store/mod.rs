//! Checkpoint storage: the record of a session and the store trait (DESIGN S15–S19).
//!
//! This module owns the [`SessionRecord`], its [`SessionStatus`] lifecycle and the
//! [`CheckpointStore`] trait every backend implements. The trait is small and async
//! (boxed futures, so it can be used as `Arc<dyn CheckpointStore<I>>`) so a blocking
//! backend like sled fits behind it by moving its calls off the tokio workers. Agent
//! state is held as encoded bytes (see [`codec`]), so one store serves agent kinds with
//! different state types.

pub mod codec;
pub mod memory;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use memory::MemoryStore;

/// Where a session stands in its life (S19).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionStatus {
    /// Owned by a live runtime instance.
    Running,
    /// Stopped with something to resume.
    Stopped,
    /// Ended by a process shutdown; resumable; not terminal.
    Interrupted,
    /// Finished.
    Completed,
    /// Canceled by a user; not resumable.
    Canceled,
    /// Failed; not resumable. The text says why.
    Failed(String),
}

/// The stored record of one session (S15).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord<I> {
    /// The session's id.
    pub session_id: String,
    /// The agent kind that runs it (to rebuild the agent after a restart).
    pub agent_kind: String,
    /// The status (S19).
    pub status: SessionStatus,
    /// The index of the next turn to run (or of the cut turn, when `state` or
    /// `interrupted_items` is set).
    pub turn_index: u64,
    /// Accepted items never consumed, in offer order.
    pub unhandled_items: Vec<I>,
    /// The items of the cut or interrupted turn.
    pub interrupted_items: Vec<I>,
    /// The cut turn's state at its last safe point, encoded by [`codec`].
    pub state: Option<Vec<u8>>,
    /// The business stop cause.
    pub stop_cause: Option<String>,
    /// The last error, if the session failed.
    pub last_error: Option<String>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Last update time, milliseconds since the Unix epoch.
    pub updated_at_ms: u64,
    /// A version counter, incremented by every write.
    pub version: u64,
}

impl<I> SessionRecord<I> {
    /// Whether the record holds a cut turn to resume (S17).
    pub fn is_mid_turn(&self) -> bool {
        self.state.is_some() || !self.interrupted_items.is_empty()
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A store failure. Every variant says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A stored record or state could not be decoded. The record is left as it is.
    #[error("record of session `{session}` is corrupt: {reason}; it was left untouched: inspect it with `agentloop sessions show`, restore it from a backup or delete it")]
    Corrupt {
        /// The session.
        session: String,
        /// What is wrong.
        reason: String,
    },
    /// A value could not be encoded.
    #[error("could not encode the record of session `{session}`: {reason}; check that the agent state serializes")]
    Encode {
        /// The session.
        session: String,
        /// What is wrong.
        reason: String,
    },
    /// The backend failed.
    #[error("checkpoint store failed to {operation} session `{session}`: {message}; check the data directory and disk, then retry")]
    Backend {
        /// What was attempted: load, save, delete, flush.
        operation: &'static str,
        /// The session.
        session: String,
        /// The backend's message.
        message: String,
    },
}

/// A checkpoint store (S15–S18). Implementations must not block tokio workers.
pub trait CheckpointStore<I>: Send + Sync + 'static {
    /// Loads a session's record, if any.
    fn load<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<SessionRecord<I>>, StoreError>>;

    /// Writes a session's record (replacing any previous one). Resolves once durable to
    /// the store's guarantee.
    fn save(&self, record: SessionRecord<I>) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Deletes a session's record; resolves to whether one existed.
    fn delete<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;
}
