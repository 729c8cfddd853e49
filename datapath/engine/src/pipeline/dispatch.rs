//! Where frames for this sled's guests go: inbound by (VNI, guest MAC)
//! ([`MacIndex`]), same-sled delivery by (VNI, guest IP) ([`LocalDest`]), to a port
//! of this engine or of another worker's ([`Owner`]).

use crate::ids::PortId;
use wire::MacAddr;

/// Who holds a port of this sled: this engine, or another worker's engine. Every
/// worker runs its own engine over its own ports, and learns where the others' ports
/// are (`Engine::set_sibling_port`) so that traffic to them is handed over to that
/// worker instead of looping through the underlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    Port(PortId),
    Sibling(u16),
}

/// A guest address on this sled: where VPC-internal traffic to it is delivered
/// without encapsulation.
#[derive(Clone, Copy, Debug)]
pub(super) struct LocalDest {
    pub(super) owner: Owner,
    /// The guest's MAC (what a frame handed to a sibling worker is addressed to).
    pub(super) mac: MacAddr,
    pub(super) mtu: u16,
}

/// Inbound dispatch, (VNI, guest MAC) -> owner: a sorted array of packed keys, searched
/// by bisection. Only our own ports are keys (the network cannot add any), so no keyed
/// hash is needed, and a sled has tens of ports: a few compares, where std's SipHash
/// cost ~250 instructions per inbound packet.
#[derive(Debug, Default)]
pub(super) struct MacIndex(Vec<(u128, Owner)>);

impl MacIndex {
    fn key(vni: u32, mac: MacAddr) -> u128 {
        let m = mac.0;
        let mac48 = u64::from_be_bytes([0, 0, m[0], m[1], m[2], m[3], m[4], m[5]]);
        u128::from(vni) << 48 | u128::from(mac48)
    }

    #[inline]
    pub(super) fn get(&self, vni: u32, mac: MacAddr) -> Option<Owner> {
        let k = Self::key(vni, mac);
        let i = self.0.binary_search_by_key(&k, |e| e.0).ok()?;
        self.0.get(i).map(|e| e.1)
    }

    /// Adds or replaces the owner of (vni, mac).
    pub(super) fn insert(&mut self, vni: u32, mac: MacAddr, owner: Owner) {
        let k = Self::key(vni, mac);
        match self.0.binary_search_by_key(&k, |e| e.0) {
            Ok(i) => self.0[i].1 = owner,
            Err(i) => self.0.insert(i, (k, owner)),
        }
    }

    pub(super) fn remove(&mut self, vni: u32, mac: MacAddr) {
        let k = Self::key(vni, mac);
        if let Ok(i) = self.0.binary_search_by_key(&k, |e| e.0) {
            self.0.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_index_finds_exactly_its_keys() {
        let mac = |b: u8| MacAddr([2, 0, 0, 0, 0, b]);
        let mut ix = MacIndex::default();
        // Inserted out of order, with one MAC in two VNIs.
        for (vni, b, id) in [
            (7, 9, 0),
            (7, 1, 1),
            (1 << 23, 1, 2),
            (7, 5, 3),
            (0, 0xff, 4),
        ] {
            ix.insert(vni, mac(b), Owner::Port(PortId(id)));
        }
        assert_eq!(ix.get(7, mac(1)), Some(Owner::Port(PortId(1))));
        assert_eq!(ix.get(1 << 23, mac(1)), Some(Owner::Port(PortId(2))));
        assert_eq!(ix.get(7, mac(5)), Some(Owner::Port(PortId(3))));
        assert_eq!(ix.get(0, mac(0xff)), Some(Owner::Port(PortId(4))));
        assert_eq!(ix.get(8, mac(1)), None);
        assert_eq!(ix.get(7, mac(2)), None);
        // The VNI and the MAC do not overlap in the packed key.
        assert_eq!(ix.get(7 << 8, MacAddr([0; 6])), None);
        ix.insert(7, mac(5), Owner::Sibling(9));
        assert_eq!(ix.get(7, mac(5)), Some(Owner::Sibling(9)));
        ix.remove(7, mac(1));
        ix.remove(7, mac(1));
        assert_eq!(ix.get(7, mac(1)), None);
        assert_eq!(ix.get(1 << 23, mac(1)), Some(Owner::Port(PortId(2))));
        assert_eq!(ix.0.len(), 4);
        assert!(ix.0.windows(2).all(|w| w[0].0 < w[1].0));
        // Many ports.
        for b in 10..60u8 {
            ix.insert(u32::from(b % 3), mac(b), Owner::Port(PortId(u32::from(b))));
        }
        assert_eq!(ix.0.len(), 54);
        for b in 10..60u8 {
            assert_eq!(
                ix.get(u32::from(b % 3), mac(b)),
                Some(Owner::Port(PortId(u32::from(b))))
            );
            assert_eq!(ix.get(u32::from(b % 3) + 3, mac(b)), None);
        }
        assert_eq!(ix.get(7, mac(5)), Some(Owner::Sibling(9)));
    }
}
