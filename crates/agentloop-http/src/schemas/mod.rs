//! The shapes of the HTTP front's answers as OpenAPI schemas (S43): one type per JSON
//! answer the handlers build, named as the wire names it. These types are never built:
//! the handlers write their JSON with the names in `wire.rs` and `events.rs`, and the
//! test `openapi.rs` holds the two together by validating every answer a real server
//! gives against the schema documented for its route and status (strictly: a field the
//! schema does not name fails it). Request bodies are not here: they are the handlers'
//! own types.

#![allow(dead_code)]

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

mod stream;
pub use stream::*;

/// An error answer: a stable `code` and a message that says what to do.
#[derive(ToSchema, Serialize)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// The stable, machine-readable code (see `ErrorCode`).
    pub code: ErrorCode,
    /// What happened and what to do, for a person.
    pub message: String,
    /// When to retry, in milliseconds (also `Retry-After`, in seconds): `not_live`,
    /// `session_full`, `too_many_sessions`.
    #[schema(nullable = false)]
    pub retry_after_ms: Option<u64>,
}

/// The code of an error answer. Clients match on it; the message is for people.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the body or a parameter cannot be used; the message names it.
    BadRequest,
    /// 401: no or wrong bearer token.
    Unauthorized,
    /// 403: (no token) the request's `Host` is not a loopback name.
    ForbiddenHost,
    /// 404: no session by that id, live or stored.
    UnknownSession,
    /// 404: the session keeps no checkpoint of that turn.
    UnknownCheckpoint,
    /// 404: the session has no such timer (it fired, or was canceled).
    UnknownTimer,
    /// 404: no route serves the path.
    NotFound,
    /// 405: the route does not take the method.
    MethodNotAllowed,
    /// 408: the request body did not arrive whole in time.
    BodyTimeout,
    /// 409: a session or record exists under the id.
    Duplicate,
    /// 409: the session is not in a state for this.
    WrongState,
    /// 409: an idempotency key reused with another push.
    IdempotencyMismatch,
    /// 409: the record's agent version neither runs here nor migrates (S40).
    VersionUnavailable,
    /// 409: (cluster) the request cannot cross to the node that runs the session.
    NotForwardable,
    /// 409: `move` on a server that is not a cluster node.
    NotANode,
    /// 413: the body is over the limit.
    TooLarge,
    /// 414: the request line is longer than the server reads.
    UriTooLong,
    /// 431: the request head is over `[http] max_header_bytes`; the connection is
    /// closed.
    HeadersTooLarge,
    /// 415: (no token) a `POST` that is not JSON and has no `X-Agentloop-Client`.
    JsonRequired,
    /// 429: requests in flight or event streams at their bound.
    TooMany,
    /// 429: the server runs as many sessions as it may; `Retry-After`.
    TooManySessions,
    /// 429: the session holds `[limits] session_timers` timers; nothing armed;
    /// `Retry-After`.
    TooManyTimers,
    /// 429: the session holds all it may; nothing accepted; `Retry-After`.
    SessionFull,
    /// 503: the server holds more memory than its budget (`[limits] memory`); nothing
    /// new accepted; `Retry-After`.
    OverMemory,
    /// 500: the store failed; the message names it.
    Internal,
    /// 502: (cluster) the node that runs the session could not be reached.
    OwnerUnreachable,
    /// 503: the shutdown began; nothing new is accepted.
    Draining,
    /// 503: stored, not live yet; `Retry-After`.
    NotLive,
    /// 503: the server could not take the request now (its blocking pool failed).
    Unavailable,
}

/// A session's id (S32): 1 to 128 bytes of UTF-8 without control characters, as
/// `agentloop::ids::validate_session_id` takes it (the schema counts characters; the
/// server counts bytes).
#[derive(ToSchema, Serialize)]
#[schema(
    min_length = 1,
    max_length = 128,
    pattern = r"^[^\u0000-\u001F\u007F-\u009F]+$"
)]
pub struct SessionIdText(pub String);

/// `GET /healthz`.
#[derive(ToSchema, Serialize)]
pub struct Health {
    /// Always `up`.
    #[schema(pattern = "^up$")]
    pub status: String,
}

/// `GET /readyz`.
#[derive(ToSchema, Serialize)]
pub struct Ready {
    /// Always `ready`.
    #[schema(pattern = "^ready$")]
    pub status: String,
}

/// A session's status, as a stable name.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusName {
    /// It runs (or its record says it does).
    Running,
    /// It sleeps (S39): its record holds it; a push or a timer wakes it.
    Sleeping,
    /// It stopped and can run again.
    Stopped,
    /// A turn stopped on an interrupt.
    Interrupted,
    /// It finished its work.
    Completed,
    /// It was canceled.
    Canceled,
    /// It failed.
    Failed,
}

