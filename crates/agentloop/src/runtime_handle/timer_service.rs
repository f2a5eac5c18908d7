//! The task that fires durable timers (S39): it reads the store's due-time index once
//! at start, keeps the armed timers in a due-time queue (`agentloop_core::timers`),
//! sleeps until the earliest, and pushes each due timer's item into its session with
//! the timer's removal (or move) riding the write that accepts it. A push the session
//! answers as a duplicate (a fire retried after its item was accepted) removes the
//! timer alone. The item goes wherever the session runs: here (woken if it sleeps), or
//! on a cluster node, forwarded to its owner with the timer's change. A session that
//! takes nothing now (stopped, recovering, its owner unreachable) is tried again later
//! with a backoff; the timer stays in the store meanwhile.
//!
//! On a store several processes share (a cluster, S36), the service also reads the
//! due-time index again every `rescan`: timers armed by another node, and those of
//! sessions it adopts from a node that died, fire here too (the owner accepts a fire
//! once: its key makes a second a duplicate).
//!
//! Time is the wall clock, read through tokio's clock once started (so a test's paused
//! clock moves timers too); it never goes back. This file decides nothing about what a
//! session does with the item and never touches a store engine.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};

use agentloop_core::timers::{TimerQueue, TimerRef};

use crate::push::{PreemptAck, PushError};
use crate::runtime_handle::RuntimeHandle;
use crate::store::TimerChange;
use crate::timers::{Clock, Command, Notify};

/// How many timers fire at once (each is a push that waits for its write).
const FIRING: usize = 512;
/// The first retry of a timer whose session is not running here, then doubled.
const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between retries.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// What a fire came to.
enum Fired {
    /// Done (or nothing to do: canceled, moved, the session gone).
    Done,
    /// Fire it again at this time (the session is not running here yet).
    Retry(u64),
}

