//! Spawn settings are part of the record (issue 28, 4): a session spawned with its own
//! durability, history, replay buffer, restart policy and poll interval keeps all of
//! them across restarts of its runtime and a planned move to another node, instead of
//! taking the defaults of whichever runtime resumes it.
//!
//! A checkpoint history needs turn ends that are written (S16b refuses `exit` with a
//! history), so `exit` durability and history 3 are carried by two sessions of the
//! same runtime through the same restarts and move.

use std::sync::Arc;
use std::time::Duration;

use agentloop::session::{RestartPolicy, SessionSettings};
use agentloop::store::MemoryStore;
use agentloop::{Durability, Runtime, SessionSpec, StopOptions};
use agentloop_sim::{SimAgent, SimEvent, SimItem};
use agentloop_tests::*;
use parking_lot::Mutex;

type Rt = Runtime<SimItem, SimEvent>;

/// Every item id the session's turns took, in order, on any node.
type Delivered = Arc<Mutex<Vec<u64>>>;

async fn node(name: &'static str, store: Arc<MemoryStore<SimItem>>, delivered: Delivered) -> Rt {
    let (rt, _report) = Rt::builder()
        .store(store)
        .heartbeat(Duration::from_millis(50), Duration::from_millis(300))
        // The runtime's own defaults differ from every setting the session was
        // spawned with: a resume that fell back to them would show.
        .durability(Durability::Sync)
        .node(name)
        .register_agent("sim", move |_cfg: &[u8]| {
            let d = delivered.clone();
            Ok(SimAgent::new(steps(1))
                .with_turn_hook(Arc::new(move |_turn, ids| d.lock().extend_from_slice(ids))))
        })
        .start()
        .await
        .unwrap();
    rt
}

/// Pushes `ids` to both sessions through `rt` and waits until turns have taken the
/// last of them.
async fn push_and_run(rt: &Rt, delivered: &Delivered, ids: &[u64]) {
    for &id in ids {
        rt.push(EXIT, item(id))
            .await
            .unwrap_or_else(|e| panic!("push {id}: {e}"));
        rt.push(HISTORY, item(1000 + id))
            .await
            .unwrap_or_else(|e| panic!("push {}: {e}", 1000 + id));
    }
    let last = *ids.last().unwrap();
    within("the turns that take the last items", async {
        while !(delivered.lock().contains(&last) && delivered.lock().contains(&(1000 + last))) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

const EXIT: &str = "kept-exit";
const HISTORY: &str = "kept-history";

/// The settings record `id`'s last incarnation wrote.
fn stored_settings(store: &MemoryStore<SimItem>, id: &str) -> Option<SessionSettings> {
    let stored = store.get_stored(id).expect("the record");
    stored.decode::<SimItem>().expect("decodes").header.settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_durability_and_history_three_survive_two_restarts_and_a_move() {
    use agentloop_cluster::peers::connect_in_process;
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let delivered: Delivered = Arc::default();
    let exit = SessionSettings {
        durability: Durability::Exit,
        history: 0,
        replay: 64,
        restart: RestartPolicy::Never,
        poll_interval_ms: Some(700),
        events: None,
        idle_after_ms: None,
    };
    let history = SessionSettings {
        durability: Durability::Turn,
        history: 3,
        replay: 32,
        restart: RestartPolicy::Transient,
        poll_interval_ms: None,
        events: None,
        idle_after_ms: None,
    };
    let expect = |store: &MemoryStore<SimItem>, when: &str| {
        assert_eq!(stored_settings(store, EXIT), Some(exit), "{EXIT} {when}");
        assert_eq!(
            stored_settings(store, HISTORY),
            Some(history),
            "{HISTORY} {when}"
        );
    };

    let a = node("a", store.clone(), delivered.clone()).await;
    for (id, s) in [(EXIT, exit), (HISTORY, history)] {
        let mut spec = SessionSpec::new(id, "sim")
            .persistent(true)
            .durability(s.durability)
            .history(s.history)
            .replay(s.replay)
            .restart(s.restart);
        if let Some(p) = s.poll_interval() {
            spec = spec.poll_interval(p);
        }
        a.supervisor().spawn(spec).await.unwrap();
    }
    push_and_run(&a, &delivered, &[1, 2]).await;
    // Give a (wrong) write at a turn end time to land before looking.
    tokio::time::sleep(Duration::from_millis(50)).await;
    // An `exit` session writes nothing before its exit; the other writes at turn ends.
    assert!(
        store.get(EXIT).is_none(),
        "an `exit` session is not written at a turn end"
    );
    assert_eq!(
        stored_settings(&store, HISTORY),
        Some(history),
        "at a turn end"
    );

    // Two restarts of the node: each stops the sessions at a safe point (the records
    // `Interrupted`), and the next runtime resumes them from their records.
    let mut next = 3;
    let mut a = a;
    for restart in 1..=2 {
        a.stop(StopOptions::immediate().shutdown()).await.unwrap();
        expect(&store, &format!("at exit before restart {restart}"));
        a = node("a", store.clone(), delivered.clone()).await;
        assert_eq!(
            a.supervisor().list().await.len(),
            2,
            "resumed at restart {restart}"
        );
        push_and_run(&a, &delivered, &[next, next + 1]).await;
        next += 2;
    }

    // A planned move of both to node b: b resumes them from the records a wrote.
    let b = node("b", store.clone(), delivered.clone()).await;
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    for id in [EXIT, HISTORY] {
        a.migrate(id, "b", Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("the move of {id}: {e}"));
    }
    assert_eq!(b.supervisor().list().await.len(), 2, "both run on b");
    push_and_run(&b, &delivered, &[next, next + 1]).await;
    next += 2;

    // b's incarnations write what they run with: the settings they were spawned with,
    // not b's defaults (sync, no history, no replay, permanent restarts).
    b.stop(StopOptions::immediate().shutdown()).await.unwrap();
    expect(&store, "after two restarts and a move");
    // Eight turns ended durably; history 3 keeps the last three.
    let kept = a.history(HISTORY).await.unwrap();
    assert_eq!(kept.len(), 3, "history 3 kept: {kept:?}");
    // A fork inherits the checkpoint's settings, with a history of its own.
    let turn = kept.last().expect("a checkpoint").turn;
    let fork = a
        .fork(HISTORY, turn, "kept-fork", 1)
        .await
        .expect("the fork");
    fork.stop(StopOptions::immediate().shutdown())
        .await
        .unwrap();
    assert_eq!(
        stored_settings(&store, "kept-fork"),
        Some(SessionSettings {
            history: 1,
            ..history
        }),
        "a fork keeps the checkpoint's settings"
    );
    let mut got = delivered.lock().clone();
    got.sort_unstable();
    let want: Vec<u64> = (1..next).chain(1001..1000 + next).collect();
    assert_eq!(got, want, "every item once");
    a.stop(StopOptions::immediate().shutdown()).await.unwrap();
}
