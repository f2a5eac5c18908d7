//! The checkpoint actor's messages, which are the store's lifecycle ([`CheckpointMsg`]:
//! close, counters), and the committer's counters ([`CheckpointStats`]). Shared by the
//! actor (`actor.rs`), which answers them, and the client (`client.rs`), which holds the
//! actor's reference; it performs nothing.

use std::sync::atomic::Ordering;

use ractor::RpcReplyPort;

use crate::store::committer::Committer;
use crate::store::StoreError;

/// Where a lifecycle message is answered.
pub(super) type Reply<T> = RpcReplyPort<Result<T, StoreError>>;

/// Counters of a store's committer (answer to [`CheckpointMsg::Stats`] and
/// [`CheckpointClient::stats`](super::CheckpointClient::stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Record writes received.
    pub saves: u64,
    /// Waves applied (a batch the committer took at once; a listing splits one).
    pub waves: u64,
    /// Operations applied, over all waves.
    pub ops: u64,
    /// The largest wave, in operations.
    pub max_wave: u64,
    /// Flushes run (each covers every write of its batch).
    pub flushes: u64,
    /// Bytes of payload (items and states) written.
    pub bytes: u64,
    /// Times the committer's thread was started because work arrived while it was not
    /// running (each is a thread wake-up on the write path; fewer than `waves` when
    /// writes came back while it lingered).
    pub wakes: u64,
}

/// Messages of the checkpoint actor: its lifecycle. Store operations do not pass
/// through it; they go to the committer through [`CheckpointClient`](super::CheckpointClient) (the one door to
/// the store, S15c).
pub enum CheckpointMsg {
    /// Stop taking writes (they are answered `Closed`), finish every write already
    /// taken (answered after its flush), release the engine and its directory lock,
    /// answer, and stop.
    Close {
        /// Where to answer.
        reply: Reply<()>,
    },
    /// Counters.
    Stats {
        /// Where to answer.
        reply: RpcReplyPort<CheckpointStats>,
    },
}

// A local message (with the `cluster` feature ractor needs the impl; `local_message!`).
#[cfg(feature = "cluster")]
impl ractor::Message for CheckpointMsg {}

/// Reads the counters.
pub(super) fn stats(committer: &Committer) -> CheckpointStats {
    let c = &committer.counters;
    CheckpointStats {
        saves: c.saves.load(Ordering::Relaxed),
        waves: c.waves.load(Ordering::Relaxed),
        ops: c.ops.load(Ordering::Relaxed),
        max_wave: c.max_wave.load(Ordering::Relaxed),
        flushes: c.flushes.load(Ordering::Relaxed),
        bytes: c.bytes.load(Ordering::Relaxed),
        wakes: c.wakes.load(Ordering::Relaxed),
    }
}
