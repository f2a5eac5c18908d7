//! S39 (issue 34): durable timers and schedules through a real runtime on a store, with
//! tokio's paused clock: a timer's item is pushed into its session at its time, once;
//! a timer armed before a restart fires once after it; a schedule missed for hours
//! fires once, then keeps its grid; a canceled timer never fires; a fire whose item was
//! already accepted (a retried fire) delivers nothing again and removes the timer.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use agentloop::store::{Repeat, StoredTimer};
use agentloop::{
    timers::TimerError, CheckpointStore, Durability, MemoryStore, PushOptions, Runtime, Schedule,
    SessionSpec,
};
use agentloop_sim::{Ledger, SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use parking_lot::Mutex;

type Rt = Runtime<SimItem, SimEvent>;

/// A runtime on `store` whose sim sessions report what they delivered to `ledger`.
async fn runtime(
    store: &Arc<MemoryStore<SimItem>>,
    ledger: &Arc<Mutex<Option<Arc<Mutex<Ledger>>>>>,
) -> Rt {
    let l = ledger.clone();
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .flush_logs(None)
        .register_agent("sim", move |_cfg: &[u8]| {
            let a = SimAgent::new(steps(1));
            *l.lock() = Some(a.ledger());
            Ok(a)
        })
        .start()
        .await
        .expect("the runtime starts");
    rt
}

async fn spawn(rt: &Rt, id: &str) {
    spawn_kind(rt, id, "sim").await
}

/// Spawns persistent `sync` session `id` of agent kind `kind`.
async fn spawn_kind(rt: &Rt, id: &str, kind: &str) {
    rt.supervisor()
        .spawn(
            SessionSpec::new(id, kind)
                .persistent(true)
                .durability(Durability::Sync),
        )
        .await
        .expect("spawn");
}

fn delivered(ledger: &Arc<Mutex<Option<Arc<Mutex<Ledger>>>>>) -> Vec<u64> {
    ledger
        .lock()
        .as_ref()
        .map(|l| l.lock().delivered_ids())
        .unwrap_or_default()
}

fn in_(d: Duration) -> SystemTime {
    SystemTime::now() + d
}

const MIN: Duration = Duration::from_secs(60);

/// A timer pushes its item at its time, not before, and once.
#[tokio::test(start_paused = true)]
async fn a_timer_pushes_its_item_at_its_time_once() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledger = Arc::default();
    let rt = runtime(&store, &ledger).await;
    spawn(&rt, "t").await;
    let n = rt
        .wake_at("t", in_(60 * MIN), item(7))
        .await
        .expect("armed");
    let listed = rt.timers("t").await.expect("listed");
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].id, listed[0].item.clone()), (n, Some(item(7))));
    assert_eq!(listed[0].schedule, None);
    tokio::time::sleep(59 * MIN).await;
    assert!(delivered(&ledger).is_empty(), "not before its time");
    tokio::time::sleep(2 * MIN).await;
    within("the timer's turn", async {
        while delivered(&ledger) != vec![7] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        rt.timers("t").await.expect("listed").is_empty(),
        "gone once fired"
    );
    tokio::time::sleep(120 * MIN).await;
    assert_eq!(delivered(&ledger), vec![7], "once");
    rt.shutdown().await.expect("shutdown");
}

