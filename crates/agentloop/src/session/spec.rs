//! What a session is: [`SessionSpec`], the one description of a session's id, agent
//! kind, configuration, persistence and options, for a session started alone
//! ([`crate::session::SessionHandle::spawn`]) and for one a supervisor starts and restarts
//! ([`crate::supervisor::SupervisorHandle::spawn`]). Plain data built with chained setters; it
//! starts nothing.
//!
//! A per-session option is added here and nowhere else: the session reads it from the
//! spec, the record keeps what [`SessionSpec::recorded_settings`] names, and a resume
//! restores it through [`SessionSpec::settings`]. What the runtime, not the caller,
//! decides for a session (its supervisor, its metrics, the runtime's heartbeat and
//! limits, a record already read) sits in crate-private fields the supervisor sets.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::events::{EventFilter, DEFAULT_EVENT_CAPACITY};
use crate::session::{BufferBound, Durability, EndHook, ExitSummary, RestartPolicy};
use crate::store::lease::{DEFAULT_HEARTBEAT, DEFAULT_LEASE_TIMEOUT};

/// What to spawn: one session's id, agent kind, configuration and options.
#[derive(Clone)]
pub struct SessionSpec<I> {
    /// The session's id (1–128 bytes, no control characters).
    pub id: String,
    /// The agent kind: the name a supervisor builds the agent by, recorded so the
    /// session can be rebuilt from its record.
    pub kind: String,
    /// The agent's configuration, serialized, handed to the kind's factory (and
    /// recorded with the kind).
    pub agent_config: Vec<u8>,
    /// Whether the session loads and saves checkpoints (needs a store).
    pub persist: bool,
    /// When a persistent session writes its record (S16a).
    pub durability: Durability,
    /// When its supervisor restarts it (a session started alone never restarts; the
    /// policy is still recorded, so a supervisor that resumes the record applies it).
    pub restart: RestartPolicy,
    /// Items pushed right after the session starts, in order, before anything else:
    /// by its supervisor at each start (a restart too), or at the spawn of a session
    /// started alone.
    pub initial_items: Vec<I>,
    /// How many of its last turn-end checkpoints the session keeps beside its record
    /// (issue 13; default 0, at most [`crate::store::history::MAX_HISTORY`]): list
    /// them, read one, fork a new session from one. Needs a store and `Turn` or `Sync`
    /// durability (turn ends are written).
    pub history: usize,
    /// How many of its last events the session keeps for subscribers that reconnect
    /// after a sequence number (S20; default 0: none, and nothing is allocated). The
    /// buffer is allocated at the first event, and holds clones of the events.
    pub replay: usize,
    /// Whether the session keeps its events in the store, and for how long (S20a):
    /// a subscriber that asks for the events after a number gets them from the store
    /// when the replay buffer no longer holds them, after a restart, a crash, a move
    /// or a failover too. Needs a persistent session, a store that keeps events and
    /// an event codec (the runtime's, [`crate::runtime::RuntimeBuilder::keep_events`], or
    /// [`SessionSpec::event_codec`]). `None` (the default): none kept.
    pub events: Option<agentloop_core::event_log::Retention>,
    /// How often the session re-reads its own record while detached, so a cancel
    /// written by another process is noticed (S24); `None`: the runtime's heartbeat
    /// (a supervisor's [`SupervisorArgs::heartbeat`](crate::supervisor::SupervisorArgs::heartbeat),
    /// 10 s for a session started alone).
    pub poll_interval: Option<Duration>,
    /// The default capacity of each subscriber's event buffer.
    pub event_capacity: usize,
    /// Session-end hooks (S21), run in order after the final checkpoint and before
    /// `Ended`.
    pub end_hooks: Vec<EndHook>,
    /// The bound on each session-end hook.
    pub hook_timeout: Duration,
    /// How much the session holds before it refuses pushes (S34a); `None`: a
    /// supervisor's `[limits]`, or no bound for a session started alone.
    pub buffer_bound: Option<BufferBound>,
    /// The runtime instance that owns the session, recorded in `Running` records (a
    /// supervisor names its own instance instead).
    pub owner: Option<String>,
    /// How old an owner's heartbeat may be before its `Running` records are
    /// recoverable by another instance (S19); `None`: 30 s, or the runtime's own for
    /// the sessions it resumes.
    pub lease_timeout: Option<Duration>,
    /// How long the session stays idle (no turn, nothing buffered, nobody subscribed)
    /// before it goes to sleep (S39): its record is written, its actor exits, and the
    /// next push, by-id operation, subscription or due timer wakes it from the record.
    /// `None`: the runtime's default ([`crate::runtime::RuntimeBuilder::idle_after`]; off unless
    /// set). Only a persistent session sleeps. Kept in the record.
    pub idle_after: Option<Duration>,
    /// The stored record, when the spawner already read it (the runtime's resume, an
    /// answer, a fork). Used by one start only. (Boxed: a supervisor keeps every
    /// session's spec, and this is the largest field and almost always `None`, B2.)
    pub(crate) preloaded: Option<Box<crate::store::LoadedRecord<I>>>,
    /// Claim the record by compare-and-swap before running (issue 18, S37): on a store
    /// several instances share, two of them may resume the same record, and exactly one
    /// claim succeeds. Set by the runtime for the sessions it resumes or adopts as a
    /// cluster node.
    pub(crate) claim: bool,
    /// The runtime's own session, resumed from its record (at start, adopted from a
    /// node that died, moved here): never refused for `[limits] sessions` (S34a). A
    /// fork, an answer's resume and a wake are new live sessions and are counted
    /// (issue 52).
    pub(crate) resumed: bool,
    /// A subscriber to attach before the first incarnation's actor starts (capacity,
    /// filter), so it sees every event from the first; used once, never for a restart.
    pub(crate) subscribe: Option<(usize, EventFilter)>,
    /// What the runtime decides for this start of the session.
    pub(crate) run: RunContext,
}

