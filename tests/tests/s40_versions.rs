//! S40 agent versions: a record keeps the version of the kind that wrote it; a runtime
//! that registers that version resumes it there (pinned), one that does not migrates it
//! along its chain of migrations to the newest version, and one that can do neither
//! refuses it with an error naming the kind, the record's version and the versions
//! available, leaving the record as it was. A migration that fails leaves the record as
//! it was; the dry run says what the start then does.

use std::sync::Arc;

use agentloop::versions::SessionFate;
use agentloop::{
    versions::Migration, Agent, AgentError, CheckpointStore, MemoryStore, Runtime, RuntimeBuilder,
    SessionSpec, Turn, TurnCx, TurnOutcome,
};
use agentloop_sim::{SimEvent, SimItem};
use agentloop_tests::*;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// An item whose first turn fails (once per test process), so the supervisor
/// restarts the session.
const FAIL_ONCE: u64 = 666;
static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Version 1's state: how many items it saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct CountV1 {
    n: u32,
}

/// Version 2's state: the count under another name and type, and a note.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct CountV2 {
    total: u64,
    note: String,
}

/// Version 3's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct CountV3 {
    total: u64,
    notes: Vec<String>,
}

/// What one turn saw: which version ran it, its items, the state it was given (as
/// that version's debug text).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    version: u32,
    items: Vec<u64>,
    state: Option<String>,
}

/// One agent per version, generic over its state; `next` turns the state it was given
/// (if any) and the turn's item count into the one it carries.
struct Counter<S> {
    version: u32,
    seen: mpsc::UnboundedSender<Seen>,
    next: fn(Option<S>, u64) -> S,
}

impl<S> Agent for Counter<S>
where
    S: Clone + Send + Sync + Serialize + serde::de::DeserializeOwned + std::fmt::Debug + 'static,
{
    type Item = SimItem;
    type Event = SimEvent;
    type State = S;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        _cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<S>, AgentError> {
        let items: Vec<u64> = turn.items.iter().map(|i| i.id).collect();
        let _ = self.seen.send(Seen {
            version: self.version,
            items: items.clone(),
            state: turn.state.as_ref().map(|s| format!("{s:?}")),
        });
        if items.contains(&FAIL_ONCE) && !FAILED.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(AgentError::failed("item 666 fails its first turn"));
        }
        Ok(TurnOutcome::CompletedWith {
            state: (self.next)(turn.state, items.len() as u64),
        })
    }
}

fn v1(prev: Option<CountV1>, k: u64) -> CountV1 {
    CountV1 {
        n: prev.map_or(0, |c| c.n) + k as u32,
    }
}
fn v2(prev: Option<CountV2>, k: u64) -> CountV2 {
    let prev = prev.unwrap_or(CountV2 {
        total: 0,
        note: String::new(),
    });
    CountV2 {
        total: prev.total + k,
        note: prev.note,
    }
}
fn v3(prev: Option<CountV3>, k: u64) -> CountV3 {
    let prev = prev.unwrap_or(CountV3 {
        total: 0,
        notes: Vec::new(),
    });
    CountV3 {
        total: prev.total + k,
        notes: prev.notes,
    }
}

type Builder = RuntimeBuilder<SimItem, SimEvent>;

/// A builder on `store` with the given versions of kind `counter` registered, each
/// reporting its turns on `tx`.
fn builder(
    store: &Arc<MemoryStore<SimItem>>,
    versions: &[u32],
    tx: &mpsc::UnboundedSender<Seen>,
) -> Builder {
    let mut b = Runtime::builder().store(store.clone() as Arc<dyn CheckpointStore<SimItem>>);
    for &v in versions {
        let seen = tx.clone();
        b = match v {
            1 => b.register_agent_version("counter", 1, move |_: &[u8]| {
                Ok(Counter {
                    version: 1,
                    seen: seen.clone(),
                    next: v1,
                })
            }),
            2 => b.register_agent_version("counter", 2, move |_: &[u8]| {
                Ok(Counter {
                    version: 2,
                    seen: seen.clone(),
                    next: v2,
                })
            }),
            3 => b.register_agent_version("counter", 3, move |_: &[u8]| {
                Ok(Counter {
                    version: 3,
                    seen: seen.clone(),
                    next: v3,
                })
            }),
            _ => unreachable!("versions 1 to 3"),
        };
    }
    b
}

