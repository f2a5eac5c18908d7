//! agentloop's cluster routing (issue 18, S36; issue 54): how by-id work reaches a
//! session another runtime runs. The library keeps the trait a router implements
//! (`agentloop::cluster::forward::Forward`, with what crosses) and calls it; this
//! crate has the routers and what they carry:
//!
//! * [`relay`]: event streams across nodes (a subscriber on one node reads the events
//!   of a session another node runs), for every router;
//! * [`peers`]: runtimes of one process connected as cluster peers (tests, benchmarks,
//!   a service that runs several runtimes), without ractor's `cluster` feature;
//! * with the `nodes` feature (on by default): nodes on `ractor_cluster`, joined by
//!   address and cookie, with mutual TLS ([`ClusterNode`], [`NodeConfig`], [`NodeTls`]).
//!
//! Only the `nodes` feature pays for ractor's `cluster` feature (its remote registry
//! and the `Message` bounds on every actor message, B2): it turns on
//! `agentloop/cluster` for the whole program. A program that only connects runtimes in
//! process depends on this crate with `default-features = false`.

pub mod peers;
pub mod relay;

#[cfg(feature = "nodes")]
mod node;
#[cfg(feature = "nodes")]
pub use node::{is_private, ClusterNode, NodeConfig, NodeError, NodeMsg, NodeTls, FORWARD_TIMEOUT};
