//! S34a (issue 29): what a caller may make a runtime hold is bounded. A session refuses
//! a push once it holds its bound of items or bytes (waiting or in a turn), hands the
//! item back and accepts again when its turns have taken some; a supervisor refuses a
//! spawn over its bound of live sessions, but never a record it resumes. Paused clock.

use std::collections::HashMap;
use std::sync::Arc;

use agentloop::{
    session::BufferBound, supervisor::agent_kind, supervisor::RestartBudget,
    supervisor::SessionLimits, CheckpointStore, MemoryStore, PushError, SessionHandle, SessionSpec,
    StopOptions, SupervisorArgs, SupervisorError, SupervisorHandle,
};
use agentloop_sim::{Gate, Notice, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;

/// A session holds at most `items` items: the turn's and the waiting ones together. The
/// refused item comes back in the error, and nothing of it was accepted.
#[tokio::test(start_paused = true)]
async fn a_full_session_refuses_a_push_and_hands_the_item_back() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let h: Handle = SessionHandle::spawn(
        SessionSpec::new("full", "default").buffer_bound(BufferBound {
            items: 3,
            bytes: usize::MAX,
        }),
        Arc::new(
            SimAgent::new(steps(1))
                .with_step_gate(gate.clone())
                .with_probe(tx),
        ),
        None,
    )
    .await
    .unwrap();
    h.push(item(1)).await.unwrap();
    probe.at_step(0, 0).await;
    // The turn holds item 1; two more wait.
    h.push(item(2)).await.unwrap();
    h.push(item(3)).await.unwrap();
    match h.push(item(4)).await {
        Err(PushError::Full { item, full }) => {
            assert_eq!(item.id, 4, "the refused item is handed back");
            assert_eq!((full.items, full.max_items), (3, 3));
            let text = PushError::Full { item, full }.to_string();
            assert!(text.contains("[limits] session_items"), "{text}");
        }
        other => panic!("expected Full, got {other:?}"),
    }
    // Its turns take them: there is room again.
    gate.open_all();
    probe
        .until("the turns took the waiting items", |n| {
            matches!(n, Notice::TurnDone { turn: 1 })
        })
        .await;
    h.push(item(5)).await.unwrap();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_accepted, 4);
    assert_eq!(exit.counters.items_delivered, 4);
}

/// A persistent session counts the stored bytes of what it holds: a push whose item
/// would take it over its byte bound is refused, a small one still fits.
#[tokio::test(start_paused = true)]
async fn a_persistent_session_bounds_the_bytes_it_holds() {
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(MemoryStore::new());
    let h: Handle = SessionHandle::spawn(
        SessionSpec::new("bytes", "default")
            .persistent(true)
            .kind("sim")
            .buffer_bound(BufferBound {
                items: usize::MAX,
                bytes: 2_000,
            }),
        Arc::new(
            SimAgent::new(steps(1))
                .with_step_gate(gate.clone())
                .with_probe(tx),
        ),
        Some(store),
    )
    .await
    .unwrap();
    h.push(SimItem::new(1, "a".repeat(900))).await.unwrap();
    probe.at_step(0, 0).await;
    h.push(SimItem::new(2, "b".repeat(900))).await.unwrap();
    match h.push(SimItem::new(3, "c".repeat(900))).await {
        Err(PushError::Full { item, full }) => {
            assert_eq!(item.id, 3);
            assert!(full.bytes > 1_800 && full.bytes < 2_000, "{full:?}");
            assert!(
                full.to_string().contains("[limits] session_bytes"),
                "{full}"
            );
        }
        other => panic!("expected Full, got {other:?}"),
    }
    h.push(SimItem::new(4, "d")).await.unwrap();
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_delivered, 3);
}

fn sim_args(limits: SessionLimits) -> SupervisorArgs<SimItem, SimEvent> {
    let gate = Gate::new();
    let mut kinds = HashMap::new();
    kinds.insert(
        "sim".to_string(),
        agent_kind("sim", move |_: &[u8]| {
            Ok(SimAgent::new(steps(1)).with_step_gate(gate.clone()))
        }),
    );
    SupervisorArgs {
        kinds,
        store: None,
        owner: None,
        budget: RestartBudget::default(),
        heartbeat: agentloop::store::DEFAULT_HEARTBEAT,
        metrics: None,
        limits,
    }
}

