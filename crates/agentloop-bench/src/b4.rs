//! B4: shutdown of 10k busy sessions (DESIGN §10): a safe point every 10 ms, ≈ 1 KiB of
//! agent state, the sled store in a temp dir. Target: the shutdown report arrives
//! within 250 ms of the last safe point, every session is `Interrupted` in the store
//! and resumable. No baseline.
//!
//! One round (untimed setup, then the measured shutdown, then the checks):
//!
//! * A `Runtime` on a fresh temp dir: `Runtime::builder().store(..)` with a
//!   `CheckpointActor` opened on the directory by the harness, which is exactly what
//!   `.data_dir(dir)` does (the harness keeps the client to read the store's counters
//!   and closes it itself); `flush_logs(None)`; one cleanup hook that only notes when it
//!   ran; one agent kind, `"sim"`: a busy agent that runs the steps of
//!   `Script::react(1000, 10 ms, 10 ms)` exactly as `SimAgent` does (`begin_step`, a
//!   10 ms tokio sleep, `emit`, then `cx.safe_point(..)` with a `SimState` carrying
//!   1 024 B of payload) and, in addition, notes the instant at which a safe point
//!   returned the shutdown's cancel. (A wrapper around `SimAgent` cannot do that: a
//!   `TurnCx<Wrapper>` cannot be handed to `SimAgent::run_turn`, so its step loop is
//!   repeated here.)
//! * 10 000 persistent sessions spawned idle through the supervisor, then one
//!   `push(item).no_wait()` each: every item starts a turn of 2 001 steps (≈ 20 s at 10 ms a
//!   step), so every session is mid-turn and reaches a safe point every 10 ms (or as
//!   often as two vCPUs manage: printed) when the shutdown comes. (Spawning each session
//!   with its item instead makes the later spawns compete with the earlier sessions'
//!   turns: 18 s for the spawns under `exit`, minutes under `sync`.) The harness waits
//!   until all 10 000 turns have started, then lets them run 1 s.
//! * Timed: `runtime.shutdown_handle().shutdown()`, the default `cooperative` strategy
//!   (drain gate, a graceful stop with cause `shutdown` to every session, cut at its
//!   next safe point, grace 30 s, force, cleanup with the store flush), until the
//!   `ShutdownReport` is returned. **The figure is the time from the last session's
//!   cut safe point (the latest instant any agent noted) to the report's arrival.** The
//!   time from the request, the spread of the cuts after it, the report's phases, when
//!   the cleanup hook ran, and the store's pipeline (its counters sampled every 2 ms:
//!   when the final saves were all in, when each wave and flush started) are printed
//!   too. `Runtime::shutdown` then (untimed) stops the supervisor; the harness closes
//!   the store.
//! * Checks: a fresh `CheckpointActor` on the directory lists every record; each must
//!   be `Interrupted` with cause `shutdown`, its item as the cut turn's item, nothing
//!   unhandled, and a decodable mid-turn `SimState` (1 024 B payload, at least one step
//!   done). Then a second `Runtime` starts on the directory (`.data_dir`) with the real
//!   `SimAgent` (its steps held at a closed gate, so the resumed turns wait) and its
//!   `StartReport` must list all 10 000 sessions resumed, 10 000 items, none skipped;
//!   it is stopped with an immediate shutdown stop and must report 10 000 exits, none
//!   failed.
//!
//! Two durability modes of the busy sessions: `Exit` (the figure, 5 rounds: records
//! are written when the sessions end, at the shutdown) and `Sync` (the library's
//! default; a diagnostic, 3 rounds interleaved with the first ones: every safe point
//! also rewrites the session's record, ≈ 1 M writes per second requested at 10 ms, far
//! above what the store sustains on two vCPUs). The figure is the median over its
//! rounds; the verdict also requires every figure round to end with 10 000
//! `Interrupted`, resumable records, 10 000 resumed sessions, no kill and no failed
//! checkpoint.
//!
//! Diagnostic: `B4_EXIT_ONLY=1` skips the sync rounds (to profile the figure's rounds
//! alone, for example under `perf record`); `B4_PERF_MARKS=1` prints each round's
//! request and report instants on `CLOCK_MONOTONIC`, for `perf report --time` on a
//! recording made with `perf record -k CLOCK_MONOTONIC`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentloop::store::{codec, CheckpointStats};
use agentloop::{
    shutdown::CleanupHook, shutdown::ShutdownReport, store::CheckpointActor,
    store::CheckpointClient, store::SessionStatus, turn::Step, Agent, AgentError, CheckpointStore,
    Durability, ExitReason, Runtime, SafePoint, SessionSpec, StopOptions, Turn, TurnCx,
    TurnOutcome,
};
use agentloop_sim::{Gate, Script, SimAgent, SimEvent, SimItem, SimState, SimStep};

