//! How a session ends (DESIGN S13, S16, S18, S21, S23, S24, S27): the exit state,
//! built from the ledger's placement, and what the final checkpoint does with the
//! record. Also the salvage of a session whose actor died before its teardown.
//!
//! The decision table of the final checkpoint (one place, pure):
//!
//! | situation | record |
//! |---|---|
//! | no store, a failed load, another owner claimed it | left as it is |
//! | canceled by id (S24) | rewritten `Canceled` with what the session holds (only over a canceled or live record) |
//! | detached, not by a shutdown (S23) | finalized `Completed` / `Stopped` (items left) / `Failed` / `Canceled`, never over a final record; a supervised failure is left to the supervisor |
//! | failed (S18) | left as it is |
//! | ended by a stop, an interrupt or a shutdown with something to resume (or by a shutdown at all, S27), no skip | saved `Stopped` / `Interrupted`, never over a final record |
//! | otherwise (clean end, idle, skip) | deleted |
//!
//! Every other status write (past the restart budget, a cancel by id, a session killed
//! by a shutdown, a reopen, and the lease hand-overs of a claim, an answer and a
//! migration) is in the one table beside it, `store/transition.rs`.
//!
//! This file never moves an item between places: it reads the placement.

use crate::cancel::CancelInfo;
use crate::events::TurnEnd;
use crate::exit::{CheckpointOutcome, ExitReason, ExitState, FailureKind};
use crate::session::core::{Core, Effect, Effects, ExitPlan, PendingExit};
use crate::session::ledger::TurnFate;
use crate::store::{Payload, RecordWrite, SessionStatus, StoreError, WriteCondition};
use crate::turn::agent::Agent;
use crate::turn::control::{Ending, StateSnap};

/// What the final checkpoint does with the record.
#[derive(Debug)]
pub(crate) enum FinalAction {
    /// Leave it as it is.
    Nothing,
    /// It cannot be written: the cut turn's state cannot be stored. The outcome says so.
    Refused(String),
    /// Write it.
    Write {
        write: Box<RecordWrite>,
        kind: FinalKind,
    },
    /// Delete it (S16's clean end).
    Delete,
    /// Write this final record in place of what it held (S26a): a clean end of a
    /// session whose checkpoint history or kept events remain, so every door still
    /// lists it with its status. One write, the whole record: no item, no state, no
    /// journal, every timer removed; never over a final record (a cancel that landed
    /// first stays).
    End {
        /// The final record (`Stopped` after a stop, else `Completed`).
        write: Box<RecordWrite>,
    },
}

/// Which final write it is (for what a refusal means).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FinalKind {
    /// A stopped, interrupted or shut-down session's record (S16, S27).
    Save,
    /// A background session's finalizer (S23).
    Finalize,
    /// A canceled session's record, rewritten with what it holds (S24).
    CancelRewrite,
}

impl FinalAction {
    /// The checkpoint outcome of this action, given the store's answer (S13: never
    /// folded into the exit reason).
    pub(crate) fn outcome(&self, result: Result<bool, StoreError>) -> CheckpointOutcome {
        match (self, result) {
            (FinalAction::Nothing, _) => CheckpointOutcome::NotAttempted,
            (FinalAction::Refused(why), _) => CheckpointOutcome::Failed(why.clone()),
            (FinalAction::Write { .. }, Ok(_)) => CheckpointOutcome::Saved,
            (FinalAction::End { .. }, Err(StoreError::Final { status, .. })) => {
                tracing::info!(%status, "the record is already final; the clean end leaves it");
                CheckpointOutcome::NotAttempted
            }
            (FinalAction::Write { kind, .. }, Err(StoreError::Final { status, .. })) => {
                // A cancel (or a finalizer) that landed first wins (S24); its items stay
                // in the exit state.
                tracing::info!(%status, ?kind, "the record is already final; the exit leaves it");
                CheckpointOutcome::NotAttempted
            }
            (FinalAction::Write { .. }, Err(StoreError::NoRecord { .. })) => {
                CheckpointOutcome::NotAttempted
            }
            (FinalAction::Write { .. }, Err(e)) => {
                tracing::error!(error = %e, "final checkpoint failed");
                CheckpointOutcome::Failed(e.to_string())
            }
            (FinalAction::Delete, Ok(true)) => CheckpointOutcome::Deleted,
            (FinalAction::Delete, Ok(false)) => CheckpointOutcome::NotAttempted,
            (FinalAction::Delete | FinalAction::End { .. }, Err(e)) => {
                tracing::error!(error = %e, "deleting the stale record failed");
                CheckpointOutcome::Failed(e.to_string())
            }
            // Nothing to resume is kept: the record that says how it ended is no
            // checkpoint.
            (FinalAction::End { .. }, Ok(_)) => CheckpointOutcome::Deleted,
        }
    }
}

