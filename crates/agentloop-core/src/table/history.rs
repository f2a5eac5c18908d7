//! The checkpoint history over a table (S20): recording a snapshot of the record after
//! a write (keeping the newest `keep`), answering a query, purging. The keys and the
//! answers' shapes are `crate::history`'s; this is the part that reads and writes a
//! [`Table`].

use serde::{Deserialize, Serialize};

use super::kv::Table;
use crate::codec;
use crate::history::{
    history_key, history_prefix, turn_of, HistoryAnswer, HistoryEntry, HistoryMark, HistoryQuery,
    MAX_HISTORY,
};
use crate::record::{Payload, StoredRecord};
use crate::store_error::StoreError;

/// A snapshot as stored: self-describing, like the header.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    at_ms: u64,
    #[serde(with = "serde_bytes")]
    header: Vec<u8>,
    items: Vec<(u64, serde_bytes::ByteBuf)>,
    state: Option<serde_bytes::ByteBuf>,
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
