//! Per-flow ECMP: the usable next hops toward one underlay destination
//! ([`NextHopSet`]) and which of them a flow leaves by ([`NextHopSet::pick`]).
//!
//! A sled with a link to each of two switches reaches another sled over a
//! multipath route: the daemon hands the engine every usable next hop of that
//! route, and each flow picks one by its flow hash, the same hash that sets the
//! outer UDP source port and flow label. The pick is rendezvous hashing (highest
//! random weight): each hop gets a score mixed from the flow hash and the hop's
//! identity, and the highest score wins. So a flow keeps its hop while the set is
//! stable (and across restarts: the hash is a fixed function of the flow), new
//! flows spread evenly, and a hop that leaves the set moves only its own flows
//! (the others keep their scores' winner); one that joins takes a fair share.

use super::config::NextHop;

/// The most next hops one destination is spread over: a sled has a link or two
/// per switch, and the kernel's multipath routes rarely carry more.
pub const MAX_NEXT_HOPS: usize = 8;

/// The usable next hops toward one underlay destination, at most
/// [`MAX_NEXT_HOPS`], without duplicates. Fixed-size and `Copy`: it lives in the
/// daemon's next-hop snapshot and is read when a flow is compiled, never
/// allocated per packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextHopSet {
    hops: [Option<NextHop>; MAX_NEXT_HOPS],
}

impl NextHopSet {
    /// Adds `hop`; false (and nothing added) when it is there already or the set
    /// is full.
    pub fn insert(&mut self, hop: NextHop) -> bool {
        if self.iter().any(|h| h == hop) {
            return false;
        }
        match self.hops.iter_mut().find(|h| h.is_none()) {
            Some(free) => {
                *free = Some(hop);
                true
            }
            None => false,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = NextHop> + '_ {
        self.hops.iter().flatten().copied()
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.hops.iter().all(Option::is_none)
    }

    /// The next hop the flow of hash `flow_hash` (`FlowKey::hash64`) leaves by;
    /// `None` when the set is empty.
    pub fn pick(&self, flow_hash: u64) -> Option<NextHop> {
        self.iter()
            .max_by_key(|h| (mix(flow_hash ^ hop_id(h)), h.ifindex, h.dst_mac))
    }
}

impl From<NextHop> for NextHopSet {
    fn from(hop: NextHop) -> Self {
        let mut s = NextHopSet::default();
        s.insert(hop);
        s
    }
}

impl FromIterator<NextHop> for NextHopSet {
    /// The first [`MAX_NEXT_HOPS`] distinct hops; the rest are left out.
    fn from_iter<I: IntoIterator<Item = NextHop>>(iter: I) -> Self {
        let mut s = NextHopSet::default();
        for h in iter {
            s.insert(h);
        }
        s
    }
}

/// A hop's identity for scoring: its link and the neighbour's MAC (what stays
/// the same across restarts of the daemon), mixed so that similar hops score
/// independently.
fn hop_id(h: &NextHop) -> u64 {
    let mut mac = [0u8; 8];
    mac[2..].copy_from_slice(&h.dst_mac.0);
    mix(u64::from_be_bytes(mac) ^ (u64::from(h.ifindex) << 48))
}

/// SplitMix64's finalizer: every input bit affects every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinery::flow::FlowKey;
    use std::net::{IpAddr, Ipv4Addr};
    use wire::MacAddr;

    fn hop(ifindex: u32, last: u8) -> NextHop {
        NextHop {
            ifindex,
            src_mac: MacAddr([2, 0, 0, 0, 1, ifindex as u8]),
            dst_mac: MacAddr([2, 0, 0, 0, 2, last]),
        }
    }

    /// The hashes of 1000 TCP flows between two guests (source ports vary), as
    /// the engine computes them.
    fn flow_hashes() -> Vec<u64> {
        (0..1000u16)
            .map(|i| {
                let key = FlowKey {
                    vni: 100,
                    src_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)),
                    dst_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 6)),
                    src_port: 40000 + i,
                    dst_port: 5201,
                    proto: 6,
                    icmp_type: 0,
                    icmp_code: 0,
                };
                key.hash64()
            })
            .collect()
    }

    #[test]
    fn a_set_holds_distinct_hops_up_to_its_size() {
        let mut s = NextHopSet::default();
        assert!(s.is_empty() && s.pick(7).is_none());
        assert!(s.insert(hop(2, 1)));
        assert!(!s.insert(hop(2, 1)), "no duplicates");
        for i in 1..MAX_NEXT_HOPS as u8 {
            assert!(s.insert(hop(3, i)));
        }
        assert!(!s.insert(hop(4, 9)), "full");
        assert_eq!(s.len(), MAX_NEXT_HOPS);
        assert_eq!(NextHopSet::from(hop(2, 1)).len(), 1);
    }

    /// 1000 flows over two hops: each carries 30-70% of them.
    #[test]
    fn flows_spread_over_two_hops() {
        let s: NextHopSet = [hop(2, 1), hop(3, 1)].into_iter().collect();
        let hashes = flow_hashes();
        let on_first = hashes
            .iter()
            .filter(|&&h| s.pick(h) == Some(hop(2, 1)))
            .count();
        assert!((300..=700).contains(&on_first), "{on_first} of 1000");
    }

    /// A flow's hop depends on the set's members only, not their order, and is
    /// the same every time it is asked.
    #[test]
    fn a_flow_keeps_its_hop() {
        let ab: NextHopSet = [hop(2, 1), hop(3, 1)].into_iter().collect();
        let ba: NextHopSet = [hop(3, 1), hop(2, 1)].into_iter().collect();
        for h in flow_hashes() {
            assert_eq!(ab.pick(h), ab.pick(h));
            assert_eq!(ab.pick(h), ba.pick(h));
        }
    }

    /// Taking a hop out moves exactly its flows (to the others, spread); putting
    /// it back moves exactly those flows back.
    #[test]
    fn removing_a_hop_moves_only_its_flows() {
        let three: NextHopSet = [hop(2, 1), hop(3, 1), hop(4, 1)].into_iter().collect();
        let two: NextHopSet = [hop(2, 1), hop(4, 1)].into_iter().collect();
        let (mut moved, mut to_2) = (0, 0);
        for h in flow_hashes() {
            let (before, after) = (three.pick(h).unwrap(), two.pick(h).unwrap());
            if before == hop(3, 1) {
                moved += 1;
                to_2 += usize::from(after == hop(2, 1));
            } else {
                assert_eq!(before, after, "a flow of a remaining hop moved");
            }
        }
        assert!(moved > 200, "{moved} flows were on the removed hop");
        assert!(
            (moved * 3 / 10..=moved * 7 / 10).contains(&to_2),
            "{to_2} of {moved} moved to one hop"
        );
    }
}