/// Where a session is: it runs here, it sleeps (S39), or it is only stored.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    /// It runs in this process.
    Live,
    /// Its record says it sleeps and it does not run.
    Sleeping,
    /// Only its record exists.
    Stored,
}

/// A safe point's name.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SafePointName {
    /// After a model call.
    AfterModelCall,
    /// After the tool calls.
    AfterToolCalls,
    /// At either.
    Any,
    /// None (never asked for; shown where a cancel had no safe point).
    None,
}

/// `POST /sessions` (201) and `POST /sessions/{id}/history/{turn}/fork`'s new id.
#[derive(ToSchema, Serialize)]
pub struct Spawned {
    /// The session's id.
    pub id: String,
}

/// A row of `GET /sessions`.
#[derive(ToSchema, Serialize)]
pub struct SessionRow {
    /// The session's id.
    pub id: String,
    /// Its agent kind (`null` for a record that does not decode, or a session kept
    /// only as checkpoint history or events, S26a).
    pub kind: Option<String>,
    /// The version of its kind (S40): the stored record's or the one it runs.
    pub version: Option<u32>,
    /// It runs in this process.
    pub live: bool,
    /// Where it is.
    pub presence: Presence,
    /// The same as `presence` (kept for older clients).
    pub state: Presence,
    /// Where it stands (S26a), judged the same at every door from what runs and what
    /// is stored; `unreadable` for a record that does not decode.
    pub status: RowStatus,
    /// How often the supervisor restarted it (`null` when it is not live).
    pub restarts: Option<u64>,
    /// Why the record does not decode (with `status: unreadable`).
    #[schema(nullable = false)]
    pub error: Option<String>,
}

/// A row's stored status: a status name, or `unreadable`.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowStatus {
    /// See `StatusName`.
    Running,
    /// See `StatusName`.
    Sleeping,
    /// See `StatusName`.
    Stopped,
    /// See `StatusName`.
    Interrupted,
    /// See `StatusName`.
    Completed,
    /// See `StatusName`.
    Canceled,
    /// See `StatusName`.
    Failed,
    /// The record does not decode (see `error`).
    Unreadable,
}

/// The S24 view of a session (`GET /sessions/{id}`) or of a kept checkpoint (`GET
/// /sessions/{id}/history/{turn}`): every payload as JSON through the server's
/// redaction. A session that runs here and was never written has only `session_id`,
/// `status`, `live`, `presence`, `kept` and `run`.
#[derive(ToSchema, Serialize)]
pub struct SessionView {
    /// The session's id.
    pub session_id: String,
    /// Its agent kind.
    #[schema(nullable = false)]
    pub agent_kind: Option<String>,
    /// The version of its kind that wrote the record (S40).
    #[schema(nullable = false)]
    pub agent_version: Option<u32>,
    /// Its status (`null`: nothing stored yet).
    pub status: Option<StatusName>,
    /// The failure, for a failed record.
    pub last_error: Option<String>,
    /// The business stop cause.
    pub stop_cause: Option<String>,
    /// The next turn's index (or the cut turn's).
    #[schema(nullable = false)]
    pub turn_index: Option<u64>,
    /// Items accepted and not consumed, in offer order.
    #[schema(nullable = false)]
    pub unhandled_items: Option<Vec<Value>>,
    /// The cut turn's items.
    #[schema(nullable = false)]
    pub interrupted_items: Option<Vec<Value>>,
    /// The agent's state: the cut turn's, or (with `state_carried`) the state the
    /// session carries between turns.
    pub state: Option<Value>,
    /// `state` is the carried state, not a cut turn's.
    #[schema(nullable = false)]
    pub state_carried: Option<bool>,
    /// The interrupt, if the session stopped on one.
    pub interrupt: Option<InterruptView>,
    /// Last update, ms since the Unix epoch.
    #[schema(nullable = false)]
    pub updated_at_ms: Option<u64>,
    /// The record's version (each write adds one).
    #[schema(nullable = false)]
    pub version: Option<u64>,
    /// The session's own settings (durability, history, replay, restart policy, event
    /// retention), restored when it resumes; `null` for an older record.
    #[schema(value_type = Option<Object>)]
    pub settings: Option<Value>,
    /// The cut turn's durable steps (S1b).
    pub steps: Option<StepsView>,
    /// Durable timers and schedules (S39).
    #[schema(nullable = false)]
    pub timers: Option<Vec<TimerView>>,
    /// The record says the session sleeps (S39).
    #[schema(nullable = false)]
    pub asleep: Option<bool>,
    /// (`GET /sessions/{id}` only) it runs in this process.
    #[schema(nullable = false)]
    pub live: Option<bool>,
    /// (`GET /sessions/{id}` only) where it is.
    #[schema(nullable = false)]
    pub presence: Option<Presence>,
    /// (`GET /sessions/{id}` only, while it runs here) what it does.
    #[schema(nullable = false)]
    pub run: Option<RunView>,
    /// (`GET /sessions/{id}` only) what the store keeps of it (S26a).
    #[schema(nullable = false)]
    pub kept: Option<Kept>,
}

