//! Session events and their delivery to subscribers (DESIGN S20, S21).
//!
//! This module owns the event vocabulary, the subscriber registry and the stream a
//! subscriber reads. Delivery rules:
//!
//! * Each subscriber has its own bounded channel, and a subscriber never slows the
//!   session by default (S20): when its channel is full it *lags*: nothing more is
//!   queued to it, and when it has read what its channel holds it catches up from the
//!   replay buffer (the events since the first it missed, under the same lock that
//!   numbers events, so nothing is repeated or reordered), preceded by
//!   [`SessionEvent::Lagged`] for what the buffer no longer holds. A subscriber that
//!   asked for backpressure ([`EventFilter::with_backpressure`], in-process only) is
//!   different: turn events (turn started, agent events, preempted, turn ended) are
//!   sent from the turn task and wait for its capacity, so it slows the agent down,
//!   without ever blocking the TurnLoop actor. A dropped subscriber's sends fail at
//!   once: it costs nothing and is pruned.
//! * `StopRequested` is sent by the actor, which never waits: when a subscriber's buffer
//!   is full it is skipped for that subscriber (the cause is repeated in `Ended`).
//! * `Ended` never needs buffer capacity: teardown writes it into each subscriber's
//!   terminal slot, which the stream reads after its buffer drains. Teardown never
//!   waits on a subscriber, and `Ended` is always the last event; `None` after it is the
//!   authoritative end of the stream.
//! * Every event the session emits gets the next number of the session's sequence
//!   ([`Sequenced::seq`]), whether or not anybody listens, so the numbers are a
//!   property of the session's history, not of its audience. Numbers are given and
//!   events queued under one lock, so each stream sees them strictly increasing; a
//!   stream skips the numbers of events its filter drops (and of a `StopRequested`
//!   skipped for a full buffer). The sequence continues across restarts and resumes:
//!   the record keeps the last number written (S26).
//! * A session with a replay buffer (`SessionConfig::replay_capacity`) keeps its last
//!   events, so a subscriber can start after a number it saw
//!   (`Subscribers::subscribe_after`) and get exactly what it missed, or a
//!   [`SessionEvent::Lagged`] marker when the buffer no longer holds it. The buffer
//!   allocates at its first event: an idle session pays nothing for it (B2).
//!
//! It must not decide anything about turns or stops.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::cancel::{CancelInfo, CancelMode};
use crate::exit::ExitSummary;
use crate::interrupt::InterruptInfo;

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

/// An event of a session's stream (S20). It crosses nodes as JSON when a node relays
/// another node's stream (issue 18).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
        /// Whether the record holds this turn's end: under `Durability::Turn` and
        /// `Sync` the event is sent only after the write holding it is flushed, and
        /// says whether it succeeded; without a store and under `Exit` it is false.
        durable: bool,
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
    /// A stream that asked to start after a sequence number the replay buffer no longer
    /// holds: `missed` events are gone. Only ever the first event of such a stream; its
    /// number is the last one missed, so a client that records numbers resumes after
    /// it.
    Lagged {
        /// How many events the stream cannot replay.
        missed: u64,
    },
}

/// An event with its place in the session's sequence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sequenced<E> {
    /// The event's number: strictly increasing in every stream, and across the
    /// session's restarts and resumes (S20, S26).
    pub seq: u64,
    /// The event.
    pub event: SessionEvent<E>,
}

/// The numbers a session gave and still owes, shared by its subscriber registry and the
/// session core (which records [`EventSeq::mark`] in every write).
///
/// A turn whose `TurnEnded` waits for its write has already reported its end, so the
/// session may exit (and write its final record) before that event is numbered; the
/// turn *owes* those numbers meanwhile ([`EventSeq::owe`]). The record keeps the last
/// number given plus the owed ones, so the next incarnation never reuses a number the
/// owed events take, and `Ended` is numbered after them (issue 28).
///
/// Packed in one atomic (the last number given in the high 48 bits, the numbers owed in
/// the low 16) so that giving an owed number and settling its debt is one step: a
/// writer never reads the mark between the two.
#[derive(Debug, Default)]
pub(crate) struct EventSeq {
    state: AtomicU64,
}

