//! The ledger: where every accepted item of one session is (DESIGN S5, S6, S8, S10,
//! S15, S17). It is the only code that moves an item.
//!
//! Every accepted item gets an entry number (`Seq`, increasing in push order, kept in
//! the record so numbering continues after a resume) and is, at any moment, in exactly
//! one place:
//!
//! | place | what it is |
//! |---|---|
//! | `preempted` | a preempted turn's items, offered first to the next plan (S8) |
//! | `front` | items handed back (a plan's remaining items, an aborted plan's offer, a record's unhandled items), ahead of later pushes (S5, S6) |
//! | `tail` | pushed since the last offer, in push order |
//! | `cut` | the cut turn: a record's turn to resume (S17), or the turn that ended the session |
//! | the turn's offer | offered to a planning turn |
//! | the turn's split | consumed by the running turn / handed back by its plan |
//!
//! and leaves only by delivery (a completed turn consumed it), a plan's drop, or the
//! session's exit (its items are then in the exit state). Each move returns the
//! changes to the stored item entries it implies (a put when an item is accepted or a
//! plan rewrites it, a delete when it is delivered or dropped); a move between places
//! changes no entry, only the order the header records. So a push costs one entry
//! whatever the backlog. [`Ledger::placement`] gives the full placement (for the
//! record's header, the exit state, a killed session's salvage): the same answer from
//! one place.
//!
//! Invariants (checked by [`Ledger::check`] in tests): every held item is in exactly
//! one place; `tail` ascends and every entry number in it is above every other held
//! one (it holds only items pushed after everything else was offered or placed), so
//! the stored order is `front` (as the header lists it) and then the other entries in
//! number order.
//!
//! It knows nothing of actors, stores or time; it must not decide when a turn runs or
//! when a write happens (that is the session core's job).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::codec::PayloadError;
use crate::header::Payload;
use crate::plan::{Plan, PlanInput};
use crate::record::LoadedRecord;
use crate::write::ItemChange;
mod split;
pub use split::{PlanSplit, Planned};

/// An accepted item's entry number.
pub type Seq = u64;

/// Hashes an entry number as itself: numbers are dense and given by the session (no
/// one can choose them to collide), so SipHash's protection buys nothing here.
#[derive(Default)]
pub struct SeqHasher(u64);

impl Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        // Spread the low bits over the high ones hashbrown uses for its control bytes.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The held items by entry number.
type Held_<I> = HashMap<Seq, Held<I>, BuildHasherDefault<SeqHasher>>;

/// An item the session holds: its value and, when the session persists, the bytes its
/// entry holds.
#[derive(Clone, Debug)]
pub struct Held<I> {
    /// The item.
    pub item: I,
    /// Its entry's bytes (a persistent session's), `None` in memory.
    pub bytes: Option<Payload>,
}

/// What a turn is offered.
pub enum Offer<I> {
    /// Plan over these items; `bytes` (when the session persists) are their stored
    /// bytes, in the input's order (preempted first, then buffered).
    Plan {
        /// What the plan is offered.
        input: PlanInput<I>,
        /// The offered items' stored bytes, in the input's order.
        bytes: Option<Vec<Payload>>,
    },
    /// Resume the cut turn with these items (S17); no plan.
    Resume {
        /// The cut turn's items.
        items: Vec<I>,
    },
}

/// Where the items of the turn that is planning or running are.
#[derive(Clone, Debug)]
struct TurnItems {
    index: u64,
    /// Offered, in offer order (preempted first).
    offered: Vec<Seq>,
    /// How many of `offered` came from `preempted`.
    from_preempted: usize,
    is_resume: bool,
    /// Known once the plan returned (and at once for a resume turn).
    split: Option<Split>,
}

/// What the plan did with the offer.
#[derive(Clone, Debug)]
enum Split {
    /// It kept the offer's order (the default plan, a plan that takes the first N): it
    /// consumed `offered[..consumed]` and handed back the `remaining` after them; the
    /// rest of the offer was dropped. Costs no allocation.
    InOrder { consumed: usize, remaining: usize },
    /// Any other answer, by entry number.
    Listed {
        consumed: Vec<Seq>,
        remaining: Vec<Seq>,
    },
}

