//! The layout's own tests (format 3: one head, loose entries, format-2 conversion),
//! over a plain ordered map that counts the reads that scan.

use super::*;
use crate::codec;
use crate::record::RecordHeader;
use crate::write::{RecordWrite, WriteCondition};
use std::ops::Bound;

/// A plain ordered map as the table, counting the reads that scan (and the point reads
/// and seeks, for the pages of `list_page`).
#[derive(Default)]
struct Map {
    rows: BTreeMap<Vec<u8>, Payload>,
    scans: std::cell::Cell<usize>,
    gets: std::cell::Cell<usize>,
    seeks: std::cell::Cell<usize>,
}

impl Table for Map {
    fn get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
        self.gets.set(self.gets.get() + 1);
        Ok(self.rows.get(key).cloned())
    }
    fn first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.seeks.set(self.seeks.get() + 1);
        Ok(self
            .rows
            .range::<[u8], _>((std::ops::Bound::Included(from), std::ops::Bound::Unbounded))
            .next()
            .map(|(k, _)| k.clone()))
    }
    fn put(&mut self, key: Vec<u8>, value: Payload) {
        self.rows.insert(key, value);
    }
    fn remove(&mut self, key: Vec<u8>) {
        self.rows.remove(&key);
    }
    fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self
            .entries_with_prefix(prefix)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }
    fn entries_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        self.scans.set(self.scans.get() + 1);
        Ok(self
            .rows
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn entries_in_range(
        &self,
        from: &[u8],
        to: &[u8],
    ) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        Ok(self
            .rows
            .range::<[u8], _>((Bound::Included(from), Bound::Included(to)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

fn p(b: &[u8]) -> Payload {
    Payload::from(b.to_vec())
}

fn header(id: &str) -> RecordHeader {
    RecordHeader {
        session_id: id.into(),
        agent_kind: "sim".into(),
        ..RecordHeader::default()
    }
}

fn write(items: Vec<ItemChange>, state: StateChange, replace: bool) -> RecordWrite {
    RecordWrite {
        header: header("s"),
        items,
        state,
        journal: Vec::new(),
        replace,
        condition: WriteCondition::Always,
        history: None,
        timers: Vec::new(),
    }
}

fn load(t: &Map) -> StoredRecord {
    match read(t, "s").unwrap() {
        Some(Stored::Current(r)) => r,
        other => panic!("expected a record, got {other:?}"),
    }
}

fn seqs(r: &StoredRecord) -> Vec<u64> {
    r.items.iter().map(|(s, _)| *s).collect()
}

/// S15c: a whole-record write is one key, rewritten in place; neither it nor the load
/// scans the session's prefix (the scans are what piled up under fjall's rewritten
/// keys).
#[test]
fn s15c_a_whole_record_is_one_key_and_nothing_scans() {
    let mut t = Map::default();
    for n in 0..50u64 {
        let w = write(
            vec![ItemChange::Put(n, p(b"a")), ItemChange::Put(n + 1, p(b"b"))],
            StateChange::Put(p(&n.to_le_bytes())),
            true,
        );
        super::write(&mut t, w).unwrap();
        assert_eq!(t.rows.len(), 1, "one key after write {n}");
        let r = load(&t);
        assert_eq!(seqs(&r), vec![n, n + 1]);
        assert_eq!(r.state.as_deref(), Some(&n.to_le_bytes()[..]));
        assert_eq!(r.header.version, n + 1);
    }
    assert_eq!(t.scans.get(), 0, "no write and no load scanned");
}

/// S15c: pushes add loose entries and rewrite the head; delivering removes them;
/// the head's bounds follow, so reads touch only the live range; a replacing write
/// removes every loose entry.
#[test]
fn s15c_loose_entries_follow_pushes_and_deliveries() {
    let mut t = Map::default();
    super::write(&mut t, write(vec![], StateChange::Delete, true)).unwrap();
    for n in 0..10u64 {
        super::write(
            &mut t,
            write(vec![ItemChange::Put(n, p(b"x"))], StateChange::Keep, false),
        )
        .unwrap();
    }
    assert_eq!(t.rows.len(), 11, "the head and ten loose items");
    assert_eq!(seqs(&load(&t)), (0..10).collect::<Vec<_>>());
    // A turn delivers the first three and stores its state (inline).
    super::write(
        &mut t,
        write(
            (0..3).map(ItemChange::Delete).collect(),
            StateChange::Put(p(b"state")),
            false,
        ),
    )
    .unwrap();
    assert_eq!(t.rows.len(), 8);
    let head = head::decode("s", &t.rows[&header_key("s")]).unwrap();
    let l = head.layout.unwrap();
    assert_eq!((l.loose_items, l.lo, l.hi, l.loose_state), (7, 3, 9, false));
    let r = load(&t);
    assert_eq!(seqs(&r), (3..10).collect::<Vec<_>>());
    assert_eq!(r.state.as_deref(), Some(&b"state"[..]));
    // A plan rewrites an item in place: counted once.
    super::write(
        &mut t,
        write(vec![ItemChange::Put(5, p(b"y"))], StateChange::Keep, false),
    )
    .unwrap();
    let l = head::decode("s", &t.rows[&header_key("s")])
        .unwrap()
        .layout
        .unwrap();
    assert_eq!(l.loose_items, 7);
    // A whole write leaves one key again.
    super::write(
        &mut t,
        write(
            vec![ItemChange::Put(20, p(b"z"))],
            StateChange::Delete,
            true,
        ),
    )
    .unwrap();
    assert_eq!(t.rows.len(), 1);
    assert_eq!(seqs(&load(&t)), vec![20]);
    assert_eq!(t.scans.get(), 0);
    assert!(super::delete(&mut t, "s").unwrap());
    assert!(t.rows.is_empty());
}

/// A record beyond the inline limit keeps its items and state loose, so a push's
/// head stays small whatever the backlog.
#[test]
fn a_large_record_is_kept_loose() {
    let mut t = Map::default();
    let big = vec![7u8; INLINE_LIMIT / 4];
    let items = (0..6).map(|n| ItemChange::Put(n, p(&big))).collect();
    super::write(&mut t, write(items, StateChange::Put(p(&big)), true)).unwrap();
    let head_len = t.rows[&header_key("s")].len();
    assert!(head_len < 1024, "the head is {head_len} bytes");
    let r = load(&t);
    assert_eq!(seqs(&r), (0..6).collect::<Vec<_>>());
    assert_eq!(r.state.as_deref().map(<[u8]>::len), Some(big.len()));
    // A state beyond the limit on its own is loose too.
    let huge = vec![1u8; INLINE_LIMIT + 1];
    super::write(&mut t, write(vec![], StateChange::Put(p(&huge)), true)).unwrap();
    assert_eq!(t.rows.len(), 2);
    assert_eq!(load(&t).state.as_deref().map(<[u8]>::len), Some(huge.len()));
}

/// Format 2 still loads (by a scan of its entries), and its first write converts it:
/// an incremental write keeps its entries loose under a format-3 head that names
/// them, a compare-and-swap too.
#[test]
fn s15_a_format2_record_loads_and_its_first_write_converts_it() {
    let mut t = Map::default();
    let mut h = header("s");
    h.next_seq = 3;
    h.version = 4;
    t.put(
        header_key("s"),
        codec::encode_format2_header(&h).unwrap().into(),
    );
    for n in 0..3 {
        t.put(item_key("s", n), p(&[n as u8]));
    }
    t.put(state_key("s"), p(b"old state"));
    let r = load(&t);
    assert_eq!(seqs(&r), vec![0, 1, 2]);
    assert_eq!(r.state.as_deref(), Some(&b"old state"[..]));
    assert_eq!(r.header.version, 4);
    // Its first write: one item delivered, one pushed.
    super::write(
        &mut t,
        write(
            vec![ItemChange::Delete(0), ItemChange::Put(3, p(b"new"))],
            StateChange::Keep,
            false,
        ),
    )
    .unwrap();
    let head = head::decode("s", &t.rows[&header_key("s")]).unwrap();
    assert_eq!(
        t.rows[&header_key("s")][4..6],
        head::FORMAT3.to_le_bytes(),
        "a record without journal entries is written in format 3 (an older build reads it)"
    );
    let l = head.layout.expect("converted to format 3");
    assert_eq!((l.loose_items, l.lo, l.hi, l.loose_state), (3, 1, 3, true));
    let scans = t.scans.get();
    let r = load(&t);
    assert_eq!(seqs(&r), vec![1, 2, 3]);
    assert_eq!(r.state.as_deref(), Some(&b"old state"[..]));
    assert_eq!(r.header.version, 5);
    assert_eq!(t.scans.get(), scans, "a format-3 load does not scan");
    // A compare-and-swap of another format-2 record converts it as well.
    t.put(
        header_key("t"),
        codec::encode_format2_header(&header("t")).unwrap().into(),
    );
    t.put(item_key("t", 9), p(b"i"));
    let outcome = cas(
        &mut t,
        "t",
        &[StatusKind::Stopped],
        SessionStatus::Canceled,
        1,
    )
    .unwrap();
    assert!(matches!(outcome, CasOutcome::Swapped(_)));
    match read(&t, "t").unwrap() {
        Some(Stored::Current(r)) => {
            assert_eq!(seqs(&r), vec![9]);
            assert_eq!(r.header.status, SessionStatus::Canceled);
        }
        other => panic!("{other:?}"),
    }
}

/// S15: a build that reads format 2 only refuses a format-3 head rather than
/// misreading it: the magic and the version field sit where format 2 has them, and
/// the version says 3 (format-2 builds accept 1 and 2 and call any other
/// "unknown format version … a newer agentloop wrote it").
#[test]
fn s15_a_format3_head_announces_its_version_where_format2_readers_look() {
    let bytes = head::encode(&header("s"), Layout::default(), &[(1, p(b"i"))], None).unwrap();
    assert_eq!(bytes[..4], codec::MAGIC);
    assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 3);
    // And its payload length covers the header only: the layout follows it.
    let len = u32::from_le_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]) as usize;
    assert!(codec::ENVELOPE + len < bytes.len());
}

/// The fast read from the head alone answers exactly what `read` does, and says
/// when it cannot.
#[test]
fn reading_from_the_head_alone_matches_read() {
    let mut t = Map::default();
    super::write(
        &mut t,
        write(
            vec![ItemChange::Put(1, p(b"a"))],
            StateChange::Put(p(b"s")),
            true,
        ),
    )
    .unwrap();
    let bytes = t.rows[&header_key("s")].clone();
    match read_head_only("s", &bytes).unwrap() {
        HeadRead::Record(r) => assert_eq!(Some(*r), read(&t, "s").unwrap()),
        HeadRead::NeedsEntries => panic!("an inline record needs nothing else"),
    }
    super::write(
        &mut t,
        write(vec![ItemChange::Put(2, p(b"b"))], StateChange::Keep, false),
    )
    .unwrap();
    let bytes = t.rows[&header_key("s")].clone();
    assert!(matches!(
        read_head_only("s", &bytes).unwrap(),
        HeadRead::NeedsEntries
    ));
}

fn entry(occ: u32, name: &str, result: Option<&[u8]>) -> Payload {
    codec::encode_journal_entry(
        "s",
        &crate::steps::JournalEntry {
            occurrence: occ,
            name: name.into(),
            result: result.map(<[u8]>::to_vec),
        },
    )
    .unwrap()
}

fn with_journal(mut w: RecordWrite, turn: u64, covered: u32, j: Vec<JournalChange>) -> RecordWrite {
    w.header.journal = Some(crate::steps::JournalMark { turn, covered });
    w.journal = j;
    w
}

/// S1b, issue 32 (4): journal entries are inline in the head while they fit (one key
/// per step's write); the head is format 4 while any exist and format 3 again once the
/// last goes; a read does not scan; a safe point's deletes and a turn end's replacing
/// write remove them.
#[test]
fn s1b_journal_entries_are_loose_counted_and_make_the_head_format4() {
    let mut t = Map::default();
    super::write(
        &mut t,
        write(vec![ItemChange::Put(0, p(b"a"))], StateChange::Keep, true),
    )
    .unwrap();
    let version =
        |t: &Map| u16::from_le_bytes([t.rows[&header_key("s")][4], t.rows[&header_key("s")][5]]);
    assert_eq!(version(&t), head::FORMAT3);
    // Step 0 began (a NoRetry step), then finished; step 1 finished.
    for j in [
        vec![JournalChange::Put(0, entry(0, "pay", None))],
        vec![JournalChange::Put(0, entry(0, "pay", Some(b"ok")))],
        vec![JournalChange::Put(1, entry(1, "mail", Some(b"sent")))],
    ] {
        super::write(
            &mut t,
            with_journal(write(vec![], StateChange::Keep, false), 4, 0, j),
        )
        .unwrap();
    }
    assert_eq!(version(&t), head::FORMAT4);
    let scans = t.scans.get();
    let r = load(&t);
    assert_eq!(t.scans.get(), scans, "a format-4 read does not scan");
    let j = codec::decode_journal(&r.header, &r.journal)
        .unwrap()
        .unwrap();
    assert_eq!(
        j.mark,
        crate::steps::JournalMark {
            turn: 4,
            covered: 0
        }
    );
    let names: Vec<_> = j
        .entries
        .iter()
        .map(|e| (e.occurrence, e.name.as_str(), e.result.clone()))
        .collect();
    assert_eq!(
        names,
        vec![
            (0, "pay", Some(b"ok".to_vec())),
            (1, "mail", Some(b"sent".to_vec()))
        ]
    );
    let h = head::decode("s", &t.rows[&header_key("s")]).unwrap();
    let l = h.layout.unwrap();
    assert_eq!(
        l.journal_entries, 0,
        "small entries are inline: a step's write is one key"
    );
    assert_eq!(
        h.journal.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert!(!t
        .rows
        .keys()
        .any(|k| matches!(parse_key(k), Some((_, KeyKind::Journal(_))))));
    // A safe point covers both: its write deletes them with the state it puts.
    super::write(
        &mut t,
        with_journal(
            write(vec![], StateChange::Put(p(b"st")), false),
            4,
            2,
            vec![JournalChange::Delete(0), JournalChange::Delete(1)],
        ),
    )
    .unwrap();
    assert_eq!(version(&t), head::FORMAT3, "no entries: format 3 again");
    assert!(!t
        .rows
        .keys()
        .any(|k| matches!(parse_key(k), Some((_, KeyKind::Journal(_))))));
    let r = load(&t);
    assert!(r.journal.is_empty());
    assert_eq!(r.header.journal.unwrap().covered, 2);
    // Another step, then a replacing write (a turn's end) without it: gone.
    super::write(
        &mut t,
        with_journal(
            write(vec![], StateChange::Keep, false),
            4,
            2,
            vec![JournalChange::Put(2, entry(2, "pay", Some(b"x")))],
        ),
    )
    .unwrap();
    assert_eq!(load(&t).journal.len(), 1);
    super::write(
        &mut t,
        write(vec![ItemChange::Put(0, p(b"a"))], StateChange::Delete, true),
    )
    .unwrap();
    assert!(!t
        .rows
        .keys()
        .any(|k| matches!(parse_key(k), Some((_, KeyKind::Journal(_))))));
    assert_eq!(version(&t), head::FORMAT3);
    assert!(load(&t).journal.is_empty());
}

/// S1b: a record with a journal stored as entries (an import) reads back the same;
/// delete removes the journal; a journal entry under the wrong occurrence, or entries
/// without a mark, are Corrupt. Entries beyond the inline limit are loose, counted by
/// the head, and read back in order with the inline ones.
#[test]
fn s1b_a_journal_survives_entries_of_and_delete_removes_it() {
    let mut h = header("s");
    h.journal = Some(crate::steps::JournalMark {
        turn: 1,
        covered: 3,
    });
    let rec = StoredRecord {
        header: h,
        items: vec![(0, p(b"a"))],
        state: Some(p(b"st")),
        journal: vec![(3, entry(3, "a", Some(b"1"))), (5, entry(5, "b", None))],
    };
    let mut t = Map::default();
    for (k, v) in entries_of(rec.clone()).unwrap() {
        t.put(k, v);
    }
    let back = load(&t);
    assert_eq!(back.journal, rec.journal);
    assert_eq!(back.items, rec.items);
    let named: Vec<_> = raw_entries("s", t.rows.iter().map(|(k, v)| (k.clone(), v.to_vec())))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(
        named.contains(&"step 3".to_string()) && named.contains(&"step 5".to_string()),
        "{named:?}"
    );
    assert!(super::delete(&mut t, "s").unwrap());
    assert!(t.rows.is_empty(), "{:?}", t.rows.keys().collect::<Vec<_>>());
    // A journal beyond the inline limit: the writes put the later entries loose.
    let mut t = Map::default();
    super::write(
        &mut t,
        write(vec![ItemChange::Put(0, p(b"a"))], StateChange::Keep, true),
    )
    .unwrap();
    let big = vec![7u8; INLINE_LIMIT / 3];
    for occ in 0..5u32 {
        super::write(
            &mut t,
            with_journal(
                write(vec![], StateChange::Keep, false),
                1,
                0,
                vec![JournalChange::Put(occ, entry(occ, "big", Some(&big)))],
            ),
        )
        .unwrap();
    }
    let h = head::decode("s", &t.rows[&header_key("s")]).unwrap();
    assert!(
        h.layout.unwrap().journal_entries > 0,
        "some entries are loose"
    );
    assert!(!h.journal.is_empty(), "some are inline");
    let back = load(&t);
    assert_eq!(
        back.journal.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    assert!(super::delete(&mut t, "s").unwrap());
    assert!(t.rows.is_empty(), "{:?}", t.rows.keys().collect::<Vec<_>>());
    // Damage is named.
    let mut wrong = rec.clone();
    wrong.journal = vec![(4, entry(3, "a", Some(b"1")))];
    let e = codec::decode_journal(&wrong.header, &wrong.journal)
        .unwrap_err()
        .to_string();
    assert!(e.contains("names step 3"), "{e}");
    let mut unmarked = rec;
    unmarked.header.journal = None;
    let e = codec::decode_journal(&unmarked.header, &unmarked.journal)
        .unwrap_err()
        .to_string();
    assert!(e.contains("names no turn"), "{e}");
}

/// S1b: a durable step's entry written straight into the record keeps the stored
/// header (placement, state) but for the version and the journal's mark (set with no
/// step covered when none is stored); it is fenced like any write, refused over a final
/// record, without a record, and for a journal of another turn.
#[test]
fn s1b_append_journal_keeps_the_header_and_is_fenced() {
    let mut t = Map::default();
    let id = "s";
    assert!(matches!(
        super::append_journal(
            &mut t,
            id,
            1,
            0,
            JournalChange::Put(0, entry(0, "a", Some(b"1")))
        ),
        Err(StoreError::NoRecord { .. })
    ));
    let mut w = write(
        vec![ItemChange::Put(4, p(b"item"))],
        StateChange::Put(p(b"st")),
        true,
    );
    w.header.lease_epoch = 3;
    w.header.cut = vec![4];
    w.header.turn_index = 2;
    w.header.status = SessionStatus::Running;
    super::write(&mut t, w).unwrap();
    super::append_journal(
        &mut t,
        id,
        3,
        2,
        JournalChange::Put(0, entry(0, "a", Some(b"1"))),
    )
    .unwrap();
    let r = load(&t);
    assert_eq!(r.header.cut, vec![4], "the placement is kept");
    assert_eq!(r.state.as_deref(), Some(&b"st"[..]));
    assert_eq!(r.header.version, 2);
    assert_eq!(
        r.header.journal,
        Some(crate::steps::JournalMark {
            turn: 2,
            covered: 0
        })
    );
    assert_eq!(r.journal.len(), 1);
    // Fenced: an older owner's epoch.
    assert!(matches!(
        super::append_journal(
            &mut t,
            id,
            2,
            2,
            JournalChange::Put(1, entry(1, "b", Some(b"2")))
        ),
        Err(StoreError::Fenced { .. })
    ));
    // Another turn's journal: refused (the session writes it itself).
    assert!(matches!(
        super::append_journal(
            &mut t,
            id,
            3,
            5,
            JournalChange::Put(1, entry(1, "b", Some(b"2")))
        ),
        Err(StoreError::Refused { .. })
    ));
    // A covered count stored by a safe point's write is kept.
    let mut w = write(vec![], StateChange::Keep, false);
    w.header = load(&t).header;
    w.header.journal = Some(crate::steps::JournalMark {
        turn: 2,
        covered: 1,
    });
    w.journal = vec![JournalChange::Delete(0)];
    super::write(&mut t, w).unwrap();
    super::append_journal(
        &mut t,
        id,
        3,
        2,
        JournalChange::Put(1, entry(1, "b", Some(b"2"))),
    )
    .unwrap();
    assert_eq!(load(&t).header.journal.map(|m| m.covered), Some(1));
    // Final: refused.
    super::cas(
        &mut t,
        id,
        &[StatusKind::Running],
        SessionStatus::Canceled,
        9,
    )
    .unwrap();
    assert!(matches!(
        super::append_journal(
            &mut t,
            id,
            9,
            2,
            JournalChange::Put(2, entry(2, "c", Some(b"3")))
        ),
        Err(StoreError::Final { .. })
    ));
}

/// Issue 52: a page of records costs what it returns. Among 20 000 records (and a
/// session's kept events, which sort before every record), a page of 10 after an id
/// seeks 11 times and reads 10 heads, and scans nothing; it lists what the whole
/// listing lists for those ids, a corrupt head with its error included.
#[test]
fn a_page_of_records_reads_only_the_records_it_lists() {
    let mut t = Map::default();
    for n in 0..20_000u64 {
        let id = format!("s{n:05}");
        let w = RecordWrite {
            header: header(&id),
            ..write(
                vec![ItemChange::Put(1, p(b"one"))],
                StateChange::Keep,
                false,
            )
        };
        super::write(&mut t, w).unwrap();
    }
    // A head that does not decode, between two records; kept events of one session.
    t.rows.insert(header_key("s00010a"), p(b"garbage"));
    for n in 0..1_000u32 {
        let mut k = vec![events::EVENTS_MARK];
        k.extend_from_slice(b"s00001\0");
        k.extend_from_slice(&n.to_be_bytes());
        t.rows.insert(k, p(b"event"));
    }
    let scan = || t.rows.iter().map(|(k, v)| Ok((k.clone(), v.clone())));
    let all = list(scan(), std::iter::empty(), None).unwrap();
    assert_eq!(all.len(), 20_001);

    let (gets, seeks, scans) = (t.gets.get(), t.seeks.get(), t.scans.get());
    let page = list_page(&t, Some("s00005"), 10).unwrap();
    let ids: Vec<&str> = page.iter().map(|e| e.session_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "s00006", "s00007", "s00008", "s00009", "s00010", "s00010a", "s00011", "s00012",
            "s00013", "s00014"
        ]
    );
    assert_eq!(t.gets.get() - gets, 10, "one head read per record listed");
    assert_eq!(
        t.seeks.get() - seeks,
        11,
        "one seek per record, and one to end"
    );
    assert_eq!(t.scans.get() - scans, 0, "no scan");
    for e in &page {
        let whole = all.iter().find(|a| a.session_id == e.session_id).unwrap();
        match (&e.record, &whole.record) {
            (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("`{}`: the page has {a:?}, the listing {b:?}", e.session_id),
        }
    }
    assert!(
        page[5].record.is_err(),
        "the corrupt head is listed with its error"
    );

    // From the start (the kept events before it are not read), to the end, and none.
    let (gets, seeks) = (t.gets.get(), t.seeks.get());
    let first = list_page(&t, None, 3).unwrap();
    let ids: Vec<&str> = first.iter().map(|e| e.session_id.as_str()).collect();
    assert_eq!(ids, ["s00000", "s00001", "s00002"]);
    assert_eq!((t.gets.get() - gets, t.seeks.get() - seeks), (3, 4));
    let last = list_page(&t, Some("s19998"), 10).unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].session_id, "s19999");
    assert!(list_page(&t, Some("s19999"), 10).unwrap().is_empty());
    assert!(list_page(&t, None, 0).unwrap().is_empty());
    // An `after` that is no id (a control character) still pages in id order.
    let odd = list_page(&t, Some("s00003\0h"), 2).unwrap();
    let ids: Vec<&str> = odd.iter().map(|e| e.session_id.as_str()).collect();
    assert_eq!(ids, ["s00004", "s00005"]);
}

/// S26a: a session is known while its history or kept events remain, with or without
/// a record. `kept_page` pages those ids in order, each once whatever it keeps, seeking
/// one session at a time (one seek per keyspace per id, and one per keyspace to end),
/// scanning nothing, and steps over ids that extend another and over an `after` that
/// is no id.
#[test]
fn a_page_of_kept_sessions_lists_each_id_once_in_order() {
    let mut t = Map::default();
    // Records only: not kept beyond their record, never in this page.
    for n in 0..100u64 {
        let id = format!("r{n:03}");
        let w = RecordWrite {
            header: header(&id),
            ..write(
                vec![ItemChange::Put(1, p(b"one"))],
                StateChange::Keep,
                false,
            )
        };
        super::write(&mut t, w).unwrap();
    }
    let event_key = |id: &str, n: u32| {
        let mut k = events::events_prefix(id);
        k.extend_from_slice(&n.to_be_bytes());
        k
    };
    // History only, events only, both, an id extending another, many entries each.
    for turn in 0..50u64 {
        t.rows
            .insert(crate::history::history_key("h1", turn), p(b"snap"));
        t.rows
            .insert(crate::history::history_key("both", turn), p(b"snap"));
    }
    for n in 0..500u32 {
        t.rows.insert(event_key("e1", n), p(b"event"));
        t.rows.insert(event_key("both", n), p(b"event"));
        t.rows.insert(event_key("e1x", n), p(b"event"));
    }
    let (seeks, scans) = (t.seeks.get(), t.scans.get());
    let all = kept_page(&t, None, 100).unwrap();
    assert_eq!(all, ["both", "e1", "e1x", "h1"]);
    assert_eq!(t.scans.get() - scans, 0, "no scan");
    assert!(
        t.seeks.get() - seeks <= 2 + 2 * 4,
        "a seek per keyspace per id and one to end, not one per entry: {}",
        t.seeks.get() - seeks
    );
    assert_eq!(kept_page(&t, None, 2).unwrap(), ["both", "e1"]);
    assert_eq!(kept_page(&t, Some("e1"), 10).unwrap(), ["e1x", "h1"]);
    assert_eq!(kept_page(&t, Some("both\0x"), 1).unwrap(), ["e1"]);
    assert!(kept_page(&t, Some("h1"), 10).unwrap().is_empty());
    assert!(kept_page(&t, None, 0).unwrap().is_empty());
    // A session's history removed: listed for its events alone; both removed: gone.
    for turn in 0..50u64 {
        t.rows.remove(&crate::history::history_key("h1", turn));
    }
    assert_eq!(
        kept_page(&t, Some("e1x"), 10).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(kept_page(&t, None, 10).unwrap(), ["both", "e1", "e1x"]);
}
