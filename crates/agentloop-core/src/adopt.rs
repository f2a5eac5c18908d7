//! Failover (issue 18, S38): a node adopts the sessions of nodes that died. Every node
//! sharing a store beats in it; a node whose heartbeat is older than the lease timeout
//! is presumed dead, and each of its `Running` or `Interrupted` records is resumed by
//! the live node placement names for it ([`crate::placement`]), which claims the record
//! by compare-and-swap first (`session::load`), so two nodes that disagree about
//! membership for a moment still never both run it.
//!
//! This file holds the judgements as plain functions of what the store said (who is
//! live, what to adopt, whether a sweep is due) and the [`Sweeper`] that remembers what
//! it already swept. The runtime's sweep task reads the store and spawns the resumes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::lease::is_fresh;
use crate::placement;

/// Who is live and who is presumed dead, from the store's heartbeats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Live nodes (this one always among them), by name.
    pub live: Vec<String>,
    /// Nodes presumed dead, with their last heartbeat.
    pub dead: BTreeMap<String, u64>,
}

impl Membership {
    /// Judges `beats` (every instance's last heartbeat) at `now_ms`: fresh within
    /// `lease_timeout` is live. `me` is live whatever its last beat says (it is running
    /// this code).
    pub fn judge(beats: &[(String, u64)], me: &str, now_ms: u64, lease_timeout: Duration) -> Self {
        let mut live = BTreeSet::new();
        let mut dead = BTreeMap::new();
        live.insert(me.to_string());
        for (name, beat) in beats {
            if name == me {
                continue;
            }
            if is_fresh(*beat, now_ms, lease_timeout) {
                live.insert(name.clone());
            } else {
                dead.insert(name.clone(), *beat);
            }
        }
        Membership {
            live: live.into_iter().collect(),
            dead,
        }
    }

    /// Whether `owner` (a record's) is live. A record without an owner has none.
    pub fn is_live(&self, owner: Option<&str>) -> bool {
        owner.is_some_and(|o| self.live.binary_search_by(|n| n.as_str().cmp(o)).is_ok())
    }
}

/// Whether this node (`me`) should adopt a resumable record of `session` owned by
/// `owner`: its owner is not live, and placement over the live nodes names `me`.
pub fn should_adopt(m: &Membership, me: &str, session: &str, owner: Option<&str>) -> bool {
    owner != Some(me) && !m.is_live(owner) && placement::owner_of(&m.live, session) == Some(me)
}

/// Remembers what the last sweep saw, so a node lists the store's records only when
/// something changed: the live set, or a node newly presumed dead (or one that beat
/// again and died again). Every `every` ticks it sweeps anyway (a claim that failed
/// for a transient error is retried then).
#[derive(Debug)]
pub struct Sweeper {
    last: Option<Membership>,
    ticks: u32,
    every: u32,
}

impl Sweeper {
    /// A sweeper that sweeps at its first tick, and at least every `every` ticks.
    pub fn new(every: u32) -> Self {
        Sweeper {
            last: None,
            ticks: 0,
            every: every.max(1),
        }
    }

    /// Whether a sweep is due with membership `m`; remembers `m` when it is.
    pub fn due(&mut self, m: &Membership) -> bool {
        self.ticks += 1;
        let changed = self.last.as_ref() != Some(m);
        if changed || self.ticks >= self.every {
            self.ticks = 0;
            self.last = Some(m.clone());
            return true;
        }
        false
    }

    /// Forgets the last membership: the next tick sweeps (a sweep that failed).
    pub fn retry(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beats(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(n, b)| (n.to_string(), *b)).collect()
    }

    const LEASE: Duration = Duration::from_secs(3);

    #[test]
    fn fresh_beats_are_live_and_stale_ones_dead_and_i_am_live() {
        let m = Membership::judge(
            &beats(&[("a", 10_000), ("b", 6_000), ("me", 1)]),
            "me",
            10_500,
            LEASE,
        );
        assert_eq!(m.live, vec!["a".to_string(), "me".to_string()]);
        assert_eq!(m.dead.get("b"), Some(&6_000));
        assert!(m.is_live(Some("a")) && !m.is_live(Some("b")) && !m.is_live(None));
    }

    #[test]
    fn a_dead_nodes_sessions_are_split_among_the_live_by_placement() {
        let m = Membership::judge(
            &beats(&[("a", 10_000), ("b", 10_000), ("c", 1_000)]),
            "a",
            10_000,
            LEASE,
        );
        let (mut a, mut b) = (0, 0);
        for i in 0..300 {
            let s = format!("s{i}");
            let by_a = should_adopt(&m, "a", &s, Some("c"));
            let mb = Membership::judge(
                &beats(&[("a", 10_000), ("b", 10_000), ("c", 1_000)]),
                "b",
                10_000,
                LEASE,
            );
            let by_b = should_adopt(&mb, "b", &s, Some("c"));
            assert!(by_a != by_b, "{s}: exactly one live node adopts it");
            a += usize::from(by_a);
            b += usize::from(by_b);
            // A live owner's sessions stay where they are, whatever placement says.
            assert!(!should_adopt(&m, "a", &s, Some("b")));
            assert!(!should_adopt(&m, "a", &s, Some("a")));
        }
        assert!(a > 90 && b > 90, "{a} / {b}");
    }

    #[test]
    fn sweeps_only_when_membership_changes_or_the_period_is_up() {
        let mut s = Sweeper::new(5);
        let m1 = Membership::judge(&beats(&[("a", 100)]), "me", 100, LEASE);
        assert!(s.due(&m1), "the first tick sweeps");
        assert!(!s.due(&m1));
        let m2 = Membership::judge(&beats(&[("a", 100)]), "me", 10_000, LEASE);
        assert!(s.due(&m2), "a died");
        assert!(!s.due(&m2) && !s.due(&m2) && !s.due(&m2));
        assert!(!s.due(&m2));
        assert!(s.due(&m2), "the fifth tick sweeps anyway");
        s.retry();
        assert!(s.due(&m2), "after a failed sweep");
    }
}
