//! The CheckpointActor: owns the embedded store (sled by default, or fjall:
//! `backend.rs`) and runs its writes as group commits (DESIGN §1, S15–S19).
//!
//! Every write (save, delete, status compare-and-swap, heartbeat) joins the *pending
//! wave*. The commit is pipelined in two stages, each on a blocking thread:
//!
//! 1. **apply**: when no wave is being applied, the pending wave is applied to sled in
//!    arrival order (visible to readers, not yet durable); writes that arrive meanwhile
//!    form the next wave;
//! 2. **flush**: when no flush is running, one starts and covers every write applied
//!    before it started; writes applied meanwhile wait for the next flush.
//!
//! So one flush covers everything that arrived together, applying the next wave
//! overlaps the current flush, and each waiter is answered only after a flush that
//! started after its write was applied. When nothing else waits for a flush (the
//! common case for a lone session), one blocking job applies the wave, reports it
//! applied, flushes, and answers the wave's waiters itself: the same order, two thread
//! hops fewer (B7, docs/benchmarks.md). A wave is one sled batch (or one plain insert
//! when it changes one key): every write in it, whatever the session, is applied
//! atomically (`sled.rs`). Reads of a session with
//! writes pending or being applied are ordered into the wave, so a read never sees an
//! older value than a write issued before it. Payloads are encoded by the caller (the
//! session, or [`CheckpointClient`]'s typed methods), not in this actor's loop.
//!
//! The actor never blocks: sled runs on blocking threads. It owns the backend; nothing
//! else writes it while the actor lives. [`CheckpointClient`] is its typed face and
//! implements [`CheckpointStore`].

use std::collections::HashSet;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::ids::validate_session_id;
use crate::metrics::RuntimeMetrics;
use crate::store::backend::{Backend, Engine};
use crate::store::wave::{OpResult, WriteOp};
use crate::store::{
    CasOutcome, CheckpointStore, RecordWrite, SessionStatus, StatusKind, StoreError, Stored,
    StoredEntry,
};

type Reply<T> = RpcReplyPort<Result<T, StoreError>>;
/// An applied operation waiting for a flush: who to answer, and what it did.
type AppliedOp = (Waiter, Result<OpResult, StoreError>);
/// A list request waiting for the wave it must see (by wave number).
type WaitingList = (u64, Option<Vec<StatusKind>>, Reply<Vec<StoredEntry>>);

/// Counters of the checkpoint actor (answer to [`CheckpointMsg::Stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Record writes received.
    pub saves: u64,
    /// Waves written (each with one flush).
    pub waves: u64,
    /// Operations written, over all waves.
    pub ops: u64,
    /// The largest wave, in operations.
    pub max_wave: u64,
    /// Flushes run (each covers every write applied before it started).
    pub flushes: u64,
    /// Bytes of payload (items and states) written.
    pub bytes: u64,
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
    /// Internal: a wave was applied (cannot be built outside the crate).
    Applied(Applied),
    /// Internal: a flush finished (cannot be built outside the crate).
    Flushed(Flushed),
}

crate::local_message!(CheckpointMsg);

/// Internal: the results of an applied wave (opaque).
pub struct Applied(Vec<Result<OpResult, StoreError>>);

/// Internal: the result of a flush (opaque).
pub struct Flushed(Result<(), StoreError>);

/// How one operation of a wave is answered.
enum Waiter {
    Unit(Reply<()>),
    Deleted(Reply<bool>),
    Cas(Reply<CasOutcome>),
    Load(Reply<Option<Stored>>),
}

/// The checkpoint actor. `I` is the item type of the clients it hands out; the actor
/// itself moves encoded records only.
pub struct CheckpointActor<I>(PhantomData<fn() -> I>);