/// What the runtime, not the caller, decides for one start of a session.
#[derive(Clone)]
pub(crate) struct RunContext {
    /// Whether the session loads its stored record at start (default). A supervisor
    /// turns it off when it restarts a session from the items the failed incarnation
    /// handed back, which are fresher than any record.
    pub(crate) load_record: bool,
    /// Whether a supervisor decides what a failure means (S26): a supervised detached
    /// session that fails leaves its record for the supervisor, which restarts the
    /// session from it or marks it `Failed`.
    pub(crate) supervised: bool,
    /// The poll interval when the spec names none (the supervisor's heartbeat).
    pub(crate) heartbeat: Duration,
    /// Where the session counts its turns (S35); set by the supervisor from its own.
    pub(crate) metrics: Option<Arc<crate::metrics::RuntimeMetrics>>,
    /// How the session's events are kept (an `EventCodec<E>`, S20a); set by the
    /// supervisor from the runtime's, or by [`SessionSpec::event_codec`].
    pub(crate) event_codec: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Where the turns' durable timers are told to the runtime's timer service (S39);
    /// set by the supervisor from the runtime's.
    pub(crate) timer_service: Option<crate::timers::Notify>,
    /// What its durable timers may hold (S34a).
    pub(crate) timer_bounds: crate::timers::TimerBounds,
    /// The runtime's default for [`SessionSpec::idle_after`] (S39); set by the
    /// supervisor from the runtime's.
    pub(crate) idle_after: Option<Duration>,
    /// The version of the agent kind this start runs (S40), written into every record
    /// header; chosen by the supervisor's start (`versions::choose`).
    pub(crate) agent_version: u32,
    /// The version a failed incarnation ran, for a restart from the items it handed
    /// back (no record read): the restart runs it again while it is registered.
    pub(crate) restart_version: Option<u32>,
    /// Its supervisor's restart decision, asked by the teardown so that an
    /// incarnation that will be started again ends its streams with `Restarting`, not
    /// `Ended` (S26); `None` for a session started alone.
    pub(crate) restart_oracle: Option<Arc<crate::session::restart::RestartOracle>>,
}