/// A timer armed before a shutdown fires once after the next start (the store's
/// due-time index is read at start); one canceled never fires.
#[tokio::test(start_paused = true)]
async fn a_timer_armed_before_a_restart_fires_once_after_it_and_a_canceled_one_never() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledger = Arc::default();
    let rt = runtime(&store, &ledger).await;
    spawn(&rt, "r").await;
    rt.wake_at("r", in_(10 * MIN), item(1))
        .await
        .expect("armed");
    let canceled = rt
        .wake_at("r", in_(10 * MIN), item(2))
        .await
        .expect("armed");
    assert!(rt.cancel_timer("r", canceled).await.expect("canceled"));
    assert!(!rt.cancel_timer("r", canceled).await.expect("answered"));
    rt.shutdown().await.expect("shutdown");

    let rt = runtime(&store, &ledger).await;
    within("the session to be resumed", async {
        while rt.supervisor().inspect("r").await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(11 * MIN).await;
    within("the timer's turn", async {
        while delivered(&ledger) != vec![1] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(60 * MIN).await;
    assert_eq!(
        delivered(&ledger),
        vec![1],
        "once, and never the canceled one"
    );
    assert!(rt.timers("r").await.expect("listed").is_empty());
    rt.shutdown().await.expect("shutdown");
}

/// A schedule whose slot passed hours ago (the process was down) fires once at start,
/// not once per missed slot, and then keeps its grid.
#[tokio::test(start_paused = true)]
async fn a_schedule_missed_for_hours_fires_once_then_keeps_its_grid() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledger = Arc::default();
    let rt = runtime(&store, &ledger).await;
    spawn(&rt, "s").await;
    rt.shutdown().await.expect("shutdown");
    // Stored as a node that went down five hours ago would have left it: due then,
    // every hour.
    let hour = 3_600_000u64;
    let now = agentloop::store::now_ms();
    let slot = now - 5 * hour + 60_000;
    store
        .arm_timer(
            "s",
            StoredTimer {
                due_ms: slot,
                item: agentloop::store::codec::encode_item(&item(5)).unwrap(),
                repeat: Some(Repeat::Every { ms: hour }),
                armed_ms: slot - hour,
                fired: 0,
            },
            usize::MAX,
        )
        .await
        .expect("armed");
    let rt = runtime(&store, &ledger).await;
    within("the missed schedule's one fire", async {
        while delivered(&ledger).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let timers = rt.timers("s").await.expect("listed");
    assert_eq!(timers.len(), 1, "a schedule stays");
    assert_eq!(timers[0].fired, 1);
    assert_eq!(
        agentloop::store::codec::decode_item::<SimItem>(
            "s",
            &agentloop::store::codec::encode_item(&item(5)).unwrap()
        )
        .unwrap(),
        item(5)
    );
    // Its grid: the slot plus whole hours, the first after now.
    let due = timers[0]
        .due
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert_eq!((due - slot) % hour, 0, "on the grid");
    assert!(
        due > now && due - now <= hour,
        "the next slot after now: {due} vs {now}"
    );
    assert_eq!(
        timers[0].schedule,
        Some(Schedule::Every(Duration::from_millis(hour)))
    );
    tokio::time::sleep(Duration::from_millis(due - now) + MIN).await;
    within("the next slot's fire", async {
        while delivered(&ledger).len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        delivered(&ledger),
        vec![5, 5],
        "one fire for five missed slots, then one per slot"
    );
    rt.shutdown().await.expect("shutdown");
}

/// A fire whose item the session already accepted (a retried fire: same key) delivers
/// nothing again, and the timer is removed all the same.
#[tokio::test(start_paused = true)]
async fn a_retried_fire_delivers_nothing_again_and_removes_the_timer() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledger = Arc::default();
    let rt = runtime(&store, &ledger).await;
    spawn(&rt, "d").await;
    let when = in_(10 * MIN);
    let n = rt.wake_at("d", when, item(3)).await.expect("armed");
    let due = rt.timers("d").await.unwrap()[0]
        .due
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // The fire's item, accepted under the fire's own key before the timer comes due.
    let mut options = PushOptions::new();
    options.idempotency = Some((format!("timer/{n}/{due}"), 0));
    rt.supervisor()
        .push("d", item(3))
        .options(options)
        .await
        .expect("accepted");
    tokio::time::sleep(11 * MIN).await;
    within("the timer's removal", async {
        while !rt.timers("d").await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(MIN).await;
    assert_eq!(delivered(&ledger), vec![3], "delivered once");
    rt.shutdown().await.expect("shutdown");
}

/// An agent whose turn arms a timer for every item under 100 (its id plus 100, ten
/// minutes later), and records every item it receives.
struct Waker {
    seen: Arc<Mutex<Vec<u64>>>,
}

impl agentloop::Agent for Waker {
    type Item = SimItem;
    type Event = SimEvent;
    type State = ();

    async fn run_turn(
        &self,
        turn: agentloop::Turn<Self>,
        cx: agentloop::TurnCx<Self>,
    ) -> Result<agentloop::TurnOutcome<()>, agentloop::AgentError> {
        for it in &turn.items {
            self.seen.lock().push(it.id);
            if it.id < 100 {
                cx.wake_at(in_(10 * MIN), SimItem::new(it.id + 100, "woken"))
                    .await
                    .map_err(|e| agentloop::AgentError::failed(e.to_string()))?;
            }
        }
        Ok(agentloop::TurnOutcome::Completed)
    }
}

/// A turn arms a timer (`TurnCx::wake_at`, a durable step): its item comes back into
/// the session at its time, once; the timer is listed until then.
#[tokio::test(start_paused = true)]
async fn a_turn_arms_a_timer_and_its_item_comes_back_once() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let s = seen.clone();
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .flush_logs(None)
        .register_agent("waker", move |_cfg: &[u8]| Ok(Waker { seen: s.clone() }))
        .start()
        .await
        .expect("the runtime starts");
    spawn_kind(&rt, "w", "waker").await;
    rt.supervisor().push("w", item(7)).await.expect("pushed");
    within("the turn to arm its timer", async {
        while rt.timers("w").await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let armed = rt.timers("w").await.unwrap();
    assert_eq!(armed[0].item, Some(SimItem::new(107, "woken")));
    tokio::time::sleep(9 * MIN).await;
    assert_eq!(*seen.lock(), vec![7], "not before its time");
    tokio::time::sleep(2 * MIN).await;
    within("the woken item", async {
        while seen.lock().len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(30 * MIN).await;
    assert_eq!(*seen.lock(), vec![7, 107], "once");
    assert!(rt.timers("w").await.unwrap().is_empty());
    rt.shutdown().await.expect("shutdown");
}

/// A session with no record cannot have a timer: refused with what to do.
#[tokio::test(start_paused = true)]
async fn a_timer_for_a_session_without_a_record_is_refused_with_what_to_do() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledger = Arc::default();
    let rt = runtime(&store, &ledger).await;
    let e = rt
        .wake_at("nobody", in_(MIN), item(1))
        .await
        .expect_err("no record");
    assert!(matches!(e, TimerError::NoRecord { .. }), "{e:?}");
    assert!(e.to_string().contains("spawn it persistent"), "{e}");
    let e = rt
        .schedule("nobody", Schedule::Every(Duration::ZERO), item(1))
        .await
        .expect_err("a zero period");
    assert!(matches!(e, TimerError::Period), "{e:?}");
    rt.shutdown().await.expect("shutdown");
}

/// Arms a timer in its turn, records the number, then holds the turn when `hold`.
struct ArmThenHold {
    numbers: Arc<Mutex<Vec<u64>>>,
    hold: bool,
    armed: Option<tokio::sync::mpsc::UnboundedSender<()>>,
}

impl agentloop::Agent for ArmThenHold {
    type Item = SimItem;
    type Event = SimEvent;
    type State = ();

    async fn run_turn(
        &self,
        _turn: agentloop::Turn<Self>,
        cx: agentloop::TurnCx<Self>,
    ) -> Result<agentloop::TurnOutcome<()>, agentloop::AgentError> {
        let n = cx
            .wake_at(in_(10 * MIN), SimItem::new(500, "later"))
            .await
            .map_err(|e| agentloop::AgentError::failed(e.to_string()))?;
        self.numbers.lock().push(n);
        if self.hold {
            if let Some(tx) = &self.armed {
                let _ = tx.send(());
            }
            std::future::pending::<()>().await;
        }
        Ok(agentloop::TurnOutcome::Completed)
    }
}

/// `TurnCx::wake_at` is a durable step: a turn cut after it armed its timer (a crash),
/// run again from the record, is answered the same number from its journal and arms
/// nothing more.
#[tokio::test]
async fn a_turn_run_again_after_a_crash_arms_its_timer_once() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let numbers: Arc<Mutex<Vec<u64>>> = Arc::default();
    let (tx, mut armed) = tokio::sync::mpsc::unbounded_channel();
    let spec = || {
        SessionSpec::new("c", "armer")
            .persistent(true)
            .durability(Durability::Sync)
    };
    let first = agentloop::SessionHandle::spawn(
        spec(),
        Arc::new(ArmThenHold {
            numbers: numbers.clone(),
            hold: true,
            armed: Some(tx),
        }),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("spawn");
    first.push(item(1)).await.expect("pushed");
    within("the timer to be armed", armed.recv()).await;
    assert_eq!(store.timers("c").await.unwrap().len(), 1);
    // The crash: what the store holds now, timers left behind (a second arm would show
    // in the fresh store).
    let after = Arc::new(MemoryStore::<SimItem>::new());
    after.insert(store.get("c").expect("the record"));
    drop(first);
    let second = agentloop::SessionHandle::spawn(
        spec(),
        Arc::new(ArmThenHold {
            numbers: numbers.clone(),
            hold: false,
            armed: None,
        }),
        Some(after.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("resume");
    second
        .stop(agentloop::StopOptions::drain())
        .await
        .expect("stop");
    within("exit", second.wait()).await;
    let numbers = numbers.lock().clone();
    assert_eq!(numbers.len(), 2, "the turn ran twice: {numbers:?}");
    assert_eq!(numbers[0], numbers[1], "the same number, from the journal");
    assert!(
        after.timers("c").await.unwrap().is_empty(),
        "the rerun armed nothing"
    );
}

/// A session that is not persistent cannot keep a timer (it has no record to outlive
/// the process): refused with what to do, nothing armed.
#[tokio::test(start_paused = true)]
async fn a_timer_for_a_session_that_is_not_persistent_is_refused() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledger = Arc::default();
    let rt = runtime(&store, &ledger).await;
    rt.supervisor()
        .spawn(SessionSpec::new("mem", "sim"))
        .await
        .expect("spawn");
    let e = rt
        .wake_at("mem", in_(MIN), item(1))
        .await
        .expect_err("not persistent");
    assert!(matches!(e, TimerError::Session(_)), "{e:?}");
    assert!(e.to_string().contains("not persistent"), "{e}");
    assert!(store.timers("mem").await.unwrap().is_empty());
    rt.shutdown().await.expect("shutdown");
}

/// A timer due in a hundred billion years neither fires nor holds up the service: a
/// timer due soon after it still fires. Arming for a
/// session that is stored already writes nothing more (no checkpoint write).
#[tokio::test(start_paused = true)]
async fn a_timer_absurdly_far_away_leaves_the_others_firing_and_a_stored_session_is_not_rewritten()
{
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let ledger = Arc::default();
    let rt = runtime(&store, &ledger).await;
    spawn(&rt, "far").await;
    rt.supervisor().push("far", item(1)).await.expect("pushed");
    within("the first turn", async {
        while delivered(&ledger) != vec![1] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let saves = store.save_count();
    let far = SystemTime::UNIX_EPOCH + Duration::from_millis(u64::MAX / 2);
    rt.wake_at("far", far, item(2)).await.expect("armed");
    rt.wake_at("far", in_(MIN), item(3)).await.expect("armed");
    assert_eq!(
        store.save_count(),
        saves,
        "a stored session is not written again to arm"
    );
    tokio::time::sleep(2 * MIN).await;
    within("the near timer", async {
        while delivered(&ledger) != vec![1, 3] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3 * 86_400)).await;
    assert_eq!(delivered(&ledger), vec![1, 3]);
    assert_eq!(
        rt.timers("far").await.unwrap().len(),
        1,
        "the far one waits"
    );
    rt.shutdown().await.expect("shutdown");
}

/// Ends its turn with a wake-up time (`TurnCx::end_and_wake_at`) when one of its items
/// is under 100: that item's id + 100 comes back in ten minutes. With `hold`: it says
/// it started, waits for the gate, then passes a safe point and ignores the cancel it
/// may capture there (the cancel must win over the outcome all the same).
struct EndsWithWakeUp {
    seen: Arc<Mutex<Vec<u64>>>,
    hold: Option<(
        tokio::sync::mpsc::UnboundedSender<()>,
        Arc<tokio::sync::Notify>,
    )>,
}

impl EndsWithWakeUp {
    fn new(seen: &Arc<Mutex<Vec<u64>>>) -> Self {
        EndsWithWakeUp {
            seen: seen.clone(),
            hold: None,
        }
    }
}

impl agentloop::Agent for EndsWithWakeUp {
    type Item = SimItem;
    type Event = SimEvent;
    type State = ();

    async fn run_turn(
        &self,
        turn: agentloop::Turn<Self>,
        cx: agentloop::TurnCx<Self>,
    ) -> Result<agentloop::TurnOutcome<()>, agentloop::AgentError> {
        self.seen.lock().extend(turn.items.iter().map(|i| i.id));
        if let Some((started, gate)) = &self.hold {
            let _ = started.send(());
            gate.notified().await;
            let _ignored = cx.safe_point(agentloop::SafePoint::AfterModelCall, &());
        }
        match turn.items.iter().find(|i| i.id < 100) {
            Some(it) => cx.end_and_wake_at(in_(10 * MIN), SimItem::new(it.id + 100, "woken")),
            None => Ok(agentloop::TurnOutcome::Completed),
        }
    }
}

/// A turn that ends with a wake-up time (`TurnOutcome::WakeAt`): the turn completes, its
/// timer is listed, the idle session sleeps meanwhile, and at the time the item comes
/// back into it (woken), once.
#[tokio::test(start_paused = true)]
async fn a_turn_that_ends_with_a_wake_up_time_sleeps_and_gets_its_item_back_then_once() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let s = seen.clone();
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .flush_logs(None)
        .idle_after(MIN)
        .register_agent("later", move |_cfg: &[u8]| Ok(EndsWithWakeUp::new(&s)))
        .start()
        .await
        .expect("the runtime starts");
    spawn_kind(&rt, "w", "later").await;
    let armed_from = SystemTime::now();
    rt.supervisor().push("w", item(7)).await.expect("pushed");
    within("the turn's wake-up to be armed", async {
        while rt.timers("w").await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let armed = rt.timers("w").await.unwrap();
    assert_eq!(armed.len(), 1, "{armed:?}");
    assert_eq!(armed[0].item, Some(SimItem::new(107, "woken")));
    let due = agentloop_ms(armed[0].due);
    let expect = agentloop_ms(armed_from + 10 * MIN);
    assert!(
        due >= expect && due < expect + 1_000,
        "due ten minutes after the turn: {due} against {expect}"
    );
    tokio::time::sleep(5 * MIN).await;
    assert_eq!(*seen.lock(), vec![7], "not before its time");
    let counts = rt.supervisor().counts().await;
    assert_eq!(
        (counts.live, counts.sleeping),
        (0, 1),
        "idle meanwhile, so asleep"
    );
    tokio::time::sleep(6 * MIN).await;
    within("the woken item", async {
        while seen.lock().len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(30 * MIN).await;
    assert_eq!(*seen.lock(), vec![7, 107], "once");
    assert!(rt.timers("w").await.unwrap().is_empty());
    rt.shutdown().await.expect("shutdown");
}

fn agentloop_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64
}

/// A cancel the turn captured at a safe point wins over the wake-up it ended with
/// anyway: the session ends canceled with the turn's items kept, and nothing is armed
/// (unlike `TurnCx::wake_at`, which arms when called).
#[tokio::test(start_paused = true)]
async fn a_turn_that_captured_a_cancel_arms_no_wake_up() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Notify::new());
    let h = agentloop::SessionHandle::spawn(
        SessionSpec::new("c", "later")
            .persistent(true)
            .durability(Durability::Sync),
        Arc::new(EndsWithWakeUp {
            seen: seen.clone(),
            hold: Some((started_tx, gate.clone())),
        }),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("spawn");
    h.push(item(3)).await.expect("pushed");
    within("the turn to start", started.recv()).await;
    h.stop(agentloop::StopOptions::graceful())
        .await
        .expect("stop");
    gate.notify_one();
    let exit = within("exit", h.wait()).await;
    assert!(
        matches!(exit.reason, agentloop::ExitReason::Canceled(_)),
        "{:?}",
        exit.reason
    );
    assert_eq!(ids(&exit.interrupted_items), vec![3]);
    assert!(
        store.timers("c").await.unwrap().is_empty(),
        "the canceled turn armed nothing"
    );
}

/// The wake-up is armed as the turn's last durable step: a turn cut after the step's
/// result is journaled but before its end is on record (a crash), run again from the
/// record, is answered from the journal and arms nothing more.
#[tokio::test]
async fn a_turn_that_ended_with_a_wake_up_and_ran_again_after_a_crash_arms_it_once() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let spec = || {
        SessionSpec::new("k", "later")
            .persistent(true)
            .durability(Durability::Sync)
    };
    let first = agentloop::SessionHandle::spawn(
        spec(),
        Arc::new(EndsWithWakeUp::new(&seen)),
        Some(store.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("spawn");
    // A reader that stops after `TurnStarted`, with room for one event: the arm step's
    // `StepStarted` fills its buffer and its `StepFinished`, sent once the step's result
    // is journaled, waits there, so the turn cannot end.
    let mut events = first.subscribe_with_backpressure(1);
    first.push(item(1)).await.expect("pushed");
    loop {
        match within("the turn to start", events.next()).await {
            Some(agentloop::SessionEvent::TurnStarted { .. }) => break,
            Some(_) => continue,
            None => panic!("the stream ended before the turn started"),
        }
    }
    within("the wake-up step's result on record", async {
        loop {
            let journaled = store.get("k").and_then(|r| r.journal).is_some_and(|j| {
                j.entries
                    .iter()
                    .any(|e| e.name == "end_and_wake_at" && e.result.is_some())
            });
            if journaled {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(store.timers("k").await.unwrap().len(), 1, "armed once");
    // The crash: what the store holds now, timers left behind (a second arm would show
    // in the fresh store).
    let after = Arc::new(MemoryStore::<SimItem>::new());
    after.insert(store.get("k").expect("the record"));
    drop(events);
    drop(first);
    let second = agentloop::SessionHandle::spawn(
        spec(),
        Arc::new(EndsWithWakeUp::new(&seen)),
        Some(after.clone() as Arc<dyn CheckpointStore<SimItem>>),
    )
    .await
    .expect("resume");
    second
        .stop(agentloop::StopOptions::drain())
        .await
        .expect("stop");
    let exit = within("exit", second.wait()).await;
    assert_eq!(exit.reason, agentloop::ExitReason::Completed);
    assert_eq!(*seen.lock(), vec![1, 1], "the turn ran again");
    assert!(
        after.timers("k").await.unwrap().is_empty(),
        "the rerun was answered from the journal and armed nothing"
    );
}

/// A session that cannot keep a timer (no store): the turn that ends with a wake-up
/// time fails with what to do, instead of losing the wake-up.
#[tokio::test(start_paused = true)]
async fn a_wake_up_without_a_store_fails_the_turn_with_what_to_do() {
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let h = agentloop::SessionHandle::spawn(
        SessionSpec::new("n", "later"),
        Arc::new(EndsWithWakeUp::new(&seen)),
        None,
    )
    .await
    .expect("spawn");
    h.push(item(2)).await.expect("pushed");
    let exit = within("exit", h.wait()).await;
    match &exit.reason {
        agentloop::ExitReason::Failed(why) => {
            assert!(why.contains("wake-up time"), "{why}");
            assert!(why.contains("need a checkpoint store"), "{why}");
        }
        r => panic!("expected Failed, got {r:?}"),
    }
}

/// S34a (issue 52): a session's durable timers are bounded (`[limits]`
/// `session_timers`, `timer_bytes`, `timer_period`). Without the bounds 300 timers of
/// 900 KB took a server's memory and an `every 1ms` schedule came back after every
/// restart. Over a bound the arm is refused before anything is written, saying which
/// bound and what to do; a canceled timer gives its place back; the bound holds for
/// the store too (a second runtime on it sees the same count).
#[tokio::test(start_paused = true)]
async fn a_sessions_timers_are_bounded_in_count_size_and_period() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (rt, _) = Runtime::<SimItem, SimEvent>::builder()
        .store(store.clone() as Arc<dyn CheckpointStore<SimItem>>)
        .flush_logs(None)
        .register_agent("sim", |_cfg: &[u8]| Ok(SimAgent::new(steps(1))))
        .session_limits(agentloop::supervisor::SessionLimits {
            max_sessions: usize::MAX,
            buffer: agentloop::session::BufferBound::UNBOUNDED,
            timers: agentloop::timers::TimerBounds {
                per_session: 2,
                item_bytes: 200,
                min_period: Duration::from_secs(2),
            },
        })
        .start()
        .await
        .expect("the runtime starts");
    spawn(&rt, "b").await;
    let big = SimItem::new(1, "x".repeat(300));
    match rt.wake_at("b", in_(MIN), big).await {
        Err(e @ TimerError::ItemTooLarge { .. }) => {
            assert!(e.to_string().contains("[limits] timer_bytes"), "{e}")
        }
        other => panic!("expected ItemTooLarge, got {other:?}"),
    }
    for schedule in ["every 10ms", "every 1s", "* * * * * *"] {
        match rt.schedule("b", schedule.parse().unwrap(), item(2)).await {
            Err(e @ TimerError::PeriodTooShort { .. }) => {
                assert!(
                    e.to_string().contains("[limits] timer_period"),
                    "{schedule}: {e}"
                )
            }
            other => panic!("{schedule}: expected PeriodTooShort, got {other:?}"),
        }
    }
    assert!(rt.timers("b").await.unwrap().is_empty(), "nothing armed");
    let first = rt.wake_at("b", in_(MIN), item(3)).await.expect("first");
    rt.schedule("b", "every 2s".parse().unwrap(), item(4))
        .await
        .expect("second");
    match rt.wake_at("b", in_(MIN), item(5)).await {
        Err(e @ TimerError::TooMany { .. }) => {
            assert!(e.to_string().contains("[limits] session_timers"), "{e}")
        }
        other => panic!("expected TooMany, got {other:?}"),
    }
    assert_eq!(rt.timers("b").await.unwrap().len(), 2);
    assert!(rt.cancel_timer("b", first).await.unwrap());
    rt.wake_at("b", in_(MIN), item(6))
        .await
        .expect("a canceled timer's place is free again");
    // The store refuses past its count whoever asks (a turn's arm goes the same way).
    let timer = StoredTimer {
        due_ms: agentloop_ms(in_(MIN)),
        item: Vec::new(),
        repeat: None,
        armed_ms: 0,
        fired: 0,
    };
    match store.arm_timer("b", timer, 2).await {
        Err(agentloop::StoreError::TooManyTimers { max: 2, .. }) => {}
        other => panic!("expected TooManyTimers, got {other:?}"),
    }
    rt.shutdown().await.expect("shutdown");
}
