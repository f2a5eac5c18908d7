//! The control block one turn shares between its session and its turn task: the shell
//! over the turn's state machine (`agentloop_core::turn::TurnMachine`).
//!
//! The machine decides everything (the phase, the merged cancel and its origins, the
//! capture at a safe point, the resumable state, the step book, the turn's
//! classification); this shell keeps it under one lock shared by the session and the
//! turn task, turns tokio's clock into the machine's `now`, encodes states outside the
//! lock, keeps the steps' waiters (reply ports) beside the machine so a write takes both
//! at once, hands a direct journal entry to the store under the lock, and performs the
//! machine's effects once the lock is released: waking the turn task, telling the
//! cancel's waiters, answering preempt acknowledgements, telling the session the turn
//! progressed. Neither side waits on the other while holding the lock.
//!
//! Invariant: once the phase is `Ended`, nothing changes any more, and the session
//! treats the turn as having no target for new cancels.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::hooks::encode_with;
pub(crate) use super::hooks::TurnHooks;
pub(crate) use super::writes::{journal_puts, DirectJournal, LiveTurn, StepDurable, StepWrite};
use super::writes::{log_unframed, no_write};
use crate::cancel::{CancelRequest, Canceled, SafePoint};
use crate::events::TurnEnd;
use crate::exit::FailureKind;
use crate::push::{PendingAck, PreemptAck};
use agentloop_core::ledger::PlanSplit;
use agentloop_core::steps::{
    Journal, JournalEntry, StepDecision, StepError, StepPolicy, TurnJournal,
};
use agentloop_core::turn::{AckAnswer, Effects, Outcome, Requeue, RunEnd, StepFinish, TurnMachine};

pub(crate) use agentloop_core::turn::{
    is_carried, Ending, Origin, Phase, StateSnap, Submitted, LOADED_CARRIED_TAG,
};

/// The machine and the steps' waiters, under one lock.
struct Locked<I, S> {
    machine: TurnMachine<I, S, PendingAck<I>>,
    /// Steps waiting for the session's write that holds their entry.
    waiters: Vec<tokio::sync::oneshot::Sender<bool>>,
}

impl<I, S> Locked<I, S> {
    fn add_waiter(&mut self) -> StepDurable {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiters.push(tx);
        rx
    }
}

/// The shared control block of one turn.
pub(crate) struct TurnControl<I, S> {
    pub(crate) index: u64,
    state: Mutex<Locked<I, S>>,
    hooks: TurnHooks<S>,
    /// Wakes the turn task when the cancel changed (a new deadline, Immediate).
    wake: Notify,
    /// Told (every waiter) when a cancel becomes active while the turn runs: what
    /// `TurnCx::cancel_requested` waits on (`wake` is the turn task's alone).
    cancel_watch: Notify,
    /// Set once a preempt is submitted to the running turn (S8).
    preempted: AtomicBool,
    preempted_notify: Notify,
    /// Under `sync` and `turn`: the answer to "is my end durable?", which the task
    /// awaits before sending `TurnEnded`.
    durable_end: Mutex<Option<tokio::sync::oneshot::Receiver<bool>>>,
    /// Writes journal entries straight into the record, when the session's store can
    /// (installed by the session's shell when the turn starts).
    direct: std::sync::OnceLock<DirectJournal>,
}

impl<I: Clone, S: Clone> TurnControl<I, S> {
    pub(crate) fn new(
        index: u64,
        input_state: Option<StateSnap<S>>,
        journal: Journal,
        hooks: TurnHooks<S>,
    ) -> Self {
        TurnControl {
            index,
            state: Mutex::new(Locked {
                machine: TurnMachine::new(index, input_state, journal, hooks.settings()),
                waiters: Vec::new(),
            }),
            hooks,
            wake: Notify::new(),
            cancel_watch: Notify::new(),
            preempted: AtomicBool::new(false),
            preempted_notify: Notify::new(),
            durable_end: Mutex::new(None),
            direct: std::sync::OnceLock::new(),
        }
    }

