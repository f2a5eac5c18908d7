//! How records are laid out in an ordered key-value table, and how writes,
//! compare-and-swaps and deletes apply to them (DESIGN S15, S15c, S19, S24). Every engine
//! (memory, sled, fjall, PostgreSQL) runs this code over its own table, so they share
//! one semantics; the store conformance suite pins it.
//!
//! Keys (a session id has no control character, so `0x00` ends it and one session's
//! keys are contiguous and never a prefix of another's):
//!
//! ```text
//! <id> 0x00 'h'                 the head: header, layout, inline items and state
//! <id> 0x00 'i' <seq: u64 BE>   a loose item entry (big-endian: key order is push order)
//! <id> 0x00 's'                 a loose state
//! <id> 0x00 'j' <occ: u32 BE>   a journal entry of the running or cut turn (format 4)
//! ```
//!
//! Format 3 (issue 30, `codec::head`): a whole-record write puts everything in the head
//! (one key); an incremental write puts a pushed item as a loose entry and the state
//! inline while it fits; the head says how many loose items there are and between which
//! entry numbers, so no write and no load scans the session's prefix. A format-2 record
//! (no layout: every item and the state loose) is read by a scan and converted by its
//! first write. A write's journal changes (S1b) go inline in the head while its inline
//! payload fits, else loose (counted by the head); the head is written in format 4
//! while any exist.
//!
//! Records of format 1 live elsewhere (sled's `records` tree, key = id); a table
//! reaches them through the `format1_*` methods. When both exist for one id, format 2
//! wins (a conversion that crashed between its two steps left the old one behind).

use std::collections::BTreeMap;

use crate::codec::head::{self, Head, Layout, INLINE_LIMIT};
use crate::codec::legacy;
use crate::ids::validate_session_id;

pub mod events;
pub mod history;
mod keys;
pub(crate) mod kv;
mod list;
pub mod timers;
use crate::record::{Format1Record, Payload, Stored, StoredRecord};
use crate::status::{CasOutcome, SessionStatus, StatusKind};
use crate::store_error::StoreError;
use crate::write::{ConditionFailed, ItemChange, JournalChange, RecordWrite, StateChange};
pub use keys::{
    entry_name, header_key, item_key, journal_key, parse_key, session_prefix, state_key, KeyKind,
};
pub use kv::Table;
pub use list::{kept_page, list, list_page};

/// A session's stored entries named for a raw listing (`sessions show --raw`), with the
/// items and state a format-3 head holds inline listed after it as `item N` and
/// `state`, like loose entries (the head's reading says which are inline); a head that
/// does not decode is listed as it is.
pub fn raw_entries(
    id: &str,
    entries: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (k, v) in entries {
        let name = entry_name(&k);
        let inline = match parse_key(&k) {
            Some((_, KeyKind::Header)) => head::decode(id, &v).ok(),
            _ => None,
        };
        out.push((name, v));
        if let Some(h) = inline {
            for (seq, b) in h.items {
                out.push((format!("item {seq}"), b.to_vec()));
            }
            if let Some(s) = h.state {
                out.push(("state".to_string(), s.to_vec()));
            }
            for (occ, b) in h.journal {
                out.push((format!("step {occ}"), b.to_vec()));
            }
        }
    }
    out
}

pub(crate) fn check_id(id: &str) -> Result<(), StoreError> {
    validate_session_id(id).map_err(|reason| StoreError::InvalidId {
        id: id.to_string(),
        reason,
    })
}

