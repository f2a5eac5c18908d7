//! Records of format 2 (issue 12 to issue 29: a header envelope of version 2 and one
//! loose entry per item and for the state) still load, and are converted to format 3
//! (issue 30: one head, DESIGN S15, S15c) by their first write. The records are laid out
//! here key by key exactly as a format-2 build wrote them (`codec::encode_format2_header`
//! is that build's header encoder), in a real sled directory that the runtime then opens.

use std::sync::Arc;

use agentloop::store::{codec, RecordHeader, SledBackend, Stored};
use agentloop::{
    store::CheckpointActor, store::SessionStatus, CheckpointStore, Durability, Runtime,
    SessionHandle, SessionSpec, StopOptions,
};
use agentloop_core::table;
use agentloop_sim::{Ledger, SimAgent, SimEvent, SimItem, SimState};
use agentloop_tests::{ids, steps, within, TempDir};
use parking_lot::Mutex;

/// Writes a format-2 record: its header (version 2 envelope), one entry per item and
/// the state, under the format-2 keys.
fn put_format2(
    b: &SledBackend,
    header: &RecordHeader,
    items: &[SimItem],
    state: Option<&SimState>,
) {
    let id = &header.session_id;
    b.put_raw(
        &table::header_key(id),
        &codec::encode_format2_header(header).unwrap(),
    )
    .unwrap();
    for (seq, item) in items.iter().enumerate() {
        b.put_raw(
            &table::item_key(id, seq as u64),
            &codec::encode_item(item).unwrap(),
        )
        .unwrap();
    }
    if let Some(s) = state {
        b.put_raw(&table::state_key(id), &codec::encode_state(id, s).unwrap())
            .unwrap();
    }
}

fn header(id: &str, status: SessionStatus, items: u64, cut: Vec<u64>) -> RecordHeader {
    RecordHeader {
        session_id: id.into(),
        agent_kind: "sim".into(),
        status,
        turn_index: 4,
        cut,
        next_seq: items,
        version: 7,
        lease_epoch: 2,
        created_at_ms: 1_795_300_000_000,
        updated_at_ms: 1_795_300_000_500,
        ..RecordHeader::default()
    }
}

/// The format of the head stored for `id` (the version field of its envelope).
fn format_of(b: &SledBackend, id: &str) -> u16 {
    let entries = b.raw_entries(id).unwrap();
    let (_, head) = entries
        .iter()
        .find(|(name, _)| name == "header")
        .expect("a head");
    u16::from_le_bytes([head[4], head[5]])
}

/// A directory with two format-2 records: `v2-stopped` (three unhandled items) and
/// `v2-interrupted` (a cut turn of item 0 with its state, then item 1).
fn directory() -> TempDir {
    let dir = TempDir::new("format2");
    let b = SledBackend::open(dir.path()).unwrap();
    let items = |base: u64, n: u64| -> Vec<SimItem> {
        (0..n)
            .map(|i| SimItem::new(base + i, format!("item {i}")))
            .collect()
    };
    put_format2(
        &b,
        &header("v2-stopped", SessionStatus::Stopped, 3, vec![]),
        &items(1, 3),
        None,
    );
    put_format2(
        &b,
        &header("v2-interrupted", SessionStatus::Interrupted, 2, vec![0]),
        &items(10, 2),
        Some(&SimState {
            turn: 4,
            items: vec![10],
            steps_done: 1,
            payload: vec![7; 64],
        }),
    );
    b.flush().unwrap();
    drop(b);
    dir
}

