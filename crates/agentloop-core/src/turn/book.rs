//! The book of a turn's durable steps (S1b): the journal, the changes no write has taken
//! yet, where a step's entry goes (with the session's next write, or straight into the
//! record), and what a write of the live record takes of the turn ([`LiveTurn`]). Part
//! of the turn's state machine; the steps' waiters (reply ports) are the caller's, kept
//! beside the machine under the same lock. It must not name a runtime.

use crate::cancel::{Canceled, SafePoint};
use crate::codec::encode_journal_entry;
use crate::header::Payload;
use crate::steps::{
    Journal, JournalEntry, JournalMark, StepDecision, StepError, StepPolicy, TurnJournal,
};
use crate::write::JournalChange;

use super::{Effects, Phase, TurnMachine};

/// The durable steps of one turn.
#[derive(Debug)]
pub(super) struct StepBook {
    pub(super) journal: Journal,
    changes: Vec<JournalChange>,
    /// A step the turn cannot go on from (divergence, a result over the bound or not
    /// journaled): the turn ends `Failed` with it, whatever the agent returns.
    pub(super) failure: Option<String>,
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

impl StepBook {
    pub(super) fn new(journal: Journal) -> Self {
        StepBook {
            journal,
            changes: Vec::new(),
            failure: None,
            direct_off: false,
            direct_ok: false,
        }
    }

    /// A safe point's state covers the steps before it: when entries are written, their
    /// deletes go with the state's write.
    pub(super) fn safe_point(&mut self, journal_writes: bool) {
        let dropped = self.journal.safe_point();
        if journal_writes {
            self.changes
                .extend(dropped.into_iter().map(JournalChange::Delete));
        }
    }

    /// An interrupt's state covers every step the turn began (none runs any more).
    pub(super) fn cover_all(&mut self) {
        self.journal.safe_point();
    }

    /// The journal as a record keeps it, when there is anything to keep.
    pub(super) fn to_record(&self) -> Option<TurnJournal> {
        (!self.journal.is_empty()).then(|| self.journal.to_record())
    }

    /// Queues an entry for the next write; a framing failure fails the turn (the step
    /// cannot be made durable). Whether it was queued.
    fn queue(&mut self, session: &str, entry: &JournalEntry) -> bool {
        match encode_journal_entry(session, entry) {
            Ok(bytes) => {
                self.changes
                    .push(JournalChange::Put(entry.occurrence, bytes));
                true
            }
            Err(why) => {
                self.failure.get_or_insert(why.to_string());
                false
            }
        }
    }
}

/// What a write of the live record takes of the running turn, at once.
#[derive(Debug)]
pub struct LiveTurn<S> {
    /// The resumable state's tag and bytes (`None`: not encoded by a safe point).
    pub state: Option<(u64, Option<Payload>)>,
    /// The state's value when no safe point encoded it (the write encodes it): the
    /// same state as the tag's, so it agrees with the journal's mark.
    pub value: Option<S>,
    /// The journal's mark, when the record must keep one.
    pub mark: Option<JournalMark>,
    /// The journal's changes since the last write, or every entry for a whole write.
    pub changes: Vec<JournalChange>,
    /// Entries a whole write could not frame (occurrence, why): the caller logs them.
    pub unframed: Vec<(u32, String)>,
}

/// Where a finished step's entry goes ([`TurnMachine::step_finish`]).
#[derive(Debug, PartialEq, Eq)]
pub enum StepFinish {
    /// Nowhere: entries are not written while the turn runs (or the entry could not be
    /// framed, which fails the turn).
    Unwritten,
    /// The turn is over (a step finished on a task of the agent's own after the turn
    /// returned): no write will hold it; the step learns so.
    TurnOver,
    /// Straight into the record: the caller hands this change to the store before it
    /// releases the machine, so a write that replaces the whole record either includes
    /// it or follows it. If the store refuses it, [`TurnMachine::step_requeue`].
    Direct(JournalChange, JournalEntry),
    /// With the session's next write: the caller adds a waiter for it.
    Queued,
}

/// What putting back an entry the store refused did ([`TurnMachine::step_requeue`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Requeue {
    /// The turn is over: no write will hold it.
    TurnOver,
    /// A safe point's state covers it meanwhile: its write drops the entry, so putting
    /// it back would outlive the turn. Nothing to wait for.
    Covered,
    /// Queued for the session's next write: the caller adds a waiter for it.
    Queued,
    /// It could not be framed: the turn fails.
    Failed,
}

