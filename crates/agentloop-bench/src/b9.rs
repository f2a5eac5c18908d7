//! B9 (issue 15): one checkpoint save + load round through the public store API, one
//! record of ≈ 700 B, agentloop on fjall against raw sled's `insert` + `flush` + `get`
//! in the same process and run, both sides at the same level. Target: ratio ≤ 0.25.
//!
//! Issue 51: the figure is measured at the default level, `power` (both sides survive a
//! power loss: agentloop on fjall `power`, `persist(SyncAll)`, against raw sled's
//! `insert` + `flush` + an fsync of its data file + `get`), and again at `crash` (both
//! survive a process crash only: fjall `persist(Buffer)` against raw sled's `insert` +
//! `flush` + `get`, the figure before issue 51) as a second line.
//!
//! * agentloop: a `CheckpointActor` on fjall in a temp dir; per operation
//!   `CheckpointStore::save(record)` (acknowledged after the group commit's persist)
//!   then `CheckpointStore::load(id)`, which must return the record just saved. The
//!   record is a `SessionRecord<SimItem>` with two unhandled items and a 512 B state
//!   (≈ 700 B encoded; printed); its state varies every operation, and 16 session ids
//!   take turns.
//! * Baseline (raw sled): its own database; per operation `insert` of a value of the
//!   record's encoded size (varied, so sled writes it) + `db.flush()` (+ the fsync at
//!   `power`) + `get`, on a blocking thread, the whole round in one blocking job (no
//!   hop per operation: the cheapest way to drive sled).
//! * Beside it (not the figure): agentloop on sled at `power` (the default engine, same
//!   API), raw fjall with `persist(Buffer)` and `persist(SyncAll)`.
//!
//! Rounds of `OPS` operations per side, interleaved (the order reverses every round),
//! after a warm-up round of each; a round's sample is its mean per operation; each
//! side's value is the median over rounds.

use std::path::Path;
use std::time::Instant;

use agentloop::store::{Engine, StoreDurability};
use agentloop::{
    store::CheckpointActor, store::CheckpointClient, store::SessionRecord, CheckpointStore,
};
use agentloop_sim::SimItem;

use crate::harness::{micros_per_op, workers};
use crate::raw::RawSled;
use crate::report::{print_table, ratio_line_max, summarize, Summary};
use crate::tempdir::TempDir;

/// Timed rounds per side (odd, so the median is one round).
const ROUNDS: usize = 9;
/// Save + load rounds per round and side.
const OPS: usize = 300;
/// Session ids the operations rotate over.
const IDS: usize = 16;
/// The agent state's size.
const STATE_BYTES: usize = 512;
/// The target: agentloop on fjall ≤ 0.25 × raw sled, at the same level.
const TARGET: f64 = 0.25;

type Client = CheckpointClient<SimItem>;

fn record(id: &str, n: u64) -> SessionRecord<SimItem> {
    let mut r = SessionRecord::<SimItem>::new(id, "sim", 3);
    r.unhandled_items = vec![
        SimItem::new(n, "what is the weather in Lisbon"),
        SimItem::new(n + 1, "and tomorrow?"),
    ];
    let mut state = vec![0x5A; STATE_BYTES];
    state[..8].copy_from_slice(&n.to_le_bytes());
    r.state = Some(state);
    r
}

/// One agentloop round: `OPS` save + load pairs. Mean µs per pair (and, when
/// `B9_SPLIT` is set, the mean save and load printed apart: a diagnostic).
async fn agentloop_round(client: &Client, round: u64) -> f64 {
    let split = std::env::var_os("B9_SPLIT").is_some();
    let (mut saves, mut loads) = (0.0, 0.0);
    let t0 = Instant::now();
    for i in 0..OPS as u64 {
        let ts = Instant::now();
        let n = round * OPS as u64 + i;
        let id = format!("b9-{:02}", n % IDS as u64);
        client.save(record(&id, n)).await.expect("a B9 save failed");
        let tl = Instant::now();
        saves += (tl - ts).as_secs_f64();
        let back = client
            .load(&id)
            .await
            .expect("a B9 load failed")
            .expect("the B9 record just saved");
        assert_eq!(
            back.state.as_deref().map(|s| &s[..8]),
            Some(&n.to_le_bytes()[..]),
            "B9: the load returned another version"
        );
        loads += tl.elapsed().as_secs_f64();
    }
    if split {
        println!(
            "  diag: save {:.1} µs, load {:.1} µs (mean of {OPS})",
            saves * 1e6 / OPS as f64,
            loads * 1e6 / OPS as f64
        );
    }
    micros_per_op(t0.elapsed(), OPS as u64)
}

