//! The control block one turn shares between its TurnLoop actor and its turn task.
//!
//! It owns the turn's phase (planning → running → ended), the merged cancel (S3) with
//! its origins (stop or preempt), the capture of a cancel at a safe point (S1), the
//! last resumable state, and, once the turn is over, its classification. The actor only
//! submits cancels and reads the ending; the turn task only transitions phases and
//! records what happened. Neither waits on the other while holding the lock.
//!
//! Invariant: once `phase` is `Ended`, nothing changes any more, and the actor treats
//! the turn as having no target for new cancels.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::agent::TurnOutcome;
use crate::cancel::{CancelInfo, CancelMode, CancelRequest, CancelState, Canceled, SafePoint};
use crate::events::TurnEnd;
use crate::exit::FailureKind;
use crate::push::{PendingAck, PreemptAck};

/// Where a turn is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The plan is being computed (S5).
    Planning,
    /// The agent's `run_turn` is running.
    Running,
    /// The turn is over (its task may still be sending its last events).
    Ended,
}

/// Who asked for a cancel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A stop request (S11): a cut turn ends the session.
    Stop,
    /// A preempting push (S7): a cut turn hands its items to the next plan.
    Preempt,
}

/// What submitting a cancel did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Submitted {
    /// Held until the planning turn becomes active.
    Pending,
    /// Applied to the running turn.
    Active,
    /// The turn is already over.
    TurnEnded,
}

/// How the agent's future ended.
pub(crate) enum RunEnd<S> {
    /// `run_turn` returned.
    Returned(Result<TurnOutcome<S>, crate::agent::AgentError>),
    /// `run_turn` panicked.
    Panicked(String),
    /// The future was dropped by an Immediate cancel.
    Killed,
}

/// Where a turn's items are, for a `sync` record (S16a).
pub(crate) enum LiveTurn<I, S> {
    /// Nothing consumed yet: the offered items are all still to be handled.
    Planning,
    /// In flight, or cut / interrupted / failed: the consumed items are the turn to
    /// resume, with its state; the plan's remaining items are still to be handled.
    Cut {
        consumed: Vec<I>,
        remaining: Vec<I>,
        state: Option<S>,
    },
    /// Completed (or the plan consumed nothing): only the remaining items are left.
    Done { remaining: Vec<I> },
    /// Preempted: its items go to the next plan first, then the remaining ones.
    Requeued { consumed: Vec<I>, remaining: Vec<I> },
}

/// How the whole turn ended, read by the actor after the task's `TurnFinished`.
pub(crate) enum Ending<I, S> {
    /// Planning did not complete: the offered items go back untouched (S6).
    PlanAborted {
        /// Why.
        reason: String,
        /// The plan itself failed, and how (the session exits `Failed`); `None` when a
        /// stop arrived while planning.
        plan_failed: Option<FailureKind>,
    },
    /// The plan consumed nothing, so no turn ran; what it handed back waits for new
    /// input.
    Deferred,
    /// The turn ran.
    Ran {
        /// How it ended.
        end: TurnEnd,
        /// The items the turn consumed.
        consumed: Vec<I>,
        /// The state to resume from if the turn was cut or interrupted.
        resume_state: Option<S>,
        /// For a failed turn, what kind of failure.
        failure: Option<FailureKind>,
    },
}

pub(crate) struct ControlState<I, S> {
    pub(crate) phase: Phase,
    /// Cancels submitted while planning, activated when the turn starts running (S7).
    pending: Option<CancelRequest>,
    pending_by_stop: bool,
    pending_by_preempt: bool,
    /// Preempt acknowledgements waiting for the turn to become active.
    pending_acks: Vec<PendingAck<I>>,
    /// The merged cancel of the running turn.
    active: Option<CancelState>,
    first_mode: Option<CancelMode>,
    by_stop: bool,
    by_preempt: bool,
    /// A stop committed while planning: do not run the turn (S6).
    abort_planning: bool,
    /// The safe point at which a cancel was honoured.
    captured: Option<SafePoint>,
    /// The state recorded at the last safe point.
    last_state: Option<S>,
    /// The state a resume turn started from (its input).
    input_state: Option<S>,
    /// A copy of the consumed items (the originals were moved into the turn).
    pub(crate) consumed: Vec<I>,
    /// Items the plan handed back (S5).
    pub(crate) remaining: Vec<I>,
    /// Items the plan dropped (S5).
    pub(crate) dropped: u64,
    ending: Option<Ending<I, S>>,
}

