//! The Runtime facade (issue 4): sessions ended by a shutdown-style stop are recorded
//! `Interrupted` and a new runtime on the same data directory resumes them with their
//! items; stopping through the runtime drops no queued push.

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    exit::CheckpointOutcome, store::SessionStatus, ExitReason, Runtime, SessionSpec, StopOptions,
};
use agentloop_sim::{Gate, Ledger, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use parking_lot::Mutex;

type Rt = Runtime<SimItem, SimEvent>;

#[tokio::test]
async fn runtime_resumes_interrupted_sessions_with_their_items() {
    let dir = TempDir::new("runtime");
    // Run 1: every step waits at a gate that never opens, so turns are mid-flight.
    let gate = Gate::new();
    let g = gate.clone();
    let (rt, report) = Rt::builder()
        .data_dir(dir.path())
        .register_agent("sim", move |_cfg: &[u8]| {
            Ok(SimAgent::new(steps(2)).with_step_gate(g.clone()))
        })
        .start()
        .await
        .unwrap();
    assert!(report.resumed.is_empty());
    let sup = rt.supervisor().clone();
    for (s, items) in [("alpha", vec![1, 2, 3]), ("beta", vec![4, 5])] {
        sup.spawn(
            SessionSpec::new(s, "sim")
                .persistent(true)
                .initial_items(items.into_iter().map(item).collect()),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let exits = rt
        .stop(
            StopOptions::graceful_timeout(Duration::from_millis(100))
                .shutdown()
                .cause("shutdown"),
        )
        .await
        .unwrap();
    assert_eq!(exits.len(), 2);
    for e in &exits {
        assert_eq!(e.reason, ExitReason::Shutdown, "{e:?}");
        assert_eq!(e.checkpoint, CheckpointOutcome::Saved);
    }
    {
        let b = agentloop::store::SledBackend::open(dir.path()).unwrap();
        for e in b.list(None).unwrap() {
            assert_eq!(*e.record.unwrap().status(), SessionStatus::Interrupted);
        }
    }

    // Run 2: a free-running agent; the runtime resumes both on start.
    let ledgers: Arc<Mutex<Vec<Arc<Mutex<Ledger>>>>> = Arc::new(Mutex::new(Vec::new()));
    let l = ledgers.clone();
    let (rt, report) = Rt::builder()
        .data_dir(dir.path())
        .register_agent("sim", move |_cfg: &[u8]| {
            let a = SimAgent::new(steps(2));
            l.lock().push(a.ledger());
            Ok(a)
        })
        .start()
        .await
        .unwrap();
    let mut resumed = report.resumed.clone();
    resumed.sort();
    assert_eq!(resumed, vec!["alpha".to_string(), "beta".to_string()]);
    assert_eq!(report.items, 5, "{report:?}");
    assert!(report.skipped.is_empty(), "{report:?}");
    let exits = rt.stop(StopOptions::drain()).await.unwrap();
    assert!(exits
        .iter()
        .all(|e| e.unhandled_items.is_empty() && e.interrupted_items.is_empty()));
    let mut delivered: Vec<u64> = ledgers
        .lock()
        .iter()
        .flat_map(|l| l.lock().delivered_ids())
        .collect();
    delivered.sort_unstable();
    assert_eq!(delivered, vec![1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn stopping_through_the_runtime_drops_no_queued_push() {
    let dir = TempDir::new("runtime-stop");
    let (rt, _) = Rt::builder()
        .data_dir(dir.path())
        .register_agent("sim", |_cfg: &[u8]| Ok(SimAgent::new(steps(2))))
        .start()
        .await
        .unwrap();
    let h = rt
        .supervisor()
        .spawn(SessionSpec::new("busy", "sim"))
        .await
        .unwrap();
    for id in 0..200 {
        h.push(item(id)).no_wait(); // queued in the session's mailbox
    }
    let exits = rt.stop(StopOptions::bare()).await.unwrap();
    let exit = &exits[0];
    let late = h.take_late_items().len() as u64;
    let held = (exit.unhandled_items.len() + exit.interrupted_items.len()) as u64;
    assert_eq!(
        exit.counters.items_delivered + exit.counters.items_dropped_by_plan + held + late,
        200,
        "every queued push is delivered, unhandled or late: {exit:?}"
    );
}

/// Issue 12 (S15, S18): a stored record that does not decode as the runtime's item type
/// is skipped at start, left untouched, and logged at WARN with its id and the reason,
/// so an application that never reads `StartReport::skipped` still hears of it.
#[tokio::test]
async fn an_undecodable_record_is_logged_at_warn_with_its_id_and_reason() {
    use std::io::Write;

    use agentloop::{store::CheckpointActor, store::SessionRecord, CheckpointStore};

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let dir = TempDir::new("runtime-warn");
    {
        // Written by a program whose items are strings, not `SimItem`s.
        let store = CheckpointActor::<String>::spawn(dir.path()).await.unwrap();
        let mut rec = SessionRecord::<String>::new("wrong-type", "sim", 1);
        rec.status = SessionStatus::Interrupted;
        rec.unhandled_items = vec!["a string, not a SimItem".into()];
        store.save(rec).await.unwrap();
        store.close().await.unwrap();
    }
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (rt, report) = Rt::builder()
        .data_dir(dir.path())
        .register_agent("sim", |_cfg: &[u8]| Ok(SimAgent::new(steps(1))))
        .start()
        .await
        .expect("an undecodable record does not stop the start");
    assert!(report.resumed.is_empty(), "{report:?}");
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert_eq!(report.skipped[0].0, "wrong-type");
    let log = String::from_utf8(capture.0.lock().clone()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("wrong-type"))
        .unwrap_or_else(|| panic!("no log line names the record:\n{log}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("does not decode"), "{line}");
    assert!(
        line.contains("SimItem") || line.contains(&report.skipped[0].1),
        "the reason is in the line: {line}"
    );
    rt.shutdown().await.unwrap();
    // Left untouched (S18): the record still reads with the type that wrote it.
    let store = CheckpointActor::<String>::spawn(dir.path()).await.unwrap();
    let rec = store
        .load("wrong-type")
        .await
        .unwrap()
        .expect("still there");
    assert_eq!(
        rec.unhandled_items,
        vec!["a string, not a SimItem".to_string()]
    );
    store.close().await.unwrap();
}

/// Issue 16 (2): a record still `Running` under another instance whose heartbeat is
/// fresh is not resumed, and the report says whose it is, when its lease expires and
/// what to do; once the lease has expired it is resumed and counted as recovered after
/// a crash, apart from sessions interrupted by a shutdown.
#[tokio::test]
async fn a_live_owner_is_named_with_its_lease_and_a_dead_ones_sessions_are_recovered() {
    use agentloop::store::SessionRecord;
    use agentloop::store::{CheckpointStore, MemoryStore};
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let mut crashed = SessionRecord::<SimItem>::new("crashed", "sim", 0);
    crashed.status = SessionStatus::Running;
    crashed.owner = Some("other".into());
    crashed.unhandled_items = vec![item(1)];
    store.save(crashed).await.unwrap();
    let mut saved = SessionRecord::<SimItem>::new("saved", "sim", 0);
    saved.status = SessionStatus::Interrupted;
    saved.unhandled_items = vec![item(2)];
    store.save(saved).await.unwrap();
    store
        .beat("other", agentloop::store::now_ms())
        .await
        .unwrap();
    let start = |store: Arc<MemoryStore<SimItem>>| async move {
        Rt::builder()
            .store(store)
            .heartbeat(Duration::from_millis(50), Duration::from_millis(400))
            .register_agent("sim", |_cfg: &[u8]| {
                Ok(SimAgent::new(steps(1)).with_step_gate(Gate::new()))
            })
            .start()
            .await
            .unwrap()
    };
    let (rt, report) = start(store.clone()).await;
    assert_eq!(report.resumed, vec!["saved".to_string()], "{report:?}");
    assert_eq!(report.recovered, 0);
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    let (id, why) = &report.skipped[0];
    assert_eq!(id, "crashed");
    assert!(
        why.contains("owned by instance `other`")
            && why.contains("its lease expires in")
            && why.contains("lease_timeout 400ms")
            && why.contains("if it is gone, start again after that"),
        "{why}"
    );
    rt.stop(StopOptions::immediate().shutdown()).await.unwrap();
    // The owner never beats again: after its lease the session is recovered.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rt, report) = start(store).await;
    assert!(
        report.resumed.contains(&"crashed".to_string()),
        "{report:?}"
    );
    assert_eq!(report.recovered, 1, "{report:?}");
    rt.stop(StopOptions::immediate().shutdown()).await.unwrap();
}

/// Issue 30 (the shutdown's last mile): a shutdown handle learns that the shutdown
/// started and reads its report from what the coordinator publishes, without a message
/// through the coordinator's mailbox: every waiter, however many and whenever they
/// start waiting (before, during, after), gets the same report, and one that asks after
/// the end gets it at once.
#[tokio::test]
async fn shutdown_waiters_read_the_published_report() {
    let dir = TempDir::new("runtime-report");
    let (rt, _) = Rt::builder()
        .data_dir(dir.path())
        .register_agent("sim", |_cfg: &[u8]| Ok(SimAgent::new(steps(2))))
        .start()
        .await
        .unwrap();
    for i in 0..20 {
        let h = rt
            .supervisor()
            .spawn(SessionSpec::new(format!("s{i}"), "sim"))
            .await
            .unwrap();
        h.push(item(i)).await.unwrap();
    }
    let handle = rt.shutdown_handle();
    assert!(!handle.is_started().await);
    let early: Vec<_> = (0..50)
        .map(|_| {
            let h = handle.clone();
            tokio::spawn(async move { h.wait_report().await })
        })
        .collect();
    let started = {
        let h = handle.clone();
        tokio::spawn(async move { h.started().await })
    };
    let report = within("the shutdown", handle.shutdown()).await.unwrap();
    within("started", started).await.unwrap();
    assert!(handle.is_started().await);
    assert_eq!(report.sessions.total, 20, "{report:?}");
    for w in early {
        let got = within("a waiter", w).await.unwrap().unwrap();
        assert_eq!(got.sessions.total, report.sessions.total);
        assert_eq!(got.phases.total, report.phases.total);
    }
    // After the end: at once, the same report.
    let late = within("a late waiter", handle.wait_report()).await.unwrap();
    assert_eq!(late.phases.total, report.phases.total);
}
