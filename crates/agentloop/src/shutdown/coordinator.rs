//! The ShutdownCoordinator actor (DESIGN S27): runs one shutdown — drain gate, the
//! strategy's phases, force for anything left, cleanup — and answers every request
//! with the same report.
//!
//! The actor only keeps the shutdown's state (not started / running / done, the
//! waiters, the force flag); the shutdown itself runs in a task so the actor keeps
//! answering: a second request joins the waiters (idempotent), `Force` (a second
//! signal) flips the force flag the running phases watch. It owns no session: sessions
//! come from the supervisor's drain gate, records are written through the store.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::ShutdownConfig;
use crate::store::CheckpointStore;
use crate::supervisor::SupervisorHandle;

use super::cleanup::{run_hooks, CleanupHook};
use super::report::{CheckpointCounts, PhaseDurations, SessionCounts, ShutdownReport};
use super::sessions::SessionSet;
use super::strategy::{ShutdownCx, ShutdownStrategy};

/// Flushes the process's log output at the end of cleanup (runs on a blocking thread).
pub type LogFlush = Arc<dyn Fn() + Send + Sync>;

/// Messages of the ShutdownCoordinator (public: other actors may `cast!` / `call!` it).
pub enum ShutdownMsg {
    /// Start the shutdown if it has not started, and answer with the report when it is
    /// done. Idempotent: every request gets the same report.
    Request {
        /// Where to answer.
        reply: RpcReplyPort<ShutdownReport>,
    },
    /// Start the shutdown without waiting for it (a first signal).
    Begin,
    /// Skip what is left of the grace to force (a second signal). Starts the shutdown
    /// first if it has not started.
    Force,
    /// Answer with the report once a shutdown (started by anyone) is done; does not
    /// start one.
    WaitReport {
        /// Where to answer.
        reply: RpcReplyPort<ShutdownReport>,
    },
    /// Whether a shutdown has started.
    Started {
        /// Where to answer.
        reply: RpcReplyPort<bool>,
    },
    /// Internal: the shutdown task is done.
    #[doc(hidden)]
    Finished(Box<ShutdownReport>),
}

// A local message (with the `cluster` feature ractor needs the impl; `local_message!`).
#[cfg(feature = "cluster")]
impl ractor::Message for ShutdownMsg {}

/// What the coordinator is built with.
pub struct CoordinatorArgs<I, E> {
    /// The supervisor whose sessions are shut down.
    pub supervisor: SupervisorHandle<I, E>,
    /// The store to flush and to mark killed sessions in.
    pub store: Option<Arc<dyn CheckpointStore<I>>>,
    /// Grace, force timeout, cleanup bound.
    pub config: ShutdownConfig,
    /// The strategy, and the name it was selected by.
    pub strategy: (String, Arc<dyn ShutdownStrategy>),
    /// Cleanup hooks, in the order they run.
    pub hooks: Vec<CleanupHook>,
    /// Flushes logs at the end of cleanup.
    pub flush_logs: Option<LogFlush>,
}

enum Stage<I, E> {
    NotStarted(Box<CoordinatorArgs<I, E>>),
    Running {
        waiters: Vec<RpcReplyPort<ShutdownReport>>,
        force: watch::Sender<bool>,
    },
    Done(Box<ShutdownReport>),
}

/// The coordinator's state.
pub struct CoordinatorState<I, E> {
    stage: Stage<I, E>,
    /// Waiters that do not start the shutdown.
    watchers: Vec<RpcReplyPort<ShutdownReport>>,
    /// Where the shutdown task publishes its report for [`ShutdownHandle`]s, which wait
    /// on it without a message through this actor's mailbox (issue 30: behind a
    /// mailbox of 10 000 session ends, a report waited).
    published: Published,
}

/// What the coordinator publishes to its handles: whether the shutdown started, and its
/// report once done.
#[derive(Clone)]
pub struct Published {
    started: watch::Sender<bool>,
    report: watch::Sender<Option<Arc<ShutdownReport>>>,
}

/// A coordinator's arguments and where it publishes.
pub struct CoordinatorStart<I, E> {
    /// What it is built with.
    pub args: CoordinatorArgs<I, E>,
    /// Where it publishes (the handle keeps the receivers).
    pub published: Published,
}

/// The ShutdownCoordinator actor.
pub struct ShutdownCoordinator<I, E>(std::marker::PhantomData<fn() -> (I, E)>);

impl<I, E> Default for ShutdownCoordinator<I, E> {
    fn default() -> Self {
        ShutdownCoordinator(std::marker::PhantomData)
    }
}

