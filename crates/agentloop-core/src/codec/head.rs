//! The record head of format 3 (issue 30, DESIGN S15c): the header envelope followed
//! by where the rest of the record is, so that a record is usually **one engine key**
//! and neither a write nor a load has to scan a key prefix.
//!
//! ```text
//! magic "ALCK" | format version (u16 LE) = 3 | header length (u32 LE) | header (MessagePack)
//! | status kind (u8) | version (u64 LE) | lease epoch (u64 LE)
//! | loose items (u64 LE) | lowest loose entry number (u64 LE) | highest (u64 LE)
//! | flags (u8: bit 0 the state is a loose entry, bit 1 an inline state follows)
//! | format 4 only: loose journal entries (u32 LE) | lowest occurrence (u32 LE) | highest (u32 LE)
//! | inline items (u32 LE) | per item: entry number (u64 LE), length (u32 LE), bytes
//! | when bit 1: state length (u32 LE), bytes
//! | format 4 only: inline journal entries (u32 LE) | per entry: occurrence (u32 LE), length (u32 LE), bytes
//! ```
//!
//! Format 4 (issue 32) is format 3 with a journal of durable steps (S1b). Journal
//! entries live inline in the head while the inline payload fits [`INLINE_LIMIT`] (so
//! a step's write is one key, as a push's usually is), else as loose entries `<id> 0x00
//! 'j' <occurrence: u32 BE>`, which the head counts with their bounds. A head is
//! written in format 4 only while its record holds journal entries, so a record without
//! any still reads in a build that knows format 3 only; one with entries is refused
//! there (that build would run the journaled steps again).
//!
//! *Inline* items and state live in the head itself; *loose* ones are entries of their
//! own under the format-2 keys (`<id> 0x00 'i' <n>`, `<id> 0x00 's'`), all loose item
//! entries within `[lowest, highest]` (`table.rs` keeps those bounds and the count). A
//! whole-record write puts everything inline (one key) unless it is larger than
//! [`INLINE_LIMIT`]; an incremental write (a push) adds a loose entry and rewrites the
//! head, which carries at most [`INLINE_LIMIT`] bytes of inline payload, so a push costs
//! the same whatever the backlog. A format-2 head has no layout: its record is every
//! entry under its prefix (found by a scan, and converted on its first write).
//!
//! The status kind, version and lease epoch are repeated in binary after the header
//! (written from the same header, so they agree): a write checks its condition and its
//! fencing token with [`peek`], without decoding the MessagePack header it replaces
//! (whose bytes still pass the structural check of `check.rs`, so a damaged header is
//! still refused by a conditional write, S18).
//!
//! An older build refuses a format-3 head ("unknown format version 3 … a newer agentloop
//! wrote it"): it never misreads one. This module only encodes and decodes; it must not
//! touch a table.

use crate::codec::{self, check, payload, HEADER_LIMIT};
use crate::header::{Payload, RecordHeader};
use crate::status::StatusKind;
use crate::store_error::StoreError;

/// The format that has a layout: what this build writes for a record without journal
/// entries.
pub const FORMAT3: u16 = 3;
/// Format 3 with a journal of durable steps: what this build writes for a record with
/// journal entries.
pub const FORMAT4: u16 = 4;

/// Inline payload (items and state) a head carries at most, in bytes: beyond it a
/// write keeps items and the state as loose entries, so rewriting the head stays cheap.
pub const INLINE_LIMIT: usize = 16 << 10;

/// Where a record's loose entries are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// How many loose item entries exist.
    pub loose_items: u64,
    /// Every loose item entry's number is at least this (when `loose_items > 0`).
    pub lo: u64,
    /// Every loose item entry's number is at most this (when `loose_items > 0`).
    pub hi: u64,
    /// The state is a loose entry.
    pub loose_state: bool,
    /// How many journal entries exist (format 4).
    pub journal_entries: u32,
    /// Every journal entry's occurrence is at least this (when there are entries).
    pub journal_lo: u32,
    /// Every journal entry's occurrence is at most this (when there are entries).
    pub journal_hi: u32,
}

