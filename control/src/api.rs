//! The control API: what `xdeadm` (or any orchestrator) may ask `overlayd`, and what it
//! answers.
//!
//! The protocol is one JSON object per line over a Unix stream socket, both ways:
//! `{"version":1,"op":"set-v2p",...}` and `{"version":1,"ok":{...}}` or
//! `{"version":1,"error":"..."}`. The version is checked before anything else is
//! decoded, so a client built for another protocol gets a clear refusal instead of a
//! confusing field error. Types here are the stable surface: the engine's own types
//! appear only where they are already plain data with a stable serde form
//! ([`PortConfig`], [`Vni`], [`MacAddr`]); inspection results the engine produces
//! (stats, MTU budget, RA, layer and flow dumps) travel as the engine serialises them.

use core::fmt;
use core::str::FromStr;
use engine::ExternalIps;
use engine::V2bEntry;
use engine::{CidrDir, PortConfig, PortLimits, PortState, RouteClass, Vni};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv6Addr};
use wire::MacAddr;

/// The protocol version this build speaks.
pub const API_VERSION: u32 = 1;

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_API_SOCKET: &str = "/run/overlayd/api.sock";

/// Requests are refused above this size: no legitimate request comes close (a full
/// firewall rule set is a few hundred KiB at most), and an unbounded line would let a
/// client make the daemon allocate without limit.
pub const MAX_LINE: usize = 4 << 20;

/// One request on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestEnvelope {
    pub version: u32,
    #[serde(flatten)]
    pub request: Request,
}

/// One response on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResponseEnvelope {
    pub version: u32,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Success with a typed reply, or a refusal whose text names the bad value. A refused
/// request has changed nothing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok(Reply),
    Error(String),
}

/// Every verb of the admin tool (bar `ra listen`, which runs inside a guest).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    CreatePort(Box<CreatePort>),
    DeletePort {
        name: String,
    },
    ListPorts,
    SetV2p(V2pEntry),
    ClearV2p {
        vpc_ip: IpAddr,
        vni: Vni,
        /// opteadm's form names the whole mapping: when given, the mapping must be
        /// exactly this (a stale command does not remove a newer mapping).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<V2pTarget>,
    },
    DumpV2p,
    /// opteadm's `set-v2b PREFIX ENDPOINT...`: traffic to `prefix` routed to the
    /// internet gateway may leave by these boundary-services endpoints (added to
    /// those the prefix has).
    SetV2b {
        prefix: IpNet,
        endpoints: Vec<Ipv6Addr>,
    },
    /// `clear-v2b PREFIX ENDPOINT...`: removes these endpoints from the prefix (the
    /// prefix goes with its last one).
    ClearV2b {
        prefix: IpNet,
        endpoints: Vec<Ipv6Addr>,
    },
    /// The V2B table in force, `--boundary-services` shorthand included.
    DumpV2b,
    AddRouterEntry {
        port: String,
        #[serde(flatten)]
        entry: RouteEntry,
    },
    DelRouterEntry {
        port: String,
        dest: IpNet,
        /// The class of the route to delete; `system` when absent.
        #[serde(default, skip_serializing_if = "RouteClass::is_system")]
        class: RouteClass,
    },
    DumpRoutes {
        port: String,
    },
    AddFwRule {
        port: String,
        rule: FwRule,
    },
    RmFwRule {
        port: String,
        direction: Direction,
        priority: u16,
        filters: FwFilters,
    },
    /// Removes the rule with this id (as `list-fw-rules` and `dump-layer PORT
    /// firewall` show it); with `direction`, only if the rule looks that way
    /// (opteadm's `rm-fw-rule --dir DIR ID`). `remove-fw-rule PORT ID` gives none.
    RmFwRuleId {
        port: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        direction: Option<Direction>,
        id: u64,
    },
    /// The port's firewall rules as configured, with their ids.
    ListFwRules {
        port: String,
    },
    /// `allow-cidr PORT PREFIX --dir in|out` (and `attach-subnet`, `dir` both):
    /// the guest may receive frames to (`in`) and send frames from (`out`)
    /// addresses of `prefix` besides its own (OPTE's transit IPs and attached
    /// subnets); saved with the port, shown by `list-ports --json` as
    /// `config.cidrs`.
    AllowCidr {
        port: String,
        prefix: IpNet,
        dir: CidrDir,
    },
    /// `remove-cidr PORT PREFIX --dir in|out` (and `detach-subnet`, `dir` both).
    RemoveCidr {
        port: String,
        prefix: IpNet,
        dir: CidrDir,
    },
    /// `pause-port`: the port drops every frame, both ways (counted
    /// `port_paused`), keeping its flows, connections and rules; saved.
    PausePort {
        port: String,
    },
    /// `resume-port`: a paused port carries traffic again, its connections where
    /// they were.
    ResumePort {
        port: String,
    },
    SetFwRules {
        port: String,
        rules: Vec<FwRule>,
    },
    DumpLayer {
        port: String,
        layer: String,
    },
    ListLayers {
        port: String,
    },
    /// The port's tracked connections (TCP, and UDP/ICMP too).
    DumpTcpFlows {
        port: String,
    },
    /// One page of the port's unified flow table.
    /// Replaces the port's external addresses (`set-external-ips`); its flows are
    /// decided again.
    SetExternalIps {
        port: String,
        #[serde(flatten)]
        external: ExternalIps,
    },
    /// Replaces the port's rate limits (`set-port-limits`; none: unlimited).
    SetPortLimits {
        port: String,
        #[serde(flatten)]
        limits: PortLimits,
    },
    DumpUft {
        port: String,
        /// Where the page starts: the `next` of the previous page (the first page
        /// without it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<u64>,
        /// Most entries in the page; the daemon's largest page (4096) without it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    ClearUft {
        port: String,
    },
    Stats {
        port: Option<String>,
    },
    Mtu {
        port: String,
    },
    Ra {
        port: String,
    },
    /// `doctor`: the daemon checks the host and its own setup.
    Doctor,
    /// `path-check`: probe the underlay path to `peer`, or to every sled V2P names.
    PathCheck {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<Ipv6Addr>,
    },
    /// Per worker: its core, ports, queues, rounds and busy ratio
    /// (`xdeadm workers`).
    Workers,
    /// `capture`: copies of a port's frames into a pcapng file the daemon writes.
    Capture(CaptureSpec),
}

