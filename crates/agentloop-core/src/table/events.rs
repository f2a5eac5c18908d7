//! How a session's kept events (S20a, issue 33) are laid out in the table, appended,
//! trimmed, read and removed. Every engine runs this code over its own table, like the
//! record layout in `super`; what to keep and how numbers are given is decided in
//! [`crate::event_log`], and nothing here knows an event's type: a kept event is its
//! number, its time and its body (the runtime's encoding, JSON).
//!
//! Keys (apart from a session's record keys, like the checkpoint history, so a load or
//! a listing of records never reads them):
//!
//! ```text
//! 0x02 <id> 0x00 0xff <reserved: u64 BE>                                   the reserved mark
//! 0x02 <id> 0x00 <first: u64 BE> <last: u64 BE> <at: u64 BE> <n: u32 BE>   a page
//! ```
//!
//! A page holds the events of one append (one group commit), ascending; its key names
//! its first and last number, its newest event's time and how many events it holds, and
//! the reserved mark is a key with no value, so trimming, finding where to start a
//! replay and reading the mark read keys only (PostgreSQL leaves these values unread
//! in a write's transaction).

use crate::event_log::Retention;
use crate::header::Payload;
use crate::store_error::StoreError;
use crate::table::kv::Table;

/// The first byte of every kept-event key.
pub const EVENTS_MARK: u8 = 0x02;

/// One kept event: its number, when it was kept and its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptEvent {
    /// The event's number in its session's sequence.
    pub seq: u64,
    /// When it was emitted, ms since the Unix epoch.
    pub at_ms: u64,
    /// The event, as the runtime encoded it (JSON).
    pub body: Vec<u8>,
}

/// A page of events as a session builds it: each event's body encoded straight into
/// one buffer (`push_with`), so keeping an event costs no allocation of its own; sealed
/// (compressed) when it is written.
///
/// Layout of the buffer, per event: the number after the page's first (LEB128), the
/// time after the page's first event's (LEB128), the body's length (u32 LE), the body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageBuilder {
    first: u64,
    last: u64,
    count: u32,
    first_at: u64,
    newest_at: u64,
    buf: Vec<u8>,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

impl PageBuilder {
    /// Whether it holds no event.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How many events it holds.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Adds event `seq` (numbers ascending) emitted at `at_ms`, its body written by
    /// `encode` into the page's buffer. An event that does not encode is left out
    /// (the error is returned; the page is as before).
    pub fn push_with(
        &mut self,
        seq: u64,
        at_ms: u64,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
    ) -> Result<(), String> {
        if self.count == 0 {
            self.first = seq;
            self.first_at = at_ms;
        }
        let mark = self.buf.len();
        put_varint(&mut self.buf, seq.saturating_sub(self.first));
        put_varint(&mut self.buf, at_ms.saturating_sub(self.first_at));
        let len_at = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        if let Err(e) = encode(&mut self.buf) {
            self.buf.truncate(mark);
            return Err(e);
        }
        let len = (self.buf.len() - len_at - 4) as u32;
        self.buf[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
        self.count += 1;
        self.last = seq;
        self.newest_at = self.newest_at.max(at_ms);
        Ok(())
    }

    /// The events it holds.
    pub fn events(&self) -> Vec<KeptEvent> {
        decode_buf(self.first, self.first_at, &self.buf).unwrap_or_default()
    }

    /// The page as written: its place and its value (compressed).
    pub fn seal(&self) -> Option<SealedPage> {
        if self.count == 0 {
            return None;
        }
        let mut value = Vec::with_capacity(self.buf.len() / 2 + 24);
        value.push(PAGE_FORMAT);
        value.extend_from_slice(&self.first.to_le_bytes());
        value.extend_from_slice(&self.first_at.to_le_bytes());
        value.extend_from_slice(&lz4_flex::block::compress_prepend_size(&self.buf));
        Some(SealedPage {
            info: PageInfo {
                first: self.first,
                last: self.last,
                at_ms: self.newest_at,
                count: self.count,
            },
            value,
        })
    }
}

/// The format byte of a page's value.
const PAGE_FORMAT: u8 = 1;

fn decode_buf(first: u64, first_at: u64, b: &[u8]) -> Option<Vec<KeptEvent>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let seq = first + get_varint(b, &mut at)?;
        let at_ms = first_at + get_varint(b, &mut at)?;
        let len = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize;
        at += 4;
        let body = b.get(at..at + len)?.to_vec();
        at += len;
        out.push(KeptEvent { seq, at_ms, body });
    }
    Some(out)
}

