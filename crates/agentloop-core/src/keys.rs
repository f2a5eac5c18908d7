//! The idempotency keys a record keeps (S34a): what one accepted push's key is, and how
//! many a session keeps. What a session does with them is the runtime's.

use serde::{Deserialize, Serialize};

/// How many keys of answered pushes a session keeps (the oldest answered one is
/// dropped first). Keys of pushes not answered yet are not counted: see
/// [`UNANSWERED_KEYS`].
pub const KEPT_KEYS: usize = 64;

/// How many keys of unanswered pushes a session keeps at most, on top of the
/// [`KEPT_KEYS`] answered ones: a push whose answer a crash lost keeps its key until a
/// retry is answered (a duplicate), however many pushes were lost with it, up to this
/// bound; beyond it the oldest unanswered key is dropped (and logged), and a retry of
/// that push would deliver it again. Every record write carries these keys, so the
/// bound also bounds the header (1 024 keys of at most 256 bytes: under 300 KiB).
pub const UNANSWERED_KEYS: usize = 1024;

/// One accepted push's key, as a record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptKey {
    /// The client's idempotency key.
    pub key: String,
    /// A fingerprint of what the push carried (the client's choice of hash).
    pub fingerprint: u64,
    /// The push was not known to be answered when the record was written (its answer
    /// waited for this write or a later one): the key is kept beyond the
    /// [`KEPT_KEYS`] window until a retry with it is answered. Absent (false) in
    /// records written before it was kept, and for answered keys, so an answered key
    /// is written as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unanswered: bool,
}
