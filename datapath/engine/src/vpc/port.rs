//! Guest ports: what the control plane says about one guest NIC.

use crate::ids::Vni;
use crate::machinery::ratelimit::{LimitError, PortLimits};
use crate::vpc::nat::{ExternalIpError, ExternalIps};
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

/// The MTU a port gets when creation does not name one (the reference's default).
pub const DEFAULT_PORT_MTU: u16 = 1500;

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

/// Which way an allowed prefix applies (`allow-cidr --dir`); `both` is what
/// `attach-subnet` allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CidrDir {
    /// The guest may receive frames whose destination is in the prefix.
    In,
    /// The guest may send frames whose source is in the prefix.
    Out,
    /// Both (an attached subnet).
    Both,
}

impl CidrDir {
    fn has_in(self) -> bool {
        matches!(self, CidrDir::In | CidrDir::Both)
    }
    fn has_out(self) -> bool {
        matches!(self, CidrDir::Out | CidrDir::Both)
    }
}

/// A direction that is none of `in`, `out` and `both` (the text given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid direction {0:?}: expected in, out or both")]
pub struct ParseCidrDirError(pub String);

impl core::str::FromStr for CidrDir {
    type Err = ParseCidrDirError;
    fn from_str(s: &str) -> Result<Self, ParseCidrDirError> {
        match s.to_ascii_lowercase().as_str() {
            "in" => Ok(CidrDir::In),
            "out" => Ok(CidrDir::Out),
            "both" => Ok(CidrDir::Both),
            _ => Err(ParseCidrDirError(s.to_string())),
        }
    }
}

impl fmt::Display for CidrDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CidrDir::In => "in",
            CidrDir::Out => "out",
            CidrDir::Both => "both",
        })
    }
}

/// Most prefixes a port may allow per direction: the checks scan them linearly
/// (only for frames not to or from the guest's own addresses).
pub const MAX_PORT_CIDRS: usize = 64;

/// Why a prefix was refused (for a port's allowed prefixes, and as a route's
/// destination); each names the value. Nothing changes on a refusal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// Host bits set: `network` is the prefix it would stand for.
    #[error("prefix {net} has host bits set (the network is {network})")]
    HostBits { net: IpNet, network: IpNet },
    #[error("prefix {net} is IPv{family}, but port {port:?} has no IPv{family} address")]
    NoAddressOfFamily {
        net: IpNet,
        port: String,
        family: u8,
    },
    #[error("prefix {net} is not a range of unicast addresses a guest may use")]
    NotUnicast { net: IpNet },
    /// The port allows the prefix that way already.
    #[error("port {port:?} already allows {net} (direction {dir})")]
    AlreadyAllowed {
        port: String,
        net: IpNet,
        dir: &'static str,
    },
    #[error(
        "port {port:?} already allows {max} prefixes (direction {dir}); {net} is one too many",
        max = MAX_PORT_CIDRS
    )]
    TooMany {
        port: String,
        net: IpNet,
        dir: &'static str,
    },
    /// The port does not allow the prefix that way.
    #[error("port {port:?} does not allow {net} (direction {dir})")]
    NotAllowed {
        port: String,
        net: IpNet,
        dir: &'static str,
    },
}

/// A port's transit IPs and attached subnets, as OPTE has them: prefixes besides
/// the guest's own addresses that anti-spoofing admits as sources (`outbound`) and
/// the inbound destination check admits as destinations (`inbound`). A VPN or
/// firewall appliance needs them to forward traffic that is not its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCidrs {
    /// Destinations the guest may receive (`allow-cidr --dir in`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inbound: Vec<IpNet>,
    /// Sources the guest may send from (`allow-cidr --dir out`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outbound: Vec<IpNet>,
}

