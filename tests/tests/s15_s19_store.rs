//! S15–S19 on the real store: the CheckpointActor over sled (group commit, ordering,
//! ids), the S16 save/keep/delete table, resume across restarts (S17), never destroying
//! resumability (S18), the status lifecycle and its compare-and-swap (S19), and `sync`
//! durability (S16a).

use std::sync::Arc;
use std::time::Duration;

use agentloop::store::{codec, now_ms, ListEntry, RecordWrite, Stored, StoredEntry};
use agentloop::{
    exit::CheckpointOutcome, store::CasOutcome, store::CheckpointActor, store::CheckpointClient,
    store::SessionRecord, store::SessionStatus, store::StatusKind, CheckpointStore, Durability,
    ExitReason, MemoryStore, Plan, SessionSpec, StopOptions, StoreError,
};
use agentloop_sim::{Fault, Notice, SimAgent, SimItem, SimState};
use agentloop_tests::*;
use futures::future::BoxFuture;

type Client = CheckpointClient<SimItem>;

async fn open(dir: &TempDir) -> Client {
    CheckpointActor::<SimItem>::spawn(dir.path())
        .await
        .expect("open the store")
}

fn dyn_store(c: &Client) -> Arc<dyn CheckpointStore<SimItem>> {
    Arc::new(c.clone())
}

fn config(id: &str, durability: Durability) -> SessionSpec<SimItem> {
    SessionSpec::new(id, "default")
        .persistent(true)
        .kind("sim")
        .durability(durability)
}

fn record(id: &str, status: SessionStatus, unhandled: Vec<u64>) -> SessionRecord<SimItem> {
    let mut r = SessionRecord::new(id, "sim", 3);
    r.status = status;
    r.unhandled_items = unhandled.into_iter().map(item).collect();
    r
}

async fn raw(c: &Client, id: &str) -> Option<SessionRecord<SimItem>> {
    c.load(id).await.expect("load")
}

#[tokio::test]
async fn s15_actor_round_trip_list_and_invalid_ids() {
    let dir = TempDir::new("actor");
    let c = open(&dir).await;
    c.save(record("a", SessionStatus::Stopped, vec![1, 2]))
        .await
        .unwrap();
    c.save(record("b", SessionStatus::Interrupted, vec![3]))
        .await
        .unwrap();
    assert_eq!(
        ids(&raw(&c, "a").await.unwrap().unhandled_items),
        vec![1, 2]
    );
    let stopped: Vec<String> = c
        .list(Some(vec![StatusKind::Stopped]))
        .await
        .unwrap()
        .into_iter()
        .map(|e: ListEntry<SimItem>| e.session_id)
        .collect();
    assert_eq!(stopped, vec!["a".to_string()]);
    assert_eq!(c.list(None).await.unwrap().len(), 2);
    assert!(c.delete("a").await.unwrap());
    assert!(!c.delete("a").await.unwrap());
    assert!(raw(&c, "a").await.is_none());
    for bad in ["", "x\ny"] {
        let e = c.load(bad).await.unwrap_err();
        assert!(matches!(e, StoreError::InvalidId { .. }), "{e}");
        let e = c
            .save(record(bad, SessionStatus::Stopped, vec![]))
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::InvalidId { .. }), "{e}");
    }
    let e = c.delete(&"x".repeat(129)).await.unwrap_err();
    assert!(e.to_string().contains("128"), "{e}");
    c.close().await.unwrap();
}

