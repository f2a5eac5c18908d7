//! # agentloop
//!
//! A runtime for long-running agent sessions on message-passing actors (ractor on
//! tokio). A *session* runs *turns* of your [`Agent`] over a queue of pushed *items*
//! (user messages, tool results, tasks). While a turn runs, the session keeps taking
//! pushes, stops and preemptions; a turn ends early only at a *safe point* the agent
//! declares (after a model call, after a round of tool calls). Stops carry options
//! (graceful, with a timeout, immediate, drain, a business cause); every accepted item
//! is accounted for in the session's [`ExitState`]; persistent sessions keep a record
//! in a checkpoint store (sled by default) and resume after a restart.
//!
//! ## Start here: a complete agent on a [`Runtime`]
//!
//! ```
//! use agentloop::prelude::*;
//!
//! /// An assistant that answers each message of a turn, with a safe point after its
//! /// (here pretend) model call.
//! struct Echo;
//!
//! impl Agent for Echo {
//!     type Item = String;   // what clients push
//!     type Event = String;  // what the agent streams while it works
//!     type State = u64;     // what a resumed turn continues from
//!
//!     async fn run_turn(&self, turn: Turn<Self>, cx: TurnCx<Self>)
//!         -> Result<TurnOutcome<u64>, AgentError>
//!     {
//!         for (answered, message) in turn.items.iter().enumerate() {
//!             cx.emit(format!("you said: {message}")).await;
//!             // A stop or a preempt may end the turn here; `?` propagates it.
//!             cx.safe_point(SafePoint::AfterModelCall, &(answered as u64 + 1))?;
//!         }
//!         Ok(TurnOutcome::Completed)
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // `.data_dir("./agentloop-data")` would keep persistent sessions in sled.
//!     let (runtime, _resumed) = Runtime::<String, String>::builder()
//!         .register_agent("echo", |_config: &[u8]| Ok(Echo))
//!         .start()
//!         .await?;
//!     let session = runtime.supervisor().spawn(SessionSpec::new("chat-1", "echo")).await?;
//!     let mut events = session.subscribe();
//!     session.push("hello".to_string()).await?;
//!     // Handle what was pushed, then end (`StopOptions::graceful()` would end the
//!     // running turn at its next safe point instead).
//!     session.stop(StopOptions::drain().cause("user left")).await?;
//!     let mut answers = Vec::new();
//!     while let Some(event) = events.next().await {
//!         if let SessionEvent::Agent { event, .. } = event {
//!             answers.push(event);
//!         }
//!     }
//!     assert_eq!(answers, ["you said: hello"]);
//!     let exit = session.wait().await;
//!     assert_eq!(exit.stop_cause.as_deref(), Some("user left"));
//!     assert_eq!(exit.counters.items_delivered, 1);
//!     runtime.shutdown().await?;
//!     Ok(())
//! }
//! ```
//!
//! ## One example per use case
//!
//! Each is one file in `examples/` (run with `cargo run --example NAME`; CI runs all):
//!
//! | example | shows |
//! |---|---|
//! | `quickstart` | one session end to end: items, events, a graceful stop with a cause |
//! | `preempt` | a newer message preempts the running turn at its next safe point (S7, S8) |
//! | `stop_and_resume` | a persistent session cut by a shutdown resumes after a restart (S17) |
//! | `human_approval` | an agent asks for approval, the runtime restarts, the answer resumes the turn (S4) |
//! | `detach_and_cancel` | a session handed to the background and canceled by id (S23, S24) |
//! | `history_and_fork` | turn-end checkpoints listed, one inspected, a new session forked from it |
//! | `embed_in_actor_tree` | your own ractor actor owns the session supervisor |
//! | `graceful_shutdown` | configuration, a cleanup hook, signals and the shutdown report (S27, S28) |
//!
//! ## Where things are
//!
//! - [`Runtime`] / [`RuntimeBuilder`]: the store, the instance lease, the
//!   [`SupervisorHandle`] (spawn, push, stop, detach, cancel by id) and the shutdown.
//! - [`SessionSpec`]: what a session is (id, agent kind, options), for a session
//!   started alone and one a supervisor starts.
//! - [`SessionHandle`]: one session without a supervisor.
//! - [`Agent`], [`Turn`], [`TurnCx`], [`TurnOutcome`]: what you implement and what a
//!   turn is given.
//! - [`StopOptions`], [`PushOptions`], [`Preempt`]: the options a stop or a push
//!   carries; [`SessionEvent`]: the event stream; [`ExitState`]: how a session ended.
//! - [`store`]: the checkpoint stores ([`MemoryStore`], sled through
//!   [`store::CheckpointActor`]); [`view`]: what a client may see of a record (redaction).
//! - [`prelude`]: the names most programs need, in one `use`.
//! - [`ractor`]: the actor library agentloop runs on, re-exported so your own actors
//!   use the same version; [`supervisor::SupervisorMsg`] and [`session::TurnLoopMsg`] work with its
//!   `cast!` / `call!` macros.
//!
//! The rule numbers in these docs (S1…) are listed with their one-line meaning in
//! `docs/semantics.md`.