use crate::harness::{mode_name, ms, stats_delta, workers};
use crate::report::{median, print_table, summarize};
use crate::tempdir::TempDir;

/// Busy sessions to shut down.
const SESSIONS: usize = 10_000;
/// Agent state payload per session.
const STATE_BYTES: usize = 1024;
/// Each step's latency: one safe point per step.
const STEP: Duration = Duration::from_millis(10);
/// Model/tool rounds per turn: 2 001 steps, ≈ 20 s, far longer than a round.
const SCRIPT_ROUNDS: usize = 1000;
/// How long the sessions run once every turn has started, before the shutdown.
const BUSY: Duration = Duration::from_secs(1);
/// Rounds of the figure (`exit`), odd so the median is one round.
const ROUNDS: usize = 5;
/// Rounds of the `sync` diagnostic, interleaved with the first ones of the figure.
const SYNC_ROUNDS: usize = 3;
/// How often the store's counters are sampled during a shutdown.
const SAMPLE: Duration = Duration::from_millis(2);
/// The target: report ≤ 250 ms after the last safe point.
const TARGET_MS: f64 = 250.0;

fn session_id(i: usize) -> String {
    format!("b4-{i:05}")
}

// ---------------------------------------------------------------------------------
// The busy agent: SimAgent's step loop, plus a note of the safe point that was cut.

/// One session's cut: when its safe point returned the cancel, and its mean time per
/// safe point over the turn.
struct Cut {
    at: Instant,
    per_step: Duration,
}

/// What the busy agents tell the harness.
#[derive(Default)]
struct Probe {
    /// Turns started.
    started: AtomicUsize,
    /// Turns that ran their whole script (none should).
    finished: AtomicUsize,
    /// One entry per turn cut at a safe point.
    cuts: Mutex<Vec<Cut>>,
}

struct BusyAgent {
    script: Arc<Script>,
    probe: Arc<Probe>,
}

impl Agent for BusyAgent {
    type Item = SimItem;
    type Event = SimEvent;
    type State = SimState;

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<SimState>, AgentError> {
        let began = Instant::now();
        let first = turn.resume.as_ref().map_or(0, |s| s.steps_done);
        let mut st = turn.resume.unwrap_or_else(|| SimState {
            turn: turn.index,
            items: turn.items.iter().map(|i| i.id).collect(),
            steps_done: 0,
            payload: vec![0xA5; STATE_BYTES],
        });
        self.probe.started.fetch_add(1, Ordering::Relaxed);
        for (i, step) in self.script.steps.iter().enumerate().skip(first) {
            let (kind, latency) = match *step {
                SimStep::ModelCall {
                    input_tokens,
                    latency,
                } => {
                    cx.begin_step(
                        Step::ModelCall,
                        &[("input_tokens", i64::from(input_tokens))],
                    );
                    (SafePoint::AfterModelCall, latency)
                }
                SimStep::ToolRound { calls, latency } => {
                    cx.begin_step(Step::ToolCalls, &[("calls", i64::from(calls))]);
                    (SafePoint::AfterToolCalls, latency)
                }
            };
            tokio::time::sleep(latency).await;
            cx.emit(SimEvent::StepDone {
                turn: turn.index,
                step: i,
            })
            .await;
            st.steps_done = i + 1;
            if let Err(c) = cx.safe_point(kind, &st) {
                let at = Instant::now();
                let steps = (st.steps_done - first).max(1) as u32;
                self.probe.cuts.lock().expect("probe lock").push(Cut {
                    at,
                    per_step: (at - began) / steps,
                });
                return Err(c.into());
            }
        }
        self.probe.finished.fetch_add(1, Ordering::Relaxed);
        Ok(TurnOutcome::Completed)
    }
}

