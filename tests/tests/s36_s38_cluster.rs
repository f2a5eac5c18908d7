//! Cluster nodes sharing one store (issue 18, S36–S38), in one process: two runtimes
//! as nodes on one shared store. A dead node's sessions are adopted by the live node
//! placement names, each by exactly one; a node that stops beating (paused past its
//! lease) is fenced: its session's next write is refused, the session stops, and the
//! record stays the adopter's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agentloop::cluster::placement;
use agentloop::store::history::{HistoryAnswer, HistoryQuery};
use agentloop::store::{MemoryStore, RecordWrite, Stored, StoredEntry};
use agentloop::{
    store::CasOutcome, store::SessionRecord, store::SessionStatus, store::StatusKind,
    CheckpointStore, Runtime, SessionSpec, StopOptions, StoreError,
};
use agentloop_sim::{Gate, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use futures::future::BoxFuture;
use parking_lot::Mutex;

type Rt = Runtime<SimItem, SimEvent>;

const BEAT: Duration = Duration::from_millis(50);
const LEASE: Duration = Duration::from_millis(300);

/// Which node ran a turn holding which item ids.
type Turns = Arc<Mutex<Vec<(&'static str, Vec<u64>)>>>;

async fn node(
    name: &'static str,
    store: Arc<dyn CheckpointStore<SimItem>>,
    turns: Turns,
    gate: Option<Gate>,
) -> Rt {
    let (rt, _report) = Rt::builder()
        .store(store)
        .heartbeat(BEAT, LEASE)
        .node(name)
        .register_agent("sim", move |_cfg: &[u8]| {
            let t = turns.clone();
            let agent = SimAgent::new(steps(1)).with_turn_hook(Arc::new(move |_turn, ids| {
                t.lock().push((name, ids.to_vec()))
            }));
            Ok(match &gate {
                Some(g) => agent.with_step_gate(g.clone()),
                None => agent,
            })
        })
        .start()
        .await
        .unwrap();
    rt
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..400 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// S38: a dead node's `Running` sessions (each with work waiting) are resumed by the
/// live nodes after its lease expires, each by the node placement names and by no
/// other; every record then names its adopter at a later lease epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_sessions_are_adopted_by_placement_each_once() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let n = 24u64;
    for i in 0..n {
        let mut r = SessionRecord::<SimItem>::new(format!("s{i}"), "sim", 0);
        r.status = SessionStatus::Running;
        r.owner = Some("dead".into());
        r.unhandled_items = vec![item(i)];
        store.save(r).await.unwrap();
    }
    // The dead node beat just now: at the start of a and b it is still live.
    store
        .beat("dead", agentloop::store::now_ms())
        .await
        .unwrap();
    let turns: Turns = Arc::default();
    let a = node("a", store.clone(), turns.clone(), None).await;
    let b = node("b", store.clone(), turns.clone(), None).await;
    assert!(
        turns.lock().is_empty(),
        "nothing adopted while its owner is live"
    );
    wait_until("every session ran its item", || {
        turns.lock().len() as u64 >= n
    })
    .await;
    // A little longer: nothing runs twice.
    tokio::time::sleep(LEASE).await;
    let ran = turns.lock().clone();
    assert_eq!(ran.len() as u64, n, "each item delivered once: {ran:?}");
    let by_item: HashMap<u64, &str> = ran.iter().map(|(node, ids)| (ids[0], *node)).collect();
    let live = ["a".to_string(), "b".to_string()];
    for i in 0..n {
        let id = format!("s{i}");
        let expected = placement::owner_of(&live, &id).unwrap();
        assert_eq!(
            by_item.get(&i).copied(),
            Some(expected),
            "{id} ran where placement said"
        );
        // The record is gone (a clean exit) or names its adopter at a later epoch.
        if let Some(r) = store.get(&id) {
            assert_eq!(r.owner.as_deref(), Some(expected), "{id}");
            assert!(r.lease_epoch >= 1, "{id}: {}", r.lease_epoch);
        }
    }
    assert!(by_item.values().any(|n| *n == "a") && by_item.values().any(|n| *n == "b"));
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// A store whose heartbeats can be withheld: a node paused (SIGSTOP, a long GC) beats
/// no more while its sessions, once it runs again, still try to write.
struct PausableBeats {
    inner: Arc<MemoryStore<SimItem>>,
    paused: AtomicBool,
    /// A node this view of the store does not see (a membership that disagrees).
    hide: Option<&'static str>,
    /// Refuse every compare-and-swap write (a hand-over that loses to a concurrent
    /// change, or a database failing at that moment).
    refuse_cas: AtomicBool,
}

impl CheckpointStore<SimItem> for PausableBeats {
    fn load_stored<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        self.inner.load_stored(id)
    }
    fn write(&self, w: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        if self.refuse_cas.load(Ordering::SeqCst)
            && matches!(w.condition, agentloop::store::WriteCondition::AtVersion(_))
        {
            return Box::pin(std::future::ready(Err(StoreError::Backend {
                operation: "save",
                session: w.header.session_id.clone(),
                message: "injected compare-and-swap failure".into(),
            })));
        }
        self.inner.write(w)
    }
    fn delete(&self, id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.inner.delete(id)
    }
    fn list_stored(
        &self,
        s: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        self.inner.list_stored(s)
    }
    fn cas_status(
        &self,
        id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>> {
        self.inner.cas_status(id, from, to)
    }
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        CheckpointStore::<SimItem>::flush(&*self.inner)
    }
    fn beat(&self, instance: &str, now_ms: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        if self.paused.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Ok(())));
        }
        CheckpointStore::<SimItem>::beat(&*self.inner, instance, now_ms)
    }
    fn heartbeat(&self, instance: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        CheckpointStore::<SimItem>::heartbeat(&*self.inner, instance)
    }
    fn instances(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        let all = CheckpointStore::<SimItem>::instances(&*self.inner);
        let hide = self.hide;
        Box::pin(async move {
            Ok(all
                .await?
                .into_iter()
                .filter(|(n, _)| Some(n.as_str()) != hide)
                .collect())
        })
    }
    fn keeps_history(&self) -> bool {
        self.inner.keeps_history()
    }
    fn history(
        &self,
        id: &str,
        q: HistoryQuery,
    ) -> BoxFuture<'static, Result<HistoryAnswer, StoreError>> {
        self.inner.history(id, q)
    }
}

