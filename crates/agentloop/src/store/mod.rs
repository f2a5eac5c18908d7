//! Checkpoint storage (DESIGN S15–S19): what a stored record is, the store trait every
//! backend implements, and the backends.
//!
//! The record layer is plain code in `agentloop-core`, re-exported here: the record's
//! shape ([`record`]), its encoding ([`codec`]), the writes a session makes to it
//! ([`mod@write`]), its checkpoint history ([`history`]) and how writes apply to a
//! key-value table (`agentloop_core::table`, which every engine and the PostgreSQL
//! store share). This module owns what performs I/O: the [`CheckpointStore`] trait, the
//! memory, sled and fjall backends and the [`CheckpointActor`] that group-commits
//! writes to the engine. It knows nothing of sessions: items and agent states are
//! encoded payloads here, numbered by the writer.
//!
//! The trait is small and async (boxed futures, so it can be used as
//! `Arc<dyn CheckpointStore<I>>`) so a blocking backend like sled fits behind it by
//! moving its calls off the tokio workers. Its required methods move records as stored;
//! the provided ones ([`CheckpointStore::load`], [`CheckpointStore::save`], …) encode
//! and decode whole records of item type `I` for tools and tests.

pub mod actor;
mod backend;
mod client;
pub mod committer;
pub mod fjall;
pub mod lease;
pub mod level;
mod lifecycle;
pub mod memory;
mod offline;
pub mod sled;
pub mod transfer;
pub(crate) mod transition;
pub(crate) mod wave;

pub use agentloop_core::{codec, history, record, write};
pub(crate) use agentloop_core::{status, table};

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use self::backend::{Backend, Engine};
pub use self::fjall::FjallBackend;

/// The level fjall was configured with before every engine had one (issue 51): now
/// [`StoreDurability`], the same for sled, fjall and PostgreSQL.
#[deprecated(note = "use StoreDurability: every engine has the level now (S15b)")]
pub type FjallDurability = StoreDurability;
pub use self::level::{StoreDurability, UnknownDurability, STORE_DURABILITIES};
pub use self::sled::SledBackend;
pub use actor::CheckpointActor;
pub use agentloop_core::table::events::{EventAppend, KeptEvent, KeptEvents, PageBuilder};
pub use agentloop_core::table::timers::{StoredTimer, TimerChange};
pub use agentloop_core::timers::{Repeat, TimerRef};
pub use client::CheckpointClient;
pub use lease::{InstanceLease, DEFAULT_HEARTBEAT};
pub use lifecycle::{CheckpointMsg, CheckpointStats};
pub use memory::MemoryStore;
pub use record::{
    Format1Record, ListEntry, LoadedItem, LoadedRecord, Payload, Placement, RecordHeader,
    SessionRecord, Stored, StoredEntry, StoredRecord,
};
pub use status::{CasOutcome, SessionStatus, StatusKind};
pub use write::{ItemChange, JournalChange, RecordWrite, StateChange, WriteCondition};

pub use agentloop_core::store_error::{now_ms, StoreError};

/// A session's kept events waiting to be written (S20a): taken by the store when it
/// writes them ([`CheckpointStore::ride_events`]).
pub trait EventRider: Send + Sync {
    /// What waits, taken now: the append, whether its answer waits for a flush, and
    /// where the answer goes; `None` when nothing waits any more.
    fn take(&self) -> Option<(EventAppend, bool, committer::Answer<()>)>;
}

