//! The sled backend (DESIGN §1: sled `=0.34.7`, wrapped here and only here).
//!
//! Every method blocks: call them only from a blocking thread (`spawn_blocking`, the
//! checkpoint actor's write jobs, or an offline tool), never on a tokio worker. Records
//! live in the tree `records` (key: session id, value: a codec envelope), instance
//! heartbeats in the tree `instances` (key: instance id, value: u64 LE milliseconds).
//!
//! Durability: `flush` makes every write before it survive a process crash (sled 0.34
//! flushes with `sync_file_range`), not a power loss; see docs/operations.md.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::{
    codec, now_ms, CasOutcome, ListEntry, SessionRecord, SessionStatus, StatusKind, StoreError,
};

/// One write (or ordered read) of a wave, applied in order by [`SledBackend::apply`].
#[derive(Debug)]
pub enum WriteOp {
    /// Store an encoded record.
    Put {
        /// The session id.
        key: String,
        /// The codec envelope.
        bytes: Vec<u8>,
    },
    /// Store an encoded record unless the stored one is final (S19).
    PutLive {
        /// The session id.
        key: String,
        /// The codec envelope.
        bytes: Vec<u8>,
    },
    /// Remove a record.
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
    /// Read a record's bytes in order with the writes around it.
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
    /// A put, beat or flush is done.
    Done,
    /// A delete; whether a record existed.
    Deleted(bool),
    /// A compare-and-swap.
    Cas(CasOutcome),
    /// A read; the bytes, if any.
    Read(Option<Vec<u8>>),
}

/// A sled database holding agentloop records.
pub struct SledBackend {
    path: PathBuf,
    db: sled::Db,
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
        let records = db
            .open_tree("records")
            .map_err(|e| backend_err("open", "", e))?;
        let instances = db
            .open_tree("instances")
            .map_err(|e| backend_err("open", "", e))?;
        Ok(SledBackend {
            path,
            db,
            records,
            instances,
        })
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A record's raw bytes. Blocks.
    pub fn get_raw(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.records
            .get(key.as_bytes())
            .map(|v| v.map(|b| b.to_vec()))
            .map_err(|e| backend_err("load", key, e))
    }

