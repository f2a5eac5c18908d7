//! The committer (S15c): one thread per store commits its writes. Writers (a session, a
//! [`CheckpointClient`](crate::store::CheckpointClient)) queue their operations here and are
//! answered by the committer directly: when it wakes it takes everything queued (no
//! timer, as Restate's log writer does), applies it as one engine batch in arrival
//! order, makes it durable once, then answers every writer of the batch: a session
//! through the completion it handed over (a message into its own mailbox), a client
//! through its oneshot. Reads of a session with operations queued join the queue, so
//! they see those operations; a load whose record is all in its head (format 3, no
//! loose entries) is read on the caller's thread, and other reads go to the engine on
//! the blocking pool. A read there and the apply of a wave exclude each other
//! (`Committer::applying`): a read of several keys (a head, then the loose entries it
//! names) sees the engine between two waves, never halfway through one. The flush is
//! outside that exclusion: no read waits behind a flush.
//!
//! The thread is a tokio blocking-pool thread held for as long as work is queued (one
//! at a time per store: a queue that was empty starts it, it returns once the queue has
//! stayed empty for `LINGER`, 50 µs, yielding: a writer that comes back within it is
//! taken without waking a parked thread): between bursts a store holds no thread, a
//! store dropped without a close leaks none, and tokio's paused clock (the tests'
//! accelerated time) sees the store busy while it commits, as it sees any blocking job.
//!
//! It owns the order of writes and their durability; it does not know item types,
//! validate ids or decide anything about records (the engine applies a write's
//! conditions and fencing). The engine may stall a writer under back-pressure (fjall):
//! that is why every engine write runs on this thread, never on a tokio worker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::metrics::RuntimeMetrics;
use crate::store::backend::Backend;
use crate::store::wave::{OpResult, WriteOp};
use crate::store::{CasOutcome, StatusKind, StoreError, Stored, StoredEntry};

/// A completion: called once with the operation's result, from the committer's thread
/// (or with [`StoreError::Closed`] from wherever it is dropped unanswered).
pub struct Answer<T>(Option<Completion<T>>);

/// What an [`Answer`] calls.
type Completion<T> = Box<dyn FnOnce(Result<T, StoreError>) + Send>;

impl<T> Answer<T> {
    /// A completion that calls `f`.
    pub fn new(f: impl FnOnce(Result<T, StoreError>) + Send + 'static) -> Self {
        Answer(Some(Box::new(f)))
    }

    /// A completion that sends to a oneshot (whose receiver may be gone).
    pub fn oneshot(tx: tokio::sync::oneshot::Sender<Result<T, StoreError>>) -> Self
    where
        T: Send + 'static,
    {
        Answer::new(move |r| {
            let _ = tx.send(r);
        })
    }

    /// Answers.
    pub fn send(mut self, result: Result<T, StoreError>) {
        if let Some(f) = self.0.take() {
            f(result);
        }
    }
}

impl<T> Drop for Answer<T> {
    fn drop(&mut self) {
        // Never left without an answer: an operation dropped unanswered (the store
        // closed before it was taken) is answered `Closed`.
        if let Some(f) = self.0.take() {
            f(Err(StoreError::Closed));
        }
    }
}

impl<T> std::fmt::Debug for Answer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Answer")
    }
}

/// How one operation is answered.
#[derive(Debug)]
pub(crate) enum Waiter {
    Unit(Answer<()>),
    Deleted(Answer<bool>),
    Cas(Answer<CasOutcome>),
    Load(Answer<Option<Stored>>),
    Armed(Answer<u64>),
}

/// What the committer's thread takes from its queue.
enum Job {
    /// An operation on the engine, applied in arrival order.
    Op { op: WriteOp, waiter: Waiter },
    /// A listing: runs once every operation queued before it is applied (on the
    /// blocking pool: a scan must not hold the writes behind it).
    List {
        what: Listing,
        answer: Answer<Vec<StoredEntry>>,
    },
    /// The ids of one page of sessions that keep history or events
    /// (`table::kept_page`, S26a): runs as a listing does.
    Kept {
        after: Option<String>,
        limit: usize,
        answer: Answer<Vec<String>>,
    },
    /// Finish everything queued before it, refuse what follows, release the engine.
    Close { answer: Answer<()> },
    /// Nothing: wakes the thread so that the riders waiting are committed.
    Wake,
}