// ---------------------------------------------------------------------------------
// One round.

/// What one round measured and found.
struct Round {
    spawn: Duration,
    until_busy: Duration,
    /// Request → report (wall clock around the request).
    request_to_report: Duration,
    /// Request → the marker cleanup hook ran (all sessions ended, store flushed).
    hook_ran: Option<Duration>,
    /// Last cut safe point → report: the figure.
    after_last_safe_point: Duration,
    /// Request → first / median / 99th percentile / last cut.
    cuts_after_request: [Duration; 4],
    cuts: usize,
    cuts_before_request: usize,
    finished: usize,
    /// Median and max over sessions of the mean time per safe point.
    per_step: [Duration; 2],
    report: ShutdownReport,
    release: Duration,
    /// The store's counters from the first push to the closed runtime.
    store_stats: CheckpointStats,
    /// The store's pipeline after the request, sampled.
    store_timeline: Timeline,
    store: StoreCheck,
    resume: ResumeCheck,
}

#[derive(Default)]
struct StoreCheck {
    records: usize,
    interrupted: usize,
    /// `Interrupted`, cause `shutdown`, its item cut, a decodable mid-turn state.
    resumable_shape: usize,
    /// Safe points recorded in the saved states (sum of `steps_done`).
    steps_done: u64,
    first_bad: Option<String>,
}

#[derive(Default)]
struct ResumeCheck {
    start: Duration,
    resumed: usize,
    items: usize,
    skipped: usize,
    exits: usize,
    failed: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

async fn round(mode: Durability) -> Round {
    let dir = TempDir::new("b4", mode_name(mode));
    let probe = Arc::new(Probe::default());
    let script = Arc::new(Script::react(SCRIPT_ROUNDS, STEP, STEP));
    // The runtime's `data_dir` does exactly this (a `CheckpointActor` on the directory,
    // as the runtime's store); opened here so the harness can read its counters.
    let client = CheckpointActor::<SimItem>::spawn(dir.path())
        .await
        .expect("opening the B4 store");
    // A cleanup hook that notes when it ran: the grace is over and the store flushed.
    let hook_ran: Arc<Mutex<Option<Instant>>> = Arc::default();
    let (runtime, start) = {
        let (probe, script) = (probe.clone(), script.clone());
        let hook_ran = hook_ran.clone();
        Runtime::<SimItem, SimEvent>::builder()
            .store(Arc::new(client.clone()))
            .flush_logs(None)
            .on_shutdown(CleanupHook::new("b4-marker", move || {
                let hook_ran = hook_ran.clone();
                async move {
                    hook_ran
                        .lock()
                        .expect("marker lock")
                        .get_or_insert(Instant::now());
                    Ok(())
                }
            }))
            .register_agent("sim", move |_cfg: &[u8]| {
                Ok(BusyAgent {
                    script: script.clone(),
                    probe: probe.clone(),
                })
            })
            .start()
            .await
            .expect("starting the B4 runtime")
    };
    assert!(
        start.resumed.is_empty(),
        "B4: a fresh directory resumed sessions"
    );

    // Setup: 10k idle sessions, then one push each starts all the turns.
    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        handles.push(
            runtime
                .supervisor()
                .spawn(
                    SessionSpec::new(session_id(i), "sim")
                        .persistent(true)
                        .durability(mode),
                )
                .await
                .expect("spawning a B4 session"),
        );
    }
    let spawn = t0.elapsed();
    let before = stats(&client).await;
    let t0 = Instant::now();
    for (i, h) in handles.iter().enumerate() {
        h.push(SimItem::new(i as u64, "busy task")).no_wait();
    }
    drop(handles);
    while probe.started.load(Ordering::Relaxed) < SESSIONS {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "B4: only {} of {SESSIONS} turns started",
            probe.started.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let until_busy = t0.elapsed();
    tokio::time::sleep(BUSY).await;

    // Timed: the shutdown, from the request to the report. A sampler reads the store's
    // counters every few ms meanwhile (one small actor message each; under `sync` the
    // answers wait behind the actor's backlog).
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (client, sampling) = (client.clone(), sampling.clone());
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                let s = stats(&client).await;
                samples.push((Instant::now(), s));
                tokio::time::sleep(SAMPLE).await;
            }
            samples
        })
    };
    let handle = runtime.shutdown_handle();
    let requested = Instant::now();
    let report = handle.shutdown().await.expect("the B4 shutdown");
    let reported = Instant::now();
    if std::env::var_os("B4_PERF_MARKS").is_some() {
        // Diagnostic: CLOCK_MONOTONIC instants, for `perf report --time` on a recording
        // made with `perf record -k CLOCK_MONOTONIC`.
        println!("  perf marks: requested {requested:?}, reported {reported:?}");
    }
    sampling.store(false, Ordering::Relaxed);
    let t1 = Instant::now();
    let again = runtime.shutdown().await.expect("releasing the B4 runtime");
    let release = t1.elapsed();
    assert_eq!(again, report, "B4: a second request got another report");
    let after = stats(&client).await;
    client.close().await.expect("closing the B4 store");
    let samples = sampler.await.expect("the B4 sampler panicked");
    let store_timeline = timeline(&samples, &before, requested, mode);
    let store_stats = stats_delta(&after, &before);

    // The cuts.
    let cuts = std::mem::take(&mut *probe.cuts.lock().expect("probe lock"));
    let cuts_before_request = cuts.iter().filter(|c| c.at < requested).count();
    let mut cut_after: Vec<Duration> = cuts
        .iter()
        .map(|c| c.at.saturating_duration_since(requested))
        .collect();
    cut_after.sort_unstable();
    let mut per_step: Vec<Duration> = cuts.iter().map(|c| c.per_step).collect();
    per_step.sort_unstable();
    let last_cut = cuts.iter().map(|c| c.at).max().unwrap_or(requested);

    let hook_ran = hook_ran
        .lock()
        .expect("marker lock")
        .map(|t| t.saturating_duration_since(requested));

    let store = check_store(&dir).await;
    let resume = check_resume(&dir, &script).await;
    drop(dir);
    Round {
        spawn,
        until_busy,
        request_to_report: reported - requested,
        hook_ran,
        after_last_safe_point: reported.saturating_duration_since(last_cut),
        cuts_after_request: [
            cut_after.first().copied().unwrap_or_default(),
            percentile(&cut_after, 0.5),
            percentile(&cut_after, 0.99),
            cut_after.last().copied().unwrap_or_default(),
        ],
        cuts: cuts.len(),
        cuts_before_request,
        finished: probe.finished.load(Ordering::Relaxed),
        per_step: [
            percentile(&per_step, 0.5),
            per_step.last().copied().unwrap_or_default(),
        ],
        report,
        release,
        store_stats,
        store_timeline,
        store,
        resume,
    }
}

