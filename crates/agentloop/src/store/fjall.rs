//! The fjall backend (issue 15: fjall 3, wrapped here and only here), beside sled.
//!
//! Every method blocks: call them only from a blocking thread (the checkpoint actor's
//! jobs, `spawn_blocking`, or an offline tool), never on a tokio worker.
//!
//! Keyspaces: `sessions` holds format-2 records laid out by `table.rs` (a header, one
//! entry per item, the state) and the checkpoint history, with the same keys as sled's
//! `sessions` tree; `instances` holds instance heartbeats (key: instance id, value: u64
//! LE milliseconds). Format 1 never existed on fjall, so there is no `records`
//! keyspace: a record of format 1 moves here through `agentloop sessions export` /
//! `import`, which writes it as format 2.
//!
//! Writes: a wave is staged by `wave.rs` and committed as one fjall write batch, which
//! is atomic across keyspaces (heartbeats included). Conditional writes and status
//! compare-and-swaps read, check and write inside that wave without fjall's
//! transactions: **one writer per database** (the checkpoint actor applies one wave at
//! a time and owns the database while it lives; fjall's directory lock keeps other
//! processes out), so nothing can change a record between a wave's read and its commit.
//! A transactional database would add a conflict check per write for a guarantee the
//! single writer already gives (docs/operations.md, "Engines").
//!
//! Durability ([`StoreDurability`], S15b): a committed batch is in fjall's journal buffer;
//! [`FjallBackend::flush`] persists the journal once per group commit, with
//! `PersistMode::Buffer` (`crash`: written to the OS, survives a process crash) or
//! `PersistMode::SyncAll` (`power`: fsync, survives a power loss).

use std::path::{Path, PathBuf};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use crate::store::level::StoreDurability;
use crate::store::record::Payload;
use crate::store::table;
use crate::store::wave::backend_err;
use crate::store::wave::{self, Base, OpResult, Staged, Wave, WriteOp};
use crate::store::{StatusKind, StoreError, Stored, StoredEntry};

/// How fjall gives a level: one `persist` per group commit.
fn mode(level: StoreDurability) -> PersistMode {
    match level {
        StoreDurability::Crash => PersistMode::Buffer,
        StoreDurability::Power => PersistMode::SyncAll,
    }
}

/// A fjall database holding agentloop records.
pub struct FjallBackend {
    path: PathBuf,
    durability: StoreDurability,
    db: Database,
    sessions: Keyspace,
    instances: Keyspace,
}

impl Base for FjallBackend {
    fn base_get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
        self.sessions
            .get(key)
            .map(|v| v.map(|b| Payload::from(b.as_ref())))
            .map_err(|e| backend_err("load", "", e))
    }
    fn base_keys(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.sessions
            .prefix(prefix)
            .map(|g| {
                g.key()
                    .map(|k| k.to_vec())
                    .map_err(|e| backend_err("load", "", e))
            })
            .collect()
    }
    fn base_entries(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        self.sessions
            .prefix(prefix)
            .map(|g| {
                g.into_inner()
                    .map(|(k, v)| (k.to_vec(), Payload::from(v.as_ref())))
                    .map_err(|e| backend_err("load", "", e))
            })
            .collect()
    }
    fn base_range(&self, from: &[u8], to: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        self.sessions
            .range(from..=to)
            .map(|g| {
                g.into_inner()
                    .map(|(k, v)| (k.to_vec(), Payload::from(v.as_ref())))
                    .map_err(|e| backend_err("load", "", e))
            })
            .collect()
    }
    fn base_format1_get(&self, _id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    fn base_first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.sessions.range(from..).next() {
            None => Ok(None),
            Some(g) => g
                .key()
                .map(|k| Some(k.to_vec()))
                .map_err(|e| backend_err("list", "", e)),
        }
    }
    fn base_format1_next_after(&self, _after: Option<&str>) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
}

/// Removes what an interrupted creation of a fjall database left in `dir`.
///
/// Invariant (fjall 3.1, `Database::create_new`): a new database writes its first
/// journal `0.jnl` and its `keyspaces` folder first and its `version` marker last, and
/// a directory without the marker is created anew, which fails on the leftover `0.jnl`
/// ("File exists"). A process killed in between (the crash loop's SIGKILL shortly after
/// start) would leave a directory that never opens again. Without the marker nothing
/// was ever written through the database (it is usable only once creation returned),
/// so the leftovers hold no data: they are removed, and the removal is logged.
fn clear_unfinished_creation(dir: &Path) {
    if dir.join("version").exists() || !dir.join("0.jnl").is_file() {
        return;
    }
    tracing::warn!(dir = %dir.display(),
        "an earlier creation of the fjall database here was interrupted before it finished (no version marker); its leftovers hold no data and are removed");
    if let Err(e) = std::fs::remove_file(dir.join("0.jnl")) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove the leftover journal");
    }
    // Only when empty: anything in it would be data, never removed.
    let _ = std::fs::remove_dir(dir.join("keyspaces"));
}