/// Bits of [`EventSeq`]'s state that count owed numbers.
const OWED_BITS: u32 = 16;
/// The owed count's mask.
const OWED_MASK: u64 = (1 << OWED_BITS) - 1;
/// One given number in [`EventSeq`]'s state.
const GIVEN: u64 = 1 << OWED_BITS;

impl EventSeq {
    /// The last number given (0 before the first event).
    pub(crate) fn last(&self) -> u64 {
        self.state.load(Ordering::Acquire) >> OWED_BITS
    }

    /// The last number given or owed: what a record keeps, so a later incarnation
    /// starts after every number this one gives before its `Ended`.
    pub(crate) fn mark(&self) -> u64 {
        let s = self.state.load(Ordering::Acquire);
        (s >> OWED_BITS) + (s & OWED_MASK)
    }

    /// Continues a sequence a record left off: the next event gets `last + 2` (one
    /// number is left for the previous incarnation's `Ended`, which followed its last
    /// write). Called before the session emits anything; never moves backwards.
    pub(crate) fn continue_after(&self, last: u64) {
        self.state
            .fetch_max(last.saturating_add(1) << OWED_BITS, Ordering::AcqRel);
    }

    fn next(&self) -> u64 {
        (self.state.fetch_add(GIVEN, Ordering::AcqRel) >> OWED_BITS) + 1
    }

    /// Promises `n` numbers to events not numbered yet (a turn's final events).
    fn owe(&self, n: u64) {
        self.state.fetch_add(n.min(OWED_MASK), Ordering::AcqRel);
    }

    /// Gives the next number to an owed event, settling one owed number.
    fn pay(&self) -> u64 {
        (self.state.fetch_add(GIVEN - 1, Ordering::AcqRel) >> OWED_BITS) + 1
    }

    /// Gives up `n` owed numbers whose events were never sent (the turn task was
    /// dropped): they are skipped, as for events nobody receives, so `Ended` still
    /// follows the mark a record kept.
    fn forgive(&self, n: u64) {
        self.state.fetch_add(n * (GIVEN - 1), Ordering::AcqRel);
    }
}

/// Which events a subscriber receives, and whether it may slow the session. `Ended`
/// is always delivered. A subscriber is neither woken nor slowed by events it filters
/// out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventFilter {
    /// Backpressure instead of lag (S20): when this subscriber's buffer is full, the
    /// session's turn waits for it to read. Off by default: a subscriber that falls
    /// behind gets [`SessionEvent::Lagged`] and catches up from the replay buffer, and
    /// the session never waits for it. Only for in-process readers that must see every
    /// event of a session without a replay buffer; a stream relayed to another node
    /// never applies backpressure.
    #[serde(default)]
    pub backpressure: bool,
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
            backpressure: false,
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
            backpressure: false,
            turn_started: false,
            agent: false,
            preempted: false,
            turn_ended: true,
            stop_requested: false,
        }
    }

    /// The same filter, with backpressure: the session waits for this subscriber when
    /// its buffer is full instead of letting it lag (see [`EventFilter::backpressure`]).
    pub const fn with_backpressure(mut self) -> Self {
        self.backpressure = true;
        self
    }

    /// Whether `event` passes.
    pub fn accepts<E>(&self, event: &SessionEvent<E>) -> bool {
        match event {
            SessionEvent::TurnStarted { .. } => self.turn_started,
            SessionEvent::Agent { .. } => self.agent,
            SessionEvent::Preempted { .. } => self.preempted,
            SessionEvent::TurnEnded { .. } => self.turn_ended,
            SessionEvent::StopRequested { .. } => self.stop_requested,
            SessionEvent::Ended(_) | SessionEvent::Lagged { .. } => true,
        }
    }
}

