//! The types a session's options are made of: its durability (S16a), its session-end
//! hooks (S21) and its buffer bound (S34a). The options themselves are
//! [`SessionSpec`](crate::session::SessionSpec)'s fields.
//!
//! Session ids are validated in `agentloop_core::ids`; this module does not start anything.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::session::ExitSummary;

pub use agentloop_core::ids::{validate_session_id, SessionIdError, MAX_SESSION_ID_LEN};

/// A session-end hook (S21): runs after the final checkpoint and before `Ended`, bounded
/// by [`SessionSpec::hook_timeout`](crate::session::SessionSpec::hook_timeout) and isolated from the other hooks (a failing,
/// panicking or hanging hook does not stop the next one).
pub type EndHook = Arc<dyn Fn(ExitSummary) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

pub use agentloop_core::durability::Durability;

/// How many items, and how many bytes of them, a session holds (waiting for a turn or
/// in one) before it refuses a push with [`crate::session::PushError::Full`] (S34a). Bytes are
/// the items' stored encoding, so the byte bound applies to persistent sessions; a
/// session without a store is bounded by its item count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferBound {
    /// Items held at most.
    pub items: usize,
    /// Stored bytes of the held items at most.
    pub bytes: usize,
}

impl BufferBound {
    /// No bound (a session embedded in-process, where the caller is trusted).
    pub const UNBOUNDED: BufferBound = BufferBound {
        items: usize::MAX,
        bytes: usize::MAX,
    };

    /// The tighter of two bounds, field by field (a session's own bound under a
    /// runtime's limits).
    pub fn min(self, other: BufferBound) -> BufferBound {
        BufferBound {
            items: self.items.min(other.items),
            bytes: self.bytes.min(other.bytes),
        }
    }
}

impl Default for BufferBound {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}