/// Group commit: saves that arrive together share one wave and one flush; every waiter
/// is answered; writes of one session issued together share waves, the later one
/// winning (each wave is one atomic batch; writes are no longer coalesced, since a
/// session's writes are changes, not whole records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_group_commit_batches_writes() {
    let dir = TempDir::new("group");
    let c = open(&dir).await;
    let saves: Vec<_> = (0..64)
        .map(|i| c.save(record(&format!("s{i}"), SessionStatus::Stopped, vec![i])))
        .collect();
    for r in futures::future::join_all(saves).await {
        r.unwrap();
    }
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.saves, 64);
    assert!(
        stats.waves < 64,
        "64 saves sent together must share waves: {stats:?}"
    );
    // Ten saves of one session issued back to back: the first starts a wave, the other
    // nine wait together and are applied in one wave, in order.
    let before = c.stats().await.unwrap();
    let saves: Vec<_> = (0..10)
        .map(|i| c.save(record("same", SessionStatus::Stopped, vec![i])))
        .collect();
    for r in futures::future::join_all(saves).await {
        r.unwrap();
    }
    let after = c.stats().await.unwrap();
    // The first save starts a wave alone; the rest wait together. How many share a wave
    // depends on when that first wave completes, but some must.
    assert!(after.waves - before.waves < 10, "{before:?} -> {after:?}");
    assert_eq!(after.saves - before.saves, 10);
    assert_eq!(
        ids(&raw(&c, "same").await.unwrap().unhandled_items),
        vec![9]
    );
    c.close().await.unwrap();
}

/// Ordering: a read issued after a write sees it; writes issued in order land in order,
/// even when their futures are awaited in another order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_writes_are_ordered_at_call_time() {
    let dir = TempDir::new("order");
    let c = open(&dir).await;
    for round in 0..50u64 {
        let first = c.save(record("o", SessionStatus::Stopped, vec![round]));
        let second = c.save(record("o", SessionStatus::Stopped, vec![round + 1000]));
        let read = c.load("o");
        // Await in reverse order.
        let got = read.await.unwrap().unwrap();
        second.await.unwrap();
        first.await.unwrap();
        assert_eq!(ids(&got.unhandled_items), vec![round + 1000]);
    }
    c.close().await.unwrap();
}

