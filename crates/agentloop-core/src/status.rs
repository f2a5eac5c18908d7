//! The status lifecycle of a stored record (DESIGN S19) and what a compare-and-swap of
//! it found. Pure vocabulary.

use serde::{Deserialize, Serialize};

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
