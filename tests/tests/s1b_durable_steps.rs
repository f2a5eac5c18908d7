//! S1b (issue 32): durable steps, through a real session on a store. A "crash" is the
//! store as it was at a moment (every write acknowledged by then) copied into a fresh
//! store, where a new session on the same id resumes the cut turn: what it replays,
//! runs again or reports unknown is what a process restarted after a SIGKILL at that
//! moment would do (the child-process crash test, with SIGKILLs, is `s1b_crash.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use agentloop::store::MemoryStore;
use agentloop::{
    turn::StepKey, turn::StepOutcome, Agent, AgentError, Durability, ExitReason, SafePoint,
    SessionEvent, SessionHandle, SessionSpec, StepPolicy, StopOptions, Turn, TurnCx, TurnOutcome,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};

use agentloop_tests::within;

/// An external service that counts its calls per key (a payment API that would
/// deduplicate by idempotency key).
#[derive(Default)]
struct Service {
    calls: Mutex<HashMap<String, u32>>,
}

impl Service {
    fn call(&self, key: &StepKey) -> String {
        let mut c = self.calls.lock();
        let n = c.entry(key.to_string()).or_default();
        *n += 1;
        format!("receipt {key} #{n}")
    }
    fn calls(&self, key: &str) -> u32 {
        self.calls.lock().get(key).copied().unwrap_or(0)
    }
    fn total(&self) -> u32 {
        self.calls.lock().values().sum()
    }
}

/// Where the agent stops to let the test take its "crash" snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Never.
    No,
    /// After step `n` returned.
    After(usize),
    /// Inside step `n`, after the service answered, before the step returns.
    Inside(usize),
}

