//! Stop and detach from any node (issue 18, S36): [`RuntimeHandle::stop_anywhere`](crate::runtime::RuntimeHandle::stop_anywhere) and
//! [`RuntimeHandle::detach_anywhere`](crate::runtime::RuntimeHandle::detach_anywhere) act here when this runtime runs the session, and
//! otherwise send the request to the node that does (through the installed forwarder);
//! [`RuntimeHandle::control_here`](crate::runtime::RuntimeHandle::control_here) is what the receiving node runs. Options cross as
//! data ([`WireStop`](crate::runtime_handle::forward::WireStop)); a stop whose cancel targets an unnamed safe-point set does not.

use crate::supervisor::SupervisorError;

/// Why a stop or detach sent to another node did not happen there.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Here: the supervisor's refusal (including no such session anywhere).
    #[error(transparent)]
    Here(#[from] SupervisorError),
    /// The node that runs it could not be reached.
    #[error("session `{session}` runs on node `{node}`, which could not be reached ({error}); retry, or send it to that node")]
    Unreachable {
        /// The session.
        session: String,
        /// That node.
        node: String,
        /// What happened.
        error: String,
    },
    /// The node that runs it refused.
    #[error("session `{session}`: the node that runs it refused: {error}")]
    Refused {
        /// The session.
        session: String,
        /// Its reason.
        error: String,
    },
    /// A session is stored under this id but is not live yet (issue 28): retry after
    /// `retry_after`.
    #[error("session `{session}` is stored but not live yet: {why}; retry in {}", agentloop_core::duration_text::format_duration(*retry_after))]
    NotLive {
        /// The session.
        session: String,
        /// When to retry.
        retry_after: std::time::Duration,
        /// What is happening to it.
        why: String,
    },
    /// A session is stored under this id but nothing runs it: `hint` says what to do.
    #[error("session `{session}` is stored ({status}) but not running: {hint}")]
    NotRunning {
        /// The session.
        session: String,
        /// Its stored status.
        status: String,
        /// What to do.
        hint: String,
    },
    /// The options cannot cross nodes.
    #[error("session `{0}` runs on another node and this stop's cancel targets a safe-point set that cannot cross nodes; use after_model_call, after_tool_calls or any")]
    NotForwardable(String),
}

impl ControlError {
    /// When to retry, for a session that is stored but not live yet.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ControlError::NotLive { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    pub(crate) fn stored(session: String, absence: crate::liveness::Absence) -> Self {
        match absence {
            crate::liveness::Absence::NotLive { retry_after, why } => ControlError::NotLive {
                session,
                retry_after,
                why,
            },
            crate::liveness::Absence::NotRunning { status, hint } => ControlError::NotRunning {
                session,
                status,
                hint,
            },
        }
    }
}
