//! Event streams across nodes (issue 18, S36): a subscriber on one node reads the
//! events of a session another node runs. The owner keeps a local subscription per
//! relay (`Relays`); the subscriber's node long-polls it ([`Request::NextEvents`],
//! at most [`RELAY_POLL`] per poll) and feeds what arrives into an ordinary
//! [`EventStream`] (`pump`). Polling, not pushing, keeps backpressure where it is
//! on one node: a subscriber that reads slowly stops the polls, and the owner's
//! subscription buffer (and its `Lagged` accounting) decides the rest.
//!
//! A relayed stream carries the owner's sequence numbers, ends with the owner's
//! `Ended`, and ends without it when the owner is lost (the subscriber resubscribes
//! after the last number it saw, S20). This file owns relays only: subscribing is the
//! supervisor's, the transport the forwarder's (the node's, `node.rs`, or the
//! in-process peers', `peers.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use agentloop::cluster::forward::{PushAnswer, Request, RELAY_POLL};
use agentloop::events::{
    EventFilter, EventStream, Sequenced, SessionEvent, DEFAULT_EVENT_CAPACITY,
};
use agentloop::runtime_handle::RuntimeHandle;
use agentloop::SupervisorError;

/// A relay nobody polled for this long is closed (its subscriber's node went away
/// without closing it).
pub const RELAY_IDLE: Duration = Duration::from_secs(30);

/// At most this many events per answer.
pub const BATCH: usize = 256;

struct Relay<E> {
    events: EventStream<E>,
    polled: Instant,
}

/// The relays this node serves: one local subscription per remote subscriber.
pub struct Relays<E> {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Relay<E>>>>>,
}

impl<E> Default for Relays<E> {
    fn default() -> Self {
        Relays {
            next: AtomicU64::new(1),
            open: Mutex::new(HashMap::new()),
        }
    }
}

impl<E> Relays<E>
where
    E: Clone + Send + Sync + Serialize + 'static,
{
    /// Opens a relay of `session`'s events (subscribed here, on the node that runs it).
    pub async fn open<I>(
        &self,
        handle: &RuntimeHandle<I, E>,
        session: &str,
        after: Option<u64>,
        filter: EventFilter,
    ) -> PushAnswer
    where
        I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    {
        self.close_idle();
        let subscribed = match after {
            Some(after) => {
                handle
                    .supervisor()
                    .subscribe_after(session, after, filter)
                    .await
            }
            None => handle.supervisor().subscribe(session, filter).await,
        };
        match subscribed {
            Ok(events) => {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                let relay = Relay {
                    events,
                    polled: Instant::now(),
                };
                self.open
                    .lock()
                    .insert(id, Arc::new(tokio::sync::Mutex::new(relay)));
                PushAnswer::Subscribed(id)
            }
            Err(SupervisorError::UnknownSession(_)) => PushAnswer::UnknownSession,
            Err(e) => PushAnswer::Refused(e.to_string()),
        }
    }

    /// The next events of relay `stream`: waits up to [`RELAY_POLL`] for the first,
    /// then takes what is ready (at most [`BATCH`]). Closes the relay after `Ended`.
    pub async fn next(&self, stream: u64) -> PushAnswer {
        let Some(relay) = self.open.lock().get(&stream).cloned() else {
            return PushAnswer::UnknownStream;
        };
        let mut relay = relay.lock().await;
        relay.polled = Instant::now();
        let mut events = Vec::new();
        let mut ended = false;
        let mut next = match tokio::time::timeout(RELAY_POLL, relay.events.next_sequenced()).await {
            Err(_) => None,
            Ok(None) => {
                ended = true;
                None
            }
            Ok(Some(s)) => Some(s),
        };
        while let Some(s) = next.take() {
            ended = matches!(s.event, SessionEvent::Ended(_));
            match serde_json::to_value(&s) {
                Ok(v) => events.push(v),
                Err(e) => tracing::warn!(
                    stream,
                    seq = s.seq,
                    error = %e,
                    "an event does not encode as JSON; the remote subscriber misses it"
                ),
            }
            if ended || events.len() >= BATCH {
                break;
            }
            match relay.events.next_sequenced().now_or_never() {
                Some(Some(s)) => next = Some(s),
                Some(None) => ended = true,
                None => {}
            }
        }
        relay.polled = Instant::now();
        drop(relay);
        if ended {
            self.close(stream);
        }
        PushAnswer::Events { events, ended }
    }

    /// Answers a subscriber node's poll or close of one of these relays; any other
    /// request is not a relay's.
    pub async fn answer(&self, request: Request) -> PushAnswer {
        match request {
            Request::NextEvents { stream } => self.next(stream).await,
            Request::CloseEvents { stream } => {
                self.close(stream);
                PushAnswer::Done
            }
            other => PushAnswer::Refused(format!("not a relay request: {other:?}")),
        }
    }

    /// Closes relay `stream` (unsubscribes).
    pub fn close(&self, stream: u64) {
        self.open.lock().remove(&stream);
    }

    /// Closes relays nobody polled for [`RELAY_IDLE`] (one being polled is busy, so
    /// alive): their subscriber's node went away without closing them, and an
    /// unread subscription would hold the session's events back once its buffer
    /// fills.
    pub fn close_idle(&self) {
        self.open.lock().retain(|stream, r| match r.try_lock() {
            Ok(r) if r.polled.elapsed() >= RELAY_IDLE => {
                tracing::warn!(
                    stream,
                    idle = ?r.polled.elapsed(),
                    "closing an event relay nobody polls (its subscriber's node went away); that subscriber misses the rest"
                );
                false
            }
            _ => true,
        });
    }

    /// Closes idle relays every half [`RELAY_IDLE`] until `self` is dropped (the node
    /// actor owns the only other reference). Only a cluster node sweeps.
    pub fn sweep_idle(self: &Arc<Self>) -> tokio::task::JoinHandle<()>
    where
        E: Send + 'static,
    {
        let relays = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELAY_IDLE / 2).await;
                match relays.upgrade() {
                    Some(r) => r.close_idle(),
                    None => return,
                }
            }
        })
    }

    /// How many relays are open (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open.lock().len()
    }
}