/// One step of the agent's program, or a safe point (state: how many program moves
/// are done).
#[derive(Clone, Debug)]
enum Move {
    Step(&'static str, StepPolicy),
    SafePoint,
}

/// What each step gave the agent, by program position.
type Outcomes = Vec<(usize, StepOutcome<String>)>;

#[derive(Clone)]
struct Stepper {
    service: Arc<Service>,
    program: Vec<Move>,
    hold: Hold,
    /// Told when the agent holds.
    held: mpsc::UnboundedSender<()>,
    /// What each step gave the agent, by program position.
    outcomes: Arc<Mutex<Outcomes>>,
}

impl Stepper {
    fn new(
        service: Arc<Service>,
        program: Vec<Move>,
        hold: Hold,
    ) -> (Self, mpsc::UnboundedReceiver<()>) {
        let (held, rx) = mpsc::unbounded_channel();
        (
            Stepper {
                service,
                program,
                hold,
                held,
                outcomes: Arc::default(),
            },
            rx,
        )
    }
}

impl Agent for Stepper {
    type Item = u64;
    type Event = ();
    /// The program moves done at the last safe point.
    type State = usize;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<usize>, AgentError> {
        let start = turn.resume.unwrap_or(0);
        for (at, m) in self.program.iter().enumerate().skip(start) {
            match m {
                Move::SafePoint => cx.safe_point(SafePoint::AfterToolCalls, &(at + 1))?,
                Move::Step(name, policy) => {
                    let inside = self.hold == Hold::Inside(at);
                    let service = self.service.clone();
                    let held = self.held.clone();
                    let out = cx
                        .step_with(name, *policy, |key| async move {
                            let r = service.call(&key);
                            if inside {
                                let _ = held.send(());
                                std::future::pending::<()>().await;
                            }
                            r
                        })
                        .await?;
                    self.outcomes.lock().push((at, out));
                    if self.hold == Hold::After(at) {
                        let _ = self.held.send(());
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
        Ok(TurnOutcome::Completed)
    }
}

const ID: &str = "payer";

fn spec(durability: Durability) -> SessionSpec<u64> {
    SessionSpec::new(ID, "default")
        .persistent(true)
        .kind("stepper")
        .durability(durability)
}

async fn start(
    agent: Stepper,
    store: &Arc<MemoryStore<u64>>,
    durability: Durability,
) -> SessionHandle<u64, ()> {
    SessionHandle::spawn(spec(durability), Arc::new(agent), Some(store.clone()))
        .await
        .expect("spawn")
}

/// The store as it is now, as a restarted process would find it.
fn crash(store: &MemoryStore<u64>) -> Arc<MemoryStore<u64>> {
    let fresh = Arc::new(MemoryStore::new());
    if let Some(r) = store.get(ID) {
        fresh.insert(r);
    }
    fresh
}

fn steps(names: &[&'static str]) -> Vec<Move> {
    names
        .iter()
        .map(|n| Move::Step(n, StepPolicy::Retry))
        .collect()
}

fn key(turn: u64, occurrence: u32, name: &str) -> String {
    format!("{ID}/{turn}/{occurrence}/{name}")
}

/// Runs `program` to the hold, takes the crash snapshot, and resumes a second agent
/// with the same program (no hold) on it; returns the service, the resumed session's
/// step events and what the resumed agent's steps gave it.
async fn crash_and_resume(
    program: Vec<Move>,
    hold: Hold,
    durability: Durability,
) -> (
    Arc<Service>,
    Vec<SessionEvent<()>>,
    Vec<(usize, StepOutcome<String>)>,
) {
    let service = Arc::new(Service::default());
    let store = Arc::new(MemoryStore::new());
    let (first, mut held) = Stepper::new(service.clone(), program.clone(), hold);
    let h = start(first, &store, durability).await;
    h.push(1).await.expect("push");
    within("the agent to hold", held.recv()).await;
    let after_crash = crash(&store);
    let rec = after_crash.get(ID).expect("the record is stored");
    // A journal is only ever on record with its turn as the record's cut turn: the
    // restart resumes that very turn (same index, same items) and replays it.
    assert!(rec.is_mid_turn(), "the cut turn is on record: {rec:?}");
    assert_eq!(rec.interrupted_items, vec![1], "{rec:?}");
    assert_eq!(
        rec.journal.as_ref().map(|j| j.mark.turn),
        Some(0),
        "{rec:?}"
    );
    drop(h);
    let (second, _) = Stepper::new(service.clone(), program, Hold::No);
    let outcomes = second.outcomes.clone();
    let h = start(second, &after_crash, durability).await;
    let mut events = h.subscribe_with_backpressure(1024);
    h.stop(StopOptions::drain()).await.expect("stop");
    let events = within("the event stream to end", async move {
        let mut v = Vec::new();
        while let Some(e) = events.next().await {
            v.push(e);
        }
        v
    })
    .await;
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed, "{exit:?}");
    let steps = events
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                SessionEvent::StepStarted { .. } | SessionEvent::StepFinished { .. }
            )
        })
        .collect();
    let out = outcomes.lock().clone();
    (service, steps, out)
}

fn finished(events: &[SessionEvent<()>]) -> Vec<(u32, bool, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::StepFinished {
                key,
                replayed,
                unknown,
                ..
            } => Some((key.occurrence, *replayed, *unknown)),
            _ => None,
        })
        .collect()
}

/// S1b under `sync` and `turn`: a finished step's result is durable before `step`
/// returns, so after a crash the rerun gets it from the journal without calling the
/// service again, and runs the steps after it once.
#[tokio::test]
async fn s1b_finished_steps_are_replayed_after_a_crash_not_run_again() {
    for durability in [Durability::Sync, Durability::Turn] {
        let (service, events, outcomes) = crash_and_resume(
            steps(&["search", "charge", "mail"]),
            Hold::After(1),
            durability,
        )
        .await;
        for (occ, name) in [(0, "search"), (1, "charge"), (2, "mail")] {
            assert_eq!(
                service.calls(&key(0, occ, name)),
                1,
                "{durability:?}: `{name}` ran once"
            );
        }
        assert_eq!(service.total(), 3);
        assert_eq!(
            finished(&events),
            vec![(0, true, false), (1, true, false), (2, false, false)],
            "{durability:?}: two replayed, one run"
        );
        // The replayed results are the ones the first run journaled.
        assert_eq!(
            outcomes[1].1,
            StepOutcome::Done(format!("receipt {} #1", key(0, 1, "charge")))
        );
    }
}

