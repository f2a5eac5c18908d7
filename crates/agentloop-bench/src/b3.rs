//! B3: checkpoints saved and flushed per second, ~4 KiB of agent state, 64 concurrent
//! stops, against raw sled in the same process and run (DESIGN §10).
//!
//! * Baseline (raw sled): its own sled database in a temp dir; per round, 64 records
//!   (distinct session ids, fresh every round) inserted as one `sled::Batch` followed by
//!   one `db.flush()`, on a blocking thread. Rate = 64 / (batch + flush time). Each
//!   record is written in agentloop's record layout (since issue 30 format 3: one head
//!   key holding header, items and state; `agentloop_core::table::entries_of`) with the same
//!   bytes as a checkpoint agentloop stored in the warm-up round, read back from its
//!   store.
//! * agentloop: one `CheckpointActor` (one sled dir) for the whole run. Per round, 64
//!   persistent sessions (fresh ids) of a simulated agent with a 4 KiB state payload;
//!   each has a turn in flight, parked at its second step after the first safe point
//!   (so its state is recorded). Untimed setup ends there. The timed part: issue
//!   `stop(StopOptions::immediate())` on all 64 at once (one task each) and wait until
//!   all 64 exits are in; every exit must say `CheckpointOutcome::Saved` with the cut
//!   item and mid-turn state. Rate = 64 / that time. Measured for both durability
//!   modes: `Exit` (the stop path writes only the checkpoint) and `Sync` (the default;
//!   the stop also flushes once more to answer pushes waiting for a write).
//! * Not sides of the ratio: raw sled with one flush per save (the same 64 records,
//!   each inserted and flushed on its own: what group commit saves), the actor's
//!   waves per stop round, and the push throughput (acknowledged pushes per second) of
//!   one and of 64 concurrent `Sync` sessions of a no-op agent. Two diagnostics split
//!   the agentloop side in its halves: 64 concurrent `save`s of the same records
//!   straight to the `CheckpointClient` (the store alone), and 64 non-persistent
//!   sessions parked and stopped the same way (the sessions alone).
//!
//! Issue 51: the figure is measured at the store's default level, `power` (agentloop's
//! sled store fsyncs its data file after each flush; the baseline's flush is followed
//! by the same fsync; on fjall both `persist(SyncAll)`), and again at `crash` (flush
//! alone; `persist(Buffer)`) as a second line.
//!
//! The figure is agentloop with `Exit` durability over the baseline; `Sync`'s ratio is
//! printed next to it. All sides run in interleaved rounds (the order reverses every
//! round) after a warm-up round of each; each side's value is the median over rounds.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::store::{CheckpointStats, Engine, StoreDurability, Stored};
use agentloop::{
    exit::CheckpointOutcome, store::CheckpointActor, store::CheckpointClient, CheckpointStore,
    Durability, ExitState, SessionHandle, SessionSpec, StopOptions,
};
use agentloop_core::table;
use agentloop_sim::{Gate, Notice, Script, SimAgent, SimItem, SimStep};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::harness::{mode_name, stats_delta, stop_and_wait, workers, SimHandle};
use crate::report::{median, print_table, summarize};
use crate::tempdir::TempDir;

/// Concurrent stops (and records per baseline batch).
const SESSIONS: usize = 64;
/// Agent state payload per turn.
const STATE_BYTES: usize = 4096;
/// Timed rounds per side (odd, so the median is one round).
const ROUNDS: usize = 31;
/// The target: agentloop ≥ 0.80 × baseline.
const TARGET: f64 = 0.80;
/// Push-throughput measurements (odd; the median is printed).
const PUSH_RUNS: usize = 3;
/// How long one push-throughput measurement runs.
const PUSH_WINDOW: Duration = Duration::from_millis(1500);

type Store = CheckpointClient<SimItem>;

// ---------------------------------------------------------------------------------
// Baseline: raw sled.

/// One stored checkpoint's entries as agentloop's store lays them out (since issue 30
/// format 3: one head holding the header, the items and the state when they fit, as
/// here), each key without its session id: the bytes agentloop wrote for one session.
#[derive(Clone)]
struct Template {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Template {
    fn len(&self) -> usize {
        self.entries.iter().map(|(_, v)| v.len()).sum()
    }

