//! Shutdown strategies (DESIGN S27): what happens between the drain gate and cleanup.
//!
//! A strategy drives the sessions through a [`ShutdownCx`]: `grace(stop)` sends every
//! live session a stop and waits until they have all exited, the grace ends or a
//! second request skips to force; `force()` sends Immediate stops, waits the force
//! timeout and kills what is left. The coordinator always closes the gate before and
//! cleans up after, and forces whatever a strategy leaves alive, so a strategy cannot
//! lose a session. Strategies are registered by name; the configuration picks one.
//!
//! This module owns the trait and the three built-ins; the session bookkeeping behind
//! the context is in `shutdown::sessions`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::config::ShutdownConfig;
use crate::options::StopOptions;

/// The stop cause every shutdown stop carries (S27).
pub const SHUTDOWN_CAUSE: &str = "shutdown";

/// What the coordinator hands a strategy (type-erased: strategies are not generic over
/// the item and event types).
pub(crate) trait Phases: Send {
    fn config(&self) -> &ShutdownConfig;
    fn live(&self) -> usize;
    fn force_requested(&self) -> bool;
    fn grace(&mut self, stop: StopOptions) -> BoxFuture<'_, ()>;
    fn force(&mut self) -> BoxFuture<'_, ()>;
    fn tally(&self) -> Tally;
}

/// The sessions being shut down, as a strategy sees them.
pub struct ShutdownCx {
    pub(crate) phases: Box<dyn Phases>,
}

impl ShutdownCx {
    /// The `[shutdown]` configuration (grace, force timeout, cleanup).
    pub fn config(&self) -> &ShutdownConfig {
        self.phases.config()
    }

    /// Sessions still alive.
    pub fn live(&self) -> usize {
        self.phases.live()
    }

    /// Whether a second request asked to skip to force.
    pub fn force_requested(&self) -> bool {
        self.phases.force_requested()
    }

    /// The grace phase: sends `stop` (marked as a shutdown stop, with cause
    /// `shutdown` unless it has one) to every live session, then waits until all have
    /// exited, `config().grace` has passed, or force was requested. Sessions that end
    /// here count as exited in grace. May be called once.
    pub fn grace(&mut self, stop: StopOptions) -> BoxFuture<'_, ()> {
        self.phases.grace(stop)
    }

    /// The force phase: an Immediate shutdown stop to every live session, a wait of at
    /// most `config().force_timeout`, then a kill of any still alive (its record is
    /// marked `Interrupted` from its last durable state).
    pub fn force(&mut self) -> BoxFuture<'_, ()> {
        self.phases.force()
    }
}

/// A way to shut down (S27). Implement it to add your own and register it on the
/// runtime by name.
pub trait ShutdownStrategy: Send + Sync + 'static {
    /// Runs before the drain gate closes (nothing by default).
    fn before_gate(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Runs the phases between the drain gate and cleanup. Sessions it leaves alive
    /// are forced by the coordinator afterwards.
    fn run<'a>(&'a self, cx: &'a mut ShutdownCx) -> BoxFuture<'a, ()>;
}

/// The default: grace with a graceful stop (next safe point of any kind, cause
/// `shutdown`), then force.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cooperative;

impl ShutdownStrategy for Cooperative {
    fn run<'a>(&'a self, cx: &'a mut ShutdownCx) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            cx.grace(StopOptions::graceful()).await;
            cx.force().await;
        })
    }
}

/// No grace: Immediate stops at once, then kills after the force timeout.
#[derive(Clone, Copy, Debug, Default)]
pub struct Immediate;

impl ShutdownStrategy for Immediate {
    fn run<'a>(&'a self, cx: &'a mut ShutdownCx) -> BoxFuture<'a, ()> {
        Box::pin(async move { cx.force().await })
    }
}

/// Sessions finish their accepted items within the grace (a drain stop), then the
/// rest are forced.
#[derive(Clone, Copy, Debug, Default)]
pub struct Drain;

impl ShutdownStrategy for Drain {
    fn run<'a>(&'a self, cx: &'a mut ShutdownCx) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            cx.grace(StopOptions::drain()).await;
            cx.force().await;
        })
    }
}

/// What the `migrate` strategy asks of a cluster node's runtime (installed with the
/// node's router, `RuntimeHandle::set_forwarder`; type-erased like the phases).
pub trait HandOver: Send + Sync {
    /// Before the drain gate: pushes for the sessions running now wait in line from
    /// here on, in arrival order, instead of being refused as late (S38).
    fn hold(&self) -> BoxFuture<'static, ()>;
    /// After the force: hands the stopped sessions to other nodes, then lets the
    /// pushes held for each go to its new node; how many moved.
    fn hand_over(&self) -> BoxFuture<'static, usize>;
}

/// A cluster node's shutdown (issue 18, S38): every session stops at its next safe
/// point (as `cooperative`), then each one left `Interrupted` is handed to the live
/// node placement names and resumed there, instead of waiting for this node to come
/// back. What cannot move stays `Interrupted` here and is adopted after the lease. A node
/// with no router (it reaches no other node) hands nothing over.
#[derive(Clone)]
pub struct Migrate {
    pub(crate) hand_over: Arc<std::sync::OnceLock<Arc<dyn HandOver>>>,
}

impl ShutdownStrategy for Migrate {
    /// Holds the pushes of the running sessions before the drain gate would refuse
    /// them: they wait in line and go to each session's new node.
    fn before_gate(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(h) = self.hand_over.get() {
                h.hold().await;
            }
        })
    }

    fn run<'a>(&'a self, cx: &'a mut ShutdownCx) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            cx.grace(StopOptions::graceful()).await;
            cx.force().await;
            // Read after the force: a router installed meanwhile still hands over.
            if let Some(hand_over) = self.hand_over.get().cloned() {
                let moved = hand_over.hand_over().await;
                tracing::info!(moved, "handed the sessions over to the other nodes");
            }
        })
    }
}

/// Strategies by name: the three built-ins, to which a runtime adds its own.
pub fn builtin_strategies() -> HashMap<String, Arc<dyn ShutdownStrategy>> {
    let mut m: HashMap<String, Arc<dyn ShutdownStrategy>> = HashMap::new();
    m.insert("cooperative".into(), Arc::new(Cooperative));
    m.insert("immediate".into(), Arc::new(Immediate));
    m.insert("drain".into(), Arc::new(Drain));
    m
}

/// The counts the report is built from.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally {
    pub(crate) total: u64,
    pub(crate) exited_in_grace: u64,
    pub(crate) forced: u64,
    pub(crate) killed: u64,
    pub(crate) saved: u64,
    pub(crate) failed: u64,
    pub(crate) items_saved: u64,
    pub(crate) items_unsaved: u64,
    pub(crate) late: u64,
    pub(crate) grace: Duration,
    pub(crate) force: Duration,
}
