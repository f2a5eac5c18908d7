//! How one session is configured: its id, agent kind, persistence, event buffer and
//! session-end hooks (DESIGN S21, S32).
//!
//! Session ids are validated in `crate::ids`; this module does not start anything.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::events::DEFAULT_EVENT_CAPACITY;
use crate::session::ExitSummary;

pub use crate::ids::{validate_session_id, SessionIdError, MAX_SESSION_ID_LEN};

/// A session-end hook (S21): runs after the final checkpoint and before `Ended`, bounded
/// by [`SessionConfig::hook_timeout`] and isolated from the other hooks (a failing,
/// panicking or hanging hook does not stop the next one).
pub type EndHook = Arc<dyn Fn(ExitSummary) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// When a persistent session writes its record (S16a).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Only at exit (S16): cheapest; a crash loses what the process held.
    Exit,
    /// At every turn end and at exit: each completed turn is durable, and
    /// `TurnEnded { durable: true }` is sent only once the write holding it is flushed.
    /// Pushes are acknowledged at once (a crash loses the items accepted since the last
    /// turn end, and a running turn restarts from its items, not a safe point).
    Turn,
    /// Also whenever an item is accepted and whenever a turn ends or reaches a safe
    /// point, group-committed; `push` is acknowledged only after the write that holds
    /// the item is flushed, and `TurnEnded { durable: true }` is sent only after the
    /// write holding the turn's end is. A SIGKILL at any moment loses no acknowledged
    /// item.
    #[default]
    Sync,
}

/// The configuration of one session.
#[derive(Clone)]
pub struct SessionConfig {
    /// The session's id (1–128 bytes, no control characters).
    pub id: String,
    /// The agent kind (recorded so the session can be rebuilt from its record).
    pub agent_kind: String,
    /// The agent's serialized configuration (recorded with the kind).
    pub agent_config: Vec<u8>,
    /// Whether the session loads and saves checkpoints (needs a store).
    pub persist: bool,
    /// The default capacity of each subscriber's event buffer.
    pub event_capacity: usize,
    /// How many of its last turn-end checkpoints the session keeps beside its record
    /// (issue 13; default 0, at most [`crate::store::history::MAX_HISTORY`]): list them,
    /// read one, fork a new session from one. Needs a store and `Turn` or `Sync`
    /// durability (turn ends are written).
    pub history: usize,
    /// How many of its last events the session keeps for subscribers that reconnect
    /// after a sequence number (S20; default 0: none, and nothing is allocated). The
    /// buffer is allocated at the first event, and holds clones of the events.
    pub replay_capacity: usize,
    /// Session-end hooks, run in order.
    pub end_hooks: Vec<EndHook>,
    /// The bound on each hook.
    pub hook_timeout: Duration,
    /// When a persistent session writes its record.
    pub durability: Durability,
    /// The runtime instance that owns the session (recorded in `Running` records).
    pub owner: Option<String>,
    /// How old an owner's heartbeat may be before its `Running` records are
    /// recoverable by another instance (S19).
    pub lease_timeout: Duration,
    /// Whether a persistent session loads its stored record at start (default). The
    /// supervisor turns it off when it restarts a session from the items the failed
    /// incarnation handed back, which are fresher than any record.
    pub load_record: bool,
    /// Whether the session claims a record another instance owned by compare-and-swap
    /// before it runs (issue 18, S37): on a store several instances share, two of them
    /// may resume the same record, and exactly one claim succeeds. Set by the runtime
    /// for the sessions it resumes or adopts as a cluster node.
    pub(crate) claim: bool,
    /// How often a detached (background) session re-reads its own record, so a cancel
    /// written by another process is honoured (S24).
    pub poll_interval: Duration,
    /// Whether a supervisor decides what a failure means (set by the supervisor, S26):
    /// a supervised detached session that fails leaves its record for the supervisor,
    /// which restarts the session from it or marks it `Failed`.
    pub supervised: bool,
    /// A subscriber registered before the session's actor starts (capacity, filter),
    /// so it sees every event from the first (a resume turn's `TurnStarted` included).
    /// Set by [`crate::SessionHandle::spawn_subscribed`] and the supervisor's
    /// [`crate::SupervisorHandle::spawn_subscribed`], which take the stream at once.
    pub(crate) subscribe_at_spawn: Option<(usize, crate::events::EventFilter)>,
    /// Where the session counts its turns (S35); set by the supervisor from its own.
    pub(crate) metrics: Option<std::sync::Arc<crate::metrics::RuntimeMetrics>>,
    /// The restart policy its supervisor applies, kept in the record so a resume
    /// restores it (issue 28); the session itself never restarts.
    pub(crate) restart: crate::session::RestartPolicy,
    /// `poll_interval`, when it was set for this session rather than taken from the
    /// runtime's heartbeat: kept in the record so a resume restores it (issue 28).
    pub(crate) own_poll_interval: Option<Duration>,
    /// How much the session holds before it refuses pushes (S34a); unbounded unless
    /// set (a supervisor sets its runtime's `[limits]`).
    pub buffer_bound: BufferBound,
}

