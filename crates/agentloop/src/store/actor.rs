//! The CheckpointActor: owns an embedded store's lifecycle (sled by default, or fjall:
//! `backend.rs`) and its committer (`committer.rs`, S15c), and answers its lifecycle
//! messages (`lifecycle.rs`; DESIGN §1, S15–S19).
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
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use crate::metrics::RuntimeMetrics;
use crate::store::backend::{Backend, Engine};
use crate::store::committer::{Answer, Committer};
use crate::store::StoreError;

use super::client::CheckpointClient;
use super::lifecycle::stats;
pub use super::lifecycle::{CheckpointMsg, CheckpointStats};

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
