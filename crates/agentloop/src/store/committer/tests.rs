//! Unit tests of `committer`.

use super::*;
use crate::store::backend::Engine;

/// A directory of its own under the system's temp dir, removed on drop.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "agentloop-committer-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(dir: &Dir) -> Arc<Committer> {
    let engine = Backend::open(&dir.0, Engine::SLED).expect("sled opens");
    Committer::start(Arc::new(engine), None, tokio::runtime::Handle::current())
        .expect("committer starts")
}

fn beat(n: u64) -> WriteOp {
    WriteOp::Beat {
        instance: format!("i{n}"),
        now_ms: n,
    }
}

/// Holds the committer's thread inside an answer until the gate opens: everything
/// queued meanwhile is waiting when it comes back for more. Returns once the
/// thread is held.
async fn gate(c: &Arc<Committer>) -> std::sync::mpsc::Sender<()> {
    let (open, held) = std::sync::mpsc::channel::<()>();
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    c.submit(
        WriteOp::Flush,
        Waiter::Unit(Answer::new(move |_| {
            let _ = entered_tx.send(());
            let _ = held.recv();
        })),
    );
    entered.await.expect("the committer takes the gate");
    open
}

async fn unit(
    rx: tokio::sync::oneshot::Receiver<Result<(), StoreError>>,
) -> Result<(), StoreError> {
    rx.await.unwrap_or(Err(StoreError::Closed))
}

/// S15c: a load of a record held in its head (and of no record) is answered on the
/// caller's thread, before `load` returns (no hop); a load of a session with writes
/// queued waits for them; a record with loose entries goes to the blocking pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_from_the_head_needs_no_hop() {
    use crate::store::{ItemChange, RecordHeader, RecordWrite, StateChange, WriteCondition};
    let dir = Dir::new("head-load");
    let c = open(&dir);
    let write = |items: Vec<ItemChange>, replace: bool| {
        WriteOp::Write(Box::new(RecordWrite {
            header: RecordHeader {
                session_id: "s".into(),
                ..RecordHeader::default()
            },
            items,
            state: StateChange::Keep,
            journal: Vec::new(),
            replace,
            condition: WriteCondition::Always,
            history: None,
            timers: Vec::new(),
        }))
    };
    let loaded = |c: &Arc<Committer>| {
        let (tx, rx) = std::sync::mpsc::channel();
        c.load("s".into(), Answer::new(move |r| drop(tx.send(r))));
        rx
    };
    // No record: answered at once.
    let rx = loaded(&c);
    assert!(
        matches!(rx.try_recv(), Ok(Ok(None))),
        "answered before load returned"
    );
    let (tx, rx) = tokio::sync::oneshot::channel();
    let item = ItemChange::Put(1, crate::store::Payload::from(&b"\x01"[..]));
    c.submit(write(vec![item], true), Waiter::Unit(Answer::oneshot(tx)));
    unit(rx).await.expect("written");
    let rx = loaded(&c);
    match rx.try_recv() {
        Ok(Ok(Some(Stored::Current(r)))) => assert_eq!(r.items.len(), 1),
        other => panic!("an inline record is answered before load returns: {other:?}"),
    }
    // A pushed item is a loose entry: the load needs the range, off the caller.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let item = ItemChange::Put(2, crate::store::Payload::from(&b"\x02"[..]));
    c.submit(write(vec![item], false), Waiter::Unit(Answer::oneshot(tx)));
    unit(rx).await.expect("written");
    let rx = loaded(&c);
    let r = tokio::task::spawn_blocking(move || rx.recv().expect("answered"))
        .await
        .expect("the wait");
    match r {
        Ok(Some(Stored::Current(r))) => assert_eq!(r.items.len(), 2),
        other => panic!("{other:?}"),
    }
}

/// S15c: what is queued while the committer works is taken at once, applied as one
/// wave and made durable by one flush, and every writer is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_queued_is_one_batch_and_one_flush() {
    let dir = Dir::new("batch");
    let c = open(&dir);
    let open_gate = gate(&c).await;
    let waits: Vec<_> = (0..50)
        .map(|n| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            c.submit(beat(n), Waiter::Unit(Answer::oneshot(tx)));
            rx
        })
        .collect();
    let before = (
        c.counters.waves.load(Ordering::Acquire),
        c.counters.flushes.load(Ordering::Acquire),
    );
    open_gate.send(()).expect("the gate is held");
    for w in waits {
        unit(w).await.expect("every queued write is answered Ok");
    }
    assert_eq!(
        c.counters.waves.load(Ordering::Acquire) - before.0,
        1,
        "the 50 writes queued together are one wave"
    );
    assert_eq!(
        c.counters.flushes.load(Ordering::Acquire) - before.1,
        1,
        "and one flush"
    );
    assert_eq!(c.counters.max_wave.load(Ordering::Acquire), 50);
    let (tx, rx) = tokio::sync::oneshot::channel();
    c.close(Answer::oneshot(tx));
    unit(rx).await.expect("closed");
}

/// A close finishes what was queued before it, answers what follows `Closed`, and
/// releases the engine: its directory opens again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_finishes_what_came_before_and_refuses_what_follows() {
    let dir = Dir::new("close");
    let c = open(&dir);
    let open_gate = gate(&c).await;
    let (before_tx, before_rx) = tokio::sync::oneshot::channel();
    c.submit(beat(1), Waiter::Unit(Answer::oneshot(before_tx)));
    let (close_tx, close_rx) = tokio::sync::oneshot::channel();
    c.close(Answer::oneshot(close_tx));
    let (after_tx, after_rx) = tokio::sync::oneshot::channel();
    c.submit(beat(2), Waiter::Unit(Answer::oneshot(after_tx)));
    open_gate.send(()).expect("the gate is held");
    unit(before_rx)
        .await
        .expect("queued before the close: written");
    unit(close_rx).await.expect("the close is answered");
    assert!(matches!(unit(after_rx).await, Err(StoreError::Closed)));
    assert!(c.is_closed());
    // Nothing holds the engine: the directory opens again, with the first beat.
    let again = Backend::open(&dir.0, Engine::SLED).expect("reopens after close");
    assert_eq!(again.heartbeat("i1").expect("reads"), Some(1));
    assert_eq!(again.heartbeat("i2").expect("reads"), None);
}

