//! A guest port as the API describes it (`create-xde`): its configuration, external
//! addresses, rate limits and allowed prefixes, and the checks that make a
//! configuration valid on its own. What depends on the running daemon (the underlay
//! MTU, the other ports) is the daemon's to check.
//!
//! The checks live here, with the types, because both ends need them: `xdeadm`
//! refuses a bad command line before anything is sent, and the daemon refuses the
//! same request from any client, with the same message.

use crate::Vni;
use core::fmt;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use uuid::Uuid;
use wire::MacAddr;

/// The MTU a port gets when creation does not name one (the reference's default).
pub const DEFAULT_PORT_MTU: u16 = 1500;

/// Smallest MTU accepted for a port: IPv6's minimum link MTU (RFC 8200).
pub const MIN_PORT_MTU: u16 = 1280;

/// The longest port name: it names a network device (`IFNAMSIZ` - 1).
pub const MAX_PORT_NAME: usize = 15;

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
    /// The guest's DNS search list (opteadm's `--domain-search-list`), offered in
    /// DHCPv4 option 119 and DHCPv6 option 24; when empty, `domain` alone is
    /// offered. Absent from state saved before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domain_search: Vec<String>,
    /// External addresses for traffic to the internet gateway (docs/nat.md); none by
    /// default, and absent from state saved before they existed.
    #[serde(default)]
    pub external: ExternalIps,
    /// Rate limits (`set-port-limits`); none by default, and absent from state saved
    /// before they existed.
    #[serde(default, skip_serializing_if = "PortLimits::is_unlimited")]
    pub limits: PortLimits,
    /// Prefixes besides its own addresses the guest may send from and receive at
    /// (`allow-cidr`, `attach-subnet`); none by default, and absent from state saved
    /// before they existed.
    #[serde(default, skip_serializing_if = "PortCidrs::is_empty")]
    pub cidrs: PortCidrs,
}

/// Why a port configuration is refused; each names the bad value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortConfigError {
    #[error("port name {0:?} must be 1 to {MAX_PORT_NAME} bytes (it names a network device)")]
    Name(String),
    #[error("{role} MAC {mac} is not a unicast address")]
    MacNotUnicast { role: &'static str, mac: MacAddr },
    #[error("guest MAC and gateway MAC are both {0}")]
    SameMacs(MacAddr),
    #[error("a port needs an IPv4 or an IPv6 private address")]
    NoAddress,
    #[error("MTU {0} is below the minimum of {MIN_PORT_MTU}")]
    MtuTooSmall(u16),
    #[error("private IP {ip} is outside VPC subnet {subnet}")]
    OutsideSubnet { ip: IpAddr, subnet: IpNet },
    #[error("a port with an IPv4 address needs a gateway IPv4 address")]
    NoGatewayIpv4,
    #[error("private IP {0} is the gateway's IPv4 address")]
    GatewayAddress(Ipv4Addr),
    #[error("private IP {0} is not a unicast address")]
    NotUnicast(IpAddr),
    #[error("private IP {0} is link-local; a port needs a routable IPv6 address")]
    LinkLocal(Ipv6Addr),
    #[error(
        "domain search name {0:?} is not a DNS name (dot-separated labels of 1 to 63 letters, digits, '-' or '_'; at most 253 bytes)"
    )]
    SearchName(String),
    #[error(
        "domain search list {names} takes {bytes} bytes encoded; DHCPv4 option 119 holds at most {MAX_SEARCH_BYTES}"
    )]
    SearchListTooLong { names: String, bytes: usize },
    #[error(transparent)]
    External(#[from] ExternalIpsError),
    #[error(transparent)]
    Cidr(#[from] CidrError),
    #[error(transparent)]
    Limits(#[from] LimitsError),
}

impl PortConfig {
    /// Checks the configuration on its own (the daemon also checks it against the
    /// underlay MTU and the other ports).
    pub fn validate(&self) -> Result<(), PortConfigError> {
        if self.name.is_empty() || self.name.len() > MAX_PORT_NAME {
            return Err(PortConfigError::Name(self.name.clone()));
        }
        for (role, mac) in [("guest", self.guest_mac), ("gateway", self.gateway_mac)] {
            if !mac.is_unicast() {
                return Err(PortConfigError::MacNotUnicast { role, mac });
            }
        }
        if self.guest_mac == self.gateway_mac {
            return Err(PortConfigError::SameMacs(self.guest_mac));
        }
        if self.ipv4.is_none() && self.ipv6.is_none() {
            return Err(PortConfigError::NoAddress);
        }
        if self.mtu < MIN_PORT_MTU {
            return Err(PortConfigError::MtuTooSmall(self.mtu));
        }
        let outside = |ip: IpAddr, subnet: IpNet| match subnet.contains(&ip) {
            true => Ok(()),
            false => Err(PortConfigError::OutsideSubnet { ip, subnet }),
        };
        if let (Some(ip), Some(net)) = (self.ipv4, self.vpc_subnet4) {
            outside(ip.into(), net.into())?;
        }
        if let (Some(ip), Some(net)) = (self.ipv6, self.vpc_subnet6) {
            outside(ip.into(), net.into())?;
        }
        if self.ipv4.is_some() && self.gateway_ipv4.is_none() {
            return Err(PortConfigError::NoGatewayIpv4);
        }
        if let Some(ip) = self.ipv4 {
            // The gateway answers ARP and echo for its own address: a guest holding
            // it would be unreachable, and would see its own address as its router.
            if self.gateway_ipv4 == Some(ip) {
                return Err(PortConfigError::GatewayAddress(ip));
            }
            if ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() || ip.is_loopback() {
                return Err(PortConfigError::NotUnicast(ip.into()));
            }
        }
        if let Some(ip) = self.ipv6 {
            // Link-local and multicast addresses never leave the guest's link (the
            // datapath drops such traffic as link_local_only), so they cannot be the
            // address the VPC routes to the guest.
            if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
                return Err(PortConfigError::NotUnicast(ip.into()));
            }
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                return Err(PortConfigError::LinkLocal(ip));
            }
        }
        check_search_list(&self.domain_search)?;
        self.external.validate(self.ipv4, self.ipv6)?;
        self.cidrs.validate(self)?;
        Ok(self.limits.validate()?)
    }
}

