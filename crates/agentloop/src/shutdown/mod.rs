//! Shutdown (DESIGN S27, S28): the coordinator actor, its strategies, the sessions'
//! bookkeeping during a shutdown, cleanup hooks, the report and signals.
//!
//! One file per concern: `coordinator` (the actor and its handle), `strategy` (the
//! trait, the context strategies drive and the built-ins), `sessions` (grace, force,
//! kill, records of killed sessions), `cleanup` (hooks and their bound), `report`,
//! `signals`. The configuration (`[shutdown]` in `agentloop.toml`) is in
//! [`crate::config`].

pub mod cleanup;
pub mod coordinator;
pub mod report;
mod sessions;
pub mod signals;
pub mod strategy;

pub use cleanup::CleanupHook;
pub use coordinator::{
    CoordinatorArgs, CoordinatorGone, CoordinatorStart, LogFlush, Published, ShutdownCoordinator,
    ShutdownHandle, ShutdownMsg,
};
pub use report::{
    CheckpointCounts, HookOutcome, HookReport, PhaseDurations, SessionCounts, ShutdownReport,
};
pub use signals::{listen as listen_for_signals, Signal};
pub use strategy::{
    builtin_strategies, Cooperative, Drain, HandOver, Immediate, Migrate, ShutdownCx,
    ShutdownStrategy, SHUTDOWN_CAUSE,
};
