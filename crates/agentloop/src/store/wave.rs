//! A wave of store operations staged over an engine's ordered key-value table (issue
//! 15: shared by the sled and fjall backends, so both apply writes, compare-and-swaps,
//! deletes and reads the same way, through `table.rs`).
//!
//! [`apply`] runs a wave's operations in order over a [`Wave`]: each operation sees the
//! ones before it (reads of the engine merged with what the wave has staged), nothing
//! reaches the engine yet. The backend then commits what the wave staged
//! ([`Staged`]) as one atomic write of its own and makes it durable at its flush. This
//! module owns the operation and result types and the staging; it must not touch an
//! engine: everything it reads goes through [`Base`].
//!
//! Invariant the backends rely on: one wave is applied at a time (the checkpoint
//! actor's pipeline never runs two applies together), so the reads a wave makes and the
//! writes it commits are not interleaved with another writer's. That is what makes the
//! read-check-write of a conditional write or a compare-and-swap atomic without the
//! engine's transactions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use crate::store::record::Payload;
use crate::store::table::{self, Table};
use crate::store::{
    now_ms, CasOutcome, RecordWrite, SessionStatus, StatusKind, StoreError, Stored,
};

/// One operation of a wave, applied in order by [`apply`].
#[derive(Debug)]
pub enum WriteOp {
    /// A change to one session's record.
    Write(Box<RecordWrite>),
    /// Remove a session's record (every entry).
    Delete {
        /// The session id.
        key: String,
    },
    /// Compare-and-swap a record's status.
    Cas {
        /// The session id.
        key: String,
        /// The statuses that allow the swap.
        from: Vec<StatusKind>,
        /// The new status.
        to: SessionStatus,
    },
    /// Renew an instance heartbeat.
    Beat {
        /// The instance id.
        instance: String,
        /// The heartbeat time.
        now_ms: u64,
    },
    /// Remove a session's record and its checkpoint history.
    Purge {
        /// The session id.
        key: String,
    },
    /// Read a record in order with the writes around it.
    Read {
        /// The session id.
        key: String,
    },
    /// Store a session's entries exactly as given (its live record and its history),
    /// only if nothing is stored for it: an import (`store::transfer`).
    Restore {
        /// The session id.
        key: String,
        /// Every entry, by key (keys of this session only).
        entries: Vec<(Vec<u8>, Payload)>,
    },
    /// A durable step's journal change written straight into a record
    /// (`table::append_journal`, S1b).
    Journal {
        /// The session id.
        key: String,
        /// The writer's fencing token.
        epoch: u64,
        /// The turn the change belongs to.
        turn: u64,
        /// The change.
        change: crate::store::JournalChange,
    },
    /// Kept events of a session appended, and trimmed (S20a;
    /// `table::events::append_events`).
    Events {
        /// The session id.
        key: String,
        /// The writer's fencing token.
        epoch: u64,
        /// The events, the reserved mark and the retention.
        append: crate::store::EventAppend,
        /// Whether its answer waits for a flush (a new reserved mark does; events
        /// alone are made durable by the next flush of any write).
        flush: bool,
    },
    /// A session's timer armed or canceled (S39; `table::timers`).
    Timer {
        /// The session id.
        key: String,
        /// What to do.
        change: TimerOp,
    },
    /// Nothing: its answer comes after the wave's flush.
    Flush,
}

/// A timer operation of its own (not riding a record write).
#[derive(Debug)]
pub enum TimerOp {
    /// Arm a timer unless the session holds this many: answered [`OpResult::Armed`]
    /// with its number.
    Arm(crate::store::StoredTimer, usize),
    /// Cancel a timer by number: answered [`OpResult::Deleted`].
    Cancel(u64),
    /// A change a record write would carry, alone (a fire whose item the session
    /// already held): answered [`OpResult::Done`].
    Change(crate::store::TimerChange),
}

impl WriteOp {
    /// Whether the op's answer must wait for the wave's flush.
    pub fn needs_flush(&self) -> bool {
        !matches!(
            self,
            WriteOp::Events { flush: false, .. } | WriteOp::Read { .. }
        )
    }
}

/// The result of one [`WriteOp`].
#[derive(Debug)]
pub enum OpResult {
    /// A write, beat or flush is done.
    Done,
    /// A delete; whether a record existed.
    Deleted(bool),
    /// A compare-and-swap.
    Cas(CasOutcome),
    /// A read; the record, if any (boxed: records are large next to the other results).
    Read(Option<Box<Stored>>),
    /// A timer armed; its number.
    Armed(u64),
}

