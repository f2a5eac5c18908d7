//! The SessionSupervisor: spawns sessions by message, keeps the registry of live
//! sessions, routes requests by id, and restarts failed sessions under a restart policy
//! and budget (DESIGN S25, S26).
//!
//! It owns the registry and the agent kinds (named factories, so a session can be
//! rebuilt from its record after a restart or a crash). Sessions are its linked
//! children: it overrides ractor's default supervision (which would stop the supervisor
//! when any child exits) and learns of every end from the child's exit state. It never
//! runs agent code and never stops a session with ractor's `stop()`: stops are in-band
//! `Stop` messages.
//!
//! Restart (S26): a session that ended `Failed` is restarted when its policy allows and
//! its budget (at most `max_restarts` in `window`) is not spent. A `sync`-persistent
//! session restarts from its last durable record; any other session restarts from what
//! the failed incarnation handed back (its interrupted, then unhandled items), without
//! loading a record. A push the supervisor routes to an incarnation that has just ended
//! triggers the restart first and goes to the new incarnation, so messages that arrive
//! while a session restarts are delivered to it, not bounced. Past the budget the
//! session stays ended `Failed` (its record is marked `Failed`) and leaves the registry.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::agent::Agent;
use crate::error::{SessionError, SpawnError};
use crate::events::{EventFilter, EventStream};
use crate::options::{PushOptions, StopOptions};
use crate::session::{
    validate_session_id, BoundClient, Durability, ExitReason, ExitState, FailureKind, PreemptAck,
    PushError, SessionConfig, SessionHandle, SessionIdError, SessionInfo,
};
use crate::store::{CheckpointStore, SessionStatus, StatusKind};

pub use crate::session::RestartPolicy;

mod directory;

use directory::Directory;

/// At most `max_restarts` restarts within `window` (OTP's intensity and period).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartBudget {
    /// Restarts allowed within the window.
    pub max_restarts: u32,
    /// The window.
    pub window: Duration,
}

impl Default for RestartBudget {
    /// 3 restarts per 60 s.
    fn default() -> Self {
        RestartBudget {
            max_restarts: 3,
            window: Duration::from_secs(60),
        }
    }
}

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
    /// How many turn-end checkpoints to keep (see [`SessionConfig::history`]).
    pub history: usize,
    /// How many recent events to keep for subscribers that reconnect after a sequence
    /// number (see [`SessionConfig::replay`]).
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
    /// issue 18; [`SessionConfig`]'s `claim`).
    pub(crate) claim: bool,
    /// How often this session re-reads its record while detached (S24), when not the
    /// supervisor's heartbeat ([`SupervisorArgs::heartbeat`]).
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
    /// the supervisor's heartbeat ([`SupervisorArgs::heartbeat`]).
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
    /// [`SessionConfig::replay`]).
    pub fn replay(mut self, capacity: usize) -> Self {
        self.replay = capacity;
        self
    }

    /// Keeps the last `n` turn-end checkpoints (see [`SessionConfig::history`]).
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

/// A supervisor request that could not be served. Every variant says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The id is invalid.
    #[error("invalid session id: {0}")]
    InvalidId(#[from] SessionIdError),
    /// A live session already has this id.
    #[error("a session with id `{0}` is already running; pick another id or stop it first")]
    Duplicate(String),
    /// The session runs: the operation needs it stopped.
    #[error("session `{0}` is running; stop it first, then retry")]
    Running(String),
    /// No live session has this id.
    #[error("no live session has id `{0}`; list sessions to see the live ones")]
    UnknownSession(String),
    /// No agent kind is registered under this name.
    #[error("no agent kind named `{kind}` is registered (known: {known}); register it when building the runtime")]
    UnknownKind {
        /// The kind asked for.
        kind: String,
        /// The registered kinds.
        known: String,
    },
    /// The kind's factory refused the configuration.
    #[error("agent kind `{kind}` refused its configuration: {reason}")]
    BadConfig {
        /// The kind.
        kind: String,
        /// Why.
        reason: String,
    },
    /// A [`SupervisorMsg::SpawnBatch`] carried more specs than [`MAX_SPAWN_BATCH`].
    #[error("a spawn batch carried {len} specs, more than the {max} one message may carry; split it (SupervisorHandle::spawn_batch does) and send the specs again")]
    BatchTooLarge {
        /// How many specs the batch carried.
        len: usize,
        /// The most one batch may carry.
        max: usize,
    },
    /// The runtime runs as many sessions as its bound allows (S34a, `[limits]
    /// sessions`): nothing was spawned.
    #[error("`{id}` was not spawned: this runtime already runs {max} sessions, its bound ([limits] sessions); retry once some have ended, or raise the bound")]
    TooManySessions {
        /// The id asked for.
        id: String,
        /// The bound.
        max: usize,
    },
    /// The runtime is shutting down: the drain gate refuses new sessions (S27).
    #[error("the runtime is shutting down and accepts no new sessions (`{0}` was not spawned); spawn it on the next start")]
    ShuttingDown(String),
    /// A persistent session was asked for but the supervisor has no store.
    #[error("session `{0}` is persistent but the supervisor has no checkpoint store; build the runtime with a store or spawn it non-persistent")]
    NoStore(String),
    /// Spawning failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The session refused the request.
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// A registered agent kind: builds the agent from its serialized configuration and
/// spawns its session. Implemented for closures by [`agent_kind`].
pub trait AgentKind<I, E>: Send + Sync + 'static {
    /// Builds the agent and spawns its session linked under `supervisor`.
    fn spawn(
        &self,
        config: SessionConfig,
        agent_config: &[u8],
        store: Option<Arc<dyn CheckpointStore<I>>>,
        supervisor: ActorCell,
        record: Option<crate::store::LoadedRecord<I>>,
    ) -> BoxFuture<'static, Result<SessionHandle<I, E>, SupervisorError>>;
}

struct FnKind<F>(F, String);