impl Layout {
    /// Whether a loose item entry numbered `seq` may exist.
    pub fn may_hold(&self, seq: u64) -> bool {
        self.loose_items > 0 && self.lo <= seq && seq <= self.hi
    }

    /// Counts a new loose item entry.
    pub fn add(&mut self, seq: u64) {
        if self.loose_items == 0 {
            (self.lo, self.hi) = (seq, seq);
        } else {
            self.lo = self.lo.min(seq);
            self.hi = self.hi.max(seq);
        }
        self.loose_items += 1;
    }

    /// Whether a journal entry at `occurrence` may exist.
    pub fn may_hold_step(&self, occurrence: u32) -> bool {
        self.journal_entries > 0 && self.journal_lo <= occurrence && occurrence <= self.journal_hi
    }

    /// Counts a new journal entry.
    pub fn add_step(&mut self, occurrence: u32) {
        if self.journal_entries == 0 {
            (self.journal_lo, self.journal_hi) = (occurrence, occurrence);
        } else {
            self.journal_lo = self.journal_lo.min(occurrence);
            self.journal_hi = self.journal_hi.max(occurrence);
        }
        self.journal_entries += 1;
    }

    /// Uncounts a removed journal entry (the bounds stay wide until the last goes:
    /// a read walks at most the turn's steps).
    pub fn remove_step(&mut self) {
        self.journal_entries = self.journal_entries.saturating_sub(1);
        if self.journal_entries == 0 {
            (self.journal_lo, self.journal_hi) = (0, 0);
        }
    }

    /// The head's format given its inline journal entries: 4 while journal entries
    /// exist (loose or inline), else 3.
    pub fn format(&self, inline_journal: usize) -> u16 {
        if self.journal_entries > 0 || inline_journal > 0 {
            FORMAT4
        } else {
            FORMAT3
        }
    }

    /// Uncounts a removed loose item entry. The bounds narrow when an end goes (items
    /// are mostly delivered in entry order), so a read's range does not walk over the
    /// removed entries of delivered items.
    pub fn remove(&mut self, seq: u64) {
        self.loose_items = self.loose_items.saturating_sub(1);
        if self.loose_items == 0 {
            (self.lo, self.hi) = (0, 0);
        } else if seq == self.lo {
            self.lo = seq.saturating_add(1);
        } else if seq == self.hi {
            self.hi = seq.saturating_sub(1);
        }
    }
}

/// A decoded head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// The header.
    pub header: RecordHeader,
    /// Where the loose entries are; `None` for a format-2 head (every entry is loose
    /// and unknown until scanned).
    pub layout: Option<Layout>,
    /// Inline items, ascending by entry number.
    pub items: Vec<(u64, Payload)>,
    /// The inline state.
    pub state: Option<Payload>,
    /// Inline journal entries (format 4), ascending by occurrence.
    pub journal: Vec<(u32, Payload)>,
}

impl Head {
    /// Bytes of inline payload.
    pub fn inline_bytes(&self) -> usize {
        self.items.iter().map(|(_, b)| b.len()).sum::<usize>()
            + self.state.as_ref().map_or(0, |s| s.len())
            + self.journal.iter().map(|(_, b)| b.len()).sum::<usize>()
    }
}

/// The fields a write checks, kept in binary beside the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The status kind.
    pub kind: StatusKind,
    /// The stored version.
    pub version: u64,
    /// The stored lease epoch.
    pub lease_epoch: u64,
}

impl Summary {
    fn of(h: &RecordHeader) -> Self {
        Summary {
            kind: h.status.kind(),
            version: h.version,
            lease_epoch: h.lease_epoch,
        }
    }
}