/// The actor's state.
pub struct CheckpointState {
    /// `None` once the actor stopped (post_stop releases sled's lock).
    backend: Option<Arc<Backend>>,
    pending: Vec<(WriteOp, Waiter)>,
    /// Sessions with an operation pending or in flight (reads of them join the wave).
    busy: HashSet<String>,
    /// The wave being applied.
    applying: Option<Vec<Waiter>>,
    /// Applied writes waiting for a flush that starts after them.
    unflushed: Vec<AppliedOp>,
    /// Writes covered by the flush in flight.
    flushing: Option<Vec<AppliedOp>>,
    /// Lists wait for the waves that held writes issued before them (by wave number),
    /// so they see every earlier write without waiting for later ones.
    lists: Vec<WaitingList>,
    completed_waves: u64,
    /// Set by `Close`: new writes are refused; answered once the pipeline is empty.
    closing: Option<Reply<()>>,
    /// Set once `Close` was answered: the actor drains its mailbox, refusing each
    /// message, and stops.
    closed: bool,
    stats: CheckpointStats,
    /// Where apply and flush times are observed (S35).
    metrics: Option<Arc<RuntimeMetrics>>,
}

/// Runs `f` (a blocking store job), observing its duration with `observe` when there
/// are metrics.
fn timed<T>(
    metrics: &Option<Arc<RuntimeMetrics>>,
    observe: fn(&RuntimeMetrics, std::time::Duration),
    f: impl FnOnce() -> T,
) -> T {
    match metrics {
        None => f(),
        Some(m) => {
            let began = std::time::Instant::now();
            let out = f();
            observe(m, began.elapsed());
            out
        }
    }
}

fn check_id(id: &str) -> Result<(), StoreError> {
    validate_session_id(id).map_err(|reason| StoreError::InvalidId {
        id: id.to_string(),
        reason,
    })
}

impl<I: 'static> CheckpointActor<I> {
    /// Opens the sled store in `dir` (off the tokio workers) and starts the actor.
    pub async fn spawn(dir: impl AsRef<Path>) -> Result<CheckpointClient<I>, StoreError> {
        Self::spawn_inner(dir.as_ref().to_path_buf(), Engine::Sled, None).await
    }

    /// Like [`CheckpointActor::spawn`], linked under `supervisor`.
    pub async fn spawn_linked(
        dir: impl AsRef<Path>,
        supervisor: ActorCell,
    ) -> Result<CheckpointClient<I>, StoreError> {
        Self::spawn_inner(dir.as_ref().to_path_buf(), Engine::Sled, Some(supervisor)).await
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
        let backend = Arc::new(backend);
        let actor = CheckpointActor::<I>(PhantomData);
        let spawned = match supervisor {
            None => Actor::spawn(None, actor, (backend, metrics)).await,
            Some(s) => Actor::spawn_linked(None, actor, (backend, metrics), s).await,
        };
        let (actor, _join) = spawned.map_err(|e| StoreError::Backend {
            operation: "open",
            session: String::new(),
            message: format!("the checkpoint actor did not start: {e}"),
        })?;
        Ok(CheckpointClient {
            actor,
            opened: Arc::new(Opened {
                at_ms: opened_at_ms,
                beaten: Default::default(),
            }),
            _items: PhantomData,
        })
    }
}

impl CheckpointState {
    fn push(&mut self, key: Option<&str>, op: WriteOp, waiter: Waiter) {
        if let Some(k) = key {
            self.busy.insert(k.to_string());
        }
        self.pending.push((op, waiter));
    }

