//! The part of agentloop that needs no runtime. The vocabulary: session ids, the
//! business interrupt, a record's status, header and settings, durability, idempotency
//! keys. The record layer: the record's shapes ([`record`]), the writes a session makes
//! ([`mod@write`]), their encoding ([`codec`]), the key-value table every store applies
//! them to ([`table`]), the checkpoint history ([`history`]) and [`StoreError`]. The
//! cluster's judgements: lease arithmetic, placement, adoption and rebalancing. The
//! journal of durable steps ([`steps`], S1b). How long events are kept in the store
//! ([`event_log`], S20a). Which durable timers are due and when
//! a schedule fires next ([`timers`], S39). Plain data and plain functions; this
//! crate has no tokio and no ractor in its Cargo.toml, so the compiler keeps it free of
//! I/O (DESIGN §1, issue 31). The `agentloop` crate re-exports the items at their old
//! paths.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adopt;
pub mod cancel;
pub mod codec;
pub mod durability;
pub mod duration_text;
pub mod event_log;
pub mod header;
pub mod history;
pub mod ids;
pub mod interrupt;
pub mod keys;
pub mod lease;
pub mod ledger;
pub mod lifecycle;
pub mod placement;
pub mod plan;
pub mod rebalance;
pub mod record;
pub mod settings;
pub mod status;
pub mod steps;
pub mod stop;
pub mod store_error;
pub mod table;
pub mod timers;
pub mod turn;
pub mod versions;
pub mod write;

pub use store_error::StoreError;
