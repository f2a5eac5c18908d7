//! S22–S24: attach (bound or observer), detach to the background with a CAS-finalized
//! record, and cancel by id, including a cancel written directly to the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    exit::CheckpointOutcome, store::SessionStatus, store::StatusKind, supervisor::agent_kind,
    supervisor::RestartBudget, CheckpointStore, Durability, ExitReason, MemoryStore, RestartPolicy,
    SessionError, SessionSpec, SupervisorArgs, SupervisorHandle,
};
use agentloop_sim::{Fault, Gate, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;

fn config(id: &str) -> SessionSpec<SimItem> {
    SessionSpec::new(id, "default")
        .persistent(true)
        .kind("sim")
        .durability(Durability::Sync)
        .owner("me")
}

async fn gated_bg(
    id: &str,
    mem: &Arc<MemoryStore<SimItem>>,
    agent: SimAgent,
) -> (Handle, Gate, Probe) {
    let gate = Gate::new();
    let (tx, probe) = agentloop_tests::probe();
    let h = spawn_on(
        config(id),
        agent.with_step_gate(gate.clone()).with_probe(tx),
        mem.clone() as Arc<dyn CheckpointStore<SimItem>>,
    )
    .await;
    (h, gate, probe)
}

/// S23: the record lists the in-flight and queued items in order; the session drains;
/// the record ends `Completed`.
#[tokio::test(start_paused = true)]
async fn s23_detach_records_items_in_order_then_completes() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let (h, gate, mut probe) = gated_bg("bg", &mem, SimAgent::new(steps(2))).await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.push(item(3)).await.unwrap();
    h.detach().await.unwrap();
    let rec = mem.get("bg").unwrap();
    assert_eq!(rec.status, SessionStatus::Running);
    assert_eq!(ids(&rec.interrupted_items), vec![1], "in flight");
    assert_eq!(ids(&rec.unhandled_items), vec![2, 3], "queued, in order");
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(exit.counters.items_delivered, 3);
    assert_eq!(exit.checkpoint, CheckpointOutcome::Saved);
    assert_eq!(mem.get("bg").unwrap().status, SessionStatus::Completed);
}

/// S23: an agent error in the background ends the record `Failed` with the error text,
/// and a later resume is refused with that text.
#[tokio::test(start_paused = true)]
async fn s23_background_failure_is_final_and_refuses_resume() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let (h, gate, mut probe) = gated_bg(
        "bg-fail",
        &mem,
        SimAgent::new(steps(2)).with_fault(Some(0), 1, Fault::Fail, true),
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.detach().await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert!(matches!(exit.reason, ExitReason::Failed(_)));
    match mem.get("bg-fail").unwrap().status {
        SessionStatus::Failed(e) => assert!(e.contains("simulated failure"), "{e}"),
        s => panic!("expected Failed, got {s:?}"),
    }
    let again = spawn_on(
        config("bg-fail"),
        SimAgent::new(steps(1)),
        mem.clone() as Arc<dyn CheckpointStore<SimItem>>,
    )
    .await;
    let exit = within("refusal", again.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("simulated failure") && e.contains("Failed")),
        "{:?}",
        exit.reason
    );
}

/// S22: a bound client that disconnects before detach cancels the work (Immediate);
/// after a detach its disconnect does nothing.
#[tokio::test(start_paused = true)]
async fn s22_bound_client_disconnect_cancels_only_before_detach() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let (h, _gate, mut probe) = gated_bg("bound", &mem, SimAgent::new(steps(2))).await;
    let client = h.attach_bound();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    drop(client);
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(i) if i.mode == agentloop::cancel::CancelMode::Immediate)
    );
    assert_eq!(exit.stop_cause.as_deref(), Some("client disconnected"));

    let (h, gate, mut probe) = gated_bg("bound-2", &mem, SimAgent::new(steps(2))).await;
    let client = h.attach_bound();
    let observer = h.subscribe(); // an observer attach: it never cancels anything
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.detach().await.unwrap();
    drop(client);
    drop(observer);
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(exit.counters.items_delivered, 1);
}

/// S23: detach without a store is refused with a clear error.
#[tokio::test(start_paused = true)]
async fn s23_detach_without_a_store_is_refused() {
    let h = spawn("no-store", SimAgent::new(steps(1))).await;
    let e = h.detach().await.unwrap_err();
    assert!(matches!(e, SessionError::DetachNeedsStore(ref id) if id == "no-store"));
    assert!(e.to_string().contains("no checkpoint store"), "{e}");
}

fn supervisor_args(
    mem: &Arc<MemoryStore<SimItem>>,
    gate: Gate,
) -> SupervisorArgs<SimItem, SimEvent> {
    let mut kinds = HashMap::new();
    kinds.insert(
        "sim".to_string(),
        agent_kind("sim", move |_: &[u8]| {
            Ok(SimAgent::new(steps(2)).with_step_gate(gate.clone()))
        }),
    );
    SupervisorArgs {
        kinds,
        store: Some(mem.clone() as Arc<dyn CheckpointStore<SimItem>>),
        owner: Some("me".into()),
        budget: RestartBudget::default(),
        heartbeat: agentloop::store::DEFAULT_HEARTBEAT,
        metrics: None,
        limits: Default::default(),
    }
}