/// Every entry of `journal` as puts (a whole write), and the entries that could not be
/// framed (their occurrence and why), which the caller logs: such a step runs again on
/// a resume, as one whose entry was lost (its policy decides).
pub fn journal_puts(
    session: &str,
    journal: &TurnJournal,
) -> (Vec<JournalChange>, Vec<(u32, String)>) {
    let mut puts = Vec::with_capacity(journal.entries.len());
    let mut unframed = Vec::new();
    for e in &journal.entries {
        match encode_journal_entry(session, e) {
            Ok(b) => puts.push(JournalChange::Put(e.occurrence, b)),
            Err(why) => unframed.push((e.occurrence, why.to_string())),
        }
    }
    (puts, unframed)
}

impl<I: Clone, S: Clone, A> TurnMachine<I, S, A> {
    /// A write of the session's showing this running turn as the record's cut turn
    /// is durable (the shell says so from its completion): its steps' entries may go
    /// straight into the record from now on.
    pub fn cut_on_record(&mut self) {
        if self.phase == Phase::Running {
            self.steps.direct_ok = true;
        }
    }

    /// What a write of the live record takes of the turn (session side): the state and
    /// the journal together, so a stored state and the steps it covers always agree.
    /// `whole`: the write replaces the record, so it gets every journal entry (and
    /// entries no longer go straight into the record this turn). The caller takes the
    /// steps' waiters with it.
    pub fn take_for_write(&mut self, whole: bool, session: &str) -> LiveTurn<S> {
        let state = self.state.as_ref().map(|s| (s.tag, s.bytes.clone()));
        let value = self
            .state
            .as_ref()
            .filter(|s| s.bytes.is_none())
            .map(|s| s.value.clone());
        // Every write of a turn whose steps are written carries its mark, so a direct
        // append that lands before this write never leaves entries under a header
        // without one.
        let mark = (self.settings.journal_writes || !self.steps.journal.is_empty())
            .then(|| self.steps.journal.mark());
        let (changes, unframed) = if whole {
            self.steps.direct_off = true;
            self.steps.changes.clear();
            journal_puts(session, &self.steps.journal.to_record())
        } else {
            (std::mem::take(&mut self.steps.changes), Vec::new())
        };
        LiveTurn {
            state,
            value,
            mark,
            changes,
            unframed,
        }
    }

    /// Every journal entry a write may have stored for this turn (its entries and the
    /// changes no write took yet), for the session to delete at the turn's end.
    pub fn journal_leftovers(&mut self) -> Vec<u32> {
        let mut occ: Vec<u32> = self
            .steps
            .journal
            .entries()
            .iter()
            .map(|e| e.occurrence)
            .collect();
        occ.extend(self.steps.changes.drain(..).map(|c| match c {
            JournalChange::Put(o, _) | JournalChange::Delete(o) => o,
        }));
        occ.sort_unstable();
        occ.dedup();
        occ
    }

    /// The journal's entries and mark (a turn that ended, or a resume turn that never
    /// ran, hands them back to the session).
    pub fn journal(&self) -> Option<TurnJournal> {
        self.steps.to_record()
    }

