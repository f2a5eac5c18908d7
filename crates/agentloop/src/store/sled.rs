//! The sled backend (DESIGN §1: sled `=0.34.7`, wrapped here and only here).
//!
//! Every method blocks: call them only from a blocking thread (`spawn_blocking`, the
//! checkpoint actor's write jobs, or an offline tool), never on a tokio worker.
//!
//! Trees: `sessions` holds format-2 records, laid out by `table.rs` (a header, one
//! entry per item, the state); `records` holds format-1 records (key: session id, one
//! envelope each), read and converted on their first write; `instances` holds instance
//! heartbeats (key: instance id, value: u64 LE milliseconds).
//!
//! A wave of operations ([`SledBackend::apply_unflushed`]) is staged over the tree in
//! memory, each operation seeing the ones before it, and committed as one sled batch:
//! every write of the wave, all sessions together, is applied atomically.
//!
//! Durability: `flush` makes every write before it survive a process crash (sled 0.34
//! flushes with `sync_file_range`), not a power loss; see docs/operations.md.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};

use crate::store::record::Payload;
use crate::store::table::{self, Table};
use crate::store::{
    now_ms, CasOutcome, RecordWrite, SessionStatus, StatusKind, StoreError, Stored, StoredEntry,
};

/// One operation of a wave, applied in order by [`SledBackend::apply_unflushed`].
#[derive(Debug)]
pub enum WriteOp {
    /// A change to one session's record.
    Write(Box<RecordWrite>),
    /// Remove a session's record (every entry).
    Delete {
        /// The session id.
        key: String,
    },
    /// Compare-and-swap a record's status.
    Cas {
        /// The session id.
        key: String,
        /// The statuses that allow the swap.
        from: Vec<StatusKind>,
        /// The new status.
        to: SessionStatus,
    },
    /// Renew an instance heartbeat.
    Beat {
        /// The instance id.
        instance: String,
        /// The heartbeat time.
        now_ms: u64,
    },
    /// Remove a session's record and its checkpoint history.
    Purge {
        /// The session id.
        key: String,
    },
    /// Read a record in order with the writes around it.
    Read {
        /// The session id.
        key: String,
    },
    /// Nothing: its answer comes after the wave's flush.
    Flush,
}

/// The result of one [`WriteOp`].
#[derive(Debug)]
pub enum OpResult {
    /// A write, beat or flush is done.
    Done,
    /// A delete; whether a record existed.
    Deleted(bool),
    /// A compare-and-swap.
    Cas(CasOutcome),
    /// A read; the record, if any (boxed: records are large next to the other results).
    Read(Option<Box<Stored>>),
}

/// A sled database holding agentloop records.
pub struct SledBackend {
    path: PathBuf,
    db: sled::Db,
    sessions: sled::Tree,
    records: sled::Tree,
    instances: sled::Tree,
}

fn backend_err(operation: &'static str, session: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        operation,
        session: session.to_string(),
        message: e.to_string(),
    }
}

/// The tree with a wave's staged changes on top.
struct Wave<'a> {
    backend: &'a SledBackend,
    staged: BTreeMap<Vec<u8>, Option<Payload>>,
    format1: HashMap<String, Option<Vec<u8>>>,
}

impl<'a> Wave<'a> {
    fn new(backend: &'a SledBackend) -> Self {
        Wave {
            backend,
            staged: BTreeMap::new(),
            format1: HashMap::new(),
        }
    }

    fn merged_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        let mut out: BTreeMap<Vec<u8>, Payload> = BTreeMap::new();
        for kv in self.backend.sessions.scan_prefix(prefix) {
            let (k, v) = kv.map_err(|e| backend_err("load", "", e))?;
            out.insert(k.to_vec(), Payload::from(v.as_ref()));
        }
        for (k, v) in self
            .staged
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            match v {
                Some(v) => out.insert(k.clone(), v.clone()),
                None => out.remove(k),
            };
        }
        Ok(out.into_iter().collect())
    }

    /// Commits the staged changes: one atomic batch for the sessions tree, then the
    /// format-1 changes (a conversion's leftover is harmless: format 2 wins).
    fn commit(self) -> Result<(), StoreError> {
        if self.staged.len() == 1 {
            // One key: a plain insert or remove is atomic on its own and spares sled's
            // batch manifest (which seals the log buffer: an extra write at the flush).
            if let Some((k, v)) = self.staged.into_iter().next() {
                let r = match v {
                    Some(v) => self.backend.sessions.insert(k, v.as_ref()).map(|_| ()),
                    None => self.backend.sessions.remove(k).map(|_| ()),
                };
                r.map_err(|e| backend_err("save", "", e))?;
            }
        } else if !self.staged.is_empty() {
            let mut batch = sled::Batch::default();
            for (k, v) in self.staged {
                match v {
                    Some(v) => batch.insert(k, v.as_ref()),
                    None => batch.remove(k),
                }
            }
            self.backend
                .sessions
                .apply_batch(batch)
                .map_err(|e| backend_err("save", "", e))?;
        }
        for (id, v) in self.format1 {
            let r = match v {
                Some(bytes) => self
                    .backend
                    .records
                    .insert(id.as_bytes(), bytes)
                    .map(|_| ()),
                None => self.backend.records.remove(id.as_bytes()).map(|_| ()),
            };
            r.map_err(|e| backend_err("save", &id, e))?;
        }
        Ok(())
    }
}

