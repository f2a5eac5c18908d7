//! The session's event numbers (S20): every event gets the next number of one sequence,
//! given and queued under one lock, continuing across restarts and resumes. A counter
//! and the count of numbers owed to events still being queued; nothing else.

use std::sync::atomic::{AtomicU64, Ordering};

/// The numbers a session gave and still owes, shared by its subscriber registry and the
/// session core (which records [`EventSeq::mark`] in every write).
///
/// A turn whose `TurnEnded` waits for its write has already reported its end, so the
/// session may exit (and write its final record) before that event is numbered; the
/// turn *owes* those numbers meanwhile ([`EventSeq::owe`]). The record keeps the last
/// number given plus the owed ones, so the next incarnation never reuses a number the
/// owed events take, and `Ended` is numbered after them (issue 28).
///
/// Packed in one atomic (the last number given in the high 48 bits, the numbers owed in
/// the low 16) so that giving an owed number and settling its debt is one step: a
/// writer never reads the mark between the two.
#[derive(Debug, Default)]
pub(crate) struct EventSeq {
    pub(super) state: AtomicU64,
}

/// Bits of [`EventSeq`]'s state that count owed numbers.
pub(super) const OWED_BITS: u32 = 16;
/// The owed count's mask.
pub(super) const OWED_MASK: u64 = (1 << OWED_BITS) - 1;
/// One given number in [`EventSeq`]'s state.
pub(super) const GIVEN: u64 = 1 << OWED_BITS;

impl EventSeq {
    /// The last number given (0 before the first event).
    pub(crate) fn last(&self) -> u64 {
        self.state.load(Ordering::Acquire) >> OWED_BITS
    }

    /// The last number given or owed: what a record keeps, so a later incarnation
    /// starts after every number this one gives before its `Ended`.
    pub(crate) fn mark(&self) -> u64 {
        let s = self.state.load(Ordering::Acquire);
        (s >> OWED_BITS) + (s & OWED_MASK)
    }

    /// Continues a sequence a record left off: the next event gets `last + 2` (one
    /// number is left for the previous incarnation's `Ended`, which followed its last
    /// write). Called before the session emits anything; never moves backwards.
    pub(crate) fn continue_after(&self, last: u64) {
        self.state
            .fetch_max(last.saturating_add(1) << OWED_BITS, Ordering::AcqRel);
    }

    /// Continues after number `n` exactly (a kept event's, or the kept events'
    /// reserved mark, S20a): the next event gets `n + 1` or later. Never moves
    /// backwards.
    pub(crate) fn continue_from(&self, n: u64) {
        self.state.fetch_max(n << OWED_BITS, Ordering::AcqRel);
    }

    pub(super) fn next(&self) -> u64 {
        (self.state.fetch_add(GIVEN, Ordering::AcqRel) >> OWED_BITS) + 1
    }

    /// Promises `n` numbers to events not numbered yet (a turn's final events).
    pub(super) fn owe(&self, n: u64) {
        self.state.fetch_add(n.min(OWED_MASK), Ordering::AcqRel);
    }

    /// Gives the next number to an owed event, settling one owed number.
    pub(super) fn pay(&self) -> u64 {
        (self.state.fetch_add(GIVEN - 1, Ordering::AcqRel) >> OWED_BITS) + 1
    }

    /// Gives up `n` owed numbers whose events were never sent (the turn task was
    /// dropped): they are skipped, as for events nobody receives, so `Ended` still
    /// follows the mark a record kept.
    pub(super) fn forgive(&self, n: u64) {
        self.state.fetch_add(n * (GIVEN - 1), Ordering::AcqRel);
    }
}
