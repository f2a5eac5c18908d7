//! Events kept in the store (DESIGN S20a, issue 33): the session's side. The keeper
//! takes every event as it is numbered (under the registry's publish lock, never
//! waiting), encoding it into its current page, and hands itself to the store's
//! committer, which takes the page at its next wave, whoever starts it (the session's
//! own turn-end write, another session's, the instance heartbeat): "written in the
//! group commit that follows it", one append in flight at a time. Live delivery never
//! waits for it, and a wave of events alone is not flushed (the next flush of any write
//! makes it durable), so a session streaming tokens keeps streaming. The keeper starts
//! a wave of its own only for its `Ended`, for a reservation a turn waits for, and when
//! [`WAKE_AT`] events wait.
//!
//! **Numbers.** A number may be handed to a subscriber only below a *reserved mark*
//! made durable in the store, so that a new incarnation, which numbers after the
//! stored mark, never gives a number some client saw before a SIGKILL. The keeper
//! reserves ahead ([`RESERVE_BLOCK`]), early enough that turn events never wait for it
//! in practice; a turn task whose next number is above the durable mark (less a slack
//! for the few events the actor numbers without waiting) waits for the reservation
//! ([`Keeper::gate`]). When the session ends, its last append lowers the mark to
//! `Ended`'s number, so a graceful restart continues without a gap.
//!
//! **What a crash costs a subscriber** (S20a, 2026-11-28: "`missed` is what may have
//! been handed out"). After a SIGKILL the next incarnation numbers after the stored
//! mark, and the numbers between the last kept event and the mark are of two kinds:
//! numbers the killed process gave to events it did not write (lost), and numbers it
//! reserved and never gave. Nothing durable tells them apart (telling them apart would
//! take a store write per event), so the new incarnation keeps a *crash note*
//! ([`Keeper::after_crash`]): a kept `Lagged { missed }` numbered with the stored mark,
//! never delivered live, saying that the `missed` numbers up to it may include
//! numbers never given. A replay that reports a gap covering a note's numbers says its
//! count is an upper bound (`EventStream::lagged_upper_bound`, the SSE `lagged`'s
//! `upper_bound`), and a gap without a note is exact. The reservation is sized to the
//! session's pace ([`Keeper::block`]): a session that gives a few events between two
//! writes reserves a few ([`MIN_BLOCK`]) numbers ahead, not [`RESERVE_BLOCK`], so the
//! upper bound after a crash is close to what could really have been lost.
//!
//! It owns the pending events and the append in flight; it decides nothing about what
//! is kept (the store trims by the session's retention) and never touches a record.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::{Sequenced, SessionEvent};
use crate::store::committer::Answer;
use crate::store::{EventAppend, EventRider, KeptEvents, StoreError};
use agentloop_core::event_log::Retention;
use agentloop_core::table::events::PageBuilder;

/// The most numbers a keeper reserves ahead (a session that gives hundreds of events
/// between two writes: a long turn streaming tokens).
pub const RESERVE_BLOCK: u64 = 1024;

/// Numbers the actor may give without waiting (a stop's `StopRequested`, `Ended`) past
/// the point where turn events wait for a reservation.
const SLACK: u64 = 64;

/// The fewest numbers a keeper reserves ahead: the actor's [`SLACK`] twice (a new
/// reservation is asked half a block ahead, before turn events reach the slack) and
/// room for a few events.
pub const MIN_BLOCK: u64 = 2 * SLACK + 32;

/// How a session's events are written to and read from the store: JSON by default
/// ([`EventCodec::json`]).
pub struct EventCodec<E> {
    encode: fn(&SessionEvent<E>, &mut Vec<u8>) -> Result<(), String>,
    decode: fn(&[u8]) -> Result<SessionEvent<E>, String>,
}

impl<E> Clone for EventCodec<E> {
    fn clone(&self) -> Self {
        EventCodec {
            encode: self.encode,
            decode: self.decode,
        }
    }
}

impl<E> std::fmt::Debug for EventCodec<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventCodec")
    }
}

impl<E: serde::Serialize + serde::de::DeserializeOwned> EventCodec<E> {
    /// Events as JSON: what the HTTP front sends, and what `agentloop sessions events`
    /// lists without knowing the event type.
    pub fn json() -> Self {
        EventCodec {
            encode: |e, w| serde_json::to_writer(w, e).map_err(|e| e.to_string()),
            decode: |b| serde_json::from_slice(b).map_err(|e| e.to_string()),
        }
    }
}

impl<E> EventCodec<E> {
    /// Decodes a kept event's body.
    pub fn decode(&self, body: &[u8]) -> Result<SessionEvent<E>, String> {
        (self.decode)(body)
    }
}

/// Hands the keeper to the store's next group commit (store, id and epoch bound in;
/// `true`: start one now).
pub(crate) type RideFn = Box<dyn Fn(Arc<dyn EventRider>, bool) + Send + Sync>;
/// Reads the session's kept events after a number, whole pages until at least this
/// many.
pub(crate) type ReadFn =
    Box<dyn Fn(u64, usize) -> BoxFuture<'static, Result<KeptEvents, StoreError>> + Send + Sync>;

/// Pending events that start a group commit of their own instead of waiting for the
/// next one (bounded memory and bounded loss in a long turn that writes nothing else).
const WAKE_AT: usize = 256;

