//! Several nodes sharing one store (issue 18, S36–S38), as the runtime sees them: the
//! routing trait a router implements for by-id work on sessions that run elsewhere
//! ([`forward`]) and what a stop or a control request crossing nodes may carry
//! ([`control`]) — both kept by the runtime handle that calls them and re-exported
//! here —, a session's planned move ([`migrate`], with the handle's `migrate`,
//! `hand_over_all` and `resume_handed_over` in `moves.rs`), and the judgements — where a
//! session should run ([`placement`]), which dead node's sessions to adopt ([`adopt`]),
//! when and what to rebalance ([`rebalance`]) — which are plain code in
//! `agentloop-core`, re-exported here. The routers themselves are the
//! `agentloop-cluster` crate's (issue 54): the event relays that carry a subscription
//! across nodes, the in-process network of runtimes (tests, benchmarks and programs
//! that run several runtimes in one process, without ractor's `cluster` feature) and
//! nodes on ractor_cluster. Sessions, their records and claims are the session's and
//! the store's business.

pub use crate::runtime_handle::{control, forward};
pub use agentloop_core::{adopt, placement, rebalance};
pub mod migrate;
mod moves;