/// Assembles a record from its entries (all keys of one session, in order): the head's
/// inline items and state with the loose entries (format 3), or the entries alone
/// (format 2).
pub fn assemble(
    id: &str,
    entries: Vec<(Vec<u8>, Payload)>,
) -> Result<Option<StoredRecord>, StoreError> {
    let mut head = None;
    let mut loose = Loose::default();
    for (k, v) in entries {
        match parse_key(&k) {
            Some((kid, kind)) if kid == id => match kind {
                KeyKind::Header => head = Some(head::decode(id, &v)?),
                KeyKind::Item(seq) => loose.items.push((seq, v)),
                KeyKind::State => loose.state = Some(v),
                KeyKind::Journal(occ) => loose.journal.push((occ, v)),
                KeyKind::Other => {}
            },
            _ => {}
        }
    }
    // Entries without a head: the head is what makes a record (a write puts it last in
    // its batch, a delete removes everything).
    let Some(head) = head else { return Ok(None) };
    Ok(Some(combine(head, loose)))
}

/// A record from its head and its loose entries.
fn combine(head: Head, loose: Loose) -> StoredRecord {
    let Loose {
        items: loose,
        state: loose_state,
        journal: loose_journal,
    } = loose;
    let Head {
        header,
        items: mut inline,
        state,
        mut journal,
        ..
    } = head;
    if journal.is_empty() {
        journal = loose_journal;
    } else if !loose_journal.is_empty() {
        journal.extend(loose_journal);
        journal.sort_by_key(|(occ, _)| *occ);
    }
    let items = if inline.is_empty() {
        loose
    } else if loose.is_empty() {
        inline
    } else {
        inline.extend(loose);
        inline.sort_by_key(|(seq, _)| *seq);
        inline
    };
    StoredRecord {
        header,
        items,
        state: loose_state.or(state),
        journal,
    }
}

fn format1(id: &str, bytes: Vec<u8>) -> Result<Stored, StoreError> {
    let (p, _) = legacy::prefix(id, &bytes)?;
    Ok(Stored::Format1(Format1Record {
        session_id: p.session_id,
        agent_kind: p.agent_kind,
        agent_config: p.agent_config,
        status: p.status,
        bytes,
    }))
}

/// Reads one session's record: its head, then only the loose entries the head names
/// (format 3), or every entry under its prefix (format 2).
pub fn read(t: &impl Table, id: &str) -> Result<Option<Stored>, StoreError> {
    check_id(id)?;
    let Some(bytes) = t.get(&header_key(id))? else {
        return match t.format1_get(id)? {
            Some(bytes) => format1(id, bytes).map(Some),
            None => Ok(None),
        };
    };
    let head = head::decode(id, &bytes)?;
    let Some(layout) = head.layout else {
        return Ok(assemble(id, t.entries_with_prefix(&session_prefix(id))?)?.map(Stored::Current));
    };
    let loose = read_loose(t, id, &layout)?;
    Ok(Some(Stored::Current(combine(head, loose))))
}

/// A record's loose entries: items and journal entries ascending, and the state.
#[derive(Default)]
struct Loose {
    items: Vec<(u64, Payload)>,
    state: Option<Payload>,
    journal: Vec<(u32, Payload)>,
}

/// A format-3 or format-4 record's loose entries: its items (in the head's bounds),
/// its state and its journal entries (in the head's bounds).
fn read_loose(t: &impl Table, id: &str, layout: &Layout) -> Result<Loose, StoreError> {
    let mut loose = Loose::default();
    if layout.loose_items > 0 {
        for (k, v) in t.entries_in_range(&item_key(id, layout.lo), &item_key(id, layout.hi))? {
            if let Some((_, KeyKind::Item(seq))) = parse_key(&k) {
                loose.items.push((seq, v));
            }
        }
    }
    if layout.journal_entries > 0 {
        let (lo, hi) = (
            journal_key(id, layout.journal_lo),
            journal_key(id, layout.journal_hi),
        );
        for (k, v) in t.entries_in_range(&lo, &hi)? {
            if let Some((_, KeyKind::Journal(occ))) = parse_key(&k) {
                loose.journal.push((occ, v));
            }
        }
    }
    loose.state = match layout.loose_state {
        true => t.get(&state_key(id))?,
        false => None,
    };
    Ok(loose)
}

/// What a record's head alone answers of a read.
#[derive(Debug)]
pub enum HeadRead {
    /// The whole record: a format-3 head without loose entries.
    Record(Box<Stored>),
    /// The record has loose entries (or is of format 2): [`read`] it.
    NeedsEntries,
}