impl<I, E> CoordinatorState<I, E>
where
    I: Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Starts the shutdown task if it has not started.
    fn begin(&mut self, myself: &ActorRef<ShutdownMsg>, force: bool) {
        let args = match std::mem::replace(
            &mut self.stage,
            Stage::Done(Box::default()), // placeholder, replaced below
        ) {
            Stage::NotStarted(args) => args,
            other => {
                self.stage = other;
                return;
            }
        };
        let (tx, rx) = watch::channel(force);
        self.stage = Stage::Running {
            waiters: Vec::new(),
            force: tx,
        };
        self.published.started.send_replace(true);
        let myself = myself.clone();
        let published = self.published.clone();
        let span = tracing::info_span!("shutdown", strategy = %args.strategy.0);
        tokio::spawn(
            async move {
                let report = run_shutdown(*args, rx).await;
                // The handles' waiters hear it from here, at once; the actor answers
                // the messages that asked it.
                published
                    .report
                    .send_replace(Some(Arc::new(report.clone())));
                let _ = myself.send_message(ShutdownMsg::Finished(Box::new(report)));
            }
            .instrument(span),
        );
    }
}

impl<I, E> Actor for ShutdownCoordinator<I, E>
where
    I: Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static,
    E: Clone + Send + Sync + 'static,
{
    type Msg = ShutdownMsg;
    type State = CoordinatorState<I, E>;
    type Arguments = CoordinatorStart<I, E>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        start: CoordinatorStart<I, E>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(CoordinatorState {
            stage: Stage::NotStarted(Box::new(start.args)),
            watchers: Vec::new(),
            published: start.published,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ShutdownMsg::Request { reply } => {
                st.begin(&myself, false);
                match &mut st.stage {
                    Stage::Running { waiters, .. } => waiters.push(reply),
                    Stage::Done(report) => {
                        let _ = reply.send((**report).clone());
                    }
                    Stage::NotStarted(_) => {}
                }
            }
            ShutdownMsg::Begin => st.begin(&myself, false),
            ShutdownMsg::Force => {
                st.begin(&myself, true);
                if let Stage::Running { force, .. } = &st.stage {
                    tracing::warn!("shutdown: force requested, skipping what is left of the grace");
                    let _ = force.send(true);
                }
            }
            ShutdownMsg::WaitReport { reply } => match &st.stage {
                Stage::Done(report) => {
                    let _ = reply.send((**report).clone());
                }
                _ => st.watchers.push(reply),
            },
            ShutdownMsg::Started { reply } => {
                let _ = reply.send(!matches!(st.stage, Stage::NotStarted(_)));
            }
            ShutdownMsg::Finished(report) => {
                if let Stage::Running { waiters, .. } = &mut st.stage {
                    for w in waiters.drain(..) {
                        let _ = w.send((*report).clone());
                    }
                }
                for w in st.watchers.drain(..) {
                    let _ = w.send((*report).clone());
                }
                st.stage = Stage::Done(report);
            }
        }
        Ok(())
    }
}

/// One shutdown, start to report.
async fn run_shutdown<I, E>(
    args: CoordinatorArgs<I, E>,
    force: watch::Receiver<bool>,
) -> ShutdownReport
where
    I: Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static,
    E: Clone + Send + Sync + 'static,
{
    let started = Instant::now();
    let (strategy_name, strategy) = args.strategy;
    tracing::info!(grace = ?args.config.grace, force_timeout = ?args.config.force_timeout, cleanup = ?args.config.cleanup, "shutdown started: drain gate closing");

    // 1. Drain gate (after what the strategy does first).
    strategy.before_gate().await;
    let gate = args.supervisor.close_gate().await;
    let gate_took = started.elapsed();
    let (members, late_at_gate, owner, ends) = match gate {
        Some(g) => (g.sessions, Some(g.late), g.owner, g.ends),
        None => (
            Vec::new(),
            None,
            None,
            tokio::sync::mpsc::unbounded_channel().1,
        ),
    };

    // 2-3. The strategy's phases; anything it leaves alive is forced.
    let set = SessionSet::new(
        args.config.clone(),
        args.store.clone(),
        owner,
        members,
        ends,
        force.clone(),
    );
    let mut cx = ShutdownCx {
        phases: Box::new(set),
    };
    strategy.run(&mut cx).await;
    if cx.live() > 0 {
        cx.force().await;
    }
    let tally = cx.phases.tally();

    // 4. Cleanup, bounded as a whole.
    let cleanup_started = Instant::now();
    let deadline = cleanup_started + args.config.cleanup;
    let store_flush_error = match &args.store {
        None => None,
        Some(store) => match tokio::time::timeout_at(deadline, store.flush()).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!(
                "the store flush did not finish within the cleanup bound ({:?})",
                args.config.cleanup
            )),
        },
    };
    let hooks = run_hooks(&args.hooks, deadline).await;
    if let Some(flush) = args.flush_logs {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let _ = tokio::time::timeout(left, tokio::task::spawn_blocking(move || flush())).await;
    }
    let cleanup_took = cleanup_started.elapsed();

    let late = tally.late
        + late_at_gate
            .map(|l| l.load(std::sync::atomic::Ordering::Relaxed))
            .unwrap_or(0);
    let report = ShutdownReport {
        strategy: strategy_name,
        force_requested: *force.borrow(),
        phases: PhaseDurations {
            gate: gate_took,
            grace: tally.grace,
            force: tally.force,
            cleanup: cleanup_took,
            total: started.elapsed(),
        },
        sessions: SessionCounts {
            total: tally.total,
            exited_in_grace: tally.exited_in_grace,
            forced: tally.forced,
            killed: tally.killed,
        },
        checkpoints: CheckpointCounts {
            saved: tally.saved,
            failed: tally.failed,
            items_saved: tally.items_saved,
            items_unsaved: tally.items_unsaved,
        },
        late_items: late,
        store_flush_error,
        hooks,
    };
    tracing::info!(report = ?report, "shutdown done");
    report
}

