//! A cluster node on `ractor_cluster` (issue 18, S36): the node server (nodes join by
//! address and cookie), the node actor that serves requests for the sessions this node
//! runs, and the forwarder that sends a request to the node that owns a session. The
//! owner is the one the session's record names (the lease decides, not placement).
//! Every node actor joins the process group `agentloop.node.<name>`, which
//! ractor_cluster keeps in sync across connected nodes. The cookie authenticates; TLS
//! ([`NodeTls`], S43: each node with a certificate from the cluster's CA, both sides
//! verified) encrypts. Without TLS a node listens only on loopback or a private network
//! ([`NodeError::PublicAddress`]). This file owns the transport only: what a request
//! does is the runtime's, what crosses is `agentloop::cluster::forward`'s.

use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::{NodeServer, NodeServerMessage, RactorClusterMessage};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::relay::{pump, Ask, Relays};
use agentloop::cluster::forward::Forwarded;
use agentloop::cluster::forward::{
    Control, ControlOutcome, Forward, PushAnswer, Request, WirePreempt,
};
use agentloop::events::{EventFilter, EventStream};
use agentloop::options::PushOptions;
use agentloop::push::{PreemptAck, PushError};
use agentloop::runtime_handle::RuntimeHandle;
use agentloop::store::{CheckpointStore, Stored};

/// How long a forwarded request may take before the caller hears `OwnerUnreachable`.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// A node's settings. Its `Debug` never shows the cookie (S43).
#[derive(Clone)]
pub struct NodeConfig {
    /// The node's name: the runtime's (`RuntimeBuilder::node`), unique among nodes.
    pub name: String,
    /// Where the node server listens for other nodes (loopback or a private address).
    pub listen: SocketAddr,
    /// The shared secret nodes authenticate each other with (it does not encrypt).
    pub cookie: String,
    /// Nodes to join at start (`host:port` of their node servers).
    pub join: Vec<String>,
    /// Mutual TLS with the other nodes (S43); `None`: plain TCP, on loopback or a
    /// private network only.
    pub tls: Option<NodeTls>,
}

impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("name", &self.name)
            .field("listen", &self.listen)
            .field("cookie", &"<set>")
            .field("join", &self.join)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Mutual TLS between nodes (S43): this node's certificate and key, and the cluster's
/// CA every node's certificate must chain to. A node accepts only peers that present a
/// certificate from that CA, and verifies the node it joins against it and the name in
/// the join address (a DNS name or an IP the certificate must hold).
#[derive(Clone)]
pub struct NodeTls {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls").finish_non_exhaustive()
    }
}

impl NodeTls {
    /// From this node's certificate chain `cert` and private key `key`, and the
    /// cluster's CA `ca` (PEM files).
    pub fn from_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> Result<Self, NodeError> {
        let tls = |e: String| NodeError::Tls(e);
        let chain = agentloop::tls::certificates(cert, "the node's certificate")
            .map_err(|e| tls(e.to_string()))?;
        let private = agentloop::tls::private_key(key, "the node's private key")
            .map_err(|e| tls(e.to_string()))?;
        let roots = Arc::new(
            agentloop::tls::roots(ca, "the cluster's CA").map_err(|e| tls(e.to_string()))?,
        );
        let provider = agentloop::tls::provider();
        let pair = |e: rustls::Error| {
            tls(format!(
                "the node's certificate {} and key {} cannot be used: {e}",
                cert.display(),
                key.display()
            ))
        };
        let peers = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| tls(format!("the cluster's CA {}: {e}", ca.display())))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(pair)?
            .with_client_cert_verifier(peers)
            .with_single_cert(chain.clone(), private.clone_key())
            .map_err(pair)?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(pair)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, private)
            .map_err(pair)?;
        Ok(NodeTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }
}

/// The name a joined node's certificate must hold: the host of `host:port`.
fn server_name(peer: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let host = match peer.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => peer,
    };
    rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("`{peer}` names no host a certificate can hold: {e}"))
}

