//! S39 (issue 34): sessions that sleep, through a real runtime on a store, with tokio's
//! paused clock: an idle session's record is written asleep and its actor exits; a
//! push, a stop, a cancel, an inspect, a subscription and a due timer wake it, and
//! what queued behind the wake is delivered in order, once; a session watched by a
//! subscriber stays awake; a runtime started on records that sleep registers them
//! asleep without starting them; a sleeping session counts for nothing in a shutdown.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use agentloop::{
    CheckpointStore, Durability, EventFilter, ExitReason, MemoryStore, Runtime, SessionSpec,
    StopOptions,
};
use agentloop_sim::{Ledger, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use parking_lot::Mutex;

type Rt = Runtime<SimItem, SimEvent>;

/// Every incarnation's ledger, in order: a woken session is a new agent.
type Ledgers = Arc<Mutex<Vec<Arc<Mutex<Ledger>>>>>;

const IDLE: Duration = Duration::from_secs(60);

/// A runtime builder whose sim sessions (turns of `n` steps) report to `ledgers`.
fn builder(ledgers: &Ledgers, n: usize) -> agentloop::RuntimeBuilder<SimItem, SimEvent> {
    let l = ledgers.clone();
    Runtime::<SimItem, SimEvent>::builder()
        .flush_logs(None)
        .register_agent("sim", move |_cfg: &[u8]| {
            let a = SimAgent::new(steps(n));
            l.lock().push(a.ledger());
            Ok(a)
        })
}

async fn runtime(
    store: &Arc<MemoryStore<SimItem>>,
    ledgers: &Ledgers,
    idle: Option<Duration>,
) -> Rt {
    let mut b = builder(ledgers, 1).store(store.clone() as Arc<dyn CheckpointStore<SimItem>>);
    if let Some(idle) = idle {
        b = b.idle_after(idle);
    }
    let (rt, _) = b.start().await.expect("the runtime starts");
    rt
}

async fn spawn(rt: &Rt, id: &str) {
    rt.supervisor()
        .spawn(
            SessionSpec::new(id, "sim")
                .persistent(true)
                .durability(Durability::Sync),
        )
        .await
        .expect("spawn");
}

/// Everything delivered, by every incarnation, in order.
fn delivered(ledgers: &Ledgers) -> Vec<u64> {
    ledgers
        .lock()
        .iter()
        .flat_map(|l| l.lock().delivered_ids())
        .collect()
}

/// Asleep: no live incarnation, and its record says so.
async fn asleep(rt: &Rt, id: &str) -> bool {
    let live = rt.supervisor().list().await.iter().any(|s| s.id == id);
    let store = rt.store().expect("a store");
    let record = match store.load_stored(id).await.expect("readable") {
        Some(agentloop::store::Stored::Current(r)) => r.header.asleep,
        _ => false,
    };
    !live && record
}

/// Waits (on the paused clock) until `id` sleeps.
async fn until_asleep(rt: &Rt, id: &str) {
    within("the session to fall asleep", async {
        while !asleep(rt, id).await {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
}

fn stored_asleep(store: &MemoryStore<SimItem>, id: &str) -> Option<bool> {
    match store.get_stored(id)? {
        agentloop::store::Stored::Current(r) => Some(r.header.asleep),
        _ => None,
    }
}

/// A `sync` push to a sleeping session is acknowledged once durable and delivered
/// once; the session is live again, and sleeps again after another idle period.
#[tokio::test(start_paused = true)]
async fn a_push_to_a_sleeping_session_is_acknowledged_and_delivered_once() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let rt = runtime(&store, &ledgers, Some(IDLE)).await;
    spawn(&rt, "a").await;
    rt.supervisor().push("a", item(1)).await.expect("pushed");
    within("the first turn", async {
        while delivered(&ledgers) != vec![1] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(!asleep(&rt, "a").await, "awake while it works");
    until_asleep(&rt, "a").await;
    assert_eq!(stored_asleep(&store, "a"), Some(true), "its record says so");
    let counts = rt.supervisor().counts().await;
    assert_eq!((counts.live, counts.sleeping), (0, 1));
    assert_eq!(ledgers.lock().len(), 1, "one incarnation so far");

    rt.supervisor()
        .push("a", item(2))
        .await
        .expect("acknowledged");
    within("the woken session's turn", async {
        while delivered(&ledgers) != vec![1, 2] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(ledgers.lock().len(), 2, "woken: a new incarnation");
    assert!(!asleep(&rt, "a").await);
    assert_eq!(
        stored_asleep(&store, "a"),
        Some(false),
        "the push's write woke the record"
    );
    until_asleep(&rt, "a").await;
    tokio::time::sleep(10 * IDLE).await;
    assert_eq!(delivered(&ledgers), vec![1, 2], "once each");
    rt.shutdown().await.expect("shutdown");
}

/// Pushes sent while the session wakes are delivered in the order they were sent,
/// each once, none refused.
#[tokio::test(start_paused = true)]
async fn pushes_racing_a_wake_keep_their_order() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let rt = runtime(&store, &ledgers, Some(IDLE)).await;
    spawn(&rt, "o").await;
    until_asleep(&rt, "o").await;
    let sup = rt.supervisor();
    // Sent one after the other (each future sends when first polled, in order), and
    // all answered together.
    let pushes = (0..40).map(|i| {
        let sup = sup.clone();
        async move { sup.push("o", item(i)).await }
    });
    let answers = futures::future::join_all(pushes).await;
    for (i, a) in answers.iter().enumerate() {
        assert!(a.is_ok(), "push {i}: {a:?}");
    }
    within("every item", async {
        while delivered(&ledgers).len() < 40 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        delivered(&ledgers),
        (0..40).collect::<Vec<_>>(),
        "in order, once"
    );
    rt.shutdown().await.expect("shutdown");
}

/// A stop wakes the session and stops it as it would a live one (its end reported,
/// a clean end deletes its record); a cancel wakes it and leaves its record
/// `Canceled`; an inspect wakes it and answers.
#[tokio::test(start_paused = true)]
async fn a_stop_a_cancel_and_an_inspect_wake_and_answer() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let rt = runtime(&store, &ledgers, Some(IDLE)).await;
    let mut ends = rt.supervisor().session_ends().expect("a feed");
    for id in ["s", "c", "i"] {
        spawn(&rt, id).await;
    }
    for id in ["s", "c", "i"] {
        until_asleep(&rt, id).await;
    }
    rt.supervisor()
        .stop("s", StopOptions::bare())
        .await
        .expect("stopped");
    let end = within("the stop's end", ends.recv()).await.expect("an end");
    assert_eq!(
        (end.id.as_str(), end.exit.reason.clone()),
        ("s", ExitReason::Completed)
    );
    assert!(
        store.get_stored("s").is_none(),
        "a clean end deletes the record"
    );

    let status = rt.supervisor().cancel("c").await.expect("canceled");
    assert_eq!(status, agentloop::store::SessionStatus::Canceled);
    let end = within("the cancel's end", ends.recv())
        .await
        .expect("an end");
    assert_eq!(end.id, "c");
    let rec = store.get("c").expect("kept");
    assert_eq!(rec.status, agentloop::store::SessionStatus::Canceled);

    let info = rt.supervisor().inspect("i").await.expect("inspected");
    assert_eq!(info.session_id, "i");
    assert!(!asleep(&rt, "i").await, "woken by the inspect");
    rt.shutdown().await.expect("shutdown");
}

/// A subscription wakes a sleeping session and sees its events; the session stays
/// awake while somebody listens, and sleeps again once nobody does.
#[tokio::test(start_paused = true)]
async fn a_subscription_wakes_the_session_and_keeps_it_awake() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let rt = runtime(&store, &ledgers, Some(IDLE)).await;
    spawn(&rt, "w").await;
    until_asleep(&rt, "w").await;
    let mut events = rt
        .supervisor()
        .subscribe("w", EventFilter::all())
        .await
        .expect("subscribed");
    assert!(!asleep(&rt, "w").await, "woken by the subscription");
    rt.supervisor().push("w", item(9)).await.expect("pushed");
    within("the turn's events", async {
        while let Some(ev) = events.next().await {
            if matches!(ev, agentloop::SessionEvent::TurnEnded { .. }) {
                break;
            }
        }
    })
    .await;
    tokio::time::sleep(10 * IDLE).await;
    assert!(!asleep(&rt, "w").await, "awake while somebody listens");
    drop(events);
    until_asleep(&rt, "w").await;
    assert_eq!(delivered(&ledgers), vec![9]);
    rt.shutdown().await.expect("shutdown");
}

/// A durable timer due while its session sleeps wakes it and delivers its item once.
#[tokio::test(start_paused = true)]
async fn a_due_timer_wakes_a_sleeping_session() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let rt = runtime(&store, &ledgers, Some(IDLE)).await;
    spawn(&rt, "t").await;
    rt.wake_at("t", SystemTime::now() + 30 * IDLE, item(4))
        .await
        .expect("armed");
    until_asleep(&rt, "t").await;
    tokio::time::sleep(31 * IDLE).await;
    within("the timer's turn", async {
        while delivered(&ledgers) != vec![4] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    until_asleep(&rt, "t").await;
    tokio::time::sleep(60 * IDLE).await;
    assert_eq!(delivered(&ledgers), vec![4], "once");
    rt.shutdown().await.expect("shutdown");
}

/// A shutdown does not wait for sleeping sessions (they run nothing); the next start
/// on the same data directory (sled, held by one process) registers them asleep
/// without starting them, and the first push wakes each.
#[tokio::test(start_paused = true)]
async fn sleeping_sessions_stay_asleep_across_a_restart() {
    let dir = TempDir::new("s39-sleep-restart");
    let ledgers = Ledgers::default();
    let start = |ledgers: &Ledgers| {
        builder(ledgers, 1)
            .data_dir(dir.path())
            .idle_after(IDLE)
            .start()
    };
    let (rt, _) = start(&ledgers).await.expect("starts");
    for i in 0..5 {
        spawn(&rt, &format!("r{i}")).await;
    }
    for i in 0..5 {
        until_asleep(&rt, &format!("r{i}")).await;
    }
    let report = rt.shutdown().await.expect("shutdown");
    assert_eq!(
        report.sessions.total, 0,
        "nothing to stop: {:?}",
        report.sessions
    );
    let started = ledgers.lock().len();

    let (rt, report) = start(&ledgers).await.expect("restarts");
    assert_eq!(report.asleep, 5, "{report:?}");
    assert!(report.resumed.is_empty(), "{report:?}");
    assert_eq!(ledgers.lock().len(), started, "none started");
    assert_eq!(rt.supervisor().counts().await.sleeping, 5);
    rt.supervisor().push("r3", item(33)).await.expect("woken");
    within("the woken session's turn", async {
        while delivered(&ledgers) != vec![33] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(rt.supervisor().counts().await.sleeping, 4);
    rt.shutdown().await.expect("shutdown");
}

/// A session spawned with what its record cannot restore (an end hook) keeps it across
/// a sleep: the hook does not run when it falls asleep, and runs at its real end.
#[tokio::test(start_paused = true)]
async fn a_sleep_is_not_an_end() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let rt = runtime(&store, &ledgers, Some(IDLE)).await;
    let hooks = Arc::new(Mutex::new(Vec::new()));
    let h = hooks.clone();
    rt.supervisor()
        .spawn(
            SessionSpec::new("h", "sim")
                .persistent(true)
                .on_end(move |s| {
                    let h = h.clone();
                    async move {
                        h.lock().push(s.reason);
                        Ok(())
                    }
                }),
        )
        .await
        .expect("spawn");
    until_asleep(&rt, "h").await;
    assert!(hooks.lock().is_empty(), "no end hook at a sleep");
    rt.supervisor()
        .stop("h", StopOptions::bare())
        .await
        .expect("stopped");
    within("the end hook", async {
        while hooks.lock().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(*hooks.lock(), vec![ExitReason::Completed]);
    rt.shutdown().await.expect("shutdown");
}

/// Without `idle_after` nothing sleeps.
#[tokio::test(start_paused = true)]
async fn off_unless_set() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let rt = runtime(&store, &ledgers, None).await;
    spawn(&rt, "n").await;
    tokio::time::sleep(100 * IDLE).await;
    assert!(!asleep(&rt, "n").await);
    assert_eq!(rt.supervisor().counts().await.live, 1);
    rt.shutdown().await.expect("shutdown");
}

/// S39 + S20a: a session that keeps its events numbers on across a sleep: the woken
/// incarnation's first event follows the sleeping one's last (its `Ended`, kept and
/// passed over), so a subscriber that reconnects after the last number it saw gets the
/// new events with no `Lagged` (nothing was missed).
#[tokio::test(start_paused = true)]
async fn a_stream_reconnected_across_a_sleep_sees_no_gap() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let (rt, _) = builder(&ledgers, 2)
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .idle_after(IDLE)
        .keep_events()
        .start()
        .await
        .expect("starts");
    rt.supervisor()
        .spawn(
            SessionSpec::new("k", "sim")
                .persistent(true)
                .replay(0)
                .keep_events(agentloop::event_log::Retention::default()),
        )
        .await
        .expect("spawn");
    let mut events = rt
        .supervisor()
        .subscribe("k", EventFilter::all())
        .await
        .expect("subscribed");
    rt.supervisor().push("k", item(1)).await.expect("pushed");
    let last = within("the first turn's events", async {
        loop {
            let e = events.next_sequenced().await.expect("an event");
            if matches!(e.event, agentloop::SessionEvent::TurnEnded { .. }) {
                break e.seq;
            }
        }
    })
    .await;
    drop(events);
    until_asleep(&rt, "k").await;
    rt.supervisor().push("k", item(2)).await.expect("woken");
    within("the woken session's turn", async {
        while delivered(&ledgers) != vec![1, 2] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let mut again = rt
        .supervisor()
        .subscribe_after("k", last, EventFilter::all())
        .await
        .expect("resubscribed");
    let seen = within("the second turn's events", async {
        let mut seen = Vec::new();
        loop {
            let e = again.next_sequenced().await.expect("an event");
            let done = matches!(e.event, agentloop::SessionEvent::TurnEnded { .. });
            seen.push(e);
            if done {
                break seen;
            }
        }
    })
    .await;
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e.event, agentloop::SessionEvent::Lagged { .. })),
        "nothing was missed: {seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e.event, agentloop::SessionEvent::Ended(_))),
        "the sleep's Ended is passed over: {seen:?}"
    );
    assert!(seen[0].seq > last + 1, "after the sleep's Ended: {seen:?}");
    rt.shutdown().await.expect("shutdown");
}

/// A shutdown that begins while a session wakes ends it cleanly: the wake completes,
/// the woken session is stopped with the others, the shutdown finishes, and the push
/// that woke it is accepted (then delivered, or kept in the saved record for the next
/// start) or handed back with its item: never lost.
#[tokio::test(start_paused = true)]
async fn a_shutdown_during_a_wake_ends_it_cleanly() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let rt = runtime(&store, &ledgers, Some(IDLE)).await;
    spawn(&rt, "s").await;
    until_asleep(&rt, "s").await;
    let sup = rt.supervisor().clone();
    // The push reaches the supervisor first (it wakes the session), the shutdown's
    // drain gate right behind it.
    let push = tokio::spawn(async move { sup.push("s", item(5)).await });
    tokio::task::yield_now().await;
    let report = within("the shutdown", rt.shutdown())
        .await
        .expect("shutdown");
    assert!(report.sessions.total <= 1, "{report:?}");
    match within("the push's answer", push)
        .await
        .expect("the push task")
    {
        Ok(_) => {
            assert_eq!(
                report.sessions.total, 1,
                "woken before the gate closed: {report:?}"
            );
            let kept = store
                .get("s")
                .map(|r| [r.unhandled_items, r.interrupted_items].concat())
                .unwrap_or_default();
            assert!(
                delivered(&ledgers).contains(&5) || kept.contains(&item(5)),
                "accepted: delivered or saved ({kept:?})"
            );
        }
        Err(agentloop::PushError::Late { item: back })
        | Err(agentloop::PushError::UnknownSession { item: back, .. }) => {
            assert_eq!(back, item(5), "handed back");
        }
        Err(e) => panic!("{e}"),
    }
}

/// S34a (issue 52): a wake and a fork are new live sessions and count against
/// `[limits] sessions` (20 000 woken against a bound of 5 000, 64 227 forks against
/// 1 000 got past it). At the bound a push to a sleeping session is told to retry (the
/// item handed back, the session still asleep, its record untouched), and a fork is
/// refused before it writes a record; once a place frees, both go through.
#[tokio::test(start_paused = true)]
async fn wakes_and_forks_count_against_the_session_bound() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledgers = Ledgers::default();
    let (rt, _) = builder(&ledgers, 1)
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .idle_after(IDLE)
        .session_limits(agentloop::supervisor::SessionLimits {
            max_sessions: 2,
            buffer: agentloop::session::BufferBound::UNBOUNDED,
            timers: agentloop::timers::TimerBounds::UNBOUNDED,
        })
        .start()
        .await
        .expect("the runtime starts");
    rt.supervisor()
        .spawn(
            SessionSpec::new("sleeper", "sim")
                .persistent(true)
                .durability(Durability::Sync)
                .history(3),
        )
        .await
        .expect("spawn");
    rt.supervisor()
        .push("sleeper", item(1))
        .await
        .expect("push");
    within("the first turn", async {
        while delivered(&ledgers) != vec![1] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    until_asleep(&rt, "sleeper").await;
    // Two live sessions (`idle_after` off for them): the bound is reached.
    for id in ["a", "b"] {
        rt.supervisor()
            .spawn(
                SessionSpec::new(id, "sim")
                    .persistent(true)
                    .durability(Durability::Sync)
                    .idle_after(Duration::from_secs(24 * 3600)),
            )
            .await
            .expect("spawn");
    }
    match rt.supervisor().push("sleeper", item(2)).await {
        Err(agentloop::PushError::NotLive {
            item,
            why,
            retry_after,
            ..
        }) => {
            assert_eq!(item.id, 2, "the item is handed back");
            assert!(why.contains("[limits] sessions"), "{why}");
            assert!(retry_after > Duration::ZERO);
        }
        other => panic!("expected NotLive at the bound, got {other:?}"),
    }
    assert!(asleep(&rt, "sleeper").await, "still asleep, not woken");
    match rt
        .supervisor()
        .fork("sleeper", 1, "forked", Durability::Sync, 0)
        .await
    {
        Err(e @ agentloop::session::ForkError::TooManySessions { .. }) => {
            assert!(e.to_string().contains("[limits] sessions"), "{e}");
            assert!(e.to_string().contains("nothing was written"), "{e}");
        }
        other => panic!("expected TooManySessions, got {:?}", other.map(|_| ())),
    }
    assert!(
        store.load_stored("forked").await.unwrap().is_none(),
        "a refused fork writes no record"
    );
    assert_eq!(rt.supervisor().list().await.len(), 2, "still two live");
    // A place frees: the wake goes through, then the bound holds again for the fork.
    rt.supervisor()
        .stop("b", StopOptions::immediate())
        .await
        .expect("stop");
    within("the wake once there is room", async {
        loop {
            match rt.supervisor().push("sleeper", item(2)).await {
                Ok(_) => break,
                Err(agentloop::PushError::NotLive { .. }) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    within("the woken session's turn", async {
        while delivered(&ledgers) != vec![1, 2] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(matches!(
        rt.supervisor()
            .fork("sleeper", 1, "forked", Durability::Sync, 0)
            .await,
        Err(agentloop::session::ForkError::TooManySessions { .. })
    ));
    rt.supervisor()
        .stop("a", StopOptions::immediate())
        .await
        .expect("stop");
    within("the fork once there is room", async {
        loop {
            match rt
                .supervisor()
                .fork("sleeper", 1, "forked", Durability::Sync, 0)
                .await
            {
                Ok(_) => break,
                Err(agentloop::session::ForkError::TooManySessions { .. }) => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    rt.shutdown().await.expect("shutdown");
}
