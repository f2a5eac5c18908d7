//! `agentloop run`, the main job (DESIGN §9): starts the runtime on the sled store
//! (`./agentloop-data` unless the config file or `--data-dir` says otherwise), resumes
//! what the previous run left `Interrupted` and says how much, spawns sessions of the
//! simulated agent and feeds them items, shows live progress, and on Ctrl+C / SIGTERM
//! runs the graceful shutdown (a second signal forces) and prints its report as a
//! table. When every session has delivered its items, it shuts down by itself.
//!
//! Item ids are unique across runs on one data directory: `(run nonce << 32) | (k ×
//! items + i)`, the nonce being the low 32 bits of the run's start time in epoch
//! milliseconds (the run tag in the session ids), so a resumed session's items never
//! collide with a later run's.
//!
//! With `--item-log FILE` the job appends an audit line per event (see [`ItemLog`]);
//! the crash-loop test (`tests/crash_loop.rs`) checks conservation (S10) over it
//! across SIGKILLs (S16a, S31).
//!
//! This file owns the job's flow and its output; the shutdown itself is the library's
//! (`agentloop::shutdown`), the table is in `report_table`.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentloop::config::RuntimeConfig;
use agentloop::shutdown::{listen_for_signals, Signal};
use agentloop::store::{Engine, StoreDurability};
use agentloop::{PushError, Runtime, SessionSpec, StopOptions};
use agentloop_sim::{Script, SimAgent, SimCounters, SimEvent, SimItem};
use serde::{Deserialize, Serialize};

use crate::cli::RunFlags;
use crate::report_table::report_table;

/// Parsed arguments.
pub(crate) struct RunArgs {
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    engine: Option<String>,
    durability: Option<String>,
    item_log: Option<PathBuf>,
    sessions: usize,
    items: u64,
    push_ms: u64,
    agent: AgentConfig,
    /// The versions of kind `sim` to register (S40).
    versions: crate::cli::SimVersions,
}

/// The simulated agent's configuration, stored in each record so a resumed session
/// runs the same agent.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct AgentConfig {
    rounds: usize,
    model_ms: u64,
    tool_ms: u64,
}

impl Default for AgentConfig {
    /// `agentloop run`'s defaults: 2 rounds of a 40 ms model call and a 20 ms tool round.
    fn default() -> Self {
        AgentConfig {
            rounds: 2,
            model_ms: 40,
            tool_ms: 20,
        }
    }
}

impl AgentConfig {
    /// The configuration a session was spawned with: JSON, `{}` or nothing for the
    /// defaults (`agentloop serve` spawns by JSON); missing keys take the defaults.
    /// Refused above `limits` (S34a: the script is built at spawn, so an unbounded
    /// `rounds` would take the process down), naming the key that raises the bound.
    pub(crate) fn from_json(
        bytes: &[u8],
        limits: &agentloop::config::LimitsConfig,
    ) -> Result<Self, String> {
        let c = Self::parse(bytes)?;
        if c.rounds == 0 || c.rounds > limits.sim_rounds {
            return Err(format!(
                "rounds {} is out of range: 1 to {} (the server's [limits] sim_rounds)",
                c.rounds, limits.sim_rounds
            ));
        }
        let step = limits.sim_step.as_millis() as u64;
        for (key, ms) in [("model_ms", c.model_ms), ("tool_ms", c.tool_ms)] {
            if ms > step {
                return Err(format!(
                    "{key} {ms} is out of range: at most {step} (the server's [limits] sim_step, {})",
                    agentloop::config::format_duration(limits.sim_step)
                ));
            }
        }
        Ok(c)
    }

    fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.is_empty() {
            return Ok(AgentConfig::default());
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Partial {
            rounds: Option<usize>,
            model_ms: Option<u64>,
            tool_ms: Option<u64>,
        }
        // The message in JSON's terms, never the Rust type's name (S34a).
        let p: Partial = serde_json::from_slice(bytes).map_err(|e| {
            format!(
                "not a simulated agent configuration ({}): send {{\"rounds\": n, \"model_ms\": ms, \"tool_ms\": ms}}, each optional",
                agentloop_http::plain_serde_message(&e.to_string())
            )
        })?;
        let d = AgentConfig::default();
        Ok(AgentConfig {
            rounds: p.rounds.unwrap_or(d.rounds),
            model_ms: p.model_ms.unwrap_or(d.model_ms),
            tool_ms: p.tool_ms.unwrap_or(d.tool_ms),
        })
    }