/// Reads a record from its head's bytes alone when it can (what [`read`] would answer).
pub fn read_head_only(id: &str, bytes: &[u8]) -> Result<HeadRead, StoreError> {
    let head = head::decode(id, bytes)?;
    Ok(match head.layout {
        Some(l) if l.loose_items == 0 && !l.loose_state && l.journal_entries == 0 => {
            HeadRead::Record(Box::new(Stored::Current(combine(head, Loose::default()))))
        }
        _ => HeadRead::NeedsEntries,
    })
}

/// The entries that store `record` as a write would leave it on an empty table: one
/// head holding everything when it fits in [`INLINE_LIMIT`], else a head and loose
/// entries (an import, a fixture).
pub fn entries_of(record: StoredRecord) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
    let id = record.header.session_id.clone();
    let size: usize = record.items.iter().map(|(_, b)| b.len()).sum::<usize>()
        + record.state.as_ref().map_or(0, |s| s.len())
        + record.journal.iter().map(|(_, b)| b.len()).sum::<usize>();
    if size <= INLINE_LIMIT {
        let head = head::encode_with(
            &record.header,
            Layout::default(),
            &record.items,
            record.state.as_ref(),
            &record.journal,
        )?;
        return Ok(vec![(header_key(&id), head.into())]);
    }
    let mut layout = Layout::default();
    let mut out = Vec::with_capacity(record.items.len() + record.journal.len() + 2);
    for (seq, bytes) in record.items {
        layout.add(seq);
        out.push((item_key(&id, seq), bytes));
    }
    for (occ, bytes) in record.journal {
        layout.add_step(occ);
        out.push((journal_key(&id, occ), bytes));
    }
    if let Some(s) = record.state {
        layout.loose_state = true;
        out.push((state_key(&id), s));
    }
    let head = head::encode(&record.header, layout, &[], None)?;
    out.insert(0, (header_key(&id), head.into()));
    Ok(out)
}

/// The stored head of `id` (format 3 or 2), or the bytes of its format-1 record.
fn current(t: &impl Table, id: &str) -> Result<(Option<Head>, Option<Vec<u8>>), StoreError> {
    match t.get(&header_key(id))? {
        Some(bytes) => Ok((Some(head::decode(id, &bytes)?), None)),
        None => Ok((None, t.format1_get(id)?)),
    }
}

/// The layout of a stored head; a format-2 head's is found by scanning its entries
/// (once: the write converts it).
fn layout_of(t: &impl Table, id: &str, layout: Option<Layout>) -> Result<Layout, StoreError> {
    if let Some(l) = layout {
        return Ok(l);
    }
    let mut l = Layout::default();
    for k in t.keys_with_prefix(&session_prefix(id))? {
        match parse_key(&k).map(|(_, kind)| kind) {
            Some(KeyKind::Item(seq)) => l.add(seq),
            Some(KeyKind::State) => l.loose_state = true,
            Some(KeyKind::Journal(occ)) => l.add_step(occ),
            _ => {}
        }
    }
    Ok(l)
}

