//! The store conformance suite (DESIGN S15, S19, S24, S37; issue 12): what every
//! [`CheckpointStore`] must do, as one generic test per behaviour. A backend runs it
//! with [`run_all`] on a fresh, empty store (`tests/tests/store_conformance.rs` does for
//! the memory store and for sled through the checkpoint actor; a networked store runs
//! the same functions).
//!
//! Every check panics with a message naming the behaviour and what was found.

use std::sync::Arc;

use agentloop::store::{
    ItemChange, Payload, RecordHeader, RecordWrite, StateChange, Stored, WriteCondition,
};
use agentloop::{
    store::CasOutcome, store::SessionRecord, store::SessionStatus, store::StatusKind,
    CheckpointStore, StoreError,
};
use agentloop_sim::{SimItem, SimState};

use crate::{ids, item};

/// The store under test.
pub type Store = Arc<dyn CheckpointStore<SimItem>>;

fn payload(i: u64) -> Payload {
    agentloop::store::codec::encode_item(&item(i))
        .expect("an item encodes")
        .into()
}

fn state_payload(steps: usize) -> Payload {
    agentloop::store::codec::encode_state(
        "conformance",
        &SimState {
            turn: 1,
            items: vec![],
            steps_done: steps,
            payload: vec![1, 2, 3],
        },
    )
    .expect("a state encodes")
    .into()
}

fn header(id: &str, status: SessionStatus) -> RecordHeader {
    RecordHeader {
        session_id: id.to_string(),
        agent_kind: "sim".into(),
        agent_config: b"cfg".to_vec(),
        status,
        turn_index: 1,
        created_at_ms: 10,
        updated_at_ms: 20,
        heartbeat_ms: 20,
        ..RecordHeader::default()
    }
}

fn write(h: RecordHeader, items: Vec<ItemChange>, state: StateChange) -> RecordWrite {
    RecordWrite {
        header: h,
        items,
        state,
        journal: Vec::new(),
        replace: false,
        condition: WriteCondition::NotFinal,
        history: None,
        timers: Vec::new(),
    }
}

async fn stored(store: &Store, id: &str) -> agentloop::store::StoredRecord {
    match store.load_stored(id).await.expect("load_stored") {
        Some(Stored::Current(r)) => r,
        other => panic!("`{id}`: expected a format-2 record, found {other:?}"),
    }
}

async fn record(store: &Store, id: &str) -> SessionRecord<SimItem> {
    store
        .load(id)
        .await
        .expect("load")
        .unwrap_or_else(|| panic!("`{id}`: no record"))
}

/// A whole record saved is loaded equal (items in order, state, every header field but
/// the version, which the store counts).
pub async fn whole_records_round_trip(store: &Store) {
    let mut r = SessionRecord::<SimItem>::new("whole", "sim", 7);
    r.status = SessionStatus::Interrupted;
    r.agent_config = b"config".to_vec();
    r.unhandled_items = vec![item(5), item(2), item(9)];
    r.interrupted_items = vec![item(4), item(1)];
    r.state = Some(state_payload(3).to_vec());
    r.stop_cause = Some("shutdown".into());
    r.last_error = Some("earlier".into());
    r.owner = Some("instance-1".into());
    r.lease_epoch = 3;
    store.save(r.clone()).await.expect("save");
    let mut back = record(store, "whole").await;
    assert_eq!(back.version, 1, "the first write makes version 1");
    back.version = r.version;
    assert_eq!(back, r, "a saved record loads equal");
    assert!(store.load("nobody").await.expect("load").is_none());
}

/// Incremental writes: each puts or deletes its item entries, sets or clears the state
/// and rewrites the header; the logical order is rebuilt from `front`, `cut` and the
/// entry numbers.
pub async fn incremental_writes_build_the_record(store: &Store) {
    let id = "incr";
    let h = |cut: Vec<u64>, front: Vec<u64>, next: u64| RecordHeader {
        cut,
        front,
        next_seq: next,
        ..header(id, SessionStatus::Running)
    };
    // Three pushes, one write each.
    for seq in 0..3 {
        store
            .write(write(
                h(vec![], vec![], seq + 1),
                vec![ItemChange::Put(seq, payload(seq))],
                StateChange::Keep,
            ))
            .await
            .expect("a push's write");
    }
    let r = record(store, id).await;
    assert_eq!(ids(&r.unhandled_items), vec![0, 1, 2]);
    assert_eq!(r.version, 3, "one version per write");
    // A turn consumes 1 and 0 (in that order) and reaches a safe point.
    store
        .write(write(
            h(vec![1, 0], vec![], 3),
            vec![],
            StateChange::Put(state_payload(1)),
        ))
        .await
        .expect("a safe point's write");
    let r = record(store, id).await;
    assert_eq!(ids(&r.interrupted_items), vec![1, 0]);
    assert_eq!(ids(&r.unhandled_items), vec![2]);
    assert!(r.state.is_some());
    // It is preempted: its items go first, in the turn's order; a push arrives.
    store
        .write(write(
            h(vec![], vec![1, 0], 4),
            vec![ItemChange::Put(3, payload(3))],
            StateChange::Delete,
        ))
        .await
        .expect("a preemption's write");
    let r = record(store, id).await;
    assert_eq!(ids(&r.unhandled_items), vec![1, 0, 2, 3]);
    assert!(r.interrupted_items.is_empty() && r.state.is_none());
    // A turn completes with 1, 0 and 2: their entries go.
    store
        .write(write(
            h(vec![], vec![], 4),
            vec![
                ItemChange::Delete(1),
                ItemChange::Delete(0),
                ItemChange::Delete(2),
            ],
            StateChange::Keep,
        ))
        .await
        .expect("a turn end's write");
    let s = stored(store, id).await;
    assert_eq!(
        s.items.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
        vec![3],
        "delivered entries are gone"
    );
    assert_eq!(s.header.version, 6);
    assert_eq!(ids(&record(store, id).await.unhandled_items), vec![3]);
}