/// The S16 table on sled: for each kind of exit, whether the record is saved, kept or
/// deleted, and the ExitState::checkpoint outcome.
#[tokio::test]
async fn s16_save_keep_delete_table() {
    let dir = TempDir::new("s16");
    let c = open(&dir).await;
    let store = dyn_store(&c);
    let stale = |id: &str| record(id, SessionStatus::Stopped, vec![]);

    // Bare stop with items: saved, Stopped, items unhandled.
    let (h, gate, mut probe) = gated_on("bare", &store, steps(2)).await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::bare()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.checkpoint, CheckpointOutcome::Saved);
    let r = raw(&c, "bare").await.unwrap();
    assert_eq!(
        (r.status.clone(), ids(&r.unhandled_items)),
        (SessionStatus::Stopped, vec![2])
    );

    // Stop-cancel mid-turn: saved with the mid-turn state and interrupted items.
    let (h, gate, mut probe) = gated_on("cancel", &store, steps(3)).await;
    h.push(item(1)).await.unwrap();
    gate.open(1);
    probe.at_step(0, 1).await;
    h.stop(StopOptions::immediate()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(matches!(exit.reason, ExitReason::Canceled(_)));
    assert_eq!(exit.checkpoint, CheckpointOutcome::Saved);
    let r = raw(&c, "cancel").await.unwrap();
    assert_eq!(ids(&r.interrupted_items), vec![1]);
    let st: SimState = codec::decode_state("cancel", r.state.as_ref().unwrap()).unwrap();
    assert_eq!(st.steps_done, 1);

    // Business interrupt: saved.
    let h = spawn_on(
        config("interrupt", Durability::Exit),
        SimAgent::new(steps(2)).with_fault(Some(0), 1, Fault::Interrupt, true),
        store.clone(),
    )
    .await;
    h.push(item(1)).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert!(matches!(exit.reason, ExitReason::Interrupted(_)));
    assert_eq!(exit.checkpoint, CheckpointOutcome::Saved);
    assert!(raw(&c, "interrupt").await.unwrap().is_mid_turn());

    // Idle stop: nothing left; a stale record is deleted.
    c.save(stale("idle")).await.unwrap();
    let h = spawn_on(
        config("idle", Durability::Exit),
        SimAgent::new(steps(1)),
        store.clone(),
    )
    .await;
    h.stop(StopOptions::until_idle_for(Duration::from_millis(10)))
        .await
        .unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.checkpoint, CheckpointOutcome::Deleted);
    assert!(raw(&c, "idle").await.is_none());

    // skip_checkpoint with items left: nothing saved, the stale record deleted.
    c.save(stale("skip")).await.unwrap();
    let (h, gate, mut probe) = gated_on("skip", &store, steps(2)).await;
    h.push(item(1)).await.unwrap();
    probe.at_step(3, 0).await; // the turn index continues from the stale record
    h.push(item(2)).await.unwrap();
    h.stop(StopOptions::immediate().skip_checkpoint())
        .await
        .unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.checkpoint, CheckpointOutcome::Deleted);
    assert!(raw(&c, "skip").await.is_none());
    assert_eq!(
        ids(&exit.unhandled_items),
        vec![2],
        "the items are in the exit state"
    );

    // Plan error: the record is kept as it was.
    let kept = record("plan-error", SessionStatus::Stopped, vec![1]);
    c.save(kept.clone()).await.unwrap();
    let before = raw(&c, "plan-error").await.unwrap();
    let h = spawn_on(
        config("plan-error", Durability::Exit),
        SimAgent::new(steps(1)).with_plan_fn(Arc::new(|_| -> Result<Plan<SimItem>, _> {
            Err(agentloop::AgentError::failed("planner down"))
        })),
        store.clone(),
    )
    .await;
    let exit = within("exit", h.wait()).await;
    assert!(matches!(exit.reason, ExitReason::Failed(_)));
    assert_eq!(exit.checkpoint, CheckpointOutcome::NotAttempted);
    assert_eq!(raw(&c, "plan-error").await.unwrap(), before);

    // Load error (a corrupt record): kept, byte for byte.
    let backend_dir = dir.path().to_path_buf();
    c.close().await.unwrap();
    {
        let b = agentloop::store::SledBackend::open(&backend_dir).unwrap();
        b.put_raw(
            &agentloop_core::table::header_key("corrupt"),
            b"ALCK\x02\x00garbage",
        )
        .unwrap();
    }
    let c = open(&dir).await;
    let store = dyn_store(&c);
    let h = spawn_on(
        config("corrupt", Durability::Exit),
        SimAgent::new(steps(1)),
        store.clone(),
    )
    .await;
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("corrupt")),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.checkpoint, CheckpointOutcome::NotAttempted);
    c.close().await.unwrap();
    let b = agentloop::store::SledBackend::open(&backend_dir).unwrap();
    assert_eq!(
        b.raw_entries("corrupt").unwrap(),
        vec![("header".to_string(), b"ALCK\x02\x00garbage".to_vec())]
    );
    drop(b);

    // A save error lands in the outcome, never in the reason.
    let c = open(&dir).await;
    let store = dyn_store(&c);
    let (h, gate, mut probe) = gated_on("save-error", &store, steps(2)).await;
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(item(2)).await.unwrap();
    c.close().await.unwrap(); // the store goes away before the exit
    h.stop(StopOptions::bare()).await.unwrap();
    gate.open_all();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert!(
        matches!(&exit.checkpoint, CheckpointOutcome::Failed(e) if e.contains("closed")),
        "{:?}",
        exit.checkpoint
    );
    assert_eq!(ids(&exit.unhandled_items), vec![2]);
}

async fn gated_on(
    id: &str,
    store: &Arc<dyn CheckpointStore<SimItem>>,
    script: agentloop_sim::Script,
) -> (Handle, agentloop_sim::Gate, Probe) {
    let gate = agentloop_sim::Gate::new();
    let (tx, probe) = agentloop_tests::probe();
    let h = spawn_on(
        config(id, Durability::Exit),
        SimAgent::new(script)
            .with_step_gate(gate.clone())
            .with_probe(tx),
        store.clone(),
    )
    .await;
    (h, gate, probe)
}

