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
//! `purge` (an explicit delete) removes it. This module only lays out and reads
//! snapshots; what a session keeps is its configuration's business.

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::record::{Payload, StoredRecord};
use crate::store_error::StoreError;
use crate::table::kv::Table;

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

/// A snapshot as stored: self-describing, like the header.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    at_ms: u64,
    #[serde(with = "serde_bytes")]
    header: Vec<u8>,
    items: Vec<(u64, serde_bytes::ByteBuf)>,
    state: Option<serde_bytes::ByteBuf>,
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

fn corrupt(id: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        session: id.to_string(),
        reason,
    }
}

/// After a write of `id` applied to `t`: stores `r`, the record as it now stands, as
/// the snapshot of `mark.turn`, then keeps only the newest `mark.keep` snapshots.
pub(crate) fn record(
    t: &mut impl Table,
    id: &str,
    mark: HistoryMark,
    at_ms: u64,
    r: StoredRecord,
) -> Result<(), StoreError> {
    let snap = Snapshot {
        at_ms,
        header: codec::encode_header(&r.header)?,
        items: r
            .items
            .into_iter()
            .map(|(seq, v)| (seq, serde_bytes::ByteBuf::from(v.to_vec())))
            .collect(),
        state: r.state.map(|s| serde_bytes::ByteBuf::from(s.to_vec())),
    };
    let bytes = rmp_serde::to_vec_named(&snap).map_err(|e| StoreError::Encode {
        session: id.to_string(),
        reason: format!("checkpoint history: {e}"),
    })?;
    t.put(history_key(id, mark.turn), Payload::from(bytes));
    let keys = t.keys_with_prefix(&history_prefix(id))?;
    let keep = mark.keep.clamp(1, MAX_HISTORY);
    let excess = keys.len().saturating_sub(keep);
    if excess > 0 {
        for k in keys.into_iter().take(excess) {
            t.remove(k);
        }
    }
    Ok(())
}

fn decode(id: &str, bytes: &[u8]) -> Result<Snapshot, StoreError> {
    rmp_serde::from_slice(bytes).map_err(|e| corrupt(id, format!("checkpoint history: {e}")))
}

/// Answers `query` over `t`.
pub fn read(t: &impl Table, id: &str, query: HistoryQuery) -> Result<HistoryAnswer, StoreError> {
    let prefix = history_prefix(id);
    match query {
        HistoryQuery::List => {
            let mut out = Vec::new();
            for (k, v) in t.entries_with_prefix(&prefix)? {
                let Some(turn) = turn_of(&k, prefix.len()) else {
                    continue;
                };
                let snap = decode(id, &v)?;
                let size = snap.header.len()
                    + snap.items.iter().map(|(_, b)| b.len()).sum::<usize>()
                    + snap.state.as_ref().map_or(0, |s| s.len());
                out.push(HistoryEntry {
                    turn,
                    at_ms: snap.at_ms,
                    size,
                });
            }
            Ok(HistoryAnswer::List(out))
        }
        HistoryQuery::Load(turn) => {
            let Some(v) = t.get(&history_key(id, turn))? else {
                return Ok(HistoryAnswer::Load(None));
            };
            let snap = decode(id, &v)?;
            let header = codec::decode_header(id, &snap.header)?;
            Ok(HistoryAnswer::Load(Some(Box::new(StoredRecord {
                header,
                items: snap
                    .items
                    .into_iter()
                    .map(|(s, b)| (s, Payload::from(b.into_vec())))
                    .collect(),
                state: snap.state.map(|s| Payload::from(s.into_vec())),
                // A turn's end drops its journal: a snapshot never holds one.
                journal: Vec::new(),
            }))))
        }
    }
}

/// Removes every snapshot of `id`; how many there were.
pub(crate) fn purge(t: &mut impl Table, id: &str) -> Result<usize, StoreError> {
    let keys = t.keys_with_prefix(&history_prefix(id))?;
    let n = keys.len();
    for k in keys {
        t.remove(k);
    }
    Ok(n)
}
