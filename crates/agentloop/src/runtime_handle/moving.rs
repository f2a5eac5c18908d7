//! The sessions this node moved or is moving, each with its gate: a fair lock that
//! pushes to a moving session take in arrival order, so a push that arrives during or
//! right after a move cannot overtake those queued before it. Read on every push of a
//! cluster node; the moves themselves are `migrate`'s.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long a moved session keeps routing this node's pushes through its gate (so a
/// push that arrives right after the move cannot overtake those queued during it).
const REMEMBER_MOVED: Duration = Duration::from_secs(60);

/// The sessions this node moved or is moving: each one's gate (a fair lock: pushes
/// take it in arrival order) and when the move began.
#[derive(Clone, Default)]
pub(crate) struct Moving {
    gates: Arc<Mutex<HashMap<String, (Gate, Instant)>>>,
    /// Gates closed by a `migrate` shutdown until its hand-over of each session.
    held: Arc<Mutex<HashMap<String, tokio::sync::OwnedMutexGuard<()>>>>,
}

/// A moving session's gate: a fair lock, so pushes take it in arrival order.
type Gate = Arc<tokio::sync::Mutex<()>>;

impl Moving {
    /// The gate of a session being moved or moved recently.
    /// Looked up on every push of a cluster node: one map read, no sweep.
    pub(crate) fn gate(&self, id: &str) -> Option<Gate> {
        let found = self.gates.lock().get(id).cloned();
        // A gate a `migrate` shutdown holds closed never expires.
        found
            .filter(|(_, at)| at.elapsed() < REMEMBER_MOVED || self.held.lock().contains_key(id))
            .map(|(g, _)| g)
    }

    /// A new move's gate; old moves are forgotten here (moves are rare, pushes not).
    /// A gate a `migrate` shutdown holds is kept, not replaced: a move queues behind
    /// the pushes already waiting at it.
    pub(crate) fn begin(&self, id: &str) -> Gate {
        let held: std::collections::HashSet<String> = self.held.lock().keys().cloned().collect();
        let mut map = self.gates.lock();
        map.retain(|k, (_, at)| at.elapsed() < REMEMBER_MOVED || held.contains(k));
        if held.contains(id) {
            if let Some((g, _)) = map.get(id) {
                return g.clone();
            }
        }
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(id.to_string(), (gate.clone(), Instant::now()));
        gate
    }

    pub(crate) fn forget(&self, id: &str) {
        self.gates.lock().remove(id);
    }

    /// Closes a new gate for `id` until [`Moving::release`]: its pushes wait in line.
    pub(crate) fn hold(&self, id: &str) {
        // A new gate (none is held for `id` yet): nobody holds it.
        if let Ok(guard) = self.begin(id).try_lock_owned() {
            self.held.lock().insert(id.to_string(), guard);
        }
    }

    /// Opens `id`'s held gate: its waiting pushes go on, in order.
    pub(crate) fn release(&self, id: &str) {
        self.held.lock().remove(id);
    }

    /// Opens every held gate.
    pub(crate) fn release_all(&self) {
        self.held.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_queues_behind_the_pushes_a_migrate_shutdown_holds() {
        let m = Moving::default();
        m.hold("s");
        let held = m.gate("s").expect("held");
        assert!(held.try_lock().is_err(), "closed while held");
        // A move begun meanwhile gets the same gate (behind the waiting pushes), not
        // a fresh one that would let later pushes overtake them.
        assert!(Arc::ptr_eq(&m.begin("s"), &held));
        m.release("s");
        assert!(held.try_lock().is_ok(), "open once released");
        // Not held: a move gets a new gate.
        assert!(!Arc::ptr_eq(&m.begin("s"), &held));
        m.hold("t");
        m.release_all();
        assert!(m.gate("t").expect("remembered").try_lock().is_ok());
    }
}