/// What the store keeps of a session (S26a): a session is known while any of it is.
#[derive(ToSchema, Serialize)]
pub struct Kept {
    /// Its record.
    pub record: bool,
    /// How many turn-end checkpoints its history keeps (`GET /sessions/{id}/history`).
    pub history: u64,
    /// The highest number of its kept events (`GET /sessions/{id}/events`); 0: none.
    pub events: u64,
}

/// A stored interrupt.
#[derive(ToSchema, Serialize)]
pub struct InterruptView {
    /// Why the turn stopped.
    pub reason: String,
    /// The question, redacted.
    pub question: Value,
    /// Whether the session waits for an answer (`POST /sessions/{id}/resume`).
    pub awaiting_answer: bool,
}

/// The cut turn's durable steps (S1b).
#[derive(ToSchema, Serialize)]
pub struct StepsView {
    /// The turn they belong to.
    pub turn: u64,
    /// How many of its steps the stored state covers.
    pub covered: u32,
    /// The journaled steps after them, in order.
    pub journaled: Vec<StepView>,
}

/// One journaled step.
#[derive(ToSchema, Serialize)]
pub struct StepView {
    /// Its position among the turn's steps of its name.
    pub occurrence: u32,
    /// Its name.
    pub name: String,
    /// Its full key.
    pub key: String,
    /// Its result is journaled (replayed when the turn runs again).
    pub finished: bool,
    /// Its result, redacted as the state is.
    pub result: Option<Value>,
}

/// A timer as a session's view shows it.
#[derive(ToSchema, Serialize)]
pub struct TimerView {
    /// Its number (what cancels it).
    pub id: u64,
    /// When it is due next, ms since the Unix epoch.
    pub due_ms: u64,
    /// The item it pushes (redacted).
    pub item: Value,
    /// `every <n>ms` or a cron expression; `null` for a one-off timer.
    pub schedule: Option<String>,
    /// How many times it fired.
    pub fired: u64,
}

/// What a live session does (`GET /sessions/{id}`).
#[derive(ToSchema, Serialize)]
pub struct RunView {
    /// `idle`, `planning` or `running`.
    pub phase: Phase,
    /// The turn it runs or will run.
    pub turn_index: u64,
    /// Items waiting for the next turn.
    pub buffered: usize,
    /// Items of a preempted turn waiting for the next plan.
    pub preempted: usize,
    /// A stop was committed.
    pub stop_committed: bool,
    /// Its restart policy, budget and how much of the budget is used (S26): whether
    /// a failure now would be restarted.
    #[schema(nullable = false)]
    pub restarts: Option<RestartUse>,
}

/// A live session's restart budget and its use (S26).
#[derive(ToSchema, Serialize)]
pub struct RestartUse {
    /// When it is restarted: `permanent` (after any failure but a permanent one),
    /// `transient` (after a panic or an internal error) or `never`. A permanent agent
    /// error is never restarted.
    pub policy: String,
    /// Restarts within the budget's window so far.
    pub used: u32,
    /// Restarts the budget allows within its window; past it the session ends
    /// `failed`.
    pub limit: u32,
    /// The window, in seconds.
    pub window_s: u64,
    /// Restarts since it was spawned, whatever the window.
    pub total: u32,
}

/// A live session's phase.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Between turns.
    Idle,
    /// Planning a turn.
    Planning,
    /// In a turn.
    Running,
}

/// `DELETE /sessions/{id}`. (Named `SessionDeleted`: a schema named as one of its
/// properties, `Deleted.deleted`, makes generated Python fail `mypy --strict`.)
#[derive(ToSchema, Serialize)]
#[schema(as = SessionDeleted)]
pub struct Deleted {
    /// The session's id.
    pub id: String,
    /// Always `true`.
    pub deleted: bool,
}

/// `POST /sessions/{id}/items`.
#[derive(ToSchema, Serialize)]
pub struct Pushed {
    /// What became of the preempt the push asked for.
    pub preempt: PreemptAck,
}