/// S1b: a `Retry` step cut between its effect and its journal entry runs again with
/// the same key (the service deduplicates by it); a `NoRetry` one is not run again:
/// the agent gets `Unknown` with the key.
#[tokio::test]
async fn s1b_a_step_cut_mid_effect_reruns_with_its_key_or_is_unknown() {
    let (service, events, _) = crash_and_resume(
        steps(&["search", "charge"]),
        Hold::Inside(1),
        Durability::Sync,
    )
    .await;
    assert_eq!(
        service.calls(&key(0, 1, "charge")),
        2,
        "Retry: run again, same key"
    );
    // Nothing of a Retry step is on record before its result: the rerun starts it as
    // new, under the same key.
    assert!(events.iter().any(|e| matches!(e, SessionEvent::StepStarted { key: k, .. } if k.to_string() == key(0, 1, "charge"))));

    let program = vec![
        Move::Step("search", StepPolicy::Retry),
        Move::Step("charge", StepPolicy::NoRetry),
    ];
    let (service, events, outcomes) =
        crash_and_resume(program, Hold::Inside(1), Durability::Sync).await;
    assert_eq!(
        service.calls(&key(0, 1, "charge")),
        1,
        "NoRetry: never twice"
    );
    assert_eq!(finished(&events), vec![(0, true, false), (1, false, true)]);
    assert_eq!(
        outcomes[1].1,
        StepOutcome::Unknown {
            key: key(0, 1, "charge").parse().unwrap()
        }
    );
}

/// S1b: a safe point's state covers the steps before it (their entries go with its
/// write); the rerun resumes from the state and numbers its next step after them.
#[tokio::test]
async fn s1b_a_safe_point_covers_the_steps_before_it() {
    let program = vec![
        Move::Step("a", StepPolicy::Retry),
        Move::SafePoint,
        Move::Step("b", StepPolicy::Retry),
        Move::Step("c", StepPolicy::Retry),
    ];
    let (service, events, _) = crash_and_resume(program, Hold::After(2), Durability::Sync).await;
    assert_eq!(service.total(), 3, "every step once");
    // `a` is behind the state: not met again; `b` replayed; `c` runs.
    assert_eq!(finished(&events), vec![(1, true, false), (2, false, false)]);
}

/// S1b: a rerun that asks for another step at a journaled position diverges: the turn
/// fails with the typed error naming both steps, and the record is kept with its
/// journal for the code that wrote it.
#[tokio::test]
async fn s1b_a_renamed_step_diverges_and_the_record_is_kept() {
    let service = Arc::new(Service::default());
    let store = Arc::new(MemoryStore::new());
    let (first, mut held) = Stepper::new(
        service.clone(),
        steps(&["search", "charge"]),
        Hold::After(1),
    );
    let h = start(first, &store, Durability::Sync).await;
    h.push(1).await.unwrap();
    within("hold", held.recv()).await;
    let after = crash(&store);
    drop(h);
    let (second, _) = Stepper::new(service.clone(), steps(&["search", "refund"]), Hold::No);
    let h = start(second, &after, Durability::Sync).await;
    let exit = within("exit", h.wait()).await;
    match &exit.reason {
        ExitReason::Failed(e) => {
            assert!(e.contains("`refund`") && e.contains("`charge`"), "{e}");
        }
        other => panic!("expected a divergence failure, got {other:?}"),
    }
    assert_eq!(service.calls(&key(0, 1, "refund")), 0);
    let rec = after.get(ID).expect("the record is kept");
    let j = rec.journal.expect("with its journal");
    assert_eq!(
        j.entries
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>(),
        ["search", "charge"]
    );
}

