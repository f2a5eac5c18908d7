//! The `Runtime` facade: for those without an actor tree, one call starts the checkpoint
//! actor (sled in a data directory, or a given store), the instance lease (S19) and the
//! session supervisor (S25), and resumes the sessions a previous run left resumable
//! (`Interrupted`, or `Running` under an owner whose heartbeat is stale) with a report.
//!
//! It owns those pieces and their order: start store → lease → supervisor → shutdown
//! coordinator → resume; shut down: the coordinator's phases (S27) → supervisor →
//! store. It holds no session logic and no shutdown logic (that is `shutdown`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{ConfigError, RuntimeConfig, ShutdownConfig};
use crate::error::SpawnError;
use crate::liveness::{holder, resumable, Resumable};
use crate::options::StopOptions;
use crate::session::{Durability, ExitState};
use crate::shutdown::{
    builtin_strategies, CleanupHook, CoordinatorArgs, LogFlush, ShutdownHandle, ShutdownReport,
    ShutdownStrategy,
};
use crate::store::lease::{DEFAULT_HEARTBEAT, DEFAULT_LEASE_TIMEOUT};
use crate::store::{
    now_ms, CheckpointActor, CheckpointClient, CheckpointStore, Engine, InstanceLease,
    SessionStatus, StatusKind, StoreError,
};
use crate::supervisor::{
    AgentKind, RestartBudget, SessionEnd, SessionSpec, SupervisorArgs, SupervisorHandle,
};
use crate::turn::agent::Agent;
use agentloop_core::adopt::{should_adopt, Membership, Sweeper};
use agentloop_core::rebalance::{Rebalance, Rebalancer};
use tokio::sync::mpsc;

use crate::store::Stored;
use crate::supervisor::versions::VersionPlan;

pub use crate::runtime_handle::RuntimeHandle;

/// A runtime could not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The store failed.
    #[error("checkpoint store: {0}")]
    Store(#[from] StoreError),
    /// An actor could not start.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No strategy is registered under the configured name.
    #[error("invalid configuration: `shutdown.strategy` = {name:?} is not a registered strategy; known: {known}")]
    UnknownStrategy {
        /// The configured name.
        name: String,
        /// The registered names.
        known: String,
    },
    /// Migrations were registered for an agent kind with no version registered.
    #[error("migrations are registered for agent kind `{kind}`, but no version of it is; register its versions too (RuntimeBuilder::register_agent_version)")]
    NoVersion {
        /// The kind.
        kind: String,
    },
    /// The shutdown coordinator was already gone.
    #[error("the runtime was already shut down")]
    AlreadyShutDown,
}

/// What the start found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartReport {
    /// Sessions resumed, by id.
    pub resumed: Vec<String>,
    /// Items those sessions carried (unhandled plus interrupted).
    pub items: usize,
    /// How many of the resumed sessions were recovered after their process died (their
    /// record was still `Running` under an owner whose lease had expired); the others
    /// were interrupted by a shutdown (or stopped) and saved.
    pub recovered: usize,
    /// Records not resumed, with why (a live owner, corrupt, an unknown kind...).
    pub skipped: Vec<(String, String)>,
    /// Sessions whose records say they sleep (S39), registered asleep without being
    /// started: the first push, by-id operation, subscription or due timer wakes each.
    pub asleep: usize,
}

/// A running agentloop: checkpoint store, instance lease, session supervisor.
///
/// It dereferences to its [`RuntimeHandle`] (supervisor, store views, resume, delete,
/// shutdown handle); clone that handle into anything that serves sessions while the
/// `Runtime` itself stays with whoever shuts it down.
pub struct Runtime<I, E> {
    handle: RuntimeHandle<I, E>,
    client: Option<CheckpointClient<I>>,
    _lease: Option<InstanceLease>,
    lease_timeout: Duration,
    heartbeat: Duration,
    /// A cluster node (issue 18): resumes claim, dead nodes' sessions are adopted.
    node: bool,
    /// Whether and how the node moves sessions when placement changes.
    rebalance: Option<Rebalance>,
    /// The adoption sweep of a cluster node, stopped at shutdown.
    adopter: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The timer service (S39), stopped at shutdown.
    timers: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl<I, E> Drop for Runtime<I, E> {
    fn drop(&mut self) {
        if let Some(task) = self.adopter.lock().take() {
            task.abort();
        }
        if let Some(task) = self.timers.lock().take() {
            task.abort();
        }
    }
}

impl<I, E> std::ops::Deref for Runtime<I, E> {
    type Target = RuntimeHandle<I, E>;
    fn deref(&self) -> &RuntimeHandle<I, E> {
        &self.handle
    }
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

    /// A handle on this runtime's sessions and store, to clone into servers and tasks
    /// (the `Runtime` itself dereferences to it).
    pub fn handle(&self) -> RuntimeHandle<I, E> {
        self.handle.clone()
    }

    /// The checkpoint actor's counters, when the runtime runs one (built with a data
    /// directory).
    pub async fn checkpoint_stats(&self) -> Option<crate::store::CheckpointStats> {
        self.client.as_ref()?.stats().await.ok()
    }

    /// Shuts down (S27): runs the coordinator's phases (or joins the shutdown a signal
    /// started), then stops the supervisor and closes the store. Returns the report.
    pub async fn shutdown(self) -> Result<ShutdownReport, RuntimeError> {
        let report = self
            .handle
            .shutdown
            .shutdown()
            .await
            .map_err(|_| RuntimeError::AlreadyShutDown)?;
        self.release().await?;
        Ok(report)
    }

    /// Stops every session in-band with `options` (queued pushes are answered, never
    /// dropped), then the supervisor, then the store, without the shutdown phases.
    /// Returns the sessions' exit states.
    pub async fn stop(self, options: StopOptions) -> Result<Vec<ExitState<I>>, RuntimeError> {
        // No recovery sweep may resume what the stop is ending.
        if let Some(task) = self.adopter.lock().take() {
            task.abort();
        }
        let exits = self.supervisor.stop_all(options).await;
        self.release().await?;
        Ok(exits)
    }

    async fn release(&self) -> Result<(), RuntimeError> {
        if let Some(task) = self.adopter.lock().take() {
            task.abort();
        }
        let _ = self.supervisor.actor().drain_and_wait(None).await;
        // Drain, not stop: a question to the coordinator racing a stop would stay in its
        // mailbox unanswered while any shutdown handle lives (a caller of
        // `is_started` waited forever); drained, each is answered, later ones refused.
        if self.handle.shutdown.actor().drain().is_err() {
            self.handle.shutdown.actor().stop(None);
        }
        if let Some(c) = &self.client {
            c.close().await?;
        }
        Ok(())
    }
}

mod adopt;
mod builder;
mod resume;
pub use builder::RuntimeBuilder;