/// The per-subscriber slot that carries `Ended` without using buffer capacity, and the
/// count of final turn events still being delivered to that subscriber.
#[derive(Default)]
pub(crate) struct TerminalSlot {
    /// `Ended`'s number and summary.
    summary: Mutex<Option<(u64, ExitSummary)>>,
    waker: AtomicWaker,
    /// Final turn events sent after the turn reported its end and not delivered yet.
    /// `Ended` waits for them, so it is always last (backpressure subscribers only).
    inflight: AtomicUsize,
    /// The number of the first event a lagging subscriber missed (0: not lagging).
    /// Set and cleared under the publish lock; while set, nothing is queued to it.
    lag_from: AtomicU64,
}

impl TerminalSlot {
    fn set(&self, ended: (u64, ExitSummary)) {
        *self.summary.lock() = Some(ended);
        self.waker.wake();
    }

    fn get(&self) -> Option<(u64, ExitSummary)> {
        self.summary.lock().clone()
    }
}

/// Decrements a subscriber's in-flight count when a final send finishes or is dropped.
struct InflightGuard(Arc<TerminalSlot>);

impl InflightGuard {
    /// Counts one more event in flight to the subscriber of `slot`.
    fn new(slot: &Arc<TerminalSlot>) -> Self {
        slot.inflight.fetch_add(1, Ordering::AcqRel);
        InflightGuard(slot.clone())
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.waker.wake();
        }
    }
}

struct SubscriberTx<E> {
    tx: mpsc::Sender<Sequenced<E>>,
    slot: Arc<TerminalSlot>,
    filter: EventFilter,
}

impl<E> SubscriberTx<E> {
    /// Whether this subscriber lags instead of slowing the session.
    fn lags(&self) -> bool {
        !self.filter.backpressure
    }
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
///   delivered, so turn N+1's events never overtake turn N's;
/// * a number is given and its event queued (or registered in flight) under the
///   `publish` lock, and nothing is queued to a subscriber with events in flight, so
///   every stream's numbers increase.
pub(crate) struct Subscribers<E> {
    // Copy-on-write: senders take a cheap snapshot and never hold the lock across an
    // await.
    list: RwLock<Arc<Vec<SubscriberTx<E>>>>,
    ended: Mutex<EndState>,
    seq: Arc<EventSeq>,
    /// Held while a number is given and its event queued; guards the replay buffer.
    /// Shared with the lagging streams, which catch up from it.
    publish: Arc<Mutex<Replay<E>>>,
    order: Arc<tokio::sync::Mutex<()>>,
    /// The stream registered before the actor started (subscribe at spawn), until the
    /// spawner takes it. Invariant: the spawner takes it right after the spawn returns
    /// (or drops it, which unsubscribes), so an unread stream never holds turn events
    /// back by backpressure.
    at_spawn: Mutex<Option<EventStream<E>>>,
}

/// `Ended` once given, and the turn tasks that hold it back.
#[derive(Default)]
struct EndState {
    /// `Ended`, numbered: the streams have it (or get it when they subscribe).
    ended: Option<(u64, ExitSummary)>,
    /// `Ended` asked for while turn tasks hold it back: numbered and sent when the
    /// last hold goes, so it is numbered after their events (issue 28).
    pending: Option<ExitSummary>,
    /// Turn tasks between reporting their end and queuing `TurnEnded` (which waits
    /// for its write): `Ended` reaches the streams only when none is left.
    holds: usize,
}

/// Holds `Ended` back until dropped (see [`Subscribers::hold_end`]), and owes the
/// numbers of the final events its turn task will send.
pub(crate) struct EndHold<E: Clone + Send + 'static> {
    subscribers: Arc<Subscribers<E>>,
    /// Final events promised and not numbered yet.
    owed: u64,
}

impl<E: Clone + Send + 'static> Drop for EndHold<E> {
    fn drop(&mut self) {
        let subs = &self.subscribers;
        if self.owed > 0 {
            subs.seq.forgive(self.owed);
        }
        let _publish = subs.publish.lock();
        let ended = {
            let mut st = subs.ended.lock();
            st.holds -= 1;
            match (st.holds, st.pending.take()) {
                (0, Some(summary)) => {
                    let e = (subs.seq.next(), summary);
                    st.ended = Some(e.clone());
                    Some(e)
                }
                (_, pending) => {
                    st.pending = pending;
                    None
                }
            }
        };
        if let Some(ended) = ended {
            subs.close_streams(ended);
        }
    }
}

