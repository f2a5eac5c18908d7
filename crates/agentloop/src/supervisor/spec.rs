//! What to spawn: [`SessionSpec`], a session's id, agent kind, configuration,
//! persistence and options, built with chained setters. Plain data.

use crate::events::EventFilter;
use crate::session::{Durability, RestartPolicy};
use std::fmt;
use std::time::Duration;

/// What to spawn.
#[derive(Clone)]
pub struct SessionSpec<I> {
    /// The session's id.
    pub id: String,
    /// The registered agent kind.
    pub kind: String,
    /// The agent's configuration, serialized, handed to the kind's factory.
    pub agent_config: Vec<u8>,
    /// Whether the session loads and saves checkpoints (needs the supervisor's store).
    pub persist: bool,
    /// When a persistent session writes its record.
    pub durability: Durability,
    /// When to restart it.
    pub restart: RestartPolicy,
    /// Items to push right after it starts, in order.
    pub initial_items: Vec<I>,
    /// How many turn-end checkpoints to keep (see [`SessionConfig::history`](crate::session::SessionConfig::history)).
    pub history: usize,
    /// How many recent events to keep for subscribers that reconnect after a sequence
    /// number (see [`SessionConfig::replay`](crate::session::SessionConfig::replay)).
    pub replay: usize,
    /// The stored record, when the spawner already read it (the runtime's resume).
    /// (Boxed: the supervisor keeps every session's spec, and this is the largest field
    /// and almost always `None`, B2.)
    pub(crate) preloaded: Option<Box<crate::store::LoadedRecord<I>>>,
    /// The lease timeout the session judges a `Running` record's owner by (S19), when
    /// not the default: the runtime's configured one for the sessions it resumes, so
    /// the session agrees with the runtime that the owner is gone.
    pub(crate) lease_timeout: Option<Duration>,
    /// Claim the record by compare-and-swap before running (a cluster node's resume,
    /// issue 18; [`SessionConfig`](crate::session::SessionConfig)'s `claim`).
    pub(crate) claim: bool,
    /// How often this session re-reads its record while detached (S24), when not the
    /// supervisor's heartbeat ([`SupervisorArgs::heartbeat`](super::SupervisorArgs::heartbeat)).
    pub(crate) poll_interval: Option<Duration>,
    /// A subscriber to attach before the first incarnation's actor starts (capacity,
    /// filter); used once, never for a restart.
    pub(crate) subscribe: Option<(usize, EventFilter)>,
}

impl<I> SessionSpec<I> {
    /// A non-persistent session of `kind`, permanent restart policy, no initial items.
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
            preloaded: None,
            lease_timeout: None,
            claim: false,
            poll_interval: None,
            subscribe: None,
        }
    }

    /// How often the session re-reads its own record while detached, so a cancel
    /// written by another process is noticed within this interval (S24). Defaults to
    /// the supervisor's heartbeat ([`SupervisorArgs::heartbeat`](super::SupervisorArgs::heartbeat)).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = Some(every);
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

    /// Sets the durability mode.
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// Sets the restart policy.
    pub fn restart(mut self, policy: RestartPolicy) -> Self {
        self.restart = policy;
        self
    }

    /// Items to push right after the start.
    pub fn initial_items(mut self, items: Vec<I>) -> Self {
        self.initial_items = items;
        self
    }

    /// Keeps the last `capacity` events for reconnecting subscribers (see
    /// [`SessionConfig::replay`](crate::session::SessionConfig::replay)).
    pub fn replay(mut self, capacity: usize) -> Self {
        self.replay = capacity;
        self
    }

    /// Keeps the last `n` turn-end checkpoints (see [`SessionConfig::history`](crate::session::SessionConfig::history)).
    pub fn history(mut self, n: usize) -> Self {
        self.history = n;
        self
    }

    /// Applies the settings a record kept (issue 28): durability, history, replay,
    /// restart policy and, when it was set, the poll interval.
    pub fn settings(mut self, s: crate::session::SessionSettings) -> Self {
        self.durability = s.durability;
        self.history = s.history;
        self.replay = s.replay;
        self.restart = s.restart;
        self.poll_interval = s.poll_interval();
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
            .finish()
    }
}

impl<I> SessionSpec<I> {
    /// The spec that resumes a stored record: persistent, with the settings the record kept
    /// (issue 28: durability, history, replay, restart policy, poll interval), or at
    /// `durability` with the defaults for a record written before settings were kept; the
    /// session uses this record instead of loading it again, judges its owner's lease by
    /// `lease_timeout` as the runtime did (S19), and claims it first when `claim` (a
    /// cluster node).
    pub(crate) fn resuming(
        rec: crate::store::LoadedRecord<I>,
        durability: Durability,
        lease_timeout: Duration,
        claim: bool,
    ) -> Self {
        let h = &rec.header;
        let spec = SessionSpec::new(h.session_id.clone(), h.agent_kind.clone())
            .config(h.agent_config.clone())
            .persistent(true);
        let mut spec = match h.settings {
            Some(s) => spec.settings(s),
            None => spec.durability(durability),
        };
        spec.preloaded = Some(Box::new(rec));
        spec.lease_timeout = Some(lease_timeout);
        spec.claim = claim;
        spec
    }
}
