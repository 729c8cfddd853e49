//! Guest ports: what the control plane says about one guest NIC.
//!
//! The engine takes a [`PortConfig`] as it is given: whether it makes sense on its
//! own (unicast MACs, addresses inside their subnets, a gateway IPv4 for an IPv4
//! guest, external addresses and prefixes of the port's families, limits in range)
//! is the API's check (`api::PortConfig::validate`), which the admin tool and the
//! daemon both run. The engine checks what depends on its own state (a name, MAC
//! or address taken; an MTU the underlay cannot carry; the table budget; the
//! prefixes it scans per packet), and whatever else it is given may make a port
//! useless but never makes the engine panic or spin (docs/engine.md, "Who checks
//! what").

use crate::ids::Vni;
use crate::machinery::ratelimit::PortLimits;
use crate::vpc::nat::ExternalIps;
use core::fmt;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use wire::MacAddr;

/// Whether a port carries traffic (`list-ports`), as OPTE names its port states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PortState {
    /// Created (or restored) and carrying traffic, but no frame has passed it yet
    /// in either direction.
    Ready,
    /// A frame has passed it since it was created or restored.
    Running,
    /// Paused by the operator (`pause-port`): every frame, both ways, is dropped
    /// and counted as `port_paused`; its flows, connections and rules are kept, so
    /// `resume-port` resumes its connections where they were.
    Paused,
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortState::Ready => "ready",
            PortState::Running => "running",
            PortState::Paused => "paused",
        })
    }
}

/// Everything the control plane configures on a port at creation (`create-xde`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortConfig {
    /// The port's name; also the tap device's name.
    pub name: String,
    pub guest_mac: MacAddr,
    /// The MAC the guest sees as its gateway (source of every frame it receives).
    pub gateway_mac: MacAddr,
    /// The guest's private IPv4 address, if it has one.
    pub ipv4: Option<Ipv4Addr>,
    /// The guest's private IPv6 address, if it has one.
    pub ipv6: Option<Ipv6Addr>,
    /// The VPC subnet(s) the guest's addresses belong to.
    pub vpc_subnet4: Option<Ipv4Net>,
    pub vpc_subnet6: Option<Ipv6Net>,
    /// The gateway's IPv4 address (the guest's default router). The gateway's IPv6
    /// address is always fe80::EUI-64(gateway_mac).
    pub gateway_ipv4: Option<Ipv4Addr>,
    pub vni: Vni,
    /// The link MTU offered to the guest: RA MTU option, DHCP option 26, and the
    /// VPC-internal path MTU.
    pub mtu: u16,
    /// Instance-level external jumbo flag; external traffic may use `mtu` only when the
    /// sled-wide flag is set too.
    pub external_jumbo: bool,
    pub dns_servers4: Vec<Ipv4Addr>,
    pub dns_servers6: Vec<Ipv6Addr>,
    pub hostname: Option<String>,
    pub domain: Option<String>,
    /// The guest's DNS search list (DHCPv4 option 119, DHCPv6 option 24); when
    /// empty, `domain` alone is offered as the list. Absent from state saved
    /// before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domain_search: Vec<String>,
    /// External addresses for traffic to the internet gateway (`nat.rs`); none by
    /// default, and absent from state saved before they existed.
    #[serde(default)]
    pub external: ExternalIps,
    /// Rate limits (`set-port-limits`, `ratelimit.rs`); none by default, and absent
    /// from state saved before they existed.
    #[serde(default, skip_serializing_if = "PortLimits::is_unlimited")]
    pub limits: PortLimits,
    /// Prefixes besides its own addresses the guest may send from and receive at
    /// (`allow-cidr`, `attach-subnet`); none by default, and absent from state saved
    /// before they existed.
    #[serde(default, skip_serializing_if = "PortCidrs::is_empty")]
    pub cidrs: PortCidrs,
}

/// Most prefixes a port may allow per direction: the checks scan them linearly, per
/// frame not to or from the guest's own addresses, so the engine refuses a longer
/// list (`EngineError::TooManyPrefixes`) to bound its own per-frame work.
pub const MAX_PORT_CIDRS: usize = 64;

/// A port's transit IPs and attached subnets, as OPTE has them: prefixes besides
/// the guest's own addresses that anti-spoofing admits as sources (`outbound`) and
/// the inbound destination check admits as destinations (`inbound`). A VPN or
/// firewall appliance needs them to forward traffic that is not its own. The
/// engine needs no more of them than their number: a prefix of a family the port
/// has no address of, or written with host bits set, is matched as its network
/// and harms nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCidrs {
    /// Destinations the guest may receive (`allow-cidr --dir in`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inbound: Vec<IpNet>,
    /// Sources the guest may send from (`allow-cidr --dir out`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outbound: Vec<IpNet>,
    /// External attached subnets (`attach-subnet -e`): addresses the internet
    /// reaches untranslated, so the NAT layer leaves a flow alone whose guest-side
    /// address is in one. Admitted both ways only by the two lists above (the API
    /// puts each in both); here they decide NAT and nothing else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<IpNet>,
}