/// One session's keeper (see the module doc).
pub(crate) struct Keeper<E> {
    codec: EventCodec<E>,
    retention: Retention,
    state: Mutex<State>,
    /// Numbers up to this one are reserved durably: turn events may take them.
    durable: AtomicU64,
    reserved: tokio::sync::Notify,
}

struct State {
    /// Where appends go, once the session started (its epoch is known).
    ride: Option<Arc<RideFn>>,
    read: Option<Arc<ReadFn>>,
    /// Numbered and not yet handed to an append, encoded, ascending.
    pending: PageBuilder,
    /// The append in flight, as sent (for subscribers that replay meanwhile).
    in_flight: Option<PageBuilder>,
    /// Handed to the store, waiting for its next group commit.
    riding: bool,
    /// An event was kept that should not wait for someone else's write (a turn's
    /// end, the session's end, a reservation, many events).
    wake: bool,
    /// The next append is this life's first (a fresh session): the store drops what a
    /// previous session of this id kept.
    fresh: bool,
    /// The highest mark asked for.
    asked: u64,
    /// The mark the next append sets (0: none).
    next_mark: u64,
    /// `Ended` was kept: the next append sets the mark to its number exactly.
    ended: Option<u64>,
    /// Events appended since the last trim, and when it was.
    since_trim: u64,
    trimmed_at_ms: u64,
    /// Fenced, or the store closed: nothing more is appended.
    stopped: bool,
    /// `Ended` was taken: no reservation after it (its mark is the last).
    finished: bool,
    /// Appends refused in a row by a store error (a turn waiting for a reservation
    /// backs off by them).
    failures: u32,
    /// The session's pace: the most events one append carried lately (each append
    /// rides one group commit), decaying by a quarter an append. Sizes the block
    /// reserved ahead ([`Keeper::block`]).
    pace: u64,
}

/// The keeper as the store sees it: what waits, taken when the store writes it.
struct Ride<E>(Arc<Keeper<E>>);

impl<E: Clone + Send + 'static> EventRider for Ride<E> {
    fn take(&self) -> Option<(EventAppend, bool, Answer<()>)> {
        self.0.take()
    }
}