/// Applies one write (see [`RecordWrite`]): reads the stored head (one key), checks the
/// condition and the fencing token, then writes the head and the changed loose entries
/// only. A replacing write removes the loose entries the stored head names and keeps
/// the record inline when it fits in [`INLINE_LIMIT`].
pub fn write(t: &mut impl Table, w: RecordWrite) -> Result<(), StoreError> {
    let id = w.header.session_id.clone();
    check_id(&id)?;
    let head_bytes = t.get(&header_key(&id))?;
    let peeked = match &head_bytes {
        // A replacing write discards the stored inline payload: it is checked, not copied.
        Some(bytes) => head::peek_with(&id, bytes, !w.replace).map(|p| (Some(p), None)),
        None => t.format1_get(&id).map(|old| (None, old)),
    };
    let (stored, old, damaged) = match peeked {
        Ok((h, old)) => (h, old, false),
        // A damaged record is left alone (S18), except by an unconditional write.
        Err(e) if w.condition != crate::write::WriteCondition::Always => return Err(e),
        Err(_) => (None, None, true),
    };
    let kind = match (&stored, &old) {
        (Some(h), _) => Some(h.summary.kind),
        (None, Some(bytes)) => Some(legacy::prefix(&id, bytes)?.0.status.kind()),
        (None, None) => None,
    };
    if let Err(why) = w.condition.allows(kind) {
        // The refusal names the stored status in full: only now is the header decoded.
        let status = match (&head_bytes, &old) {
            (Some(bytes), _) => Some(head::decode(&id, bytes)?.header.status),
            (None, Some(bytes)) => Some(legacy::prefix(&id, bytes)?.0.status),
            (None, None) => None,
        };
        return Err(match (why, status) {
            (ConditionFailed::Final, Some(status)) => StoreError::Final {
                session: id,
                status,
            },
            (ConditionFailed::Exists, Some(status)) => StoreError::Exists {
                session: id,
                status,
            },
            _ => StoreError::NoRecord { session: id },
        });
    }
    if let (crate::write::WriteCondition::AtVersion(expected), Some(h)) = (&w.condition, &stored) {
        if h.summary.version != *expected {
            return Err(StoreError::Changed {
                session: id,
                expected: *expected,
                found: h.summary.version,
            });
        }
    }
    let stored_epoch = stored.as_ref().map_or(0, |h| h.summary.lease_epoch);
    // S37: a cancel by id moved the epoch one past its owner's; that owner may still
    // write what it holds over the `Canceled` record (S24), and no one else below it.
    let canceled_owner = w.condition == crate::write::WriteCondition::CanceledOrLive
        && kind == Some(StatusKind::Canceled)
        && w.header.lease_epoch + 1 == stored_epoch;
    if w.header.lease_epoch < stored_epoch && !canceled_owner {
        return Err(StoreError::Fenced {
            session: id,
            held: w.header.lease_epoch,
            current: stored_epoch,
        });
    }
    if stored.is_none() && old.is_some() && !w.replace {
        return Err(StoreError::Refused {
            session: id,
            status: "format 1".into(),
            why: "a record of the previous format is converted only by a write that replaces \
                  it whole (a session that loaded it does that on its first write)"
                .into(),
        });
    }
    let mut header = w.header;
    header.version = stored.as_ref().map_or(0, |h| h.summary.version) + 1;
    // The stored epoch never goes down (the canceled owner's write above keeps it).
    header.lease_epoch = header.lease_epoch.max(stored_epoch);
    let (mut layout, mut inline, mut state, mut journal) = match stored {
        Some(h) => (
            layout_of(t, &id, h.layout)?,
            h.items.into_iter().collect::<BTreeMap<_, _>>(),
            h.state,
            h.journal.into_iter().collect::<BTreeMap<_, _>>(),
        ),
        None => (Layout::default(), BTreeMap::new(), None, BTreeMap::new()),
    };
    if w.replace {
        if damaged {
            // The head cannot say where the entries are: remove all of them.
            for k in t.keys_with_prefix(&session_prefix(&id))? {
                t.remove(k);
            }
        } else {
            remove_loose(t, &id, &layout)?;
        }
        if old.is_some() {
            t.format1_remove(&id);
        }
        (layout, inline, state, journal) =
            (Layout::default(), BTreeMap::new(), None, BTreeMap::new());
    }
    for change in w.items {
        match change {
            // A whole record goes inline; an item already inline stays there.
            ItemChange::Put(seq, bytes) if w.replace || inline.contains_key(&seq) => {
                inline.insert(seq, bytes);
            }
            ItemChange::Put(seq, bytes) => {
                let key = item_key(&id, seq);
                let existed = layout.may_hold(seq) && t.get(&key)?.is_some();
                t.put(key, bytes);
                if !existed {
                    layout.add(seq);
                }
            }
            ItemChange::Delete(seq) => {
                if inline.remove(&seq).is_none() && layout.may_hold(seq) {
                    let key = item_key(&id, seq);
                    if t.get(&key)?.is_some() {
                        t.remove(key);
                        layout.remove(seq);
                    }
                }
            }
        }
    }
    // Journal entries (S1b) go inline while the head's inline payload fits, so a step's
    // write is one key; an entry already loose stays loose.
    let inline_now = |inline: &BTreeMap<u64, Payload>,
                      state: &Option<Payload>,
                      journal: &BTreeMap<u32, Payload>| {
        inline.values().map(|b| b.len()).sum::<usize>()
            + state.as_ref().map_or(0, |s| s.len())
            + journal.values().map(|b| b.len()).sum::<usize>()
    };
    for change in w.journal {
        match change {
            JournalChange::Put(occ, bytes) => {
                let key = journal_key(&id, occ);
                let loose = layout.may_hold_step(occ) && t.get(&key)?.is_some();
                if loose {
                    t.put(key, bytes);
                } else if journal.contains_key(&occ)
                    || inline_now(&inline, &state, &journal) + bytes.len() <= INLINE_LIMIT
                {
                    journal.insert(occ, bytes);
                } else {
                    t.put(key, bytes);
                    layout.add_step(occ);
                }
            }
            JournalChange::Delete(occ) => {
                if journal.remove(&occ).is_none() && layout.may_hold_step(occ) {
                    let key = journal_key(&id, occ);
                    if t.get(&key)?.is_some() {
                        t.remove(key);
                        layout.remove_step();
                    }
                }
            }
        }
    }
    let inline_items: usize = inline.values().map(|b| b.len()).sum::<usize>()
        + journal.values().map(|b| b.len()).sum::<usize>();
    match w.state {
        StateChange::Keep => {}
        StateChange::Put(bytes) if inline_items + bytes.len() <= INLINE_LIMIT => {
            if layout.loose_state {
                t.remove(state_key(&id));
                layout.loose_state = false;
            }
            state = Some(bytes);
        }
        StateChange::Put(bytes) => {
            t.put(state_key(&id), bytes);
            layout.loose_state = true;
            state = None;
        }
        StateChange::Delete => {
            if layout.loose_state {
                t.remove(state_key(&id));
                layout.loose_state = false;
            }
            state = None;
        }
    }
    // Beyond the limit the inline items become loose entries (once), so that the head
    // a push rewrites stays small whatever the backlog.
    if inline_items + state.as_ref().map_or(0, |s| s.len()) > INLINE_LIMIT {
        for (seq, bytes) in std::mem::take(&mut inline) {
            t.put(item_key(&id, seq), bytes);
            layout.add(seq);
        }
        for (occ, bytes) in std::mem::take(&mut journal) {
            t.put(journal_key(&id, occ), bytes);
            layout.add_step(occ);
        }
        if let Some(s) = state.take_if(|s| s.len() > INLINE_LIMIT) {
            t.put(state_key(&id), s);
            layout.loose_state = true;
        }
    }
    let items: Vec<(u64, Payload)> = inline.into_iter().collect();
    let journal: Vec<(u32, Payload)> = journal.into_iter().collect();
    let encoded = head::encode_with(&header, layout, &items, state.as_ref(), &journal)?;
    t.put(header_key(&id), encoded.into());
    if let Some(mark) = w.history {
        // The record as this write leaves it, read through its head (no prefix scan).
        if let Some(Stored::Current(now)) = read(t, &id)? {
            history::record(t, &id, mark, header.updated_at_ms, now)?;
        }
    }
    // S39: the timers it arms or fired, in the same batch as the record.
    timers::apply(t, &id, w.timers)?;
    Ok(())
}