/// What `capture` copies, for how long, and where to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSpec {
    pub port: String,
    /// Also the underlay frames of the port's traffic (see `crate::capture`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub underlay: bool,
    /// Stop after this many frames (default: only the time limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Stop after this many seconds (default 10, at most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u32>,
    /// The pcapng file the daemon writes: an absolute path, new or empty.
    pub file: std::path::PathBuf,
}

impl CaptureSpec {
    /// How long a capture runs without `seconds`, and at most.
    pub const DEFAULT_SECONDS: u32 = 10;
    pub const MAX_SECONDS: u32 = 3600;

    /// How long the capture runs (the daemon refuses it out of range).
    pub fn duration(&self) -> std::time::Duration {
        let s = self.seconds.unwrap_or(Self::DEFAULT_SECONDS);
        std::time::Duration::from_secs(u64::from(s.min(Self::MAX_SECONDS)))
    }
}

/// How a capture ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaptureEnd {
    /// `count` frames were written.
    Count,
    /// `seconds` passed.
    Time,
    /// The port was deleted (or its worker stopped) meanwhile.
    PortGone,
}

/// `capture`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureReport {
    pub port: String,
    pub file: std::path::PathBuf,
    /// Frames written to the file.
    pub frames: u64,
    /// Frames not captured because the file was not written fast enough (the
    /// capture's bounded queue was full).
    pub dropped: u64,
    pub ended: CaptureEnd,
}

impl Request {
    /// Whether the request changes configuration (and so the persisted state).
    pub fn is_mutation(&self) -> bool {
        matches!(
            self,
            Request::CreatePort(_)
                | Request::DeletePort { .. }
                | Request::SetV2p(_)
                | Request::ClearV2p { .. }
                | Request::SetV2b { .. }
                | Request::ClearV2b { .. }
                | Request::AddRouterEntry { .. }
                | Request::DelRouterEntry { .. }
                | Request::AddFwRule { .. }
                | Request::RmFwRule { .. }
                | Request::RmFwRuleId { .. }
                | Request::SetFwRules { .. }
                | Request::SetExternalIps { .. }
                | Request::SetPortLimits { .. }
                | Request::AllowCidr { .. }
                | Request::RemoveCidr { .. }
                | Request::PausePort { .. }
                | Request::ResumePort { .. }
        )
    }
}

/// `create-xde`: the port's configuration plus where its tap goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePort {
    pub config: PortConfig,
    /// Network namespace (by name, as `ip netns` knows it) to move the tap into; the
    /// daemon's own namespace when absent.
    #[serde(default)]
    pub netns: Option<String>,
    /// An existing interface to attach the port to instead of making a tap: the
    /// host side of a hypervisor's tap (QEMU, libvirt), which the daemon reads and
    /// writes with a packet socket and never deletes. Excludes `netns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<String>,
    /// Serve the guest over vhost-user at this socket instead of a tap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<VhostUser>,
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

/// A virtual-to-physical mapping: the guest `vpc_ip` in VPC `vni` has MAC `vpc_mac`
/// and lives on the sled whose underlay address is `underlay_ip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2pEntry {
    pub vpc_ip: IpAddr,
    pub vpc_mac: MacAddr,
    pub underlay_ip: Ipv6Addr,
    pub vni: Vni,
}

/// The guest MAC and sled of a V2P mapping, as opteadm's `clear-v2p` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2pTarget {
    pub vpc_mac: MacAddr,
    pub underlay_ip: Ipv6Addr,
}

/// Where the router sends traffic matching a destination prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteTarget {
    /// Inside the VPC: the overlay layer looks the destination up in V2P.
    Subnet,
    /// Out of the rack through boundary services (the internet gateway).
    Igw,
    /// Discarded (counted).
    Drop,
    /// To the VPC guest with this address (`ip4=ADDR`, `ip6=ADDR`): the packet goes,
    /// unchanged, to that guest (an appliance whose port admits the destination).
    Ip(IpAddr),
}

impl FromStr for RouteTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let ip = |v4: bool, a: &str| -> Result<RouteTarget, String> {
            let addr: IpAddr = a
                .parse()
                .map_err(|_| format!("invalid route target {s:?}: {a:?} is not an address"))?;
            if addr.is_ipv4() != v4 {
                return Err(format!(
                    "invalid route target {s:?}: {a:?} is not an IPv{} address",
                    if v4 { 4 } else { 6 }
                ));
            }
            Ok(RouteTarget::Ip(addr))
        };
        match s.split_once('=') {
            Some(("ip4", a)) => ip(true, a),
            Some(("ip6", a)) => ip(false, a),
            _ => match s {
                "subnet" => Ok(RouteTarget::Subnet),
                "igw" => Ok(RouteTarget::Igw),
                "drop" => Ok(RouteTarget::Drop),
                _ => Err(format!(
                    "invalid route target {s:?}: expected subnet, igw, drop, ip4=ADDR or ip6=ADDR"
                )),
            },
        }
    }
}

