//! S32 sweep (issue 6, part 5): every kind of bad input DESIGN S32 lists, at the entry
//! points users actually hit, gets a clear, typed error and loses nothing: no stored
//! record is altered or deleted (S18), no other session is disturbed, and every item is
//! either accepted (and then delivered) or handed back in the error.
//!
//! One self-contained test per kind. Sled is used where the store is the point (records
//! as bytes); elsewhere a `MemoryStore` on a paused clock.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentloop::config::{ConfigError, RuntimeConfig};
use agentloop::options::positive_millis;
use agentloop::session::{SessionIdError, MAX_SESSION_ID_LEN};
use agentloop::store::codec::{self, FORMAT_VERSION, MAGIC};
use agentloop::store::{SledBackend, WriteCondition};
use agentloop::{
    config::ShutdownConfig, exit::CheckpointOutcome, exit::FailureKind, options::OptionsError,
    session::TurnLoopMsg, store::CheckpointActor, store::SessionRecord, store::SessionStatus,
    store::StatusKind, CheckpointStore, ExitReason, MemoryStore, Preempt, PushError, PushOptions,
    Runtime, RuntimeError, SessionError, SessionHandle, SessionSpec, SpawnError, StopOptions,
    StoreError, SupervisorError,
};
use agentloop_core::table::{self, header_key};
use agentloop_sim::{Gate, Ledger, Notice, SimAgent, SimEvent, SimItem, SimState};
use agentloop_tests::*;
use parking_lot::Mutex;

type Rt = Runtime<SimItem, SimEvent>;
type Ledgers = Arc<Mutex<Vec<Arc<Mutex<Ledger>>>>>;

// ------------------------------------------------------------------------------------
// Helpers local to the sweep.

/// A record of `id` with `status` holding `items` as unhandled items.
fn record(id: &str, status: SessionStatus, items: &[u64]) -> SessionRecord<SimItem> {
    let mut r = SessionRecord::new(id, "sim", 2);
    r.status = status;
    r.unhandled_items = items.iter().copied().map(item).collect();
    r
}

/// The stored entries (key, value), head first, of a whole record, laid out as the
/// store writes a record too large to keep inline (record format 3: a head that names
/// its loose entries, one entry per item, the state entry), so that the tests can
/// damage the head and each entry apart.
fn entries_of(r: &SessionRecord<SimItem>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let w = r.to_write(WriteCondition::Always).expect("encode record");
    let id = w.header.session_id.clone();
    let mut layout = codec::head::Layout::default();
    let mut loose = Vec::new();
    for change in &w.items {
        if let agentloop::store::ItemChange::Put(seq, bytes) = change {
            layout.add(*seq);
            loose.push((table::item_key(&id, *seq), bytes.to_vec()));
        }
    }
    if let agentloop::store::StateChange::Put(bytes) = &w.state {
        layout.loose_state = true;
        loose.push((table::state_key(&id), bytes.to_vec()));
    }
    let head = codec::head::encode(&w.header, layout, &[], None).expect("encode head");
    let mut out = vec![(header_key(&id), head)];
    out.extend(loose);
    out
}

/// The entries of a valid `Interrupted` record of `id` with items and a mid-turn state.
fn valid_entries(id: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut r = record(id, SessionStatus::Interrupted, &[1, 2]);
    r.interrupted_items = vec![item(3)];
    r.state = Some(
        codec::encode_state(
            id,
            &SimState {
                turn: 2,
                items: vec![3],
                steps_done: 1,
                payload: vec![7; 16],
            },
        )
        .expect("encode state"),
    );
    r.stop_cause = Some("shutdown".into());
    entries_of(&r)
}

/// The header envelope of [`valid_entries`]: the part of a record these tests damage.
fn valid_bytes(id: &str) -> Vec<u8> {
    valid_entries(id).swap_remove(0).1
}

/// [`valid_entries`] of `id` with its header replaced by `header`.
fn with_header(id: &str, header: Vec<u8>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut e = valid_entries(id);
    e[0].1 = header;
    e
}

/// Decodes a whole record of `id` whose header is `header` (its items and state
/// valid), as a store reads it: assemble the entries, then decode the items.
fn decode_record(id: &str, header: &[u8]) -> Result<(), StoreError> {
    let entries = with_header(id, header.to_vec())
        .into_iter()
        .map(|(k, v)| (k, v.into()))
        .collect();
    match table::assemble(id, entries)? {
        Some(r) => agentloop::store::Stored::Current(r)
            .decode::<SimItem>()
            .map(|_| ()),
        None => Err(StoreError::NoRecord {
            session: id.to_string(),
        }),
    }
}

/// Where `needle` starts in `hay` (the test's bytes always hold it).
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("the bytes hold the needle")
}

/// Drops a sled backend and waits (bounded) until its directory lock is free: sled's
/// IO threads hold it a moment after the drop (the checkpoint actor's close waits the
/// same way). Blocks.
fn release(b: SledBackend) {
    let lock = b.path().join("db");
    drop(b);
    let file = std::fs::File::open(&lock).expect("sled's lock file");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while file.try_lock().is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "sled kept its lock for 10 s"
        );
        std::thread::yield_now();
    }
    file.unlock().expect("unlock");
}

/// Writes raw entries straight into sled (as a broken disk or another build would),
/// off the tokio workers. The directory must not be open elsewhere.
async fn put_raw(dir: &Path, entries: Vec<(Vec<u8>, Vec<u8>)>) {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let b = SledBackend::open(&dir).expect("open sled");
        for (key, value) in entries {
            b.put_raw(&key, &value).expect("raw put");
        }
        b.flush().expect("flush");
        release(b);
    })
    .await
    .expect("blocking task");
}

/// Every stored entry of each session with its raw bytes, read straight from sled.
#[allow(clippy::type_complexity)]
async fn raw_all(dir: &Path, keys: &[&str]) -> Vec<(String, Vec<(String, Vec<u8>)>)> {
    let dir = dir.to_path_buf();
    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let b = SledBackend::open(&dir).expect("open sled");
        let v = keys
            .into_iter()
            .map(|k| {
                let v = b.raw_entries(&k).expect("raw entries");
                (k, v)
            })
            .collect();
        release(b);
        v
    })
    .await
    .expect("blocking task")
}

/// An agent factory for a runtime: free-running two-step agents whose ledgers the test
/// can read.
fn agents() -> (
    Ledgers,
    impl Fn(&[u8]) -> Result<SimAgent, String> + Send + Sync + 'static,
) {
    gated_agents(None)
}

