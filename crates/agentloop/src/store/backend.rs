//! The embedded engines the checkpoint actor can own (issue 15): sled (the default) and
//! fjall, chosen by [`Engine`] (`[store] engine` in agentloop.toml). This module only
//! opens an engine and forwards the actor's blocking calls to it; the engines' own
//! files (`sled/`, `fjall.rs`) are the only ones that touch them.
//!
//! Opening says what is wrong with a directory for what it is (a file, no permission,
//! held by another process, named by its pid from [`HOLDER_FILE`]) and checks which
//! engine wrote the directory: sled's files (`conf`, `db`) or
//! fjall's (`version` plus its keyspaces), and refuses the other engine with a message
//! that says how to move the records (`agentloop sessions export` / `import`), since
//! neither engine can read the other's files and opening one in the other's directory
//! would start an empty database beside the records.

use std::path::Path;

use crate::store::fjall::FjallBackend;
use crate::store::history::{HistoryAnswer, HistoryQuery};
use crate::store::level::StoreDurability;
use crate::store::offline;
use crate::store::record::Payload;
use crate::store::wave::{Base, OpResult, WriteOp};
use crate::store::write::RecordWrite;
use crate::store::{KeptEvents, SledBackend, StatusKind, StoreError, Stored, StoredEntry};

/// Which embedded engine holds the records, at which durability level (S15b).
/// The default is sled at `power`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// sled 0.34 (the default), at the given level (`power` by default: its flush, then
    /// an fsync of its data file).
    Sled(StoreDurability),
    /// fjall 3, at the given level (`power`: `persist(SyncAll)`).
    Fjall(StoreDurability),
}

impl Default for Engine {
    fn default() -> Self {
        Engine::Sled(StoreDurability::default())
    }
}

impl Engine {
    /// sled at the default level, `power`.
    pub const SLED: Engine = Engine::Sled(StoreDurability::Power);
    /// fjall at the default level, `power`.
    pub const FJALL: Engine = Engine::Fjall(StoreDurability::Power);

    /// The configuration name: `"sled"` or `"fjall"`.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Sled(_) => "sled",
            Engine::Fjall(_) => "fjall",
        }
    }

    /// What an acknowledged write survives.
    pub fn durability(&self) -> StoreDurability {
        match self {
            Engine::Sled(l) | Engine::Fjall(l) => *l,
        }
    }

    /// The same engine at level `level`.
    pub fn at(self, level: StoreDurability) -> Engine {
        match self {
            Engine::Sled(_) => Engine::Sled(level),
            Engine::Fjall(_) => Engine::Fjall(level),
        }
    }

    /// The engine named `name` (`"sled"` or `"fjall"`) at `level`.
    pub fn named(name: &str, level: StoreDurability) -> Option<Engine> {
        match name {
            "sled" => Some(Engine::Sled(level)),
            "fjall" => Some(Engine::Fjall(level)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Engine {
    /// `sled, durability power`: what the start line says.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, durability {}", self.name(), self.durability())
    }
}

/// An open engine.
pub enum Backend {
    /// sled.
    Sled(SledBackend),
    /// fjall.
    Fjall(FjallBackend),
}

/// What wrote a data directory, as far as its files tell.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Nothing,
    Sled,
    Fjall,
}

fn found(dir: &Path) -> Found {
    if dir.join("conf").is_file() && dir.join("db").is_file() {
        Found::Sled
    } else if dir.join("version").is_file() || dir.join("keyspaces").is_dir() {
        Found::Fjall
    } else {
        Found::Nothing
    }
}

fn mismatch(dir: &Path, wanted: Engine, holds: &str) -> StoreError {
    StoreError::Backend {
        operation: "open",
        session: String::new(),
        message: format!(
            "the data directory {} holds a {holds} database, but the store is configured \
             for {}: set `[store] engine = \"{holds}\"` (or `--engine {holds}`), or move \
             the records with `agentloop sessions export --data-dir {} > sessions.jsonl` \
             and `agentloop sessions import --engine {} --data-dir <new dir> < \
             sessions.jsonl`",
            dir.display(),
            wanted.name(),
            dir.display(),
            wanted.name(),
        ),
    }
}

/// Reads go to the engine as committed (what a wave reads; exports).
impl Base for Backend {
    fn base_get(&self, key: &[u8]) -> Result<Option<Payload>, StoreError> {
        match self {
            Backend::Sled(b) => b.base_get(key),
            Backend::Fjall(b) => b.base_get(key),
        }
    }
    fn base_keys(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        match self {
            Backend::Sled(b) => b.base_keys(prefix),
            Backend::Fjall(b) => b.base_keys(prefix),
        }
    }
    fn base_entries(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        match self {
            Backend::Sled(b) => b.base_entries(prefix),
            Backend::Fjall(b) => b.base_entries(prefix),
        }
    }
    fn base_format1_get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Backend::Sled(b) => b.base_format1_get(id),
            Backend::Fjall(b) => b.base_format1_get(id),
        }
    }
    fn base_range(&self, from: &[u8], to: &[u8]) -> Result<Vec<(Vec<u8>, Payload)>, StoreError> {
        match self {
            Backend::Sled(b) => b.base_range(from, to),
            Backend::Fjall(b) => b.base_range(from, to),
        }
    }
    fn base_first_key_from(&self, from: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Backend::Sled(b) => b.base_first_key_from(from),
            Backend::Fjall(b) => b.base_first_key_from(from),
        }
    }
    fn base_format1_next_after(&self, after: Option<&str>) -> Result<Option<String>, StoreError> {
        match self {
            Backend::Sled(b) => b.base_format1_next_after(after),
            Backend::Fjall(b) => b.base_format1_next_after(after),
        }
    }
}