impl fmt::Display for RouteTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteTarget::Subnet => "subnet",
            RouteTarget::Igw => "igw",
            RouteTarget::Drop => "drop",
            RouteTarget::Ip(IpAddr::V4(a)) => return write!(f, "ip4={a}"),
            RouteTarget::Ip(IpAddr::V6(a)) => return write!(f, "ip6={a}"),
        })
    }
}

/// One router entry of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    pub dest: IpNet,
    pub target: RouteTarget,
    /// Path MTU of this route when it differs from the port's (e.g. an external
    /// destination known to take less than the jumbo MTU).
    #[serde(default)]
    pub mtu: Option<u16>,
    /// `system` (the default; absent from state saved before classes) or
    /// `custom` (wins a tie with a `system` route of the same prefix).
    #[serde(default, skip_serializing_if = "RouteClass::is_system")]
    pub class: RouteClass,
}

/// Which way a firewall rule looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Traffic arriving at the guest.
    In,
    /// Traffic the guest sends.
    Out,
}

impl FromStr for Direction {
    type Err = String;
    /// Case-insensitive, as opteadm's `--dir IN` is.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "in" => Ok(Direction::In),
            "out" => Ok(Direction::Out),
            _ => Err(format!("invalid direction {s:?}: expected in or out")),
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::In => "in",
            Direction::Out => "out",
        })
    }
}

/// What a matching firewall rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FwAction {
    Allow,
    Deny,
}

impl FromStr for FwAction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "allow" => Ok(FwAction::Allow),
            "deny" => Ok(FwAction::Deny),
            _ => Err(format!(
                "invalid firewall action {s:?}: expected allow or deny"
            )),
        }
    }
}

impl fmt::Display for FwAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FwAction::Allow => "allow",
            FwAction::Deny => "deny",
        })
    }
}

/// The remote end a firewall rule matches: the source for inbound rules, the
/// destination for outbound ones; or, with `vni`, the VPC the traffic travels in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FwHost {
    Any,
    Ip(IpAddr),
    Subnet(IpNet),
    /// Traffic of VPC `vni`: inbound, the Geneve VNI a frame came in with;
    /// outbound, the VNI it leaves with (the port's own for a destination in the
    /// VPC). Traffic from or to outside the VPC (the internet, through boundary
    /// services) matches no `vni` host.
    Vni(Vni),
}

impl FromStr for FwHost {
    type Err = String;
    /// `any`, an address or a prefix; also opteadm's `ip=ADDR`, `subnet=CIDR` and
    /// `vni=N`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("any") {
            return Ok(FwHost::Any);
        }
        match s.split_once('=') {
            Some(("ip", v)) => {
                return v
                    .parse()
                    .map(FwHost::Ip)
                    .map_err(|_| format!("invalid firewall host {s:?}: {v:?} is not an IP address"))
            }
            Some(("subnet", v)) => {
                return v
                    .parse()
                    .map(FwHost::Subnet)
                    .map_err(|_| format!("invalid firewall host {s:?}: {v:?} is not a prefix"))
            }
            Some(("vni", v)) => {
                return v
                    .parse::<u32>()
                    .ok()
                    .and_then(|n| Vni::new(n).ok())
                    .map(FwHost::Vni)
                    .ok_or_else(|| {
                        format!("invalid firewall host {s:?}: {v:?} is not a VNI (0 to 16777215)")
                    })
            }
            Some((k, _)) => {
                return Err(format!(
                    "invalid firewall host {s:?}: unknown kind {k:?} (expected any, ip=ADDR, subnet=CIDR or vni=N)"
                ))
            }
            None => {}
        }
        if s.contains('/') {
            return s
                .parse()
                .map(FwHost::Subnet)
                .map_err(|_| format!("invalid subnet {s:?}"));
        }
        s.parse().map(FwHost::Ip).map_err(|_| {
            format!("invalid firewall host {s:?}: expected any, an IP address, a prefix or vni=N")
        })
    }
}

impl fmt::Display for FwHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FwHost::Any => f.write_str("any"),
            FwHost::Ip(ip) => write!(f, "{ip}"),
            FwHost::Subnet(net) => write!(f, "{net}"),
            FwHost::Vni(v) => write!(f, "vni={v}"),
        }
    }
}

/// The protocol a firewall rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FwProto {
    Any,
    Tcp,
    Udp,
    Icmp,
    Icmp6,
    /// Any other IP protocol, by number (`proto=N`; the four above are written by
    /// name).
    Number(u8),
}

impl FwProto {
    /// Only TCP and UDP have ports to filter on.
    pub fn has_ports(self) -> bool {
        matches!(self, FwProto::Tcp | FwProto::Udp)
    }

    /// Only ICMP and ICMPv6 have message types.
    pub fn has_icmp_types(self) -> bool {
        matches!(self, FwProto::Icmp | FwProto::Icmp6)
    }

    /// The IP protocol number, `None` for any.
    pub fn number(self) -> Option<u8> {
        match self {
            FwProto::Any => None,
            FwProto::Tcp => Some(6),
            FwProto::Udp => Some(17),
            FwProto::Icmp => Some(1),
            FwProto::Icmp6 => Some(58),
            FwProto::Number(n) => Some(n),
        }
    }

    /// The protocol numbered `n`, by name when it has one.
    pub fn from_number(n: u8) -> FwProto {
        match n {
            6 => FwProto::Tcp,
            17 => FwProto::Udp,
            1 => FwProto::Icmp,
            58 => FwProto::Icmp6,
            n => FwProto::Number(n),
        }
    }
}

