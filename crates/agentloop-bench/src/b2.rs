//! B2: spawn 100k idle sessions through the supervisor, against a bare ractor supervisor
//! spawning 100k empty linked children in the same process and run (DESIGN §10, as
//! restated for issue 31: the mechanism supervision needs is the baseline). Two targets:
//! time per spawn ≤ 1.25 × the baseline's, and ≤ 12 KiB of RSS per idle session (with
//! and without the `cluster` feature: build the harness alone for the one, with
//! `--features agentloop/cluster` for the other).
//!
//! * Baseline: a bare ractor supervisor (an actor that, on request, spawns an empty
//!   actor linked under itself and answers with its ref), asked `N` times in sequence;
//!   the harness keeps each child's `ActorRef`.
//! * Diagnostic: `Actor::spawn` of an actor with unit state that does nothing, `N` times
//!   in sequence (a raw unlinked spawn, the figure's baseline before issue 31).
//! * agentloop: a fresh `SupervisorHandle` (no store) per round with one agent kind,
//!   `"sim"` (`SimAgent` with `Script::noop()`); `supervisor.spawn_batch(specs)` with
//!   `N / 1000` batches of 1 000 `SessionSpec::new(id, "sim")` in sequence
//!   (non-persistent, no items: idle sessions); the harness keeps each `SessionHandle`.
//!   The specs are built before the clock starts. Issue 14: a supervisor's
//!   request/reply alone costs about 2 × a raw spawn, so the figure is the batch.
//! * Reported beside it (diagnostic): the same through `supervisor.spawn(spec)`, one
//!   request per session.
//! * Diagnostic side (not the figure), to split the cost: `SessionHandle::spawn` of the
//!   same agent with no supervisor (the session's own share).
//!
//! Each side of a round: release the allocator's free memory to the kernel
//! (`malloc_trim(0)` on glibc), read VmRSS, spawn `N` (timed: the spawn calls only),
//! wait until every actor has finished `post_start` (status `Running`), read VmRSS
//! again (RSS per unit = the difference / `N`), then stop everything and wait until it
//! ended (agentloop: `stop_all(StopOptions::bare())`, every exit checked), release free
//! memory again and read the residue (≈ 0 when the side gave everything back). The
//! sides run one after the other, never together, in an order that reverses every
//! round; each side's value is the median over rounds.
//!
//! The figure has the client on the thread that runs `main` (like B1); a second set of
//! rounds runs the same client as a task on the runtime's workers (diagnostic).
//! `B2_ONLY=<part of a side's label>` runs only the matching sides, for profiling one
//! (its verdict lines then mean nothing).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::{
    supervisor::agent_kind, supervisor::AgentKind, supervisor::RestartBudget,
    supervisor::MAX_SPAWN_BATCH, ExitReason, SessionHandle, SessionSpec, StopOptions,
    SupervisorArgs, SupervisorHandle,
};
use agentloop_sim::{Script, SimAgent, SimEvent, SimItem};
use ractor::{Actor, ActorProcessingErr, ActorRef, ActorStatus, RpcReplyPort, SupervisionEvent};

use crate::harness::{micros_per_op, ms, workers, Holder, SimHandle};
use crate::report::{median, print_table, ratio_line_max, summarize, Summary};

/// Spawns per side per round.
const N: usize = 100_000;
/// Rounds of the figure (client on the main thread; odd, so the median is one round).
const ROUNDS: usize = 5;
/// Rounds of the diagnostic placement (client as a runtime task).
const DIAG_ROUNDS: usize = 3;
/// The time target: agentloop ≤ 1.25 × the bare supervisor (DESIGN §10).
const TARGET: f64 = 1.25;
/// The memory target: RSS per idle session, KiB.
const RSS_TARGET_KIB: f64 = 12.0;

// ---------------------------------------------------------------------------------
// Memory: VmRSS, and handing free heap pages back to the kernel between sides.