/// What a wave reads of an engine: its `sessions` table (format-2 entries and history)
/// and its format-1 records. Implemented by each backend over its committed state.
pub trait Base {
    /// A value of the sessions table.
    fn base_get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError>;
    /// Every key of the sessions table that starts with `prefix`, in order.
    fn base_keys(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError>;
    /// Every `(key, value)` of the sessions table that starts with `prefix`, in order.
    fn base_entries(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError>;
    /// A format-1 record's bytes.
    fn base_format1_get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Every `(key, value)` of the sessions table from `from` to `to`, both included, in
    /// order.
    fn base_range(&self, from: &[u8], to: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError>;
    /// The first key of the sessions table at or after `from`, if any (a seek).
    fn base_first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// The first id after `after` (from the start when `None`) with a format-1 record.
    fn base_format1_next_after(&self, after: Option<&str>) -> Result<Option<String>, StoreError>;
}

/// What a wave leaves for its backend to commit atomically.
#[derive(Debug, Default)]
pub struct Staged {
    /// Sessions-table changes (`None`: remove), in key order.
    pub sessions: BTreeMap<Vec<u8>, Option<Payload>>,
    /// Format-1 record changes by session id (`None`: remove).
    pub format1: HashMap<String, Option<Vec<u8>>>,
    /// Heartbeats: `(index of the operation, instance, time)`.
    pub beats: Vec<(usize, String, u64)>,
}

/// The engine's table with a wave's staged changes on top.
pub struct Wave<'a, B: Base> {
    base: &'a B,
    staged: Staged,
}

impl<'a, B: Base> Wave<'a, B> {
    /// A wave with nothing staged: reads see the engine as committed.
    pub fn new(base: &'a B) -> Self {
        Wave {
            base,
            staged: Staged::default(),
        }
    }

    fn staged_prefix<'s>(
        &'s self,
        prefix: &'s [u8],
    ) -> impl Iterator<Item = (&'s Vec<u8>, &'s Option<Payload>)> + 's {
        self.staged
            .sessions
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
    }
}

impl<B: Base> Table for Wave<'_, B> {
    fn get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
        if let Some(v) = self.staged.sessions.get(key) {
            return Ok(v.clone());
        }
        self.base.base_get(key)
    }
    fn put(&mut self, key: Vec<u8>, value: Payload) {
        self.staged.sessions.insert(key, Some(value));
    }
    fn remove(&mut self, key: Vec<u8>) {
        self.staged.sessions.insert(key, None);
    }
    fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        // Keys only: a replacing write scans its session's keys to remove them, and
        // copying their values (the state, items) would be wasted.
        let mut out: BTreeSet<Vec<u8>> = self.base.base_keys(prefix)?.into_iter().collect();
        for (k, v) in self.staged_prefix(prefix) {
            match v {
                Some(_) => out.insert(k.clone()),
                None => out.remove(k),
            };
        }
        Ok(out.into_iter().collect())
    }
    fn entries_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        let mut out: BTreeMap<Vec<u8>, Payload> =
            self.base.base_entries(prefix)?.into_iter().collect();
        for (k, v) in self.staged_prefix(prefix) {
            match v {
                Some(v) => out.insert(k.clone(), v.clone()),
                None => out.remove(k),
            };
        }
        Ok(out.into_iter().collect())
    }
    fn entries_in_range(
        &self,
        from: &[u8],
        to: &[u8],
    ) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        let mut out: BTreeMap<Vec<u8>, Payload> =
            self.base.base_range(from, to)?.into_iter().collect();
        let staged = self
            .staged
            .sessions
            .range::<[u8], _>((Bound::Included(from), Bound::Included(to)));
        for (k, v) in staged {
            match v {
                Some(v) => out.insert(k.clone(), v.clone()),
                None => out.remove(k),
            };
        }
        Ok(out.into_iter().collect())
    }
    fn keys_in_range(&self, from: &[u8], to: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self
            .entries_in_range(from, to)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }
    fn first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        // The engine's first key not removed by the wave, against the wave's first put.
        let mut at = from.to_vec();
        let base = loop {
            match self.base.base_first_key_from(&at)? {
                Some(k) if matches!(self.staged.sessions.get(&k), Some(None)) => {
                    at = k;
                    at.push(0);
                }
                other => break other,
            }
        };
        let staged = self
            .staged
            .sessions
            .range::<[u8], _>((Bound::Included(from), Bound::Unbounded))
            .find(|(_, v)| v.is_some())
            .map(|(k, _)| k.clone());
        Ok(match (base, staged) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }
    fn format1_get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(v) = self.staged.format1.get(id) {
            return Ok(v.clone());
        }
        self.base.base_format1_get(id)
    }
    fn format1_next_after(&self, after: Option<&str>) -> Result<Option<String>, StoreError> {
        let mut at = after.map(str::to_string);
        let base = loop {
            match self.base.base_format1_next_after(at.as_deref())? {
                Some(id) if matches!(self.staged.format1.get(&id), Some(None)) => at = Some(id),
                other => break other,
            }
        };
        let staged = self
            .staged
            .format1
            .iter()
            .filter(|(id, v)| v.is_some() && after.is_none_or(|a| id.as_str() > a))
            .map(|(id, _)| id.clone())
            .min();
        Ok(match (base, staged) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }
    fn format1_put(&mut self, id: &str, bytes: Vec<u8>) {
        self.staged.format1.insert(id.to_string(), Some(bytes));
    }
    fn format1_remove(&mut self, id: &str) {
        self.staged.format1.insert(id.to_string(), None);
    }
}