impl FjallBackend {
    /// Opens (or creates) the database in `dir`. Blocks.
    pub fn open(dir: impl AsRef<Path>, durability: StoreDurability) -> Result<Self, StoreError> {
        let path = dir.as_ref().to_path_buf();
        let open_err = |e: fjall::Error| StoreError::Backend {
            operation: "open",
            session: String::new(),
            message: match e {
                fjall::Error::Locked => format!(
                    "the data directory {} is locked by another process (another agentloop \
                     holds it): stop that process or choose another directory",
                    path.display()
                ),
                e => format!("cannot open the fjall database in {}: {e}", path.display()),
            },
        };
        clear_unfinished_creation(&path);
        let db = Database::builder(&path).open().map_err(open_err)?;
        let sessions = db
            .keyspace("sessions", KeyspaceCreateOptions::default)
            .map_err(open_err)?;
        let instances = db
            .keyspace("instances", KeyspaceCreateOptions::default)
            .map_err(open_err)?;
        Ok(FjallBackend {
            path,
            durability,
            db,
            sessions,
            instances,
        })
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What a flush survives.
    pub fn durability(&self) -> StoreDurability {
        self.durability
    }

    /// A session's record as stored. Blocks.
    pub fn load(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        table::read(&Wave::new(self), id)
    }

    /// Reads a session's checkpoint history. Blocks.
    pub fn history(
        &self,
        id: &str,
        query: crate::store::history::HistoryQuery,
    ) -> Result<crate::store::history::HistoryAnswer, StoreError> {
        agentloop_core::table::history::read(&Wave::new(self), id, query)
    }

    /// Every record (corrupt ones listed with their error), optionally filtered by
    /// status, in id order. Blocks.
    pub fn list(&self, statuses: Option<&[StatusKind]>) -> Result<Vec<StoredEntry>, StoreError> {
        let scan = self.sessions.iter().map(|g| {
            g.into_inner()
                .map(|(k, v)| (k.to_vec(), Payload::from(v.as_ref())))
                .map_err(|e| backend_err("list", "", e))
        });
        table::list(scan, std::iter::empty(), statuses)
    }

    /// Every key and value stored for a session (its format-2 entries), named,
    /// undecoded: for inspecting a record that does not decode. Blocks.
    pub fn raw_entries(&self, id: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let entries = self
            .base_entries(&table::session_prefix(id))?
            .into_iter()
            .map(|(k, v)| (k, v.to_vec()));
        Ok(table::raw_entries(id, entries))
    }

    /// An instance's last heartbeat. Blocks.
    pub fn heartbeat(&self, instance: &str) -> Result<Option<u64>, StoreError> {
        let v = self
            .instances
            .get(instance.as_bytes())
            .map_err(|e| backend_err("heartbeat", instance, e))?;
        Ok(v.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok().map(u64::from_le_bytes)))
    }

    /// Persists every write committed so far at the database's durability level.
    /// Blocks.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db
            .persist(mode(self.durability))
            .map_err(|e| backend_err("flush", "", e))
    }

    /// Stores raw bytes under a raw key of the `sessions` keyspace, bypassing every
    /// check: for tests that damage records (as `SledBackend::put_raw`). Blocks.
    pub fn put_raw(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let mut batch = self.db.batch();
        batch.insert(&self.sessions, key, value);
        batch.commit().map_err(|e| backend_err("save", "", e))
    }

    /// Persists the journal with an fsync, whatever the level (a clean close). Blocks.
    pub fn sync_for_close(&self) -> Result<(), StoreError> {
        self.db
            .persist(PersistMode::SyncAll)
            .map_err(|e| backend_err("flush", "", e))
    }

    /// Applies one wave of operations in order without persisting: each sees the ones
    /// before it; the wave's changes (heartbeats included) are committed as one atomic
    /// batch, visible to readers at once and durable after the next
    /// [`FjallBackend::flush`] that starts after this returns. Blocks.
    pub(crate) fn apply_unflushed(&self, ops: Vec<WriteOp>) -> Vec<Result<OpResult, StoreError>> {
        let (mut results, staged) = wave::apply(self, ops);
        let Staged {
            sessions,
            format1,
            beats,
        } = staged;
        // Invariant: format-1 changes follow a format-1 read, and this engine has none.
        // Should one appear, nothing of the wave is written (rather than a part of it).
        if !format1.is_empty() {
            let e = backend_err(
                "save",
                "",
                "internal: a format-1 change on fjall; nothing of this wave was written",
            );
            tracing::error!(error = %e, "a wave was refused");
            wave::fail_changes(&mut results, &e);
            for (i, _, _) in beats {
                results[i] = Err(e.clone());
            }
            return results;
        }
        let mut batch = self.db.batch();
        for (k, v) in sessions {
            match v {
                Some(v) => batch.insert(&self.sessions, k, v.as_ref()),
                None => batch.remove(&self.sessions, k),
            }
        }
        for (_, instance, now_ms) in &beats {
            batch.insert(&self.instances, instance.as_bytes(), now_ms.to_le_bytes());
        }
        if let Err(e) = batch.commit() {
            let e = backend_err("save", "", e);
            wave::fail_changes(&mut results, &e);
            for (i, _, _) in beats {
                results[i] = Err(e.clone());
            }
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A creation killed before fjall wrote its version marker leaves `0.jnl`, `lock`
    /// and an empty `keyspaces`: the directory opens again (it used to fail with "File
    /// exists" forever), and a real database's files are never touched.
    #[test]
    fn an_interrupted_creation_does_not_brick_the_directory() {
        let dir = std::env::temp_dir().join(format!("agentloop-fjall-half-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("keyspaces")).unwrap();
        std::fs::write(dir.join("0.jnl"), vec![0u8; 4096]).unwrap();
        std::fs::write(dir.join("lock"), b"").unwrap();
        let b =
            FjallBackend::open(&dir, StoreDurability::Crash).expect("opens after a half creation");
        b.flush().unwrap();
        drop(b);
        assert!(dir.join("version").is_file());
        // A finished database keeps its journal across opens.
        let b = FjallBackend::open(&dir, StoreDurability::Crash).expect("opens again");
        drop(b);
        assert!(dir.join("version").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