    /// The agent as the jobs run it: no ledger (flat memory), tool calls as durable
    /// steps (S1b), and a `turn` line in `log` per completed turn when there is one.
    pub(crate) fn logged_agent(&self, log: Option<&Arc<ItemLog>>) -> SimAgent {
        let agent = self.agent().without_ledger().with_durable_tools();
        match log {
            Some(log) => {
                let log = log.clone();
                agent.with_turn_hook(Arc::new(move |_turn, ids: &[u64]| log.turn(ids)))
            }
            None => agent,
        }
    }

    /// The agent.
    pub(crate) fn agent(&self) -> SimAgent {
        SimAgent::new(Script::react(
            self.rounds,
            Duration::from_millis(self.model_ms),
            Duration::from_millis(self.tool_ms),
        ))
    }
}

impl RunArgs {
    /// The parsed flags, checked: item ids must stay unique across runs. An `Err` is a
    /// usage error (exit 2).
    pub(crate) fn from_flags(f: RunFlags) -> Result<RunArgs, String> {
        let run = RunArgs {
            engine: f.store.engine_name(),
            durability: f.store.durability_name(),
            versions: f.store.versions.clone(),
            config: f.store.config,
            data_dir: f.store.data_dir,
            item_log: f.item_log,
            sessions: f.sessions,
            items: f.items_per_session,
            push_ms: RunFlags::millis(f.push, f.push_ms, 50),
            agent: AgentConfig {
                rounds: f.rounds as usize,
                model_ms: RunFlags::millis(f.model, f.model_ms, 40),
                tool_ms: RunFlags::millis(f.tool, f.tool_ms, 20),
            },
        };
        // Item ids keep the low 32 bits for `k * items + i` (the high ones are the run's).
        if (run.sessions as u64)
            .checked_mul(run.items)
            .is_none_or(|n| n >= 1 << 32)
        {
            return Err(format!(
                "--sessions {} x --items-per-session {} must be below 2^32 (4294967296): item ids \
                 keep 32 bits for the item and 32 for the run, so they stay unique across runs",
                run.sessions, run.items
            ));
        }
        Ok(run)
    }
}

/// The `--item-log` audit file: one line per event, each line one `write(2)` on a file
/// opened for appending, so a line written completely is never torn by a later SIGKILL
/// and lines from the feeders and the turns never interleave. A SIGKILL *during* a
/// write may leave the last line without its newline: readers drop such a line.
///
/// `turn` lines are written by the simulated agent's turn hook, synchronously on the
/// turn's task (the simulated agent is not library code; a short blocking append there
/// is acceptable, and it is what puts the line on file before the turn's end can reach
/// the record).
pub(crate) struct ItemLog {
    file: std::fs::File,
}

impl ItemLog {
    pub(crate) fn open(path: &Path) -> Result<Self, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open the item log {}: {e}", path.display()))?;
        Ok(ItemLog { file })
    }

    /// Appends `line` and a newline in one write.
    fn line(&self, mut line: String) {
        line.push('\n');
        if let Err(e) = (&self.file).write_all(line.as_bytes()) {
            tracing::warn!(error = %e, "cannot write to the item log");
        }
    }

    fn pushing(&self, session: &str, id: u64) {
        self.line(format!("pushing {session} {id}"));
    }

    fn acked(&self, session: &str, id: u64) {
        self.line(format!("acked {session} {id}"));
    }

    pub(crate) fn turn(&self, ids: &[u64]) {
        let mut line = String::with_capacity(5 + ids.len() * 21);
        line.push_str("turn");
        for id in ids {
            line.push(' ');
            line.push_str(&id.to_string());
        }
        self.line(line);
    }
}

/// Live counters: completed turns and their items (counted by the agents themselves,
/// so resumed sessions count from their first turn; counts only, so the job's memory
/// does not grow with its turns), the feeders still pushing.
#[derive(Default)]
struct Progress {
    counters: Arc<SimCounters>,
    feeders: AtomicUsize,
    late: AtomicU64,
}

impl Progress {
    /// Completed turns and the items they delivered.
    fn delivered(&self) -> (u64, u64) {
        (self.counters.turns(), self.counters.items())
    }
}

/// Writes a line to stdout, ignoring a closed pipe (`agentloop run | head` must not
/// panic).
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

/// `--engine` / `--durability` over the configuration file's `[store]` values: a flag
/// given wins, the file (or its default: sled at `power`) fills in the rest.
pub(crate) fn engine_from_flags(
    config: &RuntimeConfig,
    engine: Option<&str>,
    durability: Option<&str>,
) -> Result<Engine, String> {
    let level = match durability {
        Some(d) => {
            StoreDurability::parse_or_explain(d).map_err(|e| format!("--durability: {e}"))?
        }
        None => config.store.engine.durability(),
    };
    match engine {
        None => Ok(config.store.engine.at(level)),
        Some(name) => Engine::named(name, level).ok_or_else(|| {
            format!("--engine: unknown engine `{name}`: write sled (the default) or fjall")
        }),
    }
}

