//! The keys of a live record in the table (the layout the module above draws): a
//! session's prefix, its head, loose items, state and journal entries, and how a key
//! is read back. It knows nothing of what the entries hold.

use super::{events, timers};

const HEADER: u8 = b'h';
const ITEM: u8 = b'i';
const STATE: u8 = b's';
const JOURNAL: u8 = b'j';

/// The prefix of every key of `id`.
pub fn session_prefix(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 10);
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k
}

/// The header's key.
pub fn header_key(id: &str) -> Vec<u8> {
    let mut k = session_prefix(id);
    k.push(HEADER);
    k
}

/// An item entry's key.
pub fn item_key(id: &str, seq: u64) -> Vec<u8> {
    let mut k = session_prefix(id);
    k.push(ITEM);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The state entry's key.
pub fn state_key(id: &str) -> Vec<u8> {
    let mut k = session_prefix(id);
    k.push(STATE);
    k
}

/// A journal entry's key (S1b).
pub fn journal_key(id: &str, occurrence: u32) -> Vec<u8> {
    let mut k = session_prefix(id);
    k.push(JOURNAL);
    k.extend_from_slice(&occurrence.to_be_bytes());
    k
}

/// What a key is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A header.
    Header,
    /// An item entry.
    Item(u64),
    /// A state entry.
    State,
    /// A journal entry, by occurrence.
    Journal(u32),
    /// A key this build does not know (a later format's entry): skipped.
    Other,
}

/// Splits a key into its session id and what it is; `None` for a key that is not
/// of this layout at all.
pub fn parse_key(key: &[u8]) -> Option<(&str, KeyKind)> {
    if matches!(
        key.first(),
        Some(&crate::history::HISTORY_MARK)
            | Some(&events::EVENTS_MARK)
            | Some(&timers::DUE_MARK)
            | Some(&timers::TIMERS_MARK)
    ) {
        // A checkpoint-history key (`store::history`), a kept event (`events`) or a
        // timer (`timers`), not part of a live record.
        return None;
    }
    let zero = key.iter().position(|b| *b == 0)?;
    let id = std::str::from_utf8(&key[..zero]).ok()?;
    let rest = &key[zero + 1..];
    let kind = match rest {
        [HEADER] => KeyKind::Header,
        [STATE] => KeyKind::State,
        [ITEM, seq @ ..] if seq.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(seq);
            KeyKind::Item(u64::from_be_bytes(b))
        }
        [JOURNAL, occ @ ..] if occ.len() == 4 => {
            let mut b = [0u8; 4];
            b.copy_from_slice(occ);
            KeyKind::Journal(u32::from_be_bytes(b))
        }
        _ => KeyKind::Other,
    };
    Some((id, kind))
}

/// What an entry is, in words (`header`, `item 3`, `state`), for raw listings.
pub fn entry_name(key: &[u8]) -> String {
    match parse_key(key) {
        Some((_, KeyKind::Header)) => "header".to_string(),
        Some((_, KeyKind::Item(seq))) => format!("item {seq}"),
        Some((_, KeyKind::State)) => "state".to_string(),
        Some((_, KeyKind::Journal(occ))) => format!("step {occ}"),
        _ => format!("unknown key {:02x?}", key),
    }
}
