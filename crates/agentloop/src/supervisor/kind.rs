//! Agent kinds: named factories the supervisor builds agents with, so a session can be
//! rebuilt from its record after a restart or a crash. A kind builds the agent from its
//! serialized configuration and spawns the session; it never touches the registry.

use super::error::SupervisorError;
use crate::agent::Agent;
use crate::session::{SessionHandle, SessionSpec};
use crate::store::CheckpointStore;
use futures::future::BoxFuture;
use ractor::ActorCell;
use std::sync::Arc;

/// A registered agent kind: builds the agent from its serialized configuration and
/// spawns its session. Implemented for closures by [`agent_kind`].
pub trait AgentKind<I, E>: Send + Sync + 'static {
    /// Builds the agent from `spec.agent_config` and spawns the session `spec`
    /// describes, linked under `supervisor`.
    fn spawn(
        &self,
        spec: SessionSpec<I>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        supervisor: ActorCell,
    ) -> BoxFuture<'static, Result<SessionHandle<I, E>, SupervisorError>>;
}

pub(super) struct FnKind<F>(F, String);

impl<A, F> AgentKind<A::Item, A::Event> for FnKind<F>
where
    A: Agent,
    F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
{
    fn spawn(
        &self,
        spec: SessionSpec<A::Item>,
        store: Option<Arc<dyn CheckpointStore<A::Item>>>,
        supervisor: ActorCell,
    ) -> BoxFuture<'static, Result<SessionHandle<A::Item, A::Event>, SupervisorError>> {
        let agent = (self.0)(&spec.agent_config).map_err(|reason| SupervisorError::BadConfig {
            kind: self.1.clone(),
            reason,
        });
        Box::pin(async move {
            let agent = Arc::new(agent?);
            Ok(SessionHandle::spawn_linked(spec, agent, store, supervisor).await?)
        })
    }
}

/// Wraps a factory (serialized configuration → agent) as an [`AgentKind`].
pub fn agent_kind<A, F>(
    name: impl Into<String>,
    factory: F,
) -> Arc<dyn AgentKind<A::Item, A::Event>>
where
    A: Agent,
    F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
{
    Arc::new(FnKind(factory, name.into()))
}
