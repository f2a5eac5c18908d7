//! Session events and their delivery to subscribers (DESIGN S20, S21).
//!
//! This module owns the event vocabulary, the subscriber registry and the stream a
//! subscriber reads. Delivery rules:
//!
//! * Each subscriber has its own bounded channel. Turn events (turn started, agent
//!   events, preempted, turn ended) are sent from the turn task and wait for capacity,
//!   so a slow but live subscriber slows the agent down (backpressure) without ever
//!   blocking the TurnLoop actor. A dropped subscriber's sends fail at once: it costs
//!   nothing and is pruned.
//! * `StopRequested` is sent by the actor, which never waits: when a subscriber's buffer
//!   is full it is skipped for that subscriber (the cause is repeated in `Ended`).
//! * `Ended` never needs buffer capacity: teardown writes it into each subscriber's
//!   terminal slot, which the stream reads after its buffer drains. Teardown never
//!   waits on a subscriber, and `Ended` is always the last event; `None` after it is the
//!   authoritative end of the stream.
//!
//! It must not decide anything about turns or stops.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::agent::InterruptInfo;
use crate::cancel::{CancelInfo, CancelMode};
use crate::exit::ExitSummary;

/// The default capacity of a subscriber's event buffer.
pub const DEFAULT_EVENT_CAPACITY: usize = 256;

/// How a turn ended, as reported by [`SessionEvent::TurnEnded`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TurnEnd {
    /// The turn completed its work.
    Completed,
    /// A preemption ended the turn (S8); its items are offered to the next plan.
    Preempted(CancelInfo),
    /// A stop's cancel ended the turn.
    Canceled(CancelInfo),
    /// The agent ended the turn with a business interrupt (S4).
    Interrupted(InterruptInfo),
    /// The agent returned an error or panicked.
    Failed(String),
    /// The plan failed or a stop arrived while planning; the offered items went back to
    /// the buffer in their original order (S6). No `TurnStarted` preceded this.
    PlanAborted(String),
}

/// An event of a session's stream (S20).
#[derive(Clone, Debug, PartialEq)]
pub enum SessionEvent<E> {
    /// A turn's plan is done and the turn runs.
    TurnStarted {
        /// The turn's index.
        turn: u64,
        /// How many items it consumes.
        items: usize,
        /// Whether it resumes a cut turn (S17).
        resumed: bool,
    },
    /// An event emitted by the agent.
    Agent {
        /// The turn that emitted it.
        turn: u64,
        /// The event.
        event: E,
    },
    /// The turn was preempted and ends at a safe point (S8).
    Preempted {
        /// The turn's index.
        turn: u64,
    },
    /// A turn ended.
    TurnEnded {
        /// The turn's index.
        turn: u64,
        /// How it ended.
        outcome: TurnEnd,
    },
    /// A stop request was accepted (best effort when the buffer is full).
    StopRequested {
        /// The cancel mode the stop carried, if any.
        cancel: Option<CancelMode>,
        /// The cause it carried, if any.
        cause: Option<String>,
    },
    /// The session ended. Always the last event.
    Ended(ExitSummary),
}

/// Which events a subscriber receives. `Ended` is always delivered. A subscriber is
/// neither woken nor slowed by events it filters out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventFilter {
    /// `TurnStarted`.
    pub turn_started: bool,
    /// `Agent` events.
    pub agent: bool,
    /// `Preempted`.
    pub preempted: bool,
    /// `TurnEnded`.
    pub turn_ended: bool,
    /// `StopRequested`.
    pub stop_requested: bool,
}

impl Default for EventFilter {
    fn default() -> Self {
        Self::all()
    }
}

impl EventFilter {
    /// Every event.
    pub const fn all() -> Self {
        EventFilter {
            turn_started: true,
            agent: true,
            preempted: true,
            turn_ended: true,
            stop_requested: true,
        }
    }

    /// Only turn ends (and `Ended`): for clients that wait for results.
    pub const fn turn_ends() -> Self {
        EventFilter {
            turn_started: false,
            agent: false,
            preempted: false,
            turn_ended: true,
            stop_requested: false,
        }
    }

    /// Whether `event` passes.
    pub fn accepts<E>(&self, event: &SessionEvent<E>) -> bool {
        match event {
            SessionEvent::TurnStarted { .. } => self.turn_started,
            SessionEvent::Agent { .. } => self.agent,
            SessionEvent::Preempted { .. } => self.preempted,
            SessionEvent::TurnEnded { .. } => self.turn_ended,
            SessionEvent::StopRequested { .. } => self.stop_requested,
            SessionEvent::Ended(_) => true,
        }
    }
}

