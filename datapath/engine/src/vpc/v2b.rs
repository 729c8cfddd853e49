//! The virtual-to-boundary (V2B) table: which boundary-services endpoints (the
//! rack's switches, on the underlay) carry traffic to an external prefix.
//!
//! Traffic a port's router sends to the internet gateway is encapsulated toward one
//! endpoint of the longest prefix containing its destination, chosen by the flow's
//! hash so that one flow always takes the same switch while flows spread over all of
//! them (like ECMP). The same endpoints are the only underlay sources an External
//! frame (from outside the rack) is accepted from ([`crate::vpc::overlay::InboundTrust`]).
//!
//! The table follows opteadm's `set-v2b`/`clear-v2b`: setting adds endpoints to a
//! prefix, clearing removes them, and a prefix left without endpoints disappears.

use crate::machinery::flow::FlowKey;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};

/// One prefix and its endpoints, as `dump-v2b` shows them and the state file keeps
/// them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2bEntry {
    pub prefix: IpNet,
    /// Sorted, no duplicates.
    pub endpoints: Vec<Ipv6Addr>,
}

/// Why a change to the V2B table was refused; each names the value. Nothing
/// changes on a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum V2bError {
    #[error("set-v2b {prefix}: no boundary endpoint given")]
    NoEndpoint { prefix: IpNet },
    #[error("V2B endpoint {endpoint} for {prefix} is not a unicast underlay address")]
    EndpointNotUnicast { endpoint: Ipv6Addr, prefix: IpNet },
    /// The table has no entry for the prefix.
    #[error("no V2B entry for {prefix}")]
    NoEntry { prefix: IpNet },
    /// The prefix has no such endpoint.
    #[error("V2B entry {prefix} has no endpoint {endpoint}")]
    NoSuchEndpoint { prefix: IpNet, endpoint: Ipv6Addr },
}

/// The V2B table of a sled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct V2b {
    /// Prefixes are kept normalised (host bits zero), so `10.0.0.1/8` and
    /// `10.0.0.0/8` are one entry.
    map: BTreeMap<IpNet, BTreeSet<Ipv6Addr>>,
    /// Every endpoint of every prefix, sorted: the inbound check is a search here.
    all: Vec<Ipv6Addr>,
}

impl V2b {
    /// The table `--boundary-services ADDR` stands for: both default prefixes to
    /// that one endpoint (empty without one).
    pub fn shorthand(endpoint: Option<Ipv6Addr>) -> Result<V2b, V2bError> {
        let mut t = V2b::default();
        if let Some(e) = endpoint {
            for net in [IpNet::V4(Default::default()), IpNet::V6(Default::default())] {
                t.set(net, &[e])?;
            }
        }
        Ok(t)
    }

    /// Adds `endpoints` to `prefix` (those it has already stay). Refuses, changing
    /// nothing, an empty list or an endpoint that is not a unicast address.
    pub fn set(&mut self, prefix: IpNet, endpoints: &[Ipv6Addr]) -> Result<(), V2bError> {
        if endpoints.is_empty() {
            return Err(V2bError::NoEndpoint { prefix });
        }
        if let Some(&endpoint) = endpoints
            .iter()
            .find(|e| e.is_unspecified() || e.is_multicast() || e.is_loopback())
        {
            return Err(V2bError::EndpointNotUnicast { endpoint, prefix });
        }
        self.map
            .entry(prefix.trunc())
            .or_default()
            .extend(endpoints.iter().copied());
        self.reindex();
        Ok(())
    }

    /// Removes `endpoints` from `prefix`; the prefix goes when none is left. Refuses,
    /// changing nothing, a prefix not in the table or an endpoint it does not have.
    pub fn clear(&mut self, prefix: IpNet, endpoints: &[Ipv6Addr]) -> Result<(), V2bError> {
        let Some(set) = self.map.get_mut(&prefix.trunc()) else {
            return Err(V2bError::NoEntry { prefix });
        };
        if let Some(&endpoint) = endpoints.iter().find(|e| !set.contains(e)) {
            return Err(V2bError::NoSuchEndpoint { prefix, endpoint });
        }
        for e in endpoints {
            set.remove(e);
        }
        if set.is_empty() {
            self.map.remove(&prefix.trunc());
        }
        self.reindex();
        Ok(())
    }

    /// Adds every entry of `other` (the daemon's table on top of the configured
    /// `--boundary-services` shorthand).
    pub fn merge(&mut self, other: &V2b) {
        for (prefix, eps) in &other.map {
            self.map.entry(*prefix).or_default().extend(eps);
        }
        self.reindex();
    }

    fn reindex(&mut self) {
        let all: BTreeSet<Ipv6Addr> = self.map.values().flatten().copied().collect();
        self.all = all.into_iter().collect();
    }

