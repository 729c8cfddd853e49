//! Rules: predicates over a flow and one action.
//!
//! A rule is built, then finalized (a type-state): [`Rule<Building, A>`] collects
//! predicates, and [`Rule::finalize`] checks them and returns a [`Rule<Finalized, A>`],
//! the only kind a [`crate::machinery::layer::Layer`] accepts. A half-built or contradictory rule
//! (a port range whose start is after its end, an IPv4 source with an IPv6
//! destination) therefore never reaches the datapath.

use crate::machinery::flow::{FlowKey, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP};
use core::fmt;
use core::marker::PhantomData;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use wire::meta::InnerMeta;

/// A rule still being built.
#[derive(Clone, Debug)]
pub struct Building;
/// A rule whose predicates were checked.
#[derive(Clone, Debug)]
pub struct Finalized;

/// Traffic direction relative to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Toward the guest.
    In,
    /// From the guest.
    Out,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::In => "in",
            Direction::Out => "out",
        })
    }
}

/// An inclusive range of L4 ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortRange {
    pub start: u16,
    pub end: u16,
}

impl PortRange {
    pub fn single(p: u16) -> PortRange {
        PortRange { start: p, end: p }
    }

    fn contains(&self, p: u16) -> bool {
        self.start <= p && p <= self.end
    }
}

/// One condition on a packet's flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Predicate {
    /// Source address inside this prefix (a single address is a /32 or /128).
    SrcIp(IpNet),
    DstIp(IpNet),
    /// IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6).
    Proto(u8),
    SrcPort(PortRange),
    DstPort(PortRange),
    /// ICMP or ICMPv6 message type.
    IcmpType(u8),
    /// ICMP or ICMPv6 message code (with an [`Predicate::IcmpType`]).
    IcmpCode(u8),
    /// The VPC the packet travels in: its Geneve VNI inbound, the VNI it is
    /// encapsulated with outbound (the port's own, for a destination in the VPC).
    /// Traffic from or to outside the VPC (the Geneve External option, the internet
    /// gateway) has no VPC and matches no `Vni`.
    Vni(u32),
}

/// The fields of a packet that predicates look at.
#[derive(Clone, Copy, Debug)]
pub struct MatchFields {
    pub key: FlowKey,
    /// The ICMP/ICMPv6 type, for ICMP packets.
    pub icmp_type: Option<u8>,
    /// The VPC the packet travels in (see [`Predicate::Vni`]); `None` for traffic
    /// from or to outside the VPC, and where nobody asked (the engine works it out
    /// only for a layer with `Vni` predicates, see `Layer::uses_vni`).
    pub vpc_vni: Option<u32>,
}

impl MatchFields {
    /// The fields of packet `m` of flow `key`, with no VPC worked out (the caller
    /// fills in [`MatchFields::vpc_vni`] where a layer asks).
    pub fn of(key: &FlowKey, m: &InnerMeta) -> MatchFields {
        MatchFields {
            key: *key,
            icmp_type: (m.proto == PROTO_ICMP || m.proto == PROTO_ICMPV6).then_some(m.icmp_type),
            vpc_vni: None,
        }
    }
}

impl Predicate {
    fn matches(&self, f: &MatchFields) -> bool {
        let k = &f.key;
        let has_ports = k.proto == PROTO_TCP || k.proto == PROTO_UDP;
        match self {
            Predicate::SrcIp(n) => n.contains(&k.src_ip),
            Predicate::DstIp(n) => n.contains(&k.dst_ip),
            Predicate::Proto(p) => k.proto == *p,
            Predicate::SrcPort(r) => has_ports && r.contains(k.src_port),
            Predicate::DstPort(r) => has_ports && r.contains(k.dst_port),
            Predicate::IcmpType(t) => f.icmp_type == Some(*t),
            Predicate::IcmpCode(c) => f.icmp_type.is_some() && k.icmp_code == *c,
            Predicate::Vni(v) => f.vpc_vni == Some(*v),
        }
    }
}