impl FromStr for FwProto {
    type Err = String;
    /// Case-insensitive, as opteadm's `--protocol TCP` is; `proto=N` for any IP
    /// protocol number. opteadm's `arp` is refused by name (ARP never reaches the
    /// firewall); ICMP types (`icmp:8`) are [`FwProtoSpec`]'s.
    fn from_str(s: &str) -> Result<Self, String> {
        let l = s.to_ascii_lowercase();
        match l.as_str() {
            "any" => Ok(FwProto::Any),
            "tcp" => Ok(FwProto::Tcp),
            "udp" => Ok(FwProto::Udp),
            "icmp" => Ok(FwProto::Icmp),
            "icmp6" => Ok(FwProto::Icmp6),
            "arp" => Err(format!(
                "protocol {s:?} is not supported yet: ARP never reaches the firewall (the gateway answers or denies it)"
            )),
            _ => match l.strip_prefix("proto=") {
                Some(n) => n.parse::<u8>().map(FwProto::from_number).map_err(|_| {
                    format!("invalid protocol {s:?}: {n:?} is not a protocol number (0 to 255)")
                }),
                None => Err(format!(
                    "invalid protocol {s:?}: expected any, tcp, udp, icmp[:TYPE[/CODE]], icmp6[:TYPE[/CODE]] or proto=N"
                )),
            },
        }
    }
}

impl fmt::Display for FwProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FwProto::Any => f.write_str("any"),
            FwProto::Tcp => f.write_str("tcp"),
            FwProto::Udp => f.write_str("udp"),
            FwProto::Icmp => f.write_str("icmp"),
            FwProto::Icmp6 => f.write_str("icmp6"),
            FwProto::Number(n) => write!(f, "proto={n}"),
        }
    }
}

/// An ICMP or ICMPv6 message type, and optionally code, a rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IcmpMatch {
    #[serde(rename = "type")]
    pub icmp_type: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u8>,
}

impl fmt::Display for IcmpMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.icmp_type)?;
        if let Some(c) = self.code {
            write!(f, "/{c}")?;
        }
        Ok(())
    }
}

/// A protocol as opteadm's `--protocol` writes it: [`FwProto`], or
/// `icmp:TYPE[/CODE]` / `icmp6:TYPE[/CODE]` (e.g. `icmp6:2` Packet Too Big,
/// `icmp:3/4` fragmentation needed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FwProtoSpec {
    pub proto: FwProto,
    pub icmp: Option<IcmpMatch>,
}

impl FromStr for FwProtoSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some((p, ty)) = s.split_once(':') else {
            return Ok(FwProtoSpec {
                proto: s.parse()?,
                icmp: None,
            });
        };
        let proto = match p.to_ascii_lowercase().as_str() {
            "icmp" => FwProto::Icmp,
            "icmp6" => FwProto::Icmp6,
            _ => {
                return Err(format!(
                    "invalid protocol {s:?}: only icmp and icmp6 take a message type"
                ))
            }
        };
        let num = |v: &str, what: &str| {
            v.parse::<u8>().map_err(|_| {
                format!("invalid protocol {s:?}: {v:?} is not an ICMP {what} (0 to 255)")
            })
        };
        let (t, code) = match ty.split_once('/') {
            Some((t, c)) => (num(t, "type")?, Some(num(c, "code")?)),
            None => (num(ty, "type")?, None),
        };
        Ok(FwProtoSpec {
            proto,
            icmp: Some(IcmpMatch { icmp_type: t, code }),
        })
    }
}

/// Destination ports of a rule: one port, or an inclusive range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FwPorts {
    One(u16),
    Range { start: u16, end: u16 },
}

impl FwPorts {
    /// (first, last), inclusive.
    pub fn bounds(self) -> (u16, u16) {
        match self {
            FwPorts::One(p) => (p, p),
            FwPorts::Range { start, end } => (start, end),
        }
    }
}

impl FromStr for FwPorts {
    type Err = String;
    /// `80` or `8000-8080`.
    fn from_str(s: &str) -> Result<Self, String> {
        let port = |p: &str| {
            p.parse::<u16>()
                .map_err(|_| format!("invalid port {p:?} in {s:?}"))
        };
        match s.split_once('-') {
            Some((a, b)) => Ok(FwPorts::Range {
                start: port(a)?,
                end: port(b)?,
            }),
            None => port(s).map(FwPorts::One),
        }
    }
}

impl fmt::Display for FwPorts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FwPorts::One(p) => write!(f, "{p}"),
            FwPorts::Range { start, end } => write!(f, "{start}-{end}"),
        }
    }
}

/// The match part of a firewall rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FwFilters {
    pub host: FwHost,
    pub proto: FwProto,
    /// Destination ports and port ranges (inbound: the guest's service; outbound:
    /// the remote's); empty means any. Only for TCP/UDP.
    #[serde(default)]
    pub ports: Vec<FwPorts>,
    /// The ICMP/ICMPv6 message type (and code); only for icmp and icmp6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp: Option<IcmpMatch>,
}

impl FwFilters {
    /// Refuses filters that could never match as written, naming the value.
    pub fn validate(&self) -> Result<(), String> {
        if !self.ports.is_empty() && !self.proto.has_ports() {
            return Err(format!(
                "ports {} given for protocol {}, which has no ports",
                self.ports_text(),
                self.proto
            ));
        }
        for p in &self.ports {
            let (start, end) = p.bounds();
            if start == 0 {
                return Err(format!("port {p}: port 0 cannot be matched"));
            }
            if start > end {
                return Err(format!("port range {p} starts after it ends"));
            }
        }
        if let Some(i) = self.icmp {
            if !self.proto.has_icmp_types() {
                return Err(format!(
                    "ICMP type {i} given for protocol {}, which has no ICMP types",
                    self.proto
                ));
            }
        }
        Ok(())
    }

    /// The ports as `--ports` takes them (`80,8000-8080`).
    pub fn ports_text(&self) -> String {
        let v: Vec<String> = self.ports.iter().map(ToString::to_string).collect();
        v.join(",")
    }