/// A node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The address is public and TLS is off: the cookie authenticates but does not
    /// encrypt.
    #[error("refusing to listen for cluster nodes on the public address {0} without TLS: the cookie authenticates but does not encrypt; turn on TLS between nodes (--cluster-tls-cert, --cluster-tls-key, --cluster-ca), or use a loopback or private address (10/8, 172.16/12, 192.168/16, fc00::/7) on a private network")]
    PublicAddress(IpAddr),
    /// The node's TLS files could not be used.
    #[error("the cluster's TLS: {0}")]
    Tls(String),
    /// The node server or actor did not start.
    #[error("the cluster node did not start: {0}; check that the port is free")]
    Start(String),
}

/// Whether `ip` is loopback or private (where an unencrypted cookie is acceptable).
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_private(),
        IpAddr::V6(v6) => v6.is_loopback() || (v6.segments()[0] & 0xfe00) == 0xfc00,
    }
}

/// The node actor's message: one request (JSON of [`Request`]) and its answer.
#[derive(RactorClusterMessage)]
pub enum NodeMsg {
    /// A request for a session this node runs.
    #[rpc]
    Request(Vec<u8>, RpcReplyPort<Vec<u8>>),
}

fn group(node: &str) -> String {
    format!("agentloop.node.{node}")
}

/// The process group every node actor joins (asked in turn for a session whose record
/// names no owner yet: a session spawned with nothing to store).
const ALL_NODES: &str = "agentloop.nodes";

/// Serves requests for this node's sessions.
struct NodeActor<I, E>(PhantomData<fn() -> (I, E)>);

/// What the node actor serves requests with: the runtime and its event relays.
struct Served<I, E> {
    handle: RuntimeHandle<I, E>,
    relays: Arc<Relays<E>>,
    /// Closes relays whose subscriber went away; stopped with the actor.
    sweeper: tokio::task::JoinHandle<()>,
}