/// S17 across a restart of the store: a cut turn resumes from its last safe point with
/// its items, new items wait behind, and completing it removes the old state.
#[tokio::test]
async fn s17_resume_across_a_store_restart() {
    let dir = TempDir::new("s17");
    let c = open(&dir).await;
    let store = dyn_store(&c);
    let (h, gate, mut probe) = gated_on("r", &store, steps(3)).await;
    h.push(item(1)).await.unwrap();
    gate.open(1);
    probe.at_step(0, 1).await;
    h.stop(StopOptions::immediate()).await.unwrap();
    assert_eq!(
        within("exit", h.wait()).await.checkpoint,
        CheckpointOutcome::Saved
    );
    c.close().await.unwrap();

    let c = open(&dir).await;
    let store = dyn_store(&c);
    let (tx, mut probe) = agentloop_tests::probe();
    let agent = SimAgent::new(steps(3)).with_probe(tx);
    let ledger = agent.ledger();
    let h = spawn_on(config("r", Durability::Exit), agent, store.clone()).await;
    h.push(item(2)).await.unwrap();
    let (items, resumed) = probe.turn_begins(0).await;
    assert_eq!((items, resumed), (vec![1], true));
    probe
        .until("resumed turn skips step 0", |n| {
            matches!(n, Notice::StepBegin { turn: 0, .. })
        })
        .await;
    let (items, _) = probe.turn_begins(1).await;
    assert_eq!(items, vec![2]);
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(ledger.lock().delivered_ids(), vec![1, 2]);
    assert!(
        raw(&c, "r").await.is_none(),
        "the old mid-turn state is gone"
    );
    c.close().await.unwrap();
}

async fn refused(
    c: &Client,
    rec: SessionRecord<SimItem>,
    owner: Option<&str>,
) -> (ExitReason, Option<SessionRecord<SimItem>>) {
    let id = rec.session_id.clone();
    c.save(rec).await.unwrap();
    let mut cfg = config(&id, Durability::Sync);
    if let Some(o) = owner {
        cfg = cfg.owner(o);
    }
    let h = spawn_on(cfg, SimAgent::new(steps(1)), dyn_store(c)).await;
    let exit = within("exit", h.wait()).await;
    (exit.reason, raw(c, &id).await)
}

/// S19: resume is refused for Running with a fresh heartbeat, Canceled and Failed (the
/// message names the status and the error), and the record is left alone; a stale
/// heartbeat is recoverable, and so is a record this instance owns.
#[tokio::test]
async fn s19_resume_refusals_and_stale_recovery() {
    let dir = TempDir::new("s19");
    let c = open(&dir).await;

    let mut running = record("busy", SessionStatus::Running, vec![1]);
    running.owner = Some("instance-A".into());
    c.beat("instance-A", now_ms()).await.unwrap();
    let (reason, rec) = refused(&c, running.clone(), Some("instance-B")).await;
    match reason {
        ExitReason::Failed(e) => {
            assert!(e.contains("Running") && e.contains("instance-A"), "{e}");
        }
        r => panic!("expected a refusal, got {r:?}"),
    }
    assert_eq!(rec.unwrap().unhandled_items, running.unhandled_items);

    let (reason, rec) = refused(
        &c,
        record("cancelled", SessionStatus::Canceled, vec![1]),
        None,
    )
    .await;
    assert!(
        matches!(&reason, ExitReason::Failed(e) if e.contains("Canceled") && e.contains("canceled")),
        "{reason:?}"
    );
    assert_eq!(rec.unwrap().status, SessionStatus::Canceled);

    let (reason, rec) = refused(
        &c,
        record(
            "failed",
            SessionStatus::Failed("model quota exhausted".into()),
            vec![1],
        ),
        None,
    )
    .await;
    assert!(
        matches!(&reason, ExitReason::Failed(e) if e.contains("Failed") && e.contains("model quota exhausted")),
        "{reason:?}"
    );
    assert!(rec.is_some());

    // Stale: the owner's heartbeat is older than the lease.
    let mut ghost = record("ghost", SessionStatus::Running, vec![7]);
    ghost.owner = Some("instance-dead".into());
    c.beat("instance-dead", now_ms() - 120_000).await.unwrap();
    c.save(ghost).await.unwrap();
    let (tx, mut probe) = agentloop_tests::probe();
    let h = spawn_on(
        config("ghost", Durability::Sync)
            .owner("instance-B")
            .lease_timeout(Duration::from_secs(30)),
        SimAgent::new(steps(1)).with_probe(tx),
        dyn_store(&c),
    )
    .await;
    assert_eq!(
        probe.turn_begins(3).await.0,
        vec![7],
        "recovered and resumed"
    );
    h.stop(StopOptions::drain()).await.unwrap();
    assert_eq!(within("exit", h.wait()).await.counters.items_delivered, 1);

    // Owned by this very instance (a restart inside the runtime): resumable.
    let mut mine = record("mine", SessionStatus::Running, vec![8]);
    mine.owner = Some("instance-B".into());
    c.beat("instance-B", now_ms()).await.unwrap();
    c.save(mine).await.unwrap();
    let h = spawn_on(
        config("mine", Durability::Sync).owner("instance-B"),
        SimAgent::new(steps(1)),
        dyn_store(&c),
    )
    .await;
    h.stop(StopOptions::drain()).await.unwrap();
    assert_eq!(within("exit", h.wait()).await.counters.items_delivered, 1);
    c.close().await.unwrap();
}

