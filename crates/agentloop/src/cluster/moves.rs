//! A node's moves (issue 18, S38): a planned move of one session to another node
//! (`migrate`), the resume of a session handed over here, the `migrate` shutdown's
//! hand-over of everything this node left `Interrupted`, and a rebalance round. The
//! decisions are `crate::cluster`'s (placement, membership, the moving gates); these
//! methods perform them.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::cluster::adopt::Membership;
use crate::cluster::migrate::{hand_over, hand_over_stopped, MigrateError, Moved, ReleaseAll};
use crate::cluster::rebalance::{moves, Rebalance};
use crate::options::StopOptions;
use crate::runtime_handle::RuntimeHandle;
use crate::store::{now_ms, SessionStatus, Stored};

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
        let spec =
            crate::session::SessionSpec::resuming(rec, self.durability, self.lease_timeout, false);
        self.supervisor
            .spawn(spec)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

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
        // S40: hand a session only to a node that can run its version.
        let runs = match store.advertised().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read what the other nodes run: sessions stay Interrupted here until adopted");
                return 0;
            }
        };
        let mut m = crate::cluster::adopt::Membership::judge(
            &beats,
            &self.instance,
            now_ms(),
            self.lease_timeout,
        )
        .with_runs(runs);
        m.live.retain(|n| *n != self.instance);
        if m.live.is_empty() {
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
            let placed = crate::cluster::adopt::Placed {
                session: &r.header.session_id,
                kind: &r.header.agent_kind,
                version: r.header.agent_version,
            };
            let Some(to) = m.placed(placed) else {
                tracing::warn!(session = %r.header.session_id, kind = %r.header.agent_kind, version = r.header.agent_version,
                    "no other live node runs this session's version: it stays Interrupted here until a node that runs it adopts it or this one restarts");
                continue;
            };
            let to = to.to_string();
            let id = r.header.session_id.clone();
            if let Err(e) = store.write(hand_over(&r.header, &to)).await {
                tracing::warn!(session = %id, error = %e, "could not hand the session over; it stays Interrupted here until adopted");
                continue;
            }
            match forwarder.resume_on(to.clone(), id.clone()).await {
                Ok(()) => moved += 1,
                Err(e) => tracing::warn!(session = %id, node = %to, error = %e,
                    "the session was handed over but not resumed there; it stays Interrupted under that node until it restarts (or the others adopt it if it dies)"),
            }
            self.moving.release(&id);
        }
        moved
    }

    /// One rebalance round with membership `m`: moves every persistent session this
    /// node runs and owns whose placement names another joined node, at most
    /// `policy.concurrent` at once. Failures are logged (WARN) and retried by a later
    /// round; a failed move leaves the session running here.
    pub(crate) async fn rebalance_round(&self, m: &Membership, policy: Rebalance) {
        let (Some(store), Some(forwarder)) = (self.store.clone(), self.forwarder.get().cloned())
        else {
            return;
        };
        // Candidates from what runs here and placement alone (no I/O): after a join
        // about one in n sessions, none in a settled cluster.
        let running: Vec<(String, String, u32)> = self
            .supervisor
            .list()
            .await
            .into_iter()
            .map(|s| (s.id, s.kind, s.version))
            .collect();
        let candidates = moves(m, &self.instance, &running, |n| forwarder.reachable(n));
        // Only sessions with a `Running` record this node owns: one with nothing
        // stored would end instead of moving.
        let mut planned = Vec::with_capacity(candidates.len());
        for (session, to) in candidates {
            match store.load_stored(&session).await {
                Ok(Some(Stored::Current(r)))
                    if r.header.owner.as_deref() == Some(self.instance.as_str())
                        && r.header.status == SessionStatus::Running =>
                {
                    planned.push((session, to))
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(%session, error = %e,
                    "cannot read a record to rebalance; a later round retries"),
            }
        }
        if planned.is_empty() {
            return;
        }
        tracing::info!(
            moves = planned.len(),
            live = ?m.live,
            "placement changed: moving sessions to the nodes it names"
        );
        futures::stream::iter(planned)
            .for_each_concurrent(policy.concurrent.max(1), |(session, to)| async move {
                // A shutdown moves what it moves itself (`migrate` strategy), or stops it.
                if self.shutdown.is_started().await {
                    return;
                }
                match self.migrate(&session, &to, policy.safe_point_timeout).await {
                    Ok(moved) => tracing::info!(%session, %to, took = ?moved.total, "rebalanced"),
                    Err(e) => tracing::warn!(%session, %to, error = %e, "a rebalancing move failed; a later round retries"),
                }
            })
            .await;
    }
}