#![warn(missing_docs)]

/// The `Agent` trait and what crosses it (it lives with the turn: `turn::agent`).
pub use turn::agent;
pub mod cancel;
pub mod cluster;
pub mod config;
pub mod error;
pub mod events;
pub mod exit;
pub use agentloop_core::{event_log, ids, interrupt, lifecycle};
pub mod liveness;
pub mod memory;
pub mod metrics;
pub mod operator_file;
pub mod options;
pub mod push;
pub mod runtime;
pub mod runtime_handle;
pub mod session;
pub(crate) mod shared;
pub mod shutdown;
pub mod store;
pub mod supervisor;
pub mod timers;
#[cfg(feature = "tls")]
pub mod tls;
pub mod turn;
/// Agent versions (DESIGN S40), kept with the kinds they version: `supervisor::versions`.
pub use supervisor::versions;
pub mod view;

/// The actor library agentloop runs on (ractor), re-exported so that your own actors,
/// and the `cast!` / `call!` macros you use on [`supervisor::SupervisorMsg`] and [`session::TurnLoopMsg`],
/// use the same version.
pub use ractor;

/// Declares message types local (never sent to another node) for ractor.
///
/// With agentloop's `cluster` feature, ractor's own `cluster` feature is on for the
/// whole program, which removes ractor's blanket `impl<T> Message for T`; every actor
/// message type must then say it is one. This macro writes that impl when the feature
/// is on and nothing when it is off, so your actors compile either way:
///
/// ```
/// enum AppMsg {
///     Start { id: String },
/// }
/// agentloop::local_message!(AppMsg);
/// ```
///
/// A message that must cross nodes implements `ractor::Message` itself (or derives it
/// with `ractor_cluster`'s `RactorClusterMessage`).
#[cfg(feature = "cluster")]
#[macro_export]
macro_rules! local_message {
    ($($t:ty),+ $(,)?) => { $(impl $crate::ractor::Message for $t {})+ };
}

/// Declares message types local (never sent to another node) for ractor.
///
/// With agentloop's `cluster` feature, ractor's own `cluster` feature is on for the
/// whole program, which removes ractor's blanket `impl<T> Message for T`; every actor
/// message type must then say it is one. This macro writes that impl when the feature
/// is on and nothing when it is off, so your actors compile either way:
///
/// ```
/// enum AppMsg {
///     Start { id: String },
/// }
/// agentloop::local_message!(AppMsg);
/// ```
///
/// A message that must cross nodes implements `ractor::Message` itself (or derives it
/// with `ractor_cluster`'s `RactorClusterMessage`).
#[cfg(not(feature = "cluster"))]
#[macro_export]
macro_rules! local_message {
    ($($t:ty),+ $(,)?) => {};
}

/// The names most programs need: `use agentloop::prelude::*;`.
pub mod prelude {
    pub use crate::agent::{
        Agent, AgentError, InterruptInfo, Plan, PlanInput, Turn, TurnOutcome, WakeUp,
    };
    pub use crate::cancel::SafePoint;
    pub use crate::events::{EventStream, SessionEvent, TurnEnd};
    pub use crate::options::{Preempt, PushOptions, StopOptions};
    pub use crate::runtime::{Runtime, RuntimeBuilder};
    pub use crate::session::{
        Durability, ExitReason, ExitState, SessionHandle, SessionSpec, TurnCx,
    };
    pub use crate::supervisor::SupervisorHandle;
}

// The crate root names what a program needs (issue 54: about 40 names); everything else
// is named by its module (`agentloop::store::SessionStatus`, `agentloop::supervisor::
// AgentKind`, …).
pub use agent::{Agent, AgentError, InterruptInfo, Plan, PlanInput, Turn, TurnOutcome};
pub use cancel::{Canceled, SafePoint};
pub use error::{SessionError, SpawnError};
pub use events::{EventFilter, EventStream, SessionEvent, TurnEnd};
pub use exit::{ExitReason, ExitState};
pub use options::{Preempt, PushOptions, StopOptions};
pub use session::{Durability, PreemptAck, PushError, SessionHandle, SessionSpec};
pub use turn::{Step, StepPolicy, TurnCx};
/// The README's API tour, compiled as a doctest so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use config::RuntimeConfig;
pub use runtime::{Runtime, RuntimeBuilder, RuntimeError, RuntimeHandle};
pub use store::{CheckpointStore, MemoryStore, StoreError};
pub use supervisor::{RestartPolicy, SupervisorArgs, SupervisorError, SupervisorHandle};
pub use timers::Schedule;
pub use view::SessionView;
