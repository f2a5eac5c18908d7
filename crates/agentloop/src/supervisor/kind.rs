//! Agent kinds: named factories the supervisor builds agents with, so a session can be
//! rebuilt from its record after a restart or a crash. A kind builds the agent from its
//! serialized configuration and spawns the session; it never touches the registry.
//! Each kind runs one version or several (S40; the versions and their migrations are
//! [`crate::supervisor::versions`]'s).

use super::error::SupervisorError;
use crate::session::{SessionHandle, SessionSpec};
use crate::store::{codec, CheckpointStore, StoreError};
use crate::supervisor::versions::Migration;
use crate::turn::agent::Agent;
use futures::future::BoxFuture;
use ractor::ActorCell;
use std::collections::BTreeSet;
use std::sync::Arc;

/// A registered agent kind: builds the agent from its serialized configuration and
/// spawns its session. Implemented for closures by [`agent_kind`]; a kind with several
/// versions is an [`AgentVersions`](crate::supervisor::versions::AgentVersions).
pub trait AgentKind<I, E>: Send + Sync + 'static {
    /// Builds the agent of the version the runtime chose for this start (S40: the
    /// record's version, or the newest for a new or migrated session) from
    /// `spec.agent_config` and spawns the session `spec` describes, linked under
    /// `supervisor`.
    fn spawn(
        &self,
        spec: SessionSpec<I>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        supervisor: ActorCell,
    ) -> BoxFuture<'static, Result<SessionHandle<I, E>, SupervisorError>>;

    /// The versions of this kind that run here (S40); at least one.
    fn versions(&self) -> BTreeSet<u32> {
        BTreeSet::from([agentloop_core::header::FIRST_VERSION])
    }

    /// The migration registered from `version` to `version + 1`, if any.
    fn migration(&self, version: u32) -> Option<&Migration> {
        let _ = version;
        None
    }

    /// The versions a migration starts from.
    fn migrations_from(&self) -> BTreeSet<u32> {
        BTreeSet::new()
    }

    /// Checks that `state` (a stored state, as a migration leaves it) reads as the
    /// state of `version`, so a migration whose result the new code cannot read is
    /// refused before anything is written.
    fn check_state(&self, version: u32, session: &str, state: &[u8]) -> Result<(), StoreError> {
        let _ = (version, session, state);
        Ok(())
    }

    /// Checks that `item` (a stored item, as a migration leaves it) reads as the item
    /// type.
    fn check_item(&self, session: &str, item: &[u8]) -> Result<(), StoreError> {
        let _ = (session, item);
        Ok(())
    }

    /// The one version this kind runs when it has no migration (a start then needs to
    /// read no record to choose); `None` when a start must read the record's version.
    fn single_version(&self) -> Option<u32> {
        Some(agentloop_core::header::FIRST_VERSION)
    }
}

pub(crate) struct FnKind<F> {
    factory: F,
    name: String,
    version: u32,
    check: fn(&str, &[u8]) -> Result<(), StoreError>,
    check_item: fn(&str, &[u8]) -> Result<(), StoreError>,
}

fn check_item_as<I: serde::de::DeserializeOwned>(
    session: &str,
    item: &[u8],
) -> Result<(), StoreError> {
    codec::decode_item::<I>(session, item).map(|_| ())
}

fn check_state_as<S: serde::de::DeserializeOwned>(
    session: &str,
    state: &[u8],
) -> Result<(), StoreError> {
    codec::decode_state::<S>(session, state).map(|_| ())
}

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
        let agent =
            (self.factory)(&spec.agent_config).map_err(|reason| SupervisorError::BadConfig {
                kind: self.name.clone(),
                reason,
            });
        Box::pin(async move {
            let agent = Arc::new(agent?);
            Ok(SessionHandle::spawn(spec, agent, store)
                .linked(supervisor)
                .await?)
        })
    }

    fn versions(&self) -> BTreeSet<u32> {
        BTreeSet::from([self.version])
    }

    fn check_state(&self, _version: u32, session: &str, state: &[u8]) -> Result<(), StoreError> {
        (self.check)(session, state)
    }

    fn check_item(&self, session: &str, item: &[u8]) -> Result<(), StoreError> {
        (self.check_item)(session, item)
    }

    fn single_version(&self) -> Option<u32> {
        Some(self.version)
    }
}

/// Wraps a factory (serialized configuration → agent) as an [`AgentKind`] of version 1.
pub fn agent_kind<A, F>(
    name: impl Into<String>,
    factory: F,
) -> Arc<dyn AgentKind<A::Item, A::Event>>
where
    A: Agent,
    F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
{
    agent_kind_version(name, agentloop_core::header::FIRST_VERSION, factory)
}

/// Wraps a factory as version `version` of an [`AgentKind`] (S40).
pub fn agent_kind_version<A, F>(
    name: impl Into<String>,
    version: u32,
    factory: F,
) -> Arc<dyn AgentKind<A::Item, A::Event>>
where
    A: Agent,
    F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
{
    Arc::new(FnKind {
        factory,
        name: name.into(),
        version,
        check: check_state_as::<A::State>,
        check_item: check_item_as::<A::Item>,
    })
}
