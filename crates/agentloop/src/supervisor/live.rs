//! The supervisor's live sessions by id, with their ids in order beside the map, so a
//! page of them (`GET /sessions`, issue 52) costs what it returns: a seek in the
//! ordered ids and the page's entries, never a pass over every live session. Reads
//! go to the map ([`Deref`]); the only ways to change it keep the order with it.

use std::collections::{BTreeSet, HashMap};
use std::ops::{Bound, Deref};

/// Live sessions' entries (`V`: the registry's `Entry`) by id, looked up by hash as
/// before, and their ids in order.
pub(super) struct Live<V> {
    by_id: HashMap<String, V>,
    order: BTreeSet<String>,
}

impl<V> Default for Live<V> {
    fn default() -> Self {
        Live {
            by_id: HashMap::new(),
            order: BTreeSet::new(),
        }
    }
}

impl<V> Deref for Live<V> {
    type Target = HashMap<String, V>;
    fn deref(&self) -> &Self::Target {
        &self.by_id
    }
}

impl<V> Live<V> {
    /// Enters (or replaces) `id`'s entry.
    pub(super) fn insert(&mut self, id: String, entry: V) -> Option<V> {
        if !self.by_id.contains_key(&id) {
            self.order.insert(id.clone());
        }
        self.by_id.insert(id, entry)
    }

    /// Takes `id`'s entry out.
    pub(super) fn remove(&mut self, id: &str) -> Option<V> {
        let entry = self.by_id.remove(id)?;
        self.order.remove(id);
        Some(entry)
    }

    /// `id`'s entry, to change it.
    pub(super) fn get_mut(&mut self, id: &str) -> Option<&mut V> {
        self.by_id.get_mut(id)
    }

    /// Gives back the memory the map grew for sessions no longer live.
    pub(super) fn shrink_to_fit(&mut self) {
        self.by_id.shrink_to_fit();
    }

    /// The entries whose id comes after `after` (from the first when `None`), in id
    /// order, at most `limit`: a seek and `limit` steps.
    pub(super) fn page<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> impl Iterator<Item = &'a V> + 'a {
        let from = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        self.order
            .range::<str, _>((from, Bound::Unbounded))
            .take(limit)
            .filter_map(|id| self.by_id.get(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(live: &Live<u32>, after: Option<&str>, limit: usize) -> Vec<u32> {
        live.page(after, limit).copied().collect()
    }

    /// Issue 52: a page of live sessions is in id order after `after`, at most `limit`,
    /// and follows inserts, replacements and removals.
    #[test]
    fn a_page_of_live_sessions_is_in_id_order_after_an_id() {
        let mut live: Live<u32> = Live::default();
        for n in [5u32, 1, 9, 3, 7] {
            assert!(live.insert(format!("s{n}"), n).is_none());
        }
        assert_eq!(ids(&live, None, 10), [1, 3, 5, 7, 9]);
        assert_eq!(ids(&live, None, 2), [1, 3]);
        assert_eq!(ids(&live, Some("s3"), 2), [5, 7]);
        assert_eq!(
            ids(&live, Some("s4"), 10),
            [5, 7, 9],
            "after an id not live"
        );
        assert_eq!(ids(&live, Some("s9"), 10), Vec::<u32>::new());
        assert_eq!(ids(&live, None, 0), Vec::<u32>::new());
        // A replaced entry keeps one place; a removed one leaves the order.
        assert_eq!(live.insert("s5".into(), 50), Some(5));
        assert_eq!(live.remove("s3"), Some(3));
        assert_eq!(live.remove("s3"), None);
        assert_eq!(ids(&live, None, 10), [1, 50, 7, 9]);
        assert_eq!(live.len(), 4);
        assert_eq!(live.order.len(), 4, "the order holds exactly the live ids");
        // Many sessions: a page is its own length, from anywhere.
        for n in 0..20_000u32 {
            live.insert(format!("m{n:05}"), n);
        }
        assert_eq!(ids(&live, Some("m12344"), 3), [12_345, 12_346, 12_347]);
    }
}