/// agentloop's own work of a round without any hand-off (diagnostic): on one blocking
/// thread, per operation the record's encoding (`to_write`), the engine's apply and
/// flush (`Backend::write`, what the committer runs) and the load from the head (what a
/// caller runs). What the public API costs beyond it is the hand-offs.
fn inline_round(engine: &agentloop::store::Backend, round: u64) -> (f64, f64, f64) {
    let (mut enc, mut apply, mut load) = (0.0, 0.0, 0.0);
    for i in 0..OPS as u64 {
        let n = round * OPS as u64 + i;
        let id = format!("b9-{:02}", n % IDS as u64);
        let t0 = Instant::now();
        let w = record(&id, n)
            .to_write(agentloop::store::WriteCondition::Always)
            .expect("encoding the B9 record");
        let t1 = Instant::now();
        engine.write(w).expect("a B9 write");
        let t2 = Instant::now();
        let back = engine
            .load_from_head(&id)
            .expect("a record all in its head")
            .expect("a B9 load")
            .expect("the B9 record just saved");
        let t3 = Instant::now();
        assert!(matches!(back, agentloop::store::Stored::Current(_)));
        enc += (t1 - t0).as_secs_f64();
        apply += (t2 - t1).as_secs_f64();
        load += (t3 - t2).as_secs_f64();
    }
    let us = |x: f64| x * 1e6 / OPS as f64;
    (us(enc), us(apply), us(load))
}

/// A raw engine, driven in rounds of the same shape as agentloop's.
trait Raw: Send + Sync + 'static {
    /// One operation: insert `value` at `key`, make it durable at the engine's level,
    /// get it back and check that it is version `n`.
    fn save_load(&self, key: &str, value: &[u8], n: u64);

    /// One round: `OPS` operations on values of `len` bytes (each a new version, so the
    /// engine writes it). Mean µs per operation.
    fn round(&self, len: usize, round: u64) -> f64 {
        let mut value = vec![0x5A; len];
        let t0 = Instant::now();
        for i in 0..OPS as u64 {
            let n = round * OPS as u64 + i;
            value[..8].copy_from_slice(&n.to_le_bytes());
            let key = format!("b9-{:02}", n % IDS as u64);
            self.save_load(&key, &value, n);
        }
        micros_per_op(t0.elapsed(), OPS as u64)
    }
}

impl Raw for RawSled {
    fn save_load(&self, key: &str, value: &[u8], n: u64) {
        self.db.insert(key, value).expect("sled insert");
        self.flush();
        let got = self.db.get(key).expect("sled get").expect("the value");
        assert_eq!(&got[..8], &n.to_le_bytes());
    }
}

struct RawFjall {
    db: fjall::Database,
    ks: fjall::Keyspace,
    mode: fjall::PersistMode,
}

impl RawFjall {
    fn open(dir: &Path, mode: fjall::PersistMode) -> Self {
        let (db, ks) = crate::raw::open_fjall(dir, "b9");
        RawFjall { db, ks, mode }
    }
}

impl Raw for RawFjall {
    fn save_load(&self, key: &str, value: &[u8], n: u64) {
        self.ks.insert(key, value).expect("fjall insert");
        self.db.persist(self.mode).expect("fjall persist");
        let got = self.ks.get(key).expect("fjall get").expect("the value");
        assert_eq!(&got[..8], &n.to_le_bytes());
    }
}

async fn raw_round<R: Raw>(raw: &std::sync::Arc<R>, len: usize, round: u64) -> f64 {
    let raw = raw.clone();
    tokio::task::spawn_blocking(move || raw.round(len, round))
        .await
        .expect("a raw B9 round panicked")
}

