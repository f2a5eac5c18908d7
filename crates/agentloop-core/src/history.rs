//! A session's checkpoint history (issue 13, 4): the last N turn-end checkpoints, kept
//! beside the live record so a user can list them, read one and start a new session
//! from it (LangGraph's state history and fork).
//!
//! A turn-end write that carries a [`HistoryMark`] also stores a snapshot of the record
//! as that write leaves it, in the same atomic write, and drops the oldest snapshots
//! beyond the mark's `keep`. Keys start with `0x01`, which no session id does (ids have
//! no control characters), so the live record's keys, scans and deletes never see them:
//!
//! ```text
//! 0x01 <id> 0x00 <turn: u64 BE>   one snapshot (turn order is key order)
//! ```
//!
//! History outlives S16's delete of the live record at a clean exit; only
//! `purge` (an explicit delete) removes it. This module lays out the keys and the
//! answers' shapes; recording, reading and purging over a table is
//! `crate::table::history`'s; what a session keeps is its configuration's business.

use serde::Serialize;

use crate::record::StoredRecord;
/// The first byte of every history key.
pub const HISTORY_MARK: u8 = 0x01;

/// The most snapshots a session may keep.
pub const MAX_HISTORY: usize = 1_000;

/// Asks a write to keep a snapshot of the record it leaves, as turn `turn`'s end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryMark {
    /// The turn that ended.
    pub turn: u64,
    /// How many snapshots to keep (the newest), at most [`MAX_HISTORY`].
    pub keep: usize,
}

/// One kept checkpoint, as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HistoryEntry {
    /// The turn whose end it is.
    pub turn: u64,
    /// When it was written, ms since the Unix epoch.
    pub at_ms: u64,
    /// Its size in bytes (header, items and state).
    pub size: usize,
}

/// What to read of a session's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryQuery {
    /// List every kept checkpoint, oldest first.
    List,
    /// Read the checkpoint of this turn's end.
    Load(u64),
}

/// The answer to a [`HistoryQuery`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistoryAnswer {
    /// The kept checkpoints, oldest first.
    List(Vec<HistoryEntry>),
    /// The checkpoint, as a record (`None`: no checkpoint of that turn is kept).
    Load(Option<Box<StoredRecord>>),
}

/// The prefix of every history key of `id`.
pub fn history_prefix(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 10);
    k.push(HISTORY_MARK);
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k
}

/// The key of session `id`'s snapshot after `turn`: the session's history prefix and
/// the turn, big-endian, so a prefix scan reads snapshots in turn order.
pub fn history_key(id: &str, turn: u64) -> Vec<u8> {
    let mut k = history_prefix(id);
    k.extend_from_slice(&turn.to_be_bytes());
    k
}

/// The turn a history key names, read after a prefix of `prefix_len` bytes; `None`
/// for a key of another shape.
pub fn turn_of(key: &[u8], prefix_len: usize) -> Option<u64> {
    let b: [u8; 8] = key.get(prefix_len..)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}