impl fmt::Display for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Predicate::SrcIp(n) => write!(f, "src={n}"),
            Predicate::DstIp(n) => write!(f, "dst={n}"),
            Predicate::Proto(p) => write!(f, "proto={p}"),
            Predicate::SrcPort(r) => write!(f, "sport={}-{}", r.start, r.end),
            Predicate::DstPort(r) => write!(f, "dport={}-{}", r.start, r.end),
            Predicate::IcmpType(t) => write!(f, "icmp_type={t}"),
            Predicate::IcmpCode(c) => write!(f, "icmp_code={c}"),
            Predicate::Vni(v) => write!(f, "vni={v}"),
        }
    }
}

/// Why a rule could not be finalized; each names the offending predicate or value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("port range {start}-{end} starts after it ends")]
    PortRangeReversed { start: u16, end: u16 },
    #[error("rule names two protocols, {first} and {second}: it can never match")]
    TwoProtocols { first: u8, second: u8 },
    #[error("{predicate} needs an ICMP type too")]
    CodeWithoutType { predicate: Predicate },
    #[error("{predicate} is not a VNI (24 bits)")]
    NotAVni { predicate: Predicate },
    /// IPv4 and IPv6 prefixes in one rule (all of its predicates, as given).
    #[error("rule mixes IPv4 and IPv6 prefixes ({}): it can never match", spaced(.predicates))]
    MixedFamilies { predicates: Vec<Predicate> },
    #[error("{predicate} needs protocol TCP or UDP, not {proto}")]
    PortsNeedTcpOrUdp { predicate: Predicate, proto: u8 },
    #[error("{predicate} needs protocol ICMP or ICMPv6, not {proto}")]
    IcmpNeedsIcmp { predicate: Predicate, proto: u8 },
}