    /// Performs what the machine asked for (never under the lock).
    fn apply(&self, fx: Effects<PendingAck<I>>) {
        if fx.preempted {
            self.preempted.store(true, Ordering::Release);
            self.preempted_notify.notify_waiters();
        }
        if fx.wake_task {
            self.wake.notify_one();
        }
        if fx.cancel_watch {
            self.cancel_watch.notify_waiters();
        }
        let answer = match fx.ack_answer {
            AckAnswer::Submitted => PreemptAck::Submitted { turn: self.index },
            AckAnswer::TargetEnded => PreemptAck::TargetEnded { turn: self.index },
        };
        for ack in fx.acks {
            ack.answer(answer);
        }
        if fx.progress {
            if let Some(p) = &self.hooks.progress {
                p();
            }
        }
    }

    /// Installs the direct journal writer (once; before the turn runs).
    pub(crate) fn set_direct(&self, direct: DirectJournal) {
        let _ = self.direct.set(direct);
    }

    /// A write of the session's showing this running turn as the record's cut turn
    /// is durable (the shell says so from its completion): its steps' entries may go
    /// straight into the record from now on.
    pub(crate) fn cut_on_record(&self) {
        self.state.lock().machine.cut_on_record();
    }

    /// The turn's task sends `TurnEnded` only once `rx` says whether the write holding
    /// the end succeeded (a dropped sender: it did not).
    pub(crate) fn wait_for_durable_end(&mut self, rx: tokio::sync::oneshot::Receiver<bool>) {
        *self.durable_end.get_mut() = Some(rx);
    }

    /// What the task awaits before sending `TurnEnded`, if anything (taken once).
    pub(crate) fn take_durable_end(&self) -> Option<tokio::sync::oneshot::Receiver<bool>> {
        self.durable_end.lock().take()
    }

    pub(crate) fn phase(&self) -> Phase {
        self.state.lock().machine.phase()
    }

    /// Takes the plan's answer (session side; once).
    pub(crate) fn take_split(&self) -> Option<PlanSplit<I>> {
        self.state.lock().machine.take_split()
    }

    /// The consumed items of a plan whose answer the session has not taken yet, for a
    /// push strategy (S9). A copy, so user code never runs under this lock.
    pub(crate) fn consumed_view(&self) -> Option<Vec<I>> {
        self.state.lock().machine.consumed_view()
    }

    /// A copy of the resumable state (a write that must encode it itself).
    pub(crate) fn state_snapshot(&self) -> Option<StateSnap<S>> {
        self.state.lock().machine.state_snapshot()
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

    /// Submits a cancel (session side); see `TurnMachine::submit`. A preempt's
    /// acknowledgement that the machine does not hold is handed back.
    pub(crate) fn submit(
        &self,
        req: CancelRequest,
        origin: Origin,
        now: Instant,
        ack: Option<PendingAck<I>>,
    ) -> (Submitted, Option<PendingAck<I>>) {
        let (submitted, ack, fx) =
            self.state
                .lock()
                .machine
                .submit(req, origin, now.into_std(), ack);
        self.apply(fx);
        (submitted, ack)
    }

    /// A stop committed while planning (S6): the turn must not run. Returns whether the
    /// turn was still planning (see `TurnMachine::abort_planning`).
    pub(crate) fn abort_planning(&self, cancel: Option<CancelRequest>) -> bool {
        let aborted = self.state.lock().machine.abort_planning(cancel);
        if aborted {
            self.wake.notify_one();
        }
        aborted
    }

    /// Whether the planning turn was told to abort (turn-task side).
    pub(crate) fn planning_aborted(&self) -> bool {
        self.state.lock().machine.planning_aborted()
    }

    /// Planning is done (turn-task side); see `TurnMachine::start_running`.
    pub(crate) fn start_running(&self, split: Option<PlanSplit<I>>, now: Instant) {
        let fx = self
            .state
            .lock()
            .machine
            .start_running(split, now.into_std());
        self.apply(fx);
    }

    /// The absolute deadline after which the turn must be dropped, if any.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.state.lock().machine.deadline().map(Instant::from_std)
    }

    /// Whether the turn's future must be dropped now (Immediate in force).
    pub(crate) fn must_kill(&self) -> bool {
        self.state.lock().machine.must_kill()
    }