/// S19/S24: a cancel CAS racing a finalize CAS never ends Completed after Canceled:
/// exactly one wins, and the loser sees the winner's status. Run many times on real
/// threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s19_cancel_racing_finalize_never_ends_completed_after_canceled() {
    let dir = TempDir::new("cas");
    let c = open(&dir).await;
    let (mut cancels, mut finals) = (0, 0);
    for i in 0..300 {
        let id = format!("race-{i}");
        c.save(record(&id, SessionStatus::Running, vec![i]))
            .await
            .unwrap();
        let (c1, c2, id1, id2) = (c.clone(), c.clone(), id.clone(), id.clone());
        let cancel = tokio::spawn(async move {
            c1.cas_status(&id1, vec![StatusKind::Running], SessionStatus::Canceled)
                .await
        });
        let finalize = tokio::spawn(async move {
            c2.cas_status(&id2, vec![StatusKind::Running], SessionStatus::Completed)
                .await
        });
        let (a, b) = (
            cancel.await.unwrap().unwrap(),
            finalize.await.unwrap().unwrap(),
        );
        let end = raw(&c, &id).await.unwrap().status;
        match (a, b) {
            (
                CasOutcome::Swapped(SessionStatus::Running),
                CasOutcome::Mismatch(SessionStatus::Canceled),
            ) => {
                assert_eq!(end, SessionStatus::Canceled);
                cancels += 1;
            }
            (
                CasOutcome::Mismatch(SessionStatus::Completed),
                CasOutcome::Swapped(SessionStatus::Running),
            ) => {
                assert_eq!(end, SessionStatus::Completed);
                finals += 1;
            }
            other => panic!("round {i}: both or neither won: {other:?}"),
        }
    }
    assert_eq!(cancels + finals, 300);
    // A terminal record is not changed by a later CAS.
    c.save(record("done", SessionStatus::Completed, vec![]))
        .await
        .unwrap();
    assert_eq!(
        c.cas_status("done", vec![StatusKind::Running], SessionStatus::Canceled)
            .await
            .unwrap(),
        CasOutcome::Mismatch(SessionStatus::Completed)
    );
    assert_eq!(
        c.cas_status("nobody", vec![StatusKind::Running], SessionStatus::Canceled)
            .await
            .unwrap(),
        CasOutcome::Missing
    );
    c.close().await.unwrap();
}

/// A store whose writes are applied at call time (the trait's ordering contract) but
/// whose acknowledgements wait for a gate: shows when a caller is answered.
struct GatedStore {
    inner: MemoryStore<SimItem>,
    release: tokio::sync::watch::Sender<bool>,
}

