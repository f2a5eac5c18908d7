//! `SessionHandle`: the typed, async face of one TurnLoop actor.
//!
//! It owns nothing but references (the actor, the session's shared state and its
//! subscriber registry), so it is cheap to clone and keeps working after the session
//! exited: pushes come back as late, stops are no-ops, subscribers get `Ended` at once,
//! `wait` returns the exit state.

use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::error::{SessionError, SpawnError};
use crate::events::{EventFilter, EventStream, Subscribers};
use crate::options::StopOptions;
use crate::session::messages::{SessionInfo, TurnLoopMsg};
use crate::session::turn_loop::{TurnLoop, TurnLoopArgs};
use crate::session::{validate_session_id, ExitReason, ExitState, SessionSpec};
use crate::shared::SessionShared;
use crate::store::CheckpointStore;
use crate::turn::agent::Agent;

/// A handle on one session. Generic only over the item and event types, so sessions of
/// different agent kinds can sit side by side.
pub struct SessionHandle<I, E> {
    pub(super) actor: ActorRef<TurnLoopMsg<I, E>>,
    pub(super) shared: Arc<SessionShared<I>>,
    subscribers: Arc<Subscribers<E>>,
    event_capacity: usize,
}

impl<I, E> Clone for SessionHandle<I, E> {
    fn clone(&self) -> Self {
        SessionHandle {
            actor: self.actor.clone(),
            shared: self.shared.clone(),
            subscribers: self.subscribers.clone(),
            event_capacity: self.event_capacity,
        }
    }
}

impl<I, E> std::fmt::Debug for SessionHandle<I, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("id", &self.shared.id)
            .finish()
    }
}