/// The last events of a session, for subscribers that start after a number.
struct Replay<E> {
    capacity: usize,
    /// Oldest first; allocated by the first event kept.
    events: VecDeque<Sequenced<E>>,
}

impl<E: Clone> Replay<E> {
    /// The events after number `after` up to `last` (the last number given) that the
    /// buffer holds and `filter` accepts, oldest first, preceded by
    /// [`SessionEvent::Lagged`] when some of them are no longer held.
    fn since(&self, after: u64, last: u64, filter: &EventFilter) -> Vec<Sequenced<E>> {
        let mut out = Vec::new();
        let first_held = self.events.front().map_or(last + 1, |e| e.seq);
        if after + 1 < first_held && after < last {
            let missed = first_held.min(last + 1) - 1 - after;
            out.push(Sequenced {
                seq: first_held.min(last + 1) - 1,
                event: SessionEvent::Lagged { missed },
            });
        }
        out.extend(
            self.events
                .iter()
                .filter(|e| e.seq > after && e.seq <= last && filter.accepts(&e.event))
                .cloned(),
        );
        out
    }

    fn keep(&mut self, seq: u64, event: &SessionEvent<E>) {
        if self.capacity == 0 {
            return;
        }
        if self.events.len() == self.capacity {
            self.events.pop_front();
        }
        self.events.push_back(Sequenced {
            seq,
            event: event.clone(),
        });
    }
}

