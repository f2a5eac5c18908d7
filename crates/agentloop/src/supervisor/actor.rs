//! The supervisor actor: its message loop and its supervision of the sessions (its
//! linked children). Each message is answered from the registry (spawns, ends,
//! restarts) or handed to the session it names in a task, so the actor never waits on
//! a session. It decides nothing itself: admission, starts, restarts and ends are the
//! registry's ([`super::registry`]), pushes it routes are [`super::routing`]'s. It
//! touches the store only for a cancel by id (S24).

use super::args::SupervisorArgs;
use super::directory::Directory;
use super::error::SupervisorError;
use super::messages::RecordContext;
use super::messages::{
    AttachMode, Attachment, ClosedGate, GateMember, InternalMsg, Reroute, SessionEnd,
    SessionSummary, SupervisorInternal, SupervisorMsg, MAX_SPAWN_BATCH,
};
use super::registry::SupervisorState;
use super::routing::route_push;
use crate::error::SessionError;
use crate::options::StopOptions;
use crate::session::SessionHandle;
use crate::store::transition::StatusChange;
use crate::store::{CheckpointStore, SessionStatus};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use std::collections::HashMap;
use std::sync::Arc;

/// What a listing says of a live session.
fn summary<I, E>(e: &super::registry::Entry<I, E>) -> SessionSummary
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    SessionSummary {
        id: e.spec.id.clone(),
        kind: e.spec.kind.clone(),
        version: e.handle.agent_version(),
        restarts: e.restarted,
    }
}

/// The supervisor actor, with the directory it shares with its handles.
pub(crate) struct SessionSupervisor<I, E> {
    pub(super) directory: Arc<Directory<I, E>>,
}

