//! Turns (DESIGN S2, S4–S8, S11, S16a, S17): what happens at the boundary (the exit,
//! the next turn, or waiting), starting a turn, and what a turn's end means: its items
//! move in the ledger (delivered, preempted, cut, or back in order), the session's exit
//! is decided when the turn ends it, and under `sync` the turn's end is written before
//! the next turn starts.
//!
//! This file decides turns; it never answers a push and never builds a write (it asks
//! `durability` for one).

use std::sync::Arc;

use tokio::time::Instant;

use crate::events::TurnEnd;
use crate::exit::{ExitReason, FailureKind};
use crate::session::core::exit::pending;
use crate::session::core::{ActiveTurn, Core, Effect, Effects, StoreOp, Timed};
use crate::session::ledger::{Offer, TurnFate};
use crate::store::codec::{payload, PayloadError};
use crate::store::Payload;
use crate::turn::agent::{Agent, PlanInput};
use crate::turn::control::{Ending, TurnControl, TurnHooks};

/// Encodes an agent state, checked (the `sync` safe-point hook).
fn encode_state<S: serde::Serialize + serde::de::DeserializeOwned>(
    s: &S,
) -> Result<Vec<u8>, PayloadError> {
    payload::encode_checked(s)
}

impl<A: Agent> Core<A> {
    /// The actor started: a failed load ends the session at once, leaving the record
    /// as it was (S18).
    pub(super) fn on_start(&mut self) {
        if let Some(e) = self.load_error.as_deref().cloned() {
            tracing::error!(error = %e, "loading the session record failed");
            self.exit = Some(pending(
                ExitReason::Failed(e.to_string()),
                Some(FailureKind::Record),
                None,
            ));
        }
    }

    /// What happens at a turn boundary: exit, start the next turn, or go idle (with an
    /// idle timer when `until_idle_for` asked for one). Runs after every event.
    pub(super) fn advance(&mut self, _now: Instant, fx: &mut Effects<A>) {
        if self.exited || self.turn.is_some() {
            return;
        }
        if let Some(exit) = self.exit.take() {
            let exit = *exit;
            self.begin_exit(exit.reason, exit.failure, exit.state, fx);
            return;
        }
        // After a plan that consumed nothing, only a new push makes another plan worth it.
        let has_work = !self.await_input && self.ledger.has_work();
        if self.stop.committed && !(self.stop.drain && has_work) {
            // Bare/graceful/immediate stop at a boundary, or a drain with nothing it can
            // still finish.
            let reason = if self.stop.shutdown {
                ExitReason::Shutdown
            } else {
                ExitReason::Completed
            };
            self.begin_exit(reason, None, None, fx);
            return;
        }
        if has_work {
            self.start_turn(fx);
            return;
        }
        // Idle: one timer per idle period (a second until_idle_for must not postpone the
        // exit); every accepted push bumps the epoch, which voids the armed timer.
        if let Some(d) = self.stop.idle_for {
            if self.idle_armed != Some(self.idle_epoch) {
                self.idle_armed = Some(self.idle_epoch);
                fx.push(Effect::Timer {
                    after: d,
                    event: Timed::IdleDue {
                        epoch: self.idle_epoch,
                    },
                });
            }
        }
        self.arm_sleep(fx);
    }

