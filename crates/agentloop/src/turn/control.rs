//! The control block one turn shares between its session and its turn task.
//!
//! It owns the turn's phase (planning → running → ended), the merged cancel (S3) with
//! its origins (stop or preempt), the capture of a cancel at a safe point (S1), the
//! turn's resumable state (with its encoded bytes when the session writes each safe
//! point, S16a), the journal of its durable steps (S1b) under the same lock as the
//! state (a write takes both at once, so a stored state and the steps it covers always
//! agree), the plan's answer by entry number until the session takes it, and, once the
//! turn is over, its classification. The session only submits cancels and
//! reads what happened; the turn task only transitions phases and records what
//! happened. Neither waits on the other while holding the lock, and nothing is encoded
//! under it.
//!
//! Invariant: once `phase` is `Ended`, nothing changes any more, and the session treats
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
use crate::store::codec::PayloadError;
use crate::store::{JournalChange, Payload};
use agentloop_core::ledger::PlanSplit;
use agentloop_core::steps::{
    Journal, JournalMark, StepDecision, StepError, StepPolicy, TurnJournal,
};

/// Where a step learns that the write holding its entry is flushed (`true`), or
/// failed (`false`; a dropped sender: it failed).
pub(crate) type StepDurable = tokio::sync::oneshot::Receiver<bool>;

/// Writes a journal change straight into the stored record (S1b,
/// `CheckpointStore::append_journal_then`), answering when it is durable: what the
/// session installs in a turn whose steps' entries are written (`sync`, `turn`) when
/// its store can.
pub(crate) type DirectJournal =
    Box<dyn Fn(JournalChange, crate::store::committer::Answer<()>) + Send + Sync>;

/// Where a step's journal entry is being written.
pub(crate) enum StepWrite {
    /// With the session's next write.
    Session(StepDurable),
    /// Straight into the record; if the store refuses that (no record yet, another
    /// format), the entry goes with the session's next write instead.
    Direct(
        tokio::sync::oneshot::Receiver<Result<(), crate::store::StoreError>>,
        agentloop_core::steps::JournalEntry,
    ),
}

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

/// A resumable state: the value, its encoded bytes (when the session writes safe
/// points), and which state it is (0: the turn's input; then one per safe point).
#[derive(Clone, Debug)]
pub(crate) struct StateSnap<S> {
    pub(crate) value: S,
    pub(crate) bytes: Option<Payload>,
    pub(crate) tag: u64,
}

/// The tag of the state turn `index` carried to the next turn
/// (`TurnOutcome::CompletedWith`): the low 32 bits all ones, which no safe point's tag
/// (`index << 32 | n`, `n` from 1) and no cut turn's loaded state (0) has.
pub(crate) fn carried_tag(index: u64) -> u64 {
    index.wrapping_shl(32) | u64::from(u32::MAX)
}

/// The tag of a carried state read from a record.
pub(crate) const LOADED_CARRIED_TAG: u64 = u64::MAX;

/// Whether a state's tag says it is a carried state (see [`carried_tag`]).
pub(crate) fn is_carried(tag: u64) -> bool {
    tag & u64::from(u32::MAX) == u64::from(u32::MAX)
}

/// How the whole turn ended, read by the session after the task's `TurnFinished`.
pub(crate) enum Ending<S> {
    /// Planning did not complete: the offered items go back untouched (S6).
    PlanAborted {
        /// Why.
        reason: String,
        /// The plan itself failed, and how (the session exits `Failed`); `None` when a
        /// stop arrived while planning.
        plan_failed: Option<FailureKind>,
    },
    /// The plan consumed nothing, so no turn ran; its answer is the split.
    Deferred,
    /// The turn ran.
    Ran {
        /// How it ended.
        end: TurnEnd,
        /// The state to resume from if the turn was cut or interrupted.
        resume_state: Option<StateSnap<S>>,
        /// For a failed turn, what kind of failure.
        failure: Option<FailureKind>,
        /// The journal of its durable steps, as a record keeps it, when it has one
        /// (S1b): kept with a cut turn's state.
        journal: Option<TurnJournal>,
        /// The state a completed turn leaves to the next (`TurnOutcome::CompletedWith`).
        carried: Option<StateSnap<S>>,
    },
}

