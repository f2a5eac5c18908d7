//! A deterministic simulated agent for agentloop.
//!
//! Each turn runs a [`Script`]: model calls and rounds of tool calls with configurable
//! latencies (tokio time, so tests on a paused clock cost no wall time). After every
//! step it calls `cx.safe_point(..)` with a [`SimState`] that records how far the turn
//! got, so a resumed turn continues where the cut one stopped. Before every step it
//! calls `cx.begin_step(..)` (DESIGN S1a).
//!
//! For tests it offers:
//! * faults at a given turn and step: fail, panic, or a business interrupt;
//! * plan policies: consume at most N items, drop items by text prefix, fail, or wait;
//! * gates: a step (or the plan) waits for a permit the test hands out, and a probe
//!   channel tells the test where the agent is, so tests synchronise on channels, never
//!   on sleeps;
//! * a ledger of which items completed turns consumed and which the plan dropped, for
//!   conservation checks (S10) (a long-running job turns it off and keeps
//!   [`SimCounters`]), and an optional synchronous turn hook
//!   ([`SimAgent::with_turn_hook`]) for checks that must see a completed turn before
//!   the runtime does (the main job's crash loop).
//!
//! It uses no randomness: the same pushes and the same script give the same turns.

use std::sync::Arc;
use std::time::Duration;

use agentloop::{
    turn::Step, Agent, AgentError, Plan, PlanInput, SafePoint, Turn, TurnCx, TurnOutcome,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Semaphore};

/// An item pushed to a simulated session.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SimItem {
    /// A unique id (for conservation checks).
    pub id: u64,
    /// The text (a plan policy may drop items by prefix).
    pub text: String,
}

impl SimItem {
    /// An item with this id and text.
    pub fn new(id: u64, text: impl Into<String>) -> Self {
        SimItem {
            id,
            text: text.into(),
        }
    }
}

/// What the simulated agent emits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SimEvent {
    /// A step finished.
    StepDone {
        /// The turn.
        turn: u64,
        /// The step's index in the script.
        step: usize,
    },
    /// An event of a model-backed agent served beside the simulated one on the same
    /// runtime (`agentloop serve --model-url`'s kind `chat`), as JSON
    /// (`agentloop_openai::ChatEvent`).
    Model {
        /// The event.
        event: serde_json::Value,
    },
}

/// The resumable state of a simulated turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimState {
    /// The turn this state belongs to.
    pub turn: u64,
    /// The ids of the turn's items.
    pub items: Vec<u64>,
    /// How many script steps are done.
    pub steps_done: usize,
    /// Filler bytes, to model a realistic state size (benchmarks use ~1 KiB). Written
    /// as one MessagePack `bin` (`serde_bytes`): a plain `Vec<u8>` is a sequence of
    /// integers, which takes up to 2 bytes per byte and is encoded element by element
    /// (docs/semantics.md, S15a).
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

/// One step of a script.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SimStep {
    /// A model call (safe point `AfterModelCall` after it).
    ModelCall {
        /// How long it takes.
        latency: Duration,
        /// Input tokens, logged before the call (S1a).
        input_tokens: u32,
    },
    /// A round of tool calls (safe point `AfterToolCalls` after it).
    ToolRound {
        /// How long it takes.
        latency: Duration,
        /// How many calls.
        calls: u32,
    },
}

impl SimStep {
    fn safe_point(&self) -> SafePoint {
        match self {
            SimStep::ModelCall { .. } => SafePoint::AfterModelCall,
            SimStep::ToolRound { .. } => SafePoint::AfterToolCalls,
        }
    }

    fn latency(&self) -> Duration {
        match self {
            SimStep::ModelCall { latency, .. } | SimStep::ToolRound { latency, .. } => *latency,
        }
    }
}

/// A turn's script: the steps every turn runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Script {
    /// The steps, in order.
    pub steps: Vec<SimStep>,
}

