//! The CheckpointActor: owns an embedded store's lifecycle (sled by default, or fjall:
//! `backend.rs`) and its committer (`committer.rs`, S15c), and answers the messages of
//! actors that `call!` it (DESIGN §1, S15–S19).
//!
//! It is on no store operation's path: [`CheckpointClient`] (`client.rs`), the typed
//! face sessions and callers use, is the one door to the store: it queues writes on
//! the committer's thread, is answered by it directly, and reads the engine without
//! passing through here. The actor keeps what needs one owner, the store's lifecycle:
//! opening the engine and starting the committer, its counters, and closing (the
//! committer finishes what was queued, refuses the rest, releases the engine and its
//! directory lock, then the actor stops), also when its supervisor stops it. It never
//! blocks: engine work runs on the committer's thread or the blocking pool.

use std::marker::PhantomData;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::metrics::RuntimeMetrics;
use crate::store::backend::{Backend, Engine};
use crate::store::committer::{Answer, Committer};
use crate::store::StoreError;

pub use super::client::CheckpointClient;

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

/// Messages of the checkpoint actor: its lifecycle. Store operations do not pass
/// through it; they go to the committer through [`CheckpointClient`] (the one door to
/// the store, S15c).
pub enum CheckpointMsg {
    /// Stop taking writes (they are answered `Closed`), finish every write already
    /// taken (answered after its flush), release the engine and its directory lock,
    /// answer, and stop.
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

/// Reads the counters.
pub(super) fn stats(committer: &Committer) -> CheckpointStats {
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
            CheckpointMsg::Stats { reply } => {
                let _ = reply.send(stats(&st.committer));
            }
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
        Ok(CheckpointClient::new(actor, committer, opened_at_ms))
    }
}