/// The shared control block of one turn.
pub(crate) struct TurnControl<I, S> {
    pub(crate) index: u64,
    state: Mutex<ControlState<I, S>>,
    /// Wakes the turn task when the cancel changed (a new deadline, Immediate).
    wake: Notify,
    /// Set once a preempt is submitted to the running turn (S8).
    preempted: AtomicBool,
    preempted_notify: Notify,
}

impl<I: Clone, S: Clone> TurnControl<I, S> {
    pub(crate) fn new(index: u64, input_state: Option<S>) -> Self {
        TurnControl {
            index,
            state: Mutex::new(ControlState {
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
                last_state: None,
                input_state,
                consumed: Vec::new(),
                remaining: Vec::new(),
                dropped: 0,
                ending: None,
            }),
            wake: Notify::new(),
            preempted: AtomicBool::new(false),
            preempted_notify: Notify::new(),
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        self.state.lock().phase
    }

    /// Where the turn's items are right now, for a `sync` record (S16a), read from the
    /// ending once the turn is over (the consumed items move into it).
    pub(crate) fn live(&self) -> LiveTurn<I, S> {
        let st = self.state.lock();
        match (&st.ending, st.phase) {
            (None, Phase::Planning) => LiveTurn::Planning,
            (None, _) => LiveTurn::Cut {
                consumed: st.consumed.clone(),
                remaining: st.remaining.clone(),
                state: st.last_state.clone().or_else(|| st.input_state.clone()),
            },
            (Some(Ending::PlanAborted { .. }), _) => LiveTurn::Planning,
            (Some(Ending::Deferred), _) => LiveTurn::Done {
                remaining: st.remaining.clone(),
            },
            (
                Some(Ending::Ran {
                    end,
                    consumed,
                    resume_state,
                    ..
                }),
                _,
            ) => match end {
                TurnEnd::Completed => LiveTurn::Done {
                    remaining: st.remaining.clone(),
                },
                TurnEnd::Preempted(_) => LiveTurn::Requeued {
                    consumed: consumed.clone(),
                    remaining: st.remaining.clone(),
                },
                _ => LiveTurn::Cut {
                    consumed: consumed.clone(),
                    remaining: st.remaining.clone(),
                    state: resume_state.clone(),
                },
            },
        }
    }

    /// The phase and a copy of the consumed items, for push strategies (S9). A copy,
    /// so user code never runs under this lock.
    pub(crate) fn phase_and_consumed(&self) -> (Phase, Vec<I>) {
        let st = self.state.lock();
        (st.phase, st.consumed.clone())
    }

    fn fire_preempted(&self) {
        self.preempted.store(true, Ordering::Release);
        self.preempted_notify.notify_waiters();
    }

    pub(crate) fn is_preempted(&self) -> bool {
        self.preempted.load(Ordering::Acquire)
    }

    /// Resolves once a preempt was submitted to this turn.
    pub(crate) async fn preempted(&self) {
        loop {
            let notified = self.preempted_notify.notified();
            tokio::pin!(notified);
            // Register before checking the flag, so a concurrent fire is not missed.
            notified.as_mut().enable();
            if self.is_preempted() {
                return;
            }
            notified.await;
        }
    }

    /// Submits a cancel (actor side). A planning turn holds it until it runs; a running
    /// turn merges it now (S3); an ended turn ignores it. A preempt's acknowledgement is
    /// held with a pending cancel (answered when the turn starts or ends), under the
    /// same lock, so it can never miss the transition; otherwise it is handed back.
    pub(crate) fn submit(
        &self,
        req: CancelRequest,
        origin: Origin,
        now: Instant,
        ack: Option<PendingAck<I>>,
    ) -> (Submitted, Option<PendingAck<I>>) {
        let mut st = self.state.lock();
        match st.phase {
            Phase::Ended => (Submitted::TurnEnded, ack),
            Phase::Planning => {
                st.pending = Some(match st.pending {
                    Some(p) => p.merge(req),
                    None => req,
                });
                match origin {
                    Origin::Stop => st.pending_by_stop = true,
                    Origin::Preempt => st.pending_by_preempt = true,
                }
                if let Some(a) = ack {
                    st.pending_acks.push(a);
                }
                (Submitted::Pending, None)
            }
            Phase::Running => {
                Self::activate_cancel(&mut st, req, now);
                match origin {
                    Origin::Stop => st.by_stop = true,
                    Origin::Preempt => st.by_preempt = true,
                }
                drop(st);
                if origin == Origin::Preempt {
                    self.fire_preempted();
                }
                self.wake.notify_one();
                (Submitted::Active, ack)
            }
        }
    }

    fn activate_cancel(st: &mut ControlState<I, S>, req: CancelRequest, now: Instant) {
        let new = req.at(now);
        if st.first_mode.is_none() {
            st.first_mode = Some(new.mode);
        }
        st.active = CancelState::merge_opt(st.active, Some(new), now);
    }

    /// A stop committed while planning (S6): the turn must not run. Returns whether the
    /// turn was still planning.
    ///
    /// The stop's cancel (if any) is held as pending too: if the plan completes before
    /// the task sees the abort, the plan's decision stands (it is never discarded
    /// after it returned) and the turn runs under that cancel instead.
    pub(crate) fn abort_planning(&self, cancel: Option<CancelRequest>) -> bool {
        let mut st = self.state.lock();
        if st.phase != Phase::Planning {
            return false;
        }
        st.abort_planning = true;
        if let Some(req) = cancel {
            st.pending = Some(match st.pending {
                Some(p) => p.merge(req),
                None => req,
            });
            st.pending_by_stop = true;
        }
        drop(st);
        self.wake.notify_one();
        true
    }

    /// Whether the planning turn was told to abort (turn-task side).
    pub(crate) fn planning_aborted(&self) -> bool {
        self.state.lock().abort_planning
    }

    /// Planning is done (turn-task side): the turn becomes active, pending cancels are
    /// submitted and their acknowledgements sent. A plan that returned is never
    /// discarded, even if a stop asked to abort planning meanwhile: the stop's cancel is
    /// among the pending ones (see [`TurnControl::abort_planning`]).
    pub(crate) fn start_running(
        &self,
        consumed: Vec<I>,
        remaining: Vec<I>,
        dropped: u64,
        now: Instant,
    ) {
        let mut st = self.state.lock();
        st.phase = Phase::Running;
        st.consumed = consumed;
        st.remaining = remaining;
        st.dropped = dropped;
        let mut preempted = false;
        if let Some(req) = st.pending.take() {
            Self::activate_cancel(&mut st, req, now);
            st.by_stop |= st.pending_by_stop;
            st.by_preempt |= st.pending_by_preempt;
            preempted = st.pending_by_preempt;
        }
        let acks = std::mem::take(&mut st.pending_acks);
        drop(st);
        if preempted {
            self.fire_preempted();
        }
        for ack in acks {
            ack.answer(PreemptAck::Submitted { turn: self.index });
        }
    }

    /// The absolute deadline after which the turn must be dropped, if any.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.state.lock().active.and_then(|c| c.deadline)
    }