/// The store's pipeline during a shutdown, from its counters sampled every
/// [`SAMPLE`] (times after the request).
#[derive(Default)]
struct Timeline {
    /// When all 10 000 final saves had reached the actor (`exit` only: under `sync`
    /// the counter also holds safe-point writes).
    saves_in: Option<Duration>,
    /// When waves started, with the operations they added.
    waves: Vec<(Duration, u64)>,
    /// When flushes started.
    flushes: Vec<Duration>,
}

fn timeline(
    samples: &[(Instant, CheckpointStats)],
    before: &CheckpointStats,
    requested: Instant,
    mode: Durability,
) -> Timeline {
    let mut t = Timeline::default();
    let (mut waves, mut ops, mut flushes) = (None, 0, None);
    for (at, s) in samples {
        let after = at.saturating_duration_since(requested);
        if mode == Durability::Exit
            && t.saves_in.is_none()
            && s.saves >= before.saves + SESSIONS as u64
        {
            t.saves_in = Some(after);
        }
        // The first sample is the base: only changes after it are listed.
        if waves.is_some_and(|w| s.waves > w) {
            t.waves.push((after, s.ops - ops));
        }
        if flushes.is_some_and(|f| s.flushes > f) {
            t.flushes.push(after);
        }
        (waves, ops, flushes) = (Some(s.waves), s.ops, Some(s.flushes));
    }
    t
}

async fn stats(client: &CheckpointClient<SimItem>) -> CheckpointStats {
    client
        .stats()
        .await
        .expect("reading the B4 store's counters")
}

