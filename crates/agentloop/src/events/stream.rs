//! The stream a subscriber reads ([`EventStream`]): its channel, then, when it lagged,
//! what the replay buffer still holds (after a `Lagged` marker for what it does not),
//! and `Ended` last from its terminal slot.

use super::slot::TerminalSlot;
use super::{Sequenced, SessionEvent};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// A subscriber's view of a session: its events in order, `Ended` last, then `None`.
///
/// Read it with [`EventStream::next`] or as a `futures::Stream`. Dropping it
/// unsubscribes; the session never waits on a dropped stream.
pub struct EventStream<E> {
    pub(super) rx: mpsc::Receiver<Sequenced<E>>,
    /// Where `Ended` waits for a local subscriber; `None` for a stream relayed from
    /// another node, whose `Ended` arrives in `rx` like any event.
    pub(super) slot: Option<Arc<TerminalSlot>>,
    pub(super) finished: bool,
    /// How this stream catches up after it lagged (`None`: a backpressure or relayed
    /// stream, which never lags here).
    pub(super) catch_up: Option<CatchUp<E>>,
    /// Events taken by the last catch-up, read before the channel.
    pub(super) pending: VecDeque<Sequenced<E>>,
    /// What a replay reads from the store before the rest (S20a): polled first, a
    /// page at a time.
    pub(super) backfill: Option<Backfill<E>>,
    /// The page the last backfill read, read before anything else.
    pub(super) backfilled: VecDeque<Sequenced<E>>,
    /// The numbers of the `Lagged` events in `backfilled` whose count is an upper
    /// bound (S20a: their numbers may include ones a crashed process reserved and
    /// never gave).
    pub(super) bounds: Vec<u64>,
    /// Whether the last `Lagged` returned counts an upper bound.
    pub(super) upper_bound: bool,
}

/// Takes what a lagging stream missed from the replay buffer and stops its lag; with
/// what to read from the store first (S20a) when the buffer no longer holds it all.
pub(super) type CatchUp<E> =
    Box<dyn Fn(&TerminalSlot) -> (Vec<Sequenced<E>>, Option<Backfill<E>>) + Send + Sync>;

/// What a stream reads from the store before the rest (S20a): one page of events, and
/// the read of the next page when there is more (issue 52: a replay from the start of
/// a session that keeps a million events holds one page in memory, not the million).
pub(crate) type Backfill<E> = futures::future::BoxFuture<'static, Replayed<E>>;

/// One page of a replay from the store.
pub(crate) struct Replayed<E> {
    /// Its events, in order.
    pub(crate) events: Vec<Sequenced<E>>,
    /// The numbers of its `Lagged` events whose count is an upper bound.
    pub(crate) bounds: Vec<u64>,
    /// The read of the next page, when there is more.
    pub(crate) next: Option<BackfillNext<E>>,
}

/// The read of a replay's next page.
pub(crate) struct BackfillNext<E>(pub(crate) Backfill<E>);

impl<E> EventStream<E> {
    /// A stream fed by a relay of another node's stream (issue 18): its events in
    /// order, `Ended` last, then `None`. When the relay closes the channel without
    /// `Ended` (the owner was lost), the stream ends there: resubscribe after the last
    /// number seen. The routers that carry events across nodes (the `agentloop-cluster`
    /// crate's relays) build it; a program has no use for it.
    #[doc(hidden)]
    pub fn relayed(rx: mpsc::Receiver<Sequenced<E>>) -> Self {
        EventStream {
            rx,
            slot: None,
            finished: false,
            catch_up: None,
            pending: VecDeque::new(),
            backfill: None,
            backfilled: VecDeque::new(),
            bounds: Vec::new(),
            upper_bound: false,
        }
    }

    /// A stream of `events` only (kept events of a session that ended), then `None`.
    pub(crate) fn of(events: Vec<Sequenced<E>>) -> Self {
        let (tx, rx) = mpsc::channel(events.len().max(1));
        for e in events {
            // Sized to hold them all.
            let _ = tx.try_send(e);
        }
        EventStream::relayed(rx)
    }

