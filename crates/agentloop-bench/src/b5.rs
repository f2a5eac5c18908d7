//! B5: recover 10k interrupted sessions at start, against raw sled scan + decode +
//! ractor spawn in the same process and run (DESIGN §10). Target: agentloop ≤ 2 ×
//! baseline.
//!
//! Setup (untimed, per side per round): a fresh sled directory holding 10 000 records
//! written through `SledBackend::apply` the way the store writes them (record format 3
//! since issue 30: one head holding the header, the items and the state; `agentloop_core::table`): status
//! `Interrupted`, cut mid-turn (one interrupted item and ~1 KiB of encoded `SimState`)
//! with two unhandled items queued behind it. Every side gets its own copy of the same
//! records, so each starts from a closed directory (the setup waits until sled has
//! released its lock).
//!
//! * Baseline (raw): open the sled database, iterate the `sessions` tree, decode each
//!   record's head (`codec::head::decode`), its items (`codec::payload::decode`) and
//!   its agent state (`codec::decode_state`) on a blocking thread (the keys and bytes the
//!   store uses, read with the store's codec), then spawn one ractor actor per record
//!   that holds the decoded record and state and does nothing else. Timed from the open
//!   to the last spawn.
//! * agentloop: `Runtime::builder().data_dir(dir).register_agent("sim", ..).start()`,
//!   timed until it returns its `StartReport`, which must list all 10 000 sessions as
//!   resumed with their 30 000 items and skip none. Then (untimed) `Runtime::stop` with
//!   an immediate shutdown stop; every session must report an exit. Two agents:
//!   - the figure: a `SimAgent` whose turn is one model call of an hour, so each resumed
//!     turn waits in its first step, as a real agent waiting on its model would: the
//!     window holds the recovery and nothing else;
//!   - a diagnostic, not the figure: `Script::noop()`, so each resumed turn and the turn
//!     of its queued items complete at once and write their records (`Sync`) while the
//!     remaining sessions are still being recovered.
//!
//! Issue 51: the store recovers at the default level, `power` (the figure); the
//! baseline only reads. `B5_DURABILITY=crash` runs the agentloop side at `crash` (a
//! diagnostic: what `power`'s fsyncs of the recovery's group commits cost).
//!
//! The sides run one at a time in an order that reverses every round, after one
//! warm-up round; each side's value is the median over rounds.

use std::path::Path;

/// The level the agentloop side recovers at: `power` unless `B5_DURABILITY` says
/// otherwise (a diagnostic).
fn level() -> agentloop::store::StoreDurability {
    std::env::var("B5_DURABILITY")
        .ok()
        .and_then(|l| agentloop::store::StoreDurability::parse(&l))
        .unwrap_or_default()
}
use std::time::{Duration, Instant};

use agentloop::store::codec;
use agentloop::store::{RecordHeader, SledBackend, WriteCondition};
use agentloop::{
    store::CheckpointActor, store::SessionRecord, store::SessionStatus, store::StatusKind,
    CheckpointStore, ExitReason, Runtime, StopOptions,
};
use agentloop_core::table::{self, KeyKind};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem, SimState, SimStep};
use ractor::Actor;

use crate::harness::{ms, workers, Holder};
use crate::report::{median, print_table, ratio_line_max, summarize};

/// Interrupted sessions to recover.
const SESSIONS: usize = 10_000;
/// Encoded agent state per record (filler of `SimState`).
const STATE_BYTES: usize = 1024;
/// Items per record: one interrupted (the cut turn's), two unhandled.
const ITEMS_PER_RECORD: usize = 3;
/// Timed rounds per side (odd, so the median is one round).
const ROUNDS: usize = 5;
/// The target: agentloop ≤ 2 × baseline.
const TARGET: f64 = 2.0;
/// The parked agent's model call: far longer than any run.
const PARKED_STEP: Duration = Duration::from_secs(3600);

// ---------------------------------------------------------------------------------
// Temp dirs (removed at the end, and on a panic by `Drop`).

use crate::tempdir::TempDir;

// ---------------------------------------------------------------------------------
// Setup: 10k interrupted records.

fn session_id(i: usize) -> String {
    format!("b5-{i:05}")
}