/// [`agents`], every step waiting at `gate` and reporting to a probe, when given.
fn gated_agents(
    gated: Option<(Gate, tokio::sync::mpsc::UnboundedSender<Notice>)>,
) -> (
    Ledgers,
    impl Fn(&[u8]) -> Result<SimAgent, String> + Send + Sync + 'static,
) {
    let ledgers: Ledgers = Arc::new(Mutex::new(Vec::new()));
    let l = ledgers.clone();
    let factory = move |_cfg: &[u8]| {
        let mut a = SimAgent::new(steps(2));
        if let Some((gate, probe)) = &gated {
            a = a.with_step_gate(gate.clone()).with_probe(probe.clone());
        }
        l.lock().push(a.ledger());
        Ok(a)
    };
    (ledgers, factory)
}

/// Every item id delivered to a completed turn, over all agents built, sorted.
fn delivered(ledgers: &Ledgers) -> Vec<u64> {
    let mut v: Vec<u64> = ledgers
        .lock()
        .iter()
        .flat_map(|l| l.lock().delivered_ids())
        .collect();
    v.sort_unstable();
    v
}

/// Asserts `e` is `Corrupt` for `session` and returns its reason; the message must say
/// the record was left untouched and what to do.
fn corrupt_reason(e: &StoreError, session: &str) -> String {
    match e {
        StoreError::Corrupt { session: s, reason } => {
            assert_eq!(s, session, "the error names the session: {e}");
            let msg = e.to_string();
            assert!(msg.contains("left untouched"), "{msg}");
            assert!(
                msg.contains("agentloop sessions show") && msg.contains("backup"),
                "the message says what to do: {msg}"
            );
            reason.clone()
        }
        other => panic!("expected StoreError::Corrupt for `{session}`, got {other:?}"),
    }
}

/// Runs a persistent session of `id` directly on `store` (no supervisor) and asserts it
/// ends `Failed` with a record failure naming `needle`, attempts no checkpoint, and
/// hands a later push back.
async fn a_session_refuses_the_record(
    store: Arc<dyn CheckpointStore<SimItem>>,
    id: &str,
    needle: &str,
) {
    let h: SessionHandle<SimItem, SimEvent> = SessionHandle::spawn(
        SessionSpec::new(id, "default")
            .persistent(true)
            .kind("sim")
            .durability(agentloop::Durability::Sync),
        Arc::new(SimAgent::new(steps(1))),
        Some(store),
    )
    .await
    .expect("spawn is accepted; the load error ends the session");
    let exit = within("the refused session to end", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains(needle) && e.contains(id)),
        "{id}: {:?}",
        exit.reason
    );
    assert_eq!(exit.failure, Some(FailureKind::Record), "{id}");
    assert_eq!(exit.checkpoint, CheckpointOutcome::NotAttempted, "{id}");
    let e = h.push(item(900)).await.unwrap_err();
    assert!(
        matches!(&e, PushError::Late { item } if item.id == 900),
        "{id}: {e}"
    );
}

// ------------------------------------------------------------------------------------
// Corrupt records.

/// Bad magic and flipped payload bytes: `decode_record`, the sled checkpoint actor, a
/// session resuming the record, the runtime's start and a spawn through its supervisor
/// all report `StoreError::Corrupt` naming the session; the record stays byte for byte
/// and the other session resumes and delivers its items.
#[tokio::test]
async fn s32_corrupt_records_are_reported_and_left_byte_for_byte() {
    // Bad magic.
    let mut bad_magic = valid_bytes("bad-magic");
    bad_magic[..4].copy_from_slice(b"JUNK");
    // Flipped header bytes. The header's payload (after the 10-byte envelope) is a
    // MessagePack map whose `session_id` holds the id and whose `status` names the
    // status.
    let payload = 10;
    let id_at = |bytes: &[u8], id: &str, i: usize| {
        assert!(i < id.len());
        find(&bytes[payload..], id.as_bytes()) + payload + i
    };
    let mut flipped_utf8 = valid_bytes("flipped-utf8");
    let at = id_at(&flipped_utf8, "flipped-utf8", 3);
    flipped_utf8[at] ^= 0xff; // invalid UTF-8 in the id
    let mut flipped_id = valid_bytes("flipped-id");
    let at = id_at(&flipped_id, "flipped-id", 0);
    flipped_id[at] ^= 0x01; // `gl...`: another id, same length
    let mut flipped_status = valid_bytes("flipped-status");
    let at = find(&flipped_status, b"Interrupted");
    flipped_status[at] = b'X'; // `Xnterrupted`: no such status
    let corrupt = vec![
        ("bad-magic".to_string(), bad_magic, "magic"),
        ("flipped-utf8".to_string(), flipped_utf8, "does not decode"),
        ("flipped-id".to_string(), flipped_id, "stored under"),
        (
            "flipped-status".to_string(),
            flipped_status,
            "does not decode",
        ),
    ];

    // (1) The codec: a clear Corrupt naming the session and what is wrong.
    for (key, bytes, needle) in &corrupt {
        let e = decode_record(key, bytes).unwrap_err();
        let reason = corrupt_reason(&e, key);
        assert!(reason.contains(needle), "{key}: {reason}");
    }
    // Any single flipped header byte decodes or is Corrupt; never a panic, never a
    // different error. (The envelope carries no checksum: a flip inside a text or a
    // number field decodes as a different, valid record.)
    let good = valid_bytes("sweep");
    for at in payload..good.len() {
        let mut b = good.clone();
        b[at] ^= 0xff;
        match decode_record("sweep", &b) {
            Ok(_) | Err(StoreError::Corrupt { .. }) => {}
            Err(e) => panic!("flip at {at}: {e:?}"),
        }
    }

    // Sled: the corrupt records next to a good resumable one.
    let dir = TempDir::new("s32-corrupt");
    let mut entries: Vec<(Vec<u8>, Vec<u8>)> = corrupt
        .iter()
        .flat_map(|(k, b, _)| with_header(k, b.clone()))
        .collect();
    entries.extend(entries_of(&record(
        "good",
        SessionStatus::Interrupted,
        &[1, 2, 3],
    )));
    put_raw(dir.path(), entries).await;
    let keys: Vec<&str> = corrupt.iter().map(|(k, _, _)| k.as_str()).collect();
    let before = raw_all(dir.path(), &keys).await;

    // (2) The checkpoint actor: load, list and compare-and-swap report Corrupt and
    // change nothing; a session resuming the record fails without touching it.
    let client = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    for (key, _, needle) in &corrupt {
        let e = client.load(key).await.unwrap_err();
        assert!(corrupt_reason(&e, key).contains(needle), "{key}");
        let e = client
            .cas_status(key, vec![StatusKind::Interrupted], SessionStatus::Canceled)
            .await
            .unwrap_err();
        corrupt_reason(&e, key);
    }
    let listed = client.list(None).await.unwrap();
    assert_eq!(
        listed.len(),
        corrupt.len() + 1,
        "corrupt records are listed, not hidden"
    );
    for entry in &listed {
        match entry.session_id.as_str() {
            "good" => assert!(entry.record.is_ok()),
            key => {
                corrupt_reason(entry.record.as_ref().unwrap_err(), key);
            }
        }
    }
    let store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(client.clone());
    a_session_refuses_the_record(store, "bad-magic", "corrupt").await;
    client.close().await.unwrap();
    assert_eq!(
        raw_all(dir.path(), &keys).await,
        before,
        "S18: left as they were"
    );

    // (3) The runtime's start: the corrupt records are skipped with the reason, the
    // good one resumes; a spawn of a corrupt id through the supervisor fails the same
    // way and is not restarted; a push to it hands the item back.
    let (ledgers, factory) = agents();
    let (rt, report) = Rt::builder()
        .data_dir(dir.path())
        .register_agent("sim", factory)
        .start()
        .await
        .expect("a corrupt record does not stop the runtime from starting");
    assert_eq!(report.resumed, vec!["good".to_string()], "{report:?}");
    assert_eq!(report.items, 3, "{report:?}");
    let mut skipped: Vec<&str> = report.skipped.iter().map(|(k, _)| k.as_str()).collect();
    skipped.sort_unstable();
    let mut expected = keys.clone();
    expected.sort_unstable();
    assert_eq!(skipped, expected, "{report:?}");
    for (key, why) in &report.skipped {
        assert!(
            why.contains("is corrupt")
                && why.contains(key.as_str())
                && why.contains("left untouched"),
            "{key}: {why}"
        );
    }
    let sup = rt.supervisor().clone();
    let h = sup
        .spawn(SessionSpec::new("flipped-status", "sim").persistent(true))
        .await
        .expect("spawn is accepted; the load error ends the session");
    let exit = within("the corrupt session to end", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains("corrupt")),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.failure, Some(FailureKind::Record));
    match sup.push("flipped-status", item(50)).await.unwrap_err() {
        PushError::UnknownSession { id, item } => {
            assert_eq!(
                (id.as_str(), item),
                ("flipped-status", agentloop_tests::item(50))
            );
        }
        e => panic!("a record failure is not restarted: {e}"),
    }
    let exits = rt.stop(StopOptions::drain()).await.unwrap();
    assert_eq!(exits.len(), 1, "only the good session was live");
    assert_eq!(
        delivered(&ledgers),
        vec![1, 2, 3],
        "the good session lost nothing"
    );
    assert_eq!(
        raw_all(dir.path(), &keys).await,
        before,
        "S18: neither the start nor the failed spawn touched a corrupt record"
    );
}