/// The most bytes a search list takes encoded: what one DHCPv4 option holds (a
/// longer one would need RFC 3396's split options, which not every client joins).
pub const MAX_SEARCH_BYTES: usize = 255;

/// Refuses a search list a guest could not be given: a name that is not a DNS
/// name (labels of letters, digits, `-` and `_`), or a list too long for DHCPv4.
fn check_search_list(names: &[String]) -> Result<(), PortConfigError> {
    let label_ok = |l: &str| {
        l.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    for name in names {
        let labels_ok = name
            .strip_suffix('.')
            .unwrap_or(name)
            .split('.')
            .all(label_ok);
        if !labels_ok || wire::dns::name_len(name).is_err() {
            return Err(PortConfigError::SearchName(name.clone()));
        }
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    match wire::dns::names_len(&refs) {
        Ok(bytes) if bytes > MAX_SEARCH_BYTES => Err(PortConfigError::SearchListTooLong {
            names: names.join(","),
            bytes,
        }),
        _ => Ok(()),
    }
}

/// A port: its configuration and where its guest is (a tap of its own, moved into a
/// network namespace or left in the daemon's; a hypervisor's interface it is
/// attached to; or a VM served over vhost-user). What `create-xde` asks for and the
/// state file keeps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    pub config: PortConfig,
    /// Network namespace (by name, as `ip netns` knows it) to move the tap into; the
    /// daemon's own namespace when absent.
    #[serde(default)]
    pub netns: Option<String>,
    /// Serve the guest over vhost-user at this socket instead of a tap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<VhostUser>,
    /// An existing interface to attach the port to instead of making a tap: the
    /// host side of a hypervisor's tap (QEMU, libvirt), which the daemon reads and
    /// writes with a packet socket and never deletes. Excludes `netns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<String>,
}

/// A port whose guest is a VM attached over vhost-user: overlayd is the backend
/// of the VM's virtio-net device (see `docs/operating.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostUser {
    /// The vhost-user socket's path.
    pub socket: std::path::PathBuf,
    #[serde(default)]
    pub mode: VhostUserMode,
}