impl PortCidrs {
    pub fn is_empty(&self) -> bool {
        self.inbound.is_empty() && self.outbound.is_empty()
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

    /// Adds `net` for `dir`. Refuses, naming the value: host bits set, a prefix of
    /// a family the port has no address of, one already allowed that way, more than
    /// [`MAX_PORT_CIDRS`]. Nothing changes on a refusal.
    pub fn allow(&mut self, net: IpNet, dir: CidrDir, cfg: &PortConfig) -> Result<(), CidrError> {
        check_cidr(net, cfg)?;
        let lists = [
            (dir.has_in(), &self.inbound, "in"),
            (dir.has_out(), &self.outbound, "out"),
        ];
        for (wanted, list, name) in lists {
            if !wanted {
                continue;
            }
            let port = || cfg.name.clone();
            if list.contains(&net) {
                return Err(CidrError::AlreadyAllowed {
                    port: port(),
                    net,
                    dir: name,
                });
            }
            if list.len() >= MAX_PORT_CIDRS {
                return Err(CidrError::TooMany {
                    port: port(),
                    net,
                    dir: name,
                });
            }
        }
        if dir.has_in() {
            self.inbound.push(net);
        }
        if dir.has_out() {
            self.outbound.push(net);
        }
        Ok(())
    }

    /// Removes `net` for `dir`; refuses, naming the value, when it is not allowed
    /// that way (for `both`, either way). Nothing changes on a refusal.
    pub fn remove(&mut self, net: IpNet, dir: CidrDir, port: &str) -> Result<(), CidrError> {
        let missing = |list: &Vec<IpNet>, name: &'static str| {
            if list.contains(&net) {
                Ok(())
            } else {
                Err(CidrError::NotAllowed {
                    port: port.to_string(),
                    net,
                    dir: name,
                })
            }
        };
        if dir.has_in() {
            missing(&self.inbound, "in")?;
        }
        if dir.has_out() {
            missing(&self.outbound, "out")?;
        }
        if dir.has_in() {
            self.inbound.retain(|n| *n != net);
        }
        if dir.has_out() {
            self.outbound.retain(|n| *n != net);
        }
        Ok(())
    }

    /// Checks a whole set against the port (restored or created with it).
    pub fn validate(&self, cfg: &PortConfig) -> Result<(), CidrError> {
        let mut rebuilt = PortCidrs::default();
        for n in &self.inbound {
            rebuilt.allow(*n, CidrDir::In, cfg)?;
        }
        for n in &self.outbound {
            rebuilt.allow(*n, CidrDir::Out, cfg)?;
        }
        Ok(())
    }
}

/// Refuses a prefix with host bits set (`10.9.0.1/6`), naming the network it would
/// stand for, as `ip route` does: the operator meant one of the two, and a prefix
/// kept as typed would not be the one matched.
pub fn check_network(net: IpNet) -> Result<(), CidrError> {
    if net.trunc() != net {
        return Err(CidrError::HostBits {
            net,
            network: net.trunc(),
        });
    }
    Ok(())
}

fn check_cidr(net: IpNet, cfg: &PortConfig) -> Result<(), CidrError> {
    check_network(net)?;
    let (has, family) = match net {
        IpNet::V4(_) => (cfg.ipv4.is_some(), 4),
        IpNet::V6(_) => (cfg.ipv6.is_some(), 6),
    };
    if !has {
        return Err(CidrError::NoAddressOfFamily {
            net,
            port: cfg.name.clone(),
            family,
        });
    }
    let a = net.addr();
    if a.is_multicast() || a.is_loopback() {
        return Err(CidrError::NotUnicast { net });
    }
    Ok(())
}

/// Smallest MTU accepted for a port: IPv6's minimum link MTU (RFC 8200).
pub const MIN_PORT_MTU: u16 = 1280;

