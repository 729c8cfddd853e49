//! The overlay layer's tables: virtual-to-physical (V2P) mappings and boundary
//! services.
//!
//! V2P says which sled hosts a guest address of a VPC and which MAC the guest has:
//! the outer IPv6 destination and the inner destination MAC of every frame sent to
//! it. Boundary services is where traffic routed to the internet gateway goes: the
//! rack's switches, reached at the underlay addresses of the V2B table
//! ([`crate::vpc::v2b`]) in a VNI of their own.
//!
//! The same tables say who may send into a VPC ([`InboundTrust`]): a frame from the
//! underlay is delivered only if its outer source is the sled V2P names for its inner
//! source address in its VNI and its inner source MAC is the mapped guest's, or, for
//! traffic from outside the VPC (the Geneve External option), if its outer source is
//! a boundary-services endpoint. Otherwise any host that reaches a sled's underlay
//! address could inject frames into any VPC by naming a VNI and a guest MAC.

use crate::drop::DropReason;
use crate::ids::Vni;
use core::fmt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use wire::MacAddr;

/// Where a virtual address lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2pEntry {
    /// The underlay address of the sled hosting the guest.
    pub underlay: Ipv6Addr,
    /// The guest's MAC.
    pub mac: MacAddr,
}

/// One mapping in `dump_v2p`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct V2pDump {
    pub vni: Vni,
    pub ip: IpAddr,
    pub underlay: Ipv6Addr,
    pub mac: MacAddr,
}

/// Who may send the frames of an inbound flow, compiled into its flow-table entry
/// when the flow is first seen (from V2P or the boundary-services endpoints), so that
/// later frames cost a compare instead of a lookup. A V2P change bumps the epoch, so
/// no entry outlives the mapping it was compiled from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// A guest on another sled: the outer source must be `sled` and the inner source
    /// MAC `mac`.
    Sled { sled: Ipv6Addr, mac: MacAddr },
    /// Outside the VPC: an External frame from a boundary-services endpoint.
    Boundary,
    /// A guest of this sled, delivered without the underlay (nothing to check).
    Local,
}

impl fmt::Display for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sender::Sled { sled, mac } => write!(f, "sled {sled} mac {mac}"),
            Sender::Boundary => f.write_str("boundary services"),
            Sender::Local => f.write_str("this sled"),
        }
    }
}

/// What an underlay frame says about where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnderlaySource {
    /// Outer IPv6 source.
    pub sled: Ipv6Addr,
    /// The Geneve Oxide External option: from outside the VPC.
    pub external: bool,
    /// Inner source MAC.
    pub mac: MacAddr,
    /// Relayed by the sled the destination port moved here from, within the
    /// grace period (`vpc::moved`): admitted as if it came from the sender's own
    /// sled, for a connection the port already tracks (never an External frame).
    pub relayed: bool,
}

/// The sled's view of who may send what over the underlay (see the module doc).
/// Built per frame from borrowed tables, so it costs a few pointer stores.
#[derive(Clone, Copy, Debug)]
pub struct InboundTrust<'a> {
    pub v2p: &'a V2p,
    /// The boundary-services endpoints: every endpoint of the V2B table, sorted.
    pub boundary: &'a [Ipv6Addr],
    /// This sled's underlay address: nothing that claims it comes over the underlay.
    pub this_sled: &'a Ipv6Addr,
}

impl InboundTrust<'_> {
    /// The sender a flow from `src_ip` in VPC `vni` may have, if `from` is it (the
    /// first frame of the flow, checked against the tables).
    pub fn sender(
        &self,
        vni: Vni,
        src_ip: IpAddr,
        from: &UnderlaySource,
    ) -> Result<Sender, DropReason> {
        if from.external {
            return if self.is_boundary(from.sled) {
                Ok(Sender::Boundary)
            } else {
                Err(DropReason::UnderlaySrcMismatch)
            };
        }
        match self.v2p.get(vni, src_ip) {
            Some(v)
                if (v.underlay == from.sled || from.relayed)
                    && v.mac == from.mac
                    && v.underlay != *self.this_sled =>
            {
                Ok(Sender::Sled {
                    sled: v.underlay,
                    mac: v.mac,
                })
            }
            _ => Err(DropReason::UnderlaySrcMismatch),
        }
    }

    /// Whether `from` is admitted only because it is relayed (`vpc::moved`): the
    /// sender its tables give is not the sled it comes from.
    pub fn relay_only(&self, s: &Sender, from: &UnderlaySource) -> bool {
        from.relayed
            && !self.admits(
                s,
                &UnderlaySource {
                    relayed: false,
                    ..*from
                },
            )
    }

    /// Whether `from` is the sender compiled for a flow (a later frame of it).
    #[inline]
    pub fn admits(&self, s: &Sender, from: &UnderlaySource) -> bool {
        match s {
            Sender::Sled { sled, mac } => {
                !from.external && (from.sled == *sled || from.relayed) && from.mac == *mac
            }
            Sender::Boundary => from.external && self.is_boundary(from.sled),
            Sender::Local => false,
        }
    }

    /// Whether `addr` is a boundary-services endpoint: asked for every External
    /// frame. A rack has a few (its switches), which equality finds faster than
    /// ordering does (an `Ipv6Addr` compares for order octet by octet).
    #[inline]
    fn is_boundary(&self, addr: Ipv6Addr) -> bool {
        if self.boundary.len() <= 8 {
            self.boundary.contains(&addr)
        } else {
            self.is_boundary_searched(addr)
        }
    }

    /// [`Self::is_boundary`] of a list too long to walk: out of line, so that the
    /// walk above, inlined into every External frame's sender check, keeps few
    /// registers.
    #[cold]
    #[inline(never)]
    fn is_boundary_searched(&self, addr: Ipv6Addr) -> bool {
        self.boundary.binary_search(&addr).is_ok()
    }
}