/// The process's resident set size in KiB (`VmRSS` of `/proc/self/status`).
pub(crate) fn rss_kib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    parse_vm_rss(&status).expect("no VmRSS line in /proc/self/status")
}

fn parse_vm_rss(status: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let value: f64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => Some(value),
        _ => None,
    }
}

/// Returns the allocator's free pages (in every arena) to the kernel, so a side's RSS
/// growth is not hidden by memory the previous side freed but the allocator kept.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn release_free_memory() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::os::raw::c_int;
    }
    // SAFETY: glibc's `malloc_trim` takes no pointers and only releases free memory.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() {}

/// Waits until `ready(i)` holds for every `i < n` (checked in order, sleeping 1 ms
/// whenever the next one is not ready yet).
async fn settle(n: usize, ready: impl Fn(usize) -> bool) -> Duration {
    let t0 = Instant::now();
    let mut i = 0;
    while i < n {
        if ready(i) {
            i += 1;
        } else {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "B2: spawned actors never all started"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    t0.elapsed()
}

/// One side's measurement in one round.
#[derive(Clone, Copy, Debug)]
struct SideRound {
    /// µs per spawn call.
    us_per_spawn: f64,
    /// KiB of RSS per live unit.
    kib_per_unit: f64,
    /// KiB per unit still resident after everything stopped (leak check).
    residue_kib_per_unit: f64,
    /// ms from the last spawn until every actor ran its `post_start`.
    settle_ms: f64,
}

fn side_round(n: usize, spawn: Duration, settled: Duration, rss: [f64; 3]) -> SideRound {
    SideRound {
        us_per_spawn: micros_per_op(spawn, n as u64),
        kib_per_unit: (rss[1] - rss[0]) / n as f64,
        residue_kib_per_unit: (rss[2] - rss[0]) / n as f64,
        settle_ms: ms(settled),
    }
}

// ---------------------------------------------------------------------------------
// Diagnostic: raw ractor spawns of an empty actor (`Holder<()>`, unlinked).

async fn raw_spawn_side(n: usize) -> SideRound {
    let mut actors = Vec::with_capacity(n);
    release_free_memory();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    for _ in 0..n {
        actors.push(
            Actor::spawn(None, Holder::<()>::new(), ())
                .await
                .expect("spawning an empty actor"),
        );
    }
    let spawn = t0.elapsed();
    let settled = settle(n, |i| actors[i].0.get_status() == ActorStatus::Running).await;
    let rss1 = rss_kib();
    for (a, _) in &actors {
        a.stop(None);
    }
    for (_, join) in actors {
        join.await.expect("an empty actor's task failed");
    }
    release_free_memory();
    let rss2 = rss_kib();
    side_round(n, spawn, settled, [rss0, rss1, rss2])
}

// ---------------------------------------------------------------------------------
// agentloop: idle sessions through the supervisor (and, diagnostic, without it).

fn sim_kinds() -> HashMap<String, Arc<dyn AgentKind<SimItem, SimEvent>>> {
    let mut kinds = HashMap::new();
    kinds.insert(
        "sim".to_string(),
        agent_kind("sim", |_cfg: &[u8]| Ok(SimAgent::new(Script::noop()))),
    );
    kinds
}

fn ids(round: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("b2-{round}-{i:06}")).collect()
}

fn check_exits(exits: &[agentloop::ExitState<SimItem>], n: usize) {
    assert_eq!(
        exits.len(),
        n,
        "B2: stop_all should return one exit per session"
    );
    for e in exits {
        assert!(
            matches!(e.reason, ExitReason::Completed),
            "B2 session {} ended {:?}",
            e.session_id,
            e.reason
        );
    }
}

/// The sessions through the supervisor: one `spawn` request per session, or (the
/// figure) `spawn_batch` requests of [`MAX_SPAWN_BATCH`] specs each.
async fn supervisor_side(n: usize, round: &str, batched: bool) -> SideRound {
    let supervisor = SupervisorHandle::<SimItem, SimEvent>::start(SupervisorArgs {
        kinds: sim_kinds(),
        store: None,
        owner: None,
        budget: RestartBudget::default(),
        heartbeat: agentloop::store::DEFAULT_HEARTBEAT,
        metrics: None,
        limits: Default::default(),
    })
    .await
    .expect("starting the B2 supervisor");
    let ids = ids(round, n);
    let mut handles: Vec<SimHandle> = Vec::with_capacity(n);
    let mut batches: Vec<Vec<SessionSpec<SimItem>>> = Vec::new();
    let mut singles: Vec<SessionSpec<SimItem>> = Vec::new();
    let specs = ids.into_iter().map(|id| SessionSpec::new(id, "sim"));
    if batched {
        let mut specs = specs.peekable();
        while specs.peek().is_some() {
            batches.push(specs.by_ref().take(MAX_SPAWN_BATCH).collect());
        }
    } else {
        singles.extend(specs);
    }
    release_free_memory();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    for batch in batches {
        for spawned in supervisor.spawn_batch(batch).await {
            handles.push(spawned.expect("spawning a B2 session in a batch"));
        }
    }
    for spec in singles {
        handles.push(supervisor.spawn(spec).await.expect("spawning a B2 session"));
    }
    let spawn = t0.elapsed();
    let settled = settle(n, |i| {
        handles[i].actor().get_status() == ActorStatus::Running
    })
    .await;
    let rss1 = rss_kib();
    let exits = supervisor.stop_all(StopOptions::bare()).await;
    check_exits(&exits, n);
    drop(exits);
    drop(handles);
    // The supervisor forgets each session when its termination arrives; drain those,
    // then stop it.
    supervisor
        .actor()
        .drain_and_wait(Some(Duration::from_secs(60)))
        .await
        .expect("stopping the B2 supervisor");
    release_free_memory();
    let rss2 = rss_kib();
    side_round(n, spawn, settled, [rss0, rss1, rss2])
}

async fn direct_side(n: usize, round: &str) -> SideRound {
    let ids = ids(round, n);
    let mut handles: Vec<SimHandle> = Vec::with_capacity(n);
    release_free_memory();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    for id in ids {
        let agent = Arc::new(SimAgent::new(Script::noop()));
        handles.push(
            SessionHandle::spawn(SessionSpec::new(id, "default"), agent, None)
                .await
                .expect("spawning a B2 session directly"),
        );
    }
    let spawn = t0.elapsed();
    let settled = settle(n, |i| {
        handles[i].actor().get_status() == ActorStatus::Running
    })
    .await;
    let rss1 = rss_kib();
    for h in &handles {
        h.stop(StopOptions::bare())
            .await
            .expect("stopping a B2 session");
    }
    let mut exits = Vec::with_capacity(n);
    for h in &handles {
        exits.push(h.wait().await);
    }
    check_exits(&exits, n);
    drop(exits);
    drop(handles);
    release_free_memory();
    let rss2 = rss_kib();
    side_round(n, spawn, settled, [rss0, rss1, rss2])
}

// ---------------------------------------------------------------------------------
// Diagnostic: the bare mechanism of a spawn through a supervisor: a ractor actor that,
// on request, spawns an empty actor linked under itself and answers with its ref.

enum BareSupMsg {
    Spawn(RpcReplyPort<ActorRef<()>>),
}

agentloop::local_message!(BareSupMsg);

struct BareSupervisor;

impl Actor for BareSupervisor {
    type Msg = BareSupMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BareSupMsg::Spawn(reply) => {
                let (child, _join) =
                    Actor::spawn_linked(None, Holder::<()>::new(), (), myself.get_cell()).await?;
                let _ = reply.send(child);
            }
        }
        Ok(())
    }

    /// Children's starts and ends are not the bare supervisor's business (ractor's
    /// default would stop it when a child ends).
    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        _evt: SupervisionEvent,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