/// What a listing reads.
pub(crate) enum Listing {
    /// Every record, optionally only those of these statuses.
    All(Option<Vec<StatusKind>>),
    /// One page in id order (`table::list_page`): after this id, at most this many.
    Page(Option<String>, usize),
}

/// Operations that wait for the next group commit instead of starting one (S20a: a
/// session's kept events, written "in the group commit that follows them"): the
/// committer takes them at its next wave, whoever starts it.
pub(crate) trait Rider: Send + Sync {
    /// What waits, taken now (`None`: nothing any more).
    fn take(&self) -> Option<(WriteOp, Waiter)>;
}

/// How long the committer's thread stays awake with nothing queued before it ends
/// (see `Committer::linger`).
const LINGER: std::time::Duration = std::time::Duration::from_micros(50);

/// Counters of one store's committer.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) saves: AtomicU64,
    pub(crate) waves: AtomicU64,
    pub(crate) ops: AtomicU64,
    pub(crate) max_wave: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) wakes: AtomicU64,
}

/// The writers' side of a store's committer (opaque outside the crate): queue operations,
/// read what is not queued.
pub struct Committer {
    /// What is queued, and whether the committer's thread is running.
    queue: parking_lot::Mutex<Queue>,
    /// Sessions with operations queued and not applied yet, and how many.
    queued: parking_lot::Mutex<HashMap<String, u32>>,
    /// The engine; taken at close.
    engine: parking_lot::RwLock<Option<Arc<Backend>>>,
    /// Where apply and flush times are observed (S35).
    metrics: Option<Arc<RuntimeMetrics>>,
    closed: AtomicBool,
    /// Jobs were queued since the committer's thread last took them (read while it
    /// lingers, without the queue's lock).
    has_jobs: AtomicBool,
    /// Runs reads and listings on its blocking pool.
    runtime: tokio::runtime::Handle,
    pub(crate) counters: Counters,
    /// Operations were applied whose answers did not wait for a flush (kept events):
    /// the close flushes them.
    unflushed: AtomicBool,
    /// Riders waiting for the next wave.
    riders: parking_lot::Mutex<Vec<Box<dyn Rider>>>,
    /// Held shared by each read on the blocking pool ([`Committer::read`]) and
    /// exclusive by the committer's thread while it applies a wave (not while it
    /// flushes). An engine read of a record takes several calls (its head, then the
    /// loose entries the head names), and neither engine's calls see one snapshot: a
    /// wave applied between them (an item delivered: its entry removed, the head
    /// rewritten) made a load answer a head naming an entry that was gone ("the
    /// header names item entry N, which is missing"; the power-cut test's reads of live
    /// sessions, S31a). Listings do not take it (a scan must not hold the writes behind
    /// it): a listed record's head is one key, but its loose entries may be of the next
    /// wave; a record read whole for its items is a load.
    applying: Arc<parking_lot::RwLock<()>>,
}

/// The committer's queue.
#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// A thread is committing (it takes `jobs` again before it returns).
    running: bool,
    /// A close was taken: nothing more is queued.
    closed: bool,
    /// Closes asked after the first one: answered once the engine is released.
    closers: Vec<Answer<()>>,
    /// The engine was released (or dropped after the thread ended abnormally).
    released: bool,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer")
            .field("closed", &self.is_closed())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Job::Op { .. } => "Op",
            Job::List { .. } => "List",
            Job::Kept { .. } => "Kept",
            Job::Close { .. } => "Close",
            Job::Wake => "Wake",
        })
    }
}

fn key_of(op: &WriteOp) -> Option<&str> {
    match op {
        WriteOp::Write(w) => Some(w.session_id()),
        WriteOp::Delete { key }
        | WriteOp::Purge { key }
        | WriteOp::Cas { key, .. }
        | WriteOp::Read { key }
        | WriteOp::Journal { key, .. }
        | WriteOp::Events { key, .. }
        | WriteOp::Timer { key, .. }
        | WriteOp::Restore { key, .. } => Some(key),
        WriteOp::Beat { .. } | WriteOp::Flush => None,
    }
}

