//! A session being started under a supervisor ([`SupervisorHandle::spawn`]): the one
//! way to start a session by spec (issue 54). Await it for the session's handle, or
//! chain [`Spawn::subscribed`] for a stream attached before the session starts too. It
//! holds the request until it is awaited; the supervisor decides everything.

use std::future::IntoFuture;

use futures::future::BoxFuture;

use super::error::SupervisorError;
use super::handle::SupervisorHandle;
use super::messages::SubscribedSpawn;
use crate::events::{EventFilter, EventStream};
use crate::session::{SessionHandle, SessionSpec};

impl<I, E> SupervisorHandle<I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Starts a session under this supervisor (S25): the one way to start a session by
    /// spec. Await it for the session's handle; chain [`Spawn::subscribed`] for a
    /// stream attached before the session starts as well. Many specs at once, with few
    /// requests: [`SupervisorHandle::spawn_batch`].
    ///
    /// ```no_run
    /// # async fn f(sup: agentloop::SupervisorHandle<String, ()>) -> Result<(), agentloop::SupervisorError> {
    /// use agentloop::{EventFilter, SessionSpec};
    /// let session = sup.spawn(SessionSpec::new("chat-1", "echo")).await?;
    /// let (other, events) = sup
    ///     .spawn(SessionSpec::new("chat-2", "echo"))
    ///     .subscribed(64, EventFilter::all())
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn spawn(&self, spec: SessionSpec<I>) -> Spawn<'_, I, E> {
        Spawn {
            supervisor: self,
            spec,
        }
    }

    /// Spawns a session with a subscriber attached before its actor starts.
    #[deprecated(
        note = "one way to start a session (issue 54): `supervisor.spawn(spec).subscribed(capacity, filter).await`"
    )]
    pub async fn spawn_subscribed(
        &self,
        spec: SessionSpec<I>,
        capacity: usize,
        filter: EventFilter,
    ) -> Result<(SessionHandle<I, E>, EventStream<E>), SupervisorError> {
        self.spawn_subscribed_now(spec, capacity, filter).await
    }
}

/// A session being started under a supervisor: await it for its handle, or chain
/// [`Spawn::subscribed`]. Nothing is sent before it is awaited.
#[must_use = "a session is started when this is awaited"]
pub struct Spawn<'s, I, E> {
    supervisor: &'s SupervisorHandle<I, E>,
    spec: SessionSpec<I>,
}

impl<'s, I, E> Spawn<'s, I, E> {
    /// Attaches a subscriber before the session's actor starts: the stream sees every
    /// event of this incarnation from the first, also when the first turn (a resume,
    /// S17) starts before the answer comes. A restarted incarnation is a new session to
    /// subscribe to; this stream ends with the first one's `Ended`. `capacity` bounds
    /// the stream's buffer (backpressure, S20).
    pub fn subscribed(self, capacity: usize, filter: EventFilter) -> SpawnSubscribed<'s, I, E> {
        SpawnSubscribed {
            supervisor: self.supervisor,
            spec: self.spec,
            capacity,
            filter,
        }
    }
}

impl<'s, I, E> IntoFuture for Spawn<'s, I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    type Output = Result<SessionHandle<I, E>, SupervisorError>;
    type IntoFuture = BoxFuture<'s, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.supervisor.spawn_now(self.spec))
    }
}

/// A session being started with a subscriber attached first ([`Spawn::subscribed`]):
/// await it for the handle and the stream.
#[must_use = "a session is started when this is awaited"]
pub struct SpawnSubscribed<'s, I, E> {
    supervisor: &'s SupervisorHandle<I, E>,
    spec: SessionSpec<I>,
    capacity: usize,
    filter: EventFilter,
}

impl<'s, I, E> IntoFuture for SpawnSubscribed<'s, I, E>
where
    I: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    type Output = SubscribedSpawn<I, E>;
    type IntoFuture = BoxFuture<'s, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(
            self.supervisor
                .spawn_subscribed_now(self.spec, self.capacity, self.filter),
        )
    }
}
