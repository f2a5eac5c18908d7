//! The schemas of `GET /sessions/{id}/events`: one Server-Sent Event per variant of
//! [`StreamEvent`], each with its `data` shape (S20, S43). Like the rest of `schemas`,
//! never built: the test `openapi.rs` validates the stream a real server sends.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::{ErrorBody, SafePointName};

/// One Server-Sent Event of `GET /sessions/{id}/events`: its `event:` line is `event`,
/// its `data:` line is `data` as JSON, and its `id:` line is its sequence number.
#[derive(ToSchema, Serialize)]
#[serde(tag = "event", content = "data", rename_all = "snake_case")]
pub enum StreamEvent {
    /// A turn began.
    TurnStarted(TurnStarted),
    /// The agent's own event, through the redaction.
    Agent(AgentEvent),
    /// A durable step began (S1b).
    StepStarted(StepStarted),
    /// A durable step finished, ran or replayed (S1b).
    StepFinished(StepFinished),
    /// A preempt landed.
    Preempted(TurnOnly),
    /// A turn ended.
    TurnEnded(TurnEnded),
    /// A stop was requested.
    StopRequested(StopRequested),
    /// Events this stream missed (numbered as the last of them), exactly or at most
    /// (`upper_bound`).
    Lagged(Lagged),
    /// The session ended and nothing of it will run again; the stream closes after it.
    Ended(Ended),
    /// The session failed and its supervisor starts it again (issue 53): the last event
    /// of this incarnation's stream, which closes after it; reconnect with
    /// `Last-Event-ID` (an `EventSource` does) to follow the next one.
    Restarting(Restarting),
    /// (the only event of a stream for a session stored but not live yet) retry after
    /// `retry_after_ms`.
    NotLive(ErrorBody),
}

/// `turn_started`.
#[derive(ToSchema, Serialize)]
pub struct TurnStarted {
    /// The turn's index.
    pub turn: u64,
    /// How many items it takes.
    pub items: usize,
    /// It is a cut turn run again.
    pub resumed: bool,
}

/// `agent`.
#[derive(ToSchema, Serialize)]
pub struct AgentEvent {
    /// The turn's index.
    pub turn: u64,
    /// The agent's event as JSON.
    pub event: Value,
}

/// `step_started`.
#[derive(ToSchema, Serialize)]
pub struct StepStarted {
    /// The turn's index.
    pub turn: u64,
    /// The step's full key.
    pub key: String,
    /// Its name.
    pub name: String,
    /// Its position among the turn's steps of that name.
    pub occurrence: u32,
    /// It runs again (a `Retry` step whose result was not journaled).
    pub rerun: bool,
}

/// `step_finished`.
#[derive(ToSchema, Serialize)]
pub struct StepFinished {
    /// The turn's index.
    pub turn: u64,
    /// The step's full key.
    pub key: String,
    /// Its name.
    pub name: String,
    /// Its position among the turn's steps of that name.
    pub occurrence: u32,
    /// Answered from the journal, not run.
    pub replayed: bool,
    /// A `NoRetry` step whose outcome is unknown, not run again.
    pub unknown: bool,
}

/// `preempted`.
#[derive(ToSchema, Serialize)]
pub struct TurnOnly {
    /// The turn's index.
    pub turn: u64,
}

/// `turn_ended`.
#[derive(ToSchema, Serialize)]
pub struct TurnEnded {
    /// The turn's index.
    pub turn: u64,
    /// How it ended.
    pub outcome: TurnOutcome,
    /// Its checkpoint is durable.
    pub durable: bool,
}

/// How a turn ended.
#[derive(ToSchema, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TurnOutcome {
    /// It finished.
    Completed,
    /// A preempt cut it.
    Preempted {
        /// How.
        cancel: CancelInfo,
    },
    /// A cancel cut it.
    Canceled {
        /// How.
        cancel: CancelInfo,
    },
    /// It stopped on an interrupt.
    Interrupted {
        /// Why.
        reason: String,
        /// The question (redacted).
        question: Value,
    },
    /// It failed.
    Failed {
        /// The error.
        error: String,
    },
    /// Its plan was aborted.
    PlanAborted {
        /// The error.
        error: String,
    },
}