/// A write that replaces removes every entry it does not put, and the state unless it
/// puts one.
pub async fn a_replacing_write_is_the_whole_record(store: &Store) {
    let id = "replace";
    store
        .write(write(
            header(id, SessionStatus::Running),
            (0..4).map(|s| ItemChange::Put(s, payload(s))).collect(),
            StateChange::Put(state_payload(2)),
        ))
        .await
        .expect("first write");
    let mut w = write(
        RecordHeader {
            next_seq: 10,
            ..header(id, SessionStatus::Stopped)
        },
        vec![ItemChange::Put(9, payload(9))],
        StateChange::Keep,
    );
    w.replace = true;
    store.write(w).await.expect("replacing write");
    let s = stored(store, id).await;
    assert_eq!(
        s.items.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
        vec![9]
    );
    assert!(
        s.state.is_none(),
        "a replacing write without a state clears it"
    );
    assert_eq!(s.header.status, SessionStatus::Stopped);
}

/// Conditions (S19, S24): `NotFinal` never overwrites a final record; `CanceledOrLive`
/// needs a record that is canceled or live; `Always` writes over anything. A refused
/// write changes nothing.
pub async fn conditional_writes_keep_their_meaning(store: &Store) {
    for (n, fin) in [
        SessionStatus::Completed,
        SessionStatus::Canceled,
        SessionStatus::Failed("boom".into()),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("final-{n}");
        let mut r = SessionRecord::<SimItem>::new(id.clone(), "sim", 1);
        r.status = fin.clone();
        r.unhandled_items = vec![item(1)];
        store.save(r).await.expect("save");
        let before = stored(store, &id).await;
        let e = store
            .write(write(
                header(&id, SessionStatus::Running),
                vec![ItemChange::Put(5, payload(5))],
                StateChange::Put(state_payload(1)),
            ))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Final { status, .. } if *status == fin),
            "NotFinal over {fin}: {e}"
        );
        assert_eq!(
            stored(store, &id).await,
            before,
            "a refused write changes nothing"
        );
        let mut canceled = write(
            header(&id, SessionStatus::Canceled),
            vec![],
            StateChange::Keep,
        );
        canceled.condition = WriteCondition::CanceledOrLive;
        let r = store.write(canceled).await;
        match fin {
            SessionStatus::Canceled => r.expect("CanceledOrLive over Canceled is written"),
            _ => assert!(
                matches!(r, Err(StoreError::Final { .. })),
                "CanceledOrLive over {fin}: {r:?}"
            ),
        }
        let mut always = write(
            header(&id, SessionStatus::Stopped),
            vec![],
            StateChange::Keep,
        );
        always.condition = WriteCondition::Always;
        store
            .write(always)
            .await
            .expect("Always writes over anything");
        assert_eq!(
            stored(store, &id).await.header.status,
            SessionStatus::Stopped
        );
    }
    let mut missing = write(
        header("absent", SessionStatus::Canceled),
        vec![],
        StateChange::Keep,
    );
    missing.condition = WriteCondition::CanceledOrLive;
    let e = store.write(missing).await.unwrap_err();
    assert!(matches!(e, StoreError::NoRecord { .. }), "{e}");
    assert!(store.load_stored("absent").await.unwrap().is_none());
    for live in [
        SessionStatus::Running,
        SessionStatus::Stopped,
        SessionStatus::Interrupted,
    ] {
        let id = format!("live-{live}");
        store
            .write(write(header(&id, live.clone()), vec![], StateChange::Keep))
            .await
            .expect("first write");
        let mut w = write(
            header(&id, SessionStatus::Canceled),
            vec![],
            StateChange::Keep,
        );
        w.condition = WriteCondition::CanceledOrLive;
        store
            .write(w)
            .await
            .unwrap_or_else(|e| panic!("CanceledOrLive over {live}: {e}"));
    }
}