impl<A: Agent> Core<A> {
    /// The session ends (S21): the exit state from the ledger's placement, the final
    /// action, and the effect that performs them. From here the session takes nothing.
    pub(super) fn begin_exit(
        &mut self,
        reason: ExitReason,
        failure: Option<FailureKind>,
        state: Option<StateSnap<A::State>>,
        fx: &mut Effects<A>,
    ) {
        self.exited = true;
        // A resume turn that never ran is still the cut turn to resume (S17): its state
        // is the record's.
        let state = state.or_else(|| self.seed_state.take().map(|s| *s));
        let has_mid_turn_state = state.is_some();
        // Without a cut turn's state, the record keeps what the session carries
        // between turns (a cut turn's state holds what it carried).
        let state = state.or_else(|| {
            self.carried
                .take()
                .filter(|c| c.bytes.is_some())
                .map(|c| *c)
        });
        let placement = self.ledger.placement();
        let exit = ExitState {
            session_id: self.config.id.clone(),
            reason: reason.clone(),
            failure,
            stop_cause: self.shared.cause(),
            unhandled_items: self.ledger.values(&placement.unhandled),
            interrupted_items: self.ledger.values(&placement.interrupted),
            late_items: self.shared.late_snapshot(),
            has_mid_turn_state,
            checkpoint: CheckpointOutcome::NotAttempted,
            counters: self.counters,
            next_turn_index: self.next_index,
        };
        let carries = state
            .as_ref()
            .is_some_and(|s| crate::turn::control::is_carried(s.tag));
        let left = !placement.unhandled.is_empty()
            || !placement.interrupted.is_empty()
            || (state.is_some() && !carries);
        let last = self.final_action(&reason, state, left, carries);
        fx.push(Effect::Exit(Box::new(ExitPlan { exit, last })));
    }

    /// See the module docs' table.
    fn final_action(
        &mut self,
        reason: &ExitReason,
        state: Option<StateSnap<A::State>>,
        left: bool,
        carries: bool,
    ) -> FinalAction {
        if !self.persists() || self.load_error.is_some() || self.durable.fenced {
            return FinalAction::Nothing;
        }
        let failed = matches!(reason, ExitReason::Failed(_));
        let shutdown = self.stop.shutdown || matches!(reason, ExitReason::Shutdown);
        let (status, condition, kind) = if self.stop.canceled {
            (
                SessionStatus::Canceled,
                WriteCondition::CanceledOrLive,
                FinalKind::CancelRewrite,
            )
        } else if self.detached && !self.stop.shutdown {
            if failed && self.config.supervised {
                // S26: the supervisor restarts the session from this record (and
                // detaches the new incarnation again) or marks it `Failed`.
                return FinalAction::Nothing;
            }
            let to = match reason {
                ExitReason::Failed(e) => SessionStatus::Failed(e.clone()),
                ExitReason::Canceled(_) => SessionStatus::Canceled,
                // A drain that could not finish everything stays resumable (S18).
                _ if left => SessionStatus::Stopped,
                _ => SessionStatus::Completed,
            };
            (to, WriteCondition::NotFinal, FinalKind::Finalize)
        } else if failed {
            return FinalAction::Nothing;
        } else {
            let caused_by_stop = self.stop.committed
                || matches!(
                    reason,
                    ExitReason::Interrupted(_) | ExitReason::Shutdown | ExitReason::Canceled(_)
                );
            // A carried state is kept like work left: a stopped conversation goes on
            // from it when the session is spawned again.
            if !(caused_by_stop && (left || carries || shutdown) && !self.stop.skip_checkpoint) {
                return self.clean_end(caused_by_stop);
            }
            // A business interrupt waits for its answer, also during a shutdown:
            // `Stopped`, which `Runtime::start` never resumes by itself.
            let status = if shutdown && !matches!(reason, ExitReason::Interrupted(_)) {
                SessionStatus::Interrupted
            } else {
                SessionStatus::Stopped
            };
            (status, WriteCondition::NotFinal, FinalKind::Save)
        };
        let state = match state {
            None => None,
            Some(StateSnap {
                bytes: Some(b),
                tag,
                ..
            }) => Some((tag, b)),
            Some(snap) => match crate::store::codec::encode_state(&self.config.id, &snap.value) {
                Ok(b) => Some((snap.tag, Payload::from(b))),
                Err(e) => {
                    tracing::error!(error = %e, "the cut turn's state cannot be stored; the record is left as it was");
                    return FinalAction::Refused(e.to_string());
                }
            },
        };
        // Whole: earlier writes may still be unanswered, and one may have been refused.
        // A cut turn's journal (S1b) is kept with its state.
        let journal = match (
            state.is_some() || self.ledger.cut().is_some(),
            self.cut_journal.as_deref(),
        ) {
            (true, Some(j)) => super::durability::JournalPart {
                mark: Some(j.mark),
                changes: crate::turn::control::journal_puts(&self.config.id, j),
                waiters: Vec::new(),
            },
            _ => super::durability::JournalPart::none(),
        };
        let mut write = self.record_write(status, state, journal, condition, true);
        if let ExitReason::Interrupted(info) = reason {
            write.header.interrupt = Some(info.clone());
            write.header.awaiting_answer = true;
        }
        if let (Some(turn), n) = (self.history_at_exit, self.config.history) {
            if n > 0 {
                // The final write holds the last turn's end (issue 13, 4).
                write.history = Some(crate::store::history::HistoryMark { turn, keep: n });
            }
        }
        if let SessionStatus::Failed(e) = &write.header.status {
            write.header.last_error = Some(e.clone());
        } else if let ExitReason::Canceled(CancelInfo {
            agent_error: Some(e),
            ..
        }) = reason
        {
            // The cancel decided the end (S1); the record keeps what the agent said.
            write.header.last_error = Some(e.clone());
        }
        FinalAction::Write {
            write: Box::new(write),
            kind,
        }
    }