/// Runs B9 and prints its tables and verdict line (the last line).
pub async fn run() {
    use std::sync::Arc;
    let started = Instant::now();
    println!(
        "B9: checkpoint save + load round through the public store API, one record of ~700 B; \
         {ROUNDS} interleaved rounds of {OPS} rounds per side, warm-up 1 round per side; \
         tokio workers: {}",
        workers()
    );
    let dirs: Vec<TempDir> = [
        "fjall-crash",
        "fjall-power",
        "sled",
        "raw-sled",
        "raw-fjall-buffer",
        "raw-fjall-syncall",
        "raw-sled-power",
    ]
    .iter()
    .map(|t| TempDir::new("b9", t))
    .collect();
    let crash: Client =
        CheckpointActor::spawn_engine(dirs[0].path(), Engine::Fjall(StoreDurability::Crash))
            .await
            .expect("fjall crash store");
    let power: Client =
        CheckpointActor::spawn_engine(dirs[1].path(), Engine::Fjall(StoreDurability::Power))
            .await
            .expect("fjall power store");
    let on_sled: Client = CheckpointActor::spawn(dirs[2].path())
        .await
        .expect("sled store");
    let w = record("b9-00", 0)
        .to_write(agentloop::store::WriteCondition::Always)
        .expect("encoding the B9 record");
    let len = agentloop::store::codec::encode_header(&w.header)
        .expect("encoding the B9 header")
        .len()
        + w.payload_bytes();
    let (p3, p4, p5, p6) = (
        dirs[3].path().to_path_buf(),
        dirs[4].path().to_path_buf(),
        dirs[5].path().to_path_buf(),
        dirs[6].path().to_path_buf(),
    );
    let (raw_sled, raw_buffer, raw_sync, raw_sled_power) = tokio::task::spawn_blocking(move || {
        (
            Arc::new(RawSled::open(&p3, StoreDurability::Crash)),
            Arc::new(RawFjall::open(&p4, fjall::PersistMode::Buffer)),
            Arc::new(RawFjall::open(&p5, fjall::PersistMode::SyncAll)),
            Arc::new(RawSled::open(&p6, StoreDurability::Power)),
        )
    })
    .await
    .expect("opening the raw B9 engines");
    println!("record: {len} B encoded (header, 2 items, {STATE_BYTES} B state)");
    // The price of one hand-off to a blocking thread and back on this machine: the
    // store path's unit of latency (diagnostic).
    let mut hops = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..OPS {
            tokio::task::spawn_blocking(|| ())
                .await
                .expect("an empty blocking job");
        }
        hops.push(micros_per_op(t0.elapsed(), OPS as u64));
    }
    println!(
        "diag: one spawn_blocking round trip {:.1} µs (median of 5 x {OPS})",
        crate::report::median(&hops)
    );

    // Where a save + load's time goes without hand-offs (diagnostic).
    let inline_dir = TempDir::new("b9", "inline");
    let inline_path = inline_dir.path().to_path_buf();
    let (enc, apply, load) = tokio::task::spawn_blocking(move || {
        let engine =
            agentloop::store::Backend::open(&inline_path, Engine::Fjall(StoreDurability::Crash))
                .expect("the inline B9 engine");
        inline_round(&engine, 0);
        let mut v: Vec<(f64, f64, f64)> = (1..=5).map(|r| inline_round(&engine, r)).collect();
        v.sort_by(|a, b| (a.0 + a.1 + a.2).total_cmp(&(b.0 + b.1 + b.2)));
        v[2]
    })
    .await
    .expect("the inline B9 round");
    drop(inline_dir);
    println!(
        "diag: fjall crash without hand-offs, on one thread: encode {enc:.1} µs + apply and \
         flush {apply:.1} µs + load from the head {load:.1} µs = {:.1} µs (median of 5 x {OPS})",
        enc + apply + load
    );

    let mut s: [Vec<f64>; 7] = Default::default();
    for round in 0..=ROUNDS as u64 {
        let mut sides: Vec<usize> = (0..7).collect();
        if round % 2 == 1 {
            sides.reverse();
        }
        for side in sides {
            let v = match side {
                0 => raw_round(&raw_sled, len, round).await,
                1 => agentloop_round(&crash, round).await,
                2 => agentloop_round(&on_sled, round).await,
                3 => raw_round(&raw_buffer, len, round).await,
                4 => agentloop_round(&power, round).await,
                5 => raw_round(&raw_sync, len, round).await,
                _ => raw_round(&raw_sled_power, len, round).await,
            };
            if round > 0 {
                s[side].push(v);
            }
        }
    }
    let stats = crash
        .stats()
        .await
        .expect("the fjall crash store's counters");
    println!(
        "diag: fjall crash store: {} saves, {} waves, {} committer thread wake-ups (the rest \
         were taken while it lingered)",
        stats.saves, stats.waves, stats.wakes
    );
    for c in [crash, power, on_sled] {
        c.close().await.expect("closing a B9 store");
    }
    drop((raw_sled, raw_buffer, raw_sync, raw_sled_power));
    drop(dirs);

    let sum: Vec<_> = s.iter().map(|v| summarize(v)).collect();
    let tables: [(&str, &[(&str, Summary)]); 3] = [
        (
            "B9 save + load round at power (the figure: agentloop on fjall power / raw sled + fsync)",
            &[
                ("baseline: raw sled insert + flush + fsync + get", sum[6]),
                ("agentloop: fjall power, save + load", sum[4]),
            ],
        ),
        (
            "B9 at crash (second line: agentloop on fjall crash / raw sled)",
            &[
                ("baseline: raw sled insert + flush + get", sum[0]),
                ("agentloop: fjall crash, save + load", sum[1]),
            ],
        ),
        (
            "Beside it (not the figure)",
            &[
                ("agentloop: sled power, save + load", sum[2]),
                ("raw fjall insert + persist(Buffer) + get", sum[3]),
                ("raw fjall insert + persist(SyncAll) + get", sum[5]),
            ],
        ),
    ];
    for (title, rows) in tables {
        println!();
        print_table(title, "µs/op", rows);
    }
    println!(
        "agentloop fjall crash / raw fjall Buffer = {:.2}; agentloop fjall power / raw fjall SyncAll = {:.2}; agentloop sled power / raw sled + fsync = {:.2}; B9 wall time {:.1} s",
        sum[1].median / sum[3].median,
        sum[4].median / sum[5].median,
        sum[2].median / sum[6].median,
        started.elapsed().as_secs_f64()
    );
    println!(
        "B9 at crash (second line, not the figure) ratio={:.2}",
        sum[1].median / sum[0].median
    );
    println!();
    println!(
        "{}",
        ratio_line_max("B9", sum[4].median / sum[6].median, TARGET)
    );
}