impl<E: Clone + Send + 'static> Subscribers<E> {
    /// A registry numbering events with `seq`, keeping the last `replay_capacity`
    /// events for late subscribers (0: none).
    pub(crate) fn new(seq: Arc<EventSeq>, replay_capacity: usize) -> Self {
        Subscribers {
            list: RwLock::new(Arc::new(Vec::new())),
            ended: Mutex::new(EndState::default()),
            seq,
            publish: Arc::new(Mutex::new(Replay {
                capacity: replay_capacity,
                events: VecDeque::new(),
            })),
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
        self.subscribe_inner(capacity, filter, None)
    }

    /// Adds a subscriber that starts after event `after` (a number it saw): the events
    /// since then that the replay buffer holds are queued first, in order, preceded by
    /// [`SessionEvent::Lagged`] when some are no longer held.
    pub(crate) fn subscribe_after(
        &self,
        after: u64,
        capacity: usize,
        filter: EventFilter,
    ) -> EventStream<E> {
        self.subscribe_inner(capacity, filter, Some(after))
    }

    fn subscribe_inner(
        &self,
        capacity: usize,
        filter: EventFilter,
        after: Option<u64>,
    ) -> EventStream<E> {
        // Under the publish lock: no event is numbered between the replay taken here
        // and the registration, so the stream misses nothing and repeats nothing.
        let replay = self.publish.lock();
        let backlog: Vec<Sequenced<E>> = match after {
            None => Vec::new(),
            // Numbers up to `last` were given; `Ended`'s is given by `end`.
            Some(after) => replay.since(after, self.seq.last(), &filter),
        };
        let (tx, rx) = mpsc::channel(capacity.max(1) + backlog.len());
        for ev in backlog {
            // The channel was sized to hold the backlog.
            let _ = tx.try_send(ev);
        }
        let slot = Arc::new(TerminalSlot::default());
        // Checked under the list lock: `end` sets `ended` before it takes the list, so
        // a subscriber is either in the list `end` takes or sees `ended` here.
        let mut list = self.list.write();
        let ended = self.ended.lock().ended.clone();
        match ended {
            Some(ended) => slot.set(ended),
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
        drop(replay);
        let catch_up = match filter.backpressure {
            true => None,
            false => Some(self.catch_up(filter)),
        };
        EventStream {
            rx,
            slot: Some(slot),
            finished: false,
            catch_up,
            pending: VecDeque::new(),
        }
    }

    /// How a lagging stream with `filter` catches up: under the publish lock, it takes
    /// what it missed from the replay buffer (with `Lagged` for what is gone) and stops
    /// lagging, so the next event is queued to it again, after these.
    fn catch_up(&self, filter: EventFilter) -> CatchUp<E> {
        let replay = self.publish.clone();
        let seq = self.seq.clone();
        Box::new(move |slot: &TerminalSlot| {
            let replay = replay.lock();
            let from = slot.lag_from.swap(0, Ordering::AcqRel);
            if from == 0 {
                return Vec::new();
            }
            // `Ended` reaches the slots under this lock, with its number: what was
            // missed ends before it.
            let last = match slot.get() {
                Some((ended, _)) => ended - 1,
                None => seq.last(),
            };
            replay.since(from - 1, last, &filter)
        })
    }

    /// Whether late subscribers can replay events (every event is then built, even
    /// when nobody listens now).
    pub(crate) fn replays(&self) -> bool {
        self.publish.lock().capacity > 0
    }

    /// Gives an event nobody receives its number (the sequence does not depend on who
    /// listens).
    pub(crate) fn skip(&self) {
        self.seq.next();
    }

    fn snapshot(&self) -> Arc<Vec<SubscriberTx<E>>> {
        self.list.read().clone()
    }

    /// Waits for the order gate (turn tasks call this before sending anything).
    pub(crate) async fn order_gate(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.order.clone().lock_owned().await
    }

    /// Numbers `event`, keeps it for replay and queues it to every accepting
    /// subscriber with room; returns the subscribers that were full (their copy is
    /// registered in flight, so `Ended` and later events wait for it).
    /// `owed`: the event's number was promised by an [`EndHold`], which it settles.
    fn publish(
        &self,
        event: &SessionEvent<E>,
        owed: bool,
    ) -> (u64, Vec<(SubscriberTx<E>, InflightGuard)>) {
        let mut replay = self.publish.lock();
        // Taken under the lock: a subscriber registered meanwhile is in it or got this
        // event from the replay buffer.
        let subs = self.snapshot();
        let seq = match owed {
            true => self.seq.pay(),
            false => self.seq.next(),
        };
        replay.keep(seq, event);
        let mut full = Vec::new();
        for s in subs.iter().filter(|s| s.filter.accepts(event)) {
            if s.lags() {
                // A lagging subscriber gets this event when it catches up (the replay
                // buffer holds it, or its `Lagged` counts it).
                if s.slot.lag_from.load(Ordering::Acquire) != 0 {
                    continue;
                }
                let item = Sequenced {
                    seq,
                    event: event.clone(),
                };
                if let Err(mpsc::error::TrySendError::Full(_)) = s.tx.try_send(item) {
                    s.slot.lag_from.store(seq, Ordering::Release);
                }
                continue;
            }
            if s.slot.inflight.load(Ordering::Acquire) > 0 {
                full.push((s.clone(), InflightGuard::new(&s.slot)));
                continue;
            }
            let item = Sequenced {
                seq,
                event: event.clone(),
            };
            if let Err(mpsc::error::TrySendError::Full(_)) = s.tx.try_send(item) {
                full.push((s.clone(), InflightGuard::new(&s.slot)));
            }
        }
        (seq, full)
    }

    /// Sends to every live subscriber, waiting for capacity (backpressure). Called from
    /// turn tasks only (holding the order gate), never from the actor.
    pub(crate) async fn send(&self, event: SessionEvent<E>) {
        let (seq, full) = self.publish(&event, false);
        for (s, guard) in full {
            // A closed subscriber fails at once; it is pruned on the next subscribe.
            let _ =
                s.tx.send(Sequenced {
                    seq,
                    event: event.clone(),
                })
                .await;
            drop(guard);
        }
    }

    /// Delivers the final events of a turn. What fits in the subscribers' buffers is
    /// queued at once; for a subscriber whose buffer is full, the rest are registered as
    /// in flight (synchronously, so `Ended` waits for them) and the returned future
    /// delivers them, holding the order gate until done. `None` means everything was
    /// delivered and the gate is released.
    ///
    /// Call before reporting the turn's end to the actor, or with the [`EndHold`] taken
    /// before reporting it (whose owed numbers the events take), then await the future
    /// (if any): teardown may run meanwhile and `Ended` still comes after these events.
    pub(crate) fn send_final(
        &self,
        events: Vec<SessionEvent<E>>,
        gate: tokio::sync::OwnedMutexGuard<()>,
        mut hold: Option<&mut EndHold<E>>,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        // Per full subscriber: its guard and the numbered events still owed to it.
        let mut pending: Vec<(SubscriberTx<E>, Vec<Sequenced<E>>, InflightGuard)> = Vec::new();
        for event in events {
            let owed = match hold.as_deref_mut() {
                Some(h) if h.owed > 0 => {
                    h.owed -= 1;
                    true
                }
                _ => false,
            };
            let (seq, full) = self.publish(&event, owed);
            for (s, guard) in full {
                let item = Sequenced {
                    seq,
                    event: event.clone(),
                };
                match pending.iter_mut().find(|p| Arc::ptr_eq(&p.0.slot, &s.slot)) {
                    // Already owed earlier events: this one queues behind them (the
                    // extra in-flight count is released at once).
                    Some(p) => p.1.push(item),
                    None => pending.push((s, vec![item], guard)),
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

    /// Sends without waiting; a full or closed subscriber, or one with events in
    /// flight (this event would overtake them), is skipped. Returns how many
    /// subscribers were skipped because they were full or had events in flight.
    pub(crate) fn try_send(&self, event: SessionEvent<E>) -> usize {
        let (_, full) = self.publish(&event, false);
        full.len()
    }

    /// Whether anybody listens to events like `probe` (lets senders skip building
    /// events nobody wants).
    /// A replay buffer wants everything.
    pub(crate) fn wants(&self, probe: impl Fn(&EventFilter) -> bool) -> bool {
        self.list.read().iter().any(|s| probe(&s.filter)) || self.replays()
    }

    /// Ends every stream: writes `Ended` into each terminal slot and empties the
    /// registry. Never waits. Idempotent.
    /// While a turn task holds it back ([`Subscribers::hold_end`]), `Ended` is numbered
    /// and reaches the streams when the last hold is dropped: it is the last event and
    /// has the highest number.
    pub(crate) fn end(&self, summary: ExitSummary) {
        let _publish = self.publish.lock();
        let ended = {
            let mut st = self.ended.lock();
            if st.ended.is_some() || st.pending.is_some() {
                return;
            }
            if st.holds > 0 {
                st.pending = Some(summary);
                return;
            }
            let e = (self.seq.next(), summary);
            st.ended = Some(e.clone());
            e
        };
        // Under the publish lock: a lagging stream catching up sees `Ended`'s number
        // in its slot whenever the number was given.
        self.close_streams(ended);
    }

    /// Keeps `Ended` from the streams until the hold is dropped: a turn task takes it
    /// before reporting its end when its `TurnEnded` waits for a write, so `Ended`
    /// stays last even when the session exits meanwhile. The hold owes the numbers of
    /// the `owed` final events the task will send ([`Subscribers::send_final`]), so a
    /// record written meanwhile reserves them ([`EventSeq::mark`]).
    pub(crate) fn hold_end(self: &Arc<Self>, owed: u64) -> EndHold<E> {
        self.ended.lock().holds += 1;
        self.seq.owe(owed);
        EndHold {
            subscribers: self.clone(),
            owed,
        }
    }

    /// Writes `Ended` into every stream's terminal slot and empties the registry.
    fn close_streams(&self, ended: (u64, ExitSummary)) {
        let list = std::mem::take(&mut *self.list.write());
        for s in list.iter() {
            s.slot.set(ended.clone());
        }
    }
}

/// Sends a turn's final events to one subscriber, in order.
async fn deliver<E: Clone>(s: &SubscriberTx<E>, events: Vec<Sequenced<E>>) {
    for ev in events {
        if s.tx.send(ev).await.is_err() {
            break;
        }
    }
}

/// A subscriber's view of a session: its events in order, `Ended` last, then `None`.
///
/// Read it with [`EventStream::next`] or as a `futures::Stream`. Dropping it
/// unsubscribes; the session never waits on a dropped stream.
pub struct EventStream<E> {
    rx: mpsc::Receiver<Sequenced<E>>,
    /// Where `Ended` waits for a local subscriber; `None` for a stream relayed from
    /// another node, whose `Ended` arrives in `rx` like any event.
    slot: Option<Arc<TerminalSlot>>,
    finished: bool,
    /// How this stream catches up after it lagged (`None`: a backpressure or relayed
    /// stream, which never lags here).
    catch_up: Option<CatchUp<E>>,
    /// Events taken by the last catch-up, read before the channel.
    pending: VecDeque<Sequenced<E>>,
}

/// Takes what a lagging stream missed from the replay buffer and stops its lag.
type CatchUp<E> = Box<dyn Fn(&TerminalSlot) -> Vec<Sequenced<E>> + Send + Sync>;

impl<E> EventStream<E> {
    /// A stream fed by a relay of another node's stream (issue 18): its events in
    /// order, `Ended` last, then `None`. When the relay closes the channel without
    /// `Ended` (the owner was lost), the stream ends there: resubscribe after the last
    /// number seen.
    pub(crate) fn relayed(rx: mpsc::Receiver<Sequenced<E>>) -> Self {
        EventStream {
            rx,
            slot: None,
            finished: false,
            catch_up: None,
            pending: VecDeque::new(),
        }
    }

    /// The next event, or `None` once `Ended` was returned.
    pub async fn next(&mut self) -> Option<SessionEvent<E>> {
        self.next_sequenced().await.map(|s| s.event)
    }

    /// The next event with its sequence number, or `None` once `Ended` was returned.
    pub async fn next_sequenced(&mut self) -> Option<Sequenced<E>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Sequenced<E>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        // Fields borrowed apart: no Arc clone on this path (every event polls it).
        let Some(slot) = self.slot.as_ref() else {
            return match self.rx.poll_recv(cx) {
                Poll::Ready(Some(ev)) => {
                    self.finished = matches!(ev.event, SessionEvent::Ended(_));
                    Poll::Ready(Some(ev))
                }
                Poll::Ready(None) => {
                    self.finished = true;
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            };
        };
        if let Some(ev) = self.pending.pop_front() {
            return Poll::Ready(Some(ev));
        }
        // Buffered events always come before `Ended`.
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(ev)) => return Poll::Ready(Some(ev)),
            Poll::Ready(None) | Poll::Pending => {}
        }
        // The channel is empty: a stream that lagged catches up now (nothing was
        // queued to it since it lagged, so these come next).
        if slot.lag_from.load(Ordering::Acquire) != 0 {
            if let Some(catch_up) = self.catch_up.as_ref() {
                self.pending.extend(catch_up(slot));
                if let Some(ev) = self.pending.pop_front() {
                    return Poll::Ready(Some(ev));
                }
            }
        }
        // Register the waker before checking the slot so a concurrent `set` (or the last
        // in-flight final event) is not missed.
        slot.waker.register(cx.waker());
        if let Some((seq, summary)) = slot.get() {
            if slot.inflight.load(Ordering::Acquire) > 0 {
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
            return Poll::Ready(Some(Sequenced {
                seq,
                event: SessionEvent::Ended(summary),
            }));
        }
        Poll::Pending
    }
}

// No field is ever pinned (the stream is polled through `&mut`), so moving it is fine
// whatever `E` is.
impl<E> Unpin for EventStream<E> {}

impl<E> futures::Stream for EventStream<E> {
    type Item = SessionEvent<E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx).map(|o| o.map(|s| s.event))
    }
}

impl<E> std::fmt::Debug for EventStream<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("finished", &self.finished)
            .finish()
    }
}
