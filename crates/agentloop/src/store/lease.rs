//! The runtime instance's lease (DESIGN S19): one id per runtime instance and one
//! heartbeat per instance, renewed on an interval for all the sessions it owns.
//!
//! A `Running` record names its owner. It is owned *live* while the owner's heartbeat is
//! fresher than the lease timeout; after that the owner is presumed dead and the record
//! is recoverable. This module only renews and judges heartbeats; the TurnLoop decides
//! what a stale or fresh owner means for a resume.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::store::{now_ms, CheckpointStore};

/// The default heartbeat interval.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// The default lease timeout: three missed heartbeats.
pub const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// The heartbeat interval of a cluster node (issue 18): C1 needs a dead node's
/// sessions running on survivors within 5 s.
pub const CLUSTER_HEARTBEAT: Duration = Duration::from_secs(1);
/// The lease timeout of a cluster node: three missed heartbeats.
pub const CLUSTER_LEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// A runtime instance's lease: its id and the task that renews its heartbeat.
pub struct InstanceLease {
    id: String,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for InstanceLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceLease")
            .field("id", &self.id)
            .finish()
    }
}

impl InstanceLease {
    /// A fresh instance id: unique per process start (pid, start time, a counter).
    pub fn new_id() -> String {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        format!(
            "instance-{}-{}-{}",
            std::process::id(),
            now_ms(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Writes a first heartbeat (so the instance is live before it owns anything), then
    /// renews it every `interval` until dropped.
    pub async fn start<I: 'static>(
        store: Arc<dyn CheckpointStore<I>>,
        interval: Duration,
    ) -> Result<Self, crate::store::StoreError> {
        Self::start_named(store, interval, Self::new_id()).await
    }

    /// [`InstanceLease::start`] under a given id (a cluster node's name, which outlives
    /// the process: a restarted node is the same instance).
    pub async fn start_named<I: 'static>(
        store: Arc<dyn CheckpointStore<I>>,
        interval: Duration,
        id: String,
    ) -> Result<Self, crate::store::StoreError> {
        store.beat(&id, now_ms()).await?;
        let beat_id = id.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is immediate; the first beat is written
            loop {
                tick.tick().await;
                if let Err(e) = store.beat(&beat_id, now_ms()).await {
                    tracing::warn!(instance = %beat_id, error = %e, "heartbeat renewal failed");
                }
            }
        });
        Ok(InstanceLease { id, task })
    }

    /// The instance id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for InstanceLease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub use agentloop_core::lease::{is_fresh, last_seen};
