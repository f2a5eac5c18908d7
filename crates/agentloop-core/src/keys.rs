//! The idempotency keys a record keeps (S34a): what one accepted push's key is, and how
//! many a session keeps. What a session does with them is the runtime's.

use serde::{Deserialize, Serialize};

/// How many accepted keys a session keeps (oldest dropped first).
pub const KEPT_KEYS: usize = 64;

/// One accepted push's key, as a record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptKey {
    /// The client's idempotency key.
    pub key: String,
    /// A fingerprint of what the push carried (the client's choice of hash).
    pub fingerprint: u64,
}