/// Sends one request to the owner and returns its answer (or why there is none).
pub type Ask = Arc<dyn Fn(Request) -> BoxFuture<'static, Result<PushAnswer, String>> + Send + Sync>;

/// The subscriber's side of relay `stream` at node `node`: a task that polls it and
/// feeds an [`EventStream`]; it closes the relay when the stream is dropped, and ends
/// the stream (without `Ended`) with a WARN when the owner cannot be reached.
pub fn pump<E>(node: String, stream: u64, ask: Ask) -> EventStream<E>
where
    E: DeserializeOwned + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Sequenced<E>>(DEFAULT_EVENT_CAPACITY);
    tokio::spawn(async move {
        loop {
            let answer = tokio::select! {
                a = ask(Request::NextEvents { stream }) => a,
                _ = tx.closed() => {
                    let _ = ask(Request::CloseEvents { stream }).await;
                    return;
                }
            };
            let (events, ended) = match answer {
                Ok(PushAnswer::Events { events, ended }) => (events, ended),
                Ok(PushAnswer::UnknownStream) => {
                    tracing::warn!(%node, stream, "the node running the session closed this event stream (unpolled too long); resubscribe after the last event number seen");
                    return;
                }
                Ok(other) => {
                    tracing::warn!(%node, stream, answer = ?other, "a mismatched answer to an event poll; the stream ends, resubscribe after the last event number seen");
                    let _ = ask(Request::CloseEvents { stream }).await;
                    return;
                }
                Err(error) => {
                    tracing::warn!(%node, stream, %error, "lost the node running the session; its event stream ends here, resubscribe after the last event number seen");
                    // Best effort: the owner may still hold the relay (a poll that
                    // timed out); otherwise it closes it once idle.
                    let _ = ask(Request::CloseEvents { stream }).await;
                    return;
                }
            };
            for v in events {
                match serde_json::from_value::<Sequenced<E>>(v) {
                    Ok(s) => {
                        if tx.send(s).await.is_err() {
                            let _ = ask(Request::CloseEvents { stream }).await;
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(%node, stream, error = %e, "an event from another node does not decode; the subscriber misses it")
                    }
                }
            }
            if ended {
                return;
            }
        }
    });
    EventStream::relayed(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentloop::exit::{CheckpointOutcome, ExitCounters, ExitReason, ExitSummary};

    fn started(seq: u64) -> Sequenced<u32> {
        Sequenced {
            seq,
            event: SessionEvent::TurnStarted {
                turn: seq,
                items: 1,
                resumed: false,
            },
        }
    }

    fn ended(seq: u64) -> Sequenced<u32> {
        Sequenced {
            seq,
            event: SessionEvent::Ended(ExitSummary {
                session_id: "s".into(),
                reason: ExitReason::Completed,
                failure: None,
                stop_cause: Some("done".into()),
                unhandled: 0,
                interrupted: 0,
                late: 0,
                checkpoint: CheckpointOutcome::Saved,
                counters: ExitCounters::default(),
            }),
        }
    }

    /// An owner-side relay fed by a channel instead of a session.
    fn relay_on(relays: &Relays<u32>) -> (u64, mpsc::Sender<Sequenced<u32>>) {
        let (tx, rx) = mpsc::channel(16);
        let id = relays.next.fetch_add(1, Ordering::Relaxed);
        let relay = Relay {
            events: EventStream::relayed(rx),
            polled: Instant::now(),
        };
        relays
            .open
            .lock()
            .insert(id, Arc::new(tokio::sync::Mutex::new(relay)));
        (id, tx)
    }

    fn decoded(answer: PushAnswer) -> (Vec<u64>, bool) {
        match answer {
            PushAnswer::Events { events, ended } => (
                events
                    .into_iter()
                    .map(|v| serde_json::from_value::<Sequenced<u32>>(v).unwrap().seq)
                    .collect(),
                ended,
            ),
            other => panic!("not events: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_takes_what_is_ready_and_the_relay_closes_after_ended() {
        let relays = Relays::<u32>::default();
        let (id, tx) = relay_on(&relays);
        for seq in 1..=3 {
            tx.send(started(seq)).await.unwrap();
        }
        assert_eq!(decoded(relays.next(id).await), (vec![1, 2, 3], false));
        // Nothing for RELAY_POLL: an empty answer, the relay stays open.
        assert_eq!(decoded(relays.next(id).await), (vec![], false));
        assert_eq!(relays.len(), 1);
        tx.send(started(4)).await.unwrap();
        tx.send(ended(5)).await.unwrap();
        assert_eq!(decoded(relays.next(id).await), (vec![4, 5], true));
        assert_eq!(relays.len(), 0, "closed after Ended");
        assert_eq!(relays.next(id).await, PushAnswer::UnknownStream);
    }

    #[tokio::test(start_paused = true)]
    async fn a_relay_nobody_polls_is_closed_and_a_polled_one_is_kept() {
        let relays = Relays::<u32>::default();
        let (idle, _tx1) = relay_on(&relays);
        let (busy, tx2) = relay_on(&relays);
        tokio::time::advance(RELAY_IDLE / 2).await;
        tx2.send(started(1)).await.unwrap();
        assert_eq!(decoded(relays.next(busy).await), (vec![1], false));
        tokio::time::advance(RELAY_IDLE / 2 + Duration::from_millis(1)).await;
        relays.close_idle();
        assert_eq!(relays.next(idle).await, PushAnswer::UnknownStream);
        assert_eq!(relays.len(), 1, "the polled relay stays");
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_closes_a_relay_whose_subscriber_went_away() {
        let relays = Arc::new(Relays::<u32>::default());
        let (id, _tx) = relay_on(&relays);
        let sweeper = relays.sweep_idle();
        tokio::time::sleep(RELAY_IDLE + RELAY_IDLE / 2 + Duration::from_millis(1)).await;
        assert_eq!(relays.next(id).await, PushAnswer::UnknownStream);
        // It stops once the relays are gone.
        drop(relays);
        tokio::time::sleep(RELAY_IDLE).await;
        assert!(sweeper.is_finished());
    }

    /// A fake owner: answers polls from a script, records every request.
    fn scripted(script: Vec<Result<PushAnswer, String>>) -> (Ask, Arc<Mutex<Vec<Request>>>) {
        let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
        let script = Arc::new(Mutex::new(std::collections::VecDeque::from(script)));
        let log = seen.clone();
        let ask: Ask = Arc::new(move |r: Request| {
            log.lock().push(r.clone());
            let next = match r {
                Request::NextEvents { .. } => script.lock().pop_front(),
                _ => Some(Ok(PushAnswer::Done)),
            };
            Box::pin(async move {
                match next {
                    Some(a) => a,
                    // Script exhausted: the owner has nothing more, ever.
                    None => std::future::pending().await,
                }
            })
        });
        (ask, seen)
    }

    fn events(seqs: &[Sequenced<u32>], ended: bool) -> Result<PushAnswer, String> {
        Ok(PushAnswer::Events {
            events: seqs
                .iter()
                .map(|s| serde_json::to_value(s).unwrap())
                .collect(),
            ended,
        })
    }

    #[tokio::test]
    async fn a_pumped_stream_yields_the_owners_events_in_order_then_ends_after_ended() {
        let (ask, seen) = scripted(vec![
            events(&[started(7), started(8)], false),
            events(&[], false),
            events(&[started(9), ended(10)], true),
        ]);
        let mut stream = pump::<u32>("n0".into(), 3, ask);
        let mut got = Vec::new();
        while let Some(s) = stream.next_sequenced().await {
            got.push(s);
        }
        assert_eq!(got, vec![started(7), started(8), started(9), ended(10)]);
        assert_eq!(
            seen.lock().len(),
            3,
            "no poll after Ended: {:?}",
            seen.lock()
        );
    }

    #[tokio::test]
    async fn a_lost_owner_ends_the_stream_without_ended() {
        let (ask, _) = scripted(vec![
            events(&[started(1)], false),
            Err("the connection to it failed".into()),
        ]);
        let mut stream = pump::<u32>("n0".into(), 1, ask);
        assert_eq!(stream.next_sequenced().await, Some(started(1)));
        assert_eq!(stream.next_sequenced().await, None);
    }

    #[tokio::test]
    async fn dropping_a_pumped_stream_closes_the_relay_at_the_owner() {
        let (ask, seen) = scripted(vec![events(&[started(1)], false)]);
        let mut stream = pump::<u32>("n0".into(), 5, ask);
        assert_eq!(stream.next_sequenced().await, Some(started(1)));
        drop(stream);
        for _ in 0..200 {
            if seen.lock().contains(&Request::CloseEvents { stream: 5 }) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the relay was not closed: {:?}", seen.lock());
    }
}
