//! Who holds the connection slots (issue 52, S34a: per-peer fairness). A peer is a
//! client address: an IPv4 address, or an IPv6 /64 (one host's usual allocation, so a
//! host cannot take more by rotating addresses inside it). The registry admits a
//! connection when the server holds fewer than `max_connections` and its peer fewer than
//! `max_per_peer`. At the cap, a new connection from a peer that holds fewer than the
//! peer holding the most (by two or more) takes the place of one of that peer's
//! connections: an idle one (no request in flight: a slowloris, a kept-alive socket)
//! when there is one, else its oldest, which is closed at once. So a peer may use every
//! slot while nobody else wants one, but when others wait it keeps no more than an
//! equal share: a slowloris that reconnects as soon as its sockets close cannot keep a
//! well-behaved client out.
//!
//! This file only counts and chooses; [`super::conn::drive`] closes what it evicts.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use super::conn::Conn;

/// The address a peer is known by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PeerKey {
    V4([u8; 4]),
    /// The first 64 bits.
    V6([u8; 8]),
}

impl From<IpAddr> for PeerKey {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => PeerKey::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => PeerKey::V4(v4.octets()),
                None => {
                    let o = v6.octets();
                    PeerKey::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
                }
            },
        }
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The server holds `max_connections`, and no peer holds more than this one's share.
    Full,
    /// This peer holds `max_per_peer` already.
    PeerFull,
}

/// The connection slots and who holds them.
#[derive(Debug)]
pub(crate) struct Peers {
    max_total: usize,
    max_per_peer: usize,
    inner: parking_lot::Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    total: usize,
    next_id: u64,
    /// Each peer's connections, oldest first.
    by_peer: HashMap<PeerKey, BTreeMap<u64, Arc<Conn>>>,
}

/// A connection's slot, given back on drop (unless it was evicted: then its place was
/// given to another already).
#[derive(Debug)]
pub(crate) struct Ticket {
    peers: Arc<Peers>,
    key: PeerKey,
    id: u64,
    /// Whether admitting it evicted another peer's connection.
    pub(crate) evicted_another: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self.peers.inner.lock();
        let Some(conns) = inner.by_peer.get_mut(&self.key) else {
            return;
        };
        if conns.remove(&self.id).is_none() {
            return;
        }
        if conns.is_empty() {
            inner.by_peer.remove(&self.key);
        }
        inner.total -= 1;
    }
}

impl Peers {
    /// At most `max_total` connections, `max_per_peer` of them from one peer.
    pub(crate) fn new(max_total: usize, max_per_peer: usize) -> Arc<Self> {
        Arc::new(Peers {
            max_total: max_total.max(1),
            max_per_peer: max_per_peer.max(1),
            inner: parking_lot::Mutex::new(Inner::default()),
        })
    }

    /// Admits `conn` from `ip`, evicting another peer's connection at the cap when that
    /// peer holds more than its share.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr, conn: Arc<Conn>) -> Result<Ticket, Refused> {
        let key = PeerKey::from(ip);
        let mut inner = self.inner.lock();
        let held = inner.by_peer.get(&key).map_or(0, BTreeMap::len);
        if held >= self.max_per_peer {
            // Without a bound of its own, the peer simply holds every slot.
            return Err(match self.max_per_peer < self.max_total {
                true => Refused::PeerFull,
                false => Refused::Full,
            });
        }
        let mut evicted_another = false;
        if inner.total >= self.max_total {
            // The peer holding the most; it must hold at least two more than this one,
            // or taking one of its places would not make things fairer.
            let top = inner
                .by_peer
                .iter()
                .map(|(k, c)| (*k, c.len()))
                .max_by_key(|(_, n)| *n);
            let Some((victim_key, most)) = top.filter(|(_, n)| *n >= held + 2) else {
                return Err(Refused::Full);
            };
            let Some(conns) = inner.by_peer.get_mut(&victim_key) else {
                return Err(Refused::Full);
            };
            let victim = conns
                .iter()
                .find(|(_, c)| !c.busy())
                .or_else(|| conns.iter().next())
                .map(|(id, _)| *id);
            let Some(victim) = victim.and_then(|id| conns.remove(&id)) else {
                return Err(Refused::Full);
            };
            if most == 1 {
                inner.by_peer.remove(&victim_key);
            }
            victim.evict.notify_one();
            inner.total -= 1;
            evicted_another = true;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.by_peer.entry(key).or_default().insert(id, conn);
        inner.total += 1;
        Ok(Ticket {
            peers: self.clone(),
            key,
            id,
            evicted_another,
        })
    }

    /// Connections held now (for tests).
    #[cfg(test)]
    fn total(&self) -> usize {
        self.inner.lock().total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::conn::Clock;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn a_peer_over_its_share_gives_a_place_to_another_at_the_cap() {
        let peers = Peers::new(4, 4);
        let clock = Clock::new();
        let hog: Vec<_> = (0..4)
            .map(|_| {
                let c = Conn::new(clock);
                (peers.admit(ip("10.0.0.1"), c.clone()).expect("room"), c)
            })
            .collect();
        assert_eq!(peers.total(), 4);
        // The hog cannot take a fifth (it holds every slot; no bound of its own).
        assert_eq!(
            peers.admit(ip("10.0.0.1"), Conn::new(clock)).unwrap_err(),
            Refused::Full
        );
        // Another peer takes the place of the hog's oldest idle connection.
        let other = peers
            .admit(ip("10.0.0.2"), Conn::new(clock))
            .expect("fair share");
        assert!(other.evicted_another);
        assert_eq!(peers.total(), 4);
        // The evicted one was told, and its ticket's drop frees nothing twice.
        let (ticket, conn) = &hog[0];
        let told = tokio::time::timeout(std::time::Duration::from_secs(1), conn.evict.notified())
            .await
            .is_ok();
        assert!(told, "the victim was not told");
        let _ = ticket;
        drop(hog);
        assert_eq!(peers.total(), 1);
        drop(other);
        assert_eq!(peers.total(), 0);
    }

    #[test]
    fn equal_shares_refuse_at_the_cap() {
        let peers = Peers::new(2, 2);
        let clock = Clock::new();
        let _a = peers.admit(ip("10.0.0.1"), Conn::new(clock)).unwrap();
        let _b = peers.admit(ip("10.0.0.2"), Conn::new(clock)).unwrap();
        assert_eq!(
            peers.admit(ip("10.0.0.3"), Conn::new(clock)).unwrap_err(),
            Refused::Full
        );
    }

    #[test]
    fn a_peer_bound_refuses_its_next_connection_while_others_get_in() {
        let peers = Peers::new(8, 2);
        let clock = Clock::new();
        let _a = peers.admit(ip("10.0.0.1"), Conn::new(clock)).unwrap();
        let _b = peers.admit(ip("10.0.0.1"), Conn::new(clock)).unwrap();
        assert_eq!(
            peers.admit(ip("10.0.0.1"), Conn::new(clock)).unwrap_err(),
            Refused::PeerFull
        );
        assert!(peers.admit(ip("10.0.0.2"), Conn::new(clock)).is_ok());
    }

    #[test]
    fn ipv6_peers_are_their_64_prefix() {
        assert_eq!(
            PeerKey::from(ip("2001:db8::1")),
            PeerKey::from(ip("2001:db8::ffff:2"))
        );
        assert_ne!(
            PeerKey::from(ip("2001:db8:0:1::1")),
            PeerKey::from(ip("2001:db8::1"))
        );
        assert_eq!(
            PeerKey::from(ip("::ffff:10.0.0.1")),
            PeerKey::from(ip("10.0.0.1"))
        );
    }
}