/// Encodes an agent state, checked (see `store::codec::payload::encode_checked`).
pub(crate) type EncodeState<S> = fn(&S) -> Result<Vec<u8>, PayloadError>;

/// What the session installs in each turn's control block.
pub(crate) struct TurnHooks<S> {
    /// When the session writes every safe point (`sync`): encodes a state (checked, so
    /// only a state that reads back is ever written).
    pub(crate) encode_state: Option<EncodeState<S>>,
    /// When the session persists (any durability): encodes the state a completed turn
    /// carries (`TurnOutcome::CompletedWith`), so a carried state is always stored as
    /// it was checked, and one that does not read back fails its turn.
    pub(crate) encode_carried: Option<EncodeState<S>>,
    /// Tells the session the turn progressed: a safe point recorded a state (`sync`),
    /// the plan's answer changes stored entries, or a step's journal entry waits for
    /// its write (`sync`, `turn`). Called outside the lock.
    pub(crate) progress: Option<Box<dyn Fn() + Send + Sync>>,
    /// Each journal entry is written before its step goes on (`sync` and `turn`, S1b);
    /// otherwise the journal is only kept in memory until the final write.
    pub(crate) journal_writes: bool,
}

impl<S> TurnHooks<S> {
    /// No hooks (a session that writes nothing while a turn runs).
    pub(crate) fn none() -> Self {
        TurnHooks {
            encode_state: None,
            encode_carried: None,
            progress: None,
            journal_writes: false,
        }
    }
}

/// The durable steps of one turn (S1b): the journal, the changes no write has taken
/// yet, and the steps waiting for the write that holds their entry.
struct StepBook {
    journal: Journal,
    changes: Vec<JournalChange>,
    waiters: Vec<tokio::sync::oneshot::Sender<bool>>,
    /// A step the turn cannot go on from (divergence, a result over the bound or not
    /// journaled): the turn ends `Failed` with it, whatever the agent returns.
    failure: Option<String>,
    /// A write replacing the whole record took the journal: entries are no longer
    /// written straight into the record this turn (one could land before that write and
    /// be removed by it).
    direct_off: bool,
    /// A write of the session's that shows this turn as the record's cut turn (its
    /// items, its state) is durable: only then may entries go straight into the record,
    /// so a record with journal entries always resumes this very turn (same index, same
    /// items), never a turn that plans again.
    direct_ok: bool,
}

/// What a write of the live record takes of the running turn, under one lock.
pub(crate) struct LiveTurn<S> {
    /// The resumable state's tag and bytes (`None`: not encoded by a safe point).
    pub(crate) state: Option<(u64, Option<Payload>)>,
    /// The state's value when no safe point encoded it (the write encodes it): the
    /// same state as the tag's, so it agrees with the journal's mark.
    pub(crate) value: Option<S>,
    /// The journal's mark, when the record must keep one.
    pub(crate) mark: Option<JournalMark>,
    /// The journal's changes since the last write, or every entry for a whole write.
    pub(crate) changes: Vec<JournalChange>,
    /// Steps whose entry this write holds.
    pub(crate) waiters: Vec<tokio::sync::oneshot::Sender<bool>>,
}

/// Encodes a journal entry for the record.
fn encode_entry(
    session: &str,
    entry: &agentloop_core::steps::JournalEntry,
) -> Result<Payload, String> {
    crate::store::codec::encode_journal_entry(session, entry).map_err(|e| e.to_string())
}