/// S1b: a result over the turn's journal bound is refused with an error naming the
/// step; one that does not encode too; the turn fails.
#[tokio::test]
async fn s1b_a_result_over_the_bound_or_not_encodable_fails_the_turn() {
    struct Big(bool);
    impl Agent for Big {
        type Item = u64;
        type Event = ();
        type State = ();
        async fn run_turn(
            &self,
            _t: Turn<Self>,
            cx: TurnCx<Self>,
        ) -> Result<TurnOutcome<()>, AgentError> {
            if self.0 {
                let _: Vec<u8> = cx
                    .step("download", |_| async { vec![7u8; 2 << 20] })
                    .await?;
            } else {
                let _: Unencodable = cx.step("weird", |_| async { Unencodable }).await?;
            }
            Ok(TurnOutcome::Completed)
        }
    }
    #[derive(serde::Deserialize)]
    struct Unencodable;
    impl serde::Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no wire form"))
        }
    }
    for (big, needle) in [(true, "`download`"), (false, "`weird`")] {
        let store = Arc::new(MemoryStore::<u64>::new());
        let h = SessionHandle::spawn(
            SessionSpec::new("big", "default")
                .persistent(true)
                .durability(Durability::Sync),
            Arc::new(Big(big)),
            Some(store.clone()),
        )
        .await
        .unwrap();
        h.push(1).await.unwrap();
        let exit = within("exit", h.wait()).await;
        match &exit.reason {
            ExitReason::Failed(e) => assert!(e.contains(needle), "{e}"),
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(exit.interrupted_items, vec![1], "the item is kept");
    }
}

/// S1b with S2/S11: an Immediate stop during a `NoRetry` step leaves it unknown: the
/// final write keeps its journaled beginning with the cut turn, and the resumed turn
/// gets `Unknown`. A graceful stop honoured at the next step boundary keeps the
/// finished steps, which the resumed turn replays.
#[tokio::test]
async fn s1b_cancel_at_a_step_boundary_and_an_immediate_cancel_inside_a_step() {
    for durability in [Durability::Exit, Durability::Sync] {
        let service = Arc::new(Service::default());
        let store = Arc::new(MemoryStore::new());
        let program = vec![
            Move::Step("a", StepPolicy::Retry),
            Move::Step("b", StepPolicy::NoRetry),
        ];
        let (first, mut held) = Stepper::new(service.clone(), program.clone(), Hold::Inside(1));
        let h = start(first, &store, durability).await;
        h.push(1).await.unwrap();
        within("hold", held.recv()).await;
        h.stop(StopOptions::immediate()).await.unwrap();
        let exit = within("exit", h.wait()).await;
        assert!(matches!(exit.reason, ExitReason::Canceled(_)), "{exit:?}");
        let (second, _) = Stepper::new(service.clone(), program, Hold::No);
        let outcomes = second.outcomes.clone();
        let h = start(second, &store, durability).await;
        h.stop(StopOptions::drain()).await.unwrap();
        let exit = within("exit", h.wait()).await;
        assert_eq!(
            exit.reason,
            ExitReason::Completed,
            "{durability:?}: {exit:?}"
        );
        assert_eq!(
            service.calls(&key(0, 0, "a")),
            1,
            "{durability:?}: `a` replayed"
        );
        assert_eq!(
            service.calls(&key(0, 1, "b")),
            1,
            "{durability:?}: `b` not run again"
        );
        assert!(
            matches!(outcomes.lock()[1].1, StepOutcome::Unknown { .. }),
            "{durability:?}: {:?}",
            outcomes.lock()
        );
    }

    // A stop at safe points: the next step boundary honours it.
    let service = Arc::new(Service::default());
    let store = Arc::new(MemoryStore::new());
    let gate = Arc::new(Notify::new());
    struct Gated {
        service: Arc<Service>,
        gate: Arc<Notify>,
        held: mpsc::UnboundedSender<()>,
    }
    impl Agent for Gated {
        type Item = u64;
        type Event = ();
        type State = usize;
        async fn run_turn(
            &self,
            _t: Turn<Self>,
            cx: TurnCx<Self>,
        ) -> Result<TurnOutcome<usize>, AgentError> {
            let s = self.service.clone();
            cx.step("a", |k| async move { s.call(&k) }).await?;
            let _ = self.held.send(());
            self.gate.notified().await;
            let s = self.service.clone();
            cx.step("b", |k| async move { s.call(&k) }).await?;
            Ok(TurnOutcome::Completed)
        }
    }
    let (tx, mut held) = mpsc::unbounded_channel();
    let h = SessionHandle::spawn(
        spec(Durability::Exit),
        Arc::new(Gated {
            service: service.clone(),
            gate: gate.clone(),
            held: tx,
        }),
        Some(store.clone()),
    )
    .await
    .unwrap();
    h.push(1).await.unwrap();
    within("hold", held.recv()).await;
    h.stop(StopOptions::graceful()).await.unwrap();
    gate.notify_one();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Canceled(c) if c.at == Some(SafePoint::AfterToolCalls)),
        "{exit:?}"
    );
    assert_eq!(
        service.calls(&key(0, 1, "b")),
        0,
        "the boundary stopped `b` before it ran"
    );
    let rec = store.get(ID).expect("saved");
    assert_eq!(
        rec.journal.map(|j| j.entries.len()),
        Some(1),
        "`a` is journaled"
    );
}

