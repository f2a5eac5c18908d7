//! Durable timers and schedules (DESIGN S39, issue 34), as plain decisions: which
//! timers are due, in what order, when a recurring schedule fires next, and what a
//! schedule does after a downtime that missed some of its slots (it fires once, not
//! once per missed slot). Nothing here waits, reads a clock or touches a store: the
//! runtime asks with the time it read, and arms what the answers say (issue 34's later
//! steps wire it).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

/// A timer's place: when it is due, the session it pushes into, and its id there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimerRef {
    /// When it is due, ms since the Unix epoch.
    pub due_ms: u64,
    /// The session it pushes into.
    pub session: String,
    /// Its id, unique within the session.
    pub id: u64,
}

/// The timers armed on a node, ordered by due time (then session and id, so timers due
/// at the same moment fire in a stable order).
#[derive(Debug, Default)]
pub struct TimerQueue {
    heap: BinaryHeap<Reverse<TimerRef>>,
}

impl TimerQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arms a timer.
    pub fn arm(&mut self, timer: TimerRef) {
        self.heap.push(Reverse(timer));
    }

    /// The armed timers, in no order.
    pub fn refs(&self) -> impl Iterator<Item = &TimerRef> {
        self.heap.iter().map(|Reverse(t)| t)
    }

    /// How many timers are armed.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether none is armed.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// When the next timer is due (`None`: none armed): the runtime sleeps until then.
    pub fn next_due(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(t)| t.due_ms)
    }

    /// Takes every timer due at `now_ms`, earliest first.
    pub fn due(&mut self, now_ms: u64) -> Vec<TimerRef> {
        let mut out = Vec::new();
        while self
            .heap
            .peek()
            .is_some_and(|Reverse(t)| t.due_ms <= now_ms)
        {
            if let Some(Reverse(t)) = self.heap.pop() {
                out.push(t);
            }
        }
        out
    }

    /// Disarms a timer (a cancel); whether it was armed.
    pub fn disarm(&mut self, session: &str, id: u64) -> bool {
        let before = self.heap.len();
        self.heap
            .retain(|Reverse(t)| !(t.session == session && t.id == id));
        self.heap.len() < before
    }
}

/// How a stored timer recurs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Repeat {
    /// On a fixed grid: every `ms` milliseconds from its first due time.
    Every {
        /// The period, ms (at least 1).
        ms: u64,
    },
    /// At the times a cron expression names, in UTC (parsed by the runtime).
    Cron {
        /// The expression, as given.
        expr: String,
    },
}

/// How a schedule recurs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Every {
    /// Every `ms` milliseconds (at least 1).
    Millis(u64),
}

impl Every {
    fn period(&self) -> u64 {
        match self {
            Every::Millis(ms) => (*ms).max(1),
        }
    }
}

/// What a schedule does at `now_ms`, its last slot having been `slot_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fire {
    /// Whether it fires now (once, however many slots were missed).
    pub now: bool,
    /// How many slots passed without a fire (a downtime): reported, not replayed.
    pub missed: u64,
    /// Its next slot: the first one after `now_ms`, on the schedule's grid.
    pub next_ms: u64,
}

/// The decision for a schedule whose next slot was `slot_ms`, at `now_ms`: before the
/// slot, nothing (the next slot stays); at or after it, one fire, the slots missed
/// since counted, and the next slot the first on the grid after `now_ms` (so a schedule
/// keeps its phase: every hour at :15 stays at :15 after a downtime).
pub fn fire(every: Every, slot_ms: u64, now_ms: u64) -> Fire {
    if now_ms < slot_ms {
        return Fire {
            now: false,
            missed: 0,
            next_ms: slot_ms,
        };
    }
    let period = every.period();
    let passed = (now_ms - slot_ms) / period;
    Fire {
        now: true,
        missed: passed,
        next_ms: slot_ms + (passed + 1) * period,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(due_ms: u64, session: &str, id: u64) -> TimerRef {
        TimerRef {
            due_ms,
            session: session.into(),
            id,
        }
    }

    #[test]
    fn timers_come_due_in_order_and_once() {
        let mut q = TimerQueue::new();
        q.arm(t(30, "b", 1));
        q.arm(t(10, "a", 2));
        q.arm(t(30, "a", 1));
        q.arm(t(50, "c", 1));
        assert_eq!(q.next_due(), Some(10));
        assert_eq!(q.due(9), vec![]);
        assert_eq!(
            q.due(30),
            vec![t(10, "a", 2), t(30, "a", 1), t(30, "b", 1)],
            "earliest first, ties by session then id"
        );
        assert!(q.due(30).is_empty(), "each once");
        assert!(q.disarm("c", 1));
        assert!(!q.disarm("c", 1));
        assert!(q.is_empty());
    }

    #[test]
    fn a_schedule_fires_once_after_a_downtime_and_keeps_its_phase() {
        let hour = 3_600_000;
        let every = Every::Millis(hour);
        // Before its slot: nothing.
        assert_eq!(
            fire(every, 15 * 60_000, 0),
            Fire {
                now: false,
                missed: 0,
                next_ms: 15 * 60_000
            }
        );
        // Down from 00:15 to 05:20: one fire (not six), five later slots counted as
        // missed, the next at 06:15.
        let f = fire(every, 15 * 60_000, 5 * hour + 20 * 60_000);
        assert_eq!(
            f,
            Fire {
                now: true,
                missed: 5,
                next_ms: 6 * hour + 15 * 60_000
            }
        );
    }

    proptest! {
        /// Whatever the downtime: a fire at or after the slot happens once, the next
        /// slot is after `now`, on the grid, and less than a period after `now`.
        #[test]
        fn the_next_slot_is_after_now_on_the_grid(
            slot in 0u64..1_000_000,
            period in 1u64..10_000,
            late in 0u64..1_000_000,
        ) {
            let now = slot + late;
            let f = fire(Every::Millis(period), slot, now);
            prop_assert!(f.now);
            prop_assert!(f.next_ms > now);
            prop_assert!(f.next_ms - now <= period);
            prop_assert_eq!((f.next_ms - slot) % period, 0);
            prop_assert_eq!(f.missed, late / period);
        }
    }
}

/// A timer as its session's key keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredTimer {
    /// When it is due next, ms since the Unix epoch.
    pub due_ms: u64,
    /// The item it pushes, as the session's codec encoded it.
    #[serde(with = "serde_bytes")]
    pub item: Vec<u8>,
    /// How it recurs (`None`: once).
    pub repeat: Option<Repeat>,
    /// When it was armed, ms since the Unix epoch.
    pub armed_ms: u64,
    /// How many times it fired.
    pub fired: u64,
}

/// A change to a session's timers that rides a record write ([`crate::write::RecordWrite`]),
/// so it is durable exactly when the record's change is. Serializable: a fire forwarded
/// to the node that owns the session carries it (S39).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimerChange {
    /// Arm a timer (its number is taken in the write).
    Arm(StoredTimer),
    /// Timer `timer`, due at `due_ms`, fired: its item is among this write's items.
    /// A timer that recurs moves to `next_due_ms`; one that does not is removed. A timer
    /// no longer stored (canceled after it fired) changes nothing.
    Fired {
        /// The timer's number.
        timer: u64,
        /// The due time it fired for.
        due_ms: u64,
        /// Its next due time (`None`: it does not recur).
        next_due_ms: Option<u64>,
    },
    /// Every timer of the session is removed: it ended, and nothing may push into it
    /// (S26a: the final record of a clean end, written in place of S16's delete, which
    /// removed them).
    RemoveAll,
}