async fn bare_supervisor_side(n: usize) -> SideRound {
    let (sup, sup_join) = Actor::spawn(None, BareSupervisor, ())
        .await
        .expect("spawning the bare supervisor");
    let mut children: Vec<ActorRef<()>> = Vec::with_capacity(n);
    release_free_memory();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    for _ in 0..n {
        let (tx, rx) = tokio::sync::oneshot::channel();
        sup.send_message(BareSupMsg::Spawn(RpcReplyPort::from(tx)))
            .unwrap_or_else(|_| panic!("the bare supervisor is gone"));
        children.push(rx.await.expect("the bare supervisor did not answer"));
    }
    let spawn = t0.elapsed();
    let settled = settle(n, |i| children[i].get_status() == ActorStatus::Running).await;
    let rss1 = rss_kib();
    for c in &children {
        c.stop(None);
    }
    settle(n, |i| children[i].get_status() == ActorStatus::Stopped).await;
    sup.stop(None);
    sup_join.await.expect("the bare supervisor's task failed");
    drop(children);
    release_free_memory();
    let rss2 = rss_kib();
    side_round(n, spawn, settled, [rss0, rss1, rss2])
}

// ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Base,
    BareSup,
    Direct,
    Single,
    Batch,
}

const SIDES: [Side; 5] = [
    Side::Base,
    Side::BareSup,
    Side::Direct,
    Side::Single,
    Side::Batch,
];

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Base => "diag: raw ractor spawn, empty actor",
            Side::Batch => "agentloop: supervisor.spawn_batch (1000 per batch)",
            Side::Single => "diag: supervisor.spawn, one request each",
            Side::Direct => "diag: SessionHandle::spawn, no supervisor",
            Side::BareSup => "baseline: bare ractor supervisor, linked empty child",
        }
    }

    async fn run(self, n: usize, round: &str) -> SideRound {
        match self {
            Side::Base => raw_spawn_side(n).await,
            Side::BareSup => bare_supervisor_side(n).await,
            Side::Direct => direct_side(n, round).await,
            Side::Single => supervisor_side(n, round, false).await,
            Side::Batch => supervisor_side(n, round, true).await,
        }
    }
}

