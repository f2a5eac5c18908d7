//! The supervisor's directory: which incarnation answers for each session id, readable
//! by every [`SupervisorHandle`](super::SupervisorHandle) without a message to the
//! supervisor (issue 31: by-id work without detours).
//!
//! The supervisor is the only writer: it enters an incarnation once it is started
//! (after its seed items and, for a detached session, its detach were sent, so nothing
//! routed here overtakes them) and takes it out when the incarnation ends. Readers only
//! look up: a push to a live incarnation goes straight to the session's mailbox on the
//! caller's task, which saves the supervisor's mailbox and a spawned routing task (two
//! hand-offs) on every push; stops, subscriptions and inspections by id go the same
//! way. Everything that needs a decision (a session that has just
//! ended and may be restarted, an unknown id that may be stored, a closed drain gate)
//! still goes through the supervisor: this module decides nothing about lifecycles.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

use crate::metrics::{PushResult, RuntimeMetrics};
use crate::session::SessionHandle;

/// Live incarnations by session id, the drain gate, and the routed-push counters.
pub(crate) struct Directory<I, E> {
    sessions: DashMap<String, SessionHandle<I, E>>,
    /// Set by the supervisor's `CloseGate` (S27): spawns are refused as shutting down,
    /// routed pushes are answered late. The supervisor's only copy of the gate.
    gate_closed: AtomicBool,
    /// Pushes the closed gate answered late.
    gate_late: Arc<AtomicU64>,
    metrics: Option<Arc<RuntimeMetrics>>,
    /// The runtime's codec for kept events (an `EventCodec<E>`, S20a), once set.
    event_codec: std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
    /// The runtime's timer service (S39), once it has one.
    timer_service: std::sync::OnceLock<crate::timers::Notify>,
    /// The runtime's default `idle_after` (S39), once set.
    idle_after: std::sync::OnceLock<std::time::Duration>,
}

impl<I, E> Directory<I, E> {
    /// How long the runtime lets its persistent sessions idle before they sleep, when
    /// their spec says nothing (S39).
    pub(crate) fn idle_after(&self) -> Option<std::time::Duration> {
        self.idle_after.get().copied()
    }

    /// Sets the runtime's default `idle_after` (the first one set stays).
    pub(crate) fn set_idle_after(&self, idle: std::time::Duration) {
        let _ = self.idle_after.set(idle);
    }

    /// Where sessions tell the runtime's timer service of the timers their turns arm.
    pub(crate) fn timer_service(&self) -> Option<crate::timers::Notify> {
        self.timer_service.get().cloned()
    }

    /// Sets the runtime's timer service (the first one set stays).
    pub(crate) fn set_timer_service(&self, notify: crate::timers::Notify) {
        let _ = self.timer_service.set(notify);
    }

    /// The runtime's codec for kept events, if one was set.
    pub(crate) fn event_codec(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        self.event_codec.get().cloned()
    }

    /// Sets the runtime's codec for kept events (the first one set stays).
    pub(crate) fn set_event_codec(&self, codec: Arc<dyn std::any::Any + Send + Sync>) {
        let _ = self.event_codec.set(codec);
    }

    /// An empty directory counting routed pushes in `metrics`.
    pub(crate) fn new(metrics: Option<Arc<RuntimeMetrics>>) -> Self {
        Directory {
            sessions: DashMap::new(),
            gate_closed: AtomicBool::new(false),
            gate_late: Arc::new(AtomicU64::new(0)),
            metrics,
            event_codec: std::sync::OnceLock::new(),
            timer_service: std::sync::OnceLock::new(),
            idle_after: std::sync::OnceLock::new(),
        }
    }

    /// Enters (or replaces) the incarnation answering for `id`.
    pub(crate) fn enter(&self, id: &str, handle: SessionHandle<I, E>) {
        self.sessions.insert(id.to_string(), handle);
    }

    /// Gives back the memory the table grew for sessions no longer live.
    pub(crate) fn shrink(&self) {
        self.sessions.shrink_to_fit();
    }

    /// Takes `id` out (its incarnation ended, or the supervisor stops).
    pub(crate) fn remove(&self, id: &str) {
        self.sessions.remove(id);
    }

    /// The incarnation the registry holds for `id`, ended or not.
    pub(crate) fn get(&self, id: &str) -> Option<SessionHandle<I, E>> {
        Some(self.sessions.get(id)?.value().clone())
    }

    /// The incarnation answering for `id` while it has not ended; `None` when the
    /// supervisor must decide (unknown, or ended and maybe restarting).
    pub(crate) fn live(&self, id: &str) -> Option<SessionHandle<I, E>>
    where
        I: Clone + Send + Sync + 'static,
        E: Clone + Send + Sync + 'static,
    {
        let handle = self.sessions.get(id)?.value().clone();
        (!handle.has_ended()).then_some(handle)
    }

    /// Closes the drain gate (S27): from now on routed pushes are answered late.
    pub(crate) fn close_gate(&self) {
        self.gate_closed.store(true, Ordering::Release);
    }

    /// Whether the drain gate is closed; a caller that sees it closed counts the late
    /// push with [`Directory::count_gate_late`].
    pub(crate) fn gate_closed(&self) -> bool {
        self.gate_closed.load(Ordering::Acquire)
    }

    /// One push refused by the closed gate.
    pub(crate) fn count_gate_late(&self) {
        self.gate_late.fetch_add(1, Ordering::Relaxed);
        self.count(PushResult::Late);
    }

    /// The counter of pushes refused by the closed gate (the shutdown reports it).
    pub(crate) fn gate_late(&self) -> Arc<AtomicU64> {
        self.gate_late.clone()
    }

    /// A routed push was answered.
    pub(crate) fn count(&self, result: PushResult) {
        if let Some(m) = &self.metrics {
            m.push(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_starts_open_and_counts_what_it_refuses() {
        let d: Directory<u32, u32> = Directory::new(None);
        assert!(!d.gate_closed());
        d.close_gate();
        assert!(d.gate_closed());
        d.count_gate_late();
        d.count_gate_late();
        assert_eq!(d.gate_late().load(Ordering::Relaxed), 2);
        assert!(d.live("nobody").is_none());
    }
}
