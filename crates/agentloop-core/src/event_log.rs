//! Events that outlive the process (DESIGN S20a, issue 33), as plain decisions: how a
//! session numbers its events so that no number is ever given to two events, also
//! after a SIGKILL; which stored events a retention keeps; and what a subscriber that
//! asks for the events after `n` gets from the store. Nothing here waits or touches a
//! store: the session asks, and writes what the answers say (issue 33's later steps
//! wire it).
//!
//! **Numbering.** The header keeps a *reserved mark*: every number up to it may have
//! been handed to a live subscriber. A session gives numbers only below its mark; when
//! it runs out it reserves the next block ([`Numbering::take`] answers the new mark to
//! write, and the number may be handed out only once that write is durable). A new
//! incarnation (after a restart, a crash, a move) starts after the stored mark, so a
//! number some client saw before a SIGKILL is never given again; numbers between the
//! last event written and the mark were never written, and a subscriber that asks for
//! them is told how many it missed.

use serde::{Deserialize, Serialize};

/// How many numbers a session reserves at a time by default.
pub const DEFAULT_RESERVE: u64 = 1024;

/// A session's event numbering: the last number given and the reserved mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numbering {
    last: u64,
    mark: u64,
    block: u64,
}

/// What numbering the next event needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextNumber {
    /// Give this number now.
    Ready(u64),
    /// Write this new reserved mark first; the number is given once it is durable
    /// ([`Numbering::reserved`]).
    Reserve {
        /// The mark to write.
        mark: u64,
    },
}

impl Numbering {
    /// A new incarnation over a stored `mark` (0 for a new session): it numbers after
    /// the mark, in blocks of `block` (at least 1).
    pub fn after(mark: u64, block: u64) -> Self {
        Numbering {
            last: mark,
            mark,
            block: block.max(1),
        }
    }

    /// The last number given.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The reserved mark: every number given is at most it.
    pub fn mark(&self) -> u64 {
        self.mark
    }

    /// The next event's number, or the mark to reserve first.
    pub fn take(&mut self) -> NextNumber {
        if self.last < self.mark {
            self.last += 1;
            NextNumber::Ready(self.last)
        } else {
            NextNumber::Reserve {
                mark: self.mark.saturating_add(self.block),
            }
        }
    }

    /// The reservation of `mark` is durable: numbers up to it may be given.
    pub fn reserved(&mut self, mark: u64) {
        self.mark = self.mark.max(mark);
    }
}

/// One stored event's place: its number and when it was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// The event's number.
    pub seq: u64,
    /// When it was written, ms since the Unix epoch.
    pub at_ms: u64,
}

/// How long stored events are kept (S20a: a count and an age).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Keep at most this many (the newest).
    pub count: u64,
    /// Keep none older than this, in ms (`None`: no age limit).
    pub max_age_ms: Option<u64>,
}

impl Retention {
    /// The numbers of the stored events `events` (ascending by number) to delete at
    /// `now_ms`: beyond the count, from the oldest, and every one past the age.
    pub fn trim(&self, events: &[StoredEvent], now_ms: u64) -> Vec<u64> {
        let over = events.len().saturating_sub(self.count as usize);
        events
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                *i < over
                    || self
                        .max_age_ms
                        .is_some_and(|age| now_ms.saturating_sub(e.at_ms) > age)
            })
            .map(|(_, e)| e.seq)
            .collect()
    }
}

impl Default for Retention {
    /// 10 000 events, a day.
    fn default() -> Self {
        Retention {
            count: 10_000,
            max_age_ms: Some(24 * 3600 * 1000),
        }
    }
}

/// What a subscriber that asks for the events after `after` gets from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Events missed: numbered after `after`, never written or no longer kept (the
    /// stream starts with `Lagged { missed }` when it is not 0).
    pub missed: u64,
    /// The stored numbers to send, ascending.
    pub send: Vec<u64>,
}

/// The replay for a subscriber after `after`, given the stored numbers (ascending) and
/// the last number given (`last`): every number in `(after, last]` is sent when stored
/// and counted as missed when not, so a stream is never silently short.
pub fn replay(after: u64, stored: &[u64], last: u64) -> Replay {
    let send: Vec<u64> = stored
        .iter()
        .copied()
        .filter(|s| *s > after && *s <= last)
        .collect();
    let wanted = last.saturating_sub(after);
    Replay {
        missed: wanted - send.len() as u64,
        send,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn numbers_reserve_in_blocks_and_wait_for_the_reservation() {
        let mut n = Numbering::after(0, 3);
        assert_eq!(n.take(), NextNumber::Reserve { mark: 3 });
        assert_eq!(
            n.take(),
            NextNumber::Reserve { mark: 3 },
            "not before it is durable"
        );
        n.reserved(3);
        assert_eq!(
            (n.take(), n.take(), n.take()),
            (
                NextNumber::Ready(1),
                NextNumber::Ready(2),
                NextNumber::Ready(3)
            )
        );
        assert_eq!(n.take(), NextNumber::Reserve { mark: 6 });
        // A restart after the stored mark.
        let mut again = Numbering::after(3, 3);
        assert_eq!(again.take(), NextNumber::Reserve { mark: 6 });
        again.reserved(6);
        assert_eq!(again.take(), NextNumber::Ready(4));
    }

    #[test]
    fn retention_trims_by_count_then_age() {
        let ev = |seq, at_ms| StoredEvent { seq, at_ms };
        let stored = [ev(1, 10), ev(2, 20), ev(3, 30), ev(4, 40)];
        let r = Retention {
            count: 3,
            max_age_ms: Some(15),
        };
        assert_eq!(
            r.trim(&stored, 50),
            vec![1, 2, 3],
            "1 over the count, 2 and 3 too old"
        );
        let r = Retention {
            count: 10,
            max_age_ms: None,
        };
        assert!(r.trim(&stored, u64::MAX).is_empty());
    }

    #[test]
    fn a_replay_counts_what_it_cannot_send() {
        assert_eq!(
            replay(2, &[1, 3, 5, 6], 7),
            Replay {
                missed: 2,
                send: vec![3, 5, 6]
            },
            "4 and 7 were never written or not kept"
        );
        assert_eq!(
            replay(9, &[1, 2], 7),
            Replay {
                missed: 0,
                send: vec![]
            }
        );
    }

    proptest! {
        /// S20a: incarnations killed at random moments, each starting after the mark
        /// its predecessor made durable, never give one number twice; a number handed
        /// out is always at most a durable mark.
        #[test]
        fn numbers_are_never_given_twice_across_kills(
            runs in prop::collection::vec((1usize..40, 0usize..3), 1..12),
            block in 1u64..8,
        ) {
            let mut durable_mark = 0u64;
            let mut given: BTreeMap<u64, usize> = BTreeMap::new();
            for (run, (events, pending_at_kill)) in runs.into_iter().enumerate() {
                let mut n = Numbering::after(durable_mark, block);
                let mut left = events;
                while left > 0 {
                    match n.take() {
                        NextNumber::Ready(s) => {
                            prop_assert!(s <= durable_mark, "{} given above the durable mark {}", s, durable_mark);
                            prop_assert!(given.insert(s, run).is_none(), "{} given twice", s);
                            left -= 1;
                        }
                        NextNumber::Reserve { mark } => {
                            // The kill may come before the reservation is durable.
                            if left <= pending_at_kill {
                                break;
                            }
                            durable_mark = mark;
                            n.reserved(mark);
                        }
                    }
                }
            }
        }
    }
}