/// Lists the directory's records on a fresh `CheckpointActor` and checks each one.
async fn check_store(dir: &TempDir) -> StoreCheck {
    let client = CheckpointActor::<SimItem>::spawn(dir.path())
        .await
        .expect("opening the B4 store after the shutdown");
    let entries = client.list(None).await.expect("listing the B4 records");
    let mut c = StoreCheck {
        records: entries.len(),
        ..StoreCheck::default()
    };
    for e in entries {
        let rec = match e.record {
            Ok(r) => r,
            Err(err) => {
                c.first_bad
                    .get_or_insert(format!("{}: {err}", e.session_id));
                continue;
            }
        };
        if rec.status != SessionStatus::Interrupted {
            c.first_bad
                .get_or_insert(format!("{}: status {}", rec.session_id, rec.status));
            continue;
        }
        c.interrupted += 1;
        let state = rec
            .state
            .as_deref()
            .map(|b| codec::decode_state::<SimState>(&rec.session_id, b));
        let shape = match &state {
            Some(Ok(s)) => {
                c.steps_done += s.steps_done as u64;
                s.payload.len() == STATE_BYTES
                    && s.steps_done > 0
                    && s.items
                        == rec
                            .interrupted_items
                            .iter()
                            .map(|i| i.id)
                            .collect::<Vec<_>>()
            }
            _ => false,
        };
        if shape
            && rec.stop_cause.as_deref() == Some("shutdown")
            && rec.interrupted_items.len() == 1
            && rec.unhandled_items.is_empty()
        {
            c.resumable_shape += 1;
        } else {
            c.first_bad.get_or_insert(format!(
                "{}: cause {:?}, {} cut items, {} unhandled, state {:?}",
                rec.session_id,
                rec.stop_cause,
                rec.interrupted_items.len(),
                rec.unhandled_items.len(),
                state.map(|s| s.map(|s| (s.steps_done, s.payload.len())))
            ));
        }
    }
    client.close().await.expect("closing the B4 check store");
    c
}

/// Starts a second runtime on the directory with the real `SimAgent` (steps held at a
/// closed gate) and checks that it resumes every session; then stops it.
async fn check_resume(dir: &TempDir, script: &Script) -> ResumeCheck {
    let gate = Gate::new();
    let script = script.clone();
    let t0 = Instant::now();
    let (runtime, report) = Runtime::<SimItem, SimEvent>::builder()
        .data_dir(dir.path())
        .flush_logs(None)
        .register_agent("sim", move |_cfg: &[u8]| {
            Ok(SimAgent::new(script.clone())
                .with_state_payload(STATE_BYTES)
                .with_step_gate(gate.clone()))
        })
        .start()
        .await
        .expect("starting the B4 resume runtime");
    let start = t0.elapsed();
    let exits = runtime
        .stop(StopOptions::immediate().shutdown())
        .await
        .expect("stopping the B4 resume runtime");
    ResumeCheck {
        start,
        resumed: report.resumed.len(),
        items: report.items,
        skipped: report.skipped.len(),
        exits: exits.len(),
        failed: exits
            .iter()
            .filter(|e| matches!(e.reason, ExitReason::Failed(_)))
            .count(),
    }
}

impl Round {
    /// Every session `Interrupted` with a resumable record, all resumed, nothing lost.
    fn complete(&self) -> bool {
        let r = &self.report;
        self.store.records == SESSIONS
            && self.store.interrupted == SESSIONS
            && self.store.resumable_shape == SESSIONS
            && self.resume.resumed == SESSIONS
            && self.resume.items == SESSIONS
            && self.resume.skipped == 0
            && self.resume.exits == SESSIONS
            && self.resume.failed == 0
            && r.sessions.total == SESSIONS as u64
            && r.sessions.killed == 0
            && r.checkpoints.failed == 0
            && r.checkpoints.saved == SESSIONS as u64
            && r.store_flush_error.is_none()
    }