impl<I, E> SessionHandle<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Answers the business interrupt of session `config.id` and resumes it (S4; see
    /// `crate::session::answer`): the answer and this owner's claim are written to the
    /// record in one durable write before anything starts, then the session is spawned
    /// on that record with a subscriber attached (so it sees the resumed turn's
    /// `TurnStarted`). The resumed turn gets the answer in [`crate::turn::agent::Turn::answer`],
    /// beside its saved state and interrupted items, before any new item. Works after a
    /// process restart: the record is all it needs.
    ///
    /// Errors hand the answer back and leave the record unchanged, except
    /// [`AnswerError::Spawn`](crate::session::AnswerError::Spawn) (the answer is on record; spawn
    /// the session again).
    pub async fn resume_with_answer<A>(
        config: SessionSpec<I>,
        agent: Arc<A>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        answer: I,
        capacity: usize,
    ) -> Result<(Self, EventStream<E>), crate::session::AnswerError<I>>
    where
        A: Agent<Item = I, Event = E>,
        I: serde::Serialize + serde::de::DeserializeOwned,
    {
        let id = config.id.clone();
        let store = match store.filter(|_| config.persist) {
            Some(s) => s,
            None => return Err(crate::session::AnswerError::NotPersistent { id, answer }),
        };
        let record = crate::session::answer::claim_with_answer(
            &*store,
            &id,
            config.owner.as_deref(),
            answer,
            None,
        )
        .await?;
        let mut config = config;
        config.subscribe = Some((capacity, EventFilter::all()));
        let handle = Self::spawn_inner(config, agent, Some(store), None, Some(record))
            .await
            .map_err(|e| crate::session::AnswerError::Spawn {
                id: id.clone(),
                reason: e.to_string(),
            })?;
        match handle.take_events_at_spawn() {
            Some(events) => Ok((handle, events)),
            None => Err(crate::session::AnswerError::Spawn {
                id,
                reason: "the subscriber at spawn was not registered".into(),
            }),
        }
    }

    /// Starts a new session `config.id` from turn `turn`'s kept checkpoint of session
    /// `from` (issue 13, 4): its items and state, as that turn's end left them. The
    /// checkpoint is written as the new session's record first (never over an
    /// existing record), then the session starts on it, with `config`'s settings.
    /// `from` is untouched.
    pub async fn fork<A>(
        config: SessionSpec<I>,
        agent: Arc<A>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        from: &str,
        turn: u64,
    ) -> Result<Self, crate::session::ForkError>
    where
        A: Agent<Item = I, Event = E>,
        I: serde::Serialize + serde::de::DeserializeOwned,
    {
        let id = config.id.clone();
        let store = match store.filter(|_| config.persist) {
            Some(s) => s,
            None => return Err(crate::session::ForkError::NotPersistent(id)),
        };
        // The fork runs with `config`: its record says so from the first write.
        let settings = config.recorded_settings();
        let record =
            crate::session::fork::write_fork(&*store, from, turn, &id, |_| settings).await?;
        Self::spawn_inner(config, agent, Some(store), None, Some(record))
            .await
            .map_err(|e| crate::session::ForkError::Spawn {
                id,
                reason: e.to_string(),
            })
    }

    /// The stream registered before the actor started, once (the supervisor's
    /// subscribed spawn takes it right after the spawn).
    pub(crate) fn take_events_at_spawn(&self) -> Option<EventStream<E>> {
        self.subscribers.take_at_spawn()
    }

    pub(super) async fn spawn_inner<A>(
        mut config: SessionSpec<I>,
        agent: Arc<A>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        supervisor: Option<ActorCell>,
        preloaded: Option<crate::store::LoadedRecord<I>>,
    ) -> Result<Self, SpawnError>
    where
        A: Agent<Item = I, Event = E>,
    {
        validate_session_id(&config.id)?;
        let preloaded = preloaded.or_else(|| config.preloaded.take().map(|r| *r));
        if config.persist && store.is_none() {
            return Err(SpawnError::NoStore(config.id));
        }
        if config.history > 0 {
            let why = if config.history > crate::store::history::MAX_HISTORY {
                Some(format!(
                    "a history of {} checkpoints is over the bound of {}; ask for fewer",
                    config.history,
                    crate::store::history::MAX_HISTORY
                ))
            } else if !config.persist || config.durability == crate::session::Durability::Exit {
                Some(
                    "a checkpoint history needs a persistent session whose turn ends are \
                     written: durability Turn or Sync"
                        .to_string(),
                )
            } else {
                None
            };
            if let Some(why) = why {
                return Err(SpawnError::History { id: config.id, why });
            }
        }
        let keeper = match config.events {
            None => None,
            Some(retention) => {
                let why = if !config.persist {
                    Some("keeping events needs a persistent session".to_string())
                } else if !store.as_ref().is_some_and(|s| s.keeps_events()) {
                    Some("its checkpoint store keeps no events; use sled, fjall, PostgreSQL or the memory store, or spawn without keep_events".to_string())
                } else if retention.count == 0 {
                    Some("a retention of 0 events keeps nothing; ask for at least 1, or spawn without keep_events".to_string())
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(SpawnError::Events { id: config.id, why });
                }
                let codec = config
                    .run
                    .event_codec
                    .as_ref()
                    .and_then(|c| c.downcast_ref::<crate::events::EventCodec<E>>())
                    .cloned();
                match codec {
                    Some(codec) => Some(crate::events::keeper::Keeper::new(codec, retention)),
                    None => {
                        return Err(SpawnError::Events {
                            id: config.id,
                            why: "keeping its events needs a codec for the event type: build the runtime with RuntimeBuilder::keep_events(), or give the spec one with SessionSpec::event_codec(EventCodec::json())".into(),
                        })
                    }
                }
            }
        };
        let mut shared = SessionShared::new(config.id.clone());
        shared.agent_version = config.run.agent_version;
        let shared = Arc::new(shared);
        if let Some(store) = store
            .as_ref()
            .filter(|s| config.persist && s.keeps_timers())
        {
            let _ = shared.timers.set(crate::timers::TimerLink {
                store: store.clone(),
                service: config.run.timer_service.clone(),
                bounds: config.run.timer_bounds,
            });
        }
        let subscribers = Arc::new(Subscribers::new(
            shared.event_seq.clone(),
            config.replay,
            keeper,
        ));
        if let Some((capacity, filter)) = config.subscribe.take() {
            subscribers.reserve_at_spawn(capacity, filter);
        }
        let id = config.id.clone();
        let event_capacity = config.event_capacity;
        // The spec's seed items go in first, before anything the caller pushes (a
        // supervisor's incarnation carries none: the supervisor pushes them itself).
        let seed = std::mem::take(&mut config.initial_items);
        let args = TurnLoopArgs {
            config,
            agent,
            store,
            shared: shared.clone(),
            subscribers: subscribers.clone(),
            preloaded,
        };
        let spawned = match supervisor {
            None => Actor::spawn(None, TurnLoop::<A>::default(), args).await,
            Some(sup) => Actor::spawn_linked(None, TurnLoop::<A>::default(), args, sup).await,
        };
        let (actor, _join) = spawned.map_err(|e| SpawnError::Actor {
            id,
            reason: e.to_string(),
        })?;
        let handle = SessionHandle {
            actor,
            shared,
            subscribers,
            event_capacity,
        };
        for item in seed {
            handle.push(item).no_wait();
        }
        Ok(handle)
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The version of its agent kind this session runs (S40): the version that wrote
    /// its record, or the newest registered for a new or migrated session.
    pub fn agent_version(&self) -> u32 {
        self.shared.agent_version
    }

    /// The TurnLoop actor, for `cast!` / `call!` and supervision.
    pub fn actor(&self) -> &ActorRef<TurnLoopMsg<I, E>> {
        &self.actor
    }

    /// Stops the session (S11). Idempotent: stopping an exited session is Ok.
    pub async fn stop(&self, options: StopOptions) -> Result<(), SessionError> {
        options.validate()?;
        let (tx, rx) = oneshot::channel();
        let msg = TurnLoopMsg::Stop {
            options,
            reply: Some(RpcReplyPort::from(tx)),
        };
        if self.actor.send_message(msg).is_err() {
            return Ok(());
        }
        match rx.await {
            Ok(r) => r.map_err(SessionError::from),
            Err(_) => Ok(()),
        }
    }

    /// Hands the session to the background (S23): see [`TurnLoopMsg::Detach`]. Refused
    /// with `DetachNeedsStore` for a session without a store.
    pub async fn detach(&self) -> Result<(), SessionError> {
        self.ask_durable(|reply| TurnLoopMsg::Detach { reply })
            .await
    }

    /// Writes the session's record now and answers once it is durable (a persistent
    /// session; one not persistent is refused with [`SessionError::NotPersistent`]).
    /// What a durable timer armed for a session not written yet relies on (S39).
    pub async fn checkpoint(&self) -> Result<(), SessionError> {
        self.ask_durable(|reply| TurnLoopMsg::Checkpoint { reply })
            .await
    }

    /// Sends the message `msg` makes with a reply port and awaits the answer (a write
    /// made durable); a session that is gone, or goes before answering, is `Exited`.
    async fn ask_durable(
        &self,
        msg: impl FnOnce(RpcReplyPort<Result<(), SessionError>>) -> TurnLoopMsg<I, E>,
    ) -> Result<(), SessionError> {
        let (tx, rx) = oneshot::channel();
        if self
            .actor
            .send_message(msg(RpcReplyPort::from(tx)))
            .is_err()
        {
            return Err(SessionError::Exited(self.shared.id.clone()));
        }
        rx.await
            .map_err(|_| SessionError::Exited(self.shared.id.clone()))?
    }

    /// Attaches a bound client (S22): while the returned guard lives the client is
    /// connected; dropping it before [`SessionHandle::detach`] cancels the session's
    /// work (Immediate). After a detach, dropping it does nothing.
    pub fn attach_bound(&self) -> BoundClient {
        let handle = self.clone();
        BoundClient {
            disconnect: Some(Box::new(move || {
                if handle.is_detached() {
                    return;
                }
                let msg = TurnLoopMsg::Stop {
                    options: StopOptions::immediate().cause("client disconnected"),
                    reply: None,
                };
                // A session already gone has nothing left to cancel.
                let _ = handle.actor.send_message(msg);
            })),
        }
    }

    /// Whether the session was detached (handed to the background).
    pub fn is_detached(&self) -> bool {
        self.shared
            .detached
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Subscribes to the session's events with the session's default capacity (S20).
    /// After the exit the stream yields `Ended` at once. The stream never slows the
    /// session: when it falls behind by more than its capacity it gets
    /// [`SessionEvent::Lagged`](crate::events::SessionEvent::Lagged) and catches up from the
    /// replay buffer ([`SessionSpec::replay`]); use
    /// [`SessionHandle::subscribe_with_backpressure`] to see every event without one.
    pub fn subscribe(&self) -> EventStream<E> {
        self.subscribers
            .subscribe(self.event_capacity, EventFilter::all())
    }

    /// Subscribes with backpressure (S20): when the stream's buffer of `capacity`
    /// events is full, the session's turns wait for this reader, so it sees every event
    /// even without a replay buffer. For in-process readers that keep reading; a
    /// reader that stops holds the session's turns still (never its actor, its stops
    /// or its teardown).
    pub fn subscribe_with_backpressure(&self, capacity: usize) -> EventStream<E> {
        self.subscribers
            .subscribe(capacity, EventFilter::all().with_backpressure())
    }

    /// Subscribes with an explicit buffer capacity (lags when it falls behind).
    pub fn subscribe_with_capacity(&self, capacity: usize) -> EventStream<E> {
        self.subscribers.subscribe(capacity, EventFilter::all())
    }

    /// Subscribes to the events `filter` lets through (and `Ended`). Events filtered
    /// out neither wake nor slow this subscriber.
    pub fn subscribe_filtered(&self, capacity: usize, filter: EventFilter) -> EventStream<E> {
        self.subscribers.subscribe(capacity, filter)
    }

    /// Subscribes after event `seq` (a number a previous stream returned with
    /// [`EventStream::next_sequenced`]): the stream first yields, in order, the events
    /// numbered above `seq` that the session's replay buffer
    /// ([`SessionSpec::replay`]) still holds, preceded by
    /// [`SessionEvent::Lagged`](crate::events::SessionEvent::Lagged) when some are gone, then
    /// continues live. `seq` 0 asks for everything still held.
    pub fn subscribe_after(
        &self,
        seq: u64,
        capacity: usize,
        filter: EventFilter,
    ) -> EventStream<E> {
        self.subscribers.subscribe_after(seq, capacity, filter)
    }

    /// A snapshot of the session.
    pub async fn inspect(&self) -> Result<SessionInfo, SessionError> {
        let (tx, rx) = oneshot::channel();
        let msg = TurnLoopMsg::Inspect {
            reply: RpcReplyPort::from(tx),
        };
        if self.actor.send_message(msg).is_err() {
            return Err(SessionError::Exited(self.shared.id.clone()));
        }
        rx.await
            .map_err(|_| SessionError::Exited(self.shared.id.clone()))
    }

    /// Waits for the session to end and returns its exit state (S13).
    pub async fn wait(&self) -> ExitState<I> {
        let mut rx = self.shared.exit_signal();
        let exit = match rx.wait_for(|e| e.is_some()).await {
            Ok(e) => e.clone(),
            // Unreachable while this handle holds the shared state; answer anyway.
            Err(_) => None,
        };
        match exit {
            Some(e) => (*e).clone(),
            None => ExitState {
                session_id: self.shared.id.clone(),
                reason: ExitReason::Failed("the session's exit state was lost".into()),
                failure: Some(crate::session::FailureKind::Internal),
                stop_cause: self.shared.cause(),
                unhandled_items: Vec::new(),
                interrupted_items: Vec::new(),
                late_items: self.shared.late_snapshot(),
                has_mid_turn_state: false,
                checkpoint: crate::session::CheckpointOutcome::NotAttempted,
                counters: Default::default(),
                next_turn_index: 0,
            },
        }
    }

    /// Whether this incarnation has ended (its exit state is published); cheaper than
    /// [`exit_state`](SessionHandle::exit_state), which copies the state.
    pub(crate) fn has_ended(&self) -> bool {
        self.shared.exited().is_some() || self.subscribers.is_asleep()
    }

    /// Whether this incarnation went to sleep (S39): it is spent, its session lives on.
    pub(crate) fn is_asleep(&self) -> bool {
        self.subscribers.is_asleep()
    }

    /// The exit state if the session has ended.
    pub fn exit_state(&self) -> Option<ExitState<I>> {
        self.shared.exited().map(|e| (*e).clone())
    }

    /// Takes the late items recorded so far (S14): every push rejected after the stop
    /// committed, including those whose callers ignored the error.
    pub fn take_late_items(&self) -> Vec<I> {
        self.shared.take_late()
    }

    /// Whether a stop has committed (or the session exited).
    pub fn is_stopped(&self) -> bool {
        self.shared.is_stopped()
    }
}

/// A bound client's connection (S22): dropping it before the session is detached
/// cancels the session's work, Immediate. After a detach, dropping it does nothing.
pub struct BoundClient {
    disconnect: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl std::fmt::Debug for BoundClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoundClient")
    }
}

impl Drop for BoundClient {
    fn drop(&mut self) {
        if let Some(disconnect) = self.disconnect.take() {
            disconnect();
        }
    }
}