impl Table for Wave<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
        if let Some(v) = self.staged.get(key) {
            return Ok(v.clone());
        }
        self.backend
            .sessions
            .get(key)
            .map(|v| v.map(|b| Payload::from(b.as_ref())))
            .map_err(|e| backend_err("load", "", e))
    }
    fn put(&mut self, key: Vec<u8>, value: Payload) {
        self.staged.insert(key, Some(value));
    }
    fn remove(&mut self, key: Vec<u8>) {
        self.staged.insert(key, None);
    }
    fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        // Keys only: a replacing write scans its session's keys to remove them, and
        // copying their values (the state, items) would be wasted.
        let mut out: std::collections::BTreeSet<Vec<u8>> = std::collections::BTreeSet::new();
        for k in self.backend.sessions.scan_prefix(prefix).keys() {
            out.insert(k.map_err(|e| backend_err("load", "", e))?.to_vec());
        }
        for (k, v) in self
            .staged
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            match v {
                Some(_) => out.insert(k.clone()),
                None => out.remove(k),
            };
        }
        Ok(out.into_iter().collect())
    }
    fn entries_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        self.merged_prefix(prefix)
    }
    fn format1_get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(v) = self.format1.get(id) {
            return Ok(v.clone());
        }
        self.backend
            .records
            .get(id.as_bytes())
            .map(|v| v.map(|b| b.to_vec()))
            .map_err(|e| backend_err("load", id, e))
    }
    fn format1_put(&mut self, id: &str, bytes: Vec<u8>) {
        self.format1.insert(id.to_string(), Some(bytes));
    }
    fn format1_remove(&mut self, id: &str) {
        self.format1.insert(id.to_string(), None);
    }
}

impl SledBackend {
    /// Opens (or creates) the database in `dir`. Blocks.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = dir.as_ref().to_path_buf();
        let db = sled::Config::new()
            .path(&path)
            .open()
            .map_err(|e| StoreError::Backend {
                operation: "open",
                session: String::new(),
                message: format!(
                    "cannot open the data directory {}: {e} (is another agentloop process using it?)",
                    path.display()
                ),
            })?;
        let tree = |name: &str| db.open_tree(name).map_err(|e| backend_err("open", "", e));
        let sessions = tree("sessions")?;
        let records = tree("records")?;
        let instances = tree("instances")?;
        Ok(SledBackend {
            path,
            db,
            sessions,
            records,
            instances,
        })
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A session's record as stored. Blocks.
    pub fn load(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        table::read(&Wave::new(self), id)
    }

    /// Reads a session's checkpoint history (issue 13). Blocks.
    pub fn history(
        &self,
        id: &str,
        query: crate::store::history::HistoryQuery,
    ) -> Result<crate::store::history::HistoryAnswer, StoreError> {
        crate::store::history::read(&Wave::new(self), id, query)
    }

    /// Every key and value stored for a session (format 2 entries, then a format-1
    /// record under the key `<id>` of the `records` tree), undecoded: for inspecting a
    /// record that does not decode. Blocks.
    pub fn raw_entries(&self, id: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.sessions.scan_prefix(table::session_prefix(id)) {
            let (k, v) = kv.map_err(|e| backend_err("load", id, e))?;
            let name = match table::parse_key(&k) {
                Some((_, table::KeyKind::Header)) => "header".to_string(),
                Some((_, table::KeyKind::Item(seq))) => format!("item {seq}"),
                Some((_, table::KeyKind::State)) => "state".to_string(),
                _ => format!("unknown key {:02x?}", &k[..]),
            };
            out.push((name, v.to_vec()));
        }
        if let Some(v) = self
            .records
            .get(id.as_bytes())
            .map_err(|e| backend_err("load", id, e))?
        {
            out.push(("format-1 record".to_string(), v.to_vec()));
        }
        Ok(out)
    }