impl Committer {
    /// A committer over `engine`; its thread runs on `runtime`'s blocking pool while
    /// work is queued.
    pub(crate) fn start(
        engine: Arc<Backend>,
        metrics: Option<Arc<RuntimeMetrics>>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Arc<Self>, StoreError> {
        Ok(Arc::new(Committer {
            queue: parking_lot::Mutex::new(Queue::default()),
            queued: parking_lot::Mutex::new(HashMap::new()),
            engine: parking_lot::RwLock::new(Some(engine)),
            metrics,
            closed: AtomicBool::new(false),
            has_jobs: AtomicBool::new(false),
            runtime,
            counters: Counters::default(),
            unflushed: AtomicBool::new(false),
            riders: parking_lot::Mutex::new(Vec::new()),
            applying: Arc::new(parking_lot::RwLock::new(())),
        }))
    }

    /// Whether the store was closed and its engine released.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Queues `job`, starting the committer's thread if it is not running. After a
    /// close the job is dropped, which answers it `Closed`.
    fn send(self: &Arc<Self>, job: Job) {
        let mut queue = self.queue.lock();
        if queue.closed {
            // A close after the first one waits for the same release.
            if let Job::Close { answer } = job {
                if queue.released {
                    drop(queue);
                    return answer.send(Ok(()));
                }
                return queue.closers.push(answer);
            }
            drop(queue);
            return drop(job);
        }
        if matches!(job, Job::Close { .. }) {
            queue.closed = true;
        }
        queue.jobs.push(job);
        self.has_jobs.store(true, Ordering::Release);
        if !queue.running {
            queue.running = true;
            drop(queue);
            self.counters.wakes.fetch_add(1, Ordering::Relaxed);
            // Disarmed only by a normal return: a panic on the thread (in the engine or
            // in a completion) or a runtime that drops the job unrun closes the queue.
            let mut guard = Running {
                committer: self.clone(),
                finished: false,
            };
            self.runtime.spawn_blocking(move || {
                guard.committer.run();
                guard.disarm();
            });
        }
    }

    /// Queues an operation; `waiter` is answered once it is applied (reads) or applied
    /// and durable (everything else).
    pub(crate) fn submit(self: &Arc<Self>, op: WriteOp, waiter: Waiter) {
        if let WriteOp::Write(w) = &op {
            self.counters.saves.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes
                .fetch_add(w.payload_bytes() as u64, Ordering::Relaxed);
        }
        if let Some(key) = key_of(&op) {
            *self.queued.lock().entry(key.to_string()).or_insert(0) += 1;
        }
        self.send(Job::Op { op, waiter });
    }

    /// Reads a session's record: through the queue when operations on it are queued
    /// (so it sees them); else from its head on the caller's thread when the head holds
    /// the whole record (no hop: S15c), else from the engine on the blocking pool.
    pub(crate) fn load(self: &Arc<Self>, key: String, answer: Answer<Option<Stored>>) {
        if self.queued.lock().contains_key(&key) {
            return self.submit(WriteOp::Read { key }, Waiter::Load(answer));
        }
        let Some(engine) = self.engine.read().clone() else {
            return answer.send(Err(StoreError::Closed));
        };
        if let Some(r) = engine.load_from_head(&key) {
            drop(engine);
            return answer.send(r);
        }
        drop(engine);
        self.read(move |engine| engine.load(&key), answer);
    }

    /// Runs a read that needs no ordering on the blocking pool, between two waves
    /// (never while one is applied: see `applying`).
    pub(crate) fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Backend) -> Result<T, StoreError> + Send + 'static,
        answer: Answer<T>,
    ) {
        let Some(engine) = self.engine.read().clone() else {
            return answer.send(Err(StoreError::Closed));
        };
        let applying = self.applying.clone();
        self.runtime.spawn_blocking(move || {
            let r = {
                let _between_waves = applying.read();
                read(&engine)
            };
            // Released before answering: once the store's close is answered nothing
            // holds the engine (its directory lock).
            drop(engine);
            answer.send(r);
        });
    }

    /// Adds a rider to the next wave; `wake` starts one now when none is under way
    /// (else the rider waits for the next write of anyone).
    pub(crate) fn ride(self: &Arc<Self>, rider: Box<dyn Rider>, wake: bool) {
        if self.queue.lock().closed {
            // Nothing will take it: what it holds is answered `Closed` as it drops.
            drop(rider.take());
            return;
        }
        self.riders.lock().push(rider);
        if wake {
            self.send(Job::Wake);
        }
    }

    /// Queues a listing (it sees every operation queued before it).
    pub(crate) fn list(
        self: &Arc<Self>,
        statuses: Option<Vec<StatusKind>>,
        answer: Answer<Vec<StoredEntry>>,
    ) {
        self.send(Job::List {
            what: Listing::All(statuses),
            answer,
        });
    }

    /// Queues the listing of one page in id order (it sees every operation queued
    /// before it, like [`Committer::list`]), reading only the page's records.
    pub(crate) fn list_page(
        self: &Arc<Self>,
        after: Option<String>,
        limit: usize,
        answer: Answer<Vec<StoredEntry>>,
    ) {
        self.send(Job::List {
            what: Listing::Page(after, limit),
            answer,
        });
    }

    /// Queues the listing of one page of the sessions that keep history or events
    /// (S26a; it sees every operation queued before it, like [`Committer::list`]).
    pub(crate) fn kept_page(
        self: &Arc<Self>,
        after: Option<String>,
        limit: usize,
        answer: Answer<Vec<String>>,
    ) {
        self.send(Job::Kept {
            after,
            limit,
            answer,
        });
    }

    /// Closes the store: what was queued before is finished and answered, later
    /// operations are answered `Closed`, the engine is released (its directory can be
    /// opened again), then `answer` is called.
    pub(crate) fn close(self: &Arc<Self>, answer: Answer<()>) {
        self.send(Job::Close { answer });
    }

    fn applied(&self, key: &str) {
        let mut queued = self.queued.lock();
        if let Some(n) = queued.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                queued.remove(key);
            }
        }
    }
}