impl<I, E> Actor for SessionSupervisor<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    type Msg = SupervisorMsg<I, E>;
    type State = SupervisorState<I, E>;
    type Arguments = SupervisorArgs<I, E>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: SupervisorArgs<I, E>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(SupervisorState {
            kinds: args.kinds,
            store: args.store,
            owner: args.owner,
            budget: args.budget,
            heartbeat: args.heartbeat,
            metrics: args.metrics,
            limits: args.limits,
            sessions: Default::default(),
            by_actor: HashMap::new(),
            stopping: false,
            stopping_flag: Default::default(),
            directory: self.directory.clone(),
            watchers: Vec::new(),
            sleeping: Default::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Spawn { spec, reply } => {
                let _ = reply.send(st.spawn_new(&myself, *spec).await);
            }
            SupervisorMsg::SpawnBatch { specs, reply } => {
                let answer = if specs.len() > MAX_SPAWN_BATCH {
                    let initial_items: usize = specs.iter().map(|s| s.initial_items.len()).sum();
                    tracing::warn!(
                        specs = specs.len(),
                        initial_items,
                        max = MAX_SPAWN_BATCH,
                        "a spawn batch was refused whole for its size; nothing in it was spawned"
                    );
                    Err(SupervisorError::BatchTooLarge {
                        len: specs.len(),
                        max: MAX_SPAWN_BATCH,
                    })
                } else {
                    Ok(st.spawn_batch(&myself, specs).await)
                };
                let _ = reply.send(answer);
            }
            SupervisorMsg::SpawnSubscribed {
                spec,
                capacity,
                filter,
                reply,
            } => {
                let mut spec = *spec;
                spec.subscribe = Some((capacity, filter));
                let r = st.spawn_new(&myself, spec).await.and_then(|handle| {
                    match handle.take_events_at_spawn() {
                        Some(events) => Ok((handle, events)),
                        None => Err(SupervisorError::Session(SessionError::Exited(
                            "the session's subscriber at spawn was not registered".into(),
                        ))),
                    }
                });
                // A caller that gave up drops the stream here, which unsubscribes it.
                let _ = reply.send(r);
            }
            SupervisorMsg::Push {
                id,
                item,
                options,
                reply,
            } => {
                route_push(&myself, st, id, item, options, reply, 0).await;
            }
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::Reroute(Reroute {
                id,
                item,
                options,
                reply,
                tries,
            }))) => {
                route_push(&myself, st, id, item, options, reply, tries).await;
            }
            SupervisorMsg::Stop { id, options, reply } if st.is_asleep(&id) => {
                // S39: woken, then stopped as any live session (its end hooks run, its
                // end is reported); after a shutdown began it stays asleep.
                let h = st.live(&myself, &id).await;
                answer_from_session(id, h, reply, |h| async move { h.stop(options).await });
            }
            SupervisorMsg::Stop { id, options, reply } => {
                let r = match st.sessions.get(&id) {
                    None => Err(SupervisorError::UnknownSession(id)),
                    Some(e) => {
                        let h = e.handle.clone();
                        // Answered off the actor: a stop's reply never blocks routing.
                        tokio::spawn(async move {
                            let _ = reply.send(h.stop(options).await.map_err(Into::into));
                        });
                        return Ok(());
                    }
                };
                let _ = reply.send(r);
            }
            SupervisorMsg::Subscribe {
                id,
                capacity,
                filter,
                reply,
            } => {
                let r = match st.live(&myself, &id).await {
                    Some(h) => Ok(h.subscribe_filtered(capacity, filter)),
                    None => Err(SupervisorError::UnknownSession(id)),
                };
                let _ = reply.send(r);
            }
            SupervisorMsg::SubscribeAfter {
                id,
                after,
                capacity,
                filter,
                reply,
            } => {
                let r = match st.live(&myself, &id).await {
                    Some(h) => Ok(h.subscribe_after(after, capacity, filter)),
                    None => Err(SupervisorError::UnknownSession(id)),
                };
                let _ = reply.send(r);
            }
            SupervisorMsg::Inspect { id, reply } => {
                let h = st.live(&myself, &id).await;
                answer_from_session(id, h, reply, |h| async move { h.inspect().await });
            }
            SupervisorMsg::Attach {
                id,
                mode,
                filter,
                reply,
            } => {
                let r = match st.live(&myself, &id).await {
                    Some(h) => Ok(Attachment {
                        events: h.subscribe_filtered(crate::events::DEFAULT_EVENT_CAPACITY, filter),
                        bound: (mode == AttachMode::Bound).then(|| h.attach_bound()),
                    }),
                    None => Err(SupervisorError::UnknownSession(id)),
                };
                let _ = reply.send(r);
            }
            SupervisorMsg::Checkpoint { id, reply } if st.sleeping.contains(&id) => {
                // Asleep, its record is written already (S39).
                let _ = reply.send(Ok(()));
            }
            SupervisorMsg::Checkpoint { id, reply } => {
                let h = st.live(&myself, &id).await;
                answer_from_session(id, h, reply, |h| async move { h.checkpoint().await });
            }
            SupervisorMsg::Detach { id, reply } => {
                let h = st.live(&myself, &id).await;
                // Only a persistent session can be detached (S23); a restart detaches
                // the new incarnation again.
                if let Some(e) = st.sessions.get_mut(&id).filter(|e| e.spec.persist) {
                    e.detached = true;
                }
                answer_from_session(id, h, reply, |h| async move { h.detach().await });
            }
            SupervisorMsg::Cancel { id, reply } => {
                // A sleeping session is woken and canceled like a live one (S39): its
                // record is rewritten `Canceled` with what it holds, its end reported.
                let live = match st.is_asleep(&id) {
                    true => st.live(&myself, &id).await,
                    false => st.sessions.get(&id).map(|e| e.handle.clone()),
                };
                // Before the cancel's task runs: an incarnation that fails meanwhile is
                // not restarted (S24, S26; found by conservation_system).
                if let Some(entry) = st.sessions.get_mut(&id) {
                    entry.canceled = true;
                    if let Some(oracle) = &entry.spec.run.restart_oracle {
                        oracle.cancel();
                    }
                }
                let store = st.store.clone();
                tokio::spawn(async move {
                    let _ = reply.send(cancel(store, live, id).await);
                });
            }
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::CloseGate { reply })) => {
                st.directory.close_gate();
                st.set_stopping();
                // A session asleep (or falling asleep) counts for nothing in the grace
                // (S39): its record is written and it runs nothing.
                let mut sessions: Vec<GateMember<I, E>> = st
                    .sessions
                    .values()
                    .filter(|e| !e.handle.is_asleep())
                    .map(|e| GateMember {
                        spec: e.spec.clone(),
                        handle: e.handle.clone(),
                    })
                    .collect();
                sessions.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
                tracing::info!(sessions = sessions.len(), "drain gate closed");
                // Opened in the same message as the members are taken: each of them
                // leaves the registry after this, and is reported on it then.
                let (feed, ends) = tokio::sync::mpsc::unbounded_channel();
                st.watchers.push(feed);
                let _ = reply.send(ClosedGate {
                    sessions,
                    late: st.directory.gate_late(),
                    owner: st.owner.clone(),
                    ends,
                });
            }
            SupervisorMsg::WatchEnds { feed } => st.watchers.push(feed),
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::RecordContext { reply })) => {
                let _ = reply.send(RecordContext {
                    store: st.store.clone(),
                    owner: st.owner.clone(),
                    kinds: st.kinds.keys().cloned().collect(),
                    full: (st.sessions.len() >= st.limits.max_sessions)
                        .then_some(st.limits.max_sessions),
                });
            }
            SupervisorMsg::StopAll { options, reply } => {
                st.set_stopping();
                let handles: Vec<SessionHandle<I, E>> =
                    st.sessions.values().map(|e| e.handle.clone()).collect();
                tokio::spawn(async move {
                    let mut exits = Vec::with_capacity(handles.len());
                    for h in &handles {
                        let _ = h.stop(options.clone()).await;
                    }
                    for h in handles {
                        exits.push(h.wait().await);
                    }
                    let _ = reply.send(exits);
                });
            }
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::RestartUse { id, reply })) => {
                let budget = st.budget;
                let now = tokio::time::Instant::now();
                let used = st.sessions.get(&id).map(|e| super::messages::RestartUse {
                    policy: e.spec.restart,
                    used: e
                        .restarts
                        .iter()
                        .filter(|t| now.duration_since(**t) <= budget.window)
                        .count() as u32,
                    limit: budget.max_restarts,
                    window_s: budget.window.as_secs(),
                    total: e.restarted,
                });
                let _ = reply.send(used);
            }
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::Counts { reply })) => {
                let falling = st
                    .sessions
                    .values()
                    .filter(|e| e.handle.is_asleep())
                    .count();
                let _ = reply.send(super::messages::SessionsByState {
                    live: st.sessions.len() - falling,
                    sleeping: st.sleeping.len() + falling,
                });
            }
            SupervisorMsg::Internal(SupervisorInternal(InternalMsg::Sleepers {
                sessions,
                reply,
            })) => {
                let mut refused = Vec::new();
                for (id, kind) in sessions {
                    if st.sessions.contains_key(&id) || st.sleeping.contains(&id) {
                        continue;
                    }
                    if !st.kinds.contains_key(&kind) {
                        refused.push(id);
                        continue;
                    }
                    st.sleeping.insert(&id, None);
                }
                let _ = reply.send(refused);
            }
            SupervisorMsg::List { reply } => {
                let v: Vec<SessionSummary> =
                    st.sessions.page(None, usize::MAX).map(summary).collect();
                let _ = reply.send(v);
            }
            SupervisorMsg::ListPage {
                after,
                limit,
                reply,
            } => {
                let v: Vec<SessionSummary> = st
                    .sessions
                    .page(after.as_deref(), limit)
                    .map(summary)
                    .collect();
                let _ = reply.send(v);
            }
        }
        Ok(())
    }

    /// Invariant: every session still registered when the supervisor stops is reported
    /// to the end feeds, so a feed closes only after every session's end is on it. A
    /// session that has not ended yet is waited for in a task that holds the feeds
    /// open; it cannot wait forever: after `post_stop` ractor kills the supervisor's
    /// linked children, and a killed session still publishes its exit state (from its
    /// state's destructor). A supervisor that panics skips `post_stop`: its feeds then
    /// close without the ends of the sessions it still held.
    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        st.set_stopping();
        let ids: Vec<String> = st.sessions.keys().cloned().collect();
        for id in ids {
            let Some(entry) = st.sessions.remove(&id) else {
                continue;
            };
            st.directory.remove(&id);
            if entry.handle.is_asleep() {
                continue; // not an end (S39)
            }
            match entry.handle.exit_state() {
                Some(exit) => st.publish_end(&entry.spec, entry.restarted, exit),
                None if st.watchers.is_empty() => {}
                None => {
                    let watchers = st.watchers.clone();
                    tokio::spawn(async move {
                        let exit = entry.handle.wait().await;
                        let end = SessionEnd {
                            id: entry.spec.id.clone(),
                            kind: entry.spec.kind.clone(),
                            persistent: entry.spec.persist,
                            restarts: entry.restarted,
                            exit,
                        };
                        for w in watchers {
                            let _ = w.send(end.clone());
                        }
                    });
                }
            }
        }
        st.watchers.clear();
        Ok(())
    }

    /// Overrides ractor's default, which stops the supervisor when a child exits: a
    /// session's end is handled (restart or forget) and the supervisor lives on.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let cell = match &evt {
            SupervisionEvent::ActorTerminated(cell, _, _)
            | SupervisionEvent::ActorFailed(cell, _) => cell.clone(),
            _ => return Ok(()),
        };
        // Invariant: a killed session's state travels inside this event (ractor boxes
        // it into `ActorTerminated`), and its destructor is what publishes the exit
        // state `on_end` waits for. Drop the event first, or that wait never ends.
        drop(evt);
        // Only the current incarnation counts (an older one was already handled when a
        // routed message found it ended).
        if let Some(id) = st.by_actor.get(&cell.get_id()).cloned() {
            st.on_end(&myself, &id).await;
        }
        Ok(())
    }
}

