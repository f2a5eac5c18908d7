//! [`CheckpointClient`]: the typed, cloneable door to an embedded store (sled or
//! fjall) that the checkpoint actor opened. Every operation goes straight to the store's
//! committer (S15c): a write is queued when the method is called (the trait's ordering
//! contract) and answered by the committer after its flush; a read runs on the
//! committer's thread or the blocking pool, ordered after the writes queued before it.
//! It owns no engine and decides nothing about records; the actor (`actor.rs`) owns the
//! store's lifecycle.

use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::Arc;

use futures::future::BoxFuture;
use ractor::ActorRef;
use tokio::sync::oneshot;

use crate::store::committer::{Answer, Committer, Waiter};
use crate::store::lifecycle::{stats, CheckpointMsg, CheckpointStats};
use crate::store::wave::{TimerOp, WriteOp};
use crate::store::{
    CasOutcome, CheckpointStore, RecordWrite, SessionStatus, StatusKind, StoreError, Stored,
    StoredEntry,
};
use agentloop_core::ids::validate_session_id;

fn check_id(id: &str) -> Result<(), StoreError> {
    validate_session_id(id).map_err(|reason| StoreError::InvalidId {
        id: id.to_string(),
        reason,
    })
}

/// Queues `op` on `key`'s session after checking the id; a bad id is answered at once.
fn submit_checked(committer: &Arc<Committer>, key: &str, op: WriteOp, waiter: Waiter) {
    match check_id(key) {
        Ok(()) => committer.submit(op, waiter),
        Err(e) => match waiter {
            Waiter::Unit(a) => a.send(Err(e)),
            Waiter::Deleted(a) => a.send(Err(e)),
            Waiter::Cas(a) => a.send(Err(e)),
            Waiter::Load(a) => a.send(Err(e)),
            Waiter::Armed(a) => a.send(Err(e)),
        },
    }
}

/// Hands `submit` an answer and waits for it (a committer gone: `Closed`).
fn asked<T: Send + 'static>(
    submit: impl FnOnce(Answer<T>),
) -> BoxFuture<'static, Result<T, StoreError>> {
    let (tx, rx) = oneshot::channel();
    submit(Answer::oneshot(tx));
    Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
}

/// The typed, cloneable face of a store. Implements [`CheckpointStore`] for item type
/// `I`; every write is queued on the store's committer when the method is called (the
/// trait's ordering contract) and answered by it, without passing the actor (S15c).
pub struct CheckpointClient<I> {
    actor: ActorRef<CheckpointMsg>,
    /// The store's committer: writes are queued on it and answered by it (S15c).
    committer: Arc<Committer>,
    /// Who beat through this store since it was opened, and when it was opened: the
    /// proof [`CheckpointStore::orphaned`] gives (issue 28).
    opened: Arc<Opened>,
    _items: PhantomData<fn() -> I>,
}

/// What a client remembers of the store's life in this process.
#[derive(Debug)]
struct Opened {
    /// Wall-clock time the engine was opened (and its directory locked).
    at_ms: u64,
    /// Every runtime instance that beat through this store since.
    beaten: parking_lot::Mutex<HashSet<String>>,
}

impl<I> Clone for CheckpointClient<I> {
    fn clone(&self) -> Self {
        CheckpointClient {
            actor: self.actor.clone(),
            committer: self.committer.clone(),
            opened: self.opened.clone(),
            _items: PhantomData,
        }
    }
}

impl<I> CheckpointClient<I> {
    /// The face of a store the actor `actor` opened at `opened_at_ms`.
    pub(super) fn new(
        actor: ActorRef<CheckpointMsg>,
        committer: Arc<Committer>,
        opened_at_ms: u64,
    ) -> Self {
        CheckpointClient {
            actor,
            committer,
            opened: Arc::new(Opened {
                at_ms: opened_at_ms,
                beaten: Default::default(),
            }),
            _items: PhantomData,
        }
    }

    /// Submits a timer operation of `session` (S39) to the committer.
    fn timer_op(&self, session: &str, change: TimerOp, waiter: Waiter) {
        let op = WriteOp::Timer {
            key: session.to_string(),
            change,
        };
        submit_checked(&self.committer, session, op, waiter);
    }

    /// The actor that owns the store's lifecycle, for supervision (linking, stopping)
    /// or its lifecycle messages.
    pub fn actor(&self) -> &ActorRef<CheckpointMsg> {
        &self.actor
    }

    /// The committer's counters.
    pub async fn stats(&self) -> Result<CheckpointStats, StoreError> {
        if self.committer.is_closed() {
            return Err(StoreError::Closed);
        }
        Ok(stats(&self.committer))
    }

    /// Closes the store: writes sent before this call are finished and answered, later
    /// ones are refused with `Closed`, the engine is released (its directory can be
    /// opened again once this returns), and the actor stops.
    pub async fn close(&self) -> Result<(), StoreError> {
        // Straight to the committer, like every other operation of the client: what
        // this client or its clones sent before is finished, what follows is refused.
        let (tx, rx) = oneshot::channel();
        self.committer.close(Answer::oneshot(tx));
        let closed = rx.await.map_err(|_| StoreError::Closed)?;
        // The actor owns nothing more: it stops after the messages it has admitted
        // (each answered `Closed` by the closed committer).
        if self.actor.drain().is_err() {
            self.actor.stop(None);
        }
        closed
    }
}