impl<I, E> Actor for NodeActor<I, E>
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + Serialize + DeserializeOwned + 'static,
{
    type Msg = NodeMsg;
    type State = Served<I, E>;
    type Arguments = (RuntimeHandle<I, E>, String);

    async fn pre_start(
        &self,
        myself: ActorRef<NodeMsg>,
        (handle, name): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(group(&name), vec![myself.get_cell()]);
        ractor::pg::join(ALL_NODES.to_string(), vec![myself.get_cell()]);
        let relays = Arc::new(Relays::default());
        let sweeper = relays.sweep_idle();
        Ok(Served {
            handle,
            relays,
            sweeper,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<NodeMsg>,
        served: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        served.sweeper.abort();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<NodeMsg>,
        msg: NodeMsg,
        served: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let NodeMsg::Request(bytes, reply) = msg;
        let handle = served.handle.clone();
        let relays = served.relays.clone();
        // A push waits for durability, an event poll for events: never in the
        // actor's handler.
        tokio::spawn(async move {
            let answer = serve(&handle, &relays, &bytes).await;
            let bytes = serde_json::to_vec(&answer).unwrap_or_default();
            let _ = reply.send(bytes);
        });
        Ok(())
    }
}

/// What this node does with a request from another (locally only: never forwarded on).
async fn serve<I, E>(handle: &RuntimeHandle<I, E>, relays: &Relays<E>, bytes: &[u8]) -> PushAnswer
where
    I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
    E: Clone + Send + Sync + Serialize + 'static,
{
    let request: Request = match serde_json::from_slice(bytes) {
        Ok(r) => r,
        Err(e) => return PushAnswer::Refused(format!("not a request this node understands: {e}")),
    };
    match request {
        Request::Control { session, op } => match handle.control_here(&session, op).await {
            ControlOutcome::Done => PushAnswer::Done,
            ControlOutcome::UnknownSession => PushAnswer::UnknownSession,
            ControlOutcome::Refused(e) | ControlOutcome::Unreachable { error: e, .. } => {
                PushAnswer::Refused(e)
            }
        },
        Request::Subscribe {
            session,
            after,
            filter,
        } => relays.open(handle, &session, after, filter).await,
        r @ (Request::NextEvents { .. } | Request::CloseEvents { .. }) => relays.answer(r).await,
        Request::Resume { session } => match handle.resume_handed_over(&session).await {
            Ok(()) => PushAnswer::Resumed,
            Err(e) => PushAnswer::Refused(e),
        },
        Request::Push {
            session,
            item,
            preempt,
            early,
            idempotency,
            timer,
        } => {
            let item: I = match serde_json::from_value(item) {
                Ok(i) => i,
                Err(e) => return PushAnswer::Refused(format!("not an item this node takes: {e}")),
            };
            let options: PushOptions<I> = Forwarded {
                preempt: preempt.map(|p| p.to_preempt()),
                answer_at_acceptance: early,
                idempotency,
                timer,
            }
            .to_options();
            match handle
                .supervisor()
                .push(&session, item)
                .options(options)
                .await
            {
                Ok(ack) => PushAnswer::Accepted(ack.into()),
                Err(PushError::UnknownSession { .. }) => PushAnswer::UnknownSession,
                Err(PushError::Late { .. }) => PushAnswer::Late,
                Err(PushError::Full { full, .. }) => PushAnswer::Full(full),
                Err(PushError::NotDurable { error }) => PushAnswer::NotDurable(error),
                Err(e) => PushAnswer::Refused(e.to_string()),
            }
        }
    }
}

/// Sends `request` to a node actor and reads its answer (or says why there is none).
async fn ask(actor: &ActorRef<NodeMsg>, request: &Request) -> Result<PushAnswer, String> {
    let bytes =
        serde_json::to_vec(request).map_err(|e| format!("the request does not encode: {e}"))?;
    match actor
        .call(
            |reply| NodeMsg::Request(bytes, reply),
            Some(FORWARD_TIMEOUT),
        )
        .await
    {
        Ok(CallResult::Success(b)) => serde_json::from_slice::<PushAnswer>(&b)
            .map_err(|e| format!("an answer it could not read: {e}")),
        Ok(CallResult::Timeout) => Err(format!(
            "no answer within {FORWARD_TIMEOUT:?}; it may have done what was asked"
        )),
        Ok(CallResult::SenderError) | Err(_) => Err("the connection to it failed".into()),
    }
}

/// Sends requests to the node a session's record names as its owner.
struct Forwarder<I, E> {
    store: Arc<dyn CheckpointStore<I>>,
    me: String,
    _events: PhantomData<fn() -> E>,
}

impl<I, E> Forward<I, E> for Forwarder<I, E>
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
        let store = self.store.clone();
        let me = self.me.clone();
        Box::pin(async move {
            let (owner, targets) = match targets(&*store, &me, &session).await {
                Some(t) => t,
                // Its record says this node, which does not run it: it ended, or moves.
                None => return Err(PushError::UnknownSession { id: session, item }),
            };
            if owner.is_some() && !forwardable {
                return Err(PushError::NotForwardable { id: session, item });
            }
            if let (Some(node), true) = (&owner, targets.is_empty()) {
                return Err(PushError::OwnerUnreachable {
                    id: session,
                    node: node.clone(),
                    item,
                    error: "this node is not connected to it".into(),
                });
            }
            if targets.is_empty() {
                return Err(PushError::UnknownSession { id: session, item });
            }
            if !forwardable {
                return Err(PushError::NotForwardable { id: session, item });
            }
            let request = match serde_json::to_value(&item) {
                Ok(json) => Request::Push {
                    session: session.clone(),
                    item: json,
                    preempt: options.preempt.as_ref().and_then(WirePreempt::from_preempt),
                    early: options.answer_at_acceptance,
                    idempotency: options.idempotency.clone(),
                    timer: options.timer.clone(),
                },
                Err(e) => {
                    return Err(PushError::RefusedByOwner {
                        id: session,
                        node: owner.unwrap_or_default(),
                        item,
                        error: format!("the item does not encode as JSON: {e}"),
                    })
                }
            };
            for (node, actor) in targets {
                return match ask(&actor, &request).await {
                    Ok(PushAnswer::Accepted(ack)) => Ok(ack.into()),
                    // Not there: ask the next node (only when the record named none).
                    Ok(PushAnswer::UnknownSession) => continue,
                    Ok(PushAnswer::Late) => Err(PushError::Late { item }),
                    Ok(PushAnswer::Full(full)) => Err(PushError::Full { item, full }),
                    Ok(PushAnswer::NotDurable(error)) => Err(PushError::NotDurable { error }),
                    Ok(PushAnswer::Refused(error)) => Err(PushError::RefusedByOwner {
                        id: session,
                        node,
                        item,
                        error,
                    }),
                    Ok(other) => Err(PushError::OwnerUnreachable {
                        id: session,
                        node,
                        item,
                        error: format!("a mismatched answer {other:?}"),
                    }),
                    Err(error) => Err(PushError::OwnerUnreachable {
                        id: session,
                        node,
                        item,
                        error,
                    }),
                };
            }
            Err(PushError::UnknownSession { id: session, item })
        })
    }

    fn reachable(&self, node: &str) -> bool {
        node != self.me && !remote_members(&group(node)).is_empty()
    }

    fn control(&self, session: String, op: Control) -> BoxFuture<'static, ControlOutcome> {
        let store = self.store.clone();
        let me = self.me.clone();
        Box::pin(async move {
            let request = Request::Control {
                session: session.clone(),
                op,
            };
            match ask_owner(&*store, &me, &session, &request).await {
                Ok((_, PushAnswer::Done)) => ControlOutcome::Done,
                Ok((_, other)) => ControlOutcome::Refused(format!("a mismatched answer {other:?}")),
                Err(outcome) => outcome,
            }
        })
    }

    fn subscribe(
        &self,
        session: String,
        after: Option<u64>,
        filter: EventFilter,
    ) -> BoxFuture<'static, Result<EventStream<E>, ControlOutcome>> {
        let store = self.store.clone();
        let me = self.me.clone();
        Box::pin(async move {
            let request = Request::Subscribe {
                session: session.clone(),
                after,
                filter,
            };
            match ask_owner(&*store, &me, &session, &request).await {
                Ok(((node, actor), PushAnswer::Subscribed(stream))) => {
                    let ask: Ask = Arc::new(move |request: Request| {
                        let actor = actor.clone();
                        Box::pin(async move { ask(&actor, &request).await })
                    });
                    Ok(pump(node, stream, ask))
                }
                Ok((_, other)) => Err(ControlOutcome::Refused(format!(
                    "a mismatched answer {other:?}"
                ))),
                Err(outcome) => Err(outcome),
            }
        })
    }

    fn resume_on(&self, node: String, session: String) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async move {
            let Some(actor) = remote_members(&group(&node)).into_iter().next() else {
                return Err(format!("this node is not connected to node `{node}`"));
            };
            match ask(&actor, &Request::Resume { session }).await {
                Ok(PushAnswer::Resumed) => Ok(()),
                Ok(PushAnswer::Refused(e)) => Err(e),
                Ok(other) => Err(format!("a mismatched answer {other:?}")),
                Err(e) => Err(format!("node `{node}`: {e}")),
            }
        })
    }
}