impl<A, F> AgentKind<A::Item, A::Event> for FnKind<F>
where
    A: Agent,
    F: Fn(&[u8]) -> Result<A, String> + Send + Sync + 'static,
{
    fn spawn(
        &self,
        config: SessionConfig,
        agent_config: &[u8],
        store: Option<Arc<dyn CheckpointStore<A::Item>>>,
        supervisor: ActorCell,
        record: Option<crate::store::LoadedRecord<A::Item>>,
    ) -> BoxFuture<'static, Result<SessionHandle<A::Item, A::Event>, SupervisorError>> {
        let agent = (self.0)(agent_config).map_err(|reason| SupervisorError::BadConfig {
            kind: self.1.clone(),
            reason,
        });
        Box::pin(async move {
            let agent = Arc::new(agent?);
            Ok(
                SessionHandle::spawn_linked_with_record(config, agent, store, supervisor, record)
                    .await?,
            )
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

/// One line of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    /// The session's id.
    pub id: String,
    /// Its agent kind.
    pub kind: String,
    /// How many times it was restarted.
    pub restarts: u32,
}

/// How many sessions of one batch start at once (see `spawn_batch`).
const SPAWN_OVERLAP: usize = 32;

/// A session's start, resolved but not begun: everything its agent kind needs.
struct Prepared<I, E> {
    kind: Arc<dyn AgentKind<I, E>>,
    config: SessionConfig,
    store: Option<Arc<dyn CheckpointStore<I>>>,
    supervisor: ActorCell,
    record: Option<crate::store::LoadedRecord<I>>,
}

impl<I: 'static, E: 'static> Prepared<I, E> {
    /// Begins the start: the kind builds the agent and spawns the session's actor.
    fn start(self) -> BoxFuture<'static, Result<SessionHandle<I, E>, SupervisorError>> {
        let agent_config = self.config.agent_config.clone();
        self.kind.spawn(
            self.config,
            &agent_config,
            self.store,
            self.supervisor,
            self.record,
        )
    }
}

/// The most specs one [`SupervisorMsg::SpawnBatch`] may carry: a bound on the time the
/// supervisor spends on one message (other requests wait behind it) and on the reply's
/// size. [`SupervisorHandle::spawn_batch`] splits a longer list into batches of this
/// size.
pub const MAX_SPAWN_BATCH: usize = 1000;

/// The answer to a batch spawn: one result per spec, in the order of the specs.
pub type BatchSpawn<I, E> = Vec<Result<SessionHandle<I, E>, SupervisorError>>;

/// The answer to a subscribed spawn: the session's handle and its event stream.
pub type SubscribedSpawn<I, E> = Result<(SessionHandle<I, E>, EventStream<E>), SupervisorError>;

/// Messages of the SessionSupervisor (public: other actors may `cast!` / `call!` it).
pub enum SupervisorMsg<I, E> {
    /// Spawn a session (S25).
    Spawn {
        /// What to spawn (boxed: specs are large next to the other messages).
        spec: Box<SessionSpec<I>>,
        /// Where to answer.
        reply: RpcReplyPort<Result<SessionHandle<I, E>, SupervisorError>>,
    },
    /// Spawn up to [`MAX_SPAWN_BATCH`] sessions with one request and one reply (S25):
    /// each spec is checked as a single spawn would be and answered in order; the
    /// sessions' actors start concurrently. A longer batch is refused whole with
    /// [`SupervisorError::BatchTooLarge`] (its specs, and any initial items in them, are
    /// dropped with a WARN: split it, as [`SupervisorHandle::spawn_batch`] does).
    SpawnBatch {
        /// What to spawn.
        specs: Vec<SessionSpec<I>>,
        /// Where to answer: one result per spec.
        reply: RpcReplyPort<Result<BatchSpawn<I, E>, SupervisorError>>,
    },
    /// Spawn a session with a subscriber attached before its actor starts, so the
    /// stream sees every event from the first (a resume turn's `TurnStarted` too).
    SpawnSubscribed {
        /// What to spawn.
        spec: Box<SessionSpec<I>>,
        /// The stream's buffer size (backpressure, S20).
        capacity: usize,
        /// Which events the stream receives.
        filter: EventFilter,
        /// Where to answer: the handle and the stream.
        reply: RpcReplyPort<SubscribedSpawn<I, E>>,
    },
    /// Push to a session by id. Rejections come back in the reply with the item.
    Push {
        /// The session.
        id: String,
        /// The item.
        item: I,
        /// Preempt options.
        options: PushOptions<I>,
        /// Where to answer.
        reply: RpcReplyPort<Result<PreemptAck, RoutedPushError<I>>>,
    },
    /// Stop a session by id (an in-band Stop; never ractor's stop).
    Stop {
        /// The session.
        id: String,
        /// What kind of stop.
        options: StopOptions,
        /// Where to answer.
        reply: RpcReplyPort<Result<(), SupervisorError>>,
    },
    /// Subscribe to a session's current incarnation.
    Subscribe {
        /// The session.
        id: String,
        /// Buffer capacity.
        capacity: usize,
        /// Which events.
        filter: EventFilter,
        /// Where to answer.
        reply: RpcReplyPort<Result<EventStream<E>, SupervisorError>>,
    },
    /// Subscribe to a session's events after sequence number `after` (the replay
    /// buffer first, with a `Lagged` marker when some are gone, then live).
    SubscribeAfter {
        /// The session.
        id: String,
        /// The last sequence number the client has.
        after: u64,
        /// Buffer capacity.
        capacity: usize,
        /// Which events.
        filter: EventFilter,
        /// Where to answer.
        reply: RpcReplyPort<Result<EventStream<E>, SupervisorError>>,
    },
    /// Inspect a session by id.
    Inspect {
        /// The session.
        id: String,
        /// Where to answer.
        reply: RpcReplyPort<Result<SessionInfo, SupervisorError>>,
    },
    /// List live sessions.
    List {
        /// Where to answer.
        reply: RpcReplyPort<Vec<SessionSummary>>,
    },
    /// Attach a client by id (S22): bound (its disconnect before a detach cancels the
    /// session's work, Immediate) or an observer (events only).
    Attach {
        /// The session.
        id: String,
        /// Bound or observer.
        mode: AttachMode,
        /// Which events.
        filter: EventFilter,
        /// Where to answer.
        reply: RpcReplyPort<Result<Attachment<E>, SupervisorError>>,
    },
    /// Detach a session by id (S23).
    Detach {
        /// The session.
        id: String,
        /// Where to answer.
        reply: RpcReplyPort<Result<(), SupervisorError>>,
    },
    /// Cancel a session by id (S24): flips a `Running` record to `Canceled` atomically
    /// and stops the live session Immediate; on a terminal record it changes nothing.
    /// Answers the record's status afterwards.
    Cancel {
        /// The session.
        id: String,
        /// Where to answer.
        reply: RpcReplyPort<Result<SessionStatus, SupervisorError>>,
    },
    /// Stop every session with an in-band Stop (never ractor's stop: queued pushes are
    /// answered, as unhandled or late, never dropped) and answer with their exit states
    /// once all have ended. No session is restarted from then on.
    StopAll {
        /// The stop to send to each.
        options: StopOptions,
        /// Where to answer.
        reply: RpcReplyPort<Vec<ExitState<I>>>,
    },
    /// Open a feed of session ends (see [`SessionEnd`]): from now on, every session
    /// that leaves the registry for good is reported on it with its final exit state.
    WatchEnds {
        /// Where to send the ends (a cast: requests sent after it are served after it).
        feed: mpsc::UnboundedSender<SessionEnd<I>>,
    },
    /// Messages the runtime sends itself (the shutdown coordinator's gate, a routed
    /// push's retry, an answer's claim): opaque outside the crate.
    Internal(SupervisorInternal<I, E>),
}

// A local message: it carries replies and closures, so it never crosses nodes (with the
// `cluster` feature ractor needs the impl; `local_message!`).
#[cfg(feature = "cluster")]
impl<I: Send + Sync + 'static, E: Send + Sync + 'static> ractor::Message for SupervisorMsg<I, E> {}

/// An internal supervisor message (opaque outside the crate).
pub struct SupervisorInternal<I, E>(pub(crate) InternalMsg<I, E>);

/// The supervisor's internal messages.
pub(crate) enum InternalMsg<I, E> {
    /// Close the drain gate for a shutdown (S27): from now on spawns are refused with
    /// SupervisorError::ShuttingDown, routed pushes are rejected as late items
    /// (handed back and counted), and no session is restarted. Answers with every live
    /// session, for the shutdown coordinator to stop.
    CloseGate {
        /// Where to answer.
        reply: RpcReplyPort<ClosedGate<I, E>>,
    },
    /// A routed push found its incarnation ended and must be retried.
    Reroute(Reroute<I>),
    /// What a caller needs to work on a stored record outside the supervisor's mailbox
    /// (an answer's claim): the store, the owner and the kinds.
    RecordContext {
        /// Where to answer.
        reply: RpcReplyPort<RecordContext<I>>,
    },
}

impl<I, E> From<InternalMsg<I, E>> for SupervisorMsg<I, E> {
    fn from(m: InternalMsg<I, E>) -> Self {
        SupervisorMsg::Internal(SupervisorInternal(m))
    }
}

/// A session that left the supervisor's registry for good: it was stopped, completed,
/// canceled, ended by a shutdown, or failed without (or past) a restart. Its final
/// exit state holds every item it still had (S10: unhandled, interrupted, late), so a
/// caller that stops a session by id gets those items back here rather than losing
/// them with the session. A failed incarnation that was restarted is not reported (its
/// items went to the next incarnation).
#[derive(Clone, Debug)]
pub struct SessionEnd<I> {
    /// The session's id.
    pub id: String,
    /// Its agent kind.
    pub kind: String,
    /// Whether it was persistent (its held items are then also in its record, when
    /// `exit.checkpoint` says `Saved`, or in its last durable record under `sync`).
    pub persistent: bool,
    /// How many times it was restarted before this end.
    pub restarts: u32,
    /// The final incarnation's exit state.
    pub exit: ExitState<I>,
}

/// A live session handed to the shutdown coordinator when the drain gate closes.
pub(crate) struct GateMember<I, E> {
    /// The session's spec (kind, configuration, persistence), to write its record if it
    /// has to be killed.
    pub spec: SessionSpec<I>,
    /// The live incarnation.
    pub handle: SessionHandle<I, E>,
}

/// The answer to closing the drain gate.
pub(crate) struct ClosedGate<I, E> {
    /// Every live session when the gate closed.
    pub sessions: Vec<GateMember<I, E>>,
    /// Pushes the gate has rejected as late so far (it keeps counting).
    pub late: Arc<AtomicU64>,
    /// The runtime instance that owns the sessions.
    pub owner: Option<String>,
}

/// Internal: a push to retry on the new incarnation.
pub(crate) struct Reroute<I> {
    id: String,
    item: I,
    options: PushOptions<I>,
    reply: RpcReplyPort<Result<PreemptAck, RoutedPushError<I>>>,
    tries: u32,
}

/// How a client attaches (S22).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// The client's disconnect (dropping the attachment) before a detach cancels the
    /// session's work, Immediate.
    Bound,
    /// The client only watches.
    Observer,
}