// ------------------------------------------------------------------------------------
// Truncated records.

/// Every prefix of a valid record's header (and every prefix of its payload re-framed
/// with a matching length, and a padded one) is `Corrupt`, never a panic; on sled,
/// truncated records fail the load, are skipped at start and stay as they were.
#[tokio::test]
async fn s32_truncated_records_are_corrupt_at_every_length() {
    let bytes = valid_bytes("trunc");
    assert!(decode_record("trunc", &bytes).is_ok());
    for cut in 0..bytes.len() {
        let e = decode_record("trunc", &bytes[..cut]).unwrap_err();
        let reason = corrupt_reason(&e, "trunc");
        assert!(reason.contains("truncated"), "cut {cut}: {reason}");
    }
    // A prefix of the payload under a header that agrees with it: still Corrupt. (In
    // format 3 the envelope's length covers the header; the head's layout follows it.
    // A cut at the header's exact end leaves a whole header and no layout: truncated.)
    let payload = &bytes[10..];
    let header_len = u32::from_le_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]) as usize;
    for cut in 0..payload.len() {
        let mut framed = MAGIC.to_vec();
        framed.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        framed.extend_from_slice(&(cut as u32).to_le_bytes());
        framed.extend_from_slice(&payload[..cut]);
        let e = decode_record("trunc", &framed).unwrap_err();
        let reason = corrupt_reason(&e, "trunc");
        let expected = if cut == header_len {
            "truncated"
        } else {
            "does not decode"
        };
        assert!(reason.contains(expected), "re-framed cut {cut}: {reason}");
    }
    // Padding is caught too: with the old length and with a length that covers it.
    let mut padded = bytes.clone();
    padded.push(0);
    let reason = corrupt_reason(&decode_record("trunc", &padded).unwrap_err(), "trunc");
    assert!(reason.contains("padded"), "{reason}");
    let len = u32::from_le_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]);
    padded[6..10].copy_from_slice(&(len + 1).to_le_bytes());
    let reason = corrupt_reason(&decode_record("trunc", &padded).unwrap_err(), "trunc");
    assert!(reason.contains("trailing"), "{reason}");

    // Sled: truncated records next to an intact one.
    let dir = TempDir::new("s32-truncated");
    let cut = |id: &str, n: usize| {
        let b = valid_bytes(id);
        let n = n.min(b.len() - 1);
        (id.to_string(), b[..n].to_vec())
    };
    let truncated = [
        cut("trunc-empty", 0),
        cut("trunc-header", 7),
        cut("trunc-payload", usize::MAX), // all but the last byte
    ];
    let keys: Vec<&str> = truncated.iter().map(|(k, _)| k.as_str()).collect();
    let mut entries: Vec<(Vec<u8>, Vec<u8>)> = truncated
        .iter()
        .flat_map(|(k, b)| with_header(k, b.clone()))
        .collect();
    entries.extend(entries_of(&record(
        "intact",
        SessionStatus::Interrupted,
        &[4, 5],
    )));
    put_raw(dir.path(), entries).await;
    let before = raw_all(dir.path(), &keys).await;
    assert!(before.iter().all(|(_, v)| !v.is_empty()));

    let client = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    for key in &keys {
        let e = client.load(key).await.unwrap_err();
        assert!(corrupt_reason(&e, key).contains("truncated"), "{key}");
    }
    let store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(client.clone());
    a_session_refuses_the_record(store, "trunc-payload", "truncated").await;
    client.close().await.unwrap();

    let (ledgers, factory) = agents();
    let (rt, report) = Rt::builder()
        .data_dir(dir.path())
        .register_agent("sim", factory)
        .start()
        .await
        .unwrap();
    assert_eq!(report.resumed, vec!["intact".to_string()], "{report:?}");
    let mut skipped: Vec<&str> = report.skipped.iter().map(|(k, _)| k.as_str()).collect();
    skipped.sort_unstable();
    let mut expected = keys.clone();
    expected.sort_unstable();
    assert_eq!(skipped, expected, "{report:?}");
    assert!(
        report
            .skipped
            .iter()
            .all(|(_, why)| why.contains("truncated")),
        "{report:?}"
    );
    rt.stop(StopOptions::drain()).await.unwrap();
    assert_eq!(delivered(&ledgers), vec![4, 5]);
    assert_eq!(raw_all(dir.path(), &keys).await, before, "S18");
}

// ------------------------------------------------------------------------------------
// Unknown format versions.

