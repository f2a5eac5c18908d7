//! Durable timers armed from a turn (S39): `TurnCx::wake_at` and `TurnCx::schedule`.
//! Each is a durable step (S1b) named `wake_at` / `schedule`: the timer is armed in the
//! store before the call returns, and a turn that runs again (after a crash, a restart,
//! a move) is answered the timer's number from the journal instead of arming a second
//! one. The runtime's timer service fires it (`crate::timers`).

use std::time::SystemTime;

use crate::agent::Agent;
use crate::store::Repeat;
use crate::timers::{Schedule, TimerError};
use crate::turn::context::TurnCx;

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
    /// [`RuntimeHandle::schedule`](crate::RuntimeHandle::schedule)); a durable step
    /// like [`wake_at`](Self::wake_at).
    pub async fn schedule(&self, schedule: Schedule, item: A::Item) -> Result<u64, TimerError> {
        let repeat = schedule.repeat()?;
        let due = crate::timers::first_due(&repeat, crate::store::now_ms())?;
        self.arm_timer("schedule", due, Some(repeat), item).await
    }

    async fn arm_timer(
        &self,
        step: &str,
        due_ms: u64,
        repeat: Option<Repeat>,
        item: A::Item,
    ) -> Result<u64, TimerError> {
        let link = self.session.timers.get().ok_or(TimerError::NoStore)?;
        let timer = crate::timers::stored(&item, due_ms, repeat, crate::store::now_ms())?;
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