/// A page's events from its stored value.
fn decode_page(id: &str, value: &[u8]) -> Result<Vec<KeptEvent>, StoreError> {
    let bad = |why: &str| corrupt(id, format!("a page of kept events {why}"));
    if value.first() != Some(&PAGE_FORMAT) || value.len() < 17 {
        return Err(bad("has an unknown format (written by a later version?)"));
    }
    let u = |i: usize| u64::from_le_bytes(value[i..i + 8].try_into().unwrap_or([0; 8]));
    let (first, first_at) = (u(1), u(9));
    let buf = lz4_flex::block::decompress_size_prepended(&value[17..])
        .map_err(|e| bad(&format!("does not decompress: {e}")))?;
    decode_buf(first, first_at, &buf).ok_or_else(|| bad("is truncated"))
}

/// A page ready to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedPage {
    /// Its place (its key).
    pub info: PageInfo,
    /// Its value.
    pub value: Vec<u8>,
}

/// What one append writes: a page of events (maybe none), a new reserved mark, and
/// the retention to trim by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventAppend {
    /// The events, ascending by number ([`PageBuilder::seal`]).
    pub page: Option<SealedPage>,
    /// The new reserved mark: numbers up to it may be handed out before they are kept
    /// (0: unchanged). Set as given: the session raises it ahead of its numbers and
    /// lowers it once, to its `Ended`'s number, with its last append.
    pub reserved: u64,
    /// The session's first append of a new life (no record was loaded): what a
    /// previous session of this id kept is removed first.
    pub fresh: bool,
    /// What to keep after this append (`None`: no trim this time). By count, the
    /// pages wholly older than the newest `count` numbers go (a read of their keys
    /// only); by age (when `trim_age`), every page older than the age (a read of every
    /// page key of the session, so a session asks for it rarely).
    pub retention: Option<Retention>,
    /// Also trim by age this time.
    pub trim_age: bool,
    /// The writer's clock, ms since the Unix epoch (for the age of events).
    pub now_ms: u64,
}

/// What a read of kept events answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeptEvents {
    /// The kept events numbered after the asked number, ascending.
    pub events: Vec<KeptEvent>,
    /// The highest number kept (0: none).
    pub last: u64,
    /// The stored reserved mark (0: none).
    pub reserved: u64,
}

/// The place of one page, from its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageInfo {
    /// Its first event's number.
    pub first: u64,
    /// Its last event's number.
    pub last: u64,
    /// Its newest event's time.
    pub at_ms: u64,
    /// How many events it holds.
    pub count: u32,
}

/// The tag of the reserved mark's key.
const RESERVED_TAG: u8 = 0xff;

/// The key of the reserved mark.
fn reserved_key(id: &str, reserved: u64) -> Vec<u8> {
    let mut k = events_prefix(id);
    k.push(RESERVED_TAG);
    k.extend_from_slice(&reserved.to_be_bytes());
    k
}

/// The prefix of every kept-event key of `id`.
pub fn events_prefix(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 30);
    k.push(EVENTS_MARK);
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k
}