/// The file in a data directory that names the process holding it (its pid), written
/// after each successful open, so a second process refused by the engine's lock can say
/// who holds it.
pub const HOLDER_FILE: &str = "agentloop.pid";

fn open_error(why: String) -> StoreError {
    StoreError::Backend {
        operation: "open",
        session: String::new(),
        message: why,
    }
}

/// What is wrong with `dir` before an engine tries it: a file where the directory
/// should be, or no permission to create or use it. Answers the directories it created
/// (`dir` and any missing ancestors), so that their entries can be made durable.
fn check_dir(dir: &Path) -> Result<Vec<std::path::PathBuf>, StoreError> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => Err(open_error(format!(
            "the data directory {} is not a directory (it is a file): point data_dir / \
                 --data-dir at a directory (it is created when missing)",
            dir.display()
        ))),
        Ok(m) if m.permissions().readonly() => Err(open_error(format!(
            "permission denied: the data directory {} is read-only; give this user \
                 write access to it, or choose another directory",
            dir.display()
        ))),
        Ok(_) => Ok(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let created: Vec<std::path::PathBuf> = dir
                .ancestors()
                .filter(|a| !a.as_os_str().is_empty())
                .take_while(|a| !a.exists())
                .map(Path::to_path_buf)
                .collect();
            std::fs::create_dir_all(dir).map_err(|e| {
                open_error(format!(
                    "cannot create the data directory {}: {e}",
                    dir.display()
                ))
            })?;
            Ok(created)
        }
        Err(e) => Err(open_error(format!(
            "cannot use the data directory {}: {e}",
            dir.display()
        ))),
    }
}

/// Makes the entries of directories just created survive a power loss (S15b): each
/// one's entry in its parent, fsynced (a relative data directory's parent is the
/// working directory). Neither engine does this for the data directory itself. A
/// failure is logged: the records are written, but a power cut soon after could lose
/// the directory that holds them.
fn sync_created(created: &[std::path::PathBuf]) {
    for dir in created {
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if let Err(e) = std::fs::File::open(parent).and_then(|d| d.sync_all()) {
            tracing::warn!(dir = %dir.display(), parent = %parent.display(), error = %e,
                "could not fsync the directory holding the new data directory: a power cut soon after could lose it, and what it holds");
        }
    }
}

/// How long `Backend::open` waits for a lock this process is letting go of.
pub(crate) const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the engine refused to open because the directory's lock is held.
fn locked(e: &StoreError) -> bool {
    e.to_string().to_ascii_lowercase().contains("lock")
}

