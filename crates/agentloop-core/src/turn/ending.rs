//! How a turn's end is classified (S1, S8, S13, S15a): what the agent's future did
//! ([`RunEnd`]), the resumable state it leaves ([`StateSnap`], with the tags that tell a
//! safe point's state from a carried one) and what the session reads afterwards
//! ([`Ending`]). Part of the turn's state machine; it must not name a runtime.

use crate::cancel::{CancelInfo, CancelMode};
use crate::header::Payload;
use crate::interrupt::InterruptInfo;
use crate::steps::TurnJournal;

use super::{AgentError, FailureKind, Phase, TurnEnd, TurnMachine};

/// A resumable state: the value, its encoded bytes (when the session writes safe
/// points), and which state it is (0: the turn's input; then one per safe point).
#[derive(Clone, Debug, PartialEq)]
pub struct StateSnap<S> {
    /// The state.
    pub value: S,
    /// Its bytes, when a safe point encoded it.
    pub bytes: Option<Payload>,
    /// Which state it is.
    pub tag: u64,
}

/// The tag of the state turn `index` carried to the next turn (`CompletedWith`): the
/// low 32 bits all ones, which no safe point's tag (`index << 32 | n`, `n` from 1) and
/// no cut turn's loaded state (0) has.
pub fn carried_tag(index: u64) -> u64 {
    index.wrapping_shl(32) | u64::from(u32::MAX)
}

/// The tag of a carried state read from a record.
pub const LOADED_CARRIED_TAG: u64 = u64::MAX;

/// Whether a state's tag says it is a carried state (see [`carried_tag`]).
pub fn is_carried(tag: u64) -> bool {
    tag & u64::from(u32::MAX) == u64::from(u32::MAX)
}

/// What the agent's `run_turn` returned, as the machine classifies it (the runtime's
/// `TurnOutcome` without what only the runtime acts on: a wake-up is `Completed`).
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome<S> {
    /// The turn finished its work.
    Completed,
    /// The turn finished and leaves this state to the next turn.
    CompletedWith(S),
    /// A business interrupt (S4) with the state to continue from.
    Interrupted(InterruptInfo, S),
}

/// How the agent's future ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEnd<S> {
    /// `run_turn` returned.
    Returned(Result<Outcome<S>, AgentError>),
    /// `run_turn` panicked.
    Panicked(String),
    /// The future was dropped by an Immediate cancel.
    Killed,
}

/// How the whole turn ended, read by the session after the turn task's end.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending<S> {
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
        /// The state a completed turn leaves to the next (`CompletedWith`).
        carried: Option<StateSnap<S>>,
    },
}