impl<E: Clone + Send + 'static> Keeper<E> {
    /// A keeper that holds events until [`Keeper::start`].
    pub(crate) fn new(codec: EventCodec<E>, retention: Retention) -> Arc<Self> {
        Arc::new(Keeper {
            codec,
            retention,
            state: Mutex::new(State {
                ride: None,
                read: None,
                pending: PageBuilder::default(),
                in_flight: None,
                riding: false,
                wake: false,
                fresh: false,
                asked: 0,
                next_mark: 0,
                ended: None,
                since_trim: 0,
                trimmed_at_ms: 0,
                stopped: false,
                finished: false,
                failures: 0,
                pace: 0,
            }),
            durable: AtomicU64::new(0),
            reserved: tokio::sync::Notify::new(),
        })
    }

    /// The session started: appends ride the store's group commits through `ride`, a
    /// new life when `fresh`, its numbers after `after`; the first reservation is
    /// asked at once, so the first event rarely waits for it.
    pub(crate) fn start(self: &Arc<Self>, ride: RideFn, read: ReadFn, fresh: bool, after: u64) {
        let mut st = self.state.lock();
        st.ride = Some(Arc::new(ride));
        st.read = Some(Arc::new(read));
        st.fresh = fresh;
        self.durable.store(after, Ordering::Release);
        st.asked = after + Self::block(&st);
        st.next_mark = st.asked;
        st.wake = true;
        self.request(st);
    }

    /// How many numbers to reserve ahead at the session's pace: enough that the events
    /// of two group commits and the actor's slack fit in half a block (so turn events
    /// do not wait for a reservation, which rides the next group commit), and no more:
    /// after a crash, the numbers reserved and not written are reported as possibly
    /// missed (an upper bound), so a block sized to the pace keeps that bound close to
    /// what could have been lost ([`MIN_BLOCK`] to [`RESERVE_BLOCK`]).
    fn block(st: &State) -> u64 {
        (2 * SLACK + 4 * st.pace).clamp(MIN_BLOCK, RESERVE_BLOCK)
    }

    /// The previous incarnation left `reserved` above its last kept event `last_kept`
    /// (it crashed, or lost its record to another owner, before its last append):
    /// keeps a crash note, a `Lagged { missed }` numbered `reserved` covering the
    /// numbers after `last_kept`, so that every replay across them, from this
    /// incarnation or a later one, says its count is an upper bound (see the module
    /// doc). Call before [`Keeper::start`]; the next incarnation numbers after
    /// `reserved`, so the note takes no number an event could have.
    pub(crate) fn after_crash(&self, last_kept: u64, reserved: u64) {
        if reserved <= last_kept {
            return;
        }
        let mut st = self.state.lock();
        let note = SessionEvent::<E>::Lagged {
            missed: reserved - last_kept,
        };
        let encode = self.codec.encode;
        if let Err(why) = st
            .pending
            .push_with(reserved, crate::store::now_ms(), |w| encode(&note, w))
        {
            tracing::warn!(error = %why, "a crash note could not be encoded: a replay across the crash reports its gap as exact");
        }
    }

    /// Reads the session's kept events after `after` (for a subscriber's replay).
    pub(crate) fn reader(&self) -> Option<Arc<ReadFn>> {
        self.state.lock().read.clone()
    }

    /// The codec.
    pub(crate) fn codec(&self) -> &EventCodec<E> {
        &self.codec
    }

    /// Takes a numbered event (called under the publish lock; never waits).
    pub(crate) fn keep(self: &Arc<Self>, seq: u64, event: &SessionEvent<E>) {
        let mut st = self.state.lock();
        if st.stopped {
            return;
        }
        let encode = self.codec.encode;
        if let Err(why) = st
            .pending
            .push_with(seq, crate::store::now_ms(), |w| encode(event, w))
        {
            tracing::warn!(seq, error = %why, "an event could not be encoded to be kept: a subscriber that replays it from the store is told it missed it");
        }
        if let SessionEvent::Ended(_) | SessionEvent::Restarting { .. } = event {
            // The incarnation's last append: written now, and the mark lowered to it.
            st.ended = Some(seq);
            st.wake = true;
        }
        if st.pending.len() >= WAKE_AT {
            st.wake = true;
        }
        let block = Self::block(&st);
        if st.ended.is_none() && !st.finished && seq + block / 2 > st.asked {
            // Ahead of need: durable with the next group commit, long before the
            // numbers reach it.
            st.asked = seq + block;
            st.next_mark = st.asked;
        }
        self.request(st);
    }

    /// Events numbered and not yet in the store (pending or in flight), for a
    /// subscriber that replays: taken under the publish lock.
    pub(crate) fn unwritten(&self) -> Vec<Sequenced<E>> {
        let st = self.state.lock();
        let mut kept = st
            .in_flight
            .as_ref()
            .map(PageBuilder::events)
            .unwrap_or_default();
        kept.extend(st.pending.events());
        drop(st);
        kept.into_iter()
            .filter_map(|k| {
                let event = self.codec.decode(&k.body).ok()?;
                Some(Sequenced { seq: k.seq, event })
            })
            .collect()
    }

    /// Waits until number `next` may be handed out (it is under the durable reserved
    /// mark, less the slack). Turn tasks call it before numbering an event, and the
    /// session's start waits for its first reservation with it (so the events the actor
    /// numbers without waiting are covered too).
    pub(crate) async fn gate(self: &Arc<Self>, next: u64) {
        loop {
            let notified = self.reserved.notified();
            if next + SLACK <= self.durable.load(Ordering::Acquire) {
                return;
            }
            // A store that refused the last appends is asked again after a pause
            // (10 ms, doubling, at most a second), not in a loop.
            let failures = self.state.lock().failures;
            if failures > 0 {
                let pause = std::time::Duration::from_millis(10 << failures.min(7));
                tokio::time::sleep(pause.min(std::time::Duration::from_secs(1))).await;
            }
            {
                let mut st = self.state.lock();
                if st.stopped || st.finished || st.ride.is_none() {
                    // Stopped: nothing more is kept. Not started: nothing is numbered
                    // before the start anyway.
                    return;
                }
                if next + SLACK > st.asked {
                    st.asked = next + Self::block(&st);
                    st.next_mark = st.asked;
                }
                st.wake = true;
                self.request(st);
            }
            notified.await;
        }
    }

    /// Hands the keeper to the store when something waits and no append is in flight:
    /// riding the next group commit, or starting one when it should not wait.
    fn request(self: &Arc<Self>, mut st: parking_lot::MutexGuard<'_, State>) {
        if st.in_flight.is_some() || st.stopped {
            return;
        }
        let Some(ride) = st.ride.clone() else {
            return;
        };
        if st.pending.is_empty() && st.next_mark == 0 && st.ended.is_none() {
            return;
        }
        let wake = std::mem::take(&mut st.wake);
        if st.riding && !wake {
            return;
        }
        st.riding = true;
        drop(st);
        (ride)(Arc::new(Ride(self.clone())), wake);
    }

    /// The store takes what waits (at its group commit): one append, encoded here.
    fn take(self: &Arc<Self>) -> Option<(EventAppend, bool, Answer<()>)> {
        let mut st = self.state.lock();
        st.riding = false;
        if st.in_flight.is_some()
            || st.stopped
            || (st.pending.is_empty() && st.next_mark == 0 && st.ended.is_none())
        {
            return None;
        }
        let page = std::mem::take(&mut st.pending);
        st.pace = (page.len() as u64).max(st.pace - st.pace / 4);
        let mark = match st.ended.take() {
            // The session's last append: the mark is exactly `Ended`'s number, so the
            // next incarnation continues after it without a gap; no mark after it.
            Some(end) => {
                st.finished = true;
                st.next_mark = 0;
                end
            }
            None => std::mem::take(&mut st.next_mark),
        };
        let fresh = std::mem::take(&mut st.fresh);
        let now_ms = crate::store::now_ms();
        st.since_trim += page.len() as u64;
        // By count every eighth of the count (a read of the keys of the pages that go),
        // by age every eighth of the age (a read of every page key).
        let trim = fresh || st.since_trim >= (self.retention.count / 8).max(32);
        if trim {
            st.since_trim = 0;
        }
        let trim_age = self.retention.max_age_ms.is_some_and(|age| {
            fresh || now_ms.saturating_sub(st.trimmed_at_ms) >= (age / 8).max(1)
        });
        if trim_age {
            st.trimmed_at_ms = now_ms;
        }
        let sealed = page.seal();
        st.in_flight = Some(page);
        drop(st);
        let me = self.clone();
        let answer = Answer::new(move |r: Result<(), StoreError>| me.appended(r, mark));
        Some((
            EventAppend {
                page: sealed,
                reserved: mark,
                fresh,
                retention: (trim || trim_age).then_some(self.retention),
                trim_age,
                now_ms,
            },
            mark > 0,
            answer,
        ))
    }

    /// An append was answered.
    fn appended(self: &Arc<Self>, r: Result<(), StoreError>, mark: u64) {
        let mut st = self.state.lock();
        st.in_flight = None;
        match r {
            Ok(()) => {
                st.failures = 0;
                if mark > 0 {
                    self.durable.fetch_max(mark, Ordering::AcqRel);
                    self.reserved.notify_waiters();
                }
            }
            Err(e @ (StoreError::Fenced { .. } | StoreError::Closed)) => {
                match e {
                    // Another owner keeps them: nothing is lost.
                    StoreError::Fenced { .. } => {
                        tracing::info!(error = %e, "the session's events are no longer kept here: its record has another owner")
                    }
                    _ => {
                        tracing::warn!(error = %e, "the store closed before the session's last events were kept: a subscriber that replays them is told it missed them")
                    }
                }
                st.stopped = true;
                st.pending = PageBuilder::default();
                drop(st);
                // Turn tasks waiting for a reservation go on: this incarnation is
                // superseded (or its store is gone) and keeps nothing more.
                self.reserved.notify_waiters();
                return;
            }
            Err(e) => {
                // The page is lost (a replay reports its numbers missed); the
                // reservation it carried is asked again with the next append, and turn
                // tasks that need it wait for it: no number is handed out unreserved.
                tracing::warn!(error = %e, "events could not be kept in the store: subscribers that replay them are told they missed them; the next append tries again");
                if mark > 0 && !st.finished {
                    st.next_mark = st.next_mark.max(mark);
                }
                st.failures = st.failures.saturating_add(1);
                drop(st);
                self.reserved.notify_waiters();
                return;
            }
        }
        self.request(st);
    }
}