impl CheckpointStore<SimItem> for GatedStore {
    fn load_stored<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        self.inner.load_stored(id)
    }
    fn write(&self, w: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        let done = self.inner.write(w);
        let mut rx = self.release.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|open| *open).await;
            done.await
        })
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
        let mut rx = self.release.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|open| *open).await;
            Ok(())
        })
    }
    fn beat(&self, i: &str, t: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.beat(i, t)
    }
    fn heartbeat(&self, i: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        self.inner.heartbeat(i)
    }
}

/// S16a: in `sync`, a push is acknowledged only once the write holding its item is
/// durable, and that write holds it.
#[tokio::test(start_paused = true)]
async fn s16a_sync_push_is_acknowledged_after_its_write() {
    let gated = Arc::new(GatedStore {
        inner: MemoryStore::new(),
        release: tokio::sync::watch::Sender::new(false),
    });
    let store: Arc<dyn CheckpointStore<SimItem>> = gated.clone();
    let gate = agentloop_sim::Gate::new();
    let h = spawn_on(
        config("sync-ack", Durability::Sync),
        SimAgent::new(steps(1)).with_step_gate(gate.clone()),
        store,
    )
    .await;
    let h2 = h.clone();
    let push = tokio::spawn(async move { h2.push(item(1)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !push.is_finished(),
        "acknowledged before the write was durable"
    );
    let rec = gated.inner.get("sync-ack").expect("the write was issued");
    let held: Vec<u64> = ids(&rec.unhandled_items)
        .into_iter()
        .chain(ids(&rec.interrupted_items))
        .collect();
    assert_eq!(held, vec![1]);
    assert_eq!(rec.status, SessionStatus::Running);
    gated.release.send_replace(true);
    within("ack", push).await.unwrap().unwrap();
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
}

/// S16a: in `sync`, the record follows the turn: at a safe point it holds the turn's
/// items and its state; after the turn it holds nothing in flight.
#[tokio::test(start_paused = true)]
async fn s16a_sync_record_follows_safe_points_and_turn_ends() {
    let mem = Arc::new(MemoryStore::<SimItem>::new());
    let store: Arc<dyn CheckpointStore<SimItem>> = mem.clone();
    let gate = agentloop_sim::Gate::new();
    let (tx, mut probe) = agentloop_tests::probe();
    let h = spawn_on(
        config("sync-follow", Durability::Sync).owner("me"),
        SimAgent::new(steps(2))
            .with_step_gate(gate.clone())
            .with_probe(tx),
        store,
    )
    .await;
    h.push(item(1)).await.unwrap();
    gate.open(1);
    probe.at_step(0, 1).await;
    let st = within("the safe-point write", async {
        loop {
            if let Some(r) = mem.get("sync-follow") {
                if let Some(bytes) = &r.state {
                    return (
                        r.clone(),
                        codec::decode_state::<SimState>("sync-follow", bytes).unwrap(),
                    );
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(st.1.steps_done, 1);
    assert_eq!(ids(&st.0.interrupted_items), vec![1]);
    assert_eq!(st.0.owner.as_deref(), Some("me"));
    gate.open(1);
    probe
        .until("turn 0 done", |n| matches!(n, Notice::TurnDone { turn: 0 }))
        .await;
    within("the turn-end write", async {
        loop {
            if mem.get("sync-follow").is_some_and(|r| {
                r.state.is_none() && r.interrupted_items.is_empty() && r.turn_index == 1
            }) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    h.stop(StopOptions::bare()).await.unwrap();
    within("exit", h.wait()).await;
    assert!(mem.get("sync-follow").is_none(), "clean exit deletes");
}

/// S16a on sled: a session actor that dies mid-turn (killed: no teardown, like a crash)
/// leaves its last sync write, and a new session resumes the cut turn from its last
/// safe point with every acknowledged item.
#[tokio::test]
async fn s16a_sync_survives_an_abrupt_end_on_sled() {
    let dir = TempDir::new("sync-kill");
    let c = open(&dir).await;
    let store = dyn_store(&c);
    let gate = agentloop_sim::Gate::new();
    let (tx, mut probe) = agentloop_tests::probe();
    let h = spawn_on(
        config("k", Durability::Sync).owner("dead-instance"),
        SimAgent::new(steps(3))
            .with_step_gate(gate.clone())
            .with_probe(tx),
        store.clone(),
    )
    .await;
    h.push(item(1)).await.unwrap();
    gate.open(1);
    probe.at_step(0, 1).await;
    h.push(item(2)).await.unwrap(); // acknowledged: durable, no extra flush needed
    h.actor().kill();
    within("exit", h.wait()).await;
    let rec = raw(&c, "k").await.unwrap();
    assert_eq!(rec.status, SessionStatus::Running);
    assert_eq!(ids(&rec.interrupted_items), vec![1]);
    assert_eq!(ids(&rec.unhandled_items), vec![2]);
    c.close().await.unwrap();

    let c = open(&dir).await;
    let (tx, mut probe) = agentloop_tests::probe();
    let agent = SimAgent::new(steps(3)).with_probe(tx);
    let ledger = agent.ledger();
    // Another instance recovers it once the dead owner's heartbeat is stale (S19).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let h = spawn_on(
        config("k", Durability::Sync)
            .owner("new-instance")
            .lease_timeout(Duration::from_millis(10)),
        agent,
        dyn_store(&c),
    )
    .await;
    assert_eq!(probe.turn_begins(0).await, (vec![1], true));
    h.stop(StopOptions::drain()).await.unwrap();
    within("exit", h.wait()).await;
    assert_eq!(ledger.lock().delivered_ids(), vec![1, 2]);
    c.close().await.unwrap();
}

/// S19: one heartbeat per instance, renewed on its interval (each renewal is one
/// write, whatever the number of sessions).
#[tokio::test(start_paused = true)]
async fn s19_instance_lease_renews_one_heartbeat() {
    let dir = TempDir::new("lease");
    let c = open(&dir).await;
    let store = dyn_store(&c);
    let lease = agentloop::store::InstanceLease::start(store.clone(), Duration::from_secs(10))
        .await
        .unwrap();
    let first = store
        .heartbeat(lease.id())
        .await
        .unwrap()
        .expect("a first beat");
    let before = c.stats().await.unwrap().ops;
    tokio::time::sleep(Duration::from_secs(35)).await;
    c.flush().await.unwrap();
    let beats = c.stats().await.unwrap().ops - before - 1; // minus the flush
    assert_eq!(beats, 3, "one write per interval");
    assert!(store.heartbeat(lease.id()).await.unwrap().unwrap() >= first);
    assert_ne!(
        lease.id(),
        agentloop::store::InstanceLease::new_id(),
        "ids are unique"
    );
    drop(lease);
    assert!(agentloop::store::lease::is_fresh(
        first,
        first + 29_000,
        Duration::from_secs(30)
    ));
    assert!(!agentloop::store::lease::is_fresh(
        first,
        first + 31_000,
        Duration::from_secs(30)
    ));
    c.close().await.unwrap();
}

/// S19 on sled: a live (`sync`) write never overwrites a final record; it reports
/// `Final` with the status it found and writes nothing.
#[tokio::test]
async fn s19_live_writes_never_overwrite_a_final_record() {
    let dir = TempDir::new("live");
    let c = open(&dir).await;
    c.save(record("f", SessionStatus::Canceled, vec![1]))
        .await
        .unwrap();
    let e = c
        .save_live(record("f", SessionStatus::Running, vec![1, 2]))
        .await
        .unwrap_err();
    assert!(
        matches!(e, StoreError::Final { ref status, .. } if *status == SessionStatus::Canceled),
        "{e}"
    );
    let r = raw(&c, "f").await.unwrap();
    assert_eq!(
        (r.status, ids(&r.unhandled_items)),
        (SessionStatus::Canceled, vec![1])
    );
    // A non-final record is overwritten as usual.
    c.save(record("g", SessionStatus::Running, vec![1]))
        .await
        .unwrap();
    c.save_live(record("g", SessionStatus::Running, vec![1, 2]))
        .await
        .unwrap();
    assert_eq!(
        ids(&raw(&c, "g").await.unwrap().unhandled_items),
        vec![1, 2]
    );
    c.close().await.unwrap();
}