/// Writes one journal change of turn `turn` straight into the stored record (S1b: a
/// durable step's entry, without a write of the session's whole placement): the stored
/// header is kept but for its version, the owner's fencing token `epoch` (checked as
/// every write's, so a fenced owner is refused) and the journal's mark (set to `turn`
/// with no step covered when the record has none: the stored state then covers none of
/// this turn's steps). Refused with [`StoreError::NoRecord`] without a record, and with
/// [`StoreError::Refused`] over a format-2 record or a record whose journal belongs to
/// another turn (the session then writes the entry with its own next write).
pub fn append_journal(
    t: &mut impl Table,
    id: &str,
    epoch: u64,
    turn: u64,
    change: JournalChange,
) -> Result<(), StoreError> {
    check_id(id)?;
    let Some(bytes) = t.get(&header_key(id))? else {
        return Err(StoreError::NoRecord {
            session: id.to_string(),
        });
    };
    let head = head::decode(id, &bytes)?;
    let refuse = |why: String| StoreError::Refused {
        session: id.to_string(),
        status: head.header.status.to_string(),
        why,
    };
    if head.layout.is_none() {
        return Err(refuse(
            "the record is of format 2: the session's next write converts it".into(),
        ));
    }
    let mut header = head.header.clone();
    match header.journal {
        Some(m) if m.turn != turn => {
            return Err(refuse(format!(
                "its journal belongs to turn {}, not {turn}",
                m.turn
            )))
        }
        Some(_) => {}
        None => header.journal = Some(crate::steps::JournalMark { turn, covered: 0 }),
    }
    header.lease_epoch = epoch;
    write(
        t,
        RecordWrite {
            header,
            items: Vec::new(),
            state: StateChange::Keep,
            journal: vec![change],
            replace: false,
            condition: crate::write::WriteCondition::NotFinal,
            history: None,
            timers: Vec::new(),
        },
    )
}