/// A panic on the committer's thread (here in a completion) closes the queue: the
/// operations after it are answered `Closed` instead of waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_on_the_committers_thread_answers_everything_after_it_closed() {
    let dir = Dir::new("panic");
    let c = open(&dir);
    c.submit(
        WriteOp::Flush,
        Waiter::Unit(Answer::new(|_| panic!("a completion that panics"))),
    );
    let answer = |n| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        c.submit(beat(n), Waiter::Unit(Answer::oneshot(tx)));
        rx
    };
    let first = answer(1);
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), unit(first)).await;
    // Queued behind the panic (or with it in one batch): never left waiting.
    assert!(
        r.is_ok(),
        "an operation queued with the panic was never answered"
    );
    let later = tokio::time::timeout(std::time::Duration::from_secs(10), unit(answer(2)))
        .await
        .expect("an operation after the panic is answered");
    assert!(matches!(later, Err(StoreError::Closed)), "{later:?}");
    // A close still answers, once the engine is dropped.
    let (tx, rx) = tokio::sync::oneshot::channel();
    c.close(Answer::oneshot(tx));
    tokio::time::timeout(std::time::Duration::from_secs(10), unit(rx))
        .await
        .expect("the close is answered")
        .expect("closed");
    assert!(c.is_closed());
}

/// An answer dropped without being called (its operation never ran) says `Closed`.
#[test]
fn an_unanswered_answer_says_closed() {
    let (tx, rx) = std::sync::mpsc::channel();
    drop(Answer::<()>::new(move |r| {
        let _ = tx.send(r);
    }));
    assert!(matches!(rx.recv(), Ok(Err(StoreError::Closed))));
}

/// A load that goes to the engine on the blocking pool (a record with loose entries,
/// nothing of its session queued when it was asked) never sees a wave half applied:
/// the head and the loose entries it reads are of one state. Here each write delivers
/// the oldest item (its loose entry removed, the head no longer naming it) and takes a
/// new one, as a session working through a backlog does, while a client reads the
/// record (`GET /sessions/{id}`; the power-cut test once read a head naming an entry
/// the next write had removed: "the header names item entry 3524, which is missing").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_never_mixes_two_waves() {
    use crate::store::{ItemChange, RecordHeader, RecordWrite, StateChange, WriteCondition};
    const BACKLOG: u64 = 64;
    let dir = Dir::new("torn-load");
    let engine = Backend::open(&dir.0, Engine::Sled(crate::store::StoreDurability::Crash))
        .expect("sled opens");
    let c = Committer::start(Arc::new(engine), None, tokio::runtime::Handle::current())
        .expect("committer starts");
    let write = |front: Vec<u64>, items: Vec<ItemChange>| {
        WriteOp::Write(Box::new(RecordWrite {
            header: RecordHeader {
                session_id: "s".into(),
                front,
                ..RecordHeader::default()
            },
            items,
            state: StateChange::Keep,
            journal: Vec::new(),
            replace: false,
            condition: WriteCondition::Always,
            history: None,
            timers: Vec::new(),
        }))
    };
    let item = |seq: u64| ItemChange::Put(seq, crate::store::Payload::from(&seq.to_be_bytes()[..]));
    let (tx, rx) = tokio::sync::oneshot::channel();
    c.submit(
        write((1..=BACKLOG).collect(), (1..=BACKLOG).map(item).collect()),
        Waiter::Unit(Answer::oneshot(tx)),
    );
    unit(rx).await.expect("written");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        tokio::spawn(async move {
            let mut oldest = 1;
            while !stop.load(Ordering::Relaxed) {
                let newest = oldest + BACKLOG;
                let (tx, rx) = tokio::sync::oneshot::channel();
                c.submit(
                    write(
                        (oldest + 1..=newest).collect(),
                        vec![ItemChange::Delete(oldest), item(newest)],
                    ),
                    Waiter::Unit(Answer::oneshot(tx)),
                );
                unit(rx).await.expect("written");
                oldest += 1;
            }
        })
    };
    let reader = {
        let c = c.clone();
        tokio::task::spawn_blocking(move || {
            let began = std::time::Instant::now();
            let mut loads = 0u64;
            while began.elapsed() < std::time::Duration::from_millis(1500) {
                let (tx, rx) = std::sync::mpsc::channel();
                c.load("s".into(), Answer::new(move |r| drop(tx.send(r))));
                let r = match rx.recv().expect("answered") {
                    Ok(Some(Stored::Current(r))) => r,
                    other => panic!("{other:?}"),
                };
                loads += 1;
                // Neither an entry the head names missing, nor one it no longer names
                // (delivered) still there.
                r.placement()
                    .unwrap_or_else(|e| panic!("after {loads} loads: {e}"));
                let seqs: Vec<u64> = r.items.iter().map(|(s, _)| *s).collect();
                assert_eq!(seqs, r.header.front, "after {loads} loads");
            }
            loads
        })
    };
    let loads = reader.await;
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("the writer");
    let loads = loads.expect("no load saw two waves mixed");
    assert!(loads > 0);
    let (tx, rx) = tokio::sync::oneshot::channel();
    c.close(Answer::oneshot(tx));
    unit(rx).await.expect("closed");
}
