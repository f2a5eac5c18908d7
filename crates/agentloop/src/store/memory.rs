//! An in-memory [`CheckpointStore`], for tests and for sessions that only need to
//! survive within one process. Writes are applied when called (the trait's ordering
//! contract), and it can be told to fail, to exercise the error paths of S16 and S18.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::future::{ready, BoxFuture};
use parking_lot::Mutex;

use crate::store::{
    now_ms, CasOutcome, CheckpointStore, ListEntry, SessionRecord, SessionStatus, StatusKind,
    StoreError,
};

/// An in-memory store. Cloning records in and out models a real store's copy semantics.
pub struct MemoryStore<I> {
    records: Mutex<HashMap<String, SessionRecord<I>>>,
    instances: Mutex<HashMap<String, u64>>,
    fail_loads: AtomicBool,
    fail_saves: AtomicBool,
    saves: AtomicU64,
    deletes: AtomicU64,
}

impl<I> Default for MemoryStore<I> {
    fn default() -> Self {
        MemoryStore {
            records: Mutex::new(HashMap::new()),
            instances: Mutex::new(HashMap::new()),
            fail_loads: AtomicBool::new(false),
            fail_saves: AtomicBool::new(false),
            saves: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
        }
    }
}

impl<I: Clone + Send + Sync + 'static> MemoryStore<I> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of a record, without going through the async API.
    pub fn get(&self, session_id: &str) -> Option<SessionRecord<I>> {
        self.records.lock().get(session_id).cloned()
    }

    /// Writes a record directly (as another process would).
    pub fn insert(&self, record: SessionRecord<I>) {
        self.records
            .lock()
            .insert(record.session_id.clone(), record);
    }

    /// Makes every following load fail (or succeed again).
    pub fn fail_loads(&self, fail: bool) {
        self.fail_loads.store(fail, Ordering::SeqCst);
    }

    /// Makes every following save fail (or succeed again).
    pub fn fail_saves(&self, fail: bool) {
        self.fail_saves.store(fail, Ordering::SeqCst);
    }

    /// How many saves succeeded.
    pub fn save_count(&self) -> u64 {
        self.saves.load(Ordering::SeqCst)
    }

    /// How many deletes removed a record.
    pub fn delete_count(&self) -> u64 {
        self.deletes.load(Ordering::SeqCst)
    }

    /// How many records are stored.
    pub fn len(&self) -> usize {
        self.records.lock().len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<I: Clone + Send + Sync + 'static> CheckpointStore<I> for MemoryStore<I> {
    fn load<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<SessionRecord<I>>, StoreError>> {
        let r = if self.fail_loads.load(Ordering::SeqCst) {
            Err(StoreError::Backend {
                operation: "load",
                session: session_id.to_string(),
                message: "injected load failure".into(),
            })
        } else {
            Ok(self.get(session_id))
        };
        Box::pin(ready(r))
    }

    fn save(&self, record: SessionRecord<I>) -> BoxFuture<'static, Result<(), StoreError>> {
        let r = if self.fail_saves.load(Ordering::SeqCst) {
            Err(StoreError::Backend {
                operation: "save",
                session: record.session_id.clone(),
                message: "injected save failure".into(),
            })
        } else {
            let mut map = self.records.lock();
            let mut record = record;
            record.version = map.get(&record.session_id).map_or(1, |r| r.version + 1);
            map.insert(record.session_id.clone(), record);
            self.saves.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        Box::pin(ready(r))
    }

    fn save_live(&self, record: SessionRecord<I>) -> BoxFuture<'static, Result<(), StoreError>> {
        // Check and write under one lock: the write is conditional, atomically.
        let mut map = self.records.lock();
        let current = map.get(&record.session_id);
        if let Some(status) = current
            .map(|r| r.status.clone())
            .filter(SessionStatus::is_terminal)
        {
            return Box::pin(ready(Err(StoreError::Final {
                session: record.session_id,
                status,
            })));
        }
        if self.fail_saves.load(Ordering::SeqCst) {
            return Box::pin(ready(Err(StoreError::Backend {
                operation: "save",
                session: record.session_id.clone(),
                message: "injected save failure".into(),
            })));
        }
        let mut record = record;
        record.version = current.map_or(1, |r| r.version + 1);
        map.insert(record.session_id.clone(), record);
        self.saves.fetch_add(1, Ordering::SeqCst);
        Box::pin(ready(Ok(())))
    }

    fn delete(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let existed = self.records.lock().remove(session_id).is_some();
        if existed {
            self.deletes.fetch_add(1, Ordering::SeqCst);
        }
        Box::pin(ready(Ok(existed)))
    }

    fn list(
        &self,
        statuses: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<ListEntry<I>>, StoreError>> {
        let mut v: Vec<ListEntry<I>> = self
            .records
            .lock()
            .values()
            .filter(|r| {
                statuses
                    .as_ref()
                    .is_none_or(|s| s.contains(&r.status.kind()))
            })
            .map(|r| ListEntry {
                session_id: r.session_id.clone(),
                record: Ok(r.clone()),
            })
            .collect();
        v.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        Box::pin(ready(Ok(v)))
    }

    fn cas_status(
        &self,
        session_id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>> {
        let mut map = self.records.lock();
        let out = match map.get_mut(session_id) {
            None => CasOutcome::Missing,
            Some(r) if from.contains(&r.status.kind()) => {
                let prev = std::mem::replace(&mut r.status, to);
                r.updated_at_ms = now_ms();
                r.version += 1;
                CasOutcome::Swapped(prev)
            }
            Some(r) => CasOutcome::Mismatch(r.status.clone()),
        };
        Box::pin(ready(Ok(out)))
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
}
