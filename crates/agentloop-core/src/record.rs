//! What a session's stored record is (DESIGN S15): the header, the item entries and the
//! cut turn's state, as a store holds them ([`StoredRecord`], payloads still encoded),
//! as a session loads them ([`LoadedRecord`], items decoded beside their bytes and
//! their entry numbers), and as a whole ([`SessionRecord`], the logical record that
//! tools and tests read and write).
//!
//! Layout invariant (format 2): every item a session holds is one entry, numbered by a
//! per-session sequence number (`seq`) given when the item was accepted, so entry keys
//! keep push order. The header names the cut turn's items (`cut`, in the turn's order)
//! and the unhandled items that are offered before the rest (`front`, in offer order);
//! every other entry is unhandled and is offered after them, in sequence order. So the
//! logical order of S15 is rebuilt from the entries without storing it per item, and a
//! push writes one entry plus the header whatever the backlog.
//!
//! This module knows no session, no backend and no encoding: it only describes (the
//! conversions to and from bytes are `codec/record.rs`'s).

use std::collections::HashSet;

pub use crate::header::{Payload, RecordHeader};
use crate::interrupt::InterruptInfo;
use crate::status::SessionStatus;
use crate::steps::TurnJournal;
use crate::store_error::StoreError;

/// A format-2 record as stored: header, item entries (in entry-number order) and the
/// cut turn's state, payloads encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    /// The header.
    pub header: RecordHeader,
    /// `(entry number, encoded item)`, ascending.
    pub items: Vec<(u64, Payload)>,
    /// The cut turn's encoded state.
    pub state: Option<Payload>,
    /// `(occurrence, encoded journal entry)` of the running or cut turn's durable steps
    /// (S1b), ascending; the header's `journal` mark says which turn.
    pub journal: Vec<(u32, Payload)>,
}

/// Where a record's items are, by entry number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The cut turn's items, in the turn's order.
    pub interrupted: Vec<u64>,
    /// The unhandled items, in offer order.
    pub unhandled: Vec<u64>,
}

impl StoredRecord {
    /// The logical order of the items (see the module docs). A header that names an
    /// entry that is missing, or one entry twice, is `Corrupt`.
    pub fn placement(&self) -> Result<Placement, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            session: self.header.session_id.clone(),
            reason,
        };
        let present: HashSet<u64> = self.items.iter().map(|(s, _)| *s).collect();
        let mut named = HashSet::new();
        for seq in self.header.cut.iter().chain(&self.header.front) {
            if !present.contains(seq) {
                return Err(corrupt(format!(
                    "the header names item entry {seq}, which is missing"
                )));
            }
            if !named.insert(*seq) {
                return Err(corrupt(format!("the header names item entry {seq} twice")));
            }
        }
        let mut unhandled = self.header.front.clone();
        unhandled.extend(
            self.items
                .iter()
                .map(|(s, _)| *s)
                .filter(|s| !named.contains(s)),
        );
        Ok(Placement {
            interrupted: self.header.cut.clone(),
            unhandled,
        })
    }
}

/// A record in format 1 (one bincode envelope), as a store found it. Reading its items
/// needs their type ([`Stored::decode`]); a session that loads it replaces it with
/// format 2 on its first write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format1Record {
    /// The session's id.
    pub session_id: String,
    /// The agent kind.
    pub agent_kind: String,
    /// The agent's configuration.
    pub agent_config: Vec<u8>,
    /// The status.
    pub status: SessionStatus,
    /// The whole envelope.
    pub bytes: Vec<u8>,
}

/// A record as a store returns it, in the format it was written in.
// Not boxed: a `Stored` is read once per load and consumed at once; the format-1
// variant is the rare one.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Format 2: header, item entries, state entry.
    Current(StoredRecord),
    /// Format 1, written before issue 12; converted on its first write.
    Format1(Format1Record),
}

/// One item of a loaded record: its entry number, its value and its stored bytes.
#[derive(Clone, Debug)]
pub struct LoadedItem<I> {
    /// The entry number.
    pub seq: u64,
    /// The value.
    pub item: I,
    /// The encoded bytes (format 2; re-encoded for a converted format-1 record).
    pub bytes: Payload,
}

/// A record decoded for a session: the header, the items in their logical places with
/// their entry numbers and bytes, and the encoded state.
#[derive(Clone, Debug)]
pub struct LoadedRecord<I> {
    /// The header (for a format-1 record: built from it, entries numbered interrupted
    /// items first, then unhandled ones, in order).
    pub header: RecordHeader,
    /// The cut turn's items, in order.
    pub interrupted: Vec<LoadedItem<I>>,
    /// The unhandled items, in offer order.
    pub unhandled: Vec<LoadedItem<I>>,
    /// The cut turn's encoded state (see `codec::decode_state`).
    pub state: Option<Payload>,
    /// The cut turn's journal of durable steps (S1b), decoded.
    pub journal: Option<TurnJournal>,
    /// It was read in format 1: the first write must replace it whole.
    pub format1: bool,
}

impl Stored {
    /// The session id.
    pub fn session_id(&self) -> &str {
        match self {
            Stored::Current(r) => &r.header.session_id,
            Stored::Format1(r) => &r.session_id,
        }
    }

    /// The status.
    pub fn status(&self) -> &SessionStatus {
        match self {
            Stored::Current(r) => &r.header.status,
            Stored::Format1(r) => &r.status,
        }
    }
}