    /// The protocol as `--protocol` takes it (`tcp`, `icmp6:2`, `icmp:3/4`).
    pub fn proto_text(&self) -> String {
        match self.icmp {
            Some(i) => format!("{}:{i}", self.proto),
            None => self.proto.to_string(),
        }
    }
}

/// One firewall rule. Rules are evaluated in ascending priority; the first match
/// decides. A rule is identified by its `id`, which the daemon assigns when the rule
/// is added (unique within the port, never reused, kept across restarts), or by
/// (direction, priority, filters).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FwRule {
    /// Assigned by the daemon; what a request gives here is not used (0: not
    /// assigned yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub id: u64,
    pub direction: Direction,
    pub priority: u16,
    pub action: FwAction,
    pub filters: FwFilters,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl FwRule {
    pub fn same_identity(&self, direction: Direction, priority: u16, filters: &FwFilters) -> bool {
        self.direction == direction && self.priority == priority && &self.filters == filters
    }
}

impl fmt::Display for FwRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.id != 0 {
            write!(f, "id={} ", self.id)?;
        }
        write!(
            f,
            "{} prio={} {} host={} proto={}",
            self.direction,
            self.priority,
            self.action,
            self.filters.host,
            self.filters.proto_text()
        )?;
        if !self.filters.ports.is_empty() {
            write!(f, " ports={}", self.filters.ports_text())?;
        }
        Ok(())
    }
}

/// A port as the state file keeps it: its configuration and where its tap goes, or
/// which interface it is attached to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    pub config: PortConfig,
    pub netns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<VhostUser>,
    /// The interface the port is attached to (`create-xde --attach`); absent for a
    /// port with a tap of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<String>,
}

/// A port as `list-ports` shows it: what was configured and, when the dataplane does
/// not hold it (refused when the daemon restored it), why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStatus {
    #[serde(flatten)]
    pub port: PortInfo,
    /// Absent for a port that is in the dataplane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_applied: Option<NotApplied>,
    /// Whether the port's tap is served (absent from a daemon without taps, and
    /// for a port not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<PortLink>,
    /// `ready` (no frame yet since created or restored), `running` or `paused`;
    /// absent for a port not applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PortState>,
}

/// Whether a port's tap is served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum PortLink {
    Up,
    /// The tap went away (its guest's namespace or the device was deleted); the
    /// daemon re-opens it, on a back-off, once it can (the guest is back).
    Down {
        /// When it went, in milliseconds since the Unix epoch.
        since_unix_ms: u64,
        reason: String,
    },
}

/// Why a saved item (a port, a V2P mapping) is kept in the state but not in the
/// dataplane, and when the daemon tries it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotApplied {
    /// The dataplane's refusal at the last attempt.
    pub reason: String,
    pub attempts: u32,
    /// Until the next attempt (sooner for a port whose namespace appears).
    pub retry_in_ms: u64,
}

/// A successful answer; the variant says what it carries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "kebab-case")]
pub enum Reply {
    /// A change was applied (and persisted).
    Done,
    Ports(Vec<PortStatus>),
    V2p(Vec<V2pEntry>),
    V2b(Vec<V2bEntry>),
    Routes(Vec<RouteEntry>),
    FwRules(Vec<FwRule>),
    /// Engine-produced inspection results (stats, MTU budget, RA, layer and flow
    /// dumps), exactly as the engine serialises them.
    Inspect(serde_json::Value),
    /// `doctor`'s checks, in order.
    Doctor(Vec<Check>),
    /// `path-check`: one result per peer.
    PathCheck(Vec<PeerPath>),
    Capture(CaptureReport),
}

/// How a `doctor` check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Pass,
    /// Works, but not as well as it could (or could not be verified).
    Warn,
    /// Breaks traffic, or will under load.
    Fail,
}

impl fmt::Display for CheckStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckStatus::Pass => "pass",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "FAIL",
        })
    }
}

/// One `doctor` check: what was looked at, what was found and, unless it passed,
/// how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Stable name, e.g. `underlay-mtu` or `port-tap:opte0`.
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The underlay path to one peer sled, as `path-check` measured it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerPath {
    pub peer: Ipv6Addr,
    /// The size the path should carry: this sled's underlay MTU.
    pub wanted: u16,
    /// The largest IPv6 packet (unfragmented ICMPv6 echo) that made the round
    /// trip; `None`: not even the 1280-byte minimum did.
    pub largest: Option<u16>,
    pub probes: u32,
    /// Why the peer could not be probed (the probe socket refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PeerPath {
    /// Whether the path carries full-size frames.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.largest == Some(self.wanted)
    }
}

/// Decodes one request line, refusing other protocol versions before looking at the
/// rest. The error is the text to send back.
pub fn decode_request(line: &[u8]) -> Result<Request, String> {
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("request is not valid JSON: {e}"))?;
    check_version(&value)?;
    let env: RequestEnvelope =
        serde_json::from_value(value).map_err(|e| format!("invalid request: {e}"))?;
    Ok(env.request)
}

/// Decodes one response line, refusing other protocol versions.
pub fn decode_response(line: &[u8]) -> Result<Outcome, String> {
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("response is not valid JSON: {e}"))?;
    check_version(&value)?;
    let env: ResponseEnvelope =
        serde_json::from_value(value).map_err(|e| format!("invalid response: {e}"))?;
    Ok(env.outcome)
}

fn check_version(value: &serde_json::Value) -> Result<(), String> {
    match value.get("version") {
        None => Err(format!(
            "message has no \"version\" field (this side speaks version {API_VERSION})"
        )),
        Some(v) if v.as_u64() == Some(u64::from(API_VERSION)) => Ok(()),
        Some(v) => Err(format!(
            "unsupported API version {v} (this side speaks version {API_VERSION})"
        )),
    }
}

