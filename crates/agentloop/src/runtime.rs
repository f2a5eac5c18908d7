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

use crate::agent::Agent;
use crate::cluster::adopt::{should_adopt, Membership, Sweeper};
use crate::cluster::rebalance::{Rebalance, Rebalancer};
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
use tokio::sync::mpsc;

use crate::store::Stored;
use crate::versions::VersionPlan;

/// The agent kinds a runtime runs, by name, each with its versions (S40).
pub(crate) type Kinds<I, E> = HashMap<String, Arc<dyn AgentKind<I, E>>>;

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

/// Builds a [`Runtime`].
pub struct RuntimeBuilder<I, E> {
    data_dir: Option<PathBuf>,
    engine: Engine,
    store: Option<Arc<dyn CheckpointStore<I>>>,
    kinds: HashMap<String, crate::versions::AgentVersions<I, E>>,
    budget: RestartBudget,
    heartbeat: Duration,
    lease_timeout: Duration,
    durability: Durability,
    shutdown: ShutdownConfig,
    strategies: HashMap<String, Arc<dyn ShutdownStrategy>>,
    hooks: Vec<CleanupHook>,
    flush_logs: Option<LogFlush>,
    end_feeds: Vec<mpsc::UnboundedSender<SessionEnd<I>>>,
    redaction: crate::view::Redaction,
    node: Option<String>,
    rebalance: Option<Rebalance>,
    limits: crate::supervisor::SessionLimits,
    /// The codec for kept events (an `EventCodec<E>`, S20a), when set.
    event_codec: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// How long persistent sessions idle before they sleep (S39), unless their spec
    /// says otherwise.
    idle_after: Option<Duration>,
}

/// Flushes the process's stdout and stderr (tracing's fmt layer writes there).
fn flush_std() {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
}

