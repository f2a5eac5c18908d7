//! What a plan is offered and what it decides (S5, S8): plain data the agent's `plan`
//! receives and returns, and the session's ledger applies. Owns no decision about
//! when a turn runs.

/// What a plan is offered (S5, S8).
#[derive(Clone, Debug)]
pub struct PlanInput<I> {
    /// The index of the turn being planned.
    pub turn_index: u64,
    /// Items of the previous turn, which was preempted before it could finish them (S8).
    pub preempted: Vec<I>,
    /// Buffered items in push order.
    pub buffered: Vec<I>,
}

impl<I> PlanInput<I> {
    /// The default plan: consume the preempted items, then the buffer.
    pub fn consume_all(self) -> Plan<I> {
        let mut consumed = self.preempted;
        consumed.extend(self.buffered);
        Plan {
            consumed,
            remaining: Vec::new(),
        }
    }

    /// All offered items, preempted first (the original push order).
    pub fn into_items(self) -> Vec<I> {
        let mut all = self.preempted;
        all.extend(self.buffered);
        all
    }

    /// How many items are offered.
    pub fn len(&self) -> usize {
        self.preempted.len() + self.buffered.len()
    }

    /// Whether nothing is offered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A plan's decision (S5).
#[derive(Clone, Debug)]
pub struct Plan<I> {
    /// What this turn consumes.
    pub consumed: Vec<I>,
    /// What goes back to the front of the buffer, ahead of anything pushed later.
    pub remaining: Vec<I>,
}