/// Which side of the vhost-user socket listens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VhostUserMode {
    /// overlayd listens; QEMU connects (`-chardev socket,...,reconnect=1`).
    #[default]
    Server,
    /// QEMU listens (`-chardev socket,...,server=on`); overlayd connects, and
    /// connects again after it restarts, while the VM keeps running.
    Client,
}

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

/// Lowest SNAT port: the reference (and opteadm) refuse the well-known ports.
pub const SNAT_PORT_MIN: u16 = 1024;

/// A SNAT address and the source ports this port may use on it (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnatRange {
    pub ip: IpAddr,
    pub start: u16,
    pub end: u16,
}

impl SnatRange {
    /// Whether two ranges share an address and at least one port.
    pub fn overlaps(&self, other: &SnatRange) -> bool {
        self.ip == other.ip && self.start <= other.end && other.start <= self.end
    }
}

/// A port's external addresses (opteadm's `--snat-ip/--snat-start/--snat-end`,
/// `--ephemeral-ip`, `--floating-ip`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalIps {
    pub snat: Option<SnatRange>,
    pub ephemeral: Option<IpAddr>,
    pub floating: Vec<IpAddr>,
    /// The internet gateways each address serves (OPTE's `inet_gw_map`;
    /// `--inet-gw ADDR=UUID[,UUID]`): a flow routed through gateway `G`
    /// (`ig=G`) leaves from an address that serves `G`. Empty: every address
    /// serves every gateway.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gateways: BTreeMap<IpAddr, BTreeSet<Uuid>>,
}

/// Why a port's external addresses are refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExternalIpsError {
    #[error("{role} IP {ip}: the port has no private address of that family")]
    NoSuchFamily { role: &'static str, ip: IpAddr },
    #[error("SNAT start port {0} is below {SNAT_PORT_MIN}")]
    SnatStartTooLow(u16),
    #[error("SNAT port range {start}-{end}: start is above end")]
    SnatRangeReversed { start: u16, end: u16 },
    #[error("floating IP {0} is given twice")]
    FloatingTwice(IpAddr),
    #[error("internet gateways for {0}: it is not one of the port's external addresses")]
    GatewayForUnknownIp(IpAddr),
    #[error("internet gateways for {0}: none given")]
    NoGateways(IpAddr),
}

impl ExternalIps {
    /// Whether the port has no external address at all.
    pub fn is_empty(&self) -> bool {
        self.snat.is_none() && self.ephemeral.is_none() && self.floating.is_empty()
    }

    /// Checks the addresses against the port's private ones: a port range inside
    /// 1024-65535 with start <= end, and every address of a family the port has (a
    /// v6 external address for a v4-only guest could never be used).
    pub fn validate(
        &self,
        ipv4: Option<Ipv4Addr>,
        ipv6: Option<Ipv6Addr>,
    ) -> Result<(), ExternalIpsError> {
        let family = |role: &'static str, ip: IpAddr| {
            let ok = match ip {
                IpAddr::V4(_) => ipv4.is_some(),
                IpAddr::V6(_) => ipv6.is_some(),
            };
            match ok {
                true => Ok(()),
                false => Err(ExternalIpsError::NoSuchFamily { role, ip }),
            }
        };
        if let Some(s) = &self.snat {
            family("SNAT", s.ip)?;
            if s.start < SNAT_PORT_MIN {
                return Err(ExternalIpsError::SnatStartTooLow(s.start));
            }
            if s.start > s.end {
                return Err(ExternalIpsError::SnatRangeReversed {
                    start: s.start,
                    end: s.end,
                });
            }
        }
        if let Some(ip) = self.ephemeral {
            family("ephemeral", ip)?;
        }
        for (i, &ip) in self.floating.iter().enumerate() {
            family("floating", ip)?;
            if self.floating[..i].contains(&ip) {
                return Err(ExternalIpsError::FloatingTwice(ip));
            }
        }
        for (&ip, gateways) in &self.gateways {
            if !self.has(ip) {
                return Err(ExternalIpsError::GatewayForUnknownIp(ip));
            }
            if gateways.is_empty() {
                return Err(ExternalIpsError::NoGateways(ip));
            }
        }
        Ok(())
    }

    /// Whether `ip` is one of the addresses (SNAT, ephemeral or floating).
    fn has(&self, ip: IpAddr) -> bool {
        self.snat.is_some_and(|s| s.ip == ip)
            || self.ephemeral == Some(ip)
            || self.floating.contains(&ip)
    }
}

