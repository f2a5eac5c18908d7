//! Records of format 1 (bincode, written before issue 12) still load, and are converted
//! to the current format (3 since issue 30) on their first write (DESIGN S15). Reads the committed fixture
//! `tests/fixtures/v1-sled` (written by the checkpoint actor of commit 3c593a9; see
//! tests/fixtures/README.md) from a copy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentloop::store::{SledBackend, Stored};
use agentloop::{
    store::CasOutcome, store::CheckpointActor, store::SessionStatus, store::StatusKind,
    CheckpointStore, Durability, Runtime, SessionHandle, SessionSpec, StopOptions,
};
use agentloop_sim::{Ledger, Notice, SimAgent, SimEvent, SimItem, SimState};
use agentloop_tests::{ids, steps, within, TempDir};
use parking_lot::Mutex;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/v1-sled")
}

/// A copy of the fixture (sled writes to the directory it opens).
fn copy() -> TempDir {
    let dir = TempDir::new("format1");
    for f in ["conf", "db"] {
        std::fs::copy(fixture().join(f), dir.path().join(f)).expect("copy the fixture");
    }
    dir
}

fn format_of(b: &SledBackend, id: &str) -> u16 {
    match b.load(id).expect("load").expect("a record") {
        Stored::Current(_) => 3,
        Stored::Format1(_) => 1,
    }
}

/// Every fixture record loads with its items, status, state and fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_format1_records_load_with_everything_they_held() {
    let dir = copy();
    let c = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    let listed = c.list(None).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|e| e.session_id.as_str()).collect();
    assert_eq!(
        names,
        [
            "v1-canceled",
            "v1-completed",
            "v1-failed",
            "v1-interrupted",
            "v1-running",
            "v1-stopped"
        ]
    );
    let r = c.load("v1-interrupted").await.unwrap().unwrap();
    assert_eq!(r.status, SessionStatus::Interrupted);
    assert_eq!(r.turn_index, 5);
    assert_eq!(ids(&r.interrupted_items), vec![10]);
    assert_eq!(r.interrupted_items[0].text, "cut");
    assert_eq!(ids(&r.unhandled_items), vec![11, 12]);
    assert_eq!(r.stop_cause.as_deref(), Some("shutdown"));
    assert_eq!(r.agent_config, b"cfg");
    assert_eq!(
        (r.created_at_ms, r.updated_at_ms),
        (1_795_300_000_000, 1_795_300_000_500)
    );
    let state: SimState =
        agentloop::store::codec::decode_state("v1-interrupted", r.state.as_ref().unwrap())
            .expect("a format-1 state decodes");
    assert_eq!(
        state,
        SimState {
            turn: 5,
            items: vec![10],
            steps_done: 1,
            payload: vec![1, 2, 3]
        }
    );
    let failed = c.load("v1-failed").await.unwrap().unwrap();
    assert_eq!(
        failed.status,
        SessionStatus::Failed("model call failed".into())
    );
    assert_eq!(failed.last_error.as_deref(), Some("model call failed"));
    assert_eq!(ids(&failed.unhandled_items), vec![30]);
    let running = c.load("v1-running").await.unwrap().unwrap();
    assert_eq!(running.owner.as_deref(), Some("instance-dead"));
    // A status filter reads format-1 statuses without the item type.
    let interrupted = c
        .list_stored(Some(vec![StatusKind::Interrupted]))
        .await
        .unwrap();
    assert_eq!(interrupted.len(), 1);
    assert_eq!(interrupted[0].session_id, "v1-interrupted");
    // A compare-and-swap changes a format-1 record's status in place (cancel by id).
    assert_eq!(
        c.cas_status(
            "v1-stopped",
            vec![StatusKind::Stopped],
            SessionStatus::Canceled
        )
        .await
        .unwrap(),
        CasOutcome::Swapped(SessionStatus::Stopped)
    );
    let canceled = c.load("v1-stopped").await.unwrap().unwrap();
    assert_eq!(canceled.status, SessionStatus::Canceled);
    assert_eq!(ids(&canceled.unhandled_items), vec![1, 2], "items kept");
    c.close().await.unwrap();
    let b = SledBackend::open(dir.path()).unwrap();
    assert_eq!(
        format_of(&b, "v1-stopped"),
        1,
        "a status change is no conversion"
    );
}

