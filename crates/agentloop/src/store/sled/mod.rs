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
//! A wave of operations (`SledBackend::apply_unflushed`) is staged over the tree in
//! memory by `wave.rs`, each operation seeing the ones before it, and committed here as
//! one sled batch: every write of the wave, all sessions together, is applied
//! atomically.
//!
//! Durability ([`StoreDurability`], S15b): sled 0.34's `flush` writes its log with
//! `sync_file_range`, which survives a process crash but not a power loss (it neither
//! flushes the disk's cache nor writes the file's metadata; sled's own flusher fsyncs
//! every 500 ms). At `crash` that flush is all a group commit does. At `power` (the
//! default) [`SledBackend::flush`] then does what sled's flush leaves undone, once per
//! group commit: an fsync of each blob file sled finished since the last flush (values
//! too large for a log segment, under `blobs/`), of the database's directories when
//! their entries changed (a new blob, a snapshot's rename), then of the data file
//! (`db`), so an acknowledged write survives a power cut (proven by the power-cut test,
//! `crates/agentloop-cli/tests/power_cut.rs`). The changes are learned from an inotify
//! watch (Linux), else by listing the directories.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::store::level::StoreDurability;
use crate::store::offline;
use crate::store::record::Payload;
use crate::store::table;
use crate::store::wave::backend_err;
use crate::store::wave::{self, Base, OpResult, Staged, Wave, WriteOp};
use crate::store::write::RecordWrite;
use crate::store::{StatusKind, StoreError, Stored, StoredEntry};

/// A sled database holding agentloop records.
pub struct SledBackend {
    path: PathBuf,
    db: sled::Db,
    /// What the `power` level syncs after sled's flush; `None` at `crash`.
    power: Option<PowerSync>,
    sessions: sled::Tree,
    records: sled::Tree,
    instances: sled::Tree,
}

impl Base for SledBackend {
    fn base_get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
        self.sessions
            .get(key)
            .map(|v| v.map(|b| Payload::from(b.as_ref())))
            .map_err(|e| backend_err("load", "", e))
    }
    fn base_keys(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.sessions
            .scan_prefix(prefix)
            .keys()
            .map(|k| {
                k.map(|k| k.to_vec())
                    .map_err(|e| backend_err("load", "", e))
            })
            .collect()
    }
    fn base_entries(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        self.sessions
            .scan_prefix(prefix)
            .map(|kv| {
                kv.map(|(k, v)| (k.to_vec(), Payload::from(v.as_ref())))
                    .map_err(|e| backend_err("load", "", e))
            })
            .collect()
    }
    fn base_range(&self, from: &[u8], to: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        self.sessions
            .range(from..=to)
            .map(|kv| {
                kv.map(|(k, v)| (k.to_vec(), Payload::from(v.as_ref())))
                    .map_err(|e| backend_err("load", "", e))
            })
            .collect()
    }
    fn base_format1_get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.records
            .get(id.as_bytes())
            .map(|v| v.map(|b| b.to_vec()))
            .map_err(|e| backend_err("load", id, e))
    }
    fn base_first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.sessions.range(from..).keys().next() {
            None => Ok(None),
            Some(k) => k
                .map(|k| Some(k.to_vec()))
                .map_err(|e| backend_err("list", "", e)),
        }
    }
    fn base_format1_next_after(&self, after: Option<&str>) -> Result<Option<String>, StoreError> {
        use std::ops::Bound;
        let from = match after {
            Some(a) => Bound::Excluded(a.as_bytes()),
            None => Bound::Unbounded,
        };
        match self
            .records
            .range::<&[u8], _>((from, Bound::Unbounded))
            .keys()
            .next()
        {
            None => Ok(None),
            Some(k) => k
                .map(|k| Some(String::from_utf8_lossy(&k).into_owned()))
                .map_err(|e| backend_err("list", "", e)),
        }
    }
}

/// sled's page cache, in bytes (sled's own default is 1 GiB, which a node with a
/// million sessions would fill with their records). Records not in it are read from
/// disk (and the OS's page cache): a node with a million sessions asleep (S39) keeps
/// them on disk, not in its heap (B11).
pub const SLED_CACHE_BYTES: u64 = 32 << 20;