/// One interrupted record, cut in its first step, with two items queued behind it.
fn record(i: usize) -> SessionRecord<SimItem> {
    let id = session_id(i);
    let base = (i * ITEMS_PER_RECORD) as u64;
    let mut rec = SessionRecord::new(id.clone(), "sim", 3);
    rec.status = SessionStatus::Interrupted;
    rec.interrupted_items = vec![SimItem::new(base, "cut turn")];
    rec.unhandled_items = vec![
        SimItem::new(base + 1, "queued a"),
        SimItem::new(base + 2, "queued b"),
    ];
    let state = SimState {
        turn: 3,
        items: vec![base],
        steps_done: 0,
        payload: vec![0x5A; STATE_BYTES],
    };
    rec.state = Some(codec::encode_state(&id, &state).expect("encoding a B5 state"));
    rec.stop_cause = Some("shutdown".into());
    rec
}

/// Writes the records into a fresh directory (blocking; sled's lock is released when
/// this returns). Returns the directory and the encoded record size.
async fn populated_dir(tag: &str) -> (TempDir, usize) {
    let dir = TempDir::new("b5", tag);
    let path = dir.path().to_path_buf();
    let record_len = tokio::task::spawn_blocking(move || {
        let backend = SledBackend::open_at(&path, agentloop::store::StoreDurability::Crash)
            .expect("opening the B5 setup db");
        let mut len = 0;
        let writes = (0..SESSIONS)
            .map(|i| {
                let w = record(i)
                    .to_write(WriteCondition::Always)
                    .expect("encoding a B5 record");
                len = w.payload_bytes();
                w
            })
            .collect();
        backend.write_all(writes).expect("writing the B5 records");
        drop(backend);
        len
    })
    .await
    .expect("the B5 setup panicked");
    wait_unlocked(dir.path()).await;
    (dir, record_len)
}