/// Predicates as a rule is written: `src=10.0.0.0/8 dst=fd00::/8`.
fn spaced(predicates: &[Predicate]) -> String {
    predicates
        .iter()
        .map(std::string::ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Rule precedence: lower values are consulted first.
pub type Priority = u16;

/// Predicates (all must hold) and one action.
#[derive(Clone, Debug)]
pub struct Rule<S, A> {
    priority: Priority,
    predicates: Vec<Predicate>,
    action: A,
    _state: PhantomData<S>,
}

impl<A> Rule<Building, A> {
    /// A rule with no predicates yet (it would match everything).
    pub fn new(priority: Priority, action: A) -> Self {
        Rule {
            priority,
            predicates: Vec::new(),
            action,
            _state: PhantomData,
        }
    }

    /// Adds a predicate (builder style).
    pub fn matching(mut self, p: Predicate) -> Self {
        self.predicates.push(p);
        self
    }

    /// Checks the predicates for contradictions; the error names the offending one.
    pub fn finalize(self) -> Result<Rule<Finalized, A>, RuleError> {
        let mut v4 = false;
        let mut v6 = false;
        let mut proto = None;
        for p in &self.predicates {
            match p {
                Predicate::SrcIp(n) | Predicate::DstIp(n) => match n {
                    IpNet::V4(_) => v4 = true,
                    IpNet::V6(_) => v6 = true,
                },
                Predicate::SrcPort(r) | Predicate::DstPort(r) if r.start > r.end => {
                    return Err(RuleError::PortRangeReversed {
                        start: r.start,
                        end: r.end,
                    });
                }
                Predicate::Proto(x) => {
                    if let Some(prev) = proto.replace(*x) {
                        if prev != *x {
                            return Err(RuleError::TwoProtocols {
                                first: prev,
                                second: *x,
                            });
                        }
                    }
                }
                _ => {}
            }
        }
        let has_type = self
            .predicates
            .iter()
            .any(|p| matches!(p, Predicate::IcmpType(_)));
        if let Some(p) = self
            .predicates
            .iter()
            .find(|p| matches!(p, Predicate::IcmpCode(_)))
        {
            if !has_type {
                return Err(RuleError::CodeWithoutType { predicate: *p });
            }
        }
        if let Some(p) = self
            .predicates
            .iter()
            .find(|p| matches!(p, Predicate::Vni(v) if *v >= 1 << 24))
        {
            return Err(RuleError::NotAVni { predicate: *p });
        }
        if v4 && v6 {
            return Err(RuleError::MixedFamilies {
                predicates: self.predicates,
            });
        }
        for p in &self.predicates {
            match (p, proto) {
                (Predicate::SrcPort(_) | Predicate::DstPort(_), Some(x))
                    if x != PROTO_TCP && x != PROTO_UDP =>
                {
                    return Err(RuleError::PortsNeedTcpOrUdp {
                        predicate: *p,
                        proto: x,
                    });
                }
                (Predicate::IcmpType(_) | Predicate::IcmpCode(_), Some(x))
                    if x != PROTO_ICMP && x != PROTO_ICMPV6 =>
                {
                    return Err(RuleError::IcmpNeedsIcmp {
                        predicate: *p,
                        proto: x,
                    });
                }
                _ => {}
            }
        }
        Ok(Rule {
            priority: self.priority,
            predicates: self.predicates,
            action: self.action,
            _state: PhantomData,
        })
    }
}

impl<A> Rule<Finalized, A> {
    /// True if every predicate holds for `f`.
    pub fn matches(&self, f: &MatchFields) -> bool {
        self.predicates.iter().all(|p| p.matches(f))
    }
}

impl<S, A> Rule<S, A> {
    /// Whether the rule has a [`Predicate::Vni`] (its layer then needs
    /// [`MatchFields::vpc_vni`] worked out).
    pub fn uses_vni(&self) -> bool {
        self.predicates
            .iter()
            .any(|p| matches!(p, Predicate::Vni(_)))
    }

    pub fn priority(&self) -> Priority {
        self.priority
    }

    pub fn predicates(&self) -> &[Predicate] {
        &self.predicates
    }

    pub fn action(&self) -> &A {
        &self.action
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(src: &str, dst: &str, proto: u8, sp: u16, dp: u16) -> MatchFields {
        MatchFields {
            key: FlowKey {
                vni: 1,
                proto,
                src_ip: src.parse().unwrap(),
                dst_ip: dst.parse().unwrap(),
                src_port: sp,
                dst_port: dp,
                icmp_type: 0,
                icmp_code: 0,
            },
            icmp_type: None,
            vpc_vni: None,
        }
    }

    #[test]
    fn all_predicates_must_hold() {
        let r = Rule::new(10, ())
            .matching(Predicate::SrcIp("10.0.0.0/8".parse().unwrap()))
            .matching(Predicate::Proto(PROTO_TCP))
            .matching(Predicate::DstPort(PortRange { start: 80, end: 90 }))
            .finalize()
            .unwrap();
        assert!(r.matches(&fields("10.1.2.3", "1.1.1.1", 6, 5, 80)));
        assert!(r.matches(&fields("10.1.2.3", "1.1.1.1", 6, 5, 90)));
        assert!(!r.matches(&fields("10.1.2.3", "1.1.1.1", 6, 5, 91)));
        assert!(!r.matches(&fields("11.1.2.3", "1.1.1.1", 6, 5, 80)));
        assert!(!r.matches(&fields("10.1.2.3", "1.1.1.1", 17, 5, 80)));
        // An IPv6 packet never matches an IPv4 prefix.
        assert!(!r.matches(&fields("::1", "::2", 6, 5, 80)));
    }

    #[test]
    fn icmp_type_and_ports() {
        let r = Rule::new(1, ())
            .matching(Predicate::IcmpType(8))
            .finalize()
            .unwrap();
        let mut f = fields("1.1.1.1", "2.2.2.2", PROTO_ICMP, 7, 7);
        assert!(!r.matches(&f));
        f.icmp_type = Some(8);
        assert!(r.matches(&f));
        // Port predicates never match ICMP even though its key carries the identifier.
        let p = Rule::new(1, ())
            .matching(Predicate::SrcPort(PortRange::single(7)))
            .finalize()
            .unwrap();
        assert!(!p.matches(&f));
    }

    #[test]
    fn icmp_codes_and_vnis() {
        // Packet Too Big (ICMPv6 2/0) and frag-needed (ICMP 3/4), code included.
        let ptb = Rule::new(1, ())
            .matching(Predicate::Proto(PROTO_ICMPV6))
            .matching(Predicate::IcmpType(2))
            .matching(Predicate::IcmpCode(0))
            .finalize()
            .unwrap();
        let mut f = fields("fd00::1", "fd00::2", PROTO_ICMPV6, 0, 0);
        f.icmp_type = Some(2);
        assert!(ptb.matches(&f));
        f.key.icmp_code = 1;
        assert!(!ptb.matches(&f));
        f.icmp_type = Some(128);
        f.key.icmp_code = 0;
        assert!(!ptb.matches(&f));
        // ICMPv4 type 2 is not ICMPv6 type 2.
        let mut v4 = fields("1.1.1.1", "2.2.2.2", PROTO_ICMP, 0, 0);
        v4.icmp_type = Some(2);
        assert!(!ptb.matches(&v4));
        // A VNI predicate matches the packet's VPC, and nothing outside a VPC.
        let vni = Rule::new(1, ())
            .matching(Predicate::Vni(10))
            .finalize()
            .unwrap();
        assert!(vni.uses_vni() && !ptb.uses_vni());
        let mut g = fields("10.0.0.1", "10.0.0.2", PROTO_TCP, 1, 2);
        assert!(!vni.matches(&g), "outside any VPC");
        g.vpc_vni = Some(10);
        assert!(vni.matches(&g));
        g.vpc_vni = Some(11);
        assert!(!vni.matches(&g));
        // The flow key's own VNI is not what is matched.
        g.vpc_vni = None;
        g.key.vni = 10;
        assert!(!vni.matches(&g));
    }

    #[test]
    fn finalize_refuses_contradictions_naming_them() {
        let e = Rule::new(1, ())
            .matching(Predicate::DstPort(PortRange { start: 9, end: 3 }))
            .finalize()
            .unwrap_err()
            .to_string();
        assert!(e.contains("9-3"), "{e}");
        let e = Rule::new(1, ())
            .matching(Predicate::SrcIp("10.0.0.0/8".parse().unwrap()))
            .matching(Predicate::DstIp("fd00::/8".parse().unwrap()))
            .finalize()
            .unwrap_err()
            .to_string();
        assert!(e.contains("fd00::/8"), "{e}");
        let e = Rule::new(1, ())
            .matching(Predicate::Proto(PROTO_ICMP))
            .matching(Predicate::DstPort(PortRange::single(80)))
            .finalize()
            .unwrap_err()
            .to_string();
        assert!(e.contains("dport=80-80"), "{e}");
        let e = Rule::new(1, ())
            .matching(Predicate::Proto(6))
            .matching(Predicate::Proto(17))
            .finalize()
            .unwrap_err()
            .to_string();
        assert!(e.contains("6 and 17"), "{e}");
        let e = Rule::new(1, ())
            .matching(Predicate::IcmpCode(4))
            .finalize()
            .unwrap_err()
            .to_string();
        assert!(e.contains("icmp_code=4"), "{e}");
        let e = Rule::new(1, ())
            .matching(Predicate::Proto(PROTO_UDP))
            .matching(Predicate::IcmpType(3))
            .matching(Predicate::IcmpCode(4))
            .finalize()
            .unwrap_err()
            .to_string();
        assert!(e.contains("icmp_type=3") && e.contains("17"), "{e}");
        let e = Rule::new(1, ())
            .matching(Predicate::Vni(1 << 24))
            .finalize()
            .unwrap_err()
            .to_string();
        assert!(e.contains("vni=16777216"), "{e}");
    }
}
