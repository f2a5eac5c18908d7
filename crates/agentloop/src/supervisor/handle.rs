//! The typed handle on a supervisor, what embedders and the runtime call. A push to a
//! live session goes through the [`super::directory`] straight to the session; every
//! other request is a message to the supervisor actor. The handle keeps no state of its
//! own beyond the actor's reference and the directory.

use super::actor::SessionSupervisor;
use super::args::SupervisorArgs;
use super::directory::Directory;
use super::error::{gone, SupervisorError};
use super::messages::{
    AttachMode, Attachment, BatchSpawn, ClosedGate, InternalMsg, SessionEnd, SessionSummary,
    SubscribedSpawn, SupervisorMsg, MAX_SPAWN_BATCH,
};
use crate::error::{SessionError, SpawnError};
use crate::events::{EventFilter, EventStream};
use crate::options::{PushOptions, StopOptions};
use crate::session::SessionSpec;
use crate::session::{
    validate_session_id, Durability, ExitReason, ExitState, PreemptAck, PushError, SessionHandle,
    SessionInfo,
};
use crate::store::SessionStatus;
use ractor::{Actor, ActorCell, ActorRef, RpcReplyPort};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A typed handle on a SessionSupervisor.
pub struct SupervisorHandle<I, E> {
    pub(super) actor: ActorRef<SupervisorMsg<I, E>>,
    /// The supervisor's directory: a push to a live session goes straight to it.
    pub(super) directory: Arc<Directory<I, E>>,
}

impl<I, E> Clone for SupervisorHandle<I, E> {
    fn clone(&self) -> Self {
        SupervisorHandle {
            actor: self.actor.clone(),
            directory: self.directory.clone(),
        }
    }
}