/// How a cancel ended a turn.
#[derive(ToSchema, Serialize)]
pub struct CancelInfo {
    /// The cancel's mode.
    pub mode: CancelMode,
    /// The safe point it landed at.
    pub at: Option<SafePointName>,
    /// It escalated to immediate.
    pub escalated: bool,
    /// Its timeout ran out.
    pub timed_out: bool,
    /// The agent failed while it was canceled.
    pub agent_error: Option<String>,
}

/// A cancel's mode: `"immediate"` or `{"at": <safe point>}`.
#[derive(ToSchema, Serialize)]
#[serde(untagged)]
pub enum CancelMode {
    /// `"immediate"`.
    Immediate(ImmediateName),
    /// `{"at": <safe point>}`.
    At(CancelAt),
}

/// The word `immediate`.
#[derive(ToSchema, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImmediateName {
    /// At once.
    Immediate,
}

/// A cancel at a safe point.
#[derive(ToSchema, Serialize)]
pub struct CancelAt {
    /// Where.
    pub at: SafePointName,
}

/// `stop_requested`.
#[derive(ToSchema, Serialize)]
pub struct StopRequested {
    /// The cancel the stop carries, if any.
    pub cancel: Option<CancelMode>,
    /// The stop cause.
    pub cause: Option<String>,
}

/// `lagged`.
#[derive(ToSchema, Serialize)]
pub struct Lagged {
    /// How many numbers this stream skips here: the numbers after the client's last
    /// id up to this event's id (it is numbered as the last of them). Each number
    /// that was given to an event is an event the stream cannot replay.
    pub missed: u64,
    /// `false`: every one of the `missed` numbers was an event, so exactly `missed`
    /// events were lost. `true`: some may never have been given to an event (a server
    /// crashed holding numbers it had reserved ahead, S20a; those it gave and did not
    /// write are among them), so at most `missed` were lost. Either way the stream
    /// goes on after this event's id; a client that needs every event reloads the
    /// state it derives from them.
    pub upper_bound: bool,
}

/// `restarting`.
#[derive(ToSchema, Serialize)]
pub struct Restarting {
    /// Which restart this is within the session's life (1 for the first).
    pub attempt: u32,
    /// In how many milliseconds the new incarnation starts (0: at once).
    pub after_ms: u64,
    /// Why the incarnation failed.
    pub error: String,
}

/// `ended`.
#[derive(ToSchema, Serialize)]
pub struct Ended {
    /// The session's id.
    pub session_id: String,
    /// Why it ended; `shutdown`: the server is going away (reconnect later).
    pub reason: ExitReason,
    /// The stop cause.
    pub stop_cause: Option<String>,
    /// Items accepted and not consumed.
    pub unhandled: usize,
    /// The cut turn's items.
    pub interrupted: usize,
    /// Items that arrived after the stop was committed.
    pub late: usize,
    /// Whether its exit checkpoint was written.
    pub checkpoint: CheckpointOutcome,
}

/// Why a session ended.
#[derive(ToSchema, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExitReason {
    /// It finished its work.
    Completed,
    /// It was canceled.
    Canceled {
        /// How.
        cancel: CancelInfo,
    },
    /// It stopped on an interrupt.
    Interrupted {
        /// Why.
        reason: String,
        /// The question (redacted).
        question: Value,
    },
    /// It failed.
    Failed {
        /// The error.
        error: String,
    },
    /// The server is shutting down (the session resumes when it is back).
    Shutdown,
    /// It went to sleep (S39).
    Asleep,
}

/// Whether the exit checkpoint was written.
#[derive(ToSchema, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CheckpointOutcome {
    /// None was attempted.
    NotAttempted,
    /// Written.
    Saved,
    /// Writing failed.
    Failed {
        /// The error.
        error: String,
    },
    /// The record was deleted.
    Deleted,
}
