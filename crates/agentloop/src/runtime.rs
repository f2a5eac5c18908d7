//! The `Runtime` facade: for those without an actor tree, one call starts the checkpoint
//! actor (sled in a data directory, or a given store), the instance lease (S19) and the
//! session supervisor (S25), and resumes the sessions a previous run left resumable
//! (`Interrupted`, or `Running` under an owner whose heartbeat is stale) with a report.
//!
//! It owns those three pieces and their order: start store → lease → supervisor →
//! resume; stop: every session in-band → supervisor → store. It holds no session logic.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::agent::Agent;
use crate::error::SpawnError;
use crate::options::StopOptions;
use crate::session::{Durability, ExitState};
use crate::store::lease::{is_fresh, DEFAULT_HEARTBEAT, DEFAULT_LEASE_TIMEOUT};
use crate::store::{
    now_ms, CheckpointActor, CheckpointClient, CheckpointStore, InstanceLease, SessionStatus,
    StatusKind, StoreError,
};
use crate::supervisor::{
    agent_kind, AgentKind, RestartBudget, SessionSpec, SupervisorArgs, SupervisorHandle,
};

/// A runtime could not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The store failed.
    #[error("checkpoint store: {0}")]
    Store(#[from] StoreError),
    /// An actor could not start.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

/// What the start found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartReport {
    /// Sessions resumed, by id.
    pub resumed: Vec<String>,
    /// Items those sessions carried (unhandled plus interrupted).
    pub items: usize,
    /// Records not resumed, with why (a live owner, corrupt, an unknown kind...).
    pub skipped: Vec<(String, String)>,
}

/// Builds a [`Runtime`].
pub struct RuntimeBuilder<I, E> {
    data_dir: Option<PathBuf>,
    store: Option<Arc<dyn CheckpointStore<I>>>,
    kinds: HashMap<String, Arc<dyn AgentKind<I, E>>>,
    budget: RestartBudget,
    heartbeat: Duration,
    lease_timeout: Duration,
}

impl<I, E> Default for RuntimeBuilder<I, E> {
    fn default() -> Self {
        RuntimeBuilder {
            data_dir: None,
            store: None,
            kinds: HashMap::new(),
            budget: RestartBudget::default(),
            heartbeat: DEFAULT_HEARTBEAT,
            lease_timeout: DEFAULT_LEASE_TIMEOUT,
        }
    }
}

impl<I, E> RuntimeBuilder<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// A builder with no store and no agent kinds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep records in sled in `dir` (a checkpoint actor is started on it).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Keep records in `store` instead of a data directory.
    pub fn store(mut self, store: Arc<dyn CheckpointStore<I>>) -> Self {
        self.store = Some(store);
        self
    }

    /// Registers an agent kind: `factory` builds the agent from its serialized config.
    pub fn register_agent<A, F>(mut self, name: impl Into<String>, factory: F) -> Self
    where
        A: Agent<Item = I, Event = E>,
        F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
    {
        let name = name.into();
        self.kinds.insert(name.clone(), agent_kind(name, factory));
        self
    }

    /// Sets the restart budget of every session.
    pub fn restart_budget(mut self, budget: RestartBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Sets the instance heartbeat interval and the lease timeout (S19).
    pub fn heartbeat(mut self, interval: Duration, lease_timeout: Duration) -> Self {
        self.heartbeat = interval;
        self.lease_timeout = lease_timeout;
        self
    }

    /// Starts the store, the lease and the supervisor, then resumes what a previous run
    /// left resumable.
    pub async fn start(self) -> Result<(Runtime<I, E>, StartReport), RuntimeError> {
        let (store, client) = match (self.store, self.data_dir) {
            (Some(s), _) => (Some(s), None),
            (None, Some(dir)) => {
                let c = CheckpointActor::<I>::spawn(dir).await?;
                (
                    Some(Arc::new(c.clone()) as Arc<dyn CheckpointStore<I>>),
                    Some(c),
                )
            }
            (None, None) => (None, None),
        };
        let lease = match &store {
            Some(s) => Some(InstanceLease::start(s.clone(), self.heartbeat).await?),
            None => None,
        };
        let instance = lease
            .as_ref()
            .map(|l| l.id().to_string())
            .unwrap_or_else(InstanceLease::new_id);
        let supervisor = SupervisorHandle::start(SupervisorArgs {
            kinds: self.kinds,
            store: store.clone(),
            owner: Some(instance.clone()),
            budget: self.budget,
        })
        .await?;
        let runtime = Runtime {
            supervisor,
            store,
            client,
            _lease: lease,
            instance,
            lease_timeout: self.lease_timeout,
        };
        let report = runtime.resume().await?;
        Ok((runtime, report))
    }
}

