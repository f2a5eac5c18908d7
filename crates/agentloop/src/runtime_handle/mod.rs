//! [`RuntimeHandle`]: a cheap, cloneable handle on a running runtime's sessions and
//! store: the supervisor, the redacted client views (S24), history, resume with an
//! answer, delete, and the shutdown handle. Front ends (the HTTP router, a service's
//! own tasks) hold one; the [`crate::runtime::Runtime`] that owns the lease and the checkpoint
//! actor dereferences to it.
//!
//! It only forwards to the supervisor and reads through the store's trait; it starts
//! and stops nothing (that is `runtime`). It keeps the routing trait a node installs for
//! sessions that run elsewhere (`forward`) and what a control request crossing nodes
//! carries (`control`), both published under `agentloop::cluster`; the moves between
//! nodes (`crate::cluster::migrate`) sit above it.

mod by_id;
pub mod control;
pub mod forward;
mod hand_over;
pub(crate) mod moving;
pub(crate) mod timer_service;
mod timers;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::session::Durability;
use crate::shutdown::ShutdownHandle;
use crate::store::{CheckpointStore, StoreError};
use crate::supervisor::SupervisorHandle;

/// A handle on a running runtime (see the module docs). Cloning is cheap.
pub struct RuntimeHandle<I, E> {
    pub(crate) supervisor: SupervisorHandle<I, E>,
    pub(crate) store: Option<Arc<dyn CheckpointStore<I>>>,
    pub(crate) instance: String,
    pub(crate) durability: Durability,
    pub(crate) shutdown: ShutdownHandle,
    pub(crate) redaction: crate::view::Redaction,
    pub(crate) metrics: Arc<crate::metrics::RuntimeMetrics>,
    /// How to reach the owner of a session another node runs (a cluster node installs
    /// it; issue 18).
    pub(crate) forwarder:
        Arc<std::sync::OnceLock<Arc<dyn crate::runtime_handle::forward::Forward<I, E>>>>,
    /// Where the `migrate` shutdown strategy finds how to hand this node's sessions
    /// over (issue 18, S38): set with the forwarder, so a runtime hands over only
    /// when it can reach other nodes. Weak: the strategy owns it (the hand-over holds
    /// this handle, which must not hold itself).
    pub(crate) hand_over: std::sync::Weak<std::sync::OnceLock<Arc<dyn crate::shutdown::HandOver>>>,
    /// Sessions this node moved or is moving to another (issue 18, S38): pushes for
    /// them queue on the session's gate, in arrival order, and go to the new owner.
    pub(crate) moving: crate::runtime_handle::moving::Moving,
    /// The lease timeout resumed sessions judge owners by (S19).
    pub(crate) lease_timeout: std::time::Duration,
    /// The runtime's heartbeat: how often it sweeps for records to recover.
    pub(crate) heartbeat: std::time::Duration,
    /// Whether it recovers records whose owner's lease expired while it runs (a node,
    /// or a runtime on a shared store; issue 28).
    pub(crate) sweeps: bool,
    /// Whether it is a cluster node.
    pub(crate) node: bool,
    /// Where arms and cancels of durable timers are told to the timer service (set
    /// once it started, S39).
    pub(crate) timer_service:
        Arc<std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<crate::timers::Command>>>,
    /// The clock timers are armed and fired by.
    pub(crate) timer_clock: crate::timers::Clock,
    /// What a durable timer may hold (S34a, `[limits]`).
    pub(crate) timer_bounds: crate::timers::TimerBounds,
    /// The agent kinds the supervisor runs, by name, with their versions (S40): which
    /// stored records this runtime can run.
    pub(crate) kinds: Arc<crate::supervisor::versions::Kinds<I, E>>,
}

impl<I, E> Clone for RuntimeHandle<I, E> {
    fn clone(&self) -> Self {
        RuntimeHandle {
            supervisor: self.supervisor.clone(),
            store: self.store.clone(),
            instance: self.instance.clone(),
            durability: self.durability,
            shutdown: self.shutdown.clone(),
            redaction: self.redaction.clone(),
            metrics: self.metrics.clone(),
            forwarder: self.forwarder.clone(),
            hand_over: self.hand_over.clone(),
            timer_bounds: self.timer_bounds,
            moving: self.moving.clone(),
            lease_timeout: self.lease_timeout,
            heartbeat: self.heartbeat,
            sweeps: self.sweeps,
            node: self.node,
            timer_service: self.timer_service.clone(),
            timer_clock: self.timer_clock,
            kinds: self.kinds.clone(),
        }
    }
}

