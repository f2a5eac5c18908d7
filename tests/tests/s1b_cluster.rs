//! S1b with S38 (issue 32): durable steps across a planned move and a failover, on two
//! runtimes as cluster nodes sharing one store. A step's key names the session, the
//! turn, the occurrence and the step, not the node: the node that resumes the cut turn
//! replays what another node journaled, under the same keys, and runs the rest once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentloop::store::MemoryStore;
use agentloop::{
    store::SessionRecord, store::SessionStatus, turn::StepKey, Agent, AgentError, CheckpointStore,
    Runtime, SessionSpec, StopOptions, Turn, TurnCx, TurnOutcome,
};
use agentloop_core::steps::{JournalEntry, JournalMark, TurnJournal};
use agentloop_sim::{SimEvent, SimItem};
use agentloop_tests::item;
use parking_lot::Mutex;
use tokio::sync::Notify;

type Rt = Runtime<SimItem, SimEvent>;

const BEAT: Duration = Duration::from_millis(50);
const LEASE: Duration = Duration::from_millis(300);
const STEPS: [&str; 5] = ["quote", "reserve", "charge", "capture", "receipt"];

/// Counts calls per key and which node made each.
#[derive(Default)]
struct Service {
    calls: Mutex<HashMap<String, Vec<&'static str>>>,
}

impl Service {
    fn call(&self, node: &'static str, key: &StepKey) -> String {
        let mut c = self.calls.lock();
        let v = c.entry(key.to_string()).or_default();
        v.push(node);
        format!("done {key} #{}", v.len())
    }
}

/// Five durable steps per turn; after step `hold_after` (when set) it waits for
/// `release`, the first time any node's agent gets there.
struct Payer {
    node: &'static str,
    service: Arc<Service>,
    hold_after: Option<usize>,
    held: Arc<Notify>,
    release: Arc<Notify>,
    completed: Arc<Mutex<Vec<(&'static str, u64)>>>,
    /// Held already (shared by the nodes' agents).
    once: Arc<std::sync::atomic::AtomicBool>,
}

impl Agent for Payer {
    type Item = SimItem;
    type Event = SimEvent;
    type State = ();

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<()>, AgentError> {
        for (i, name) in STEPS.iter().enumerate() {
            let (service, node) = (self.service.clone(), self.node);
            let _: String = cx
                .step(name, |key| async move { service.call(node, &key) })
                .await?;
            if self.hold_after == Some(i)
                && !self.once.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                self.held.notify_one();
                self.release.notified().await;
            }
        }
        self.completed.lock().push((self.node, turn.index));
        Ok(TurnOutcome::Completed)
    }
}

