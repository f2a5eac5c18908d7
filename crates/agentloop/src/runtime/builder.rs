//! The [`RuntimeBuilder`]: what a runtime is made of (a store or a data directory,
//! agent kinds and their versions, budgets, limits, hooks), and its start in order:
//! store, lease, supervisor, shutdown coordinator, resume. It decides nothing about a
//! session.

use super::*;

/// Builds a [`Runtime`].
pub struct RuntimeBuilder<I, E> {
    data_dir: Option<PathBuf>,
    engine: Engine,
    store: Option<Arc<dyn CheckpointStore<I>>>,
    kinds: HashMap<String, crate::supervisor::versions::AgentVersions<I, E>>,
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
        self.register_agent_version(name, crate::supervisor::versions::FIRST_VERSION, factory)
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
            .or_insert_with(|| crate::supervisor::versions::AgentVersions::new(name))
            .insert_version(version, kind);
        self
    }

    /// Registers the migration of kind `name`'s records from version `from` to
    /// `from + 1` (S40): plain functions over the stored state, items and
    /// configuration ([`crate::supervisor::versions::Migration`]). A record is migrated when its own version
    /// is not registered and migrations chain from it to the newest registered
    /// version; the migrated record is checked (the new version reads its state, the
    /// item type reads its items) and written before the session runs. A migration
    /// that fails leaves the record as it was.
    pub fn register_migration(
        mut self,
        name: impl Into<String>,
        from: u32,
        migration: crate::supervisor::versions::Migration,
    ) -> Self {
        let name = name.into();
        self.kinds
            .entry(name.clone())
            .or_insert_with(|| crate::supervisor::versions::AgentVersions::new(name))
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
    ) -> Result<crate::supervisor::versions::DeployPlan, crate::store::StoreError> {
        Ok(self.plan_deploy(store.list_stored(None).await?))
    }

    /// [`RuntimeBuilder::dry_run`] over records already listed (`list_stored`, or an
    /// offline tool's listing of a data directory).
    pub fn plan_deploy(
        &self,
        entries: Vec<crate::store::StoredEntry>,
    ) -> crate::supervisor::versions::DeployPlan {
        crate::supervisor::versions::dry_run(entries, |name| {
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
    /// ([`crate::session::SessionSpec::idle_after`]); off unless set. A sleeping session costs a
    /// small entry in memory; its record holds the rest, and the next push, by-id
    /// operation, subscription or due timer wakes it. At start, sessions whose records
    /// say they sleep are registered asleep, not started (on a store this process holds
    /// alone).
    pub fn idle_after(mut self, idle: Duration) -> Self {
        self.idle_after = Some(idle);
        self
    }

    /// Sets the redaction every client-facing read goes through ([`RuntimeHandle::view`](crate::runtime::RuntimeHandle::view),
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
    /// with [`crate::session::SessionSpec::keep_events`] (every persistent session spawned over
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
        // A cluster node can hand its sessions over at shutdown (issue 18, S38), once a
        // router is installed (`RuntimeHandle::set_forwarder` sets the hand-over).
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
                hand_over: Arc::downgrade(&hand_over),
                moving: Default::default(),
                lease_timeout: self.lease_timeout,
                heartbeat: self.heartbeat,
                sweeps,
                node: self.node.is_some(),
                timer_service: Arc::default(),
                timer_clock: crate::timers::Clock::new(),
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
            let runs = crate::supervisor::versions::runs_of(&runtime.handle.kinds);
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