impl TurnItems {
    /// (consumed, remaining) once the split is known.
    fn parts(&self) -> Option<(&[Seq], &[Seq])> {
        match self.split.as_ref()? {
            Split::InOrder {
                consumed,
                remaining,
            } => Some((
                &self.offered[..*consumed],
                &self.offered[*consumed..*consumed + *remaining],
            )),
            Split::Listed {
                consumed,
                remaining,
            } => Some((consumed, remaining)),
        }
    }
}

/// The cut turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// Its index.
    pub index: u64,
    /// Its items, in the turn's order.
    pub items: Vec<Seq>,
}

/// Where every held item is, by entry number (see [`Ledger::placement`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The cut turn's items (a record's `interrupted_items`): the cut, or the running
    /// turn's consumed items, or a resume turn's.
    pub interrupted: Vec<Seq>,
    /// Everything else, in the order it would be offered next.
    pub unhandled: Vec<Seq>,
}

/// How a turn ended, as the ledger needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnFate {
    /// It completed: its consumed items are delivered.
    Completed,
    /// It was preempted (S8): its items go first to the next plan.
    Preempted,
    /// It was cut (canceled, interrupted, failed): its items are the cut turn.
    Cut,
}

/// The ledger of one session.
pub struct Ledger<I> {
    /// Entries are stored: moves report entry changes, items keep their bytes.
    persist: bool,
    held: Held_<I>,
    /// The stored bytes of the held items (0 for items without bytes): what a push's
    /// buffer bound counts (S34a).
    held_bytes: usize,
    next_seq: Seq,
    preempted: Vec<Seq>,
    front: VecDeque<Seq>,
    tail: VecDeque<Seq>,
    cut: Option<Cut>,
    turn: Option<Box<TurnItems>>,
    /// The last turn's box, kept for the next (a turn allocates nothing it can reuse).
    spare: Option<Box<TurnItems>>,
    /// The header's `front` list, cached until a move other than a push changes it.
    order_cache: Option<Vec<Seq>>,
}

impl<I: Clone> Ledger<I> {
    /// An empty ledger.
    pub fn new(persist: bool) -> Self {
        Ledger {
            persist,
            held: Held_::default(),
            held_bytes: 0,
            next_seq: 0,
            preempted: Vec::new(),
            front: VecDeque::new(),
            tail: VecDeque::new(),
            cut: None,
            turn: None,
            spare: None,
            order_cache: None,
        }
    }

    /// Takes a loaded record's items (S17): its cut turn (if any) and its unhandled
    /// items, in order, with their entry numbers and bytes; numbering continues above
    /// the record's. Call on an empty ledger. Returns the cut turn's index if there is
    /// one.
    pub fn seed(&mut self, record: &mut LoadedRecord<I>) -> Option<u64> {
        let mut top = record.header.next_seq;
        let held_bytes = &mut self.held_bytes;
        let mut take = |it: crate::record::LoadedItem<I>, held: &mut Held_<I>| {
            top = top.max(it.seq + 1);
            let seq = it.seq;
            *held_bytes += it.bytes.len();
            held.insert(
                seq,
                Held {
                    item: it.item,
                    bytes: Some(it.bytes),
                },
            );
            seq
        };
        let cut: Vec<Seq> = std::mem::take(&mut record.interrupted)
            .into_iter()
            .map(|it| take(it, &mut self.held))
            .collect();
        for it in std::mem::take(&mut record.unhandled) {
            let seq = take(it, &mut self.held);
            self.front.push_back(seq);
        }
        self.next_seq = top;
        self.order_cache = None;
        if cut.is_empty() && record.state.is_none() {
            return None;
        }
        self.cut = Some(Cut {
            index: record.header.turn_index,
            items: cut,
        });
        Some(record.header.turn_index)
    }

    /// Accepts a pushed item: it joins the tail. Returns its entry number and the entry
    /// to put.
    pub fn accept(&mut self, item: I, bytes: Option<Payload>) -> (Seq, Vec<ItemChange>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let change = match (&bytes, self.persist) {
            (Some(b), true) => vec![ItemChange::Put(seq, b.clone())],
            _ => Vec::new(),
        };
        self.held_bytes += bytes.as_ref().map_or(0, |b| b.len());
        self.held.insert(seq, Held { item, bytes });
        self.tail.push_back(seq);
        (seq, change)
    }