/// A client's attachment: the event stream, and for a bound client the guard whose drop
/// is its disconnect.
pub struct Attachment<E> {
    /// The session's events.
    pub events: EventStream<E>,
    /// Present for a bound client.
    pub bound: Option<BoundClient>,
}

/// A push routed by id that was not accepted; the item comes back when it was not.
#[derive(Debug)]
pub enum RoutedPushError<I> {
    /// No live session has this id; the item is handed back.
    UnknownSession {
        /// The session asked for.
        id: String,
        /// The item.
        item: I,
    },
    /// The session rejected it.
    Push(PushError<I>),
    /// A session is stored under this id but is not live yet: it is being recovered,
    /// resumed or moved, or waits for its dead owner's lease (issue 28). The item is
    /// handed back; push it again after `retry_after`.
    NotLive {
        /// The session.
        id: String,
        /// The item.
        item: I,
        /// When to retry.
        retry_after: std::time::Duration,
        /// What is happening to it.
        why: String,
    },
    /// A session is stored under this id but nothing runs it (stopped, interrupted,
    /// ended or waiting for an answer); `hint` says what to do. The item is handed back.
    NotRunning {
        /// The session.
        id: String,
        /// The item.
        item: I,
        /// Its stored status.
        status: String,
        /// What to do.
        hint: String,
    },
    /// Another node owns the session and the push cannot cross nodes: it carries an S9
    /// strategy (a closure) (issue 18, S36). The item is handed back; send it to the
    /// owner node, or without the strategy.
    NotForwardable {
        /// The session.
        id: String,
        /// The item.
        item: I,
    },
    /// Another node owns the session and could not be reached (down, not joined, or it
    /// did not answer in time). The item is handed back: it may or may not have been
    /// taken when the error is a timeout.
    OwnerUnreachable {
        /// The session.
        id: String,
        /// The owner node, as its record names it.
        node: String,
        /// The item.
        item: I,
        /// What happened.
        error: String,
    },
    /// Another node owns the session and refused the push (invalid options there, or
    /// an item it cannot store); the item is handed back.
    RefusedByOwner {
        /// The session.
        id: String,
        /// The owner node.
        node: String,
        /// The item.
        item: I,
        /// The owner's reason.
        error: String,
    },
}

impl<I> RoutedPushError<I> {
    /// When to push again, for a session that is stored but not live yet.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            RoutedPushError::NotLive { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// An `UnknownSession` for a session that is stored after all, told as what it is.
    pub(crate) fn stored(id: String, item: I, absence: crate::liveness::Absence) -> Self {
        match absence {
            crate::liveness::Absence::NotLive { retry_after, why } => RoutedPushError::NotLive {
                id,
                item,
                retry_after,
                why,
            },
            crate::liveness::Absence::NotRunning { status, hint } => RoutedPushError::NotRunning {
                id,
                item,
                status,
                hint,
            },
        }
    }
}

/// The session's own refusal is the source of [`RoutedPushError::Push`].
impl<I: fmt::Debug + 'static> std::error::Error for RoutedPushError<I> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RoutedPushError::Push(e) => Some(e),
            _ => None,
        }
    }
}

impl<I> fmt::Display for RoutedPushError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoutedPushError::UnknownSession { id, .. } => write!(
                f,
                "no live session has id `{id}`; the item is handed back in this error"
            ),
            RoutedPushError::Push(e) => fmt::Display::fmt(e, f),
            RoutedPushError::NotLive {
                id,
                retry_after,
                why,
                ..
            } => write!(
                f,
                "session `{id}` is stored but not live yet: {why}; push again in {}; the item \
                 is handed back",
                crate::config::format_duration(*retry_after)
            ),
            RoutedPushError::NotRunning {
                id, status, hint, ..
            } => write!(
                f,
                "session `{id}` is stored ({status}) but not running: {hint}; the item is \
                 handed back"
            ),
            RoutedPushError::NotForwardable { id, .. } => write!(
                f,
                "session `{id}` runs on another node and this push carries a strategy (a \
                 closure), which cannot cross nodes; push it on the owner node, or without \
                 the strategy; the item is handed back"
            ),
            RoutedPushError::RefusedByOwner {
                id, node, error, ..
            } => write!(
                f,
                "session `{id}` runs on node `{node}`, which refused the push: {error}; the \
                 item is handed back"
            ),
            RoutedPushError::OwnerUnreachable {
                id, node, error, ..
            } => write!(
                f,
                "session `{id}` runs on node `{node}`, which could not be reached ({error}); \
                 retry, or push to that node directly; the item is handed back"
            ),
        }
    }
}

/// The supervisor actor, with the directory it shares with its handles.
pub(crate) struct SessionSupervisor<I, E> {
    directory: Arc<Directory<I, E>>,
}

/// What the supervisor is built with.
pub struct SupervisorArgs<I, E> {
    /// Agent kinds by name.
    pub kinds: HashMap<String, Arc<dyn AgentKind<I, E>>>,
    /// The checkpoint store for persistent sessions.
    pub store: Option<Arc<dyn CheckpointStore<I>>>,
    /// The runtime instance that owns the sessions (recorded in their records).
    pub owner: Option<String>,
    /// The restart budget per session.
    pub budget: RestartBudget,
    /// The instance heartbeat: how often a detached session re-reads its record, so a
    /// cancel written by another process is noticed within one heartbeat (S24). The
    /// runtime passes its own; [`DEFAULT_HEARTBEAT`](crate::DEFAULT_HEARTBEAT) otherwise.
    pub heartbeat: Duration,
    /// Where the supervisor and its sessions count turns, routed pushes and restarts
    /// (S35); `None` counts nothing.
    pub metrics: Option<Arc<crate::metrics::RuntimeMetrics>>,
    /// How many sessions it runs and how much each holds (S34a); unbounded by default.
    pub limits: SessionLimits,
}

/// The bounds a supervisor applies to its sessions (S34a, `[limits]` in
/// agentloop.toml): how many run at once, and what each holds before it refuses a push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// Live sessions at most: a spawn over it is refused with
    /// [`SupervisorError::TooManySessions`]. Sessions the runtime resumes or adopts
    /// from their records are never refused for it (they are the runtime's own).
    pub max_sessions: usize,
    /// What each session holds before it refuses a push ([`PushError::Full`]).
    pub buffer: crate::session::BufferBound,
}

impl SessionLimits {
    /// No bounds (an embedded runtime whose callers are trusted).
    pub const UNBOUNDED: SessionLimits = SessionLimits {
        max_sessions: usize::MAX,
        buffer: crate::session::BufferBound::UNBOUNDED,
    };
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}

struct Entry<I, E> {
    spec: SessionSpec<I>,
    handle: SessionHandle<I, E>,
    actor: ActorId,
    restarts: VecDeque<Instant>,
    restarted: u32,
    /// Detached (S23): a restarted incarnation is detached again.
    detached: bool,
}

/// What an incarnation inherits from the ones before it: a new session has none.
#[derive(Default)]
struct Lineage {
    /// When its predecessors were restarted (within the budget's window).
    restarts: VecDeque<Instant>,
    /// How many restarts led to it.
    restarted: u32,
    /// Whether the session was detached (S23): the new incarnation is detached again.
    detached: bool,
}

/// The supervisor's store, owner and registered kinds (for an answer's claim).
pub(crate) struct RecordContext<I> {
    store: Option<Arc<dyn CheckpointStore<I>>>,
    owner: Option<String>,
    kinds: Vec<String>,
}

/// The supervisor's state.
pub(crate) struct SupervisorState<I, E> {
    kinds: HashMap<String, Arc<dyn AgentKind<I, E>>>,
    store: Option<Arc<dyn CheckpointStore<I>>>,
    owner: Option<String>,
    budget: RestartBudget,
    heartbeat: Duration,
    metrics: Option<Arc<crate::metrics::RuntimeMetrics>>,
    limits: SessionLimits,
    sessions: HashMap<String, Entry<I, E>>,
    by_actor: HashMap<ActorId, String>,
    /// Set by `StopAll`: no restarts, no new sessions.
    stopping: bool,
    /// Set by `CloseGate`: spawns are refused as `ShuttingDown`, routed pushes late.
    gate_closed: bool,
    /// The live incarnations by id, the gate and the push counters, shared with every
    /// handle (by-id pushes read it without a message to this actor).
    directory: Arc<Directory<I, E>>,
    /// Feeds of session ends ([`SupervisorMsg::WatchEnds`]).
    watchers: Vec<mpsc::UnboundedSender<SessionEnd<I>>>,
}

