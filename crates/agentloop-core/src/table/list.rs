//! Listings of the table: every record grouped from one ordered scan ([`list`]), one
//! page of records in id order ([`list_page`]) and one page of the sessions that keep
//! history or events ([`kept_page`]), each seeking rather than scanning where it can.
//! It reads records as `super::read` reads them and writes nothing.

use super::{assemble, events, format1, parse_key, read, Table};
use crate::record::{Payload, Stored, StoredEntry};
use crate::status::{SessionStatus, StatusKind};
use crate::store_error::StoreError;

/// One session's entries during a scan: its id and its `(key, value)` pairs.
type Group = (String, Vec<(Vec<u8>, Payload)>);

/// Groups an ordered scan of the whole table into records, filtered by status; corrupt
/// records are listed with their error. `format1` are the format-1 records (id, bytes)
/// that have no format-2 record.
pub fn list(
    scan: impl Iterator<Item = Result<(Vec<u8>, Payload), StoreError>>,
    format1_records: impl Iterator<Item = Result<(String, Vec<u8>), StoreError>>,
    statuses: Option<&[StatusKind]>,
) -> Result<Vec<StoredEntry>, StoreError> {
    let wanted = |s: &SessionStatus| statuses.is_none_or(|f| f.contains(&s.kind()));
    let mut out: Vec<StoredEntry> = Vec::new();
    // Every session with format-2 entries, listed or not: a format-1 record under the
    // same id is an unfinished conversion's leftover, never listed.
    let mut current: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut group: Option<Group> = None;
    let flush = |group: Option<Group>, out: &mut Vec<StoredEntry>| {
        let Some((id, entries)) = group else { return };
        match assemble(&id, entries) {
            Ok(Some(r)) if wanted(&r.header.status) => out.push(StoredEntry {
                session_id: id,
                record: Ok(Stored::Current(r)),
            }),
            Ok(_) => {}
            Err(e) => out.push(StoredEntry {
                session_id: id,
                record: Err(e),
            }),
        }
    };
    for kv in scan {
        let (k, v) = kv?;
        let Some((id, _)) = parse_key(&k) else {
            continue;
        };
        match &mut group {
            Some((gid, entries)) if gid == id => entries.push((k, v)),
            _ => {
                let id = id.to_string();
                current.insert(id.clone());
                flush(group.take(), &mut out);
                group = Some((id, vec![(k, v)]));
            }
        }
    }
    flush(group.take(), &mut out);
    for kv in format1_records {
        let (id, bytes) = kv?;
        if current.contains(&id) {
            continue;
        }
        match format1(&id, bytes) {
            Ok(r) if wanted(r.status()) => out.push(StoredEntry {
                session_id: id,
                record: Ok(r),
            }),
            Ok(_) => {}
            Err(e) => out.push(StoredEntry {
                session_id: id,
                record: Err(e),
            }),
        }
    }
    out.sort_by(|a, b| a.session_id.cmp(&b.session_id));
    Ok(out)
}

/// The smallest byte a session id starts with: an id holds no control character (S32),
/// so every key of a live record sorts at or above it, and the checkpoint-history,
/// kept-event and timer keys (marked `0x01` to `0x04`) sort below it.
const FIRST_ID_BYTE: u8 = 0x20;