fn one_to_two() -> Migration {
    Migration::new().state(|c: CountV1| {
        Ok(CountV2 {
            total: u64::from(c.n),
            note: "from v1".into(),
        })
    })
}

fn two_to_three() -> Migration {
    Migration::new().state(|c: CountV2| {
        Ok(CountV3 {
            total: c.total,
            notes: vec![c.note, "from v2".into()],
        })
    })
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    within("the next turn", rx.recv())
        .await
        .expect("an agent is alive")
}

/// Runs session `s` on version 1 alone: two turns (two items, then one), then a
/// shutdown, which leaves it `Interrupted` with its carried state `CountV1 { n: 2 }`.
async fn interrupted_on_v1(store: &Arc<MemoryStore<SimItem>>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (rt, _) = builder(store, &[1], &tx).start().await.expect("start v1");
    let h = rt
        .supervisor()
        .spawn(SessionSpec::new("s", "counter").persistent(true))
        .await
        .expect("spawn");
    h.push(item(1)).await.expect("push");
    assert_eq!(next(&mut rx).await.version, 1);
    h.push(item(2)).await.expect("push");
    let _ = next(&mut rx).await;
    // Wait until the second turn's state is what the record holds.
    within("the second turn's record", async {
        loop {
            let rec = store.load("s").await.expect("load").expect("stored");
            if rec.state.is_some() && rec.turn_index == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    rt.shutdown().await.expect("shutdown");
    let rec = store.load("s").await.expect("load").expect("stored");
    assert_eq!(
        rec.agent_version, 1,
        "a record keeps the version that wrote it"
    );
    assert_eq!(rec.status.to_string(), "Interrupted");
    let state: CountV1 =
        agentloop::store::codec::decode_state("s", rec.state.as_deref().expect("a state"))
            .expect("v1 state");
    assert_eq!(state, CountV1 { n: 2 });
}

fn v1_state(n: u32) -> Option<String> {
    Some(format!("{:?}", CountV1 { n }))
}

/// A session interrupted on v1 resumes on a runtime with v1 and v2 pinned to v1: v1
/// runs its next turn with its own state, and the record stays at v1; a new session on
/// that runtime runs v2.
#[tokio::test(start_paused = true)]
async fn s40_a_record_resumes_pinned_on_its_own_version() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    interrupted_on_v1(&store).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (rt, report) = builder(&store, &[1, 2], &tx)
        .start()
        .await
        .expect("start v1+v2");
    assert_eq!(report.resumed, vec!["s".to_string()], "{report:?}");
    rt.supervisor().push("s", item(3)).await.expect("push");
    assert_eq!(
        next(&mut rx).await,
        Seen {
            version: 1,
            items: vec![3],
            state: v1_state(2)
        }
    );
    let fresh = rt
        .supervisor()
        .spawn(SessionSpec::new("new", "counter").persistent(true))
        .await
        .expect("spawn");
    fresh.push(item(9)).await.expect("push");
    assert_eq!(
        next(&mut rx).await,
        Seen {
            version: 2,
            items: vec![9],
            state: None
        }
    );
    rt.shutdown().await.expect("shutdown");
    assert_eq!(store.load("s").await.unwrap().unwrap().agent_version, 1);
    assert_eq!(store.load("new").await.unwrap().unwrap().agent_version, 2);
}

/// On a runtime with v2 alone and the migration from v1, the session resumes migrated:
/// v2 runs its next turn with the migrated state, and the record is v2's.
#[tokio::test(start_paused = true)]
async fn s40_a_record_is_migrated_to_the_newest_version() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    interrupted_on_v1(&store).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (rt, report) = builder(&store, &[2], &tx)
        .register_migration("counter", 1, one_to_two())
        .start()
        .await
        .expect("start v2");
    assert_eq!(report.resumed, vec!["s".to_string()], "{report:?}");
    rt.supervisor().push("s", item(3)).await.expect("push");
    let migrated = CountV2 {
        total: 2,
        note: "from v1".into(),
    };
    assert_eq!(
        next(&mut rx).await,
        Seen {
            version: 2,
            items: vec![3],
            state: Some(format!("{migrated:?}"))
        }
    );
    rt.shutdown().await.expect("shutdown");
    let rec = store.load("s").await.unwrap().unwrap();
    assert_eq!(rec.agent_version, 2);
    let state: CountV2 =
        agentloop::store::codec::decode_state("s", rec.state.as_deref().unwrap()).unwrap();
    assert_eq!(
        state,
        CountV2 {
            total: 3,
            note: "from v1".into()
        }
    );
}

/// With neither v1 nor a migration from it, the start refuses the session, says why
/// (kind, version, versions available) and keeps the record byte for byte; a spawn by
/// id is refused the same way.
#[tokio::test(start_paused = true)]
async fn s40_a_record_no_version_runs_is_refused_and_kept() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    interrupted_on_v1(&store).await;
    let before = store.load_stored("s").await.unwrap().unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (rt, report) = builder(&store, &[2, 3], &tx)
        .register_migration("counter", 2, two_to_three())
        .start()
        .await
        .expect("start v2+v3");
    assert!(report.resumed.is_empty(), "{report:?}");
    let (id, why) = &report.skipped[0];
    assert_eq!(id, "s");
    for part in [
        "session `s`",
        "version 1 of agent kind `counter`",
        "runs version(s) 2, 3",
        "no migration from version 1 to 2",
        "record is kept",
    ] {
        assert!(why.contains(part), "{part:?} missing from: {why}");
    }
    let e = rt
        .supervisor()
        .spawn(SessionSpec::new("s", "counter").persistent(true))
        .await
        .expect_err("refused");
    assert!(matches!(e, agentloop::SupervisorError::Version(_)), "{e}");
    assert!(
        e.to_string().contains("version 1 of agent kind `counter`"),
        "{e}"
    );
    rt.shutdown().await.expect("shutdown");
    assert!(rx.try_recv().is_err(), "no version ran a turn");
    assert_eq!(
        store.load_stored("s").await.unwrap().unwrap(),
        before,
        "the record is kept as it was"
    );
}

