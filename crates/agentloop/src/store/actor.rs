//! The CheckpointActor: owns an embedded store's lifecycle (sled by default, or fjall:
//! `backend.rs`) and its committer (`committer.rs`, S15c), and answers the messages of
//! actors that `call!` it (DESIGN §1, S15–S19).
//!
//! It is not on the path of an ordinary write: [`CheckpointClient`], the typed face
//! sessions and callers use, queues writes on the committer's thread and is answered by
//! it directly, and reads the engine without passing through here. The actor keeps
//! what needs one owner: opening the engine and starting the committer, closing (the
//! committer finishes what was queued, refuses the rest, releases the engine and its
//! directory lock, then the actor stops), and the same operations as messages for
//! whoever holds only its [`ActorRef`]. It never blocks: engine work runs on the
//! committer's thread or the blocking pool.

use crate::store::wave::TimerOp;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::BoxFuture;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::ids::validate_session_id;
use crate::metrics::RuntimeMetrics;
use crate::store::backend::{Backend, Engine};
use crate::store::committer::{Answer, Committer, Waiter};
use crate::store::wave::WriteOp;
use crate::store::{
    CasOutcome, CheckpointStore, RecordWrite, SessionStatus, StatusKind, StoreError, Stored,
    StoredEntry,
};

type Reply<T> = RpcReplyPort<Result<T, StoreError>>;

/// Counters of a store's committer (answer to [`CheckpointMsg::Stats`] and
/// [`CheckpointClient::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Record writes received.
    pub saves: u64,
    /// Waves applied (a batch the committer took at once; a listing splits one).
    pub waves: u64,
    /// Operations applied, over all waves.
    pub ops: u64,
    /// The largest wave, in operations.
    pub max_wave: u64,
    /// Flushes run (each covers every write of its batch).
    pub flushes: u64,
    /// Bytes of payload (items and states) written.
    pub bytes: u64,
    /// Times the committer's thread was started because work arrived while it was not
    /// running (each is a thread wake-up on the write path; fewer than `waves` when
    /// writes came back while it lingered).
    pub wakes: u64,
}

/// Messages of the checkpoint actor. Other actors may `call!` it directly; sessions use
/// [`CheckpointClient`].
pub enum CheckpointMsg {
    /// Apply a change to one session's record; answered after the flush that covers it.
    Write {
        /// The write (boxed: writes are large next to the other messages).
        write: Box<RecordWrite>,
        /// Where to answer.
        reply: Reply<()>,
    },
    /// Read a record as stored.
    Load {
        /// The session.
        session_id: String,
        /// Where to answer.
        reply: Reply<Option<Stored>>,
    },
    /// Delete a record; answers whether one existed, after the flush.
    Delete {
        /// The session.
        session_id: String,
        /// Where to answer.
        reply: Reply<bool>,
    },
    /// Compare-and-swap a record's status (S19, S24); answered after the flush.
    Cas {
        /// The session.
        session_id: String,
        /// The statuses that allow the swap.
        from: Vec<StatusKind>,
        /// The new status.
        to: SessionStatus,
        /// Where to answer.
        reply: Reply<CasOutcome>,
    },
    /// List records as stored (ordered after the writes issued before it).
    List {
        /// Only these statuses, if given.
        statuses: Option<Vec<StatusKind>>,
        /// Where to answer.
        reply: Reply<Vec<StoredEntry>>,
    },
    /// Answered once every write issued before it is flushed.
    Flush {
        /// Where to answer.
        reply: Reply<()>,
    },
    /// Renew an instance heartbeat; answered after the flush.
    Beat {
        /// The instance.
        instance: String,
        /// The time.
        now_ms: u64,
        /// Where to answer.
        reply: Reply<()>,
    },
    /// Read a session's checkpoint history (sees every write answered before it).
    History {
        /// The session.
        session_id: String,
        /// What to read.
        query: crate::store::history::HistoryQuery,
        /// Where to answer.
        reply: Reply<crate::store::history::HistoryAnswer>,
    },
    /// Delete a record and its checkpoint history; answers whether anything existed,
    /// after the flush.
    Purge {
        /// The session.
        session_id: String,
        /// Where to answer.
        reply: Reply<bool>,
    },
    /// Read an instance heartbeat.
    Heartbeat {
        /// The instance.
        instance: String,
        /// Where to answer.
        reply: Reply<Option<u64>>,
    },
    /// Stop taking writes (they are answered `Closed`), finish every write already
    /// taken (answered after its flush), release sled and its directory lock, answer,
    /// and stop.
    Close {
        /// Where to answer.
        reply: Reply<()>,
    },
    /// Counters.
    Stats {
        /// Where to answer.
        reply: RpcReplyPort<CheckpointStats>,
    },
}