/// How many items, and how many bytes of them, a session holds (waiting for a turn or
/// in one) before it refuses a push with [`crate::PushError::Full`] (S34a). Bytes are
/// the items' stored encoding, so the byte bound applies to persistent sessions; a
/// session without a store is bounded by its item count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferBound {
    /// Items held at most.
    pub items: usize,
    /// Stored bytes of the held items at most.
    pub bytes: usize,
}

impl BufferBound {
    /// No bound (a session embedded in-process, where the caller is trusted).
    pub const UNBOUNDED: BufferBound = BufferBound {
        items: usize::MAX,
        bytes: usize::MAX,
    };
}

impl Default for BufferBound {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}

impl fmt::Debug for SessionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionConfig")
            .field("id", &self.id)
            .field("agent_kind", &self.agent_kind)
            .field("persist", &self.persist)
            .field("event_capacity", &self.event_capacity)
            .field("replay_capacity", &self.replay_capacity)
            .field("end_hooks", &self.end_hooks.len())
            .field("hook_timeout", &self.hook_timeout)
            .field("durability", &self.durability)
            .field("owner", &self.owner)
            .finish()
    }
}

impl SessionConfig {
    /// A non-persistent session with default settings.
    pub fn new(id: impl Into<String>) -> Self {
        SessionConfig {
            id: id.into(),
            agent_kind: "default".into(),
            agent_config: Vec::new(),
            persist: false,
            event_capacity: DEFAULT_EVENT_CAPACITY,
            replay_capacity: 0,
            history: 0,
            end_hooks: Vec::new(),
            hook_timeout: Duration::from_secs(5),
            durability: Durability::Sync,
            owner: None,
            lease_timeout: crate::store::lease::DEFAULT_LEASE_TIMEOUT,
            load_record: true,
            claim: false,
            poll_interval: crate::store::lease::DEFAULT_HEARTBEAT,
            supervised: false,
            subscribe_at_spawn: None,
            metrics: None,
            restart: crate::session::RestartPolicy::Permanent,
            own_poll_interval: None,
            buffer_bound: BufferBound::UNBOUNDED,
        }
    }

    /// Refuses pushes while the session holds `bound.items` items or its items'
    /// stored bytes would pass `bound.bytes` (S34a).
    pub fn buffer_bound(mut self, bound: BufferBound) -> Self {
        self.buffer_bound = bound;
        self
    }

    /// The settings this session's record keeps (issue 28), restored when it is
    /// rebuilt from the record.
    pub fn settings(&self) -> crate::session::SessionSettings {
        crate::session::SessionSettings {
            durability: self.durability,
            history: self.history,
            replay: self.replay_capacity,
            restart: self.restart,
            poll_interval_ms: self.own_poll_interval.map(|d| d.as_millis() as u64),
        }
    }

    /// Sets when a persistent session writes its record (default `Sync`).
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// Names the runtime instance that owns the session.
    pub fn owner(mut self, instance: impl Into<String>) -> Self {
        self.owner = Some(instance.into());
        self
    }

    /// Sets the lease timeout used to judge other owners' heartbeats.
    pub fn lease_timeout(mut self, d: Duration) -> Self {
        self.lease_timeout = d;
        self
    }

    /// Sets the agent kind.
    pub fn agent_kind(mut self, kind: impl Into<String>) -> Self {
        self.agent_kind = kind.into();
        self
    }

    /// Loads and saves checkpoints.
    pub fn persistent(mut self, persist: bool) -> Self {
        self.persist = persist;
        self
    }

    /// Sets the default subscriber buffer capacity.
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity.max(1);
        self
    }

    /// Keeps the session's last `capacity` events for subscribers that reconnect after
    /// a sequence number ([`crate::SessionHandle::subscribe_after`]).
    pub fn replay(mut self, capacity: usize) -> Self {
        self.replay_capacity = capacity;
        self
    }

    /// Keeps the last `n` turn-end checkpoints (see [`SessionConfig::history`]).
    pub fn history(mut self, n: usize) -> Self {
        self.history = n;
        self
    }

    /// Adds a session-end hook.
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
}