/// A chain v1 → v2 → v3: a v1 record on a runtime with v3 alone is migrated twice, in
/// order.
#[tokio::test(start_paused = true)]
async fn s40_a_chain_of_migrations_applies_in_order() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    interrupted_on_v1(&store).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (rt, report) = builder(&store, &[3], &tx)
        .register_migration("counter", 1, one_to_two())
        .register_migration("counter", 2, two_to_three())
        .start()
        .await
        .expect("start v3");
    assert_eq!(report.resumed, vec!["s".to_string()], "{report:?}");
    rt.supervisor().push("s", item(3)).await.expect("push");
    let migrated = CountV3 {
        total: 2,
        notes: vec!["from v1".into(), "from v2".into()],
    };
    assert_eq!(
        next(&mut rx).await,
        Seen {
            version: 3,
            items: vec![3],
            state: Some(format!("{migrated:?}"))
        }
    );
    rt.shutdown().await.expect("shutdown");
    assert_eq!(store.load("s").await.unwrap().unwrap().agent_version, 3);
}

/// A migration that fails (here: its function refuses; then: its result does not read
/// as the new version's state) leaves the record as it was, and says which migration
/// failed on what.
#[tokio::test(start_paused = true)]
async fn s40_a_failing_migration_leaves_the_record_as_it_was() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    interrupted_on_v1(&store).await;
    let before = store.load_stored("s").await.unwrap().unwrap();
    let refusing = Migration::new().state(|_: CountV1| -> Result<CountV2, String> {
        Err("the note cannot be derived".into())
    });
    // Writes a v1 state again: v2 cannot read it.
    let unreadable = Migration::new().state(|c: CountV1| Ok(c));
    for (migration, expect) in [
        (refusing, "the note cannot be derived"),
        (unreadable, "version 2 cannot read the migrated state"),
    ] {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (rt, report) = builder(&store, &[2], &tx)
            .register_migration("counter", 1, migration)
            .start()
            .await
            .expect("start v2");
        assert!(report.resumed.is_empty(), "{report:?}");
        let why = &report.skipped[0].1;
        assert!(
            why.contains("could not be migrated from version 1 to 2"),
            "{why}"
        );
        assert!(why.contains(expect), "{why}");
        rt.shutdown().await.expect("shutdown");
        assert!(rx.try_recv().is_err(), "nothing ran");
        assert_eq!(
            store.load_stored("s").await.unwrap().unwrap(),
            before,
            "the record is as it was"
        );
    }
}