/// Fencing (S37): a write whose lease epoch is below the stored one is refused and
/// changes nothing; an equal or higher one is written and the stored epoch follows it.
pub async fn writes_are_fenced_by_the_lease_epoch(store: &Store) {
    let id = "fenced";
    let at = |epoch: u64, seq: u64| {
        write(
            RecordHeader {
                lease_epoch: epoch,
                next_seq: seq + 1,
                ..header(id, SessionStatus::Running)
            },
            vec![ItemChange::Put(seq, payload(seq))],
            StateChange::Keep,
        )
    };
    store.write(at(2, 0)).await.expect("epoch 2 claims");
    store
        .write(at(2, 1))
        .await
        .expect("the same epoch writes on");
    let before = stored(store, id).await;
    let e = store.write(at(1, 2)).await.unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Fenced {
                held: 1,
                current: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        stored(store, id).await,
        before,
        "a fenced write changes nothing"
    );
    store
        .write(at(3, 3))
        .await
        .expect("a new owner claims epoch 3");
    assert!(matches!(
        store.write(at(2, 4)).await,
        Err(StoreError::Fenced {
            held: 2,
            current: 3,
            ..
        })
    ));
    assert_eq!(stored(store, id).await.header.lease_epoch, 3);
    // A status compare-and-swap (cancel by id) needs no epoch, and moves it on.
    assert!(matches!(
        store
            .cas_status(id, vec![StatusKind::Running], SessionStatus::Canceled)
            .await
            .unwrap(),
        CasOutcome::Swapped(SessionStatus::Running)
    ));
    assert_eq!(
        stored(store, id).await.header.lease_epoch,
        4,
        "a cancel by id increments the epoch (S37)"
    );
    // The canceled owner (epoch 3) may still write what it holds over `Canceled` (S24);
    // the epoch stays where the cancel put it.
    let mut last = at(3, 5);
    last.header.status = SessionStatus::Canceled;
    last.condition = WriteCondition::CanceledOrLive;
    store
        .write(last)
        .await
        .expect("the canceled owner's last write");
    let after = stored(store, id).await;
    assert_eq!(after.header.lease_epoch, 4, "the epoch never goes down");
    assert_eq!(after.header.status, SessionStatus::Canceled);
    // An owner older than that is fenced, also over `Canceled`.
    let mut stale = at(2, 6);
    stale.condition = WriteCondition::CanceledOrLive;
    assert!(matches!(
        store.write(stale).await,
        Err(StoreError::Fenced {
            held: 2,
            current: 4,
            ..
        })
    ));
}

/// Compare-and-swap of the status (S19, S24): swapped, mismatch or missing; `Failed`
/// also sets the last error; the version counts it; the items are untouched.
pub async fn status_compare_and_swap(store: &Store) {
    let mut r = SessionRecord::<SimItem>::new("cas", "sim", 2);
    r.status = SessionStatus::Running;
    r.unhandled_items = vec![item(1), item(2)];
    store.save(r).await.expect("save");
    let v0 = stored(store, "cas").await.header.version;
    assert_eq!(
        store
            .cas_status("cas", vec![StatusKind::Stopped], SessionStatus::Canceled)
            .await
            .unwrap(),
        CasOutcome::Mismatch(SessionStatus::Running)
    );
    assert_eq!(
        store
            .cas_status(
                "cas",
                vec![StatusKind::Running, StatusKind::Stopped],
                SessionStatus::Failed("it broke".into())
            )
            .await
            .unwrap(),
        CasOutcome::Swapped(SessionStatus::Running)
    );
    let back = record(store, "cas").await;
    assert_eq!(back.status, SessionStatus::Failed("it broke".into()));
    assert_eq!(back.last_error.as_deref(), Some("it broke"));
    assert_eq!(ids(&back.unhandled_items), vec![1, 2]);
    assert_eq!(back.version, v0 + 1);
    assert_eq!(
        store
            .cas_status("nobody", vec![StatusKind::Running], SessionStatus::Canceled)
            .await
            .unwrap(),
        CasOutcome::Missing
    );
}

/// Delete removes every entry; it says whether there was a record.
pub async fn delete_removes_everything(store: &Store) {
    store
        .write(write(
            header("gone", SessionStatus::Running),
            (0..3).map(|s| ItemChange::Put(s, payload(s))).collect(),
            StateChange::Put(state_payload(1)),
        ))
        .await
        .expect("write");
    assert!(store.delete("gone").await.unwrap(), "there was a record");
    assert!(store.load_stored("gone").await.unwrap().is_none());
    assert!(
        !store.delete("gone").await.unwrap(),
        "nothing left to delete"
    );
    // Writing the id again starts from nothing (no entry of the old record returns).
    store
        .write(write(
            header("gone", SessionStatus::Running),
            vec![ItemChange::Put(7, payload(7))],
            StateChange::Keep,
        ))
        .await
        .expect("write");
    let s = stored(store, "gone").await;
    assert_eq!(s.items.len(), 1);
    assert!(s.state.is_none());
    assert_eq!(s.header.version, 1, "a new record counts from 1");
}