/// S40 with S1b: steps that version 1 journaled in a cut turn are replayed only by
/// version 1. A runtime with version 2 alone and a migration that keeps them pinned
/// (the default) refuses the record, saying why and keeping it; one whose migration
/// discards them resumes the turn on version 2, which runs its steps afresh (the
/// service sees each a second time: the price of discarding, docs/operations.md).
#[tokio::test]
async fn s40_journaled_steps_stay_with_their_version_unless_a_migration_discards_them() {
    let service = Arc::new(Service::default());
    let store = Arc::new(MemoryStore::new());
    let program = steps(&["charge", "ship"]);
    let (first, mut held) = Stepper::new(service.clone(), program.clone(), Hold::After(1));
    let h = start(first, &store, Durability::Sync).await;
    h.push(1).await.expect("push");
    within("the agent to hold", held.recv()).await;
    let after_crash = crash(&store);
    drop(h);
    let rec = after_crash.get(ID).expect("stored");
    assert_eq!(rec.agent_version, 1);
    assert_eq!(
        rec.journal.as_ref().map(|j| j.entries.len()),
        Some(2),
        "{rec:?}"
    );
    let before = after_crash.get(ID);

    let (second, _) = Stepper::new(service.clone(), program, Hold::No);
    let deploy = |migration: agentloop::versions::Migration| {
        let agent = second.clone();
        agentloop::Runtime::<u64, ()>::builder()
            .store(after_crash.clone() as Arc<dyn agentloop::CheckpointStore<u64>>)
            .register_agent_version("stepper", 2, move |_: &[u8]| Ok(agent.clone()))
            .register_migration("stepper", 1, migration)
            .start()
    };
    let (rt, report) = deploy(agentloop::versions::Migration::new())
        .await
        .expect("start");
    assert!(report.resumed.is_empty(), "{report:?}");
    let why = &report.skipped[0].1;
    for part in [
        "could not be migrated from version 1 to 2",
        "holds 2 durable step(s) journaled by version 1",
        "Migration::discard_journal",
        "record is kept",
    ] {
        assert!(why.contains(part), "{part:?} missing from: {why}");
    }
    rt.shutdown().await.expect("shutdown");
    assert_eq!(
        after_crash.get(ID),
        before,
        "the refused record is kept as it was"
    );
    assert_eq!(service.total(), 2, "nothing ran");

    let (rt, report) = deploy(agentloop::versions::Migration::new().discard_journal())
        .await
        .expect("start");
    assert_eq!(report.resumed, vec![ID.to_string()], "{report:?}");
    within("the steps to run again on version 2", async {
        while service.calls(&key(0, 1, "ship")) < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        service.calls(&key(0, 0, "charge")),
        2,
        "run afresh, not replayed"
    );
    rt.shutdown().await.expect("shutdown");
    let rec = after_crash.get(ID).expect("kept for the next start");
    assert_eq!(rec.agent_version, 2, "{rec:?}");
    assert!(rec.journal.is_none(), "{rec:?}");
}
