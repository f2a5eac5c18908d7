//! The sessions a supervisor holds asleep (DESIGN S39): what it keeps of each is one
//! 64-bit hash of its id, so a node holds a million sleeping sessions in a few dozen
//! bytes each; their records hold the rest, and a wake reads the record. A session
//! spawned with what its record cannot restore (end hooks, a buffer bound, …) also
//! keeps its spec here until it wakes.
//!
//! A hash says "maybe asleep here"; the record decides. Two ids with the same hash
//! (about one chance in 10⁷ among a million sleepers) cost a record read and count
//! once. A record deleted by another process while its session sleeps is counted until
//! something asks for its id or the runtime restarts.
//!
//! This file only remembers; the registry decides when to sleep and wake.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use crate::session::SessionSpec;

/// The sleeping sessions of one supervisor.
pub(super) struct Sleepers<I> {
    hasher: std::collections::hash_map::RandomState,
    ids: HashSet<u64, NoHash>,
    /// Specs a record cannot restore, by id (rare).
    kept: HashMap<String, Box<SessionSpec<I>>>,
}

impl<I> Default for Sleepers<I> {
    fn default() -> Self {
        Sleepers {
            hasher: Default::default(),
            ids: HashSet::with_hasher(NoHash),
            kept: HashMap::new(),
        }
    }
}

impl<I> Sleepers<I> {
    fn hash(&self, id: &str) -> u64 {
        self.hasher.hash_one(id)
    }

    /// Whether `id` may sleep here (its record decides).
    pub(super) fn contains(&self, id: &str) -> bool {
        self.ids.contains(&self.hash(id))
    }

    /// `id` fell asleep (or was found asleep at start); `spec` when its record cannot
    /// restore it.
    pub(super) fn insert(&mut self, id: &str, spec: Option<SessionSpec<I>>) {
        self.ids.insert(self.hash(id));
        if let Some(spec) = spec {
            self.kept.insert(id.to_string(), Box::new(spec));
        }
    }

    /// `id` wakes (or its record is gone): forgets it, handing back its kept spec.
    pub(super) fn remove(&mut self, id: &str) -> Option<Box<SessionSpec<I>>> {
        let h = self.hash(id);
        self.ids.remove(&h);
        self.kept.remove(id)
    }

    /// How many sleep.
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// The set's keys are hashes already.
#[derive(Clone, Copy, Default)]
pub(super) struct NoHash;

impl BuildHasher for NoHash {
    type Hasher = Passthrough;
    fn build_hasher(&self) -> Passthrough {
        Passthrough(0)
    }
}

/// Hashes a `u64` to itself.
#[derive(Default)]
pub(super) struct Passthrough(u64);

impl std::hash::Hasher for Passthrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_ids_by_hash_and_keeps_specs_it_is_given() {
        let mut s: Sleepers<u32> = Sleepers::default();
        s.insert("a", None);
        s.insert("b", Some(SessionSpec::new("b", "k")));
        assert!(s.contains("a") && s.contains("b") && !s.contains("c"));
        assert_eq!(s.len(), 2);
        assert!(s.remove("a").is_none());
        assert_eq!(s.remove("b").map(|spec| spec.id), Some("b".to_string()));
        assert_eq!(s.len(), 0);
        assert!(!s.contains("b"));
    }
}