/// A record of another format version is `Corrupt` with a reason naming the version
/// and what this build reads; it is never rewritten or deleted (a newer build may read
/// it): not by the load, not by the runtime's start, not by a spawn of its id.
#[tokio::test]
async fn s32_unknown_format_versions_are_refused_and_kept() {
    let versioned = |id: &str, v: u16| {
        let mut b = valid_bytes(id);
        b[4..6].copy_from_slice(&v.to_le_bytes());
        b
    };
    let newer = FORMAT_VERSION + 1;
    for v in [0, newer, u16::MAX] {
        let e = decode_record("v", &versioned("v", v)).unwrap_err();
        let reason = corrupt_reason(&e, "v");
        assert!(
            reason.contains(&format!("unknown format version {v}"))
                && reason.contains(&format!("reads version {FORMAT_VERSION}")),
            "{reason}"
        );
    }
    // A record from a newer build must not be advertised as garbage to delete.
    let e = decode_record("v", &versioned("v", newer)).unwrap_err();
    assert!(
        e.to_string().contains("newer"),
        "the message says the record comes from a newer build: {e}"
    );

    let dir = TempDir::new("s32-version");
    let mut entries = with_header("future", versioned("future", newer));
    entries.extend(entries_of(&record(
        "present",
        SessionStatus::Interrupted,
        &[6, 7],
    )));
    put_raw(dir.path(), entries).await;
    let before = raw_all(dir.path(), &["future"]).await;

    let client = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    let e = client.load("future").await.unwrap_err();
    assert!(corrupt_reason(&e, "future").contains(&format!("version {newer}")));
    client.close().await.unwrap();

    let (ledgers, factory) = agents();
    let (rt, report) = Rt::builder()
        .data_dir(dir.path())
        .register_agent("sim", factory)
        .start()
        .await
        .unwrap();
    assert_eq!(report.resumed, vec!["present".to_string()], "{report:?}");
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert_eq!(report.skipped[0].0, "future");
    assert!(
        report.skipped[0]
            .1
            .contains(&format!("unknown format version {newer}")),
        "{report:?}"
    );
    let sup = rt.supervisor().clone();
    let h = sup
        .spawn(SessionSpec::new("future", "sim").persistent(true))
        .await
        .unwrap();
    let exit = within("the session on a future record to end", h.wait()).await;
    assert!(
        matches!(&exit.reason, ExitReason::Failed(e) if e.contains(&format!("unknown format version {newer}"))),
        "{:?}",
        exit.reason
    );
    assert_eq!(exit.failure, Some(FailureKind::Record));
    assert_eq!(exit.checkpoint, CheckpointOutcome::NotAttempted);
    assert!(
        sup.list().await.iter().all(|s| s.id != "future"),
        "a record failure is not restarted"
    );
    rt.stop(StopOptions::drain()).await.unwrap();
    assert_eq!(delivered(&ledgers), vec![6, 7]);
    assert_eq!(raw_all(dir.path(), &["future"]).await, before, "S18");
}

// ------------------------------------------------------------------------------------
// Invalid session ids.

/// Empty, over 128 bytes (counted in bytes, not characters) and control characters are
/// refused with the specific `SessionIdError` at `SessionHandle::spawn`, at the
/// supervisor (through `Runtime`) and at the sled store; exactly 128 bytes is accepted
/// everywhere. Nothing is written and the live session next door keeps its items.
#[tokio::test(start_paused = true)]
async fn s32_invalid_session_ids_are_refused_everywhere() {
    let cases: Vec<(String, SessionIdError)> = vec![
        (String::new(), SessionIdError::Empty),
        ("x".repeat(129), SessionIdError::TooLong { len: 129 }),
        ("é".repeat(65), SessionIdError::TooLong { len: 130 }),
        ("a\u{7}b".into(), SessionIdError::ControlCharacter { at: 1 }),
        (
            "tab\there".into(),
            SessionIdError::ControlCharacter { at: 3 },
        ),
        ("line\n".into(), SessionIdError::ControlCharacter { at: 4 }),
        ("é\u{85}".into(), SessionIdError::ControlCharacter { at: 2 }),
        ("nul\0".into(), SessionIdError::ControlCharacter { at: 3 }),
    ];
    let what_to_do = |e: &SessionIdError| match e {
        SessionIdError::Empty => "use 1 to 128 bytes",
        SessionIdError::TooLong { .. } => "the limit is 128 bytes",
        SessionIdError::ControlCharacter { .. } => "use printable characters only",
    };
    let max_ascii = "x".repeat(MAX_SESSION_ID_LEN);
    let max_utf8 = "é".repeat(MAX_SESSION_ID_LEN / 2);
    assert_eq!((max_ascii.len(), max_utf8.len()), (128, 128));

    let store = Arc::new(MemoryStore::<SimItem>::new());
    store.insert(record("parked", SessionStatus::Stopped, &[70]));
    let parked = store.get("parked").unwrap();
    let dyn_store: Arc<dyn CheckpointStore<SimItem>> = store.clone();

    // (1) SessionHandle::spawn, persistent on a store.
    for (id, want) in &cases {
        let e = SessionHandle::<SimItem, SimEvent>::spawn(
            SessionSpec::new(id.clone(), "default").persistent(true),
            Arc::new(SimAgent::new(steps(1))),
            Some(dyn_store.clone()),
        )
        .await
        .unwrap_err();
        match &e {
            SpawnError::InvalidId(got) => assert_eq!(got, want, "{id:?}"),
            other => panic!("{id:?}: expected SpawnError::InvalidId, got {other}"),
        }
        assert!(e.to_string().contains(what_to_do(want)), "{id:?}: {e}");
    }
    assert_eq!(store.len(), 1, "nothing was written for a refused id");
    for id in [&max_ascii, &max_utf8] {
        let h = spawn_on(
            SessionSpec::new(id.clone(), "default")
                .persistent(true)
                .kind("sim")
                .durability(agentloop::Durability::Exit),
            SimAgent::new(steps(1)),
            dyn_store.clone(),
        )
        .await;
        assert_eq!(h.id(), id.as_str());
        h.push(item(1)).await.unwrap();
        h.stop(StopOptions::drain()).await.unwrap();
        let exit = within("the 128-byte session to end", h.wait()).await;
        assert_eq!(exit.counters.items_delivered, 1, "{id}");
    }

    // (2) The supervisor, through the runtime: refused before any agent is built, the
    // live session next door keeps its items, the stored record is untouched.
    let gate = Gate::new();
    let (tx, _probe) = probe();
    let (ledgers, factory) = gated_agents(Some((gate.clone(), tx)));
    let (rt, _) = Rt::builder()
        .store(dyn_store.clone())
        .register_agent("sim", factory)
        .start()
        .await
        .unwrap();
    let sup = rt.supervisor().clone();
    sup.spawn(SessionSpec::new("next-door", "sim").initial_items(vec![item(1), item(2)]))
        .await
        .unwrap();
    for (id, want) in &cases {
        let e = sup
            .spawn(
                SessionSpec::new(id.clone(), "sim")
                    .persistent(true)
                    .initial_items(vec![item(99)]),
            )
            .await
            .unwrap_err();
        match &e {
            SupervisorError::InvalidId(got) => assert_eq!(got, want, "{id:?}"),
            other => panic!("{id:?}: expected SupervisorError::InvalidId, got {other}"),
        }
        assert!(e.to_string().contains(what_to_do(want)), "{id:?}: {e}");
    }
    assert_eq!(
        ledgers.lock().len(),
        1,
        "no agent was built for a refused id"
    );
    let h = sup
        .spawn(SessionSpec::new(max_ascii.clone(), "sim").initial_items(vec![item(3)]))
        .await
        .expect("128 bytes is accepted");
    assert_eq!(h.id(), max_ascii);
    sup.push("next-door", item(4)).await.unwrap();
    let mut live: Vec<String> = sup.list().await.into_iter().map(|s| s.id).collect();
    live.sort();
    assert_eq!(live, vec!["next-door".to_string(), max_ascii.clone()]);
    gate.open_all();
    let exits = rt.stop(StopOptions::drain()).await.unwrap();
    assert_eq!(exits.len(), 2);
    assert_eq!(
        delivered(&ledgers),
        vec![1, 2, 3, 4],
        "every accepted item delivered"
    );
    assert_eq!(
        store.get("parked"),
        Some(parked),
        "the stored record is untouched"
    );
    assert_eq!(store.len(), 1);

    // (3) The sled store validates keys on every operation.
    let dir = TempDir::new("s32-ids");
    let client = CheckpointActor::<SimItem>::spawn(dir.path()).await.unwrap();
    client
        .save(record("kept", SessionStatus::Stopped, &[8]))
        .await
        .unwrap();
    for (id, want) in &cases {
        let check = |e: StoreError, op: &str| match &e {
            StoreError::InvalidId { id: got_id, reason } => {
                assert_eq!((got_id, reason), (id, want), "{op} {id:?}");
                assert!(e.to_string().contains(what_to_do(want)), "{op}: {e}");
            }
            other => panic!("{op} {id:?}: expected StoreError::InvalidId, got {other:?}"),
        };
        check(
            client
                .save(record(id, SessionStatus::Stopped, &[9]))
                .await
                .unwrap_err(),
            "save",
        );
        check(
            client
                .save_live(record(id, SessionStatus::Running, &[9]))
                .await
                .unwrap_err(),
            "save_live",
        );
        check(client.load(id).await.unwrap_err(), "load");
        check(client.delete(id).await.unwrap_err(), "delete");
        check(
            client
                .cas_status(id, vec![StatusKind::Stopped], SessionStatus::Canceled)
                .await
                .unwrap_err(),
            "cas",
        );
    }
    client
        .save(record(&max_ascii, SessionStatus::Stopped, &[10]))
        .await
        .unwrap();
    let back = client
        .load(&max_ascii)
        .await
        .unwrap()
        .expect("128 bytes is a valid key");
    assert_eq!(ids(&back.unhandled_items), vec![10]);
    let listed = client.list(None).await.unwrap();
    assert_eq!(listed.len(), 2, "only the valid keys were written");
    assert_eq!(
        ids(&client.load("kept").await.unwrap().unwrap().unhandled_items),
        vec![8]
    );
    client.close().await.unwrap();
}