/// `snat 198.51.100.1:1024-2047, ephemeral 198.51.100.7, floating 192.0.2.5` (what
/// `list-ports` shows), or `-` for none.
impl fmt::Display for ExternalIps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let mut sep = "";
        if let Some(s) = &self.snat {
            write!(f, "snat {}:{}-{}", s.ip, s.start, s.end)?;
            sep = ", ";
        }
        if let Some(ip) = &self.ephemeral {
            write!(f, "{sep}ephemeral {ip}")?;
            sep = ", ";
        }
        for ip in &self.floating {
            write!(f, "{sep}floating {ip}")?;
            sep = ", ";
        }
        for (ip, gateways) in &self.gateways {
            let ids: Vec<String> = gateways.iter().map(Uuid::to_string).collect();
            write!(f, "{sep}{ip} via {}", ids.join(" "))?;
        }
        Ok(())
    }
}

/// The largest limit accepted: 400 Gbit/s, beyond any NIC a sled has.
pub const MAX_MBPS: u32 = 400_000;

/// The largest burst accepted (1 GiB).
pub const MAX_BURST_KIB: u32 = 1 << 20;

/// The largest packet rate accepted.
pub const MAX_PPS: u32 = 1_000_000_000;

/// A port's rate limits as configured (`set-port-limits`); `None` is unlimited.
/// `burst_kib` applies to both byte buckets (default: 20 ms at the rate, at least
/// four 64 KiB buffers); `pps` limits each direction separately, with a burst of
/// the rate's 20 ms (at least 64 packets). How the datapath applies them:
/// docs/operating.md, "Rate limits".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_mbps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_mbps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_kib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pps: Option<u32>,
}

/// Why rate limits are refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("{direction} limit {mbps} Mbit/s is outside 1-{MAX_MBPS} Mbit/s")]
    Rate { direction: &'static str, mbps: u32 },
    #[error("burst {0} KiB is outside 1-{MAX_BURST_KIB} KiB")]
    Burst(u32),
    #[error("burst {0} KiB given without an egress or ingress limit to apply to")]
    BurstWithoutRate(u32),
    #[error("packet rate {0} pps is outside 1-{MAX_PPS} pps")]
    Pps(u32),
}

impl PortLimits {
    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.egress_mbps.is_none() && self.ingress_mbps.is_none() && self.pps.is_none()
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<(), LimitsError> {
        for (direction, v) in [("egress", self.egress_mbps), ("ingress", self.ingress_mbps)] {
            if let Some(mbps) = v.filter(|&m| m == 0 || m > MAX_MBPS) {
                return Err(LimitsError::Rate { direction, mbps });
            }
        }
        if let Some(b) = self.burst_kib {
            if b == 0 || b > MAX_BURST_KIB {
                return Err(LimitsError::Burst(b));
            }
            if self.egress_mbps.is_none() && self.ingress_mbps.is_none() {
                return Err(LimitsError::BurstWithoutRate(b));
            }
        }
        match self.pps {
            Some(p) if p == 0 || p > MAX_PPS => Err(LimitsError::Pps(p)),
            _ => Ok(()),
        }
    }

    /// `egress 100 Mbit/s, ingress 1000 Mbit/s, burst 512 KiB, 10000 pps`, or `-`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.egress_mbps {
            parts.push(format!("egress {m} Mbit/s"));
        }
        if let Some(m) = self.ingress_mbps {
            parts.push(format!("ingress {m} Mbit/s"));
        }
        if let Some(b) = self.burst_kib {
            parts.push(format!("burst {b} KiB"));
        }
        if let Some(p) = self.pps {
            parts.push(format!("{p} pps"));
        }
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(", ")
        }
    }
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

/// A word that names no direction.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid direction {0:?}: expected in, out or both")]
pub struct CidrDirError(pub String);