/// Starts the service over `handle`'s store: it reads the due-time index, then fires;
/// it is told of arms and cancels on `rx` (`again` is its own sender: the next slot of
/// a schedule). What it is told before the index is read waits in line: a timer both
/// read and told is fired once, the second try finding it gone. Returns its task. It ends when the runtime's shutdown starts (the timers stay
/// stored; the next start reads them).
pub(crate) fn start<I, E>(
    handle: RuntimeHandle<I, E>,
    clock: Clock,
    again: Notify,
    mut rx: mpsc::UnboundedReceiver<Command>,
    rescan: Option<Duration>,
) -> tokio::task::JoinHandle<()>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut queue = TimerQueue::new();
        let Some(store) = handle.store.clone() else {
            return;
        };
        let mut wait = RETRY_FIRST;
        loop {
            match store.due_timers().await {
                Ok(armed) => {
                    if !armed.is_empty() {
                        tracing::info!(timers = armed.len(), "durable timers armed from the store");
                    }
                    for t in armed {
                        queue.arm(t);
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot read the durable timers from the store; no timer fires until they are read");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
        // A retried timer is queued at its retry time; its due time (the fire's key) and
        // its next wait are kept here.
        let mut retries: HashMap<(String, u64), (u64, Duration)> = HashMap::new();
        let firing = Arc::new(Semaphore::new(FIRING));
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(TimerRef, Fired)>();
        let shutdown = handle.shutdown.clone();
        let mut stopping = std::pin::pin!(shutdown.started());
        // With a rescan: the fires queued or in flight, so a timer read again is not
        // queued twice.
        let mut known: std::collections::HashSet<(String, u64, u64)> = match rescan {
            Some(_) => queue
                .refs()
                .map(|t| (t.session.clone(), t.id, t.due_ms))
                .collect(),
            None => Default::default(),
        };
        let mut rescans = tokio::time::interval(rescan.unwrap_or(Duration::from_secs(3600)));
        rescans.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rescans.tick().await;
        loop {
            let next = queue.next_due().map(|ms| clock.instant_of(ms));
            tokio::select! {
                () = &mut stopping => break,
                _ = rescans.tick(), if rescan.is_some() => {
                    match store.due_timers().await {
                        Ok(armed) => {
                            for t in armed {
                                if known.insert((t.session.clone(), t.id, t.due_ms)) {
                                    queue.arm(t);
                                }
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot read the durable timers again; the next rescan retries"),
                    }
                }
                command = rx.recv() => match command {
                    Some(Command::Arm(t)) => {
                        retries.remove(&(t.session.clone(), t.id));
                        if rescan.is_some() {
                            known.insert((t.session.clone(), t.id, t.due_ms));
                        }
                        queue.arm(t);
                    }
                    Some(Command::Disarm { session, id }) => {
                        retries.remove(&(session.clone(), id));
                        if rescan.is_some() {
                            known.retain(|(s, n, _)| !(*s == session && *n == id));
                        }
                        queue.disarm(&session, id);
                    }
                    None => break,
                },
                Some((t, fired)) = done_rx.recv() => {
                    if rescan.is_some() && matches!(fired, Fired::Done) {
                        known.remove(&(t.session.clone(), t.id, t.due_ms));
                    }
                    if let Fired::Retry(at) = fired {
                        let key = (t.session.clone(), t.id);
                        let wait = retries.get(&key).map_or(RETRY_FIRST, |(_, w)| *w);
                        retries.insert(key, (t.due_ms, (wait * 2).min(RETRY_MAX)));
                        queue.arm(TimerRef { due_ms: at, ..t });
                    }
                }
                () = sleep_until(next) => {
                    let now = clock.now_ms();
                    for mut t in queue.due(now) {
                        let wait = match retries.remove(&(t.session.clone(), t.id)) {
                            Some((due, wait)) => {
                                t.due_ms = due;
                                wait
                            }
                            None => RETRY_FIRST,
                        };
                        let Ok(permit) = firing.clone().acquire_owned().await else {
                            break;
                        };
                        let (handle, done, again) = (handle.clone(), done_tx.clone(), again.clone());
                        tokio::spawn(async move {
                            let fired = fire(&handle, &t, clock, wait, &again).await;
                            drop(permit);
                            let _ = done.send((t, fired));
                        });
                    }
                }
            }
        }
        tracing::debug!("timer service stopped: the runtime is shutting down");
    })
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Fires timer `t`: pushes its item with its removal (or move); `wait` is how long to
/// wait before trying again when its session is not running here.
async fn fire<I, E>(
    handle: &RuntimeHandle<I, E>,
    t: &TimerRef,
    clock: Clock,
    wait: Duration,
    again: &mpsc::UnboundedSender<Command>,
) -> Fired
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    let Some(store) = handle.store.clone() else {
        return Fired::Done;
    };
    let retry = || Fired::Retry(clock.now_ms() + u64::try_from(wait.as_millis()).unwrap_or(0));
    let stored = match store.timer(&t.session, t.id).await {
        Ok(timer) => timer,
        Err(e) => {
            tracing::warn!(session = %t.session, timer = t.id, error = %e, "cannot read a due timer; trying again");
            return retry();
        }
    };
    // Canceled, or moved since (its new time is queued): nothing to do.
    let Some(stored) = stored.filter(|s| s.due_ms == t.due_ms) else {
        return Fired::Done;
    };
    let item: I = match crate::store::codec::decode_item(&t.session, &stored.item) {
        Ok(i) => i,
        Err(e) => {
            tracing::error!(session = %t.session, timer = t.id, error = %e,
                "a due timer's item does not decode as this runtime's item type: it is kept, not fired; cancel it, or run a build that reads it");
            return Fired::Done;
        }
    };
    let now = clock.now_ms();
    let next = stored
        .repeat
        .as_ref()
        .and_then(|r| crate::timers::next_due(r, t.due_ms, now));
    let change = TimerChange::Fired {
        timer: t.id,
        due_ms: t.due_ms,
        next_due_ms: next,
    };
    let mut options = crate::options::PushOptions::new();
    options.answer_at_acceptance = true;
    // The same fire always carries the same key: a retry after its item was accepted is
    // answered as a duplicate and delivers nothing.
    options.idempotency = Some((format!("timer/{}/{}", t.id, t.due_ms), 0));
    options.timer = Some(change.clone());
    let rearm = |next: Option<u64>| {
        if let Some(due_ms) = next {
            let _ = again.send(Command::Arm(TimerRef {
                due_ms,
                session: t.session.clone(),
                id: t.id,
            }));
        }
    };
    // Wherever it runs: here (woken if it sleeps), or at its owner on a cluster node.
    match handle.push(&t.session, item).options(options).await {
        Ok(PreemptAck::Duplicate) => {
            // Accepted before (a retried fire): the timer's change alone.
            match store.change_timer(&t.session, change).await {
                Ok(()) => {
                    rearm(next);
                    Fired::Done
                }
                Err(e) => {
                    tracing::warn!(session = %t.session, timer = t.id, error = %e, "cannot remove a fired timer; trying again");
                    retry()
                }
            }
        }
        Ok(_) => {
            tracing::debug!(session = %t.session, timer = t.id, late_ms = now.saturating_sub(t.due_ms), "timer fired");
            handle.metrics.timer_fired(now.saturating_sub(t.due_ms));
            rearm(next);
            Fired::Done
        }
        Err(PushError::UnknownSession { .. })
            if matches!(store.load_stored(&t.session).await, Ok(None)) =>
        {
            // Neither live nor stored: the session is gone (it ended before its record
            // was ever written); its timer goes with it.
            tracing::warn!(session = %t.session, timer = t.id, "a due timer's session is neither running nor stored: the timer is removed, its item not delivered");
            if let Err(e) = store.cancel_timer(&t.session, t.id).await {
                tracing::warn!(session = %t.session, timer = t.id, error = %e, "cannot remove the timer; trying again");
                return retry();
            }
            Fired::Done
        }
        Err(PushError::UnknownSession { .. })
        | Err(PushError::NotLive { .. })
        | Err(PushError::NotRunning { .. })
        | Err(PushError::Late { .. })
        | Err(PushError::Full { .. })
        | Err(PushError::NotDurable { .. }) => {
            tracing::debug!(session = %t.session, timer = t.id, retry_in = ?wait, "a due timer's session takes nothing here now; trying again");
            retry()
        }
        Err(e) => {
            tracing::warn!(session = %t.session, timer = t.id, error = %e, "a due timer's push was refused; trying again");
            retry()
        }
    }
}