/// Whether [`HOLDER_FILE`] names another process (which holds the lock for good, as
/// far as this process can tell).
fn held_elsewhere(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(HOLDER_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .is_some_and(|pid| pid != std::process::id())
}

/// The engine's open error, said for what it is: permission denied, or the lock held by
/// another process (named by its pid when the holder wrote [`HOLDER_FILE`]).
fn explain(dir: &Path, e: StoreError) -> StoreError {
    let text = e.to_string();
    if text.contains("Permission denied") || text.contains("permission denied") {
        return open_error(format!(
            "permission denied in the data directory {}: give this user write access to \
                 it and its files, or choose another directory ({text})",
            dir.display()
        ));
    }
    let lower = text.to_ascii_lowercase();
    if lower.contains("lock") {
        let holder = std::fs::read_to_string(dir.join(HOLDER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|pid| *pid != std::process::id());
        let who = match holder {
            Some(pid) => format!("another process (pid {pid}) holds it"),
            None => "another process holds it".to_string(),
        };
        return open_error(format!(
            "the data directory {} is in use: {who}; stop that process (another agentloop \
                 run, or a program embedding agentloop) or choose another directory",
            dir.display()
        ));
    }
    e
}

impl Backend {
    /// The engine whose database is in `dir`, if any, at `power` (an offline tool opens
    /// what it finds, writes what it acknowledges power-safe, and must not create a
    /// database where none is).
    pub fn detect(dir: &Path) -> Option<Engine> {
        match found(dir) {
            Found::Sled => Some(Engine::SLED),
            Found::Fjall => Some(Engine::FJALL),
            Found::Nothing => None,
        }
    }

    /// Opens `engine` in `dir` (creating it), refusing a directory the other engine
    /// wrote. Blocks.
    ///
    /// A directory whose lock this process let go of a moment ago (a backend dropped
    /// here: the engine's background work releases the lock shortly after the drop
    /// returns) is waited for, up to 2 s; one another process holds is
    /// refused at once.
    pub fn open(dir: &Path, engine: Engine) -> Result<Self, StoreError> {
        let created = check_dir(dir)?;
        let began = std::time::Instant::now();
        let opened = loop {
            let attempt = match (engine, found(dir)) {
                (Engine::Sled(_), Found::Fjall) => return Err(mismatch(dir, engine, "fjall")),
                (Engine::Fjall(_), Found::Sled) => return Err(mismatch(dir, engine, "sled")),
                (Engine::Sled(l), _) => SledBackend::open_at(dir, l).map(Backend::Sled),
                (Engine::Fjall(d), _) => FjallBackend::open(dir, d).map(Backend::Fjall),
            };
            match attempt {
                Err(e) if locked(&e) && !held_elsewhere(dir) && began.elapsed() < RELEASE_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                other => break other.map_err(|e| explain(dir, e))?,
            }
        };
        // Best effort: a second process refused by the lock names this one.
        if let Err(e) = std::fs::write(dir.join(HOLDER_FILE), std::process::id().to_string()) {
            tracing::debug!(dir = %dir.display(), error = %e, "could not write the holder file");
        }
        if engine.durability() == StoreDurability::Power {
            sync_created(&created);
        }
        Ok(opened)
    }

    /// The engine and its settings.
    pub fn engine(&self) -> Engine {
        match self {
            Backend::Sled(b) => Engine::Sled(b.durability()),
            Backend::Fjall(f) => Engine::Fjall(f.durability()),
        }
    }

    /// Where the database lives.
    pub fn path(&self) -> &Path {
        match self {
            Backend::Sled(b) => b.path(),
            Backend::Fjall(b) => b.path(),
        }
    }

    /// See [`SledBackend::apply_unflushed`].
    pub(crate) fn apply_unflushed(&self, ops: Vec<WriteOp>) -> Vec<Result<OpResult, StoreError>> {
        match self {
            Backend::Sled(b) => b.apply_unflushed(ops),
            Backend::Fjall(b) => b.apply_unflushed(ops),
        }
    }

    /// Applies one change to a session's record (see [`RecordWrite`]) and makes it
    /// durable before returning: what a session's committer does, for tools that write
    /// a data directory with no runtime on it (imports, repairs, tests). Blocks.
    pub fn write(&self, write: RecordWrite) -> Result<(), StoreError> {
        offline::write_all(&|ops| self.apply(ops), vec![write])
    }

    /// Applies several changes in order as one batch made durable once at the end (one
    /// flush for all); answers the first failure, if any (the writes before it are
    /// applied). Blocks.
    pub fn write_all(&self, writes: Vec<RecordWrite>) -> Result<(), StoreError> {
        offline::write_all(&|ops| self.apply(ops), writes)
    }

    /// Removes a session's record (every entry but its checkpoint history, as
    /// [`crate::store::CheckpointStore::delete`]), durably; answers whether one was stored.
    /// Blocks.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let op = WriteOp::Delete {
            key: id.to_string(),
        };
        offline::removal(&|ops| self.apply(ops), op, "delete", id)
    }

    /// Removes a session's record and its checkpoint history, durably; answers whether
    /// a record was stored. Blocks.
    pub fn purge(&self, id: &str) -> Result<bool, StoreError> {
        let op = WriteOp::Purge {
            key: id.to_string(),
        };
        offline::removal(&|ops| self.apply(ops), op, "purge", id)
    }

    /// Renews instance `instance`'s heartbeat to `now_ms`, durably. Blocks.
    pub fn beat(&self, instance: &str, now_ms: u64) -> Result<(), StoreError> {
        offline::beat(&|ops| self.apply(ops), instance, now_ms)
    }

    /// Applies one wave of operations in order and makes it durable once at the end
    /// (group commit). If that fails, every operation of the wave but reads reports it.
    /// Blocks.
    pub(crate) fn apply(&self, ops: Vec<WriteOp>) -> Vec<Result<OpResult, StoreError>> {
        let mut results = self.apply_unflushed(ops);
        if let Err(e) = self.flush() {
            crate::store::wave::fail_unflushed(&mut results, &e);
        }
        results
    }

    /// Stores raw bytes under a raw key of the sessions table, bypassing every check:
    /// for tests that damage records (a head that does not decode). Blocks.
    pub fn put_raw(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        match self {
            Backend::Sled(b) => b.put_raw(key, value),
            Backend::Fjall(b) => b.put_raw(key, value),
        }
    }

    /// Makes every write so far durable at the engine's level (sled: flush, then at
    /// `power` an fsync of its data file; fjall: persist at its level).
    pub fn flush(&self) -> Result<(), StoreError> {
        match self {
            Backend::Sled(b) => b.flush(),
            Backend::Fjall(b) => b.flush(),
        }
    }

    /// Makes every write so far survive a power loss, whatever the level: what a
    /// clean close does before it releases the engine (S15b). Blocks.
    pub fn sync_for_close(&self) -> Result<(), StoreError> {
        match self {
            Backend::Sled(b) => b.sync_for_close(),
            Backend::Fjall(b) => b.sync_for_close(),
        }
    }

    /// See [`SledBackend::load`].
    pub fn load(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        match self {
            Backend::Sled(b) => b.load(id),
            Backend::Fjall(b) => b.load(id),
        }
    }

    /// A session's record read from its head alone, when that is all it takes: a
    /// format-3 record without loose entries, or no record (a point read of one key,
    /// plus one of sled's format-1 tree). `None` when the record needs more (loose
    /// entries, format 2 or 1): [`Backend::load`] it on a blocking thread. Called on
    /// the caller's thread (docs/operations.md, "Reads"): neither engine makes a point
    /// read wait for a writer.
    pub fn load_from_head(&self, id: &str) -> Option<Result<Option<Stored>, StoreError>> {
        if let Err(reason) = agentloop_core::ids::validate_session_id(id) {
            return Some(Err(StoreError::InvalidId {
                id: id.to_string(),
                reason,
            }));
        }
        match self.base_get(&crate::store::table::header_key(id)) {
            Err(e) => Some(Err(e)),
            Ok(Some(bytes)) => match crate::store::table::read_head_only(id, &bytes) {
                Ok(crate::store::table::HeadRead::Record(r)) => Some(Ok(Some(*r))),
                Ok(crate::store::table::HeadRead::NeedsEntries) => None,
                Err(e) => Some(Err(e)),
            },
            Ok(None) => match self.base_format1_get(id) {
                Err(e) => Some(Err(e)),
                Ok(None) => Some(Ok(None)),
                Ok(Some(_)) => None,
            },
        }
    }

    /// See [`SledBackend::history`].
    pub fn history(&self, id: &str, query: HistoryQuery) -> Result<HistoryAnswer, StoreError> {
        match self {
            Backend::Sled(b) => b.history(id, query),
            Backend::Fjall(b) => b.history(id, query),
        }
    }

    /// The kept events of session `id` numbered after `after` (S20a), whole pages
    /// until at least `max` are read. Blocks.
    pub fn read_events(&self, id: &str, after: u64, max: usize) -> Result<KeptEvents, StoreError> {
        let view = crate::store::wave::Wave::new(self);
        agentloop_core::table::events::read_events(&view, id, after, max)
    }

    /// Session `id`'s timers, by number (S39). Blocks.
    pub fn timers(&self, id: &str) -> Result<Vec<(u64, crate::store::StoredTimer)>, StoreError> {
        let view = crate::store::wave::Wave::new(self);
        agentloop_core::table::timers::list(&view, id)
    }

    /// Session `id`'s timer `timer`, if armed (S39). Blocks.
    pub fn timer(
        &self,
        id: &str,
        timer: u64,
    ) -> Result<Option<crate::store::StoredTimer>, StoreError> {
        let view = crate::store::wave::Wave::new(self);
        agentloop_core::table::timers::get(&view, id, timer)
    }

    /// Every armed timer, earliest first: the due-time index (S39). Blocks.
    pub fn due_timers(&self) -> Result<Vec<crate::store::TimerRef>, StoreError> {
        let view = crate::store::wave::Wave::new(self);
        agentloop_core::table::timers::due_index(&view)
    }

    /// See [`SledBackend::list`].
    pub fn list(&self, statuses: Option<&[StatusKind]>) -> Result<Vec<StoredEntry>, StoreError> {
        match self {
            Backend::Sled(b) => b.list(statuses),
            Backend::Fjall(b) => b.list(statuses),
        }
    }

    /// One page of records in id order after `after`, at most `limit`, reading only
    /// the page's records (`table::list_page`, issue 52). Blocks.
    pub fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        crate::store::table::list_page(&crate::store::wave::Wave::new(self), after, limit)
    }

    /// One page of the sessions that keep history or events, in id order after
    /// `after`, at most `limit` (`table::kept_page`, S26a). Blocks.
    pub fn kept_page(&self, after: Option<&str>, limit: usize) -> Result<Vec<String>, StoreError> {
        crate::store::table::kept_page(&crate::store::wave::Wave::new(self), after, limit)
    }

    /// Every key and value stored for a session, named, undecoded (see
    /// [`SledBackend::raw_entries`]). Blocks.
    pub fn raw_entries(&self, id: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        match self {
            Backend::Sled(b) => b.raw_entries(id),
            Backend::Fjall(b) => b.raw_entries(id),
        }
    }

    /// See [`SledBackend::heartbeat`].
    pub fn heartbeat(&self, instance: &str) -> Result<Option<u64>, StoreError> {
        match self {
            Backend::Sled(b) => b.heartbeat(instance),
            Backend::Fjall(b) => b.heartbeat(instance),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temp dir, removed on drop.
    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!(
            "agentloop-backend-{tag}-{}-{}",
            std::process::id(),
            crate::store::now_ms()
        ));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    /// S15b: the directories `check_dir` creates are named (deepest first), so that
    /// `Backend::open` at `power` fsyncs each one's parent; an existing directory creates
    /// none.
    #[test]
    fn the_directories_created_for_the_data_directory_are_named() {
        let d = dir("created");
        let nested = d.0.join("a").join("b");
        let created = check_dir(&nested).expect("created");
        assert_eq!(created, vec![nested.clone(), d.0.join("a")]);
        assert!(nested.is_dir());
        assert!(check_dir(&nested).expect("exists").is_empty());
        drop(Backend::open(&d.0.join("c"), Engine::SLED).expect("opens at power"));
        assert!(d.0.join("c").join("db").is_file());
    }

    /// What sled's background work does after a backend of this process was dropped:
    /// it holds the lock a moment longer. The next open waits for it instead of
    /// refusing the directory as in use (CI saw that race).
    #[test]
    fn a_lock_this_process_is_letting_go_of_is_waited_for() {
        let d = dir("release");
        drop(Backend::open(&d.0, Engine::SLED).expect("opens"));
        let lock = std::fs::File::open(d.0.join("db")).unwrap();
        lock.lock().unwrap();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(lock);
        });
        let began = std::time::Instant::now();
        let b = Backend::open(&d.0, Engine::SLED).expect("opens once the lock is let go of");
        assert!(began.elapsed() >= std::time::Duration::from_millis(250));
        holder.join().unwrap();
        drop(b);
    }

    /// A lock another process holds (its pid in the holder file) is refused at once,
    /// naming that process.
    #[test]
    fn a_lock_another_process_holds_is_refused_at_once() {
        let d = dir("elsewhere");
        drop(Backend::open(&d.0, Engine::SLED).expect("opens"));
        let lock = std::fs::File::open(d.0.join("db")).unwrap();
        lock.lock().unwrap();
        let other = std::process::id().wrapping_add(1).max(2);
        std::fs::write(d.0.join(HOLDER_FILE), other.to_string()).unwrap();
        let began = std::time::Instant::now();
        let e = Backend::open(&d.0, Engine::SLED).err().expect("refused");
        assert!(began.elapsed() < RELEASE_WAIT / 2, "{:?}", began.elapsed());
        assert!(e.to_string().contains(&format!("pid {other}")), "{e}");
        drop(lock);
    }
}