/// Sends `request` for `session` to the node that runs it (the one its record names,
/// else each joined node in turn until one knows it): that node and its answer, or
/// the outcome to report (never `Done`). A `Refused` answer is reported as such.
async fn ask_owner<I: 'static>(
    store: &dyn CheckpointStore<I>,
    me: &str,
    session: &str,
    request: &Request,
) -> Result<((String, ActorRef<NodeMsg>), PushAnswer), ControlOutcome> {
    let Some((owner, targets)) = targets(store, me, session).await else {
        return Err(ControlOutcome::UnknownSession);
    };
    if let (Some(node), true) = (&owner, targets.is_empty()) {
        return Err(ControlOutcome::Unreachable {
            node: node.clone(),
            error: "this node is not connected to it".into(),
        });
    }
    for (node, actor) in targets {
        match ask(&actor, request).await {
            Ok(PushAnswer::UnknownSession) => continue,
            Ok(PushAnswer::Refused(e)) => return Err(ControlOutcome::Refused(e)),
            Ok(answer) => return Ok(((node, actor), answer)),
            Err(error) => return Err(ControlOutcome::Unreachable { node, error }),
        }
    }
    Err(ControlOutcome::UnknownSession)
}

/// The node a session's record names as its owner (`None`: none yet) and whom to ask:
/// that node's actor, or every joined node's when the record names none. `None` when
/// the record names this node, which does not run it (it ended, or is moving).
async fn targets<I: 'static>(
    store: &dyn CheckpointStore<I>,
    me: &str,
    session: &str,
) -> Option<(Option<String>, Vec<(String, ActorRef<NodeMsg>)>)> {
    let owner = match store.load_stored(session).await {
        Ok(Some(Stored::Current(r))) => r.header.owner.clone(),
        _ => None,
    };
    if owner.as_deref() == Some(me) {
        return None;
    }
    let targets = match &owner {
        Some(node) => remote_members(&group(node))
            .into_iter()
            .map(|a| (node.clone(), a))
            .collect(),
        None => remote_members(ALL_NODES)
            .into_iter()
            .map(|a| ("a joined node".to_string(), a))
            .collect(),
    };
    Some((owner, targets))
}

