//! # agentloop
//!
//! A runtime for long-running agent sessions on message-passing actors (ractor on
//! tokio). Each session is a [`TurnLoop`] actor that runs *turns* of an [`Agent`] over a
//! queue of pushed items. Sessions can be preempted at safe points, stopped with
//! options, checkpointed, resumed, and they report every item they accepted in their
//! [`ExitState`].
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use agentloop::*;
//! # async fn demo<A: Agent<Item = String, Event = String>>(agent: A) -> Result<(), Box<dyn std::error::Error>> {
//! let session = SessionHandle::spawn(SessionConfig::new("chat-1"), Arc::new(agent), None).await?;
//! let mut events = session.subscribe();
//! session.push("hello".to_string()).await?;
//! session.stop(StopOptions::graceful().cause("user left")).await?;
//! while let Some(event) = events.next().await {
//!     println!("{event:?}");
//! }
//! let exit = session.wait().await;
//! assert_eq!(exit.stop_cause.as_deref(), Some("user left"));
//! # Ok(()) }
//! ```
//!
//! The semantics are numbered in the design contract (S1…S32) and described as built in
//! `docs/semantics.md`.

#![warn(missing_docs)]

pub mod agent;
pub mod cancel;
pub mod config;
pub mod error;
pub mod events;
pub mod exit;
pub mod ids;
pub mod options;
pub mod push;
pub mod runtime;
pub mod session;
pub(crate) mod shared;
pub mod shutdown;
pub mod store;
pub mod supervisor;
pub mod turn;
pub mod view;

pub use agent::{Agent, AgentError, InterruptInfo, Plan, PlanInput, Turn, TurnOutcome};
pub use cancel::{CancelInfo, CancelMode, CancelRequest, CancelState, Canceled, SafePoint};
pub use error::{SessionError, SpawnError};
pub use events::{EventFilter, EventStream, Sequenced, SessionEvent, TurnEnd};
pub use options::{OptionsError, Preempt, PushOptions, StopOptions, TurnPhase, TurnView};
pub use session::{
    AnswerError, CheckpointOutcome, Durability, ExitCounters, ExitReason, ExitState, ExitSummary,
    FailureKind, ForkError, PreemptAck, PushError, SessionConfig, SessionHandle, SessionInfo, Step,
    TurnCx, TurnLoop, TurnLoopMsg,
};
/// The README's API tour, compiled as a doctest so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use config::{ConfigError, RedactConfig, RuntimeConfig, ShutdownConfig};
pub use runtime::{Runtime, RuntimeBuilder, RuntimeError, StartReport};
pub use shutdown::{CleanupHook, ShutdownHandle, ShutdownReport, ShutdownStrategy};
pub use store::{
    CasOutcome, CheckpointActor, CheckpointClient, CheckpointStore, InstanceLease, MemoryStore,
    SessionRecord, SessionStatus, StatusKind, StoreError, DEFAULT_HEARTBEAT,
};
pub use supervisor::{
    agent_kind, AgentKind, AttachMode, Attachment, ClosedGate, GateMember, RestartBudget,
    RestartPolicy, RoutedPushError, SessionEnd, SessionSpec, SessionSupervisor, SubscribedSpawn,
    SupervisorArgs, SupervisorError, SupervisorHandle, SupervisorMsg,
};
pub use view::{Part, Redaction, SessionView};
