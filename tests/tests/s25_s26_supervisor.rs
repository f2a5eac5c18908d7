//! S25–S26: the SessionSupervisor spawns sessions by message, routes by id, refuses bad
//! requests with typed errors, survives its children, and restarts failed sessions
//! under a restart policy and budget without losing messages.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    store::SessionStatus, supervisor::agent_kind, supervisor::RestartBudget, CheckpointStore,
    Durability, EventFilter, ExitReason, MemoryStore, PushError, RestartPolicy, SessionEvent,
    SessionSpec, StopOptions, SupervisorArgs, SupervisorError, SupervisorHandle,
};
use agentloop_sim::{Fault, Ledger, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use parking_lot::Mutex;

type Sup = SupervisorHandle<SimItem, SimEvent>;

/// A "sim" kind whose config byte picks a fault: 0 none, 1 one panic at turn 0 step 1,
/// 2 a panic on every turn, 3 one agent error at turn 0 step 1, 4 a permanent agent
/// error on every turn. The ledger of every incarnation is collected.
fn kinds(ledgers: Arc<Mutex<Vec<Arc<Mutex<Ledger>>>>>) -> SupervisorArgs<SimItem, SimEvent> {
    // "Once" faults fire in the first incarnation only (each incarnation is a new agent).
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sim = agent_kind("sim", move |config: &[u8]| {
        let first = !fired.swap(true, std::sync::atomic::Ordering::SeqCst);
        let mut agent = SimAgent::new(steps(2));
        agent = match config.first().copied().unwrap_or(0) {
            0 => agent,
            1 if first => agent.with_fault(Some(0), 1, Fault::Panic, true),
            2 => agent.with_fault(None, 1, Fault::Panic, false),
            3 if first => agent.with_fault(Some(0), 1, Fault::Fail, true),
            4 => agent.with_fault(None, 1, Fault::FailPermanent, false),
            1 | 3 => agent,
            other => return Err(format!("unknown fault byte {other}")),
        };
        ledgers.lock().push(agent.ledger());
        Ok(agent)
    });
    let mut map = HashMap::new();
    map.insert("sim".to_string(), sim);
    SupervisorArgs {
        kinds: map,
        store: None,
        owner: Some("test-instance".into()),
        budget: RestartBudget {
            max_restarts: 2,
            window: Duration::from_secs(60),
        },
        heartbeat: agentloop::store::DEFAULT_HEARTBEAT,
        metrics: None,
        limits: Default::default(),
    }
}

fn delivered(ledgers: &Arc<Mutex<Vec<Arc<Mutex<Ledger>>>>>) -> Vec<u64> {
    let mut v: Vec<u64> = ledgers
        .lock()
        .iter()
        .flat_map(|l| l.lock().delivered_ids())
        .collect();
    v.sort_unstable();
    v
}

#[tokio::test(start_paused = true)]
async fn s25_spawn_route_list_and_typed_errors() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let sup = Sup::start(kinds(ledgers.clone())).await.unwrap();
    sup.spawn(SessionSpec::new("a", "sim").initial_items(vec![item(1)]))
        .await
        .unwrap();
    sup.spawn(SessionSpec::new("b", "sim")).await.unwrap();
    sup.push("a", item(2)).await.unwrap();
    sup.push("b", item(3)).await.unwrap();
    let ids: Vec<String> = sup.list().await.into_iter().map(|s| s.id).collect();
    assert_eq!(ids, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(sup.inspect("a").await.unwrap().session_id, "a");

    // Duplicate id, unknown kind, invalid id, unknown session, bad config.
    assert!(matches!(
        sup.spawn(SessionSpec::new("a", "sim")).await,
        Err(SupervisorError::Duplicate(ref id)) if id == "a"
    ));
    match sup.spawn(SessionSpec::new("c", "nope")).await {
        Err(SupervisorError::UnknownKind { kind, known }) => {
            assert_eq!((kind.as_str(), known.as_str()), ("nope", "sim"));
        }
        r => panic!("expected UnknownKind, got {:?}", r.map(|_| ())),
    }
    assert!(matches!(
        sup.spawn(SessionSpec::new("bad\nid", "sim")).await,
        Err(SupervisorError::InvalidId(_))
    ));
    assert!(matches!(
        sup.spawn(SessionSpec::new("cfg", "sim").config(vec![9]))
            .await,
        Err(SupervisorError::BadConfig { .. })
    ));
    assert!(matches!(
        sup.spawn(SessionSpec::new("p", "sim").persistent(true))
            .await,
        Err(SupervisorError::NoStore(_))
    ));
    match sup.push("ghost", item(9)).await {
        Err(PushError::UnknownSession { id, item }) => {
            assert_eq!((id.as_str(), item.id), ("ghost", 9), "the item comes back");
        }
        r => panic!("expected UnknownSession, got {r:?}"),
    }
    assert!(matches!(
        sup.stop("ghost", StopOptions::bare()).await,
        Err(SupervisorError::UnknownSession(_))
    ));

    sup.stop("a", StopOptions::drain()).await.unwrap();
    sup.stop("b", StopOptions::drain()).await.unwrap();
    within("sessions leave the registry", async {
        while !sup.list().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(delivered(&ledgers), vec![1, 2, 3]);
}

/// S25, batch spawn: one request spawns many sessions; each spec is answered in order
/// and fails alone (bad id, a duplicate of a live session or of an earlier spec in the
/// same batch, unknown kind, bad config); initial items reach their sessions.
#[tokio::test(start_paused = true)]
async fn s25_batch_spawn_answers_each_spec_in_order() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let sup = Sup::start(kinds(ledgers.clone())).await.unwrap();
    sup.spawn(SessionSpec::new("live", "sim")).await.unwrap();
    let answers = sup
        .spawn_batch(vec![
            SessionSpec::new("x", "sim").initial_items(vec![item(1)]),
            SessionSpec::new("bad\nid", "sim"),
            SessionSpec::new("live", "sim"),
            SessionSpec::new("y", "sim").initial_items(vec![item(2), item(3)]),
            SessionSpec::new("x", "sim").initial_items(vec![item(99)]),
            SessionSpec::new("z", "nope"),
            SessionSpec::new("w", "sim").config(vec![9]),
        ])
        .await;
    let shape: Vec<&str> = answers
        .iter()
        .map(|a| match a {
            Ok(_) => "ok",
            Err(SupervisorError::InvalidId(_)) => "invalid",
            Err(SupervisorError::Duplicate(_)) => "duplicate",
            Err(SupervisorError::UnknownKind { .. }) => "unknown kind",
            Err(SupervisorError::BadConfig { .. }) => "bad config",
            Err(_) => "other",
        })
        .collect();
    assert_eq!(
        shape,
        [
            "ok",
            "invalid",
            "duplicate",
            "ok",
            "duplicate",
            "unknown kind",
            "bad config"
        ]
    );
    assert_eq!(answers[0].as_ref().unwrap().id(), "x");
    assert_eq!(answers[3].as_ref().unwrap().id(), "y");
    let ids: Vec<String> = sup.list().await.into_iter().map(|s| s.id).collect();
    assert_eq!(ids, ["live", "x", "y"]);
    // The sessions run: the batch's seeds are delivered, routing reaches them.
    sup.push("x", item(4)).await.unwrap();
    let exits = sup.stop_all(StopOptions::drain()).await;
    assert_eq!(exits.len(), 3);
    assert_eq!(delivered(&ledgers), vec![1, 2, 3, 4]);
}

/// S25, batch spawn: a list longer than one batch is split by the handle; a raw
/// `SpawnBatch` message over the bound is refused whole with a typed error.
#[tokio::test(start_paused = true)]
async fn s25_batch_spawn_splits_long_lists_and_bounds_one_message() {
    use agentloop::{supervisor::SupervisorMsg, supervisor::MAX_SPAWN_BATCH};
    let sup = Sup::start(kinds(Arc::new(Mutex::new(Vec::new()))))
        .await
        .unwrap();
    let n = MAX_SPAWN_BATCH * 2 + 7;
    let specs = (0..n)
        .map(|i| SessionSpec::new(format!("s{i:05}"), "sim"))
        .collect();
    let answers = sup.spawn_batch(specs).await;
    assert_eq!(answers.len(), n);
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(sup.list().await.len(), n);

    let too_many = (0..=MAX_SPAWN_BATCH)
        .map(|i| SessionSpec::new(format!("t{i:05}"), "sim"))
        .collect();
    let refused = agentloop::ractor::call!(sup.actor(), |reply| SupervisorMsg::SpawnBatch {
        specs: too_many,
        reply
    })
    .expect("the supervisor answers");
    match refused {
        Err(SupervisorError::BatchTooLarge { len, max }) => {
            assert_eq!((len, max), (MAX_SPAWN_BATCH + 1, MAX_SPAWN_BATCH));
        }
        other => panic!("expected BatchTooLarge, got {:?}", other.map(|v| v.len())),
    }
    assert_eq!(
        sup.list().await.len(),
        n,
        "nothing of the refused batch was spawned"
    );
    assert_eq!(sup.stop_all(StopOptions::bare()).await.len(), n);
}

/// S26: an agent panic mid-turn restarts the session; items pushed while it restarts
/// reach the new incarnation; nothing is lost; the supervisor lives on.
#[tokio::test(start_paused = true)]
async fn s26_panic_restarts_and_pushes_during_the_restart_are_delivered() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let sup = Sup::start(kinds(ledgers.clone())).await.unwrap();
    sup.spawn(SessionSpec::new("p", "sim").config(vec![1]))
        .await
        .unwrap();
    for id in 1..=10 {
        sup.push("p", item(id)).await.unwrap();
    }
    within("the restart", async {
        while sup.list().await.first().map(|s| s.restarts) != Some(1) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    for id in 11..=15 {
        sup.push("p", item(id)).await.unwrap();
    }
    sup.stop("p", StopOptions::drain()).await.unwrap();
    within("the drain", async {
        while !sup.list().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(delivered(&ledgers), (1..=15).collect::<Vec<u64>>());
    // The supervisor survived its child's failure.
    sup.spawn(SessionSpec::new("after", "sim")).await.unwrap();
}

/// S26: a `sync`-persistent session restarts from its last durable record.
#[tokio::test(start_paused = true)]
async fn s26_sync_session_restarts_from_its_record() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let mut args = kinds(ledgers.clone());
    args.store = Some(mem.clone() as Arc<dyn CheckpointStore<SimItem>>);
    let sup = Sup::start(args).await.unwrap();
    sup.spawn(
        SessionSpec::new("s", "sim")
            .config(vec![1])
            .persistent(true)
            .durability(Durability::Sync),
    )
    .await
    .unwrap();
    for id in 1..=5 {
        sup.push("s", item(id)).await.unwrap();
    }
    within("the restart", async {
        while sup.list().await.first().map(|s| s.restarts) != Some(1) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    sup.stop("s", StopOptions::drain()).await.unwrap();
    within("the drain", async {
        while !sup.list().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(delivered(&ledgers), vec![1, 2, 3, 4, 5]);
    assert!(mem.get("s").is_none(), "the clean end deleted the record");
}

/// S26: past the budget the session ends Failed, its subscribers get Ended, and its
/// record is marked Failed with the error; a `Never` policy does not restart at all.
#[tokio::test(start_paused = true)]
async fn s26_budget_spent_ends_failed_and_never_does_not_restart() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let mut args = kinds(ledgers.clone());
    args.store = Some(mem.clone() as Arc<dyn CheckpointStore<SimItem>>);
    let sup = Sup::start(args).await.unwrap();
    sup.spawn(
        SessionSpec::new("doomed", "sim")
            .config(vec![2])
            .persistent(true)
            .initial_items(vec![item(1)]),
    )
    .await
    .unwrap();
    // Follow the incarnations: a stream may start after its incarnation ended (then
    // it yields nothing), so the order is checked by
    // `s26_restarting_not_ended_while_the_session_runs_again`.
    let mut lasts = Vec::new();
    within("the budget to be spent", async {
        while !sup.list().await.is_empty() {
            if let Ok(mut events) = sup.subscribe("doomed", EventFilter::all()).await {
                let mut last = None;
                while let Some(ev) = events.next().await {
                    last = Some(ev);
                }
                lasts.extend(last);
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    for (i, last) in lasts.iter().enumerate() {
        match last {
            SessionEvent::Ended(s) => {
                assert_eq!(i + 1, lasts.len(), "Ended only at the end: {lasts:?}");
                assert!(matches!(s.reason, ExitReason::Failed(_)), "{s:?}");
            }
            SessionEvent::Restarting { attempt, error, .. } => {
                assert!((1..=2).contains(attempt), "{lasts:?}");
                assert!(error.contains("panicked"), "{error}");
            }
            other => panic!("each stream ends with Ended or Restarting: {other:?}"),
        }
    }
    match mem.get("doomed").map(|r| r.status) {
        Some(SessionStatus::Failed(e)) => assert!(e.contains("panicked"), "{e}"),
        other => panic!("expected a Failed record, got {other:?}"),
    }
    assert_eq!(ledgers.lock().len(), 3, "one start and two restarts");

    let before = ledgers.lock().len();
    sup.spawn(
        SessionSpec::new("once", "sim")
            .config(vec![2])
            .restart(RestartPolicy::Never)
            .initial_items(vec![item(7)]),
    )
    .await
    .unwrap();
    within("the failure", async {
        while sup.list().await.iter().any(|s| s.id == "once") {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(ledgers.lock().len(), before + 1, "no restart");
}

/// S26: `Transient` restarts after a panic but not after an error the agent returned.
#[tokio::test(start_paused = true)]
async fn s26_transient_restarts_only_after_a_panic() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let sup = Sup::start(kinds(ledgers.clone())).await.unwrap();
    sup.spawn(
        SessionSpec::new("err", "sim")
            .config(vec![3])
            .restart(RestartPolicy::Transient)
            .initial_items(vec![item(1)]),
    )
    .await
    .unwrap();
    within("the failure", async {
        while !sup.list().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        ledgers.lock().len(),
        1,
        "an agent error is not restarted under Transient"
    );
}

/// Issue 53, "`ended` means ended": an incarnation the supervisor restarts ends its
/// subscribers' stream with `Restarting { attempt, .. }`, never `Ended`; the session
/// sends `Ended` once, when nothing runs again (here: past the budget of 2).
#[tokio::test(start_paused = true)]
async fn s26_restarting_not_ended_while_the_session_runs_again() {
    let gate = agentloop_sim::Gate::new();
    let mut args = kinds(Arc::new(Mutex::new(Vec::new())));
    let g = gate.clone();
    args.kinds.insert(
        "gated".into(),
        agent_kind("gated", move |_: &[u8]| {
            Ok(SimAgent::new(steps(2))
                .with_step_gate(g.clone())
                .with_fault(None, 1, Fault::Panic, false))
        }),
    );
    let sup = Sup::start(args).await.unwrap();
    sup.spawn(SessionSpec::new("again", "gated").initial_items(vec![item(1)]))
        .await
        .unwrap();
    let mut lasts = Vec::new();
    for incarnation in 0..3u32 {
        within("the incarnation", async {
            while sup.list().await.first().map(|s| s.restarts) != Some(incarnation) {
                tokio::task::yield_now().await;
            }
        })
        .await;
        // The incarnation waits at its first step's gate: subscribed before it fails.
        let mut events = sup.subscribe("again", EventFilter::all()).await.unwrap();
        gate.open(2);
        let mut last = None;
        within("the stream's end", async {
            while let Some(ev) = events.next().await {
                last = Some(ev);
            }
        })
        .await;
        lasts.push(last.expect("a last event"));
    }
    match &lasts[..] {
        [SessionEvent::Restarting {
            attempt: 1,
            error: e1,
            after_ms: 0,
        }, SessionEvent::Restarting {
            attempt: 2,
            error: e2,
            ..
        }, SessionEvent::Ended(end)] => {
            assert!(
                e1.contains("panicked") && e2.contains("panicked"),
                "{lasts:?}"
            );
            assert!(matches!(end.reason, ExitReason::Failed(_)), "{end:?}");
        }
        other => panic!("Restarting twice, then Ended: {other:?}"),
    }
    within("the session to leave", async {
        while !sup.list().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Issue 53: a permanent agent error is never restarted, whatever the policy: the
/// session ends `Failed` at once, its `Ended` says the failure was permanent, and its
/// record says so.
#[tokio::test(start_paused = true)]
async fn s26_a_permanent_agent_error_is_not_restarted() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let mut args = kinds(ledgers.clone());
    args.store = Some(mem.clone() as Arc<dyn CheckpointStore<SimItem>>);
    let sup = Sup::start(args).await.unwrap();
    sup.spawn(
        SessionSpec::new("refused", "sim")
            .config(vec![4])
            .persistent(true)
            .restart(RestartPolicy::Permanent),
    )
    .await
    .unwrap();
    let mut events = sup.subscribe("refused", EventFilter::all()).await.unwrap();
    sup.push("refused", item(1)).await.unwrap();
    let mut ended = Vec::new();
    within("the end", async {
        while let Some(ev) = events.next().await {
            if let SessionEvent::Ended(s) = ev {
                ended.push(s);
            }
        }
    })
    .await;
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert!(
        matches!(ended[0].reason, ExitReason::Failed(_)),
        "{ended:?}"
    );
    assert_eq!(
        ended[0].failure,
        Some(agentloop::exit::FailureKind::AgentPermanent)
    );
    within("the session to leave", async {
        while !sup.list().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // Let a restart, if one were (wrongly) made, start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(sup.list().await.is_empty(), "not running again");
    assert_eq!(ledgers.lock().len(), 1, "one incarnation, no restart");
    match mem.get("refused").map(|r| r.status) {
        Some(SessionStatus::Failed(e)) => assert!(e.contains("permanent"), "{e}"),
        other => panic!("expected a Failed record, got {other:?}"),
    }
}

/// A store whose loads of sessions named `slow…` wait for a gate; everything else goes
/// straight to memory.
struct SlowLoads {
    inner: MemoryStore<SimItem>,
    release: tokio::sync::watch::Sender<bool>,
}

impl CheckpointStore<SimItem> for SlowLoads {
    fn load_stored<'a>(
        &'a self,
        id: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<agentloop::store::Stored>, agentloop::StoreError>,
    > {
        let mut rx = self.release.subscribe();
        Box::pin(async move {
            if id.starts_with("slow") {
                let _ = rx.wait_for(|open| *open).await;
            }
            self.inner.load_stored(id).await
        })
    }
    fn write(
        &self,
        w: agentloop::store::RecordWrite,
    ) -> futures::future::BoxFuture<'static, Result<(), agentloop::StoreError>> {
        self.inner.write(w)
    }
    fn delete(
        &self,
        id: &str,
    ) -> futures::future::BoxFuture<'static, Result<bool, agentloop::StoreError>> {
        self.inner.delete(id)
    }
    fn list_stored(
        &self,
        s: Option<Vec<agentloop::store::StatusKind>>,
    ) -> futures::future::BoxFuture<
        'static,
        Result<Vec<agentloop::store::StoredEntry>, agentloop::StoreError>,
    > {
        self.inner.list_stored(s)
    }
    fn cas_status(
        &self,
        id: &str,
        from: Vec<agentloop::store::StatusKind>,
        to: SessionStatus,
    ) -> futures::future::BoxFuture<
        'static,
        Result<agentloop::store::CasOutcome, agentloop::StoreError>,
    > {
        self.inner.cas_status(id, from, to)
    }
    fn flush(&self) -> futures::future::BoxFuture<'static, Result<(), agentloop::StoreError>> {
        self.inner.flush()
    }
    fn beat(
        &self,
        i: &str,
        t: u64,
    ) -> futures::future::BoxFuture<'static, Result<(), agentloop::StoreError>> {
        self.inner.beat(i, t)
    }
    fn heartbeat(
        &self,
        i: &str,
    ) -> futures::future::BoxFuture<'static, Result<Option<u64>, agentloop::StoreError>> {
        self.inner.heartbeat(i)
    }
}

/// Issue 31 (by-id work without detours): a push, an inspection, a subscription and a
/// stop of a live session go straight to it, so a supervisor busy elsewhere (here:
/// starting a session whose record load hangs) holds none of them. Through the
/// supervisor's mailbox each would wait behind the start.
#[tokio::test(start_paused = true)]
async fn s25_a_push_to_a_live_session_does_not_wait_for_the_supervisor() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let slow = Arc::new(SlowLoads {
        inner: MemoryStore::new(),
        release: tokio::sync::watch::Sender::new(false),
    });
    let mut args = kinds(ledgers.clone());
    args.store = Some(slow.clone());
    let sup = Sup::start(args).await.unwrap();
    sup.spawn(SessionSpec::new("fast", "sim")).await.unwrap();
    // The supervisor starts "slow-1" and waits for its record.
    let starting = {
        let sup = sup.clone();
        tokio::spawn(async move {
            sup.spawn(SessionSpec::new("slow-1", "sim").persistent(true))
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!starting.is_finished(), "the slow start is still waiting");
    // Pushes to the live session are answered meanwhile, and delivered.
    for id in 1..=3 {
        within(
            "a push while the supervisor is busy",
            sup.push("fast", item(id)),
        )
        .await
        .unwrap();
    }
    // So are an inspection, a subscription, and a stop, each by id.
    let info = within("an inspection while busy", sup.inspect("fast"))
        .await
        .unwrap();
    assert_eq!(info.session_id, "fast");
    let mut events = within(
        "a subscription while busy",
        sup.subscribe("fast", EventFilter::all()),
    )
    .await
    .unwrap();
    within("a stop while busy", sup.stop("fast", StopOptions::drain()))
        .await
        .unwrap();
    within("the stream ends with the session", async {
        while let Some(e) = events.next().await {
            if matches!(e, SessionEvent::Ended(_)) {
                return;
            }
        }
        panic!("the stream closed without Ended");
    })
    .await;
    assert!(
        !starting.is_finished(),
        "still waiting: the requests went around it"
    );
    slow.release.send_replace(true);
    within("the slow start", starting).await.unwrap().unwrap();
    sup.stop("slow-1", StopOptions::drain()).await.unwrap();
    within("sessions leave the registry", async {
        while !sup.list().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(delivered(&ledgers), vec![1, 2, 3]);
}

/// S23 + S26: a detached session that fails is restarted detached: the new incarnation
/// goes on in the background, finishes what the record holds, finalizes its record
/// `Completed` and ends (an attached incarnation would stay, idle, and keep its record
/// `Running`).
#[tokio::test(start_paused = true)]
async fn s23_a_restarted_detached_session_is_detached_again() {
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let gate = agentloop_sim::Gate::new();
    let mut args = kinds(ledgers.clone());
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (g, l) = (gate.clone(), ledgers.clone());
    // The first incarnation waits at each step for the gate and panics at turn 0's
    // step 1; later ones run freely.
    args.kinds.insert(
        "gated".into(),
        agent_kind("gated", move |_: &[u8]| {
            let agent = if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                SimAgent::new(steps(2))
                    .with_step_gate(g.clone())
                    .with_fault(Some(0), 1, Fault::Panic, true)
            } else {
                SimAgent::new(steps(2))
            };
            l.lock().push(agent.ledger());
            Ok(agent)
        }),
    );
    args.store = Some(mem.clone() as Arc<dyn CheckpointStore<SimItem>>);
    let sup = Sup::start(args).await.unwrap();
    let mut ends = sup.session_ends().expect("the supervisor is running");
    sup.spawn(
        SessionSpec::new("d", "gated")
            .persistent(true)
            .durability(Durability::Sync),
    )
    .await
    .unwrap();
    sup.push("d", item(1)).await.unwrap();
    sup.push("d", item(2)).await.unwrap();
    sup.detach("d").await.unwrap();
    gate.open_all();
    let end = within("the restarted incarnation's end", ends.recv())
        .await
        .expect("the feed is open");
    assert_eq!(end.id, "d");
    assert_eq!(end.restarts, 1, "it ended after one restart");
    assert_eq!(end.exit.reason, ExitReason::Completed);
    assert_eq!(delivered(&ledgers), vec![1, 2]);
    assert_eq!(mem.get("d").unwrap().status, SessionStatus::Completed);
    assert!(sup.list().await.is_empty());
}
