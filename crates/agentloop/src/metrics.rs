//! The runtime's metrics (issue 17, S35), on the Prometheus client library
//! (`prometheus-client`): turns by outcome, pushes routed by id by result, session
//! restarts, checkpoint write (apply) and flush latency histograms, and the shutdown's
//! phase durations. The runtime creates one [`RuntimeMetrics`] and hands it to the
//! supervisor, the sessions and the checkpoint actor, which only count into it; a front
//! end registers it ([`RuntimeMetrics::register`]) and encodes the registry (the HTTP
//! front's `GET /metrics`). Gauges that are a reading of the present (sessions by
//! status) are the front end's, taken at scrape time.
//!
//! Counting is one atomic add (every labelled counter is resolved once, at creation);
//! nothing here blocks, allocates per event or decides anything.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use agentloop_core::turn::TurnEnd;

/// One label: `(name, value)`.
type Label = Vec<(&'static str, &'static str)>;

/// The runtime's counters and histograms. Cheap to share (`Arc`); every metric is
/// itself a shared handle.
#[derive(Debug)]
pub struct RuntimeMetrics {
    turns: Family<Label, Counter>,
    pushes: Family<Label, Counter>,
    /// The members of `turns`, resolved once (counting is one atomic add, no lookup):
    /// completed, preempted, canceled, interrupted, failed, plan_aborted.
    turn_counters: [Counter; 6],
    /// The members of `pushes`: accepted, late, refused.
    push_counters: [Counter; 3],
    restarts: Counter,
    steps: Family<Label, Counter>,
    /// The members of `steps`: ran, replayed, unknown, failed.
    step_counters: [Counter; 4],
    checkpoint_apply: Histogram,
    checkpoint_flush: Histogram,
    /// How late durable timers fired (S39), seconds after their due time.
    timer_lateness: Histogram,
    shutdown_phase: Family<Label, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        // 50 µs to ~1.6 s, doubling: group commits on sled run from tens of µs (no
        // flush work) to hundreds of ms (a large wave behind a slow disk).
        let buckets = || exponential_buckets(50e-6, 2.0, 16);
        let turns = Family::<Label, Counter>::default();
        let pushes = Family::<Label, Counter>::default();
        let turn_counters =
            TURN_OUTCOMES.map(|o| turns.get_or_create(&vec![("outcome", o)]).clone());
        let push_counters =
            PUSH_RESULTS.map(|r| pushes.get_or_create(&vec![("result", r)]).clone());
        let steps = Family::<Label, Counter>::default();
        let step_counters = STEP_RESULTS.map(|r| steps.get_or_create(&vec![("result", r)]).clone());
        RuntimeMetrics {
            turns,
            pushes,
            turn_counters,
            push_counters,
            restarts: Counter::default(),
            steps,
            step_counters,
            checkpoint_apply: Histogram::new(buckets()),
            checkpoint_flush: Histogram::new(buckets()),
            // 1 ms to ~33 s, doubling.
            timer_lateness: Histogram::new(exponential_buckets(1e-3, 2.0, 16)),
            shutdown_phase: Family::default(),
        }
    }
}

/// The `outcome` label values of `agentloop_turns_total`, in `turn_counters` order.
const TURN_OUTCOMES: [&str; 6] = [
    "completed",
    "preempted",
    "canceled",
    "interrupted",
    "failed",
    "plan_aborted",
];

/// The `result` label values of `agentloop_pushes_total`, in `push_counters` order.
const PUSH_RESULTS: [&str; 3] = ["accepted", "late", "refused"];

/// The `result` label values of `agentloop_steps_total`, in `step_counters` order.
const STEP_RESULTS: [&str; 4] = ["ran", "replayed", "unknown", "failed"];

/// How a durable step (S1b) ended, for [`RuntimeMetrics::step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepResult {
    /// It ran and its result is journaled.
    Ran,
    /// Its journaled result was replayed without running it.
    Replayed,
    /// A `NoRetry` step whose outcome is unknown (not run again).
    Unknown,
    /// Refused (divergence, the bound) or not journaled: the turn fails.
    Failed,
}

/// How a routed push ended, for [`RuntimeMetrics::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushResult {
    /// Accepted by the session.
    Accepted,
    /// Refused as late: the drain gate was closed or the session's stop committed (the
    /// item was handed back).
    Late,
    /// Refused otherwise: unknown session, invalid options, an item that cannot be
    /// stored.
    Refused,
}