    /// S16's clean end: the record is deleted, unless the session's checkpoint history
    /// or kept events remain (S26a): then a final record without items, state or
    /// journal takes its place, `Stopped` after a stop and `Completed` otherwise, so
    /// the session stays listed with how it ended until it is deleted.
    fn clean_end(&mut self, caused_by_stop: bool) -> FinalAction {
        let keeps_more = self.config.history > 0 || self.config.settings.events.is_some();
        if !keeps_more {
            return FinalAction::Delete;
        }
        let status = match caused_by_stop {
            true => SessionStatus::Stopped,
            false => SessionStatus::Completed,
        };
        let mut write = self.record_write(
            status,
            None,
            super::durability::JournalPart::none(),
            WriteCondition::NotFinal,
            true,
        );
        // What it held is not kept (a clean end or a skip): the record says how it
        // ended, nothing more, and no timer pushes into it.
        write.items.clear();
        write.timers = vec![crate::store::TimerChange::RemoveAll];
        write.header.interrupt = None;
        write.header.awaiting_answer = false;
        FinalAction::End {
            write: Box::new(write),
        }
    }

    /// The exit state of a session whose actor died before its teardown: every item it
    /// holds, placed by what the current turn had done (S10): a completed turn's items
    /// delivered, a preempted or still-planning turn's unhandled, a running or cut
    /// turn's interrupted.
    pub(crate) fn salvage(&mut self) -> ExitState<A::Item> {
        if let Some(t) = self.turn.take() {
            if let Some(split) = t.control.take_split() {
                let (dropped, _) = self.ledger.decide(split);
                self.counters.items_dropped_by_plan += dropped;
            }
            match t.control.take_ending() {
                Some(Ending::Ran {
                    end: TurnEnd::Completed,
                    ..
                }) => {
                    let (delivered, _) = self.ledger.end_turn(TurnFate::Completed);
                    self.counters.turns_completed += 1;
                    self.counters.items_delivered += delivered;
                }
                Some(Ending::Ran {
                    end: TurnEnd::Preempted(_),
                    ..
                }) => {
                    self.ledger.end_turn(TurnFate::Preempted);
                }
                Some(Ending::Deferred) | Some(Ending::PlanAborted { .. }) => {
                    self.ledger.turn_not_run()
                }
                Some(Ending::Ran { .. }) => {
                    self.ledger.end_turn(TurnFate::Cut);
                }
                None if self.ledger.split_known() => {
                    self.ledger.end_turn(TurnFate::Cut);
                }
                None => self.ledger.turn_not_run(),
            }
        }
        let placement = self.ledger.placement();
        ExitState {
            session_id: self.config.id.clone(),
            reason: ExitReason::Failed(
                "the session actor stopped before its teardown (killed or failed)".into(),
            ),
            failure: Some(FailureKind::Internal),
            stop_cause: self.shared.cause(),
            unhandled_items: self.ledger.values(&placement.unhandled),
            interrupted_items: self.ledger.values(&placement.interrupted),
            late_items: self.shared.late_snapshot(),
            has_mid_turn_state: false,
            checkpoint: CheckpointOutcome::NotAttempted,
            counters: self.counters,
            next_turn_index: self.next_index,
        }
    }
}

/// An exit decided by a turn's end (re-exported for `turns.rs`).
pub(super) fn pending<S>(
    reason: ExitReason,
    failure: Option<FailureKind>,
    state: Option<StateSnap<S>>,
) -> Box<PendingExit<S>> {
    Box::new(PendingExit {
        reason,
        failure,
        state,
    })
}