    /// `(key, value)` of every entry of session `id`.
    fn entries(&self, id: &str) -> Vec<(Vec<u8>, &[u8])> {
        self.entries
            .iter()
            .map(|(suffix, v)| {
                let mut key = table::session_prefix(id);
                key.extend_from_slice(suffix);
                (key, v.as_slice())
            })
            .collect()
    }
}

/// The entries agentloop stored for `id` (as its whole-record write lays them out).
async fn template(store: &Store, id: &str) -> Template {
    match store.load_stored(id).await.expect("loading a B3 record") {
        Some(Stored::Current(r)) => {
            let prefix = table::session_prefix(id).len();
            Template {
                entries: table::entries_of(r)
                    .expect("laying out a B3 record")
                    .into_iter()
                    .map(|(k, v)| (k[prefix..].to_vec(), v.to_vec()))
                    .collect(),
            }
        }
        other => panic!("B3: no record stored for {id}: {other:?}"),
    }
}

/// The baseline's engine: raw sled (B3) or raw fjall (B3 on fjall, issue 15), made
/// durable at the level measured.
#[derive(Clone)]
enum RawDb {
    Sled(Arc<crate::raw::RawSled>),
    Fjall {
        db: fjall::Database,
        ks: fjall::Keyspace,
        mode: fjall::PersistMode,
    },
}

impl RawDb {
    /// Writes `entries` of every key in `keys` atomically and makes them durable.
    fn write(&self, template: &Template, keys: &[String]) {
        match self {
            RawDb::Sled(raw) => {
                let mut batch = sled::Batch::default();
                for k in keys {
                    for (key, value) in template.entries(k) {
                        batch.insert(key, value);
                    }
                }
                raw.db.apply_batch(batch).expect("sled apply_batch");
                raw.flush();
            }
            RawDb::Fjall { db, ks, mode } => {
                let mut batch = db.batch();
                for k in keys {
                    for (key, value) in template.entries(k) {
                        batch.insert(ks, key, value);
                    }
                }
                batch.commit().expect("fjall batch commit");
                db.persist(*mode).expect("fjall persist");
            }
        }
    }
}

struct RawSled {
    db: RawDb,
    template: Arc<Template>,
    next_key: u64,
}

impl RawSled {
    fn open(dir: &Path, template: Template, engine: Engine) -> Self {
        let db = match engine {
            Engine::Fjall(level) => {
                let (db, ks) = crate::raw::open_fjall(dir, "sessions");
                let mode = match level {
                    StoreDurability::Crash => fjall::PersistMode::Buffer,
                    StoreDurability::Power => fjall::PersistMode::SyncAll,
                };
                RawDb::Fjall { db, ks, mode }
            }
            Engine::Sled(level) => RawDb::Sled(Arc::new(crate::raw::RawSled::wrap(
                sled::Config::new()
                    .path(dir)
                    .open()
                    .expect("opening the baseline sled db"),
                dir,
                level,
            ))),
        };
        RawSled {
            db,
            template: Arc::new(template),
            next_key: 0,
        }
    }

    fn keys(&mut self) -> Vec<String> {
        let keys = (self.next_key..self.next_key + SESSIONS as u64)
            .map(|k| format!("b3-raw-{k:08}"))
            .collect();
        self.next_key += SESSIONS as u64;
        keys
    }

    /// One round: 64 inserts as one batch, one flush. Returns records per second.
    async fn batch_round(&mut self) -> f64 {
        let (db, template, keys) = (self.db.clone(), self.template.clone(), self.keys());
        tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            db.write(&template, &keys);
            keys.len() as f64 / t0.elapsed().as_secs_f64()
        })
        .await
        .expect("the baseline blocking job panicked")
    }

    /// One round: 64 inserts, each followed by its own flush. Returns records per second.
    async fn per_save_round(&mut self) -> f64 {
        let (db, template, keys) = (self.db.clone(), self.template.clone(), self.keys());
        tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            for k in &keys {
                db.write(&template, std::slice::from_ref(k));
            }
            keys.len() as f64 / t0.elapsed().as_secs_f64()
        })
        .await
        .expect("the per-save blocking job panicked")
    }
}

// ---------------------------------------------------------------------------------
// agentloop: 64 concurrent stops through the CheckpointActor.

/// Two zero-latency steps: the first ends at a safe point (state recorded), the second
/// waits at its gate, so the turn is in flight with mid-turn state when it is stopped.
fn two_step_script() -> Script {
    Script {
        steps: vec![
            SimStep::ModelCall {
                latency: Duration::ZERO,
                input_tokens: 1,
            },
            SimStep::ToolRound {
                latency: Duration::ZERO,
                calls: 1,
            },
        ],
    }
}