/// One page of records in id order: those whose id comes after `after` (from the first
/// when `None`), at most `limit`, each read as [`read`] reads it (a corrupt one is
/// listed with its error, as [`list`] lists it). It seeks one session at a time
/// ([`Table::first_key_from`], [`Table::format1_next_after`]) and reads only the
/// records it lists, so a page costs what it returns (issue 52: a seek and one record
/// per row), however many records the table holds.
pub fn list_page(
    t: &impl Table,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<StoredEntry>, StoreError> {
    let mut out: Vec<StoredEntry> = Vec::with_capacity(limit.min(1024));
    let mut from = match after {
        Some(a) => past(a),
        None => vec![FIRST_ID_BYTE],
    };
    let mut next = next_id(t, &mut from, after)?;
    let mut next_format1 = t.format1_next_after(after)?;
    while out.len() < limit {
        let id = match (&next, &next_format1) {
            (None, None) => break,
            (Some(a), Some(b)) => a.min(b).clone(),
            (Some(a), None) => a.clone(),
            (None, Some(b)) => b.clone(),
        };
        if next.as_deref() == Some(id.as_str()) {
            from = past(&id);
            next = next_id(t, &mut from, Some(&id))?;
        }
        if next_format1.as_deref() == Some(id.as_str()) {
            next_format1 = t.format1_next_after(Some(&id))?;
        }
        match read(t, &id) {
            Ok(Some(record)) => out.push(StoredEntry {
                session_id: id,
                record: Ok(record),
            }),
            Ok(None) => {}
            Err(e) => out.push(StoredEntry {
                session_id: id,
                record: Err(e),
            }),
        }
    }
    Ok(out)
}

/// One page of the sessions that keep checkpoint history (S16b) or events (S20a), in
/// id order: their ids after `after` (from the first when `None`), at most `limit`,
/// whether or not a record of them remains (S26a: a session is known while anything of
/// it is kept; the caller merges this page with [`list_page`]'s). It seeks one session
/// at a time in each keyspace ([`Table::first_key_from`]), so a page costs what it
/// returns, however many entries each session keeps.
pub fn kept_page(
    t: &impl Table,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let marks = [crate::history::HISTORY_MARK, events::EVENTS_MARK];
    let mut next: Vec<Option<String>> = marks
        .iter()
        .map(|m| next_kept(t, *m, after))
        .collect::<Result<_, _>>()?;
    let mut out: Vec<String> = Vec::with_capacity(limit.min(1024));
    while out.len() < limit {
        let Some(id) = next.iter().flatten().min().cloned() else {
            break;
        };
        for (i, mark) in marks.iter().enumerate() {
            if next[i].as_deref() == Some(id.as_str()) {
                next[i] = next_kept(t, *mark, Some(&id))?;
            }
        }
        out.push(id);
    }
    Ok(out)
}

/// The first session after `after` with a key in the keyspace marked `mark`
/// (`mark`, id, `0x00`, …).
fn next_kept(t: &impl Table, mark: u8, after: Option<&str>) -> Result<Option<String>, StoreError> {
    let mut from = vec![mark];
    match after {
        // Past every key of `after` in this keyspace; an `after` that is no id (a NUL
        // in it) comes after the same ids as its part before the NUL.
        Some(a) => {
            from.extend_from_slice(a.split('\0').next().unwrap_or_default().as_bytes());
            from.push(1);
        }
        None => from.push(FIRST_ID_BYTE),
    }
    loop {
        let Some(key) = t.first_key_from(&from)? else {
            return Ok(None);
        };
        if key.first() != Some(&mark) {
            return Ok(None);
        }
        let rest = &key[1..];
        let Some(end) = rest.iter().position(|b| *b == 0) else {
            // No id's key (nothing writes one): step over it.
            from = key;
            from.push(0);
            continue;
        };
        match std::str::from_utf8(&rest[..end]) {
            Ok(id) if after.is_none_or(|a| id > a) => return Ok(Some(id.to_string())),
            // Past every key of this id (`mark`, id, `0x00`, …).
            _ => {
                from = key[..1 + end].to_vec();
                from.push(1);
            }
        }
    }
}

/// The first key past every key of session `id` (they are `id`, `0x00`, …; an id that
/// extends `id` goes on with a byte above `0x01`).
fn past(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 1);
    k.extend_from_slice(id.as_bytes());
    k.push(1);
    k
}

/// The session of the first record key at or after `from` whose id comes after
/// `after`, moving `from` past the keys it skips (each skip moves it forward).
fn next_id(
    t: &impl Table,
    from: &mut Vec<u8>,
    after: Option<&str>,
) -> Result<Option<String>, StoreError> {
    loop {
        let Some(key) = t.first_key_from(from)? else {
            return Ok(None);
        };
        match parse_key(&key) {
            Some((id, _)) if after.is_none_or(|a| id > a) => return Ok(Some(id.to_string())),
            Some((id, _)) => *from = past(id),
            None => {
                *from = key;
                from.push(0);
            }
        }
    }
}