struct Shared {
    service: Arc<Service>,
    held: Arc<Notify>,
    release: Arc<Notify>,
    completed: Arc<Mutex<Vec<(&'static str, u64)>>>,
    once: Arc<std::sync::atomic::AtomicBool>,
}

impl Shared {
    fn new() -> Self {
        Shared {
            service: Arc::default(),
            held: Arc::new(Notify::new()),
            release: Arc::new(Notify::new()),
            completed: Arc::default(),
            once: Arc::default(),
        }
    }
}

async fn node(
    name: &'static str,
    store: Arc<dyn CheckpointStore<SimItem>>,
    shared: &Shared,
    hold_after: Option<usize>,
) -> Rt {
    let (service, held, release, completed, once) = (
        shared.service.clone(),
        shared.held.clone(),
        shared.release.clone(),
        shared.completed.clone(),
        shared.once.clone(),
    );
    Rt::builder()
        .store(store)
        .heartbeat(BEAT, LEASE)
        .node(name)
        .register_agent("pay", move |_cfg: &[u8]| {
            Ok(Payer {
                node: name,
                service: service.clone(),
                hold_after,
                held: held.clone(),
                release: release.clone(),
                completed: completed.clone(),
                once: once.clone(),
            })
        })
        .start()
        .await
        .unwrap()
        .0
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Every step of turn 0 of `session` was called exactly once, under its key.
fn each_once(service: &Service, session: &str) -> HashMap<String, Vec<&'static str>> {
    let calls = service.calls.lock().clone();
    for (occ, name) in STEPS.iter().enumerate() {
        let key = format!("{session}/0/{occ}/{name}");
        assert_eq!(calls.get(&key).map(Vec::len), Some(1), "{key}: {calls:?}");
    }
    calls
}

/// S1b + S38: a planned move while a turn is between durable steps: the move's stop
/// is honoured at the next step boundary, the cut turn's journal moves with the
/// record, and the new owner replays the finished steps and runs the rest, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_survive_a_planned_move_each_run_once() {
    use agentloop_cluster::peers::connect_in_process;
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let shared = Shared::new();
    let a = node("a", store.clone(), &shared, Some(1)).await;
    let b = node("b", store.clone(), &shared, Some(1)).await;
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    a.supervisor()
        .spawn(SessionSpec::new("mover", "pay").persistent(true))
        .await
        .unwrap();
    a.supervisor().push("mover", item(1)).await.unwrap();
    shared.held.notified().await;
    // Two steps journaled on a; the move's stop lands at the next step boundary.
    let release = shared.release.clone();
    let opener = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.notify_one();
    });
    a.migrate("mover", "b", Duration::from_secs(2))
        .await
        .expect("the move");
    opener.await.unwrap();
    wait_until("the turn completed", || !shared.completed.lock().is_empty()).await;
    assert_eq!(
        shared.completed.lock().clone(),
        vec![("b", 0)],
        "it completed on b"
    );
    let calls = each_once(&shared.service, "mover");
    assert_eq!(calls["mover/0/0/quote"], vec!["a"]);
    assert_eq!(calls["mover/0/1/reserve"], vec!["a"]);
    assert_eq!(
        calls["mover/0/2/charge"],
        vec!["b"],
        "the rest ran on b: {calls:?}"
    );
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// S1b + S38: a node dies mid-turn after journaling two steps; after its lease
/// expires, the node placement names adopts the session, replays those two under the
/// same keys and runs the other three once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_survive_a_failover_each_run_once() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let shared = Shared::new();
    // What the dead node left: turn 0 cut after two durable steps.
    let mut r = SessionRecord::<SimItem>::new("orphan", "pay", 0);
    r.status = SessionStatus::Running;
    r.owner = Some("dead".into());
    r.interrupted_items = vec![item(1)];
    let entries = ["quote", "reserve"]
        .iter()
        .enumerate()
        .map(|(occ, name)| {
            let key = StepKey {
                session: "orphan".into(),
                turn: 0,
                occurrence: occ as u32,
                name: name.to_string(),
            };
            let result = shared.service.call("dead", &key);
            JournalEntry {
                occurrence: occ as u32,
                name: name.to_string(),
                result: Some(agentloop::store::codec::payload::encode_checked(&result).unwrap()),
            }
        })
        .collect();
    r.journal = Some(TurnJournal {
        mark: JournalMark {
            turn: 0,
            covered: 0,
        },
        entries,
    });
    store.save(r).await.unwrap();
    store
        .beat("dead", agentloop::store::now_ms())
        .await
        .unwrap();
    let a = node("a", store.clone(), &shared, None).await;
    let b = node("b", store.clone(), &shared, None).await;
    wait_until("the adopter completed the turn", || {
        !shared.completed.lock().is_empty()
    })
    .await;
    tokio::time::sleep(LEASE).await;
    let completed = shared.completed.lock().clone();
    assert_eq!(completed.len(), 1, "one adopter: {completed:?}");
    let adopter = completed[0].0;
    let calls = each_once(&shared.service, "orphan");
    assert_eq!(
        calls["orphan/0/0/quote"],
        vec!["dead"],
        "replayed, not re-run"
    );
    assert_eq!(calls["orphan/0/1/reserve"], vec!["dead"]);
    for name in ["charge", "capture", "receipt"] {
        let key = calls.keys().find(|k| k.ends_with(name)).unwrap();
        assert_eq!(calls[key], vec![adopter], "{key}");
    }
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}
