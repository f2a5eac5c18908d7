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

use serde::{Deserialize, Serialize};

use crate::event_log::Retention;
use crate::header::Payload;
use crate::store_error::StoreError;
use crate::table::kv::Table;

/// The first byte of every kept-event key.
pub const EVENTS_MARK: u8 = 0x02;

/// One kept event: its number, when it was kept and its body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptEvent {
    /// The event's number in its session's sequence.
    pub seq: u64,
    /// When it was emitted, ms since the Unix epoch.
    pub at_ms: u64,
    /// The event, as the runtime encoded it (JSON).
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// What one append writes: a page of events (ascending, maybe empty), a new reserved
/// mark, and the retention to trim by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventAppend {
    /// The events, ascending by number.
    pub events: Vec<KeptEvent>,
    /// The new reserved mark: numbers up to it may be handed out before they are kept
    /// (0: unchanged). Set as given: the session raises it ahead of its numbers and
    /// lowers it once, to its `Ended`'s number, with its last append.
    pub reserved: u64,
    /// The session's first append of a new life (no record was loaded): what a
    /// previous session of this id kept is removed first.
    pub fresh: bool,
    /// What to keep after this append (`None`: no trim this time; a trim reads every
    /// page key of the session, so a session trims every few appends).
    pub retention: Option<Retention>,
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

/// Appends events of `id` and trims by the append's retention (S20a). `epoch` is the
/// writer's fencing token: refused with [`StoreError::Fenced`] when the session's
/// record names a later owner, with nothing written. Without a record (a session not
/// written yet, or whose record a clean exit removed) the append is taken.
pub fn append_events(
    t: &mut impl Table,
    id: &str,
    epoch: u64,
    append: EventAppend,
) -> Result<(), StoreError> {
    super::check_id(id)?;
    if let Some(bytes) = t.get(&super::header_key(id))? {
        let stored = crate::codec::head::peek_with(id, &bytes, false)?
            .summary
            .lease_epoch;
        if epoch < stored {
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
    let scan = !append.fresh && (append.reserved > 0 || append.retention.is_some());
    let (mut pages, reserved) = match scan {
        true => pages(t, id)?,
        false => (Vec::new(), None),
    };
    if append.reserved > 0 && Some(append.reserved) != reserved.as_ref().map(|r| r.1) {
        if let Some((old, _)) = reserved {
            t.remove(old);
        }
        t.put(reserved_key(id, append.reserved), Payload::from(Vec::new()));
    }
    if let (Some(first), Some(last)) = (append.events.first(), append.events.last()) {
        let info = PageInfo {
            first: first.seq,
            last: last.seq,
            at_ms: append.events.iter().map(|e| e.at_ms).max().unwrap_or(0),
            count: append.events.len() as u32,
        };
        let bytes = rmp_serde::to_vec(&append.events).map_err(|e| StoreError::Encode {
            session: id.to_string(),
            reason: format!("kept events: {e}"),
        })?;
        let key = page_key(id, info);
        t.put(key.clone(), Payload::from(bytes));
        pages.push((key, info));
    }
    if let Some(retention) = append.retention {
        if append.fresh {
            // Nothing else is kept: the scan above was skipped.
            pages = self::pages(t, id)?.0;
        }
        let infos: Vec<PageInfo> = pages.iter().map(|(_, p)| *p).collect();
        for i in retention.trim_pages(&infos, append.now_ms) {
            t.remove(pages[i].0.clone());
        }
    }
    Ok(())
}

/// The kept events of `id` numbered after `after`, ascending.
pub fn read_events(t: &impl Table, id: &str, after: u64) -> Result<KeptEvents, StoreError> {
    super::check_id(id)?;
    let (pages, reserved) = pages(t, id)?;
    let mut out = KeptEvents {
        reserved: reserved.map_or(0, |r| r.1),
        last: pages.last().map_or(0, |(_, p)| p.last),
        events: Vec::new(),
    };
    for (k, p) in pages.iter().filter(|(_, p)| p.last > after) {
        let Some(bytes) = t.get(k)? else { continue };
        let events: Vec<KeptEvent> = rmp_serde::from_slice(&bytes)
            .map_err(|e| corrupt(id, format!("kept events {}..={}: {e}", p.first, p.last)))?;
        out.events
            .extend(events.into_iter().filter(|e| e.seq > after));
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
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct Map(BTreeMap<Vec<u8>, Payload>);

    impl Table for Map {
        fn get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
            Ok(self.0.get(key).cloned())
        }
        fn put(&mut self, key: Vec<u8>, value: Payload) {
            self.0.insert(key, value);
        }
        fn remove(&mut self, key: Vec<u8>) {
            self.0.remove(&key);
        }
        fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
            Ok(self
                .0
                .keys()
                .filter(|k| k.starts_with(prefix))
                .cloned()
                .collect())
        }
        fn entries_with_prefix(
            &self,
            prefix: &[u8],
        ) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
            Ok(self
                .0
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        }
    }

    fn ev(seq: u64, at_ms: u64) -> KeptEvent {
        KeptEvent {
            seq,
            at_ms,
            body: format!("{{\"n\":{seq}}}").into_bytes(),
        }
    }

    fn append(events: Vec<KeptEvent>, count: u64, now_ms: u64) -> EventAppend {
        EventAppend {
            events,
            reserved: 0,
            fresh: false,
            retention: Some(Retention {
                count,
                max_age_ms: Some(1_000),
            }),
            now_ms,
        }
    }

    #[test]
    fn events_are_appended_read_after_a_number_and_trimmed() {
        let mut t = Map::default();
        append_events(&mut t, "s", 0, append(vec![ev(1, 10), ev(2, 10)], 10, 10)).unwrap();
        append_events(&mut t, "s", 0, append(vec![ev(4, 20)], 10, 20)).unwrap();
        let r = read_events(&t, "s", 1).unwrap();
        assert_eq!(
            r.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![2, 4]
        );
        assert_eq!(r.last, 4);
        assert_eq!(r.events[1].body, b"{\"n\":4}".to_vec());
        // The count: the oldest page goes once the newer ones hold enough.
        append_events(&mut t, "s", 0, append(vec![ev(5, 30), ev(6, 30)], 3, 30)).unwrap();
        let r = read_events(&t, "s", 0).unwrap();
        assert_eq!(
            r.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![4, 5, 6]
        );
        // The age: everything older than a second at the next append.
        append_events(&mut t, "s", 0, append(vec![ev(7, 1_500)], 100, 1_500)).unwrap();
        let r = read_events(&t, "s", 0).unwrap();
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
            read_events(&t, "s", 0).unwrap().reserved,
            50,
            "lowered at the end"
        );
        let mut a = append(vec![ev(1, 2)], 10, 2);
        a.fresh = true;
        append_events(&mut t, "s", 0, a).unwrap();
        let r = read_events(&t, "s", 0).unwrap();
        assert_eq!((r.reserved, r.events.len()), (0, 1));
        assert_eq!(remove_all(&mut t, "s").unwrap(), 1, "the page; no mark");
        assert_eq!(read_events(&t, "s", 0).unwrap(), KeptEvents::default());
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