/// S1b (issue 32, 4): a turn's journal of durable steps is kept incrementally (one
/// entry per write), reads back with its mark, is dropped entry by entry (a safe point)
/// and whole (a replacing write at the turn's end), and goes with a delete.
pub async fn the_journal_of_durable_steps_is_kept(store: &Store) {
    use agentloop::store::codec::{decode_journal, encode_journal_entry};
    use agentloop::store::JournalChange;
    use agentloop_core::steps::{JournalEntry, JournalMark};
    let entry = |occ: u32, name: &str, result: Option<&[u8]>| {
        encode_journal_entry(
            "steps",
            &JournalEntry {
                occurrence: occ,
                name: name.into(),
                result: result.map(<[u8]>::to_vec),
            },
        )
        .expect("a journal entry encodes")
    };
    let journaled = |covered: u32, j: Vec<JournalChange>| {
        let mut h = header("steps", SessionStatus::Running);
        h.journal = Some(JournalMark { turn: 1, covered });
        let mut w = write(h, vec![], StateChange::Keep);
        w.journal = j;
        w
    };
    store
        .write(write(
            header("steps", SessionStatus::Running),
            vec![ItemChange::Put(0, payload(0))],
            StateChange::Keep,
        ))
        .await
        .expect("write");
    for j in [
        vec![JournalChange::Put(0, entry(0, "charge", None))],
        vec![JournalChange::Put(0, entry(0, "charge", Some(b"ok")))],
        vec![JournalChange::Put(1, entry(1, "mail", Some(b"sent")))],
    ] {
        store.write(journaled(0, j)).await.expect("a step's write");
    }
    let s = stored(store, "steps").await;
    let j = decode_journal(&s.header, &s.journal)
        .expect("the journal decodes")
        .expect("a journal is stored");
    assert_eq!(
        j.mark,
        JournalMark {
            turn: 1,
            covered: 0
        }
    );
    assert_eq!(
        j.entries
            .iter()
            .map(|e| (e.occurrence, e.name.as_str(), e.result.as_deref()))
            .collect::<Vec<_>>(),
        vec![
            (0, "charge", Some(&b"ok"[..])),
            (1, "mail", Some(&b"sent"[..]))
        ],
        "the journal holds each step's last entry"
    );
    let typed = record(store, "steps").await;
    assert_eq!(typed.journal.map(|j| j.entries.len()), Some(2));
    // A safe point covering step 0 drops its entry in the write of its state.
    let mut w = journaled(1, vec![JournalChange::Delete(0)]);
    w.state = StateChange::Put(state_payload(1));
    store.write(w).await.expect("a safe point's write");
    let s = stored(store, "steps").await;
    assert_eq!(
        s.journal.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(s.header.journal.map(|m| m.covered), Some(1));
    // The turn's end: a replacing write without the journal.
    let mut end = write(
        header("steps", SessionStatus::Running),
        vec![ItemChange::Put(0, payload(0))],
        StateChange::Delete,
    );
    end.replace = true;
    store.write(end).await.expect("the turn end's write");
    let s = stored(store, "steps").await;
    assert!(s.journal.is_empty(), "the turn's end drops its journal");
    store
        .write(journaled(
            0,
            vec![JournalChange::Put(0, entry(0, "x", Some(b"1")))],
        ))
        .await
        .expect("write");
    assert!(store.delete("steps").await.unwrap());
    store
        .write(write(
            header("steps", SessionStatus::Running),
            vec![],
            StateChange::Keep,
        ))
        .await
        .expect("write");
    assert!(
        stored(store, "steps").await.journal.is_empty(),
        "nothing of the old journal returns"
    );
}

/// Listing filters by status and sorts by id; typed listing decodes the items.
pub async fn list_filters_by_status(store: &Store) {
    for (id, status) in [
        ("list-c", SessionStatus::Interrupted),
        ("list-a", SessionStatus::Stopped),
        ("list-b", SessionStatus::Interrupted),
    ] {
        let mut r = SessionRecord::<SimItem>::new(id, "sim", 1);
        r.status = status;
        r.unhandled_items = vec![item(1)];
        store.save(r).await.expect("save");
    }
    let listed = store
        .list(Some(vec![StatusKind::Interrupted]))
        .await
        .expect("list");
    let mine: Vec<&str> = listed
        .iter()
        .map(|e| e.session_id.as_str())
        .filter(|id| id.starts_with("list-"))
        .collect();
    assert_eq!(mine, vec!["list-b", "list-c"]);
    for e in &listed {
        let r = e.record.as_ref().expect("decodes");
        assert_eq!(r.status, SessionStatus::Interrupted);
    }
    let all = store.list_stored(None).await.expect("list_stored");
    let ids: Vec<&str> = all.iter().map(|e| e.session_id.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted, "listed in id order");
    assert!(ids.contains(&"list-a"));
}

/// What a listing says of a record, to compare a page with the whole listing: its id
/// and the record as stored, or its error.
fn listed(e: &agentloop::store::StoredEntry) -> (String, String) {
    let what = match &e.record {
        Ok(r) => format!("ok {r:?}"),
        Err(err) => format!("error {err}"),
    };
    (e.session_id.clone(), what)
}

/// Pages of records (issue 52): in id order after an id, at most `limit`, each page
/// what the whole listing says of its records; walking the pages lists every record
/// once; an `after` that is not stored starts after where it would be; a deleted
/// record leaves the pages.
pub async fn pages_list_in_id_order(store: &Store) {
    for id in ["pg-e", "pg-a", "pg-d", "pg-b", "pg-c"] {
        let mut r = SessionRecord::<SimItem>::new(id, "sim", 1);
        r.status = SessionStatus::Stopped;
        r.unhandled_items = vec![item(1), item(2)];
        store.save(r).await.expect("save");
    }
    let all: Vec<(String, String)> = store
        .list_stored(None)
        .await
        .expect("list_stored")
        .iter()
        .map(listed)
        .collect();
    // Every page of 2, from the first: the whole listing, in order, once.
    let mut walked: Vec<(String, String)> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list_page(after.as_deref(), 2)
            .await
            .expect("list_page");
        assert!(
            page.len() <= 2,
            "a page holds at most `limit`: {}",
            page.len()
        );
        let Some(last) = page.last() else { break };
        after = Some(last.session_id.clone());
        walked.extend(page.iter().map(listed));
        assert!(
            walked.len() <= all.len(),
            "the pages list more than the store holds"
        );
    }
    assert_eq!(walked, all, "the pages, walked, are the whole listing");
    let ids = |page: &[agentloop::store::StoredEntry]| -> Vec<String> {
        page.iter().map(|e| e.session_id.clone()).collect()
    };
    let page = store.list_page(Some("pg-a"), 3).await.expect("list_page");
    assert_eq!(ids(&page), ["pg-b", "pg-c", "pg-d"]);
    let page = store.list_page(Some("pg-bb"), 1).await.expect("list_page");
    assert_eq!(ids(&page), ["pg-c"], "after an id that is not stored");
    assert!(store
        .list_page(None, 0)
        .await
        .expect("list_page")
        .is_empty());
    let first = store.list_page(None, 1).await.expect("list_page");
    assert_eq!(ids(&first), [all[0].0.clone()]);
    let last = &all[all.len() - 1].0;
    assert!(store
        .list_page(Some(last), 10)
        .await
        .expect("list_page")
        .is_empty());
    assert!(store.delete("pg-c").await.expect("delete"));
    let page = store.list_page(Some("pg-b"), 1).await.expect("list_page");
    assert_eq!(ids(&page), ["pg-d"], "a deleted record leaves the pages");
    for id in ["pg-a", "pg-b", "pg-d", "pg-e"] {
        store.delete(id).await.expect("delete");
    }
}