/// The bytes of kept events a replay reads from the store at once (whole pages, so a
/// little more): what one subscriber's replay holds in memory, whatever the session
/// keeps (issue 52).
pub const REPLAY_PAGE: usize = 1 << 20;

/// Where a replay from the store reads, and what it keeps.
pub(crate) struct ReplaySource<E> {
    /// Reads the session's kept events.
    pub(crate) read: Arc<ReadFn>,
    pub(crate) codec: EventCodec<E>,
    /// What the subscriber takes.
    pub(crate) filter: super::EventFilter,
    /// The session ended for good: its last `Ended` is news (see
    /// [`replay_from_store`]).
    pub(crate) final_ended: bool,
    /// The bytes of one page ([`REPLAY_PAGE`], but in tests).
    pub(crate) page_bytes: usize,
}

/// The pace of every replay from the store together, in events a second (0: no
/// pace): set once by the operator ([`set_replay_rate`], `[limits] replay_rate`).
static REPLAY_RATE: AtomicU64 = AtomicU64::new(0);
/// When the replays' pace lets the next chunk go, in ns after [`pace_origin`].
static REPLAY_NEXT_NS: AtomicU64 = AtomicU64::new(0);

fn pace_origin() -> tokio::time::Instant {
    static ORIGIN: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(tokio::time::Instant::now)
}

/// Paces every replay from the store of this process together at `events_per_second`
/// (0: as fast as they go; issue 52: four clients replaying from the start as fast as
/// they can took both cores of a server, and another client's p99 went to ten times
/// its idle value). A replay's chunks take turns on one timeline, each waiting for its
/// share: the replays share the rate, and the rest of the machine keeps what is left.
pub fn set_replay_rate(events_per_second: u64) {
    REPLAY_RATE.store(events_per_second, Ordering::Relaxed);
}

/// Waits for `events`' turn under the replay pace.
async fn paced(events: usize) {
    let rate = REPLAY_RATE.load(Ordering::Relaxed);
    if rate == 0 || events == 0 {
        return;
    }
    let cost = (events as u64).saturating_mul(1_000_000_000) / rate;
    let now = u64::try_from(pace_origin().elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut next = REPLAY_NEXT_NS.load(Ordering::Relaxed);
    let start = loop {
        let start = next.max(now);
        match REPLAY_NEXT_NS.compare_exchange_weak(
            next,
            start.saturating_add(cost),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => break start,
            Err(seen) => next = seen,
        }
    };
    if start > now {
        tokio::time::sleep_until(pace_origin() + std::time::Duration::from_nanos(start)).await;
    }
}

/// Kept events decoded at once by a replay: the longest a replay holds a worker
/// without yielding (issue 52: a page of 6 000 events decoded in one go held a worker
/// for 25 to 50 ms, and four clients replaying from 0 took other clients' p99 to ten
/// times its idle value; chunks of 256 still took a replay-only soak's p99 to 2.6-2.9x
/// idle, chunks of 32 to 1.5-1.7x).
pub(crate) const DECODE_CHUNK: usize = 32;

/// A replay from the store of the kept events numbered in `(after, upto]` that the
/// source's filter takes, a page at a time: each page is read when the stream has
/// taken the one before, and decoded [`DECODE_CHUNK`] events at a time, yielding
/// between chunks. `unwritten` (the keeper's events not written yet, the newest) join
/// the last page. See [`replay_from_store`] for the rest.
pub(crate) fn replay_pages<E: Clone + Send + 'static>(
    src: ReplaySource<E>,
    unwritten: Vec<Sequenced<E>>,
    after: u64,
    upto: u64,
) -> super::stream::Backfill<E> {
    let page = (src.read)(after, src.page_bytes);
    Box::pin(async move {
        let kept = match page.await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "a subscriber's replay could not read the kept events: it is told it missed them");
                Default::default()
            }
        };
        // A full page may be followed by more: this page ends at its last event, and
        // the next one is read after it.
        let read_bytes: usize = kept.events.iter().map(|e| e.body.len().max(1)).sum();
        let page_upto = match kept.events.last() {
            Some(last) if read_bytes >= src.page_bytes && last.seq < upto => last.seq,
            _ => upto,
        };
        let cut = Cut {
            after,
            page_upto,
            upto,
        };
        paced(kept.events.len().min(DECODE_CHUNK)).await;
        decode_chunk(src, kept.events, unwritten, cut)
    })
}

