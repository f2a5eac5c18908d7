//! The vocabulary of agentloop that needs no runtime: session ids, the business
//! interrupt, a record's status, header and settings, durability, idempotency keys,
//! lease arithmetic and placement. Plain data and plain functions; this crate has no
//! tokio and no ractor in its Cargo.toml, so the compiler keeps it free of I/O
//! (DESIGN §1, issue 31). The `agentloop` crate re-exports every item at its old path.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod codec;
pub mod durability;
pub mod header;
pub mod history;
pub mod ids;
pub mod interrupt;
pub mod keys;
pub mod lease;
pub mod placement;
pub mod record;
pub mod settings;
pub mod status;
pub mod store_error;
pub mod table;
pub mod write;
