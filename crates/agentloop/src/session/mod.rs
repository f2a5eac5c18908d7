//! Sessions: the TurnLoop actor and everything one session is made of (DESIGN §2–§7).
//!
//! One file per concern: `core/` (every decision, sans-IO: plain handlers over state
//! and events that return effects), `ledger` (`agentloop-core`'s: every accepted item's place; the only
//! code that moves an item), the actor shell around the core (`turn_loop`: the dispatch;
//! `effects`: performing what the core returns; `load`: reading the record at start;
//! `teardown`: the exit), `turn_task` (the task that runs agent code), `messages` (the
//! public message type), `handle` (the typed async handle), `spec` (what a session is) and `config` (the
//! types of its options). What a turn shares with its
//! session lives in `crate::turn`, the exit state in `crate::exit`, a push's answers in
//! `crate::push`, the state handles read after the actor is gone in `crate::shared`.

pub(crate) mod answer;
#[cfg(feature = "bench-shell")]
#[doc(hidden)]
pub mod bench_shell;
mod config;
pub(crate) mod core;
mod effects;
pub(crate) mod fork;
mod handle;
mod info;
pub(crate) mod keys;
mod push;
mod spawn;
pub(crate) use agentloop_core::ledger;
mod load;
pub(crate) use load::judge_owner;
mod loop_state;
pub(crate) mod messages;
use agentloop_core::settings;
pub(crate) mod restart;
mod session_ref;
mod spec;
mod teardown;
mod turn_loop;
mod turn_task;

pub use crate::exit::{
    CheckpointOutcome, ExitCounters, ExitReason, ExitState, ExitSummary, FailureKind,
};
pub use crate::turn::{Step, TurnCx};
pub use answer::AnswerError;
pub use config::{
    validate_session_id, BufferBound, Durability, EndHook, SessionIdError, MAX_SESSION_ID_LEN,
};
pub use fork::ForkError;
pub use handle::{BoundClient, SessionHandle};
pub use keys::{KeptKey, KEPT_KEYS, UNANSWERED_KEYS};
pub use messages::{PreemptAck, PushError, PushReply, SessionInfo, TurnLoopMsg};
pub use push::{Push, Pushed};
pub use settings::{RestartPolicy, SessionSettings};
pub use spawn::{SessionSpawn, SessionSpawnSubscribed};
pub(crate) use spec::RunContext;
pub use spec::SessionSpec;