/// Runs the job; `Ok(true)` when the shutdown left every record safe.
pub(crate) async fn run(args: RunArgs) -> Result<bool, String> {
    let began = Instant::now();
    let mut config = RuntimeConfig::load(args.config.as_deref()).map_err(|e| e.to_string())?;
    if let Some(dir) = &args.data_dir {
        config.store.data_dir = dir.clone();
    }
    if args.engine.is_some() || args.durability.is_some() {
        config.store.engine =
            engine_from_flags(&config, args.engine.as_deref(), args.durability.as_deref())?;
    }
    let data_dir = config.store.data_dir.clone();
    // The run's tag (session ids) and nonce (the high 32 bits of its item ids).
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let run_tag = format!("r{started_ms}");
    let run_nonce = started_ms & 0xFFFF_FFFF;
    // Opened before the runtime starts: resumed sessions log their turns too.
    let item_log = match &args.item_log {
        Some(path) => Some(Arc::new(ItemLog::open(path)?)),
        None => None,
    };
    let progress = Arc::new(Progress::default());
    let p = progress.clone();
    let hook_log = item_log.clone();
    let limits = config.limits;
    let builder = Runtime::<SimItem, SimEvent>::builder().config(&config);
    let (rt, start) = args
        .versions
        .register(builder, move |bytes: &[u8]| {
            Ok(AgentConfig::from_json(bytes, &limits)?
                .logged_agent(hook_log.as_ref())
                .with_counters(p.counters.clone()))
        })
        .start()
        .await
        .map_err(|e| format!("cannot start on {}: {e}", data_dir.display()))?;
    let shutdown = rt.shutdown_handle();
    let signals = listen_for_signals(shutdown.clone(), |sig: Signal, n: usize| {
        // Printed on its own line so it does not mix with the progress line.
        if n == 1 {
            say!("\nagentloop: {sig} received: shutting down gracefully (send it again to force)");
        } else if n == 2 {
            say!("\nagentloop: second signal ({sig}): forcing the shutdown");
        }
    })
    .map_err(|e| format!("cannot install the signal handlers: {e}"))?;

    say!(
        "agentloop: resumed {} session{} carrying {} item{} ({} interrupted by a shutdown, {} recovered after their process died)",
        start.resumed.len(),
        plural(start.resumed.len()),
        start.items,
        plural(start.items),
        start.resumed.len() - start.recovered,
        start.recovered,
    );
    for (id, why) in &start.skipped {
        say!("agentloop: not resumed: {id}: {why}");
    }

    let sup = rt.supervisor().clone();
    // Resumed sessions finish the items they carried, then complete.
    for id in &start.resumed {
        let _ = sup
            .stop(id, StopOptions::drain().cause("resumed work done"))
            .await;
    }
    // New sessions, fed one item at a time.
    let agent_config = serde_json::to_vec(&args.agent).map_err(|e| e.to_string())?;
    for k in 0..args.sessions {
        let id = format!("{run_tag}-s{k}");
        let spec = SessionSpec::new(id.clone(), "sim")
            .config(agent_config.clone())
            .persistent(true)
            .durability(config.store.flush);
        sup.spawn(spec)
            .await
            .map_err(|e| format!("cannot spawn session {id}: {e}"))?;
        progress.feeders.fetch_add(1, Ordering::Relaxed);
        let (sup, progress, items, pause, log) = (
            sup.clone(),
            progress.clone(),
            args.items,
            Duration::from_millis(args.push_ms),
            item_log.clone(),
        );
        tokio::spawn(async move {
            for i in 0..items {
                let item_id = (run_nonce << 32) | (k as u64 * items + i);
                let item = SimItem::new(item_id, format!("message {i} to {id}"));
                if let Some(log) = &log {
                    log.pushing(&id, item_id);
                }
                // A session that holds all its bound allows ([limits] session_items)
                // refuses the push and hands the item back: wait for its turns to take
                // some, then push it again (nothing is lost or skipped).
                let mut pushed = sup.push(&id, item).await;
                while let Err(PushError::Full { item, .. }) = pushed {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    pushed = sup.push(&id, item).await;
                }
                match pushed {
                    Ok(_) => {
                        if let Some(log) = &log {
                            log.acked(&id, item_id);
                        }
                    }
                    Err(PushError::Late { .. }) => {
                        // The drain gate is closed: this run is shutting down.
                        progress.late.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(session = %id, error = %e, "push refused");
                        break;
                    }
                }
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            let _ = sup
                .stop(&id, StopOptions::drain().cause("all items pushed"))
                .await;
            progress.feeders.fetch_sub(1, Ordering::Relaxed);
        });
    }
    say!(
        "agentloop: ready: {} new and {} resumed session{} on {} ({}: {}; pid {}); Ctrl+C or SIGTERM shuts down gracefully",
        args.sessions,
        start.resumed.len(),
        plural(start.resumed.len()),
        data_dir.display(),
        config.store.engine,
        config.store.engine.durability().survives(),
        std::process::id()
    );
    let _ = std::io::stdout().flush();

    // Progress until every session is done or a signal starts the shutdown: an
    // indicatif bar on stderr when it is a terminal, else a plain line on stdout every
    // second. Both show the total, the rate and the time left.
    let total = args.sessions as u64 * args.items + start.items as u64;
    let mut view = ProgressView::new(total);
    let wait_report = shutdown.wait_report();
    tokio::pin!(wait_report);
    let mut finished_by_itself = false;
    loop {
        tokio::select! {
            _ = &mut wait_report => break,
            _ = tokio::time::sleep(view.tick()) => {}
        }
        let live = sup.list().await.len();
        let checkpoints = rt.checkpoint_stats().await.map(|s| s.saves).unwrap_or(0);
        let (turns, items) = progress.delivered();
        view.show(live, turns, items, checkpoints);
        if live == 0 && progress.feeders.load(Ordering::Relaxed) == 0 {
            finished_by_itself = true;
            break;
        }
    }
    view.finish();
    if finished_by_itself {
        say!("agentloop: every session delivered its items; shutting down");
    }
    let report = rt
        .shutdown()
        .await
        .map_err(|e| format!("shutdown failed: {e}"))?;
    signals.abort();
    say!("{}", report_table(&report).trim_end());
    if report.late_items > 0 {
        say!(
            "agentloop: {} late item{}: pushes that arrived after the drain gate closed; they were refused and handed back to the feeders, which stopped there, so they are in no record and the next run does not push them again",
            report.late_items,
            plural(report.late_items as usize)
        );
    }
    let (turns, items) = progress.delivered();
    say!(
        "agentloop: {turns} turns, {items} items delivered in {:.1?}",
        began.elapsed()
    );
    say!(
        "agentloop: {} tool calls run as durable steps, {} replayed from the journal (finished before a restart, not run again)",
        progress.counters.steps_run(),
        progress.counters.steps_replayed()
    );
    if report.checkpoints.failed > 0 || report.store_flush_error.is_some() {
        say!(
            "agentloop: some records could not be written (see the report and the log); their items are listed in the log"
        );
        return Ok(false);
    }
    if report.checkpoints.saved > 0 {
        say!(
            "agentloop: {} session{} saved Interrupted with {} item{}; the next `agentloop run` on {} resumes them",
            report.checkpoints.saved,
            plural(report.checkpoints.saved as usize),
            report.checkpoints.items_saved,
            plural(report.checkpoints.items_saved as usize),
            data_dir.display()
        );
    }
    Ok(true)
}

/// The live progress: totals, rate (over the last 10 s) and time left.
struct ProgressView {
    total: u64,
    bar: Option<indicatif::ProgressBar>,
    /// `(when, items delivered)` samples for the rate.
    window: std::collections::VecDeque<(Instant, u64)>,
}

impl ProgressView {
    fn new(total: u64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {pos}/{len} items ({percent}%) {per_sec} ETA {eta} | {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        ProgressView {
            total,
            bar,
            window: std::collections::VecDeque::new(),
        }
    }

    fn tick(&self) -> Duration {
        if self.bar.is_some() {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(1)
        }
    }

    fn show(&mut self, live: usize, turns: u64, items: u64, checkpoints: u64) {
        let now = Instant::now();
        self.window.push_back((now, items));
        while self
            .window
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_secs(10))
        {
            self.window.pop_front();
        }
        let rate = match (self.window.front(), self.window.back()) {
            (Some((t0, i0)), Some((t1, i1))) if t1 > t0 => {
                (i1 - i0) as f64 / t1.duration_since(*t0).as_secs_f64()
            }
            _ => 0.0,
        };
        let left = self.total.saturating_sub(items);
        let eta = if left == 0 {
            "0s".to_string()
        } else if rate > 0.0 {
            humantime::format_duration(Duration::from_secs((left as f64 / rate).ceil() as u64))
                .to_string()
        } else {
            "unknown".to_string()
        };
        let rest = format!("sessions live {live} | turns {turns} | checkpoints {checkpoints}");
        match &self.bar {
            Some(bar) => {
                bar.set_position(items.min(self.total));
                bar.set_message(rest);
            }
            None => {
                let pct = if self.total == 0 {
                    100.0
                } else {
                    items as f64 * 100.0 / self.total as f64
                };
                say!(
                    "progress: items delivered {items} of {} ({pct:.1}%) | {rate:.0} items/s | ETA {eta} | {rest}",
                    self.total
                );
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