impl PortCidrs {
    pub fn is_empty(&self) -> bool {
        self.inbound.is_empty() && self.outbound.is_empty() && self.external.is_empty()
    }

    /// Whether `ip`, the guest's side of a flow to or from the internet, is in an
    /// external attached subnet: the flow is then not translated. One empty-list
    /// branch for a port without any.
    #[inline]
    pub fn exempts_nat(&self, ip: IpAddr) -> bool {
        self.external.iter().any(|n| n.contains(&ip))
    }

    /// Whether a frame to `dst` (not the guest's own address) may reach the guest.
    #[inline]
    pub fn admits_in(&self, dst: IpAddr) -> bool {
        self.inbound.iter().any(|n| n.contains(&dst))
    }

    /// Whether the guest may send from `src` (not its own address).
    #[inline]
    pub fn admits_out(&self, src: IpAddr) -> bool {
        self.outbound.iter().any(|n| n.contains(&src))
    }
}

/// Smallest MTU accepted for a port: IPv6's minimum link MTU (RFC 8200). The
/// engine refuses a port MTU outside this to what the underlay carries
/// (`EngineError::PortMtuOutOfRange`), and an underlay that cannot carry it.
pub const MIN_PORT_MTU: u16 = 1280;

impl PortConfig {
    /// The gateway's IPv6 link-local address: fe80::EUI-64(gateway MAC).
    pub fn gateway_ipv6(&self) -> Ipv6Addr {
        link_local_eui64(self.gateway_mac)
    }
}

/// fe80::/64 with the modified EUI-64 interface identifier of `mac` (RFC 4291 App. A).
pub fn link_local_eui64(mac: MacAddr) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A dual-stack port as the end-to-end tests create it.
    pub(crate) fn sample() -> PortConfig {
        PortConfig {
            name: "opte0".into(),
            guest_mac: "a8:40:25:ff:00:01".parse().unwrap(),
            gateway_mac: "a8:40:25:00:00:01".parse().unwrap(),
            ipv4: Some("172.30.0.5".parse().unwrap()),
            ipv6: Some("fd00:1122:3344:100::5".parse().unwrap()),
            vpc_subnet4: Some("172.30.0.0/22".parse().unwrap()),
            vpc_subnet6: Some("fd00:1122:3344:100::/64".parse().unwrap()),
            gateway_ipv4: Some("172.30.0.1".parse().unwrap()),
            vni: Vni::new(1701).unwrap(),
            mtu: 8500,
            external_jumbo: false,
            dns_servers4: vec![],
            dns_servers6: vec![],
            hostname: None,
            domain: None,
            domain_search: vec![],
            external: Default::default(),
            limits: Default::default(),
            cidrs: Default::default(),
        }
    }

    #[test]
    fn eui64_link_local() {
        let mac: MacAddr = "a8:40:25:00:00:01".parse().unwrap();
        assert_eq!(link_local_eui64(mac).to_string(), "fe80::aa40:25ff:fe00:1");
    }

    /// The per-frame checks match a prefix's network, of its own family only,
    /// whatever the list holds.
    #[test]
    fn allowed_prefixes_admit_their_addresses_only() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cidrs = PortCidrs {
            inbound: vec![net("fd00:50::/64"), net("10.9.0.1/16")],
            outbound: vec![net("0.0.0.0/0")],
            external: vec![net("10.9.0.0/24")],
        };
        assert!(cidrs.admits_out(ip("8.8.8.8")));
        assert!(!cidrs.admits_out(ip("2001:db8::1")));
        assert!(!cidrs.admits_in(ip("8.8.8.8")));
        assert!(cidrs.admits_in(ip("10.9.200.1")), "host bits: the network");
        assert!(cidrs.admits_in(ip("fd00:50::7")));
        assert!(!PortCidrs::default().admits_in(ip("10.9.0.1")));
        assert!(cidrs.exempts_nat(ip("10.9.0.200")));
        assert!(!cidrs.exempts_nat(ip("10.9.1.1")) && !cidrs.exempts_nat(ip("fd00:50::7")));
        assert!(!PortCidrs::default().exempts_nat(ip("10.9.0.1")));
        let json = serde_json::to_string(&PortCidrs::default()).unwrap();
        assert_eq!(json, "{}");
    }
}
