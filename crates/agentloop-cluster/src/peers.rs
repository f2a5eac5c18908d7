//! Nodes in one process (tests, benchmarks, a service that runs several runtimes):
//! a forwarder that reaches the other runtimes' supervisors directly instead of over
//! `ractor_cluster`. Same semantics as the network forwarder (the `agentloop-cluster` crate): the owner the
//! record names, else every peer in turn; a push with an S9 strategy does not cross.
//! This file only routes; what a request does is the receiving runtime's.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::relay::Relays;
use agentloop::cluster::forward::{
    Control, ControlOutcome, Forward, Forwarded, PushAnswer, Request,
};
use agentloop::events::{EventFilter, EventStream};
use agentloop::push::{PreemptAck, PushError};
use agentloop::runtime_handle::RuntimeHandle;
use agentloop::store::Stored;

/// Each runtime and the event relays it serves to the others.
type Peers<I, E> = Arc<RwLock<BTreeMap<String, (RuntimeHandle<I, E>, Arc<Relays<E>>)>>>;

/// Connects runtimes of one process as cluster peers: each gets a forwarder to the
/// others. Every runtime must be a node (`RuntimeBuilder::node`) named as given.
/// Event streams cross as they do between processes: relayed as JSON
/// ([`crate::relay`]).
pub fn connect_in_process<I, E>(nodes: &[(&str, &RuntimeHandle<I, E>)])
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + Serialize + DeserializeOwned + 'static,
{
    let peers: Peers<I, E> = Arc::new(RwLock::new(
        nodes
            .iter()
            .map(|(name, h)| (name.to_string(), ((*h).clone(), Arc::default())))
            .collect(),
    ));
    for (name, h) in nodes {
        h.set_forwarder(Arc::new(PeerForwarder {
            me: name.to_string(),
            peers: peers.clone(),
        }));
    }
}

/// A peer's name, runtime and relays.
type Peer<I, E> = (String, RuntimeHandle<I, E>, Arc<Relays<E>>);

struct PeerForwarder<I, E> {
    me: String,
    peers: Peers<I, E>,
}

impl<I, E> PeerForwarder<I, E> {
    /// The other runtimes, with their names and relays.
    fn others(&self) -> Vec<Peer<I, E>> {
        self.peers
            .read()
            .iter()
            .filter(|(n, _)| **n != self.me)
            .map(|(n, (h, r))| (n.clone(), h.clone(), r.clone()))
            .collect()
    }
}

impl<I, E> Forward<I, E> for PeerForwarder<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + Serialize + DeserializeOwned + 'static,
{
    fn push(
        &self,
        session: String,
        item: I,
        options: Forwarded,
        forwardable: bool,
    ) -> BoxFuture<'static, Result<PreemptAck, PushError<I>>> {
        let me = self.me.clone();
        let peers = self.peers.clone();
        Box::pin(async move {
            let all: Vec<(String, RuntimeHandle<I, E>)> = peers
                .read()
                .iter()
                .filter(|(n, _)| **n != me)
                .map(|(n, (h, _))| (n.clone(), h.clone()))
                .collect();
            let Some((_, any)) = all.first() else {
                return Err(PushError::UnknownSession { id: session, item });
            };
            let owner = match any.store() {
                Some(s) => match s.load_stored(&session).await {
                    Ok(Some(Stored::Current(r))) => r.header.owner.clone(),
                    _ => None,
                },
                None => None,
            };
            if owner.as_deref() == Some(me.as_str()) {
                return Err(PushError::UnknownSession { id: session, item });
            }
            if owner.is_some() && !forwardable {
                return Err(PushError::NotForwardable { id: session, item });
            }
            let targets: Vec<_> = all
                .into_iter()
                .filter(|(n, _)| owner.as_ref().is_none_or(|o| o == n))
                .collect();
            let mut item = item;
            for (_, h) in targets {
                let options = options.to_options();
                match h.supervisor().push(&session, item).options(options).await {
                    Err(PushError::UnknownSession { item: back, .. }) => item = back,
                    other => return other,
                }
            }
            Err(PushError::UnknownSession { id: session, item })
        })
    }

    fn reachable(&self, node: &str) -> bool {
        node != self.me && self.peers.read().contains_key(node)
    }

    fn control(&self, session: String, op: Control) -> BoxFuture<'static, ControlOutcome> {
        let peers = self.others();
        Box::pin(async move {
            for (_, h, _) in peers {
                match h.control_here(&session, op.clone()).await {
                    ControlOutcome::UnknownSession => continue,
                    other => return other,
                }
            }
            ControlOutcome::UnknownSession
        })
    }

    fn subscribe(
        &self,
        session: String,
        after: Option<u64>,
        filter: EventFilter,
    ) -> BoxFuture<'static, Result<EventStream<E>, ControlOutcome>> {
        use crate::relay::{pump, Ask};
        let peers = self.others();
        Box::pin(async move {
            for (node, h, relays) in peers {
                let answer = relays.open(&h, &session, after, filter).await;
                match answer {
                    PushAnswer::Subscribed(stream) => {
                        let ask: Ask = Arc::new(move |r: Request| {
                            let relays = relays.clone();
                            Box::pin(async move { Ok(relays.answer(r).await) })
                        });
                        return Ok(pump(node, stream, ask));
                    }
                    PushAnswer::UnknownSession => continue,
                    PushAnswer::Refused(e) => return Err(ControlOutcome::Refused(e)),
                    other => {
                        return Err(ControlOutcome::Refused(format!(
                            "a mismatched answer {other:?}"
                        )))
                    }
                }
            }
            Err(ControlOutcome::UnknownSession)
        })
    }

    fn resume_on(&self, node: String, session: String) -> BoxFuture<'static, Result<(), String>> {
        let peer = self.peers.read().get(&node).map(|(h, _)| h.clone());
        Box::pin(async move {
            match peer {
                Some(h) => h.resume_handed_over(&session).await,
                None => Err(format!("no node `{node}` in this process")),
            }
        })
    }
}