// ------------------------------------------------------------------------------------
// Duplicate ids.

/// Spawning a second session under an id that is live is refused with
/// `SupervisorError::Duplicate` before any agent is built; the live session keeps its
/// record exactly, keeps every item it accepted and keeps taking more.
#[tokio::test(start_paused = true)]
async fn s32_duplicate_ids_are_refused_and_the_live_session_keeps_everything() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let gate = Gate::new();
    let (tx, mut probe) = probe();
    let (ledgers, factory) = gated_agents(Some((gate.clone(), tx)));
    let (rt, _) = Rt::builder()
        .store(store.clone())
        .register_agent("sim", factory)
        .start()
        .await
        .unwrap();
    let sup = rt.supervisor().clone();
    let h = sup
        .spawn(
            SessionSpec::new("dup", "sim")
                .persistent(true)
                .initial_items(vec![item(1), item(2), item(3)]),
        )
        .await
        .unwrap();
    // Turn 0 waits at its first step (no more writes until the gate opens); the push
    // is ordered after the initial items: once it is acknowledged (sync durability:
    // written), all four are accepted and on record.
    probe.at_step(0, 0).await;
    sup.push("dup", item(4)).await.unwrap();
    let before = store.get("dup").expect("the live session's record");
    assert_eq!(before.status, SessionStatus::Running);
    let mut on_record = ids(&before.unhandled_items);
    on_record.extend(ids(&before.interrupted_items));
    on_record.sort_unstable();
    assert_eq!(on_record, vec![1, 2, 3, 4]);

    for spec in [
        SessionSpec::new("dup", "sim")
            .persistent(true)
            .initial_items(vec![item(90)]),
        SessionSpec::new("dup", "sim"),
        SessionSpec::new("dup", "no-such-kind").persistent(true),
    ] {
        let e = sup.spawn(spec).await.unwrap_err();
        match &e {
            SupervisorError::Duplicate(id) => assert_eq!(id, "dup"),
            other => panic!("expected SupervisorError::Duplicate, got {other}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("`dup`") && msg.contains("pick another id or stop it first"),
            "{msg}"
        );
    }
    assert_eq!(ledgers.lock().len(), 1, "no second agent was built");
    assert_eq!(
        store.get("dup"),
        Some(before),
        "the record is exactly as it was"
    );
    let live = sup.list().await;
    assert_eq!(live.len(), 1);
    assert_eq!((live[0].id.as_str(), live[0].restarts), ("dup", 0));

    // The live session carries on: it takes more, and delivers everything.
    sup.push("dup", item(5)).await.unwrap();
    gate.open_all();
    sup.stop("dup", StopOptions::drain()).await.unwrap();
    let exit = within("dup to drain", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(exit.counters.items_accepted, 5);
    assert_eq!(
        delivered(&ledgers),
        vec![1, 2, 3, 4, 5],
        "90 was never accepted"
    );
    assert!(exit.late_items.is_empty() && h.take_late_items().is_empty());
    rt.stop(StopOptions::bare()).await.unwrap();
}

// ------------------------------------------------------------------------------------
// Pushes to unknown sessions.

/// A push routed to an id with no live session comes back as
/// `PushError::UnknownSession` carrying the very item; other requests by that id
/// get `SupervisorError::UnknownSession`. A stored-but-not-live record is not touched,
/// and the live session keeps delivering every item in order.
#[tokio::test(start_paused = true)]
async fn s32_pushes_to_unknown_sessions_hand_the_item_back() {
    let store = Arc::new(MemoryStore::<SimItem>::new());
    store.insert(record("parked", SessionStatus::Stopped, &[70, 71]));
    let parked = store.get("parked").unwrap();
    let (ledgers, factory) = agents();
    let (rt, _) = Rt::builder()
        .store(store.clone())
        .register_agent("sim", factory)
        .start()
        .await
        .unwrap();
    let sup = rt.supervisor().clone();
    let h = sup.spawn(SessionSpec::new("real", "sim")).await.unwrap();
    sup.push("real", item(1)).await.unwrap();

    let unknown = |e: PushError<SimItem>, want_id: &str, want: u64| match e {
        PushError::UnknownSession { ref id, ref item } => {
            assert_eq!(
                (id.as_str(), item.clone()),
                (want_id, agentloop_tests::item(want))
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("`{want_id}`")) && msg.contains("handed back"),
                "{msg}"
            );
        }
        other => panic!("expected UnknownSession for {want_id:?}, got {other}"),
    };
    unknown(
        sup.push("ghost", item(100)).await.unwrap_err(),
        "ghost",
        100,
    );
    unknown(
        sup.push("parked", item(101)).await.unwrap_err(),
        "parked",
        101,
    );
    unknown(
        sup.push("ghost", item(102))
            .options(PushOptions::preempt(
                Preempt::any_safe_point().timeout(Duration::from_secs(1)),
            ))
            .await
            .unwrap_err(),
        "ghost",
        102,
    );
    unknown(sup.push("", item(103)).await.unwrap_err(), "", 103);
    unknown(sup.push("REAL", item(104)).await.unwrap_err(), "REAL", 104);

    // Every other request by id says the same, and what to do.
    let is_unknown = |e: SupervisorError| {
        assert!(
            matches!(&e, SupervisorError::UnknownSession(id) if id == "ghost"),
            "{e}"
        );
        assert!(e.to_string().contains("list sessions"), "{e}");
    };
    is_unknown(
        sup.stop("ghost", StopOptions::immediate())
            .await
            .unwrap_err(),
    );
    is_unknown(
        sup.subscribe("ghost", agentloop::EventFilter::all())
            .await
            .unwrap_err(),
    );
    is_unknown(sup.inspect("ghost").await.unwrap_err());
    is_unknown(sup.detach("ghost").await.unwrap_err());
    is_unknown(
        sup.attach(
            "ghost",
            agentloop::supervisor::AttachMode::Bound,
            agentloop::EventFilter::all(),
        )
        .await
        .err()
        .expect("attach to an unknown id fails"),
    );
    is_unknown(sup.cancel("ghost").await.unwrap_err());

    sup.push("real", item(2)).await.unwrap();
    sup.stop("real", StopOptions::drain()).await.unwrap();
    let exit = within("real to drain", h.wait()).await;
    assert_eq!(exit.counters.items_accepted, 2);
    assert_eq!(
        ledgers.lock()[0].lock().delivered_ids(),
        vec![1, 2],
        "in push order"
    );
    // Once it has exited, its id is unknown too, and the item still comes back.
    unknown(sup.push("real", item(3)).await.unwrap_err(), "real", 3);
    assert_eq!(
        store.get("parked"),
        Some(parked),
        "no push woke or wrote it"
    );
    assert!(store.get("ghost").is_none());
    rt.stop(StopOptions::bare()).await.unwrap();
}