    /// The next entry number (recorded in the header).
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }

    /// Whether an item waits for a turn (or a cut turn waits to resume).
    pub fn has_work(&self) -> bool {
        self.cut.is_some()
            || !self.preempted.is_empty()
            || !self.front.is_empty()
            || !self.tail.is_empty()
    }

    /// Whether nothing is held at all.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty() && self.cut.is_none() && self.turn.is_none()
    }

    /// What the session holds, in a turn or waiting for one: (items, stored bytes).
    pub fn held(&self) -> (usize, usize) {
        (self.held.len(), self.held_bytes)
    }

    /// How many items wait outside a turn: (buffered, preempted).
    pub fn waiting(&self) -> (usize, usize) {
        (self.front.len() + self.tail.len(), self.preempted.len())
    }

    /// The cut turn, if any.
    pub fn cut(&self) -> Option<&Cut> {
        self.cut.as_ref()
    }

    /// Offers everything waiting to turn `index`: the cut turn (a resume, no plan), or
    /// the preempted items then the buffer (S5, S8). Moves them into the turn.
    pub fn offer(&mut self, index: u64) -> Offer<I> {
        self.order_cache = None;
        let mut turn = self.spare.take().unwrap_or_else(|| {
            Box::new(TurnItems {
                index,
                offered: Vec::new(),
                from_preempted: 0,
                is_resume: false,
                split: None,
            })
        });
        turn.index = index;
        turn.offered.clear();
        if let Some(cut) = self.cut.take() {
            let items = cut.items.iter().map(|s| self.value(*s)).collect();
            turn.split = Some(Split::InOrder {
                consumed: cut.items.len(),
                remaining: 0,
            });
            turn.offered = cut.items;
            turn.from_preempted = 0;
            turn.is_resume = true;
            self.turn = Some(turn);
            return Offer::Resume { items };
        }
        turn.offered.append(&mut self.preempted);
        let from_preempted = turn.offered.len();
        turn.offered.extend(self.front.drain(..));
        turn.offered.extend(self.tail.drain(..));
        let seqs = &turn.offered;
        let input = PlanInput {
            turn_index: index,
            preempted: seqs[..from_preempted]
                .iter()
                .map(|s| self.value(*s))
                .collect(),
            buffered: seqs[from_preempted..]
                .iter()
                .map(|s| self.value(*s))
                .collect(),
        };
        let bytes = self.persist.then(|| {
            seqs.iter()
                .filter_map(|s| self.held.get(s).and_then(|h| h.bytes.clone()))
                .collect()
        });
        turn.from_preempted = from_preempted;
        turn.is_resume = false;
        turn.split = None;
        self.turn = Some(turn);
        Offer::Plan { input, bytes }
    }

    fn value(&self, seq: Seq) -> I {
        // Invariant: every seq in a place is held (see `check`).
        self.held[&seq].item.clone()
    }

    /// The running turn's plan answered (S5): consumed and remaining items take the
    /// values the plan returned; dropped items leave (their entries are deleted);
    /// rewritten items' entries are put again. No-op when the split is already known
    /// (a resume turn, or applied before).
    pub fn decide(&mut self, split: PlanSplit<I>) -> (u64, Vec<ItemChange>) {
        let Some(turn) = self.turn.as_mut().filter(|t| t.split.is_none()) else {
            return (0, Vec::new());
        };
        self.order_cache = None;
        let mut changes = Vec::new();
        // Kept order: consumed at positions 0.., remaining right after them.
        let in_order = split.consumed.iter().enumerate().all(|(i, p)| p.pos == i)
            && split
                .remaining
                .iter()
                .enumerate()
                .all(|(i, p)| p.pos == split.consumed.len() + i);
        let (n_consumed, n_remaining) = (split.consumed.len(), split.remaining.len());
        let offered = &turn.offered;
        let held_bytes = &mut self.held_bytes;
        let mut place = |p: Planned<I>, held: &mut Held_<I>| {
            let seq = offered[p.pos];
            let entry = held.entry(seq).or_insert(Held {
                item: p.item.clone(),
                bytes: None,
            });
            entry.item = p.item;
            if let Some(b) = p.rewritten {
                if self.persist {
                    changes.push(ItemChange::Put(seq, b.clone()));
                }
                *held_bytes += b.len();
                *held_bytes -= entry.bytes.as_ref().map_or(0, |old| old.len());
                entry.bytes = Some(b);
            }
            seq
        };
        let listed = if in_order {
            for p in split.consumed.into_iter().chain(split.remaining) {
                place(p, &mut self.held);
            }
            None
        } else {
            let consumed: Vec<Seq> = split
                .consumed
                .into_iter()
                .map(|p| place(p, &mut self.held))
                .collect();
            let remaining: Vec<Seq> = split
                .remaining
                .into_iter()
                .map(|p| place(p, &mut self.held))
                .collect();
            Some((consumed, remaining))
        };
        let dropped = split.dropped.len() as u64;
        for seq in split.dropped.into_iter().map(|pos| offered[pos]) {
            if let Some(h) = self.held.remove(&seq) {
                self.held_bytes -= h.bytes.map_or(0, |b| b.len());
            }
            if self.persist {
                changes.push(ItemChange::Delete(seq));
            }
        }
        turn.split = Some(match listed {
            None => Split::InOrder {
                consumed: n_consumed,
                remaining: n_remaining,
            },
            Some((consumed, remaining)) => Split::Listed {
                consumed,
                remaining,
            },
        });
        (dropped, changes)
    }

    /// The turn ended after its plan (S5, S8, S10): delivered, preempted, or cut; its
    /// remaining items go back to the front. Returns how many items were delivered and
    /// the entries to delete (the delivered ones). The split must be known.
    pub fn end_turn(&mut self, fate: TurnFate) -> (u64, Vec<ItemChange>) {
        let Some(mut turn) = self.turn.take() else {
            return (0, Vec::new());
        };
        self.order_cache = None;
        let (consumed, remaining) = turn.parts().unwrap_or((&[], &turn.offered[..]));
        for seq in remaining.iter().rev() {
            self.front.push_front(*seq);
        }
        let result = match fate {
            TurnFate::Completed => {
                let mut changes = Vec::new();
                for seq in consumed {
                    if let Some(h) = self.held.remove(seq) {
                        self.held_bytes -= h.bytes.map_or(0, |b| b.len());
                    }
                    if self.persist {
                        changes.push(ItemChange::Delete(*seq));
                    }
                }
                (consumed.len() as u64, changes)
            }
            TurnFate::Preempted => {
                self.preempted = consumed.to_vec();
                (0, Vec::new())
            }
            TurnFate::Cut => {
                self.cut = Some(Cut {
                    index: turn.index,
                    items: consumed.to_vec(),
                });
                (0, Vec::new())
            }
        };
        turn.split = None;
        self.spare = Some(turn);
        result
    }

    /// The planning turn did not run (S6): a plan that failed, a stop that aborted it,
    /// or a plan that consumed nothing. Without a split, every offered item goes back
    /// in its original order (preempted ones to `preempted`); a resume turn's items are
    /// the cut turn again. With a split (the plan consumed nothing), the remaining
    /// items go back to the front.
    pub fn turn_not_run(&mut self) {
        let Some(turn) = self.turn.take() else {
            return;
        };
        self.order_cache = None;
        if turn.is_resume {
            self.cut = Some(Cut {
                index: turn.index,
                items: turn.offered,
            });
            return;
        }
        let mut turn = turn;
        match turn.parts() {
            Some((consumed, remaining)) => {
                for seq in consumed.iter().chain(remaining).rev() {
                    self.front.push_front(*seq);
                }
            }
            None => {
                let (pre, rest) = turn.offered.split_at(turn.from_preempted);
                self.preempted = pre.to_vec();
                for seq in rest.iter().rev() {
                    self.front.push_front(*seq);
                }
            }
        }
        turn.split = None;
        self.spare = Some(turn);
    }

    /// Whether items were pushed since the current turn was offered its items.
    pub fn pushed_during_turn(&self) -> bool {
        !self.tail.is_empty()
    }

    /// Whether the turn's split is known.
    pub fn split_known(&self) -> bool {
        self.turn.as_ref().is_some_and(|t| t.split.is_some())
    }

    /// The running turn's consumed items (a copy, for push strategies, S9).
    pub fn consumed_values(&self) -> Option<Vec<I>> {
        let (consumed, _) = self.turn.as_ref()?.parts()?;
        Some(consumed.iter().map(|s| self.value(*s)).collect())
    }

    /// Where every held item is now (see the module docs): the cut turn's items
    /// (`interrupted`) and the rest in the order they would be offered next.
    pub fn placement(&self) -> Placement {
        let mut p = Placement::default();
        match &self.turn {
            None => {
                if let Some(cut) = &self.cut {
                    p.interrupted = cut.items.clone();
                }
                p.unhandled.extend(&self.preempted);
            }
            Some(t) => match t.parts() {
                None => p.unhandled.extend(&t.offered),
                Some((consumed, remaining)) => {
                    p.interrupted = consumed.to_vec();
                    p.unhandled.extend(remaining);
                }
            },
        }
        p.unhandled.extend(&self.front);
        p.unhandled.extend(&self.tail);
        p
    }

    /// The cut turn's items as a record lists them (`interrupted`): O(turn), not
    /// O(backlog), so a push's header costs the same whatever waits.
    pub fn interrupted(&self) -> Vec<Seq> {
        match &self.turn {
            None => self
                .cut
                .as_ref()
                .map(|c| c.items.clone())
                .unwrap_or_default(),
            Some(t) => t.parts().map(|(c, _)| c.to_vec()).unwrap_or_default(),
        }
    }

    /// The header's `front` list: the shortest prefix of the unhandled order after
    /// which the rest ascends (so "front, then the other entries in number order" is
    /// the order). Cached across pushes, which never change it (a push appends the
    /// highest number to `tail`).
    pub fn header_front(&mut self) -> Vec<Seq> {
        if let Some(c) = &self.order_cache {
            return c.clone();
        }
        let mut head = self.placement().unhandled;
        head.truncate(head.len() - self.tail.len());
        let mut k = head.len();
        while k > 0 && (k == head.len() || head[k - 1] < head[k]) {
            k -= 1;
        }
        if let (Some(last), Some(first_tail)) = (head.last(), self.tail.front()) {
            // Unreachable by the tail invariant; kept exact anyway.
            if last > first_tail {
                k = head.len();
            }
        }
        head.truncate(k);
        self.order_cache = Some(head.clone());
        head
    }

    /// The values of `seqs`, in order.
    pub fn values(&self, seqs: &[Seq]) -> Vec<I> {
        seqs.iter().map(|s| self.value(*s)).collect()
    }

    /// Every held item's entry (a write that replaces the whole record).
    pub fn all_entries(&self) -> Vec<ItemChange> {
        let mut seqs: Vec<&Seq> = self.held.keys().collect();
        seqs.sort_unstable();
        seqs.into_iter()
            .filter_map(|s| {
                self.held[s]
                    .bytes
                    .as_ref()
                    .map(|b| ItemChange::Put(*s, b.clone()))
            })
            .collect()
    }

    /// The invariants of the module docs; `Err` says which broke. For tests and
    /// debugging: it walks every held item.
    pub fn check(&self) -> Result<(), String> {
        let p = self.placement();
        if self.interrupted() != p.interrupted {
            return Err(format!(
                "interrupted() {:?} differs from the placement's {:?}",
                self.interrupted(),
                p.interrupted
            ));
        }
        let mut seen: Vec<Seq> = p.interrupted.iter().chain(&p.unhandled).copied().collect();
        if let Some(cut) = self.cut.as_ref().filter(|_| self.turn.is_some()) {
            seen.extend(&cut.items);
        }
        let n = seen.len();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != n {
            return Err(format!("an item is in two places: {p:?}"));
        }
        let mut held: Vec<Seq> = self.held.keys().copied().collect();
        held.sort_unstable();
        if held != seen {
            return Err(format!("held {held:?} but placed {seen:?}"));
        }
        if !self
            .tail
            .iter()
            .zip(self.tail.iter().skip(1))
            .all(|(a, b)| a < b)
        {
            return Err(format!("tail does not ascend: {:?}", self.tail));
        }
        if let Some(first) = self.tail.front() {
            let tail: std::collections::HashSet<&Seq> = self.tail.iter().collect();
            if held.iter().any(|s| !tail.contains(s) && s > first) {
                return Err(format!(
                    "a placed item is newer than the tail's first ({first})"
                ));
            }
        }
        let bytes: usize = self
            .held
            .values()
            .map(|h| h.bytes.as_ref().map_or(0, |b| b.len()))
            .sum();
        if bytes != self.held_bytes {
            return Err(format!(
                "held bytes counted {} but the held items have {bytes}",
                self.held_bytes
            ));
        }
        if self.persist && self.held.values().any(|h| h.bytes.is_none()) {
            return Err("a persistent session holds an item without bytes".into());
        }
        Ok(())
    }
}

