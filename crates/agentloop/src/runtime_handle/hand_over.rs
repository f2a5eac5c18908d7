//! Installing a router (issue 18, S36, S38): how this runtime reaches sessions other
//! nodes run, and with it the `migrate` shutdown's hand-over, so a node hands its
//! sessions to the others only once it can reach them. This file owns the
//! installation and the hand-over's view of the handle; the move itself is the
//! handle's (`cluster/moves.rs`), the shutdown's phases the coordinator's.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::runtime_handle::RuntimeHandle;

impl<I, E> RuntimeHandle<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// Installs how this runtime reaches sessions other nodes run (a router does, once:
    /// a cluster node, or the in-process peers); `false` when one was already
    /// installed. With it comes the `migrate` shutdown's hand-over (S38): from now on
    /// this node hands its sessions to the others when it shuts down that way.
    pub fn set_forwarder(&self, f: Arc<dyn crate::runtime_handle::forward::Forward<I, E>>) -> bool {
        if self.forwarder.set(f).is_err() {
            return false;
        }
        // Only a node has the `migrate` strategy, which owns the cell.
        if let Some(cell) = self.hand_over.upgrade() {
            let hand_over: Arc<dyn crate::shutdown::HandOver> =
                Arc::new(NodeHandOver(self.clone()));
            let _ = cell.set(hand_over);
        }
        true
    }
}

/// The `migrate` shutdown strategy's view of a cluster node's runtime. Private: holding
/// a node's pushes is the shutdown's to do, nobody else's.
struct NodeHandOver<I, E>(RuntimeHandle<I, E>);

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