/// S37: a node paused past its lease loses its session to the node placement names;
/// when it runs again, its session's next write is refused (fenced) and the session
/// stops without touching the record; the adopter runs the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_lease_is_fenced_and_stops_its_session() {
    let inner = Arc::new(MemoryStore::<SimItem>::new());
    let paused = Arc::new(PausableBeats {
        inner: inner.clone(),
        paused: AtomicBool::new(false),
        hide: None,
        refuse_cas: AtomicBool::new(false),
    });
    // A session id placement gives to b once a is gone (any id goes to b then: it is
    // the only live node), started on a.
    let id = "busy";
    let turns: Turns = Arc::default();
    let gate = Gate::new();
    let a = node("a", paused.clone(), turns.clone(), Some(gate.clone())).await;
    a.supervisor()
        .spawn(
            SessionSpec::new(id, "sim")
                .persistent(true)
                .initial_items(vec![item(7)]),
        )
        .await
        .unwrap();
    wait_until("a's record names it", || {
        inner
            .get(id)
            .is_some_and(|r| r.owner.as_deref() == Some("a"))
    })
    .await;
    let epoch_a = inner.get(id).unwrap().lease_epoch;
    // a stops beating (its turn is held at the gate: it is "paused").
    paused.paused.store(true, Ordering::SeqCst);
    let b = node("b", inner.clone(), turns.clone(), None).await;
    wait_until("b adopted the session and ran its item", || {
        turns.lock().iter().any(|(n, ids)| *n == "b" && ids == &[7])
    })
    .await;
    let after = inner.get(id);
    if let Some(r) = &after {
        assert_eq!(r.owner.as_deref(), Some("b"));
        assert!(r.lease_epoch > epoch_a, "{} > {epoch_a}", r.lease_epoch);
    }
    // a runs again: its turn ends, its write is fenced, its session stops.
    gate.open_all();
    let mut stopped = false;
    for _ in 0..400 {
        if a.supervisor().list().await.is_empty() {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stopped, "a's fenced session stopped");
    // Nothing a did reached the record: it is b's (or b deleted it at a clean exit).
    match inner.get(id) {
        Some(r) => assert_eq!(r.owner.as_deref(), Some("b"), "{r:?}"),
        None => assert!(after.is_none() || turns.lock().iter().any(|(n, _)| *n == "b")),
    }
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// S37: two nodes that disagree about membership (each sees only itself) both try to
/// adopt every session of a dead node; each record is claimed by compare-and-swap, so
/// exactly one of them runs each session's work, never both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_disagree_about_membership_never_both_run_a_session() {
    let inner = Arc::new(MemoryStore::<SimItem>::new());
    let n = 16u64;
    for i in 0..n {
        let mut r = SessionRecord::<SimItem>::new(format!("s{i}"), "sim", 0);
        r.status = SessionStatus::Running;
        r.owner = Some("dead".into());
        r.unhandled_items = vec![item(100 + i)];
        inner.save(r).await.unwrap();
    }
    let view = |hide| {
        Arc::new(PausableBeats {
            inner: inner.clone(),
            paused: AtomicBool::new(false),
            hide: Some(hide),
            refuse_cas: AtomicBool::new(false),
        })
    };
    let turns: Turns = Arc::default();
    // The dead node never beat: both adopt at their first sweep, racing.
    let (a, b) = tokio::join!(
        node("a", view("b"), turns.clone(), None),
        node("b", view("a"), turns.clone(), None)
    );
    wait_until("every session ran", || turns.lock().len() as u64 >= n).await;
    tokio::time::sleep(LEASE).await;
    let ran = turns.lock().clone();
    let mut items: Vec<u64> = ran.iter().flat_map(|(_, ids)| ids.clone()).collect();
    items.sort_unstable();
    assert_eq!(
        items,
        (100..100 + n).collect::<Vec<_>>(),
        "each item once: {ran:?}"
    );
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// S36: only serializable requests cross nodes. A push with an S9 strategy (a closure)
/// for a session another node owns is refused with a typed error and the item handed
/// back; the same push without the strategy is forwarded (here: no connected owner, so
/// `OwnerUnreachable` naming it); a session nobody owns is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_with_a_strategy_does_not_cross_nodes() {
    use agentloop::options::{PushOptions, PushStrategy};
    use agentloop::PushError;
    use agentloop_cluster::{ClusterNode, NodeConfig};
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let turns: Turns = Arc::default();
    let gate = Gate::new();
    let a = node("a", store.clone(), turns.clone(), Some(gate.clone())).await;
    a.supervisor()
        .spawn(
            SessionSpec::new("owned-by-a", "sim")
                .persistent(true)
                .initial_items(vec![item(1)]),
        )
        .await
        .unwrap();
    wait_until("a's record names it", || {
        store
            .get("owned-by-a")
            .is_some_and(|r| r.owner.as_deref() == Some("a"))
    })
    .await;
    let b = node("b", store.clone(), turns.clone(), None).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _node = ClusterNode::start(
        &b,
        NodeConfig {
            name: "b".into(),
            listen: format!("127.0.0.1:{port}").parse().unwrap(),
            cookie: "c".into(),
            join: vec![],
            tls: None,
        },
    )
    .await
    .expect("b's node starts");
    let mut with_strategy = PushOptions::new();
    with_strategy.strategy = Some(
        Arc::new(|_: &agentloop::options::TurnView<'_, SimItem>| None) as PushStrategy<SimItem>,
    );
    match b.push("owned-by-a", item(2)).options(with_strategy).await {
        Err(PushError::NotForwardable { id, item }) => {
            assert_eq!((id.as_str(), item.id), ("owned-by-a", 2));
        }
        other => panic!("expected NotForwardable, got {other:?}"),
    }
    match b.push("owned-by-a", item(3)).await {
        Err(PushError::OwnerUnreachable { node, item, .. }) => {
            assert_eq!((node.as_str(), item.id), ("a", 3));
        }
        other => panic!("expected OwnerUnreachable, got {other:?}"),
    }
    assert!(matches!(
        b.push("nobody", item(4)).await,
        Err(PushError::UnknownSession { .. })
    ));
    // And a public address is refused for a node: the cookie does not encrypt.
    let public = ClusterNode::start(
        &b,
        NodeConfig {
            name: "b2".into(),
            listen: "8.8.8.8:7520".parse().unwrap(),
            cookie: "c".into(),
            join: vec![],
            tls: None,
        },
    )
    .await;
    assert!(
        matches!(public, Err(agentloop_cluster::NodeError::PublicAddress(_))),
        "{public:?}"
    );
    gate.open_all();
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// An agent whose turn is ten 10 ms steps: a safe point every 10 ms (C2's busy session).
fn busy_node_agent(name: &'static str, turns: Turns) -> impl Fn(&[u8]) -> Result<SimAgent, String> {
    gated_busy_node_agent(name, turns, None)
}

/// [`busy_node_agent`] whose steps each wait for `gate`, when given.
fn gated_busy_node_agent(
    name: &'static str,
    turns: Turns,
    gate: Option<Gate>,
) -> impl Fn(&[u8]) -> Result<SimAgent, String> {
    move |_cfg: &[u8]| {
        let t = turns.clone();
        let steps = (0..10)
            .map(|i| {
                if i % 2 == 0 {
                    agentloop_sim::SimStep::ModelCall {
                        latency: Duration::from_millis(10),
                        input_tokens: 1,
                    }
                } else {
                    agentloop_sim::SimStep::ToolRound {
                        latency: Duration::from_millis(10),
                        calls: 1,
                    }
                }
            })
            .collect();
        let agent = SimAgent::new(agentloop_sim::Script { steps }).with_turn_hook(Arc::new(
            move |_turn, ids| t.lock().push((name, ids.to_vec())),
        ));
        Ok(match &gate {
            Some(g) => agent.with_step_gate(g.clone()),
            None => agent,
        })
    }
}

/// S38: a planned move of a busy session. Pushes keep arriving at the old owner while
/// the session stops at its next safe point, its lease moves by compare-and-swap and
/// the new owner resumes it: every acknowledged push is delivered exactly once, in the
/// order it was pushed, and the record ends the new owner's at a later epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_move_of_a_busy_session_loses_and_repeats_nothing() {
    use agentloop_cluster::peers::connect_in_process;
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let turns: Turns = Arc::default();
    let start = |name: &'static str| {
        let (store, turns) = (store.clone(), turns.clone());
        async move {
            Rt::builder()
                .store(store)
                .heartbeat(BEAT, LEASE)
                .node(name)
                .register_agent("sim", busy_node_agent(name, turns))
                .start()
                .await
                .unwrap()
                .0
        }
    };
    let a = start("a").await;
    let b = start("b").await;
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    a.supervisor()
        .spawn(SessionSpec::new("mover", "sim").persistent(true))
        .await
        .unwrap();
    let pushing = a.handle();
    let pusher = tokio::spawn(async move {
        let mut acked = Vec::new();
        for id in 1..=120u64 {
            match pushing.push("mover", item(id)).await {
                Ok(_) => acked.push(id),
                Err(e) => panic!("push {id}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        acked
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // A move to a node this one is not joined to is refused before anything happens.
    match a.migrate("mover", "nowhere", Duration::from_secs(1)).await {
        Err(agentloop::cluster::migrate::MigrateError::Unreachable { node, .. }) => {
            assert_eq!(node, "nowhere")
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    assert_eq!(
        a.supervisor().list().await.len(),
        1,
        "the session still runs on a"
    );
    let epoch_before = store.get("mover").map(|r| r.lease_epoch).unwrap_or(0);
    let mut on_a = a
        .subscribe_anywhere("mover", None, agentloop::EventFilter::all())
        .await
        .unwrap();
    let moved = a
        .migrate("mover", "b", Duration::from_secs(1))
        .await
        .expect("the move");
    // Event numbers continue on the new owner (S20, S38): a's stream ended with the
    // move; the first event b gives is numbered after a's last.
    let mut last_on_a = 0;
    while let Some(e) = on_a.next_sequenced().await {
        last_on_a = e.seq;
    }
    let mut on_b = a
        .subscribe_anywhere("mover", None, agentloop::EventFilter::all())
        .await
        .expect("relayed from b");
    let first_on_b = on_b.next_sequenced().await.expect("an event on b").seq;
    assert!(
        last_on_a > 0 && first_on_b > last_on_a,
        "numbers continue: {first_on_b} > {last_on_a}"
    );
    assert!(moved.total < Duration::from_secs(1), "{moved:?}");
    let acked = pusher.await.unwrap();
    assert_eq!(acked.len(), 120);
    // The session runs on b now; a runs nothing.
    assert!(a.supervisor().list().await.is_empty());
    assert_eq!(b.supervisor().list().await.len(), 1);
    let rec = store.get("mover").expect("b's record");
    assert_eq!(rec.owner.as_deref(), Some("b"));
    assert!(
        rec.lease_epoch > epoch_before,
        "{} > {epoch_before}",
        rec.lease_epoch
    );
    // Drain it through a (the stop goes to b, its owner), then audit: each
    // acknowledged push once, in push order.
    a.stop_anywhere("mover", StopOptions::drain())
        .await
        .expect("a stop sent to the old owner reaches the new one");
    let mut gone = false;
    for _ in 0..500 {
        if b.supervisor().list().await.is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gone, "the drain ended");
    let ran = turns.lock().clone();
    let delivered: Vec<u64> = ran.iter().flat_map(|(_, ids)| ids.clone()).collect();
    assert_eq!(delivered, acked, "exactly once, in order: {ran:?}");
    assert!(ran.iter().any(|(n, _)| *n == "a") && ran.iter().any(|(n, _)| *n == "b"));
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// S38: the `migrate` shutdown strategy of a cluster node stops its sessions at their
/// next safe point and hands each to the live node placement names, which resumes it
/// at once (no wait for a lease): after the shutdown every session runs on the other
/// node, and each item is delivered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migrate_shutdown_hands_every_session_to_the_other_node() {
    use agentloop::config::ShutdownConfig;
    use agentloop_cluster::peers::connect_in_process;
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let turns: Turns = Arc::default();
    // a's steps wait for this gate: its shutdown cannot hand a session over (each
    // stops at its next safe point) until a push has been sent during it.
    let steps_on_a = Gate::new();
    let a = Rt::builder()
        .store(store.clone())
        .heartbeat(BEAT, LEASE)
        .node("a")
        .shutdown_config(ShutdownConfig {
            strategy: "migrate".into(),
            ..ShutdownConfig::default()
        })
        .register_agent(
            "sim",
            gated_busy_node_agent("a", turns.clone(), Some(steps_on_a.clone())),
        )
        .start()
        .await
        .unwrap()
        .0;
    let b = Rt::builder()
        .store(store.clone())
        .heartbeat(BEAT, LEASE)
        .node("b")
        .register_agent("sim", busy_node_agent("b", turns.clone()))
        .start()
        .await
        .unwrap()
        .0;
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    let ids: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let items = (0..3).map(|k| item(10 * i as u64 + k)).collect();
        a.supervisor()
            .spawn(
                SessionSpec::new(id.clone(), "sim")
                    .persistent(true)
                    .initial_items(items),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    // A client keeps pushing through a while it shuts down: pushes that arrive during
    // the hand-over wait in line and go to b (issue 18 item 3), none is refused.
    let shutting = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let sent_during = Arc::new(tokio::sync::Notify::new());
    let pusher = {
        let (ha, ids, shutting, done) = (a.handle(), ids.clone(), shutting.clone(), done.clone());
        let sent_during = sent_during.clone();
        let coordinator = a.handle().shutdown_handle();
        tokio::spawn(async move {
            let (mut acked, mut during) = (Vec::new(), 0);
            for k in 0..10_000u64 {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                // In the shutdown: it has begun (the coordinator says so).
                let in_shutdown = shutting.load(Ordering::SeqCst) && coordinator.is_started().await;
                if in_shutdown {
                    sent_during.notify_one();
                }
                let id = &ids[(k % 4) as usize];
                match ha.push(id, item(1000 + k)).await {
                    Ok(_) => {
                        acked.push(1000 + k);
                        during += usize::from(in_shutdown);
                    }
                    // Refused only once a's shutdown is over (its supervisor is gone).
                    Err(e) => {
                        assert!(
                            done.load(Ordering::SeqCst),
                            "push {k} during the shutdown: {e}"
                        );
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (acked, during)
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    shutting.store(true, Ordering::SeqCst);
    let shutdown = tokio::spawn(async move { a.shutdown().await });
    // A push is on its way during the shutdown; then a's sessions may reach their
    // safe points and be handed over.
    sent_during.notified().await;
    steps_on_a.open_all();
    let report = shutdown.await.unwrap().unwrap();
    done.store(true, Ordering::SeqCst);
    let (acked, during) = pusher.await.unwrap();
    assert!(during > 0, "some pushes were sent during the shutdown");
    assert_eq!(report.checkpoints.saved, 4, "{report:?}");
    let mut running: Vec<String> = b
        .supervisor()
        .list()
        .await
        .into_iter()
        .map(|s| s.id)
        .collect();
    running.sort();
    assert_eq!(
        running, ids,
        "every session runs on b right after a's shutdown"
    );
    for id in &ids {
        assert_eq!(store.get(id).unwrap().owner.as_deref(), Some("b"));
    }
    let mut gone = false;
    for _ in 0..500 {
        let mut delivered: Vec<u64> = turns.lock().iter().flat_map(|(_, i)| i.clone()).collect();
        delivered.sort_unstable();
        if delivered.len() >= 12 + acked.len() {
            let mut expected: Vec<u64> = (0..4u64)
                .flat_map(|i| (0..3).map(move |k| 10 * i + k))
                .chain(acked.iter().copied())
                .collect();
            expected.sort_unstable();
            assert_eq!(delivered, expected, "each item once");
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gone, "every item delivered: {:?}", turns.lock());
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// After a move that did not happen: the session runs on a again and nowhere else, its
/// record is a's, and once `gate` opens its `items` are delivered on a, once each.
async fn runs_on_a_again(
    a: &Rt,
    b: &Rt,
    store: &MemoryStore<SimItem>,
    turns: &Turns,
    gate: &Gate,
    id: &str,
    items: &[u64],
) {
    assert_eq!(a.supervisor().list().await.len(), 1, "it runs on a again");
    assert!(b.supervisor().list().await.is_empty());
    assert_eq!(store.get(id).unwrap().owner.as_deref(), Some("a"));
    gate.open_all();
    wait_until("its items delivered on a", || {
        let mut ids: Vec<u64> = turns.lock().iter().flat_map(|(_, i)| i.clone()).collect();
        ids.sort_unstable();
        ids == items
    })
    .await;
    assert!(turns.lock().iter().all(|(n, _)| *n == "a"));
}

/// S38: a move whose lease hand-over fails (the compare-and-swap is refused) leaves the
/// session running where it was, with everything it held: it is never left stopped
/// with nobody to run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_whose_hand_over_fails_resumes_the_session_in_place() {
    use agentloop::cluster::migrate::MigrateError;
    use agentloop_cluster::peers::connect_in_process;
    let inner = Arc::new(MemoryStore::<SimItem>::new());
    let view = Arc::new(PausableBeats {
        inner: inner.clone(),
        paused: AtomicBool::new(false),
        hide: None,
        refuse_cas: AtomicBool::new(false),
    });
    let turns: Turns = Arc::default();
    let gate = Gate::new();
    let a = node("a", view.clone(), turns.clone(), Some(gate.clone())).await;
    let b = node("b", inner.clone(), turns.clone(), None).await;
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    a.supervisor()
        .spawn(
            SessionSpec::new("stays", "sim")
                .persistent(true)
                .initial_items(vec![item(41), item(42)]),
        )
        .await
        .unwrap();
    wait_until("a's record names it", || {
        inner
            .get("stays")
            .is_some_and(|r| r.owner.as_deref() == Some("a"))
    })
    .await;
    view.refuse_cas.store(true, Ordering::SeqCst);
    match a.migrate("stays", "b", Duration::from_millis(50)).await {
        Err(MigrateError::Store { .. }) => {}
        other => panic!("expected the hand-over to fail, got {other:?}"),
    }
    view.refuse_cas.store(false, Ordering::SeqCst);
    runs_on_a_again(&a, &b, &inner, &turns, &gate, "stays", &[41, 42]).await;
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// S38: a move whose new node cannot resume the session (here: b does not know its
/// agent kind) takes the lease back by compare-and-swap and runs the session on the
/// old node again; nothing is left `Interrupted` under a node that will not run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_the_new_node_cannot_resume_runs_the_session_on_the_old_node_again() {
    use agentloop::cluster::migrate::MigrateError;
    use agentloop_cluster::peers::connect_in_process;
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let turns: Turns = Arc::default();
    let gate = Gate::new();
    let a = node("a", store.clone(), turns.clone(), Some(gate.clone())).await;
    let b = Rt::builder()
        .store(store.clone())
        .heartbeat(BEAT, LEASE)
        .node("b")
        .start()
        .await
        .unwrap()
        .0;
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    a.supervisor()
        .spawn(
            SessionSpec::new("homing", "sim")
                .persistent(true)
                .initial_items(vec![item(51), item(52)]),
        )
        .await
        .unwrap();
    wait_until("a's record names it", || {
        store
            .get("homing")
            .is_some_and(|r| r.owner.as_deref() == Some("a"))
    })
    .await;
    let epoch = store.get("homing").unwrap().lease_epoch;
    match a.migrate("homing", "b", Duration::from_millis(50)).await {
        Err(MigrateError::NotResumed { node, .. }) => assert_eq!(node, "b"),
        other => panic!("expected NotResumed, got {other:?}"),
    }
    let back = store.get("homing").unwrap().lease_epoch;
    assert!(back > epoch + 1, "handed over and back: {back}");
    runs_on_a_again(&a, &b, &store, &turns, &gate, "homing", &[51, 52]).await;
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// S36, S20: a session's events read through another node are the events its owner's
/// subscribers get: the same numbers, in order, `Ended` last; a subscription after a
/// number replays from the owner's buffer; a session that runs nowhere is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_events_stream_from_another_node_as_they_do_at_its_owner() {
    use agentloop::{events::Sequenced, EventFilter, EventStream, SessionEvent};
    use agentloop_cluster::peers::connect_in_process;
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let turns: Turns = Arc::default();
    let a = node("a", store.clone(), turns.clone(), None).await;
    let b = node("b", store.clone(), turns.clone(), None).await;
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    a.supervisor()
        .spawn(
            SessionSpec::new("watched", "sim")
                .persistent(true)
                .replay(64),
        )
        .await
        .unwrap();
    let all = EventFilter::all();
    let at_owner = a.subscribe_anywhere("watched", None, all).await.unwrap();
    let relayed = b.subscribe_anywhere("watched", None, all).await.unwrap();
    for id in 1..=5 {
        b.push("watched", item(id)).await.unwrap();
    }
    wait_until("five items delivered", || {
        turns.lock().iter().map(|(_, ids)| ids.len()).sum::<usize>() == 5
    })
    .await;
    // A late subscriber through b, after the owner's second event: the rest replayed.
    let late = b.subscribe_anywhere("watched", Some(2), all).await.unwrap();
    b.stop_anywhere("watched", StopOptions::drain())
        .await
        .unwrap();
    async fn collect(mut s: EventStream<SimEvent>) -> Vec<Sequenced<SimEvent>> {
        let mut v = Vec::new();
        while let Some(e) = s.next_sequenced().await {
            v.push(e);
        }
        v
    }
    let (at_owner, relayed, late) = (
        collect(at_owner).await,
        collect(relayed).await,
        collect(late).await,
    );
    assert!(
        at_owner
            .iter()
            .any(|e| matches!(e.event, SessionEvent::Agent { .. })),
        "{at_owner:?}"
    );
    assert!(matches!(
        at_owner.last().map(|e| &e.event),
        Some(SessionEvent::Ended(_))
    ));
    assert_eq!(relayed, at_owner, "the same events, numbers and end");
    let after_two: Vec<_> = at_owner.iter().filter(|e| e.seq > 2).cloned().collect();
    assert_eq!(late, after_two, "replayed after number 2, then live");
    match b.subscribe_anywhere("watched", None, all).await {
        Err(agentloop::cluster::control::ControlError::Here(
            agentloop::SupervisorError::UnknownSession(id),
        )) => assert_eq!(id, "watched"),
        other => panic!("expected UnknownSession, got {:?}", other.map(|_| ())),
    }
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// S38, issue 18 item 3: placement changes when a node joins. Node a ran every session
/// alone; b joins; once the live set has settled, a moves the sessions placement now
/// gives b to it by planned migration and keeps the rest. Pushes sent through a after
/// the move reach b; every acknowledged push is delivered exactly once; and once moved,
/// nothing moves again (no back and forth between the two nodes' rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_node_joins_the_sessions_placement_gives_it_move_to_it() {
    use agentloop::cluster::rebalance::Rebalance;
    use agentloop_cluster::peers::connect_in_process;
    use std::collections::BTreeSet;
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let turns: Turns = Arc::default();
    let policy = Rebalance {
        settle: Duration::from_millis(300),
        concurrent: 4,
        safe_point_timeout: Duration::from_secs(1),
    };
    let start = |name: &'static str| {
        let (store, turns) = (store.clone(), turns.clone());
        async move {
            Rt::builder()
                .store(store)
                .heartbeat(BEAT, LEASE)
                .node(name)
                .rebalance(policy)
                .register_agent("sim", move |_cfg: &[u8]| {
                    let t = turns.clone();
                    Ok(
                        SimAgent::new(steps(1)).with_turn_hook(Arc::new(move |_turn, ids| {
                            t.lock().push((name, ids.to_vec()))
                        })),
                    )
                })
                .start()
                .await
                .unwrap()
                .0
        }
    };
    let n = 16u64;
    let ids: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let a = start("a").await;
    for (i, id) in ids.iter().enumerate() {
        a.supervisor()
            .spawn(SessionSpec::new(id.clone(), "sim").persistent(true))
            .await
            .unwrap();
        a.push(id, item(i as u64)).await.unwrap();
    }
    let to_b: BTreeSet<String> = ids
        .iter()
        .filter(|s| placement::owner_of(&["a", "b"], s) == Some("b"))
        .cloned()
        .collect();
    assert!(!to_b.is_empty() && to_b.len() < ids.len(), "{to_b:?}");
    let b = start("b").await;
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    let running = |rt: &Rt| {
        let s = rt.supervisor().clone();
        async move {
            s.list()
                .await
                .into_iter()
                .map(|x| x.id)
                .collect::<BTreeSet<_>>()
        }
    };
    let mut settled = false;
    for _ in 0..500 {
        if running(&b).await == to_b && running(&a).await.len() == ids.len() - to_b.len() {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        settled,
        "b runs {:?}, expected {to_b:?}; a runs {:?}",
        running(&b).await,
        running(&a).await
    );
    for id in &to_b {
        assert_eq!(store.get(id).and_then(|r| r.owner), Some("b".to_string()));
    }
    // Pushes through a reach each session wherever it runs now.
    for (i, id) in ids.iter().enumerate() {
        a.push(id, item(100 + i as u64)).await.unwrap();
    }
    wait_until("every push delivered", || {
        turns.lock().iter().map(|(_, ids)| ids.len()).sum::<usize>() == 2 * ids.len()
    })
    .await;
    // Stable: after three more settle periods, nobody moved anything again.
    let epochs: Vec<u64> = ids
        .iter()
        .map(|id| store.get(id).map(|r| r.lease_epoch).unwrap_or(0))
        .collect();
    tokio::time::sleep(policy.settle * 3).await;
    let later: Vec<u64> = ids
        .iter()
        .map(|id| store.get(id).map(|r| r.lease_epoch).unwrap_or(0))
        .collect();
    assert_eq!(epochs, later, "no session moved again");
    assert_eq!(running(&b).await, to_b);
    let ran = turns.lock().clone();
    let mut delivered: Vec<u64> = ran.iter().flat_map(|(_, ids)| ids.clone()).collect();
    delivered.sort_unstable();
    let mut expected: Vec<u64> = (0..n).chain(100..100 + n).collect();
    expected.sort_unstable();
    assert_eq!(delivered, expected, "each push exactly once: {ran:?}");
    for (i, id) in ids.iter().enumerate() {
        let by = if to_b.contains(id) { "b" } else { "a" };
        assert!(
            ran.iter()
                .any(|(n, ids)| *n == by && ids.contains(&(100 + i as u64))),
            "{id}'s second item ran on {by}: {ran:?}"
        );
    }
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
}
