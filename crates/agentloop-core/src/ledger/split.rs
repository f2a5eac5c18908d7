//! What a turn's plan did with the items it was offered (S5), by position in the offer:
//! what the turn consumes, what goes back to the front, what was dropped. The turn's
//! control block carries it from the planning task to the session; the ledger (which
//! knows the entry behind each position) applies it. Plain data.

use crate::header::Payload;

/// One item of a plan's answer: the offered item it is (its position in the offer), its
/// value as the plan returned it, and new bytes when the plan changed it (a persistent
/// session's entry is rewritten).
#[derive(Clone, Debug)]
pub struct Planned<I> {
    /// Its position in the offer.
    pub pos: usize,
    /// Its value as the plan returned it.
    pub item: I,
    /// New bytes for its entry when the plan changed it.
    pub rewritten: Option<Payload>,
}

/// What a plan did with its offer, by position in the offer (S5); the ledger knows
/// which entry each position is.
#[derive(Clone, Debug)]
pub struct PlanSplit<I> {
    /// What the turn consumes, in the plan's order.
    pub consumed: Vec<Planned<I>>,
    /// What goes back to the front, in the plan's order.
    pub remaining: Vec<Planned<I>>,
    /// Dropped by the plan's decision.
    pub dropped: Vec<usize>,
}

impl<I> PlanSplit<I> {
    /// Whether the split changes stored entries (drops or rewrites).
    pub fn changes_entries(&self) -> bool {
        !self.dropped.is_empty()
            || self
                .consumed
                .iter()
                .chain(&self.remaining)
                .any(|p| p.rewritten.is_some())
    }
}
