//! B13: a turn emitting 100 agent events under `sync` in a session that keeps its
//! events in the store (S20a), against the same turn in a session that does not, in
//! the same run on the same store (DESIGN §10; issue 33). Target: ratio ≤ 1.2.
//!
//! Setup: one `CheckpointActor` on sled (a temp dir) and two persistent `sync`
//! sessions on it running the same agent: each turn emits 100 events (a short token,
//! as a model streaming its answer would) and ends. One session keeps its events
//! (`SessionSpec::keep_events`, JSON), the other does not. Each session has one live
//! subscriber (a chat UI following it). A round times, on each session, one turn from
//! the push (acknowledged once durable, `sync`) to its `TurnEnded` (sent once the turn
//! end's write is flushed) at the subscriber, alternating which session goes first; a
//! warm-up round is discarded. The figure is the ratio of the medians.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::event_log::Retention;
use agentloop::store::Engine;
use agentloop::{
    events::EventCodec, Agent, AgentError, CheckpointStore, Durability, EventStream, SessionEvent,
    SessionHandle, SessionSpec, StopOptions, Turn, TurnCx, TurnOutcome,
};

use crate::harness::{in_turn, ms, stop_and_wait, Paired, TempStore};
use crate::report::ratio_line_max;

/// Timed rounds (after one warm-up round).
const ROUNDS: usize = 200;
/// Agent events per turn.
const EVENTS: usize = 100;
/// The target: keeping / not keeping ≤ 1.2.
const TARGET: f64 = 1.2;

/// An agent whose every turn emits `EVENTS` tokens.
struct Streamer;

impl Agent for Streamer {
    type Item = u64;
    type Event = String;
    type State = ();

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        for i in 0..EVENTS {
            cx.emit(format!("token {i} of turn {}", turn.index)).await;
        }
        Ok(TurnOutcome::Completed)
    }
}

type Session = (SessionHandle<u64, String>, EventStream<String>);

async fn session(id: &str, store: &Arc<dyn CheckpointStore<u64>>, keep: bool) -> Session {
    let mut spec = SessionSpec::new(id, "default")
        .persistent(true)
        .kind("streamer")
        .durability(Durability::Sync)
        .replay(256);
    if keep {
        spec = spec
            .keep_events(Retention::default())
            .event_codec(EventCodec::<String>::json());
    }
    let h = SessionHandle::spawn(spec, Arc::new(Streamer), Some(store.clone()))
        .await
        .expect("spawning a B13 session");
    let events = h.subscribe_with_capacity(4 * EVENTS);
    (h, events)
}

/// One turn: push, then read the subscriber's events until `TurnEnded`.
async fn turn(s: &mut Session, item: u64) -> Duration {
    let t0 = Instant::now();
    s.0.push(item).await.expect("a B13 push");
    loop {
        match s.1.next().await {
            Some(SessionEvent::TurnEnded { durable, .. }) => {
                assert!(durable, "a sync turn end is durable");
                return t0.elapsed();
            }
            Some(_) => {}
            None => panic!("a B13 session ended"),
        }
    }
}

/// Runs B13 and prints its table and verdict.
pub async fn run() {
    println!(
        "B13: a turn emitting {EVENTS} agent events under sync, push to TurnEnded at a live \
         subscriber, in a session keeping its events in the store vs one that does not; \
         {ROUNDS} interleaved rounds after a warm-up; sled"
    );
    let temp = TempStore::<u64>::open("b13", Engine::SLED).await;
    let store = &temp.store;
    let mut kept = session("b13-kept", store, true).await;
    let mut plain = session("b13-plain", store, false).await;
    // The session that does not keep its events is the baseline.
    let mut s = Paired::default();
    for round in 0..=ROUNDS {
        let item = round as u64;
        let (a, b) = in_turn(round, turn(&mut kept, item), turn(&mut plain, item)).await;
        s.record(round, ms(b), ms(a));
    }
    let kept_events = store
        .read_events("b13-kept", 0, usize::MAX)
        .await
        .expect("reading the kept events");
    for (h, _) in [kept, plain] {
        stop_and_wait(&h, StopOptions::bare(), "stop").await;
    }
    let _ = temp.client.close().await;
    let ratio = s.table(
        "B13: ms per turn (push to TurnEnded)",
        "ms",
        "events not kept",
        "events kept",
    );
    println!(
        "events kept in the store at the end: {} (numbers {}..={}; retention 10 000)",
        kept_events.events.len(),
        kept_events.events.first().map_or(0, |e| e.seq),
        kept_events.last
    );
    println!("{}", ratio_line_max("B13", ratio, TARGET));
}
