//! An in-memory [`CheckpointStore`], for tests and for sessions that only need to
//! survive within one process. It keeps records as a real store does (encoded entries
//! in an ordered map, laid out and written by `table.rs`, the code the sled backend
//! runs too), applies writes when called (the trait's ordering contract), and can be
//! told to fail, to exercise the error paths of S16 and S18.

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::future::{ready, BoxFuture};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::record::Payload;
use crate::store::table::{self, Table};
use crate::store::{
    now_ms, CasOutcome, CheckpointStore, RecordWrite, SessionRecord, SessionStatus, StatusKind,
    StoreError, Stored, StoredEntry,
};

/// The memory store's table: the ordered map the entries live in.
#[derive(Default)]
struct Entries(BTreeMap<Vec<u8>, Payload>);

impl Table for Entries {
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
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect())
    }
    fn keys_in_range(&self, from: &[u8], to: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self
            .0
            .range::<[u8], _>((Bound::Included(from), Bound::Included(to)))
            .map(|(k, _)| k.clone())
            .collect())
    }
    fn first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .0
            .range::<[u8], _>((Bound::Included(from), Bound::Unbounded))
            .next()
            .map(|(k, _)| k.clone()))
    }
    fn entries_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        Ok(self
            .0
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
            .0
            .range::<[u8], _>((Bound::Included(from), Bound::Included(to)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

/// Whether `key` is a record's head (one per record).
fn is_head(key: &[u8]) -> bool {
    table::parse_key(key).map(|(_, kind)| kind) == Some(table::KeyKind::Header)
}

/// An in-memory store. `I` is the item type of its typed face ([`MemoryStore::get`],
/// [`MemoryStore::insert`] and the trait's provided methods).
pub struct MemoryStore<I> {
    entries: Mutex<Entries>,
    instances: Mutex<HashMap<String, u64>>,
    /// What each instance advertised it can run (S40).
    runs: Mutex<std::collections::BTreeMap<String, agentloop_core::adopt::Runs>>,
    fail_loads: AtomicBool,
    fail_saves: AtomicBool,
    saves: AtomicU64,
    deletes: AtomicU64,
    /// Records read by listings (whole or by page), for tests of what a page costs.
    listed: AtomicU64,
    _items: PhantomData<fn() -> I>,
}

impl<I> Default for MemoryStore<I> {
    fn default() -> Self {
        MemoryStore {
            entries: Mutex::new(Entries::default()),
            instances: Mutex::new(HashMap::new()),
            runs: Mutex::default(),
            fail_loads: AtomicBool::new(false),
            fail_saves: AtomicBool::new(false),
            saves: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            listed: AtomicU64::new(0),
            _items: PhantomData,
        }
    }
}

impl<I> MemoryStore<I> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every following load fail (or succeed again).
    pub fn fail_loads(&self, fail: bool) {
        self.fail_loads.store(fail, Ordering::SeqCst);
    }

    /// Makes every following write fail (or succeed again).
    pub fn fail_saves(&self, fail: bool) {
        self.fail_saves.store(fail, Ordering::SeqCst);
    }

    /// How many writes succeeded.
    pub fn save_count(&self) -> u64 {
        self.saves.load(Ordering::SeqCst)
    }

    /// How many deletes removed a record.
    pub fn delete_count(&self) -> u64 {
        self.deletes.load(Ordering::SeqCst)
    }

    /// How many records listings have answered so far (`list_stored` every one it
    /// lists, `list_page` its page's): what a test of a page's cost counts (issue 52).
    pub fn records_listed(&self) -> u64 {
        self.listed.load(Ordering::SeqCst)
    }

    /// Stores raw bytes under a raw key, bypassing every check: for tests that damage
    /// records (a head that does not decode, as a broken disk would leave one).
    pub fn put_raw(&self, key: &[u8], value: &[u8]) {
        self.entries
            .lock()
            .put(key.to_vec(), Payload::from(value.to_vec()));
    }

    /// How many records are stored.
    pub fn len(&self) -> usize {
        self.entries.lock().0.keys().filter(|k| is_head(k)).count()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A session's record as stored.
    pub fn get_stored(&self, session_id: &str) -> Option<Stored> {
        table::read(&*self.entries.lock(), session_id)
            .ok()
            .flatten()
    }

    /// Every stored key and value, in key order (to compare against a model in tests).
    pub fn raw_entries(&self) -> Vec<(Vec<u8>, Payload)> {
        self.entries
            .lock()
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl<I: Serialize + DeserializeOwned + Clone> MemoryStore<I> {
    /// A copy of a record, decoded, without going through the async API. `None` when
    /// there is none or it does not decode.
    pub fn get(&self, session_id: &str) -> Option<SessionRecord<I>> {
        self.get_stored(session_id)?
            .decode::<I>()
            .ok()
            .map(|l| l.into_record())
    }

    /// Writes a record directly (as another process would), replacing whatever was
    /// stored. Panics if the record's items do not encode: this is a test helper.
    pub fn insert(&self, record: SessionRecord<I>) {
        let id = record.session_id.clone();
        let write = record
            .to_write(crate::store::WriteCondition::Always)
            .unwrap_or_else(|e| panic!("MemoryStore::insert of `{id}`: {e}"));
        if let Err(e) = table::write(&mut *self.entries.lock(), write) {
            panic!("MemoryStore::insert of `{id}`: {e}");
        }
    }
}

impl<I: 'static> CheckpointStore<I> for MemoryStore<I> {
    fn load_stored<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        let r = if self.fail_loads.load(Ordering::SeqCst) {
            Err(StoreError::Backend {
                operation: "load",
                session: session_id.to_string(),
                message: "injected load failure".into(),
            })
        } else {
            table::read(&*self.entries.lock(), session_id)
        };
        Box::pin(ready(r))
    }

    fn write(&self, write: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        let mut entries = self.entries.lock();
        // The condition is checked before the injected failure: a refused write says
        // why it was refused, as a real store would.
        let r = if self.fail_saves.load(Ordering::SeqCst) {
            let id = write.session_id().to_string();
            // Apply to a copy to learn whether the condition would refuse it.
            let mut probe = Entries(entries.0.clone());
            match table::write(&mut probe, write) {
                Err(e) => Err(e),
                Ok(()) => Err(StoreError::Backend {
                    operation: "save",
                    session: id,
                    message: "injected save failure".into(),
                }),
            }
        } else {
            table::write(&mut *entries, write)
        };
        if r.is_ok() {
            self.saves.fetch_add(1, Ordering::SeqCst);
        }
        Box::pin(ready(r))
    }

    fn append_journal_then(
        &self,
        session: &str,
        epoch: u64,
        turn: u64,
        change: crate::store::JournalChange,
        done: crate::store::committer::Answer<()>,
    ) {
        let r = if self.fail_saves.load(Ordering::SeqCst) {
            Err(StoreError::Backend {
                operation: "save",
                session: session.to_string(),
                message: "injected save failure".into(),
            })
        } else {
            table::append_journal(&mut *self.entries.lock(), session, epoch, turn, change)
        };
        if r.is_ok() {
            self.saves.fetch_add(1, Ordering::SeqCst);
        }
        done.send(r);
    }

    fn keeps_events(&self) -> bool {
        true
    }

    fn keeps_history(&self) -> bool {
        true
    }

    fn append_events_then(
        &self,
        session: &str,
        epoch: u64,
        append: crate::store::EventAppend,
        _flush: bool,
        done: crate::store::committer::Answer<()>,
    ) {
        let r = agentloop_core::table::events::append_events(
            &mut *self.entries.lock(),
            session,
            epoch,
            append,
        );
        done.send(r);
    }

    fn read_events(
        &self,
        session: &str,
        after: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<crate::store::KeptEvents, StoreError>> {
        let r =
            agentloop_core::table::events::read_events(&*self.entries.lock(), session, after, max);
        Box::pin(ready(r))
    }

    fn keeps_timers(&self) -> bool {
        true
    }

    fn arm_timer(
        &self,
        session: &str,
        timer: crate::store::StoredTimer,
        max: usize,
    ) -> BoxFuture<'static, Result<u64, StoreError>> {
        let r = table::timers::arm(&mut *self.entries.lock(), session, timer, max);
        Box::pin(ready(r))
    }

    fn cancel_timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<bool, StoreError>> {
        let r = table::timers::cancel(&mut *self.entries.lock(), session, timer);
        Box::pin(ready(r))
    }

    fn change_timer(
        &self,
        session: &str,
        change: crate::store::TimerChange,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let r = table::timers::apply(&mut *self.entries.lock(), session, vec![change]);
        Box::pin(ready(r))
    }

    fn timers(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Vec<(u64, crate::store::StoredTimer)>, StoreError>> {
        let r = table::timers::list(&*self.entries.lock(), session);
        Box::pin(ready(r))
    }

    fn timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<Option<crate::store::StoredTimer>, StoreError>> {
        let r = table::timers::get(&*self.entries.lock(), session, timer);
        Box::pin(ready(r))
    }

    fn due_timers(&self) -> BoxFuture<'static, Result<Vec<crate::store::TimerRef>, StoreError>> {
        let r = table::timers::due_index(&*self.entries.lock());
        Box::pin(ready(r))
    }

    fn delete(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let r = table::delete(&mut *self.entries.lock(), session_id);
        if let Ok(true) = r {
            self.deletes.fetch_add(1, Ordering::SeqCst);
        }
        Box::pin(ready(r))
    }

    fn list_stored(
        &self,
        statuses: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        let entries = self.entries.lock();
        let scan = entries.0.iter().map(|(k, v)| Ok((k.clone(), v.clone())));
        let r = table::list(scan, std::iter::empty(), statuses.as_deref());
        if let Ok(all) = &r {
            self.listed.fetch_add(all.len() as u64, Ordering::SeqCst);
        }
        Box::pin(ready(r))
    }

    fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        let r = table::list_page(&*self.entries.lock(), after, limit);
        if let Ok(page) = &r {
            self.listed.fetch_add(page.len() as u64, Ordering::SeqCst);
        }
        Box::pin(ready(r))
    }

    fn list_kept_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<String>, StoreError>> {
        Box::pin(ready(table::kept_page(&*self.entries.lock(), after, limit)))
    }

    fn cas_status(
        &self,
        session_id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>> {
        let r = table::cas(&mut *self.entries.lock(), session_id, &from, to, now_ms());
        Box::pin(ready(r))
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(ready(Ok(())))
    }

    fn beat(&self, instance: &str, now_ms: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        self.instances.lock().insert(instance.to_string(), now_ms);
        Box::pin(ready(Ok(())))
    }

    fn heartbeat(&self, instance: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        Box::pin(ready(Ok(self.instances.lock().get(instance).copied())))
    }

    fn advertise(
        &self,
        instance: &str,
        runs: &agentloop_core::adopt::Runs,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.runs.lock().insert(instance.to_string(), runs.clone());
        Box::pin(ready(Ok(())))
    }

    fn advertised(
        &self,
    ) -> BoxFuture<
        'static,
        Result<std::collections::BTreeMap<String, agentloop_core::adopt::Runs>, StoreError>,
    > {
        Box::pin(ready(Ok(self.runs.lock().clone())))
    }

    fn instances(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        let mut all: Vec<(String, u64)> = self
            .instances
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        all.sort();
        Box::pin(ready(Ok(all)))
    }

    fn history(
        &self,
        session_id: &str,
        query: crate::store::history::HistoryQuery,
    ) -> BoxFuture<'static, Result<crate::store::history::HistoryAnswer, StoreError>> {
        let r = agentloop_core::table::history::read(&*self.entries.lock(), session_id, query);
        Box::pin(ready(r))
    }

    fn purge(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let r = table::purge(&mut *self.entries.lock(), session_id);
        if let Ok(true) = r {
            self.deletes.fetch_add(1, Ordering::SeqCst);
        }
        Box::pin(ready(r))
    }
}