impl RuntimeMetrics {
    /// New, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every metric under `registry` (names prefixed `agentloop_` by the
    /// caller's sub-registry or as given here).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "agentloop_turns",
            "Turns ended, by outcome (completed, preempted, canceled, interrupted, failed, plan_aborted)",
            self.turns.clone(),
        );
        registry.register(
            "agentloop_pushes",
            "Pushes routed by session id, by result (accepted, late, refused)",
            self.pushes.clone(),
        );
        registry.register(
            "agentloop_steps",
            "Durable steps, by result (ran, replayed from the journal, unknown, failed)",
            self.steps.clone(),
        );
        registry.register(
            "agentloop_restarts",
            "Failed sessions restarted by the supervisor",
            self.restarts.clone(),
        );
        registry.register_with_unit(
            "agentloop_checkpoint_apply",
            "Time to apply one group commit (a wave of record writes) to the store, before its flush",
            Unit::Seconds,
            self.checkpoint_apply.clone(),
        );
        registry.register_with_unit(
            "agentloop_checkpoint_flush",
            "Time of one store flush (what makes the writes before it durable)",
            Unit::Seconds,
            self.checkpoint_flush.clone(),
        );
        registry.register_with_unit(
            "agentloop_timer_lateness",
            "How long after its due time each durable timer fired (its item accepted)",
            Unit::Seconds,
            self.timer_lateness.clone(),
        );
        registry.register_with_unit(
            "agentloop_shutdown_phase",
            "Duration of each phase of the last shutdown (gate, grace, force, cleanup, total)",
            Unit::Seconds,
            self.shutdown_phase.clone(),
        );
    }

    /// A turn ended.
    pub fn turn_ended(&self, end: &TurnEnd) {
        let i = match end {
            TurnEnd::Completed => 0,
            TurnEnd::Preempted(_) => 1,
            TurnEnd::Canceled(_) => 2,
            TurnEnd::Interrupted(_) => 3,
            TurnEnd::Failed(_) => 4,
            TurnEnd::PlanAborted(_) => 5,
        };
        self.turn_counters[i].inc();
    }

    /// A push routed by id was answered.
    pub fn push(&self, result: PushResult) {
        let i = match result {
            PushResult::Accepted => 0,
            PushResult::Late => 1,
            PushResult::Refused => 2,
        };
        self.push_counters[i].inc();
    }

    /// A durable step ended.
    pub fn step(&self, result: StepResult) {
        let i = match result {
            StepResult::Ran => 0,
            StepResult::Replayed => 1,
            StepResult::Unknown => 2,
            StepResult::Failed => 3,
        };
        self.step_counters[i].inc();
    }

    /// The supervisor restarted a failed session.
    pub fn restart(&self) {
        self.restarts.inc();
    }

    /// A wave was applied in `took`.
    pub fn checkpoint_applied(&self, took: Duration) {
        self.checkpoint_apply.observe(took.as_secs_f64());
    }

    /// A durable timer fired `late_ms` after its due time (S39).
    pub fn timer_fired(&self, late_ms: u64) {
        self.timer_lateness.observe(late_ms as f64 / 1_000.0);
    }

    /// A flush took `took`.
    pub fn checkpoint_flushed(&self, took: Duration) {
        self.checkpoint_flush.observe(took.as_secs_f64());
    }

    /// The shutdown finished with these phase durations, by phase name
    /// (`ShutdownReport::phases`, [`crate::shutdown::report::PhaseDurations::named`]).
    pub fn shutdown_phases(&self, phases: impl IntoIterator<Item = (&'static str, Duration)>) {
        for (name, d) in phases {
            self.shutdown_phase
                .get_or_create(&vec![("phase", name)])
                .set(d.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_in_the_text_format() {
        let m = RuntimeMetrics::new();
        m.turn_ended(&TurnEnd::Completed);
        m.turn_ended(&TurnEnd::Completed);
        m.push(PushResult::Late);
        m.checkpoint_flushed(Duration::from_millis(3));
        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        assert!(
            text.contains("agentloop_turns_total{outcome=\"completed\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("agentloop_pushes_total{result=\"late\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("agentloop_checkpoint_flush_seconds_count 1"),
            "{text}"
        );
    }
}