/// The members of `group` on other nodes.
fn remote_members(group: &str) -> Vec<ActorRef<NodeMsg>> {
    ractor::pg::get_members(&group.to_string())
        .into_iter()
        .filter(|c| !c.get_id().is_local())
        .map(ActorRef::<NodeMsg>::from)
        .collect()
}

/// A running cluster node: its node server and node actor. Stopped when dropped.
pub struct ClusterNode {
    server: ActorRef<NodeServerMessage>,
    actor: ActorRef<NodeMsg>,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode").finish_non_exhaustive()
    }
}

impl ClusterNode {
    /// Starts the node server on `config.listen`, the node actor for `handle`'s
    /// sessions, installs the forwarder on `handle`, and joins `config.join` (retried in
    /// the background while a peer is not up yet).
    pub async fn start<I, E>(
        handle: &RuntimeHandle<I, E>,
        config: NodeConfig,
    ) -> Result<Self, NodeError>
    where
        I: Clone + Send + Sync + Serialize + DeserializeOwned + std::fmt::Debug + 'static,
        E: Clone + Send + Sync + Serialize + DeserializeOwned + 'static,
    {
        let ip = config.listen.ip();
        if config.tls.is_none() && !is_private(ip) {
            return Err(NodeError::PublicAddress(ip));
        }
        let server = NodeServer::new(
            config.listen.port(),
            config.cookie.clone(),
            config.name.clone(),
            ip.to_string(),
            config
                .tls
                .as_ref()
                .map(|t| ractor_cluster::IncomingEncryptionMode::Tls(t.acceptor.clone())),
            None,
        )
        .with_listen_addr(ip);
        let (server, _) = Actor::spawn(None, server, ())
            .await
            .map_err(|e| NodeError::Start(e.to_string()))?;
        let (actor, _) = Actor::spawn(
            None,
            NodeActor::<I, E>(PhantomData),
            (handle.clone(), config.name.clone()),
        )
        .await
        .map_err(|e| NodeError::Start(e.to_string()))?;
        if let Some(store) = handle.store() {
            handle.set_forwarder(Arc::new(Forwarder {
                store,
                me: config.name.clone(),
                _events: PhantomData,
            }));
        }
        for peer in config.join {
            let server = server.clone();
            let tls = match &config.tls {
                Some(t) => Some((
                    t.connector.clone(),
                    server_name(&peer).map_err(NodeError::Tls)?,
                )),
                None => None,
            };
            tokio::spawn(async move {
                let mut wait = Duration::from_millis(100);
                loop {
                    let joined = match &tls {
                        None => ractor_cluster::client_connect(&server, peer.as_str()).await,
                        Some((connector, name)) => {
                            ractor_cluster::client_connect_enc(
                                &server,
                                peer.as_str(),
                                connector.clone(),
                                name.clone(),
                            )
                            .await
                        }
                    };
                    match joined {
                        Ok(()) => {
                            tracing::info!(%peer, "joined a cluster node");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(%peer, error = %e, retry_in = ?wait, "cannot join a cluster node yet");
                            tokio::time::sleep(wait).await;
                            wait = (wait * 2).min(Duration::from_secs(5));
                        }
                    }
                }
            });
        }
        Ok(ClusterNode { server, actor })
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.actor.stop(None);
        self.server.stop(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_and_private_addresses_take_an_unencrypted_cookie() {
        for ok in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.9",
            "172.16.0.1",
            "::1",
            "fd00::1",
        ] {
            assert!(is_private(ok.parse().unwrap()), "{ok}");
        }
        for public in ["8.8.8.8", "1.1.1.1", "2001:db8::1", "0.0.0.0"] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
    }
}