/// Why a V2P mapping was refused or not found; each names the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum V2pError {
    #[error("V2P MAC {mac} for {ip} is not a unicast address")]
    MacNotUnicast { mac: MacAddr, ip: IpAddr },
    #[error("V2P underlay address {underlay} for {ip} is not a unicast address")]
    UnderlayNotUnicast { underlay: Ipv6Addr, ip: IpAddr },
    #[error("V2P virtual address {ip} is not a unicast address")]
    VirtualNotUnicast { ip: IpAddr },
    /// Nothing is mapped for this address in this VPC.
    #[error("no V2P mapping for {ip} in VNI {vni}")]
    NotFound { ip: IpAddr, vni: Vni },
}

/// The V2P table of the whole sled (all VPCs).
#[derive(Clone, Debug, Default)]
pub struct V2p {
    map: HashMap<(Vni, IpAddr), V2pEntry>,
}

impl V2p {
    /// Adds or replaces a mapping; returns the one it replaced.
    pub fn set(&mut self, vni: Vni, ip: IpAddr, e: V2pEntry) -> Result<Option<V2pEntry>, V2pError> {
        if !e.mac.is_unicast() {
            return Err(V2pError::MacNotUnicast { mac: e.mac, ip });
        }
        if e.underlay.is_unspecified() || e.underlay.is_multicast() {
            return Err(V2pError::UnderlayNotUnicast {
                underlay: e.underlay,
                ip,
            });
        }
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(V2pError::VirtualNotUnicast { ip });
        }
        Ok(self.map.insert((vni, ip), e))
    }

    pub fn clear(&mut self, vni: Vni, ip: IpAddr) -> Result<V2pEntry, V2pError> {
        self.map
            .remove(&(vni, ip))
            .ok_or(V2pError::NotFound { ip, vni })
    }

    pub fn get(&self, vni: Vni, ip: IpAddr) -> Option<&V2pEntry> {
        self.map.get(&(vni, ip))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// All mappings, ordered by VNI then address.
    pub fn dump(&self) -> Vec<V2pDump> {
        let mut v: Vec<V2pDump> = self
            .map
            .iter()
            .map(|(&(vni, ip), e)| V2pDump {
                vni,
                ip,
                underlay: e.underlay,
                mac: e.mac,
            })
            .collect();
        v.sort_by_key(|d| (d.vni, d.ip));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replace_clear_dump() {
        let mut t = V2p::default();
        let vni = Vni::new(10).unwrap();
        let ip: IpAddr = "172.30.0.6".parse().unwrap();
        let e = V2pEntry {
            underlay: "fd00:99::2".parse().unwrap(),
            mac: "a8:40:25:ff:00:02".parse().unwrap(),
        };
        assert_eq!(t.set(vni, ip, e).unwrap(), None);
        let moved = V2pEntry {
            underlay: "fd00:99::3".parse().unwrap(),
            ..e
        };
        assert_eq!(t.set(vni, ip, moved).unwrap(), Some(e));
        assert_eq!(t.get(vni, ip), Some(&moved));
        // Other VPCs do not see it.
        assert_eq!(t.get(Vni::new(11).unwrap(), ip), None);
        assert_eq!(t.dump()[0].underlay, moved.underlay);
        assert_eq!(t.clear(vni, ip).unwrap(), moved);
        let err = t.clear(vni, ip).unwrap_err().to_string();
        assert!(err.contains("172.30.0.6") && err.contains("10"), "{err}");
    }

    #[test]
    fn refuses_non_unicast_naming_it() {
        let mut t = V2p::default();
        let vni = Vni::new(10).unwrap();
        let good = V2pEntry {
            underlay: "fd00:99::2".parse().unwrap(),
            mac: "a8:40:25:ff:00:02".parse().unwrap(),
        };
        let e = t
            .set(
                vni,
                "1.1.1.1".parse().unwrap(),
                V2pEntry {
                    mac: MacAddr::BROADCAST,
                    ..good
                },
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("ff:ff:ff:ff:ff:ff"), "{e}");
        let e = t
            .set(
                vni,
                "1.1.1.1".parse().unwrap(),
                V2pEntry {
                    underlay: "ff02::1".parse().unwrap(),
                    ..good
                },
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("ff02::1"), "{e}");
        let e = t
            .set(vni, "224.0.0.1".parse().unwrap(), good)
            .unwrap_err()
            .to_string();
        assert!(e.contains("224.0.0.1"), "{e}");
        assert!(t.is_empty());
    }
}