    /// Decides a step the agent asks to run (turn-task side): a step boundary first
    /// honours a cancel in force like a safe point of kind `AfterToolCalls` (S1b: the
    /// turn resumes from its last safe point and the journal), then the journal decides
    /// (see [`crate::steps`]). A `NoRetry` step's beginning is journaled; the answer's
    /// `bool` says it was queued for the session's next write (the caller adds a waiter,
    /// and the effects say it is progress).
    pub fn step_begin(
        &mut self,
        name: &str,
        policy: StepPolicy,
        session: &str,
    ) -> Result<(StepDecision, bool, Effects<A>), Canceled> {
        if self.phase == Phase::Running {
            if let Some(at) = self.captured {
                return Err(Canceled { at });
            }
            if self.cancel_matches(SafePoint::AfterToolCalls) {
                self.captured = Some(SafePoint::AfterToolCalls);
                return Err(Canceled {
                    at: SafePoint::AfterToolCalls,
                });
            }
        }
        let decision = self.steps.journal.begin(name, policy);
        let mut queued = false;
        match &decision {
            StepDecision::Refused(e) => {
                self.steps.failure.get_or_insert_with(|| e.to_string());
            }
            StepDecision::Run {
                key,
                journal_begin: true,
                ..
            } => match self.steps.journal.began(key.occurrence, name) {
                Ok(entry) => {
                    if self.settings.journal_writes {
                        queued = self.steps.queue(session, &entry);
                    }
                }
                Err(e) => {
                    self.steps.failure.get_or_insert_with(|| e.to_string());
                }
            },
            _ => {}
        }
        Ok((decision, queued, Effects::progress(queued)))
    }

    /// Journals a step's result (turn-task side); a refusal (over the bound) fails the
    /// turn. The entry goes straight into the record when the caller can write it so
    /// (`direct`: it has a writer installed) and the record shows this turn as its cut
    /// turn (S1b: one hop to the store and back), else with the session's next write.
    pub fn step_finish(
        &mut self,
        occurrence: u32,
        name: &str,
        result: Vec<u8>,
        session: &str,
        direct: bool,
    ) -> Result<(StepFinish, Effects<A>), StepError> {
        let entry = match self.steps.journal.finish(occurrence, name, result) {
            Ok(e) => e,
            Err(e) => {
                self.steps.failure.get_or_insert_with(|| e.to_string());
                return Err(e);
            }
        };
        if !self.settings.journal_writes {
            return Ok((StepFinish::Unwritten, Effects::none()));
        }
        if self.phase == Phase::Ended {
            return Ok((StepFinish::TurnOver, Effects::none()));
        }
        if direct && !self.steps.direct_off && self.steps.direct_ok {
            return match encode_journal_entry(session, &entry) {
                Ok(bytes) => Ok((
                    StepFinish::Direct(JournalChange::Put(occurrence, bytes), entry),
                    Effects::none(),
                )),
                Err(why) => {
                    self.steps.failure.get_or_insert(why.to_string());
                    Ok((StepFinish::Unwritten, Effects::none()))
                }
            };
        }
        if self.steps.queue(session, &entry) {
            Ok((StepFinish::Queued, Effects::progress(true)))
        } else {
            Ok((StepFinish::Unwritten, Effects::none()))
        }
    }

    /// A direct write of `entry` was refused by the store (no record yet, another
    /// format): the session writes it with its next write instead.
    pub fn step_requeue(&mut self, entry: &JournalEntry, session: &str) -> (Requeue, Effects<A>) {
        if self.phase == Phase::Ended {
            return (Requeue::TurnOver, Effects::none());
        }
        if entry.occurrence < self.steps.journal.covered() {
            return (Requeue::Covered, Effects::none());
        }
        if self.steps.queue(session, entry) {
            (Requeue::Queued, Effects::progress(true))
        } else {
            (Requeue::Failed, Effects::none())
        }
    }

    /// A step decided to run ended without a result (its future was dropped, or its
    /// result did not encode): it no longer holds back a safe point.
    pub fn step_abandon(&mut self, occurrence: u32) {
        self.steps.journal.abandon(occurrence);
    }

    /// A step cannot go on: the turn ends `Failed` with `reason`, whatever the agent
    /// returns.
    pub fn step_failed(&mut self, reason: String) {
        self.steps.failure.get_or_insert(reason);
    }
}
