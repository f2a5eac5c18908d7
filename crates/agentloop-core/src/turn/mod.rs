//! The turn's state machine, sans IO: one turn's phase (planning → running → ended),
//! its merged cancel (S3) with its origins (stop or preempt), the capture of a cancel at
//! a safe point (S1), its resumable state (S2, S16a), the book of its durable steps
//! (S1b) and, once the turn is over, its classification (S13).
//!
//! [`TurnMachine`] is a plain value: each method takes the event (a cancel submitted, a
//! safe point reached, a step begun, the agent's future ended) and the time it happened
//! (`now`, passed in), changes the state and returns what the caller must do
//! ([`Effects`]: wake the turn's task, tell the cancel's waiters, answer preempt
//! acknowledgements, tell the session the turn progressed). It holds the caller's reply
//! tokens (`A`, a preempt's acknowledgement) without knowing what they are, reads no
//! clock, encodes nothing but journal entries, and waits on nothing, so it is tested
//! without a runtime (`tests.rs`, with a property test of cancel merging, safe-point
//! capture and the step book).
//!
//! The runtime's `turn/control.rs` is the shell: it keeps the machine under one lock
//! shared by the session and the turn task, encodes states outside that lock, keeps the
//! steps' waiters (reply ports) beside it, and performs the effects after the lock is
//! released. This module must not name tokio, ractor or any store.
//!
//! Invariant: once the phase is [`Phase::Ended`], nothing changes any more but the
//! hand-over of what the turn left (`take_ending`, `journal_leftovers`).

mod book;
mod ending;
mod outcome;
#[cfg(test)]
mod tests;

use std::time::Instant;

use crate::cancel::{CancelMode, CancelRequest, CancelState, Canceled, SafePoint};
use crate::header::Payload;
use crate::ledger::PlanSplit;
use crate::steps::Journal;

pub use book::{journal_puts, LiveTurn, Requeue, StepFinish};
pub use ending::{carried_tag, is_carried, Ending, Outcome, RunEnd, StateSnap, LOADED_CARRIED_TAG};
pub use outcome::{AgentError, FailureKind, TurnEnd};

use book::StepBook;

/// Where a turn is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The plan is being computed (S5).
    Planning,
    /// The agent's `run_turn` is running.
    Running,
    /// The turn is over (its task may still be sending its last events).
    Ended,
}

/// Who asked for a cancel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A stop request (S11): a cut turn ends the session.
    Stop,
    /// A preempting push (S7): a cut turn hands its items to the next plan.
    Preempt,
}

/// What submitting a cancel did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// Held until the planning turn becomes active.
    Pending,
    /// Applied to the running turn.
    Active,
    /// The turn is already over.
    TurnEnded,
}

/// The answer a held preempt acknowledgement gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckAnswer {
    /// The cancel reached the turn when it began to run.
    Submitted,
    /// The turn ended before it ran.
    TargetEnded,
}

/// What the session asks of a turn's machine, fixed for the turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnSettings {
    /// The session writes every safe point (`sync`): the shell encodes each state
    /// before [`TurnMachine::safe_point`], and a recorded state or a plan's answer that
    /// changes stored entries is progress to write.
    pub safe_points_written: bool,
    /// Each journal entry is written before its step goes on (`sync` and `turn`,
    /// S1b); otherwise the journal is only kept in memory until the final write.
    pub journal_writes: bool,
}

/// What the caller must do after a call, once it no longer holds the machine.
#[derive(Debug, PartialEq, Eq)]
pub struct Effects<A> {
    /// Wake the turn's task: its cancel changed (a new deadline, Immediate, an abort).
    pub wake_task: bool,
    /// Tell everyone waiting for a cancel in force (`TurnCx::cancel_requested`).
    pub cancel_watch: bool,
    /// A preempt reached the running turn (S8): tell whoever waits for it.
    pub preempted: bool,
    /// The turn progressed: the session has something to write.
    pub progress: bool,
    /// Held preempt acknowledgements to answer now.
    pub acks: Vec<A>,
    /// What they are answered.
    pub ack_answer: AckAnswer,
}