impl Default for RunContext {
    fn default() -> Self {
        RunContext {
            load_record: true,
            supervised: false,
            heartbeat: DEFAULT_HEARTBEAT,
            metrics: None,
            event_codec: None,
            timer_service: None,
            timer_bounds: crate::timers::TimerBounds::UNBOUNDED,
            idle_after: None,
            agent_version: agentloop_core::header::FIRST_VERSION,
            restart_version: None,
            restart_oracle: None,
        }
    }
}

impl<I> SessionSpec<I> {
    /// A non-persistent session of agent `kind` with default settings: `Sync`
    /// durability, permanent restart policy, no initial items, no history, no replay.
    pub fn new(id: impl Into<String>, kind: impl Into<String>) -> Self {
        SessionSpec {
            id: id.into(),
            kind: kind.into(),
            agent_config: Vec::new(),
            persist: false,
            durability: Durability::Sync,
            restart: RestartPolicy::Permanent,
            initial_items: Vec::new(),
            history: 0,
            replay: 0,
            events: None,
            poll_interval: None,
            event_capacity: DEFAULT_EVENT_CAPACITY,
            end_hooks: Vec::new(),
            hook_timeout: Duration::from_secs(5),
            buffer_bound: None,
            owner: None,
            lease_timeout: None,
            idle_after: None,
            preloaded: None,
            claim: false,
            resumed: false,
            subscribe: None,
            run: RunContext::default(),
        }
    }

    /// Sets the agent kind.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }

    /// Sets the serialized agent configuration.
    pub fn config(mut self, bytes: Vec<u8>) -> Self {
        self.agent_config = bytes;
        self
    }

    /// Loads and saves checkpoints.
    pub fn persistent(mut self, persist: bool) -> Self {
        self.persist = persist;
        self
    }

    /// Sets when a persistent session writes its record (default `Sync`).
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// Sets the restart policy.
    pub fn restart(mut self, policy: RestartPolicy) -> Self {
        self.restart = policy;
        self
    }

    /// Items pushed right after the start (see [`SessionSpec::initial_items`]).
    pub fn initial_items(mut self, items: Vec<I>) -> Self {
        self.initial_items = items;
        self
    }

    /// Keeps the last `capacity` events for subscribers that reconnect after a sequence
    /// number ([`crate::session::SessionHandle::subscribe_after`]).
    pub fn replay(mut self, capacity: usize) -> Self {
        self.replay = capacity;
        self
    }

    /// Keeps the session's events in the store under `retention` (see
    /// [`SessionSpec::events`]).
    pub fn keep_events(mut self, retention: agentloop_core::event_log::Retention) -> Self {
        self.events = Some(retention);
        self
    }