/// The key of a page.
pub fn page_key(id: &str, p: PageInfo) -> Vec<u8> {
    let mut k = events_prefix(id);
    k.extend_from_slice(&p.first.to_be_bytes());
    k.extend_from_slice(&p.last.to_be_bytes());
    k.extend_from_slice(&p.at_ms.to_be_bytes());
    k.extend_from_slice(&p.count.to_be_bytes());
    k
}

/// A page's place from its key (`None` for the mark's key or a key of another shape).
pub fn parse_page_key(key: &[u8], prefix_len: usize) -> Option<PageInfo> {
    let rest = key.get(prefix_len..)?;
    if rest.len() != 28 || rest[0] == RESERVED_TAG {
        return None;
    }
    let u = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&rest[i..i + 8]);
        u64::from_be_bytes(b)
    };
    let mut n = [0u8; 4];
    n.copy_from_slice(&rest[24..28]);
    Some(PageInfo {
        first: u(0),
        last: u(8),
        at_ms: u(16),
        count: u32::from_be_bytes(n),
    })
}

fn corrupt(id: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        session: id.to_string(),
        reason,
    }
}

/// The pages of `id`, ascending, and the stored reserved mark with its key.
type Pages = (Vec<(Vec<u8>, PageInfo)>, Option<(Vec<u8>, u64)>);

fn pages(t: &impl Table, id: &str) -> Result<Pages, StoreError> {
    let prefix = events_prefix(id);
    let mut out = Vec::new();
    let mut reserved = None;
    for k in t.keys_with_prefix(&prefix)? {
        match &k[prefix.len()..] {
            [RESERVED_TAG, mark @ ..] if mark.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(mark);
                reserved = Some((k.clone(), u64::from_be_bytes(b)));
            }
            _ => {
                if let Some(p) = parse_page_key(&k, prefix.len()) {
                    out.push((k, p));
                }
            }
        }
    }
    Ok((out, reserved))
}

/// The stored reserved mark of `id` and its key, read by the mark's own prefix (keys
/// only: one key).
fn stored_mark(t: &impl Table, id: &str) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
    let mut prefix = events_prefix(id);
    let at = prefix.len() + 1;
    prefix.push(RESERVED_TAG);
    Ok(t.keys_with_prefix(&prefix)?.into_iter().find_map(|k| {
        let b: [u8; 8] = k.get(at..)?.try_into().ok()?;
        Some((k, u64::from_be_bytes(b)))
    }))
}

/// Appends events of `id` and trims by the append's retention (S20a). `epoch` is the
/// writer's fencing token: refused with [`StoreError::Fenced`] when the session's
/// record names a later owner, with nothing written; as for a write (S37), the owner
/// a cancel by id fenced may still append over its `Canceled` record (the events it
/// numbered before and while it stops). Without a record (a session not written yet,
/// or whose record a clean exit removed) the append is taken.
pub fn append_events(
    t: &mut impl Table,
    id: &str,
    epoch: u64,
    append: EventAppend,
) -> Result<(), StoreError> {
    super::check_id(id)?;
    if let Some(bytes) = t.get(&super::header_key(id))? {
        let summary = crate::codec::head::peek_with(id, &bytes, false)?.summary;
        let stored = summary.lease_epoch;
        let canceled_owner =
            summary.kind == crate::status::StatusKind::Canceled && epoch + 1 == stored;
        if epoch < stored && !canceled_owner {
            return Err(StoreError::Fenced {
                session: id.to_string(),
                held: epoch,
                current: stored,
            });
        }
    }
    if append.fresh {
        remove_all(t, id)?;
    }
    // A new mark reads its own key (it sorts after every page's: its tag is 0xff).
    let reserved = match (append.fresh, append.reserved > 0) {
        (false, true) => stored_mark(t, id)?,
        _ => None,
    };
    if append.reserved > 0 && Some(append.reserved) != reserved.as_ref().map(|r| r.1) {
        if let Some((old, _)) = reserved {
            t.remove(old);
        }
        t.put(reserved_key(id, append.reserved), Payload::from(Vec::new()));
    }
    let newest = append.page.as_ref().map(|p| p.info.last);
    if let Some(page) = append.page {
        t.put(page_key(id, page.info), Payload::from(page.value));
    }
    let Some(retention) = append.retention else {
        return Ok(());
    };
    let prefix_len = events_prefix(id).len();
    // By count: the pages that start before the newest `count` numbers, read by range.
    if let Some(newest) = newest {
        let cutoff = newest.saturating_sub(retention.count);
        if cutoff > 0 {
            let from = page_key(
                id,
                PageInfo {
                    first: 0,
                    last: 0,
                    at_ms: 0,
                    count: 0,
                },
            );
            let to = page_key(
                id,
                PageInfo {
                    first: cutoff,
                    last: 0,
                    at_ms: 0,
                    count: 0,
                },
            );
            for k in t.keys_in_range(&from, &to)? {
                if parse_page_key(&k, prefix_len).is_some_and(|p| p.last <= cutoff) {
                    t.remove(k);
                }
            }
        }
    }
    // By age: every page whose newest event is older than the age.
    if let (true, Some(age)) = (append.trim_age, retention.max_age_ms) {
        let (pages, _) = pages(t, id)?;
        for (k, p) in pages {
            if append.now_ms.saturating_sub(p.at_ms) > age {
                t.remove(k);
            }
        }
    }
    Ok(())
}