impl<A> Effects<A> {
    /// Nothing to do.
    pub fn none() -> Self {
        Effects {
            wake_task: false,
            cancel_watch: false,
            preempted: false,
            progress: false,
            acks: Vec::new(),
            ack_answer: AckAnswer::Submitted,
        }
    }

    fn progress(progress: bool) -> Self {
        Effects {
            progress,
            ..Effects::none()
        }
    }

    fn answer(acks: Vec<A>, ack_answer: AckAnswer) -> Self {
        Effects {
            acks,
            ack_answer,
            ..Effects::none()
        }
    }
}

/// The state machine of one turn (see the module's documentation). `I` is the item
/// type, `S` the agent's state, `A` the caller's token for a held preempt
/// acknowledgement.
#[derive(Debug)]
pub struct TurnMachine<I, S, A> {
    index: u64,
    settings: TurnSettings,
    phase: Phase,
    /// Cancels submitted while planning, activated when the turn starts running (S7).
    pending: Option<CancelRequest>,
    pending_by_stop: bool,
    pending_by_preempt: bool,
    /// Preempt acknowledgements waiting for the turn to become active.
    pending_acks: Vec<A>,
    /// The merged cancel of the running turn.
    active: Option<CancelState>,
    first_mode: Option<CancelMode>,
    by_stop: bool,
    by_preempt: bool,
    /// A stop committed while planning: do not run the turn (S6).
    abort_planning: bool,
    /// The safe point at which a cancel was honoured.
    captured: Option<SafePoint>,
    /// The resumable state: the last safe point's, or the turn's input (S2).
    state: Option<StateSnap<S>>,
    next_tag: u64,
    /// A safe point's state did not encode: the turn ends `Failed` (S15a, S18).
    state_failure: Option<String>,
    /// The plan's answer, until the session takes it.
    split: Option<PlanSplit<I>>,
    ending: Option<Ending<S>>,
    /// The durable steps (S1b).
    steps: StepBook,
}

impl<I: Clone, S: Clone, A> TurnMachine<I, S, A> {
    /// A planning turn `index` that resumes from `input_state` (if any) with `journal`.
    pub fn new(
        index: u64,
        input_state: Option<StateSnap<S>>,
        journal: Journal,
        settings: TurnSettings,
    ) -> Self {
        TurnMachine {
            index,
            settings,
            phase: Phase::Planning,
            pending: None,
            pending_by_stop: false,
            pending_by_preempt: false,
            pending_acks: Vec::new(),
            active: None,
            first_mode: None,
            by_stop: false,
            by_preempt: false,
            abort_planning: false,
            captured: None,
            state: input_state,
            // Tags are unique across the session's turns (0 is a record's state).
            next_tag: index.wrapping_shl(32) | 1,
            state_failure: None,
            split: None,
            ending: None,
            steps: StepBook::new(journal),
        }
    }

    /// The turn's index.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// What the session asked of this turn.
    pub fn settings(&self) -> TurnSettings {
        self.settings
    }

    /// Where the turn is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Takes the plan's answer (session side; once).
    pub fn take_split(&mut self) -> Option<PlanSplit<I>> {
        self.split.take()
    }

    /// The consumed items of a plan whose answer the session has not taken yet, for a
    /// push strategy (S9). A copy, so user code never runs while the machine is held.
    pub fn consumed_view(&self) -> Option<Vec<I>> {
        let split = self.split.as_ref()?;
        Some(split.consumed.iter().map(|p| p.item.clone()).collect())
    }

    /// A copy of the resumable state (a write that must encode it itself).
    pub fn state_snapshot(&self) -> Option<StateSnap<S>> {
        self.state.clone()
    }