    /// A stream of what `backfill` reads from the store, page by page, then `None`
    /// (the kept events of a session that ended, S20a).
    pub(crate) fn from_store(backfill: Backfill<E>) -> Self {
        let (_, rx) = mpsc::channel(1);
        let mut stream = EventStream::relayed(rx);
        stream.backfill = Some(backfill);
        stream
    }

    /// The next event, or `None` once `Ended` was returned.
    pub async fn next(&mut self) -> Option<SessionEvent<E>> {
        self.next_sequenced().await.map(|s| s.event)
    }

    /// The next event with its sequence number, or `None` once `Ended` was returned.
    pub async fn next_sequenced(&mut self) -> Option<Sequenced<E>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// Whether the last [`SessionEvent::Lagged`] this stream returned counts an upper
    /// bound (S20a): some of its `missed` numbers may never have been given to an
    /// event (a process crashed holding numbers it had reserved ahead; the numbers it
    /// gave and did not write are among them, and nothing durable says how many), so
    /// at most `missed` events were lost. `false`: exactly `missed` events were lost.
    /// A stream relayed from another node does not know and says `true`.
    pub fn lagged_upper_bound(&self) -> bool {
        self.upper_bound
    }

    pub(super) fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Sequenced<E>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        // A replay from the store comes first, a page at a time: the next page is read
        // once this one is taken.
        loop {
            if let Some(ev) = self.backfilled.pop_front() {
                if let SessionEvent::Lagged { .. } = ev.event {
                    self.upper_bound = match self.bounds.iter().position(|b| *b == ev.seq) {
                        Some(i) => {
                            self.bounds.swap_remove(i);
                            true
                        }
                        None => false,
                    };
                }
                return Poll::Ready(Some(ev));
            }
            if let Some(backfill) = self.backfill.as_mut() {
                match backfill.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(page) => {
                        self.backfill = page.next.map(|n| n.0);
                        self.backfilled.extend(page.events);
                        self.bounds.extend(page.bounds);
                    }
                }
                continue;
            }
            let polled = self.poll_local(cx);
            if self.backfill.is_some() {
                // A catch-up reads the store first.
                continue;
            }
            if let Poll::Ready(Some(Sequenced {
                event: SessionEvent::Lagged { .. },
                ..
            })) = &polled
            {
                // Counted from the replay buffer: exact. Relayed from another node:
                // not known here.
                self.upper_bound = self.slot.is_none();
            }
            return polled;
        }
    }

    /// [`EventStream::poll_event`] past the replay from the store: the channel, what a
    /// catch-up took from the replay buffer, and `Ended` from the slot.
    fn poll_local(&mut self, cx: &mut Context<'_>) -> Poll<Option<Sequenced<E>>> {
        // Fields borrowed apart: no Arc clone on this path (every event polls it).
        let Some(slot) = self.slot.as_ref() else {
            return match self.rx.poll_recv(cx) {
                Poll::Ready(Some(ev)) => {
                    self.finished = matches!(
                        ev.event,
                        SessionEvent::Ended(_) | SessionEvent::Restarting { .. }
                    );
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
                let (events, backfill) = catch_up(slot);
                self.pending.extend(events);
                if let Some(backfill) = backfill {
                    // What the buffer no longer holds comes from the store first
                    // (`poll_event` polls it next).
                    self.backfill = Some(backfill);
                    return Poll::Pending;
                }
                if let Some(ev) = self.pending.pop_front() {
                    return Poll::Ready(Some(ev));
                }
            }
        }
        // Register the waker before checking the slot so a concurrent `set` (or the last
        // in-flight final event) is not missed.
        slot.waker.register(cx.waker());
        if let Some((seq, last)) = slot.get() {
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
                event: last.event(),
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