impl<I, E> SupervisorState<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    fn session_config(&self, spec: &SessionSpec<I>, load_record: bool) -> SessionConfig {
        let mut config = SessionConfig::new(spec.id.clone())
            .agent_kind(spec.kind.clone())
            .persistent(spec.persist)
            .durability(spec.durability)
            .history(spec.history)
            .replay(spec.replay);
        config.load_record = load_record;
        config.claim = spec.claim;
        config.supervised = true;
        config.agent_config = spec.agent_config.clone();
        if let Some(owner) = &self.owner {
            config = config.owner(owner.clone());
        }
        if let Some(lease) = spec.lease_timeout {
            config = config.lease_timeout(lease);
        }
        config.poll_interval = spec.poll_interval.unwrap_or(self.heartbeat);
        config.own_poll_interval = spec.poll_interval;
        config.restart = spec.restart;
        config.subscribe_at_spawn = spec.subscribe;
        config.metrics = self.metrics.clone();
        config.buffer_bound = self.limits.buffer;
        config
    }

    /// Checks a spawn request against the registry: a valid id, the gate open, the
    /// supervisor not stopping, no live session with this id, and room for a new one
    /// (`starting` more are being admitted with it) unless the spec resumes a record.
    async fn admit(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        spec: &SessionSpec<I>,
        starting: usize,
    ) -> Result<(), SupervisorError> {
        let id = spec.id.as_str();
        let resumes = spec.preloaded.is_some() || spec.claim;
        let live = self.sessions.len() + starting;
        match validate_session_id(id) {
            Err(e) => Err(SupervisorError::InvalidId(e)),
            Ok(()) if self.gate_closed => Err(SupervisorError::ShuttingDown(id.to_string())),
            Ok(()) if !resumes && live >= self.limits.max_sessions => {
                Err(SupervisorError::TooManySessions {
                    id: id.to_string(),
                    max: self.limits.max_sessions,
                })
            }
            Ok(()) if self.stopping => Err(SupervisorError::Session(SessionError::Exited(
                "the session supervisor is stopping".into(),
            ))),
            Ok(()) if self.live(myself, id).await.is_some() => {
                Err(SupervisorError::Duplicate(id.to_string()))
            }
            Ok(()) => Ok(()),
        }
    }

    /// A spawn request: checks the id, the gate and duplicates, then starts the first
    /// incarnation.
    async fn spawn_new(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        spec: SessionSpec<I>,
    ) -> Result<SessionHandle<I, E>, SupervisorError> {
        self.admit(myself, &spec, 0).await?;
        let seed = spec.initial_items.clone();
        self.start(myself, spec, seed, true, Lineage::default())
            .await
    }

    /// A batch of spawn requests (at most [`MAX_SPAWN_BATCH`]), answered in order:
    /// each spec is admitted like a single spawn (an id twice in the batch is a
    /// duplicate of the first), then the admitted sessions' actors start, up to
    /// `SPAWN_OVERLAP` at a time, so their starts overlap instead of queueing one
    /// after the other (B2).
    async fn spawn_batch(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        specs: Vec<SessionSpec<I>>,
    ) -> Vec<Result<SessionHandle<I, E>, SupervisorError>> {
        let mut answers: Vec<Option<Result<SessionHandle<I, E>, SupervisorError>>> =
            Vec::with_capacity(specs.len());
        let mut admitted = Vec::new();
        let mut starts = Vec::new();
        let mut ids = HashSet::with_capacity(specs.len());
        for spec in specs {
            let admission = match self.admit(myself, &spec, admitted.len()).await {
                Ok(()) if !ids.insert(spec.id.clone()) => {
                    Err(SupervisorError::Duplicate(spec.id.clone()))
                }
                other => other,
            };
            let seed = spec.initial_items.clone();
            match admission.and_then(|()| self.prepare(myself, spec, true)) {
                Ok((start, spec)) => {
                    admitted.push((answers.len(), spec, seed));
                    starts.push(start);
                    answers.push(None);
                }
                Err(e) => answers.push(Some(Err(e))),
            }
        }
        // Started lazily, at most SPAWN_OVERLAP at a time: each start's future is large
        // (≈ 5 KiB), and a bounded window reuses the same memory instead of faulting
        // in fresh pages for a thousand of them.
        let started: Vec<_> = futures::stream::iter(starts.into_iter().map(Prepared::start))
            .buffered(SPAWN_OVERLAP)
            .collect()
            .await;
        for ((at, spec, seed), started) in admitted.into_iter().zip(started) {
            answers[at] =
                Some(started.map(|handle| self.register(spec, handle, seed, Lineage::default())));
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(gone())))
            .collect()
    }

    async fn start(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        spec: SessionSpec<I>,
        seed: Vec<I>,
        load_record: bool,
        lineage: Lineage,
    ) -> Result<SessionHandle<I, E>, SupervisorError> {
        let (start, spec) = self.prepare(myself, spec, load_record)?;
        let handle = start.start().await?;
        Ok(self.register(spec, handle, seed, lineage))
    }

    /// The part of a start that needs no waiting: resolves the kind and the store and
    /// builds the session's configuration. Returns the start (it borrows nothing of the
    /// supervisor, so several may run at once) and the spec to register.
    fn prepare(
        &self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        mut spec: SessionSpec<I>,
        load_record: bool,
    ) -> Result<(Prepared<I, E>, SessionSpec<I>), SupervisorError> {
        let kind = self.kinds.get(&spec.kind).cloned().ok_or_else(|| {
            let mut known: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
            known.sort_unstable();
            SupervisorError::UnknownKind {
                kind: spec.kind.clone(),
                known: known.join(", "),
            }
        })?;
        if spec.persist && self.store.is_none() {
            return Err(SupervisorError::NoStore(spec.id.clone()));
        }
        let store = if spec.persist {
            self.store.clone()
        } else {
            None
        };
        let config = self.session_config(&spec, load_record);
        // Used once: a restart loads the record afresh, and its events go to those who
        // subscribe to the new incarnation.
        let record = spec.preloaded.take().map(|r| *r);
        spec.subscribe = None;
        let start = Prepared {
            kind,
            config,
            store,
            supervisor: myself.get_cell(),
            record,
        };
        Ok((start, spec))
    }

    /// Enters a started session in the registry and the directory, after its seed items
    /// and (a restarted detached session, S23) its detach were sent: pushes that find
    /// it in the directory go straight to its mailbox and must not overtake them.
    fn register(
        &mut self,
        spec: SessionSpec<I>,
        handle: SessionHandle<I, E>,
        seed: Vec<I>,
        lineage: Lineage,
    ) -> SessionHandle<I, E> {
        // Ordered before anything routed later: casts from this actor arrive in order.
        for item in seed {
            handle.push_nowait(item);
        }
        if lineage.detached {
            // S23 across a restart: the new incarnation goes on in the background. Only
            // the answer is awaited off the actor.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sent = handle
                .actor()
                .send_message(crate::session::TurnLoopMsg::Detach {
                    reply: RpcReplyPort::from(tx),
                })
                .is_ok();
            if sent {
                tokio::spawn(async move {
                    if let Ok(Err(e)) = rx.await {
                        tracing::warn!(error = %e, "could not detach the restarted session");
                    }
                });
            }
        }
        let actor = handle.actor().get_id();
        self.by_actor.insert(actor, spec.id.clone());
        self.directory.enter(&spec.id, handle.clone());
        self.sessions.insert(
            spec.id.clone(),
            Entry {
                spec,
                handle: handle.clone(),
                actor,
                restarts: lineage.restarts,
                restarted: lineage.restarted,
                detached: lineage.detached,
            },
        );
        handle
    }

    /// The session's incarnation ended: restart it if its policy and budget allow,
    /// else forget it. Returns whether a new incarnation runs.
    async fn on_end(&mut self, myself: &ActorRef<SupervisorMsg<I, E>>, id: &str) -> bool {
        let Some(entry) = self.sessions.remove(id) else {
            return false;
        };
        self.directory.remove(id);
        self.by_actor.remove(&entry.actor);
        let exit = match entry.handle.exit_state() {
            Some(e) => e,
            // Published by the actor's teardown or its destructor; wait for it.
            None => entry.handle.wait().await,
        };
        let failed = match &exit.reason {
            ExitReason::Failed(e) => Some(e.clone()),
            _ => None,
        };
        let Some(error) = failed else {
            tracing::info!(session = id, reason = ?exit.reason, "session ended");
            self.publish_end(&entry.spec, entry.restarted, exit);
            return false;
        };
        if self.stopping {
            self.publish_end(&entry.spec, entry.restarted, exit);
            return false;
        }
        // The kind was decided where the failure happened (never parsed from text).
        let kind = exit.failure.unwrap_or(FailureKind::Internal);
        let wants = match entry.spec.restart {
            RestartPolicy::Permanent => true,
            RestartPolicy::Transient => matches!(kind, FailureKind::Panic | FailureKind::Internal),
            RestartPolicy::Never => false,
        };
        // Failures of the session's own record (refused or unreadable) are not fixed by
        // a restart.
        let unrecoverable = kind == FailureKind::Record;
        let now = Instant::now();
        let mut restarts = entry.restarts;
        while restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.budget.window)
        {
            restarts.pop_front();
        }
        if !wants || unrecoverable || restarts.len() as u32 >= self.budget.max_restarts {
            if wants && !unrecoverable {
                tracing::error!(
                    session = id,
                    restarts = restarts.len(),
                    "restart budget spent; the session stays failed"
                );
            }
            // A record failure leaves the record as it was (S18); any other failure
            // that is not restarted is final, and the record says so (S26).
            if !unrecoverable && entry.spec.persist {
                self.mark_failed(id, &error).await;
            }
            self.publish_end(&entry.spec, entry.restarted, exit);
            return false;
        }
        restarts.push_back(now);
        let from_record = entry.spec.persist && entry.spec.durability == Durability::Sync;
        let seed = if from_record {
            Vec::new()
        } else {
            let mut items = exit.interrupted_items.clone();
            items.extend(exit.unhandled_items.iter().cloned());
            items
        };
        tracing::warn!(session = id, %error, attempt = restarts.len(), from_record, "restarting a failed session");
        if let Some(m) = &self.metrics {
            m.restart();
        }
        let spec = entry.spec.clone();
        match self
            .start(
                myself,
                spec,
                seed,
                from_record,
                Lineage {
                    restarts,
                    restarted: entry.restarted + 1,
                    detached: entry.detached,
                },
            )
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(session = id, error = %e, "restart failed; the session stays failed");
                if entry.spec.persist {
                    self.mark_failed(id, &error).await;
                }
                self.publish_end(&entry.spec, entry.restarted, exit);
                false
            }
        }
    }

    /// Reports a session's final end to every feed (dropping closed feeds).
    fn publish_end(&mut self, spec: &SessionSpec<I>, restarted: u32, exit: ExitState<I>) {
        let end = SessionEnd {
            id: spec.id.clone(),
            kind: spec.kind.clone(),
            persistent: spec.persist,
            restarts: restarted,
            exit,
        };
        self.watchers.retain(|w| w.send(end.clone()).is_ok());
    }

    /// Past the budget: the record says `Failed` with the error (S26).
    async fn mark_failed(&self, id: &str, error: &str) {
        if let Some(store) = &self.store {
            let r = store
                .cas_status(
                    id,
                    vec![
                        StatusKind::Running,
                        StatusKind::Stopped,
                        StatusKind::Interrupted,
                    ],
                    SessionStatus::Failed(error.to_string()),
                )
                .await;
            if let Err(e) = r {
                tracing::error!(session = id, error = %e, "could not mark the record Failed");
            }
        }
    }

    /// The live incarnation for `id`, restarting it first if it has just ended.
    async fn live(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        id: &str,
    ) -> Option<SessionHandle<I, E>> {
        let ended = self.sessions.get(id)?.handle.exit_state().is_some();
        if ended && !self.on_end(myself, id).await {
            return None;
        }
        self.sessions.get(id).map(|e| e.handle.clone())
    }
}

