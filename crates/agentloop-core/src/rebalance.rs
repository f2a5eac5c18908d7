//! Rebalancing (issue 18, S38): when placement changes because a node joins, the
//! sessions it now wins move to it by planned migration (`cluster/migrate.rs`): each
//! stops at its next safe point, its lease moves by compare-and-swap, the new node
//! resumes it, and pushes meanwhile queue and follow in order. Opt-in
//! (`agentloop::RuntimeBuilder::rebalance`, `serve --rebalance`): a move costs a safe
//! point and a resume, which some deployments prefer to take only at deploys.
//!
//! Only the node that runs a session moves it, and only once the live set has been
//! the same for [`Rebalance::settle`]: two nodes whose views differ for a moment (a
//! beat near its expiry) do not send sessions back and forth. This file holds the
//! judgements as plain functions of what the store and the transport said; the
//! runtime's sweep task reads them and performs the moves.

use std::time::Duration;

use crate::adopt::Membership;

/// How a node rebalances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rebalance {
    /// How long the live set must stay the same before sessions move.
    pub settle: Duration,
    /// At most this many moves at once.
    pub concurrent: usize,
    /// How long a move waits for the session's next safe point before it escalates to
    /// an immediate stop (the cut turn resumes on the new node, S17).
    pub safe_point_timeout: Duration,
}

impl Default for Rebalance {
    /// Settle 6 s (two lease timeouts at the cluster defaults), 4 moves at once, 5 s
    /// to a safe point.
    fn default() -> Self {
        Rebalance {
            settle: Duration::from_secs(6),
            concurrent: 4,
            safe_point_timeout: Duration::from_secs(5),
        }
    }
}

/// Remembers the live set and since when it holds, and whether this set was
/// rebalanced already; every `every` due checks it rebalances anyway (a session
/// spawned here that placement gives another node, a move that failed).
#[derive(Debug)]
pub struct Rebalancer {
    settle_ms: u64,
    live: Vec<String>,
    since_ms: u64,
    done: bool,
    checks: u32,
    every: u32,
}

impl Rebalancer {
    /// A rebalancer that waits `settle` after each change of the live set, and
    /// rebalances a settled set again every `every` checks.
    pub fn new(settle: Duration, every: u32) -> Self {
        Rebalancer {
            settle_ms: settle.as_millis() as u64,
            live: Vec::new(),
            since_ms: 0,
            done: false,
            checks: 0,
            every: every.max(1),
        }
    }

    /// Whether a rebalance round is due at `now_ms` with membership `m`.
    pub fn due(&mut self, m: &Membership, now_ms: u64) -> bool {
        if m.live != self.live {
            self.live = m.live.clone();
            self.since_ms = now_ms;
            self.done = false;
            self.checks = 0;
            return false;
        }
        if now_ms.saturating_sub(self.since_ms) < self.settle_ms {
            return false;
        }
        self.checks += 1;
        if !self.done || self.checks >= self.every {
            self.done = true;
            self.checks = 0;
            return true;
        }
        false
    }
}

/// The moves node `me` should make: each session of `mine` (the sessions it runs,
/// with their kind and version) whose placement over the live nodes that can run it
/// (S40) names another node that `reachable` says can be asked now, in the order given.
pub fn moves(
    m: &Membership,
    me: &str,
    mine: &[(String, String, u32)],
    reachable: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    mine.iter()
        .filter_map(|(s, kind, version)| {
            let to = m.placed(crate::adopt::Placed {
                session: s,
                kind,
                version: *version,
            })?;
            (to != me && reachable(to)).then(|| (s.clone(), to.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement;

    fn live(names: &[&str]) -> Membership {
        Membership {
            live: names.iter().map(|s| s.to_string()).collect(),
            dead: Default::default(),
            runs: Default::default(),
        }
    }

    #[test]
    fn a_round_is_due_once_the_live_set_has_settled_and_again_after_every_checks() {
        let mut r = Rebalancer::new(Duration::from_millis(1000), 3);
        let two = live(&["a", "b"]);
        assert!(!r.due(&two, 0), "a new set");
        assert!(!r.due(&two, 999), "not settled");
        assert!(r.due(&two, 1000), "settled: once");
        assert!(!r.due(&two, 1100));
        assert!(!r.due(&two, 1200));
        assert!(r.due(&two, 1300), "again after `every` checks");
        // A join resets the wait.
        let three = live(&["a", "b", "c"]);
        assert!(!r.due(&three, 1400));
        assert!(!r.due(&three, 2399));
        assert!(r.due(&three, 2400));
        // A flap (a beat near expiry) resets it too: nothing moves while views differ.
        assert!(!r.due(&two, 2500));
        assert!(!r.due(&three, 2600));
        assert!(!r.due(&three, 3599));
        assert!(r.due(&three, 3600));
    }

    #[test]
    fn only_sessions_placement_gives_a_reachable_other_node_move() {
        let m = live(&["a", "b", "c"]);
        let mine: Vec<(String, String, u32)> = (0..60)
            .map(|i| (format!("s{i}"), "k".to_string(), 1))
            .collect();
        let all = moves(&m, "a", &mine, |_| true);
        assert!(!all.is_empty());
        for (s, to) in &all {
            assert_eq!(placement::owner_of(&m.live, s), Some(to.as_str()));
            assert_ne!(to, "a");
        }
        let stay = mine
            .iter()
            .filter(|(s, _, _)| placement::owner_of(&m.live, s) == Some("a"))
            .count();
        assert_eq!(all.len() + stay, mine.len(), "the rest stay");
        // An unreachable target is not moved to.
        let to_b = moves(&m, "a", &mine, |n| n == "b");
        assert!(to_b.iter().all(|(_, to)| to == "b"));
        assert_eq!(to_b.len(), all.iter().filter(|(_, to)| to == "b").count());
        // Alone, nothing moves.
        assert!(moves(&live(&["a"]), "a", &mine, |_| true).is_empty());
    }

    /// S40: a session moves only to a node that can run its version; one no other
    /// node runs stays.
    #[test]
    fn s40_sessions_move_only_to_nodes_that_run_their_version() {
        let runs = |vs: &[u32]| {
            std::collections::BTreeMap::from([("k".to_string(), vs.iter().copied().collect())])
        };
        let mut m = live(&["a", "b", "c"]);
        m.runs.insert("b".into(), runs(&[1]));
        m.runs.insert("c".into(), runs(&[1, 2]));
        let mine: Vec<(String, String, u32)> = (0..60)
            .map(|i| (format!("s{i}"), "k".to_string(), 2))
            .collect();
        let moved = moves(&m, "a", &mine, |_| true);
        assert!(!moved.is_empty());
        assert!(moved.iter().all(|(_, to)| to == "c"), "{moved:?}");
        m.runs.insert("c".into(), runs(&[1]));
        assert!(
            moves(&m, "a", &mine, |_| true).is_empty(),
            "a runs it, nobody else does"
        );
    }
}