    /// Moves the pipeline along: applies the pending wave if none is being applied,
    /// starts a flush if none is running and writes wait for one.
    fn dispatch(&mut self, myself: &ActorRef<CheckpointMsg>) {
        self.serve_lists();
        if self.applying.is_none() && !self.pending.is_empty() {
            let wave = std::mem::take(&mut self.pending);
            let (ops, waiters): (Vec<WriteOp>, Vec<Waiter>) = wave.into_iter().unzip();
            self.stats.waves += 1;
            self.stats.ops += ops.len() as u64;
            self.stats.max_wave = self.stats.max_wave.max(ops.len() as u64);
            self.stats.bytes += ops
                .iter()
                .map(|o| match o {
                    WriteOp::Write(w) => w.payload_bytes() as u64,
                    _ => 0,
                })
                .sum::<u64>();
            let Some(backend) = self.backend.clone() else {
                return;
            };
            let myself = myself.clone();
            if self.flushing.is_none() && self.unflushed.is_empty() {
                // Nothing to flush but this wave: one blocking job applies it, reports
                // it applied (so the next wave may be applied meanwhile), flushes, and
                // answers the wave's waiters itself, two hops fewer than a flush of its
                // own. Invariants: the flush starts after the whole wave is applied, so
                // every write it answers is durable; `applying` and `flushing` hold
                // empty markers, cleared by the job's `Applied` and `Flushed`, so no
                // other wave is applied before this one and no other flush starts
                // before this one ends.
                self.applying = Some(Vec::new());
                self.flushing = Some(Vec::new());
                self.stats.flushes += 1;
                let metrics = self.metrics.clone();
                tokio::task::spawn_blocking(move || {
                    let results = timed(&metrics, RuntimeMetrics::checkpoint_applied, || {
                        backend.apply_unflushed(ops)
                    });
                    let mut writes = Vec::with_capacity(waiters.len());
                    for (waiter, result) in waiters.into_iter().zip(results) {
                        match waiter {
                            Waiter::Load(reply) => answer_read(reply, result),
                            w => writes.push((w, result)),
                        }
                    }
                    let _ = myself.send_message(CheckpointMsg::Applied(Applied(Vec::new())));
                    let flush = timed(&metrics, RuntimeMetrics::checkpoint_flushed, || {
                        backend.flush()
                    });
                    // Invariant: released before the report (see below).
                    drop(backend);
                    for (waiter, result) in writes {
                        answer_flushed(waiter, result, &flush);
                    }
                    // The waiters have their answers; the report carries the flush's
                    // own result so the actor sees what happened to it.
                    let _ = myself.send_message(CheckpointMsg::Flushed(Flushed(flush)));
                });
                return;
            }
            self.applying = Some(waiters);
            let metrics = self.metrics.clone();
            tokio::task::spawn_blocking(move || {
                let results = timed(&metrics, RuntimeMetrics::checkpoint_applied, || {
                    backend.apply_unflushed(ops)
                });
                // Invariant: blocking jobs release the backend before they report, so
                // once the actor has stopped nothing holds sled's lock.
                drop(backend);
                // The actor may be gone (shut down); then nobody waits for the answers.
                let _ = myself.send_message(CheckpointMsg::Applied(Applied(results)));
            });
        }
        if self.flushing.is_none() && !self.unflushed.is_empty() {
            let Some(backend) = self.backend.clone() else {
                return;
            };
            // Invariant: everything in `unflushed` was applied before this flush starts.
            self.flushing = Some(std::mem::take(&mut self.unflushed));
            self.stats.flushes += 1;
            let myself = myself.clone();
            let metrics = self.metrics.clone();
            tokio::task::spawn_blocking(move || {
                let r = timed(&metrics, RuntimeMetrics::checkpoint_flushed, || {
                    backend.flush()
                });
                drop(backend);
                let _ = myself.send_message(CheckpointMsg::Flushed(Flushed(r)));
            });
        }
    }

    fn applied(&mut self, results: Vec<Result<OpResult, StoreError>>) {
        self.completed_waves += 1;
        let waiters = self.applying.take().unwrap_or_default();
        for (waiter, result) in waiters.into_iter().zip(results) {
            match waiter {
                // Reads need no flush: answer them now, in order with the writes.
                Waiter::Load(reply) => answer_read(reply, result),
                w => self.unflushed.push((w, result)),
            }
        }
        // Sessions stay busy while the next wave holds them.
        self.busy = self
            .pending
            .iter()
            .filter_map(|(op, _)| op_key(op).map(str::to_string))
            .collect();
    }

    fn flushed(&mut self, flush: Result<(), StoreError>) {
        for (waiter, result) in self.flushing.take().unwrap_or_default() {
            answer_flushed(waiter, result, &flush);
        }
    }

