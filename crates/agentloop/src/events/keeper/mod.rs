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
mod tests;
