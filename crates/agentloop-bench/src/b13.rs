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
use agentloop::{
    events::EventCodec, store::CheckpointActor, store::CheckpointClient, Agent, AgentError,
    CheckpointStore, Durability, EventStream, SessionEvent, SessionHandle, SessionSpec,
    StopOptions, Turn, TurnCx, TurnOutcome,
};

use crate::report::{print_table, ratio_line_max, summarize};
use crate::tempdir::TempDir;

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
    let dir = TempDir::new("b13", "store");
    let client: CheckpointClient<u64> = CheckpointActor::spawn(dir.path())
        .await
        .expect("starting the B13 checkpoint actor");
    let store: Arc<dyn CheckpointStore<u64>> = Arc::new(client.clone());
    let mut kept = session("b13-kept", &store, true).await;
    let mut plain = session("b13-plain", &store, false).await;
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for round in 0..=ROUNDS {
        let item = round as u64;
        let (a, b) = match round % 2 {
            0 => {
                let a = turn(&mut kept, item).await;
                (a, turn(&mut plain, item).await)
            }
            _ => {
                let b = turn(&mut plain, item).await;
                (turn(&mut kept, item).await, b)
            }
        };
        if round > 0 {
            ours.push(a.as_secs_f64() * 1e3);
            theirs.push(b.as_secs_f64() * 1e3);
        }
    }
    let kept_events = store
        .read_events("b13-kept", 0, usize::MAX)
        .await
        .expect("reading the kept events");
    for (h, _) in [kept, plain] {
        h.stop(StopOptions::bare()).await.expect("stop");
        h.wait().await;
    }
    let _ = client.close().await;
    let (a, b) = (summarize(&ours), summarize(&theirs));
    print_table(
        "B13: ms per turn (push to TurnEnded)",
        "ms",
        &[("events not kept", b), ("events kept", a)],
    );
    println!(
        "events kept in the store at the end: {} (numbers {}..={}; retention 10 000)",
        kept_events.events.len(),
        kept_events.events.first().map_or(0, |e| e.seq),
        kept_events.last
    );
    println!("{}", ratio_line_max("B13", a.median / b.median, TARGET));
}
