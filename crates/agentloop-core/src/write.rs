//! A change to one session's stored record (DESIGN S15, S16a, S19): the header, the
//! item entries put or deleted, the state entry, and the condition under which the
//! store applies it. A store applies one write atomically, and all the writes of one
//! group commit together.
//!
//! This module only describes writes; `table.rs` says how they apply.

use crate::header::{Payload, RecordHeader};
use crate::status::StatusKind;

/// A change to one item entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemChange {
    /// Store this entry (an accepted item, or an item a plan rewrote).
    Put(u64, Payload),
    /// Remove this entry (delivered, or dropped by a plan).
    Delete(u64),
}

/// A change to one journal entry of the running or cut turn (S1b): the entry of the
/// step at an occurrence, encoded ([`crate::codec::encode_journal_entry`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalChange {
    /// Store this step's entry (its beginning, or its result).
    Put(u32, Payload),
    /// Remove it (a safe point's state covers it, or the turn ended).
    Delete(u32),
}

/// A change to the cut turn's state entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateChange {
    /// Leave it as it is.
    Keep,
    /// Store this state.
    Put(Payload),
    /// Remove it.
    Delete,
}

/// When a store applies a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteCondition {
    /// Whatever is stored (restores, tools, tests).
    Always,
    /// Unless the stored record is final (`Completed`, `Canceled`, `Failed`): then the
    /// write fails with `StoreError::Final` and nothing changes, so a live session never
    /// overwrites a cancel or a finalizer (S19, S24).
    NotFinal,
    /// Only over a stored record that is `Canceled` or not final (`StoreError::NoRecord`
    /// without one, `StoreError::Final` over `Completed` or `Failed`): a canceled
    /// session writing what it holds at its end (S24).
    CanceledOrLive,
    /// Only over a stored record whose version is this one (`StoreError::Changed`
    /// otherwise, `StoreError::NoRecord` without one): a read-modify-write that must not
    /// lose a concurrent change, such as answering an interrupt (two answers, one
    /// wins).
    AtVersion(u64),
    /// Only where no record is stored (`StoreError::Exists` otherwise): a new session
    /// forked from a checkpoint never overwrites another.
    Absent,
}

impl WriteCondition {
    /// Whether a write under this condition may replace a record of status `current`
    /// (`None`: there is none).
    pub fn allows(&self, current: Option<StatusKind>) -> Result<(), ConditionFailed> {
        use StatusKind::*;
        match (self, current) {
            (WriteCondition::Always, _) => Ok(()),
            (WriteCondition::NotFinal, Some(Completed | Canceled | Failed)) => {
                Err(ConditionFailed::Final)
            }
            (WriteCondition::NotFinal, _) => Ok(()),
            (WriteCondition::CanceledOrLive, None) => Err(ConditionFailed::NoRecord),
            (WriteCondition::CanceledOrLive, Some(Completed | Failed)) => {
                Err(ConditionFailed::Final)
            }
            (WriteCondition::CanceledOrLive, Some(_)) => Ok(()),
            // The version is checked by the table, which reads it.
            (WriteCondition::AtVersion(_), None) => Err(ConditionFailed::NoRecord),
            (WriteCondition::AtVersion(_), Some(_)) => Ok(()),
            (WriteCondition::Absent, None) => Ok(()),
            (WriteCondition::Absent, Some(_)) => Err(ConditionFailed::Exists),
        }
    }
}

/// Why a condition refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionFailed {
    /// The stored record is final.
    Final,
    /// There is no stored record.
    NoRecord,
    /// A record is stored.
    Exists,
}

/// A change to one session's record, applied atomically.
///
/// The store writes `header` as given except `version` (the stored version plus one),
/// after checking `condition` and the fencing token (`header.lease_epoch` must not be
/// below the stored one). With `replace`, every item entry the write does not put is
/// removed, and so is the state unless it is put, every journal entry it does not put,
/// and a format-1 record under the same id: the write is then the whole record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordWrite {
    /// The header to store.
    pub header: RecordHeader,
    /// Item entries to put or delete, applied in order.
    pub items: Vec<ItemChange>,
    /// The state entry.
    pub state: StateChange,
    /// Journal entries to put or delete (S1b), applied in order; the header's
    /// `journal` mark says which turn they belong to.
    pub journal: Vec<JournalChange>,
    /// The write is the whole record.
    pub replace: bool,
    /// When to apply it.
    pub condition: WriteCondition,
    /// Also keep a snapshot of the record this write leaves, as a turn's end (issue 13,
    /// checkpoint history); `None` for every other write.
    pub history: Option<crate::history::HistoryMark>,
    /// Changes to the session's timers (S39), durable with this write: a timer armed
    /// by the turn, or one whose item this write accepts (its removal and the item's
    /// acceptance are one write, so it fires once).
    pub timers: Vec<crate::timers::TimerChange>,
}

impl RecordWrite {
    /// The session written.
    pub fn session_id(&self) -> &str {
        &self.header.session_id
    }

    /// Bytes of payload the write carries (for counters).
    pub fn payload_bytes(&self) -> usize {
        let items: usize = self
            .items
            .iter()
            .map(|c| match c {
                ItemChange::Put(_, b) => b.len(),
                ItemChange::Delete(_) => 0,
            })
            .sum();
        let state = match &self.state {
            StateChange::Put(b) => b.len(),
            _ => 0,
        };
        let journal: usize = self
            .journal
            .iter()
            .map(|c| match c {
                JournalChange::Put(_, b) => b.len(),
                JournalChange::Delete(_) => 0,
            })
            .sum();
        items + state + journal
    }
}