    /// Whether the turn's future must be dropped now (Immediate in force).
    pub(crate) fn must_kill(&self) -> bool {
        matches!(
            self.state.lock().active,
            Some(CancelState {
                mode: CancelMode::Immediate,
                ..
            })
        )
    }

    /// The deadline passed: escalate to Immediate (S2).
    pub(crate) fn escalate_on_timeout(&self, now: Instant) {
        let mut st = self.state.lock();
        if let Some(c) = st.active {
            st.active = Some(c.normalized(now));
        }
    }

    /// Waits until the cancel changes.
    pub(crate) async fn changed(&self) {
        self.wake.notified().await
    }

    /// A safe point (S1): records the state; returns `Err(Canceled)` when the cancel in
    /// force matches `kind`. The capture is recorded here, so an agent that swallows the
    /// error does not hide the cancel.
    pub(crate) fn safe_point(&self, kind: SafePoint, state: &S) -> Result<(), Canceled> {
        let mut st = self.state.lock();
        if st.phase != Phase::Running {
            return Ok(());
        }
        st.last_state = Some(state.clone());
        if let Some(c) = st.active {
            if c.matches(kind) {
                if st.captured.is_none() {
                    st.captured = Some(kind);
                }
                return Err(Canceled { at: kind });
            }
        }
        if let Some(at) = st.captured {
            // Already captured earlier and swallowed: keep answering Canceled.
            return Err(Canceled { at });
        }
        Ok(())
    }