    /// Stores raw bytes under a raw key of the `sessions` tree, bypassing every check:
    /// for tests that damage records and for repair tools. Blocks.
    pub fn put_raw(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.sessions
            .insert(key, value)
            .map(|_| ())
            .map_err(|e| backend_err("save", "", e))
    }

    /// Stores a format-1 record's bytes under `id` (as builds before issue 12 did): for
    /// migration tests. Blocks.
    pub fn put_format1(&self, id: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.records
            .insert(id.as_bytes(), bytes)
            .map(|_| ())
            .map_err(|e| backend_err("save", id, e))
    }

    /// Every record (corrupt ones listed with their error), optionally filtered by
    /// status, in id order. Blocks.
    pub fn list(&self, statuses: Option<&[StatusKind]>) -> Result<Vec<StoredEntry>, StoreError> {
        let scan = self.sessions.iter().map(|kv| {
            kv.map(|(k, v)| (k.to_vec(), Payload::from(v.as_ref())))
                .map_err(|e| backend_err("list", "", e))
        });
        let format1 = self.records.iter().map(|kv| {
            kv.map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v.to_vec()))
                .map_err(|e| backend_err("list", "", e))
        });
        table::list(scan, format1, statuses)
    }

    /// An instance's last heartbeat. Blocks.
    pub fn heartbeat(&self, instance: &str) -> Result<Option<u64>, StoreError> {
        let v = self
            .instances
            .get(instance.as_bytes())
            .map_err(|e| backend_err("heartbeat", instance, e))?;
        Ok(v.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok().map(u64::from_le_bytes)))
    }

    /// Flushes every write so far to disk. Blocks.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db
            .flush()
            .map(|_| ())
            .map_err(|e| backend_err("flush", "", e))
    }

    /// Applies one wave of operations in order and flushes once at the end (group
    /// commit). If the flush fails, every operation of the wave but reads reports the
    /// failure. Blocks.
    pub fn apply(&self, ops: Vec<WriteOp>) -> Vec<Result<OpResult, StoreError>> {
        let mut results = self.apply_unflushed(ops);
        if let Err(e) = self.flush() {
            for r in results.iter_mut() {
                if !matches!(r, Ok(OpResult::Read(_))) {
                    *r = Err(e.clone());
                }
            }
        }
        results
    }

    /// Applies one wave of operations in order without flushing: each sees the ones
    /// before it; all the wave's record changes are committed as one atomic batch,
    /// visible to readers at once and durable after the next [`SledBackend::flush`]
    /// that starts after this returns. Blocks.
    pub fn apply_unflushed(&self, ops: Vec<WriteOp>) -> Vec<Result<OpResult, StoreError>> {
        let mut wave = Wave::new(self);
        let mut results: Vec<Result<OpResult, StoreError>> = Vec::with_capacity(ops.len());
        let mut beats = Vec::new();
        for op in ops {
            let r = match op {
                WriteOp::Write(w) => table::write(&mut wave, *w).map(|()| OpResult::Done),
                WriteOp::Delete { key } => table::delete(&mut wave, &key).map(OpResult::Deleted),
                WriteOp::Purge { key } => table::purge(&mut wave, &key).map(OpResult::Deleted),
                WriteOp::Cas { key, from, to } => {
                    table::cas(&mut wave, &key, &from, to, now_ms()).map(OpResult::Cas)
                }
                WriteOp::Beat { instance, now_ms } => {
                    beats.push((results.len(), instance, now_ms));
                    Ok(OpResult::Done)
                }
                WriteOp::Read { key } => {
                    table::read(&wave, &key).map(|r| OpResult::Read(r.map(Box::new)))
                }
                WriteOp::Flush => Ok(OpResult::Done),
            };
            results.push(r);
        }
        if let Err(e) = wave.commit() {
            for r in results.iter_mut() {
                if matches!(
                    r,
                    Ok(OpResult::Done | OpResult::Deleted(_) | OpResult::Cas(_))
                ) {
                    *r = Err(e.clone());
                }
            }
        }
        for (i, instance, now_ms) in beats {
            if let Err(e) = self
                .instances
                .insert(instance.as_bytes(), &now_ms.to_le_bytes())
            {
                results[i] = Err(backend_err("heartbeat", &instance, e));
            }
        }
        results
    }
}