/// Answers a request by id from the live session, in a task so the supervisor never
/// waits on a session; an unknown id is answered at once.
pub(super) fn answer_from_session<I, E, T, F, Fut>(
    id: String,
    handle: Option<SessionHandle<I, E>>,
    reply: RpcReplyPort<Result<T, SupervisorError>>,
    op: F,
) where
    I: Send + Sync + 'static,
    E: Send + Sync + 'static,
    T: Send + 'static,
    F: FnOnce(SessionHandle<I, E>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, SessionError>> + Send + 'static,
{
    match handle {
        Some(h) => {
            tokio::spawn(async move {
                let _ = reply.send(op(h).await.map_err(Into::into));
            });
        }
        None => {
            let _ = reply.send(Err(SupervisorError::UnknownSession(id)));
        }
    }
}

/// S24: flip the record `Running` → `Canceled` (atomically: a finalizer that loses the
/// race leaves it), then stop the live session Immediate.
pub(super) async fn cancel<I, E>(
    store: Option<Arc<dyn CheckpointStore<I>>>,
    live: Option<SessionHandle<I, E>>,
    id: String,
) -> Result<SessionStatus, SupervisorError>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    let outcome = match &store {
        Some(s) => Some(
            StatusChange::CanceledById
                .apply(&**s, &id)
                .await
                .map_err(|e| SupervisorError::Session(SessionError::Store(e)))?,
        ),
        None => None,
    };
    let status = match outcome {
        Some(crate::store::CasOutcome::Mismatch(s)) => return Ok(s), // terminal: no-op
        Some(crate::store::CasOutcome::Swapped(_)) => SessionStatus::Canceled,
        Some(crate::store::CasOutcome::Missing) | None => match &live {
            Some(_) => SessionStatus::Canceled,
            None => return Err(SupervisorError::UnknownSession(id)),
        },
    };
    if let Some(h) = live {
        let mut stop = StopOptions::immediate().cause("canceled");
        stop.canceled = true;
        h.stop(stop).await?;
    }
    Ok(status)
}
