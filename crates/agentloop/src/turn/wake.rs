//! Durable timers armed from a turn (S39): `TurnCx::wake_at` and `TurnCx::schedule`,
//! and the outcome `TurnCx::end_and_wake_at`. Each arms through a durable step (S1b)
//! named `wake_at` / `schedule` / `end_and_wake_at`: the timer is armed in the store
//! before the step's result is journaled, and a turn that runs again (after a crash, a
//! restart, a move) is answered the timer's number from the journal instead of arming
//! a second one. The runtime's timer service fires it (`crate::timers`); this module
//! must not fire or cancel timers.

use std::time::SystemTime;

use crate::store::{Repeat, StoredTimer};
use crate::timers::{Schedule, TimerError};
use crate::turn::agent::TurnCx;
use crate::turn::agent::{Agent, AgentError, TurnOutcome, WakeUp};

impl<A: Agent> TurnCx<A> {
    /// Arms a durable timer of this session (S39): at `when` `item` is pushed into the
    /// session (waking it if it sleeps), once, also after restarts. Returns the timer's
    /// number. A durable step: the same turn running again gets the same number back
    /// and arms nothing more. Needs a persistent session on a store that keeps timers
    /// ([`TimerError::NoStore`] otherwise).
    ///
    /// ```ignore
    /// // "Check the build in an hour": end the turn; the item comes back then.
    /// cx.wake_at(SystemTime::now() + Duration::from_secs(3600), Item::CheckBuild).await?;
    /// ```
    pub async fn wake_at(&self, when: SystemTime, item: A::Item) -> Result<u64, TimerError> {
        self.arm_timer("wake_at", crate::timers::ms_of(when), None, item)
            .await
    }

    /// Arms a recurring timer of this session (S39; see
    /// [`RuntimeHandle::schedule`](crate::runtime::RuntimeHandle::schedule)); a durable step
    /// like [`wake_at`](Self::wake_at).
    pub async fn schedule(&self, schedule: Schedule, item: A::Item) -> Result<u64, TimerError> {
        let repeat = schedule.repeat()?;
        let due = crate::timers::first_due(&repeat, crate::store::now_ms())?;
        self.arm_timer("schedule", due, Some(repeat), item).await
    }

    /// Ends the turn with a wake-up time (S39): return this from `run_turn`. The turn
    /// ends completed, and at `when` `item` is pushed into the session (waking it if it
    /// sleeps), once, also after restarts, on whichever node owns the session then.
    ///
    /// Unlike [`wake_at`](Self::wake_at), which arms at once, this arms only a turn that
    /// ends completed: a cancel the turn captured at a safe point, or a failed step,
    /// ends it otherwise and arms nothing. The timer is armed after `run_turn` returns,
    /// as the turn's last durable step (named `end_and_wake_at`): a turn that runs again
    /// after a crash is answered from its journal and arms nothing more. A timer that
    /// cannot be armed (the store refuses it) fails the turn with the reason. Listed
    /// and canceled like any timer ([`RuntimeHandle::timers`](crate::runtime::RuntimeHandle::timers)).
    ///
    /// Errors at once when the session cannot keep a timer (not persistent, or no store)
    /// or the item cannot be encoded: the message says which.
    ///
    /// ```ignore
    /// // "Check the build in an hour", as the turn's last word.
    /// return cx.end_and_wake_at(SystemTime::now() + Duration::from_secs(3600), Item::CheckBuild);
    /// ```
    pub fn end_and_wake_at(
        &self,
        when: SystemTime,
        item: A::Item,
    ) -> Result<TurnOutcome<A::State>, AgentError> {
        if self.session.timers.get().is_none() {
            return Err(AgentError::failed(format!(
                "the turn cannot end with a wake-up time: {}",
                TimerError::NoStore
            )));
        }
        let timer = crate::timers::stored(
            &item,
            crate::timers::ms_of(when),
            None,
            crate::store::now_ms(),
        )
        .map_err(|e| AgentError::failed(format!("the turn cannot end with a wake-up time: {e}")))?;
        Ok(TurnOutcome::WakeAt(WakeUp { timer }))
    }

    /// Arms the wake-up a turn ended with (called by the turn task after `run_turn`
    /// returned it, while the turn still runs): the durable step `end_and_wake_at`.
    pub(crate) async fn arm_wake_up(&self, wake: WakeUp) -> Result<u64, TimerError> {
        self.arm_stored("end_and_wake_at", wake.timer).await
    }

    async fn arm_timer(
        &self,
        step: &str,
        due_ms: u64,
        repeat: Option<Repeat>,
        item: A::Item,
    ) -> Result<u64, TimerError> {
        let timer = crate::timers::stored(&item, due_ms, repeat, crate::store::now_ms())?;
        self.arm_stored(step, timer).await
    }

    async fn arm_stored(&self, step: &str, timer: StoredTimer) -> Result<u64, TimerError> {
        let link = self.session.timers.get().ok_or(TimerError::NoStore)?;
        let session = self.session.id.clone();
        let armed: Result<u64, String> = self
            .step(step, |_key| async move {
                link.arm(&session, timer).await.map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| TimerError::Session(e.to_string()))?;
        armed.map_err(TimerError::Session)
    }
}