/// A checkpoint store (S15–S19). Implementations must not block tokio workers.
///
/// Ordering contract: a write (`write`, `delete`, `cas_status`, `beat`) is ordered when
/// the method is *called*, not when its future is first polled, so a caller that issues
/// two writes and awaits them from different tasks still gets them applied in call
/// order. A write's future resolves once the write is durable to the store's guarantee
/// (for the sled store: flushed). One write is applied atomically.
///
/// `I` is the item type the provided typed methods decode to; the required methods
/// move encoded records and do not depend on it.
pub trait CheckpointStore<I>: Send + Sync + 'static {
    /// Reads a session's record as stored, if any.
    fn load_stored<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Stored>, StoreError>>;

    /// Applies a change to one session's record (see [`RecordWrite`]) if its condition
    /// and lease epoch allow: `StoreError::Final` / `NoRecord` / `Fenced` otherwise,
    /// with nothing written.
    fn write(&self, write: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Deletes a session's record (every entry); resolves to whether one existed.
    fn delete(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>>;

    /// Lists records as stored, optionally only those whose status is one of
    /// `statuses`; corrupt ones are listed with their error, whatever the filter.
    fn list_stored(
        &self,
        statuses: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>>;

    /// One page of records as stored, in id order: those whose id comes after `after`
    /// (from the first when `None`), at most `limit`; corrupt ones are listed with their
    /// error, as [`list_stored`](Self::list_stored) lists them. A page costs what it
    /// returns (issue 52): every built-in store seeks to `after` in its ordered keys and
    /// reads only the page's records (`table::list_page`). The default, for a store
    /// that wraps another, cuts the page from a whole listing.
    fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        let after = after.map(str::to_string);
        let listed = self.list_stored(None);
        Box::pin(async move {
            Ok(listed
                .await?
                .into_iter()
                .filter(|e| after.as_ref().is_none_or(|a| e.session_id > *a))
                .take(limit)
                .collect())
        })
    }

    /// One page of the sessions that keep checkpoint history (S16b) or events (S20a), in
    /// id order: their ids after `after` (from the first when `None`), at most `limit`,
    /// whether or not their record remains (S26a: a session is known while anything of
    /// it is kept). A listing merges this page with [`list_page`](Self::list_page)'s.
    /// Every built-in store seeks one session at a time (`table::kept_page`), so a page
    /// costs what it returns. The default is a store that keeps neither: none.
    fn list_kept_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<String>, StoreError>> {
        let _ = (after, limit);
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Atomically sets the status to `to` if it is one of `from` (S19, S24).
    fn cas_status(
        &self,
        session_id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>>;

    /// Like [`write`](Self::write), with the result handed to `done` instead of a
    /// future: a store with a committer (sled, fjall) calls it from the committer's
    /// thread, so the writer needs no task waiting for the result (S15c: a session's
    /// completion arrives as a message in its own mailbox). Issued when called, like
    /// `write`. The default awaits `write` on a task (call it inside a tokio runtime).
    fn write_then(&self, write: RecordWrite, done: committer::Answer<()>) {
        let f = self.write(write);
        tokio::spawn(async move { done.send(f.await) });
    }

    /// Writes a durable step's journal change straight into the stored record of
    /// `session` (S1b; `table::append_journal`: the record's header kept, `epoch` checked
    /// as a write's fencing token), answered through `done` once durable. A store that
    /// cannot (the default) answers [`StoreError::Refused`] at once, and the session
    /// writes the change with its own next write instead.
    fn append_journal_then(
        &self,
        session: &str,
        epoch: u64,
        turn: u64,
        change: JournalChange,
        done: committer::Answer<()>,
    ) {
        let _ = (epoch, turn, change);
        done.send(Err(StoreError::Refused {
            session: session.to_string(),
            status: "any".into(),
            why: "this store takes journal entries through the session's own writes".into(),
        }));
    }

    /// Whether this store keeps sessions' events (S20a): a session that asks to keep
    /// them on a store that does not is refused at spawn.
    fn keeps_events(&self) -> bool {
        false
    }

    /// Appends kept events of `session` (S20a; `table::events::append_events`: fenced by
    /// `epoch`, trimmed by the append's retention), answered through `done` once
    /// applied, and once durable when `flush` (a new reserved mark); events alone are
    /// made durable by the next flush of any write. The default refuses.
    fn append_events_then(
        &self,
        session: &str,
        epoch: u64,
        append: EventAppend,
        flush: bool,
        done: committer::Answer<()>,
    ) {
        let _ = (epoch, append, flush);
        done.send(Err(StoreError::Refused {
            session: session.to_string(),
            status: "any".into(),
            why: "this store keeps no events; use sled, fjall, PostgreSQL or the memory \
                  store"
                .into(),
        }));
    }

    /// Hands `rider`'s kept events of `session` to the next group commit (S20a: each
    /// event is written "in the group commit that follows it"): a store with a
    /// committer takes them at its next wave, whoever starts it, and starts one now
    /// only when `wake`. The default takes them at once
    /// ([`append_events_then`](Self::append_events_then)).
    fn ride_events(
        &self,
        session: &str,
        epoch: u64,
        rider: std::sync::Arc<dyn EventRider>,
        wake: bool,
    ) {
        let _ = wake;
        if let Some((append, flush, done)) = rider.take() {
            self.append_events_then(session, epoch, append, flush, done);
        }
    }

    /// The kept events of `session` numbered after `after` (S20a), whole pages until
    /// their bodies come to at least `max` bytes (`usize::MAX`: all; a replay reads a
    /// page at a time, issue 52). The default, for a store that keeps none, answers
    /// none.
    fn read_events(
        &self,
        session: &str,
        after: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<KeptEvents, StoreError>> {
        let _ = (session, after, max);
        Box::pin(std::future::ready(Ok(KeptEvents::default())))
    }

    /// Whether this store keeps durable timers (S39): a timer armed on a store that
    /// does not is refused.
    fn keeps_timers(&self) -> bool {
        false
    }

    /// Arms a timer of `session` (S39; `table::timers::arm`), durably; its number.
    /// Refused by a store that keeps no timers, and with
    /// [`StoreError::TooManyTimers`] when the session holds `max` timers already
    /// (S34a).
    fn arm_timer(
        &self,
        session: &str,
        timer: StoredTimer,
        max: usize,
    ) -> BoxFuture<'static, Result<u64, StoreError>> {
        let _ = (timer, max);
        Box::pin(std::future::ready(Err(no_timers(session))))
    }

    /// Cancels `session`'s timer `timer`, durably; whether it was armed.
    fn cancel_timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<bool, StoreError>> {
        let _ = timer;
        Box::pin(std::future::ready(Err(no_timers(session))))
    }

    /// Applies one timer change of `session` alone, durably (a fire whose item the
    /// session already held: a retried fire answered as a duplicate).
    fn change_timer(
        &self,
        session: &str,
        change: TimerChange,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let _ = change;
        Box::pin(std::future::ready(Err(no_timers(session))))
    }

    /// `session`'s timer `timer`, if armed (what a fire reads). The default lists the
    /// session's timers.
    fn timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<Option<StoredTimer>, StoreError>> {
        let listed = self.timers(session);
        Box::pin(async move {
            Ok(listed
                .await?
                .into_iter()
                .find(|(n, _)| *n == timer)
                .map(|(_, t)| t))
        })
    }

    /// `session`'s timers, by number (none on a store that keeps no timers).
    fn timers(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Vec<(u64, StoredTimer)>, StoreError>> {
        let _ = session;
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Every armed timer of every session, earliest first: the due-time index, read
    /// once when a runtime starts (none on a store that keeps no timers).
    fn due_timers(&self) -> BoxFuture<'static, Result<Vec<TimerRef>, StoreError>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Like [`delete`](Self::delete), answered through `done` (see
    /// [`write_then`](Self::write_then)).
    fn delete_then(&self, session_id: &str, done: committer::Answer<bool>) {
        let f = self.delete(session_id);
        tokio::spawn(async move { done.send(f.await) });
    }

    /// Resolves once every write issued before it is durable.
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Renews the heartbeat of runtime instance `instance` (one write per instance).
    fn beat(&self, instance: &str, now_ms: u64) -> BoxFuture<'static, Result<(), StoreError>>;

    /// The last heartbeat of runtime instance `instance`, if any.
    fn heartbeat(&self, instance: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>>;

    /// Every runtime instance that ever beat, with its last heartbeat (issue 18: the
    /// membership of nodes sharing this store). The default, for a store one process
    /// owns, lists none.
    fn instances(&self) -> BoxFuture<'static, Result<Vec<(String, u64)>, StoreError>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Records what runtime instance `instance` can run (S40: agent kinds and the
    /// versions whose records it resumes), so the other nodes sharing this store place,
    /// move and hand over to it only sessions it can run. The default, for a store one
    /// process owns, keeps nothing.
    fn advertise(
        &self,
        instance: &str,
        runs: &agentloop_core::adopt::Runs,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let _ = (instance, runs);
        Box::pin(std::future::ready(Ok(())))
    }

    /// What every instance advertised it can run (S40), by instance. An instance absent
    /// advertised nothing and is assumed to run everything.
    fn advertised(
        &self,
    ) -> BoxFuture<
        'static,
        Result<std::collections::BTreeMap<String, agentloop_core::adopt::Runs>, StoreError>,
    > {
        Box::pin(std::future::ready(Ok(Default::default())))
    }

    /// Whether one process holds this store exclusively while it is open (sled and
    /// fjall lock their data directory): no runtime of another process can write it,
    /// so no record can be orphaned behind a running runtime's back and no recovery
    /// sweep is needed (issue 28). The default, for a store several processes may
    /// share (PostgreSQL, the memory store in tests), is `false`.
    fn exclusive(&self) -> bool {
        false
    }

    /// Whether this store proves that runtime instance `owner` no longer runs, so a
    /// `Running` record it owns may be recovered at once instead of after its lease
    /// (issue 28). `last_seen_ms` is the owner's last sign of life: the later of its
    /// heartbeat and the record's own times. An exclusive store proves it when `owner`
    /// has not beaten through it since it was opened and was last seen before that:
    /// whoever held the store then was another process, and the lock says it is gone.
    /// The default (a shared store) proves nothing; leases decide there.
    fn orphaned(&self, owner: &str, last_seen_ms: u64) -> bool {
        let _ = (owner, last_seen_ms);
        false
    }

    /// Whether this store keeps checkpoint history (issue 13): a store that does not
    /// refuses [`history`](Self::history) reads. The default keeps none.
    fn keeps_history(&self) -> bool {
        false
    }

    /// Reads a session's checkpoint history (issue 13): the list of kept turn-end
    /// checkpoints, or one of them. The default is a store that keeps none: it refuses.
    fn history(
        &self,
        session_id: &str,
        query: history::HistoryQuery,
    ) -> BoxFuture<'static, Result<history::HistoryAnswer, StoreError>> {
        let _ = query;
        Box::pin(std::future::ready(Err(StoreError::Backend {
            operation: "read the history of",
            session: session_id.to_string(),
            message: "this checkpoint store keeps no history; use the sled store (or the \
                      memory store in tests)"
                .into(),
        })))
    }

    /// Deletes a session's record and its checkpoint history (an explicit delete);
    /// resolves to whether anything existed. The default, for a store that keeps no
    /// history, deletes the record.
    fn purge(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.delete(session_id)
    }

    /// Loads a session's whole record, items decoded.
    fn load<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<SessionRecord<I>>, StoreError>>
    where
        I: Serialize + DeserializeOwned + Send + 'a,
    {
        Box::pin(async move {
            match self.load_stored(session_id).await? {
                Some(s) => Ok(Some(s.decode::<I>()?.into_record())),
                None => Ok(None),
            }
        })
    }

    /// Writes a whole record, replacing any previous one, whatever it is.
    fn save(&self, record: SessionRecord<I>) -> BoxFuture<'static, Result<(), StoreError>>
    where
        I: Serialize + DeserializeOwned + Clone,
    {
        match record.to_write(WriteCondition::Always) {
            Ok(w) => self.write(w),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// Writes a whole record unless the stored one is already final (`Completed`,
    /// `Canceled`, `Failed`): then resolves to `StoreError::Final` and writes nothing.
    fn save_live(&self, record: SessionRecord<I>) -> BoxFuture<'static, Result<(), StoreError>>
    where
        I: Serialize + DeserializeOwned + Clone,
    {
        match record.to_write(WriteCondition::NotFinal) {
            Ok(w) => self.write(w),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// Lists whole records, items decoded (a record that does not decode is listed
    /// with its error).
    fn list(
        &self,
        statuses: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<ListEntry<I>>, StoreError>>
    where
        I: Serialize + DeserializeOwned + Send + 'static,
    {
        let listed = self.list_stored(statuses);
        Box::pin(async move {
            Ok(listed
                .await?
                .into_iter()
                .map(|e| ListEntry {
                    session_id: e.session_id,
                    record: e
                        .record
                        .and_then(|s| s.decode::<I>().map(LoadedRecord::into_record)),
                })
                .collect())
        })
    }
}

/// The refusal of a store that keeps no timers.
fn no_timers(session: &str) -> StoreError {
    StoreError::Refused {
        session: session.to_string(),
        status: "any".into(),
        why: "this store keeps no durable timers (S39): use sled, fjall, PostgreSQL or the \
              memory store"
            .into(),
    }
}