    fn start_turn(&mut self, fx: &mut Effects<A>) {
        let index = self.next_index;
        self.next_index += 1;
        // A turn that runs again (the cut turn's resume, or the turn a record's journal
        // was written in) replays its journaled steps (S1b).
        let stored = self.cut_journal.take();
        if let Some(j) = stored.as_deref().filter(|j| j.mark.turn != index) {
            // Another turn's (its index passed without it running again): its entries
            // go with the next write, so the record never keeps entries without a mark.
            tracing::warn!(
                turn = j.mark.turn,
                now = index,
                "a journal of durable steps of a turn that did not run again is dropped"
            );
            self.durable
                .drop_journal(j.entries.iter().map(|e| e.occurrence));
        }
        let journal = agentloop_core::steps::Journal::from_record(
            &self.config.id,
            index,
            stored.as_deref(),
            agentloop_core::steps::DEFAULT_JOURNAL_LIMIT,
        );
        let carried = || self.carried.as_ref().map(|c| c.value.clone());
        let (work, is_resume, input) = match self.ledger.offer(index) {
            Offer::Resume { items } => {
                let seed = self.seed_state.take().map(|s| *s);
                let state = seed.as_ref().map(|s| s.value.clone());
                let answer = self.answer.as_ref().map(|a| a.item.clone());
                // A turn resuming from a safe point's state has what it carried in it.
                let carried = if state.is_none() { carried() } else { None };
                (
                    TurnWork::Resume {
                        items,
                        state,
                        answer,
                        carried,
                    },
                    true,
                    seed,
                )
            }
            Offer::Plan { input, bytes } => (
                TurnWork::Plan {
                    input,
                    bytes,
                    carried: carried(),
                },
                false,
                None,
            ),
        };
        let progress = || {
            self.progress_hook.as_ref().map(|h| {
                let h = h.clone();
                Box::new(move || h(index)) as Box<dyn Fn() + Send + Sync>
            })
        };
        let hooks = if self.syncs() {
            TurnHooks {
                encode_state: Some(encode_state::<A::State>),
                encode_carried: None,
                progress: progress(),
                journal_writes: true,
            }
        } else if self.writes_turn_ends() {
            // `turn`: only a durable step's entry is written while the turn runs.
            TurnHooks {
                encode_state: None,
                encode_carried: None,
                progress: progress(),
                journal_writes: true,
            }
        } else {
            TurnHooks::none()
        };
        let mut hooks = hooks;
        if self.persists() {
            hooks.encode_carried = Some(encode_state::<A::State>);
        }
        let mut control = TurnControl::new(index, input, journal, hooks);
        let durable_tx = self.writes_turn_ends().then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            control.wait_for_durable_end(rx);
            tx
        });
        let control = Arc::new(control);
        self.turn = Some(ActiveTurn {
            index,
            control: control.clone(),
            is_resume,
            durable_tx,
            delayed: Vec::new(),
        });
        fx.push(Effect::StartTurn {
            index,
            work,
            control,
        });
    }

    /// Applies the plan's answer the control block holds, if the ledger has not yet:
    /// every placement the core reads (a write, a turn's end) sees the running turn's
    /// items where its plan put them.
    pub(super) fn take_plan(&mut self) {
        let Some(split) = self.turn.as_ref().and_then(|t| t.control.take_split()) else {
            return;
        };
        let (dropped, changes) = self.ledger.decide(split);
        if dropped > 0 {
            self.counters.items_dropped_by_plan += dropped;
            tracing::info!(dropped, "items dropped by the plan's decision");
            if !self.syncs() && self.durable.record_stale {
                self.durable.dropped_since_write = true;
            }
        }
        self.durable.absorb(changes);
    }

    /// `sync`: the running turn reached a safe point or its plan changed entries: write
    /// it (S16a). `sync` and `turn`: a durable step's journal entry waits for its write
    /// (S1b).
    pub(super) fn on_turn_progress(&mut self, turn: u64, fx: &mut Effects<A>) {
        if self.exited
            || !self.writes_turn_ends()
            || self.turn.as_ref().is_none_or(|t| t.index != turn)
        {
            return;
        }
        self.take_plan();
        self.write_live(fx);
    }

    pub(super) fn on_turn_finished(&mut self, turn: u64, fx: &mut Effects<A>) {
        if self.turn.as_ref().is_none_or(|t| t.index != turn) {
            return;
        }
        self.take_plan();
        let Some(mut active) = self.turn.take() else {
            return;
        };
        // S7: delayed preempts still waiting for this turn find it ended: answered
        // now, their timers canceled (not held for their whole delay, issue 52).
        if !active.delayed.is_empty() {
            let ids = active.delayed.iter().map(|d| d.id).collect();
            for d in active.delayed.drain(..) {
                if let Some(r) = d.reply {
                    r.answer(crate::push::PreemptAck::TargetEnded { turn });
                }
            }
            fx.push(Effect::CancelTimers { ids });
        }
        // The task waits for it only when the turn ran (a plan that aborted or
        // consumed nothing sends its event at once).
        let durable_tx = active.durable_tx.take();
        let Some(ending) = active.control.take_ending() else {
            self.ledger.turn_not_run();
            self.exit = Some(pending(
                ExitReason::Failed("turn task ended without reporting how".into()),
                Some(FailureKind::Internal),
                None,
            ));
            return;
        };
        let mut completed = false;
        match ending {
            Ending::Deferred => {
                // No step ran: a journal the turn was to replay waits for the next.
                self.cut_journal = active.control.journal().map(Box::new);
                // The plan consumed nothing: what it handed back waits for new input.
                // Items pushed while it planned are new input it never saw: plan again.
                let arrived_while_planning = self.ledger.pushed_during_turn();
                self.ledger.turn_not_run();
                tracing::debug!(
                    turn,
                    arrived_while_planning,
                    "the plan consumed nothing; waiting for new input"
                );
                self.await_input = !arrived_while_planning;
            }
            Ending::PlanAborted {
                reason,
                plan_failed,
            } => {
                // S6: back to the front in their original push order, whatever the plan
                // did; a resume turn's items are the cut turn again, with its state.
                tracing::info!(turn, %reason, "turn aborted while planning; offered items restored");
                self.ledger.turn_not_run();
                if active.is_resume {
                    self.seed_state = active.control.state_snapshot().map(Box::new);
                }
                // No step ran: the journal waits for the turn that runs again.
                self.cut_journal = active.control.journal().map(Box::new);
                if plan_failed.is_some() {
                    self.exit = Some(pending(ExitReason::Failed(reason), plan_failed, None));
                }
            }
            Ending::Ran {
                end,
                resume_state,
                failure,
                journal,
                carried,
            } => {
                if let Some(c) = carried {
                    // The next turn starts from it; the turn's end write stores it.
                    self.carried = Some(Box::new(c));
                }
                tracing::debug!(turn, outcome = ?end, "turn ended");
                // S1b: a cut turn keeps its journal with its state (the final write
                // stores both); any other end drops it with the turn's end.
                let cut = matches!(
                    end,
                    TurnEnd::Canceled(_) | TurnEnd::Interrupted(_) | TurnEnd::Failed(_)
                );
                if cut {
                    self.cut_journal = journal.map(Box::new);
                } else {
                    self.durable
                        .drop_journal(active.control.journal_leftovers());
                }
                if active.is_resume {
                    // The resumed turn ran with the answer: the record no longer
                    // keeps it (an interrupt again asks anew).
                    self.answer = None;
                }
                match end {
                    TurnEnd::Completed => {
                        let (delivered, changes) = self.ledger.end_turn(TurnFate::Completed);
                        self.counters.turns_completed += 1;
                        self.counters.items_delivered += delivered;
                        self.durable.absorb(changes);
                        completed = true;
                    }
                    TurnEnd::Preempted(_) => {
                        // S8: no exit reason, no checkpoint, no interrupted items.
                        self.ledger.end_turn(TurnFate::Preempted);
                        self.counters.turns_preempted += 1;
                    }
                    TurnEnd::Canceled(info) => {
                        if let Some(e) = &info.agent_error {
                            tracing::warn!(turn, error = %e, "the agent returned an error after the cancel was captured; the session ends canceled and keeps the error");
                        }
                        self.ledger.end_turn(TurnFate::Cut);
                        let reason = if self.stop.shutdown {
                            ExitReason::Shutdown
                        } else {
                            ExitReason::Canceled(info)
                        };
                        self.exit = Some(pending(reason, None, resume_state));
                    }
                    TurnEnd::Interrupted(info) => {
                        self.ledger.end_turn(TurnFate::Cut);
                        self.exit =
                            Some(pending(ExitReason::Interrupted(info), None, resume_state));
                    }
                    TurnEnd::Failed(e) => {
                        tracing::warn!(turn, error = %e, "turn failed");
                        self.ledger.end_turn(TurnFate::Cut);
                        self.exit = Some(pending(ExitReason::Failed(e), failure, None));
                    }
                    TurnEnd::PlanAborted(_) => self.ledger.turn_not_run(),
                }
            }
        }
        // S16a: the turn's end is on record before the next turn starts (unless the
        // session is about to exit: its final write records the end). `TurnEnded`
        // waits for that write.
        let exiting = self.exit.is_some() || (self.stop.committed && !self.stop.drain);
        if self.writes_turn_ends() && !exiting {
            let write = self.write_live(fx);
            self.keep_in_history(turn, write, fx);
            self.turn_end_with(write, durable_tx, fx);
        } else if self.writes_turn_ends() {
            self.history_at_exit = Some(turn);
            self.durable.turn_end_at_exit(durable_tx);
        } else if (completed || self.durable.dropped_since_write)
            && self.persists()
            && self.durable.record_stale
        {
            // Also when the turn failed: the failure leaves the record to the
            // supervisor or the next start (S18, S26), which must not offer the
            // dropped items again (S10).
            self.replace_stale(fx);
        }
    }

    /// Issue 13 (4): the write `write` holds turn `turn`'s end; with a history, it also
    /// keeps a snapshot of the record it leaves.
    /// The turn's end is held by write `write`. When that write is among this event's
    /// effects, its task learns the result from the write's completion itself, as a
    /// durable step does (S1b): no hop through the session's mailbox (issue 54). Else
    /// the session answers it when the write's result comes back.
    fn turn_end_with(&mut self, write: u64, tx: Option<super::DurableTx>, fx: &mut Effects<A>) {
        let Some(tx) = tx else {
            return;
        };
        let issued = fx.iter_mut().rev().find_map(|e| match e {
            Effect::Store { seq, steps, .. } if *seq == write => Some(steps),
            _ => None,
        });
        match issued {
            Some(waiters) => waiters.push(tx),
            None => self.durable.turn_end_after(write, Some(tx)),
        }
    }

    fn keep_in_history(&self, turn: u64, write: u64, fx: &mut Effects<A>) {
        if self.config.history == 0 {
            return;
        }
        let mark = crate::store::history::HistoryMark {
            turn,
            keep: self.config.history,
        };
        for effect in fx.iter_mut().rev() {
            if let Effect::Store {
                seq,
                op: StoreOp::Write(w),
                ..
            } = effect
            {
                if *seq == write {
                    w.history = Some(mark);
                    return;
                }
            }
        }
    }

    /// An idle timer fired: exit if the session stayed idle for the whole period.
    pub(super) fn on_idle_due(&mut self, epoch: u64) {
        let idle = self.turn.is_none() && !self.ledger.has_work();
        if epoch == self.idle_epoch && idle && !self.exited && self.exit.is_none() {
            tracing::info!("idle long enough; exiting (until_idle_for)");
            self.exit = Some(pending(ExitReason::Completed, None, None));
        }
    }
}

impl<A: Agent> TurnWork<A> {
    /// Takes the carried state the turn gets in `Turn::state`.
    pub(crate) fn take_carried(&mut self) -> Option<A::State> {
        match self {
            TurnWork::Plan { carried, .. } | TurnWork::Resume { carried, .. } => carried.take(),
        }
    }
}

/// What the turn works on.
pub(crate) enum TurnWork<A: Agent> {
    /// A normal turn: plan over these items first. `bytes` (when the session
    /// persists) are the offered items' stored bytes, in the input's order.
    Plan {
        input: PlanInput<A::Item>,
        bytes: Option<Vec<Payload>>,
        /// The state the last completed turn carried (`Turn::state`).
        carried: Option<A::State>,
    },
    /// A resume turn (S17): no plan; these items and this state, and the answer to
    /// the interrupt that cut it, if one was given.
    Resume {
        items: Vec<A::Item>,
        state: Option<A::State>,
        answer: Option<A::Item>,
        /// The carried state, when the turn has no state of its own to resume from.
        carried: Option<A::State>,
    },
}
