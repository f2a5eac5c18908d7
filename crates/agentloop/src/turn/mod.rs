//! One turn as the agent and the runtime share it (DESIGN S1, S1a, S2, S3, S8): the
//! agent's context ([`TurnCx`]) and the control block its task and its session share.
//!
//! This module sits below the session actor: it knows the session's shared state and
//! the event registry, never the actor; a turn tells the actor about itself through a
//! callback the actor installs.

pub mod agent;
pub mod context;
pub(crate) mod control;
mod hooks;
pub mod steps;
mod wake;
pub(crate) mod writes;

pub use agent::TurnCx;
pub use context::Step;
pub use steps::{StepError, StepFailed, StepKey, StepOutcome, StepPolicy};