    /// The deadline passed: escalate to Immediate (S2).
    pub(crate) fn escalate_on_timeout(&self, now: Instant) {
        self.state
            .lock()
            .machine
            .escalate_on_timeout(now.into_std());
    }

    /// Resolves once a cancel (a stop's or a preempt's) is in force for the running
    /// turn that a safe point of kind `kind` would capture.
    pub(crate) async fn cancel_requested(&self, kind: SafePoint) {
        loop {
            let notified = self.cancel_watch.notified();
            tokio::pin!(notified);
            // Registered before the check, so an activation in between is not missed.
            notified.as_mut().enable();
            if self.state.lock().machine.cancel_matches(kind) {
                return;
            }
            notified.await;
        }
    }

    /// Waits until the cancel changed.
    pub(crate) async fn changed(&self) {
        self.wake.notified().await
    }

    /// A safe point (S1); see `TurnMachine::safe_point`. When the session writes safe
    /// points, the state is encoded first, outside the lock.
    pub(crate) fn safe_point(&self, kind: SafePoint, state: &S) -> Result<(), Canceled> {
        if self.phase() != Phase::Running {
            return Ok(());
        }
        let encoded = self.hooks.encode_state.map(|f| encode_with(f, state));
        let (result, fx) = self.state.lock().machine.safe_point(kind, state, encoded);
        self.apply(fx);
        result
    }

    /// Whether a cancel was captured at a safe point (for `TurnCx::is_canceled`).
    pub(crate) fn is_captured(&self) -> bool {
        self.state.lock().machine.is_captured()
    }

    /// Whether an `Ok` outcome returned now would stand (for the turn's wake-up, S39).
    pub(crate) fn outcome_would_stand(&self) -> bool {
        self.state.lock().machine.outcome_would_stand()
    }

    /// Planning did not complete (turn-task side).
    pub(crate) fn end_planning(&self, reason: String, plan_failed: Option<FailureKind>) {
        let fx = self.state.lock().machine.end_planning(reason, plan_failed);
        self.apply(fx);
    }

    /// The plan consumed nothing (turn-task side): no turn runs; `split` is what it
    /// handed back and dropped.
    pub(crate) fn end_deferred(&self, split: PlanSplit<I>) {
        let fx = self.state.lock().machine.end_deferred(split);
        self.apply(fx);
    }

    /// The turn is over (turn-task side): classify it (see `TurnMachine::finish`) and
    /// return the `TurnEnd` for the `TurnEnded` event. An interrupt's state, or the
    /// state a completed turn carries, is encoded first, outside the lock; steps still
    /// waiting for a write learn it will not come.
    pub(crate) fn finish(&self, run: RunEnd<S>) -> TurnEnd {
        let (interrupt_bytes, carried_bytes) = match &run {
            RunEnd::Returned(Ok(Outcome::Interrupted(_, state))) => {
                (self.hooks.encode_state.map(|f| encode_with(f, state)), None)
            }
            RunEnd::Returned(Ok(Outcome::CompletedWith(state))) => (
                None,
                self.hooks.encode_carried.map(|f| encode_with(f, state)),
            ),
            _ => (None, None),
        };
        let mut st = self.state.lock();
        st.waiters.clear();
        st.machine.finish(run, interrupt_bytes, carried_bytes)
    }

    /// What a write of the live record takes of the turn (session side): the state, the
    /// journal and the steps' waiters together, so a stored state and the steps it
    /// covers always agree. `whole`: the write replaces the record.
    pub(crate) fn take_for_write(&self, whole: bool, session: &str) -> LiveTurn<S> {
        let mut st = self.state.lock();
        let live = st.machine.take_for_write(whole, session);
        let waiters = std::mem::take(&mut st.waiters);
        drop(st);
        log_unframed(&live.unframed);
        LiveTurn {
            state: live.state,
            value: live.value,
            mark: live.mark,
            changes: live.changes,
            waiters,
        }
    }

    /// Every journal entry a write may have stored for this turn, for the session to
    /// delete at the turn's end.
    pub(crate) fn journal_leftovers(&self) -> Vec<u32> {
        self.state.lock().machine.journal_leftovers()
    }