/// S24: cancel(id) during a background run stops it and the record ends `Canceled`;
/// on a `Completed` record it is a no-op that returns `Completed`.
#[tokio::test(start_paused = true)]
async fn s24_cancel_by_id_stops_a_background_run() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let gate = Gate::new();
    let sup = SupervisorHandle::start(supervisor_args(&mem, gate.clone()))
        .await
        .unwrap();
    let h = sup
        .spawn(
            SessionSpec::new("c", "sim")
                .persistent(true)
                .restart(RestartPolicy::Never)
                .initial_items(vec![item(1), item(2)]),
        )
        .await
        .unwrap();
    sup.detach("c").await.unwrap();
    assert_eq!(sup.cancel("c").await.unwrap(), SessionStatus::Canceled);
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(mem.get("c").unwrap().status, SessionStatus::Canceled);

    let mut done = agentloop::store::SessionRecord::new("done", "sim", 1);
    done.status = SessionStatus::Completed;
    mem.insert(done);
    assert_eq!(sup.cancel("done").await.unwrap(), SessionStatus::Completed);
    assert_eq!(mem.get("done").unwrap().status, SessionStatus::Completed);
}

/// S24/S19: a cancel that lands just before the finalizer still wins: the finalizer's
/// compare-and-swap finds `Canceled` and leaves it (never `Completed` after `Canceled`).
#[tokio::test(start_paused = true)]
async fn s24_cancel_just_before_the_finalizer_wins() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let (h, gate, mut probe) = gated_bg("race", &mem, SimAgent::new(steps(2))).await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.detach().await.unwrap();
    // The cancel is written first; the session has not polled yet and finishes its
    // drain right after: its finalizer runs second.
    mem.cas_status("race", vec![StatusKind::Running], SessionStatus::Canceled)
        .await
        .unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(
        exit.checkpoint,
        CheckpointOutcome::NotAttempted,
        "the finalizer lost"
    );
    assert_eq!(mem.get("race").unwrap().status, SessionStatus::Canceled);
}

/// S24: a cancel written directly to the store, as another process would, is noticed
/// within one poll interval.
#[tokio::test(start_paused = true)]
async fn s24_cancel_written_to_the_store_is_noticed_within_one_interval() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let gate = Gate::new();
    let (tx, mut probe) = agentloop_tests::probe();
    let h = spawn_on(
        config("remote").poll_interval_for_test(Duration::from_secs(10)),
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_probe(tx),
        mem.clone() as Arc<dyn CheckpointStore<SimItem>>,
    )
    .await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.detach().await.unwrap();
    let written = tokio::time::Instant::now();
    mem.cas_status("remote", vec![StatusKind::Running], SessionStatus::Canceled)
        .await
        .unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(
        written.elapsed() <= Duration::from_secs(10),
        "{:?}",
        written.elapsed()
    );
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.stop_cause.as_deref(), Some("canceled"));
    assert_eq!(mem.get("remote").unwrap().status, SessionStatus::Canceled);
}

trait PollForTest {
    fn poll_interval_for_test(self, d: Duration) -> Self;
}
impl PollForTest for SessionSpec<SimItem> {
    fn poll_interval_for_test(mut self, d: Duration) -> Self {
        self.poll_interval = Some(d);
        self
    }
}

/// S22 through the supervisor: a bound attachment's drop cancels the work; an observer's
/// drop does not.
#[tokio::test(start_paused = true)]
async fn s22_attach_by_id_bound_and_observer() {
    use agentloop::{supervisor::AttachMode, EventFilter};
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let gate = Gate::new();
    let sup = SupervisorHandle::start(supervisor_args(&mem, gate.clone()))
        .await
        .unwrap();
    let watched = sup
        .spawn(SessionSpec::new("watched", "sim").initial_items(vec![item(1)]))
        .await
        .unwrap();
    let observer = sup
        .attach("watched", AttachMode::Observer, EventFilter::all())
        .await
        .unwrap();
    assert!(observer.bound.is_none());
    drop(observer);
    let bound_session = sup
        .spawn(SessionSpec::new("bound", "sim").initial_items(vec![item(2)]))
        .await
        .unwrap();
    let bound = sup
        .attach("bound", AttachMode::Bound, EventFilter::turn_ends())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(bound);
    let exit = within("bound exit", bound_session.wait()).await;
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert!(
        watched.exit_state().is_none(),
        "the observer's drop cancels nothing"
    );
    gate.open_all();
    sup.stop("watched", agentloop::StopOptions::drain())
        .await
        .unwrap();
    assert_eq!(
        within("watched exit", watched.wait())
            .await
            .counters
            .items_delivered,
        1
    );
}

