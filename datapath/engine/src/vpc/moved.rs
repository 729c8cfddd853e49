//! Guests in the middle of a move between sleds (docs/operating.md "Moving a
//! port"), for a grace period after it.
//!
//! A guest's port is deleted on the old sled and made on the new one, but the
//! other sleds learn of the move only when their V2P mappings change (the fleet's
//! store, or `set-v2p` on each), and frames already on their way still arrive at
//! the old sled. For [`MOVE_GRACE_NS`] after the delete the old sled relays them
//! to the new one ([`Departures`]), rather than dropping them. The new sled would
//! refuse them as they are: their outer source is the old sled, not the sled V2P
//! names for their inner source. So the imported port admits, for the same grace
//! period, frames relayed by the sled it came from ([`Arrival`]).
//!
//! The old sled relays only frames it would itself have accepted (their sender
//! checked against its V2P), never an External one, only for guests it hosted,
//! only to the sled the operator named, and only for the grace period. The new
//! sled cannot check what the old sled checked, so it bounds what a relay can
//! do: it admits relays only from the one sled the port came from, only into
//! that port, only with an inner source that is a mapped guest of the VPC with
//! its MAC, and only for a connection the port already tracks (a relay opens
//! none). A forger of the old sled's address gets no more than the moved
//! connections' next segments, for 10 s.

use std::collections::HashMap;
use std::net::Ipv6Addr;
use wire::MacAddr;

/// How long the old sled relays a moved guest's frames and the new sled admits
/// them: long enough for every sled's V2P to follow the move (the fleet's store
/// reaches every sled within a second; an operator's `set-v2p` on each sled takes
/// longer), short enough that a relay does not outlive the move it serves.
pub const MOVE_GRACE_NS: u64 = 10_000_000_000;

/// Guests that left this sled, by (VNI, guest MAC): where to and until when their
/// frames are relayed.
#[derive(Clone, Debug, Default)]
pub struct Departures {
    by_mac: HashMap<(u32, MacAddr), Departure>,
}

/// Where a guest went, and until when its frames follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Departure {
    pub to: Ipv6Addr,
    pub until: u64,
}

impl Departures {
    /// Relays the frames for guest `mac` of VPC `vni` to sled `to` for the grace
    /// period from `now` on (a second move replaces the first).
    pub fn insert(&mut self, vni: u32, mac: MacAddr, to: Ipv6Addr, now: u64) {
        let until = now.saturating_add(MOVE_GRACE_NS);
        self.by_mac.insert((vni, mac), Departure { to, until });
    }

    /// Stops relaying for the guest (it has a port here again).
    pub fn remove(&mut self, vni: u32, mac: MacAddr) {
        self.by_mac.remove(&(vni, mac));
    }

    /// The sled to relay a frame for guest `mac` of VPC `vni` to, at `now`.
    pub fn relay_to(&self, vni: u32, mac: MacAddr, now: u64) -> Option<Ipv6Addr> {
        self.by_mac
            .get(&(vni, mac))
            .filter(|d| now < d.until)
            .map(|d| d.to)
    }

    /// Forgets the departures whose grace period is over.
    pub fn expire(&mut self, now: u64) {
        self.by_mac.retain(|_, d| now < d.until);
    }

    /// Departures still in their grace period (as of the last [`Self::expire`]).
    pub fn len(&self) -> usize {
        self.by_mac.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_mac.is_empty()
    }
}

/// Where an imported port came from: the sled whose relayed frames it admits,
/// until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    pub from: Ipv6Addr,
    pub until: u64,
}

impl Arrival {
    /// The arrival of a port imported at `now` from sled `from`.
    pub fn new(from: Ipv6Addr, now: u64) -> Arrival {
        Arrival {
            from,
            until: now.saturating_add(MOVE_GRACE_NS),
        }
    }

    /// Whether a frame from outer source `sled` at `now` is relayed by the sled the
    /// port came from, within the grace period.
    #[inline]
    pub fn relays(&self, sled: Ipv6Addr, now: u64) -> bool {
        sled == self.from && now < self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 3);

    fn mac(last: u8) -> MacAddr {
        MacAddr([0xa8, 0x40, 0x25, 0xff, 0, last])
    }

    #[test]
    fn a_departure_relays_for_the_grace_period_only() {
        let mut d = Departures::default();
        d.insert(7, mac(1), C, 1_000);
        assert_eq!(d.relay_to(7, mac(1), 1_000), Some(C));
        assert_eq!(d.relay_to(7, mac(1), 1_000 + MOVE_GRACE_NS - 1), Some(C));
        assert_eq!(d.relay_to(7, mac(1), 1_000 + MOVE_GRACE_NS), None);
        // Another VPC's guest of the same MAC, another guest: not relayed.
        assert_eq!(d.relay_to(8, mac(1), 1_000), None);
        assert_eq!(d.relay_to(7, mac(2), 1_000), None);
        d.expire(1_000 + MOVE_GRACE_NS - 1);
        assert_eq!(d.len(), 1);
        d.expire(1_000 + MOVE_GRACE_NS);
        assert!(d.is_empty());
    }

    #[test]
    fn a_guest_back_here_is_no_longer_relayed() {
        let mut d = Departures::default();
        d.insert(7, mac(1), C, 0);
        d.remove(7, mac(1));
        assert_eq!(d.relay_to(7, mac(1), 1), None);
    }

    #[test]
    fn an_arrival_admits_its_sled_within_the_grace_period() {
        let a = Arrival::new(C, 5);
        assert!(a.relays(C, 5));
        assert!(!a.relays(C, 5 + MOVE_GRACE_NS));
        assert!(!a.relays(Ipv6Addr::LOCALHOST, 6));
        // A clock at its end does not wrap the grace period into the past.
        assert!(Arrival::new(C, u64::MAX - 1).relays(C, u64::MAX - 1));
    }
}
