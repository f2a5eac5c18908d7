//! The supervisor's registry: its sessions by id and by actor, the admission of spawns
//! (a valid id, the gate open, room under the bounds), the start of an incarnation and
//! its entry in the [`super::directory`], and what happens when an incarnation ends: a
//! restart within its policy and budget, or its final end published to every feed.
//! Owned by the actor; nothing else changes it.

use super::args::SessionLimits;
use super::directory::Directory;
use super::error::gone;
use super::error::SupervisorError;
use super::kind::AgentKind;
use super::messages::{SessionEnd, SupervisorMsg};
use crate::error::SessionError;
use crate::session::restart::{decide, RestartBudget, RestartDecision};
use crate::session::SessionSpec;
use crate::session::{
    validate_session_id, Durability, ExitReason, ExitState, FailureKind, SessionHandle,
};
use crate::store::transition::StatusChange;
use crate::store::CheckpointStore;
use futures::future::BoxFuture;
use futures::StreamExt;
use ractor::{ActorCell, ActorId, ActorRef, RpcReplyPort};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How many sessions of one batch start at once (see `spawn_batch`).
pub(super) const SPAWN_OVERLAP: usize = 32;

/// A session's start, resolved but not begun: everything its agent kind needs.
pub(super) struct Prepared<I, E> {
    pub(super) kind: Arc<dyn AgentKind<I, E>>,
    pub(super) spec: SessionSpec<I>,
    pub(super) store: Option<Arc<dyn CheckpointStore<I>>>,
    pub(super) supervisor: ActorCell,
}

impl<I: 'static, E: 'static> Prepared<I, E> {
    /// Begins the start: the kind builds the agent and spawns the session's actor.
    /// A kind with one version and no migration runs it at once; another chooses the
    /// version from the record first (S40, `versions::choose`).
    pub(super) fn start(self) -> BoxFuture<'static, Result<SessionHandle<I, E>, SupervisorError>>
    where
        I: Send,
    {
        let Prepared {
            kind,
            mut spec,
            store,
            supervisor,
        } = self;
        if let Some(version) = kind.single_version() {
            spec.run.agent_version = version;
            return kind.spawn(spec, store, supervisor);
        }
        Box::pin(async move {
            crate::supervisor::versions::choose(&kind, &mut spec, store.as_ref()).await?;
            kind.spawn(spec, store, supervisor).await
        })
    }
}

pub(super) struct Entry<I, E> {
    pub(super) spec: SessionSpec<I>,
    pub(super) handle: SessionHandle<I, E>,
    pub(super) actor: ActorId,
    pub(super) restarts: VecDeque<Instant>,
    pub(super) restarted: u32,
    /// Detached (S23): a restarted incarnation is detached again.
    pub(super) detached: bool,
    /// Canceled (S24): the session is not restarted, whatever its policy (a cancel
    /// that reaches an incarnation as it fails must not see it run again).
    pub(super) canceled: bool,
}

/// What an incarnation inherits from the ones before it: a new session has none.
#[derive(Default)]
pub(super) struct Lineage {
    /// When its predecessors were restarted (within the budget's window).
    pub(super) restarts: VecDeque<Instant>,
    /// How many restarts led to it.
    pub(super) restarted: u32,
    /// Whether the session was detached (S23): the new incarnation is detached again.
    pub(super) detached: bool,
}

/// The supervisor's state.
pub(crate) struct SupervisorState<I, E> {
    pub(super) kinds: HashMap<String, Arc<dyn AgentKind<I, E>>>,
    pub(super) store: Option<Arc<dyn CheckpointStore<I>>>,
    pub(super) owner: Option<String>,
    pub(super) budget: RestartBudget,
    pub(super) heartbeat: Duration,
    pub(super) metrics: Option<Arc<crate::metrics::RuntimeMetrics>>,
    pub(super) limits: SessionLimits,
    pub(super) sessions: super::live::Live<Entry<I, E>>,
    pub(super) by_actor: HashMap<ActorId, String>,
    /// Set by `StopAll`: no restarts, no new sessions.
    pub(super) stopping: bool,
    /// `stopping`, shared with the incarnations' restart oracles (nothing restarts).
    pub(super) stopping_flag: Arc<std::sync::atomic::AtomicBool>,
    /// The live incarnations by id, the gate and the push counters, shared with every
    /// handle (by-id pushes read it without a message to this actor).
    pub(super) directory: Arc<Directory<I, E>>,
    /// Feeds of session ends ([`SupervisorMsg::WatchEnds`]).
    pub(super) watchers: Vec<mpsc::UnboundedSender<SessionEnd<I>>>,
    /// Sessions asleep (S39): no actor, no directory entry.
    pub(super) sleeping: super::sleepers::Sleepers<I>,
}