crate::local_message!(CheckpointMsg);

/// The checkpoint actor. `I` is the item type of the clients it hands out; the actor
/// itself moves encoded records only.
pub struct CheckpointActor<I>(PhantomData<fn() -> I>);

/// The actor's state: the committer it owns.
pub struct CheckpointState {
    committer: Arc<Committer>,
}

impl Drop for CheckpointState {
    /// An actor killed (ractor runs no `post_stop` then) still closes its store: the
    /// committer finishes what was queued and releases the engine on its own thread.
    fn drop(&mut self) {
        if !self.committer.is_closed() {
            self.committer.close(Answer::new(|_| {}));
        }
    }
}

fn check_id(id: &str) -> Result<(), StoreError> {
    validate_session_id(id).map_err(|reason| StoreError::InvalidId {
        id: id.to_string(),
        reason,
    })
}

/// An answer that goes to an actor's reply port.
fn to_port<T: Send + 'static>(reply: Reply<T>) -> Answer<T> {
    Answer::new(move |r| {
        let _ = reply.send(r);
    })
}

/// Reads the counters.
fn stats(committer: &Committer) -> CheckpointStats {
    let c = &committer.counters;
    CheckpointStats {
        saves: c.saves.load(Ordering::Relaxed),
        waves: c.waves.load(Ordering::Relaxed),
        ops: c.ops.load(Ordering::Relaxed),
        max_wave: c.max_wave.load(Ordering::Relaxed),
        flushes: c.flushes.load(Ordering::Relaxed),
        bytes: c.bytes.load(Ordering::Relaxed),
        wakes: c.wakes.load(Ordering::Relaxed),
    }
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

/// Performs one operation message on `committer` (shared by the actor and, through
/// the same function, nothing else: the client calls the committer directly).
fn perform(committer: &Arc<Committer>, msg: CheckpointMsg) {
    match msg {
        CheckpointMsg::Write { write, reply } => {
            let key = write.session_id().to_string();
            submit_checked(
                committer,
                &key,
                WriteOp::Write(write),
                Waiter::Unit(to_port(reply)),
            )
        }
        CheckpointMsg::Delete { session_id, reply } => submit_checked(
            committer,
            &session_id.clone(),
            WriteOp::Delete { key: session_id },
            Waiter::Deleted(to_port(reply)),
        ),
        CheckpointMsg::Purge { session_id, reply } => submit_checked(
            committer,
            &session_id.clone(),
            WriteOp::Purge { key: session_id },
            Waiter::Deleted(to_port(reply)),
        ),
        CheckpointMsg::Cas {
            session_id,
            from,
            to,
            reply,
        } => submit_checked(
            committer,
            &session_id.clone(),
            WriteOp::Cas {
                key: session_id,
                from,
                to,
            },
            Waiter::Cas(to_port(reply)),
        ),
        CheckpointMsg::Load { session_id, reply } => match check_id(&session_id) {
            Ok(()) => committer.load(session_id, to_port(reply)),
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        },
        CheckpointMsg::History {
            session_id,
            query,
            reply,
        } => committer.read(
            move |engine| engine.history(&session_id, query),
            to_port(reply),
        ),
        CheckpointMsg::List { statuses, reply } => committer.list(statuses, to_port(reply)),
        CheckpointMsg::Flush { reply } => {
            committer.submit(WriteOp::Flush, Waiter::Unit(to_port(reply)))
        }
        CheckpointMsg::Beat {
            instance,
            now_ms,
            reply,
        } => committer.submit(
            WriteOp::Beat { instance, now_ms },
            Waiter::Unit(to_port(reply)),
        ),
        CheckpointMsg::Heartbeat { instance, reply } => {
            committer.read(move |engine| engine.heartbeat(&instance), to_port(reply))
        }
        CheckpointMsg::Stats { reply } => {
            let _ = reply.send(stats(committer));
        }
        CheckpointMsg::Close { reply } => committer.close(to_port(reply)),
    }
}

impl<I: 'static> Actor for CheckpointActor<I> {
    type Msg = CheckpointMsg;
    type State = CheckpointState;
    type Arguments = Arc<Committer>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        committer: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(CheckpointState { committer })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped without a close (its supervisor stopped it): close the committer and
        // wait until the engine and its directory lock are released, so whoever saw
        // the actor stop may open the directory again.
        if !st.committer.is_closed() {
            let (tx, rx) = oneshot::channel();
            st.committer.close(Answer::oneshot(tx));
            let _ = rx.await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CheckpointMsg::Close { reply } => {
                // Answered once the committer has released the engine; then the actor
                // stops after the messages already admitted (each refused `Closed` by
                // the closed committer). Drain, not stop: a stop would drop them
                // unanswered.
                st.committer.close(Answer::new(move |r| {
                    let _ = reply.send(r);
                    if myself.drain().is_err() {
                        myself.stop(None);
                    }
                }));
            }
            other => perform(&st.committer, other),
        }
        Ok(())
    }
}