impl core::str::FromStr for CidrDir {
    type Err = CidrDirError;
    fn from_str(s: &str) -> Result<Self, CidrDirError> {
        match s.to_ascii_lowercase().as_str() {
            "in" => Ok(CidrDir::In),
            "out" => Ok(CidrDir::Out),
            "both" => Ok(CidrDir::Both),
            _ => Err(CidrDirError(s.to_string())),
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

/// Most prefixes a port may allow per direction: the datapath scans them linearly
/// (only for frames not to or from the guest's own addresses).
pub const MAX_PORT_CIDRS: usize = 64;

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
    /// External attached subnets (`attach-subnet -e`, opteadm's): exempt from
    /// NAT, so the internet reaches their addresses as they are. Each is attached
    /// (in both lists above) and is detached with them, never one way only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<IpNet>,
}

/// Why a prefix cannot be allowed or removed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error(transparent)]
    HostBits(#[from] HostBitsError),
    #[error("prefix {net} is IPv{family}, but port {port:?} has no IPv{family} address")]
    NoSuchFamily {
        net: IpNet,
        family: u8,
        port: String,
    },
    #[error("prefix {0} is not a range of unicast addresses a guest may use")]
    NotUnicast(IpNet),
    #[error("port {port:?} already allows {net} (direction {dir})")]
    AlreadyAllowed {
        port: String,
        net: IpNet,
        dir: &'static str,
    },
    #[error(
        "port {port:?} already allows {MAX_PORT_CIDRS} prefixes (direction {dir}); {net} is one too many"
    )]
    TooMany {
        port: String,
        net: IpNet,
        dir: &'static str,
    },
    #[error("port {port:?} does not allow {net} (direction {dir})")]
    NotAllowed {
        port: String,
        net: IpNet,
        dir: &'static str,
    },
    #[error("external subnet {net}: exempt from NAT both ways or not at all; it cannot be allowed {dir} only (attach-subnet -e)")]
    ExternalOneWay { net: IpNet, dir: CidrDir },
    #[error("{net} is an external attached subnet of port {port:?}: detach it both ways (detach-subnet), not {dir} only")]
    ExternalHalf {
        port: String,
        net: IpNet,
        dir: CidrDir,
    },
    #[error("external subnet {net} of port {port:?} is not attached both ways (in and out)")]
    ExternalNotAttached { port: String, net: IpNet },
}

impl PortCidrs {
    pub fn is_empty(&self) -> bool {
        self.inbound.is_empty() && self.outbound.is_empty() && self.external.is_empty()
    }

    /// Attaches `net` as an external subnet, exempt from NAT (`attach-subnet
    /// -e`): [`Self::allow`] both ways, and marked. Refuses what `allow` refuses,
    /// and `dir` other than both. Nothing changes on a refusal.
    pub fn allow_external(
        &mut self,
        net: IpNet,
        dir: CidrDir,
        cfg: &PortConfig,
    ) -> Result<(), CidrError> {
        if dir != CidrDir::Both {
            return Err(CidrError::ExternalOneWay { net, dir });
        }
        self.allow(net, dir, cfg)?;
        self.external.push(net);
        Ok(())
    }