impl<I, E> Actor for SessionSupervisor<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    type Msg = SupervisorMsg<I, E>;
    type State = SupervisorState<I, E>;
    type Arguments = SupervisorArgs<I, E>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SupervisorArgs<I, E>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(SupervisorState {
            kinds: args.kinds,
            store: args.store,
            owner: args.owner,
            budget: args.budget,
            heartbeat: args.heartbeat,
            metrics: args.metrics,
            limits: args.limits,
            sessions: HashMap::new(),
            by_actor: HashMap::new(),
            stopping: false,
            gate_closed: false,
            directory: self.directory.clone(),
            watchers: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Spawn { spec, reply } => {
                let _ = reply.send(st.spawn_new(&myself, *spec).await);
            }
            SupervisorMsg::SpawnBatch { specs, reply } => {
                let answer = if specs.len() > MAX_SPAWN_BATCH {
                    let initial_items: usize = specs.iter().map(|s| s.initial_items.len()).sum();
                    tracing::warn!(
                        specs = specs.len(),
                        initial_items,
                        max = MAX_SPAWN_BATCH,
                        "a spawn batch was refused whole for its size; nothing in it was spawned"
                    );
                    Err(SupervisorError::BatchTooLarge {
                        len: specs.len(),
                        max: MAX_SPAWN_BATCH,
                    })
                } else {
                    Ok(st.spawn_batch(&myself, specs).await)
                };
                let _ = reply.send(answer);
            }
            SupervisorMsg::SpawnSubscribed {
                spec,
                capacity,
                filter,
                reply,
            } => {
                let mut spec = *spec;
                spec.subscribe = Some((capacity, filter));
                let r = st.spawn_new(&myself, spec).await.and_then(|handle| {
                    match handle.take_events_at_spawn() {
                        Some(events) => Ok((handle, events)),
                        None => Err(SupervisorError::Session(SessionError::Exited(
                            "the session's subscriber at spawn was not registered".into(),
                        ))),
                    }
                });
                // A caller that gave up drops the stream here, which unsubscribes it.
                let _ = reply.send(r);
            }
            SupervisorMsg::Push {
                id,
                item,
                options,
                reply,
            } => {
                route_push(&myself, st, id, item, options, reply, 0).await;
            }
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::Reroute(Reroute {
                id,
                item,
                options,
                reply,
                tries,
            }))) => {
                route_push(&myself, st, id, item, options, reply, tries).await;
            }
            SupervisorMsg::Stop { id, options, reply } => {
                let r = match st.sessions.get(&id) {
                    None => Err(SupervisorError::UnknownSession(id)),
                    Some(e) => {
                        let h = e.handle.clone();
                        // Answered off the actor: a stop's reply never blocks routing.
                        tokio::spawn(async move {
                            let _ = reply.send(h.stop(options).await.map_err(Into::into));
                        });
                        return Ok(());
                    }
                };
                let _ = reply.send(r);
            }
            SupervisorMsg::Subscribe {
                id,
                capacity,
                filter,
                reply,
            } => {
                let r = match st.live(&myself, &id).await {
                    Some(h) => Ok(h.subscribe_filtered(capacity, filter)),
                    None => Err(SupervisorError::UnknownSession(id)),
                };
                let _ = reply.send(r);
            }
            SupervisorMsg::SubscribeAfter {
                id,
                after,
                capacity,
                filter,
                reply,
            } => {
                let r = match st.live(&myself, &id).await {
                    Some(h) => Ok(h.subscribe_after(after, capacity, filter)),
                    None => Err(SupervisorError::UnknownSession(id)),
                };
                let _ = reply.send(r);
            }
            SupervisorMsg::Inspect { id, reply } => {
                let h = st.live(&myself, &id).await;
                answer_from_session(id, h, reply, |h| async move { h.inspect().await });
            }
            SupervisorMsg::Attach {
                id,
                mode,
                filter,
                reply,
            } => {
                let r = match st.live(&myself, &id).await {
                    Some(h) => Ok(Attachment {
                        events: h.subscribe_filtered(crate::events::DEFAULT_EVENT_CAPACITY, filter),
                        bound: (mode == AttachMode::Bound).then(|| h.attach_bound()),
                    }),
                    None => Err(SupervisorError::UnknownSession(id)),
                };
                let _ = reply.send(r);
            }
            SupervisorMsg::Detach { id, reply } => {
                let h = st.live(&myself, &id).await;
                // Only a persistent session can be detached (S23); a restart detaches
                // the new incarnation again.
                if let Some(e) = st.sessions.get_mut(&id).filter(|e| e.spec.persist) {
                    e.detached = true;
                }
                answer_from_session(id, h, reply, |h| async move { h.detach().await });
            }
            SupervisorMsg::Cancel { id, reply } => {
                let live = st.sessions.get(&id).map(|e| e.handle.clone());
                let store = st.store.clone();
                tokio::spawn(async move {
                    let _ = reply.send(cancel(store, live, id).await);
                });
            }
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::CloseGate { reply })) => {
                st.gate_closed = true;
                st.directory.close_gate();
                st.stopping = true;
                let mut sessions: Vec<GateMember<I, E>> = st
                    .sessions
                    .values()
                    .map(|e| GateMember {
                        spec: e.spec.clone(),
                        handle: e.handle.clone(),
                    })
                    .collect();
                sessions.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
                tracing::info!(sessions = sessions.len(), "drain gate closed");
                let _ = reply.send(ClosedGate {
                    sessions,
                    late: st.directory.gate_late(),
                    owner: st.owner.clone(),
                });
            }
            SupervisorMsg::WatchEnds { feed } => st.watchers.push(feed),
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::RecordContext { reply })) => {
                let _ = reply.send(RecordContext {
                    store: st.store.clone(),
                    owner: st.owner.clone(),
                    kinds: st.kinds.keys().cloned().collect(),
                });
            }
            SupervisorMsg::StopAll { options, reply } => {
                st.stopping = true;
                let handles: Vec<SessionHandle<I, E>> =
                    st.sessions.values().map(|e| e.handle.clone()).collect();
                tokio::spawn(async move {
                    let mut exits = Vec::with_capacity(handles.len());
                    for h in &handles {
                        let _ = h.stop(options.clone()).await;
                    }
                    for h in handles {
                        exits.push(h.wait().await);
                    }
                    let _ = reply.send(exits);
                });
            }
            SupervisorMsg::List { reply } => {
                let mut v: Vec<SessionSummary> = st
                    .sessions
                    .values()
                    .map(|e| SessionSummary {
                        id: e.spec.id.clone(),
                        kind: e.spec.kind.clone(),
                        restarts: e.restarted,
                    })
                    .collect();
                v.sort_by(|a, b| a.id.cmp(&b.id));
                let _ = reply.send(v);
            }
        }
        Ok(())
    }

    /// Invariant: every session still registered when the supervisor stops is reported
    /// to the end feeds, so a feed closes only after every session's end is on it. A
    /// session that has not ended yet is waited for in a task that holds the feeds
    /// open; it cannot wait forever: after `post_stop` ractor kills the supervisor's
    /// linked children, and a killed session still publishes its exit state (from its
    /// state's destructor). A supervisor that panics skips `post_stop`: its feeds then
    /// close without the ends of the sessions it still held.
    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        st.stopping = true;
        let ids: Vec<String> = st.sessions.keys().cloned().collect();
        for id in ids {
            let Some(entry) = st.sessions.remove(&id) else {
                continue;
            };
            st.directory.remove(&id);
            match entry.handle.exit_state() {
                Some(exit) => st.publish_end(&entry.spec, entry.restarted, exit),
                None if st.watchers.is_empty() => {}
                None => {
                    let watchers = st.watchers.clone();
                    tokio::spawn(async move {
                        let exit = entry.handle.wait().await;
                        let end = SessionEnd {
                            id: entry.spec.id.clone(),
                            kind: entry.spec.kind.clone(),
                            persistent: entry.spec.persist,
                            restarts: entry.restarted,
                            exit,
                        };
                        for w in watchers {
                            let _ = w.send(end.clone());
                        }
                    });
                }
            }
        }
        st.watchers.clear();
        Ok(())
    }

    /// Overrides ractor's default, which stops the supervisor when a child exits: a
    /// session's end is handled (restart or forget) and the supervisor lives on.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let cell = match &evt {
            SupervisionEvent::ActorTerminated(cell, _, _)
            | SupervisionEvent::ActorFailed(cell, _) => cell.clone(),
            _ => return Ok(()),
        };
        // Invariant: a killed session's state travels inside this event (ractor boxes
        // it into `ActorTerminated`), and its destructor is what publishes the exit
        // state `on_end` waits for. Drop the event first, or that wait never ends.
        drop(evt);
        // Only the current incarnation counts (an older one was already handled when a
        // routed message found it ended).
        if let Some(id) = st.by_actor.get(&cell.get_id()).cloned() {
            st.on_end(&myself, &id).await;
        }
        Ok(())
    }
}