    /// How this session's events (of type `E`) are written to the store when it keeps
    /// them; a supervisor's session takes the runtime's
    /// ([`crate::runtime::RuntimeBuilder::keep_events`]) when it has none.
    pub fn event_codec<E: 'static>(mut self, codec: crate::events::EventCodec<E>) -> Self {
        self.run.event_codec = Some(Arc::new(codec));
        self
    }

    /// Keeps the last `n` turn-end checkpoints (see [`SessionSpec::history`]).
    pub fn history(mut self, n: usize) -> Self {
        self.history = n;
        self
    }

    /// How often the session re-reads its own record while detached, so a cancel
    /// written by another process is noticed within this interval (S24).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = Some(every);
        self
    }

    /// Sets the default subscriber buffer capacity (at least 1).
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity.max(1);
        self
    }

    /// Adds a session-end hook (S21).
    pub fn on_end<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(ExitSummary) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
    {
        self.end_hooks.push(Arc::new(move |s| {
            Box::pin(hook(s)) as BoxFuture<'static, _>
        }));
        self
    }

    /// Sets the bound on each session-end hook.
    pub fn hook_timeout(mut self, d: Duration) -> Self {
        self.hook_timeout = d;
        self
    }

    /// Refuses pushes while the session holds `bound.items` items or its items'
    /// stored bytes would pass `bound.bytes` (S34a).
    pub fn buffer_bound(mut self, bound: BufferBound) -> Self {
        self.buffer_bound = Some(bound);
        self
    }

    /// Names the runtime instance that owns the session.
    pub fn owner(mut self, instance: impl Into<String>) -> Self {
        self.owner = Some(instance.into());
        self
    }

    /// Sets the lease timeout used to judge other owners' heartbeats (S19).
    pub fn lease_timeout(mut self, d: Duration) -> Self {
        self.lease_timeout = Some(d);
        self
    }

    /// Puts the session to sleep after `idle` without a turn, a buffered item or a
    /// subscriber (see [`SessionSpec::idle_after`], S39).
    pub fn idle_after(mut self, idle: Duration) -> Self {
        self.idle_after = Some(idle);
        self
    }

    /// Applies the settings a record kept (issue 28): durability, history, replay,
    /// restart policy and, when it was set, the poll interval.
    pub fn settings(mut self, s: crate::session::SessionSettings) -> Self {
        self.events = s.events;
        self.durability = s.durability;
        self.history = s.history;
        self.replay = s.replay;
        self.restart = s.restart;
        self.poll_interval = s.poll_interval();
        self.idle_after = s.idle_after();
        self
    }

    /// The settings this spec gives its session, as its record keeps them.
    pub fn recorded_settings(&self) -> crate::session::SessionSettings {
        crate::session::SessionSettings {
            durability: self.durability,
            history: self.history,
            replay: self.replay,
            restart: self.restart,
            poll_interval_ms: self.poll_interval.map(|d| d.as_millis() as u64),
            events: self.events,
            idle_after_ms: self.idle_after.map(|d| d.as_millis() as u64),
        }
    }

    /// Whether the session has what its record cannot restore (end hooks, a buffer
    /// bound, an event codec, a subscriber capacity or hook timeout, an owner of its
    /// own): a sleeping session's supervisor then keeps the spec (S39). (A lease timeout
    /// only judges another owner's record at a load; a woken session's record is its
    /// supervisor's, so a resumed session, which carries the runtime's, is not kept.)
    pub(crate) fn needs_keeping(&self) -> bool {
        !self.end_hooks.is_empty()
            || self.buffer_bound.is_some()
            || self.run.event_codec.is_some()
            || self.event_capacity != DEFAULT_EVENT_CAPACITY
            || self.hook_timeout != Duration::from_secs(5)
            || self.owner.is_some()
    }

    /// How often the session re-reads its record while detached: its own interval, or
    /// the runtime's heartbeat.
    pub(crate) fn effective_poll_interval(&self) -> Duration {
        self.poll_interval.unwrap_or(self.run.heartbeat)
    }

    /// The lease timeout the session judges a `Running` record's owner by.
    pub(crate) fn effective_lease_timeout(&self) -> Duration {
        self.lease_timeout.unwrap_or(DEFAULT_LEASE_TIMEOUT)
    }

    /// What one start of the session takes from the spec: everything but the initial
    /// items (a supervisor pushes them) and the record read beforehand (taken by the
    /// start that uses it); the spec itself stays with the supervisor for restarts.
    pub(crate) fn incarnation(&self) -> SessionSpec<I> {
        SessionSpec {
            id: self.id.clone(),
            kind: self.kind.clone(),
            agent_config: self.agent_config.clone(),
            persist: self.persist,
            durability: self.durability,
            restart: self.restart,
            initial_items: Vec::new(),
            history: self.history,
            replay: self.replay,
            events: self.events,
            poll_interval: self.poll_interval,
            event_capacity: self.event_capacity,
            end_hooks: self.end_hooks.clone(),
            hook_timeout: self.hook_timeout,
            buffer_bound: self.buffer_bound,
            owner: self.owner.clone(),
            lease_timeout: self.lease_timeout,
            idle_after: self.idle_after,
            preloaded: None,
            claim: self.claim,
            resumed: self.resumed,
            subscribe: self.subscribe,
            run: self.run.clone(),
        }
    }

    /// The spec that resumes a stored record: persistent, with the settings the record
    /// kept (issue 28: durability, history, replay, restart policy, poll interval), or
    /// at `durability` with the defaults for a record written before settings were
    /// kept; the session uses this record instead of loading it again, judges its
    /// owner's lease by `lease_timeout` as the runtime did (S19), and claims it first
    /// when `claim` (a cluster node).
    pub(crate) fn resuming(
        rec: crate::store::LoadedRecord<I>,
        durability: Durability,
        lease_timeout: Duration,
        claim: bool,
    ) -> Self {
        let mut spec = SessionSpec::from_header(&rec.header, durability, lease_timeout);
        spec.preloaded = Some(Box::new(rec));
        spec.claim = claim;
        spec.resumed = true;
        spec
    }

    /// The spec a record's header describes (its id, kind, configuration and settings;
    /// `durability` for a record written before settings were kept); the session loads
    /// the record itself.
    pub(crate) fn from_header(
        h: &crate::store::RecordHeader,
        durability: Durability,
        lease_timeout: Duration,
    ) -> Self {
        let spec = SessionSpec::new(h.session_id.clone(), h.agent_kind.clone())
            .config(h.agent_config.clone())
            .persistent(true)
            .lease_timeout(lease_timeout);
        match h.settings {
            Some(s) => spec.settings(s),
            None => spec.durability(durability),
        }
    }
}

