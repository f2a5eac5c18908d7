//! Moving sessions between data directories and engines (issue 15): `agentloop sessions
//! export` writes one JSON line per session, `agentloop sessions import` reads them into
//! another directory, on sled or fjall.
//!
//! A line carries everything stored for one session: its header as JSON (the header is
//! self-describing, so every field reads back), its item entries and its state as the
//! MessagePack bytes the session wrote (base64: they are payloads of the user's types,
//! which this module cannot and need not decode), its kept checkpoint history, and any
//! entry of a later format this build does not know (key and value, base64). Import
//! stores them exactly so, in one atomic write per session, and refuses a session the
//! target already holds. A session whose record was deleted at a clean exit but which
//! keeps its history is exported too (`header` is then `null`).
//!
//! This module owns the line format; it reads and writes through [`Backend`] and the
//! table layout, and never touches an engine.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::store::backend::Backend;
use crate::store::history::{self, HISTORY_MARK};
use crate::store::record::{Payload, RecordHeader, Stored, StoredRecord};
use crate::store::table::{self, KeyKind};
use crate::store::wave::{Base, OpResult, WriteOp};
use crate::store::{codec, StoreError};

/// The format tag of an export line.
pub const EXPORT_FORMAT: u32 = 1;

/// One exported session: one JSON line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportLine {
    /// Always [`EXPORT_FORMAT`].
    pub agentloop_export: u32,
    /// The session id.
    pub session_id: String,
    /// The record's header; `None` for a session that keeps only its history.
    pub header: Option<RecordHeader>,
    /// Item entries: number and MessagePack bytes (base64).
    pub items: Vec<ExportItem>,
    /// The cut turn's state, MessagePack bytes (base64).
    pub state: Option<String>,
    /// The cut turn's journal of durable steps (S1b): occurrence and entry bytes
    /// (base64). Absent when empty, so a line without one reads in older builds; an
    /// older build refuses a line with one (it would run the steps again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub journal: Vec<ExportStep>,
    /// Kept checkpoints: turn and snapshot bytes (base64).
    pub history: Vec<ExportSnapshot>,
    /// Entries of a later record format: key and value (base64).
    pub other: Vec<ExportEntry>,
}

/// An item entry of an [`ExportLine`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportItem {
    /// The entry number.
    pub seq: u64,
    /// The item's MessagePack bytes, base64.
    pub msgpack: String,
}

/// A journal entry of an [`ExportLine`] (S1b).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportStep {
    /// The step's occurrence within its turn.
    pub occurrence: u32,
    /// The entry's MessagePack bytes, base64.
    pub msgpack: String,
}

/// A checkpoint of an [`ExportLine`]'s history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSnapshot {
    /// The turn whose end it is.
    pub turn: u64,
    /// The snapshot as stored, base64.
    pub snapshot: String,
}

/// A raw entry of an [`ExportLine`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportEntry {
    /// The key, base64.
    pub key: String,
    /// The value, base64.
    pub value: String,
}

/// A session that cannot be exported, and why.
#[derive(Debug)]
pub struct NotExported {
    /// The session.
    pub session_id: String,
    /// Why (a corrupt record, a record of format 1).
    pub error: StoreError,
}