/// Where a replay is: after `after`, in a page that ends at `page_upto`, of a replay
/// that ends at `upto`.
#[derive(Clone, Copy)]
struct Cut {
    after: u64,
    page_upto: u64,
    upto: u64,
}

/// Decodes the first [`DECODE_CHUNK`] of `raw` (events of the page being replayed) and
/// says what comes next: the rest of the page (after a yield), the next page, or
/// nothing.
fn decode_chunk<E: Clone + Send + 'static>(
    src: ReplaySource<E>,
    mut raw: Vec<crate::store::KeptEvent>,
    unwritten: Vec<Sequenced<E>>,
    cut: Cut,
) -> super::stream::Replayed<E> {
    let rest = raw.split_off(raw.len().min(DECODE_CHUNK));
    // A chunk ends at its last event, but never past the page's end: events the page
    // read beyond it (the replay buffer holds them, or they are the next page's) are
    // not this replay's to send.
    let chunk_upto = match (rest.is_empty(), raw.last()) {
        (false, Some(last)) if last.seq < cut.page_upto => last.seq,
        _ => cut.page_upto,
    };
    let (now, later): (Vec<_>, Vec<_>) = unwritten.into_iter().partition(|e| e.seq <= chunk_upto);
    let filter = &src.filter;
    let chunk = KeptEvents {
        events: raw,
        ..Default::default()
    };
    let (events, bounds) = replay_from_store(
        &src.codec,
        chunk,
        now,
        cut.after,
        chunk_upto,
        // Only the replay's last event can be the final `Ended`.
        src.final_ended && chunk_upto == cut.upto,
        |e| filter.accepts(e),
    );
    let next: Option<super::stream::Backfill<E>> = if chunk_upto < cut.page_upto {
        // The rest of this page, once others had the worker.
        let cut = Cut {
            after: chunk_upto,
            ..cut
        };
        Some(Box::pin(async move {
            tokio::task::yield_now().await;
            paced(rest.len().min(DECODE_CHUNK)).await;
            decode_chunk(src, rest, later, cut)
        }))
    } else if cut.page_upto < cut.upto {
        // The next page is read when the stream has taken this one, not before.
        Some(Box::pin(async move {
            replay_pages(src, later, cut.page_upto, cut.upto).await
        }))
    } else {
        None
    };
    super::stream::Replayed {
        events,
        bounds,
        next: next.map(super::stream::BackfillNext),
    }
}