impl SledBackend {
    /// Opens (or creates) the database in `dir` at the default level, `power`. Blocks.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_at(dir, StoreDurability::default())
    }

    /// Opens (or creates) the database in `dir` at durability `level`. Blocks.
    pub fn open_at(dir: impl AsRef<Path>, level: StoreDurability) -> Result<Self, StoreError> {
        let path = dir.as_ref().to_path_buf();
        let db = sled::Config::new()
            .path(&path)
            .cache_capacity(SLED_CACHE_BYTES)
            .open()
            .map_err(|e| StoreError::Backend {
                operation: "open",
                session: String::new(),
                message: format!("cannot open the sled database in {}: {e}", path.display()),
            })?;
        let tree = |name: &str| db.open_tree(name).map_err(|e| backend_err("open", "", e));
        let sessions = tree("sessions")?;
        let records = tree("records")?;
        let instances = tree("instances")?;
        let power = match level {
            StoreDurability::Crash => None,
            StoreDurability::Power => Some(PowerSync::open(&path)?),
        };
        Ok(SledBackend {
            path,
            db,
            power,
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
        agentloop_core::table::history::read(&Wave::new(self), id, query)
    }

    /// Every key and value stored for a session (format 2 entries, then a format-1
    /// record under the key `<id>` of the `records` tree), undecoded: for inspecting a
    /// record that does not decode. Blocks.
    pub fn raw_entries(&self, id: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut entries = Vec::new();
        for kv in self.sessions.scan_prefix(table::session_prefix(id)) {
            let (k, v) = kv.map_err(|e| backend_err("load", id, e))?;
            entries.push((k.to_vec(), v.to_vec()));
        }
        let mut out = table::raw_entries(id, entries);
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

    /// What an acknowledged write survives.
    pub fn durability(&self) -> StoreDurability {
        match self.power {
            Some(_) => StoreDurability::Power,
            None => StoreDurability::Crash,
        }
    }

    /// Makes every write so far durable at the backend's level: sled's flush, then at
    /// `power` the fsyncs it leaves undone (see the module's doc). Blocks.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.flush_log()?;
        match &self.power {
            Some(power) => power.sync(),
            None => Ok(()),
        }
    }

    /// sled's own flush (`sync_file_range` of its log): what `crash` acknowledges after.
    fn flush_log(&self) -> Result<(), StoreError> {
        self.db
            .flush()
            .map(|_| ())
            .map_err(|e| backend_err("flush", "", e))
    }

    /// Flushes, then makes every write survive a power loss whatever the level (a
    /// clean close). Blocks.
    pub fn sync_for_close(&self) -> Result<(), StoreError> {
        self.flush_log()?;
        match &self.power {
            Some(power) => power.sync(),
            None => PowerSync::open_all(&self.path).map(|_| ()),
        }
    }

    /// Writes one change durably; see [`Backend::write`](crate::store::Backend::write).
    pub fn write(&self, write: RecordWrite) -> Result<(), StoreError> {
        offline::write_all(&|ops| self.apply(ops), vec![write])
    }

    /// Writes several changes as one durable batch; see
    /// [`Backend::write_all`](crate::store::Backend::write_all).
    pub fn write_all(&self, writes: Vec<RecordWrite>) -> Result<(), StoreError> {
        offline::write_all(&|ops| self.apply(ops), writes)
    }

    /// Deletes a record, keeping its history; see
    /// [`Backend::delete`](crate::store::Backend::delete).
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let op = WriteOp::Delete {
            key: id.to_string(),
        };
        offline::removal(&|ops| self.apply(ops), op, "delete", id)
    }

    /// Deletes a record and its history; see
    /// [`Backend::purge`](crate::store::Backend::purge).
    pub fn purge(&self, id: &str) -> Result<bool, StoreError> {
        let op = WriteOp::Purge {
            key: id.to_string(),
        };
        offline::removal(&|ops| self.apply(ops), op, "purge", id)
    }

    /// Renews a heartbeat; see [`Backend::beat`](crate::store::Backend::beat).
    pub fn beat(&self, instance: &str, now_ms: u64) -> Result<(), StoreError> {
        offline::beat(&|ops| self.apply(ops), instance, now_ms)
    }

    /// Applies one wave of operations in order and flushes once at the end (group
    /// commit). If the flush fails, every operation of the wave but reads reports the
    /// failure. Blocks.
    pub(crate) fn apply(&self, ops: Vec<WriteOp>) -> Vec<Result<OpResult, StoreError>> {
        let mut results = self.apply_unflushed(ops);
        if let Err(e) = self.flush() {
            wave::fail_unflushed(&mut results, &e);
        }
        results
    }

    /// Applies one wave of operations in order without flushing: each sees the ones
    /// before it; all the wave's record changes are committed as one atomic batch,
    /// visible to readers at once and durable after the next [`SledBackend::flush`]
    /// that starts after this returns. Blocks.
    pub(crate) fn apply_unflushed(&self, ops: Vec<WriteOp>) -> Vec<Result<OpResult, StoreError>> {
        let (mut results, staged) = wave::apply(self, ops);
        let Staged {
            sessions,
            format1,
            beats,
        } = staged;
        if let Err(e) = self.commit(sessions, format1) {
            wave::fail_changes(&mut results, &e);
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

    /// Commits a wave's staged changes: one atomic batch for the sessions tree, then the
    /// format-1 changes (a conversion's leftover is harmless: format 2 wins).
    fn commit(
        &self,
        sessions: std::collections::BTreeMap<Vec<u8>, Option<Payload>>,
        format1: std::collections::HashMap<String, Option<Vec<u8>>>,
    ) -> Result<(), StoreError> {
        if sessions.len() == 1 {
            // One key: a plain insert or remove is atomic on its own and spares sled's
            // batch manifest (which seals the log buffer: an extra write at the flush).
            if let Some((k, v)) = sessions.into_iter().next() {
                let r = match v {
                    Some(v) => self.sessions.insert(k, v.as_ref()).map(|_| ()),
                    None => self.sessions.remove(k).map(|_| ()),
                };
                r.map_err(|e| backend_err("save", "", e))?;
            }
        } else if !sessions.is_empty() {
            let mut batch = sled::Batch::default();
            for (k, v) in sessions {
                match v {
                    Some(v) => batch.insert(k, v.as_ref()),
                    None => batch.remove(k),
                }
            }
            self.sessions
                .apply_batch(batch)
                .map_err(|e| backend_err("save", "", e))?;
        }
        for (id, v) in format1 {
            let r = match v {
                Some(bytes) => self.records.insert(id.as_bytes(), bytes).map(|_| ()),
                None => self.records.remove(id.as_bytes()).map(|_| ()),
            };
            r.map_err(|e| backend_err("save", &id, e))?;
        }
        Ok(())
    }
}

/// What the `power` level makes durable after sled's flush (S15b): sled 0.34 writes its
/// log with `sync_file_range` and never fsyncs a directory, so a power cut could lose
/// what its flush acknowledged. Held by a [`SledBackend`] opened at `power`.
struct PowerSync {
    /// The database's directory (its entries: `db`, `conf`, `blobs/`, `snap.*`).
    dir: PathBuf,
    /// sled's data file, opened a second time: an fsync through any descriptor makes
    /// every write to the file durable.
    data: File,
    /// How the directories' changes since the last sync are learned.
    changes: Mutex<Tracker>,
}

/// How [`PowerSync`] learns what changed in the database's directories: a new blob
/// file (to fsync, with its directory) or an entry created, renamed or removed (a
/// snapshot renamed into place: the directory to fsync).
enum Tracker {
    /// inotify (Linux): one non-blocking read per sync.
    #[cfg(target_os = "linux")]
    Watch(watch::DirWatch),
    /// Listing both directories at every sync and comparing (other systems, or where
    /// inotify cannot be had).
    List(Entries),
}

/// What changed since the last sync.
#[derive(Default)]
struct Changed {
    /// Entries of the database's directory changed.
    root: bool,
    /// Entries of `blobs/` changed.
    blobs: bool,
    /// Blob files created or renamed into `blobs/`.
    new_blobs: BTreeSet<std::ffi::OsString>,
}

/// The entries of the database's directory and of its `blobs/` directory.
#[derive(Default, PartialEq, Eq)]
struct Entries {
    root: BTreeSet<std::ffi::OsString>,
    blobs: BTreeSet<std::ffi::OsString>,
    /// The blobs that were new at the last look: a listing cannot tell a blob sled is
    /// still writing from a finished one, so each new blob is synced at two syncs in a
    /// row (sled writes a blob whole before it logs a pointer to it).
    fresh: BTreeSet<std::ffi::OsString>,
}

impl Entries {
    fn list(dir: &Path) -> Result<Entries, StoreError> {
        Ok(Entries {
            root: names(dir)?,
            blobs: names(&dir.join("blobs"))?,
            fresh: BTreeSet::new(),
        })
    }

    /// What changed from `self` to `now` (which becomes `self`); the blobs new at the
    /// last look are synced again.
    fn advance(&mut self, mut now: Entries) -> Changed {
        let fresh: BTreeSet<_> = now.blobs.difference(&self.blobs).cloned().collect();
        let mut new_blobs = fresh.clone();
        new_blobs.extend(self.fresh.intersection(&now.blobs).cloned());
        let changed = Changed {
            root: now.root != self.root,
            blobs: now.blobs != self.blobs,
            new_blobs,
        };
        now.fresh = fresh;
        *self = now;
        changed
    }
}

#[cfg(target_os = "linux")]
mod watch {
    //! The directories' changes from inotify (Linux): a watch on the database's
    //! directory and one on `blobs/`, read without blocking at every sync.

    use std::collections::BTreeSet;
    use std::path::Path;

    use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

    use super::{Changed, Entries};
    use crate::store::StoreError;

    /// Entry changes: what makes a directory need an fsync.
    fn mask() -> WatchMask {
        WatchMask::CREATE | WatchMask::DELETE | WatchMask::MOVED_FROM | WatchMask::MOVED_TO
    }

    /// On `blobs/`, also a file closed after writing: a blob is synced once sled has
    /// written it whole (`CLOSE_WRITE`), not when it appears (`CREATE`, before its
    /// bytes).
    fn blob_mask() -> WatchMask {
        mask() | WatchMask::CLOSE_WRITE
    }

    pub(super) struct DirWatch {
        inotify: Inotify,
        root: WatchDescriptor,
        blobs: Option<WatchDescriptor>,
        buffer: Vec<u8>,
        /// A watch on `blobs/` could not be had after it appeared: the caller lists
        /// the directories from now on.
        broken: bool,
    }

    impl DirWatch {
        /// Watches `dir` and its `blobs/`; `None` where inotify cannot be had (the
        /// caller lists the directories instead).
        pub(super) fn new(dir: &Path) -> Option<DirWatch> {
            let inotify = Inotify::init().ok()?;
            let root = inotify.watches().add(dir, mask()).ok()?;
            let blobs_dir = dir.join("blobs");
            let blobs = match inotify.watches().add(&blobs_dir, blob_mask()) {
                Ok(wd) => Some(wd),
                // Not there yet: the root's watch sees it appear.
                Err(_) if !blobs_dir.exists() => None,
                // There but not watchable (no inotify watches left, no permission):
                // blobs would go unseen, so list instead.
                Err(_) => return None,
            };
            Some(DirWatch {
                inotify,
                root,
                blobs,
                buffer: vec![0; 4096],
                broken: false,
            })
        }

        /// Whether the watch can no longer see everything (list from now on).
        pub(super) fn broken(&self) -> bool {
            self.broken
        }

        /// What changed since the last call. A queue that overflowed, or a `blobs/`
        /// that appeared since the watch began, is answered by listing: every blob
        /// there counts as new (synced again: harmless), both directories as changed.
        pub(super) fn changed(&mut self, dir: &Path) -> Result<Changed, StoreError> {
            let mut changed = Changed::default();
            let mut relist = false;
            loop {
                let events = match self.inotify.read_events(&mut self.buffer) {
                    Ok(events) => events,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "reading the store's inotify watch failed; listing its directories instead");
                        relist = true;
                        break;
                    }
                };
                for event in events {
                    if event.mask.contains(EventMask::Q_OVERFLOW) {
                        relist = true;
                    } else if event.wd == self.root {
                        changed.root = true;
                        if event.name.is_some_and(|n| n == "blobs") && self.blobs.is_none() {
                            match self.inotify.watches().add(dir.join("blobs"), blob_mask()) {
                                Ok(wd) => self.blobs = Some(wd),
                                Err(e) => {
                                    tracing::warn!(dir = %dir.display(), error = %e, "no inotify watch on the sled store's blobs/ directory; its directories are listed at each flush from now on");
                                    self.broken = true;
                                }
                            }
                            relist = true;
                        }
                    } else if Some(&event.wd) == self.blobs.as_ref() {
                        if event.mask.intersects(
                            EventMask::CREATE
                                | EventMask::DELETE
                                | EventMask::MOVED_FROM
                                | EventMask::MOVED_TO,
                        ) {
                            changed.blobs = true;
                        }
                        if event
                            .mask
                            .intersects(EventMask::CLOSE_WRITE | EventMask::MOVED_TO)
                        {
                            if let Some(name) = event.name {
                                changed.new_blobs.insert(name.to_os_string());
                            }
                        }
                    }
                }
            }
            if relist {
                let now = Entries::list(dir)?;
                changed.root = true;
                changed.blobs = true;
                changed.new_blobs = now.blobs.into_iter().collect::<BTreeSet<_>>();
            }
            Ok(changed)
        }
    }
}

