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
//!
//! One concept a room ([`SessionSpec`], what to spawn, is the session's own): `kind` (agent kinds)
//! and `versions` (the versions of each kind, S40, published as `agentloop::versions`),
//! `args` (what a supervisor is built with and its bounds), the restart budget and
//! decision (`crate::session::restart`, beside the policy it applies), `messages`, `error`, `registry` (the sessions, their
//! admission, start, end and restart), `directory` (the live incarnations its handles
//! read without a message), `routing` (a push routed through the actor), `actor` (the
//! message loop) and `handle` (what callers use).

mod actor;
mod args;
mod directory;
mod error;
mod handle;
mod kind;
mod live;
mod messages;
mod registry;
mod routing;
mod sleepers;
mod spawn;
pub mod versions;

pub use crate::session::RestartPolicy;

#[allow(deprecated)]
pub use crate::push::RoutedPushError;
pub use crate::session::restart::RestartBudget;
pub(crate) use crate::session::restart::RestartOracle;
pub use crate::session::SessionSpec;
pub use args::{SessionLimits, SupervisorArgs};
pub use error::SupervisorError;
pub use handle::SupervisorHandle;
pub use kind::{agent_kind, agent_kind_version, AgentKind};
pub(crate) use messages::GateMember;
pub use messages::{
    AttachMode, Attachment, BatchSpawn, RestartUse, SessionEnd, SessionSummary, SessionsByState,
    SubscribedSpawn, SupervisorMsg, MAX_SPAWN_BATCH,
};
pub use spawn::{Spawn, SpawnSubscribed};
