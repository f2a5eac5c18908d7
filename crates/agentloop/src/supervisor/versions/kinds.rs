//! One agent kind at several versions side by side, with the migrations between
//! consecutive ones (S40). It dispatches a start to the version the runtime chose; it
//! chooses nothing itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::future::BoxFuture;
use ractor::ActorCell;

use super::Migration;
use crate::session::{SessionHandle, SessionSpec};
use crate::store::{CheckpointStore, StoreError};
use crate::supervisor::{AgentKind, SupervisorError};

/// The agent kinds a runtime runs, by name, each with its versions (S40).
pub(crate) type Kinds<I, E> = std::collections::HashMap<String, Arc<dyn AgentKind<I, E>>>;

/// An agent kind registered at several versions ([`AgentKind`]s, one per version) and
/// the migrations from each version to the next. Built by
/// [`RuntimeBuilder::register_agent_version`](crate::runtime::RuntimeBuilder::register_agent_version)
/// and [`RuntimeBuilder::register_migration`](crate::runtime::RuntimeBuilder::register_migration),
/// or by hand for a supervisor built alone.
pub struct AgentVersions<I, E> {
    name: String,
    versions: BTreeMap<u32, Arc<dyn AgentKind<I, E>>>,
    migrations: BTreeMap<u32, Migration>,
}

impl<I, E> AgentVersions<I, E> {
    /// A kind named `name` with no version yet.
    pub fn new(name: impl Into<String>) -> Self {
        AgentVersions {
            name: name.into(),
            versions: BTreeMap::new(),
            migrations: BTreeMap::new(),
        }
    }

    /// Registers `kind` as version `version` (replacing one registered before).
    pub fn version(mut self, version: u32, kind: Arc<dyn AgentKind<I, E>>) -> Self {
        self.insert_version(version, kind);
        self
    }

    /// Registers the migration from version `from` to `from + 1`.
    pub fn migration(mut self, from: u32, migration: Migration) -> Self {
        self.insert_migration(from, migration);
        self
    }

    pub(crate) fn insert_version(&mut self, version: u32, kind: Arc<dyn AgentKind<I, E>>) {
        self.versions.insert(version, kind);
    }

    pub(crate) fn insert_migration(&mut self, from: u32, migration: Migration) {
        self.migrations.insert(from, migration);
    }

    /// The kind's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a version or a migration is registered at all.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }

    /// The kind as the supervisor holds it: the one version itself when there is one
    /// and no migration (a start then reads no record to choose), else this.
    pub(crate) fn into_kind(mut self) -> Option<Arc<dyn AgentKind<I, E>>>
    where
        I: Send + Sync + 'static,
        E: Send + Sync + 'static,
    {
        if self.versions.len() == 1 && self.migrations.is_empty() {
            return self.versions.pop_first().map(|(_, k)| k);
        }
        if self.versions.is_empty() {
            return None;
        }
        Some(Arc::new(self))
    }
}

impl<I: Send + Sync + 'static, E: Send + Sync + 'static> AgentKind<I, E> for AgentVersions<I, E> {
    fn spawn(
        &self,
        spec: SessionSpec<I>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        supervisor: ActorCell,
    ) -> BoxFuture<'static, Result<SessionHandle<I, E>, SupervisorError>> {
        let version = spec.run.agent_version;
        match self.versions.get(&version) {
            Some(kind) => kind.spawn(spec, store, supervisor),
            None => {
                let e = super::VersionError::Unavailable {
                    session: spec.id.clone(),
                    kind: self.name.clone(),
                    version,
                    available: super::list(&self.versions()),
                    why: format!("version {version} is not registered"),
                };
                Box::pin(std::future::ready(Err(SupervisorError::Version(e))))
            }
        }
    }

    fn versions(&self) -> BTreeSet<u32> {
        self.versions.keys().copied().collect()
    }

    fn migration(&self, version: u32) -> Option<&Migration> {
        self.migrations.get(&version)
    }

    fn migrations_from(&self) -> BTreeSet<u32> {
        self.migrations.keys().copied().collect()
    }

    fn check_state(&self, version: u32, session: &str, state: &[u8]) -> Result<(), StoreError> {
        match self.versions.get(&version) {
            Some(kind) => kind.check_state(version, session, state),
            None => Ok(()),
        }
    }

    fn check_item(&self, session: &str, item: &[u8]) -> Result<(), StoreError> {
        match self.versions.last_key_value() {
            Some((_, kind)) => kind.check_item(session, item),
            None => Ok(()),
        }
    }

    fn single_version(&self) -> Option<u32> {
        None
    }
}