/// Per-round measurements of every side, in `SIDES` order.
#[derive(Default)]
struct Samples([Vec<SideRound>; 5]);

impl Samples {
    fn of(&self, side: Side) -> &[SideRound] {
        &self.0[side as usize]
    }
}

/// `rounds` rounds of every side, one side at a time; the order of the sides reverses
/// every round.
async fn rounds(tag: &'static str, rounds: usize) -> Samples {
    let mut s = Samples::default();
    for round in 0..rounds {
        let name = format!("{tag}{round}");
        let mut order = SIDES;
        if round % 2 == 1 {
            order.reverse();
        }
        for side in order {
            // Diagnostic: B2_ONLY=<label substring> runs only the matching sides (for a
            // profile of one side); the verdicts are then meaningless.
            if only().is_some_and(|o| !side.label().contains(o.as_str())) {
                s.0[side as usize].push(side_round(1, Duration::ZERO, Duration::ZERO, [0.0; 3]));
                continue;
            }
            let r = side.run(N, &name).await;
            s.0[side as usize].push(r);
        }
    }
    s
}

/// The `B2_ONLY` diagnostic filter, if set.
fn only() -> Option<String> {
    std::env::var("B2_ONLY").ok()
}

fn col(v: &[SideRound], f: impl Fn(&SideRound) -> f64) -> Vec<f64> {
    v.iter().map(f).collect()
}

