//! The subscriber registry of one session (S20, S21): each subscriber's bounded channel,
//! the replay buffer, lagging and catching up, `StopRequested` sent without waiting, and
//! `Ended` written into every terminal slot at teardown. It numbers and queues events;
//! it must not decide anything about turns or stops.

use super::filter::EventFilter;
use super::keeper::Keeper;
use super::seq::EventSeq;
use super::slot::{InflightGuard, TerminalSlot};
use super::stream::{CatchUp, EventStream};
use super::Last;
use super::{Sequenced, SessionEvent};
use crate::exit::ExitSummary;
use parking_lot::{Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One subscriber's sending side: its channel and its terminal slot.
pub(super) struct SubscriberTx<E> {
    pub(super) tx: mpsc::Sender<Sequenced<E>>,
    pub(super) slot: Arc<TerminalSlot>,
    pub(super) filter: EventFilter,
}

impl<E> SubscriberTx<E> {
    /// Whether this subscriber lags instead of slowing the session.
    pub(super) fn lags(&self) -> bool {
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
    pub(super) list: RwLock<Arc<Vec<SubscriberTx<E>>>>,
    pub(super) ended: Mutex<EndState>,
    pub(super) seq: Arc<EventSeq>,
    /// Held while a number is given and its event queued; guards the replay buffer.
    /// Shared with the lagging streams, which catch up from it.
    pub(super) publish: Arc<Mutex<Replay<E>>>,
    pub(super) order: Arc<tokio::sync::Mutex<()>>,
    /// The stream registered before the actor started (subscribe at spawn), until the
    /// spawner takes it. Invariant: the spawner takes it right after the spawn returns
    /// (or drops it, which unsubscribes), so an unread stream never holds turn events
    /// back by backpressure.
    pub(super) at_spawn: Mutex<Option<EventStream<E>>>,
    /// Keeps every event in the store (S20a), when the session keeps its events.
    pub(super) keeper: Option<Arc<Keeper<E>>>,
    /// The session went to sleep (S39): set under the registry's lock when nobody was
    /// subscribed, so a subscription either kept it awake or finds this set.
    pub(super) asleep: std::sync::atomic::AtomicBool,
}

/// `Ended` once given, and the turn tasks that hold it back.
#[derive(Default)]
pub(super) struct EndState {
    /// `Ended`, numbered: the streams have it (or get it when they subscribe).
    pub(super) ended: Option<(u64, Last)>,
    /// `Ended` asked for while turn tasks hold it back: numbered and sent when the
    /// last hold goes, so it is numbered after their events (issue 28).
    pub(super) pending: Option<Last>,
    /// Turn tasks between reporting their end and queuing `TurnEnded` (which waits
    /// for its write): `Ended` reaches the streams only when none is left.
    pub(super) holds: usize,
}

/// Holds `Ended` back until dropped (see [`Subscribers::hold_end`]), and owes the
/// numbers of the final events its turn task will send.
pub(crate) struct EndHold<E: Clone + Send + 'static> {
    pub(super) subscribers: Arc<Subscribers<E>>,
    /// Final events promised and not numbered yet.
    pub(super) owed: u64,
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
                (0, Some(last)) => {
                    let e = (subs.seq.next(), last);
                    if let Some(k) = &subs.keeper {
                        k.keep(e.0, &e.1.event());
                    }
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
pub(super) struct Replay<E> {
    pub(super) capacity: usize,
    /// Oldest first; allocated by the first event kept.
    pub(super) events: VecDeque<Sequenced<E>>,
}

impl<E: Clone> Replay<E> {
    /// The events after number `after` up to `last` (the last number given) that the
    /// buffer holds and `filter` accepts, oldest first, preceded by
    /// [`SessionEvent::Lagged`] when some of them are no longer held.
    pub(super) fn since(&self, after: u64, last: u64, filter: &EventFilter) -> Vec<Sequenced<E>> {
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

    pub(super) fn keep(&mut self, seq: u64, event: &SessionEvent<E>) {
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
    pub(crate) fn new(
        seq: Arc<EventSeq>,
        replay_capacity: usize,
        keeper: Option<Arc<Keeper<E>>>,
    ) -> Self {
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
            keeper,
            asleep: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Marks the session asleep (S39) unless somebody is subscribed: checked and set
    /// under the registry's lock, so a concurrent subscription is either counted here
    /// (and the session stays awake) or sees the mark. Returns whether it was set.
    /// The incarnation's last event is then an `Ended` with `summary` (reason
    /// `Asleep`), numbered and kept like a real end's (S20a: the keeper's last append
    /// lowers its reserved mark to it), so the woken incarnation numbers right after it
    /// and a subscriber that reconnects after an earlier number sees no gap (a replay
    /// passes over an `Ended` that is not the last). Nobody receives it live (nobody
    /// listens); a stream opened on this incarnation afterwards (a spent handle)
    /// yields it at once.
    pub(crate) fn sleep_if_unwatched(&self, summary: ExitSummary) -> bool {
        // The locks in `subscribe_inner`'s order: publish, list, ended.
        let _publish = self.publish.lock();
        let list = self.list.write();
        let watched = list.iter().any(|s| !s.tx.is_closed()) || self.at_spawn.lock().is_some();
        if !watched {
            let mut st = self.ended.lock();
            if st.ended.is_none() && st.pending.is_none() {
                let e = (self.seq.next(), Last::ended(summary));
                if let Some(k) = &self.keeper {
                    k.keep(e.0, &e.1.event());
                }
                st.ended = Some(e);
            }
            self.asleep.store(true, Ordering::Release);
        }
        !watched
    }

    /// Whether somebody is subscribed (a hint: see [`Subscribers::sleep_if_unwatched`]).
    pub(crate) fn watched(&self) -> bool {
        self.list.read().iter().any(|s| !s.tx.is_closed())
    }

    /// Whether the session went to sleep (S39).
    pub(crate) fn is_asleep(&self) -> bool {
        self.asleep.load(Ordering::Acquire)
    }

    /// The session's keeper of events in the store, if it keeps them (S20a).
    pub(crate) fn keeper(&self) -> Option<&Arc<Keeper<E>>> {
        self.keeper.as_ref()
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

    pub(super) fn subscribe_inner(
        &self,
        capacity: usize,
        filter: EventFilter,
        after: Option<u64>,
    ) -> EventStream<E> {
        // Under the publish lock: no event is numbered between the replay taken here
        // and the registration, so the stream misses nothing and repeats nothing.
        let replay = self.publish.lock();
        let last = self.seq.last();
        // S20a: what the replay buffer no longer holds comes from the store (and from
        // the keeper, for what is not written yet), before the buffer's part.
        let mut backfill = None;
        let backlog: Vec<Sequenced<E>> = match after {
            None => Vec::new(),
            Some(after) => {
                let first_held = replay.events.front().map_or(last + 1, |e| e.seq);
                let upto = first_held.min(last + 1) - 1;
                backfill = match (&self.keeper, after < upto) {
                    (Some(keeper), true) => backfill_from_store(keeper, after, upto, filter),
                    _ => None,
                };
                // Numbers up to `last` were given; `Ended`'s is given by `end`.
                match backfill {
                    Some(_) => replay.since(upto, last, &filter),
                    None => replay.since(after, last, &filter),
                }
            }
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
            backfill,
            backfilled: VecDeque::new(),
            bounds: Vec::new(),
            upper_bound: false,
        }
    }

    /// How a lagging stream with `filter` catches up: under the publish lock, it takes
    /// what it missed from the replay buffer (with `Lagged` for what is gone) and stops
    /// lagging, so the next event is queued to it again, after these.
    pub(super) fn catch_up(&self, filter: EventFilter) -> CatchUp<E> {
        let replay = self.publish.clone();
        let seq = self.seq.clone();
        let keeper = self.keeper.clone();
        Box::new(move |slot: &TerminalSlot| {
            let replay = replay.lock();
            let from = slot.lag_from.swap(0, Ordering::AcqRel);
            if from == 0 {
                return (Vec::new(), None);
            }
            // `Ended` reaches the slots under this lock, with its number: what was
            // missed ends before it.
            let last = match slot.get() {
                Some((ended, _)) => ended - 1,
                None => seq.last(),
            };
            // S20a: what the buffer no longer holds comes from the store.
            let first_held = replay.events.front().map_or(last + 1, |e| e.seq);
            let upto = first_held.min(last + 1) - 1;
            if let Some(keeper) = keeper.as_ref().filter(|_| from - 1 < upto) {
                if let Some(backfill) = backfill_from_store(keeper, from - 1, upto, filter) {
                    return (replay.since(upto, last, &filter), Some(backfill));
                }
            }
            (replay.since(from - 1, last, &filter), None)
        })
    }

    /// Whether late subscribers can replay events (every event is then built, even
    /// when nobody listens now).
    pub(crate) fn replays(&self) -> bool {
        self.keeper.is_some() || self.publish.lock().capacity > 0
    }

    /// Gives an event nobody receives its number (the sequence does not depend on who
    /// listens).
    pub(crate) fn skip(&self) {
        self.seq.next();
    }

    pub(super) fn snapshot(&self) -> Arc<Vec<SubscriberTx<E>>> {
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
    pub(super) fn publish(
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
        if let Some(k) = &self.keeper {
            k.keep(seq, event);
        }
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
        if let Some(k) = &self.keeper {
            // S20a: only numbers under the durable reserved mark are handed out.
            k.gate(self.seq.last() + 1).await;
        }
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
    /// Call before the actor handles the turn's end (the actor calls it first thing
    /// when it takes the report), or with the [`EndHold`] taken before reporting it
    /// (whose owed numbers the events take), then await the future (if any): teardown
    /// may run meanwhile and `Ended` still comes after these events.
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
    /// `last` says whether the streams end with `Ended` or, for an incarnation its
    /// supervisor starts again, `Restarting` (S26).
    pub(crate) fn end(&self, last: Last) {
        let _publish = self.publish.lock();
        let ended = {
            let mut st = self.ended.lock();
            if st.ended.is_some() || st.pending.is_some() {
                return;
            }
            if st.holds > 0 {
                st.pending = Some(last);
                return;
            }
            let e = (self.seq.next(), last);
            if let Some(k) = &self.keeper {
                k.keep(e.0, &e.1.event());
            }
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
    pub(super) fn close_streams(&self, ended: (u64, Last)) {
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

/// What a stream after `after` reads from the store (and from the keeper, for what is
/// not written yet) up to `upto`, the last number the replay buffer does not hold:
/// the keeper's unwritten events taken now (under the publish lock), the store read
/// when the stream is polled.
fn backfill_from_store<E: Clone + Send + 'static>(
    keeper: &Arc<Keeper<E>>,
    after: u64,
    upto: u64,
    filter: EventFilter,
) -> Option<super::stream::Backfill<E>> {
    let read = keeper.reader()?;
    let unwritten = keeper.unwritten();
    let src = super::keeper::ReplaySource {
        read,
        codec: keeper.codec().clone(),
        filter,
        final_ended: false,
        page_bytes: super::keeper::REPLAY_PAGE,
    };
    Some(super::keeper::replay_pages(src, unwritten, after, upto))
}