/// The coordinator is gone (its actor stopped before answering).
#[derive(Debug, thiserror::Error)]
#[error("the shutdown coordinator is gone; the runtime was already stopped")]
pub struct CoordinatorGone;

/// A cloneable handle on a ShutdownCoordinator. It learns that the shutdown started
/// and reads its report from what the coordinator publishes, without a message.
#[derive(Clone)]
pub struct ShutdownHandle {
    actor: ActorRef<ShutdownMsg>,
    started: watch::Receiver<bool>,
    report: watch::Receiver<Option<Arc<ShutdownReport>>>,
}

impl ShutdownHandle {
    /// Starts a coordinator (unlinked).
    pub async fn start<I, E>(args: CoordinatorArgs<I, E>) -> Result<Self, crate::error::SpawnError>
    where
        I: Clone + Send + Sync + serde::Serialize + serde::de::DeserializeOwned + 'static,
        E: Clone + Send + Sync + 'static,
    {
        let (started_tx, started) = watch::channel(false);
        let (report_tx, report) = watch::channel(None);
        let start = CoordinatorStart {
            args,
            published: Published {
                started: started_tx,
                report: report_tx,
            },
        };
        let (actor, _) = Actor::spawn(None, ShutdownCoordinator::<I, E>::default(), start)
            .await
            .map_err(|e| crate::error::SpawnError::Actor {
                id: "shutdown-coordinator".into(),
                reason: e.to_string(),
            })?;
        Ok(ShutdownHandle {
            actor,
            started,
            report,
        })
    }

    /// The actor, for `cast!` / `call!`.
    pub fn actor(&self) -> &ActorRef<ShutdownMsg> {
        &self.actor
    }

    /// Runs the shutdown (or joins the one running) and returns its report.
    pub async fn shutdown(&self) -> Result<ShutdownReport, CoordinatorGone> {
        self.actor
            .send_message(ShutdownMsg::Begin)
            .map_err(|_| CoordinatorGone)?;
        self.wait_report().await
    }

    /// Starts the shutdown without waiting (a first signal).
    pub fn begin(&self) {
        let _ = self.actor.send_message(ShutdownMsg::Begin);
    }

    /// Skips to force (a second signal).
    pub fn force(&self) {
        let _ = self.actor.send_message(ShutdownMsg::Force);
    }

    /// Waits for the report of a shutdown started by anyone (a signal, another caller):
    /// published by the shutdown task itself, so no mailbox stands between them.
    pub async fn wait_report(&self) -> Result<ShutdownReport, CoordinatorGone> {
        let mut report = self.report.clone();
        let done = report
            .wait_for(Option::is_some)
            .await
            .map_err(|_| CoordinatorGone)?;
        match done.as_ref() {
            Some(r) => Ok((**r).clone()),
            None => Err(CoordinatorGone),
        }
    }

    /// Whether a shutdown has started (or the coordinator is gone).
    pub async fn is_started(&self) -> bool {
        *self.started.borrow() || self.started.has_changed().is_err()
    }

    /// Resolves once a shutdown has started (at once when one has, or when the
    /// coordinator is gone).
    pub async fn started(&self) {
        let mut started = self.started.clone();
        let _ = started.wait_for(|s| *s).await;
    }
}