/// The runtime resumes the format-1 sessions a previous version left resumable
/// (`Interrupted`, and `Running` under a dead owner): the cut turn resumes from its
/// state, every item is delivered once, and each converted record is of the current format from its
/// first write on. Records nobody resumes stay format 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_format1_sessions_resume_and_are_converted_on_their_first_write() {
    let dir = copy();
    let ledgers: Arc<Mutex<Vec<Arc<Mutex<Ledger>>>>> = Arc::new(Mutex::new(Vec::new()));
    let l = ledgers.clone();
    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let (rt, report) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("sim", move |_cfg: &[u8]| {
            let a = SimAgent::new(steps(2)).with_probe(tx.clone());
            l.lock().push(a.ledger());
            Ok(a)
        })
        .start()
        .await
        .expect("the runtime starts on format-1 records");
    let mut resumed = report.resumed.clone();
    resumed.sort();
    assert_eq!(resumed, vec!["v1-interrupted", "v1-running"], "{report:?}");
    assert_eq!(report.items, 4, "{report:?}");
    let exits = within("the drain", rt.stop(StopOptions::drain()))
        .await
        .unwrap();
    assert_eq!(exits.len(), 2);
    let mut delivered: Vec<u64> = ledgers
        .lock()
        .iter()
        .flat_map(|l| l.lock().delivered_ids())
        .collect();
    delivered.sort_unstable();
    assert_eq!(delivered, vec![10, 11, 12, 20], "every item, once");
    // The cut turn (item 10) resumed; the other turns were planned afresh.
    let mut resumed_turns = Vec::new();
    while let Ok(n) = notices.try_recv() {
        if let Notice::TurnBegin {
            items,
            resumed: true,
            ..
        } = n
        {
            resumed_turns.push(items);
        }
    }
    assert_eq!(resumed_turns, vec![vec![10]]);
    let b = SledBackend::open(dir.path()).unwrap();
    // Drained to the end: their records went (no format-1 copy left behind either).
    for id in ["v1-interrupted", "v1-running"] {
        assert!(b.load(id).unwrap().is_none(), "{id}");
        assert!(b.raw_entries(id).unwrap().is_empty(), "{id}");
    }
    for id in ["v1-stopped", "v1-completed", "v1-failed", "v1-canceled"] {
        assert_eq!(format_of(&b, id), 1, "{id} untouched");
    }
}

/// A session spawned on a format-1 record converts it on its first write (a `sync`
/// push), keeping every item it held, and the converted record is of the current format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_a_sync_write_converts_a_format1_record() {
    let dir = copy();
    let c = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    let store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(c.clone());
    let gate = agentloop_sim::Gate::new();
    let h: SessionHandle<SimItem, SimEvent> = SessionHandle::spawn(
        SessionSpec::new("v1-stopped", "default")
            .persistent(true)
            .kind("sim")
            .durability(Durability::Sync),
        Arc::new(SimAgent::new(steps(1)).with_step_gate(gate.clone())),
        Some(store.clone()),
    )
    .await
    .unwrap();
    h.push(agentloop_sim::SimItem::new(3, "three"))
        .await
        .unwrap();
    let stored = c.load_stored("v1-stopped").await.unwrap().unwrap();
    let Stored::Current(r) = &stored else {
        panic!("the first write converts the record: {stored:?}");
    };
    let rec = stored.decode::<SimItem>().unwrap().into_record();
    let mut held: Vec<u64> = ids(&rec.unhandled_items);
    held.extend(ids(&rec.interrupted_items));
    held.sort_unstable();
    assert_eq!(held, vec![1, 2, 3], "nothing lost in the conversion");
    assert!(r.header.next_seq >= 3);
    h.stop(StopOptions::immediate()).await.unwrap();
    gate.open_all();
    within("exit", h.wait()).await;
    c.close().await.unwrap();
}