    /// Submits a cancel (session side). A planning turn holds it until it runs; a
    /// running turn merges it now (S3); an ended turn ignores it. A preempt's
    /// acknowledgement is held with a pending cancel (answered when the turn starts or
    /// ends), so it can never miss the transition; otherwise it is handed back.
    pub fn submit(
        &mut self,
        req: CancelRequest,
        origin: Origin,
        now: Instant,
        ack: Option<A>,
    ) -> (Submitted, Option<A>, Effects<A>) {
        match self.phase {
            Phase::Ended => (Submitted::TurnEnded, ack, Effects::none()),
            Phase::Planning => {
                self.pending = Some(match self.pending {
                    Some(p) => p.merge(req),
                    None => req,
                });
                match origin {
                    Origin::Stop => self.pending_by_stop = true,
                    Origin::Preempt => self.pending_by_preempt = true,
                }
                if let Some(a) = ack {
                    self.pending_acks.push(a);
                }
                (Submitted::Pending, None, Effects::none())
            }
            Phase::Running => {
                self.activate_cancel(req, now);
                match origin {
                    Origin::Stop => self.by_stop = true,
                    Origin::Preempt => self.by_preempt = true,
                }
                let fx = Effects {
                    wake_task: true,
                    cancel_watch: true,
                    preempted: origin == Origin::Preempt,
                    ..Effects::none()
                };
                (Submitted::Active, ack, fx)
            }
        }
    }

    fn activate_cancel(&mut self, req: CancelRequest, now: Instant) {
        let new = req.at(now);
        if self.first_mode.is_none() {
            self.first_mode = Some(new.mode);
        }
        self.active = CancelState::merge_opt(self.active, Some(new), now);
    }

    /// A stop committed while planning (S6): the turn must not run. Returns whether the
    /// turn was still planning (then the task is woken).
    ///
    /// The stop's cancel (if any) is held as pending too: if the plan completes before
    /// the task sees the abort, the plan's decision stands (it is never discarded
    /// after it returned) and the turn runs under that cancel instead.
    pub fn abort_planning(&mut self, cancel: Option<CancelRequest>) -> bool {
        if self.phase != Phase::Planning {
            return false;
        }
        self.abort_planning = true;
        if let Some(req) = cancel {
            self.pending = Some(match self.pending {
                Some(p) => p.merge(req),
                None => req,
            });
            self.pending_by_stop = true;
        }
        true
    }

    /// Whether the planning turn was told to abort (turn-task side).
    pub fn planning_aborted(&self) -> bool {
        self.abort_planning
    }

    /// Planning is done (turn-task side): the turn becomes active, pending cancels are
    /// submitted and their acknowledgements answered. A plan that returned is never
    /// discarded, even if a stop asked to abort planning meanwhile: the stop's cancel is
    /// among the pending ones (see [`TurnMachine::abort_planning`]). `split` is the
    /// plan's answer (`None` for a resume turn, whose items the session already knows);
    /// when it changes stored entries and the session writes every change, that is
    /// progress.
    pub fn start_running(&mut self, split: Option<PlanSplit<I>>, now: Instant) -> Effects<A> {
        let progress = self.settings.safe_points_written
            && split.as_ref().is_some_and(PlanSplit::changes_entries);
        self.phase = Phase::Running;
        self.split = split;
        let mut preempted = false;
        if let Some(req) = self.pending.take() {
            self.activate_cancel(req, now);
            self.by_stop |= self.pending_by_stop;
            self.by_preempt |= self.pending_by_preempt;
            preempted = self.pending_by_preempt;
        }
        Effects {
            preempted,
            progress,
            ..Effects::answer(std::mem::take(&mut self.pending_acks), AckAnswer::Submitted)
        }
    }