/// The per-subscriber slot that carries `Ended` without using buffer capacity, and the
/// count of final turn events still being delivered to that subscriber.
#[derive(Default)]
pub(crate) struct TerminalSlot {
    summary: Mutex<Option<ExitSummary>>,
    waker: AtomicWaker,
    /// Final turn events sent after the turn reported its end and not delivered yet.
    /// `Ended` waits for them, so it is always last.
    inflight: AtomicUsize,
}

impl TerminalSlot {
    fn set(&self, summary: ExitSummary) {
        *self.summary.lock() = Some(summary);
        self.waker.wake();
    }

    fn get(&self) -> Option<ExitSummary> {
        self.summary.lock().clone()
    }
}

/// Decrements a subscriber's in-flight count when a final send finishes or is dropped.
struct InflightGuard(Arc<TerminalSlot>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.waker.wake();
        }
    }
}

struct SubscriberTx<E> {
    tx: mpsc::Sender<SessionEvent<E>>,
    slot: Arc<TerminalSlot>,
    filter: EventFilter,
}

impl<E> Clone for SubscriberTx<E> {
    fn clone(&self) -> Self {
        SubscriberTx {
            tx: self.tx.clone(),
            slot: self.slot.clone(),
            filter: self.filter,
        }
    }
}

/// The subscriber registry of one session, shared by the TurnLoop actor (which adds
/// subscribers and ends them) and its turn tasks (which send turn events).
///
/// Invariants:
/// * once [`Subscribers::end`] ran, the registry is empty, so nothing new is queued;
/// * a turn task holds the order gate from its start until its final events are
///   delivered, so turn N+1's events never overtake turn N's.
pub(crate) struct Subscribers<E> {
    // Copy-on-write: senders take a cheap snapshot and never hold the lock across an
    // await.
    list: RwLock<Arc<Vec<SubscriberTx<E>>>>,
    ended: Mutex<Option<ExitSummary>>,
    order: Arc<tokio::sync::Mutex<()>>,
    /// The stream registered before the actor started (subscribe at spawn), until the
    /// spawner takes it. Invariant: the spawner takes it right after the spawn returns
    /// (or drops it, which unsubscribes), so an unread stream never holds turn events
    /// back by backpressure.
    at_spawn: Mutex<Option<EventStream<E>>>,
}

