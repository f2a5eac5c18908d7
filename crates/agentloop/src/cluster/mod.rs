//! Several nodes sharing one store (issue 18, S36–S38): where a session should run
//! ([`placement`]) and how a node adopts the sessions of nodes that died
//! ([`adopt`]). This module decides placement and adoption only; sessions, their
//! records and claims are the session's and the store's business.

pub mod adopt;
pub mod control;
pub mod forward;
pub mod migrate;
pub(crate) mod moving;
pub mod peers;
pub use agentloop_core::placement;
pub mod rebalance;
pub mod relay;
