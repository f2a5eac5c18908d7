//! State one session shares outside its actor: the stop signal and cause (S13), the
//! late list (S14), the exit state (S13) that handles wait on, and the event numbering
//! (S20), and the guard a push sent without a reply carries, which puts its item on
//! the late list if the message is dropped unprocessed (S10, S14).
//!
//! Only the TurnLoop actor writes here (handles only append to the late list when the
//! actor is already gone); readers are handles and turn contexts. Critical sections are
//! short and never span an await.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::events::EventSeq;
use crate::exit::ExitState;

impl<I> SessionShared<I> {
    /// Records a late item from a destructor (no `Clone` bound needed).
    pub(crate) fn push_late_unchecked(&self, item: I) {
        self.late.lock().push(item);
    }
}

/// Shared, non-actor state of one session.
pub(crate) struct SessionShared<I> {
    pub(crate) id: String,
    /// Pushes rejected after the stop committed (S14), not yet taken.
    late: Mutex<Vec<I>>,
    /// Fires once, when a stop commits (S13 `stopped()`).
    stopped: watch::Sender<bool>,
    /// The first non-empty stop cause (S11). Set before `stopped` fires.
    cause: Mutex<Option<String>>,
    /// The exit state, published once at teardown.
    exit: watch::Sender<Option<Arc<ExitState<I>>>>,
    /// Set by `detach` (S23): a bound client's disconnect no longer cancels the work.
    pub(crate) detached: std::sync::atomic::AtomicBool,
    /// The session's event numbering (S20), which its writes record (S26).
    pub(crate) event_seq: Arc<EventSeq>,
    /// Where the session's turns arm durable timers (S39): its store, and the runtime's
    /// timer service when there is one. Unset without a store.
    pub(crate) timers: std::sync::OnceLock<crate::timers::TimerLink<I>>,
    /// The version of the agent kind this incarnation runs (S40).
    pub(crate) agent_version: u32,
}

impl<I: Clone> SessionShared<I> {
    pub(crate) fn new(id: String) -> Self {
        SessionShared {
            id,
            late: Mutex::new(Vec::new()),
            stopped: watch::Sender::new(false),
            cause: Mutex::new(None),
            exit: watch::Sender::new(None),
            detached: std::sync::atomic::AtomicBool::new(false),
            event_seq: Arc::new(EventSeq::default()),
            timers: std::sync::OnceLock::new(),
            agent_version: agentloop_core::header::FIRST_VERSION,
        }
    }

    /// Records a late item (S14).
    pub(crate) fn push_late(&self, item: I) {
        self.late.lock().push(item);
    }

    /// Takes the late items recorded so far.
    pub(crate) fn take_late(&self) -> Vec<I> {
        std::mem::take(&mut *self.late.lock())
    }

    /// A copy of the late items recorded so far.
    pub(crate) fn late_snapshot(&self) -> Vec<I> {
        self.late.lock().clone()
    }

    /// Records the cause if none is set yet (first non-empty wins).
    pub(crate) fn offer_cause(&self, cause: Option<&str>) {
        if let Some(c) = cause.filter(|c| !c.is_empty()) {
            let mut slot = self.cause.lock();
            if slot.is_none() {
                *slot = Some(c.to_string());
            }
        }
    }

    /// The first non-empty cause.
    pub(crate) fn cause(&self) -> Option<String> {
        self.cause.lock().clone()
    }

    /// Fires the stopped signal (idempotent).
    pub(crate) fn fire_stopped(&self) {
        self.stopped.send_if_modified(|s| {
            let changed = !*s;
            *s = true;
            changed
        });
    }

    pub(crate) fn is_stopped(&self) -> bool {
        *self.stopped.borrow()
    }

    pub(crate) fn stopped_signal(&self) -> watch::Receiver<bool> {
        self.stopped.subscribe()
    }

    /// Publishes the exit state (once).
    pub(crate) fn publish_exit(&self, exit: ExitState<I>) {
        self.exit.send_replace(Some(Arc::new(exit)));
    }

    pub(crate) fn exit_signal(&self) -> watch::Receiver<Option<Arc<ExitState<I>>>> {
        self.exit.subscribe()
    }

    pub(crate) fn exited(&self) -> Option<Arc<ExitState<I>>> {
        self.exit.borrow().clone()
    }
}

/// Carried by a push sent without a reply (`handle.push(item).no_wait()`). Invariant:
/// if the message is dropped without being processed (the actor was killed with it
/// queued), the item goes to the session's late list instead of vanishing (S10, S14).
pub(crate) struct UnprocessedPush<I> {
    item: Option<I>,
    shared: Arc<SessionShared<I>>,
}

impl<I> UnprocessedPush<I> {
    pub(crate) fn new(item: I, shared: Arc<SessionShared<I>>) -> Self {
        UnprocessedPush {
            item: Some(item),
            shared,
        }
    }

    /// The actor took the message: it accounts for the item from now on.
    pub(crate) fn disarm(mut self) {
        self.item = None;
    }
}

impl<I> Drop for UnprocessedPush<I> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            self.shared.push_late_unchecked(item);
        }
    }
}