/// Waits until sled's directory lock is free. Dropping a sled database does not release
/// it at once (its background threads let go of the lock file a moment later), and
/// opening the directory before that fails with `WouldBlock`. sled locks with `flock`,
/// which `File::try_lock` also uses.
async fn wait_unlocked(dir: &Path) {
    let lock_file = dir.join("db");
    let t0 = Instant::now();
    loop {
        let file = std::fs::File::open(&lock_file).expect("opening sled's lock file");
        match file.try_lock() {
            Ok(()) => {
                file.unlock().expect("unlocking sled's lock file");
                return;
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "B5: sled never released {}",
                    lock_file.display()
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(std::fs::TryLockError::Error(e)) => panic!("locking sled's lock file: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------
// Baseline: raw sled scan + decode + one ractor actor per record.

/// A recovered record: header, items (in entry order), state. The baseline's actor
/// (`Holder<Recovered>`) holds one and does nothing.
type Recovered = (RecordHeader, Vec<SimItem>, SimState);

/// Opens sled, scans and decodes every `Interrupted` record with its items and state
/// (one session's keys are contiguous: the head, then any loose items and state).
/// Blocks.
fn scan(path: &Path) -> (sled::Db, Vec<Recovered>) {
    let db = sled::Config::new()
        .path(path)
        .open()
        .expect("opening the B5 baseline db");
    let tree = db.open_tree("sessions").expect("opening the sessions tree");
    let mut out = Vec::with_capacity(SESSIONS);
    let mut current: Option<(RecordHeader, Vec<SimItem>)> = None;
    for kv in tree.iter() {
        let (k, v) = kv.expect("scanning the sessions tree");
        let (id, kind) = table::parse_key(&k).expect("a key of the record layout");
        match kind {
            KeyKind::Header => {
                // Format 3: the head holds the items and the state when they fit (here
                // they do); a loose item or state entry follows it otherwise.
                let head = codec::head::decode(id, &v).expect("decoding a head");
                current = None;
                if head.header.status == SessionStatus::Interrupted {
                    let items = head
                        .items
                        .iter()
                        .map(|(_, b)| codec::payload::decode(b).expect("decoding an item"))
                        .collect();
                    match &head.state {
                        Some(s) => {
                            let state: SimState =
                                codec::decode_state(id, s).expect("decoding a state");
                            out.push((head.header, items, state));
                        }
                        None => current = Some((head.header, items)),
                    }
                }
            }
            KeyKind::Item(_) => {
                if let Some((_, items)) = current.as_mut() {
                    items.push(codec::payload::decode(&v).expect("decoding an item"));
                }
            }
            KeyKind::State => {
                if let Some((h, items)) = current.take() {
                    let state: SimState = codec::decode_state(id, &v).expect("decoding a state");
                    out.push((h, items, state));
                }
            }
            KeyKind::Journal(_) | KeyKind::Other => {}
        }
    }
    (db, out)
}

/// One baseline round: (total ms, of which open + scan + decode ms).
async fn baseline_round() -> (f64, f64) {
    let (dir, _) = populated_dir("raw").await;
    let path = dir.path().to_path_buf();
    let t0 = Instant::now();
    let (db, records) = tokio::task::spawn_blocking(move || scan(&path))
        .await
        .expect("the B5 baseline scan panicked");
    let scanned = t0.elapsed();
    let mut actors = Vec::with_capacity(records.len());
    for r in records {
        actors.push(
            Actor::spawn(None, Holder::<Recovered>::new(), r)
                .await
                .expect("spawning a holder"),
        );
    }
    let elapsed = t0.elapsed();
    assert_eq!(
        actors.len(),
        SESSIONS,
        "B5 baseline: not every record recovered"
    );
    for (a, _) in &actors {
        a.stop(None);
    }
    for (_, join) in actors {
        join.await.expect("a holder's task failed");
    }
    tokio::task::spawn_blocking(move || drop(db))
        .await
        .expect("closing the baseline db panicked");
    drop(dir);
    (ms(elapsed), ms(scanned))
}

// ---------------------------------------------------------------------------------
// agentloop: Runtime::start on the directory.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AgentMode {
    /// Each resumed turn waits in an hour-long model call (the figure).
    Parked,
    /// Each resumed turn, and the turn of its queued items, completes at once.
    Noop,
}

fn agent(mode: AgentMode) -> SimAgent {
    match mode {
        AgentMode::Parked => SimAgent::new(Script {
            steps: vec![SimStep::ModelCall {
                latency: PARKED_STEP,
                input_tokens: 1,
            }],
        })
        .with_state_payload(STATE_BYTES),
        AgentMode::Noop => SimAgent::new(Script::noop()).with_state_payload(STATE_BYTES),
    }
}

async fn agentloop_round(mode: AgentMode) -> f64 {
    let (dir, _) = populated_dir("agentloop").await;
    let t0 = Instant::now();
    let (runtime, report) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .engine(agentloop::store::Engine::Sled(level()))
        .register_agent("sim", move |_cfg: &[u8]| Ok(agent(mode)))
        .start()
        .await
        .expect("starting the B5 runtime");
    let elapsed = t0.elapsed();
    assert!(
        report.skipped.is_empty(),
        "B5: records skipped: {:?}",
        &report.skipped[..report.skipped.len().min(3)]
    );
    assert_eq!(
        report.resumed.len(),
        SESSIONS,
        "B5: not every session resumed"
    );
    assert_eq!(report.items, SESSIONS * ITEMS_PER_RECORD, "B5: items lost");
    let options = match mode {
        AgentMode::Parked => StopOptions::immediate().shutdown(),
        AgentMode::Noop => StopOptions::bare(),
    };
    let exits = runtime
        .stop(options)
        .await
        .expect("stopping the B5 runtime");
    assert_eq!(exits.len(), SESSIONS, "B5: not every session exited");
    for e in &exits {
        assert!(
            !matches!(e.reason, ExitReason::Failed(_)),
            "B5 session {} failed: {:?}",
            e.session_id,
            e.reason
        );
    }
    drop(dir);
    ms(elapsed)
}

/// Diagnostic: the store's part of `Runtime::start`, step by step, on its own
/// `CheckpointActor`: open the directory, list the resumable records (the runtime's
/// one scan), then load each record once through the actor, one after the other, as
/// each resumed session's `pre_start` does. Returns (open ms, list ms, µs per load).
async fn store_steps_round() -> (f64, f64, f64) {
    let (dir, _) = populated_dir("steps").await;
    let t0 = Instant::now();
    let client = CheckpointActor::<SimItem>::spawn(dir.path())
        .await
        .expect("opening the B5 store");
    let t1 = Instant::now();
    let entries = client
        .list(Some(vec![StatusKind::Interrupted, StatusKind::Running]))
        .await
        .expect("listing the B5 records");
    let t2 = Instant::now();
    assert_eq!(entries.len(), SESSIONS, "B5 steps: records missing");
    for e in &entries {
        client
            .load(&e.session_id)
            .await
            .expect("loading a B5 record")
            .expect("a B5 record vanished");
    }
    let t3 = Instant::now();
    client.close().await.expect("closing the B5 store");
    drop(dir);
    (
        ms(t1 - t0),
        ms(t2 - t1),
        (t3 - t2).as_secs_f64() * 1e6 / SESSIONS as f64,
    )
}

// ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Base,
    Parked,
    Noop,
    StoreSteps,
}

const SIDES: [Side; 4] = [Side::Base, Side::Parked, Side::Noop, Side::StoreSteps];

#[derive(Default)]
struct Samples {
    base: Vec<f64>,
    base_scan: Vec<f64>,
    parked: Vec<f64>,
    noop: Vec<f64>,
    open: Vec<f64>,
    list: Vec<f64>,
    load_us: Vec<f64>,
}

impl Samples {
    async fn run(&mut self, side: Side) {
        match side {
            Side::Base => {
                let (total, scan) = baseline_round().await;
                self.base.push(total);
                self.base_scan.push(scan);
            }
            Side::Parked => self.parked.push(agentloop_round(AgentMode::Parked).await),
            Side::Noop => self.noop.push(agentloop_round(AgentMode::Noop).await),
            Side::StoreSteps => {
                let (open, list, load) = store_steps_round().await;
                self.open.push(open);
                self.list.push(list);
                self.load_us.push(load);
            }
        }
    }
}

/// Runs B5 and prints its table and verdict line (the last line).
pub async fn run() {
    let started = Instant::now();
    let (probe, record_len) = populated_dir("probe").await;
    drop(probe);
    println!(
        "B5: recover {SESSIONS} interrupted sessions at start ({record_len} B records: \
         {STATE_BYTES} B of state, {ITEMS_PER_RECORD} items); {ROUNDS} rounds per side, sides \
         one at a time, order reversed every round, warm-up 1 round per side; the store at {}; \
         tokio workers: {}",
        level(),
        workers()
    );
    let mut warm = Samples::default();
    for side in SIDES {
        warm.run(side).await;
    }
    let mut s = Samples::default();
    for round in 0..ROUNDS {
        let mut order = SIDES;
        if round % 2 == 1 {
            order.reverse();
        }
        for side in order {
            s.run(side).await;
        }
    }
    let base = summarize(&s.base);
    let parked = summarize(&s.parked);
    let noop = summarize(&s.noop);
    println!();
    print_table(
        "B5 recovery of 10k interrupted sessions (open to last spawn / to the StartReport)",
        "ms",
        &[
            ("baseline: sled scan + decode + ractor spawn", base),
            ("agentloop: Runtime::start, turns parked", parked),
            ("diag: Runtime::start, noop turns run", noop),
        ],
    );
    println!();
    println!(
        "per session: baseline {:.1} µs, agentloop {:.1} µs (noop agent {:.1} µs)",
        base.median * 1e3 / SESSIONS as f64,
        parked.median * 1e3 / SESSIONS as f64,
        noop.median * 1e3 / SESSIONS as f64,
    );
    println!(
        "baseline split (medians): open + scan + decode {:.1} ms, {SESSIONS} spawns {:.1} ms",
        median(&s.base_scan),
        base.median - median(&s.base_scan)
    );
    println!(
        "diag, the store's steps of Runtime::start on their own (medians): open {:.1} ms, \
         list {:.1} ms, {SESSIONS} sequential loads through the CheckpointActor {:.1} µs each \
         ({:.0} ms)",
        median(&s.open),
        median(&s.list),
        median(&s.load_us),
        median(&s.load_us) * SESSIONS as f64 / 1e3
    );
    println!(
        "diagnostic ratio (noop agent, turns run during the recovery)={:.2}; B5 wall time {:.1} s",
        noop.median / base.median,
        started.elapsed().as_secs_f64()
    );
    println!();
    println!(
        "{}",
        ratio_line_max("B5", parked.median / base.median, TARGET)
    );
}