fn print_samples(title: &str, s: &Samples) {
    let table = |f: fn(&SideRound) -> f64| -> Vec<(&str, Summary)> {
        SIDES
            .iter()
            .map(|&side| (side.label(), summarize(&col(s.of(side), f))))
            .collect()
    };
    print_table(
        &format!("{title}: time per spawn"),
        "µs/spawn",
        &table(|r| r.us_per_spawn),
    );
    println!();
    print_table(
        &format!("{title}: RSS per live unit"),
        "KiB/unit",
        &table(|r| r.kib_per_unit),
    );
    for side in SIDES {
        let v = s.of(side);
        println!(
            "  {}: settled {:.1} ms after the last spawn; residue after stop {:.3} KiB/unit (medians)",
            side.label(),
            median(&col(v, |r| r.settle_ms)),
            median(&col(v, |r| r.residue_kib_per_unit))
        );
    }
}

/// Runs B2 and prints its tables and verdict lines (the ratio line is the last).
pub async fn run() {
    let started = Instant::now();
    println!(
        "B2: spawn {N} idle sessions through the supervisor vs a bare ractor supervisor spawning {N} linked empty children; \
         {ROUNDS} rounds (client on the main thread) + {DIAG_ROUNDS} (client as a task), \
         sides one at a time, order reversed every round, warm-up {} per side; tokio workers: {}",
        N / 10,
        workers()
    );
    // Warm-up: a small round of each side.
    for side in SIDES {
        if only().is_some_and(|o| !side.label().contains(o.as_str())) {
            continue;
        }
        side.run(N / 10, "warm").await;
    }

    // The figure: the client on the main thread.
    let main_thread = rounds("m", ROUNDS).await;
    // Diagnostic: the same client as a runtime task.
    let on_worker = tokio::spawn(rounds("w", DIAG_ROUNDS))
        .await
        .expect("the diagnostic client task panicked");

    println!();
    print_samples("B2 (the figure: client on the main thread)", &main_thread);
    println!();
    print_samples(
        "Diagnostic, not the figure: the same client as a runtime task",
        &on_worker,
    );
    let time = |s: &Samples, side| median(&col(s.of(side), |r| r.us_per_spawn));
    let base_t = time(&main_thread, Side::BareSup);
    let raw_t = time(&main_thread, Side::Base);
    let sup_t = time(&main_thread, Side::Batch);
    let sup_kib = median(&col(main_thread.of(Side::Batch), |r| r.kib_per_unit));
    println!();
    println!(
        "time ratios to the baseline (the bare supervisor; main-thread client): agentloop (batches) {:.2}, single spawns {:.2}, direct session {:.2}; to a raw unlinked spawn: agentloop (batches) {:.2}, bare supervisor {:.2}",
        sup_t / base_t,
        time(&main_thread, Side::Single) / base_t,
        time(&main_thread, Side::Direct) / base_t,
        sup_t / raw_t,
        base_t / raw_t,
    );
    println!(
        "diagnostic ratio (client as a runtime task)={:.2}; B2 wall time {:.1} s",
        time(&on_worker, Side::Batch) / time(&on_worker, Side::BareSup),
        started.elapsed().as_secs_f64()
    );
    println!();
    println!("{}", rss_line(sup_kib, RSS_TARGET_KIB));
    println!("{}", ratio_line_max("B2", sup_t / base_t, TARGET));
}

/// `B2 rss_per_session=<KiB> target<=12 ok|FAIL`.
fn rss_line(kib: f64, target: f64) -> String {
    let verdict = if kib <= target { "ok" } else { "FAIL" };
    format!("B2 rss_per_session={kib:.2} target<={target} {verdict}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_parsing() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(1234.0));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
    }

    #[test]
    fn rss_verdict_line() {
        assert_eq!(
            rss_line(11.996, 12.0),
            "B2 rss_per_session=12.00 target<=12 ok"
        );
        assert_eq!(
            rss_line(12.5, 12.0),
            "B2 rss_per_session=12.50 target<=12 FAIL"
        );
    }
}