impl<I> fmt::Debug for SessionSpec<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionSpec")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("persist", &self.persist)
            .field("durability", &self.durability)
            .field("restart", &self.restart)
            .field("initial_items", &self.initial_items.len())
            .field("history", &self.history)
            .field("replay", &self.replay)
            .field("event_capacity", &self.event_capacity)
            .field("end_hooks", &self.end_hooks.len())
            .field("owner", &self.owner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One datum, one place: what the record keeps is what a resume restores.
    #[test]
    fn recorded_settings_round_trip_through_a_resume() {
        let spec = SessionSpec::<u32>::new("a", "k")
            .durability(Durability::Turn)
            .history(3)
            .replay(7)
            .restart(RestartPolicy::Transient)
            .poll_interval(Duration::from_millis(250))
            .idle_after(Duration::from_secs(90));
        let kept = spec.recorded_settings();
        let back = SessionSpec::<u32>::new("a", "k").settings(kept);
        assert_eq!(back.recorded_settings(), kept);
        assert_eq!(back.effective_poll_interval(), Duration::from_millis(250));
    }

    /// S39: a session rebuilt from its record (resumed, adopted, woken) is not kept in
    /// memory while it sleeps; one with end hooks is.
    #[test]
    fn only_what_a_record_cannot_restore_is_kept_while_asleep() {
        let h = crate::store::RecordHeader {
            session_id: "a".into(),
            agent_kind: "k".into(),
            settings: Some(Default::default()),
            ..Default::default()
        };
        let resumed = SessionSpec::<u32>::from_header(&h, Durability::Sync, Duration::from_secs(3));
        assert!(!resumed.needs_keeping());
        assert!(!SessionSpec::<u32>::new("a", "k")
            .persistent(true)
            .needs_keeping());
        let hooked = SessionSpec::<u32>::new("a", "k").on_end(|_| async { Ok(()) });
        assert!(hooked.needs_keeping());
        assert!(SessionSpec::<u32>::new("a", "k")
            .buffer_bound(crate::session::BufferBound::UNBOUNDED)
            .needs_keeping());
    }

    /// A start takes neither the seed items nor the preloaded record with it.
    #[test]
    fn an_incarnation_leaves_the_seed_items_with_the_supervisor() {
        let mut spec = SessionSpec::<u32>::new("a", "k").initial_items(vec![1, 2]);
        spec.run.heartbeat = Duration::from_secs(2);
        let inc = spec.incarnation();
        assert!(inc.initial_items.is_empty());
        assert_eq!(spec.initial_items, vec![1, 2]);
        assert_eq!(inc.effective_poll_interval(), Duration::from_secs(2));
        assert_eq!(inc.effective_lease_timeout(), DEFAULT_LEASE_TIMEOUT);
    }
}