    /// Whether a cancel was captured at a safe point (for `TurnCx::is_canceled`).
    pub(crate) fn is_captured(&self) -> bool {
        self.state.lock().captured.is_some()
    }

    /// Planning did not complete (turn-task side).
    pub(crate) fn end_planning(&self, reason: String, plan_failed: Option<FailureKind>) {
        let mut st = self.state.lock();
        st.phase = Phase::Ended;
        st.ending = Some(Ending::PlanAborted {
            reason,
            plan_failed,
        });
        let acks = std::mem::take(&mut st.pending_acks);
        drop(st);
        for ack in acks {
            ack.answer(PreemptAck::TargetEnded { turn: self.index });
        }
    }

    /// The plan consumed nothing (turn-task side): no turn runs.
    pub(crate) fn end_deferred(&self, remaining: Vec<I>, dropped: u64) {
        let mut st = self.state.lock();
        st.phase = Phase::Ended;
        st.remaining = remaining;
        st.dropped = dropped;
        st.ending = Some(Ending::Deferred);
        let acks = std::mem::take(&mut st.pending_acks);
        drop(st);
        for ack in acks {
            ack.answer(PreemptAck::TargetEnded { turn: self.index });
        }
    }

    /// The turn is over (turn-task side): classify it and return the `TurnEnd` for the
    /// `TurnEnded` event.
    ///
    /// A captured or Immediate cancel wins over whatever the agent returned (S1, S13);
    /// a cancel that any stop contributed to ends the session (Canceled), one that only
    /// preempts contributed to is a preemption (S8).
    pub(crate) fn finish(&self, run: RunEnd<S>) -> TurnEnd {
        let mut st = self.state.lock();
        st.phase = Phase::Ended;
        let killed = matches!(run, RunEnd::Killed);
        let cut = if killed || st.captured.is_some() {
            let mode = st.active.map(|c| c.mode).unwrap_or(CancelMode::Immediate);
            let first = st.first_mode.unwrap_or(mode);
            Some(CancelInfo {
                mode,
                at: if killed { None } else { st.captured },
                escalated: mode != first && mode.dominates(first),
                timed_out: st.active.is_some_and(|c| c.timed_out),
            })
        } else {
            None
        };
        let mut interrupt_state = None;
        let failure = match (&cut, &run) {
            (Some(_), _) if st.by_stop || st.by_preempt => None,
            (Some(_), _) => Some(FailureKind::Internal),
            (None, RunEnd::Returned(Err(_))) => Some(FailureKind::Agent),
            (None, RunEnd::Panicked(_)) => Some(FailureKind::Panic),
            (None, RunEnd::Killed) => Some(FailureKind::Internal),
            (None, RunEnd::Returned(Ok(_))) => None,
        };
        let end = match (cut, run) {
            (Some(info), _) if st.by_stop => TurnEnd::Canceled(info),
            (Some(info), _) if st.by_preempt => TurnEnd::Preempted(info),
            (Some(_), _) => TurnEnd::Failed("turn was cut without a cancel request".into()),
            (None, RunEnd::Returned(Ok(TurnOutcome::Completed))) => TurnEnd::Completed,
            (None, RunEnd::Returned(Ok(TurnOutcome::Interrupted { info, state }))) => {
                interrupt_state = Some(state);
                TurnEnd::Interrupted(info)
            }
            (None, RunEnd::Returned(Err(crate::agent::AgentError::Canceled(c)))) => {
                TurnEnd::Failed(format!(
                    "agent returned Canceled ({c}) while no cancel was pending"
                ))
            }
            (None, RunEnd::Returned(Err(crate::agent::AgentError::Failed(e)))) => {
                TurnEnd::Failed(e)
            }
            (None, RunEnd::Panicked(msg)) => TurnEnd::Failed(format!("agent panicked: {msg}")),
            (None, RunEnd::Killed) => unreachable_killed(),
        };
        let resume_state = match &end {
            TurnEnd::Interrupted(_) => interrupt_state,
            // The state at the last safe point, or the turn's input if none (S2).
            _ => st.last_state.clone().or_else(|| st.input_state.clone()),
        };
        st.ending = Some(Ending::Ran {
            end: end.clone(),
            consumed: std::mem::take(&mut st.consumed),
            resume_state,
            failure,
        });
        end
    }