    /// Closing: once every write taken is applied and flushed, release sled off the
    /// workers, answer the closer and stop.
    async fn finish_close(
        &mut self,
        myself: &ActorRef<CheckpointMsg>,
    ) -> Result<(), ActorProcessingErr> {
        let idle = self.pending.is_empty()
            && self.applying.is_none()
            && self.unflushed.is_empty()
            && self.flushing.is_none();
        if !idle || self.closing.is_none() {
            return Ok(());
        }
        for (_, _, reply) in std::mem::take(&mut self.lists) {
            let _ = reply.send(Err(StoreError::Closed));
        }
        if let Some(backend) = self.backend.take() {
            let _ = tokio::task::spawn_blocking(move || release(backend)).await;
        }
        if let Some(reply) = self.closing.take() {
            let _ = reply.send(Ok(()));
        }
        self.closed = true;
        // Everything taken was answered. Drain, not stop: ractor closes the mailbox to
        // new messages at once and stops after the ones already admitted, each refused
        // with `Closed` here. (A stop drops the mailbox instead, and a message whose
        // send raced that drop stays in the channel unanswered for as long as a client
        // holds the actor's reference: a caller waited forever.)
        if myself.drain().is_err() {
            myself.stop(None);
        }
        Ok(())
    }

    /// A list sees the writes of every wave up to the one that held writes issued
    /// before it.
    fn list_target(&self) -> u64 {
        let in_flight = u64::from(self.applying.is_some());
        let pending = u64::from(!self.pending.is_empty());
        self.completed_waves + in_flight + pending
    }

    fn serve_lists(&mut self) {
        let done = self.completed_waves;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.lists)
            .into_iter()
            .partition(|(target, _, _)| *target <= done);
        self.lists = waiting;
        for (_, statuses, reply) in ready {
            let Some(backend) = self.backend.clone() else {
                let _ = reply.send(Err(StoreError::Closed));
                continue;
            };
            tokio::task::spawn_blocking(move || {
                let r = backend.list(statuses.as_deref());
                drop(backend);
                let _ = reply.send(r);
            });
        }
    }
}

/// Answers a read of a wave (reads need no flush).
fn answer_read(reply: Reply<Option<Stored>>, result: Result<OpResult, StoreError>) {
    let _ = reply.send(result.and_then(|r| match r {
        OpResult::Read(stored) => Ok(stored.map(|b| *b)),
        other => Err(unexpected(other)),
    }));
}

/// Answers an applied operation once `flush`, which started after it was applied, is
/// done: a failed flush fails every write it covered; a write its condition refused
/// changed nothing, so its own answer stands.
fn answer_flushed(
    waiter: Waiter,
    result: Result<OpResult, StoreError>,
    flush: &Result<(), StoreError>,
) {
    let result = match (flush, result) {
        (Err(e), Ok(_)) => Err(e.clone()),
        (_, r) => r,
    };
    match waiter {
        Waiter::Unit(reply) => {
            let _ = reply.send(result.map(|_| ()));
        }
        Waiter::Deleted(reply) => {
            let _ = reply.send(result.and_then(|r| match r {
                OpResult::Deleted(d) => Ok(d),
                other => Err(unexpected(other)),
            }));
        }
        Waiter::Cas(reply) => {
            let _ = reply.send(result.and_then(|r| match r {
                OpResult::Cas(c) => Ok(c),
                other => Err(unexpected(other)),
            }));
        }
        Waiter::Load(reply) => {
            let _ = reply.send(Err(unexpected(OpResult::Done)));
        }
    }
}