    fn print(&self, mode: Durability, n: usize) {
        let r = &self.report;
        let p = &r.phases;
        let [first, mid, p99, last] = self.cuts_after_request;
        println!(
            "[{} round {n}] {SESSIONS} idle spawns {:.0} ms, then all turns running {:.0} ms after the \
             pushes; safe point every \
             {:.1} ms (median session; slowest {:.1} ms)",
            mode_name(mode),
            ms(self.spawn),
            ms(self.until_busy),
            ms(self.per_step[0]),
            ms(self.per_step[1]),
        );
        println!(
            "  request -> report {:.1} ms; cuts after the request: first {:.1}, median {:.1}, \
             p99 {:.1}, last {:.1} ms ({} cuts, {} before the request, {} turns finished); \
             report {:.1} ms after the last safe point",
            ms(self.request_to_report),
            ms(first),
            ms(mid),
            ms(p99),
            ms(last),
            self.cuts,
            self.cuts_before_request,
            self.finished,
            ms(self.after_last_safe_point),
        );
        println!(
            "  phases: gate {:.1}, grace {:.1}, force {:.1}, cleanup {:.1}, total {:.1} ms; \
             cleanup hook ran {} ms after the request ({} ms after the last safe point, {} ms \
             before the report arrived); release (supervisor + store close) {:.1} ms",
            ms(p.gate),
            ms(p.grace),
            ms(p.force),
            ms(p.cleanup),
            ms(p.total),
            self.hook_ran
                .map_or("-".to_string(), |t| format!("{:.1}", ms(t))),
            self.hook_ran.map_or("-".to_string(), |t| format!(
                "{:.1}",
                ms(t.saturating_sub(last))
            )),
            self.hook_ran.map_or("-".to_string(), |t| format!(
                "{:.1}",
                ms(self.request_to_report.saturating_sub(t))
            )),
            ms(self.release),
        );
        println!(
            "  sessions: total {}, exited in grace {}, forced {}, killed {}; checkpoints: saved \
             {}, failed {}, items saved {}, unsaved {}; late items {}; store flush {}",
            r.sessions.total,
            r.sessions.exited_in_grace,
            r.sessions.forced,
            r.sessions.killed,
            r.checkpoints.saved,
            r.checkpoints.failed,
            r.checkpoints.items_saved,
            r.checkpoints.items_unsaved,
            r.late_items,
            r.store_flush_error.as_deref().unwrap_or("ok"),
        );
        let st = &self.store_stats;
        let tl = &self.store_timeline;
        let waves: Vec<String> = tl
            .waves
            .iter()
            .map(|(t, ops)| format!("{:.0} (+{ops})", ms(*t)))
            .collect();
        let flushes: Vec<String> = tl
            .flushes
            .iter()
            .map(|t| format!("{:.0}", ms(*t)))
            .collect();
        println!(
            "  store from the first push: {} saves, {} waves ({} ops, largest {}), \
             {} flushes, {:.1} MB",
            st.saves,
            st.waves,
            st.ops,
            st.max_wave,
            st.flushes,
            st.bytes as f64 / 1e6,
        );
        println!(
            "  store pipeline (ms after the request, sampled every {} ms): final saves all in by \
             {}; waves started at {}; flushes started at {}",
            SAMPLE.as_millis(),
            tl.saves_in
                .map_or("-".to_string(), |d| format!("{:.0}", ms(d))),
            if waves.is_empty() {
                "-".to_string()
            } else {
                waves.join(", ")
            },
            if flushes.is_empty() {
                "-".to_string()
            } else {
                flushes.join(", ")
            },
        );
        println!(
            "  store: {} records, {} Interrupted, {} with cause shutdown + cut item + mid-turn \
             state ({} safe points in the states); resume: start {:.0} ms, {} resumed, {} items, \
             {} skipped, {} exits ({} failed){}",
            self.store.records,
            self.store.interrupted,
            self.store.resumable_shape,
            self.store.steps_done,
            ms(self.resume.start),
            self.resume.resumed,
            self.resume.items,
            self.resume.skipped,
            self.resume.exits,
            self.resume.failed,
            self.store
                .first_bad
                .as_deref()
                .map(|b| format!("; first bad record: {b}"))
                .unwrap_or_default(),
        );
    }
}

// ---------------------------------------------------------------------------------

