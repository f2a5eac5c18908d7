//! Planned migration (issue 18, S38): moving a session from this node to another while
//! losing nothing. The move stops the session at its next safe point (bounded by a
//! timeout that escalates to Immediate), so its final record holds everything it had;
//! hands the lease to the new owner by compare-and-swap (owner and next epoch, on the
//! version just read); and asks the new owner to resume it. Pushes that arrive here
//! meanwhile queue on the session's gate in arrival order and go to the new owner once
//! it runs the session: none lost, none duplicated. Event numbers continue (the record
//! carries the last one).
//!
//! This file owns the move's steps and the gate; stopping is the supervisor's, the
//! transport the forwarder's ([`super::forward::Forward`]).

use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::cluster::moving::Moving;
use crate::options::StopOptions;
use crate::runtime_handle::RuntimeHandle;
use crate::store::{now_ms, RecordWrite, SessionStatus, StoreError, Stored};

/// Opens every gate a `migrate` shutdown held, whichever way its hand-over returns.
struct ReleaseAll<'a>(&'a Moving);

impl Drop for ReleaseAll<'_> {
    fn drop(&mut self) {
        self.0.release_all();
    }
}

/// The `migrate` shutdown strategy's view of a cluster node's runtime.
pub(crate) struct NodeHandOver<I, E>(pub(crate) RuntimeHandle<I, E>);

impl<I, E> crate::shutdown::HandOver for NodeHandOver<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    fn hold(&self) -> futures::future::BoxFuture<'static, ()> {
        let h = self.0.clone();
        Box::pin(async move {
            // The sessions running now; one spawned later is refused (the runtime
            // drains).
            for s in h.supervisor.list().await {
                h.moving.hold(&s.id);
            }
        })
    }

    fn hand_over(&self) -> futures::future::BoxFuture<'static, usize> {
        let h = self.0.clone();
        Box::pin(async move { h.hand_over_all().await })
    }
}

/// A move that did not happen, and why.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// This runtime is not a cluster node with a forwarder.
    #[error("session `{0}` cannot move: this runtime is not a cluster node (start it with RuntimeBuilder::node and a ClusterNode)")]
    NotANode(String),
    /// The target is this node, or not a node this one is joined to: nothing was done.
    #[error("session `{session}` cannot move to node `{node}`: it is not a node this one is joined to (or it is this node); join it first (--join) or pick another")]
    Unreachable {
        /// The session.
        session: String,
        /// The target.
        node: String,
    },
    /// This node does not run the session.
    #[error("session `{0}` does not run on this node; move it from the node that runs it")]
    NotHere(String),
    /// The store failed or refused the hand-over.
    #[error("session `{session}`: the lease could not be handed over: {error}")]
    Store {
        /// The session.
        session: String,
        /// The store's error.
        error: StoreError,
    },
    /// The new owner did not resume it. Its lease is the new owner's; that node's
    /// adoption (or a resume there) picks it up.
    #[error("session `{session}` was handed to node `{node}`, which did not resume it: {error}; its record is `Interrupted` under that node, which resumes it when it restarts (or the others adopt it if it dies)")]
    NotResumed {
        /// The session.
        session: String,
        /// The new owner.
        node: String,
        /// Why.
        error: String,
    },
}

/// What a completed move took.
#[derive(Clone, Copy, Debug)]
pub struct Moved {
    /// From the request to the session's exit here (its next safe point).
    pub stopped: Duration,
    /// From the request to the new owner running it.
    pub total: Duration,
}

/// The write that hands a stopped session's lease to node `to`: owner `to`, the next
/// epoch, `Interrupted`, conditioned on the version read (a concurrent change wins).
fn hand_over(header: &crate::store::RecordHeader, to: &str) -> RecordWrite {
    crate::store::transition::hand_over(
        header,
        Some(to.to_string()),
        SessionStatus::Interrupted,
        now_ms(),
    )
}

/// Hands a stopped session's record to node `to` (one compare-and-swap write);
/// `Ok(false)` when there is nothing to move (no record: it ended with nothing left; or
/// a final one).
async fn hand_over_stopped<I: 'static>(
    store: &dyn crate::store::CheckpointStore<I>,
    id: &str,
    to: &str,
) -> Result<bool, StoreError> {
    let record = match store.load_stored(id).await? {
        Some(Stored::Current(r)) => r,
        None => return Ok(false),
        Some(other) => {
            return Err(StoreError::Refused {
                session: id.to_string(),
                status: other.status().to_string(),
                why: "a record of the previous format cannot be handed over; resume it here \
                      once to convert it"
                    .into(),
            })
        }
    };
    if record.header.status.is_terminal() {
        return Ok(false);
    }
    store.write(hand_over(&record.header, to)).await?;
    Ok(true)
}

