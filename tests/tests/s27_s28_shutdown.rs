//! S27 (shutdown coordinator) and S28 (configuration): phases, drain gate, records of
//! sessions ended by shutdown, cleanup hooks, idempotence. Paused clock throughout: a
//! 30-second grace costs no wall time.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use agentloop::shutdown::{HookOutcome, ShutdownReport};
use agentloop::store::{CasOutcome, RecordWrite, Stored, StoredEntry};
use agentloop::{
    config::ShutdownConfig, shutdown::CleanupHook, store::CheckpointActor, store::SessionRecord,
    store::SessionStatus, store::StatusKind, CheckpointStore, MemoryStore, Runtime, RuntimeBuilder,
    SessionSpec, StoreError, SupervisorError,
};
use agentloop_sim::{Gate, Script, SimAgent, SimEvent, SimItem};
use agentloop_tests::{item, within, Handle, TempDir};
use futures::future::BoxFuture;
use parking_lot::Mutex;

type Rt = Runtime<SimItem, SimEvent>;
type Store = Arc<dyn CheckpointStore<SimItem>>;

/// A store that never answers the final checkpoint of the listed sessions (the first
/// write of an `Interrupted` record, by `save` or by the conditional `save_live`), so
/// the session cannot finish its teardown and must be killed; everything else, live
/// `Running` writes included, goes to the inner store.
struct HangingStore {
    inner: Store,
    hang: Mutex<HashSet<String>>,
}

impl HangingStore {
    fn hangs(&self, w: &RecordWrite) -> bool {
        w.header.status == SessionStatus::Interrupted && self.hang.lock().remove(w.session_id())
    }

    fn new(inner: Store, hang: &[&str]) -> Arc<Self> {
        Arc::new(HangingStore {
            inner,
            hang: Mutex::new(hang.iter().map(|s| s.to_string()).collect()),
        })
    }
}

impl CheckpointStore<SimItem> for HangingStore {
    fn load_stored<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        self.inner.load_stored(id)
    }
    fn write(&self, w: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        if self.hangs(&w) {
            return Box::pin(std::future::pending());
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
        self.inner.flush()
    }
    fn beat(&self, i: &str, now: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.beat(i, now)
    }
    fn heartbeat(&self, i: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        self.inner.heartbeat(i)
    }
}

/// Agents by their config: `polite` reaches a safe point every second; `stubborn`
/// waits at a gate that never opens before its first step (no safe point, ever).
fn builder(store: Store, never: Gate) -> RuntimeBuilder<SimItem, SimEvent> {
    Runtime::builder()
        .store(store)
        .flush_logs(None)
        .register_agent("sim", move |cfg: &[u8]| {
            let script = Script::react(3, Duration::from_secs(1), Duration::from_secs(1));
            Ok(match cfg {
                b"stubborn" => SimAgent::new(script).with_step_gate(never.clone()),
                _ => SimAgent::new(script),
            })
        })
}

async fn session(rt: &Rt, id: &str, cfg: &str, items: &[u64]) -> Handle {
    let h = rt
        .supervisor()
        .spawn(
            SessionSpec::new(id, "sim")
                .config(cfg.as_bytes().to_vec())
                .persistent(true),
        )
        .await
        .expect("spawn");
    for &i in items {
        h.push(item(i)).await.expect("push");
    }
    h
}

fn stored_items(rec: &SessionRecord<SimItem>) -> Vec<u64> {
    let mut v: Vec<u64> = rec
        .interrupted_items
        .iter()
        .chain(&rec.unhandled_items)
        .map(|i| i.id)
        .collect();
    v.sort_unstable();
    v
}

