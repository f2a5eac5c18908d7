//! Lease arithmetic (S19): an owner's last sign of life and whether a heartbeat is
//! still fresh. Plain functions of times; the heartbeat itself is the runtime's.

use std::time::Duration;

/// A record owner's last sign of life: the later of its instance heartbeat `beat` and
/// the record's own heartbeat and update times (what `CheckpointStore::orphaned`
/// compares with the store's opening, issue 28).
pub fn last_seen(header: &crate::header::RecordHeader, beat: u64) -> u64 {
    beat.max(header.heartbeat_ms).max(header.updated_at_ms)
}

/// Whether a heartbeat at `beat_ms` is still fresh at `now_ms` under `timeout`.
pub fn is_fresh(beat_ms: u64, now_ms: u64, timeout: Duration) -> bool {
    now_ms.saturating_sub(beat_ms) < timeout.as_millis() as u64
}
