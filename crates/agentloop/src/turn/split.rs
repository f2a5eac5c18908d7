//! What a turn's plan did with the items it was offered (S5), by position in the offer:
//! what the turn consumes, what goes back to the front, what was dropped. The turn's
//! control block carries it from the planning task to the session; the session's
//! ledger (which knows the entry behind each position) applies it. Plain data: it knows
//! neither the ledger nor the actor.

use crate::store::Payload;

/// One item of a plan's answer: the offered item it is (its position in the offer), its
/// value as the plan returned it, and new bytes when the plan changed it (a persistent
/// session's entry is rewritten).
#[derive(Clone, Debug)]
pub(crate) struct Planned<I> {
    pub(crate) pos: usize,
    pub(crate) item: I,
    pub(crate) rewritten: Option<Payload>,
}

/// What a plan did with its offer, by position in the offer (S5); the ledger knows
/// which entry each position is.
#[derive(Clone, Debug)]
pub(crate) struct PlanSplit<I> {
    /// What the turn consumes, in the plan's order.
    pub(crate) consumed: Vec<Planned<I>>,
    /// What goes back to the front, in the plan's order.
    pub(crate) remaining: Vec<Planned<I>>,
    /// Dropped by the plan's decision.
    pub(crate) dropped: Vec<usize>,
}

impl<I> PlanSplit<I> {
    /// Whether the split changes stored entries (drops or rewrites).
    pub(crate) fn changes_entries(&self) -> bool {
        !self.dropped.is_empty()
            || self
                .consumed
                .iter()
                .chain(&self.remaining)
                .any(|p| p.rewritten.is_some())
    }
}