impl<I, E> SupervisorState<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Stops restarts and new sessions (`StopAll`, the shutdown's gate, the actor's end).
    pub(super) fn set_stopping(&mut self) {
        self.stopping = true;
        self.stopping_flag
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// What one start of `spec`'s session takes: the spec's options, under this
    /// supervisor's instance name, heartbeat, metrics and buffer limits.
    pub(super) fn incarnation(&self, spec: &SessionSpec<I>, load_record: bool) -> SessionSpec<I> {
        let mut run = spec.incarnation();
        if let Some(owner) = &self.owner {
            run.owner = Some(owner.clone());
        }
        run.buffer_bound = Some(match run.buffer_bound {
            Some(own) => own.min(self.limits.buffer),
            None => self.limits.buffer,
        });
        let event_codec = run
            .run
            .event_codec
            .take()
            .or_else(|| self.directory.event_codec());
        run.run = crate::session::RunContext {
            load_record,
            supervised: true,
            heartbeat: self.heartbeat,
            metrics: self.metrics.clone(),
            event_codec,
            timer_service: self.directory.timer_service(),
            timer_bounds: self.limits.timers,
            idle_after: self.directory.idle_after(),
            agent_version: run.run.agent_version,
            restart_version: run.run.restart_version,
            restart_oracle: Some(Arc::new(super::RestartOracle::new(
                spec.restart,
                self.budget,
                self.stopping_flag.clone(),
            ))),
        };
        run
    }

    /// Checks a spawn request against the registry: a valid id, the gate open, the
    /// supervisor not stopping, no live session with this id, and room for a new one
    /// (`starting` more are being admitted with it) unless the spec resumes a record.
    pub(super) async fn admit(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        spec: &SessionSpec<I>,
        starting: usize,
    ) -> Result<(), SupervisorError> {
        let id = spec.id.as_str();
        // Only the runtime's own resumes pass the bound: a fork or an answer's resume
        // preloads a record too, but is a new live session (issue 52).
        let resumes = spec.resumed;
        let live = self.sessions.len() + starting;
        match validate_session_id(id) {
            Err(e) => Err(SupervisorError::InvalidId(e)),
            Ok(()) if self.directory.gate_closed() => {
                Err(SupervisorError::ShuttingDown(id.to_string()))
            }
            Ok(()) if !resumes && live >= self.limits.max_sessions => {
                Err(SupervisorError::TooManySessions {
                    id: id.to_string(),
                    max: self.limits.max_sessions,
                })
            }
            Ok(()) if self.stopping => Err(SupervisorError::Session(SessionError::Exited(
                "the session supervisor is stopping".into(),
            ))),
            Ok(()) if self.live(myself, id).await.is_some() => {
                Err(SupervisorError::Duplicate(id.to_string()))
            }
            Ok(()) => Ok(()),
        }
    }

    /// A spawn request: checks the id, the gate and duplicates, then starts the first
    /// incarnation.
    pub(super) async fn spawn_new(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        spec: SessionSpec<I>,
    ) -> Result<SessionHandle<I, E>, SupervisorError> {
        self.admit(myself, &spec, 0).await?;
        let seed = spec.initial_items.clone();
        self.start(myself, spec, seed, true, Lineage::default())
            .await
    }

    /// A batch of spawn requests (at most [`MAX_SPAWN_BATCH`](super::MAX_SPAWN_BATCH)), answered in order:
    /// each spec is admitted like a single spawn (an id twice in the batch is a
    /// duplicate of the first), then the admitted sessions' actors start, up to
    /// `SPAWN_OVERLAP` at a time, so their starts overlap instead of queueing one
    /// after the other (B2).
    pub(super) async fn spawn_batch(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        specs: Vec<SessionSpec<I>>,
    ) -> Vec<Result<SessionHandle<I, E>, SupervisorError>> {
        let mut answers: Vec<Option<Result<SessionHandle<I, E>, SupervisorError>>> =
            Vec::with_capacity(specs.len());
        let mut admitted = Vec::new();
        let mut starts = Vec::new();
        let mut ids = HashSet::with_capacity(specs.len());
        for spec in specs {
            let admission = match self.admit(myself, &spec, admitted.len()).await {
                Ok(()) if !ids.insert(spec.id.clone()) => {
                    Err(SupervisorError::Duplicate(spec.id.clone()))
                }
                other => other,
            };
            let seed = spec.initial_items.clone();
            match admission.and_then(|()| self.prepare(myself, spec, true)) {
                Ok((start, spec)) => {
                    admitted.push((answers.len(), spec, seed));
                    starts.push(start);
                    answers.push(None);
                }
                Err(e) => answers.push(Some(Err(e))),
            }
        }
        // Started lazily, at most SPAWN_OVERLAP at a time: each start's future is large
        // (≈ 5 KiB), and a bounded window reuses the same memory instead of faulting
        // in fresh pages for a thousand of them.
        let started: Vec<_> = futures::stream::iter(starts.into_iter().map(Prepared::start))
            .buffered(SPAWN_OVERLAP)
            .collect()
            .await;
        for ((at, spec, seed), started) in admitted.into_iter().zip(started) {
            answers[at] =
                Some(started.map(|handle| self.register(spec, handle, seed, Lineage::default())));
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(gone())))
            .collect()
    }

    pub(super) async fn start(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        spec: SessionSpec<I>,
        seed: Vec<I>,
        load_record: bool,
        lineage: Lineage,
    ) -> Result<SessionHandle<I, E>, SupervisorError> {
        let (start, spec) = self.prepare(myself, spec, load_record)?;
        if let Some(oracle) = &start.spec.run.restart_oracle {
            *oracle.restarts.lock() = lineage.restarts.clone();
            oracle
                .restarted
                .store(lineage.restarted, std::sync::atomic::Ordering::Release);
        }
        let handle = start.start().await?;
        Ok(self.register(spec, handle, seed, lineage))
    }

    /// The part of a start that needs no waiting: resolves the kind and the store and
    /// builds the session's configuration. Returns the start (it borrows nothing of the
    /// supervisor, so several may run at once) and the spec to register.
    pub(super) fn prepare(
        &self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        mut spec: SessionSpec<I>,
        load_record: bool,
    ) -> Result<(Prepared<I, E>, SessionSpec<I>), SupervisorError> {
        let kind = self.kinds.get(&spec.kind).cloned().ok_or_else(|| {
            let mut known: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
            known.sort_unstable();
            SupervisorError::UnknownKind {
                kind: spec.kind.clone(),
                known: known.join(", "),
            }
        })?;
        if spec.persist && self.store.is_none() {
            return Err(SupervisorError::NoStore(spec.id.clone()));
        }
        let store = if spec.persist {
            self.store.clone()
        } else {
            None
        };
        let mut run = self.incarnation(&spec, load_record);
        // Used once: a restart loads the record afresh, and its events go to those who
        // subscribe to the new incarnation.
        run.preloaded = spec.preloaded.take();
        spec.subscribe = None;
        // The registry reads the decision the incarnation's teardown made (S26).
        spec.run.restart_oracle = run.run.restart_oracle.clone();
        let start = Prepared {
            kind,
            spec: run,
            store,
            supervisor: myself.get_cell(),
        };
        Ok((start, spec))
    }

    /// Enters a started session in the registry and the directory, after its seed items
    /// and (a restarted detached session, S23) its detach were sent: pushes that find
    /// it in the directory go straight to its mailbox and must not overtake them.
    pub(super) fn register(
        &mut self,
        spec: SessionSpec<I>,
        handle: SessionHandle<I, E>,
        seed: Vec<I>,
        lineage: Lineage,
    ) -> SessionHandle<I, E> {
        // Ordered before anything routed later: casts from this actor arrive in order.
        for item in seed {
            handle.push(item).no_wait();
        }
        if lineage.detached {
            // S23 across a restart: the new incarnation goes on in the background. Only
            // the answer is awaited off the actor.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sent = handle
                .actor()
                .send_message(crate::session::TurnLoopMsg::Detach {
                    reply: RpcReplyPort::from(tx),
                })
                .is_ok();
            if sent {
                tokio::spawn(async move {
                    if let Ok(Err(e)) = rx.await {
                        tracing::warn!(error = %e, "could not detach the restarted session");
                    }
                });
            }
        }
        let actor = handle.actor().get_id();
        self.by_actor.insert(actor, spec.id.clone());
        self.directory.enter(&spec.id, handle.clone());
        self.sessions.insert(
            spec.id.clone(),
            Entry {
                spec,
                handle: handle.clone(),
                actor,
                restarts: lineage.restarts,
                restarted: lineage.restarted,
                detached: lineage.detached,
                canceled: false,
            },
        );
        handle
    }

    /// The session's incarnation ended: restart it if its policy and budget allow,
    /// else forget it. Returns whether a new incarnation runs.
    pub(super) async fn on_end(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        id: &str,
    ) -> bool {
        let Some(entry) = self.sessions.remove(id) else {
            return false;
        };
        self.directory.remove(id);
        self.by_actor.remove(&entry.actor);
        let exit = match entry.handle.exit_state() {
            Some(e) => e,
            // Published by the actor's teardown or its destructor; wait for it.
            None => entry.handle.wait().await,
        };
        if exit.reason == ExitReason::Asleep {
            self.fall_asleep(id, entry.spec);
            return false;
        }
        let failed = match &exit.reason {
            ExitReason::Failed(e) => Some(e.clone()),
            _ => None,
        };
        let Some(error) = failed else {
            tracing::info!(session = id, reason = ?exit.reason, "session ended");
            self.publish_end(&entry.spec, entry.restarted, exit);
            return false;
        };
        if self.stopping {
            self.publish_end(&entry.spec, entry.restarted, exit);
            return false;
        }
        if entry.canceled {
            // The cancel's own task makes the record `Canceled` (S24); a cancel is
            // final, so the failure is not restarted (S26).
            tracing::info!(session = id, %error, "a canceled session failed; it is not restarted");
            self.publish_end(&entry.spec, entry.restarted, exit);
            return false;
        }
        // The kind was decided where the failure happened (never parsed from text).
        let kind = exit.failure.unwrap_or(FailureKind::Internal);
        let mut restarts = entry.restarts;
        // The incarnation's teardown asked already when it ended its streams
        // (`Restarting` or `Ended`): what its subscribers were told is what happens.
        let foreseen = entry
            .spec
            .run
            .restart_oracle
            .as_ref()
            .map(|o| o.decide_once(kind));
        let decision = match foreseen {
            Some((decision, counted)) => {
                restarts = counted;
                decision
            }
            None => decide(
                entry.spec.restart,
                kind,
                &self.budget,
                &mut restarts,
                Instant::now(),
            ),
        };
        if decision != RestartDecision::Restart {
            if decision == RestartDecision::BudgetSpent {
                tracing::error!(
                    session = id,
                    restarts = restarts.len(),
                    "restart budget spent; the session stays failed"
                );
            }
            if decision == RestartDecision::Permanent {
                // Whatever the session still held is not run again: said at ERROR.
                tracing::error!(
                    session = id,
                    %error,
                    "the agent failed permanently; the session is not restarted and stays failed"
                );
            }
            // A record failure leaves the record as it was (S18); any other failure
            // that is not restarted is final, and the record says so (S26).
            if kind != FailureKind::Record && entry.spec.persist {
                if decision == RestartDecision::Permanent {
                    // The record says the failure was permanent (never restarted).
                    self.mark_failed(id, &format!("permanent failure, not restarted: {error}"))
                        .await;
                } else {
                    self.mark_failed(id, &error).await;
                }
            }
            self.publish_end(&entry.spec, entry.restarted, exit);
            return false;
        }
        let from_record = entry.spec.persist && entry.spec.durability == Durability::Sync;
        let seed = if from_record {
            Vec::new()
        } else {
            let mut items = exit.interrupted_items.clone();
            items.extend(exit.unhandled_items.iter().cloned());
            items
        };
        tracing::warn!(session = id, %error, attempt = restarts.len(), from_record, "restarting a failed session");
        if let Some(m) = &self.metrics {
            m.restart();
        }
        let mut spec = entry.spec.clone();
        // S40: a restart from handed-back items reads no record; it runs the version
        // the failed incarnation ran.
        spec.run.restart_version = Some(entry.handle.agent_version());
        match self
            .start(
                myself,
                spec,
                seed,
                from_record,
                Lineage {
                    restarts,
                    restarted: entry.restarted + 1,
                    detached: entry.detached,
                },
            )
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(session = id, error = %e, "restart failed; the session stays failed");
                if entry.spec.persist {
                    self.mark_failed(id, &error).await;
                }
                self.publish_end(&entry.spec, entry.restarted, exit);
                false
            }
        }
    }

    /// Reports a session's final end to every feed (dropping closed feeds).
    pub(super) fn publish_end(
        &mut self,
        spec: &SessionSpec<I>,
        restarted: u32,
        exit: ExitState<I>,
    ) {
        let end = SessionEnd {
            id: spec.id.clone(),
            kind: spec.kind.clone(),
            persistent: spec.persist,
            restarts: restarted,
            exit,
        };
        self.watchers.retain(|w| w.send(end.clone()).is_ok());
    }

    /// Past the budget: the record says `Failed` with the error (S26).
    pub(super) async fn mark_failed(&self, id: &str, error: &str) {
        if let Some(store) = &self.store {
            let r = StatusChange::FailedPastBudget(error.to_string())
                .apply(&**store, id)
                .await;
            if let Err(e) = r {
                tracing::error!(session = id, error = %e, "could not mark the record Failed");
            }
        }
    }

    /// The live incarnation for `id`, restarting it first if it has just ended, or
    /// waking it if it sleeps (S39).
    pub(super) async fn live(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        id: &str,
    ) -> Option<SessionHandle<I, E>> {
        if let Some(entry) = self.sessions.get(id) {
            let ended = entry.handle.has_ended();
            if !ended || self.on_end(myself, id).await {
                return self.sessions.get(id).map(|e| e.handle.clone());
            }
        }
        if self.sleeping.contains(id) {
            return self.wake(myself, id).await;
        }
        None
    }

    /// Why sleeping session `id` cannot be woken now, if it cannot: the runtime runs
    /// as many live sessions as `[limits] sessions` allows (S34a, issue 52: a wake is
    /// a new live session, and 20 000 wakes against a bound of 5 000 got past it).
    pub(super) fn wake_refused(&self, id: &str) -> Option<String> {
        let live = self.sessions.len();
        (self.sleeping.contains(id) && !self.sessions.contains_key(id) && live >= self.limits.max_sessions)
            .then(|| format!(
                "session `{id}` sleeps and cannot be woken now: this runtime already runs {} live sessions, its bound ([limits] sessions); retry once some have ended or fallen asleep, or raise the bound",
                self.limits.max_sessions
            ))
    }

    /// Whether `id` sleeps, or its incarnation has just fallen asleep (S39).
    pub(super) fn is_asleep(&self, id: &str) -> bool {
        self.sleeping.contains(id) || self.sessions.get(id).is_some_and(|e| e.handle.is_asleep())
    }

    /// An incarnation fell asleep (S39): the session stays, as a hash of its id (and
    /// its spec when its record cannot restore it). The registry's tables give back
    /// what they grew for sessions that now sleep.
    pub(super) fn fall_asleep(&mut self, id: &str, spec: SessionSpec<I>) {
        let spec = spec.needs_keeping().then_some(spec);
        self.sleeping.insert(id, spec);
        let live = self.sessions.len();
        if self.sessions.capacity() > 4 * live + 1024 {
            self.sessions.shrink_to_fit();
            self.by_actor.shrink_to_fit();
            self.directory.shrink();
        }
    }

    /// Wakes sleeping session `id` from its record (S39), unless a shutdown began (its
    /// record then stays as it is, for the next start). Whatever waits for it in this
    /// supervisor's mailbox is handled after the wake, in arrival order.
    pub(super) async fn wake(
        &mut self,
        myself: &ActorRef<SupervisorMsg<I, E>>,
        id: &str,
    ) -> Option<SessionHandle<I, E>> {
        if self.stopping || self.directory.gate_closed() {
            return None;
        }
        if !self.sleeping.contains(id) {
            return None;
        }
        if let Some(why) = self.wake_refused(id) {
            // A wake is a new live session (issue 52): at the bound it stays asleep,
            // its record as it is; a push is told to retry, a timer retries itself.
            tracing::debug!(session = id, "{why}");
            return None;
        }
        let kept = self.sleeping.remove(id);
        let store = self.store.clone()?;
        // The header says how to rebuild it; the session loads the whole record itself.
        let header = match store.load_stored(id).await {
            Ok(Some(crate::store::Stored::Current(r))) if !r.header.status.is_terminal() => {
                r.header
            }
            Ok(Some(stored)) => {
                tracing::info!(session = id, status = %stored.status(),
                    "a sleeping session's record was finalized or rewritten elsewhere; it stays as it is");
                return None;
            }
            Ok(None) => {
                tracing::info!(
                    session = id,
                    "a sleeping session's record is gone (deleted elsewhere)"
                );
                return None;
            }
            Err(e) => {
                // Kept asleep: a store that answers later wakes it then.
                tracing::warn!(session = id, error = %e,
                    "could not read a sleeping session's record to wake it; it stays asleep");
                self.sleeping.insert(id, kept.map(|s| *s));
                return None;
            }
        };
        let spec = match kept {
            Some(spec) => *spec,
            None => SessionSpec::from_header(
                &header,
                crate::session::Durability::Sync,
                crate::store::lease::DEFAULT_LEASE_TIMEOUT,
            ),
        };
        // A new lineage: the restart budget counts within one waking period.
        match self
            .start(myself, spec, Vec::new(), true, Lineage::default())
            .await
        {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::error!(session = id, error = %e,
                    "a sleeping session could not be woken; its record is kept as it is (restart the runtime with its agent kind registered to resume it)");
                None
            }
        }
    }
}