/// Matches a plan's answer to the items it was offered (S5; the turn task calls this
/// when the plan returns, off the actor), by position in the offer.
///
/// When the session persists, values are identified by their bytes (`bytes`, the
/// offered items' stored bytes, in offer order): each returned value is encoded
/// (checked: a value that would not read back fails the plan) and takes an offered
/// position with the same bytes; a value that matches none was changed by the plan and
/// takes an unmatched position (in offer order), whose entry it rewrites; positions left
/// over were dropped. Without a store, positions are only places: returned values take
/// them in order. Fails when the plan returns more items than it was offered.
pub fn split_plan<I>(
    offered: usize,
    bytes: Option<&[Payload]>,
    plan: Plan<I>,
    encode: impl Fn(&I) -> Result<Vec<u8>, PayloadError>,
) -> Result<PlanSplit<I>, String> {
    let returned = plan.consumed.len() + plan.remaining.len();
    if returned > offered {
        return Err(format!(
            "plan returned {returned} items but was offered {offered}; a plan may only \
             consume, hand back or drop offered items"
        ));
    }
    let Some(bytes) = bytes else {
        let n = plan.consumed.len();
        let place = |(i, item)| Planned {
            pos: i,
            item,
            rewritten: None,
        };
        let consumed = plan.consumed.into_iter().enumerate().map(place).collect();
        let remaining = plan
            .remaining
            .into_iter()
            .enumerate()
            .map(|(i, item)| place((n + i, item)))
            .collect();
        return Ok(PlanSplit {
            consumed,
            remaining,
            dropped: (returned..offered).collect(),
        });
    };
    let mut by_bytes: HashMap<&[u8], VecDeque<usize>> = HashMap::new();
    for (i, b) in bytes.iter().enumerate() {
        by_bytes.entry(b.as_ref()).or_default().push_back(i);
    }
    let mut taken = vec![false; offered];
    let n_consumed = plan.consumed.len();
    let mut changed: Vec<(usize, I, Vec<u8>)> = Vec::new();
    let mut slots: Vec<Option<Planned<I>>> = Vec::with_capacity(returned);
    for (slot, item) in plan.consumed.into_iter().chain(plan.remaining).enumerate() {
        let encoded = encode(&item)
            .map_err(|e| format!("the plan returned an item that cannot be stored: {e}"))?;
        match by_bytes
            .get_mut(encoded.as_slice())
            .and_then(|q| q.pop_front())
        {
            Some(i) => {
                taken[i] = true;
                slots.push(Some(Planned {
                    pos: i,
                    item,
                    rewritten: None,
                }));
            }
            None => {
                changed.push((slot, item, encoded));
                slots.push(None);
            }
        }
    }
    // Changed values take the positions left over, in offer order.
    let mut free = (0..offered).filter(|i| !taken[*i]).collect::<VecDeque<_>>();
    for (slot, item, encoded) in changed {
        // There are at least as many offered positions as returned values.
        let Some(i) = free.pop_front() else {
            return Err("the plan's answer could not be matched to its offer".into());
        };
        taken[i] = true;
        slots[slot] = Some(Planned {
            pos: i,
            item,
            rewritten: Some(encoded.into()),
        });
    }
    let mut planned: Vec<Planned<I>> = slots.into_iter().flatten().collect();
    let remaining = planned.split_off(n_consumed);
    Ok(PlanSplit {
        consumed: planned,
        remaining,
        dropped: (0..offered).filter(|i| !taken[*i]).collect(),
    })
}

#[cfg(test)]
mod tests;
