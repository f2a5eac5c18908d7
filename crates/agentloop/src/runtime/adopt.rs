//! The runtime's background loops: the timer service it starts (S39) and, on a shared
//! store, the sweep that adopts sessions whose owner died (S19, S36). Each ends when
//! the runtime shuts down.

use super::resume::{placed, register_asleep};
use super::*;

impl<I, E> Runtime<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Starts the adoption sweep of a cluster node (issue 18, S38), which is also the
    /// recovery sweep of a runtime on a shared store (issue 28): every heartbeat it
    /// reads the store's membership; when an instance is newly presumed dead (or
    /// membership changed, or every 30 beats anyway) it lists the resumable records and
    /// resumes those whose owner is dead and that placement gives this instance, each
    /// claiming its record first. A runtime that is not a node also reads the owner's
    /// own heartbeat (a store may list no instances) and takes only records whose
    /// owner's lease expired. It stops when the runtime shuts down.
    /// Starts the timer service (S39); it reads the store's due-time index first (one
    /// scan of the timers, not of the records), without holding up the start. A store
    /// that keeps no timers has none to fire.
    pub(super) fn start_timers(
        &self,
        (tx, rx): (
            crate::timers::Notify,
            tokio::sync::mpsc::UnboundedReceiver<crate::timers::Command>,
        ),
    ) {
        if !self.handle.store.as_ref().is_some_and(|s| s.keeps_timers()) {
            return;
        }
        // On a shared store, timers armed elsewhere (another node, a node whose sessions
        // this one adopts) are read again every heartbeat.
        let rescan = self.sweeps.then_some(self.heartbeat);
        let task = crate::runtime_handle::timer_service::start(
            self.handle.clone(),
            self.handle.timer_clock,
            tx,
            rx,
            rescan,
        );
        *self.timers.lock() = Some(task);
    }

    pub(super) fn start_adopting(&self) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let supervisor = self.supervisor.clone();
        let shutdown = self.handle.shutdown.clone();
        let me = self.instance.clone();
        let lease_timeout = self.lease_timeout;
        let durability = self.durability;
        let node = self.node;
        let mut tick = tokio::time::interval(self.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let rebalance = self.rebalance.map(|p| (p, Rebalancer::new(p.settle, 30)));
        let handle = self.handle.clone();
        let task = tokio::spawn(async move {
            let mut sweeper = Sweeper::new(30);
            let mut rebalance = rebalance;
            let round: Arc<tokio::sync::Mutex<()>> = Arc::default();
            loop {
                tick.tick().await;
                if shutdown.is_started().await {
                    return;
                }
                let beats = match store.instances().await {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the cluster's heartbeats; the next beat retries");
                        continue;
                    }
                };
                // S40: what each node can run, for placement and adoption.
                let runs = match store.advertised().await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read what the nodes can run; the next beat retries");
                        continue;
                    }
                };
                let m = Membership::judge(&beats, &me, now_ms(), lease_timeout).with_runs(runs);
                if let Some((policy, rebalancer)) = rebalance.as_mut() {
                    // One round at a time (a round is judged due only when none runs);
                    // a round runs beside the adoption sweep.
                    if let Ok(in_round) = round.clone().try_lock_owned() {
                        if rebalancer.due(&m, now_ms()) {
                            let (handle, m, policy) = (handle.clone(), m.clone(), *policy);
                            tokio::spawn(async move {
                                handle.rebalance_round(&m, policy).await;
                                drop(in_round);
                            });
                        }
                    }
                }
                if !sweeper.due(&m) {
                    continue;
                }
                let entries = match store
                    .list_stored(Some(vec![StatusKind::Interrupted, StatusKind::Running]))
                    .await
                {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list the records to adopt; the next beat retries");
                        sweeper.retry();
                        continue;
                    }
                };
                let live: std::collections::HashSet<String> =
                    supervisor.list().await.into_iter().map(|s| s.id).collect();
                let mut specs = Vec::new();
                let mut sleepers = Vec::new();
                for entry in entries {
                    let Ok(rec) = entry.record.and_then(|s| s.decode::<I>()) else {
                        continue;
                    };
                    let h = &rec.header;
                    if !should_adopt(&m, &me, placed(h), h.owner.as_deref())
                        || live.contains(&h.session_id)
                    {
                        continue;
                    }
                    if !node {
                        if let Some(owner) = h.owner.as_deref() {
                            let beat = match store.heartbeat(owner).await {
                                Ok(b) => b,
                                Err(e) => {
                                    tracing::warn!(error = %e, session = %h.session_id,
                                        "cannot read the owner's heartbeat; the next sweep retries");
                                    sweeper.retry();
                                    continue;
                                }
                            };
                            // S19: the owner's lease, counted as the session's load
                            // counts it. Its record may have been written after the
                            // owner's last beat: sweep again next beat, not in 30.
                            if holder(h, Some(&me), beat, false, now_ms(), lease_timeout).is_some()
                            {
                                sweeper.retry();
                                continue;
                            }
                        }
                    }
                    tracing::info!(session = %h.session_id, dead = ?h.owner, asleep = h.asleep, "adopting a session whose owner's lease expired");
                    // S39: one asleep stays asleep here (claimed, no actor).
                    if h.asleep && h.status == SessionStatus::Running {
                        sleepers.push(rec.header);
                        continue;
                    }
                    specs.push(SessionSpec::resuming(rec, durability, lease_timeout, true));
                }
                if !sleepers.is_empty() {
                    let (_, skipped) =
                        register_asleep(&*store, &supervisor, &me, sleepers, true).await;
                    if !skipped.is_empty() {
                        tracing::warn!(skipped = ?skipped, "some sleeping sessions were not adopted; the sweep retries them");
                        sweeper.retry();
                    }
                }
                let results = futures::future::join_all(
                    specs
                        .into_iter()
                        .map(|s| std::future::IntoFuture::into_future(supervisor.spawn(s))),
                )
                .await;
                let failed = results.iter().filter(|r| r.is_err()).count();
                if failed > 0 {
                    tracing::warn!(
                        failed,
                        "some adopted sessions did not start; the sweep retries them"
                    );
                    sweeper.retry();
                }
            }
        });
        *self.adopter.lock() = Some(task);
    }
}
