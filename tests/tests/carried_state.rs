//! The state a session carries between turns (`TurnOutcome::CompletedWith`,
//! `Turn::state`; docs/semantics.md "Carried state"): the next turn gets it, in memory
//! and from the record under every durability; a stop keeps it and a later spawn goes
//! on from it; a turn cut before its first safe point resumes with it; a sleep and a
//! wake keep it; `Completed` leaves it as it was; a state that cannot be stored fails
//! its turn and the record keeps the one before.

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    Agent, AgentError, CheckpointStore, Durability, ExitReason, MemoryStore, Runtime,
    SessionHandle, SessionSpec, StopOptions, Turn, TurnCx, TurnOutcome,
};
use agentloop_sim::{SimEvent, SimItem};
use agentloop_tests::*;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// What the counter carries: how many items it saw. `poison` makes it refuse to be
/// encoded (a state that cannot be stored).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
struct Count {
    n: u64,
    #[serde(default)]
    poison: bool,
}

impl Serialize for Count {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeStruct};
        if self.poison {
            return Err(S::Error::custom("this count refuses to be stored"));
        }
        let mut st = s.serialize_struct("Count", 1)?;
        st.serialize_field("n", &self.n)?;
        st.end()
    }
}

/// What one turn saw: its items, and the states it was given.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    items: Vec<u64>,
    state: Option<u64>,
    resume: Option<u64>,
}

/// Counts items across turns through the carried state. Item 900 completes with plain
/// `Completed` (the carried state stays), 666 with a state that cannot be stored, 500
/// holds the turn until `release` (no safe point before).
struct Counter {
    seen: mpsc::UnboundedSender<Seen>,
    release: Option<Arc<tokio::sync::Notify>>,
}

impl Agent for Counter {
    type Item = SimItem;
    type Event = SimEvent;
    type State = Count;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<Count>, AgentError> {
        let items: Vec<u64> = turn.items.iter().map(|i| i.id).collect();
        let _ = self.seen.send(Seen {
            items: items.clone(),
            state: turn.state.as_ref().map(|c| c.n),
            resume: turn.resume.as_ref().map(|c| c.n),
        });
        if items.contains(&500) {
            if let Some(r) = &self.release {
                r.notified().await;
            }
        }
        if items.contains(&900) {
            return Ok(TurnOutcome::Completed);
        }
        let before = turn.resume.or(turn.state).map_or(0, |c| c.n);
        Ok(TurnOutcome::CompletedWith {
            state: Count {
                n: before + items.len() as u64,
                poison: items.contains(&666),
            },
        })
    }
}

fn counter() -> (Arc<Counter>, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Arc::new(Counter {
            seen: tx,
            release: None,
        }),
        rx,
    )
}

fn spec(id: &str, durability: Durability) -> SessionSpec<SimItem> {
    SessionSpec::new(id, "counter")
        .persistent(true)
        .durability(durability)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    within("the next turn", rx.recv())
        .await
        .expect("the agent is alive")
}

/// A count as a record stores it.
fn encoded(n: u64) -> Vec<u8> {
    agentloop::store::codec::encode_state("k", &Count { n, poison: false }).expect("encodes")
}

fn seen(items: &[u64], state: Option<u64>) -> Seen {
    Seen {
        items: items.to_vec(),
        state,
        resume: None,
    }
}

/// The next turn gets what the last one carried; a stop keeps it in the record (marked
/// carried, not a cut turn's) and a session spawned again on it goes on from it; under
/// `sync`, `turn` and `exit` alike.
#[tokio::test(start_paused = true)]
async fn a_carried_state_reaches_the_next_turn_and_outlives_a_stop() {
    for durability in [Durability::Sync, Durability::Turn, Durability::Exit] {
        let store = Arc::new(MemoryStore::<SimItem>::new());
        let dyn_store = || Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>);
        let (agent, mut rx) = counter();
        let h = SessionHandle::spawn(spec("c", durability), agent, dyn_store())
            .await
            .expect("spawn");
        h.push(item(1)).await.expect("push");
        assert_eq!(next(&mut rx).await, seen(&[1], None), "{durability:?}");
        h.push(item(2)).await.expect("push");
        assert_eq!(next(&mut rx).await, seen(&[2], Some(1)), "{durability:?}");
        h.push(item(3)).await.expect("push");
        assert_eq!(next(&mut rx).await, seen(&[3], Some(2)), "{durability:?}");
        h.stop(StopOptions::drain()).await.expect("stop");
        let exit = within("exit", h.wait()).await;
        assert_eq!(exit.reason, ExitReason::Completed, "{durability:?}");
        assert!(!exit.has_mid_turn_state, "a carried state is no cut turn's");
        let rec = store.get("c").expect("a stop keeps the carried state");
        assert!(rec.state_carried && rec.state.is_some(), "{durability:?}");
        assert!(!rec.is_mid_turn(), "{durability:?}");

        let (agent, mut rx) = counter();
        let h = SessionHandle::spawn(spec("c", durability), agent, dyn_store())
            .await
            .expect("spawned again on the record");
        h.push(item(4)).await.expect("push");
        assert_eq!(
            next(&mut rx).await,
            seen(&[4], Some(3)),
            "no resume turn, and the count goes on ({durability:?})"
        );
        h.stop(StopOptions::drain()).await.expect("stop");
        within("exit", h.wait()).await;
    }
}

