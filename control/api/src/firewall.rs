//! Firewall rules as the API carries them, and their text forms: the words of
//! `add-fw-rule`'s flags and the one-line rules of `set-fw-rules` (opteadm's
//! `dir=in action=allow priority=10 hosts=any protocol=TCP port=22` and
//! `xdeadm`'s own `direction=in priority=10 host=any proto=tcp ports=22,443`).

use crate::Vni;
use core::fmt;
use core::str::FromStr;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// A firewall word or rule line that does not parse, or filters that could never
/// match as written; each names the bad value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FwSyntaxError {
    #[error("invalid direction {0:?}: expected in or out")]
    Direction(String),
    #[error("invalid firewall action {0:?}: expected allow or deny")]
    Action(String),
    #[error("invalid firewall host {word:?}: {why}")]
    Host { word: String, why: &'static str },
    #[error("invalid subnet {0:?}")]
    Subnet(String),
    #[error("protocol {0:?} is not supported yet: ARP never reaches the firewall (the gateway answers or denies it)")]
    Arp(String),
    #[error("invalid protocol {word:?}: {why}")]
    Protocol { word: String, why: String },
    #[error("invalid port {port:?} in {word:?}")]
    Port { port: String, word: String },
    #[error("{error} (ports: {list:?})")]
    PortList {
        list: String,
        error: Box<FwSyntaxError>,
    },
    #[error("ports {ports} given for protocol {proto}, which has no ports")]
    PortsWithoutPortProtocol { ports: String, proto: FwProto },
    #[error("port {0}: port 0 cannot be matched")]
    PortZero(FwPorts),
    #[error("port range {0} starts after it ends")]
    ReversedRange(FwPorts),
    #[error("ICMP type {icmp} given for protocol {proto}, which has no ICMP types")]
    IcmpWithoutIcmp { icmp: IcmpMatch, proto: FwProto },
    #[error("rule {line:?}: {error}")]
    Rule {
        line: String,
        error: Box<FwSyntaxError>,
    },
    #[error("{word:?} is not key=value")]
    NotKeyValue { word: String },
    #[error("invalid priority {0:?}")]
    Priority(String),
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    #[error("needs {0}")]
    Missing(&'static str),
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
    type Err = FwSyntaxError;
    /// Case-insensitive, as opteadm's `--dir IN` is.
    fn from_str(s: &str) -> Result<Self, FwSyntaxError> {
        match s.to_ascii_lowercase().as_str() {
            "in" => Ok(Direction::In),
            "out" => Ok(Direction::Out),
            _ => Err(FwSyntaxError::Direction(s.to_string())),
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
    type Err = FwSyntaxError;
    fn from_str(s: &str) -> Result<Self, FwSyntaxError> {
        match s.to_ascii_lowercase().as_str() {
            "allow" => Ok(FwAction::Allow),
            "deny" => Ok(FwAction::Deny),
            _ => Err(FwSyntaxError::Action(s.to_string())),
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
    type Err = FwSyntaxError;
    /// `any`, an address or a prefix; also opteadm's `ip=ADDR`, `subnet=CIDR` and
    /// `vni=N`.
    fn from_str(s: &str) -> Result<Self, FwSyntaxError> {
        let bad = |why| FwSyntaxError::Host {
            word: s.to_string(),
            why,
        };
        if s.eq_ignore_ascii_case("any") {
            return Ok(FwHost::Any);
        }
        match s.split_once('=') {
            Some(("ip", v)) => {
                return v
                    .parse()
                    .map(FwHost::Ip)
                    .map_err(|_| bad("not an IP address"))
            }
            Some(("subnet", v)) => {
                return v
                    .parse()
                    .map(FwHost::Subnet)
                    .map_err(|_| bad("not a prefix"))
            }
            Some(("vni", v)) => {
                return v
                    .parse::<Vni>()
                    .map(FwHost::Vni)
                    .map_err(|_| bad("not a VNI (0 to 16777215)"))
            }
            Some(_) => {
                return Err(bad(
                    "unknown kind (expected any, ip=ADDR, subnet=CIDR or vni=N)",
                ))
            }
            None => {}
        }
        if s.contains('/') {
            return s
                .parse()
                .map(FwHost::Subnet)
                .map_err(|_| FwSyntaxError::Subnet(s.to_string()));
        }
        s.parse()
            .map(FwHost::Ip)
            .map_err(|_| bad("expected any, an IP address, a prefix or vni=N"))
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
    type Err = FwSyntaxError;
    /// Case-insensitive, as opteadm's `--protocol TCP` is; `proto=N` for any IP
    /// protocol number. opteadm's `arp` is refused by name (ARP never reaches the
    /// firewall); ICMP types (`icmp:8`) are [`FwProtoSpec`]'s.
    fn from_str(s: &str) -> Result<Self, FwSyntaxError> {
        let bad = |why: String| FwSyntaxError::Protocol {
            word: s.to_string(),
            why,
        };
        let l = s.to_ascii_lowercase();
        match l.as_str() {
            "any" => Ok(FwProto::Any),
            "tcp" => Ok(FwProto::Tcp),
            "udp" => Ok(FwProto::Udp),
            "icmp" => Ok(FwProto::Icmp),
            "icmp6" => Ok(FwProto::Icmp6),
            "arp" => Err(FwSyntaxError::Arp(s.to_string())),
            _ => match l.strip_prefix("proto=") {
                Some(n) => n
                    .parse::<u8>()
                    .map(FwProto::from_number)
                    .map_err(|_| bad(format!("{n:?} is not a protocol number (0 to 255)"))),
                None => Err(bad(
                    "expected any, tcp, udp, icmp[:TYPE[/CODE]], icmp6[:TYPE[/CODE]] or proto=N"
                        .into(),
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
    type Err = FwSyntaxError;
    fn from_str(s: &str) -> Result<Self, FwSyntaxError> {
        let Some((p, ty)) = s.split_once(':') else {
            return Ok(FwProtoSpec {
                proto: s.parse()?,
                icmp: None,
            });
        };
        let bad = |why: String| FwSyntaxError::Protocol {
            word: s.to_string(),
            why,
        };
        let proto = match p.to_ascii_lowercase().as_str() {
            "icmp" => FwProto::Icmp,
            "icmp6" => FwProto::Icmp6,
            _ => return Err(bad("only icmp and icmp6 take a message type".into())),
        };
        let num = |v: &str, what: &str| {
            v.parse::<u8>()
                .map_err(|_| bad(format!("{v:?} is not an ICMP {what} (0 to 255)")))
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

    /// `22,443,8000-8080`, or `any` (opteadm's spelling of no port filter).
    pub fn parse_list(s: &str) -> Result<Vec<FwPorts>, FwSyntaxError> {
        if s.eq_ignore_ascii_case("any") {
            return Ok(Vec::new());
        }
        s.split(',')
            .map(|p| {
                p.parse::<FwPorts>().map_err(|e| FwSyntaxError::PortList {
                    list: s.to_string(),
                    error: Box::new(e),
                })
            })
            .collect()
    }
}

impl FromStr for FwPorts {
    type Err = FwSyntaxError;
    /// `80` or `8000-8080`.
    fn from_str(s: &str) -> Result<Self, FwSyntaxError> {
        let port = |p: &str| {
            p.parse::<u16>().map_err(|_| FwSyntaxError::Port {
                port: p.to_string(),
                word: s.to_string(),
            })
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
    /// Refuses filters that could never match as written.
    pub fn validate(&self) -> Result<(), FwSyntaxError> {
        if !self.ports.is_empty() && !self.proto.has_ports() {
            return Err(FwSyntaxError::PortsWithoutPortProtocol {
                ports: self.ports_text(),
                proto: self.proto,
            });
        }
        for &p in &self.ports {
            let (start, end) = p.bounds();
            if start == 0 {
                return Err(FwSyntaxError::PortZero(p));
            }
            if start > end {
                return Err(FwSyntaxError::ReversedRange(p));
            }
        }
        match self.icmp {
            Some(icmp) if !self.proto.has_icmp_types() => Err(FwSyntaxError::IcmpWithoutIcmp {
                icmp,
                proto: self.proto,
            }),
            _ => Ok(()),
        }
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

    /// Parses one rule line: `direction=in priority=10 action=allow host=any
    /// proto=tcp ports=22,443`, with opteadm's spellings of the keys (`dir`,
    /// `prio`, `hosts`, `protocol`, `port`) and values; the action defaults to
    /// allow.
    pub fn parse_line(s: &str) -> Result<FwRule, FwSyntaxError> {
        Self::parse_words(s).map_err(|e| FwSyntaxError::Rule {
            line: s.to_string(),
            error: Box::new(e),
        })
    }

    fn parse_words(s: &str) -> Result<FwRule, FwSyntaxError> {
        let (mut direction, mut priority, mut action) = (None, None, FwAction::Allow);
        let (mut host, mut ports) = (FwHost::Any, Vec::new());
        let mut proto = FwProtoSpec {
            proto: FwProto::Any,
            icmp: None,
        };
        for word in s.split_whitespace() {
            let (k, v) = word
                .split_once('=')
                .ok_or_else(|| FwSyntaxError::NotKeyValue {
                    word: word.to_string(),
                })?;
            match k.to_ascii_lowercase().as_str() {
                "direction" | "dir" => direction = Some(v.parse()?),
                "priority" | "prio" => {
                    priority = Some(
                        v.parse::<u16>()
                            .map_err(|_| FwSyntaxError::Priority(v.to_string()))?,
                    );
                }
                "action" => action = v.parse()?,
                "host" | "hosts" => host = v.parse()?,
                "proto" | "protocol" => proto = v.parse()?,
                "ports" | "port" => ports = FwPorts::parse_list(v)?,
                _ => return Err(FwSyntaxError::UnknownKey(k.to_string())),
            }
        }
        let rule = FwRule {
            id: 0,
            direction: direction.ok_or(FwSyntaxError::Missing("direction=in|out"))?,
            priority: priority.ok_or(FwSyntaxError::Missing("priority=N"))?,
            action,
            filters: FwFilters {
                host,
                proto: proto.proto,
                ports,
                icmp: proto.icmp,
            },
        };
        rule.filters.validate()?;
        Ok(rule)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_words_parse_and_print_back() {
        for s in ["any", "10.1.2.3", "fd00::/64", "vni=7"] {
            assert_eq!(s.parse::<FwHost>().unwrap().to_string(), s);
        }
        for bad in ["vni=16777216", "vni=x", "vni=-1"] {
            let e = bad.parse::<FwHost>().unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
        assert!("sctp"
            .parse::<FwProto>()
            .unwrap_err()
            .to_string()
            .contains("sctp"));
        // Protocol numbers: named when they have a name, 0-255 only.
        assert_eq!("proto=47".parse::<FwProto>(), Ok(FwProto::Number(47)));
        assert_eq!("PROTO=6".parse::<FwProto>(), Ok(FwProto::Tcp));
        assert_eq!(FwProto::Number(47).to_string(), "proto=47");
        let e = "proto=256".parse::<FwProto>().unwrap_err().to_string();
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
            let e = bad.parse::<FwProtoSpec>().unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains(named), "{bad}: {e}");
        }
        // Ports and ranges.
        assert_eq!("80".parse::<FwPorts>(), Ok(FwPorts::One(80)));
        assert_eq!(
            "8000-8080".parse::<FwPorts>().unwrap().to_string(),
            "8000-8080"
        );
        assert!("80-x"
            .parse::<FwPorts>()
            .unwrap_err()
            .to_string()
            .contains("\"x\""));
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
        assert!(f.validate().unwrap_err().to_string().contains("80"));
        let tcp = |ports, icmp| FwFilters {
            host: FwHost::Any,
            proto: FwProto::Tcp,
            ports,
            icmp,
        };
        let e = tcp(vec![FwPorts::Range { start: 90, end: 80 }], None)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("90-80"), "{e}");
        let e = tcp(vec![FwPorts::Range { start: 0, end: 80 }], None)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("0-80"), "{e}");
        let i = IcmpMatch {
            icmp_type: 8,
            code: None,
        };
        let e = tcp(vec![], Some(i)).validate().unwrap_err().to_string();
        assert!(e.contains("ICMP type 8") && e.contains("tcp"), "{e}");
    }
}