impl<I, E> SupervisorHandle<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Starts a supervisor (unlinked).
    pub async fn start(args: SupervisorArgs<I, E>) -> Result<Self, SpawnError> {
        Self::start_under(args, None).await
    }

    /// Starts a supervisor linked under `parent` (embedding in your actor tree, S25).
    pub async fn start_linked(
        args: SupervisorArgs<I, E>,
        parent: ActorCell,
    ) -> Result<Self, SpawnError> {
        Self::start_under(args, Some(parent)).await
    }

    /// Starts the actor, linked under `parent` when there is one, with the directory
    /// this handle shares with it.
    async fn start_under(
        args: SupervisorArgs<I, E>,
        parent: Option<ActorCell>,
    ) -> Result<Self, SpawnError> {
        let directory = Arc::new(Directory::new(args.metrics.clone()));
        let supervisor = SessionSupervisor {
            directory: directory.clone(),
        };
        let spawned = match parent {
            Some(parent) => Actor::spawn_linked(None, supervisor, args, parent).await,
            None => Actor::spawn(None, supervisor, args).await,
        };
        let (actor, _) = spawned.map_err(|e| SpawnError::Actor {
            id: "session-supervisor".into(),
            reason: e.to_string(),
        })?;
        Ok(SupervisorHandle { actor, directory })
    }

    /// The actor, for `cast!` / `call!` and supervision.
    pub fn actor(&self) -> &ActorRef<SupervisorMsg<I, E>> {
        &self.actor
    }

    async fn ask<T>(
        &self,
        build: impl FnOnce(RpcReplyPort<T>) -> SupervisorMsg<I, E>,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.actor
            .send_message(build(RpcReplyPort::from(tx)))
            .ok()?;
        rx.await.ok()
    }

    /// A request answered with a `Result`; when the supervisor is gone (the request
    /// cannot be sent, or its reply never comes), the answer says so.
    async fn request<T>(
        &self,
        build: impl FnOnce(RpcReplyPort<Result<T, SupervisorError>>) -> SupervisorMsg<I, E>,
    ) -> Result<T, SupervisorError> {
        self.ask(build).await.unwrap_or_else(|| Err(gone()))
    }

    /// Starts a session (the body of [`SupervisorHandle::spawn`]).
    pub(super) async fn spawn_now(
        &self,
        spec: SessionSpec<I>,
    ) -> Result<SessionHandle<I, E>, SupervisorError> {
        let spec = Box::new(spec);
        self.request(|reply| SupervisorMsg::Spawn { spec, reply })
            .await
    }

    /// Spawns many sessions with few requests: `specs` go to the supervisor in batches
    /// of at most [`MAX_SPAWN_BATCH`](super::MAX_SPAWN_BATCH), each one request and one reply, and the sessions
    /// of a batch start concurrently. Answers one result per spec, in order; a spec that
    /// fails (a bad or duplicate id, an unknown kind, the drain gate) fails alone. The
    /// fast way to start thousands of sessions (B2).
    pub async fn spawn_batch(&self, specs: Vec<SessionSpec<I>>) -> BatchSpawn<I, E> {
        let mut answers = Vec::with_capacity(specs.len());
        let mut specs = specs.into_iter().peekable();
        while specs.peek().is_some() {
            let batch: Vec<SessionSpec<I>> = specs.by_ref().take(MAX_SPAWN_BATCH).collect();
            let len = batch.len();
            match self
                .ask(|reply| SupervisorMsg::SpawnBatch {
                    specs: batch,
                    reply,
                })
                .await
            {
                Some(Ok(batch)) => answers.extend(batch),
                Some(Err(e)) => {
                    // Not reached: batches are cut to the bound above.
                    tracing::warn!(error = %e, "a spawn batch was refused");
                    answers.extend((0..len).map(|_| Err(gone())));
                }
                None => answers.extend((0..len).map(|_| Err(gone()))),
            }
        }
        answers
    }

    /// Starts a session with a subscriber attached before its actor starts (the body
    /// of [`Spawn::subscribed`](super::Spawn::subscribed)).
    pub(super) async fn spawn_subscribed_now(
        &self,
        spec: SessionSpec<I>,
        capacity: usize,
        filter: EventFilter,
    ) -> SubscribedSpawn<I, E> {
        let spec = Box::new(spec);
        self.request(|reply| SupervisorMsg::SpawnSubscribed {
            spec,
            capacity,
            filter,
            reply,
        })
        .await
    }

    /// Answers the business interrupt of stored session `id` and resumes it under
    /// this supervisor (S4, S25), also after a process restart: the answer and this
    /// supervisor's claim are one durable write before the session starts (see
    /// [`SessionHandle::resume_with_answer`]); the agent is rebuilt from the record's
    /// kind and configuration. Returns the handle and a stream attached before the
    /// session started (it sees the resumed turn's `TurnStarted`). The session is
    /// persistent with the settings its record kept (issue 28: durability, history,
    /// replay, restart policy, poll interval), or, for a record written before
    /// settings were kept, with `durability` and the defaults.
    pub async fn resume_with_answer(
        &self,
        id: &str,
        answer: I,
        durability: Durability,
        capacity: usize,
    ) -> Result<(SessionHandle<I, E>, EventStream<E>), crate::session::AnswerError<I>>
    where
        I: serde::Serialize + serde::de::DeserializeOwned,
    {
        let Some(ctx) = self
            .ask(|reply| InternalMsg::RecordContext { reply }.into())
            .await
        else {
            return Err(crate::session::AnswerError::Unavailable {
                id: id.to_string(),
                reason: "the session supervisor is gone; start the runtime again".into(),
                answer,
            });
        };
        let Some(store) = ctx.store else {
            return Err(crate::session::AnswerError::NotPersistent {
                id: id.to_string(),
                answer,
            });
        };
        let record = crate::session::answer::claim_with_answer(
            &*store,
            id,
            ctx.owner.as_deref(),
            answer,
            Some(&ctx.kinds),
        )
        .await?;
        // The session's own settings (issue 28); `durability` for an older record.
        let mut spec = SessionSpec::new(id, record.header.agent_kind.clone())
            .config(record.header.agent_config.clone())
            .persistent(true);
        spec = match record.header.settings {
            Some(s) => spec.settings(s),
            None => spec.durability(durability),
        };
        spec.preloaded = Some(Box::new(record));
        self.spawn_subscribed_now(spec, capacity, EventFilter::all())
            .await
            .map_err(|e| crate::session::AnswerError::Spawn {
                id: id.to_string(),
                reason: e.to_string(),
            })
    }

    /// Starts new session `to` under this supervisor from turn `turn`'s kept checkpoint
    /// of session `from` (issue 13, 4), with the source's agent kind, configuration and
    /// settings as that checkpoint kept them (issue 28: durability, replay, restart
    /// policy, poll interval), or `durability` and the defaults for a checkpoint written
    /// before settings were kept; persistent, keeping `history` checkpoints of its own.
    pub async fn fork(
        &self,
        from: &str,
        turn: u64,
        to: &str,
        durability: Durability,
        history: usize,
    ) -> Result<SessionHandle<I, E>, crate::session::ForkError>
    where
        I: serde::Serialize + serde::de::DeserializeOwned,
    {
        let gone = || crate::session::ForkError::Spawn {
            id: to.to_string(),
            reason: "the session supervisor is gone".into(),
        };
        let ctx = self
            .ask(|reply| InternalMsg::RecordContext { reply }.into())
            .await
            .ok_or_else(gone)?;
        let Some(store) = ctx.store else {
            return Err(crate::session::ForkError::NotPersistent(to.to_string()));
        };
        // A fork is a new live session (issue 52: 64 227 forks ran against a bound of
        // 1 000): refused before anything is written when there is no room.
        if let Some(max) = ctx.full {
            return Err(crate::session::ForkError::TooManySessions {
                id: to.to_string(),
                max,
            });
        }
        // The checkpoint's own settings (issue 28), or `durability` with the defaults
        // for a checkpoint written before settings were kept; the fork's history is its
        // own.
        let overrides = |kept: Option<crate::session::SessionSettings>| {
            let mut s = kept.unwrap_or(crate::session::SessionSettings {
                durability,
                ..Default::default()
            });
            s.history = history;
            s
        };
        let record = crate::session::fork::write_fork(&*store, from, turn, to, overrides).await?;
        let settings = record.header.settings.unwrap_or_default();
        let mut spec = SessionSpec::new(to, record.header.agent_kind.clone())
            .config(record.header.agent_config.clone())
            .persistent(true)
            .settings(settings);
        spec.preloaded = Some(Box::new(record));
        match self.spawn_now(spec).await {
            Ok(handle) => Ok(handle),
            // Another spawn took the last place meanwhile: the fork's record goes, so
            // a refused fork leaves nothing behind.
            Err(SupervisorError::TooManySessions { max, .. }) => {
                if let Err(e) = store.delete(to).await {
                    tracing::warn!(session = to, error = %e,
                        "a fork refused for the session bound could not remove its record; delete it, or spawn it to run it");
                }
                Err(crate::session::ForkError::TooManySessions {
                    id: to.to_string(),
                    max,
                })
            }
            Err(e) => Err(crate::session::ForkError::Spawn {
                id: to.to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// Deletes stored session `id`: its record, its checkpoint history and its kept events (S20a) (issue 13,
    /// 4). Refused while the session runs here (stop it first); resolves to whether
    /// anything was stored.
    pub async fn delete(&self, id: &str) -> Result<bool, SupervisorError> {
        validate_session_id(id)?;
        // Asked of the live entry (as every by-id request is): a session that has just
        // exited, whose end the supervisor has not taken yet, does not count as running.
        if self.inspect(id).await.is_ok() {
            return Err(SupervisorError::Running(id.to_string()));
        }
        let ctx = self
            .ask(|reply| InternalMsg::RecordContext { reply }.into())
            .await
            .ok_or_else(gone)?;
        let Some(store) = ctx.store else {
            return Ok(false);
        };
        store
            .purge(id)
            .await
            .map_err(|e| SupervisorError::Session(SessionError::Store(e)))
    }

    /// Pushes to a session by id, here (the supervisor's own sessions; a runtime's
    /// `push` also reaches sessions on other nodes). Chain
    /// [`PushById::options`](crate::push::PushById::options), then await it.
    pub fn push<'a>(&'a self, id: &'a str, item: I) -> crate::push::PushById<'a, Self, I> {
        crate::push::PushById::new(self, id, item)
    }

    /// Pushes with options to a session by id.
    #[deprecated(
        note = "one way to push (issue 54): `supervisor.push(id, item).options(options).await`"
    )]
    pub async fn push_with(
        &self,
        id: &str,
        item: I,
        options: PushOptions<I>,
    ) -> Result<PreemptAck, PushError<I>> {
        self.push_here(id, item, options).await
    }

    /// A push by id to a session this supervisor runs (or restarts, or wakes).
    pub(crate) async fn push_here(
        &self,
        id: &str,
        item: I,
        options: PushOptions<I>,
    ) -> Result<PreemptAck, PushError<I>> {
        use crate::metrics::PushResult;
        // The direct way (issue 31): a live incarnation takes the push on this task,
        // without the supervisor's mailbox or a routing task. An incarnation that ended
        // meanwhile, a closed gate and an unknown id go the supervisor's way below.
        let (item, options) = match self.directory.live(id) {
            Some(h) if !self.directory.gate_closed() => {
                let retry_options = options.clone();
                match h.push(item).options(options).await {
                    Ok(ack) => {
                        self.directory.count(PushResult::Accepted);
                        return Ok(ack);
                    }
                    // Ended between lookup and delivery: a failed incarnation may be
                    // restarting, which the supervisor decides (as for a routed push).
                    // One that fell asleep is woken by the supervisor (S39).
                    Err(PushError::Late { item })
                        if h.exit_state().is_some_and(|e| {
                            matches!(e.reason, ExitReason::Failed(_) | ExitReason::Asleep)
                        }) =>
                    {
                        let _ = h.take_late_items();
                        (item, retry_options)
                    }
                    Err(e) => {
                        self.directory.count(match e {
                            PushError::Late { .. } => PushResult::Late,
                            _ => PushResult::Refused,
                        });
                        return Err(e);
                    }
                }
            }
            _ => (item, options),
        };
        let copy = item.clone();
        let id = id.to_string();
        self.ask(|reply| SupervisorMsg::Push {
            id,
            item,
            options,
            reply,
        })
        .await
        .unwrap_or(Err(PushError::Late { item: copy }))
    }

    /// Stops a session by id.
    pub async fn stop(&self, id: &str, options: StopOptions) -> Result<(), SupervisorError> {
        // Straight to the incarnation the registry holds (ended or not, as the actor
        // would); an id it does not hold is answered by the actor.
        // One asleep goes to the supervisor, which wakes it to stop it (S39).
        if let Some(h) = self.directory.get(id).filter(|h| !h.is_asleep()) {
            return h.stop(options).await.map_err(Into::into);
        }
        let id = id.to_string();
        self.request(|reply| SupervisorMsg::Stop { id, options, reply })
            .await
    }

    /// Sets the codec sessions keep their events with (S20a), unless one was set.
    pub(crate) fn set_timer_service(&self, notify: crate::timers::Notify) {
        self.directory.set_timer_service(notify);
    }

    pub(crate) fn set_event_codec(&self, codec: Arc<dyn std::any::Any + Send + Sync>) {
        self.directory.set_event_codec(codec);
    }

    /// The runtime's codec for kept events of type `E`, if one was set.
    pub(crate) fn event_codec(&self) -> Option<crate::events::EventCodec<E>> {
        self.directory
            .event_codec()
            .and_then(|c| c.downcast_ref::<crate::events::EventCodec<E>>().cloned())
    }

    /// Subscribes to a session's current incarnation.
    pub async fn subscribe(
        &self,
        id: &str,
        filter: EventFilter,
    ) -> Result<EventStream<E>, SupervisorError> {
        let capacity = crate::events::DEFAULT_EVENT_CAPACITY;
        // A live incarnation directly; one that ended (maybe restarting) via the actor.
        if let Some(h) = self.directory.live(id) {
            let events = h.subscribe_filtered(capacity, filter);
            // Fell asleep just before (S39): the supervisor wakes it.
            if !h.is_asleep() {
                return Ok(events);
            }
        }
        let id = id.to_string();
        self.request(|reply| SupervisorMsg::Subscribe {
            id,
            capacity,
            filter,
            reply,
        })
        .await
    }

    /// Subscribes to a session's current incarnation after event `after` (a number a
    /// previous stream gave, e.g. an SSE client's `Last-Event-ID`): the events the
    /// replay buffer still holds come first, preceded by `Lagged` when some are gone.
    pub async fn subscribe_after(
        &self,
        id: &str,
        after: u64,
        filter: EventFilter,
    ) -> Result<EventStream<E>, SupervisorError> {
        if let Some(h) = self.directory.live(id) {
            let capacity = crate::events::DEFAULT_EVENT_CAPACITY;
            let events = h.subscribe_after(after, capacity, filter);
            // Fell asleep just before (S39): the supervisor wakes it.
            if !h.is_asleep() {
                return Ok(events);
            }
        }
        let id = id.to_string();
        self.request(|reply| SupervisorMsg::SubscribeAfter {
            id,
            after,
            capacity: crate::events::DEFAULT_EVENT_CAPACITY,
            filter,
            reply,
        })
        .await
    }

    /// Whether session `id` runs here now (no message to the supervisor; a session
    /// asleep does not run, S39).
    pub fn is_live(&self, id: &str) -> bool {
        self.directory.live(id).is_some_and(|h| !h.is_asleep())
    }

    /// Inspects a session by id (a sleeping one is woken, S39).
    pub async fn inspect(&self, id: &str) -> Result<SessionInfo, SupervisorError> {
        if let Some(h) = self.directory.live(id) {
            match h.inspect().await {
                // Fell asleep meanwhile (S39): the supervisor wakes it.
                Err(_) if h.is_asleep() => {}
                r => return r.map_err(Into::into),
            }
        }
        let id = id.to_string();
        self.request(|reply| SupervisorMsg::Inspect { id, reply })
            .await
    }

    /// Attaches a client (S22).
    pub async fn attach(
        &self,
        id: &str,
        mode: AttachMode,
        filter: EventFilter,
    ) -> Result<Attachment<E>, SupervisorError> {
        let id = id.to_string();
        self.request(|reply| SupervisorMsg::Attach {
            id,
            mode,
            filter,
            reply,
        })
        .await
    }

    /// Writes a live session's record now, answered once durable (see
    /// [`SessionHandle::checkpoint`](crate::session::SessionHandle::checkpoint)).
    pub async fn checkpoint(&self, id: &str) -> Result<(), SupervisorError> {
        let id = id.to_string();
        self.request(|reply| SupervisorMsg::Checkpoint { id, reply })
            .await
    }

    /// Detaches a session (S23).
    pub async fn detach(&self, id: &str) -> Result<(), SupervisorError> {
        let id = id.to_string();
        self.request(|reply| SupervisorMsg::Detach { id, reply })
            .await
    }

    /// Cancels a session by id (S24); answers the record's status afterwards.
    pub async fn cancel(&self, id: &str) -> Result<SessionStatus, SupervisorError> {
        let id = id.to_string();
        self.request(|reply| SupervisorMsg::Cancel { id, reply })
            .await
    }

    /// Stops every session in-band and returns their exit states (see
    /// [`SupervisorMsg::StopAll`](super::SupervisorMsg::StopAll)).
    pub async fn stop_all(&self, options: StopOptions) -> Vec<ExitState<I>> {
        self.ask(|reply| SupervisorMsg::StopAll { options, reply })
            .await
            .unwrap_or_default()
    }

    /// Closes the drain gate (S27; the shutdown coordinator's first step). `None` if
    /// the supervisor is gone.
    pub(crate) async fn close_gate(&self) -> Option<ClosedGate<I, E>> {
        self.ask(|reply| InternalMsg::CloseGate { reply }.into())
            .await
    }

    /// A feed of session ends ([`SessionEnd`]): every session that leaves the registry
    /// for good from now on, with its final exit state and so every item it still held.
    /// Ends before this call are not replayed. The feed ends (`None`) after the
    /// supervisor stopped and every session it held has been reported. `None` if the
    /// supervisor is gone.
    pub fn session_ends(&self) -> Option<mpsc::UnboundedReceiver<SessionEnd<I>>> {
        let (feed, rx) = mpsc::unbounded_channel();
        self.watch_ends(feed).then_some(rx)
    }

    /// Reports session ends on `feed` (see [`SupervisorHandle::session_ends`]); false if
    /// the supervisor is gone.
    pub fn watch_ends(&self, feed: mpsc::UnboundedSender<SessionEnd<I>>) -> bool {
        self.actor
            .send_message(SupervisorMsg::WatchEnds { feed })
            .is_ok()
    }

    /// A live session's restart policy, budget and how much of it is used (S26);
    /// `None` when no session of that id runs here.
    pub async fn restart_use(&self, id: &str) -> Option<super::messages::RestartUse> {
        let id = id.to_string();
        self.ask(|reply| InternalMsg::RestartUse { id, reply }.into())
            .await
            .flatten()
    }

    /// How many sessions it holds, live and asleep (S39); cheap however many sleep.
    pub async fn counts(&self) -> super::messages::SessionsByState {
        self.ask(|reply| InternalMsg::Counts { reply }.into())
            .await
            .unwrap_or_default()
    }

    /// Registers sessions whose records say they sleep, without starting them (the
    /// runtime's resume, S39). Answers the ids refused for an unknown agent kind.
    pub(crate) async fn sleepers(&self, sessions: Vec<(String, String)>) -> Vec<String> {
        let ids: Vec<String> = sessions.iter().map(|(id, _)| id.clone()).collect();
        self.ask(|reply| InternalMsg::Sleepers { sessions, reply }.into())
            .await
            .unwrap_or(ids)
    }

    /// Sets the runtime's default `idle_after` for the sessions it spawns (S39).
    pub(crate) fn set_idle_after(&self, idle: std::time::Duration) {
        self.directory.set_idle_after(idle);
    }

    /// Lists the live sessions, by id, including any falling asleep right now. Sessions
    /// asleep (S39) are not held in memory by id: their records list them
    /// ([`CheckpointStore::list_stored`](crate::store::CheckpointStore::list_stored): `asleep` in the header);
    /// [`SupervisorHandle::counts`] counts them.
    pub async fn list(&self) -> Vec<SessionSummary> {
        self.ask(|reply| SupervisorMsg::List { reply })
            .await
            .unwrap_or_default()
    }

    /// One page of [`SupervisorHandle::list`]: the live sessions whose id comes after
    /// `after` (from the first when `None`), in id order, at most `limit`. It costs what
    /// it returns (the supervisor keeps its ids in order), however many sessions live
    /// (issue 52).
    pub async fn list_page(&self, after: Option<&str>, limit: usize) -> Vec<SessionSummary> {
        let after = after.map(str::to_string);
        self.ask(|reply| SupervisorMsg::ListPage {
            after,
            limit,
            reply,
        })
        .await
        .unwrap_or_default()
    }
}

impl<I, E> crate::push::sealed::Sealed for SupervisorHandle<I, E> {}

impl<I, E> crate::push::PushTarget<I> for SupervisorHandle<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    fn push_by_id<'a>(
        &'a self,
        id: &'a str,
        item: I,
        options: PushOptions<I>,
    ) -> futures::future::BoxFuture<'a, Result<PreemptAck, PushError<I>>> {
        Box::pin(self.push_here(id, item, options))
    }
}