/// Runs B4 and prints its rounds, its table and its verdict line (the last line).
pub async fn run() {
    let started = Instant::now();
    println!(
        "B4: shutdown of {SESSIONS} busy sessions (a safe point every {} ms, {STATE_BYTES} B \
         state, sled in a temp dir, cooperative strategy); busy {} s before each shutdown; \
         {ROUNDS} rounds with exit durability (the figure), {SYNC_ROUNDS} with sync (diagnostic), \
         interleaved; tokio workers: {}",
        STEP.as_millis(),
        BUSY.as_secs(),
        workers()
    );
    let mut exit_rounds = Vec::new();
    let mut sync_rounds = Vec::new();
    for n in 0..ROUNDS {
        let mut order = vec![Durability::Exit];
        // Diagnostic: B4_EXIT_ONLY=1 skips the sync rounds (to profile the figure's).
        if n < SYNC_ROUNDS && std::env::var_os("B4_EXIT_ONLY").is_none() {
            order.push(Durability::Sync);
        }
        if n % 2 == 1 {
            order.reverse();
        }
        for mode in order {
            let r = round(mode).await;
            match mode {
                Durability::Exit => {
                    r.print(mode, exit_rounds.len() + 1);
                    exit_rounds.push(r);
                }
                // (the harness measures `exit` and `sync` only)
                Durability::Sync | Durability::Turn => {
                    r.print(mode, sync_rounds.len() + 1);
                    sync_rounds.push(r);
                }
            }
        }
    }

    let col = |rounds: &[Round], f: fn(&Round) -> Duration| {
        summarize(&rounds.iter().map(|r| ms(f(r))).collect::<Vec<_>>())
    };
    println!();
    let sync_row = |label: &'static str, f: fn(&Round) -> Duration| {
        // Absent when the sync rounds were skipped (B4_EXIT_ONLY).
        (!sync_rounds.is_empty()).then(|| (label, col(&sync_rounds, f)))
    };
    let figure_rows: Vec<_> = [(
        "exit: last safe point -> report",
        col(&exit_rounds, |r| r.after_last_safe_point),
    )]
    .into_iter()
    .chain(sync_row("sync: last safe point -> report", |r| {
        r.after_last_safe_point
    }))
    .collect();
    print_table(
        "B4 report after the last safe point (the figure: exit)",
        "ms",
        &figure_rows,
    );
    println!();
    let other_rows: Vec<_> = [
        (
            "exit: request -> report",
            col(&exit_rounds, |r| r.request_to_report),
        ),
        (
            "exit: request -> last safe point",
            col(&exit_rounds, |r| r.cuts_after_request[3]),
        ),
        (
            "exit: report.phases.total",
            col(&exit_rounds, |r| r.report.phases.total),
        ),
    ]
    .into_iter()
    .chain(sync_row("sync: request -> report", |r| r.request_to_report))
    .chain(sync_row("sync: request -> last safe point", |r| {
        r.cuts_after_request[3]
    }))
    .chain(sync_row("sync: report.phases.total", |r| {
        r.report.phases.total
    }))
    .collect();
    print_table("Not the figure", "ms", &other_rows);
    let fig = median(
        &exit_rounds
            .iter()
            .map(|r| ms(r.after_last_safe_point))
            .collect::<Vec<_>>(),
    );
    let req = median(
        &exit_rounds
            .iter()
            .map(|r| ms(r.request_to_report))
            .collect::<Vec<_>>(),
    );
    let complete = exit_rounds.iter().all(Round::complete);
    let sync_complete = sync_rounds.iter().all(Round::complete);
    let interrupted = exit_rounds
        .iter()
        .map(|r| r.store.interrupted)
        .min()
        .unwrap_or(0);
    let resumable = exit_rounds
        .iter()
        .map(|r| r.resume.resumed.min(r.store.resumable_shape))
        .min()
        .unwrap_or(0);
    println!();
    println!(
        "every round complete (all Interrupted, resumable, resumed; no kill, no failed \
         checkpoint): exit {}, sync {}; B4 wall time {:.1} s",
        if complete { "yes" } else { "NO" },
        if sync_complete { "yes" } else { "NO" },
        started.elapsed().as_secs_f64()
    );
    println!();
    let ok = fig <= TARGET_MS && complete;
    println!(
        "B4 shutdown of {SESSIONS} busy sessions: report {req:.0} ms after the request, {fig:.0} \
         ms after the last safe point (target <= {TARGET_MS:.0} ms after the last safe point), \
         {interrupted} Interrupted, {resumable} resumable {}",
        if ok { "ok" } else { "FAIL" }
    );
}
