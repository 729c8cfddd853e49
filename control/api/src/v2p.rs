//! The sled-wide mappings: virtual to physical (V2P: which sled hosts a guest) and
//! virtual to boundary (V2B: which boundary-services endpoints carry traffic to an
//! external prefix).

use crate::Vni;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv6Addr};
use wire::MacAddr;

/// A virtual-to-physical mapping: the guest `vpc_ip` in VPC `vni` has MAC `vpc_mac`
/// and lives on the sled whose underlay address is `underlay_ip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2pEntry {
    pub vpc_ip: IpAddr,
    pub vpc_mac: MacAddr,
    pub underlay_ip: Ipv6Addr,
    pub vni: Vni,
}

/// Why a mapping is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum V2pError {
    #[error("VPC MAC {0} is not a unicast address")]
    Mac(MacAddr),
    #[error("underlay address {0} is not a unicast address")]
    Underlay(Ipv6Addr),
    #[error("VPC address {0} is not a unicast address")]
    VpcIp(IpAddr),
}

impl V2pEntry {
    /// The checks a mapping must pass on its own: unicast addresses all round.
    pub fn validate(&self) -> Result<(), V2pError> {
        if !self.vpc_mac.is_unicast() {
            return Err(V2pError::Mac(self.vpc_mac));
        }
        if self.underlay_ip.is_unspecified() || self.underlay_ip.is_multicast() {
            return Err(V2pError::Underlay(self.underlay_ip));
        }
        if self.vpc_ip.is_unspecified() || self.vpc_ip.is_multicast() {
            return Err(V2pError::VpcIp(self.vpc_ip));
        }
        Ok(())
    }
}

/// Where a mapping comes from: this sled's own configuration (`xdeadm set-v2p`), or
/// the fleet's store (docs/fleet.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    #[default]
    Local,
    Fleet,
}

impl core::fmt::Display for Source {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Source::Local => "local",
            Source::Fleet => "fleet",
        })
    }
}

/// A mapping as `dump-v2p` shows it: the mapping, where it comes from, and whether
/// another of the same address overrides it (a fleet mapping under a local one set
/// with `--override-fleet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2pRecord {
    #[serde(flatten)]
    pub entry: V2pEntry,
    /// Absent from a daemon older than the fleet: all its mappings are local.
    #[serde(default)]
    pub source: Source,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overridden: bool,
}

/// The guest MAC and sled of a V2P mapping, as opteadm's `clear-v2p` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2pTarget {
    pub vpc_mac: MacAddr,
    pub underlay_ip: Ipv6Addr,
}

/// One V2B prefix and its boundary-services endpoints, as `dump-v2b` shows them and
/// the state file keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2bEntry {
    pub prefix: IpNet,
    /// Sorted, no duplicates.
    pub endpoints: Vec<Ipv6Addr>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_need_unicast_addresses() {
        let ok = V2pEntry {
            vpc_ip: "172.30.0.6".parse().unwrap(),
            vpc_mac: "a8:40:25:ff:00:06".parse().unwrap(),
            underlay_ip: "fd00:99::2".parse().unwrap(),
            vni: Vni::new(1701).unwrap(),
        };
        assert!(ok.validate().is_ok());
        let bad = [
            V2pEntry {
                underlay_ip: "ff02::1".parse().unwrap(),
                ..ok
            },
            V2pEntry {
                vpc_ip: "0.0.0.0".parse().unwrap(),
                ..ok
            },
            V2pEntry {
                vpc_mac: MacAddr::BROADCAST,
                ..ok
            },
        ];
        for (e, named) in bad.iter().zip(["ff02::1", "0.0.0.0", "ff:ff:ff:ff:ff:ff"]) {
            let err = e.validate().unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
    }
}