impl Script {
    /// No steps: a turn completes at once (the no-op agent of benchmark B1).
    pub fn noop() -> Self {
        Script { steps: Vec::new() }
    }

    /// `rounds` × (model call, tool round), then a final model call.
    pub fn react(rounds: usize, model: Duration, tools: Duration) -> Self {
        let mut steps = Vec::new();
        for _ in 0..rounds {
            steps.push(SimStep::ModelCall {
                latency: model,
                input_tokens: 512,
            });
            steps.push(SimStep::ToolRound {
                latency: tools,
                calls: 2,
            });
        }
        steps.push(SimStep::ModelCall {
            latency: model,
            input_tokens: 512,
        });
        Script { steps }
    }
}

/// A fault to inject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// Return `AgentError::Failed` (a transient failure).
    Fail,
    /// Return `AgentError::Permanent` (a permanent failure: never restarted).
    FailPermanent,
    /// Panic.
    Panic,
    /// End the turn with a business interrupt (S4).
    Interrupt,
}

#[derive(Clone, Debug)]
struct FaultRule {
    turn: Option<u64>,
    step: usize,
    fault: Fault,
    once: bool,
}

/// How the simulated agent plans.
#[derive(Clone, Debug, Default)]
pub struct PlanPolicy {
    /// Consume at most this many items; the rest remain.
    pub limit: Option<usize>,
    /// Drop items whose text starts with this prefix (an explicit plan decision).
    pub drop_prefix: Option<String>,
    /// Fail every plan.
    pub fail: bool,
    /// Take this long to plan.
    pub latency: Option<Duration>,
}

/// What the agent does when a safe point reports a cancel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CancelHandling {
    /// Propagate it with `?` (what a well-behaved agent does).
    #[default]
    Propagate,
    /// Swallow it and keep going to the end of the script (S1: the runtime still sees
    /// the cancel).
    Swallow,
    /// Return this custom error instead (S13: the cancel still wins).
    CustomError(String),
}

/// A synchronous hook called when a turn completes, with the turn's index and the ids
/// of its items (see [`SimAgent::with_turn_hook`]).
pub type TurnHook = Arc<dyn Fn(u64, &[u64]) + Send + Sync>;

/// A custom plan function (tests of S5/S6).
pub type PlanFn =
    Arc<dyn Fn(PlanInput<SimItem>) -> Result<Plan<SimItem>, AgentError> + Send + Sync>;

/// Where the agent is, reported on the probe channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A plan started (before its gate).
    PlanBegin {
        /// The turn.
        turn: u64,
    },
    /// A turn started running with these item ids.
    TurnBegin {
        /// The turn.
        turn: u64,
        /// Its items' ids.
        items: Vec<u64>,
        /// Whether it resumes a cut turn.
        resumed: bool,
    },
    /// A step is about to wait for its gate.
    StepBegin {
        /// The turn.
        turn: u64,
        /// The step.
        step: usize,
    },
    /// A turn completed.
    TurnDone {
        /// The turn.
        turn: u64,
    },
}

/// A gate the test opens: each gated point takes one permit.
#[derive(Clone, Debug)]
pub struct Gate(Arc<Semaphore>);

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Gate(Arc::new(Semaphore::new(0)))
    }

    /// Lets `n` more gated points pass.
    pub fn open(&self, n: usize) {
        self.0.add_permits(n);
    }

    /// Lets every gated point pass from now on.
    pub fn open_all(&self) {
        self.0.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    async fn pass(&self) {
        if let Ok(p) = self.0.acquire().await {
            p.forget();
        }
    }
}

/// Which items went where, from the agent's side (S10 checks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Item ids of turns that completed, by turn.
    pub completed: Vec<(u64, Vec<u64>)>,
    /// Item ids the plan dropped.
    pub dropped: Vec<u64>,
    /// The answers resumed turns got (`Turn::answer`): (turn, the answer's id and
    /// text).
    pub answers: Vec<(u64, u64, String)>,
}