/// Applies a wave's operations in order over `base` without touching it: the results
/// (one per operation) and what the backend must commit, atomically, for them to hold.
pub fn apply<B: Base>(base: &B, ops: Vec<WriteOp>) -> (Vec<Result<OpResult, StoreError>>, Staged) {
    let mut wave = Wave::new(base);
    let mut results: Vec<Result<OpResult, StoreError>> = Vec::with_capacity(ops.len());
    for op in ops {
        let r = match op {
            WriteOp::Write(w) => table::write(&mut wave, *w).map(|()| OpResult::Done),
            WriteOp::Delete { key } => table::delete(&mut wave, &key).map(OpResult::Deleted),
            WriteOp::Purge { key } => table::purge(&mut wave, &key).map(OpResult::Deleted),
            WriteOp::Cas { key, from, to } => {
                table::cas(&mut wave, &key, &from, to, now_ms()).map(OpResult::Cas)
            }
            WriteOp::Beat { instance, now_ms } => {
                wave.staged.beats.push((results.len(), instance, now_ms));
                Ok(OpResult::Done)
            }
            WriteOp::Read { key } => {
                table::read(&wave, &key).map(|r| OpResult::Read(r.map(Box::new)))
            }
            WriteOp::Restore { key, entries } => {
                table::restore(&mut wave, &key, entries).map(|()| OpResult::Done)
            }
            WriteOp::Journal {
                key,
                epoch,
                turn,
                change,
            } => {
                table::append_journal(&mut wave, &key, epoch, turn, change).map(|()| OpResult::Done)
            }
            WriteOp::Events {
                key, epoch, append, ..
            } => table::events::append_events(&mut wave, &key, epoch, append)
                .map(|()| OpResult::Done),
            WriteOp::Timer { key, change } => match change {
                TimerOp::Arm(timer, max) => {
                    table::timers::arm(&mut wave, &key, timer, max).map(OpResult::Armed)
                }
                TimerOp::Cancel(n) => {
                    table::timers::cancel(&mut wave, &key, n).map(OpResult::Deleted)
                }
                TimerOp::Change(c) => {
                    table::timers::apply(&mut wave, &key, vec![c]).map(|()| OpResult::Done)
                }
            },
            WriteOp::Flush => Ok(OpResult::Done),
        };
        results.push(r);
    }
    (results, wave.staged)
}

/// Marks every change a failed commit did not make: each write, delete and
/// compare-and-swap of the wave reports `e` (reads stand: they saw the wave as staged,
/// and the next read sees what the engine holds).
pub fn fail_changes(results: &mut [Result<OpResult, StoreError>], e: &StoreError) {
    for r in results.iter_mut() {
        if matches!(
            r,
            Ok(OpResult::Done | OpResult::Deleted(_) | OpResult::Cas(_))
        ) {
            *r = Err(e.clone());
        }
    }
}

/// Marks every operation but reads failed by a flush that failed.
pub fn fail_unflushed(results: &mut [Result<OpResult, StoreError>], e: &StoreError) {
    for r in results.iter_mut() {
        if !matches!(r, Ok(OpResult::Read(_))) {
            *r = Err(e.clone());
        }
    }
}

/// An engine's error as a store error: which operation, on which session (empty: none
/// in particular), and the engine's own words.
pub(crate) fn backend_err(
    operation: &'static str,
    session: &str,
    e: impl std::fmt::Display,
) -> StoreError {
    StoreError::Backend {
        operation,
        session: session.to_string(),
        message: e.to_string(),
    }
}
