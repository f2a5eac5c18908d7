//! Sessions: the TurnLoop actor and everything one session is made of (DESIGN §2–§6).
//!
//! One file per concern: `turn_loop` (the actor and its decisions), `turn_task` (the
//! task that runs agent code), `control` (what a turn shares with its task), `context`
//! (the agent's `TurnCx`), `stop` (how stop requests combine), `exit` (the exit state),
//! `messages` (the public message type), `handle` (the typed async handle), `config`,
//! and `shared` (the state handles read after the actor is gone).

mod config;
pub(crate) mod core;
mod handle;
pub(crate) mod ledger;
pub(crate) mod messages;
mod turn_loop;
mod turn_task;

pub use crate::exit::{
    CheckpointOutcome, ExitCounters, ExitReason, ExitState, ExitSummary, FailureKind,
};
pub use crate::turn::{Step, TurnCx};
pub use config::{
    validate_session_id, Durability, EndHook, SessionConfig, SessionIdError, MAX_SESSION_ID_LEN,
};
pub use handle::{BoundClient, SessionHandle};
pub use messages::{
    Internal, PreemptAck, PushError, PushReply, SessionInfo, TurnLoopMsg, UnprocessedPush,
};
pub use turn_loop::{LoopState, TurnLoop, TurnLoopArgs};