/// Waits (bounded, on the paused clock) until the grace stop has reached `h`: the
/// coordinator sends it only after the drain gate closed.
async fn until_stopped(h: &Handle) {
    for _ in 0..10_000 {
        if h.is_stopped() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the grace stop never arrived");
}

fn short(grace: u64, force: u64) -> ShutdownConfig {
    ShutdownConfig {
        grace: Duration::from_secs(grace),
        force_timeout: Duration::from_secs(force),
        ..ShutdownConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn s27_every_session_exits_in_grace_none_forced() {
    let mem = Arc::new(MemoryStore::new());
    let (rt, _) = builder(mem.clone(), Gate::new()).start().await.unwrap();
    for (n, id) in ["a", "b", "c"].iter().enumerate() {
        let base = n as u64 * 10;
        session(&rt, id, "polite", &[base + 1, base + 2]).await;
    }
    let started = tokio::time::Instant::now();
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(report.strategy, "cooperative");
    assert_eq!(report.sessions.total, 3);
    assert_eq!(report.sessions.exited_in_grace, 3);
    assert_eq!((report.sessions.forced, report.sessions.killed), (0, 0));
    assert_eq!(report.checkpoints.saved, 3);
    assert_eq!(report.checkpoints.items_saved, 6);
    assert_eq!(report.checkpoints.failed, 0);
    assert!(report.is_clean(), "{report:?}");
    // Each session stopped at its next safe point (one step of 1 s), not at the grace.
    assert!(report.phases.grace <= Duration::from_secs(2), "{report:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    for (n, id) in ["a", "b", "c"].iter().enumerate() {
        let rec = mem.get(id).expect("record");
        assert_eq!(rec.status, SessionStatus::Interrupted);
        assert_eq!(rec.stop_cause.as_deref(), Some("shutdown"));
        let base = n as u64 * 10;
        assert_eq!(stored_items(&rec), vec![base + 1, base + 2]);
        assert!(
            rec.state.is_some(),
            "cut at a safe point: mid-turn state kept"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn s27_stubborn_session_is_forced_then_killed_and_keeps_its_record() {
    let mem = Arc::new(MemoryStore::new());
    // Its final checkpoint hangs too, so even the Immediate stop cannot end it.
    let store = HangingStore::new(mem.clone(), &["k"]);
    let (rt, _) = builder(store, Gate::new())
        .shutdown_config(short(10, 3))
        .start()
        .await
        .unwrap();
    session(&rt, "k", "stubborn", &[1, 2, 3]).await;
    let started = tokio::time::Instant::now();
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(report.sessions.total, 1);
    assert_eq!(report.sessions.exited_in_grace, 0);
    assert_eq!(report.sessions.forced, 0);
    assert_eq!(report.sessions.killed, 1);
    // Grace ran to its end (10 s), then the force timeout (3 s), then the kill.
    assert!(report.phases.grace >= Duration::from_secs(10), "{report:?}");
    assert!(report.phases.force >= Duration::from_secs(3), "{report:?}");
    assert!(started.elapsed() >= Duration::from_secs(13));
    assert!(!report.is_clean());
    // The killed session's last durable (sync) record, marked Interrupted: all items.
    let rec = mem.get("k").expect("record");
    assert_eq!(rec.status, SessionStatus::Interrupted);
    assert_eq!(stored_items(&rec), vec![1, 2, 3]);
    assert_eq!(report.checkpoints.saved, 1);
    assert_eq!(report.checkpoints.items_saved, 3);
}

#[tokio::test(start_paused = true)]
async fn s27_mixed_grace_forced_killed_all_interrupted() {
    let mem = Arc::new(MemoryStore::new());
    let store = HangingStore::new(mem.clone(), &["killed"]);
    let (rt, _) = builder(store, Gate::new())
        .shutdown_config(short(5, 2))
        .start()
        .await
        .unwrap();
    session(&rt, "graceful", "polite", &[1, 2]).await;
    session(&rt, "forced", "stubborn", &[3, 4]).await;
    session(&rt, "killed", "stubborn", &[5, 6, 7]).await;
    // A non-persistent session too: it ends, nothing is stored, its items are counted
    // as unsaved.
    rt.supervisor()
        .spawn(SessionSpec::new("volatile", "sim").initial_items(vec![item(8)]))
        .await
        .unwrap();
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(report.sessions.total, 4);
    assert_eq!(report.sessions.exited_in_grace, 2, "{report:?}");
    assert_eq!(report.sessions.forced, 1, "{report:?}");
    assert_eq!(report.sessions.killed, 1, "{report:?}");
    assert_eq!(report.checkpoints.saved, 3);
    assert_eq!(report.checkpoints.items_saved, 7);
    assert_eq!(report.checkpoints.items_unsaved, 1);
    for (id, want) in [
        ("graceful", vec![1, 2]),
        ("forced", vec![3, 4]),
        ("killed", vec![5, 6, 7]),
    ] {
        let rec = mem.get(id).expect(id);
        assert_eq!(rec.status, SessionStatus::Interrupted, "{id}");
        assert_eq!(stored_items(&rec), want, "{id}");
    }
    assert!(mem.get("volatile").is_none());
}

#[tokio::test(start_paused = true)]
async fn s27_immediate_strategy_forces_at_once() {
    let mem = Arc::new(MemoryStore::new());
    let (rt, _) = builder(mem.clone(), Gate::new())
        .shutdown_config(ShutdownConfig {
            strategy: "immediate".into(),
            ..ShutdownConfig::default()
        })
        .start()
        .await
        .unwrap();
    session(&rt, "s", "stubborn", &[1]).await;
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(report.strategy, "immediate");
    assert_eq!(
        (report.sessions.exited_in_grace, report.sessions.forced),
        (0, 1)
    );
    assert_eq!(report.phases.grace, Duration::ZERO);
    assert_eq!(mem.get("s").unwrap().status, SessionStatus::Interrupted);
}

#[tokio::test(start_paused = true)]
async fn s27_drain_strategy_finishes_accepted_items_in_grace() {
    let mem = Arc::new(MemoryStore::new());
    let (rt, _) = builder(mem.clone(), Gate::new())
        .shutdown_config(ShutdownConfig {
            strategy: "drain".into(),
            ..ShutdownConfig::default()
        })
        .start()
        .await
        .unwrap();
    let h = session(&rt, "d", "polite", &[1, 2, 3]).await;
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(report.sessions.exited_in_grace, 1);
    let exit = h.wait().await;
    assert_eq!(
        exit.counters.items_delivered, 3,
        "drain delivers every item"
    );
    assert!(exit.unhandled_items.is_empty() && exit.interrupted_items.is_empty());
    // Ended by shutdown, so recorded Interrupted (empty) and resumed on the next start.
    let rec = mem.get("d").unwrap();
    assert_eq!(rec.status, SessionStatus::Interrupted);
    assert!(stored_items(&rec).is_empty());
}

#[tokio::test(start_paused = true)]
async fn s27_empty_runtime_shuts_down_at_once() {
    let (rt, _) = builder(Arc::new(MemoryStore::new()), Gate::new())
        .start()
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(report.sessions.total, 0);
    assert!(report.is_clean());
    assert!(
        started.elapsed() < Duration::from_millis(1),
        "no phase waited"
    );
    assert_eq!(
        report.phases.total,
        started.elapsed().min(report.phases.total)
    );
}

#[tokio::test(start_paused = true)]
async fn s27_cleanup_hooks_run_in_order_isolated_and_bounded() {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let hook = |n: u32, how: &'static str| {
        let ran = ran.clone();
        CleanupHook::new(format!("hook-{n}"), move || {
            let ran = ran.clone();
            async move {
                ran.lock().push(n);
                match how {
                    "fail" => Err("disk full".to_string()),
                    "panic" => panic!("hook {n} panics"),
                    "hang" => std::future::pending().await,
                    _ => Ok(()),
                }
            }
        })
    };
    let (rt, _) = builder(Arc::new(MemoryStore::new()), Gate::new())
        .shutdown_config(ShutdownConfig {
            cleanup: Duration::from_secs(4),
            ..ShutdownConfig::default()
        })
        .on_shutdown(hook(1, "ok"))
        .on_shutdown(hook(2, "fail"))
        .on_shutdown(hook(3, "panic"))
        .on_shutdown(hook(4, "hang"))
        .on_shutdown(hook(5, "ok"))
        .start()
        .await
        .unwrap();
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(
        *ran.lock(),
        vec![1, 2, 3, 4, 5],
        "registration order, none skipped"
    );
    let outcomes: Vec<&HookOutcome> = report.hooks.iter().map(|h| &h.outcome).collect();
    assert_eq!(outcomes[0], &HookOutcome::Ok);
    assert_eq!(outcomes[1], &HookOutcome::Failed("disk full".into()));
    assert!(matches!(outcomes[2], HookOutcome::Failed(m) if m.contains("panicked")));
    assert_eq!(outcomes[3], &HookOutcome::TimedOut);
    assert_eq!(outcomes[4], &HookOutcome::Ok);
    assert_eq!(
        (
            report.hooks_ok(),
            report.hooks_failed(),
            report.hooks_timed_out()
        ),
        (2, 2, 1)
    );
    // The hanging hook was cut at its share (4 s left / 2 hooks left = 2 s).
    assert_eq!(report.hooks[3].took, Duration::from_secs(2));
    assert!(
        report.phases.cleanup <= Duration::from_secs(4),
        "{report:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn s27_drain_gate_refuses_spawns_and_hands_pushes_back_as_late() {
    let never = Gate::new();
    let (rt, _) = builder(Arc::new(MemoryStore::new()), never.clone())
        .start()
        .await
        .unwrap();
    let h = session(&rt, "s", "stubborn", &[1]).await;
    let shutdown = rt.shutdown_handle();
    shutdown.begin();
    // The grace stop reaches the session only after the gate closed.
    until_stopped(&h).await;
    let err = rt
        .supervisor()
        .spawn(SessionSpec::new("new", "sim"))
        .await
        .unwrap_err();
    assert!(matches!(err, SupervisorError::ShuttingDown(ref id) if id == "new"));
    assert!(err.to_string().contains("shutting down"), "{err}");
    match rt.supervisor().push("s", item(99)).await {
        Err(agentloop::PushError::Late { item }) => {
            assert_eq!(item.id, 99, "the item is handed back")
        }
        other => panic!("expected a late push, got {other:?}"),
    }
    never.open_all();
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(report.late_items, 1);
    assert_eq!(report.sessions.exited_in_grace, 1);
}

#[tokio::test(start_paused = true)]
async fn s27_two_concurrent_requests_get_the_same_report() {
    let (rt, _) = builder(Arc::new(MemoryStore::new()), Gate::new())
        .start()
        .await
        .unwrap();
    session(&rt, "a", "polite", &[1]).await;
    session(&rt, "b", "stubborn", &[2]).await;
    let (h1, h2) = (rt.shutdown_handle(), rt.shutdown_handle());
    let (r1, r2) = within("both", async { tokio::join!(h1.shutdown(), h2.shutdown()) }).await;
    let (r1, r2): (ShutdownReport, ShutdownReport) = (r1.unwrap(), r2.unwrap());
    assert_eq!(r1, r2);
    assert_eq!(r1.sessions.total, 2, "one shutdown ran, not two");
    // A third request after the end gets it too, at once.
    let r3 = rt.shutdown().await.unwrap();
    assert_eq!(r1, r3);
}

#[tokio::test(start_paused = true)]
async fn s28_second_request_skips_to_force() {
    let (rt, _) = builder(Arc::new(MemoryStore::new()), Gate::new())
        .start()
        .await
        .unwrap();
    let h = session(&rt, "s", "stubborn", &[1]).await;
    let shutdown = rt.shutdown_handle();
    shutdown.begin();
    until_stopped(&h).await;
    let started = tokio::time::Instant::now();
    shutdown.force();
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert!(report.force_requested);
    assert_eq!(report.sessions.forced, 1);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the 30 s grace was cut short"
    );
}

#[tokio::test(start_paused = true)]
async fn s27_unknown_strategy_and_invalid_config_are_refused() {
    let err = builder(Arc::new(MemoryStore::new()), Gate::new())
        .shutdown_config(ShutdownConfig {
            strategy: "polite".into(),
            ..ShutdownConfig::default()
        })
        .start()
        .await
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("shutdown.strategy") && msg.contains("cooperative, drain, immediate"),
        "{msg}"
    );
    let err = builder(Arc::new(MemoryStore::new()), Gate::new())
        .shutdown_config(ShutdownConfig {
            grace: Duration::ZERO,
            ..ShutdownConfig::default()
        })
        .start()
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("shutdown.grace"), "{err}");
}

/// Every session ended by shutdown — in grace, forced, killed — is `Interrupted` on
/// disk, and a new runtime on the same data directory resumes them with every item.
#[tokio::test(start_paused = true)]
async fn s27_new_runtime_on_the_same_data_dir_resumes_every_interrupted_session() {
    let dir = TempDir::new("s27-resume");
    let client = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    let store = HangingStore::new(Arc::new(client.clone()), &["killed"]);
    let (rt, _) = builder(store, Gate::new())
        .shutdown_config(short(5, 2))
        .start()
        .await
        .unwrap();
    session(&rt, "graceful", "polite", &[1, 2]).await;
    session(&rt, "forced", "stubborn", &[3, 4]).await;
    session(&rt, "killed", "stubborn", &[5, 6, 7]).await;
    let report = within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(
        (
            report.sessions.exited_in_grace,
            report.sessions.forced,
            report.sessions.killed
        ),
        (1, 1, 1)
    );
    client.close().await.unwrap();

    // The next start, on the data directory, with agents that can finish.
    let ledgers = Arc::new(Mutex::new(Vec::new()));
    let l = ledgers.clone();
    let (rt2, start) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("sim", move |_cfg: &[u8]| {
            let agent = SimAgent::new(Script::react(3, Duration::ZERO, Duration::ZERO));
            l.lock().push(agent.ledger());
            Ok(agent)
        })
        .start()
        .await
        .unwrap();
    let mut resumed = start.resumed.clone();
    resumed.sort();
    assert_eq!(resumed, vec!["forced", "graceful", "killed"]);
    assert_eq!(start.items, 7, "every item came back");
    // Drain them: every item is delivered exactly once.
    for id in &start.resumed {
        let events = rt2
            .supervisor()
            .subscribe(id, agentloop::EventFilter::all())
            .await
            .unwrap();
        rt2.supervisor()
            .stop(id, agentloop::StopOptions::drain())
            .await
            .unwrap();
        within("drain", agentloop_tests::collect(events)).await;
    }
    let mut delivered: Vec<u64> = ledgers
        .lock()
        .iter()
        .flat_map(|l| l.lock().delivered_ids())
        .collect();
    delivered.sort_unstable();
    assert_eq!(delivered, vec![1, 2, 3, 4, 5, 6, 7]);
    let _ = rt2.shutdown().await.unwrap();
}

/// S27 step 4: the logs are flushed once, at the end of cleanup, after the hooks.
#[tokio::test(start_paused = true)]
async fn s27_cleanup_flushes_logs_after_the_hooks() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let (o1, o2) = (order.clone(), order.clone());
    let (rt, _) = builder(Arc::new(MemoryStore::new()), Gate::new())
        .on_shutdown(CleanupHook::new("hook", move || {
            let o = o1.clone();
            async move {
                o.lock().push("hook");
                Ok(())
            }
        }))
        .flush_logs(Some(Arc::new(move || o2.lock().push("logs"))))
        .start()
        .await
        .unwrap();
    within("shutdown", rt.shutdown()).await.unwrap();
    assert_eq!(*order.lock(), vec!["hook", "logs"]);
}
