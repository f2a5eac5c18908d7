//! Stop and detach from any node (issue 18, S36): [`RuntimeHandle::stop_anywhere`] and
//! [`RuntimeHandle::detach_anywhere`] act here when this runtime runs the session, and
//! otherwise send the request to the node that does (through the installed forwarder);
//! [`RuntimeHandle::control_here`] is what the receiving node runs. Options cross as
//! data ([`WireStop`]); a stop whose cancel targets an unnamed safe-point set does not.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::cluster::forward::{Control, ControlOutcome, WireStop};
use crate::options::StopOptions;
use crate::runtime_handle::RuntimeHandle;
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
    #[error("session `{session}` is stored but not live yet: {why}; retry in {}", crate::config::format_duration(*retry_after))]
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

    fn stored(session: String, absence: crate::liveness::Absence) -> Self {
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

impl<I, E> RuntimeHandle<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Tells an unknown session that is stored after all as what it is (issue 28).
    pub(crate) async fn unknown_or_stored<T>(
        &self,
        r: Result<T, ControlError>,
    ) -> Result<T, ControlError> {
        match r {
            Err(ControlError::Here(SupervisorError::UnknownSession(id))) => {
                match self.absence(&id).await {
                    Some(absence) => Err(ControlError::stored(id, absence)),
                    None => Err(SupervisorError::UnknownSession(id).into()),
                }
            }
            other => other,
        }
    }

    /// Stops session `id` wherever it runs (here, or on a cluster node at its owner).
    /// A session that is stored but not live yet is [`ControlError::NotLive`] (retry),
    /// one stored but not running [`ControlError::NotRunning`].
    pub async fn stop_anywhere(&self, id: &str, options: StopOptions) -> Result<(), ControlError> {
        let r = self.stop_routed(id, options).await;
        self.unknown_or_stored(r).await
    }

    async fn stop_routed(&self, id: &str, options: StopOptions) -> Result<(), ControlError> {
        let wire = WireStop::from_options(&options);
        match self.supervisor.stop(id, options).await {
            Err(SupervisorError::UnknownSession(_)) if self.forwarder.get().is_some() => {
                let Some(wire) = wire else {
                    return Err(ControlError::NotForwardable(id.to_string()));
                };
                self.remote(id, Control::Stop(wire)).await
            }
            other => other.map_err(ControlError::from),
        }
    }

    /// Detaches session `id` wherever it runs (S23); not live or not running as for
    /// [`RuntimeHandle::stop_anywhere`].
    pub async fn detach_anywhere(&self, id: &str) -> Result<(), ControlError> {
        let r = self.detach_routed(id).await;
        self.unknown_or_stored(r).await
    }

    async fn detach_routed(&self, id: &str) -> Result<(), ControlError> {
        match self.supervisor.detach(id).await {
            Err(SupervisorError::UnknownSession(_)) if self.forwarder.get().is_some() => {
                self.remote(id, Control::Detach).await
            }
            other => other.map_err(ControlError::from),
        }
    }

    async fn remote(&self, id: &str, op: Control) -> Result<(), ControlError> {
        let Some(forwarder) = self.forwarder.get() else {
            return Err(SupervisorError::UnknownSession(id.to_string()).into());
        };
        match forwarder.control(id.to_string(), op).await {
            ControlOutcome::Done => Ok(()),
            ControlOutcome::UnknownSession => {
                Err(SupervisorError::UnknownSession(id.to_string()).into())
            }
            ControlOutcome::Unreachable { node, error } => Err(ControlError::Unreachable {
                session: id.to_string(),
                node,
                error,
            }),
            ControlOutcome::Refused(error) => Err(ControlError::Refused {
                session: id.to_string(),
                error,
            }),
        }
    }

    /// Runs a control request another node sent for a session this node runs (never
    /// forwarded on).
    pub async fn control_here(&self, id: &str, op: Control) -> ControlOutcome {
        let r = match op {
            Control::Stop(w) => self.supervisor.stop(id, w.to_options()).await,
            Control::Detach => self.supervisor.detach(id).await,
        };
        match r {
            Ok(()) => ControlOutcome::Done,
            Err(SupervisorError::UnknownSession(_)) => ControlOutcome::UnknownSession,
            Err(e) => ControlOutcome::Refused(e.to_string()),
        }
    }
}