/// The dry run reports, for every stored session, what the start then does: pinned,
/// migrated (from, to), refused (with the start's reason), finished; and it writes
/// nothing.
#[tokio::test(start_paused = true)]
async fn s40_the_dry_run_matches_what_the_start_then_does() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    interrupted_on_v1(&store).await;
    // A v2 session beside it, and one of an unknown version (a rollback's newer one).
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (rt, _) = builder(&store, &[1, 2], &tx).start().await.expect("start");
    let h = rt
        .supervisor()
        .spawn(SessionSpec::new("t", "counter").persistent(true))
        .await
        .expect("spawn");
    h.push(item(5)).await.expect("push");
    assert_eq!(next(&mut rx).await.version, 2);
    rt.shutdown().await.expect("shutdown");
    let mut newer = store.load("t").await.unwrap().unwrap();
    newer.session_id = "u".into();
    newer.agent_version = 7;
    store.save(newer).await.expect("save");
    let stored_before: Vec<_> = store.list_stored(None).await.unwrap();

    let deploy = || builder(&store, &[2], &tx).register_migration("counter", 1, one_to_two());
    let plan = deploy().dry_run(&*store).await.expect("dry run");
    assert_eq!(
        store.list_stored(None).await.unwrap(),
        stored_before,
        "the dry run wrote nothing"
    );
    let fates: Vec<(&str, &SessionFate)> = plan
        .sessions
        .iter()
        .map(|s| (s.id.as_str(), &s.fate))
        .collect();
    assert_eq!(fates[0], ("s", &SessionFate::Migrated { from: 1, to: 2 }));
    assert_eq!(fates[1], ("t", &SessionFate::Pinned { version: 2 }));
    let SessionFate::Refused { reason } = fates[2].1 else {
        panic!("{fates:?}");
    };
    assert_eq!(fates[2].0, "u");

    let (rt, report) = deploy().start().await.expect("start");
    let mut resumed = report.resumed.clone();
    resumed.sort();
    assert_eq!(resumed, vec!["s".to_string(), "t".to_string()]);
    assert_eq!(
        report.skipped,
        vec![("u".to_string(), reason.clone())],
        "the start gives the dry run's reason"
    );
    rt.shutdown().await.expect("shutdown");
    assert_eq!(
        store.load("s").await.unwrap().unwrap().agent_version,
        2,
        "migrated as planned"
    );
    assert_eq!(store.load("t").await.unwrap().unwrap().agent_version, 2);
    assert_eq!(
        store.load("u").await.unwrap().unwrap().agent_version,
        7,
        "kept"
    );
}

