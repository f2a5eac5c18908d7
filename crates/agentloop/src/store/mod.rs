//! Checkpoint storage: the record of a session and the store trait (DESIGN S15–S19).
//!
//! This module owns the [`SessionRecord`], its [`SessionStatus`] lifecycle and the
//! [`CheckpointStore`] trait every backend implements. The trait is small and async
//! (boxed futures, so it can be used as `Arc<dyn CheckpointStore<I>>`) so a blocking
//! backend like sled fits behind it by moving its calls off the tokio workers. Agent
//! state is held as encoded bytes (see [`codec`]), so one store serves agent kinds with
//! different state types.

pub mod actor;
pub mod codec;
pub mod lease;
pub mod memory;
pub mod sled;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use self::sled::SledBackend;
pub use actor::{CheckpointActor, CheckpointClient, CheckpointMsg, CheckpointStats};
pub use lease::InstanceLease;
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

impl SessionStatus {
    /// The status without its payload.
    pub fn kind(&self) -> StatusKind {
        match self {
            SessionStatus::Running => StatusKind::Running,
            SessionStatus::Stopped => StatusKind::Stopped,
            SessionStatus::Interrupted => StatusKind::Interrupted,
            SessionStatus::Completed => StatusKind::Completed,
            SessionStatus::Canceled => StatusKind::Canceled,
            SessionStatus::Failed(_) => StatusKind::Failed,
        }
    }

    /// Whether no later status can follow (S19): `Completed`, `Canceled`, `Failed`.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            SessionStatus::Completed | SessionStatus::Canceled | SessionStatus::Failed(_)
        )
    }
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionStatus::Failed(e) => write!(f, "Failed({e})"),
            other => write!(f, "{:?}", other.kind()),
        }
    }
}

/// A status without its payload, for filters and compare-and-swap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StatusKind {
    /// `Running`.
    Running,
    /// `Stopped`.
    Stopped,
    /// `Interrupted`.
    Interrupted,
    /// `Completed`.
    Completed,
    /// `Canceled`.
    Canceled,
    /// `Failed`.
    Failed,
}

/// What a status compare-and-swap found (S19, S24).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    /// The status was one of the expected ones and is now the new one. Carries the
    /// previous status.
    Swapped(SessionStatus),
    /// The status was not one of the expected ones; nothing changed. Carries it.
    Mismatch(SessionStatus),
    /// There is no record.
    Missing,
}

/// One entry of a listing: a record, or why it could not be read.
#[derive(Clone, Debug, PartialEq)]
pub struct ListEntry<I> {
    /// The key it is stored under.
    pub session_id: String,
    /// The decoded record, or the decode error (a corrupt record is listed, not hidden).
    pub record: Result<SessionRecord<I>, StoreError>,
}

/// The stored record of one session (S15).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord<I> {
    /// The session's id.
    pub session_id: String,
    /// The agent kind that runs it (to rebuild the agent after a restart).
    pub agent_kind: String,
    /// The agent's serialized configuration, handed to the kind's factory when the
    /// session is rebuilt from this record.
    pub agent_config: Vec<u8>,
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
    /// The runtime instance that owns a `Running` record (S19).
    pub owner: Option<String>,
    /// The owner's heartbeat when the record was last written, milliseconds since the
    /// Unix epoch. Liveness is read from the instance's own heartbeat (one write per
    /// instance, not per session); this is the fallback when none is stored.
    pub heartbeat_ms: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Last update time, milliseconds since the Unix epoch.
    pub updated_at_ms: u64,
    /// A version counter, incremented by every write.
    pub version: u64,
}

impl<I> SessionRecord<I> {
    /// An empty `Stopped` record for `session_id` at turn `turn_index`.
    pub fn new(
        session_id: impl Into<String>,
        agent_kind: impl Into<String>,
        turn_index: u64,
    ) -> Self {
        let now = now_ms();
        SessionRecord {
            session_id: session_id.into(),
            agent_kind: agent_kind.into(),
            agent_config: Vec::new(),
            status: SessionStatus::Stopped,
            turn_index,
            unhandled_items: Vec::new(),
            interrupted_items: Vec::new(),
            state: None,
            stop_cause: None,
            last_error: None,
            owner: None,
            heartbeat_ms: now,
            created_at_ms: now,
            updated_at_ms: now,
            version: 0,
        }
    }

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
    /// The session id is not usable as a key (S32).
    #[error("invalid session id {id:?}: {reason}")]
    InvalidId {
        /// The id as given.
        id: String,
        /// What is wrong with it.
        reason: crate::session::SessionIdError,
    },
    /// A stored record may not be resumed (S19).
    #[error("session `{session}` cannot be resumed: its record is {status} because {why}")]
    Refused {
        /// The session.
        session: String,
        /// Its status.
        status: String,
        /// Why it is refused, and what to do.
        why: String,
    },
    /// A conditional write found the record already final (S19): it was not written.
    #[error("session `{session}` is already final ({status}); its record was not overwritten")]
    Final {
        /// The session.
        session: String,
        /// The status found.
        status: SessionStatus,
    },
    /// The store is closed (its actor stopped).
    #[error("the checkpoint store is closed; start the runtime (or its checkpoint actor) again")]
    Closed,
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

/// A checkpoint store (S15–S19). Implementations must not block tokio workers.
///
/// Ordering contract: a write (`save`, `delete`, `cas_status`, `beat`) is ordered when
/// the method is *called*, not when its future is first polled, so a caller that issues
/// two writes and awaits them from different tasks still gets them applied in call
/// order. A write's future resolves once the write is durable to the store's guarantee
/// (for the sled store: flushed).
pub trait CheckpointStore<I>: Send + Sync + 'static {
    /// Loads a session's record, if any.
    fn load<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<SessionRecord<I>>, StoreError>>;

    /// Writes a session's record (replacing any previous one).
    fn save(&self, record: SessionRecord<I>) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Writes a live session's record unless the stored one is already final
    /// (`Completed`, `Canceled`, `Failed`): then resolves to `StoreError::Final` and
    /// writes nothing, so a `sync` rewrite never overwrites a cancel or a finalizer (S19).
    fn save_live(&self, record: SessionRecord<I>) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Deletes a session's record; resolves to whether one existed.
    fn delete(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>>;

    /// Lists records, optionally only those whose status is one of `statuses`.
    fn list(
        &self,
        statuses: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<ListEntry<I>>, StoreError>>;

    /// Atomically sets the status to `to` if it is one of `from` (S19, S24).
    fn cas_status(
        &self,
        session_id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>>;

    /// Resolves once every write issued before it is durable.
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Renews the heartbeat of runtime instance `instance` (one write per instance).
    fn beat(&self, instance: &str, now_ms: u64) -> BoxFuture<'static, Result<(), StoreError>>;

    /// The last heartbeat of runtime instance `instance`, if any.
    fn heartbeat(&self, instance: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>>;
}
