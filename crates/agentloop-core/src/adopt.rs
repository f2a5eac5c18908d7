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

/// What one node can run (S40): agent kind → the versions whose records it resumes
/// (registered, or migratable to its newest).
pub type Runs = BTreeMap<String, BTreeSet<u32>>;

/// A session as placement and adoption see it (S40): its id, its agent kind and the
/// version that wrote its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed<'a> {
    /// The session id.
    pub session: &'a str,
    /// Its agent kind.
    pub kind: &'a str,
    /// The version of the kind its record was written by.
    pub version: u32,
}

/// Who is live and who is presumed dead, from the store's heartbeats, and what each
/// node said it can run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Live nodes (this one always among them), by name.
    pub live: Vec<String>,
    /// Nodes presumed dead, with their last heartbeat.
    pub dead: BTreeMap<String, u64>,
    /// What the nodes that advertised it can run (S40). A node absent here advertised
    /// nothing (an older build, or a store that keeps no advertisements) and is
    /// assumed to run every version.
    pub runs: BTreeMap<String, Runs>,
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
            runs: BTreeMap::new(),
        }
    }

    /// With what the nodes advertised they can run (S40).
    pub fn with_runs(mut self, runs: BTreeMap<String, Runs>) -> Self {
        self.runs = runs;
        self
    }

    /// Whether `node` can run a record of `kind` written by `version` (S40): what it
    /// advertised says so, or it advertised nothing.
    pub fn can_run(&self, node: &str, kind: &str, version: u32) -> bool {
        match self.runs.get(node) {
            None => true,
            Some(runs) => runs.get(kind).is_some_and(|v| v.contains(&version)),
        }
    }

    /// The live node placement names for `s` among those that can run it (S36, S40);
    /// `None` when no live node can.
    pub fn placed(&self, s: Placed<'_>) -> Option<&str> {
        // `placement::owner_of` over the able nodes (same weights, same tie-break).
        self.live
            .iter()
            .filter(|n| self.can_run(n, s.kind, s.version))
            .max_by(|a, b| {
                placement::weight(a, s.session)
                    .cmp(&placement::weight(b, s.session))
                    .then_with(|| b.cmp(a))
            })
            .map(String::as_str)
    }

    /// Whether `owner` (a record's) is live. A record without an owner has none.
    pub fn is_live(&self, owner: Option<&str>) -> bool {
        owner.is_some_and(|o| self.live.binary_search_by(|n| n.as_str().cmp(o)).is_ok())
    }
}

/// Whether this node (`me`) should adopt a resumable record `s` owned by `owner`: its
/// owner is not live, or is live but advertised it cannot run the record's version (a
/// node redeployed without it, S40); and placement over the live nodes that can run it
/// names `me`.
pub fn should_adopt(m: &Membership, me: &str, s: Placed<'_>, owner: Option<&str>) -> bool {
    let owner_runs_it =
        owner.is_some_and(|o| m.is_live(Some(o)) && m.can_run(o, s.kind, s.version));
    owner != Some(me) && !owner_runs_it && m.placed(s) == Some(me)
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

    fn placed(s: &str) -> Placed<'_> {
        Placed {
            session: s,
            kind: "k",
            version: 1,
        }
    }

    fn runs(v: &[(&str, &[u32])]) -> Runs {
        v.iter()
            .map(|(k, vs)| (k.to_string(), vs.iter().copied().collect()))
            .collect()
    }

    /// S40: a dead node's sessions go only to nodes that can run their version; a
    /// node that advertised nothing runs everything; a live owner that cannot run its
    /// record's version gives it up to one that can; a version nobody runs stays put.
    #[test]
    fn s40_sessions_are_placed_and_adopted_only_where_their_version_runs() {
        let all = &beats(&[("old", 10_000), ("new", 10_000), ("dead", 1_000)]);
        let judge = |me: &str| {
            Membership::judge(all, me, 10_000, LEASE).with_runs(BTreeMap::from([
                ("old".to_string(), runs(&[("k", &[1])])),
                ("new".to_string(), runs(&[("k", &[1, 2])])),
            ]))
        };
        for i in 0..200 {
            let id = format!("s{i}");
            let v2 = Placed {
                session: &id,
                kind: "k",
                version: 2,
            };
            assert_eq!(judge("old").placed(v2), Some("new"), "only `new` runs v2");
            assert!(!should_adopt(&judge("old"), "old", v2, Some("dead")));
            assert!(should_adopt(&judge("new"), "new", v2, Some("dead")));
            // v1 is spread over both.
            let v1 = Placed { version: 1, ..v2 };
            let by_old = should_adopt(&judge("old"), "old", v1, Some("dead"));
            let by_new = should_adopt(&judge("new"), "new", v1, Some("dead"));
            assert!(by_old != by_new, "{id}: exactly one adopts it");
            // `old` is live but cannot run its own v2 record: `new` takes it.
            assert!(should_adopt(&judge("new"), "new", v2, Some("old")));
            // A version no live node runs is adopted by none.
            let v3 = Placed { version: 3, ..v2 };
            assert_eq!(judge("new").placed(v3), None);
            assert!(!should_adopt(&judge("new"), "new", v3, Some("dead")));
            // A kind `old` does not advertise at all.
            let other = Placed { kind: "x", ..v1 };
            assert_eq!(judge("old").placed(other), None, "nobody advertised kind x");
            assert!(!judge("old").can_run("old", "x", 1));
        }
        // Without advertisements every live node runs everything (older builds), and
        // placement is the plain placement over the live nodes.
        let bare = Membership::judge(all, "old", 10_000, LEASE);
        assert!(bare.can_run("old", "k", 9) && bare.can_run("new", "x", 1));
        for i in 0..200 {
            let id = format!("s{i}");
            assert_eq!(
                bare.placed(placed(&id)),
                placement::owner_of(&bare.live, &id)
            );
        }
    }

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
            let by_a = should_adopt(&m, "a", placed(&s), Some("c"));
            let mb = Membership::judge(
                &beats(&[("a", 10_000), ("b", 10_000), ("c", 1_000)]),
                "b",
                10_000,
                LEASE,
            );
            let by_b = should_adopt(&mb, "b", placed(&s), Some("c"));
            assert!(by_a != by_b, "{s}: exactly one live node adopts it");
            a += usize::from(by_a);
            b += usize::from(by_b);
            // A live owner's sessions stay where they are, whatever placement says.
            assert!(!should_adopt(&m, "a", placed(&s), Some("b")));
            assert!(!should_adopt(&m, "a", placed(&s), Some("a")));
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