/// Removes the loose entries `layout` names.
fn remove_loose(t: &mut impl Table, id: &str, layout: &Layout) -> Result<(), StoreError> {
    if layout.loose_items > 0 {
        for (k, _) in t.entries_in_range(&item_key(id, layout.lo), &item_key(id, layout.hi))? {
            t.remove(k);
        }
    }
    if layout.loose_state {
        t.remove(state_key(id));
    }
    if layout.journal_entries > 0 {
        let (lo, hi) = (
            journal_key(id, layout.journal_lo),
            journal_key(id, layout.journal_hi),
        );
        for (k, _) in t.entries_in_range(&lo, &hi)? {
            t.remove(k);
        }
    }
    Ok(())
}

/// Compare-and-swap of the status (S19, S24): `to` if the stored status is one of
/// `from`. Sets `last_error` for `Failed`, the update time and the version.
pub fn cas(
    t: &mut impl Table,
    id: &str,
    from: &[StatusKind],
    to: SessionStatus,
    now_ms: u64,
) -> Result<CasOutcome, StoreError> {
    check_id(id)?;
    match current(t, id)? {
        (Some(head), _) => {
            let layout = layout_of(t, id, head.layout)?;
            let mut h = head.header;
            if !from.contains(&h.status.kind()) {
                return Ok(CasOutcome::Mismatch(h.status));
            }
            let prev = std::mem::replace(&mut h.status, to);
            match &h.status {
                SessionStatus::Failed(e) => h.last_error = Some(e.clone()),
                // S37: a cancel by id needs no epoch and fences the owner it had: the
                // owner's next live write is refused wherever it runs.
                SessionStatus::Canceled => h.lease_epoch += 1,
                _ => {}
            }
            h.updated_at_ms = now_ms;
            h.version += 1;
            let encoded =
                head::encode_with(&h, layout, &head.items, head.state.as_ref(), &head.journal)?;
            t.put(header_key(id), encoded.into());
            Ok(CasOutcome::Swapped(prev))
        }
        (None, Some(bytes)) => {
            let (p, _) = legacy::prefix(id, &bytes)?;
            if !from.contains(&p.status.kind()) {
                return Ok(CasOutcome::Mismatch(p.status));
            }
            t.format1_put(id, legacy::with_status(id, &bytes, to)?);
            Ok(CasOutcome::Swapped(p.status))
        }
        (None, None) => Ok(CasOutcome::Missing),
    }
}