impl<I: Clone, S: Clone, A> TurnMachine<I, S, A> {
    /// The turn is over (turn-task side): classify it and return the [`TurnEnd`] for the
    /// session's `TurnEnded` event. Steps still waiting for a write learn it will not
    /// come: the caller drops their waiters.
    ///
    /// A state that could not be stored fails the turn (S15a). Otherwise a captured or
    /// Immediate cancel wins over whatever the agent returned (S1, S13); a cancel that
    /// any stop contributed to ends the session (Canceled), one that only preempts
    /// contributed to is a preemption (S8). `interrupt_bytes` and `carried_bytes` are
    /// the encoded interrupt's state and carried state, when the session writes them
    /// (encoded by the caller, checked); one that does not read back fails the turn.
    pub fn finish(
        &mut self,
        run: RunEnd<S>,
        interrupt_bytes: Option<Result<Payload, String>>,
        carried_bytes: Option<Result<Payload, String>>,
    ) -> TurnEnd {
        self.phase = Phase::Ended;
        if let Some(reason) = self
            .state_failure
            .take()
            .or_else(|| self.steps.failure.take())
        {
            let end = TurnEnd::Failed(reason);
            self.ending = Some(Ending::Ran {
                end: end.clone(),
                resume_state: self.state.clone(),
                failure: Some(FailureKind::Record),
                journal: self.steps.to_record(),
                carried: None,
            });
            return end;
        }
        let cut = self.cut_info(&run);
        let mut failure = match (&cut, &run) {
            (Some(_), _) if self.by_stop || self.by_preempt => None,
            (Some(_), _) => Some(FailureKind::Internal),
            (None, RunEnd::Returned(Err(e))) if e.is_permanent() => {
                Some(FailureKind::AgentPermanent)
            }
            (None, RunEnd::Returned(Err(_))) => Some(FailureKind::Agent),
            (None, RunEnd::Panicked(_)) => Some(FailureKind::Panic),
            (None, RunEnd::Killed) => Some(FailureKind::Internal),
            (None, RunEnd::Returned(Ok(_))) => None,
        };
        let mut interrupt_state = None;
        let mut carried_value = None;
        let mut end = match (cut, run) {
            (Some(info), _) if self.by_stop => TurnEnd::Canceled(info),
            (Some(info), _) if self.by_preempt => TurnEnd::Preempted(info),
            (Some(_), _) => TurnEnd::Failed("turn was cut without a cancel request".into()),
            // A wake-up's timer was armed by the turn task before the turn ended (its
            // last durable step): the turn completed.
            (None, RunEnd::Returned(Ok(Outcome::Completed))) => TurnEnd::Completed,
            (None, RunEnd::Returned(Ok(Outcome::CompletedWith(state)))) => {
                carried_value = Some(state);
                TurnEnd::Completed
            }
            (None, RunEnd::Returned(Ok(Outcome::Interrupted(info, state)))) => {
                interrupt_state = Some(state);
                TurnEnd::Interrupted(info)
            }
            (None, RunEnd::Returned(Err(AgentError::Canceled(c)))) => TurnEnd::Failed(format!(
                "agent returned Canceled ({c}) while no cancel was pending"
            )),
            (None, RunEnd::Returned(Err(AgentError::Failed(e) | AgentError::Permanent(e)))) => {
                TurnEnd::Failed(e)
            }
            (None, RunEnd::Panicked(msg)) => TurnEnd::Failed(format!("agent panicked: {msg}")),
            // `cut` is always `Some` when the run was killed; this keeps the match total
            // without a panic path.
            (None, RunEnd::Killed) => TurnEnd::Failed("turn dropped without a cancel".into()),
        };
        let resume_state = match (interrupt_state, interrupt_bytes) {
            (Some(_), Some(Err(e))) => {
                // The interrupt's state cannot be stored: the turn fails instead, and
                // the resumable state stays the last good one.
                end = TurnEnd::Failed(format!(
                    "the agent state of the interrupt cannot be stored: {e}"
                ));
                failure = Some(FailureKind::Record);
                self.state.clone()
            }
            (Some(value), bytes) => {
                // The interrupt's state is where the turn continues: it covers every
                // step the turn began (none runs any more).
                self.steps.cover_all();
                let tag = self.next_tag;
                self.next_tag += 1;
                Some(StateSnap {
                    value,
                    bytes: bytes.and_then(Result::ok),
                    tag,
                })
            }
            // The state at the last safe point, or the turn's input if none (S2).
            (None, _) => self.state.clone(),
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
        self.ending = Some(Ending::Ran {
            end: end.clone(),
            resume_state,
            failure,
            journal: self.steps.to_record(),
            carried,
        });
        end
    }

    /// What a cut turn reports (S2, S13): `None` when no cancel cut it.
    fn cut_info(&self, run: &RunEnd<S>) -> Option<CancelInfo> {
        let killed = matches!(run, RunEnd::Killed);
        if !killed && self.captured.is_none() {
            return None;
        }
        let mode = self.active.map(|c| c.mode).unwrap_or(CancelMode::Immediate);
        let first = self.first_mode.unwrap_or(mode);
        Some(CancelInfo {
            mode,
            at: if killed { None } else { self.captured },
            escalated: mode != first && mode.dominates(first),
            timed_out: self.active.is_some_and(|c| c.timed_out),
            agent_error: match run {
                // The agent's own error, not the `Canceled` it propagated.
                RunEnd::Returned(Err(AgentError::Failed(e) | AgentError::Permanent(e))) => {
                    Some(e.clone())
                }
                RunEnd::Panicked(msg) => Some(format!("agent panicked: {msg}")),
                _ => None,
            },
        })
    }
}