/// What a replay from the store adds before the live part of a stream: the kept and
/// unwritten events numbered in `(after, upto]` that `accepts` takes, in order, with a
/// [`SessionEvent::Lagged`] where numbers are missing (events lost before they were
/// written, or no longer kept). `Ended` events of earlier incarnations are history,
/// not news: they are skipped without counting as missed, but for the last one of a
/// session that ended for good (`final_ended`, and it is numbered `upto`). A kept
/// `Lagged` is a crash note ([`Keeper::after_crash`]), not an event: a `Lagged` whose
/// numbers meet a note's counts an upper bound, and its number is in the second
/// vector.
pub(crate) fn replay_from_store<E: Clone>(
    codec: &EventCodec<E>,
    kept: KeptEvents,
    unwritten: Vec<Sequenced<E>>,
    after: u64,
    upto: u64,
    final_ended: bool,
    accepts: impl Fn(&SessionEvent<E>) -> bool,
) -> (Vec<Sequenced<E>>, Vec<u64>) {
    let mut all: BTreeMap<u64, Option<SessionEvent<E>>> = BTreeMap::new();
    // The crash notes: the numbers `(first, last)` that may include ones never given.
    let mut notes: Vec<(u64, u64)> = Vec::new();
    let mut take = |seq: u64, e: SessionEvent<E>| match e {
        SessionEvent::Lagged { missed } => notes.push((seq + 1 - missed.min(seq), seq)),
        e => {
            all.insert(seq, Some(e));
        }
    };
    for k in kept.events {
        if k.seq <= after || k.seq > upto {
            continue;
        }
        match codec.decode(&k.body) {
            Ok(e) => take(k.seq, e),
            Err(why) => {
                tracing::warn!(seq = k.seq, error = %why, "a kept event does not decode: the subscriber is told it missed it");
            }
        }
    }
    for e in unwritten {
        if e.seq > after && e.seq <= upto {
            take(e.seq, e.event);
        }
    }
    let mut out = Vec::new();
    let mut bounds = Vec::new();
    let mut gap = |out: &mut Vec<Sequenced<E>>, first: u64, last: u64| {
        if notes.iter().any(|(a, b)| *a <= last && first <= *b) {
            bounds.push(last);
        }
        out.push(Sequenced {
            seq: last,
            event: SessionEvent::Lagged {
                missed: last + 1 - first,
            },
        });
    };
    let mut next = after + 1;
    for (seq, event) in all {
        let Some(event) = event else { continue };
        if seq > next {
            gap(&mut out, next, seq - 1);
        }
        next = seq + 1;
        if matches!(event, SessionEvent::Ended(_)) && !(final_ended && seq == upto) {
            continue;
        }
        if accepts(&event) {
            out.push(Sequenced { seq, event });
        }
    }
    if upto >= next {
        gap(&mut out, next, upto);
    }
    (out, bounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(codec: &EventCodec<u32>, seqs: &[u64]) -> KeptEvents {
        KeptEvents {
            events: seqs
                .iter()
                .map(|s| {
                    let mut body = Vec::new();
                    (codec.encode)(
                        &SessionEvent::Agent {
                            turn: 1,
                            event: *s as u32,
                        },
                        &mut body,
                    )
                    .unwrap();
                    crate::store::KeptEvent {
                        seq: *s,
                        at_ms: 0,
                        body,
                    }
                })
                .collect(),
            last: seqs.last().copied().unwrap_or(0),
            reserved: 0,
        }
    }

    /// Issue 52: a replay reads the store a page at a time, each read asked for a
    /// page's bytes and answered with about that much (here a "page" of the fake store
    /// is one event, so at most the bytes asked for plus one event), the next page read
    /// only once the stream took the one before; the subscriber gets every event in
    /// order, a gap as `Lagged`, and the unwritten events last. 64 reconnects from 0 to
    /// a session keeping a million events held a million decoded events each before.
    #[tokio::test]
    async fn a_replay_reads_the_store_a_page_at_a_time() {
        const PAGE: usize = 3_000;
        let codec = EventCodec::<u32>::json();
        // Kept: 1..=2000 but 700 (lost before it was written); unwritten: 2001, 2002.
        let all: Vec<u64> = (1..=2000).filter(|s| *s != 700).collect();
        let store = Arc::new(kept(&codec, &all));
        let total: usize = store.events.iter().map(|e| e.body.len()).sum();
        let biggest = store.events.iter().map(|e| e.body.len()).max().unwrap();
        let reads: Arc<parking_lot::Mutex<Vec<(u64, usize, usize)>>> = Arc::default();
        let (r, st) = (reads.clone(), store.clone());
        let read: ReadFn = Box::new(move |after, max| {
            let mut bytes = 0;
            let events: Vec<_> = st
                .events
                .iter()
                .filter(|e| e.seq > after)
                .take_while(|e| {
                    let more = bytes < max;
                    bytes += e.body.len();
                    more
                })
                .cloned()
                .collect();
            let got = events.iter().map(|e| e.body.len()).sum();
            r.lock().push((after, max, got));
            let page = KeptEvents {
                events,
                last: st.last,
                reserved: 0,
            };
            Box::pin(async move { Ok(page) })
        });
        let unwritten: Vec<Sequenced<u32>> = [2001, 2002]
            .into_iter()
            .map(|seq| Sequenced {
                seq,
                event: SessionEvent::Agent {
                    turn: 1,
                    event: seq as u32,
                },
            })
            .collect();
        let src = ReplaySource {
            read: Arc::new(read),
            codec,
            filter: super::super::EventFilter::all(),
            final_ended: false,
            page_bytes: PAGE,
        };
        let mut stream =
            super::super::EventStream::from_store(replay_pages(src, unwritten, 0, 2002));
        let first = stream.next_sequenced().await.expect("the first event");
        assert_eq!(first.seq, 1);
        assert_eq!(
            reads.lock().len(),
            1,
            "one page read before the first event"
        );
        let mut seen = vec![first];
        while let Some(e) = stream.next_sequenced().await {
            seen.push(e);
        }
        let reads = reads.lock().clone();
        assert!(reads.len() >= total / (PAGE + biggest), "{reads:?}");
        for (after, max, got) in &reads {
            assert_eq!(*max, PAGE, "after {after}");
            assert!(*got <= PAGE + biggest, "after {after}: {got} bytes read");
        }
        let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
        let want: Vec<u64> = (1..=2002).collect();
        assert_eq!(seqs, want, "every number once, in order");
        // A replay that ends before the store's last event (the replay buffer holds
        // the rest) sends nothing past its end, whatever the pages it reads hold.
        let (st, codec) = (store.clone(), EventCodec::<u32>::json());
        let read: ReadFn = Box::new(move |after, _max| {
            let page = KeptEvents {
                events: st
                    .events
                    .iter()
                    .filter(|e| e.seq > after)
                    .cloned()
                    .collect(),
                last: st.last,
                reserved: 0,
            };
            Box::pin(async move { Ok(page) })
        });
        let src = ReplaySource {
            read: Arc::new(read),
            codec,
            filter: super::super::EventFilter::all(),
            final_ended: false,
            page_bytes: PAGE,
        };
        let mut stream =
            super::super::EventStream::from_store(replay_pages(src, Vec::new(), 0, 1500));
        let mut seqs = Vec::new();
        while let Some(e) = stream.next_sequenced().await {
            seqs.push(e.seq);
        }
        assert_eq!(
            seqs,
            (1..=1500).collect::<Vec<u64>>(),
            "up to the replay's end only"
        );
        assert!(
            matches!(seen[699].event, SessionEvent::Lagged { missed: 1 }),
            "the lost event is told: {:?}",
            seen[699]
        );
    }

    /// Every append's mark and numbers.
    type Log = Arc<parking_lot::Mutex<Vec<(u64, Vec<u64>)>>>;

    /// A keeper over a store that answers at once, recording every append's mark and
    /// events, and failing them while the flag is set.
    fn recorded() -> (Arc<Keeper<u32>>, Log, Arc<std::sync::atomic::AtomicBool>) {
        let keeper = Keeper::new(EventCodec::<u32>::json(), Retention::default());
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (l, f) = (log.clone(), fail.clone());
        keeper.start(
            Box::new(move |rider: Arc<dyn EventRider>, _wake| {
                if let Some((append, _flush, done)) = rider.take() {
                    let seqs = append
                        .page
                        .as_ref()
                        .map(|p| (p.info.first..=p.info.last).collect())
                        .unwrap_or_default();
                    l.lock().push((append.reserved, seqs));
                    match f.load(Ordering::SeqCst) {
                        true => done.send(Err(StoreError::Backend {
                            operation: "save",
                            session: "k".into(),
                            message: "injected".into(),
                        })),
                        false => done.send(Ok(())),
                    }
                }
            }),
            Box::new(|_, _| Box::pin(async { Ok(KeptEvents::default()) })),
            false,
            0,
        );
        (keeper, log, fail)
    }

    #[test]
    fn the_last_append_lowers_the_mark_to_ended_and_nothing_raises_it_after() {
        let (keeper, log, _) = recorded();
        assert_eq!(log.lock()[0].0, MIN_BLOCK, "reserved ahead at the start");
        keeper.keep(1, &SessionEvent::Agent { turn: 0, event: 1 });
        keeper.keep(
            2,
            &SessionEvent::Ended(crate::exit::ExitSummary {
                session_id: "k".into(),
                reason: crate::exit::ExitReason::Completed,
                failure: None,
                stop_cause: None,
                unhandled: 0,
                interrupted: 0,
                late: 0,
                checkpoint: crate::exit::CheckpointOutcome::NotAttempted,
                counters: Default::default(),
            }),
        );
        // A reservation asked after the end (a late turn event) is not written.
        keeper.keep(
            3 + RESERVE_BLOCK,
            &SessionEvent::Agent { turn: 0, event: 3 },
        );
        let log = log.lock().clone();
        let ended = log
            .iter()
            .position(|(mark, _)| *mark == 2)
            .expect("an append lowering the mark to Ended's number");
        assert!(
            log[ended + 1..].iter().all(|(mark, _)| *mark == 0),
            "no mark after the end: {log:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_reservation_is_asked_again_and_turns_wait_for_it() {
        let (keeper, log, fail) = recorded();
        fail.store(true, Ordering::SeqCst);
        // A turn needs numbers past the durable mark: its reservation fails once...
        let waiting = tokio::spawn({
            let keeper = keeper.clone();
            async move { keeper.gate(RESERVE_BLOCK).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "no number is handed out unreserved");
        assert!(
            log.lock().len() < 10,
            "asked again after pauses, not in a loop: {}",
            log.lock().len()
        );
        // ...and is asked again, with the turn still waiting, until it is durable.
        fail.store(false, Ordering::SeqCst);
        keeper.keep(1, &SessionEvent::Agent { turn: 0, event: 1 });
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the turn goes on once the reservation is durable")
            .expect("the waiting task");
        assert!(
            log.lock()
                .iter()
                .filter(|(m, _)| *m > RESERVE_BLOCK)
                .count()
                >= 2
        );
    }

    #[test]
    fn a_replay_marks_every_gap_with_its_exact_count() {
        let codec = EventCodec::<u32>::json();
        let unwritten = vec![Sequenced {
            seq: 9,
            event: SessionEvent::Agent { turn: 1, event: 9 },
        }];
        let (out, bounds) = replay_from_store(
            &codec,
            kept(&codec, &[2, 3, 6]),
            unwritten,
            1,
            10,
            false,
            |_| true,
        );
        let shape: Vec<(u64, Option<u64>)> = out
            .iter()
            .map(|e| match e.event {
                SessionEvent::Lagged { missed } => (e.seq, Some(missed)),
                _ => (e.seq, None),
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (2, None),
                (3, None),
                (5, Some(2)),
                (6, None),
                (8, Some(2)),
                (9, None),
                (10, Some(1))
            ]
        );
        assert!(bounds.is_empty(), "no crash note: every count is exact");
    }

    /// S20a (2026-11-28): a crash note (a kept `Lagged`, numbered with the killed
    /// incarnation's reserved mark) is not an event: a gap that meets its numbers is
    /// reported as an upper bound, from the store or from the keeper's unwritten
    /// events, also when the gap is split across replay chunks, and a gap elsewhere
    /// stays exact.
    #[test]
    fn a_gap_over_a_crash_note_is_an_upper_bound_and_others_are_exact() {
        let codec = EventCodec::<u32>::json();
        let note = |seq: u64, missed: u64| {
            let mut body = Vec::new();
            (codec.encode)(&SessionEvent::Lagged { missed }, &mut body).unwrap();
            crate::store::KeptEvent {
                seq,
                at_ms: 0,
                body,
            }
        };
        // Kept 1..=5 and 8 (6, 7 lost to a failed append), a crash after 8 with the
        // mark at 40 (note), the next incarnation from 41.
        let mut store = kept(&codec, &[1, 2, 3, 4, 5, 8, 41, 42]);
        store.events.insert(6, note(40, 32));
        let shape = |(out, bounds): (Vec<Sequenced<u32>>, Vec<u64>)| -> Vec<(u64, u64, bool)> {
            out.iter()
                .filter_map(|e| match e.event {
                    SessionEvent::Lagged { missed } => {
                        Some((e.seq, missed, bounds.contains(&e.seq)))
                    }
                    _ => None,
                })
                .collect()
        };
        let all = replay_from_store(&codec, store.clone(), Vec::new(), 0, 42, false, |_| true);
        assert_eq!(
            all.0.iter().filter(|e| e.seq >= 9 && e.seq <= 40).count(),
            1,
            "the note is not replayed as an event, only the gap's Lagged: {:?}",
            all.0
        );
        assert_eq!(shape(all), vec![(7, 2, false), (40, 32, true)]);
        // The note still unwritten (the new incarnation's first page), and the replay
        // ending on it.
        let unwritten = vec![Sequenced {
            seq: 40,
            event: SessionEvent::Lagged { missed: 32 },
        }];
        let upto_note = KeptEvents {
            events: store.events[..6].to_vec(),
            ..Default::default()
        };
        let tail = replay_from_store(&codec, upto_note, unwritten, 5, 40, false, |_| true);
        assert_eq!(shape(tail), vec![(7, 2, false), (40, 32, true)]);
        // A chunk that ends at 8 and the next one that starts after it.
        let first = KeptEvents {
            events: store.events[..6].to_vec(),
            ..Default::default()
        };
        assert_eq!(
            shape(replay_from_store(
                &codec,
                first,
                Vec::new(),
                0,
                8,
                false,
                |_| true
            )),
            vec![(7, 2, false)]
        );
        let second = KeptEvents {
            events: store.events[6..].to_vec(),
            ..Default::default()
        };
        assert_eq!(
            shape(replay_from_store(
                &codec,
                second,
                Vec::new(),
                8,
                42,
                false,
                |_| true
            )),
            vec![(40, 32, true)]
        );
        // After the gap, nothing of it.
        assert_eq!(
            shape(replay_from_store(
                &codec,
                store,
                Vec::new(),
                40,
                42,
                false,
                |_| true
            )),
            vec![]
        );
    }

    /// The keeper keeps a crash note only when the killed incarnation left its mark
    /// above its last kept event, numbered with the mark, ahead of everything else.
    #[test]
    fn a_crash_note_is_kept_first_with_the_mark_as_its_number() {
        let keeper = Keeper::new(EventCodec::<u32>::json(), Retention::default());
        keeper.after_crash(300, 300);
        assert!(keeper.unwritten().is_empty(), "a graceful end: no note");
        keeper.after_crash(300, 1324);
        let notes = keeper.unwritten();
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].seq, 1324);
        assert!(matches!(
            notes[0].event,
            SessionEvent::Lagged { missed: 1024 }
        ));
    }

    /// The block reserved ahead follows the session's pace: a few events a group
    /// commit reserve [`MIN_BLOCK`] ahead, hundreds [`RESERVE_BLOCK`] at most; and at
    /// a steady pace a turn never waits for a reservation (the next one rides the
    /// next group commit, half a block ahead).
    #[test]
    fn the_block_reserved_ahead_follows_the_pace() {
        let keeper = Keeper::new(EventCodec::<u32>::json(), Retention::default());
        let waiting: Arc<parking_lot::Mutex<Option<Arc<dyn EventRider>>>> = Arc::default();
        let w = waiting.clone();
        keeper.start(
            Box::new(move |rider: Arc<dyn EventRider>, _wake| *w.lock() = Some(rider)),
            Box::new(|_, _| Box::pin(async { Ok(KeptEvents::default()) })),
            false,
            0,
        );
        // A group commit: the store takes what waits and answers.
        let commit = || {
            let rider = waiting.lock().take();
            if let Some((append, _, done)) = rider.and_then(|r| r.take()) {
                done.send(Ok(()));
                return append.reserved;
            }
            0
        };
        assert_eq!(commit(), MIN_BLOCK, "a new session reserves little");
        let durable = || keeper.durable.load(Ordering::Acquire);
        let mut seq = 0;
        let mut keep = |n: u64, steady: bool| {
            for _ in 0..n {
                seq += 1;
                keeper.keep(seq, &SessionEvent::Agent { turn: 0, event: 1 });
                if steady {
                    assert!(seq + SLACK <= durable(), "no wait at {seq}: {}", durable());
                }
            }
            seq
        };
        // Five events between two group commits: the mark stays within MIN_BLOCK.
        for _ in 0..100 {
            let seq = keep(5, true);
            commit();
            assert!(durable() <= seq + MIN_BLOCK, "tight: {seq} {}", durable());
        }
        // A hundred: the block grows with the pace (the first two such turns may wait
        // for a reservation: the mark written at the first one's end was asked at the
        // old pace), and then no event waits.
        for _ in 0..2 {
            keep(100, false);
            commit();
        }
        for _ in 0..20 {
            let seq = keep(100, true);
            commit();
            assert!(durable() <= seq + 2 * SLACK + 4 * 100);
        }
        // Hundreds: at most RESERVE_BLOCK.
        for _ in 0..5 {
            keep(400, false);
            commit();
        }
        assert_eq!(Keeper::<u32>::block(&keeper.state.lock()), RESERVE_BLOCK);
    }
}