/// Removes a session's record, its checkpoint history and its kept events (an explicit
/// delete); whether any of them existed.
pub fn purge(t: &mut impl Table, id: &str) -> Result<bool, StoreError> {
    let record = delete(t, id)?;
    let history = history::purge(t, id)?;
    // Its kept events (S20a) go with it.
    let events = events::remove_all(t, id)?;
    Ok(record || history > 0 || events > 0)
}

/// Removes every entry of a session (and a format-1 record) and its timers (S39: they
/// push into a session that is no more); whether a record existed. The checkpoint
/// history and the kept events stay (S16's delete at a clean exit keeps them).
pub fn delete(t: &mut impl Table, id: &str) -> Result<bool, StoreError> {
    check_id(id)?;
    timers::remove_all(t, id)?;
    let old = t.format1_get(id)?.is_some();
    if old {
        t.format1_remove(id);
    }
    // A format-3 head names its loose entries; anything else (format 2, a damaged
    // head, entries without one) is removed by a scan of the session's prefix.
    let layout = match t.get(&header_key(id))? {
        Some(bytes) => head::decode(id, &bytes).ok().and_then(|h| h.layout),
        None => None,
    };
    if let Some(layout) = layout {
        remove_loose(t, id, &layout)?;
        t.remove(header_key(id));
        return Ok(true);
    }
    let keys = t.keys_with_prefix(&session_prefix(id))?;
    let existed = keys
        .iter()
        .any(|k| parse_key(k).map(|(_, kind)| kind) == Some(KeyKind::Header))
        || old;
    for k in keys {
        t.remove(k);
    }
    Ok(existed)
}

/// Stores a session's entries exactly as given (an import, `store::transfer`): refused
/// with [`StoreError::Exists`] when the session has a record or any history, with
/// [`StoreError::Refused`] when an entry's key is not one of this session's or there is
/// no header. Nothing is written unless everything is.
pub fn restore(
    t: &mut impl Table,
    id: &str,
    entries: Vec<(Vec<u8>, Payload)>,
) -> Result<(), StoreError> {
    check_id(id)?;
    let refused = |why: String| StoreError::Refused {
        session: id.to_string(),
        status: "import".into(),
        why,
    };
    let live = session_prefix(id);
    let history = crate::history::history_prefix(id);
    let mut header = None;
    for (k, v) in &entries {
        if k.starts_with(&history) {
            continue;
        }
        if !k.starts_with(&live) {
            return Err(refused(format!(
                "an entry's key ({:02x?}) is not one of this session's",
                &k[..k.len().min(32)]
            )));
        }
        if parse_key(k).map(|(_, kind)| kind) == Some(KeyKind::Header) {
            header = Some(head::decode(id, v)?.header);
        }
    }
    if entries.is_empty() {
        return Err(refused("nothing to import".into()));
    }
    // A session whose record was deleted at a clean exit may keep only its history.
    if header.is_none() && entries.iter().any(|(k, _)| k.starts_with(&live)) {
        return Err(refused("the record's entries hold no header".into()));
    }
    if let (Some(h), _) = current(t, id)? {
        return Err(StoreError::Exists {
            session: id.to_string(),
            status: h.header.status,
        });
    }
    if let Some(bytes) = t.format1_get(id)? {
        return Err(StoreError::Exists {
            session: id.to_string(),
            status: legacy::prefix(id, &bytes)?.0.status,
        });
    }
    if !t.keys_with_prefix(&live)?.is_empty() || !t.keys_with_prefix(&history)?.is_empty() {
        return Err(refused(
            "entries of this session are stored without a record (history or leftovers): \
             delete the session first (`agentloop sessions delete`)"
                .into(),
        ));
    }
    for (k, v) in entries {
        t.put(k, v);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