/// The figure's agent: the two-step script and a 4 KiB state, its steps held at a gate
/// that lets the first pass (so the second waits), reporting to `probe`.
fn parked_agent(probe: &mpsc::UnboundedSender<Notice>) -> SimAgent {
    let gate = Gate::new();
    gate.open(1); // the first step passes; the second waits
    SimAgent::new(two_step_script())
        .with_state_payload(STATE_BYTES)
        .with_step_gate(gate)
        .with_probe(probe.clone())
}

/// Waits until `SESSIONS` turns reported on `probe` began their second step: each is
/// parked at its gate after its first safe point.
async fn wait_parked(mut probe: mpsc::UnboundedReceiver<Notice>) {
    let mut parked = 0;
    while parked < SESSIONS {
        match probe.recv().await {
            Some(Notice::StepBegin { step: 1, .. }) => parked += 1,
            Some(_) => {}
            None => panic!("a B3 session ended before its turn was parked"),
        }
    }
}

/// Stops every session at once (`StopOptions::immediate()`, one task each) and returns
/// their exits as they come in.
async fn stop_immediately(handles: Vec<SimHandle>) -> Vec<ExitState<SimItem>> {
    let mut set = JoinSet::new();
    for h in handles {
        set.spawn(async move {
            stop_and_wait(&h, StopOptions::immediate(), "stopping a B3 session").await
        });
    }
    let mut exits = Vec::with_capacity(SESSIONS);
    while let Some(exit) = set.join_next().await {
        exits.push(exit.expect("a B3 stop task panicked"));
    }
    exits
}

/// The result of one stop round.
struct StopRound {
    /// Checkpoints per second.
    rate: f64,
    /// The actor's counters over the timed part.
    waves: u64,
    ops: u64,
}

async fn stats(store: &Store) -> CheckpointStats {
    store.stats().await.expect("the checkpoint actor is gone")
}

struct Agentloop {
    store: Store,
    round: u64,
}