/// Drops the engine and waits (bounded) until its directory lock is really free:
/// sled's background IO threads can hold the file a moment after the database is
/// dropped (fjall joins its threads in its drop). Blocks: call on a blocking thread.
fn release(backend: Arc<Backend>) {
    let lock_file = match &*backend {
        Backend::Sled(b) => b.path().join("db"),
        Backend::Fjall(b) => b.path().join("lock"),
    };
    drop(backend);
    let Ok(file) = std::fs::File::open(&lock_file) else {
        return;
    };
    for _ in 0..200 {
        if file.try_lock().is_ok() {
            let _ = file.unlock();
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    tracing::warn!(path = %lock_file.display(), "the store still holds its lock 1 s after close");
}

/// Answers a message that arrived while closing.
fn refuse_closed(msg: CheckpointMsg) {
    match msg {
        CheckpointMsg::Write { reply, .. }
        | CheckpointMsg::Flush { reply }
        | CheckpointMsg::Beat { reply, .. }
        | CheckpointMsg::Close { reply } => {
            let _ = reply.send(Err(StoreError::Closed));
        }
        CheckpointMsg::Load { reply, .. } => {
            let _ = reply.send(Err(StoreError::Closed));
        }
        CheckpointMsg::Delete { reply, .. } | CheckpointMsg::Purge { reply, .. } => {
            let _ = reply.send(Err(StoreError::Closed));
        }
        CheckpointMsg::History { reply, .. } => {
            let _ = reply.send(Err(StoreError::Closed));
        }
        CheckpointMsg::Cas { reply, .. } => {
            let _ = reply.send(Err(StoreError::Closed));
        }
        CheckpointMsg::List { reply, .. } => {
            let _ = reply.send(Err(StoreError::Closed));
        }
        CheckpointMsg::Heartbeat { reply, .. } => {
            let _ = reply.send(Err(StoreError::Closed));
        }
        CheckpointMsg::Stats { .. } | CheckpointMsg::Applied(_) | CheckpointMsg::Flushed(_) => {}
    }
}

fn op_key(op: &WriteOp) -> Option<&str> {
    match op {
        WriteOp::Write(w) => Some(w.session_id()),
        WriteOp::Delete { key }
        | WriteOp::Purge { key }
        | WriteOp::Cas { key, .. }
        | WriteOp::Read { key }
        | WriteOp::Restore { key, .. } => Some(key),
        WriteOp::Beat { .. } | WriteOp::Flush => None,
    }
}

fn unexpected(r: OpResult) -> StoreError {
    StoreError::Backend {
        operation: "apply",
        session: String::new(),
        message: format!("internal: unexpected result {r:?}"),
    }
}

impl<I: 'static> Actor for CheckpointActor<I> {
    type Msg = CheckpointMsg;
    type State = CheckpointState;
    type Arguments = (Arc<Backend>, Option<Arc<RuntimeMetrics>>);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (backend, metrics): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(CheckpointState {
            metrics,
            backend: Some(backend),
            pending: Vec::new(),
            busy: HashSet::new(),
            applying: None,
            unflushed: Vec::new(),
            flushing: None,
            lists: Vec::new(),
            completed_waves: 0,
            closing: None,
            closed: false,
            stats: CheckpointStats::default(),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Release sled (and its directory lock) before the actor reports stopped; the
        // blocking jobs hold no clone by then (they release it before reporting).
        // Dropping sled flushes and joins its threads: do it on a blocking thread.
        if let Some(backend) = st.backend.take() {
            let _ = tokio::task::spawn_blocking(move || drop(backend)).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if st.closed {
            // Closed and draining: every message still in the mailbox is refused.
            refuse_closed(msg);
            return Ok(());
        }
        if st.closing.is_some() {
            // Closing: refuse new work; the pipeline's own messages still flow.
            match msg {
                CheckpointMsg::Applied(Applied(results)) => st.applied(results),
                CheckpointMsg::Flushed(Flushed(r)) => st.flushed(r),
                CheckpointMsg::Stats { reply } => {
                    let _ = reply.send(st.stats);
                }
                other => refuse_closed(other),
            }
            st.dispatch(&myself);
            return st.finish_close(&myself).await;
        }
        match msg {
            CheckpointMsg::Close { reply } => {
                st.closing = Some(reply);
                st.dispatch(&myself);
                return st.finish_close(&myself).await;
            }
            CheckpointMsg::Write { write, reply } => match check_id(write.session_id()) {
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
                Ok(()) => {
                    st.stats.saves += 1;
                    let key = write.session_id().to_string();
                    st.push(Some(&key), WriteOp::Write(write), Waiter::Unit(reply));
                }
            },
            CheckpointMsg::Delete { session_id, reply } => match check_id(&session_id) {
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
                Ok(()) => st.push(
                    Some(&session_id.clone()),
                    WriteOp::Delete { key: session_id },
                    Waiter::Deleted(reply),
                ),
            },
            CheckpointMsg::Purge { session_id, reply } => match check_id(&session_id) {
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
                Ok(()) => st.push(
                    Some(&session_id.clone()),
                    WriteOp::Purge { key: session_id },
                    Waiter::Deleted(reply),
                ),
            },
            CheckpointMsg::History {
                session_id,
                query,
                reply,
            } => {
                let Some(backend) = st.backend.clone() else {
                    let _ = reply.send(Err(StoreError::Closed));
                    return Ok(());
                };
                tokio::task::spawn_blocking(move || {
                    let r = backend.history(&session_id, query);
                    drop(backend);
                    let _ = reply.send(r);
                });
            }
            CheckpointMsg::Cas {
                session_id,
                from,
                to,
                reply,
            } => match check_id(&session_id) {
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
                Ok(()) => st.push(
                    Some(&session_id.clone()),
                    WriteOp::Cas {
                        key: session_id,
                        from,
                        to,
                    },
                    Waiter::Cas(reply),
                ),
            },
            CheckpointMsg::Load { session_id, reply } => {
                if let Err(e) = check_id(&session_id) {
                    let _ = reply.send(Err(e));
                } else if st.busy.contains(&session_id) {
                    // Ordered after the writes issued before it.
                    st.push(
                        Some(&session_id.clone()),
                        WriteOp::Read { key: session_id },
                        Waiter::Load(reply),
                    );
                } else if let Some(backend) = st.backend.clone() {
                    tokio::task::spawn_blocking(move || {
                        let r = backend.load(&session_id);
                        drop(backend);
                        let _ = reply.send(r);
                    });
                } else {
                    let _ = reply.send(Err(StoreError::Closed));
                }
            }
            CheckpointMsg::List { statuses, reply } => {
                let target = st.list_target();
                st.lists.push((target, statuses, reply));
            }
            CheckpointMsg::Flush { reply } => st.push(None, WriteOp::Flush, Waiter::Unit(reply)),
            CheckpointMsg::Beat {
                instance,
                now_ms,
                reply,
            } => st.push(
                None,
                WriteOp::Beat { instance, now_ms },
                Waiter::Unit(reply),
            ),
            CheckpointMsg::Heartbeat { instance, reply } => {
                let Some(backend) = st.backend.clone() else {
                    let _ = reply.send(Err(StoreError::Closed));
                    return Ok(());
                };
                tokio::task::spawn_blocking(move || {
                    let r = backend.heartbeat(&instance);
                    drop(backend);
                    let _ = reply.send(r);
                });
            }
            CheckpointMsg::Stats { reply } => {
                let _ = reply.send(st.stats);
            }
            CheckpointMsg::Applied(Applied(results)) => st.applied(results),
            CheckpointMsg::Flushed(Flushed(r)) => st.flushed(r),
        }
        st.dispatch(&myself);
        Ok(())
    }
}

/// The typed, cloneable face of the checkpoint actor. Implements [`CheckpointStore`]
/// for item type `I`; every write is sent to the actor when the method is called (the
/// trait's ordering contract).
pub struct CheckpointClient<I> {
    actor: ActorRef<CheckpointMsg>,
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
            opened: self.opened.clone(),
            _items: PhantomData,
        }
    }
}

impl<I> CheckpointClient<I> {
    /// The actor, for supervision or direct `call!`.
    pub fn actor(&self) -> &ActorRef<CheckpointMsg> {
        &self.actor
    }

    fn ask<T: Send + 'static>(
        &self,
        build: impl FnOnce(Reply<T>) -> CheckpointMsg,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.actor.send_message(build(RpcReplyPort::from(tx)));
        Box::pin(async move {
            sent.map_err(|_| StoreError::Closed)?;
            rx.await.map_err(|_| StoreError::Closed)?
        })
    }

    /// The actor's counters.
    pub async fn stats(&self) -> Result<CheckpointStats, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.actor
            .send_message(CheckpointMsg::Stats {
                reply: RpcReplyPort::from(tx),
            })
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)
    }

    /// Closes the store: writes sent before this call are finished and answered, later
    /// ones are refused with `Closed`, sled is released (its directory can be opened
    /// again once this returns), and the actor stops.
    pub async fn close(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.actor
            .send_message(CheckpointMsg::Close {
                reply: RpcReplyPort::from(tx),
            })
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
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