fn power_err(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Backend {
        operation: "flush",
        session: String::new(),
        message: format!(
            "cannot make the sled database durable at level power: {what} {} failed: {e} \
             (check the disk and the file system; an acknowledged write must survive a power loss)",
            path.display()
        ),
    }
}

/// The names in `dir` (none when it does not exist yet).
fn names(dir: &Path) -> Result<BTreeSet<std::ffi::OsString>, StoreError> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| power_err("reading the directory", dir, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeSet::new()),
        Err(e) => Err(power_err("reading the directory", dir, e)),
    }
}

/// fsyncs a directory, so the entries created, renamed or removed in it survive a
/// power loss.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| power_err("the fsync of the directory", dir, e))
}

impl PowerSync {
    /// Opens the data file of the database sled just opened in `dir`, starts learning
    /// of its directories' changes, and makes durable what the open created (a new
    /// database's files and directory entries).
    fn open(dir: &Path) -> Result<Self, StoreError> {
        let file = dir.join("db");
        let data = File::open(&file).map_err(|e| power_err("opening", &file, e))?;
        #[cfg(target_os = "linux")]
        let tracker = match watch::DirWatch::new(dir) {
            Some(w) => Tracker::Watch(w),
            None => {
                tracing::debug!(dir = %dir.display(), "no inotify watch on the sled store; its directories are listed at each flush");
                Tracker::List(Entries::list(dir)?)
            }
        };
        #[cfg(not(target_os = "linux"))]
        let tracker = Tracker::List(Entries::list(dir)?);
        let this = PowerSync {
            dir: dir.to_path_buf(),
            data,
            changes: Mutex::new(tracker),
        };
        let conf = dir.join("conf");
        File::open(&conf)
            .and_then(|f| f.sync_all())
            .map_err(|e| power_err("the fsync of", &conf, e))?;
        // What the open created or changed (a new database's files and entries) is
        // made durable once; the data directory's own entry in its parent is
        // `Backend::open`'s, for every engine.
        this.sync()?;
        if dir.join("blobs").is_dir() {
            sync_dir(&dir.join("blobs"))?;
        }
        sync_dir(dir)?;
        Ok(this)
    }