    /// The endpoint for flow `key` to `dst`: among the endpoints of the longest
    /// prefix containing `dst`, the one the flow's hash picks (the same one for every
    /// packet of the flow, in every process).
    pub fn select(&self, dst: IpAddr, key: &FlowKey) -> Option<Ipv6Addr> {
        let eps = self
            .map
            .iter()
            .filter(|(p, _)| p.contains(&dst))
            .max_by_key(|(p, _)| p.prefix_len())
            .map(|(_, eps)| eps)?;
        // Bits between the ones that pick the outer UDP port (0-13) and the flow
        // label (40-59), so the endpoint is not correlated with either.
        let bits = (key.hash64() >> 14) & 0x03ff_ffff;
        let i = usize::try_from(bits.checked_rem(eps.len() as u64)?).ok()?;
        eps.iter().nth(i).copied()
    }

    /// Every endpoint of every prefix, sorted.
    pub fn endpoints(&self) -> &[Ipv6Addr] {
        &self.all
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The table, ordered by prefix.
    pub fn dump(&self) -> Vec<V2bEntry> {
        self.map
            .iter()
            .map(|(prefix, eps)| V2bEntry {
                prefix: *prefix,
                endpoints: eps.iter().copied().collect(),
            })
            .collect()
    }

    /// The table a dump describes (a restore).
    pub fn from_entries(entries: &[V2bEntry]) -> Result<V2b, V2bError> {
        let mut t = V2b::default();
        for e in entries {
            t.set(e.prefix, &e.endpoints)?;
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dst: &str, sport: u16) -> FlowKey {
        FlowKey {
            vni: 10,
            proto: 6,
            src_ip: "172.30.0.5".parse().unwrap(),
            dst_ip: dst.parse().unwrap(),
            src_port: sport,
            dst_port: 443,
            icmp_type: 0,
            icmp_code: 0,
        }
    }

    fn ep(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn pick(t: &V2b, dst: &str, sport: u16) -> Option<Ipv6Addr> {
        t.select(dst.parse().unwrap(), &key(dst, sport))
    }

    #[test]
    fn longest_prefix_of_the_right_family_wins() {
        let mut t = V2b::default();
        t.set("0.0.0.0/0".parse().unwrap(), &[ep("fd00::1")])
            .unwrap();
        t.set("10.1.0.0/16".parse().unwrap(), &[ep("fd00::2")])
            .unwrap();
        t.set("10.0.0.0/8".parse().unwrap(), &[ep("fd00::3")])
            .unwrap();
        assert_eq!(pick(&t, "10.1.2.3", 1), Some(ep("fd00::2")));
        assert_eq!(pick(&t, "10.2.2.3", 1), Some(ep("fd00::3")));
        assert_eq!(pick(&t, "192.0.2.1", 1), Some(ep("fd00::1")));
        assert_eq!(pick(&t, "2001:db8::1", 1), None);
        // Host bits do not make another entry.
        t.set("10.1.9.9/16".parse().unwrap(), &[ep("fd00::4")])
            .unwrap();
        assert_eq!(t.dump().len(), 3);
    }

    #[test]
    fn flows_spread_over_endpoints_and_keep_theirs() {
        let eps = [ep("fd00::1"), ep("fd00::2"), ep("fd00::3")];
        let mut t = V2b::default();
        t.set("::/0".parse().unwrap(), &eps).unwrap();
        let mut seen = BTreeMap::new();
        for sport in 0..300 {
            let e = pick(&t, "2001:db8::7", sport).unwrap();
            assert_eq!(pick(&t, "2001:db8::7", sport), Some(e));
            *seen.entry(e).or_insert(0) += 1;
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen.values().all(|n| *n > 50), "{seen:?}");
    }

    #[test]
    fn set_adds_clear_removes_and_refusals_name_the_value() {
        let mut t = V2b::default();
        let net: IpNet = "0.0.0.0/0".parse().unwrap();
        t.set(net, &[ep("fd00::1")]).unwrap();
        t.set(net, &[ep("fd00::2"), ep("fd00::1")]).unwrap();
        assert_eq!(t.endpoints(), [ep("fd00::1"), ep("fd00::2")]);
        let e = t.clear(net, &[ep("fd00::9")]).unwrap_err().to_string();
        assert!(e.contains("fd00::9"), "{e}");
        t.clear(net, &[ep("fd00::1")]).unwrap();
        assert_eq!(t.endpoints(), [ep("fd00::2")]);
        t.clear(net, &[ep("fd00::2")]).unwrap();
        assert!(t.is_empty() && t.endpoints().is_empty());
        assert_eq!(pick(&t, "192.0.2.1", 1), None);
        let e = t.clear(net, &[ep("fd00::2")]).unwrap_err().to_string();
        assert!(e.contains("0.0.0.0/0"), "{e}");
        let e = t.set(net, &[ep("ff02::1")]).unwrap_err().to_string();
        assert!(e.contains("ff02::1"), "{e}");
        assert!(t.set(net, &[]).is_err());
        assert!(t.is_empty());
    }

    #[test]
    fn a_dump_restores_the_same_table() {
        let mut t = V2b::default();
        t.set(
            "0.0.0.0/0".parse().unwrap(),
            &[ep("fd00::1"), ep("fd00::2")],
        )
        .unwrap();
        t.set("::/0".parse().unwrap(), &[ep("fd00::3")]).unwrap();
        assert_eq!(V2b::from_entries(&t.dump()).unwrap(), t);
    }
}