impl<I, E> RuntimeHandle<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// The runtime's metrics (S35): register them in a Prometheus registry to expose
    /// them (the HTTP front's `GET /metrics` does).
    pub fn metrics(&self) -> &Arc<crate::metrics::RuntimeMetrics> {
        &self.metrics
    }

    /// The session supervisor.
    pub fn supervisor(&self) -> &SupervisorHandle<I, E> {
        &self.supervisor
    }

    /// The checkpoint store, if any.
    pub fn store(&self) -> Option<Arc<dyn CheckpointStore<I>>> {
        self.store.clone()
    }

    /// Answers the business interrupt of stored session `id` and resumes it under this
    /// runtime with its durability (S4): LangGraph's `Command(resume=…)`. The answer
    /// and this instance's claim are one durable write before the call returns; the
    /// resumed turn gets the answer in [`crate::turn::agent::Turn::answer`]. Works after a restart:
    /// `Runtime::start` never resumes a session awaiting an answer by itself. Returns
    /// the handle and a stream attached before the session started.
    pub async fn resume_with_answer(
        &self,
        id: &str,
        answer: I,
    ) -> Result<
        (
            crate::session::SessionHandle<I, E>,
            crate::events::EventStream<E>,
        ),
        crate::session::AnswerError<I>,
    > {
        self.supervisor
            .resume_with_answer(
                id,
                answer,
                self.durability,
                crate::events::DEFAULT_EVENT_CAPACITY,
            )
            .await
    }

    /// The client view of stored session `id` through the runtime's redaction (S24):
    /// items, state and question as JSON, with what clients may not see removed. The
    /// record is never altered. `None` when nothing is stored under the id.
    pub async fn view(&self, id: &str) -> Result<Option<crate::view::SessionView>, StoreError> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        let Some(mut view) = self.record_view(store.as_ref(), id).await? else {
            return Ok(None);
        };
        // S39: the session's timers, with their items through the redaction.
        view.timers = crate::view::timers_view(id, store.timers(id).await?, &self.redaction)?;
        Ok(Some(view))
    }

    /// Where session `id` stands and what is kept of it (S26a), judged once for every
    /// door: whether it runs here, its record's status, and its checkpoint history and
    /// kept events. `None` when nothing of it runs or is kept (the only "unknown").
    pub async fn life(&self, id: &str) -> Result<Option<crate::view::SessionLife>, StoreError> {
        Ok(self.life_and_view(id, false).await?.map(|(life, _)| life))
    }

    /// [`life`](Self::life) and [`view`](Self::view) of session `id` from one read of
    /// its record (what `GET /sessions/{id}` answers): the view is `None` when no record
    /// is stored. `None` when nothing of it runs or is kept.
    pub async fn life_view(
        &self,
        id: &str,
    ) -> Result<Option<(crate::view::SessionLife, Option<crate::view::SessionView>)>, StoreError>
    {
        self.life_and_view(id, true).await
    }

    async fn life_and_view(
        &self,
        id: &str,
        with_view: bool,
    ) -> Result<Option<(crate::view::SessionLife, Option<crate::view::SessionView>)>, StoreError>
    {
        let live = self.supervisor.is_live(id);
        let mut kept = crate::view::Kept::default();
        let mut status = None;
        let mut asleep = false;
        let mut view = None;
        if let Some(store) = &self.store {
            let stored = store.load_stored(id).await?;
            match &stored {
                Some(crate::store::Stored::Current(r)) => {
                    asleep = r.header.asleep;
                    status = Some(r.header.status.clone());
                }
                Some(old @ crate::store::Stored::Format1(_)) => status = Some(old.status().clone()),
                None => {}
            }
            if with_view {
                if let Some(stored) = stored {
                    let mut v = self.view_of(stored)?;
                    // S39: the session's timers, with their items through the redaction.
                    v.timers =
                        crate::view::timers_view(id, store.timers(id).await?, &self.redaction)?;
                    view = Some(v);
                }
            }
            kept.record = status.is_some();
            // A store that keeps no history keeps none of this session; a failed read
            // is an error, not "none kept".
            if store.keeps_history() {
                kept.history = match store
                    .history(id, crate::store::history::HistoryQuery::List)
                    .await?
                {
                    crate::store::history::HistoryAnswer::List(l) => l.len(),
                    crate::store::history::HistoryAnswer::Load(_) => 0,
                };
            }
            kept.events = store.read_events(id, u64::MAX, 0).await?.last;
        }
        let lifecycle = agentloop_core::lifecycle::judge(agentloop_core::lifecycle::Facts {
            live,
            record: status.as_ref(),
            asleep,
            kept_beyond_record: kept.history > 0 || kept.events > 0,
        });
        Ok(lifecycle.map(|lifecycle| (crate::view::SessionLife { lifecycle, kept }, view)))
    }

    async fn record_view(
        &self,
        store: &dyn CheckpointStore<I>,
        id: &str,
    ) -> Result<Option<crate::view::SessionView>, StoreError> {
        match store.load_stored(id).await? {
            None => Ok(None),
            Some(stored) => self.view_of(stored).map(Some),
        }
    }

    /// The S24 view of a stored record through the runtime's redaction (no timers).
    fn view_of(
        &self,
        stored: crate::store::Stored,
    ) -> Result<crate::view::SessionView, StoreError> {
        match stored {
            crate::store::Stored::Current(r) => crate::view::session_view(&r, &self.redaction),
            old @ crate::store::Stored::Format1(_) => {
                // Format 1 is bincode: read it through the item type, then view it.
                let rec = old.decode::<I>()?.into_record();
                let write = rec.to_write(crate::store::WriteCondition::Always)?;
                let stored = crate::store::StoredRecord {
                    header: write.header,
                    items: write
                        .items
                        .into_iter()
                        .filter_map(|c| match c {
                            crate::store::ItemChange::Put(s, b) => Some((s, b)),
                            crate::store::ItemChange::Delete(_) => None,
                        })
                        .collect(),
                    state: None,
                    journal: Vec::new(),
                };
                crate::view::session_view(&stored, &self.redaction)
            }
        }
    }

    /// The kept turn-end checkpoints of session `id`, oldest first (issue 13, 4).
    pub async fn history(
        &self,
        id: &str,
    ) -> Result<Vec<crate::store::history::HistoryEntry>, StoreError> {
        let Some(store) = &self.store else {
            return Ok(Vec::new());
        };
        match store
            .history(id, crate::store::history::HistoryQuery::List)
            .await?
        {
            crate::store::history::HistoryAnswer::List(l) => Ok(l),
            crate::store::history::HistoryAnswer::Load(_) => Ok(Vec::new()),
        }
    }

    /// The client view of turn `turn`'s kept checkpoint of session `id`, through the
    /// runtime's redaction; `None` when no such checkpoint is kept.
    pub async fn checkpoint(
        &self,
        id: &str,
        turn: u64,
    ) -> Result<Option<crate::view::SessionView>, StoreError> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        match store
            .history(id, crate::store::history::HistoryQuery::Load(turn))
            .await?
        {
            crate::store::history::HistoryAnswer::Load(Some(r)) => {
                crate::view::session_view(&r, &self.redaction).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Starts new session `to` from turn `turn`'s kept checkpoint of session `from`
    /// (issue 13, 4), under this runtime, with the settings that checkpoint kept
    /// (durability, replay, restart policy, poll interval; issue 28), or this runtime's
    /// durability for a checkpoint written before settings were kept; the fork keeps
    /// `history` checkpoints of its own.
    pub async fn fork(
        &self,
        from: &str,
        turn: u64,
        to: &str,
        history: usize,
    ) -> Result<crate::session::SessionHandle<I, E>, crate::session::ForkError> {
        self.supervisor
            .fork(from, turn, to, self.durability, history)
            .await
    }

    /// Deletes stored session `id`: its record, its checkpoint history and its kept events (S20a). Refused
    /// while it runs (stop it first); resolves to whether anything was stored.
    pub async fn delete(&self, id: &str) -> Result<bool, crate::supervisor::SupervisorError> {
        self.supervisor.delete(id).await
    }

    /// The runtime's redaction (for front ends that send events to clients).
    pub fn redaction(&self) -> &crate::view::Redaction {
        &self.redaction
    }

    /// This runtime instance's id (the owner of its `Running` records).
    pub fn instance_id(&self) -> &str {
        &self.instance
    }

    /// The shutdown coordinator: clone it into a signal listener
    /// ([`crate::shutdown::listen_for_signals`]) or anything else that may start the
    /// shutdown; every request gets the same report.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }
}