    /// The absolute deadline after which the turn must be dropped, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.active.and_then(|c| c.deadline)
    }

    /// Whether the turn's future must be dropped now (Immediate in force).
    pub fn must_kill(&self) -> bool {
        matches!(
            self.active,
            Some(CancelState {
                mode: CancelMode::Immediate,
                ..
            })
        )
    }

    /// The deadline passed: escalate to Immediate (S2).
    pub fn escalate_on_timeout(&mut self, now: Instant) {
        if let Some(c) = self.active {
            self.active = Some(c.normalized(now));
        }
    }

    /// Whether a cancel in force would be captured by a safe point of kind `kind`.
    pub fn cancel_matches(&self, kind: SafePoint) -> bool {
        self.active.is_some_and(|c| c.matches(kind))
    }

    /// A safe point (S1): records `state` as the turn's resumable state and returns
    /// `Err(Canceled)` when the cancel in force matches `kind`. The capture is recorded
    /// here, so an agent that swallows the error does not hide the cancel.
    ///
    /// `encoded` is the state's bytes when the session writes safe points (the caller
    /// encodes outside its lock, checked): a state that does not read back (`Err`) is
    /// not recorded, and the turn ends at this safe point, `Failed` (S15a: the stored
    /// record keeps its last good state). A turn that is not running ignores it.
    pub fn safe_point(
        &mut self,
        kind: SafePoint,
        state: &S,
        encoded: Option<Result<Payload, String>>,
    ) -> (Result<(), Canceled>, Effects<A>) {
        if self.phase != Phase::Running {
            return (Ok(()), Effects::none());
        }
        let bytes = match encoded {
            None => None,
            Some(Ok(b)) => Some(b),
            Some(Err(e)) => {
                if self.state_failure.is_none() {
                    self.state_failure = Some(format!(
                        "the agent state at a safe point cannot be stored: {e}"
                    ));
                }
                if self.captured.is_none() {
                    self.captured = Some(kind);
                }
                return (Err(Canceled { at: kind }), Effects::none());
            }
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        self.state = Some(StateSnap {
            value: state.clone(),
            bytes,
            tag,
        });
        // The state covers the steps before it (S1b): their entries go with its write.
        self.steps.safe_point(self.settings.journal_writes);
        let mut result = Ok(());
        if let Some(c) = self.active {
            if c.matches(kind) {
                if self.captured.is_none() {
                    self.captured = Some(kind);
                }
                result = Err(Canceled { at: kind });
            }
        }
        if result.is_ok() {
            if let Some(at) = self.captured {
                // Already captured earlier and swallowed: keep answering Canceled.
                result = Err(Canceled { at });
            }
        }
        let progress = result.is_ok() && self.settings.safe_points_written;
        (result, Effects::progress(progress))
    }

    /// Whether a cancel was captured at a safe point (for `TurnCx::is_canceled`).
    pub fn is_captured(&self) -> bool {
        self.captured.is_some()
    }

    /// Whether an `Ok` outcome returned now would stand (for the turn's wake-up, S39):
    /// no cancel captured at a safe point, no state that could not be stored and no
    /// failed step, each of which [`finish`](Self::finish) puts before the outcome.
    pub fn outcome_would_stand(&self) -> bool {
        self.captured.is_none() && self.state_failure.is_none() && self.steps.failure.is_none()
    }

    /// Planning did not complete (turn-task side).
    pub fn end_planning(&mut self, reason: String, plan_failed: Option<FailureKind>) -> Effects<A> {
        self.phase = Phase::Ended;
        self.ending = Some(Ending::PlanAborted {
            reason,
            plan_failed,
        });
        Effects::answer(
            std::mem::take(&mut self.pending_acks),
            AckAnswer::TargetEnded,
        )
    }

    /// The plan consumed nothing (turn-task side): no turn runs; `split` is what it
    /// handed back and dropped (the session reads it at the turn's end).
    pub fn end_deferred(&mut self, split: PlanSplit<I>) -> Effects<A> {
        self.phase = Phase::Ended;
        self.split = Some(split);
        self.ending = Some(Ending::Deferred);
        Effects::answer(
            std::mem::take(&mut self.pending_acks),
            AckAnswer::TargetEnded,
        )
    }

    /// The turn task died without classifying the turn (a panic outside the agent's
    /// futures, e.g. in a future's destructor): record a failure so the session can
    /// account for the items. Nothing happens when an ending exists.
    pub fn abandon(&mut self, reason: String) -> Effects<A> {
        if self.ending.is_some() {
            return Effects::none();
        }
        let ending = match self.phase {
            Phase::Planning => Ending::PlanAborted {
                reason,
                plan_failed: Some(FailureKind::Panic),
            },
            Phase::Running | Phase::Ended => Ending::Ran {
                end: TurnEnd::Failed(reason),
                resume_state: self.state.clone(),
                failure: Some(FailureKind::Panic),
                journal: self.steps.to_record(),
                carried: None,
            },
        };
        self.phase = Phase::Ended;
        self.ending = Some(ending);
        Effects::answer(
            std::mem::take(&mut self.pending_acks),
            AckAnswer::TargetEnded,
        )
    }

    /// Takes the ending (session side, after the task's end; or a killed session's
    /// salvage).
    pub fn take_ending(&mut self) -> Option<Ending<S>> {
        self.ending.take()
    }
}