impl<I: 'static> CheckpointStore<I> for CheckpointClient<I> {
    fn load_stored<'a>(
        &'a self,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        match check_id(session_id) {
            Ok(()) => asked(|a| self.committer.load(session_id.to_string(), a)),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    fn write(&self, write: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        asked(|a| self.write_then(write, a))
    }

    fn write_then(&self, write: RecordWrite, done: Answer<()>) {
        let key = write.session_id().to_string();
        submit_checked(
            &self.committer,
            &key,
            WriteOp::Write(Box::new(write)),
            Waiter::Unit(done),
        );
    }

    fn append_journal_then(
        &self,
        session: &str,
        epoch: u64,
        turn: u64,
        change: crate::store::JournalChange,
        done: Answer<()>,
    ) {
        submit_checked(
            &self.committer,
            session,
            WriteOp::Journal {
                key: session.to_string(),
                epoch,
                turn,
                change,
            },
            Waiter::Unit(done),
        );
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
        flush: bool,
        done: Answer<()>,
    ) {
        submit_checked(
            &self.committer,
            session,
            WriteOp::Events {
                key: session.to_string(),
                epoch,
                append,
                flush,
            },
            Waiter::Unit(done),
        );
    }

    fn ride_events(
        &self,
        session: &str,
        epoch: u64,
        rider: Arc<dyn crate::store::EventRider>,
        wake: bool,
    ) {
        /// A session's events as the committer's rider.
        struct Events {
            key: String,
            epoch: u64,
            rider: Arc<dyn crate::store::EventRider>,
        }
        impl crate::store::committer::Rider for Events {
            fn take(&self) -> Option<(WriteOp, Waiter)> {
                let (append, flush, done) = self.rider.take()?;
                Some((
                    WriteOp::Events {
                        key: self.key.clone(),
                        epoch: self.epoch,
                        append,
                        flush,
                    },
                    Waiter::Unit(done),
                ))
            }
        }
        self.committer.ride(
            Box::new(Events {
                key: session.to_string(),
                epoch,
                rider,
            }),
            wake,
        );
    }

    fn read_events(
        &self,
        session: &str,
        after: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<crate::store::KeptEvents, StoreError>> {
        asked(|a| {
            let key = session.to_string();
            self.committer
                .read(move |engine| engine.read_events(&key, after, max), a);
        })
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
        asked(|a| {
            self.timer_op(session, TimerOp::Arm(timer, max), Waiter::Armed(a));
        })
    }

    fn cancel_timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<bool, StoreError>> {
        asked(|a| {
            self.timer_op(session, TimerOp::Cancel(timer), Waiter::Deleted(a));
        })
    }

    fn change_timer(
        &self,
        session: &str,
        change: crate::store::TimerChange,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        asked(|a| {
            self.timer_op(session, TimerOp::Change(change), Waiter::Unit(a));
        })
    }

    fn timers(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Vec<(u64, crate::store::StoredTimer)>, StoreError>> {
        asked(|a| {
            let key = session.to_string();
            self.committer.read(move |engine| engine.timers(&key), a);
        })
    }

    fn timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<Option<crate::store::StoredTimer>, StoreError>> {
        asked(|a| {
            let key = session.to_string();
            self.committer
                .read(move |engine| engine.timer(&key, timer), a);
        })
    }

    fn due_timers(&self) -> BoxFuture<'static, Result<Vec<crate::store::TimerRef>, StoreError>> {
        asked(|a| {
            self.committer.read(move |engine| engine.due_timers(), a);
        })
    }

    fn delete_then(&self, session_id: &str, done: Answer<bool>) {
        submit_checked(
            &self.committer,
            session_id,
            WriteOp::Delete {
                key: session_id.to_string(),
            },
            Waiter::Deleted(done),
        );
    }

    fn delete(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        asked(|a| self.delete_then(session_id, a))
    }

    fn list_stored(
        &self,
        statuses: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        asked(|a| self.committer.list(statuses, a))
    }

    fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        asked(|a| {
            self.committer
                .list_page(after.map(str::to_string), limit, a);
        })
    }

    fn list_kept_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<String>, StoreError>> {
        asked(|a| {
            self.committer
                .kept_page(after.map(str::to_string), limit, a);
        })
    }

    fn cas_status(
        &self,
        session_id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>> {
        let op = WriteOp::Cas {
            key: session_id.to_string(),
            from,
            to,
        };
        asked(|a| submit_checked(&self.committer, session_id, op, Waiter::Cas(a)))
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        asked(|a| self.committer.submit(WriteOp::Flush, Waiter::Unit(a)))
    }

    fn beat(&self, instance: &str, now_ms: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        {
            let mut beaten = self.opened.beaten.lock();
            if !beaten.contains(instance) {
                beaten.insert(instance.to_string());
            }
        }
        let op = WriteOp::Beat {
            instance: instance.to_string(),
            now_ms,
        };
        asked(|a| self.committer.submit(op, Waiter::Unit(a)))
    }

    fn heartbeat(&self, instance: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        let instance = instance.to_string();
        asked(|a| {
            self.committer
                .read(move |engine| engine.heartbeat(&instance), a)
        })
    }

    /// sled and fjall lock their data directory: one process holds it.
    fn exclusive(&self) -> bool {
        true
    }

    fn orphaned(&self, owner: &str, last_seen_ms: u64) -> bool {
        last_seen_ms < self.opened.at_ms && !self.opened.beaten.lock().contains(owner)
    }

    fn history(
        &self,
        session_id: &str,
        query: crate::store::history::HistoryQuery,
    ) -> BoxFuture<'static, Result<crate::store::history::HistoryAnswer, StoreError>> {
        let session_id = session_id.to_string();
        asked(|a| {
            self.committer
                .read(move |engine| engine.history(&session_id, query), a)
        })
    }

    fn purge(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let op = WriteOp::Purge {
            key: session_id.to_string(),
        };
        asked(|a| submit_checked(&self.committer, session_id, op, Waiter::Deleted(a)))
    }
}