/// Encodes a request as one line (with the trailing newline).
pub fn encode_request(request: &Request) -> Vec<u8> {
    encode_line(&RequestEnvelope {
        version: API_VERSION,
        request: request.clone(),
    })
}

/// Encodes a response as one line (with the trailing newline).
pub fn encode_response(outcome: Outcome) -> Vec<u8> {
    encode_line(&ResponseEnvelope {
        version: API_VERSION,
        outcome,
    })
}

fn encode_line<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising these types cannot fail: no maps with non-string keys, no
    // non-finite floats. Should that ever change, the peer gets an error line rather
    // than the daemon panicking.
    let mut out = serde_json::to_vec(v).unwrap_or_else(|e| {
        format!(
            "{{\"version\":{API_VERSION},\"error\":\"cannot encode message: {}\"}}",
            e.to_string().replace('"', "'")
        )
        .into_bytes()
    });
    out.push(b'\n');
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample_port(name: &str, last: u8) -> PortConfig {
        PortConfig {
            name: name.into(),
            guest_mac: MacAddr([0xa8, 0x40, 0x25, 0xff, 0x00, last]),
            gateway_mac: "a8:40:25:00:00:01".parse().unwrap(),
            ipv4: Some(format!("172.30.0.{last}").parse().unwrap()),
            ipv6: Some(format!("fd00:1122:3344:100::{last}").parse().unwrap()),
            vpc_subnet4: Some("172.30.0.0/22".parse().unwrap()),
            vpc_subnet6: Some("fd00:1122:3344:100::/64".parse().unwrap()),
            gateway_ipv4: Some("172.30.0.1".parse().unwrap()),
            vni: Vni::new(1701).unwrap(),
            mtu: 8500,
            external_jumbo: false,
            dns_servers4: vec!["1.1.1.1".parse().unwrap()],
            dns_servers6: vec![],
            hostname: Some("web".into()),
            domain: None,
            external: Default::default(),
            limits: Default::default(),
            cidrs: Default::default(),
        }
    }

    fn all_requests() -> Vec<Request> {
        let filters = FwFilters {
            host: FwHost::Subnet("10.0.0.0/8".parse().unwrap()),
            proto: FwProto::Tcp,
            ports: vec![
                FwPorts::One(22),
                FwPorts::Range {
                    start: 8000,
                    end: 8080,
                },
            ],
            icmp: None,
        };
        let rule = FwRule {
            id: 0,
            direction: Direction::In,
            priority: 100,
            action: FwAction::Allow,
            filters: filters.clone(),
        };
        vec![
            Request::CreatePort(Box::new(CreatePort {
                config: sample_port("opte0", 5),
                netns: Some("guest0".into()),
                vhost_user: None,
                attach: None,
            })),
            Request::CreatePort(Box::new(CreatePort {
                config: sample_port("vm0", 6),
                netns: None,
                attach: Some("vnet0".into()),
                vhost_user: None,
            })),
            Request::CreatePort(Box::new(CreatePort {
                config: sample_port("vm1", 7),
                netns: None,
                attach: None,
                vhost_user: Some(VhostUser {
                    socket: "/run/overlayd/vm1.sock".into(),
                    mode: VhostUserMode::Client,
                }),
            })),
            Request::DeletePort {
                name: "opte0".into(),
            },
            Request::ListPorts,
            Request::SetV2p(V2pEntry {
                vpc_ip: "172.30.0.6".parse().unwrap(),
                vpc_mac: "a8:40:25:ff:00:06".parse().unwrap(),
                underlay_ip: "fd00:99::2".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
            }),
            Request::ClearV2p {
                vpc_ip: "fd00:1122:3344:100::6".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
                expect: None,
            },
            Request::ClearV2p {
                vpc_ip: "172.30.0.6".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
                expect: Some(V2pTarget {
                    vpc_mac: "a8:40:25:ff:00:06".parse().unwrap(),
                    underlay_ip: "fd00:99::2".parse().unwrap(),
                }),
            },
            Request::DumpV2p,
            Request::SetV2b {
                prefix: "0.0.0.0/0".parse().unwrap(),
                endpoints: vec![
                    "fd00:99::b1".parse().unwrap(),
                    "fd00:99::b2".parse().unwrap(),
                ],
            },
            Request::ClearV2b {
                prefix: "::/0".parse().unwrap(),
                endpoints: vec!["fd00:99::b1".parse().unwrap()],
            },
            Request::DumpV2b,
            Request::AddRouterEntry {
                port: "opte0".into(),
                entry: RouteEntry {
                    class: Default::default(),
                    dest: "0.0.0.0/0".parse().unwrap(),
                    target: RouteTarget::Igw,
                    mtu: Some(1500),
                },
            },
            Request::DelRouterEntry {
                class: Default::default(),
                port: "opte0".into(),
                dest: "::/0".parse().unwrap(),
            },
            Request::DumpRoutes {
                port: "opte0".into(),
            },
            Request::AddFwRule {
                port: "opte0".into(),
                rule: rule.clone(),
            },
            Request::RmFwRule {
                port: "opte0".into(),
                direction: Direction::In,
                priority: 100,
                filters,
            },
            Request::SetFwRules {
                port: "opte0".into(),
                rules: vec![rule],
            },
            Request::DumpLayer {
                port: "opte0".into(),
                layer: "firewall".into(),
            },
            Request::ListLayers {
                port: "opte0".into(),
            },
            Request::DumpTcpFlows {
                port: "opte0".into(),
            },
            Request::RmFwRuleId {
                port: "opte0".into(),
                direction: Some(Direction::Out),
                id: 2,
            },
            Request::RmFwRuleId {
                port: "opte0".into(),
                direction: None,
                id: 7,
            },
            Request::ListFwRules {
                port: "opte0".into(),
            },
            Request::PausePort {
                port: "opte0".into(),
            },
            Request::ResumePort {
                port: "opte0".into(),
            },
            Request::SetFwRules {
                port: "opte0".into(),
                rules: vec![FwRule {
                    id: 4,
                    direction: Direction::In,
                    priority: 10,
                    action: FwAction::Deny,
                    filters: FwFilters {
                        host: FwHost::Vni(Vni::new(10).unwrap()),
                        proto: FwProto::Icmp6,
                        ports: vec![],
                        icmp: Some(IcmpMatch {
                            icmp_type: 128,
                            code: Some(0),
                        }),
                    },
                }],
            },
            Request::DumpUft {
                port: "opte0".into(),
                cursor: None,
                limit: None,
            },
            Request::DumpUft {
                port: "opte0".into(),
                cursor: Some(1 << 32),
                limit: Some(100),
            },
            Request::ClearUft {
                port: "opte0".into(),
            },
            Request::SetExternalIps {
                port: "opte0".into(),
                external: ExternalIps {
                    snat: Some(engine::SnatRange {
                        ip: "198.51.100.1".parse().unwrap(),
                        start: 1024,
                        end: 2047,
                    }),
                    ephemeral: None,
                    floating: vec!["192.0.2.5".parse().unwrap()],
                },
            },
            Request::SetPortLimits {
                port: "opte0".into(),
                limits: PortLimits {
                    egress_mbps: Some(100),
                    ingress_mbps: None,
                    burst_kib: Some(512),
                    pps: Some(10_000),
                },
            },
            Request::AllowCidr {
                port: "opte0".into(),
                prefix: "192.168.50.0/24".parse().unwrap(),
                dir: CidrDir::Both,
            },
            Request::RemoveCidr {
                port: "opte0".into(),
                prefix: "fd00:50::/64".parse().unwrap(),
                dir: CidrDir::Out,
            },
            Request::AddRouterEntry {
                port: "opte0".into(),
                entry: RouteEntry {
                    dest: "192.168.50.0/24".parse().unwrap(),
                    target: RouteTarget::Ip("172.30.0.6".parse().unwrap()),
                    mtu: None,
                    class: RouteClass::Custom,
                },
            },
            Request::Stats { port: None },
            Request::Stats {
                port: Some("opte0".into()),
            },
            Request::Mtu {
                port: "opte0".into(),
            },
            Request::Ra {
                port: "opte0".into(),
            },
            Request::Doctor,
            Request::PathCheck { peer: None },
            Request::PathCheck {
                peer: Some("fd00:99::2".parse().unwrap()),
            },
            Request::Workers,
            Request::Capture(CaptureSpec {
                port: "opte0".into(),
                underlay: false,
                count: Some(10),
                seconds: None,
                file: "/run/overlayd/c.pcapng".into(),
            }),
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for req in all_requests() {
            let line = encode_request(&req);
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(
                line.iter().filter(|&&b| b == b'\n').count(),
                1,
                "one line per request"
            );
            assert_eq!(decode_request(&line).unwrap(), req);
        }
    }

    #[test]
    fn wire_form_is_versioned_and_tagged() {
        let line = encode_request(&Request::Mtu { port: "p".into() });
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["op"], "mtu");
        assert_eq!(v["port"], "p");
    }

    #[test]
    fn every_reply_round_trips() {
        let replies = vec![
            Outcome::Ok(Reply::Done),
            Outcome::Ok(Reply::Ports(vec![
                PortStatus {
                    port: PortInfo {
                        config: sample_port("opte1", 7),
                        netns: None,
                        vhost_user: None,
                        attach: None,
                    },
                    not_applied: None,
                    link: Some(PortLink::Down {
                        since_unix_ms: 1_700_000_000_000,
                        reason: "read: File descriptor in bad state".into(),
                    }),
                    state: Some(PortState::Running),
                },
                PortStatus {
                    port: PortInfo {
                        config: sample_port("opte2", 8),
                        netns: Some("guest2".into()),
                        vhost_user: None,
                        attach: None,
                    },
                    not_applied: Some(NotApplied {
                        reason: "network namespace \"guest2\" not found".into(),
                        attempts: 3,
                        retry_in_ms: 4000,
                    }),
                    link: None,
                    state: None,
                },
            ])),
            Outcome::Ok(Reply::Inspect(serde_json::json!({"drops": {"bad_vni": 3}}))),
            Outcome::Ok(Reply::Doctor(vec![Check {
                name: "underlay-mtu".into(),
                status: CheckStatus::Fail,
                detail: "ul0 MTU 1500".into(),
                fix: Some("ip link set ul0 mtu 9000".into()),
            }])),
            Outcome::Ok(Reply::PathCheck(vec![PeerPath {
                peer: "fd00:99::3".parse().unwrap(),
                wanted: 9000,
                largest: Some(1500),
                probes: 15,
                error: None,
            }])),
            Outcome::Ok(Reply::Capture(CaptureReport {
                port: "opte0".into(),
                file: "/run/overlayd/c.pcapng".into(),
                frames: 10,
                dropped: 2,
                ended: CaptureEnd::Count,
            })),
            Outcome::Error("invalid MAC address \"zz\"".into()),
        ];
        for r in replies {
            assert_eq!(decode_response(&encode_response(r.clone())).unwrap(), r);
        }
    }

    #[test]
    fn other_versions_are_refused_by_name() {
        let e = decode_request(br#"{"version":2,"op":"list-ports"}"#).unwrap_err();
        assert!(e.contains("unsupported API version 2"), "{e}");
        let e = decode_request(br#"{"op":"list-ports"}"#).unwrap_err();
        assert!(e.contains("version"), "{e}");
        let e = decode_response(br#"{"version":"1","ok":{"kind":"done"}}"#).unwrap_err();
        assert!(e.contains("\"1\""), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let e = decode_request(
            br#"{"version":1,"op":"set-v2p","vpc_ip":"10.0.0.1","vpc_mac":"zz:00:00:00:00:00","underlay_ip":"fd00::1","vni":5}"#,
        )
        .unwrap_err();
        assert!(e.contains("zz:00:00:00:00:00"), "{e}");
        let e =
            decode_request(br#"{"version":1,"op":"clear-v2p","vpc_ip":"10.0.0.1","vni":16777216}"#)
                .unwrap_err();
        assert!(e.contains("16777216"), "{e}");
        let e = decode_request(br#"{"version":1,"op":"frobnicate"}"#).unwrap_err();
        assert!(e.contains("frobnicate"), "{e}");
    }

    #[test]
    fn cli_words_parse_and_print_back() {
        for s in ["subnet", "igw", "drop"] {
            assert_eq!(s.parse::<RouteTarget>().unwrap().to_string(), s);
        }
        for s in ["any", "10.1.2.3", "fd00::/64", "vni=7"] {
            assert_eq!(s.parse::<FwHost>().unwrap().to_string(), s);
        }
        assert!("router"
            .parse::<RouteTarget>()
            .unwrap_err()
            .contains("router"));
        for bad in ["vni=16777216", "vni=x", "vni=-1"] {
            let e = bad.parse::<FwHost>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        assert!("sctp".parse::<FwProto>().unwrap_err().contains("sctp"));
        // Protocol numbers: named when they have a name, 0-255 only.
        assert_eq!("proto=47".parse::<FwProto>(), Ok(FwProto::Number(47)));
        assert_eq!("PROTO=6".parse::<FwProto>(), Ok(FwProto::Tcp));
        assert_eq!(FwProto::Number(47).to_string(), "proto=47");
        let e = "proto=256".parse::<FwProto>().unwrap_err();
        assert!(e.contains("\"256\""), "{e}");
        // ICMP types and codes.
        for (s, proto, t, c) in [
            ("icmp6:2", FwProto::Icmp6, 2, None),
            ("ICMP:3/4", FwProto::Icmp, 3, Some(4)),
            ("icmp:8", FwProto::Icmp, 8, None),
        ] {
            let p: FwProtoSpec = s.parse().unwrap();
            assert_eq!(p.proto, proto, "{s}");
            assert_eq!(
                p.icmp,
                Some(IcmpMatch {
                    icmp_type: t,
                    code: c
                }),
                "{s}"
            );
        }
        for (bad, named) in [
            ("tcp:80", "only icmp and icmp6"),
            ("icmp:300", "\"300\""),
            ("icmp6:1/x", "\"x\""),
            ("icmp:", "\"\""),
        ] {
            let e = bad.parse::<FwProtoSpec>().unwrap_err();
            assert!(e.contains(bad) && e.contains(named), "{bad}: {e}");
        }
        // Ports and ranges.
        assert_eq!("80".parse::<FwPorts>(), Ok(FwPorts::One(80)));
        assert_eq!(
            "8000-8080".parse::<FwPorts>().unwrap().to_string(),
            "8000-8080"
        );
        assert!("80-x".parse::<FwPorts>().unwrap_err().contains("\"x\""));
    }

    #[test]
    fn saved_rules_without_ids_ranges_or_icmp_types_still_read() {
        let old = r#"{"direction":"in","priority":100,"action":"allow","filters":{"host":{"subnet":"10.0.0.0/8"},"proto":"tcp","ports":[22,443]}}"#;
        let r: FwRule = serde_json::from_str(old).unwrap();
        assert_eq!(r.id, 0);
        assert_eq!(r.filters.ports, [FwPorts::One(22), FwPorts::One(443)]);
        assert_eq!(r.filters.icmp, None);
        // Written back unchanged (no id, no icmp).
        assert_eq!(serde_json::to_string(&r).unwrap(), old);
        let new = r#"{"id":9,"direction":"out","priority":5,"action":"deny","filters":{"host":{"vni":10},"proto":{"number":47},"ports":[]}}"#;
        let r: FwRule = serde_json::from_str(new).unwrap();
        assert_eq!(
            r.to_string(),
            "id=9 out prio=5 deny host=vni=10 proto=proto=47"
        );
        let ranged = r#"{"direction":"in","priority":1,"action":"allow","filters":{"host":"any","proto":"udp","ports":[{"start":5000,"end":5010}]}}"#;
        let r: FwRule = serde_json::from_str(ranged).unwrap();
        assert_eq!(r.filters.ports_text(), "5000-5010");
    }

    #[test]
    fn filters_refuse_ports_without_a_port_protocol() {
        let f = FwFilters {
            host: FwHost::Any,
            proto: FwProto::Icmp,
            ports: vec![FwPorts::One(80)],
            icmp: None,
        };
        assert!(f.validate().unwrap_err().contains("80"));
        let tcp = |ports, icmp| FwFilters {
            host: FwHost::Any,
            proto: FwProto::Tcp,
            ports,
            icmp,
        };
        let e = tcp(vec![FwPorts::Range { start: 90, end: 80 }], None)
            .validate()
            .unwrap_err();
        assert!(e.contains("90-80"), "{e}");
        let e = tcp(vec![FwPorts::Range { start: 0, end: 80 }], None)
            .validate()
            .unwrap_err();
        assert!(e.contains("0-80"), "{e}");
        let i = IcmpMatch {
            icmp_type: 8,
            code: None,
        };
        let e = tcp(vec![], Some(i)).validate().unwrap_err();
        assert!(e.contains("ICMP type 8") && e.contains("tcp"), "{e}");
    }
}