    /// Adds `net` for `dir`. Refuses: host bits set, a prefix of a family the port
    /// has no address of, one already allowed that way, more than
    /// [`MAX_PORT_CIDRS`]. Nothing changes on a refusal.
    pub fn allow(&mut self, net: IpNet, dir: CidrDir, cfg: &PortConfig) -> Result<(), CidrError> {
        check_cidr(net, cfg)?;
        let lists = [
            (dir.has_in(), &self.inbound, "in"),
            (dir.has_out(), &self.outbound, "out"),
        ];
        for (wanted, list, dir) in lists {
            let port = || cfg.name.clone();
            if wanted && list.contains(&net) {
                return Err(CidrError::AlreadyAllowed {
                    port: port(),
                    net,
                    dir,
                });
            }
            if wanted && list.len() >= MAX_PORT_CIDRS {
                return Err(CidrError::TooMany {
                    port: port(),
                    net,
                    dir,
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

    /// Removes `net` for `dir`; refuses when it is not allowed that way (for
    /// `both`, either way), and one way of an external subnet (it would be exempt
    /// from NAT one way only). Nothing changes on a refusal.
    pub fn remove(&mut self, net: IpNet, dir: CidrDir, port: &str) -> Result<(), CidrError> {
        if dir != CidrDir::Both && self.external.contains(&net) {
            return Err(CidrError::ExternalHalf {
                port: port.to_string(),
                net,
                dir,
            });
        }
        let lists = [
            (dir.has_in(), &self.inbound, "in"),
            (dir.has_out(), &self.outbound, "out"),
        ];
        for (wanted, list, dir) in lists {
            if wanted && !list.contains(&net) {
                return Err(CidrError::NotAllowed {
                    port: port.to_string(),
                    net,
                    dir,
                });
            }
        }
        if dir.has_in() {
            self.inbound.retain(|n| *n != net);
        }
        if dir.has_out() {
            self.outbound.retain(|n| *n != net);
        }
        self.external.retain(|n| *n != net);
        Ok(())
    }

    /// Checks a whole set against the port (restored or created with it): each
    /// prefix as `allow` checks it, and each external subnet attached both ways,
    /// once.
    pub fn validate(&self, cfg: &PortConfig) -> Result<(), CidrError> {
        let mut rebuilt = PortCidrs::default();
        for n in &self.inbound {
            rebuilt.allow(*n, CidrDir::In, cfg)?;
        }
        for n in &self.outbound {
            rebuilt.allow(*n, CidrDir::Out, cfg)?;
        }
        for (i, n) in self.external.iter().enumerate() {
            if self.external[..i].contains(n) {
                return Err(CidrError::AlreadyAllowed {
                    port: cfg.name.clone(),
                    net: *n,
                    dir: "external",
                });
            }
            if !(self.inbound.contains(n) && self.outbound.contains(n)) {
                return Err(CidrError::ExternalNotAttached {
                    port: cfg.name.clone(),
                    net: *n,
                });
            }
        }
        Ok(())
    }
}

/// A prefix written with host bits set (`10.9.0.1/6`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("prefix {0} has host bits set (the network is {network})", network = .0.trunc())]
pub struct HostBitsError(pub IpNet);

/// Refuses a prefix with host bits set, naming the network it would stand for, as
/// `ip route` does: the operator meant one of the two, and a prefix kept as typed
/// would not be the one matched.
pub fn check_network(net: IpNet) -> Result<(), HostBitsError> {
    match net.trunc() == net {
        true => Ok(()),
        false => Err(HostBitsError(net)),
    }
}

fn check_cidr(net: IpNet, cfg: &PortConfig) -> Result<(), CidrError> {
    check_network(net)?;
    let (has, family) = match net {
        IpNet::V4(_) => (cfg.ipv4.is_some(), 4),
        IpNet::V6(_) => (cfg.ipv6.is_some(), 6),
    };
    if !has {
        return Err(CidrError::NoSuchFamily {
            net,
            family,
            port: cfg.name.clone(),
        });
    }
    let a = net.addr();
    if a.is_multicast() || a.is_loopback() {
        return Err(CidrError::NotUnicast(net));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::sample_port;

    fn sample() -> PortConfig {
        sample_port("opte0", 5)
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
        let mut p = sample();
        p.name = "a-name-of-16-byt".into();
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("1 to 15 bytes"));
    }

    #[test]
    fn search_lists_are_dns_names_that_fit_dhcpv4() {
        let mut p = sample();
        p.domain_search = vec!["eng.oxide.internal".into(), "oxide.internal.".into()];
        assert!(p.validate().is_ok());
        for bad in ["a..b", "has space.com", "", "x,y.com", &"x".repeat(64)] {
            p.domain_search = vec!["ok.com".into(), bad.into()];
            let e = p.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        p.domain_search = (0..5)
            .map(|i| format!("{i}{}.com", "x".repeat(50)))
            .collect();
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("takes 285 bytes") && e.contains("0xxx"), "{e}");
        let json = serde_json::to_string(&sample()).unwrap();
        assert!(!json.contains("domain_search"), "{json}");
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
        assert_eq!(cidrs.outbound, ["0.0.0.0/0".parse::<IpNet>().unwrap()]);
        // A saved set is checked as a whole, duplicates too.
        c.cidrs = PortCidrs {
            inbound: vec!["10.1.0.0/16".parse().unwrap(); 2],
            ..PortCidrs::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("10.1.0.0/16") && e.contains("already"), "{e}");
        let json = serde_json::to_string(&PortCidrs::default()).unwrap();
        assert_eq!(json, "{}");
        let e = cidrs
            .remove("10.9.0.0/16".parse().unwrap(), CidrDir::Both, "opte0")
            .unwrap_err();
        assert!(e.to_string().contains("does not allow 10.9.0.0/16"), "{e}");
        let e = check_network("10.9.0.1/6".parse().unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "prefix 10.9.0.1/6 has host bits set (the network is 8.0.0.0/6)"
        );
    }

    /// What the engine checked of a prefix until it trusted the API for it
    /// (datapath/engine/tests/routing.rs): multicast refused, a prefix allowed one
    /// way refused when asked for both and still free the other way, a removal
    /// naming the direction that lacks it, and at most `MAX_PORT_CIDRS` a way.
    #[test]
    fn allowed_prefixes_are_refused_by_name_and_change_nothing() {
        let c = sample();
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let mut cidrs = PortCidrs::default();
        let e = cidrs
            .allow(net("224.0.0.0/4"), CidrDir::Out, &c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("224.0.0.0/4") && e.contains("unicast"), "{e}");
        let e = cidrs
            .allow(net("192.168.50.1/24"), CidrDir::In, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("192.168.50.1/24") && e.contains("host bits"),
            "{e}"
        );
        cidrs
            .allow(net("192.168.50.0/24"), CidrDir::In, &c)
            .unwrap();
        let e = cidrs
            .allow(net("192.168.50.0/24"), CidrDir::Both, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("192.168.50.0/24") && e.contains("already"),
            "{e}"
        );
        assert!(cidrs.outbound.is_empty(), "nothing changed on the refusal");
        cidrs
            .allow(net("192.168.50.0/24"), CidrDir::Out, &c)
            .unwrap();
        cidrs
            .remove(net("192.168.50.0/24"), CidrDir::In, "opte0")
            .unwrap();
        let e = cidrs
            .remove(net("192.168.50.0/24"), CidrDir::Both, "opte0")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("192.168.50.0/24") && e.contains("direction in"),
            "{e}"
        );
        assert_eq!(cidrs.outbound, [net("192.168.50.0/24")], "kept");
        let mut full = PortCidrs::default();
        for i in 0..MAX_PORT_CIDRS {
            full.allow(net(&format!("10.{i}.0.0/16")), CidrDir::Out, &c)
                .unwrap();
        }
        let e = full
            .allow(net("10.200.0.0/16"), CidrDir::Out, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("10.200.0.0/16") && e.contains("one too many"),
            "{e}"
        );
    }

    /// An external subnet is attached both ways, removed both ways only, and a
    /// saved one must be attached (once).
    #[test]
    fn external_subnets_are_attached_and_detached_whole() {
        let mut c = sample();
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let mut cidrs = PortCidrs::default();
        let e = cidrs
            .allow_external(net("203.0.113.0/24"), CidrDir::In, &c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("203.0.113.0/24") && e.contains("in only"), "{e}");
        let e = cidrs
            .allow_external(net("203.0.113.1/24"), CidrDir::Both, &c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("host bits"), "{e}");
        assert!(cidrs.is_empty(), "nothing changed on the refusals");
        cidrs
            .allow_external(net("203.0.113.0/24"), CidrDir::Both, &c)
            .unwrap();
        assert_eq!(cidrs.external, [net("203.0.113.0/24")]);
        assert_eq!(cidrs.inbound, cidrs.external);
        assert_eq!(cidrs.outbound, cidrs.external);
        let e = cidrs
            .remove(net("203.0.113.0/24"), CidrDir::Out, "opte0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("203.0.113.0/24") && e.contains("detach"), "{e}");
        c.cidrs = cidrs.clone();
        assert!(c.validate().is_ok());
        let json = serde_json::to_string(&cidrs).unwrap();
        assert!(json.contains(r#""external":["203.0.113.0/24"]"#), "{json}");
        cidrs
            .remove(net("203.0.113.0/24"), CidrDir::Both, "opte0")
            .unwrap();
        assert!(cidrs.is_empty());
        // Saved sets: an external subnet not attached, or twice.
        c.cidrs = PortCidrs {
            inbound: vec![net("203.0.113.0/24")],
            external: vec![net("203.0.113.0/24")],
            ..PortCidrs::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("203.0.113.0/24") && e.contains("not attached"),
            "{e}"
        );
        c.cidrs.outbound = c.cidrs.inbound.clone();
        c.cidrs.external.push(net("203.0.113.0/24"));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("203.0.113.0/24") && e.contains("already"), "{e}");
    }

    #[test]
    fn external_addresses_are_checked_against_the_port() {
        let v4 = Some("172.30.0.5".parse().unwrap());
        let snat = |start, end| ExternalIps {
            snat: Some(SnatRange {
                ip: "198.51.100.1".parse().unwrap(),
                start,
                end,
            }),
            ..Default::default()
        };
        assert!(snat(1024, 2047).validate(v4, None).is_ok());
        let e = snat(80, 2047).validate(v4, None).unwrap_err().to_string();
        assert!(e.contains("80") && e.contains("1024"), "{e}");
        let e = snat(5000, 4000).validate(v4, None).unwrap_err().to_string();
        assert!(e.contains("5000-4000"), "{e}");
        let e = snat(1024, 2047)
            .validate(None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SNAT IP 198.51.100.1"), "{e}");
        // Of a family the port has no private address of, whatever its role.
        let v6 = ExternalIps {
            ephemeral: Some("2001:db8::7".parse().unwrap()),
            ..Default::default()
        };
        let e = v6.validate(v4, None).unwrap_err().to_string();
        assert!(e.contains("ephemeral IP 2001:db8::7"), "{e}");
        let twice = ExternalIps {
            floating: vec!["192.0.2.5".parse().unwrap(); 2],
            ..Default::default()
        };
        let e = twice.validate(v4, None).unwrap_err().to_string();
        assert!(e.contains("192.0.2.5 is given twice"), "{e}");
        assert_eq!(snat(1024, 2047).to_string(), "snat 198.51.100.1:1024-2047");
        // Internet gateways: only for the port's own addresses, at least one each.
        let id: Uuid = "0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a".parse().unwrap();
        let mut gw = snat(1024, 2047);
        gw.gateways
            .insert("198.51.100.1".parse().unwrap(), BTreeSet::from([id]));
        assert!(gw.validate(v4, None).is_ok());
        assert_eq!(
            gw.to_string(),
            "snat 198.51.100.1:1024-2047, 198.51.100.1 via 0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a"
        );
        let mut stranger = gw.clone();
        stranger
            .gateways
            .insert("192.0.2.9".parse().unwrap(), BTreeSet::from([id]));
        let e = stranger.validate(v4, None).unwrap_err().to_string();
        assert!(e.contains("192.0.2.9") && e.contains("not one of"), "{e}");
        gw.gateways
            .insert("198.51.100.1".parse().unwrap(), BTreeSet::new());
        let e = gw.validate(v4, None).unwrap_err().to_string();
        assert!(e.contains("198.51.100.1: none given"), "{e}");
        // Saved before gateways existed: none.
        let old: ExternalIps =
            serde_json::from_str(r#"{"snat":null,"ephemeral":null,"floating":[]}"#).unwrap();
        assert!(old.gateways.is_empty());
        assert!(snat(1024, 2047)
            .snat
            .unwrap()
            .overlaps(&snat(2047, 3000).snat.unwrap()));
    }

    #[test]
    fn limits_are_checked_and_described() {
        let l = PortLimits {
            egress_mbps: Some(100),
            ingress_mbps: None,
            burst_kib: Some(512),
            pps: Some(10_000),
        };
        assert!(l.validate().is_ok());
        assert_eq!(l.describe(), "egress 100 Mbit/s, burst 512 KiB, 10000 pps");
        for (bad, named) in [
            (
                PortLimits {
                    ingress_mbps: Some(0),
                    ..l
                },
                "ingress limit 0 Mbit/s",
            ),
            (
                PortLimits {
                    egress_mbps: None,
                    ..l
                },
                "without an egress or ingress limit",
            ),
            (
                PortLimits {
                    egress_mbps: Some(0),
                    ..l
                },
                "egress limit 0 Mbit/s",
            ),
            (
                PortLimits {
                    ingress_mbps: Some(MAX_MBPS + 1),
                    ..l
                },
                "ingress limit 400001 Mbit/s is outside 1-400000",
            ),
            (
                PortLimits {
                    burst_kib: Some(0),
                    ..l
                },
                "burst 0 KiB",
            ),
            (PortLimits { pps: Some(0), ..l }, "packet rate 0 pps"),
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(named), "{e}");
        }
        assert_eq!(PortLimits::default().describe(), "-");
    }
}