/// Answers a request by id from the live session, in a task so the supervisor never
/// waits on a session; an unknown id is answered at once.
fn answer_from_session<I, E, T, F, Fut>(
    id: String,
    handle: Option<SessionHandle<I, E>>,
    reply: RpcReplyPort<Result<T, SupervisorError>>,
    op: F,
) where
    I: Send + Sync + 'static,
    E: Send + Sync + 'static,
    T: Send + 'static,
    F: FnOnce(SessionHandle<I, E>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, SessionError>> + Send + 'static,
{
    match handle {
        Some(h) => {
            tokio::spawn(async move {
                let _ = reply.send(op(h).await.map_err(Into::into));
            });
        }
        None => {
            let _ = reply.send(Err(SupervisorError::UnknownSession(id)));
        }
    }
}

/// S24: flip the record `Running` → `Canceled` (atomically: a finalizer that loses the
/// race leaves it), then stop the live session Immediate.
async fn cancel<I, E>(
    store: Option<Arc<dyn CheckpointStore<I>>>,
    live: Option<SessionHandle<I, E>>,
    id: String,
) -> Result<SessionStatus, SupervisorError>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    let outcome = match &store {
        Some(s) => Some(
            s.cas_status(&id, vec![StatusKind::Running], SessionStatus::Canceled)
                .await
                .map_err(|e| SupervisorError::Session(SessionError::Store(e)))?,
        ),
        None => None,
    };
    let status = match outcome {
        Some(crate::store::CasOutcome::Mismatch(s)) => return Ok(s), // terminal: no-op
        Some(crate::store::CasOutcome::Swapped(_)) => SessionStatus::Canceled,
        Some(crate::store::CasOutcome::Missing) | None => match &live {
            Some(_) => SessionStatus::Canceled,
            None => return Err(SupervisorError::UnknownSession(id)),
        },
    };
    if let Some(h) = live {
        let mut stop = StopOptions::immediate().cause("canceled");
        stop.canceled = true;
        h.stop(stop).await?;
    }
    Ok(status)
}

/// Routes a push; a push that finds its incarnation ended (late, because it exited)
/// is retried once the supervisor has restarted it, so it reaches the new incarnation.
async fn route_push<I, E>(
    myself: &ActorRef<SupervisorMsg<I, E>>,
    st: &mut SupervisorState<I, E>,
    id: String,
    item: I,
    options: PushOptions<I>,
    reply: RpcReplyPort<Result<PreemptAck, RoutedPushError<I>>>,
    tries: u32,
) where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    use crate::metrics::PushResult;
    let directory = st.directory.clone();
    let count = move |r: PushResult| directory.count(r);
    if st.gate_closed {
        // S27 drain gate: the item goes back to the caller as a late item.
        st.directory.count_gate_late();
        let _ = reply.send(Err(RoutedPushError::Push(PushError::Late { item })));
        return;
    }
    let Some(h) = st.live(myself, &id).await else {
        count(PushResult::Refused);
        let _ = reply.send(Err(RoutedPushError::UnknownSession { id, item }));
        return;
    };
    let myself = myself.clone();
    let retry_options = options.clone();
    tokio::spawn(async move {
        match h.push_with(item, options).await {
            Ok(ack) => {
                count(PushResult::Accepted);
                let _ = reply.send(Ok(ack));
            }
            // The incarnation ended between routing and delivery: if it is being
            // restarted, the supervisor routes the item again (a bounded number of
            // times); a session that was stopped answers late as usual.
            Err(PushError::Late { item })
                if tries < 3
                    && h.exit_state()
                        .is_some_and(|e| matches!(e.reason, ExitReason::Failed(_))) =>
            {
                let _ = h.take_late_items();
                let msg = SupervisorMsg::from(InternalMsg::Reroute(Reroute {
                    id,
                    item,
                    options: retry_options,
                    reply,
                    tries: tries + 1,
                }));
                if let Err(ractor::MessagingErr::SendErr(SupervisorMsg::Internal(
                    SupervisorInternal(InternalMsg::Reroute(r)),
                ))) = myself.send_message(msg)
                {
                    let _ = r
                        .reply
                        .send(Err(RoutedPushError::Push(PushError::Late { item: r.item })));
                }
            }
            Err(e) => {
                count(match e {
                    PushError::Late { .. } => PushResult::Late,
                    _ => PushResult::Refused,
                });
                let _ = reply.send(Err(RoutedPushError::Push(e)));
            }
        }
    });
}

