//! By-id work wherever a session runs (issue 18, S36; issue 28): pushes, stops,
//! detaches and subscriptions go here when this runtime runs the session, else, on a
//! cluster node, to its owner through the one routing trait,
//! [`Forward`](crate::runtime_handle::forward::Forward), that a node installs; a session that
//! is stored but not live is told apart from an unknown one (`crate::liveness`). It
//! also serves what another node forwards here (`control_here`).

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::events::{EventFilter, EventStream, Sequenced, SessionEvent};
use crate::options::StopOptions;
use crate::push::PushError;
use crate::runtime_handle::control::ControlError;
use crate::runtime_handle::forward::{Control, ControlOutcome, WireStop};
use crate::runtime_handle::RuntimeHandle;
use crate::supervisor::SupervisorError;

impl<I, E> RuntimeHandle<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Pushes to a session by id wherever it runs (issue 18, S36): here when this
    /// runtime runs it, else, on a cluster node, at its owner. Chain
    /// [`PushById::options`](crate::push::PushById::options), then await it. A push with
    /// an S9 strategy does not cross nodes
    /// ([`PushError::NotForwardable`]). A
    /// session that is stored but not live yet (being recovered, resumed or moved)
    /// answers [`PushError::NotLive`] with when to push
    /// again; one stored but not running, `NotRunning` with what to do (issue 28).
    pub fn push<'a>(&'a self, id: &'a str, item: I) -> crate::push::PushById<'a, Self, I> {
        crate::push::PushById::new(self, id, item)
    }

    /// Pushes to a session wherever it runs.
    #[deprecated(
        note = "one way to push (issue 54): `runtime.push(id, item).options(options).await`"
    )]
    pub async fn push_anywhere(
        &self,
        id: &str,
        item: I,
        options: crate::options::PushOptions<I>,
    ) -> Result<crate::push::PreemptAck, crate::push::PushError<I>> {
        self.push_anywhere_now(id, item, options).await
    }

    async fn push_anywhere_now(
        &self,
        id: &str,
        item: I,
        options: crate::options::PushOptions<I>,
    ) -> Result<crate::push::PreemptAck, crate::push::PushError<I>> {
        match self.push_routed(id, item, options).await {
            Err(PushError::UnknownSession { id, item }) => match self.absence(&id).await {
                Some(absence) => Err(stored(id, item, absence)),
                None => Err(PushError::UnknownSession { id, item }),
            },
            other => other,
        }
    }

    async fn push_routed(
        &self,
        id: &str,
        item: I,
        options: crate::options::PushOptions<I>,
    ) -> Result<crate::push::PreemptAck, crate::push::PushError<I>> {
        let Some(forwarder) = self.forwarder.get() else {
            return self.supervisor.push_here(id, item, options).await;
        };
        let strategy = options.strategy.is_some();
        let forwarded = crate::runtime_handle::forward::Forwarded::of(&options);
        // A session this node moved (or is moving): in line behind the move, then
        // wherever it runs now (here again, or its new owner).
        let gate = self.moving.gate(id);
        let _in_line = match &gate {
            Some(g) => Some(g.lock().await),
            None => None,
        };
        let late = |item| Err(PushError::Late { item });
        match self.supervisor.push_here(id, item, options).await {
            Err(PushError::UnknownSession { id, item }) => {
                match forwarder.push(id, item, forwarded, !strategy).await {
                    // Held by a `migrate` shutdown for a session that stayed here:
                    // late (send it elsewhere), not unknown.
                    Err(PushError::UnknownSession { item, .. })
                        if gate.is_some() && self.shutdown.is_started().await =>
                    {
                        late(item)
                    }
                    other => other,
                }
            }
            // Late because the session is moving (a move, or a `migrate` shutdown whose
            // drain gate refuses it here): in line behind the move, then to the node
            // that runs it now; late when it still runs nowhere else.
            Err(PushError::Late { item }) => {
                let behind = match &gate {
                    Some(_) => None,
                    None => match self.moving.gate(id) {
                        Some(g) => Some(g.lock_owned().await),
                        None => return late(item),
                    },
                };
                let forwarded = forwarder
                    .push(id.to_string(), item, forwarded, !strategy)
                    .await;
                drop(behind);
                match forwarded {
                    Err(PushError::UnknownSession { item, .. }) => late(item),
                    other => other,
                }
            }
            other => other,
        }
    }

    /// Why session `id`, which no live session here (or on a node this one forwards
    /// to) has, is not live, when a record is stored under it (issue 28): not live yet
    /// (retry) or not running (what to do). `None` when nothing is stored (or the store
    /// cannot be read: the caller's "unknown" stands).
    pub async fn absence(&self, id: &str) -> Option<crate::liveness::Absence> {
        let store = self.store.as_ref()?;
        let header = match store.load_stored(id).await {
            Ok(Some(crate::store::Stored::Current(r))) => r.header,
            Ok(Some(other)) => other.decode::<I>().ok()?.header,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(session = id, error = %e, "cannot read a record to say why its session is not live");
                return None;
            }
        };
        let (beat, orphaned) = match header.owner.as_deref() {
            Some(owner) if owner != self.instance => {
                let beat = store.heartbeat(owner).await.ok().flatten();
                let seen = crate::store::lease::last_seen(&header, beat.unwrap_or(0));
                (beat, store.orphaned(owner, seen))
            }
            _ => (None, false),
        };
        Some(crate::liveness::judge(
            &header,
            beat,
            orphaned,
            crate::liveness::Looker {
                me: &self.instance,
                now_ms: crate::store::now_ms(),
                lease_timeout: self.lease_timeout,
                heartbeat: self.heartbeat,
                sweeps: self.sweeps,
                node: self.node,
                forwards: self.forwarder.get().is_some(),
            },
        ))
    }

    /// Tells an unknown session that is stored after all as what it is (issue 28).
    pub(crate) async fn unknown_or_stored<T>(
        &self,
        r: Result<T, ControlError>,
    ) -> Result<T, ControlError> {
        match r {
            Err(ControlError::Here(SupervisorError::UnknownSession(id))) => {
                match self.absence(&id).await {
                    Some(absence) => Err(ControlError::stored(id, absence)),
                    None => Err(SupervisorError::UnknownSession(id).into()),
                }
            }
            other => other,
        }
    }

    /// Stops session `id` wherever it runs (here, or on a cluster node at its owner).
    /// A session that is stored but not live yet is [`ControlError::NotLive`] (retry),
    /// one stored but not running [`ControlError::NotRunning`].
    pub async fn stop_anywhere(&self, id: &str, options: StopOptions) -> Result<(), ControlError> {
        let r = self.stop_routed(id, options).await;
        self.unknown_or_stored(r).await
    }

    async fn stop_routed(&self, id: &str, options: StopOptions) -> Result<(), ControlError> {
        let wire = WireStop::from_options(&options);
        match self.supervisor.stop(id, options).await {
            Err(SupervisorError::UnknownSession(_)) if self.forwarder.get().is_some() => {
                let Some(wire) = wire else {
                    return Err(ControlError::NotForwardable(id.to_string()));
                };
                self.remote(id, Control::Stop(wire)).await
            }
            other => other.map_err(ControlError::from),
        }
    }

    /// Detaches session `id` wherever it runs (S23); not live or not running as for
    /// [`RuntimeHandle::stop_anywhere`].
    pub async fn detach_anywhere(&self, id: &str) -> Result<(), ControlError> {
        let r = self.detach_routed(id).await;
        self.unknown_or_stored(r).await
    }

    async fn detach_routed(&self, id: &str) -> Result<(), ControlError> {
        match self.supervisor.detach(id).await {
            Err(SupervisorError::UnknownSession(_)) if self.forwarder.get().is_some() => {
                self.remote(id, Control::Detach).await
            }
            other => other.map_err(ControlError::from),
        }
    }

    async fn remote(&self, id: &str, op: Control) -> Result<(), ControlError> {
        let Some(forwarder) = self.forwarder.get() else {
            return Err(SupervisorError::UnknownSession(id.to_string()).into());
        };
        match forwarder.control(id.to_string(), op).await {
            ControlOutcome::Done => Ok(()),
            ControlOutcome::UnknownSession => {
                Err(SupervisorError::UnknownSession(id.to_string()).into())
            }
            ControlOutcome::Unreachable { node, error } => Err(ControlError::Unreachable {
                session: id.to_string(),
                node,
                error,
            }),
            ControlOutcome::Refused(error) => Err(ControlError::Refused {
                session: id.to_string(),
                error,
            }),
        }
    }

    /// Runs a control request another node sent for a session this node runs (never
    /// forwarded on).
    pub async fn control_here(&self, id: &str, op: Control) -> ControlOutcome {
        let r = match op {
            Control::Stop(w) => self.supervisor.stop(id, w.to_options()).await,
            Control::Detach => self.supervisor.detach(id).await,
        };
        match r {
            Ok(()) => ControlOutcome::Done,
            Err(SupervisorError::UnknownSession(_)) => ControlOutcome::UnknownSession,
            Err(e) => ControlOutcome::Refused(e.to_string()),
        }
    }

    /// Lets this runtime's sessions keep their events in the store as JSON (S20a; what
    /// [`crate::runtime::RuntimeBuilder::keep_events`] does, for a runtime already built: the
    /// HTTP front calls it). Sessions started before keep the codec they had.
    pub fn keep_events_as_json(&self)
    where
        E: Serialize + DeserializeOwned,
    {
        self.supervisor
            .set_event_codec(std::sync::Arc::new(crate::events::EventCodec::<E>::json()));
    }

    /// Subscribes to session `id`'s events wherever it runs (issue 18, S36): here when
    /// this runtime runs it, else, on a cluster node, relayed from its owner (after
    /// event `after` when given, like [`crate::supervisor::SupervisorHandle::subscribe_after`]).
    /// A relayed stream ends without `Ended` when its owner is lost: resubscribe
    /// after the last number seen. A session that is stored but not live yet is
    /// [`ControlError::NotLive`] (resubscribe after its `retry_after`), one stored but
    /// not running [`ControlError::NotRunning`].
    pub async fn subscribe_anywhere(
        &self,
        id: &str,
        after: Option<u64>,
        filter: EventFilter,
    ) -> Result<EventStream<E>, ControlError> {
        let r = self.subscribe_routed(id, after, filter).await;
        let r = self.unknown_or_stored(r).await;
        match r {
            Err(ControlError::Here(SupervisorError::UnknownSession(_)))
            | Err(ControlError::NotRunning { .. }) => {
                match self.kept_stream(id, after.unwrap_or(0), filter).await {
                    Some(stream) => Ok(stream),
                    None => r,
                }
            }
            r => r,
        }
    }

    /// A session that ended for good, answered from its kept events (S20a): those
    /// after `after` and its `Ended` (again, when `after` is `Ended`'s number), for as
    /// long as they are kept. `None` when it kept none, or its last kept event is not
    /// `Ended`.
    async fn kept_stream(
        &self,
        id: &str,
        after: u64,
        filter: EventFilter,
    ) -> Option<EventStream<E>> {
        let store = self.store.as_ref()?;
        let codec = self.supervisor.event_codec()?;
        // The last kept event alone (its number first, then its page), never all of
        // them at once (issue 52): the rest is read a page at a time as it is sent.
        let read_last = async {
            let last = store.read_events(id, u64::MAX, 0).await?.last;
            store.read_events(id, last.saturating_sub(1), 1).await
        };
        let kept = match read_last.await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "the kept events could not be read");
                return None;
            }
        };
        let end = kept.events.last()?;
        let ended = match codec.decode(&end.body) {
            Ok(e @ SessionEvent::Ended(_)) => Sequenced {
                seq: end.seq,
                event: e,
            },
            _ => return None,
        };
        if after >= ended.seq {
            return Some(EventStream::of(vec![ended]));
        }
        let upto = ended.seq;
        let (store, session) = (store.clone(), id.to_string());
        let read: crate::events::keeper::ReadFn =
            Box::new(move |after, max| store.read_events(&session, after, max));
        let src = crate::events::keeper::ReplaySource {
            read: std::sync::Arc::new(read),
            codec,
            filter,
            final_ended: true,
            page_bytes: crate::events::keeper::REPLAY_PAGE,
        };
        Some(EventStream::from_store(
            crate::events::keeper::replay_pages(src, Vec::new(), after, upto),
        ))
    }

    async fn subscribe_routed(
        &self,
        id: &str,
        after: Option<u64>,
        filter: EventFilter,
    ) -> Result<EventStream<E>, ControlError> {
        let here = match after {
            Some(after) => self.supervisor.subscribe_after(id, after, filter).await,
            None => self.supervisor.subscribe(id, filter).await,
        };
        let forwarder = match (here, self.forwarder.get()) {
            (Err(SupervisorError::UnknownSession(_)), Some(f)) => f,
            (other, _) => return other.map_err(ControlError::from),
        };
        forwarder
            .subscribe(id.to_string(), after, filter)
            .await
            .map_err(|outcome| match outcome {
                ControlOutcome::Done | ControlOutcome::UnknownSession => {
                    SupervisorError::UnknownSession(id.to_string()).into()
                }
                ControlOutcome::Unreachable { node, error } => ControlError::Unreachable {
                    session: id.to_string(),
                    node,
                    error,
                },
                ControlOutcome::Refused(error) => ControlError::Refused {
                    session: id.to_string(),
                    error,
                },
            })
    }
}

impl<I, E> crate::push::sealed::Sealed for RuntimeHandle<I, E> {}

impl<I, E> crate::push::PushTarget<I> for RuntimeHandle<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    fn push_by_id<'a>(
        &'a self,
        id: &'a str,
        item: I,
        options: crate::options::PushOptions<I>,
    ) -> futures::future::BoxFuture<'a, Result<crate::push::PreemptAck, crate::push::PushError<I>>>
    {
        Box::pin(self.push_anywhere_now(id, item, options))
    }
}

/// An `UnknownSession` for a session that is stored after all, told as what it is.
fn stored<I>(id: String, item: I, absence: crate::liveness::Absence) -> PushError<I> {
    match absence {
        crate::liveness::Absence::NotLive { retry_after, why } => PushError::NotLive {
            id,
            item,
            retry_after,
            why,
        },
        crate::liveness::Absence::NotRunning { status, hint } => PushError::NotRunning {
            id,
            item,
            status,
            hint,
        },
    }
}
