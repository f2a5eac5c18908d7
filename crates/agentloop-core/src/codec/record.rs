//! A stored record's conversions between its shapes (`record.rs`) and its bytes: a
//! record as stored decoded into typed items, a whole record encoded as the write that
//! stores it. It owns no format of its own: items go through [`super::payload`], a
//! format-1 record through [`super::legacy`].

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{legacy, payload};
use crate::header::{Payload, RecordHeader};
use crate::record::{LoadedItem, LoadedRecord, SessionRecord, Stored};
use crate::steps::{JournalEntry, TurnJournal};
use crate::store_error::StoreError;
use crate::write::{ItemChange, JournalChange, RecordWrite, StateChange, WriteCondition};

/// Encodes a journal entry as a record keeps it (S1b).
pub fn encode_journal_entry(session: &str, entry: &JournalEntry) -> Result<Payload, StoreError> {
    payload::encode(entry)
        .map(Payload::from)
        .map_err(|e| StoreError::Encode {
            session: session.to_string(),
            reason: format!("journal entry of step {}: {e}", entry.occurrence),
        })
}

/// Decodes a record's journal entries (stored under their occurrences) with the
/// header's mark; an entry that does not decode, or names another occurrence than its
/// key, is `Corrupt`.
pub fn decode_journal(
    header: &RecordHeader,
    stored: &[(u32, Payload)],
) -> Result<Option<TurnJournal>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        session: header.session_id.clone(),
        reason,
    };
    let Some(mark) = header.journal else {
        if stored.is_empty() {
            return Ok(None);
        }
        return Err(corrupt(format!(
            "{} journal entries are stored but the header names no turn for them",
            stored.len()
        )));
    };
    let mut entries = Vec::with_capacity(stored.len());
    for (occ, bytes) in stored {
        let e: JournalEntry = payload::decode(bytes)
            .map_err(|e| corrupt(format!("journal entry of step {occ}: {e}")))?;
        if e.occurrence != *occ {
            return Err(corrupt(format!(
                "the journal entry stored for step {occ} names step {}",
                e.occurrence
            )));
        }
        entries.push(e);
    }
    Ok(Some(TurnJournal { mark, entries }))
}

impl Stored {
    /// Decodes the items as `I` (keeping their bytes). A format-1 record is converted:
    /// its items are re-encoded in format 2 and numbered interrupted first.
    pub fn decode<I>(&self) -> Result<LoadedRecord<I>, StoreError>
    where
        I: Serialize + DeserializeOwned,
    {
        match self {
            Stored::Current(r) => {
                let id = &r.header.session_id;
                let placement = r.placement()?;
                let mut by_seq: std::collections::HashMap<u64, &Payload> =
                    r.items.iter().map(|(s, b)| (*s, b)).collect();
                let mut take = |seqs: &[u64]| -> Result<Vec<LoadedItem<I>>, StoreError> {
                    seqs.iter()
                        .map(|seq| {
                            let bytes = by_seq.remove(seq).ok_or_else(|| StoreError::Corrupt {
                                session: id.clone(),
                                reason: format!("item entry {seq} is missing"),
                            })?;
                            let item =
                                payload::decode::<I>(bytes).map_err(|e| StoreError::Corrupt {
                                    session: id.clone(),
                                    reason: format!("item entry {seq}: {e}"),
                                })?;
                            Ok(LoadedItem {
                                seq: *seq,
                                item,
                                bytes: bytes.clone(),
                            })
                        })
                        .collect()
                };
                let interrupted = take(&placement.interrupted)?;
                let unhandled = take(&placement.unhandled)?;
                let journal = decode_journal(&r.header, &r.journal)?;
                Ok(LoadedRecord {
                    header: r.header.clone(),
                    interrupted,
                    unhandled,
                    state: r.state.clone(),
                    journal,
                    format1: false,
                })
            }
            Stored::Format1(f) => {
                let rec = legacy::decode_record::<I>(&f.session_id, &f.bytes)?;
                LoadedRecord::from_record(rec, true)
            }
        }
    }
}

impl<I: Serialize + DeserializeOwned> LoadedRecord<I> {
    /// Numbers a whole record's items (interrupted first, then unhandled, in order) and
    /// encodes them, checked: a value that would not read back is refused.
    fn from_record(rec: SessionRecord<I>, format1: bool) -> Result<Self, StoreError> {
        let id = rec.session_id.clone();
        let mut next = 0u64;
        let mut number = |items: Vec<I>| -> Result<Vec<LoadedItem<I>>, StoreError> {
            items
                .into_iter()
                .map(|item| {
                    let bytes = payload::encode_checked(&item).map_err(|e| StoreError::Encode {
                        session: id.clone(),
                        reason: e.to_string(),
                    })?;
                    let seq = next;
                    next += 1;
                    Ok(LoadedItem {
                        seq,
                        item,
                        bytes: bytes.into(),
                    })
                })
                .collect()
        };
        let interrupted = number(rec.interrupted_items)?;
        let unhandled = number(rec.unhandled_items)?;
        let header = RecordHeader {
            session_id: rec.session_id,
            agent_kind: rec.agent_kind,
            agent_config: rec.agent_config,
            status: rec.status,
            turn_index: rec.turn_index,
            cut: interrupted.iter().map(|i| i.seq).collect(),
            front: Vec::new(),
            next_seq: next,
            stop_cause: rec.stop_cause,
            last_error: rec.last_error,
            owner: rec.owner,
            heartbeat_ms: rec.heartbeat_ms,
            created_at_ms: rec.created_at_ms,
            updated_at_ms: rec.updated_at_ms,
            version: rec.version,
            lease_epoch: rec.lease_epoch,
            last_event_seq: rec.last_event_seq,
            interrupt: rec.interrupt,
            awaiting_answer: rec.awaiting_answer,
            answer: rec.answer.map(serde_bytes::ByteBuf::from),
            settings: rec.settings,
            idempotency_keys: Vec::new(),
            journal: rec.journal.as_ref().map(|j| j.mark),
            asleep: false,
            state_carried: rec.state_carried && rec.state.is_some(),
            agent_version: rec.agent_version,
        };
        Ok(LoadedRecord {
            header,
            interrupted,
            unhandled,
            state: rec.state.map(Payload::from),
            journal: rec.journal,
            format1,
        })
    }
}

impl<I: Serialize + DeserializeOwned + Clone> SessionRecord<I> {
    /// The write that stores this record whole (replacing whatever was stored), under
    /// `condition`. Items are encoded and checked: one that would not read back is
    /// refused with `StoreError::Encode`.
    pub fn to_write(&self, condition: WriteCondition) -> Result<RecordWrite, StoreError> {
        let loaded = LoadedRecord::from_record(self.clone(), false)?;
        let mut items = Vec::with_capacity(loaded.item_count());
        for it in loaded.interrupted.iter().chain(&loaded.unhandled) {
            items.push(ItemChange::Put(it.seq, it.bytes.clone()));
        }
        let mut journal = Vec::new();
        for e in loaded.journal.iter().flat_map(|j| &j.entries) {
            let bytes = encode_journal_entry(&loaded.header.session_id, e)?;
            journal.push(JournalChange::Put(e.occurrence, bytes));
        }
        Ok(RecordWrite {
            header: loaded.header,
            items,
            state: match &loaded.state {
                Some(s) => StateChange::Put(s.clone()),
                None => StateChange::Delete,
            },
            journal,
            replace: true,
            condition,
            history: None,
            timers: Vec::new(),
        })
    }
}