    /// Like [`PowerSync::open`], and also fsyncs every blob file there (what a store at
    /// `crash` wrote without syncing): a clean close at any level. Blocks.
    fn open_all(dir: &Path) -> Result<Self, StoreError> {
        let this = PowerSync::open(dir)?;
        for name in names(&dir.join("blobs"))? {
            this.sync_blob(&dir.join("blobs").join(name))?;
        }
        Ok(this)
    }

    fn sync_blob(&self, blob: &Path) -> Result<(), StoreError> {
        match File::open(blob) {
            Ok(f) => f
                .sync_data()
                .map_err(|e| power_err("the fsync of the blob", blob, e)),
            // Removed since (sled collects blobs it no longer needs).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(power_err("opening the blob", blob, e)),
        }
    }

    /// What sled's flush leaves undone: the data file's fsync, then each new blob
    /// file's, then the directories whose entries changed. Blocks.
    ///
    /// The blobs go first: sled writes a blob whole before it logs the pointer to it,
    /// so syncing the blobs finished so far before the data file keeps a durable pointer
    /// from naming a blob that is not.
    fn sync(&self) -> Result<(), StoreError> {
        let changed = {
            let mut tracker = self.changes.lock();
            match &mut *tracker {
                #[cfg(target_os = "linux")]
                Tracker::Watch(w) => {
                    let changed = w.changed(&self.dir)?;
                    if w.broken() {
                        *tracker = Tracker::List(Entries::list(&self.dir)?);
                    }
                    changed
                }
                Tracker::List(seen) => seen.advance(Entries::list(&self.dir)?),
            }
        };
        let blobs_dir = self.dir.join("blobs");
        for name in &changed.new_blobs {
            self.sync_blob(&blobs_dir.join(name))?;
        }
        if (changed.blobs || !changed.new_blobs.is_empty()) && blobs_dir.is_dir() {
            sync_dir(&blobs_dir)?;
        }
        if changed.root {
            sync_dir(&self.dir)?;
        }
        self.data
            .sync_data()
            .map_err(|e| power_err("the fsync of", &self.dir.join("db"), e))
    }
}

#[cfg(test)]
mod tests;