/// A typed handle on a SessionSupervisor.
pub struct SupervisorHandle<I, E> {
    actor: ActorRef<SupervisorMsg<I, E>>,
    /// The supervisor's directory: a push to a live session goes straight to it.
    directory: Arc<Directory<I, E>>,
}

impl<I, E> Clone for SupervisorHandle<I, E> {
    fn clone(&self) -> Self {
        SupervisorHandle {
            actor: self.actor.clone(),
            directory: self.directory.clone(),
        }
    }
}

/// The supervisor is gone.
fn gone() -> SupervisorError {
    SupervisorError::Session(SessionError::Exited("the session supervisor".into()))
}

impl<I, E> SupervisorHandle<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Starts a supervisor (unlinked).
    pub async fn start(args: SupervisorArgs<I, E>) -> Result<Self, SpawnError> {
        let directory = Arc::new(Directory::new(args.metrics.clone()));
        let supervisor = SessionSupervisor {
            directory: directory.clone(),
        };
        let (actor, _) =
            Actor::spawn(None, supervisor, args)
                .await
                .map_err(|e| SpawnError::Actor {
                    id: "session-supervisor".into(),
                    reason: e.to_string(),
                })?;
        Ok(SupervisorHandle { actor, directory })
    }

    /// Starts a supervisor linked under `parent` (embedding in your actor tree, S25).
    pub async fn start_linked(
        args: SupervisorArgs<I, E>,
        parent: ActorCell,
    ) -> Result<Self, SpawnError> {
        let directory = Arc::new(Directory::new(args.metrics.clone()));
        let supervisor = SessionSupervisor {
            directory: directory.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, supervisor, args, parent)
            .await
            .map_err(|e| SpawnError::Actor {
                id: "session-supervisor".into(),
                reason: e.to_string(),
            })?;
        Ok(SupervisorHandle { actor, directory })
    }

    /// The actor, for `cast!` / `call!` and supervision.
    pub fn actor(&self) -> &ActorRef<SupervisorMsg<I, E>> {
        &self.actor
    }

    async fn ask<T>(
        &self,
        build: impl FnOnce(RpcReplyPort<T>) -> SupervisorMsg<I, E>,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.actor
            .send_message(build(RpcReplyPort::from(tx)))
            .ok()?;
        rx.await.ok()
    }

    /// Spawns a session.
    pub async fn spawn(
        &self,
        spec: SessionSpec<I>,
    ) -> Result<SessionHandle<I, E>, SupervisorError> {
        let spec = Box::new(spec);
        self.ask(|reply| SupervisorMsg::Spawn { spec, reply })
            .await
            .unwrap_or_else(|| Err(gone()))
    }

    /// Spawns many sessions with few requests: `specs` go to the supervisor in batches
    /// of at most [`MAX_SPAWN_BATCH`], each one request and one reply, and the sessions
    /// of a batch start concurrently. Answers one result per spec, in order; a spec that
    /// fails (a bad or duplicate id, an unknown kind, the drain gate) fails alone. The
    /// fast way to start thousands of sessions (B2).
    pub async fn spawn_batch(&self, specs: Vec<SessionSpec<I>>) -> BatchSpawn<I, E> {
        let mut answers = Vec::with_capacity(specs.len());
        let mut specs = specs.into_iter().peekable();
        while specs.peek().is_some() {
            let batch: Vec<SessionSpec<I>> = specs.by_ref().take(MAX_SPAWN_BATCH).collect();
            let len = batch.len();
            match self
                .ask(|reply| SupervisorMsg::SpawnBatch {
                    specs: batch,
                    reply,
                })
                .await
            {
                Some(Ok(batch)) => answers.extend(batch),
                Some(Err(e)) => {
                    // Not reached: batches are cut to the bound above.
                    tracing::warn!(error = %e, "a spawn batch was refused");
                    answers.extend((0..len).map(|_| Err(gone())));
                }
                None => answers.extend((0..len).map(|_| Err(gone()))),
            }
        }
        answers
    }

    /// Spawns a session with a subscriber attached before its actor starts: the
    /// stream sees every event of this incarnation from the first, also when the first
    /// turn (a resume, S17) starts before this call returns. A restarted incarnation
    /// is a new session to subscribe to; this stream ends with the first one's `Ended`.
    pub async fn spawn_subscribed(
        &self,
        spec: SessionSpec<I>,
        capacity: usize,
        filter: EventFilter,
    ) -> SubscribedSpawn<I, E> {
        let spec = Box::new(spec);
        self.ask(|reply| SupervisorMsg::SpawnSubscribed {
            spec,
            capacity,
            filter,
            reply,
        })
        .await
        .unwrap_or_else(|| Err(gone()))
    }

    /// Answers the business interrupt of stored session `id` and resumes it under
    /// this supervisor (S4, S25), also after a process restart: the answer and this
    /// supervisor's claim are one durable write before the session starts (see
    /// [`SessionHandle::resume_with_answer`]); the agent is rebuilt from the record's
    /// kind and configuration. Returns the handle and a stream attached before the
    /// session started (it sees the resumed turn's `TurnStarted`). The session is
    /// persistent with the settings its record kept (issue 28: durability, history,
    /// replay, restart policy, poll interval), or, for a record written before
    /// settings were kept, with `durability` and the defaults.
    pub async fn resume_with_answer(
        &self,
        id: &str,
        answer: I,
        durability: Durability,
        capacity: usize,
    ) -> Result<(SessionHandle<I, E>, EventStream<E>), crate::AnswerError<I>>
    where
        I: serde::Serialize + serde::de::DeserializeOwned,
    {
        let Some(ctx) = self
            .ask(|reply| InternalMsg::RecordContext { reply }.into())
            .await
        else {
            return Err(crate::AnswerError::Unavailable {
                id: id.to_string(),
                reason: "the session supervisor is gone; start the runtime again".into(),
                answer,
            });
        };
        let Some(store) = ctx.store else {
            return Err(crate::AnswerError::NotPersistent {
                id: id.to_string(),
                answer,
            });
        };
        let record = crate::session::answer::claim_with_answer(
            &*store,
            id,
            ctx.owner.as_deref(),
            answer,
            Some(&ctx.kinds),
        )
        .await?;
        // The session's own settings (issue 28); `durability` for an older record.
        let mut spec = SessionSpec::new(id, record.header.agent_kind.clone())
            .config(record.header.agent_config.clone())
            .persistent(true);
        spec = match record.header.settings {
            Some(s) => spec.settings(s),
            None => spec.durability(durability),
        };
        spec.preloaded = Some(Box::new(record));
        self.spawn_subscribed(spec, capacity, EventFilter::all())
            .await
            .map_err(|e| crate::AnswerError::Spawn {
                id: id.to_string(),
                reason: e.to_string(),
            })
    }

    /// Starts new session `to` under this supervisor from turn `turn`'s kept checkpoint
    /// of session `from` (issue 13, 4), with the source's agent kind, configuration and
    /// settings as that checkpoint kept them (issue 28: durability, replay, restart
    /// policy, poll interval), or `durability` and the defaults for a checkpoint written
    /// before settings were kept; persistent, keeping `history` checkpoints of its own.
    pub async fn fork(
        &self,
        from: &str,
        turn: u64,
        to: &str,
        durability: Durability,
        history: usize,
    ) -> Result<SessionHandle<I, E>, crate::ForkError>
    where
        I: serde::Serialize + serde::de::DeserializeOwned,
    {
        let gone = || crate::ForkError::Spawn {
            id: to.to_string(),
            reason: "the session supervisor is gone".into(),
        };
        let ctx = self
            .ask(|reply| InternalMsg::RecordContext { reply }.into())
            .await
            .ok_or_else(gone)?;
        let Some(store) = ctx.store else {
            return Err(crate::ForkError::NotPersistent(to.to_string()));
        };
        // The checkpoint's own settings (issue 28), or `durability` with the defaults
        // for a checkpoint written before settings were kept; the fork's history is its
        // own.
        let overrides = |kept: Option<crate::session::SessionSettings>| {
            let mut s = kept.unwrap_or(crate::session::SessionSettings {
                durability,
                ..Default::default()
            });
            s.history = history;
            s
        };
        let record = crate::session::fork::write_fork(&*store, from, turn, to, overrides).await?;
        let settings = record.header.settings.unwrap_or_default();
        let mut spec = SessionSpec::new(to, record.header.agent_kind.clone())
            .config(record.header.agent_config.clone())
            .persistent(true)
            .settings(settings);
        spec.preloaded = Some(Box::new(record));
        self.spawn(spec).await.map_err(|e| crate::ForkError::Spawn {
            id: to.to_string(),
            reason: e.to_string(),
        })
    }

    /// Deletes stored session `id`: its record and its checkpoint history (issue 13,
    /// 4). Refused while the session runs here (stop it first); resolves to whether
    /// anything was stored.
    pub async fn delete(&self, id: &str) -> Result<bool, SupervisorError> {
        validate_session_id(id)?;
        // Asked of the live entry (as every by-id request is): a session that has just
        // exited, whose end the supervisor has not taken yet, does not count as running.
        if self.inspect(id).await.is_ok() {
            return Err(SupervisorError::Running(id.to_string()));
        }
        let ctx = self
            .ask(|reply| InternalMsg::RecordContext { reply }.into())
            .await
            .ok_or_else(gone)?;
        let Some(store) = ctx.store else {
            return Ok(false);
        };
        store
            .purge(id)
            .await
            .map_err(|e| SupervisorError::Session(SessionError::Store(e)))
    }

    /// Pushes to a session by id.
    pub async fn push(&self, id: &str, item: I) -> Result<PreemptAck, RoutedPushError<I>> {
        self.push_with(id, item, PushOptions::new()).await
    }

    /// Pushes with options to a session by id.
    pub async fn push_with(
        &self,
        id: &str,
        item: I,
        options: PushOptions<I>,
    ) -> Result<PreemptAck, RoutedPushError<I>> {
        use crate::metrics::PushResult;
        // The direct way (issue 31): a live incarnation takes the push on this task,
        // without the supervisor's mailbox or a routing task. An incarnation that ended
        // meanwhile, a closed gate and an unknown id go the supervisor's way below.
        let (item, options) = match self.directory.live(id) {
            Some(h) if !self.directory.gate_closed() => {
                let retry_options = options.clone();
                match h.push_with(item, options).await {
                    Ok(ack) => {
                        self.directory.count(PushResult::Accepted);
                        return Ok(ack);
                    }
                    // Ended between lookup and delivery: a failed incarnation may be
                    // restarting, which the supervisor decides (as for a routed push).
                    Err(PushError::Late { item })
                        if h.exit_state()
                            .is_some_and(|e| matches!(e.reason, ExitReason::Failed(_))) =>
                    {
                        let _ = h.take_late_items();
                        (item, retry_options)
                    }
                    Err(e) => {
                        self.directory.count(match e {
                            PushError::Late { .. } => PushResult::Late,
                            _ => PushResult::Refused,
                        });
                        return Err(RoutedPushError::Push(e));
                    }
                }
            }
            _ => (item, options),
        };
        let copy = item.clone();
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::Push {
            id,
            item,
            options,
            reply,
        })
        .await
        .unwrap_or(Err(RoutedPushError::Push(PushError::Late { item: copy })))
    }

    /// Stops a session by id.
    pub async fn stop(&self, id: &str, options: StopOptions) -> Result<(), SupervisorError> {
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::Stop { id, options, reply })
            .await
            .unwrap_or_else(|| Err(gone()))
    }

    /// Subscribes to a session's current incarnation.
    pub async fn subscribe(
        &self,
        id: &str,
        filter: EventFilter,
    ) -> Result<EventStream<E>, SupervisorError> {
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::Subscribe {
            id,
            capacity: crate::events::DEFAULT_EVENT_CAPACITY,
            filter,
            reply,
        })
        .await
        .unwrap_or_else(|| Err(gone()))
    }

    /// Subscribes to a session's current incarnation after event `after` (a number a
    /// previous stream gave, e.g. an SSE client's `Last-Event-ID`): the events the
    /// replay buffer still holds come first, preceded by `Lagged` when some are gone.
    pub async fn subscribe_after(
        &self,
        id: &str,
        after: u64,
        filter: EventFilter,
    ) -> Result<EventStream<E>, SupervisorError> {
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::SubscribeAfter {
            id,
            after,
            capacity: crate::events::DEFAULT_EVENT_CAPACITY,
            filter,
            reply,
        })
        .await
        .unwrap_or_else(|| Err(gone()))
    }

    /// Inspects a session by id.
    pub async fn inspect(&self, id: &str) -> Result<SessionInfo, SupervisorError> {
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::Inspect { id, reply })
            .await
            .unwrap_or_else(|| Err(gone()))
    }

    /// Attaches a client (S22).
    pub async fn attach(
        &self,
        id: &str,
        mode: AttachMode,
        filter: EventFilter,
    ) -> Result<Attachment<E>, SupervisorError> {
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::Attach {
            id,
            mode,
            filter,
            reply,
        })
        .await
        .unwrap_or_else(|| Err(gone()))
    }

    /// Detaches a session (S23).
    pub async fn detach(&self, id: &str) -> Result<(), SupervisorError> {
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::Detach { id, reply })
            .await
            .unwrap_or_else(|| Err(gone()))
    }

    /// Cancels a session by id (S24); answers the record's status afterwards.
    pub async fn cancel(&self, id: &str) -> Result<SessionStatus, SupervisorError> {
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::Cancel { id, reply })
            .await
            .unwrap_or_else(|| Err(gone()))
    }

    /// Stops every session in-band and returns their exit states (see
    /// [`SupervisorMsg::StopAll`]).
    pub async fn stop_all(&self, options: StopOptions) -> Vec<ExitState<I>> {
        self.ask(|reply| SupervisorMsg::StopAll { options, reply })
            .await
            .unwrap_or_default()
    }

    /// Closes the drain gate (S27; the shutdown coordinator's first step). `None` if
    /// the supervisor is gone.
    pub(crate) async fn close_gate(&self) -> Option<ClosedGate<I, E>> {
        self.ask(|reply| InternalMsg::CloseGate { reply }.into())
            .await
    }

    /// A feed of session ends ([`SessionEnd`]): every session that leaves the registry
    /// for good from now on, with its final exit state and so every item it still held.
    /// Ends before this call are not replayed. The feed ends (`None`) after the
    /// supervisor stopped and every session it held has been reported. `None` if the
    /// supervisor is gone.
    pub fn session_ends(&self) -> Option<mpsc::UnboundedReceiver<SessionEnd<I>>> {
        let (feed, rx) = mpsc::unbounded_channel();
        self.watch_ends(feed).then_some(rx)
    }

    /// Reports session ends on `feed` (see [`SupervisorHandle::session_ends`]); false if
    /// the supervisor is gone.
    pub fn watch_ends(&self, feed: mpsc::UnboundedSender<SessionEnd<I>>) -> bool {
        self.actor
            .send_message(SupervisorMsg::WatchEnds { feed })
            .is_ok()
    }

    /// Lists the live sessions.
    pub async fn list(&self) -> Vec<SessionSummary> {
        self.ask(|reply| SupervisorMsg::List { reply })
            .await
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod routed_push_error_tests {
    use super::*;

    /// A routed push's error is a `std::error::Error` (it goes into `anyhow` and `?`),
    /// and a session's own refusal is its source.
    #[test]
    fn a_routed_push_error_is_an_error_with_the_sessions_refusal_as_source() {
        let e: Box<dyn std::error::Error> = Box::new(RoutedPushError::UnknownSession {
            id: "s".to_string(),
            item: 1u32,
        });
        assert!(e.to_string().contains("no live session has id `s`"));
        assert!(e.source().is_none());
        let e: Box<dyn std::error::Error> =
            Box::new(RoutedPushError::Push(PushError::Late { item: 2u32 }));
        assert!(e.source().is_some(), "the session's refusal is the source");
    }
}