/// The kept events of `id` numbered after `after`, ascending: whole pages, until
/// their bodies come to at least `max` bytes (a replay reads about a megabyte at a
/// time, never all a session keeps at once: issue 52; `usize::MAX`: all of them).
/// `last` and `reserved` are the session's whatever `max`.
pub fn read_events(
    t: &impl Table,
    id: &str,
    after: u64,
    max: usize,
) -> Result<KeptEvents, StoreError> {
    super::check_id(id)?;
    let (pages, reserved) = pages(t, id)?;
    let mut out = KeptEvents {
        reserved: reserved.map_or(0, |r| r.1),
        last: pages.last().map_or(0, |(_, p)| p.last),
        events: Vec::new(),
    };
    let mut read = 0usize;
    for (k, _) in pages.iter().filter(|(_, p)| p.last > after) {
        if read >= max {
            break;
        }
        let Some(bytes) = t.get(k)? else { continue };
        let events = decode_page(id, &bytes)?;
        for e in events.into_iter().filter(|e| e.seq > after) {
            read = read.saturating_add(e.body.len().max(1));
            out.events.push(e);
        }
    }
    Ok(out)
}

/// Removes every kept event of `id` and its reserved mark; how many pages there were.
pub fn remove_all(t: &mut impl Table, id: &str) -> Result<usize, StoreError> {
    let keys = t.keys_with_prefix(&events_prefix(id))?;
    let n = keys.len();
    for k in keys {
        t.remove(k);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::table::kv::tests_support::MapTable as Map;

    fn ev(seq: u64, at_ms: u64) -> KeptEvent {
        KeptEvent {
            seq,
            at_ms,
            body: format!("{{\"n\":{seq}}}").into_bytes(),
        }
    }

    fn append(events: Vec<KeptEvent>, count: u64, now_ms: u64) -> EventAppend {
        let mut page = PageBuilder::default();
        for e in events {
            page.push_with(e.seq, e.at_ms, |w| {
                w.extend_from_slice(&e.body);
                Ok(())
            })
            .unwrap();
        }
        EventAppend {
            page: page.seal(),
            reserved: 0,
            fresh: false,
            retention: Some(Retention {
                count,
                max_age_ms: Some(1_000),
            }),
            trim_age: true,
            now_ms,
        }
    }

    #[test]
    fn events_are_appended_read_after_a_number_and_trimmed() {
        let mut t = Map::default();
        append_events(&mut t, "s", 0, append(vec![ev(1, 10), ev(2, 10)], 10, 10)).unwrap();
        append_events(&mut t, "s", 0, append(vec![ev(4, 20)], 10, 20)).unwrap();
        let r = read_events(&t, "s", 1, usize::MAX).unwrap();
        assert_eq!(
            r.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![2, 4]
        );
        assert_eq!(r.last, 4);
        assert_eq!(r.events[1].body, b"{\"n\":4}".to_vec());
        // The count: the oldest page goes once the newer ones hold enough.
        append_events(&mut t, "s", 0, append(vec![ev(5, 30), ev(6, 30)], 3, 30)).unwrap();
        let r = read_events(&t, "s", 0, usize::MAX).unwrap();
        assert_eq!(
            r.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![4, 5, 6]
        );
        // The age: everything older than a second at the next append.
        append_events(&mut t, "s", 0, append(vec![ev(7, 1_500)], 100, 1_500)).unwrap();
        let r = read_events(&t, "s", 0, usize::MAX).unwrap();
        assert_eq!(r.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![7]);
    }

    #[test]
    fn the_reserved_mark_is_set_as_asked_and_a_fresh_life_starts_empty() {
        let mut t = Map::default();
        let mut a = append(vec![ev(1, 1)], 10, 1);
        a.reserved = 100;
        append_events(&mut t, "s", 0, a).unwrap();
        let mut a = append(vec![], 10, 1);
        a.reserved = 50;
        append_events(&mut t, "s", 0, a).unwrap();
        assert_eq!(
            read_events(&t, "s", 0, usize::MAX).unwrap().reserved,
            50,
            "lowered at the end"
        );
        let mut a = append(vec![ev(1, 2)], 10, 2);
        a.fresh = true;
        append_events(&mut t, "s", 0, a).unwrap();
        let r = read_events(&t, "s", 0, usize::MAX).unwrap();
        assert_eq!((r.reserved, r.events.len()), (0, 1));
        assert_eq!(remove_all(&mut t, "s").unwrap(), 1, "the page; no mark");
        assert_eq!(
            read_events(&t, "s", 0, usize::MAX).unwrap(),
            KeptEvents::default()
        );
    }

    #[test]
    fn a_page_round_trips_and_leaves_out_what_does_not_encode() {
        let mut p = PageBuilder::default();
        p.push_with(7, 1_000, |w| {
            w.extend_from_slice(b"seven");
            Ok(())
        })
        .unwrap();
        assert!(p
            .push_with(8, 1_001, |w| {
                w.extend_from_slice(b"partial");
                Err("no".into())
            })
            .is_err());
        p.push_with(300, 999, |w| {
            w.extend_from_slice(&[b'x'; 200]);
            Ok(())
        })
        .unwrap();
        let events = p.events();
        assert_eq!(
            events
                .iter()
                .map(|e| (e.seq, e.at_ms, e.body.len()))
                .collect::<Vec<_>>(),
            vec![(7, 1_000, 5), (300, 1_000, 200)],
            "a time before the first reads as the first's"
        );
        let sealed = p.seal().unwrap();
        assert_eq!(
            (sealed.info.first, sealed.info.last, sealed.info.count),
            (7, 300, 2)
        );
        assert!(
            sealed.value.len() < 120,
            "compressed: {}",
            sealed.value.len()
        );
        assert_eq!(decode_page("s", &sealed.value).unwrap(), events);
        assert!(decode_page("s", &sealed.value[..20]).is_err());
    }

    #[test]
    fn page_keys_round_trip_and_sort_by_number() {
        let p = PageInfo {
            first: 3,
            last: 9,
            at_ms: 77,
            count: 5,
        };
        let k = page_key("a", p);
        assert_eq!(parse_page_key(&k, events_prefix("a").len()), Some(p));
        let later = page_key("a", PageInfo { first: 256, ..p });
        assert!(later > k);
        assert!(crate::table::parse_key(&k).is_none(), "not a record's key");
    }
}