/// Why a port's configuration was refused; each names the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortConfigError {
    #[error("port name {name:?} must be 1 to 15 bytes (it names a network device)")]
    Name { name: String },
    #[error("guest MAC {mac} is not a unicast address")]
    GuestMacNotUnicast { mac: MacAddr },
    #[error("gateway MAC {mac} is not a unicast address")]
    GatewayMacNotUnicast { mac: MacAddr },
    #[error("guest MAC and gateway MAC are both {mac}")]
    SameMacs { mac: MacAddr },
    #[error("a port needs an IPv4 or an IPv6 private address")]
    NoAddress,
    #[error("MTU {mtu} is below the minimum of {min}", min = MIN_PORT_MTU)]
    MtuBelowMinimum { mtu: u16 },
    #[error("private IP {ip} is outside VPC subnet {subnet}")]
    OutsideSubnet { ip: IpAddr, subnet: IpNet },
    #[error("a port with an IPv4 address needs a gateway IPv4 address")]
    NoGatewayIpv4,
    #[error("private IP {ip} is the gateway's IPv4 address")]
    GatewayAddress { ip: Ipv4Addr },
    #[error("private IP {ip} is not a unicast address")]
    NotUnicast { ip: IpAddr },
    #[error("private IP {ip} is link-local; a port needs a routable IPv6 address")]
    LinkLocal { ip: Ipv6Addr },
    #[error(transparent)]
    External(#[from] ExternalIpError),
    #[error(transparent)]
    Cidr(#[from] CidrError),
    #[error(transparent)]
    Limits(#[from] LimitError),
}

impl PortConfig {
    /// Checks the configuration on its own (the engine checks it against the underlay
    /// MTU and the other ports). Errors name the bad value.
    pub fn validate(&self) -> Result<(), PortConfigError> {
        use PortConfigError as E;
        if self.name.is_empty() || self.name.len() > 15 {
            return Err(E::Name {
                name: self.name.clone(),
            });
        }
        if !self.guest_mac.is_unicast() {
            return Err(E::GuestMacNotUnicast {
                mac: self.guest_mac,
            });
        }
        if !self.gateway_mac.is_unicast() {
            return Err(E::GatewayMacNotUnicast {
                mac: self.gateway_mac,
            });
        }
        if self.guest_mac == self.gateway_mac {
            return Err(E::SameMacs {
                mac: self.guest_mac,
            });
        }
        if self.ipv4.is_none() && self.ipv6.is_none() {
            return Err(E::NoAddress);
        }
        if self.mtu < MIN_PORT_MTU {
            return Err(E::MtuBelowMinimum { mtu: self.mtu });
        }
        if let (Some(ip), Some(net)) = (self.ipv4, self.vpc_subnet4) {
            if !net.contains(&ip) {
                return Err(E::OutsideSubnet {
                    ip: ip.into(),
                    subnet: net.into(),
                });
            }
        }
        if let (Some(ip), Some(net)) = (self.ipv6, self.vpc_subnet6) {
            if !net.contains(&ip) {
                return Err(E::OutsideSubnet {
                    ip: ip.into(),
                    subnet: net.into(),
                });
            }
        }
        if self.ipv4.is_some() && self.gateway_ipv4.is_none() {
            return Err(E::NoGatewayIpv4);
        }
        if let Some(ip) = self.ipv4 {
            // The gateway answers ARP and echo for its own address: a guest holding
            // it would be unreachable, and would see its own address as its router.
            if self.gateway_ipv4 == Some(ip) {
                return Err(E::GatewayAddress { ip });
            }
            if ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() || ip.is_loopback() {
                return Err(E::NotUnicast { ip: ip.into() });
            }
        }
        if let Some(ip) = self.ipv6 {
            // Link-local and multicast addresses never leave the guest's link (the
            // datapath drops such traffic as link_local_only), so they cannot be the
            // address the VPC routes to the guest.
            if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
                return Err(E::NotUnicast { ip: ip.into() });
            }
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                return Err(E::LinkLocal { ip });
            }
        }
        self.external.validate(self.ipv4, self.ipv6)?;
        self.cidrs.validate(self)?;
        Ok(self.limits.validate()?)
    }

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

    #[test]
    fn validation_names_bad_values() {
        assert!(sample().validate().is_ok());
        let mut p = sample();
        p.mtu = 1000;
        assert!(p.validate().unwrap_err().to_string().contains("1000"));
        let mut p = sample();
        p.ipv4 = Some("10.0.0.1".parse().unwrap());
        assert!(p.validate().unwrap_err().to_string().contains("10.0.0.1"));
    }

    #[test]
    fn guest_addresses_must_be_routable_unicast_and_not_the_gateway() {
        let mut p = sample();
        p.ipv4 = p.gateway_ipv4;
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("172.30.0.1") && e.contains("gateway"), "{e}");
        for bad in ["fe80::5", "ff02::1", "::"] {
            let mut p = sample();
            p.ipv6 = Some(bad.parse().unwrap());
            p.vpc_subnet6 = None;
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        let mut p = sample();
        p.ipv4 = Some("224.0.0.5".parse().unwrap());
        p.vpc_subnet4 = None;
        assert!(p.validate().unwrap_err().to_string().contains("224.0.0.5"));
    }

    #[test]
    fn allowed_prefixes_need_an_address_of_their_family() {
        let mut c = sample();
        c.ipv6 = None;
        c.vpc_subnet6 = None;
        let mut cidrs = PortCidrs::default();
        let e = cidrs
            .allow("fd00:50::/64".parse().unwrap(), CidrDir::In, &c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fd00:50::/64") && e.contains("IPv6"), "{e}");
        cidrs
            .allow("0.0.0.0/0".parse().unwrap(), CidrDir::Out, &c)
            .unwrap();
        assert!(cidrs.admits_out("8.8.8.8".parse().unwrap()));
        assert!(!cidrs.admits_in("8.8.8.8".parse().unwrap()));
        // A saved set is checked as a whole, duplicates too.
        c.cidrs = PortCidrs {
            inbound: vec!["10.1.0.0/16".parse().unwrap(); 2],
            outbound: vec![],
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("10.1.0.0/16") && e.contains("already"), "{e}");
        let json = serde_json::to_string(&PortCidrs::default()).unwrap();
        assert_eq!(json, "{}");
    }
}