impl<I: 'static> CheckpointActor<I> {
    /// Opens the sled store in `dir` at the default level, `power` (off the tokio
    /// workers), and starts the actor.
    pub async fn spawn(dir: impl AsRef<Path>) -> Result<CheckpointClient<I>, StoreError> {
        Self::spawn_inner(dir.as_ref().to_path_buf(), Engine::SLED, None).await
    }

    /// Like [`CheckpointActor::spawn`], linked under `supervisor`.
    pub async fn spawn_linked(
        dir: impl AsRef<Path>,
        supervisor: ActorCell,
    ) -> Result<CheckpointClient<I>, StoreError> {
        Self::spawn_inner(dir.as_ref().to_path_buf(), Engine::SLED, Some(supervisor)).await
    }

    /// Opens `engine` in `dir` (off the tokio workers) and starts the actor. A directory
    /// the other engine wrote is refused with a message saying how to move its records.
    pub async fn spawn_engine(
        dir: impl AsRef<Path>,
        engine: Engine,
    ) -> Result<CheckpointClient<I>, StoreError> {
        Self::spawn_inner(dir.as_ref().to_path_buf(), engine, None).await
    }

    /// Like [`CheckpointActor::spawn_engine`], linked under `supervisor`.
    pub async fn spawn_engine_linked(
        dir: impl AsRef<Path>,
        engine: Engine,
        supervisor: ActorCell,
    ) -> Result<CheckpointClient<I>, StoreError> {
        Self::spawn_inner(dir.as_ref().to_path_buf(), engine, Some(supervisor)).await
    }

    /// Like [`CheckpointActor::spawn_engine`], observing every group commit's apply and
    /// flush time in `metrics` (the runtime's).
    pub async fn spawn_observed(
        dir: impl AsRef<Path>,
        engine: Engine,
        metrics: Arc<RuntimeMetrics>,
    ) -> Result<CheckpointClient<I>, StoreError> {
        Self::spawn_with(dir.as_ref().to_path_buf(), engine, None, Some(metrics)).await
    }

    async fn spawn_inner(
        dir: std::path::PathBuf,
        engine: Engine,
        supervisor: Option<ActorCell>,
    ) -> Result<CheckpointClient<I>, StoreError> {
        Self::spawn_with(dir, engine, supervisor, None).await
    }

    async fn spawn_with(
        dir: std::path::PathBuf,
        engine: Engine,
        supervisor: Option<ActorCell>,
        metrics: Option<Arc<RuntimeMetrics>>,
    ) -> Result<CheckpointClient<I>, StoreError> {
        // Taken before the open: anything written before the directory was locked by
        // this process was written by another one.
        let opened_at_ms = crate::store::now_ms();
        let backend = tokio::task::spawn_blocking(move || Backend::open(&dir, engine))
            .await
            .map_err(|e| StoreError::Backend {
                operation: "open",
                session: String::new(),
                message: e.to_string(),
            })??;
        let committer = Committer::start(
            Arc::new(backend),
            metrics,
            tokio::runtime::Handle::current(),
        )?;
        let actor = CheckpointActor::<I>(PhantomData);
        let args = committer.clone();
        let spawned = match supervisor {
            None => Actor::spawn(None, actor, args).await,
            Some(s) => Actor::spawn_linked(None, actor, args, s).await,
        };
        let (actor, _join) = match spawned {
            Ok(a) => a,
            Err(e) => {
                let (tx, rx) = oneshot::channel();
                committer.close(Answer::oneshot(tx));
                let _ = rx.await;
                return Err(StoreError::Backend {
                    operation: "open",
                    session: String::new(),
                    message: format!("the checkpoint actor did not start: {e}"),
                });
            }
        };
        Ok(CheckpointClient {
            actor,
            committer,
            opened: Arc::new(Opened {
                at_ms: opened_at_ms,
                beaten: Default::default(),
            }),
            _items: PhantomData,
        })
    }
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
    /// Submits a timer operation of `session` (S39) to the committer.
    fn timer_op(&self, session: &str, change: TimerOp, waiter: Waiter) {
        let op = WriteOp::Timer {
            key: session.to_string(),
            change,
        };
        submit_checked(&self.committer, session, op, waiter);
    }

    /// The actor, for supervision or direct `call!`.
    pub fn actor(&self) -> &ActorRef<CheckpointMsg> {
        &self.actor
    }

    /// Performs `build`'s operation on the committer, answered through a oneshot.
    fn ask<T: Send + 'static>(
        &self,
        build: impl FnOnce(Reply<T>) -> CheckpointMsg,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (tx, rx) = oneshot::channel();
        perform(&self.committer, build(RpcReplyPort::from(tx)));
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
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
        let session_id = session_id.to_string();
        self.ask(|reply| CheckpointMsg::Load { session_id, reply })
    }

    fn write(&self, write: RecordWrite) -> BoxFuture<'static, Result<(), StoreError>> {
        let write = Box::new(write);
        self.ask(|reply| CheckpointMsg::Write { write, reply })
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
        let (tx, rx) = oneshot::channel();
        let key = session.to_string();
        self.committer.read(
            move |engine| engine.read_events(&key, after, max),
            Answer::oneshot(tx),
        );
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
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
        let (tx, rx) = oneshot::channel();
        self.timer_op(
            session,
            TimerOp::Arm(timer, max),
            Waiter::Armed(Answer::oneshot(tx)),
        );
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
    }

    fn cancel_timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<bool, StoreError>> {
        let (tx, rx) = oneshot::channel();
        self.timer_op(
            session,
            TimerOp::Cancel(timer),
            Waiter::Deleted(Answer::oneshot(tx)),
        );
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
    }

    fn change_timer(
        &self,
        session: &str,
        change: crate::store::TimerChange,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let (tx, rx) = oneshot::channel();
        self.timer_op(
            session,
            TimerOp::Change(change),
            Waiter::Unit(Answer::oneshot(tx)),
        );
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
    }

    fn timers(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Vec<(u64, crate::store::StoredTimer)>, StoreError>> {
        let (tx, rx) = oneshot::channel();
        let key = session.to_string();
        self.committer
            .read(move |engine| engine.timers(&key), Answer::oneshot(tx));
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
    }

    fn timer(
        &self,
        session: &str,
        timer: u64,
    ) -> BoxFuture<'static, Result<Option<crate::store::StoredTimer>, StoreError>> {
        let (tx, rx) = oneshot::channel();
        let key = session.to_string();
        self.committer
            .read(move |engine| engine.timer(&key, timer), Answer::oneshot(tx));
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
    }

    fn due_timers(&self) -> BoxFuture<'static, Result<Vec<crate::store::TimerRef>, StoreError>> {
        let (tx, rx) = oneshot::channel();
        self.committer
            .read(move |engine| engine.due_timers(), Answer::oneshot(tx));
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
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
        let session_id = session_id.to_string();
        self.ask(|reply| CheckpointMsg::Delete { session_id, reply })
    }

    fn list_stored(
        &self,
        statuses: Option<Vec<StatusKind>>,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        self.ask(|reply| CheckpointMsg::List { statuses, reply })
    }

    fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<StoredEntry>, StoreError>> {
        let (tx, rx) = oneshot::channel();
        self.committer
            .list_page(after.map(str::to_string), limit, Answer::oneshot(tx));
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
    }

    fn list_kept_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<String>, StoreError>> {
        let (tx, rx) = oneshot::channel();
        self.committer
            .kept_page(after.map(str::to_string), limit, Answer::oneshot(tx));
        Box::pin(async move { rx.await.map_err(|_| StoreError::Closed)? })
    }

    fn cas_status(
        &self,
        session_id: &str,
        from: Vec<StatusKind>,
        to: SessionStatus,
    ) -> BoxFuture<'static, Result<CasOutcome, StoreError>> {
        let session_id = session_id.to_string();
        self.ask(|reply| CheckpointMsg::Cas {
            session_id,
            from,
            to,
            reply,
        })
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        self.ask(|reply| CheckpointMsg::Flush { reply })
    }

    fn beat(&self, instance: &str, now_ms: u64) -> BoxFuture<'static, Result<(), StoreError>> {
        {
            let mut beaten = self.opened.beaten.lock();
            if !beaten.contains(instance) {
                beaten.insert(instance.to_string());
            }
        }
        let instance = instance.to_string();
        self.ask(|reply| CheckpointMsg::Beat {
            instance,
            now_ms,
            reply,
        })
    }

    fn heartbeat(&self, instance: &str) -> BoxFuture<'static, Result<Option<u64>, StoreError>> {
        let instance = instance.to_string();
        self.ask(|reply| CheckpointMsg::Heartbeat { instance, reply })
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
        self.ask(|reply| CheckpointMsg::History {
            session_id,
            query,
            reply,
        })
    }

    fn purge(&self, session_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let session_id = session_id.to_string();
        self.ask(|reply| CheckpointMsg::Purge { session_id, reply })
    }
}