/// S10 + S23 + S27 under `exit` durability: a background session's record is kept
/// current as items leave the session (a completed turn, a plan's drop). A session
/// that then fails during a drain shutdown is not restarted (the runtime is stopping)
/// and its record is left to the next start (S18, S26): it must list neither the item
/// a turn delivered nor the one the plan dropped. (Before: it still listed all three,
/// as the detach wrote them, and the next start would have offered them again.)
#[tokio::test(start_paused = true)]
async fn s23_exit_durability_record_follows_items_out_of_the_session() {
    use agentloop::{config::ShutdownConfig, Runtime};
    use agentloop_sim::PlanPolicy;

    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let gate = Gate::new();
    let (tx, mut probe) = agentloop_tests::probe();
    let g = gate.clone();
    let (rt, _) = Runtime::builder()
        .store(mem.clone())
        .flush_logs(None)
        .shutdown_config(ShutdownConfig {
            strategy: "drain".into(),
            grace: Duration::from_secs(60),
            ..ShutdownConfig::default()
        })
        .register_agent("sim", move |_: &[u8]| {
            Ok(SimAgent::new(steps(2))
                .with_step_gate(g.clone())
                .with_probe(tx.clone())
                .with_plan(PlanPolicy {
                    drop_prefix: Some("spam".into()),
                    ..PlanPolicy::default()
                })
                // Turn 1 panics at its second step.
                .with_fault(Some(1), 1, Fault::Panic, true))
        })
        .start()
        .await
        .unwrap();
    let sup = rt.supervisor();
    let h = sup
        .spawn(
            SessionSpec::new("bg-exit", "sim")
                .persistent(true)
                .durability(Durability::Exit)
                .restart(RestartPolicy::Permanent)
                .initial_items(vec![item(1)]),
        )
        .await
        .unwrap();
    probe.at_step(0, 0).await;
    sup.push("bg-exit", SimItem::new(2, "spam-2"))
        .await
        .unwrap();
    sup.push("bg-exit", item(3)).await.unwrap();
    sup.detach("bg-exit").await.unwrap();
    let rec = mem.get("bg-exit").unwrap();
    assert_eq!(ids(&rec.interrupted_items), vec![1]);
    assert_eq!(ids(&rec.unhandled_items), vec![2, 3]);

    let shutdown = rt.shutdown_handle();
    shutdown.begin();
    for _ in 0..10_000 {
        if h.is_stopped() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(h.is_stopped(), "the drain stop reached the session");
    gate.open_all();
    let exit = within("the session's end", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("panicked")),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.counters.items_delivered, 1);
    assert_eq!(exit.counters.items_dropped_by_plan, 1);
    within("shutdown", rt.shutdown()).await.unwrap();

    let rec = mem.get("bg-exit").unwrap();
    assert_eq!(
        rec.status,
        SessionStatus::Running,
        "left for the next start"
    );
    assert_eq!(
        ids(&rec.interrupted_items),
        vec![3],
        "the failed turn's item"
    );
    assert!(
        rec.unhandled_items.is_empty(),
        "neither the delivered item 1 nor the dropped item 2: {:?}",
        ids(&rec.unhandled_items)
    );
}

/// S24 through `Runtime` (issue 13, 6a): a detached session polls its record at the
/// runtime's heartbeat, so a cancel written by another process with a 1 s heartbeat is
/// noticed within about one second, not the default 10 s.
#[tokio::test(start_paused = true)]
async fn s24_background_sessions_poll_at_the_runtimes_heartbeat() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let gate = Gate::new();
    let g = gate.clone();
    let (runtime, _) = agentloop::Runtime::<SimItem, SimEvent>::builder()
        .store(mem.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .heartbeat(Duration::from_secs(1), Duration::from_secs(3))
        .register_agent("sim", move |_: &[u8]| {
            Ok(SimAgent::new(steps(2)).with_step_gate(g.clone()))
        })
        .start()
        .await
        .unwrap();
    let sup = runtime.supervisor().clone();
    let h = sup
        .spawn(
            SessionSpec::new("hb", "sim")
                .persistent(true)
                .restart(RestartPolicy::Never)
                .initial_items(vec![item(1)]),
        )
        .await
        .unwrap();
    sup.detach("hb").await.unwrap();
    // Another process writes the cancel straight into the store.
    let written = tokio::time::Instant::now();
    mem.cas_status("hb", vec![StatusKind::Running], SessionStatus::Canceled)
        .await
        .unwrap();
    let exit = within("exit", h.wait()).await;
    let noticed = written.elapsed();
    assert!(
        noticed <= Duration::from_millis(1_100),
        "noticed after {noticed:?}; the runtime's heartbeat is 1 s"
    );
    assert!(
        matches!(exit.reason, ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(mem.get("hb").unwrap().status, SessionStatus::Canceled);
    gate.open_all();
    runtime.shutdown().await.unwrap();
}