/// The committer's thread, as long as it runs: if it ends other than by returning (a
/// panic in the engine or in a completion, or a runtime that dropped it unrun), the
/// queue is closed and everything in it answered `Closed`, so no writer waits forever.
struct Running {
    committer: Arc<Committer>,
    finished: bool,
}

impl Running {
    /// The thread returned normally.
    fn disarm(&mut self) {
        self.finished = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        tracing::error!(
            "the store's committer thread ended abnormally: every queued and later \
             operation is answered `Closed`; restart the runtime to write again"
        );
        let c = &self.committer;
        let rest = {
            let mut queue = c.queue.lock();
            queue.closed = true;
            queue.running = false;
            std::mem::take(&mut queue.jobs)
        };
        drop(rest);
        drop(c.engine.write().take());
        let closers = {
            let mut queue = c.queue.lock();
            queue.released = true;
            std::mem::take(&mut queue.closers)
        };
        c.closed.store(true, Ordering::Release);
        for closer in closers {
            closer.send(Ok(()));
        }
    }
}

/// Runs `f`, observing its duration with `observe` when there are metrics.
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

impl Committer {
    /// The committer's thread: takes everything queued, commits it, again, until the
    /// queue is empty (then returns) or a close was committed (then releases the
    /// engine and answers the closer).
    fn run(&self) {
        loop {
            let batch = {
                let mut queue = self.queue.lock();
                if queue.jobs.is_empty() {
                    drop(queue);
                    // Stay awake a moment for the next write (no commit waits for it).
                    self.linger();
                    queue = self.queue.lock();
                    if queue.jobs.is_empty() {
                        queue.running = false;
                        return;
                    }
                }
                self.has_jobs.store(false, Ordering::Relaxed);
                std::mem::take(&mut queue.jobs)
            };
            if let Some(close) = self.commit(batch) {
                self.finish_close(close);
                return;
            }
        }
    }

    /// Spins for at most `LINGER` while nothing is queued: a writer that queues
    /// meanwhile (a session's next push, a client's next save) is taken without waking
    /// a parked thread, the hand-off that costs most on the durable path. It delays no
    /// commit: a job queued during the spin is taken at once.
    fn linger(&self) {
        let began = std::time::Instant::now();
        while !self.has_jobs.load(Ordering::Acquire) && began.elapsed() < LINGER {
            // Yields at every turn: a thread that shares this CPU (the writer's own,
            // on a small machine) runs first.
            std::thread::yield_now();
        }
    }