/// A session pinned on v1 whose turn fails is restarted by the supervisor on v1 again,
/// also when the restart reads no record (durability `turn`: it restarts from the items
/// the failed incarnation handed back), never silently on the newest version.
#[tokio::test(start_paused = true)]
async fn s40_a_restart_after_a_failure_runs_the_same_version() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (rt, _) = builder(&store, &[1], &tx).start().await.expect("start v1");
    let h = rt
        .supervisor()
        .spawn(
            SessionSpec::new("f", "counter")
                .persistent(true)
                .durability(agentloop::Durability::Turn),
        )
        .await
        .expect("spawn");
    h.push(item(1)).await.expect("push");
    assert_eq!(next(&mut rx).await.version, 1);
    rt.shutdown().await.expect("shutdown");

    let (rt, report) = builder(&store, &[1, 2], &tx)
        .start()
        .await
        .expect("start v1+v2");
    assert_eq!(report.resumed, vec!["f".to_string()], "{report:?}");
    rt.supervisor()
        .push("f", item(FAIL_ONCE))
        .await
        .expect("push");
    let failed = next(&mut rx).await;
    assert_eq!((failed.version, failed.items.clone()), (1, vec![FAIL_ONCE]));
    let again = next(&mut rx).await;
    assert_eq!(
        again.items,
        vec![FAIL_ONCE],
        "the restart runs the handed-back item"
    );
    assert_eq!(
        again.version, 1,
        "the restart runs the version the session ran"
    );
    rt.shutdown().await.expect("shutdown");
    assert_eq!(store.load("f").await.unwrap().unwrap().agent_version, 1);
}

/// S40 in a planned move: node `b` runs versions 1 and 2, node `a` version 1 alone. `b`
/// shuts down with the `migrate` strategy: its session pinned on version 1 is handed to
/// `a` and runs there; its version-2 session is not handed to `a`, which cannot run it:
/// it stays `Interrupted` under `b`, kept at its version, for a node that runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s40_a_migrate_shutdown_hands_over_only_what_the_other_node_runs() {
    use agentloop::config::ShutdownConfig;
    use agentloop_cluster::peers::connect_in_process;
    let store = Arc::new(MemoryStore::<SimItem>::new());
    // A session version 1 left on `b`.
    let mut old = agentloop::store::SessionRecord::<SimItem>::new("old", "counter", 0);
    old.status = agentloop::store::SessionStatus::Interrupted;
    old.owner = Some("b".into());
    store.save(old).await.expect("save");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (b, report) = builder(&store, &[1, 2], &tx)
        .node("b")
        .shutdown_config(ShutdownConfig {
            strategy: "migrate".into(),
            ..ShutdownConfig::default()
        })
        .start()
        .await
        .expect("b");
    assert_eq!(report.resumed, vec!["old".to_string()], "{report:?}");
    // `a` starts once `b` runs (and beats): `b`'s session is `b`'s.
    let (a, _) = builder(&store, &[1], &tx)
        .node("a")
        .start()
        .await
        .expect("a");
    connect_in_process(&[("a", &a.handle()), ("b", &b.handle())]);
    b.supervisor()
        .spawn(SessionSpec::new("new", "counter").persistent(true))
        .await
        .expect("spawn");
    b.supervisor().push("new", item(1)).await.expect("push");
    assert_eq!(next(&mut rx).await.version, 2);
    let listed = b.supervisor().list().await;
    let versions: Vec<(String, u32)> = listed.iter().map(|s| (s.id.clone(), s.version)).collect();
    assert_eq!(
        versions,
        vec![("new".to_string(), 2), ("old".to_string(), 1)]
    );

    b.shutdown().await.expect("b's shutdown");
    let on_a: Vec<String> = a
        .supervisor()
        .list()
        .await
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(
        on_a,
        vec!["old".to_string()],
        "only what a runs was handed to it"
    );
    a.supervisor()
        .push("old", item(2))
        .await
        .expect("push on a");
    assert_eq!(
        next(&mut rx).await,
        Seen {
            version: 1,
            items: vec![2],
            state: None
        }
    );
    let new = store.load("new").await.unwrap().unwrap();
    assert_eq!(
        (new.status, new.owner.as_deref(), new.agent_version),
        (agentloop::store::SessionStatus::Interrupted, Some("b"), 2),
        "kept for a node that runs version 2"
    );
    a.shutdown().await.expect("a's shutdown");
}