impl Agentloop {
    /// Spawns 64 sessions with a turn parked after its first safe point.
    async fn setup(&mut self, durability: Durability) -> Vec<SimHandle> {
        let round = self.round;
        self.round += 1;
        let before = stats(&self.store).await;
        let (probe_tx, probe_rx) = mpsc::unbounded_channel();
        let dyn_store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(self.store.clone());
        let mut handles = Vec::with_capacity(SESSIONS);
        for s in 0..SESSIONS {
            let agent = parked_agent(&probe_tx);
            let id = format!("b3-{}-r{round:04}-s{s:02}", mode_name(durability));
            let config = SessionSpec::new(id, "default")
                .kind("sim")
                .persistent(true)
                .durability(durability);
            let h = SessionHandle::spawn(config, Arc::new(agent), Some(dyn_store.clone()))
                .await
                .expect("spawning a B3 session");
            h.push(SimItem::new(s as u64, "b3"))
                .await
                .expect("pushing the B3 item");
            handles.push(h);
        }
        drop(probe_tx);
        wait_parked(probe_rx).await;
        if durability == Durability::Sync {
            // Let the safe-point writes (one per session, after the push's) land
            // before the timed part, so it measures only the stops.
            let want = before.saves + 2 * SESSIONS as u64;
            let deadline = Instant::now() + Duration::from_secs(10);
            while stats(&self.store).await.saves < want {
                assert!(
                    Instant::now() < deadline,
                    "the B3 sync sessions' safe-point writes never arrived"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            self.store.flush().await.expect("flushing before the stops");
        }
        handles
    }

    /// One round: 64 concurrent immediate stops, timed until every exit is in.
    async fn stop_round(&mut self, durability: Durability) -> StopRound {
        let handles = self.setup(durability).await;
        let before = stats(&self.store).await;
        let t0 = Instant::now();
        let exits = stop_immediately(handles).await;
        let elapsed = t0.elapsed();
        let d = stats_delta(&stats(&self.store).await, &before);
        for e in &exits {
            assert_eq!(
                e.checkpoint,
                CheckpointOutcome::Saved,
                "B3 session {} did not save its checkpoint: {:?}",
                e.session_id,
                e.reason
            );
            assert!(
                e.has_mid_turn_state && e.interrupted_items.len() == 1,
                "B3 session {} should have been cut mid-turn with its item",
                e.session_id
            );
        }
        assert_eq!(
            d.saves, SESSIONS as u64,
            "expected one save per stop in the timed part"
        );
        StopRound {
            rate: SESSIONS as f64 / elapsed.as_secs_f64(),
            waves: d.waves,
            ops: d.ops,
        }
    }
}

// ---------------------------------------------------------------------------------
// Diagnostics: the two halves of the agentloop side.

/// 64 concurrent `save`s straight to the CheckpointClient (no sessions), each a record
/// like a stopped session's (4 KiB state, one interrupted item). Returns checkpoints
/// per second and the waves they took.
async fn direct_saves_round(store: &Store, round: u64) -> (f64, u64) {
    let state = vec![0xA5u8; STATE_BYTES];
    let recs: Vec<_> = (0..SESSIONS)
        .map(|s| {
            let mut r = agentloop::store::SessionRecord::new(
                format!("b3-direct-r{round:04}-s{s:02}"),
                "sim",
                0,
            );
            r.interrupted_items = vec![SimItem::new(s as u64, "b3")];
            r.state = Some(state.clone());
            r
        })
        .collect();
    let before = stats(store).await;
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for r in recs {
        set.spawn(store.save(r));
    }
    while let Some(r) = set.join_next().await {
        r.expect("a save task panicked")
            .expect("a direct save failed");
    }
    let rate = SESSIONS as f64 / t0.elapsed().as_secs_f64();
    let d = stats_delta(&stats(store).await, &before);
    (rate, d.waves)
}

/// 64 non-persistent sessions parked like the figure's, stopped the same way: the
/// session side of a stop without any store work. Stops / s.
async fn no_store_round(round: u64) -> f64 {
    let (probe_tx, probe_rx) = mpsc::unbounded_channel();
    let mut handles = Vec::with_capacity(SESSIONS);
    for s in 0..SESSIONS {
        let agent = parked_agent(&probe_tx);
        let config = SessionSpec::new(format!("b3-nostore-r{round:04}-s{s:02}"), "default");
        let h: SimHandle = SessionHandle::spawn(config, Arc::new(agent), None)
            .await
            .expect("spawning a B3 session");
        h.push(SimItem::new(s as u64, "b3")).await.expect("push");
        handles.push(h);
    }
    drop(probe_tx);
    wait_parked(probe_rx).await;
    let t0 = Instant::now();
    for e in stop_immediately(handles).await {
        assert_eq!(e.interrupted_items.len(), 1);
    }
    SESSIONS as f64 / t0.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------
// Push throughput of `Sync` sessions (acknowledged pushes per second).

async fn spawn_noop_sync(store: &Store, id: String) -> SimHandle {
    let dyn_store: Arc<dyn CheckpointStore<SimItem>> = Arc::new(store.clone());
    let config = SessionSpec::new(id, "default")
        .kind("sim")
        .persistent(true)
        .durability(Durability::Sync);
    SessionHandle::spawn(
        config,
        Arc::new(SimAgent::new(Script::noop())),
        Some(dyn_store),
    )
    .await
    .expect("spawning a push-throughput session")
}

/// Sequential `push().await` for `window`; returns acknowledged pushes.
async fn push_for(h: SimHandle, window: Duration) -> u64 {
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < window {
        h.push(SimItem::new(n, "p"))
            .await
            .expect("a sync push failed");
        n += 1;
    }
    let exit = stop_and_wait(&h, StopOptions::bare(), "stopping a push session").await;
    assert_eq!(
        exit.counters.items_accepted, n,
        "every acked push was accepted"
    );
    n
}

/// `sessions` sync sessions each pushing in its own task; acknowledged pushes / s.
async fn push_throughput(store: &Store, tag: &str, sessions: usize, window: Duration) -> f64 {
    let mut handles = Vec::with_capacity(sessions);
    for s in 0..sessions {
        handles.push(spawn_noop_sync(store, format!("b3-push-{tag}-s{s:02}")).await);
    }
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for h in handles {
        set.spawn(push_for(h, window));
    }
    let mut acked = 0;
    while let Some(n) = set.join_next().await {
        acked += n.expect("a push task panicked");
    }
    // The window is per task; the last task may overrun it by one push.
    acked as f64 / t0.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------

/// The verdict line of a ratio figure whose target is a lower bound.
fn ratio_line_min(id: &str, ratio: f64, target: f64) -> String {
    let verdict = if ratio >= target { "ok" } else { "FAIL" };
    format!("{id} ratio={ratio:.2} target>={target:.2} {verdict}")
}

#[derive(Default)]
struct Samples {
    base: Vec<f64>,
    per_save: Vec<f64>,
    exit: Vec<f64>,
    sync: Vec<f64>,
    exit_waves: Vec<f64>,
    exit_wave_size: Vec<f64>,
    sync_waves: Vec<f64>,
    sync_wave_size: Vec<f64>,
    direct: Vec<f64>,
    direct_waves: Vec<f64>,
    no_store: Vec<f64>,
}

impl Samples {
    fn record_direct(&mut self, (rate, waves): (f64, u64)) {
        self.direct.push(rate);
        self.direct_waves.push(waves as f64);
    }

    fn record(&mut self, mode: Durability, r: StopRound) {
        let size = r.ops as f64 / r.waves as f64;
        match mode {
            Durability::Exit => {
                self.exit.push(r.rate);
                self.exit_waves.push(r.waves as f64);
                self.exit_wave_size.push(size);
            }
            // (the harness measures `exit` and `sync` only)
            Durability::Sync | Durability::Turn => {
                self.sync.push(r.rate);
                self.sync_waves.push(r.waves as f64);
                self.sync_wave_size.push(size);
            }
        }
    }
}

/// Runs B3 and prints its tables and verdict line (the last line): the figure at
/// `power` (the default), then the same at `crash`.
pub async fn run() {
    both("B3", Engine::Sled(StoreDurability::Power)).await
}

/// Runs B3 on fjall against raw fjall with one persist per batch of 64 (issue 15), with
/// the same sides and diagnostics, at `power` (`SyncAll`) and at `crash` (`Buffer`).
pub async fn run_fjall() {
    both("B3f", Engine::Fjall(StoreDurability::Power)).await
}

async fn both(id: &str, engine: Engine) {
    let power = run_on(engine.at(StoreDurability::Power)).await;
    let crash = run_on(engine.at(StoreDurability::Crash)).await;
    println!();
    println!("{id} at crash (second line, not the figure) ratio={crash:.2}");
    println!("{}", ratio_line_min(id, power, TARGET));
}

/// B3 on `engine` at its level, both sides; prints the tables and returns the ratio.
async fn run_on(engine: Engine) -> f64 {
    let started = Instant::now();
    let fjall = matches!(engine, Engine::Fjall(_));
    let (id, raw_name) = match engine {
        Engine::Fjall(StoreDurability::Crash) => {
            ("B3f", "raw fjall, batch of 64 + 1 persist(Buffer)")
        }
        Engine::Fjall(StoreDurability::Power) => {
            ("B3f", "raw fjall, batch of 64 + 1 persist(SyncAll)")
        }
        Engine::Sled(StoreDurability::Crash) => ("B3", "raw sled, batch of 64 + 1 flush"),
        Engine::Sled(StoreDurability::Power) => ("B3", "raw sled, batch of 64 + 1 flush + fsync"),
    };
    println!(
        "{id}: checkpoints saved and flushed per second, {STATE_BYTES} B state, {SESSIONS} \
         concurrent stops, engine {engine}; {ROUNDS} interleaved rounds per side, warm-up 1 \
         round per side; tokio workers: {}",
        workers()
    );
    let al_dir = TempDir::new("b3", "agentloop");
    let raw_dir = TempDir::new("b3", "raw");
    let store: Store = CheckpointActor::<SimItem>::spawn_engine(al_dir.path(), engine)
        .await
        .expect("starting the checkpoint actor");
    let mut al = Agentloop {
        store: store.clone(),
        round: 0,
    };

    // Warm-up of the agentloop sides; it also stores the record the baseline copies.
    al.stop_round(Durability::Exit).await;
    al.stop_round(Durability::Sync).await;
    // The warm-up's first Exit round (round 0) left its stopped sessions' records.
    let template = template(
        &store,
        &format!("b3-{}-r0000-s00", mode_name(Durability::Exit)),
    )
    .await;
    let record_len = template.len();
    let entries = template.entries("x").len();
    let raw_path = raw_dir.path().to_path_buf();
    let mut raw = tokio::task::spawn_blocking(move || RawSled::open(&raw_path, template, engine))
        .await
        .expect("opening the baseline db panicked");
    raw.batch_round().await;
    raw.per_save_round().await;
    direct_saves_round(&store, u64::MAX).await;
    no_store_round(u64::MAX).await;
    println!(
        "record size: {record_len} B in {entries} entries (agentloop's stored checkpoint, format 3; the baseline writes the same keys and bytes)"
    );

    let mut s = Samples::default();
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            s.base.push(raw.batch_round().await);
            s.per_save.push(raw.per_save_round().await);
            let r = al.stop_round(Durability::Exit).await;
            s.record(Durability::Exit, r);
            let r = al.stop_round(Durability::Sync).await;
            s.record(Durability::Sync, r);
            s.record_direct(direct_saves_round(&store, round as u64).await);
            s.no_store.push(no_store_round(round as u64).await);
        } else {
            s.no_store.push(no_store_round(round as u64).await);
            s.record_direct(direct_saves_round(&store, round as u64).await);
            let r = al.stop_round(Durability::Sync).await;
            s.record(Durability::Sync, r);
            let r = al.stop_round(Durability::Exit).await;
            s.record(Durability::Exit, r);
            s.per_save.push(raw.per_save_round().await);
            s.base.push(raw.batch_round().await);
        }
    }
    let total_stats = stats(&store).await;

    // Push throughput of sync sessions (not a side of the ratio).
    let mut one = Vec::new();
    let mut many = Vec::new();
    for run in 0..PUSH_RUNS {
        one.push(push_throughput(&store, &format!("one-{run}"), 1, PUSH_WINDOW).await);
        many.push(push_throughput(&store, &format!("many-{run}"), SESSIONS, PUSH_WINDOW).await);
    }

    store.close().await.expect("closing the checkpoint actor");
    drop(raw);
    drop((al_dir, raw_dir));

    let base_s = summarize(&s.base);
    let exit_s = summarize(&s.exit);
    let sync_s = summarize(&s.sync);
    let per_save_s = summarize(&s.per_save);
    println!();
    print_table(
        &format!(
            "{id} checkpoints saved and flushed per second (higher is better; the figure: Exit)"
        ),
        "ckpt/s",
        &[
            (&format!("baseline: {raw_name}"), base_s),
            ("agentloop: 64 stops, Durability::Exit", exit_s),
            ("agentloop: 64 stops, Durability::Sync", sync_s),
        ],
    );
    println!();
    print_table(
        "Not sides of the ratio",
        "per s",
        &[
            (
                if fjall {
                    "raw fjall, 1 persist per save"
                } else {
                    "raw sled, 1 flush per save"
                },
                per_save_s,
            ),
            ("diag: 64 saves straight to the actor", summarize(&s.direct)),
            ("diag: 64 stops, not persistent", summarize(&s.no_store)),
        ],
    );
    println!();
    println!(
        "group commit on the raw engine: batch of 64 + 1 flush = {:.1} x one flush per save",
        base_s.median / per_save_s.median
    );
    println!(
        "CheckpointActor waves per round (median): Exit stops {} ({:.1} ops/wave), Sync stops {} ({:.1} ops/wave; 64 saves + 64 flushes), direct saves {}",
        median(&s.exit_waves),
        median(&s.exit_wave_size),
        median(&s.sync_waves),
        median(&s.sync_wave_size),
        median(&s.direct_waves)
    );
    println!(
        "CheckpointActor totals before the push runs: saves={} waves={} ops={} max_wave={} bytes={}",
        total_stats.saves,
        total_stats.waves,
        total_stats.ops,
        total_stats.max_wave,
        total_stats.bytes
    );
    println!(
        "sync push throughput, 1 session (sequential push().await, no-op agent): {:.0} acked pushes/s (median of {PUSH_RUNS} x {} ms)",
        median(&one),
        PUSH_WINDOW.as_millis()
    );
    println!(
        "sync push throughput, {SESSIONS} sessions (one pushing task each): {:.0} acked pushes/s (median of {PUSH_RUNS} x {} ms)",
        median(&many),
        PUSH_WINDOW.as_millis()
    );
    println!(
        "Sync-mode ratio (not the figure)={:.2}; {id} at {} wall time {:.1} s",
        sync_s.median / base_s.median,
        engine.durability(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "{id} at {}: ratio={:.2}",
        engine.durability(),
        exit_s.median / base_s.median
    );
    exit_s.median / base_s.median
}

#[cfg(test)]
mod tests {
    use super::ratio_line_min;

    #[test]
    fn verdict_line() {
        assert_eq!(
            ratio_line_min("B3", 0.804, 0.80),
            "B3 ratio=0.80 target>=0.80 ok"
        );
        assert_eq!(
            ratio_line_min("B3", 0.79, 0.80),
            "B3 ratio=0.79 target>=0.80 FAIL"
        );
    }
}