impl<I, E> Default for RuntimeBuilder<I, E> {
    fn default() -> Self {
        RuntimeBuilder {
            data_dir: None,
            engine: Engine::default(),
            store: None,
            kinds: HashMap::new(),
            budget: RestartBudget::default(),
            heartbeat: DEFAULT_HEARTBEAT,
            lease_timeout: DEFAULT_LEASE_TIMEOUT,
            durability: Durability::Sync,
            shutdown: ShutdownConfig::default(),
            strategies: builtin_strategies(),
            hooks: Vec::new(),
            flush_logs: Some(Arc::new(flush_std)),
            end_feeds: Vec::new(),
            redaction: crate::view::Redaction::none(),
            node: None,
            rebalance: None,
            limits: crate::supervisor::SessionLimits::UNBOUNDED,
            event_codec: None,
            idle_after: None,
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

    /// Keep records in `dir` (a checkpoint actor is started on it), with the engine
    /// set by [`RuntimeBuilder::engine`] (sled by default).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// The embedded engine of [`RuntimeBuilder::data_dir`] and its level: sled (the
    /// default) or fjall, each at a [`crate::store::StoreDurability`]: `power` (the
    /// default: an acknowledged write survives a power loss) or `crash` (a process
    /// crash only; faster). docs/operations.md says what each survives and costs.
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// Keep records in `store` instead of a data directory.
    pub fn store(mut self, store: Arc<dyn CheckpointStore<I>>) -> Self {
        self.store = Some(store);
        self
    }

    /// Registers an agent kind at version 1: `factory` builds the agent from its
    /// serialized config.
    pub fn register_agent<A, F>(self, name: impl Into<String>, factory: F) -> Self
    where
        A: Agent<Item = I, Event = E>,
        F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
    {
        self.register_agent_version(name, crate::versions::FIRST_VERSION, factory)
    }

    /// Registers version `version` of an agent kind (S40), beside the versions already
    /// registered: new sessions of the kind run the newest; a stored session resumes
    /// on the version that wrote it when that one is registered (pinned), else it is
    /// migrated along the kind's migrations ([`RuntimeBuilder::register_migration`])
    /// to the newest, else refused with its record kept. Each version may be its own
    /// agent type (its own state type); all share the runtime's item and event types.
    /// docs/operations.md, "Deploying new agent code", shows a deploy.
    pub fn register_agent_version<A, F>(
        mut self,
        name: impl Into<String>,
        version: u32,
        factory: F,
    ) -> Self
    where
        A: Agent<Item = I, Event = E>,
        F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
    {
        let name = name.into();
        let kind = crate::supervisor::agent_kind_version(name.clone(), version, factory);
        self.kinds
            .entry(name.clone())
            .or_insert_with(|| crate::versions::AgentVersions::new(name))
            .insert_version(version, kind);
        self
    }

    /// Registers the migration of kind `name`'s records from version `from` to
    /// `from + 1` (S40): plain functions over the stored state, items and
    /// configuration ([`crate::Migration`]). A record is migrated when its own version
    /// is not registered and migrations chain from it to the newest registered
    /// version; the migrated record is checked (the new version reads its state, the
    /// item type reads its items) and written before the session runs. A migration
    /// that fails leaves the record as it was.
    pub fn register_migration(
        mut self,
        name: impl Into<String>,
        from: u32,
        migration: crate::versions::Migration,
    ) -> Self {
        let name = name.into();
        self.kinds
            .entry(name.clone())
            .or_insert_with(|| crate::versions::AgentVersions::new(name))
            .insert_migration(from, migration);
        self
    }

    /// Reports what starting this runtime would do to every session stored in `store`
    /// (S40; `agentloop sessions migrate --dry-run`): the version each resumes on, the
    /// migration each gets (run on a copy and checked) or why each would be refused.
    /// Writes nothing.
    pub async fn dry_run(
        &self,
        store: &dyn CheckpointStore<I>,
    ) -> Result<crate::versions::DeployPlan, crate::store::StoreError> {
        Ok(self.plan_deploy(store.list_stored(None).await?))
    }

    /// [`RuntimeBuilder::dry_run`] over records already listed (`list_stored`, or an
    /// offline tool's listing of a data directory).
    pub fn plan_deploy(
        &self,
        entries: Vec<crate::store::StoredEntry>,
    ) -> crate::versions::DeployPlan {
        crate::versions::dry_run(entries, |name| {
            self.kinds
                .get(name)
                .filter(|k| !k.is_empty())
                .map(|k| k as &dyn AgentKind<I, E>)
        })
    }

    /// Sets the restart budget of every session.
    pub fn restart_budget(mut self, budget: RestartBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Runs this runtime as node `name` of a cluster sharing one store (issue 18, S36,
    /// S38; the PostgreSQL store, `agentloop-postgres`): the instance id is `name`, so a
    /// restarted node resumes its own sessions at once; every resume claims its record
    /// by compare-and-swap; and the runtime adopts the sessions of nodes whose lease
    /// expired, those placement gives it ([`crate::cluster`]). Unless a heartbeat was
    /// configured, the cluster defaults apply (1 s heartbeat, 3 s lease:
    /// docs/operations.md says what they cost). Names must be unique among the nodes.
    pub fn node(mut self, name: impl Into<String>) -> Self {
        self.node = Some(name.into());
        if self.heartbeat == DEFAULT_HEARTBEAT && self.lease_timeout == DEFAULT_LEASE_TIMEOUT {
            self.heartbeat = crate::store::lease::CLUSTER_HEARTBEAT;
            self.lease_timeout = crate::store::lease::CLUSTER_LEASE_TIMEOUT;
        }
        self
    }

    /// Makes this node move the sessions it runs to the node placement names when
    /// placement changes (a node joined), by planned migration, once the live set has
    /// been stable for `policy.settle` ([`crate::cluster::rebalance`]; issue 18, S38).
    /// Off unless set; only on a node (`node`) with a forwarder installed
    /// (`ClusterNode::start`, `connect_in_process`).
    pub fn rebalance(mut self, policy: Rebalance) -> Self {
        self.rebalance = Some(policy);
        self
    }

    /// Sets the instance heartbeat interval and the lease timeout (S19).
    pub fn heartbeat(mut self, interval: Duration, lease_timeout: Duration) -> Self {
        self.heartbeat = interval;
        self.lease_timeout = lease_timeout;
        self
    }

    /// Applies a configuration file's values: the data directory and engine, the flush policy of
    /// resumed sessions, the restart budget, the heartbeat and lease, the shutdown, the
    /// session bounds of `[limits]`.
    pub fn config(mut self, config: &RuntimeConfig) -> Self {
        self.data_dir = Some(config.store.data_dir.clone());
        self.engine = config.store.engine;
        self.durability = config.store.flush;
        self.budget = config.supervisor.restart_budget;
        self.heartbeat = config.supervisor.heartbeat;
        self.lease_timeout = config.supervisor.lease_timeout;
        if let Some(idle) = config.supervisor.idle_after {
            self.idle_after = Some(idle);
        }
        self.shutdown = config.shutdown.clone();
        self.limits = config.limits.session_limits();
        if !config.redact.fields.is_empty() {
            self.redaction = config.redact.redaction();
        }
        self
    }

    /// Bounds the sessions this runtime runs and what each holds (S34a); unbounded
    /// unless set here or by [`RuntimeBuilder::config`] (`[limits]`).
    pub fn session_limits(mut self, limits: crate::supervisor::SessionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Puts persistent sessions to sleep after `idle` without a turn, a buffered item
    /// or a subscriber (S39), unless their spec sets its own
    /// ([`crate::SessionSpec::idle_after`]); off unless set. A sleeping session costs a
    /// small entry in memory; its record holds the rest, and the next push, by-id
    /// operation, subscription or due timer wakes it. At start, sessions whose records
    /// say they sleep are registered asleep, not started (on a store this process holds
    /// alone).
    pub fn idle_after(mut self, idle: Duration) -> Self {
        self.idle_after = Some(idle);
        self
    }

    /// Sets the redaction every client-facing read goes through ([`RuntimeHandle::view`](crate::RuntimeHandle::view),
    /// and later the HTTP front): it sees items, states, questions and agent events as
    /// JSON and returns what clients may see. The stored records are never altered.
    pub fn redact(mut self, redaction: crate::view::Redaction) -> Self {
        self.redaction = redaction;
        self
    }

    /// Sets the shutdown configuration (strategy, grace, force timeout, cleanup).
    pub fn shutdown_config(mut self, config: ShutdownConfig) -> Self {
        self.shutdown = config;
        self
    }

    /// The durability of sessions resumed at start (default `Sync`).
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// Registers a shutdown strategy under `name` (the configuration selects it).
    pub fn register_strategy(
        mut self,
        name: impl Into<String>,
        strategy: Arc<dyn ShutdownStrategy>,
    ) -> Self {
        self.strategies.insert(name.into(), strategy);
        self
    }

    /// Lets sessions keep their events in the store (S20a), as JSON: a session spawned
    /// with [`crate::SessionSpec::keep_events`] (every persistent session spawned over
    /// HTTP, and `agentloop serve`'s) and every session resumed from a record that
    /// kept them.
    pub fn keep_events(mut self) -> Self
    where
        E: Serialize + DeserializeOwned,
    {
        self.event_codec = Some(Arc::new(crate::events::EventCodec::<E>::json()));
        self
    }

    /// Adds a cleanup hook; hooks run in the order they were added (S27).
    pub fn on_shutdown(mut self, hook: CleanupHook) -> Self {
        self.hooks.push(hook);
        self
    }

    /// Replaces how logs are flushed at the end of cleanup (default: stdout and
    /// stderr); `None` skips it.
    pub fn flush_logs(mut self, flush: Option<LogFlush>) -> Self {
        self.flush_logs = flush;
        self
    }

    /// Reports every session end on `feed` ([`SessionEnd`]: the final exit state of each
    /// session that leaves the supervisor for good, with the items it still held),
    /// including the ends of sessions resumed at start. The feed closes after the
    /// runtime has shut down and every session's end is on it.
    pub fn session_ends(mut self, feed: mpsc::UnboundedSender<SessionEnd<I>>) -> Self {
        self.end_feeds.push(feed);
        self
    }

    /// Starts the store, the lease, the supervisor and the shutdown coordinator, then
    /// resumes what a previous run left resumable.
    pub async fn start(mut self) -> Result<(Runtime<I, E>, StartReport), RuntimeError> {
        // A cluster node can hand its sessions over at shutdown (issue 18, S38).
        let hand_over: Arc<std::sync::OnceLock<Arc<dyn crate::shutdown::HandOver>>> =
            Arc::default();
        if self.node.is_some() {
            self.strategies.insert(
                "migrate".into(),
                Arc::new(crate::shutdown::Migrate {
                    hand_over: hand_over.clone(),
                }),
            );
        }
        self.shutdown.validate()?;
        crate::config::check_lease(self.heartbeat, self.lease_timeout)?;
        let Some(strategy) = self.strategies.get(&self.shutdown.strategy).cloned() else {
            let mut known: Vec<&str> = self.strategies.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(RuntimeError::UnknownStrategy {
                name: self.shutdown.strategy.clone(),
                known: known.join(", "),
            });
        };
        let metrics = Arc::new(crate::metrics::RuntimeMetrics::new());
        let (store, client) = match (self.store, self.data_dir) {
            (Some(s), _) => (Some(s), None),
            (None, Some(dir)) => {
                let c =
                    CheckpointActor::<I>::spawn_observed(dir, self.engine, metrics.clone()).await?;
                (
                    Some(Arc::new(c.clone()) as Arc<dyn CheckpointStore<I>>),
                    Some(c),
                )
            }
            (None, None) => (None, None),
        };
        let lease = match (&store, &self.node) {
            (Some(s), Some(name)) => {
                Some(InstanceLease::start_named(s.clone(), self.heartbeat, name.clone()).await?)
            }
            (Some(s), None) => Some(InstanceLease::start(s.clone(), self.heartbeat).await?),
            (None, _) => None,
        };
        let instance = lease
            .as_ref()
            .map(|l| l.id().to_string())
            .unwrap_or_else(InstanceLease::new_id);
        let mut kinds = HashMap::new();
        for (name, versions) in self.kinds {
            match versions.into_kind() {
                Some(kind) => {
                    kinds.insert(name, kind);
                }
                None => return Err(RuntimeError::NoVersion { kind: name }),
            }
        }
        let kinds = Arc::new(kinds);
        let supervisor = SupervisorHandle::start(SupervisorArgs {
            kinds: (*kinds).clone(),
            store: store.clone(),
            owner: Some(instance.clone()),
            budget: self.budget,
            heartbeat: self.heartbeat,
            metrics: Some(metrics.clone()),
            limits: self.limits,
        })
        .await?;
        // Before the resume below: resumed sessions sleep too (S39).
        if let Some(idle) = self.idle_after {
            supervisor.set_idle_after(idle);
        }
        // Before the resume below: resumed sessions keep their events too.
        if let Some(codec) = self.event_codec {
            supervisor.set_event_codec(codec);
        }
        // Before the resume below: resumed sessions' turns tell the timer service of the
        // timers they arm (S39).
        let timer_channel = tokio::sync::mpsc::unbounded_channel();
        if store.as_ref().is_some_and(|s| s.keeps_timers()) {
            supervisor.set_timer_service(timer_channel.0.clone());
        }
        // Before the resume below: a resumed session's end must reach the feeds too.
        for feed in self.end_feeds {
            supervisor.watch_ends(feed);
        }
        let shutdown = ShutdownHandle::start(CoordinatorArgs {
            supervisor: supervisor.clone(),
            store: store.clone(),
            config: self.shutdown.clone(),
            strategy: (self.shutdown.strategy.clone(), strategy),
            hooks: self.hooks,
            flush_logs: self.flush_logs,
        })
        .await?;
        // A cluster node adopts dead nodes' sessions; every runtime on a store other
        // processes may share recovers the records whose owner's lease expires while
        // it runs (issue 28). A store this process holds exclusively needs no sweep:
        // the start recovers everything a previous process left.
        let sweeps = self.node.is_some() || store.as_ref().is_some_and(|s| !s.exclusive());
        let runtime = Runtime {
            handle: RuntimeHandle {
                forwarder: Arc::default(),
                moving: Default::default(),
                lease_timeout: self.lease_timeout,
                heartbeat: self.heartbeat,
                sweeps,
                node: self.node.is_some(),
                timer_service: Arc::default(),
                timer_clock: crate::timers::service::Clock::new(),
                timer_bounds: self.limits.timers,
                kinds,
                metrics: metrics.clone(),
                supervisor,
                store,
                instance,
                durability: self.durability,
                shutdown,
                redaction: self.redaction,
            },
            client,
            _lease: lease,
            lease_timeout: self.lease_timeout,
            heartbeat: self.heartbeat,
            node: self.node.is_some(),
            rebalance: self.rebalance,
            adopter: parking_lot::Mutex::new(None),
            timers: parking_lot::Mutex::new(None),
        };
        let _ = runtime.handle.timer_service.set(timer_channel.0.clone());
        let _ = hand_over.set(Arc::new(crate::cluster::migrate::NodeHandOver(
            runtime.handle.clone(),
        )));
        // The shutdown's phase durations, once it happened.
        let phases = runtime.handle.shutdown.clone();
        tokio::spawn(async move {
            if let Ok(report) = phases.wait_report().await {
                metrics.shutdown_phases(report.phases.named());
            }
        });
        // S40: on a store other processes share, tell the others what this one runs
        // before resuming anything, so placement, adoption and moves respect it.
        if let (true, Some(store)) = (runtime.handle.sweeps, &runtime.handle.store) {
            let runs = crate::versions::runs_of(&runtime.handle.kinds);
            store.advertise(&runtime.handle.instance, &runs).await?;
        }
        let report = runtime.resume().await?;
        if runtime.handle.sweeps {
            runtime.start_adopting();
        }
        runtime.start_timers(timer_channel);
        Ok((runtime, report))
    }
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

    /// How `stored` would resume on this runtime's versions of its kind (S40); `None`
    /// for a kind not registered here (the spawn refuses it, naming the kinds).
    fn version_plan(&self, stored: &Stored) -> Option<VersionPlan> {
        let kind = match stored {
            Stored::Current(r) => &r.header.agent_kind,
            Stored::Format1(f) => &f.agent_kind,
        };
        let kind = self.handle.kinds.get(kind)?;
        Some(crate::versions::plan_for(
            &**kind,
            crate::versions::version_of(stored),
        ))
    }

    /// The error for a record no version here runs.
    fn version_refusal(
        &self,
        entry: &crate::store::StoredEntry,
        why: String,
    ) -> crate::versions::VersionError {
        let (kind, version) = match &entry.record {
            Ok(stored) => match stored {
                Stored::Current(r) => (r.header.agent_kind.clone(), r.header.agent_version),
                Stored::Format1(f) => (f.agent_kind.clone(), crate::versions::FIRST_VERSION),
            },
            Err(_) => (String::new(), 0),
        };
        let available = self
            .handle
            .kinds
            .get(&kind)
            .map(|k| crate::versions::list(&k.versions()))
            .unwrap_or_default();
        crate::versions::VersionError::Unavailable {
            session: entry.session_id.clone(),
            kind,
            version,
            available,
            why,
        }
    }

    /// Resumes every stored session that is `Interrupted`, or `Running` under an owner
    /// whose heartbeat is stale (S19).
    async fn resume(&self) -> Result<StartReport, RuntimeError> {
        let mut report = StartReport::default();
        let Some(store) = &self.store else {
            return Ok(report);
        };
        let entries = store
            .list_stored(Some(vec![StatusKind::Interrupted, StatusKind::Running]))
            .await?;
        // A cluster node judges other nodes' records by membership and placement.
        let membership = match self.node {
            true => Some(
                Membership::judge(
                    &store.instances().await?,
                    &self.instance,
                    now_ms(),
                    self.lease_timeout,
                )
                .with_runs(store.advertised().await?),
            ),
            false => None,
        };
        let mut spawns = Vec::new();
        let mut sleepers = Vec::new();
        for entry in entries {
            // S40: a record this runtime cannot run is left as it is; one it must
            // migrate is loaded by its session's start once migrated (its items may not
            // read as the item type before).
            let plan = match &entry.record {
                Ok(stored) => self.version_plan(stored),
                Err(_) => None,
            };
            if let Some(VersionPlan::Refused { why }) = plan {
                let e = self.version_refusal(&entry, why);
                tracing::warn!(session = %entry.session_id, error = %e,
                    "a stored session's agent version does not run here; it is not resumed and was left untouched");
                report.skipped.push((entry.session_id, e.to_string()));
                continue;
            }
            let rec = match entry.record.and_then(|s| match (plan, s) {
                (Some(VersionPlan::Migrate { .. }), Stored::Current(r)) => Ok(Resume::Migrate(r)),
                (_, s) => s.decode::<I>().map(Resume::Loaded),
            }) {
                Ok(r) => r,
                Err(e) => {
                    // Nobody may read the report: say it where operators look (S15).
                    tracing::warn!(session = %entry.session_id, error = %e,
                        "a stored record does not decode; it is not resumed and was left untouched");
                    report.skipped.push((entry.session_id, e.to_string()));
                    continue;
                }
            };
            let h = rec.header();
            if self.node && h.owner.as_deref() != Some(self.instance.as_str()) {
                // A node resumes its own records; another's only when that node is dead
                // and placement names this one (the adoption sweep's rule).
                if !membership
                    .as_ref()
                    .is_some_and(|m| should_adopt(m, &self.instance, placed(h), h.owner.as_deref()))
                {
                    report.skipped.push((
                        h.session_id.clone(),
                        format!(
                            "owned by node `{}`, or placed on another live node; that node \
                             runs it (or adopts it when its owner's lease expires)",
                            h.owner.as_deref().unwrap_or("none")
                        ),
                    ));
                    continue;
                }
            }
            if h.status == SessionStatus::Running {
                if let Some(owner) = h.owner.as_deref().filter(|o| *o != self.instance) {
                    let beat = store.heartbeat(owner).await?;
                    // An exclusive store proves a previous process's owner gone: its
                    // sessions are recovered at once, not after its lease (issue 28).
                    let seen = crate::store::lease::last_seen(h, beat.unwrap_or(0));
                    let orphaned = store.orphaned(owner, seen);
                    // S19, judged as the session's load judges it.
                    match resumable(
                        h,
                        Some(&self.instance),
                        beat,
                        orphaned,
                        now_ms(),
                        self.lease_timeout,
                    ) {
                        Resumable::Recover { orphaned: true, .. } => {
                            tracing::info!(session = %h.session_id, owner,
                                "recovering a session of a process that held this data directory before");
                        }
                        Resumable::Held { age, left, .. } => {
                            report.skipped.push((
                                h.session_id.clone(),
                                format!(
                                    "owned by instance `{owner}`, last seen {} ago; its lease \
                                     expires in {} (lease_timeout {}): if that process is \
                                     still running, it keeps the session; if it is gone, start \
                                     again after that and the session is recovered",
                                    crate::config::format_duration(age),
                                    crate::config::format_duration(left),
                                    crate::config::format_duration(self.lease_timeout),
                                ),
                            ));
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            // S39: asleep when its owner ended: registered asleep (claimed first on a
            // shared store), woken by the first request for it.
            if h.asleep && h.status == SessionStatus::Running {
                sleepers.push(h.clone());
                continue;
            }
            let items = rec.item_count();
            let crashed = h.status == SessionStatus::Running;
            let id = h.session_id.clone();
            // On a shared store the resume claims the record (a new owner and lease
            // epoch), so no other runtime's recovery sweep takes it for its dead
            // former owner's (issue 28).
            let spec = match rec {
                Resume::Loaded(rec) => {
                    SessionSpec::resuming(rec, self.durability, self.lease_timeout, self.sweeps)
                }
                Resume::Migrate(r) => {
                    let mut spec =
                        SessionSpec::from_header(&r.header, self.durability, self.lease_timeout);
                    spec.claim = self.sweeps;
                    spec.resumed = true;
                    spec
                }
            };
            spawns.push((id, (items, crashed), spec));
        }
        // In batches (one request per thousand sessions), whose sessions start
        // concurrently, a bounded number at a time, instead of one after the other (B5).
        let (meta, specs): (Vec<_>, Vec<_>) = spawns
            .into_iter()
            .map(|(id, items, spec)| ((id, items), spec))
            .unzip();
        let results = self.supervisor.spawn_batch(specs).await;
        for ((id, (items, crashed)), result) in meta.into_iter().zip(results) {
            match result {
                Ok(_) => {
                    report.resumed.push(id);
                    report.items += items;
                    report.recovered += usize::from(crashed);
                }
                Err(e) => report.skipped.push((id, e.to_string())),
            }
        }
        let (asleep, skipped) = register_asleep(
            &**store,
            &self.supervisor,
            &self.instance,
            sleepers,
            self.sweeps,
        )
        .await;
        report.asleep = asleep;
        for (id, why) in &skipped {
            // Nobody may read the report: say it where operators look (S15).
            tracing::warn!(session = %id, why = %why, "a sleeping session was not registered; its record is kept as it is");
        }
        report.skipped.extend(skipped);
        tracing::info!(
            resumed = report.resumed.len(),
            asleep = report.asleep,
            items = report.items,
            skipped = report.skipped.len(),
            "resumed stored sessions"
        );
        Ok(report)
    }

    /// Starts the adoption sweep of a cluster node (issue 18, S38), which is also the
    /// recovery sweep of a runtime on a shared store (issue 28): every heartbeat it
    /// reads the store's membership; when an instance is newly presumed dead (or
    /// membership changed, or every 30 beats anyway) it lists the resumable records and
    /// resumes those whose owner is dead and that placement gives this instance, each
    /// claiming its record first. A runtime that is not a node also reads the owner's
    /// own heartbeat (a store may list no instances) and takes only records whose
    /// owner's lease expired. It stops when the runtime shuts down.
    /// Starts the timer service (S39); it reads the store's due-time index first (one
    /// scan of the timers, not of the records), without holding up the start. A store
    /// that keeps no timers has none to fire.
    fn start_timers(
        &self,
        (tx, rx): (
            crate::timers::service::Notify,
            tokio::sync::mpsc::UnboundedReceiver<crate::timers::service::Command>,
        ),
    ) {
        if !self.handle.store.as_ref().is_some_and(|s| s.keeps_timers()) {
            return;
        }
        // On a shared store, timers armed elsewhere (another node, a node whose sessions
        // this one adopts) are read again every heartbeat.
        let rescan = self.sweeps.then_some(self.heartbeat);
        let task = crate::timers::service::start(
            self.handle.clone(),
            self.handle.timer_clock,
            tx,
            rx,
            rescan,
        );
        *self.timers.lock() = Some(task);
    }

    fn start_adopting(&self) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let supervisor = self.supervisor.clone();
        let shutdown = self.handle.shutdown.clone();
        let me = self.instance.clone();
        let lease_timeout = self.lease_timeout;
        let durability = self.durability;
        let node = self.node;
        let mut tick = tokio::time::interval(self.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let rebalance = self.rebalance.map(|p| (p, Rebalancer::new(p.settle, 30)));
        let handle = self.handle.clone();
        let task = tokio::spawn(async move {
            let mut sweeper = Sweeper::new(30);
            let mut rebalance = rebalance;
            let round: Arc<tokio::sync::Mutex<()>> = Arc::default();
            loop {
                tick.tick().await;
                if shutdown.is_started().await {
                    return;
                }
                let beats = match store.instances().await {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the cluster's heartbeats; the next beat retries");
                        continue;
                    }
                };
                // S40: what each node can run, for placement and adoption.
                let runs = match store.advertised().await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read what the nodes can run; the next beat retries");
                        continue;
                    }
                };
                let m = Membership::judge(&beats, &me, now_ms(), lease_timeout).with_runs(runs);
                if let Some((policy, rebalancer)) = rebalance.as_mut() {
                    // One round at a time (a round is judged due only when none runs);
                    // a round runs beside the adoption sweep.
                    if let Ok(in_round) = round.clone().try_lock_owned() {
                        if rebalancer.due(&m, now_ms()) {
                            let (handle, m, policy) = (handle.clone(), m.clone(), *policy);
                            tokio::spawn(async move {
                                handle.rebalance_round(&m, policy).await;
                                drop(in_round);
                            });
                        }
                    }
                }
                if !sweeper.due(&m) {
                    continue;
                }
                let entries = match store
                    .list_stored(Some(vec![StatusKind::Interrupted, StatusKind::Running]))
                    .await
                {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list the records to adopt; the next beat retries");
                        sweeper.retry();
                        continue;
                    }
                };
                let live: std::collections::HashSet<String> =
                    supervisor.list().await.into_iter().map(|s| s.id).collect();
                let mut specs = Vec::new();
                let mut sleepers = Vec::new();
                for entry in entries {
                    let Ok(rec) = entry.record.and_then(|s| s.decode::<I>()) else {
                        continue;
                    };
                    let h = &rec.header;
                    if !should_adopt(&m, &me, placed(h), h.owner.as_deref())
                        || live.contains(&h.session_id)
                    {
                        continue;
                    }
                    if !node {
                        if let Some(owner) = h.owner.as_deref() {
                            let beat = match store.heartbeat(owner).await {
                                Ok(b) => b,
                                Err(e) => {
                                    tracing::warn!(error = %e, session = %h.session_id,
                                        "cannot read the owner's heartbeat; the next sweep retries");
                                    sweeper.retry();
                                    continue;
                                }
                            };
                            // S19: the owner's lease, counted as the session's load
                            // counts it. Its record may have been written after the
                            // owner's last beat: sweep again next beat, not in 30.
                            if holder(h, Some(&me), beat, false, now_ms(), lease_timeout).is_some()
                            {
                                sweeper.retry();
                                continue;
                            }
                        }
                    }
                    tracing::info!(session = %h.session_id, dead = ?h.owner, asleep = h.asleep, "adopting a session whose owner's lease expired");
                    // S39: one asleep stays asleep here (claimed, no actor).
                    if h.asleep && h.status == SessionStatus::Running {
                        sleepers.push(rec.header);
                        continue;
                    }
                    specs.push(SessionSpec::resuming(rec, durability, lease_timeout, true));
                }
                if !sleepers.is_empty() {
                    let (_, skipped) =
                        register_asleep(&*store, &supervisor, &me, sleepers, true).await;
                    if !skipped.is_empty() {
                        tracing::warn!(skipped = ?skipped, "some sleeping sessions were not adopted; the sweep retries them");
                        sweeper.retry();
                    }
                }
                let results =
                    futures::future::join_all(specs.into_iter().map(|s| supervisor.spawn(s))).await;
                let failed = results.iter().filter(|r| r.is_err()).count();
                if failed > 0 {
                    tracing::warn!(
                        failed,
                        "some adopted sessions did not start; the sweep retries them"
                    );
                    sweeper.retry();
                }
            }
        });
        *self.adopter.lock() = Some(task);
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

/// Registers sessions whose records say they sleep (S39) with the supervisor, without
/// starting them; with `claim`, a record another owner held (a node that died, a
/// previous process on a shared store) is claimed first: one write at the next lease
/// epoch, which exactly one claimant wins. Returns how many were registered and the
/// others with why.
async fn register_asleep<I, E>(
    store: &dyn CheckpointStore<I>,
    supervisor: &SupervisorHandle<I, E>,
    me: &str,
    headers: Vec<crate::store::RecordHeader>,
    claim: bool,
) -> (usize, Vec<(String, String)>)
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    let mut skipped = Vec::new();
    let mut sessions = Vec::with_capacity(headers.len());
    for h in headers {
        if claim && h.owner.as_deref() != Some(me) {
            let write = crate::store::transition::hand_over(
                &h,
                Some(me.to_string()),
                SessionStatus::Running,
                now_ms(),
            );
            if let Err(e) = store.write(write).await {
                skipped.push((
                    h.session_id.clone(),
                    format!("its sleeping record could not be claimed ({e}); another instance took it, or the next sweep retries"),
                ));
                continue;
            }
        }
        sessions.push((h.session_id, h.agent_kind));
    }
    let offered = sessions.len();
    let refused = supervisor.sleepers(sessions).await;
    let registered = offered - refused.len();
    skipped.extend(refused.into_iter().map(|id| {
        (
            id,
            "its agent kind is not registered in this runtime; register it and start again \
             (the record is kept as it is)"
                .to_string(),
        )
    }));
    (registered, skipped)
}

/// A record the start resumes: decoded (its session uses it as read), or one its
/// session's start migrates first (S40) and then loads itself.
enum Resume<I> {
    Loaded(crate::store::LoadedRecord<I>),
    Migrate(crate::store::StoredRecord),
}

impl<I> Resume<I> {
    fn header(&self) -> &crate::store::RecordHeader {
        match self {
            Resume::Loaded(r) => &r.header,
            Resume::Migrate(r) => &r.header,
        }
    }

    fn item_count(&self) -> usize {
        match self {
            Resume::Loaded(r) => r.item_count(),
            Resume::Migrate(r) => r.items.len(),
        }
    }
}

/// A record's header as placement and adoption see it (S40).
fn placed(h: &crate::store::RecordHeader) -> agentloop_core::adopt::Placed<'_> {
    agentloop_core::adopt::Placed {
        session: &h.session_id,
        kind: &h.agent_kind,
        version: h.agent_version,
    }
}