/// Every entry of `journal` as puts (a whole write).
pub(crate) fn journal_puts(session: &str, journal: &TurnJournal) -> Vec<JournalChange> {
    journal
        .entries
        .iter()
        .filter_map(|e| match encode_entry(session, e) {
            Ok(b) => Some(JournalChange::Put(e.occurrence, b)),
            Err(why) => {
                tracing::error!(step = e.occurrence, error = %why, "a journal entry cannot be stored");
                None
            }
        })
        .collect()
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

/// The shared control block of one turn.
pub(crate) struct TurnControl<I, S> {
    pub(crate) index: u64,
    state: Mutex<ControlState<I, S>>,
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
                state: input_state,
                // Tags are unique across the session's turns (0 is a record's state).
                next_tag: index.wrapping_shl(32) | 1,
                state_failure: None,
                split: None,
                ending: None,
                steps: StepBook {
                    journal,
                    changes: Vec::new(),
                    waiters: Vec::new(),
                    failure: None,
                    direct_off: false,
                    direct_ok: false,
                },
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

    /// Installs the direct journal writer (once; before the turn runs).
    pub(crate) fn set_direct(&self, direct: DirectJournal) {
        let _ = self.direct.set(direct);
    }

    /// A write of the session's showing this running turn as the record's cut turn
    /// is durable (the shell says so from its completion): its steps' entries may go
    /// straight into the record from now on.
    pub(crate) fn cut_on_record(&self) {
        let mut st = self.state.lock();
        if st.phase == Phase::Running {
            st.steps.direct_ok = true;
        }
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
        self.state.lock().phase
    }

    /// Takes the plan's answer (session side; once).
    pub(crate) fn take_split(&self) -> Option<PlanSplit<I>> {
        self.state.lock().split.take()
    }

    /// The consumed items of a plan whose answer the session has not taken yet, for a
    /// push strategy (S9). A copy, so user code never runs under this lock.
    pub(crate) fn consumed_view(&self) -> Option<Vec<I>> {
        let st = self.state.lock();
        let split = st.split.as_ref()?;
        Some(split.consumed.iter().map(|p| p.item.clone()).collect())
    }

    /// A copy of the resumable state (a write that must encode it itself).
    pub(crate) fn state_snapshot(&self) -> Option<StateSnap<S>> {
        self.state.lock().state.clone()
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

    /// Submits a cancel (session side). A planning turn holds it until it runs; a
    /// running turn merges it now (S3); an ended turn ignores it. A preempt's
    /// acknowledgement is held with a pending cancel (answered when the turn starts or
    /// ends), under the same lock, so it can never miss the transition; otherwise it is
    /// handed back.
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
                self.cancel_watch.notify_waiters();
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
    /// among the pending ones (see [`TurnControl::abort_planning`]). `split` is the
    /// plan's answer (`None` for a resume turn, whose items the session already knows);
    /// when it changes stored entries, the session is told.
    pub(crate) fn start_running(&self, split: Option<PlanSplit<I>>, now: Instant) {
        // Only a session that writes every change (`sync`) writes the plan's answer now.
        let notify = self.hooks.encode_state.is_some()
            && split.as_ref().is_some_and(PlanSplit::changes_entries);
        let mut st = self.state.lock();
        st.phase = Phase::Running;
        st.split = split;
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
        if notify {
            self.progress();
        }
    }

    fn progress(&self) {
        if let Some(p) = &self.hooks.progress {
            p();
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

    /// Resolves once a cancel (a stop's or a preempt's) is in force for the running
    /// turn that a safe point of kind `kind` would capture.
    pub(crate) async fn cancel_requested(&self, kind: SafePoint) {
        loop {
            let notified = self.cancel_watch.notified();
            tokio::pin!(notified);
            // Registered before the check, so an activation in between is not missed.
            notified.as_mut().enable();
            if self.state.lock().active.is_some_and(|c| c.matches(kind)) {
                return;
            }
            notified.await;
        }
    }

    /// Waits until the cancel changed.
    pub(crate) async fn changed(&self) {
        self.wake.notified().await
    }

    /// A safe point (S1): records `state` as the turn's resumable state and returns
    /// `Err(Canceled)` when the cancel in force matches `kind`. The capture is recorded
    /// here, so an agent that swallows the error does not hide the cancel. When the
    /// session writes safe points, the state is encoded first (outside the lock); a
    /// state that does not read back is not recorded, and the turn ends at this safe
    /// point, `Failed` (S15a: the stored record keeps its last good state).
    pub(crate) fn safe_point(&self, kind: SafePoint, state: &S) -> Result<(), Canceled> {
        if self.phase() != Phase::Running {
            return Ok(());
        }
        let bytes = match self.hooks.encode_state.map(|f| f(state)) {
            None => None,
            Some(Ok(b)) => Some(Payload::from(b)),
            Some(Err(e)) => {
                let mut st = self.state.lock();
                if st.state_failure.is_none() {
                    st.state_failure = Some(format!(
                        "the agent state at a safe point cannot be stored: {e}"
                    ));
                }
                if st.captured.is_none() {
                    st.captured = Some(kind);
                }
                return Err(Canceled { at: kind });
            }
        };
        let mut st = self.state.lock();
        if st.phase != Phase::Running {
            return Ok(());
        }
        let tag = st.next_tag;
        st.next_tag += 1;
        st.state = Some(StateSnap {
            value: state.clone(),
            bytes,
            tag,
        });
        // The state covers the steps before it (S1b): their entries go with its write.
        let dropped = st.steps.journal.safe_point();
        if self.hooks.journal_writes {
            st.steps
                .changes
                .extend(dropped.into_iter().map(JournalChange::Delete));
        }
        let mut result = Ok(());
        if let Some(c) = st.active {
            if c.matches(kind) {
                if st.captured.is_none() {
                    st.captured = Some(kind);
                }
                result = Err(Canceled { at: kind });
            }
        }
        if result.is_ok() {
            if let Some(at) = st.captured {
                // Already captured earlier and swallowed: keep answering Canceled.
                result = Err(Canceled { at });
            }
        }
        drop(st);
        if result.is_ok() && self.hooks.encode_state.is_some() {
            self.progress();
        }
        result
    }

    /// Whether a cancel was captured at a safe point (for `TurnCx::is_canceled`).
    pub(crate) fn is_captured(&self) -> bool {
        self.state.lock().captured.is_some()
    }

    /// Whether an `Ok` outcome returned now would stand (for the turn's wake-up, S39):
    /// no cancel captured at a safe point, no state that could not be stored and no
    /// failed step, each of which [`finish`](Self::finish) puts before the outcome.
    pub(crate) fn outcome_would_stand(&self) -> bool {
        let st = self.state.lock();
        st.captured.is_none() && st.state_failure.is_none() && st.steps.failure.is_none()
    }

    fn answer_acks(&self, st: &mut ControlState<I, S>) -> Vec<PendingAck<I>> {
        let _ = self;
        std::mem::take(&mut st.pending_acks)
    }

    /// Planning did not complete (turn-task side).
    pub(crate) fn end_planning(&self, reason: String, plan_failed: Option<FailureKind>) {
        let mut st = self.state.lock();
        st.phase = Phase::Ended;
        st.ending = Some(Ending::PlanAborted {
            reason,
            plan_failed,
        });
        let acks = self.answer_acks(&mut st);
        drop(st);
        for ack in acks {
            ack.answer(PreemptAck::TargetEnded { turn: self.index });
        }
    }

    /// The plan consumed nothing (turn-task side): no turn runs; `split` is what it
    /// handed back and dropped.
    pub(crate) fn end_deferred(&self, split: PlanSplit<I>) {
        let notify = split.changes_entries();
        let mut st = self.state.lock();
        st.phase = Phase::Ended;
        st.split = Some(split);
        st.ending = Some(Ending::Deferred);
        let acks = self.answer_acks(&mut st);
        drop(st);
        for ack in acks {
            ack.answer(PreemptAck::TargetEnded { turn: self.index });
        }
        let _ = notify; // the session reads the split at TurnFinished, which follows
    }

    /// The turn is over (turn-task side): classify it and return the `TurnEnd` for the
    /// `TurnEnded` event.
    ///
    /// A state that could not be stored fails the turn (S15a). Otherwise a captured or
    /// Immediate cancel wins over whatever the agent returned (S1, S13); a cancel that
    /// any stop contributed to ends the session (Canceled), one that only preempts
    /// contributed to is a preemption (S8). An interrupt's state, or the state a
    /// completed turn carries, is encoded here when the session writes safe points; one
    /// that does not read back fails the turn.
    pub(crate) fn finish(&self, run: RunEnd<S>) -> TurnEnd {
        // Encoded before the lock is taken (never under it).
        let interrupt_bytes = match (&run, self.hooks.encode_state) {
            (RunEnd::Returned(Ok(TurnOutcome::Interrupted { state, .. })), Some(f)) => {
                Some(f(state).map(Payload::from))
            }
            _ => None,
        };
        let carried_bytes = match (&run, self.hooks.encode_carried) {
            (RunEnd::Returned(Ok(TurnOutcome::CompletedWith { state })), Some(f)) => {
                Some(f(state).map(Payload::from))
            }
            _ => None,
        };
        let mut st = self.state.lock();
        st.phase = Phase::Ended;
        Self::release_waiters(&mut st);
        if let Some(reason) = st.state_failure.take().or_else(|| st.steps.failure.take()) {
            let end = TurnEnd::Failed(reason);
            st.ending = Some(Ending::Ran {
                end: end.clone(),
                resume_state: st.state.clone(),
                failure: Some(FailureKind::Record),
                journal: Self::journal_of(&st),
                carried: None,
            });
            return end;
        }
        let killed = matches!(run, RunEnd::Killed);
        let cut = if killed || st.captured.is_some() {
            let mode = st.active.map(|c| c.mode).unwrap_or(CancelMode::Immediate);
            let first = st.first_mode.unwrap_or(mode);
            Some(CancelInfo {
                mode,
                at: if killed { None } else { st.captured },
                escalated: mode != first && mode.dominates(first),
                timed_out: st.active.is_some_and(|c| c.timed_out),
                agent_error: match &run {
                    // The agent's own error, not the `Canceled` it propagated.
                    RunEnd::Returned(Err(
                        crate::agent::AgentError::Failed(e)
                        | crate::agent::AgentError::Permanent(e),
                    )) => Some(e.clone()),
                    RunEnd::Panicked(msg) => Some(format!("agent panicked: {msg}")),
                    _ => None,
                },
            })
        } else {
            None
        };
        let mut interrupt_state = None;
        let mut carried_value = None;
        let mut failure = match (&cut, &run) {
            (Some(_), _) if st.by_stop || st.by_preempt => None,
            (Some(_), _) => Some(FailureKind::Internal),
            (None, RunEnd::Returned(Err(e))) if e.is_permanent() => {
                Some(FailureKind::AgentPermanent)
            }
            (None, RunEnd::Returned(Err(_))) => Some(FailureKind::Agent),
            (None, RunEnd::Panicked(_)) => Some(FailureKind::Panic),
            (None, RunEnd::Killed) => Some(FailureKind::Internal),
            (None, RunEnd::Returned(Ok(_))) => None,
        };
        let mut end = match (cut, run) {
            (Some(info), _) if st.by_stop => TurnEnd::Canceled(info),
            (Some(info), _) if st.by_preempt => TurnEnd::Preempted(info),
            (Some(_), _) => TurnEnd::Failed("turn was cut without a cancel request".into()),
            // A wake-up's timer was armed by the turn task before the turn ended (its
            // last durable step, `session::turn_task`): the turn completed.
            (None, RunEnd::Returned(Ok(TurnOutcome::Completed | TurnOutcome::WakeAt(_)))) => {
                TurnEnd::Completed
            }
            (None, RunEnd::Returned(Ok(TurnOutcome::CompletedWith { state }))) => {
                carried_value = Some(state);
                TurnEnd::Completed
            }
            (None, RunEnd::Returned(Ok(TurnOutcome::Interrupted { info, state }))) => {
                interrupt_state = Some(state);
                TurnEnd::Interrupted(info)
            }
            (None, RunEnd::Returned(Err(crate::agent::AgentError::Canceled(c)))) => {
                TurnEnd::Failed(format!(
                    "agent returned Canceled ({c}) while no cancel was pending"
                ))
            }
            (
                None,
                RunEnd::Returned(Err(
                    crate::agent::AgentError::Failed(e) | crate::agent::AgentError::Permanent(e),
                )),
            ) => TurnEnd::Failed(e),
            (None, RunEnd::Panicked(msg)) => TurnEnd::Failed(format!("agent panicked: {msg}")),
            (None, RunEnd::Killed) => unreachable_killed(),
        };
        let resume_state = match (&end, interrupt_state, interrupt_bytes) {
            (TurnEnd::Interrupted(_), Some(value), Some(Err(e))) => {
                // The interrupt's state cannot be stored: the turn fails instead, and
                // the resumable state stays the last good one.
                let _ = value;
                end = TurnEnd::Failed(format!(
                    "the agent state of the interrupt cannot be stored: {e}"
                ));
                failure = Some(FailureKind::Record);
                st.state.clone()
            }
            (TurnEnd::Interrupted(_), Some(value), bytes) => {
                // The interrupt's state is where the turn continues: it covers every
                // step the turn began (none runs any more).
                st.steps.journal.safe_point();
                let tag = st.next_tag;
                st.next_tag += 1;
                Some(StateSnap {
                    value,
                    bytes: bytes.and_then(Result::ok),
                    tag,
                })
            }
            // The state at the last safe point, or the turn's input if none (S2).
            _ => st.state.clone(),
        };
        let carried = match (carried_value, carried_bytes) {
            (Some(_), Some(Err(e))) => {
                // Not stored: the turn fails (like an interrupt's state), and the
                // session keeps the state it carried before.
                end = TurnEnd::Failed(format!(
                    "the agent state the turn completed with cannot be stored: {e}"
                ));
                failure = Some(FailureKind::Record);
                None
            }
            (Some(value), bytes) => Some(StateSnap {
                value,
                bytes: bytes.and_then(Result::ok),
                tag: carried_tag(self.index),
            }),
            (None, _) => None,
        };
        let journal = Self::journal_of(&st);
        st.ending = Some(Ending::Ran {
            end: end.clone(),
            resume_state,
            failure,
            journal,
            carried,
        });
        end
    }

    /// The journal as a record keeps it, when there is anything to keep.
    fn journal_of(st: &ControlState<I, S>) -> Option<TurnJournal> {
        (!st.steps.journal.is_empty()).then(|| st.steps.journal.to_record())
    }

    /// The turn is over: steps still waiting for a write learn it will not come (a
    /// dropped sender), and running ones are abandoned.
    fn release_waiters(st: &mut ControlState<I, S>) {
        st.steps.waiters.clear();
    }

    /// What a write of the live record takes of the turn (session side): the state and
    /// the journal together, so a stored state and the steps it covers always agree.
    /// `whole`: the write replaces the record, so it gets every journal entry.
    pub(crate) fn take_for_write(&self, whole: bool, session: &str) -> LiveTurn<S> {
        let mut st = self.state.lock();
        let state = st.state.as_ref().map(|s| (s.tag, s.bytes.clone()));
        let value = st
            .state
            .as_ref()
            .filter(|s| s.bytes.is_none())
            .map(|s| s.value.clone());
        // Every write of a turn whose steps are written carries its mark, so a direct
        // append that lands before this write never leaves entries under a header
        // without one.
        let mark = (self.hooks.journal_writes || !st.steps.journal.is_empty())
            .then(|| st.steps.journal.mark());
        let changes = if whole {
            st.steps.direct_off = true;
            st.steps.changes.clear();
            journal_puts(session, &st.steps.journal.to_record())
        } else {
            std::mem::take(&mut st.steps.changes)
        };
        let waiters = std::mem::take(&mut st.steps.waiters);
        LiveTurn {
            state,
            value,
            mark,
            changes,
            waiters,
        }
    }

    /// Every journal entry a write may have stored for this turn (its entries and the
    /// changes no write took yet), for the session to delete at the turn's end.
    pub(crate) fn journal_leftovers(&self) -> Vec<u32> {
        let mut st = self.state.lock();
        let mut occ: Vec<u32> = st
            .steps
            .journal
            .entries()
            .iter()
            .map(|e| e.occurrence)
            .collect();
        occ.extend(st.steps.changes.drain(..).map(|c| match c {
            JournalChange::Put(o, _) | JournalChange::Delete(o) => o,
        }));
        occ.sort_unstable();
        occ.dedup();
        occ
    }

    /// The journal's entries and mark (a turn that ended, or a resume turn that never
    /// ran, hands them back to the session).
    pub(crate) fn journal(&self) -> Option<TurnJournal> {
        Self::journal_of(&self.state.lock())
    }

    /// Decides a step the agent asks to run (turn-task side): a step boundary first
    /// honours a cancel in force like a safe point of kind `AfterToolCalls` (S1b: the
    /// turn resumes from its last safe point and the journal), then the journal decides
    /// (see `agentloop_core::steps`). A `NoRetry` step's beginning is journaled; the
    /// answer says where to wait for its write, if the session writes it.
    pub(crate) fn step_begin(
        &self,
        name: &str,
        policy: StepPolicy,
        session: &str,
    ) -> Result<(StepDecision, Option<StepDurable>), Canceled> {
        let mut st = self.state.lock();
        if st.phase == Phase::Running {
            if let Some(at) = st.captured {
                return Err(Canceled { at });
            }
            if let Some(c) = st.active {
                if c.matches(SafePoint::AfterToolCalls) {
                    st.captured = Some(SafePoint::AfterToolCalls);
                    return Err(Canceled {
                        at: SafePoint::AfterToolCalls,
                    });
                }
            }
        }
        let decision = st.steps.journal.begin(name, policy);
        let mut wait = None;
        match &decision {
            StepDecision::Refused(e) => {
                st.steps.failure.get_or_insert_with(|| e.to_string());
            }
            StepDecision::Run {
                key,
                journal_begin: true,
                ..
            } => match st.steps.journal.began(key.occurrence, name) {
                Ok(entry) => {
                    if self.hooks.journal_writes {
                        wait = self.queue_entry(&mut st, session, &entry);
                    }
                }
                Err(e) => {
                    st.steps.failure.get_or_insert_with(|| e.to_string());
                }
            },
            _ => {}
        }
        drop(st);
        if wait.is_some() {
            self.progress();
        }
        Ok((decision, wait))
    }

    /// Queues an entry for the next write and a waiter for it; a framing failure fails
    /// the turn (the step cannot be made durable).
    fn queue_entry(
        &self,
        st: &mut ControlState<I, S>,
        session: &str,
        entry: &agentloop_core::steps::JournalEntry,
    ) -> Option<StepDurable> {
        match encode_entry(session, entry) {
            Ok(bytes) => {
                st.steps
                    .changes
                    .push(JournalChange::Put(entry.occurrence, bytes));
                let (tx, rx) = tokio::sync::oneshot::channel();
                st.steps.waiters.push(tx);
                Some(rx)
            }
            Err(why) => {
                st.steps.failure.get_or_insert(why);
                None
            }
        }
    }

    /// Journals a step's result (turn-task side): the answer says where its write is,
    /// if the session writes it; a refusal (over the bound) fails the turn. The entry
    /// goes straight into the record when the store can (one hop to the store and back,
    /// S1b), else with the session's next write. Handed to the store under the lock, so
    /// a write that replaces the whole record either includes it or follows it.
    pub(crate) fn step_finish(
        &self,
        occurrence: u32,
        name: &str,
        result: Vec<u8>,
        session: &str,
    ) -> Result<Option<StepWrite>, StepError> {
        let mut st = self.state.lock();
        let entry = match st.steps.journal.finish(occurrence, name, result) {
            Ok(e) => e,
            Err(e) => {
                st.steps.failure.get_or_insert_with(|| e.to_string());
                return Err(e);
            }
        };
        if !self.hooks.journal_writes {
            return Ok(None);
        }
        if st.phase == Phase::Ended {
            // The turn is over (a step finished on a task of the agent's own after the
            // turn returned): no write will hold it; the step says so.
            let (_, rx) = tokio::sync::oneshot::channel();
            return Ok(Some(StepWrite::Session(rx)));
        }
        if let (Some(direct), false, true) =
            (self.direct.get(), st.steps.direct_off, st.steps.direct_ok)
        {
            match encode_entry(session, &entry) {
                Ok(bytes) => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    direct(
                        JournalChange::Put(occurrence, bytes),
                        crate::store::committer::Answer::oneshot(tx),
                    );
                    return Ok(Some(StepWrite::Direct(rx, entry)));
                }
                Err(why) => {
                    st.steps.failure.get_or_insert(why);
                    return Ok(None);
                }
            }
        }
        let wait = self.queue_entry(&mut st, session, &entry);
        drop(st);
        if wait.is_some() {
            self.progress();
        }
        Ok(wait.map(StepWrite::Session))
    }

    /// A direct write of `entry` was refused by the store (no record yet, another
    /// format): the session writes it with its next write instead.
    pub(crate) fn step_requeue(
        &self,
        entry: &agentloop_core::steps::JournalEntry,
        session: &str,
    ) -> Option<StepDurable> {
        let mut st = self.state.lock();
        if st.phase == Phase::Ended {
            let (_, rx) = tokio::sync::oneshot::channel();
            return Some(rx);
        }
        if entry.occurrence < st.steps.journal.covered() {
            // A safe point's state covers it meanwhile: its write drops the entry, so
            // putting it back would outlive the turn.
            return None;
        }
        let wait = self.queue_entry(&mut st, session, entry);
        drop(st);
        if wait.is_some() {
            self.progress();
        }
        wait
    }

    /// A step decided to run ended without a result (its future was dropped, or its
    /// result did not encode): it no longer holds back a safe point.
    pub(crate) fn step_abandon(&self, occurrence: u32) {
        self.state.lock().steps.journal.abandon(occurrence);
    }

    /// A step cannot go on: the turn ends `Failed` with `reason`, whatever the agent
    /// returns.
    pub(crate) fn step_failed(&self, reason: String) {
        self.state.lock().steps.failure.get_or_insert(reason);
    }

    /// The turn task died without classifying the turn (a panic outside the agent's
    /// futures, e.g. in a future's destructor): record a failure so the session can
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
                resume_state: st.state.clone(),
                failure: Some(FailureKind::Panic),
                journal: Self::journal_of(&st),
                carried: None,
            },
        };
        st.phase = Phase::Ended;
        st.ending = Some(ending);
        let acks = self.answer_acks(&mut st);
        drop(st);
        for ack in acks {
            ack.answer(PreemptAck::TargetEnded { turn: self.index });
        }
    }

    /// Takes the ending (session side, after `TurnFinished`; or a killed session's
    /// salvage).
    pub(crate) fn take_ending(&self) -> Option<Ending<S>> {
        self.state.lock().ending.take()
    }
}

// `cut` is always `Some` when the run was killed; this keeps the match total without a
// panic path.
fn unreachable_killed() -> TurnEnd {
    TurnEnd::Failed("turn dropped without a cancel".into())
}