/// A record that does not read (`id`, damaged by the caller as a broken disk would) is
/// listed on its page with its error, as the whole listing lists it (issue 52).
pub async fn a_corrupt_record_is_listed_on_its_page(store: &Store, id: &str) {
    let all = store.list_stored(None).await.expect("list_stored");
    let at = all
        .iter()
        .position(|e| e.session_id == id)
        .unwrap_or_else(|| panic!("`{id}` is not listed at all"));
    assert!(
        all[at].record.is_err(),
        "`{id}` is not corrupt: {:?}",
        all[at]
    );
    let after = at.checked_sub(1).map(|i| all[i].session_id.clone());
    let page = store
        .list_page(after.as_deref(), 2)
        .await
        .expect("a page with a corrupt record is listed, not refused");
    assert_eq!(
        page.iter().map(listed).collect::<Vec<_>>(),
        all[at..(at + 2).min(all.len())]
            .iter()
            .map(listed)
            .collect::<Vec<_>>(),
        "the page lists the corrupt record with its error, and goes on after it"
    );
}

/// A header that names an entry the record does not hold is `Corrupt` on load, naming
/// the session.
pub async fn a_header_naming_a_missing_entry_is_corrupt(store: &Store) {
    store
        .write(write(
            RecordHeader {
                cut: vec![42],
                ..header("dangling", SessionStatus::Running)
            },
            vec![ItemChange::Put(1, payload(1))],
            StateChange::Keep,
        ))
        .await
        .expect("write");
    match store.load("dangling").await {
        Err(StoreError::Corrupt { session, reason }) => {
            assert_eq!(session, "dangling");
            assert!(reason.contains("42"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Invalid ids are refused by every operation (S32); nothing is written.
pub async fn invalid_ids_are_refused(store: &Store) {
    for bad in ["", "a\u{0}b", &"x".repeat(129)] {
        let r = store
            .write(write(
                header(bad, SessionStatus::Running),
                vec![],
                StateChange::Keep,
            ))
            .await;
        assert!(
            matches!(r, Err(StoreError::InvalidId { .. })),
            "{bad:?}: {r:?}"
        );
        assert!(matches!(
            store.load_stored(bad).await,
            Err(StoreError::InvalidId { .. })
        ));
        assert!(matches!(
            store.delete(bad).await,
            Err(StoreError::InvalidId { .. })
        ));
        assert!(matches!(
            store
                .cas_status(bad, vec![StatusKind::Running], SessionStatus::Canceled)
                .await,
            Err(StoreError::InvalidId { .. })
        ));
    }
}

/// One heartbeat per instance, the last one written wins.
pub async fn heartbeats(store: &Store) {
    assert_eq!(store.heartbeat("i-1").await.unwrap(), None);
    store.beat("i-1", 5).await.unwrap();
    store.beat("i-1", 9).await.unwrap();
    store.flush().await.unwrap();
    assert_eq!(store.heartbeat("i-1").await.unwrap(), Some(9));
}

/// A store several instances share lists every instance that beat, with its last
/// heartbeat (issue 18: cluster membership). Not part of [`run_all`]: a store one
/// process owns lists none.
pub async fn shared_membership(store: &Store) {
    store.beat("node-b", 7).await.unwrap();
    store.beat("node-a", 3).await.unwrap();
    store.beat("node-a", 4).await.unwrap();
    let all = store.instances().await.unwrap();
    let mine: Vec<_> = all
        .into_iter()
        .filter(|(n, _)| n.starts_with("node-"))
        .collect();
    assert_eq!(
        mine,
        vec![("node-a".to_string(), 4), ("node-b".to_string(), 7)],
        "every instance once, with its last beat, by name"
    );
}

/// Issue 13 (4): a write with a history mark keeps a snapshot of the record it leaves;
/// only the newest `keep` stay; a snapshot reads back as the record was; S16's delete
/// keeps the history, `purge` removes record and history; listing records never shows
/// snapshots; `Absent` refuses to overwrite.
pub async fn checkpoint_history(store: &Store) {
    use agentloop::store::history::{HistoryAnswer, HistoryMark, HistoryQuery};
    let id = "hist";
    let mut seq = 0;
    for turn in 0..5u64 {
        seq += 1;
        let mut w = write(
            RecordHeader {
                turn_index: turn + 1,
                next_seq: seq + 1,
                ..header(id, SessionStatus::Running)
            },
            vec![ItemChange::Put(seq, payload(seq))],
            StateChange::Keep,
        );
        w.history = Some(HistoryMark { turn, keep: 3 });
        store.write(w).await.expect("a turn-end write");
    }
    let list = match store
        .history(id, HistoryQuery::List)
        .await
        .expect("history")
    {
        HistoryAnswer::List(l) => l,
        other => panic!("expected a list, got {other:?}"),
    };
    assert_eq!(
        list.iter().map(|e| e.turn).collect::<Vec<_>>(),
        vec![2, 3, 4],
        "exactly the newest 3, oldest first"
    );
    assert!(list.iter().all(|e| e.size > 0 && e.at_ms > 0));
    match store
        .history(id, HistoryQuery::Load(3))
        .await
        .expect("history")
    {
        HistoryAnswer::Load(Some(r)) => {
            assert_eq!(r.header.turn_index, 4);
            assert_eq!(
                r.items.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
                vec![1, 2, 3, 4],
                "the record as turn 3's write left it"
            );
        }
        other => panic!("expected turn 3's checkpoint, got {other:?}"),
    }
    assert_eq!(
        store
            .history(id, HistoryQuery::Load(0))
            .await
            .expect("history"),
        HistoryAnswer::Load(None),
        "dropped beyond the bound"
    );
    let listed = store.list_stored(None).await.expect("list");
    assert_eq!(
        listed.iter().filter(|e| e.session_id == id).count(),
        1,
        "snapshots are not records: {:?}",
        listed.iter().map(|e| &e.session_id).collect::<Vec<_>>()
    );
    // A fork target must be free.
    let mut w = write(
        header(id, SessionStatus::Stopped),
        vec![],
        StateChange::Keep,
    );
    w.condition = WriteCondition::Absent;
    assert!(matches!(
        store.write(w).await,
        Err(StoreError::Exists { .. })
    ));
    // S16's delete keeps the history; purge removes it.
    assert!(store.delete(id).await.expect("delete"));
    assert!(store.load_stored(id).await.expect("load").is_none());
    match store
        .history(id, HistoryQuery::List)
        .await
        .expect("history")
    {
        HistoryAnswer::List(l) => assert_eq!(l.len(), 3, "history outlives the delete"),
        other => panic!("{other:?}"),
    }
    // S26a: a session whose history remains is known without its record: listed once
    // on a page of kept sessions; records alone are not on it.
    let kept = store.list_kept_page(None, 10_000).await.expect("kept page");
    assert_eq!(kept.iter().filter(|k| *k == id).count(), 1, "{kept:?}");
    assert!(
        !kept.iter().any(|k| k == "incr"),
        "a record alone: {kept:?}"
    );
    assert_eq!(
        store
            .list_kept_page(Some("his"), 1)
            .await
            .expect("kept page"),
        vec![id.to_string()],
        "paged after an id"
    );
    assert!(store.purge(id).await.expect("purge"), "history existed");
    assert!(!is_kept(store, id).await, "nothing kept after a purge");
    match store
        .history(id, HistoryQuery::List)
        .await
        .expect("history")
    {
        HistoryAnswer::List(l) => assert!(l.is_empty()),
        other => panic!("{other:?}"),
    }
    assert!(!store.purge(id).await.expect("purge"), "nothing left");
}

/// Whether `id` is on the store's first page of kept sessions (S26a).
async fn is_kept(store: &Store, id: &str) -> bool {
    store
        .list_kept_page(None, 10_000)
        .await
        .expect("kept page")
        .iter()
        .any(|k| k == id)
}

/// Kept events (S20a): appended in pages, read after a number, trimmed by count, a new
/// reserved mark set as asked, fenced by the record's owner, outliving a
/// clean-exit delete of the record and removed by an explicit delete (purge).
pub async fn kept_events(store: &Store) {
    use agentloop::store::{EventAppend, PageBuilder};
    use agentloop_core::event_log::Retention;
    assert!(store.keeps_events(), "every engine keeps events");
    let append = |store: &Store, epoch: u64, seqs: &[u64], reserved: u64, count: u64| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        store.append_events_then(
            "events",
            epoch,
            EventAppend {
                page: {
                    let mut page = PageBuilder::default();
                    for s in seqs {
                        page.push_with(*s, 1_000 + s, |w| {
                            w.extend_from_slice(format!("{{\"n\":{s}}}").as_bytes());
                            Ok(())
                        })
                        .expect("a body");
                    }
                    page.seal()
                },
                reserved,
                fresh: false,
                retention: Some(Retention {
                    count,
                    max_age_ms: None,
                }),
                trim_age: false,
                now_ms: 2_000,
            },
            true,
            agentloop::store::committer::Answer::oneshot(tx),
        );
        async move { rx.await.expect("answered") }
    };
    let seqs =
        |k: &agentloop::store::KeptEvents| k.events.iter().map(|e| e.seq).collect::<Vec<_>>();
    // Before the record is written (a new session's first events).
    append(store, 0, &[1, 2], 64, 100)
        .await
        .expect("append before any record");
    let mut h = header("events", SessionStatus::Running);
    h.lease_epoch = 3;
    store
        .write(write(h, vec![], StateChange::Keep))
        .await
        .expect("write");
    append(store, 3, &[3, 5], 32, 100).await.expect("append");
    let k = store
        .read_events("events", 1, usize::MAX)
        .await
        .expect("read");
    assert_eq!(seqs(&k), vec![2, 3, 5], "the events after 1, in order");
    assert_eq!(k.events[2].body, b"{\"n\":5}".to_vec(), "the body as given");
    assert_eq!((k.last, k.reserved), (5, 32), "the mark is set as asked");
    match append(store, 2, &[6], 0, 100).await {
        Err(StoreError::Fenced {
            held: 2,
            current: 3,
            ..
        }) => {}
        other => panic!("an append of an older owner is fenced, got {other:?}"),
    }
    // A cancel by id fences the owner (S37), which may still keep what it numbers
    // while it stops; an older owner may not.
    assert!(matches!(
        store
            .cas_status("events", vec![StatusKind::Running], SessionStatus::Canceled)
            .await
            .expect("cancel"),
        CasOutcome::Swapped(_)
    ));
    append(store, 3, &[6, 7], 128, 3)
        .await
        .expect("the canceled owner's append");
    match append(store, 2, &[8], 0, 100).await {
        Err(StoreError::Fenced { .. }) => {}
        other => panic!("an older owner stays fenced, got {other:?}"),
    }
    let k = store
        .read_events("events", 0, usize::MAX)
        .await
        .expect("read");
    assert_eq!(
        seqs(&k),
        vec![3, 5, 6, 7],
        "trimmed by pages, from the oldest, while the newer ones hold 3"
    );
    assert_eq!(k.reserved, 128);
    // A clean exit's delete keeps them; an explicit delete removes them.
    assert!(store.delete("events").await.expect("delete"));
    assert_eq!(
        seqs(
            &store
                .read_events("events", 0, usize::MAX)
                .await
                .expect("read")
        ),
        vec![3, 5, 6, 7]
    );
    assert!(
        store
            .list_stored(None)
            .await
            .expect("list")
            .iter()
            .all(|e| e.session_id != "events"),
        "kept events are not a record"
    );
    assert_eq!(
        store
            .list_kept_page(Some("event"), 1)
            .await
            .expect("kept page"),
        vec!["events".to_string()],
        "S26a: a session whose events remain is on a page of kept sessions"
    );
    assert!(
        store.purge("events").await.expect("purge"),
        "the events existed"
    );
    assert!(
        !is_kept(store, "events").await,
        "nothing kept after a purge"
    );
    assert_eq!(
        store
            .read_events("events", 0, usize::MAX)
            .await
            .expect("read"),
        agentloop::store::KeptEvents::default()
    );
}

/// Durable timers (S39): numbered per session,
/// listed, found in the due-time index earliest first, canceled; a record write that
/// accepts a timer's item removes a one-off timer and moves a recurring one in the same
/// write, and one refused (fenced) changes neither; listings and loads never see
/// timers; a delete removes them.
pub async fn durable_timers(store: &Store) {
    use agentloop::store::{Repeat, StoredTimer, TimerChange};
    assert!(store.keeps_timers(), "every engine keeps timers");
    let timer = |due_ms: u64, repeat: Option<Repeat>| StoredTimer {
        due_ms,
        item: payload(7).to_vec(),
        repeat,
        armed_ms: 1,
        fired: 0,
    };
    for id in ["timers", "timers-b"] {
        store
            .write(write(
                header(id, SessionStatus::Running),
                vec![],
                StateChange::Keep,
            ))
            .await
            .expect("a record");
    }
    let once = store
        .arm_timer("timers", timer(300, None), 2)
        .await
        .expect("armed");
    let every = store
        .arm_timer("timers", timer(100, Some(Repeat::Every { ms: 1000 })), 2)
        .await
        .expect("armed");
    let other = store
        .arm_timer("timers-b", timer(200, None), 1)
        .await
        .expect("armed");
    // S34a (issue 52): a session holding its bound of timers is refused, and nothing
    // is written (its due-time index gains nothing).
    match store.arm_timer("timers-b", timer(250, None), 1).await {
        Err(StoreError::TooManyTimers { session, max: 1 }) => assert_eq!(session, "timers-b"),
        other => panic!("expected TooManyTimers, got {other:?}"),
    }
    assert_eq!(
        (once, every, other),
        (1, 2, 1),
        "numbered per session from 1"
    );
    let due: Vec<(u64, String, u64)> = store
        .due_timers()
        .await
        .expect("due index")
        .into_iter()
        .filter(|t| t.session.starts_with("timers"))
        .map(|t| (t.due_ms, t.session, t.id))
        .collect();
    assert_eq!(
        due,
        vec![
            (100, "timers".into(), every),
            (200, "timers-b".into(), other),
            (300, "timers".into(), once)
        ],
        "the due-time index, earliest first"
    );
    let listed = store.timers("timers").await.expect("listed");
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].1.item, payload(7).to_vec(), "the item as armed");
    // A record load and a listing never see timers.
    assert!(stored(store, "timers").await.items.is_empty());
    let listing = store.list_stored(None).await.expect("list");
    assert!(
        listing.iter().all(|e| e.record.is_ok()),
        "a timer key is no record"
    );
    // A fenced write (an older owner) changes neither the record nor the timers.
    let mut newer = header("timers", SessionStatus::Running);
    newer.lease_epoch = 5;
    store
        .write(write(newer.clone(), vec![], StateChange::Keep))
        .await
        .expect("a newer owner");
    let fired = |n: u64, due_ms: u64, next: Option<u64>| TimerChange::Fired {
        timer: n,
        due_ms,
        next_due_ms: next,
    };
    let mut stale = write(
        header("timers", SessionStatus::Running),
        vec![ItemChange::Put(1, payload(7))],
        StateChange::Keep,
    );
    stale.timers = vec![fired(once, 300, None)];
    assert!(matches!(
        store.write(stale).await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(store.timers("timers").await.expect("listed").len(), 2);
    // The owner's write accepting both items: the one-off timer goes, the recurring one
    // moves to its next slot, in the same write.
    let mut accept = write(
        newer,
        vec![
            ItemChange::Put(1, payload(7)),
            ItemChange::Put(2, payload(7)),
        ],
        StateChange::Keep,
    );
    accept.timers = vec![fired(once, 300, None), fired(every, 100, Some(1100))];
    store.write(accept).await.expect("accepted");
    let left = store.timers("timers").await.expect("listed");
    assert_eq!(left.len(), 1, "the one-off timer fired once: {left:?}");
    assert_eq!(
        (left[0].0, left[0].1.due_ms, left[0].1.fired),
        (every, 1100, 1)
    );
    assert_eq!(stored(store, "timers").await.items.len(), 2);
    assert!(store.cancel_timer("timers", every).await.expect("canceled"));
    assert!(!store.cancel_timer("timers", every).await.expect("answered"));
    store
        .arm_timer("timers", timer(400, None), usize::MAX)
        .await
        .expect("armed");
    // A delete takes the session's timers with it.
    assert!(store.delete("timers").await.expect("deleted"));
    assert!(store.timers("timers").await.expect("listed").is_empty());
    let due = store.due_timers().await.expect("due index");
    assert!(
        due.iter().all(|t| t.session != "timers"),
        "a deleted session's timers leave the index: {due:?}"
    );
    assert!(due.iter().any(|t| t.session == "timers-b"));
    store.delete("timers-b").await.expect("deleted");
}

/// Every check above, in order, on one fresh store.
pub async fn run_all(store: Store) {
    whole_records_round_trip(&store).await;
    incremental_writes_build_the_record(&store).await;
    a_replacing_write_is_the_whole_record(&store).await;
    conditional_writes_keep_their_meaning(&store).await;
    writes_are_fenced_by_the_lease_epoch(&store).await;
    status_compare_and_swap(&store).await;
    delete_removes_everything(&store).await;
    list_filters_by_status(&store).await;
    pages_list_in_id_order(&store).await;
    a_header_naming_a_missing_entry_is_corrupt(&store).await;
    invalid_ids_are_refused(&store).await;
    heartbeats(&store).await;
    checkpoint_history(&store).await;
    the_journal_of_durable_steps_is_kept(&store).await;
    kept_events(&store).await;
    durable_timers(&store).await;
}