impl Ledger {
    /// All item ids delivered to completed turns.
    pub fn delivered_ids(&self) -> Vec<u64> {
        self.completed
            .iter()
            .flat_map(|(_, ids)| ids.iter().copied())
            .collect()
    }
}

/// Counts of what simulated agents completed, shared between agents (the main job's
/// progress): constant memory however long they run, unlike a [`Ledger`].
#[derive(Debug, Default)]
pub struct SimCounters {
    turns: std::sync::atomic::AtomicU64,
    items: std::sync::atomic::AtomicU64,
    steps_run: std::sync::atomic::AtomicU64,
    steps_replayed: std::sync::atomic::AtomicU64,
}

impl SimCounters {
    /// Completed turns.
    pub fn turns(&self) -> u64 {
        self.turns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Items delivered to completed turns.
    pub fn items(&self) -> u64 {
        self.items.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tool calls run as durable steps (S1b).
    pub fn steps_run(&self) -> u64 {
        self.steps_run.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tool calls answered from the journal without running (a turn resumed after a
    /// crash or a restart).
    pub fn steps_replayed(&self) -> u64 {
        self.steps_replayed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn step(&self, ran: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if ran {
            self.steps_run.fetch_add(1, Relaxed);
        } else {
            self.steps_replayed.fetch_add(1, Relaxed);
        }
    }

    fn completed(&self, items: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.turns.fetch_add(1, Relaxed);
        self.items.fetch_add(items as u64, Relaxed);
    }
}

/// The simulated agent.
pub struct SimAgent {
    script: Script,
    plan: PlanPolicy,
    faults: Mutex<Vec<FaultRule>>,
    step_gate: Option<Gate>,
    plan_gate: Option<Gate>,
    probe: Option<mpsc::UnboundedSender<Notice>>,
    payload: usize,
    ledger: Arc<Mutex<Ledger>>,
    plan_fn: Option<PlanFn>,
    on_cancel: CancelHandling,
    turn_hook: Option<TurnHook>,
    /// Whether the ledger records turns, drops and answers (tests); without it the
    /// agent keeps nothing per turn (a long-running job).
    keep_ledger: bool,
    counters: Option<Arc<SimCounters>>,
    /// Each tool call of a tool round is a durable step (S1b).
    durable_tools: bool,
}

impl SimAgent {
    /// An agent running `script` every turn.
    pub fn new(script: Script) -> Self {
        SimAgent {
            script,
            plan: PlanPolicy::default(),
            faults: Mutex::new(Vec::new()),
            step_gate: None,
            plan_gate: None,
            probe: None,
            payload: 0,
            ledger: Arc::new(Mutex::new(Ledger::default())),
            plan_fn: None,
            on_cancel: CancelHandling::Propagate,
            turn_hook: None,
            keep_ledger: true,
            counters: None,
            durable_tools: false,
        }
    }

    /// Runs each tool call of a tool round as a durable step (S1b, `cx.step`) named
    /// `tool-<step>-<call>`, taking an equal share of the round's latency: a turn run
    /// again after a crash replays the calls that finished instead of making them
    /// again.
    pub fn with_durable_tools(mut self) -> Self {
        self.durable_tools = true;
        self
    }

    /// Counts completed turns and their items in `counters` (shared with other agents).
    pub fn with_counters(mut self, counters: Arc<SimCounters>) -> Self {
        self.counters = Some(counters);
        self
    }

    /// Keeps no ledger: completed turns, dropped items and answers are not recorded, so
    /// the agent's memory does not grow with the turns it runs (the main job, which
    /// runs for days, keeps [`SimCounters`] instead). Tests keep the ledger (the
    /// default).
    pub fn without_ledger(mut self) -> Self {
        self.keep_ledger = false;
        self
    }

    /// Calls `hook(turn, item_ids)` when a turn completes: synchronously, on the turn's
    /// task, right where the ledger records the turn and before the turn returns
    /// `Completed`. So whatever the hook writes is done before the session can know the
    /// turn ended (the main job's `--item-log` writes its `turn` line here, so the line
    /// is on file before the record can drop those items, S16a). With
    /// [`CancelHandling::Swallow`] the agent also reaches this point after a swallowed
    /// cancel, and the runtime still ends that turn canceled (S1).
    ///
    /// It runs inside the turn: keep it short and never block for long (no locks held
    /// across awaits, no network), and do not panic (a panic fails the turn).
    pub fn with_turn_hook(mut self, hook: TurnHook) -> Self {
        self.turn_hook = Some(hook);
        self
    }

    /// Plans with `f` instead of the plan policy (after the plan gate).
    pub fn with_plan_fn(mut self, f: PlanFn) -> Self {
        self.plan_fn = Some(f);
        self
    }

    /// What to do when a safe point reports a cancel.
    pub fn with_cancel_handling(mut self, h: CancelHandling) -> Self {
        self.on_cancel = h;
        self
    }

    /// Sets the plan policy.
    pub fn with_plan(mut self, plan: PlanPolicy) -> Self {
        self.plan = plan;
        self
    }

    /// Injects a fault at `step` of turn `turn` (any turn when `None`). A `once` fault
    /// fires only the first time.
    pub fn with_fault(self, turn: Option<u64>, step: usize, fault: Fault, once: bool) -> Self {
        self.faults.lock().push(FaultRule {
            turn,
            step,
            fault,
            once,
        });
        self
    }

    /// Every step waits for a permit of `gate`.
    pub fn with_step_gate(mut self, gate: Gate) -> Self {
        self.step_gate = Some(gate);
        self
    }

    /// Every plan waits for a permit of `gate`.
    pub fn with_plan_gate(mut self, gate: Gate) -> Self {
        self.plan_gate = Some(gate);
        self
    }

    /// Reports where the agent is on this channel.
    pub fn with_probe(mut self, probe: mpsc::UnboundedSender<Notice>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Adds `bytes` of filler to every state.
    pub fn with_state_payload(mut self, bytes: usize) -> Self {
        self.payload = bytes;
        self
    }

    /// A handle on the ledger (shared; keeps filling as the agent runs).
    pub fn ledger(&self) -> Arc<Mutex<Ledger>> {
        self.ledger.clone()
    }

    fn notice(&self, n: Notice) {
        if let Some(p) = &self.probe {
            let _ = p.send(n);
        }
    }

    fn take_fault(&self, turn: u64, step: usize) -> Option<Fault> {
        let mut faults = self.faults.lock();
        let pos = faults
            .iter()
            .position(|f| f.step == step && f.turn.is_none_or(|t| t == turn))?;
        let fault = faults[pos].fault.clone();
        if faults[pos].once {
            faults.remove(pos);
        }
        Some(fault)
    }
}

impl Agent for SimAgent {
    type Item = SimItem;
    type Event = SimEvent;
    type State = SimState;

    async fn plan(&self, offer: PlanInput<SimItem>) -> Result<Plan<SimItem>, AgentError> {
        self.notice(Notice::PlanBegin {
            turn: offer.turn_index,
        });
        if let Some(g) = &self.plan_gate {
            g.pass().await;
        }
        if let Some(d) = self.plan.latency {
            tokio::time::sleep(d).await;
        }
        if let Some(f) = &self.plan_fn {
            return f(offer);
        }
        if self.plan.fail {
            return Err(AgentError::failed("simulated plan failure"));
        }
        let mut consumed = Vec::new();
        let mut remaining = Vec::new();
        let mut dropped = Vec::new();
        for item in offer.into_items() {
            if self
                .plan
                .drop_prefix
                .as_deref()
                .is_some_and(|p| item.text.starts_with(p))
            {
                dropped.push(item.id);
            } else if self.plan.limit.is_some_and(|l| consumed.len() >= l) {
                remaining.push(item);
            } else {
                consumed.push(item);
            }
        }
        if !dropped.is_empty() && self.keep_ledger {
            self.ledger.lock().dropped.extend(dropped);
        }
        Ok(Plan {
            consumed,
            remaining,
        })
    }

    async fn run_turn(
        &self,
        turn: Turn<Self>,
        cx: TurnCx<Self>,
    ) -> Result<TurnOutcome<SimState>, AgentError> {
        let ids: Vec<u64> = turn.items.iter().map(|i| i.id).collect();
        let resumed = turn.resume.is_some();
        if let Some(a) = turn.answer.as_ref().filter(|_| self.keep_ledger) {
            self.ledger
                .lock()
                .answers
                .push((turn.index, a.id, a.text.clone()));
        }
        let mut st = turn.resume.unwrap_or_else(|| SimState {
            turn: turn.index,
            items: ids.clone(),
            steps_done: 0,
            payload: vec![0xA5; self.payload],
        });
        self.notice(Notice::TurnBegin {
            turn: turn.index,
            items: ids.clone(),
            resumed,
        });
        for (i, step) in self.script.steps.iter().enumerate().skip(st.steps_done) {
            self.notice(Notice::StepBegin {
                turn: turn.index,
                step: i,
            });
            if let Some(g) = &self.step_gate {
                g.pass().await;
            }
            match self.take_fault(turn.index, i) {
                Some(Fault::Fail) => {
                    return Err(AgentError::failed(format!(
                        "simulated failure at turn {} step {i}",
                        turn.index
                    )))
                }
                Some(Fault::FailPermanent) => {
                    return Err(AgentError::permanent(format!(
                        "simulated permanent failure at turn {} step {i}",
                        turn.index
                    )))
                }
                Some(Fault::Panic) => {
                    panic!("simulated panic at turn {} step {i}", turn.index)
                }
                Some(Fault::Interrupt) => {
                    return cx.ask(
                        "simulated approval required",
                        serde_json::json!({ "turn": turn.index, "step": i, "items": ids }),
                        st,
                    );
                }
                None => {}
            }
            match step {
                SimStep::ModelCall { input_tokens, .. } => cx.begin_step(
                    Step::ModelCall,
                    &[("input_tokens", i64::from(*input_tokens))],
                ),
                SimStep::ToolRound { calls, .. } => {
                    cx.begin_step(Step::ToolCalls, &[("calls", i64::from(*calls))])
                }
            }
            match step {
                SimStep::ToolRound { latency, calls } if self.durable_tools && *calls > 0 => {
                    let share = *latency / *calls;
                    for call in 0..*calls {
                        let ran = std::sync::atomic::AtomicBool::new(false);
                        let _: String = cx
                            .step(&format!("tool-{i}-{call}"), |key| {
                                ran.store(true, std::sync::atomic::Ordering::Relaxed);
                                async move {
                                    if !share.is_zero() {
                                        tokio::time::sleep(share).await;
                                    }
                                    format!("result of {key}")
                                }
                            })
                            .await?;
                        if let Some(c) = &self.counters {
                            c.step(ran.load(std::sync::atomic::Ordering::Relaxed));
                        }
                    }
                }
                _ if !step.latency().is_zero() => tokio::time::sleep(step.latency()).await,
                _ => {}
            }
            cx.emit(SimEvent::StepDone {
                turn: turn.index,
                step: i,
            })
            .await;
            st.steps_done = i + 1;
            if let Err(c) = cx.safe_point(step.safe_point(), &st) {
                match &self.on_cancel {
                    CancelHandling::Propagate => return Err(c.into()),
                    CancelHandling::Swallow => {}
                    CancelHandling::CustomError(e) => return Err(AgentError::failed(e.clone())),
                }
            }
        }
        if let Some(hook) = &self.turn_hook {
            hook(turn.index, &ids);
        }
        if let Some(c) = &self.counters {
            c.completed(ids.len());
        }
        if self.keep_ledger {
            self.ledger.lock().completed.push((turn.index, ids));
        }
        self.notice(Notice::TurnDone { turn: turn.index });
        Ok(TurnOutcome::Completed)
    }
}
