//! An in-memory [`CheckpointStore`], for tests and for sessions that only need to
//! survive within one process. It can be told to fail, to exercise the error paths of
//! S16 and S18.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::future::BoxFuture;
use parking_lot::Mutex;

use crate::store::{CheckpointStore, SessionRecord, StoreError};

/// An in-memory store. Cloning records in and out models a real store's copy semantics.
pub struct MemoryStore<I> {
    records: Mutex<HashMap<String, SessionRecord<I>>>,
    fail_loads: AtomicBool,
    fail_saves: AtomicBool,
    saves: AtomicU64,
    deletes: AtomicU64,
}

impl<I> Default for MemoryStore<I> {
    fn default() -> Self {
        MemoryStore {
            records: Mutex::new(HashMap::new()),
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
        Box::pin(async move {
            if self.fail_loads.load(Ordering::SeqCst) {
                return Err(StoreError::Backend {
                    operation: "load",
                    session: session_id.to_string(),
                    message: "injected load failure".into(),
                });
            }
            Ok(self.get(session_id))
        })
    }

    fn save(&self, record: SessionRecord<I>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            if self.fail_saves.load(Ordering::SeqCst) {
                return Err(StoreError::Backend {
                    operation: "save",
                    session: record.session_id.clone(),
                    message: "injected save failure".into(),
                });
            }
            let mut map = self.records.lock();
            let mut record = record;
            record.version = map.get(&record.session_id).map_or(1, |r| r.version + 1);
            map.insert(record.session_id.clone(), record);
            self.saves.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }

    fn delete<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let existed = self.records.lock().remove(session_id).is_some();
            if existed {
                self.deletes.fetch_add(1, Ordering::SeqCst);
            }
            Ok(existed)
        })
    }
}