impl<I, E> RuntimeHandle<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Moves session `id` from this node to node `to` (see the module docs); `timeout`
    /// bounds the wait for its next safe point before the stop escalates to Immediate.
    pub async fn migrate(
        &self,
        id: &str,
        to: &str,
        timeout: Duration,
    ) -> Result<Moved, MigrateError> {
        let started = Instant::now();
        let (Some(store), Some(forwarder)) = (self.store.clone(), self.forwarder.get().cloned())
        else {
            return Err(MigrateError::NotANode(id.to_string()));
        };
        if self.supervisor.inspect(id).await.is_err() {
            return Err(MigrateError::NotHere(id.to_string()));
        }
        if !forwarder.reachable(to) {
            return Err(MigrateError::Unreachable {
                session: id.to_string(),
                node: to.to_string(),
            });
        }
        let gate = self.moving.begin(id);
        let in_line = gate.lock().await;
        let options = StopOptions::graceful_timeout(timeout)
            .shutdown()
            .cause(format!("moving to node `{to}`"));
        if self.supervisor.stop(id, options).await.is_err() {
            self.moving.forget(id);
            return Err(MigrateError::NotHere(id.to_string()));
        }
        // Its exit (the final record written before it) ends its registration.
        while self.supervisor.inspect(id).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let stopped = started.elapsed();
        let done = |stopped| Moved {
            stopped,
            total: started.elapsed(),
        };
        match hand_over_stopped(&*store, id, to).await {
            // Nothing left to keep, or it ended for good: nothing to move.
            Ok(false) => Ok(done(stopped)),
            Ok(true) => {
                let resumed = forwarder.resume_on(to.to_string(), id.to_string()).await;
                if let Err(error) = &resumed {
                    // Not running there: take the lease back (a compare-and-swap that
                    // fails if `to` claimed or wrote it meanwhile; if `to` runs it
                    // anyway, its writes are fenced, S37) and run it here again.
                    let back = hand_over_stopped(&*store, id, &self.instance).await;
                    let here = match back {
                        Ok(true) => self.resume_handed_over(id).await,
                        Ok(false) => Err("it ended meanwhile".to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    match here {
                        Ok(()) => tracing::warn!(session = %id, node = %to, %error,
                            "the session was not resumed on the node it moved to; it runs on this node again"),
                        Err(e) => tracing::warn!(session = %id, node = %to, %error, back = %e,
                            "the session was not resumed on the node it moved to, nor taken back here; its record is Interrupted and is resumed when its owner restarts (or adopted if it dies)"),
                    }
                }
                // The queued pushes go now, in order, to whichever node runs it.
                drop(in_line);
                resumed.map_err(|error| MigrateError::NotResumed {
                    session: id.to_string(),
                    node: to.to_string(),
                    error,
                })?;
                Ok(done(stopped))
            }
            Err(error) => {
                // The lease is still this node's: run the session here again rather
                // than leave it stopped, and let the queued pushes reach it here.
                tracing::warn!(session = %id, node = %to, error = %error,
                    "the session could not be handed over; it resumes on this node");
                self.moving.forget(id);
                if let Err(e) = self.resume_handed_over(id).await {
                    tracing::warn!(session = %id, error = %e,
                        "the session did not resume here either; it stays Interrupted until this node restarts (or another adopts it)");
                }
                drop(in_line);
                Err(MigrateError::Store {
                    session: id.to_string(),
                    error,
                })
            }
        }
    }

    /// Resumes stored session `id`, whose lease was handed to this node (the receiving
    /// end of [`RuntimeHandle::migrate`]).
    pub async fn resume_handed_over(&self, id: &str) -> Result<(), String> {
        let Some(store) = &self.store else {
            return Err("this node has no store".into());
        };
        let rec = match store.load_stored(id).await {
            Ok(Some(s)) => s.decode::<I>().map_err(|e| e.to_string())?,
            Ok(None) => return Err(format!("no record of session `{id}`")),
            Err(e) => return Err(e.to_string()),
        };
        if rec.header.owner.as_deref() != Some(self.instance.as_str()) {
            return Err(format!(
                "session `{id}` is not handed to this node (its record names {:?})",
                rec.header.owner
            ));
        }
        let spec = crate::SessionSpec::resuming(rec, self.durability, self.lease_timeout, false);
        self.supervisor
            .spawn(spec)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl<I, E> RuntimeHandle<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Hands every session this node left `Interrupted` to the live node placement
    /// names among the others, each resumed there (the `migrate` shutdown strategy's
    /// last step, after its sessions stopped at their next safe point). Returns how
    /// many moved; one that cannot move stays `Interrupted` under this node and is
    /// adopted once this node's lease expires (S38).
    pub async fn hand_over_all(&self) -> usize {
        // Pushes held by the shutdown go on however this returns (to the new owner, or
        // refused as late when the session stays here).
        let _release = ReleaseAll(&self.moving);
        let (Some(store), Some(forwarder)) = (self.store.clone(), self.forwarder.get().cloned())
        else {
            return 0;
        };
        let beats = match store.instances().await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the cluster's members: sessions stay Interrupted here until adopted");
                return 0;
            }
        };
        let m = crate::cluster::adopt::Membership::judge(
            &beats,
            &self.instance,
            now_ms(),
            self.lease_timeout,
        );
        let others: Vec<String> = m.live.into_iter().filter(|n| *n != self.instance).collect();
        if others.is_empty() {
            tracing::warn!("no other live node: sessions stay Interrupted here until this node (or another) resumes them");
            return 0;
        }
        let entries = match store
            .list_stored(Some(vec![crate::store::StatusKind::Interrupted]))
            .await
        {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the sessions to hand over: they stay Interrupted here until adopted");
                return 0;
            }
        };
        let mut moved = 0;
        for entry in entries {
            let Ok(Stored::Current(r)) = entry.record else {
                continue;
            };
            if r.header.owner.as_deref() != Some(self.instance.as_str()) {
                continue;
            }
            let Some(to) = crate::cluster::placement::owner_of(&others, &r.header.session_id)
            else {
                continue;
            };
            let id = r.header.session_id.clone();
            if let Err(e) = store.write(hand_over(&r.header, to)).await {
                tracing::warn!(session = %id, error = %e, "could not hand the session over; it stays Interrupted here until adopted");
                continue;
            }
            match forwarder.resume_on(to.to_string(), id.clone()).await {
                Ok(()) => moved += 1,
                Err(e) => tracing::warn!(session = %id, node = %to, error = %e,
                    "the session was handed over but not resumed there; it stays Interrupted under that node until it restarts (or the others adopt it if it dies)"),
            }
            self.moving.release(&id);
        }
        moved
    }
}
