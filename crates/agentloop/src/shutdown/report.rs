//! The `ShutdownReport` (DESIGN S27): what a shutdown did, phase by phase.
//!
//! This module only describes; the coordinator fills the report in and the CLI prints
//! it as a table. Every count here is one a test can check against the store.

use std::time::Duration;

/// How long each phase took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseDurations {
    /// Closing the drain gate.
    pub gate: Duration,
    /// The grace phase (zero when the strategy has none).
    pub grace: Duration,
    /// The force phase: Immediate stops, the force timeout, kills (zero when every
    /// session ended in grace).
    pub force: Duration,
    /// Store flush, cleanup hooks, log flush.
    pub cleanup: Duration,
    /// From the start of the shutdown task (the first request, as the coordinator
    /// handled it) to the report being assembled. A caller also sees the request's trip
    /// through the coordinator's mailbox and the answer's trip back, which under heavy
    /// load can add tens of milliseconds (docs/benchmarks.md, B4).
    pub total: Duration,
}

impl PhaseDurations {
    /// Each phase by its name (`gate`, `grace`, `force`, `cleanup`, `total`), as
    /// `/metrics` labels them.
    pub fn named(&self) -> [(&'static str, Duration); 5] {
        [
            ("gate", self.gate),
            ("grace", self.grace),
            ("force", self.force),
            ("cleanup", self.cleanup),
            ("total", self.total),
        ]
    }
}

/// What happened to the sessions that were live when the gate closed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionCounts {
    /// Sessions live when the gate closed.
    pub total: u64,
    /// Ended during the grace phase.
    pub exited_in_grace: u64,
    /// Ended after an Immediate stop in the force phase.
    pub forced: u64,
    /// Still alive after the force timeout: killed; their records were marked from
    /// their last durable state.
    pub killed: u64,
}

/// Records written for the shutdown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointCounts {
    /// `Interrupted` records saved (by the sessions' final checkpoints, or by the
    /// coordinator for killed sessions).
    pub saved: u64,
    /// Saves or status changes that failed (the sessions' items are in the log).
    pub failed: u64,
    /// Items held in the saved records (unhandled plus interrupted).
    pub items_saved: u64,
    /// Items held by sessions that do not persist, or whose save failed: they end
    /// with this process.
    pub items_unsaved: u64,
}

/// How one cleanup hook went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookOutcome {
    /// It returned `Ok`.
    Ok,
    /// It returned an error or panicked; the text says which.
    Failed(String),
    /// It was cut at its share of the cleanup bound (or never started: the bound was
    /// spent).
    TimedOut,
}

/// One cleanup hook's line in the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookReport {
    /// The name it was registered under.
    pub name: String,
    /// How it went.
    pub outcome: HookOutcome,
    /// How long it ran.
    pub took: Duration,
}

/// What a shutdown did (S27). Both callers of an idempotent double request get equal
/// reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// The strategy that ran.
    pub strategy: String,
    /// A second request (a second signal) skipped the rest of the grace.
    pub force_requested: bool,
    /// Phase durations.
    pub phases: PhaseDurations,
    /// Sessions.
    pub sessions: SessionCounts,
    /// Records.
    pub checkpoints: CheckpointCounts,
    /// Pushes rejected as late items: by the drain gate, and by the sessions after
    /// their stop (each item was handed back to its caller).
    pub late_items: u64,
    /// The store flush at the start of cleanup: `None` if it succeeded, else why not.
    pub store_flush_error: Option<String>,
    /// Cleanup hooks in registration order.
    pub hooks: Vec<HookReport>,
}

impl ShutdownReport {
    /// Hooks that returned `Ok`.
    pub fn hooks_ok(&self) -> usize {
        self.count(|o| matches!(o, HookOutcome::Ok))
    }

    /// Hooks that failed or panicked.
    pub fn hooks_failed(&self) -> usize {
        self.count(|o| matches!(o, HookOutcome::Failed(_)))
    }

    /// Hooks cut by the cleanup bound.
    pub fn hooks_timed_out(&self) -> usize {
        self.count(|o| matches!(o, HookOutcome::TimedOut))
    }

    fn count(&self, f: impl Fn(&HookOutcome) -> bool) -> usize {
        self.hooks.iter().filter(|h| f(&h.outcome)).count()
    }

    /// Whether nothing went wrong: no kill, no failed checkpoint, no failed or cut
    /// hook, the store flushed.
    pub fn is_clean(&self) -> bool {
        self.sessions.killed == 0
            && self.checkpoints.failed == 0
            && self.store_flush_error.is_none()
            && self.hooks_failed() == 0
            && self.hooks_timed_out() == 0
    }
}