/// A push's preempt acknowledgement.
#[derive(ToSchema, Serialize)]
pub struct PreemptAck {
    /// `not_requested`, `no_target`, `submitted`, `target_ended`, `scheduled` or
    /// `duplicate` (a key the session holds: delivered before, not again).
    pub kind: PreemptKind,
    /// The turn it targets.
    #[schema(nullable = false)]
    pub turn: Option<u64>,
}

/// See `PreemptAck`.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptKind {
    /// No preempt was asked for.
    NotRequested,
    /// No turn to preempt.
    NoTarget,
    /// Sent to the running turn.
    Submitted,
    /// The turn ended first.
    TargetEnded,
    /// It waits (a delay, or a planning target); the events show when it lands.
    Scheduled,
    /// A retry with a key the session holds: delivered once, not again.
    Duplicate,
}

/// `POST /sessions/{id}/stop` (202). (Not `Stopping`: see `SessionDeleted`.)
#[derive(ToSchema, Serialize)]
#[schema(as = SessionStopping)]
pub struct Stopping {
    /// The session's id.
    pub id: String,
    /// Always `true`.
    pub stopping: bool,
}

/// `POST /sessions/{id}/detach`. (Not `Detached`: see `SessionDeleted`.)
#[derive(ToSchema, Serialize)]
#[schema(as = SessionDetached)]
pub struct Detached {
    /// The session's id.
    pub id: String,
    /// Always `true`.
    pub detached: bool,
}

/// `POST /sessions/{id}/move`.
#[derive(ToSchema, Serialize)]
pub struct Moved {
    /// The session's id.
    pub id: String,
    /// The node that runs it now.
    pub to: String,
    /// How long it was stopped, in ms.
    pub stopped_ms: u64,
    /// How long the move took, in ms.
    pub total_ms: u64,
}

/// `POST /sessions/{id}/cancel`.
#[derive(ToSchema, Serialize)]
pub struct Canceled {
    /// The session's id.
    pub id: String,
    /// Its status after the cancel.
    pub status: StatusName,
}

/// `POST /sessions/{id}/resume`. (Not `Resumed`: see `SessionDeleted`.)
#[derive(ToSchema, Serialize)]
#[schema(as = SessionResumed)]
pub struct Resumed {
    /// The session's id.
    pub id: String,
    /// Always `true`.
    pub resumed: bool,
}

/// A kept checkpoint (`GET /sessions/{id}/history`).
#[derive(ToSchema, Serialize)]
pub struct HistoryEntry {
    /// The turn it ended.
    pub turn: u64,
    /// When it was written, ms since the Unix epoch.
    pub at_ms: u64,
    /// Its size in bytes.
    pub size: usize,
}

/// `POST /sessions/{id}/history/{turn}/fork` (201).
#[derive(ToSchema, Serialize)]
pub struct Forked {
    /// The new session's id.
    pub id: String,
    /// The session it was forked from.
    pub from: String,
    /// The checkpoint's turn.
    pub turn: u64,
}

/// A timer (`POST /sessions/{id}/timers`, `GET /sessions/{id}/timers`).
#[derive(ToSchema, Serialize)]
pub struct Timer {
    /// Its number (what cancels it).
    pub id: u64,
    /// When it is due next, ms since the Unix epoch.
    pub due_ms: u64,
    /// The item it pushes.
    pub item: Value,
    /// `every <n>ms` or a cron expression; `null` for a one-off timer.
    pub schedule: Option<String>,
    /// How many times it fired.
    pub fired: u64,
    /// When it was armed, ms since the Unix epoch.
    pub armed_ms: u64,
}

/// `GET /sessions/{id}/timers`. (Not `Timers`: see `SessionDeleted`.)
#[derive(ToSchema, Serialize)]
#[schema(as = TimerList)]
pub struct Timers {
    /// By number.
    pub timers: Vec<Timer>,
}

/// A spawn's durability: `sync` (every push durable before it is answered), `turn`
/// (at turn ends) or `exit` (when the session exits).
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DurabilityName {
    /// Every accepted item is durable before the push is answered.
    Sync,
    /// Written at turn ends.
    Turn,
    /// Written when the session exits.
    Exit,
}

/// A stop's mode.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopMode {
    /// Finish the turn, then stop (`timeout` escalates to immediate).
    Graceful,
    /// Cancel at the safe point `at` (`timeout` escalates).
    At,
    /// Cancel the turn now.
    Immediate,
    /// Handle every waiting item, then stop.
    Drain,
    /// No cancel: the running turn completes, waiting items stay unhandled.
    Bare,
    /// Stop once idle for `idle_for`.
    Idle,
}