/// A running agentloop: checkpoint store, instance lease, session supervisor.
pub struct Runtime<I, E> {
    supervisor: SupervisorHandle<I, E>,
    store: Option<Arc<dyn CheckpointStore<I>>>,
    client: Option<CheckpointClient<I>>,
    _lease: Option<InstanceLease>,
    instance: String,
    lease_timeout: Duration,
}

impl<I, E> Runtime<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// A builder.
    pub fn builder() -> RuntimeBuilder<I, E> {
        RuntimeBuilder::new()
    }

    /// The session supervisor.
    pub fn supervisor(&self) -> &SupervisorHandle<I, E> {
        &self.supervisor
    }

    /// The checkpoint store, if any.
    pub fn store(&self) -> Option<Arc<dyn CheckpointStore<I>>> {
        self.store.clone()
    }

    /// This runtime instance's id (the owner of its `Running` records).
    pub fn instance_id(&self) -> &str {
        &self.instance
    }

    /// Resumes every stored session that is `Interrupted`, or `Running` under an owner
    /// whose heartbeat is stale (S19).
    async fn resume(&self) -> Result<StartReport, RuntimeError> {
        let mut report = StartReport::default();
        let Some(store) = &self.store else {
            return Ok(report);
        };
        let entries = store
            .list(Some(vec![StatusKind::Interrupted, StatusKind::Running]))
            .await?;
        for entry in entries {
            let rec = match entry.record {
                Ok(r) => r,
                Err(e) => {
                    report.skipped.push((entry.session_id, e.to_string()));
                    continue;
                }
            };
            if rec.status == SessionStatus::Running {
                if let Some(owner) = rec.owner.as_deref().filter(|o| *o != self.instance) {
                    let beat = store.heartbeat(owner).await?.unwrap_or(rec.heartbeat_ms);
                    if is_fresh(beat, now_ms(), self.lease_timeout) {
                        report.skipped.push((
                            rec.session_id.clone(),
                            format!("running on live instance `{owner}`"),
                        ));
                        continue;
                    }
                }
            }
            let items = rec.unhandled_items.len() + rec.interrupted_items.len();
            let mut spec = SessionSpec::new(rec.session_id.clone(), rec.agent_kind.clone())
                .config(rec.agent_config.clone())
                .persistent(true)
                .durability(Durability::Sync);
            let id = rec.session_id.clone();
            // The session uses this record instead of loading it again.
            spec.preloaded = Some(rec);
            match self.supervisor.spawn(spec).await {
                Ok(_) => {
                    report.resumed.push(id);
                    report.items += items;
                }
                Err(e) => report.skipped.push((id, e.to_string())),
            }
        }
        tracing::info!(
            resumed = report.resumed.len(),
            items = report.items,
            skipped = report.skipped.len(),
            "resumed stored sessions"
        );
        Ok(report)
    }

    /// Stops every session in-band (queued pushes are answered, never dropped), then
    /// the supervisor, then the store. Returns the sessions' exit states.
    pub async fn stop(self, options: StopOptions) -> Result<Vec<ExitState<I>>, RuntimeError> {
        let exits = self.supervisor.stop_all(options).await;
        let _ = self.supervisor.actor().drain_and_wait(None).await;
        if let Some(c) = &self.client {
            c.close().await?;
        }
        Ok(exits)
    }
}
