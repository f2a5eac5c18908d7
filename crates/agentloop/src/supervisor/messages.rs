//! The supervisor's messages (public: other actors may `cast!` / `call!` it) and what
//! they answer with: listing lines, attachments, session ends, and the internal
//! messages of the shutdown's drain gate, a routed push's retry and an answer's claim.
//! Plain data: the actor handles them.

use super::error::SupervisorError;
use crate::events::{EventFilter, EventStream};
use crate::options::{PushOptions, StopOptions};
use crate::push::PushError;
use crate::session::SessionSpec;
use crate::session::{BoundClient, ExitState, PreemptAck, SessionHandle, SessionInfo};
use crate::store::{CheckpointStore, SessionStatus};
use ractor::RpcReplyPort;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One line of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    /// The session's id.
    pub id: String,
    /// Its agent kind.
    pub kind: String,
    /// The version of its kind it runs (S40).
    pub version: u32,
    /// How many times it was restarted.
    pub restarts: u32,
}

/// A live session's restart budget and how much of it is used (S26): what a client
/// needs to tell whether a failure will be restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RestartUse {
    /// When it is restarted: `permanent`, `transient` or `never`.
    pub policy: crate::session::RestartPolicy,
    /// Restarts within the budget's window so far.
    pub used: u32,
    /// Restarts the budget allows within its window.
    pub limit: u32,
    /// The window, in seconds.
    pub window_s: u64,
    /// Restarts since it was spawned, whatever the window.
    pub total: u32,
}

/// How many sessions a supervisor holds, by state (S39): cheap to read however many
/// sleep, for gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionsByState {
    /// Sessions with a running actor.
    pub live: usize,
    /// Sessions asleep (no actor; their record holds them).
    pub sleeping: usize,
}

/// The most specs one [`SupervisorMsg::SpawnBatch`] may carry: a bound on the time the
/// supervisor spends on one message (other requests wait behind it) and on the reply's
/// size. [`SupervisorHandle::spawn_batch`](super::SupervisorHandle::spawn_batch) splits a longer list into batches of this
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
    /// dropped with a WARN: split it, as [`SupervisorHandle::spawn_batch`](super::SupervisorHandle::spawn_batch) does).
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
        reply: RpcReplyPort<Result<PreemptAck, PushError<I>>>,
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
    /// List the live sessions (those asleep are listed by their records, S39).
    List {
        /// Where to answer.
        reply: RpcReplyPort<Vec<SessionSummary>>,
    },
    /// List one page of the live sessions in id order: those after `after`, at most
    /// `limit` (issue 52: a page costs what it returns).
    ListPage {
        /// Start after this id (from the first when `None`).
        after: Option<String>,
        /// The most sessions on the page.
        limit: usize,
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
    /// Write a session's record now (see `SessionHandle::checkpoint`).
    Checkpoint {
        /// The session.
        id: String,
        /// Where to answer.
        reply: RpcReplyPort<Result<(), SupervisorError>>,
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
    /// A live session's restart budget and its use (S26, issue 53).
    RestartUse {
        /// The session.
        id: String,
        /// Where to answer (`None`: no session of that id runs here).
        reply: RpcReplyPort<Option<RestartUse>>,
    },
    /// How many sessions it holds, live and asleep (S39).
    Counts {
        /// Where to answer.
        reply: RpcReplyPort<SessionsByState>,
    },
    /// Sessions whose records say they sleep, registered asleep without an actor (the
    /// runtime's resume, S39): the first push or by-id operation wakes each.
    Sleepers {
        /// (id, agent kind) of each.
        sessions: Vec<(String, String)>,
        /// Where to answer: the ids refused because their kind is not registered (ids
        /// already held are skipped silently).
        reply: RpcReplyPort<Vec<String>>,
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
    /// The supervisor's feed of session ends, opened with the gate: every one of
    /// `sessions` is reported on it when it leaves the registry (the one feed of ends
    /// the shutdown and [`SupervisorHandle::session_ends`](crate::supervisor::SupervisorHandle::session_ends)
    /// share).
    pub ends: mpsc::UnboundedReceiver<SessionEnd<I>>,
}

/// Internal: a push to retry on the new incarnation.
pub(crate) struct Reroute<I> {
    pub(super) id: String,
    pub(super) item: I,
    pub(super) options: PushOptions<I>,
    pub(super) reply: RpcReplyPort<Result<PreemptAck, PushError<I>>>,
    pub(super) tries: u32,
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

/// The supervisor's store, owner and registered kinds (for an answer's claim).
pub(crate) struct RecordContext<I> {
    pub(super) store: Option<Arc<dyn CheckpointStore<I>>>,
    pub(super) owner: Option<String>,
    pub(super) kinds: Vec<String>,
    /// The bound of live sessions, when the supervisor runs that many already (a
    /// fork is refused before it writes anything, issue 52).
    pub(super) full: Option<usize>,
}