/// A supervisor runs at most `max_sessions`: one more is refused (also inside a batch)
/// with what to do; once one ends there is room again. Its sessions get its buffer
/// bound, and a routed push over it comes back as `Full`.
#[tokio::test(start_paused = true)]
async fn a_supervisor_bounds_its_sessions_and_their_buffers() {
    let sup = SupervisorHandle::<SimItem, SimEvent>::start(sim_args(SessionLimits {
        max_sessions: 2,
        buffer: BufferBound {
            items: 2,
            bytes: usize::MAX,
        },
        timers: agentloop::timers::TimerBounds::UNBOUNDED,
    }))
    .await
    .unwrap();
    sup.spawn(SessionSpec::new("a", "sim")).await.unwrap();
    let answers = sup
        .spawn_batch(vec![
            SessionSpec::new("b", "sim"),
            SessionSpec::new("c", "sim"),
        ])
        .await;
    assert!(answers[0].is_ok());
    match &answers[1] {
        Err(e @ SupervisorError::TooManySessions { id, max }) => {
            assert_eq!((id.as_str(), max), ("c", &2));
            assert!(e.to_string().contains("[limits] sessions"), "{e}");
        }
        other => panic!("expected TooManySessions, got {other:?}"),
    }
    // The buffer bound reaches the sessions (the gated step holds the first item).
    sup.push("a", item(1)).await.unwrap();
    sup.push("a", item(2)).await.unwrap();
    match sup.push("a", item(3)).await {
        Err(PushError::Full { item, .. }) => assert_eq!(item.id, 3),
        other => panic!("expected Full, got {other:?}"),
    }
    // One ends: there is room for another.
    sup.stop("b", StopOptions::immediate()).await.unwrap();
    let mut room = false;
    for _ in 0..100 {
        match sup.spawn(SessionSpec::new("c", "sim")).await {
            Ok(_) => {
                room = true;
                break;
            }
            Err(SupervisorError::TooManySessions { .. }) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(room, "the ended session's place was given back");
}

/// One `SessionSpec` for both starts: a supervised session's own `buffer_bound` applies
/// under the runtime's limits (the tighter of the two, field by field), so neither can
/// loosen the other.
#[tokio::test(start_paused = true)]
async fn a_spec_bound_applies_under_the_supervisors_limits() {
    let sup = SupervisorHandle::<SimItem, SimEvent>::start(sim_args(SessionLimits {
        max_sessions: 10,
        buffer: BufferBound {
            items: 3,
            bytes: usize::MAX,
        },
        timers: agentloop::timers::TimerBounds::UNBOUNDED,
    }))
    .await
    .unwrap();
    // Tighter than the limits: the spec's bound holds.
    sup.spawn(SessionSpec::new("tight", "sim").buffer_bound(BufferBound {
        items: 1,
        bytes: usize::MAX,
    }))
    .await
    .unwrap();
    sup.push("tight", item(1)).await.unwrap();
    match sup.push("tight", item(2)).await {
        Err(PushError::Full { item, .. }) => assert_eq!(item.id, 2),
        other => panic!("expected Full at the spec's bound of 1, got {other:?}"),
    }
    // Looser than the limits: the limits hold.
    sup.spawn(SessionSpec::new("loose", "sim").buffer_bound(BufferBound::UNBOUNDED))
        .await
        .unwrap();
    for id in 1..=3 {
        sup.push("loose", item(id)).await.unwrap();
    }
    match sup.push("loose", item(4)).await {
        Err(PushError::Full { item, .. }) => assert_eq!(item.id, 4),
        other => panic!("expected Full at the limits' bound of 3, got {other:?}"),
    }
}

/// S34a: a session keeps the idempotency keys of its pushes with its record: after the
/// session is rebuilt from the record (a restart), a retry with a kept key is a
/// `Duplicate` that delivers nothing, and the key with another fingerprint is refused.
#[tokio::test(start_paused = true)]
async fn idempotency_keys_live_with_the_record() {
    use agentloop::{Durability, PreemptAck, PushOptions};
    let store = Arc::new(MemoryStore::<SimItem>::new());
    // A turn that never ends by itself: an immediate stop cuts it, and the record keeps
    // the session (Interrupted) for the next incarnation, as a restart would.
    let spawn_on_store = |store: Arc<MemoryStore<SimItem>>| async move {
        let dyn_store: Arc<dyn CheckpointStore<SimItem>> = store;
        let h: Handle = SessionHandle::spawn(
            SessionSpec::new("keyed", "default")
                .persistent(true)
                .kind("sim")
                .durability(Durability::Sync),
            Arc::new(SimAgent::new(steps(1)).with_step_gate(Gate::new())),
            Some(dyn_store),
        )
        .await
        .unwrap();
        h
    };
    let keyed = |k: &str, fp: u64| PushOptions::new().idempotency_key(k, fp);
    let h = spawn_on_store(store.clone()).await;
    assert_eq!(
        h.push(item(1)).options(keyed("k1", 11)).await.unwrap(),
        PreemptAck::NotRequested
    );
    assert_eq!(
        h.push(item(1)).options(keyed("k1", 11)).await.unwrap(),
        PreemptAck::Duplicate
    );
    h.stop(StopOptions::immediate()).await.unwrap();
    let first = within("exit", h.wait()).await;
    assert_eq!(first.counters.items_accepted, 1);
    // Rebuilt from its record: the key is still known.
    let h = spawn_on_store(store.clone()).await;
    assert_eq!(
        h.push(item(1)).options(keyed("k1", 11)).await.unwrap(),
        PreemptAck::Duplicate,
        "the record kept the key"
    );
    match h.push(item(2)).options(keyed("k1", 12)).await {
        Err(PushError::KeyReused { item }) => assert_eq!(item.id, 2),
        other => panic!("expected KeyReused, got {other:?}"),
    }
    // The same two answers to pushes sent without a reply (`no_wait`): nobody hears
    // the refusal, so its item is kept in the late list (S14, nothing lost); the retry
    // of a kept key delivers nothing and is no late item either.
    h.push(item(4)).options(keyed("k1", 14)).no_wait();
    h.push(item(1)).options(keyed("k1", 11)).no_wait();
    assert_eq!(
        h.push(item(3)).options(keyed("k2", 13)).await.unwrap(),
        PreemptAck::NotRequested
    );
    h.stop(StopOptions::immediate()).await.unwrap();
    let second = within("exit", h.wait()).await;
    assert_eq!(second.counters.items_accepted, 1, "only the new key's item");
    let late: Vec<u64> = second.late_items.iter().map(|i| i.id).collect();
    assert_eq!(
        late,
        vec![4],
        "the refused item without a reply is kept, once"
    );
}

/// What [`LosesAnswers`] does with a write.
const ANSWERS: u8 = 0;
/// The write lands (durable) and its answer never comes back: a process killed
/// between its write and its answers.
const LOSES: u8 = 1;
/// Nothing lands: the process is gone.
const DEAD: u8 = 2;

/// A memory store that can lose the answers to writes that landed (S16a: a `sync` push
/// is answered after the write holding it, so a SIGKILL between the two leaves the
/// item durable and the client without an answer), then stop landing anything.
struct LosesAnswers {
    inner: Arc<MemoryStore<SimItem>>,
    mode: std::sync::atomic::AtomicU8,
}

impl CheckpointStore<SimItem> for LosesAnswers {
    fn load_stored<'a>(
        &'a self,
        id: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<agentloop::store::Stored>, agentloop::StoreError>,
    > {
        self.inner.load_stored(id)
    }
    fn write(
        &self,
        w: agentloop::store::RecordWrite,
    ) -> futures::future::BoxFuture<'static, Result<(), agentloop::StoreError>> {
        match self.mode.load(std::sync::atomic::Ordering::SeqCst) {
            ANSWERS => self.inner.write(w),
            mode => {
                // Issued (applied) now, in call order; answered never.
                let landed = (mode == LOSES).then(|| self.inner.write(w));
                Box::pin(async move {
                    if let Some(landed) = landed {
                        let _ = landed.await;
                    }
                    std::future::pending().await
                })
            }
        }
    }
    fn delete(
        &self,
        id: &str,
    ) -> futures::future::BoxFuture<'static, Result<bool, agentloop::StoreError>> {
        match self.mode.load(std::sync::atomic::Ordering::SeqCst) {
            ANSWERS => self.inner.delete(id),
            _ => Box::pin(std::future::pending()),
        }
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
        to: agentloop::store::SessionStatus,
    ) -> futures::future::BoxFuture<
        'static,
        Result<agentloop::store::CasOutcome, agentloop::StoreError>,
    > {
        self.inner.cas_status(id, from, to)
    }
    fn flush(&self) -> futures::future::BoxFuture<'static, Result<(), agentloop::StoreError>> {
        Box::pin(async { Ok(()) })
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

/// S34a (issue 52): a client that lost the answers to more keyed pushes than the
/// session keeps answered keys for (65 > 64: durable, never answered, a SIGKILL) and
/// retries them oldest first after the restart gets a duplicate for every one, and
/// every item is delivered exactly once: no retry makes room by dropping the key of
/// another lost push (before, retry 1 found key 1 dropped by push 65, was delivered
/// again and dropped key 2, and so on: all 65 twice).
#[tokio::test(start_paused = true)]
async fn more_lost_keyed_pushes_than_the_window_are_each_a_duplicate_after_a_restart() {
    use agentloop::{Durability, PreemptAck, PushOptions};
    let lost = agentloop::session::KEPT_KEYS as u64 + 1;
    let memory = Arc::new(MemoryStore::<SimItem>::new());
    let store = Arc::new(LosesAnswers {
        inner: memory.clone(),
        mode: std::sync::atomic::AtomicU8::new(ANSWERS),
    });
    let spec = || {
        SessionSpec::new("lost", "default")
            .persistent(true)
            .kind("sim")
            .durability(Durability::Sync)
    };
    let keyed = |i: u64| PushOptions::new().idempotency_key(format!("key-{i}"), i);
    let dyn_store: Arc<dyn CheckpointStore<SimItem>> = store.clone();
    let h: Handle = SessionHandle::spawn(
        spec(),
        Arc::new(SimAgent::new(steps(1)).with_step_gate(Gate::new())),
        Some(dyn_store),
    )
    .await
    .unwrap();
    // Every push's write lands; no answer comes back.
    store.mode.store(LOSES, std::sync::atomic::Ordering::SeqCst);
    let pushes: Vec<_> = (1..=lost)
        .map(|i| {
            let h = h.clone();
            async move { h.push(item(i)).options(keyed(i)).await }
        })
        .collect();
    let unanswered = tokio::spawn(futures::future::join_all(pushes));
    within("every push's write landed", async {
        loop {
            let held = memory
                .get("lost")
                .map_or(0, |r| r.unhandled_items.len() + r.interrupted_items.len());
            if held as u64 == lost {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    assert!(!unanswered.is_finished(), "no push was answered");
    // SIGKILL: the process is gone; a new one resumes the record.
    store.mode.store(DEAD, std::sync::atomic::Ordering::SeqCst);
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let dyn_store: Arc<dyn CheckpointStore<SimItem>> = memory.clone();
    let h: Handle = SessionHandle::spawn(
        spec(),
        Arc::new(
            SimAgent::new(steps(1))
                .with_step_gate(gate.clone())
                .with_probe(tx),
        ),
        Some(dyn_store),
    )
    .await
    .unwrap();
    // The client retries every lost push, oldest first.
    let mut delivered_again = Vec::new();
    for i in 1..=lost {
        match h.push(item(i)).options(keyed(i)).await {
            Ok(PreemptAck::Duplicate) => {}
            other => delivered_again.push((i, format!("{other:?}"))),
        }
    }
    assert!(
        delivered_again.is_empty(),
        "{} of {lost} retries were not duplicates: {delivered_again:?}",
        delivered_again.len()
    );
    gate.open_all();
    h.stop(StopOptions::drain()).await.unwrap();
    let exit = within("exit", h.wait()).await;
    assert_eq!(exit.counters.items_accepted, 0, "no retry was accepted");
    let mut times: HashMap<u64, usize> = HashMap::new();
    for n in probe.drain() {
        if let Notice::TurnBegin { items, .. } = n {
            for id in items {
                *times.entry(id).or_default() += 1;
            }
        }
    }
    for i in 1..=lost {
        assert_eq!(
            times.get(&i),
            Some(&1),
            "item {i} delivered once: {times:?}"
        );
    }
    assert_eq!(times.len() as u64, lost, "{times:?}");
}