/// `Completed` leaves the carried state as it was; a session that does not persist
/// carries it in memory.
#[tokio::test(start_paused = true)]
async fn completed_keeps_the_carried_state_and_memory_sessions_carry_too() {
    let (agent, mut rx) = counter();
    let h = SessionHandle::spawn(SessionSpec::new("m", "counter"), agent, None)
        .await
        .expect("spawn");
    h.push(item(1)).await.expect("push");
    assert_eq!(next(&mut rx).await, seen(&[1], None));
    h.push(item(900)).await.expect("push");
    assert_eq!(next(&mut rx).await, seen(&[900], Some(1)));
    h.push(item(2)).await.expect("push");
    assert_eq!(
        next(&mut rx).await,
        seen(&[2], Some(1)),
        "the plain Completed changed nothing"
    );
    h.stop(StopOptions::drain()).await.expect("stop");
    within("exit", h.wait()).await;
}

/// A turn cut before its first safe point (the process dies while it runs) resumes
/// from the record with its items and the carried state it started from.
#[tokio::test(start_paused = true)]
async fn a_turn_cut_before_its_first_safe_point_resumes_with_the_carried_state() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let agent = Arc::new(Counter {
        seen: tx,
        release: Some(Arc::new(tokio::sync::Notify::new())),
    });
    let h = SessionHandle::spawn(
        spec("k", Durability::Sync),
        agent,
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("spawn");
    h.push(item(1)).await.expect("push");
    assert_eq!(next(&mut rx).await, seen(&[1], None));
    h.push(item(500)).await.expect("push");
    assert_eq!(next(&mut rx).await, seen(&[500], Some(1)));
    // A push while the turn runs: its write (`sync`) records the running turn as the
    // record's cut turn.
    h.push(item(601)).await.expect("push");
    // The crash: what the store holds while the turn runs.
    let rec = store.get("k").expect("the record");
    assert_eq!(
        ids(&rec.interrupted_items),
        vec![500],
        "the running turn is on record"
    );
    assert_eq!(ids(&rec.unhandled_items), vec![601]);
    assert!(rec.state_carried, "with the state it started from");
    assert_eq!(rec.state, Some(encoded(1)), "the carried count, 1");
    let after = Arc::new(MemoryStore::<SimItem>::new());
    after.insert(rec);
    drop(h);
    let (agent, mut rx) = counter();
    let h = SessionHandle::spawn(
        spec("k", Durability::Sync),
        agent,
        Some(after.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("resume");
    assert_eq!(
        next(&mut rx).await,
        seen(&[500], Some(1)),
        "the resume turn: its items, no state of its own, the carried one"
    );
    assert_eq!(next(&mut rx).await, seen(&[601], Some(2)));
    h.stop(StopOptions::drain()).await.expect("stop");
    within("exit", h.wait()).await;
}

/// A state that cannot be stored fails its turn (the session ends `Failed`); the record
/// keeps the state carried before, and a session spawned on it goes on from that.
#[tokio::test(start_paused = true)]
async fn a_carried_state_that_cannot_be_stored_fails_the_turn_and_loses_nothing() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let dyn_store = || Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>);
    let (agent, mut rx) = counter();
    let h = SessionHandle::spawn(spec("p", Durability::Sync), agent, dyn_store())
        .await
        .expect("spawn");
    h.push(item(1)).await.expect("push");
    assert_eq!(next(&mut rx).await, seen(&[1], None));
    h.push(item(666)).await.expect("push");
    assert_eq!(next(&mut rx).await, seen(&[666], Some(1)));
    let exit = within("exit", h.wait()).await;
    match &exit.reason {
        ExitReason::Failed(why) => assert!(why.contains("cannot be stored"), "{why}"),
        r => panic!("expected Failed, got {r:?}"),
    }
    let rec = store.get("p").expect("the record stays");
    assert!(rec.state_carried, "the state carried before is kept");
    let (agent, mut rx) = counter();
    let h = SessionHandle::spawn(spec("p", Durability::Sync), agent, dyn_store())
        .await
        .expect("spawned again on the record");
    assert_eq!(
        next(&mut rx).await,
        Seen {
            items: vec![666],
            state: Some(1),
            resume: None,
        },
        "the failed turn runs again from the state carried before"
    );
    h.stop(StopOptions::bare()).await.expect("stop");
    within("exit", h.wait()).await;
}

/// A session that sleeps keeps what it carries: the push that wakes it runs a turn
/// that gets it.
#[tokio::test(start_paused = true)]
async fn a_sleeping_session_wakes_with_its_carried_state() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (tx, mut rx) = mpsc::unbounded_channel::<Seen>();
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .flush_logs(None)
        .idle_after(Duration::from_secs(5))
        .register_agent("counter", move |_cfg: &[u8]| {
            Ok(Counter {
                seen: tx.clone(),
                release: None,
            })
        })
        .start()
        .await
        .expect("the runtime starts");
    rt.supervisor()
        .spawn(spec("s", Durability::Sync))
        .await
        .expect("spawn");
    rt.supervisor().push("s", item(1)).await.expect("push");
    assert_eq!(next(&mut rx).await, seen(&[1], None));
    within("the session to sleep", async {
        while rt.supervisor().counts().await.sleeping != 1 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    let rec = store.get("s").expect("the record");
    assert!(rec.state_carried, "the sleep write keeps the carried state");
    rt.supervisor().push("s", item(2)).await.expect("push");
    assert_eq!(next(&mut rx).await, seen(&[2], Some(1)), "woken with it");
    rt.shutdown().await.expect("shutdown");
}