impl<E: Clone + Send + 'static> Subscribers<E> {
    pub(crate) fn new() -> Self {
        Subscribers {
            list: RwLock::new(Arc::new(Vec::new())),
            ended: Mutex::new(None),
            order: Arc::new(tokio::sync::Mutex::new(())),
            at_spawn: Mutex::new(None),
        }
    }

    /// Registers a subscriber before the session's actor starts; the spawner takes it
    /// with [`Subscribers::take_at_spawn`].
    pub(crate) fn reserve_at_spawn(&self, capacity: usize, filter: EventFilter) {
        let stream = self.subscribe(capacity, filter);
        *self.at_spawn.lock() = Some(stream);
    }

    /// The stream registered at spawn, once.
    pub(crate) fn take_at_spawn(&self) -> Option<EventStream<E>> {
        self.at_spawn.lock().take()
    }

    /// Adds a subscriber; after the end it gets a stream that yields `Ended` at once.
    pub(crate) fn subscribe(&self, capacity: usize, filter: EventFilter) -> EventStream<E> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let slot = Arc::new(TerminalSlot::default());
        // Checked under the list lock: `end` sets `ended` before it takes the list, so
        // a subscriber is either in the list `end` takes or sees `ended` here.
        let mut list = self.list.write();
        let ended = self.ended.lock().clone();
        match ended {
            Some(summary) => slot.set(summary),
            None => {
                let mut next: Vec<SubscriberTx<E>> =
                    list.iter().filter(|s| !s.tx.is_closed()).cloned().collect();
                next.push(SubscriberTx {
                    tx,
                    slot: slot.clone(),
                    filter,
                });
                *list = Arc::new(next);
            }
        }
        drop(list);
        EventStream {
            rx,
            slot,
            finished: false,
        }
    }

    fn snapshot(&self) -> Arc<Vec<SubscriberTx<E>>> {
        self.list.read().clone()
    }

    /// Waits for the order gate (turn tasks call this before sending anything).
    pub(crate) async fn order_gate(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.order.clone().lock_owned().await
    }

    /// Sends to every live subscriber, waiting for capacity (backpressure). Called from
    /// turn tasks only, never from the actor.
    pub(crate) async fn send(&self, event: SessionEvent<E>) {
        let subs = self.snapshot();
        for s in subs.iter().filter(|s| s.filter.accepts(&event)) {
            // A closed subscriber fails at once; it is pruned on the next subscribe.
            let _ = s.tx.send(event.clone()).await;
        }
    }

    /// Delivers the final events of a turn. What fits in the subscribers' buffers is
    /// queued at once; for a subscriber whose buffer is full, the rest are registered as
    /// in flight (synchronously, so `Ended` waits for them) and the returned future
    /// delivers them, holding the order gate until done. `None` means everything was
    /// delivered and the gate is released.
    ///
    /// Call before reporting the turn's end to the actor, then await the future (if
    /// any): teardown may run meanwhile and `Ended` still comes after these events.
    pub(crate) fn send_final(
        &self,
        events: Vec<SessionEvent<E>>,
        gate: tokio::sync::OwnedMutexGuard<()>,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let subs = self.snapshot();
        let mut pending: Vec<(SubscriberTx<E>, Vec<SessionEvent<E>>, InflightGuard)> = Vec::new();
        for s in subs.iter() {
            for (i, ev) in events.iter().enumerate() {
                if !s.filter.accepts(ev) {
                    continue;
                }
                match s.tx.try_send(ev.clone()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        s.slot.inflight.fetch_add(1, Ordering::AcqRel);
                        let guard = InflightGuard(s.slot.clone());
                        pending.push((s.clone(), events[i..].to_vec(), guard));
                        break;
                    }
                }
            }
        }
        if pending.is_empty() {
            return None;
        }
        Some(async move {
            let sends = pending.into_iter().map(|(s, evs, guard)| async move {
                deliver(&s, evs).await;
                drop(guard);
            });
            futures::future::join_all(sends).await;
            drop(gate);
        })
    }

    /// Sends without waiting; a full or closed subscriber is skipped. Returns how many
    /// subscribers were skipped because their buffer was full.
    pub(crate) fn try_send(&self, event: SessionEvent<E>) -> usize {
        let mut skipped = 0;
        for s in self.snapshot().iter().filter(|s| s.filter.accepts(&event)) {
            if let Err(mpsc::error::TrySendError::Full(_)) = s.tx.try_send(event.clone()) {
                skipped += 1;
            }
        }
        skipped
    }

    /// Whether anybody listens to events like `probe` (lets senders skip building
    /// events nobody wants).
    pub(crate) fn wants(&self, probe: impl Fn(&EventFilter) -> bool) -> bool {
        self.list.read().iter().any(|s| probe(&s.filter))
    }

    /// Ends every stream: writes `Ended` into each terminal slot and empties the
    /// registry. Never waits. Idempotent.
    pub(crate) fn end(&self, summary: ExitSummary) {
        {
            let mut ended = self.ended.lock();
            if ended.is_some() {
                return;
            }
            *ended = Some(summary.clone());
        }
        let list = std::mem::take(&mut *self.list.write());
        for s in list.iter() {
            s.slot.set(summary.clone());
        }
    }
}

/// Sends a turn's final events to one subscriber, in order, skipping filtered ones.
async fn deliver<E: Clone>(s: &SubscriberTx<E>, events: Vec<SessionEvent<E>>) {
    for ev in events {
        if s.filter.accepts(&ev) && s.tx.send(ev).await.is_err() {
            break;
        }
    }
}

/// A subscriber's view of a session: its events in order, `Ended` last, then `None`.
///
/// Read it with [`EventStream::next`] or as a `futures::Stream`. Dropping it
/// unsubscribes; the session never waits on a dropped stream.
pub struct EventStream<E> {
    rx: mpsc::Receiver<SessionEvent<E>>,
    slot: Arc<TerminalSlot>,
    finished: bool,
}

impl<E> EventStream<E> {
    /// The next event, or `None` once `Ended` was returned.
    pub async fn next(&mut self) -> Option<SessionEvent<E>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<SessionEvent<E>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        // Buffered events always come before `Ended`.
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(ev)) => return Poll::Ready(Some(ev)),
            Poll::Ready(None) | Poll::Pending => {}
        }
        // Register the waker before checking the slot so a concurrent `set` (or the last
        // in-flight final event) is not missed.
        self.slot.waker.register(cx.waker());
        if let Some(summary) = self.slot.get() {
            if self.slot.inflight.load(Ordering::Acquire) > 0 {
                // A turn's final events are still on their way (the subscriber freed
                // capacity; the sender will queue them): `Ended` waits behind them.
                return match self.rx.poll_recv(cx) {
                    Poll::Ready(Some(ev)) => Poll::Ready(Some(ev)),
                    _ => Poll::Pending,
                };
            }
            if let Ok(ev) = self.rx.try_recv() {
                return Poll::Ready(Some(ev));
            }
            self.finished = true;
            return Poll::Ready(Some(SessionEvent::Ended(summary)));
        }
        Poll::Pending
    }
}

impl<E> futures::Stream for EventStream<E> {
    type Item = SessionEvent<E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx)
    }
}

impl<E> std::fmt::Debug for EventStream<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("finished", &self.finished)
            .finish()
    }
}