impl<I> LoadedRecord<I> {
    /// The whole logical record.
    pub fn into_record(self) -> SessionRecord<I> {
        let h = self.header;
        SessionRecord {
            session_id: h.session_id,
            agent_kind: h.agent_kind,
            agent_config: h.agent_config,
            status: h.status,
            turn_index: h.turn_index,
            unhandled_items: self.unhandled.into_iter().map(|i| i.item).collect(),
            interrupted_items: self.interrupted.into_iter().map(|i| i.item).collect(),
            state: self.state.map(|s| s.to_vec()),
            stop_cause: h.stop_cause,
            last_error: h.last_error,
            owner: h.owner,
            heartbeat_ms: h.heartbeat_ms,
            created_at_ms: h.created_at_ms,
            updated_at_ms: h.updated_at_ms,
            version: h.version,
            lease_epoch: h.lease_epoch,
            last_event_seq: h.last_event_seq,
            interrupt: h.interrupt,
            awaiting_answer: h.awaiting_answer,
            answer: h.answer.map(serde_bytes::ByteBuf::into_vec),
            settings: h.settings,
            journal: self.journal,
            state_carried: h.state_carried,
            agent_version: h.agent_version,
        }
    }

    /// How many items the record holds.
    pub fn item_count(&self) -> usize {
        self.interrupted.len() + self.unhandled.len()
    }
}

/// The stored record of one session as a whole (S15): what tools and tests read with
/// `agentloop::CheckpointStore::load` and write with `agentloop::CheckpointStore::save`.
/// Sessions write it incrementally instead.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRecord<I> {
    /// The session's id.
    pub session_id: String,
    /// The agent kind that runs it (to rebuild the agent after a restart).
    pub agent_kind: String,
    /// The agent's serialized configuration, handed to the kind's factory when the
    /// session is rebuilt from this record.
    pub agent_config: Vec<u8>,
    /// The status (S19).
    pub status: SessionStatus,
    /// The index of the next turn to run (or of the cut turn, when `state` or
    /// `interrupted_items` is set).
    pub turn_index: u64,
    /// Accepted items never consumed, in offer order.
    pub unhandled_items: Vec<I>,
    /// The items of the cut or interrupted turn.
    pub interrupted_items: Vec<I>,
    /// The cut turn's state at its last safe point, encoded by
    /// `codec::encode_state`.
    pub state: Option<Vec<u8>>,
    /// The business stop cause.
    pub stop_cause: Option<String>,
    /// The last error, if the session failed.
    pub last_error: Option<String>,
    /// The runtime instance that owns a `Running` record (S19).
    pub owner: Option<String>,
    /// The owner's heartbeat when the record was last written, milliseconds since the
    /// Unix epoch. Liveness is read from the instance's own heartbeat (one write per
    /// instance, not per session); this is the fallback when none is stored.
    pub heartbeat_ms: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Last update time, milliseconds since the Unix epoch.
    pub updated_at_ms: u64,
    /// A version counter, incremented by every write.
    pub version: u64,
    /// The owner's fencing token (see [`RecordHeader::lease_epoch`]).
    pub lease_epoch: u64,
    /// The last event sequence number written (see [`RecordHeader::last_event_seq`]).
    pub last_event_seq: u64,
    /// The business interrupt that stopped the session, with its question (S4).
    pub interrupt: Option<InterruptInfo>,
    /// The session waits for an answer (see [`RecordHeader::awaiting_answer`]).
    pub awaiting_answer: bool,
    /// The answer given, encoded, until the resumed turn has run.
    pub answer: Option<Vec<u8>>,
    /// The session's own settings (see [`RecordHeader::settings`]).
    pub settings: Option<crate::settings::SessionSettings>,
    /// The cut turn's journal of durable steps (S1b): replayed when the turn runs
    /// again.
    pub journal: Option<TurnJournal>,
    /// `state` is the state the session carries between turns, not a cut turn's (see
    /// [`RecordHeader::state_carried`]).
    pub state_carried: bool,
    /// The version of the agent kind that wrote it (S40; see
    /// [`RecordHeader::agent_version`]).
    pub agent_version: u32,
}

impl<I> SessionRecord<I> {
    /// An empty `Stopped` record for `session_id` at turn `turn_index`.
    pub fn new(
        session_id: impl Into<String>,
        agent_kind: impl Into<String>,
        turn_index: u64,
    ) -> Self {
        let now = crate::store_error::now_ms();
        SessionRecord {
            session_id: session_id.into(),
            agent_kind: agent_kind.into(),
            agent_config: Vec::new(),
            status: SessionStatus::Stopped,
            turn_index,
            unhandled_items: Vec::new(),
            interrupted_items: Vec::new(),
            state: None,
            stop_cause: None,
            last_error: None,
            owner: None,
            heartbeat_ms: now,
            created_at_ms: now,
            updated_at_ms: now,
            version: 0,
            lease_epoch: 0,
            last_event_seq: 0,
            interrupt: None,
            awaiting_answer: false,
            answer: None,
            settings: None,
            journal: None,
            state_carried: false,
            agent_version: crate::header::FIRST_VERSION,
        }
    }

    /// Whether the record holds a cut turn to resume (S17).
    pub fn is_mid_turn(&self) -> bool {
        (self.state.is_some() && !self.state_carried) || !self.interrupted_items.is_empty()
    }
}

/// One entry of a typed listing: a record, or why it could not be read.
#[derive(Clone, Debug, PartialEq)]
pub struct ListEntry<I> {
    /// The key it is stored under.
    pub session_id: String,
    /// The decoded record, or the decode error (a corrupt record is listed, not hidden).
    pub record: Result<SessionRecord<I>, StoreError>,
}

/// One entry of a raw listing: a record as stored, or why it could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEntry {
    /// The session id it is stored under.
    pub session_id: String,
    /// The record, or the error (a corrupt record is listed, not hidden).
    pub record: Result<Stored, StoreError>,
}
