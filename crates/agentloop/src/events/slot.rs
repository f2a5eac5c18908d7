//! A subscriber's terminal slot: where `Ended` waits without using buffer capacity, the
//! count of final turn events still being delivered (so `Ended` stays last), and where a
//! lagging subscriber's first missed number is kept. Shared by the registry that fills
//! it and the stream that reads it; it decides nothing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use futures::task::AtomicWaker;
use parking_lot::Mutex;

use super::Last;

/// The per-subscriber slot that carries `Ended` without using buffer capacity, and the
/// count of final turn events still being delivered to that subscriber.
#[derive(Default)]
pub(crate) struct TerminalSlot {
    /// `Ended`'s (or `Restarting`'s) number and what it says.
    pub(super) summary: Mutex<Option<(u64, Last)>>,
    pub(super) waker: AtomicWaker,
    /// Final turn events sent after the turn reported its end and not delivered yet.
    /// `Ended` waits for them, so it is always last (backpressure subscribers only).
    pub(super) inflight: AtomicUsize,
    /// The number of the first event a lagging subscriber missed (0: not lagging).
    /// Set and cleared under the publish lock; while set, nothing is queued to it.
    pub(super) lag_from: AtomicU64,
}

impl TerminalSlot {
    pub(super) fn set(&self, ended: (u64, Last)) {
        *self.summary.lock() = Some(ended);
        self.waker.wake();
    }

    pub(super) fn get(&self) -> Option<(u64, Last)> {
        self.summary.lock().clone()
    }
}

/// Decrements a subscriber's in-flight count when a final send finishes or is dropped.
pub(super) struct InflightGuard(Arc<TerminalSlot>);

impl InflightGuard {
    /// Counts one more event in flight to the subscriber of `slot`.
    pub(super) fn new(slot: &Arc<TerminalSlot>) -> Self {
        slot.inflight.fetch_add(1, Ordering::AcqRel);
        InflightGuard(slot.clone())
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.waker.wake();
        }
    }
}
