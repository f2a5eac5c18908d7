//! Durable timers by session id (S39): arm one (`wake_at`), a recurring one
//! (`schedule`), list and cancel them. Each is one store write, durable before it is
//! answered; the runtime's timer service is told, and fires it at its time (also after
//! a restart: the store's due-time index is read at start).

use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::runtime_handle::RuntimeHandle;
use crate::store::Repeat;
use crate::timers::Command;
use crate::timers::{Schedule, Timer, TimerError};

impl<I, E> RuntimeHandle<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Arms a durable timer (S39): at `when` (at once if it passed), `item` is pushed
    /// into session `id`, waking it if it sleeps, also after restarts; the write that
    /// accepts the item removes the timer, so it fires once. Returns the timer's number
    /// (what [`cancel_timer`](Self::cancel_timer) takes). The session must be stored
    /// ([`TimerError::NoRecord`] otherwise).
    pub async fn wake_at(&self, id: &str, when: SystemTime, item: I) -> Result<u64, TimerError> {
        self.arm(id, crate::timers::ms_of(when), None, item).await
    }

    /// Arms a recurring timer (S39): `item` is pushed into session `id` at each time of
    /// `schedule` (the first one period after now, or the cron expression's next time).
    /// After a downtime that missed some of its times it fires once, not once per missed
    /// time, and keeps its grid. Returns its number.
    pub async fn schedule(&self, id: &str, schedule: Schedule, item: I) -> Result<u64, TimerError> {
        let repeat = schedule.repeat()?;
        let due = crate::timers::first_due(&repeat, self.timer_clock.now_ms())?;
        self.arm(id, due, Some(repeat), item).await
    }

    /// Session `id`'s timer `timer`, if armed (one read, whatever else it holds).
    pub async fn timer(&self, id: &str, timer: u64) -> Result<Option<Timer<I>>, TimerError> {
        let store = self.store.as_ref().ok_or(TimerError::NoStore)?;
        Ok(store
            .timer(id, timer)
            .await?
            .map(|t| Timer::from_stored(id, timer, t)))
    }

    /// Session `id`'s timers (one-off and recurring), by number.
    pub async fn timers(&self, id: &str) -> Result<Vec<Timer<I>>, TimerError> {
        let store = self.store.as_ref().ok_or(TimerError::NoStore)?;
        Ok(store
            .timers(id)
            .await?
            .into_iter()
            .map(|(n, t)| Timer::from_stored(id, n, t))
            .collect())
    }

    /// Cancels session `id`'s timer `timer` (durably); whether it was armed.
    pub async fn cancel_timer(&self, id: &str, timer: u64) -> Result<bool, TimerError> {
        let store = self.store.as_ref().ok_or(TimerError::NoStore)?;
        let canceled = store.cancel_timer(id, timer).await?;
        if let Some(service) = self.timer_service.get() {
            let _ = service.send(Command::Disarm {
                session: id.to_string(),
                id: timer,
            });
        }
        Ok(canceled)
    }

    async fn arm(
        &self,
        id: &str,
        due_ms: u64,
        repeat: Option<Repeat>,
        item: I,
    ) -> Result<u64, TimerError> {
        let store = self.store.as_ref().ok_or(TimerError::NoStore)?;
        if !store.keeps_timers() {
            return Err(TimerError::NoStore);
        }
        // The session must be stored, so that its timer outlives this process: one
        // running here writes its record first unless it is stored already (then this
        // is one message, no I/O); one not running here must be stored.
        match self.supervisor.checkpoint(id).await {
            Ok(()) => {}
            Err(crate::supervisor::SupervisorError::UnknownSession(_)) => {
                if store.load_stored(id).await?.is_none() {
                    return Err(TimerError::NoRecord {
                        session: id.to_string(),
                    });
                }
            }
            Err(e) => return Err(TimerError::Session(e.to_string())),
        }
        let timer = crate::timers::stored(&item, due_ms, repeat, self.timer_clock.now_ms())?;
        let link = crate::timers::TimerLink {
            store: store.clone(),
            service: self.timer_service.get().cloned(),
            bounds: self.timer_bounds,
        };
        link.arm(id, timer).await
    }
}