/// What [`export`] found: the lines, in id order, and the sessions it could not export.
#[derive(Debug, Default)]
pub struct Export {
    /// One line per session.
    pub lines: Vec<ExportLine>,
    /// Sessions left out; an export with any is incomplete.
    pub not_exported: Vec<NotExported>,
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

fn unb64(id: &str, what: &str, text: &str) -> Result<Vec<u8>, StoreError> {
    B64.decode(text).map_err(|e| StoreError::Refused {
        session: id.to_string(),
        status: "import".into(),
        why: format!("{what} is not base64: {e}"),
    })
}

/// Reads every session of `backend` (records and history). Blocks.
pub fn export(backend: &Backend) -> Result<Export, StoreError> {
    let mut out = Export::default();
    let mut ids: Vec<String> = Vec::new();
    for entry in backend.list(None)? {
        match entry.record {
            Ok(Stored::Current(_)) => ids.push(entry.session_id),
            Ok(Stored::Format1(_)) => out.not_exported.push(NotExported {
                error: StoreError::Refused {
                    session: entry.session_id.clone(),
                    status: "format 1".into(),
                    why: "a record of the previous format is exported once it is rewritten: \
                          run `agentloop run` on this directory (it resumes the session, \
                          which rewrites its record), then export again"
                        .into(),
                },
                session_id: entry.session_id,
            }),
            Err(error) => out.not_exported.push(NotExported {
                session_id: entry.session_id,
                error,
            }),
        }
    }
    // Sessions that keep only their history.
    for (k, _) in backend.base_entries(&[HISTORY_MARK])? {
        let Some(zero) = k.iter().skip(1).position(|b| *b == 0) else {
            continue;
        };
        if let Ok(id) = std::str::from_utf8(&k[1..1 + zero]) {
            ids.push(id.to_string());
        }
    }
    ids.sort();
    ids.dedup();
    for id in ids {
        out.lines.push(line(backend, &id)?);
    }
    Ok(out)
}

fn line(backend: &Backend, id: &str) -> Result<ExportLine, StoreError> {
    let mut l = ExportLine {
        agentloop_export: EXPORT_FORMAT,
        session_id: id.to_string(),
        header: None,
        items: Vec::new(),
        state: None,
        journal: Vec::new(),
        history: Vec::new(),
        other: Vec::new(),
    };
    for (k, v) in backend.base_entries(&table::session_prefix(id))? {
        match table::parse_key(&k).map(|(_, kind)| kind) {
            Some(KeyKind::Header) => {
                // Format 3 keeps small records inline in the head: exported as entries.
                let head = codec::head::decode(id, &v)?;
                l.header = Some(head.header);
                for (seq, bytes) in head.items {
                    l.items.push(ExportItem {
                        seq,
                        msgpack: b64(&bytes),
                    });
                }
                if let Some(state) = head.state {
                    l.state = Some(b64(&state));
                }
                for (occurrence, bytes) in head.journal {
                    l.journal.push(ExportStep {
                        occurrence,
                        msgpack: b64(&bytes),
                    });
                }
            }
            Some(KeyKind::Item(seq)) => l.items.push(ExportItem {
                seq,
                msgpack: b64(&v),
            }),
            Some(KeyKind::State) => l.state = Some(b64(&v)),
            Some(KeyKind::Journal(occurrence)) => l.journal.push(ExportStep {
                occurrence,
                msgpack: b64(&v),
            }),
            _ => l.other.push(ExportEntry {
                key: b64(&k),
                value: b64(&v),
            }),
        }
    }
    let prefix = history::history_prefix(id);
    for (k, v) in backend.base_entries(&prefix)? {
        match history::turn_of(&k, prefix.len()) {
            Some(turn) => l.history.push(ExportSnapshot {
                turn,
                snapshot: b64(&v),
            }),
            None => l.other.push(ExportEntry {
                key: b64(&k),
                value: b64(&v),
            }),
        }
    }
    Ok(l)
}

/// A session's entries, by key.
type Entries = Vec<(Vec<u8>, Payload)>;

/// The session and the entries `line` stands for.
fn entries(line: ExportLine) -> Result<(String, Entries), StoreError> {
    let id = line.session_id;
    if line.agentloop_export != EXPORT_FORMAT {
        return Err(StoreError::Refused {
            session: id,
            status: "import".into(),
            why: format!(
                "export format {} is not {EXPORT_FORMAT}: import with the build that exported it",
                line.agentloop_export
            ),
        });
    }
    let mut items = Vec::with_capacity(line.items.len());
    for item in line.items {
        items.push((item.seq, unb64(&id, "an item", &item.msgpack)?.into()));
    }
    items.sort_by_key(|(seq, _)| *seq);
    let state = match line.state {
        Some(state) => Some(unb64(&id, "the state", &state)?.into()),
        None => None,
    };
    let mut journal = Vec::with_capacity(line.journal.len());
    for step in line.journal {
        journal.push((
            step.occurrence,
            unb64(&id, "a journal entry", &step.msgpack)?.into(),
        ));
    }
    journal.sort_by_key(|(occ, _)| *occ);
    let mut out: Entries = Vec::new();
    if let Some(mut header) = line.header {
        if header.session_id != id {
            return Err(StoreError::Refused {
                session: id,
                status: "import".into(),
                why: format!("its header names session `{}`", header.session_id),
            });
        }
        // Kept as exported (the version included): the record reads back the same.
        header.session_id = id.clone();
        out.extend(table::entries_of(StoredRecord {
            header,
            items,
            state,
            journal,
        })?);
    } else {
        // Entries without a header (a leftover): kept as they were, loose.
        out.extend(
            items
                .into_iter()
                .map(|(seq, b)| (table::item_key(&id, seq), b)),
        );
        if let Some(s) = state {
            out.push((table::state_key(&id), s));
        }
        for (occ, b) in journal {
            out.push((table::journal_key(&id, occ), b));
        }
    }
    for snap in line.history {
        let bytes = unb64(&id, "a checkpoint", &snap.snapshot)?;
        out.push((history::history_key(&id, snap.turn), bytes.into()));
    }
    for e in line.other {
        let key = unb64(&id, "an entry's key", &e.key)?;
        out.push((key, unb64(&id, "an entry's value", &e.value)?.into()));
    }
    Ok((id, out))
}

/// Stores the sessions of `lines` in `backend`, each in one atomic write (all or
/// nothing for that session), then flushes. One result per line, in order: a session
/// the target already holds is refused ([`StoreError::Exists`]) and left as it is.
/// Blocks.
pub fn import(backend: &Backend, lines: Vec<ExportLine>) -> Vec<Result<String, StoreError>> {
    let mut ops = Vec::new();
    let mut slots: Vec<Result<String, StoreError>> = Vec::with_capacity(lines.len());
    let mut op_slot = Vec::new();
    for l in lines {
        match entries(l) {
            Ok((id, entries)) => {
                op_slot.push(slots.len());
                slots.push(Ok(id.clone()));
                ops.push(WriteOp::Restore { key: id, entries });
            }
            Err(e) => slots.push(Err(e)),
        }
    }
    for (slot, r) in op_slot.into_iter().zip(backend.apply(ops)) {
        match r {
            Ok(OpResult::Done) => {}
            Ok(other) => {
                slots[slot] = Err(StoreError::Backend {
                    operation: "import",
                    session: String::new(),
                    message: format!("internal: unexpected result {other:?}"),
                })
            }
            Err(e) => slots[slot] = Err(e),
        }
    }
    slots
}