// ------------------------------------------------------------------------------------
// Zero and negative durations.

/// `Duration` cannot be negative, so zero is what can go wrong in code; negative values
/// arrive as text or signed numbers. Every zero duration in stop and push options is
/// refused with `OptionsError::NonPositiveDuration` naming the option (the item handed
/// back, the session undisturbed); zero and negative durations in configuration are
/// `ConfigError::OutOfRange` naming the key, and the runtime refuses to start on them.
#[tokio::test(start_paused = true)]
async fn s32_zero_and_negative_durations_are_refused_and_nothing_is_lost() {
    let non_positive = |e: &OptionsError, option: &str| match e {
        OptionsError::NonPositiveDuration { option: o, got } => {
            assert_eq!(*o, option);
            assert_eq!(got, "0ns");
            assert!(
                e.to_string().contains("pass a value greater than zero"),
                "{e}"
            );
        }
        other => panic!("expected NonPositiveDuration for {option}, got {other}"),
    };

    // A session mid-turn (item 1 at its first step).
    let (h, gate, mut probe) = running("zero", SimAgent::new(steps(2))).await;
    for (opts, option) in [
        (
            StopOptions::graceful_timeout(Duration::ZERO),
            "graceful_timeout",
        ),
        (
            StopOptions::until_idle_for(Duration::ZERO),
            "until_idle_for",
        ),
        (
            StopOptions::immediate().with_timeout(Duration::ZERO),
            "graceful_timeout",
        ),
        (
            StopOptions::graceful_timeout(Duration::ZERO)
                .cause("refused stop")
                .skip_checkpoint(),
            "graceful_timeout",
        ),
    ] {
        match h.stop(opts).await.unwrap_err() {
            SessionError::InvalidOptions(e) => non_positive(&e, option),
            other => panic!("expected SessionError::InvalidOptions, got {other}"),
        }
    }
    // The same stops sent to the actor directly (as another actor would) are refused
    // there too.
    let (tx, rx) = tokio::sync::oneshot::channel();
    h.actor()
        .send_message(TurnLoopMsg::Stop {
            options: StopOptions::until_idle_for(Duration::ZERO).cause("refused stop"),
            reply: Some(tx.into()),
        })
        .unwrap();
    non_positive(&rx.await.unwrap().unwrap_err(), "until_idle_for");

    let handed_back = |e: PushError<SimItem>, id: u64, option: &str| match e {
        PushError::InvalidOptions { item, error } => {
            assert_eq!(item, agentloop_tests::item(id), "the very item comes back");
            non_positive(&error, option);
        }
        other => panic!("expected PushError::InvalidOptions, got {other}"),
    };
    handed_back(
        h.push(item(2))
            .options(PushOptions::preempt(
                Preempt::any_safe_point().timeout(Duration::ZERO),
            ))
            .await
            .unwrap_err(),
        2,
        "preempt.timeout",
    );
    handed_back(
        h.push(item(3))
            .options(PushOptions::preempt(
                Preempt::after_tool_calls().delay(Duration::ZERO),
            ))
            .await
            .unwrap_err(),
        3,
        "preempt.delay",
    );
    handed_back(
        h.push(item(4))
            .options(PushOptions::strategy(|_| {
                Some(Preempt::any_safe_point().delay(Duration::ZERO))
            }))
            .await
            .unwrap_err(),
        4,
        "preempt.delay",
    );
    // Regression: the same push cast without a reply (as another actor would) must
    // not vanish: a rejection without a reply is recorded in the late list.
    h.actor()
        .send_message(TurnLoopMsg::Push {
            item: item(5),
            options: PushOptions::preempt(Preempt::any_safe_point().timeout(Duration::ZERO)),
            reply: None,
        })
        .unwrap();
    let info = h.inspect().await.unwrap(); // ordered after the cast
    assert!(!info.stop_committed && !info.exited, "{info:?}");
    assert_eq!(info.buffered, 0, "no refused item was buffered");
    assert_eq!(
        ids(&h.take_late_items()),
        vec![5],
        "the refused item of a push without a reply is in the late list"
    );
    assert_eq!(
        probe.drain(),
        vec![],
        "no refused option touched the running turn (still at its first step)"
    );
    h.push(item(6)).await.unwrap();
    gate.open_all();
    h.stop(StopOptions::drain().cause("done")).await.unwrap();
    let exit = within("zero to drain", h.wait()).await;
    assert_eq!(exit.reason, ExitReason::Completed);
    assert_eq!(
        exit.stop_cause.as_deref(),
        Some("done"),
        "a refused stop's cause does not count"
    );
    assert_eq!(exit.counters.items_accepted, 2);
    assert_eq!(exit.counters.items_delivered, 2, "items 1 and 6");
    assert!(exit.unhandled_items.is_empty() && exit.interrupted_items.is_empty());

    // Through the supervisor: the same errors, the item handed back.
    let store = Arc::new(MemoryStore::<SimItem>::new());
    let (ledgers, factory) = agents();
    let (rt, _) = Rt::builder()
        .store(store.clone())
        .register_agent("sim", factory)
        .start()
        .await
        .unwrap();
    let sup = rt.supervisor().clone();
    let sh = sup
        .spawn(SessionSpec::new("zero-sup", "sim").persistent(true))
        .await
        .unwrap();
    match sup
        .push("zero-sup", item(10))
        .options(PushOptions::preempt(
            Preempt::any_safe_point().delay(Duration::ZERO),
        ))
        .await
        .unwrap_err()
    {
        e if e.is_session_answer() => handed_back(e, 10, "preempt.delay"),
        other => panic!("expected the session's own refusal, got {other}"),
    }
    match sup
        .stop("zero-sup", StopOptions::graceful_timeout(Duration::ZERO))
        .await
        .unwrap_err()
    {
        SupervisorError::Session(SessionError::InvalidOptions(e)) => {
            non_positive(&e, "graceful_timeout")
        }
        other => panic!("expected SupervisorError::Session(InvalidOptions), got {other}"),
    }
    sup.push("zero-sup", item(11)).await.unwrap();
    sup.stop("zero-sup", StopOptions::drain()).await.unwrap();
    let exit = within("zero-sup to drain", sh.wait()).await;
    assert_eq!(exit.counters.items_accepted, 1);
    assert_eq!(delivered(&ledgers), vec![11]);
    rt.stop(StopOptions::bare()).await.unwrap();

    // Signed values from outside Rust.
    for (millis, got) in [
        (0, "0ms"),
        (-1, "-1ms"),
        (i64::MIN, "-9223372036854775808ms"),
    ] {
        assert_eq!(
            positive_millis("grace", millis),
            Err(OptionsError::NonPositiveDuration {
                option: "grace",
                got: got.into()
            })
        );
    }

    // Configuration text: zero and negative values of every duration key.
    for (table, key) in [
        ("shutdown", "grace"),
        ("shutdown", "cleanup"),
        ("shutdown", "force_timeout"),
        ("supervisor", "restart_window"),
        ("supervisor", "heartbeat"),
        ("supervisor", "lease_timeout"),
    ] {
        // Issue 16: something that is not a duration at all says so.
        for value in ["soon", "5", "10S", "0.0000000001s"] {
            let text = format!("[{table}]\n{key} = \"{value}\"\n");
            let e = RuntimeConfig::from_toml_str(&text).unwrap_err();
            let full = format!("{table}.{key}");
            assert!(
                matches!(&e, ConfigError::NotADuration { key: k, value: v, .. } if *k == full && v == value),
                "{text}: expected NotADuration, got {e}"
            );
        }
        for value in ["0s", "0ms", "-1s", "-0.5s"] {
            let text = format!("[{table}]\n{key} = \"{value}\"\n");
            let e = RuntimeConfig::from_toml_str(&text).unwrap_err();
            let full = format!("{table}.{key}");
            match &e {
                ConfigError::OutOfRange {
                    key: k,
                    value: v,
                    allowed,
                } => {
                    assert_eq!((*k, v.as_str()), (full.as_str(), value), "{text}");
                    assert!(
                        allowed.contains("more than 0s") || allowed.contains("longer than"),
                        "{e}"
                    );
                }
                other => panic!("{text}: expected OutOfRange, got {other}"),
            }
            assert!(e.to_string().contains(&full), "{e}");
        }
    }

    // Zero durations given to the runtime builder in code: refused at start, before
    // anything runs.
    for (config, key) in [
        (
            ShutdownConfig {
                grace: Duration::ZERO,
                ..ShutdownConfig::default()
            },
            "shutdown.grace",
        ),
        (
            ShutdownConfig {
                cleanup: Duration::ZERO,
                ..ShutdownConfig::default()
            },
            "shutdown.cleanup",
        ),
        (
            ShutdownConfig {
                force_timeout: Duration::ZERO,
                ..ShutdownConfig::default()
            },
            "shutdown.force_timeout",
        ),
    ] {
        let r = Rt::builder()
            .store(store.clone())
            .shutdown_config(config)
            .start()
            .await;
        match r {
            Err(RuntimeError::Config(ConfigError::OutOfRange { key: k, .. })) => {
                assert_eq!(k, key)
            }
            Err(other) => panic!("{key}: expected RuntimeError::Config, got {other}"),
            Ok(_) => panic!("{key}: a zero duration was accepted"),
        }
    }
    // Regression: a zero heartbeat interval used to start the runtime and panic in the
    // lease's renewal task (`interval` of zero), leaving the instance's heartbeat to go
    // stale while it was alive.
    for (beat, lease, key) in [
        (
            Duration::ZERO,
            Duration::from_secs(30),
            "supervisor.heartbeat",
        ),
        (
            Duration::from_secs(10),
            Duration::ZERO,
            "supervisor.lease_timeout",
        ),
    ] {
        let r = Rt::builder()
            .store(store.clone())
            .heartbeat(beat, lease)
            .start()
            .await;
        match r {
            Err(RuntimeError::Config(ConfigError::OutOfRange { key: k, .. })) => {
                assert_eq!(k, key)
            }
            Err(other) => panic!("{key}: expected RuntimeError::Config, got {other}"),
            Ok(_) => panic!("{key}: a zero duration was accepted"),
        }
    }
}