    /// The turn task died without classifying the turn (a panic outside the agent's
    /// futures, e.g. in a future's destructor): record a failure so the actor can
    /// account for the items. No-op when an ending exists.
    pub(crate) fn abandon(&self, reason: String) {
        let mut st = self.state.lock();
        if st.ending.is_some() {
            return;
        }
        let ending = match st.phase {
            Phase::Planning => Ending::PlanAborted {
                reason,
                plan_failed: Some(FailureKind::Panic),
            },
            Phase::Running | Phase::Ended => Ending::Ran {
                end: TurnEnd::Failed(reason),
                consumed: std::mem::take(&mut st.consumed),
                resume_state: st.last_state.clone().or_else(|| st.input_state.clone()),
                failure: Some(FailureKind::Panic),
            },
        };
        st.phase = Phase::Ended;
        st.ending = Some(ending);
        let acks = std::mem::take(&mut st.pending_acks);
        drop(st);
        for ack in acks {
            ack.answer(PreemptAck::TargetEnded { turn: self.index });
        }
    }

    /// Where the turn's items are right now, for an actor that dies before the turn
    /// reported (S10): `None` while planning (the offered items are all still to be
    /// handled), else (consumed, remaining, dropped, ending) as far as known.
    #[allow(clippy::type_complexity)]
    pub(crate) fn salvage(&self) -> Option<(Vec<I>, Vec<I>, u64, Option<TurnEnd>)> {
        let mut st = self.state.lock();
        let remaining = std::mem::take(&mut st.remaining);
        let dropped = st.dropped;
        match st.ending.take() {
            None if st.phase == Phase::Planning => None,
            None => Some((std::mem::take(&mut st.consumed), remaining, dropped, None)),
            Some(Ending::PlanAborted { .. }) => None,
            Some(Ending::Deferred) => Some((Vec::new(), remaining, dropped, None)),
            Some(Ending::Ran { end, consumed, .. }) => {
                Some((consumed, remaining, dropped, Some(end)))
            }
        }
    }

    /// Takes the ending (actor side, after `TurnFinished`).
    pub(crate) fn take_ending(&self) -> Option<(Ending<I, S>, Vec<I>, u64)> {
        let mut st = self.state.lock();
        let ending = st.ending.take()?;
        let remaining = std::mem::take(&mut st.remaining);
        Some((ending, remaining, st.dropped))
    }
}

// `cut` is always `Some` when the run was killed; this keeps the match total without a
// panic path.
fn unreachable_killed() -> TurnEnd {
    TurnEnd::Failed("turn dropped without a cancel".into())
}