    /// The journal's entries and mark (a turn that ended, or a resume turn that never
    /// ran, hands them back to the session).
    pub(crate) fn journal(&self) -> Option<TurnJournal> {
        self.state.lock().machine.journal()
    }

    /// Decides a step the agent asks to run (turn-task side); see
    /// `TurnMachine::step_begin`. The answer says where to wait for the write of a
    /// `NoRetry` step's beginning, if the session writes it.
    pub(crate) fn step_begin(
        &self,
        name: &str,
        policy: StepPolicy,
        session: &str,
    ) -> Result<(StepDecision, Option<StepDurable>), Canceled> {
        let mut st = self.state.lock();
        let (decision, queued, fx) = st.machine.step_begin(name, policy, session)?;
        let wait = queued.then(|| st.add_waiter());
        drop(st);
        self.apply(fx);
        Ok((decision, wait))
    }

    /// Journals a step's result (turn-task side); see `TurnMachine::step_finish`. A
    /// direct entry is handed to the store under the lock, so a write that replaces the
    /// whole record either includes it or follows it.
    pub(crate) fn step_finish(
        &self,
        occurrence: u32,
        name: &str,
        result: Vec<u8>,
        session: &str,
    ) -> Result<Option<StepWrite>, StepError> {
        let direct = self.direct.get();
        let mut st = self.state.lock();
        let (finish, fx) =
            st.machine
                .step_finish(occurrence, name, result, session, direct.is_some())?;
        let write = match (finish, direct) {
            (StepFinish::Unwritten, _) => None,
            (StepFinish::TurnOver, _) => Some(StepWrite::Session(no_write())),
            (StepFinish::Direct(change, entry), Some(direct)) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                direct(change, crate::store::committer::Answer::oneshot(tx));
                Some(StepWrite::Direct(rx, entry))
            }
            (StepFinish::Direct(_, entry), None) => {
                // Not asked for without a writer; queued with the next write instead.
                return Ok(self
                    .requeue_locked(st, &entry, session)
                    .map(StepWrite::Session));
            }
            (StepFinish::Queued, _) => Some(StepWrite::Session(st.add_waiter())),
        };
        drop(st);
        self.apply(fx);
        Ok(write)
    }

    /// A direct write of `entry` was refused by the store (no record yet, another
    /// format): the session writes it with its next write instead.
    pub(crate) fn step_requeue(&self, entry: &JournalEntry, session: &str) -> Option<StepDurable> {
        let st = self.state.lock();
        self.requeue_locked(st, entry, session)
    }

    fn requeue_locked(
        &self,
        mut st: parking_lot::MutexGuard<'_, Locked<I, S>>,
        entry: &JournalEntry,
        session: &str,
    ) -> Option<StepDurable> {
        let (requeue, fx) = st.machine.step_requeue(entry, session);
        let wait = match requeue {
            Requeue::TurnOver => Some(no_write()),
            Requeue::Covered | Requeue::Failed => None,
            Requeue::Queued => Some(st.add_waiter()),
        };
        drop(st);
        self.apply(fx);
        wait
    }

    /// A step decided to run ended without a result (its future was dropped, or its
    /// result did not encode): it no longer holds back a safe point.
    pub(crate) fn step_abandon(&self, occurrence: u32) {
        self.state.lock().machine.step_abandon(occurrence);
    }

    /// A step cannot go on: the turn ends `Failed` with `reason`, whatever the agent
    /// returns.
    pub(crate) fn step_failed(&self, reason: String) {
        self.state.lock().machine.step_failed(reason);
    }

    /// The turn task died without classifying the turn: record a failure so the
    /// session can account for the items (see `TurnMachine::abandon`).
    pub(crate) fn abandon(&self, reason: String) {
        let fx = self.state.lock().machine.abandon(reason);
        self.apply(fx);
    }

    /// Takes the ending (session side, after `TurnFinished`; or a killed session's
    /// salvage).
    pub(crate) fn take_ending(&self) -> Option<Ending<S>> {
        self.state.lock().machine.take_ending()
    }
}