    /// After the close was taken: refuse what is queued (dropped answers say
    /// `Closed`), release the engine, answer the closer.
    fn finish_close(&self, close: Answer<()>) {
        let rest = {
            let mut queue = self.queue.lock();
            queue.running = false;
            std::mem::take(&mut queue.jobs)
        };
        drop(rest);
        // Riders that came after the close's wave are not written (the store closed):
        // what they hold is answered `Closed` as it drops.
        let riders = std::mem::take(&mut *self.riders.lock());
        for rider in riders {
            drop(rider.take());
        }
        let engine = self.engine.write().take();
        if let Some(engine) = engine {
            // Kept events applied without a flush are made durable before the engine
            // is released, and a clean close leaves everything power-safe whatever the
            // store's level (S15b: a shutdown loses nothing to a later power cut).
            self.unflushed.store(false, Ordering::Release);
            if let Err(e) = engine.sync_for_close() {
                tracing::warn!(error = %e, "the store could not be made durable at close: writes since the last flush (the last kept events; at durability crash, any write) may be lost to a power cut");
            }
            release(engine);
        }
        let closers = {
            let mut queue = self.queue.lock();
            queue.released = true;
            std::mem::take(&mut queue.closers)
        };
        self.closed.store(true, Ordering::Release);
        close.send(Ok(()));
        for closer in closers {
            closer.send(Ok(()));
        }
    }

    /// Commits one batch in order; returns the close request it met, if any (what
    /// followed it in the batch is answered `Closed`).
    fn commit(&self, batch: Vec<Job>) -> Option<Answer<()>> {
        let Some(engine) = self.engine.read().clone() else {
            // Released already: every job is answered `Closed` as it is dropped.
            return None;
        };
        let mut ops = Vec::with_capacity(batch.len());
        let mut waiters = Vec::with_capacity(batch.len());
        let mut writes: Vec<(Waiter, Result<OpResult, StoreError>)> = Vec::new();
        let mut jobs = batch.into_iter();
        let mut close = None;
        let mut needs_flush = false;
        // Riders: what waited for this wave is committed with it. A rider that needs
        // no flush (kept events alone) is applied right after the wave's flush, so it
        // never delays the writes the wave answers; the next flush makes it durable.
        // One that needs it (a reservation) goes in the wave.
        let (mut later_ops, mut later_waiters) = (Vec::new(), Vec::new());
        let riders = std::mem::take(&mut *self.riders.lock());
        for rider in riders {
            if let Some((op, waiter)) = rider.take() {
                if let Some(key) = key_of(&op) {
                    *self.queued.lock().entry(key.to_string()).or_insert(0) += 1;
                }
                match op.needs_flush() {
                    true => {
                        needs_flush = true;
                        ops.push(op);
                        waiters.push(waiter);
                    }
                    false => {
                        later_ops.push(op);
                        later_waiters.push(waiter);
                    }
                }
            }
        }
        for job in jobs.by_ref() {
            match job {
                Job::Op { op, waiter } => {
                    needs_flush |= op.needs_flush();
                    ops.push(op);
                    waiters.push(waiter);
                }
                Job::List { what, answer } => {
                    // Sees every operation before it: apply them first.
                    self.apply(&engine, &mut ops, &mut waiters, &mut writes);
                    let engine = engine.clone();
                    self.runtime.spawn_blocking(move || {
                        let r = match what {
                            Listing::All(statuses) => engine.list(statuses.as_deref()),
                            Listing::Page(after, limit) => {
                                engine.list_page(after.as_deref(), limit)
                            }
                        };
                        drop(engine);
                        answer.send(r);
                    });
                }
                Job::Kept {
                    after,
                    limit,
                    answer,
                } => {
                    self.apply(&engine, &mut ops, &mut waiters, &mut writes);
                    let engine = engine.clone();
                    self.runtime.spawn_blocking(move || {
                        let r = engine.kept_page(after.as_deref(), limit);
                        drop(engine);
                        answer.send(r);
                    });
                }
                Job::Close { answer } => {
                    close = Some(answer);
                    break;
                }
                Job::Wake => {}
            }
        }
        self.apply(&engine, &mut ops, &mut waiters, &mut writes);
        if !writes.is_empty() {
            let flush = match needs_flush {
                true => {
                    self.counters.flushes.fetch_add(1, Ordering::Relaxed);
                    self.unflushed.store(false, Ordering::Release);
                    timed(&self.metrics, RuntimeMetrics::checkpoint_flushed, || {
                        engine.flush()
                    })
                }
                // Only kept events (S20a): applied, visible to reads, durable with the
                // next flush; nobody waits for one.
                false => {
                    self.unflushed.store(true, Ordering::Release);
                    Ok(())
                }
            };
            for (waiter, result) in writes {
                answer_flushed(waiter, result, &flush);
            }
        }
        if !later_ops.is_empty() {
            let mut later = Vec::new();
            self.apply(&engine, &mut later_ops, &mut later_waiters, &mut later);
            self.unflushed.store(true, Ordering::Release);
            for (waiter, result) in later {
                answer_flushed(waiter, result, &Ok(()));
            }
        }
        // After a close: the rest of the batch is refused (dropped answers say Closed).
        drop(jobs);
        close
    }

