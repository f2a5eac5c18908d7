//! Which events a subscriber wants ([`EventFilter`]): by kind, and whether it asks for
//! backpressure (in-process only). Plain data; the subscribers apply it.

use super::SessionEvent;
use serde::{Deserialize, Serialize};

/// Which events a subscriber receives, and whether it may slow the session. `Ended`
/// is always delivered. A subscriber is neither woken nor slowed by events it filters
/// out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventFilter {
    /// Backpressure instead of lag (S20): when this subscriber's buffer is full, the
    /// session's turn waits for it to read. Off by default: a subscriber that falls
    /// behind gets [`SessionEvent::Lagged`] and catches up from the replay buffer, and
    /// the session never waits for it. Only for in-process readers that must see every
    /// event of a session without a replay buffer; a stream relayed to another node
    /// never applies backpressure.
    #[serde(default)]
    pub backpressure: bool,
    /// `TurnStarted`.
    pub turn_started: bool,
    /// `Agent` events.
    pub agent: bool,
    /// `Preempted`.
    pub preempted: bool,
    /// `TurnEnded`.
    pub turn_ended: bool,
    /// `StopRequested`.
    pub stop_requested: bool,
    /// `StepStarted` and `StepFinished` (S1b).
    #[serde(default = "yes")]
    pub steps: bool,
}

fn yes() -> bool {
    true
}

impl Default for EventFilter {
    fn default() -> Self {
        Self::all()
    }
}

impl EventFilter {
    /// Every event.
    pub const fn all() -> Self {
        EventFilter {
            backpressure: false,
            turn_started: true,
            agent: true,
            preempted: true,
            turn_ended: true,
            stop_requested: true,
            steps: true,
        }
    }

    /// Only turn ends (and `Ended`): for clients that wait for results.
    pub const fn turn_ends() -> Self {
        EventFilter {
            backpressure: false,
            turn_started: false,
            agent: false,
            preempted: false,
            turn_ended: true,
            stop_requested: false,
            steps: false,
        }
    }

    /// The same filter, with backpressure: the session waits for this subscriber when
    /// its buffer is full instead of letting it lag (see [`EventFilter::backpressure`]).
    pub const fn with_backpressure(mut self) -> Self {
        self.backpressure = true;
        self
    }

    /// Whether `event` passes.
    pub fn accepts<E>(&self, event: &SessionEvent<E>) -> bool {
        match event {
            SessionEvent::TurnStarted { .. } => self.turn_started,
            SessionEvent::Agent { .. } => self.agent,
            SessionEvent::Preempted { .. } => self.preempted,
            SessionEvent::TurnEnded { .. } => self.turn_ended,
            SessionEvent::StopRequested { .. } => self.stop_requested,
            SessionEvent::StepStarted { .. } | SessionEvent::StepFinished { .. } => self.steps,
            SessionEvent::Ended(_)
            | SessionEvent::Restarting { .. }
            | SessionEvent::Lagged { .. } => true,
        }
    }
}