/// Format-2 records load with their items, state and fields, through the store's API
/// and its listing; a load does not convert them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_format2_records_load_with_everything_they_held() {
    let dir = directory();
    let c = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    let listed = c.list(None).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|e| e.session_id.as_str()).collect();
    assert_eq!(names, ["v2-interrupted", "v2-stopped"]);
    let r = c.load("v2-stopped").await.unwrap().unwrap();
    assert_eq!(r.status, SessionStatus::Stopped);
    assert_eq!(ids(&r.unhandled_items), vec![1, 2, 3]);
    assert_eq!((r.version, r.turn_index), (7, 4));
    let r = c.load("v2-interrupted").await.unwrap().unwrap();
    assert_eq!(ids(&r.interrupted_items), vec![10]);
    assert_eq!(ids(&r.unhandled_items), vec![11]);
    let state: SimState = codec::decode_state("v2-interrupted", r.state.as_ref().unwrap()).unwrap();
    assert_eq!(state.items, vec![10]);
    c.close().await.unwrap();
    let b = SledBackend::open(dir.path()).unwrap();
    assert_eq!(format_of(&b, "v2-stopped"), 2, "a load is no conversion");
}

/// A `sync` session spawned on a format-2 record converts it with its first write (a
/// push): the head becomes format 3 and names the loose entries the record had, and
/// nothing is lost; the session then delivers every item once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_a_sync_write_converts_a_format2_record_and_loses_nothing() {
    let dir = directory();
    let c = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    let store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(c.clone());
    let gate = agentloop_sim::Gate::new();
    let agent = SimAgent::new(steps(1)).with_step_gate(gate.clone());
    let ledger = agent.ledger();
    let h: SessionHandle<SimItem, SimEvent> = SessionHandle::spawn(
        SessionSpec::new("v2-stopped", "default")
            .persistent(true)
            .kind("sim")
            .durability(Durability::Sync),
        Arc::new(agent),
        Some(store.clone()),
    )
    .await
    .unwrap();
    h.push(SimItem::new(4, "four")).await.unwrap();
    let stored = c.load_stored("v2-stopped").await.unwrap().unwrap();
    let rec = stored.decode::<SimItem>().unwrap().into_record();
    let mut held: Vec<u64> = ids(&rec.unhandled_items);
    held.extend(ids(&rec.interrupted_items));
    held.sort_unstable();
    assert_eq!(held, vec![1, 2, 3, 4], "nothing lost in the conversion");
    gate.open_all();
    within("the items", async {
        while ledger.lock().delivered_ids().len() < 4 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    h.stop(StopOptions::immediate()).await.unwrap();
    within("exit", h.wait()).await;
    let mut delivered = ledger.lock().delivered_ids();
    delivered.sort_unstable();
    assert_eq!(delivered, vec![1, 2, 3, 4], "every item, once");
    c.close().await.unwrap();
    let b = SledBackend::open(dir.path()).unwrap();
    assert!(
        b.load("v2-stopped").unwrap().is_none(),
        "a clean exit deletes it"
    );
    assert_eq!(format_of(&b, "v2-interrupted"), 2, "untouched");
    match b.load("v2-interrupted").unwrap() {
        Some(Stored::Current(_)) => {}
        other => panic!("{other:?}"),
    }
}

/// The runtime resumes an interrupted format-2 session at start: the cut turn resumes
/// from its state, every item is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_the_runtime_resumes_a_format2_session() {
    let dir = directory();
    let ledgers: Arc<Mutex<Vec<Arc<Mutex<Ledger>>>>> = Arc::new(Mutex::new(Vec::new()));
    let l = ledgers.clone();
    let (rt, report) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("sim", move |_cfg: &[u8]| {
            let a = SimAgent::new(steps(2));
            l.lock().push(a.ledger());
            Ok(a)
        })
        .start()
        .await
        .expect("the runtime starts on format-2 records");
    assert_eq!(report.resumed, vec!["v2-interrupted"], "{report:?}");
    within("the drain", rt.stop(StopOptions::drain()))
        .await
        .unwrap();
    let mut delivered: Vec<u64> = ledgers
        .lock()
        .iter()
        .flat_map(|l| l.lock().delivered_ids())
        .collect();
    delivered.sort_unstable();
    assert_eq!(delivered, vec![10, 11], "every item, once");
    let b = SledBackend::open(dir.path()).unwrap();
    assert!(
        b.load("v2-interrupted").unwrap().is_none(),
        "drained to the end"
    );
    assert_eq!(
        format_of(&b, "v2-stopped"),
        2,
        "records nobody resumes stay"
    );
}