    /// Applies the operations gathered so far as one wave; answers its reads at once
    /// and keeps its writes for the flush.
    fn apply(
        &self,
        engine: &Backend,
        ops: &mut Vec<WriteOp>,
        waiters: &mut Vec<Waiter>,
        writes: &mut Vec<(Waiter, Result<OpResult, StoreError>)>,
    ) {
        if ops.is_empty() {
            return;
        }
        let ops = std::mem::take(ops);
        let n = ops.len() as u64;
        let c = &self.counters;
        c.waves.fetch_add(1, Ordering::Relaxed);
        c.ops.fetch_add(n, Ordering::Relaxed);
        c.max_wave.fetch_max(n, Ordering::Relaxed);
        let keys: Vec<Option<String>> = ops.iter().map(|o| key_of(o).map(str::to_owned)).collect();
        let results = timed(&self.metrics, RuntimeMetrics::checkpoint_applied, || {
            // No read on the blocking pool sees the wave halfway (see `applying`).
            let _applying = self.applying.write();
            engine.apply_unflushed(ops)
        });
        // Applied: reads of these sessions may go to the engine again.
        for key in keys.iter().flatten() {
            self.applied(key);
        }
        for (waiter, result) in std::mem::take(waiters).into_iter().zip(results) {
            match waiter {
                Waiter::Load(answer) => answer_read(answer, result),
                w => writes.push((w, result)),
            }
        }
    }
}

/// Answers a read of a wave (reads need no flush).
fn answer_read(answer: Answer<Option<Stored>>, result: Result<OpResult, StoreError>) {
    answer.send(result.and_then(|r| match r {
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
        Waiter::Unit(answer) => answer.send(result.map(|_| ())),
        Waiter::Deleted(answer) => answer.send(result.and_then(|r| match r {
            OpResult::Deleted(d) => Ok(d),
            other => Err(unexpected(other)),
        })),
        Waiter::Cas(answer) => answer.send(result.and_then(|r| match r {
            OpResult::Cas(c) => Ok(c),
            other => Err(unexpected(other)),
        })),
        Waiter::Load(answer) => answer.send(Err(unexpected(OpResult::Done))),
        Waiter::Armed(answer) => answer.send(result.and_then(|r| match r {
            OpResult::Armed(n) => Ok(n),
            other => Err(unexpected(other)),
        })),
    }
}

fn unexpected(r: OpResult) -> StoreError {
    StoreError::Backend {
        operation: "apply",
        session: String::new(),
        message: format!("internal: unexpected result {r:?}"),
    }
}

/// Drops the engine and waits (bounded) until its directory lock is really free:
/// sled's background IO threads can hold the file a moment after the database is
/// dropped (fjall joins its threads in its drop). Blocks (the committer's thread).
pub(crate) fn release(engine: Arc<Backend>) {
    let lock_file = match &*engine {
        Backend::Sled(b) => b.path().join("db"),
        Backend::Fjall(b) => b.path().join("lock"),
    };
    drop(engine);
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

#[cfg(test)]
mod tests;
