//! A session being started without a supervisor ([`SessionHandle::spawn`]): the same
//! door as a supervisor's `spawn`, for a session of an agent you built yourself. Chain
//! [`SessionSpawn::linked`] to hang it under your own actor (S25) and
//! [`SessionSpawn::subscribed`] for a stream attached before it starts; await it. It
//! holds the request until it is awaited; the session's actor decides everything.

use std::future::IntoFuture;
use std::sync::Arc;

use futures::future::BoxFuture;
use ractor::ActorCell;

use crate::error::SpawnError;
use crate::events::{EventFilter, EventStream};
use crate::options::StopOptions;
use crate::session::{SessionHandle, SessionSpec};
use crate::store::CheckpointStore;
use crate::turn::agent::Agent;

impl<I, E> SessionHandle<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Starts a session of `agent` without a supervisor: the same door as
    /// [`SupervisorHandle::spawn`](crate::supervisor::SupervisorHandle::spawn), for an
    /// agent you built yourself. Await it for the handle; chain
    /// [`SessionSpawn::linked`] to hang it under your own actor (S25) and
    /// [`SessionSpawn::subscribed`] for a stream attached before it starts. A session
    /// started this way is not restarted by anything (S26 is the supervisor's).
    pub fn spawn<A>(
        spec: SessionSpec<I>,
        agent: Arc<A>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
    ) -> SessionSpawn<A>
    where
        A: Agent<Item = I, Event = E>,
    {
        SessionSpawn::new(spec, agent, store)
    }

    /// Spawns a session of `agent` linked under `supervisor` (S25).
    #[deprecated(
        note = "one way to start a session (issue 54): `SessionHandle::spawn(spec, agent, store).linked(parent).await`"
    )]
    pub async fn spawn_linked<A>(
        spec: SessionSpec<I>,
        agent: Arc<A>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        supervisor: ActorCell,
    ) -> Result<Self, SpawnError>
    where
        A: Agent<Item = I, Event = E>,
    {
        Self::spawn(spec, agent, store).linked(supervisor).await
    }

    /// Spawns a session of `agent` (unsupervised) with a subscriber attached before its
    /// actor starts.
    #[deprecated(
        note = "one way to start a session (issue 54): `SessionHandle::spawn(spec, agent, store).subscribed(capacity, filter).await`"
    )]
    pub async fn spawn_subscribed<A>(
        spec: SessionSpec<I>,
        agent: Arc<A>,
        store: Option<Arc<dyn CheckpointStore<I>>>,
        capacity: usize,
        filter: EventFilter,
    ) -> Result<(Self, EventStream<E>), SpawnError>
    where
        A: Agent<Item = I, Event = E>,
    {
        Self::spawn(spec, agent, store)
            .subscribed(capacity, filter)
            .await
    }
}

/// A session of `agent` being started without a supervisor: await it for its handle.
/// Nothing starts before it is awaited.
#[must_use = "a session is started when this is awaited"]
pub struct SessionSpawn<A: Agent> {
    spec: SessionSpec<A::Item>,
    agent: Arc<A>,
    store: Option<Arc<dyn CheckpointStore<A::Item>>>,
    parent: Option<ActorCell>,
}

impl<A: Agent> SessionSpawn<A> {
    pub(crate) fn new(
        spec: SessionSpec<A::Item>,
        agent: Arc<A>,
        store: Option<Arc<dyn CheckpointStore<A::Item>>>,
    ) -> Self {
        SessionSpawn {
            spec,
            agent,
            store,
            parent: None,
        }
    }

    /// Links the session's actor under `parent` (your actor tree, S25): your actor
    /// supervises it; nothing restarts it.
    pub fn linked(mut self, parent: ActorCell) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Attaches a subscriber before the session's actor starts: the stream sees every
    /// event of the session from the first, also when the first turn (a resume, S17)
    /// starts and ends before the answer comes. `capacity` bounds the stream's buffer
    /// (backpressure, S20).
    pub fn subscribed(mut self, capacity: usize, filter: EventFilter) -> SessionSpawnSubscribed<A> {
        self.spec.subscribe = Some((capacity, filter));
        SessionSpawnSubscribed(self)
    }
}

impl<A: Agent> IntoFuture for SessionSpawn<A> {
    type Output = Result<SessionHandle<A::Item, A::Event>, SpawnError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(SessionHandle::spawn_inner(
            self.spec,
            self.agent,
            self.store,
            self.parent,
            None,
        ))
    }
}

/// A session being started with a subscriber attached first
/// ([`SessionSpawn::subscribed`]): await it for the handle and the stream.
#[must_use = "a session is started when this is awaited"]
pub struct SessionSpawnSubscribed<A: Agent>(SessionSpawn<A>);

impl<A: Agent> IntoFuture for SessionSpawnSubscribed<A> {
    type Output = Result<(SessionHandle<A::Item, A::Event>, EventStream<A::Event>), SpawnError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        let SessionSpawn {
            spec,
            agent,
            store,
            parent,
        } = self.0;
        let id = spec.id.clone();
        Box::pin(async move {
            let handle = SessionHandle::spawn_inner(spec, agent, store, parent, None).await?;
            match handle.take_events_at_spawn() {
                Some(events) => Ok((handle, events)),
                // Not reached (the spawn registers the subscriber the spec asked
                // for); a session nobody would hold is not left running.
                None => {
                    let why = "the subscriber asked for at spawn was not registered";
                    let _ = handle.stop(StopOptions::immediate().cause(why)).await;
                    Err(SpawnError::Actor {
                        id,
                        reason: why.into(),
                    })
                }
            }
        })
    }
}
