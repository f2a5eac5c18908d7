//! Placement (issue 18, S36): which live node should own a session, by rendezvous
//! (highest random weight) hashing. Every node computes it alone from the same list of
//! live nodes, so they agree without talking; when a node leaves, only its sessions
//! move, and when one joins, only the sessions it now wins. Placement only proposes:
//! the lease in the store decides who owns a session (a claim by compare-and-swap).
//!
//! The hash is FNV-1a over `node 0x00 session`, finished by SplitMix64's mixer, so it is
//! the same in every process, build and platform (std's hasher is not).

/// The weight of `node` for `session`.
pub fn weight(node: &str, session: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node
        .as_bytes()
        .iter()
        .chain(&[0u8])
        .chain(session.as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // SplitMix64's finalizer: FNV's low bits alone are poorly mixed.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The node among `nodes` that should own `session` (ties broken by name), or `None`
/// when there is no node.
pub fn owner_of<'a, S: AsRef<str>>(nodes: &'a [S], session: &str) -> Option<&'a str> {
    nodes.iter().map(AsRef::as_ref).max_by(|a, b| {
        weight(a, session)
            .cmp(&weight(b, session))
            .then_with(|| b.cmp(a))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_same_answer_whatever_the_order_of_the_nodes() {
        let a = nodes(&["a", "b", "c"]);
        let b = nodes(&["c", "a", "b"]);
        for i in 0..500 {
            let s = format!("s{i}");
            assert_eq!(owner_of(&a, &s), owner_of(&b, &s));
        }
        assert_eq!(owner_of::<String>(&[], "x"), None);
    }

    #[test]
    fn sessions_spread_over_the_nodes() {
        let all = nodes(&["node-1", "node-2", "node-3"]);
        let mut counts = [0usize; 3];
        for i in 0..3000 {
            let owner = owner_of(&all, &format!("session-{i}")).unwrap();
            counts[all.iter().position(|n| n == owner).unwrap()] += 1;
        }
        for c in counts {
            assert!((800..=1200).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn only_the_sessions_of_a_node_that_leaves_move() {
        let before = nodes(&["a", "b", "c"]);
        let after = nodes(&["a", "c"]);
        let mut moved = 0;
        for i in 0..2000 {
            let s = format!("s{i}");
            let was = owner_of(&before, &s).unwrap();
            let now = owner_of(&after, &s).unwrap();
            if was != "b" {
                assert_eq!(was, now, "{s} moved though its node stayed");
            } else {
                moved += 1;
            }
        }
        assert!(moved > 400, "b owned {moved} of 2000");
    }

    #[test]
    fn weights_are_stable_across_builds() {
        // Pinned: a change here would move sessions between nodes of mixed versions.
        assert_eq!(weight("node-1", "session-1"), 14_485_266_247_603_439_679);
        assert_ne!(weight("a", "s"), weight("b", "s"));
    }
}