fn kind_byte(k: StatusKind) -> u8 {
    match k {
        StatusKind::Running => 0,
        StatusKind::Stopped => 1,
        StatusKind::Interrupted => 2,
        StatusKind::Completed => 3,
        StatusKind::Canceled => 4,
        StatusKind::Failed => 5,
    }
}

fn kind_of(b: u8) -> Option<StatusKind> {
    Some(match b {
        0 => StatusKind::Running,
        1 => StatusKind::Stopped,
        2 => StatusKind::Interrupted,
        3 => StatusKind::Completed,
        4 => StatusKind::Canceled,
        5 => StatusKind::Failed,
        _ => return None,
    })
}

/// Encodes a head without inline journal entries (format 3, or 4 with loose ones).
pub fn encode(
    header: &RecordHeader,
    layout: Layout,
    items: &[(u64, Payload)],
    state: Option<&Payload>,
) -> Result<Vec<u8>, StoreError> {
    encode_with(header, layout, items, state, &[])
}

/// Encodes a head with inline journal entries `journal` (ascending by occurrence):
/// format 4 when there are journal entries, else 3.
pub fn encode_with(
    header: &RecordHeader,
    layout: Layout,
    items: &[(u64, Payload)],
    state: Option<&Payload>,
    journal: &[(u32, Payload)],
) -> Result<Vec<u8>, StoreError> {
    let inline: usize = items.iter().map(|(_, b)| 12 + b.len()).sum::<usize>()
        + state.map_or(0, |s| 4 + s.len())
        + journal.iter().map(|(_, b)| 8 + b.len()).sum::<usize>();
    let mut out = Vec::with_capacity(codec::ENVELOPE + 512 + 46 + inline);
    out.extend_from_slice(&codec::MAGIC);
    let format = layout.format(journal.len());
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    // The header straight into the head (no intermediate buffer); a failure is said
    // by the payload encoder, which names the field.
    if rmp_serde::encode::write_named(&mut out, header).is_err() {
        return Err(match payload::encode(header) {
            Err(e) => StoreError::Encode {
                session: header.session_id.clone(),
                reason: e.to_string(),
            },
            Ok(_) => StoreError::Encode {
                session: header.session_id.clone(),
                reason: "the record header does not encode".into(),
            },
        });
    }
    let len = out.len() - codec::ENVELOPE;
    if len > HEADER_LIMIT {
        return Err(StoreError::Encode {
            session: header.session_id.clone(),
            reason: format!(
                "the record header is {len} bytes; the limit is {HEADER_LIMIT}: a turn consumes \
                 too many items"
            ),
        });
    }
    out[6..10].copy_from_slice(&(len as u32).to_le_bytes());
    let summary = Summary::of(header);
    out.push(kind_byte(summary.kind));
    out.extend_from_slice(&summary.version.to_le_bytes());
    out.extend_from_slice(&summary.lease_epoch.to_le_bytes());
    out.extend_from_slice(&layout.loose_items.to_le_bytes());
    out.extend_from_slice(&layout.lo.to_le_bytes());
    out.extend_from_slice(&layout.hi.to_le_bytes());
    let flags = u8::from(layout.loose_state) | (u8::from(state.is_some()) << 1);
    out.push(flags);
    if format == FORMAT4 {
        out.extend_from_slice(&layout.journal_entries.to_le_bytes());
        out.extend_from_slice(&layout.journal_lo.to_le_bytes());
        out.extend_from_slice(&layout.journal_hi.to_le_bytes());
    }
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for (seq, bytes) in items {
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    if let Some(s) = state {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
    }
    if format == FORMAT4 {
        out.extend_from_slice(&(journal.len() as u32).to_le_bytes());
        for (occ, bytes) in journal {
            out.extend_from_slice(&occ.to_le_bytes());
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }
    Ok(out)
}

/// A cursor over a head's layout section; every read is bounds-checked.
struct Cursor<'b> {
    bytes: &'b [u8],
    session: &'b str,
}

impl<'b> Cursor<'b> {
    fn corrupt(&self, what: &str) -> StoreError {
        StoreError::Corrupt {
            session: self.session.to_string(),
            reason: format!("the record head is truncated or damaged: {what}"),
        }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'b [u8], StoreError> {
        if self.bytes.len() < n {
            return Err(self.corrupt(what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u64(&mut self, what: &str) -> Result<u64, StoreError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn u32(&mut self, what: &str) -> Result<u32, StoreError> {
        let b = self.take(4, what)?;
        let mut a = [0u8; 4];
        a.copy_from_slice(b);
        Ok(u32::from_le_bytes(a))
    }
    fn u8(&mut self, what: &str) -> Result<u8, StoreError> {
        Ok(self.take(1, what)?[0])
    }
}

/// What a write needs of a stored head: its summary, layout and inline payload,
/// without the MessagePack header decoded (formats 3 and 4; a format-2 head's header
/// is decoded for its summary).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peek {
    /// Status kind, version, lease epoch.
    pub summary: Summary,
    /// Where the loose entries are; `None` for format 2.
    pub layout: Option<Layout>,
    /// Inline items, ascending by entry number.
    pub items: Vec<(u64, Payload)>,
    /// The inline state.
    pub state: Option<Payload>,
    /// Inline journal entries, ascending by occurrence.
    pub journal: Vec<(u32, Payload)>,
}

/// Reads what a write needs of a head (format 3 or 2) stored under `session`; bad
/// bytes are `Corrupt`, never a panic. The header's MessagePack is checked
/// structurally, not decoded (format 3).
pub fn peek(session: &str, bytes: &[u8]) -> Result<Peek, StoreError> {
    peek_with(session, bytes, true)
}

/// [`peek`], leaving out the inline items and state when `payload` is false (a write
/// that replaces the whole record does not need them): they are still checked, not
/// copied.
pub fn peek_with(session: &str, bytes: &[u8], payload: bool) -> Result<Peek, StoreError> {
    let (version, body, tail) = codec::split_envelope(session, bytes, HEADER_LIMIT)?;
    if version != FORMAT3 && version != FORMAT4 {
        let head = decode(session, bytes)?;
        return Ok(Peek {
            summary: Summary::of(&head.header),
            layout: head.layout,
            items: head.items,
            state: head.state,
            journal: head.journal,
        });
    }
    check::check(body).map_err(|e| StoreError::Corrupt {
        session: session.to_string(),
        reason: format!("the record header does not decode: {e}"),
    })?;
    let (summary, layout, items, state, journal) = parse_tail(session, version, tail, payload)?;
    Ok(Peek {
        summary,
        layout: Some(layout),
        items,
        state,
        journal,
    })
}

/// The binary part of a format-3 or format-4 head after its header.
type Tail = (
    Summary,
    Layout,
    Vec<(u64, Payload)>,
    Option<Payload>,
    Vec<(u32, Payload)>,
);

fn parse_tail(session: &str, version: u16, tail: &[u8], payload: bool) -> Result<Tail, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        session: session.to_string(),
        reason,
    };
    let mut c = Cursor {
        bytes: tail,
        session,
    };
    let kind = c.u8("the status kind")?;
    let kind = kind_of(kind).ok_or_else(|| corrupt(format!("unknown status kind {kind}")))?;
    let summary = Summary {
        kind,
        version: c.u64("the version")?,
        lease_epoch: c.u64("the lease epoch")?,
    };
    let loose_items = c.u64("the loose item count")?;
    let lo = c.u64("the lowest loose entry")?;
    let hi = c.u64("the highest loose entry")?;
    let flags = c.u8("the layout flags")?;
    if flags & !0b11 != 0 {
        return Err(corrupt(format!("unknown layout flags {flags:#04x}")));
    }
    if loose_items > 0 && lo > hi {
        return Err(corrupt(format!(
            "the loose entries' bounds are reversed ({lo} > {hi})"
        )));
    }
    let (journal_entries, journal_lo, journal_hi) = if version == FORMAT4 {
        let n = c.u32("the journal entry count")?;
        let jlo = c.u32("the lowest journal entry")?;
        let jhi = c.u32("the highest journal entry")?;
        if n > 0 && jlo > jhi {
            return Err(corrupt(format!(
                "a format-4 head announces {n} journal entries between {jlo} and {jhi}"
            )));
        }
        (n, jlo, jhi)
    } else {
        (0, 0, 0)
    };
    let count = c.u32("the inline item count")? as usize;
    // Each inline item takes at least 12 bytes: a count beyond what follows is damage,
    // refused before anything is allocated for it.
    if count > c.bytes.len() / 12 {
        return Err(corrupt(format!(
            "{count} inline items announced in {} bytes",
            c.bytes.len()
        )));
    }
    let mut items: Vec<(u64, Payload)> = Vec::with_capacity(if payload { count } else { 0 });
    let mut last: Option<u64> = None;
    for _ in 0..count {
        let seq = c.u64("an inline item's entry number")?;
        let len = c.u32("an inline item's length")? as usize;
        let bytes = c.take(len, "an inline item")?;
        if last.is_some_and(|last| last >= seq) {
            return Err(corrupt(format!(
                "inline items out of entry order at entry {seq}"
            )));
        }
        last = Some(seq);
        if payload {
            items.push((seq, Payload::from(bytes)));
        }
    }
    let state = if flags & 0b10 != 0 {
        let len = c.u32("the inline state's length")? as usize;
        let bytes = c.take(len, "the inline state")?;
        payload.then(|| Payload::from(bytes))
    } else {
        None
    };
    let mut journal = Vec::new();
    if version == FORMAT4 {
        let count = c.u32("the inline journal entry count")? as usize;
        if count > c.bytes.len() / 8 {
            return Err(corrupt(format!(
                "{count} inline journal entries announced in {} bytes",
                c.bytes.len()
            )));
        }
        if count == 0 && journal_entries == 0 {
            return Err(corrupt(
                "a format-4 head holds no journal entry, inline or loose".into(),
            ));
        }
        let mut last: Option<u32> = None;
        for _ in 0..count {
            let occ = c.u32("an inline journal entry's occurrence")?;
            let len = c.u32("an inline journal entry's length")? as usize;
            let bytes = c.take(len, "an inline journal entry")?;
            if last.is_some_and(|last| last >= occ) {
                return Err(corrupt(format!(
                    "inline journal entries out of order at step {occ}"
                )));
            }
            last = Some(occ);
            if payload {
                journal.push((occ, Payload::from(bytes)));
            }
        }
    }
    if !c.bytes.is_empty() {
        return Err(corrupt(format!(
            "{} bytes after the record head's end (truncated or padded)",
            c.bytes.len()
        )));
    }
    let loose_state = flags & 0b01 != 0;
    if loose_state && flags & 0b10 != 0 {
        return Err(corrupt(
            "the head holds a state and says the state is a loose entry".into(),
        ));
    }
    let layout = Layout {
        loose_items,
        lo,
        hi,
        loose_state,
        journal_entries,
        journal_lo,
        journal_hi,
    };
    Ok((summary, layout, items, state, journal))
}

/// Decodes a head of format 4, 3 or 2 stored under `session`; bad bytes are
/// `Corrupt`, never a panic.
pub fn decode(session: &str, bytes: &[u8]) -> Result<Head, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        session: session.to_string(),
        reason,
    };
    let (version, body, tail) = codec::split_envelope(session, bytes, HEADER_LIMIT)?;
    if version != FORMAT4 && version != FORMAT3 && version != codec::FORMAT2 {
        return Err(corrupt(format!(
            "a format-{version} envelope is stored where a record header belongs"
        )));
    }
    if version == codec::FORMAT2 && !tail.is_empty() {
        return Err(corrupt(format!(
            "payload is {} bytes but the envelope says {} (truncated or padded)",
            body.len() + tail.len(),
            body.len()
        )));
    }
    let header: RecordHeader = payload::decode(body)
        .map_err(|e| corrupt(format!("the record header does not decode: {e}")))?;
    if header.session_id != session {
        return Err(corrupt(format!(
            "record names session `{}` but is stored under `{session}`",
            header.session_id
        )));
    }
    let tail = match version {
        FORMAT3 | FORMAT4 => Some(parse_tail(session, version, tail, true)?),
        _ => None,
    };
    Ok(match tail {
        None => Head {
            header,
            layout: None,
            items: Vec::new(),
            state: None,
            journal: Vec::new(),
        },
        Some((_, layout, items, state, journal)) => Head {
            header,
            layout: Some(layout),
            items,
            state,
            journal,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(id: &str) -> RecordHeader {
        RecordHeader {
            session_id: id.into(),
            agent_kind: "sim".into(),
            turn_index: 7,
            cut: vec![3],
            next_seq: 9,
            ..RecordHeader::default()
        }
    }

    proptest! {
        /// S15: a head round-trips with any inline items, state and layout, and every
        /// truncation of it is Corrupt, never a panic or a misread.
        #[test]
        fn s15_a_format3_head_round_trips_and_truncations_are_corrupt(
            items in proptest::collection::btree_map(any::<u64>(), proptest::collection::vec(any::<u8>(), 0..40), 0..5),
            state in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..60)),
            (loose_items, a, b, loose_state) in (any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>()),
        ) {
            let h = header("s-1");
            let loose_state = loose_state && state.is_none();
            let layout = Layout { loose_items, lo: a.min(b), hi: a.max(b), loose_state, ..Layout::default() };
            let items: Vec<(u64, Payload)> = items.into_iter().map(|(k, v)| (k, Payload::from(v))).collect();
            let state = state.map(Payload::from);
            let bytes = encode(&h, layout, &items, state.as_ref()).unwrap();
            let back = decode("s-1", &bytes).unwrap();
            prop_assert_eq!(&back.header, &h);
            prop_assert_eq!(back.layout, Some(layout));
            prop_assert_eq!(&back.items, &items);
            prop_assert_eq!(&back.state, &state);
            let peeked = peek("s-1", &bytes).unwrap();
            prop_assert_eq!(peeked.summary, Summary { kind: StatusKind::Stopped, version: 0, lease_epoch: 0 });
            prop_assert_eq!(peeked.layout, Some(layout));
            prop_assert_eq!(&peeked.items, &items);
            let bare = peek_with("s-1", &bytes, false).unwrap();
            prop_assert_eq!((bare.summary, bare.layout), (peeked.summary, peeked.layout));
            prop_assert!(bare.items.is_empty() && bare.state.is_none());
            for cut in 0..bytes.len() {
                let peek_corrupt = matches!(peek("s-1", &bytes[..cut]), Err(StoreError::Corrupt { .. }));
                prop_assert!(peek_corrupt, "peek cut {}", cut);
                let bare_corrupt = matches!(peek_with("s-1", &bytes[..cut], false), Err(StoreError::Corrupt { .. }));
                prop_assert!(bare_corrupt, "bare peek cut {}", cut);
                let corrupt = matches!(decode("s-1", &bytes[..cut]), Err(StoreError::Corrupt { .. }));
                prop_assert!(corrupt, "cut {}", cut);
            }
            let mut padded = bytes.clone();
            padded.push(0);
            let padded_is_corrupt = matches!(decode("s-1", &padded), Err(StoreError::Corrupt { .. }));
            prop_assert!(padded_is_corrupt);
        }
    }

    /// S15: a format-2 header still decodes, as a head without a layout (its entries
    /// are found by a scan).
    #[test]
    fn s15_a_format2_header_decodes_without_a_layout() {
        let h = header("old");
        let bytes = codec::encode_format2_header(&h).unwrap();
        let head = decode("old", &bytes).unwrap();
        assert_eq!(head.header, h);
        assert_eq!(head.layout, None);
        assert!(head.items.is_empty() && head.state.is_none());
        assert_eq!(codec::decode_header("old", &bytes).unwrap(), h);
    }

    /// Issue 32 (4): a head with journal entries is format 4 and round-trips its
    /// journal layout; every truncation is Corrupt; a format-4 head that announces no
    /// entries is damage; a build that reads format 3 only (simulated by the version
    /// check of `split_envelope` one format back) refuses it as newer.
    #[test]
    fn s1b_a_head_with_journal_entries_is_format4() {
        let layout = Layout {
            journal_entries: 2,
            journal_lo: 3,
            journal_hi: 9,
            ..Layout::default()
        };
        let bytes = encode(&header("j"), layout, &[(1, Payload::from(&b"x"[..]))], None).unwrap();
        assert_eq!(bytes[4..6], FORMAT4.to_le_bytes());
        let back = decode("j", &bytes).unwrap();
        assert_eq!(back.layout, Some(layout));
        assert_eq!(peek("j", &bytes).unwrap().layout, Some(layout));
        for cut in 0..bytes.len() {
            assert!(
                matches!(decode("j", &bytes[..cut]), Err(StoreError::Corrupt { .. })),
                "cut {cut}"
            );
        }
        let plain = encode(&header("j"), Layout::default(), &[], None).unwrap();
        assert_eq!(plain[4..6], FORMAT3.to_le_bytes(), "no journal: format 3");
        // A format-4 head whose journal sections hold no entry at all.
        let mut zero = encode(&header("j"), layout, &[], None).unwrap();
        let at = zero.len() - 4 - 4 - 12;
        zero[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
        let e = decode("j", &zero).unwrap_err().to_string();
        assert!(e.contains("holds no journal entry"), "{e}");
        // Inline journal entries round-trip (a step's write is one key).
        let inline = vec![
            (2, Payload::from(&b"r2"[..])),
            (5, Payload::from(&b"r5"[..])),
        ];
        let bytes = encode_with(&header("j"), Layout::default(), &[], None, &inline).unwrap();
        assert_eq!(bytes[4..6], FORMAT4.to_le_bytes());
        let back = decode("j", &bytes).unwrap();
        assert_eq!(back.journal, inline);
        assert_eq!(peek("j", &bytes).unwrap().journal, inline);
        for cut in 0..bytes.len() {
            assert!(
                matches!(decode("j", &bytes[..cut]), Err(StoreError::Corrupt { .. })),
                "cut {cut}"
            );
        }
        // The previous build's check: it read 3 and older, so 4 is newer to it.
        let mut five = bytes.clone();
        five[4..6].copy_from_slice(&(FORMAT4 + 1).to_le_bytes());
        let e = decode("j", &five).unwrap_err().to_string();
        assert!(e.contains("a newer agentloop wrote it"), "{e}");
    }

    /// An announced inline count beyond the bytes that follow is refused before any
    /// allocation.
    #[test]
    fn a_huge_inline_count_is_corrupt() {
        let mut bytes = encode(&header("s"), Layout::default(), &[], None).unwrap();
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = decode("s", &bytes).unwrap_err().to_string();
        assert!(e.contains("inline items announced"), "{e}");
    }

    #[test]
    fn layout_bounds_follow_adds_and_in_order_removals() {
        let mut l = Layout::default();
        assert!(!l.may_hold(0));
        for s in 5..10 {
            l.add(s);
        }
        assert_eq!((l.loose_items, l.lo, l.hi), (5, 5, 9));
        l.remove(5);
        l.remove(6);
        assert_eq!((l.loose_items, l.lo, l.hi), (3, 7, 9));
        assert!(!l.may_hold(6) && l.may_hold(8));
        l.remove(9);
        assert_eq!((l.lo, l.hi), (7, 8));
        l.remove(8);
        l.remove(7);
        assert_eq!(l, Layout::default());
    }
}