// ------------------------------------------------------------------------------------
// Invalid configuration.

/// Unknown keys and tables, wrong types, out-of-range values and an unknown shutdown
/// strategy are refused with the `ConfigError` / `RuntimeError` variant that names the
/// key (and the file); a runtime that refuses its configuration touches nothing in its
/// data directory, and the next good start resumes what was there.
#[tokio::test]
async fn s32_invalid_configuration_names_the_key_and_touches_no_record() {
    let parse = |text: &str, needles: &[&str]| {
        let e = RuntimeConfig::from_toml_str(text).unwrap_err();
        match &e {
            ConfigError::Parse { path, message } => {
                assert!(path.is_none());
                for n in needles {
                    assert!(message.contains(n), "{text:?}: `{n}` in {message}");
                }
            }
            other => panic!("{text:?}: expected ConfigError::Parse, got {other}"),
        }
        assert!(e.to_string().starts_with("invalid configuration"), "{e}");
    };
    // Unknown keys and tables: the message names the key and the known ones.
    parse("[shutdown]\ngrase = \"30s\"\n", &["grase", "grace"]);
    parse("[shutdwn]\ngrace = \"30s\"\n", &["shutdwn", "shutdown"]);
    parse("verbose = true\n", &["verbose"]);
    parse("[store]\npath = \"x\"\n", &["path", "data_dir"]);
    // Wrong types.
    parse("[shutdown]\ngrace = 30\n", &["grace"]);
    parse("[supervisor]\nmax_restarts = \"3\"\n", &["max_restarts"]);
    parse("[supervisor]\nmax_restarts = 1.5\n", &["max_restarts"]);
    parse("[shutdown]\nstrategy = [\"drain\"]\n", &["strategy"]);
    parse("shutdown = \"cooperative\"\n", &["shutdown"]);
    // Not TOML at all.
    parse("[shutdown\n", &["line 1"]);

    // Out of range: the key, the value as written and the allowed range.
    for (text, key, value, allowed) in [
        (
            "[shutdown]\ngrace = \"301s\"",
            "shutdown.grace",
            "301s",
            "at most 300s",
        ),
        (
            "[shutdown]\ncleanup = \"2m\"",
            "shutdown.cleanup",
            "120s",
            "at most 60s",
        ),
        (
            "[shutdown]\nstrategy = \"  \"",
            "shutdown.strategy",
            "  ",
            "registered strategy",
        ),
        (
            "[store]\ndata_dir = \"\"",
            "store.data_dir",
            "",
            "non-empty",
        ),
        (
            "[store]\nflush = \"always\"",
            "store.flush",
            "always",
            "\"sync\"",
        ),
        (
            "[supervisor]\nmax_restarts = -1",
            "supervisor.max_restarts",
            "-1",
            "0 to 1000",
        ),
        (
            "[supervisor]\nmax_restarts = 1001",
            "supervisor.max_restarts",
            "1001",
            "0 to 1000",
        ),
        (
            "[supervisor]\nrestart_window = \"2h\"",
            "supervisor.restart_window",
            "7200s",
            "at most 1h",
        ),
        (
            "[supervisor]\nheartbeat = \"61s\"",
            "supervisor.heartbeat",
            "61s",
            "at most 60s",
        ),
        (
            "[supervisor]\nheartbeat = \"10s\"\nlease_timeout = \"10s\"",
            "supervisor.lease_timeout",
            "10s",
            "longer than supervisor.heartbeat",
        ),
    ] {
        let e = RuntimeConfig::from_toml_str(text).unwrap_err();
        match &e {
            ConfigError::OutOfRange {
                key: k,
                value: v,
                allowed: a,
            } => {
                assert_eq!((*k, v.as_str()), (key, value), "{text}");
                assert!(a.contains(allowed), "{text}: {a}");
            }
            other => panic!("{text}: expected OutOfRange, got {other}"),
        }
        let msg = e.to_string();
        assert!(msg.contains(key) && msg.contains("allowed:"), "{msg}");
    }

    // A data directory holding a resumable session.
    let dir = TempDir::new("s32-config");
    let data = dir.path().join("data");
    put_raw(
        &data,
        entries_of(&record("kept", SessionStatus::Interrupted, &[1, 2])),
    )
    .await;
    let before = raw_all(&data, &["kept"]).await;

    // A file: the error names the file and the key.
    let file = dir.path().join("agentloop.toml");
    std::fs::write(&file, "[shutdown]\ngrace = \"30s\"\ncolour = \"blue\"\n").unwrap();
    let e = RuntimeConfig::from_file(&file).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Parse { path: Some(p), .. } if p == &file),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("agentloop.toml") && msg.contains("colour"),
        "{msg}"
    );
    let e = RuntimeConfig::from_file(dir.path().join("missing.toml")).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Io { .. }) && e.to_string().contains("missing.toml"),
        "{e}"
    );

    // An unknown strategy parses (strategies are registered on the runtime) and is
    // refused at start, naming the key and the known strategies, before the data
    // directory is opened.
    let text = format!(
        "[store]\ndata_dir = '{}'\n[shutdown]\nstrategy = \"gentle\"\n",
        data.display()
    );
    let config = RuntimeConfig::from_toml_str(&text).unwrap();
    let (ledgers, factory) = agents();
    match Rt::builder()
        .config(&config)
        .register_agent("sim", factory)
        .start()
        .await
    {
        Err(e @ RuntimeError::UnknownStrategy { .. }) => {
            let RuntimeError::UnknownStrategy { name, known } = &e else {
                unreachable!()
            };
            assert_eq!(name, "gentle");
            assert_eq!(known, "cooperative, drain, immediate");
            assert!(e.to_string().contains("shutdown.strategy"), "{e}");
        }
        Err(other) => panic!("expected UnknownStrategy, got {other}"),
        Ok(_) => panic!("an unknown strategy was accepted"),
    }
    // A configuration built in code with a value out of range: refused the same way.
    let mut bad = config.clone();
    bad.shutdown.strategy = "cooperative".into();
    bad.shutdown.grace = Duration::from_secs(301);
    match Rt::builder().config(&bad).start().await {
        Err(RuntimeError::Config(ConfigError::OutOfRange { key, .. })) => {
            assert_eq!(key, "shutdown.grace")
        }
        Err(other) => panic!("expected RuntimeError::Config, got {other}"),
        Ok(_) => panic!("an out-of-range grace was accepted"),
    }
    assert!(ledgers.lock().is_empty(), "nothing was started");
    assert_eq!(
        raw_all(&data, &["kept"]).await,
        before,
        "the record is untouched"
    );

    // The next good start resumes it with its items.
    let mut good = config.clone();
    good.shutdown.strategy = "cooperative".into();
    let (ledgers, factory) = agents();
    let (rt, report) = Rt::builder()
        .config(&good)
        .register_agent("sim", factory)
        .start()
        .await
        .unwrap();
    assert_eq!(report.resumed, vec!["kept".to_string()], "{report:?}");
    assert_eq!(report.items, 2);
    rt.stop(StopOptions::drain()).await.unwrap();
    assert_eq!(delivered(&ledgers), vec![1, 2]);
}