    /// A decoded record. Blocks.
    pub fn load<I: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<SessionRecord<I>>, StoreError> {
        match self.get_raw(key)? {
            Some(bytes) => codec::decode_record(key, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Every record (corrupt ones listed with their error), optionally filtered by
    /// status, in key order. Blocks.
    pub fn list<I: DeserializeOwned>(
        &self,
        statuses: Option<&[StatusKind]>,
    ) -> Result<Vec<ListEntry<I>>, StoreError> {
        let mut out = Vec::new();
        for kv in self.records.iter() {
            let (k, v) = kv.map_err(|e| backend_err("list", "", e))?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let record = codec::decode_record::<I>(&key, &v);
            if let (Some(filter), Ok(r)) = (statuses, &record) {
                if !filter.contains(&r.status.kind()) {
                    continue;
                }
            }
            out.push(ListEntry {
                session_id: key,
                record,
            });
        }
        Ok(out)
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

    /// Applies one wave of operations in order (consecutive puts as one sled batch) and
    /// flushes once at the end (group commit). If the flush fails, every write of the
    /// wave reports the failure. Blocks.
    pub fn apply<I: Serialize + DeserializeOwned>(
        &self,
        ops: Vec<WriteOp>,
    ) -> Vec<Result<OpResult, StoreError>> {
        let mut results = self.apply_unflushed::<I>(ops);
        if let Err(e) = self.flush() {
            for r in results.iter_mut() {
                if !matches!(r, Ok(OpResult::Read(_))) {
                    *r = Err(e.clone());
                }
            }
        }
        results
    }

    /// Applies one wave of operations in order without flushing: the writes are visible
    /// to readers at once and durable after the next [`SledBackend::flush`] that starts
    /// after this returns. Blocks.
    pub fn apply_unflushed<I: Serialize + DeserializeOwned>(
        &self,
        ops: Vec<WriteOp>,
    ) -> Vec<Result<OpResult, StoreError>> {
        let mut results: Vec<Result<OpResult, StoreError>> = Vec::with_capacity(ops.len());
        let mut batch = sled::Batch::default();
        // Indices (in `results`) of the puts in `batch`: a failed commit fails exactly
        // those, not the operation that happened to trigger the commit.
        let mut batched: Vec<usize> = Vec::new();
        let commit = |batch: &mut sled::Batch,
                      batched: &mut Vec<usize>,
                      results: &mut Vec<Result<OpResult, StoreError>>| {
            if batched.is_empty() {
                return;
            }
            if let Err(e) = self.records.apply_batch(std::mem::take(batch)) {
                let e = backend_err("save", "", e);
                for &i in batched.iter() {
                    results[i] = Err(e.clone());
                }
            }
            batched.clear();
        };
        for op in ops {
            let r = match op {
                WriteOp::Put { key, bytes } => {
                    batch.insert(key.as_bytes(), bytes);
                    batched.push(results.len());
                    Ok(OpResult::Done)
                }
                WriteOp::PutLive { key, bytes } => {
                    commit(&mut batch, &mut batched, &mut results);
                    self.put_live::<I>(&key, bytes)
                }
                WriteOp::Delete { key } => {
                    commit(&mut batch, &mut batched, &mut results);
                    self.records
                        .remove(key.as_bytes())
                        .map(|old| OpResult::Deleted(old.is_some()))
                        .map_err(|e| backend_err("delete", &key, e))
                }
                WriteOp::Cas { key, from, to } => {
                    commit(&mut batch, &mut batched, &mut results);
                    self.cas::<I>(&key, &from, to)
                }
                WriteOp::Beat { instance, now_ms } => self
                    .instances
                    .insert(instance.as_bytes(), &now_ms.to_le_bytes())
                    .map(|_| OpResult::Done)
                    .map_err(|e| backend_err("heartbeat", &instance, e)),
                WriteOp::Read { key } => {
                    commit(&mut batch, &mut batched, &mut results);
                    self.get_raw(&key).map(OpResult::Read)
                }
                WriteOp::Flush => Ok(OpResult::Done),
            };
            results.push(r);
        }
        commit(&mut batch, &mut batched, &mut results);
        results
    }

    fn put_live<I: Serialize + DeserializeOwned>(
        &self,
        key: &str,
        bytes: Vec<u8>,
    ) -> Result<OpResult, StoreError> {
        // Only the checkpoint actor writes this tree, one operation at a time, so the
        // check and the write cannot be interleaved by another write.
        if let Some(old) = self.get_raw(key)? {
            if let Ok(current) = codec::decode_record::<I>(key, &old) {
                if current.status.is_terminal() {
                    return Err(StoreError::Final {
                        session: key.to_string(),
                        status: current.status,
                    });
                }
            }
        }
        self.records
            .insert(key.as_bytes(), bytes)
            .map(|_| OpResult::Done)
            .map_err(|e| backend_err("save", key, e))
    }

    fn cas<I: Serialize + DeserializeOwned>(
        &self,
        key: &str,
        from: &[StatusKind],
        to: SessionStatus,
    ) -> Result<OpResult, StoreError> {
        // A loop, because compare_and_swap fails if the bytes changed under us (only
        // possible if something outside the checkpoint actor writes the tree).
        for _ in 0..16 {
            let Some(old) = self.get_raw(key)? else {
                return Ok(OpResult::Cas(CasOutcome::Missing));
            };
            let mut record: SessionRecord<I> = codec::decode_record(key, &old)?;
            if !from.contains(&record.status.kind()) {
                return Ok(OpResult::Cas(CasOutcome::Mismatch(record.status)));
            }
            let prev = std::mem::replace(&mut record.status, to.clone());
            if let SessionStatus::Failed(e) = &record.status {
                record.last_error = Some(e.clone());
            }
            record.updated_at_ms = now_ms();
            record.version += 1;
            let new = codec::encode_record(&record)?;
            match self
                .records
                .compare_and_swap(key.as_bytes(), Some(old), Some(new))
                .map_err(|e| backend_err("cas", key, e))?
            {
                Ok(()) => return Ok(OpResult::Cas(CasOutcome::Swapped(prev))),
                Err(_) => continue,
            }
        }
        Err(backend_err(
            "cas",
            key,
            "the record kept changing during compare-and-swap",
        ))
    }
}
