//! The router layer: per port, longest-prefix match over IPv4 and IPv6 routes.
//!
//! Routes are rules of a [`Layer`] whose only predicate is the destination prefix and
//! whose priority is `(128 - prefix length) * 2`, plus 1 for a `system` route, so
//! the layer's "first match in priority order" is exactly longest-prefix match, a
//! `custom` route winning a tie with a `system` route of the same prefix (OPTE's
//! route classes: the control plane's VPC routes are `system`, a custom router's
//! `custom`). An IPv4 prefix never matches an IPv6 address, so the two families
//! share one table without interfering. Lookups only
//! happen on flow-table misses; a linear scan over a port's handful of routes is
//! cheaper there than maintaining a trie.

use crate::drop::DropReason;
use crate::ids::IgwId;
use crate::machinery::layer::{Layer, LayerDump, RuleId};
use crate::machinery::rule::{Direction, MatchFields, Predicate, Rule, RuleError};
use crate::vpc::port::MIN_PORT_MTU;
use core::fmt;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Where a route sends traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteTarget {
    /// Inside the VPC: the overlay's V2P table names the sled.
    VpcSubnet,
    /// Out of the rack through boundary services: through the internet gateway
    /// this names, whose external addresses the flow's source becomes, or (`None`)
    /// through any (every external address serves it).
    InternetGateway(Option<IgwId>),
    /// Discard (counted as `route_drop`).
    Drop,
    /// To the VPC guest with this address (opteadm's `ip4=`/`ip6=`): an appliance
    /// such as a VPN or firewall instance. The overlay sends the packet, unchanged,
    /// to where V2P says that guest lives (the outer destination and the inner
    /// destination MAC are the appliance's), or delivers it to the guest when it is
    /// on this sled. No mapping is a drop (`no_v2p`).
    Ip(IpAddr),
}

impl RouteTarget {
    /// Whether the packet stays in the VPC (encapsulated with the port's VNI).
    pub fn in_vpc(&self) -> bool {
        matches!(self, RouteTarget::VpcSubnet | RouteTarget::Ip(_))
    }
}

impl fmt::Display for RouteTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteTarget::VpcSubnet => "vpc_subnet",
            RouteTarget::InternetGateway(None) => "internet_gateway",
            RouteTarget::InternetGateway(Some(id)) => return write!(f, "internet_gateway={id}"),
            RouteTarget::Drop => "drop",
            RouteTarget::Ip(IpAddr::V4(a)) => return write!(f, "ip4={a}"),
            RouteTarget::Ip(IpAddr::V6(a)) => return write!(f, "ip6={a}"),
        })
    }
}

/// A route's class (OPTE's `RouterClass`): a port has at most one route of each
/// class per prefix; on equal prefixes `custom` wins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteClass {
    /// The VPC's own routes (the default, and what a new port's routes are).
    #[default]
    System,
    /// A custom router's routes: preferred over a `system` route of the same prefix.
    Custom,
}

impl RouteClass {
    pub fn is_system(&self) -> bool {
        *self == RouteClass::System
    }
}

/// A router class that is neither `system` nor `custom` (the text given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid router class {0:?}: expected system or custom")]
pub struct ParseRouteClassError(pub String);

impl core::str::FromStr for RouteClass {
    type Err = ParseRouteClassError;
    fn from_str(s: &str) -> Result<Self, ParseRouteClassError> {
        match s.to_ascii_lowercase().as_str() {
            "system" => Ok(RouteClass::System),
            "custom" => Ok(RouteClass::Custom),
            _ => Err(ParseRouteClassError(s.to_string())),
        }
    }
}

impl fmt::Display for RouteClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteClass::System => "system",
            RouteClass::Custom => "custom",
        })
    }
}

/// Why a route was refused; each names the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("route MTU {mtu} for {dst} is below the minimum of {min}", min = MIN_PORT_MTU)]
    MtuBelowMinimum { mtu: u16, dst: IpNet },
    #[error("route target {target} is of another address family than the destination {dst}")]
    TargetFamily { target: RouteTarget, dst: IpNet },
    #[error("route target {target} for {dst} is not a guest's unicast address")]
    TargetNotUnicast { target: RouteTarget, dst: IpNet },
    /// The port has a route of this class for the prefix already.
    #[error("a {class} route for {dst} already exists")]
    Exists { class: RouteClass, dst: IpNet },
    /// The port has no route of this class for exactly this prefix.
    #[error("no {class} route for {dst}")]
    NotFound { class: RouteClass, dst: IpNet },
    #[error(transparent)]
    Rule(#[from] RuleError),
}

/// A route's action: its target and an optional path MTU overriding the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteAction {
    pub target: RouteTarget,
    pub mtu: Option<u16>,
}

impl fmt::Display for RouteAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mtu {
            Some(m) => write!(f, "{} mtu={m}", self.target),
            None => write!(f, "{}", self.target),
        }
    }
}

/// One route in `dump_routes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteDump {
    pub dst: IpNet,
    pub class: RouteClass,
    pub target: RouteTarget,
    pub mtu: Option<u16>,
    /// Flows this route decided.
    pub hits: u64,
}

/// One port's routing table.
#[derive(Clone, Debug)]
pub struct Router {
    layer: Layer<RouteAction>,
}

impl Default for Router {
    fn default() -> Self {
        Router {
            layer: Layer::new("router"),
        }
    }
}

fn priority_of(dst: &IpNet, class: RouteClass) -> u16 {
    ((128 - u16::from(dst.prefix_len())) << 1) | u16::from(class.is_system())
}

fn class_of(priority: u16) -> RouteClass {
    if priority & 1 == 1 {
        RouteClass::System
    } else {
        RouteClass::Custom
    }
}

impl Router {
    fn find(&self, dst: &IpNet, class: RouteClass) -> Option<RuleId> {
        let prio = priority_of(dst, class);
        self.layer
            .rules(Direction::Out)
            .find(|(_, r)| r.predicates() == [Predicate::DstIp(*dst)] && r.priority() == prio)
            .map(|(id, _)| id)
    }

    /// [`Router::add_in`] of a `system` route.
    pub fn add(
        &mut self,
        dst: IpNet,
        target: RouteTarget,
        mtu: Option<u16>,
    ) -> Result<(), RouteError> {
        self.add_in(RouteClass::System, dst, target, mtu)
    }

    /// [`Router::del_in`] of a `system` route.
    pub fn del(&mut self, dst: IpNet) -> Result<(), RouteError> {
        self.del_in(RouteClass::System, dst)
    }

    /// Adds a route of `class`; the prefix is truncated to its network (10.1.2.3/8
    /// is 10.0.0.0/8). Refuses a second route of the class for the same prefix and
    /// MTUs below the IPv6 minimum, naming the value.
    pub fn add_in(
        &mut self,
        class: RouteClass,
        dst: IpNet,
        target: RouteTarget,
        mtu: Option<u16>,
    ) -> Result<(), RouteError> {
        let dst = dst.trunc();
        if let Some(mtu) = mtu {
            if mtu < MIN_PORT_MTU {
                return Err(RouteError::MtuBelowMinimum { mtu, dst });
            }
        }
        if let RouteTarget::Ip(a) = target {
            if a.is_ipv4() != matches!(dst, IpNet::V4(_)) {
                return Err(RouteError::TargetFamily { target, dst });
            }
            if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
                return Err(RouteError::TargetNotUnicast { target, dst });
            }
        }
        if self.find(&dst, class).is_some() {
            return Err(RouteError::Exists { class, dst });
        }
        let rule = Rule::new(priority_of(&dst, class), RouteAction { target, mtu })
            .matching(Predicate::DstIp(dst))
            .finalize()?;
        self.layer.add(Direction::Out, rule);
        Ok(())
    }

    /// Removes the route of `class` for exactly `dst`.
    pub fn del_in(&mut self, class: RouteClass, dst: IpNet) -> Result<(), RouteError> {
        let dst = dst.trunc();
        match self.find(&dst, class) {
            Some(id) => {
                self.layer.remove(Direction::Out, id);
                Ok(())
            }
            None => Err(RouteError::NotFound { class, dst }),
        }
    }

    /// The longest-prefix route for `f.key.dst_ip`.
    pub fn lookup(&mut self, f: &MatchFields) -> Result<RouteAction, DropReason> {
        match self.layer.evaluate(Direction::Out, f) {
            Some((_, a)) if a.target == RouteTarget::Drop => {
                self.layer.count_deny(Direction::Out);
                Err(DropReason::RouteDrop)
            }
            Some((_, a)) => Ok(*a),
            None => {
                self.layer.count_deny(Direction::Out);
                Err(DropReason::NoRoute)
            }
        }
    }

    /// The target [`Router::lookup`] would give, counting nothing (the firewall
    /// looks ahead to learn whether a flow stays in the VPC).
    pub fn peek_target(&self, f: &MatchFields) -> Option<RouteTarget> {
        self.layer.peek(Direction::Out, f).map(|a| a.target)
    }

    pub fn dump_routes(&self) -> Vec<RouteDump> {
        let d = self.layer.dump(("", ""));
        self.layer
            .rules(Direction::Out)
            .zip(d.outbound.rules)
            .filter_map(|((_, r), rd)| match r.predicates() {
                [Predicate::DstIp(dst)] => Some(RouteDump {
                    dst: *dst,
                    class: class_of(r.priority()),
                    target: r.action().target,
                    mtu: r.action().mtu,
                    hits: rd.hits,
                }),
                _ => None,
            })
            .collect()
    }

    pub fn dump(&self) -> LayerDump {
        self.layer.dump(("none", "drop (no_route)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinery::flow::FlowKey;

    fn to(dst: &str) -> MatchFields {
        let dst_ip: std::net::IpAddr = dst.parse().unwrap();
        let src_ip = if dst_ip.is_ipv4() {
            "10.0.0.1".parse().unwrap()
        } else {
            "fd00::1".parse().unwrap()
        };
        MatchFields {
            key: FlowKey {
                vni: 1,
                proto: 17,
                src_ip,
                dst_ip,
                src_port: 1,
                dst_port: 2,
                icmp_type: 0,
                icmp_code: 0,
            },
            icmp_type: None,
            vpc_vni: None,
        }
    }

    #[test]
    fn longest_prefix_wins_in_both_families() {
        let mut r = Router::default();
        r.add(
            "0.0.0.0/0".parse().unwrap(),
            RouteTarget::InternetGateway(None),
            None,
        )
        .unwrap();
        r.add("10.0.0.0/8".parse().unwrap(), RouteTarget::VpcSubnet, None)
            .unwrap();
        r.add("10.1.0.0/16".parse().unwrap(), RouteTarget::Drop, None)
            .unwrap();
        r.add(
            "10.1.2.0/24".parse().unwrap(),
            RouteTarget::InternetGateway(None),
            Some(1420),
        )
        .unwrap();
        r.add(
            "::/0".parse().unwrap(),
            RouteTarget::InternetGateway(None),
            None,
        )
        .unwrap();
        r.add("fd00::/64".parse().unwrap(), RouteTarget::VpcSubnet, None)
            .unwrap();
        assert_eq!(
            r.lookup(&to("8.8.8.8")).unwrap().target,
            RouteTarget::InternetGateway(None)
        );
        assert_eq!(
            r.lookup(&to("10.9.0.1")).unwrap().target,
            RouteTarget::VpcSubnet
        );
        assert_eq!(r.lookup(&to("10.1.9.1")), Err(DropReason::RouteDrop));
        assert_eq!(
            r.lookup(&to("10.1.2.3")).unwrap(),
            RouteAction {
                target: RouteTarget::InternetGateway(None),
                mtu: Some(1420)
            }
        );
        assert_eq!(
            r.lookup(&to("fd00::9")).unwrap().target,
            RouteTarget::VpcSubnet
        );
        assert_eq!(
            r.lookup(&to("2001:db8::1")).unwrap().target,
            RouteTarget::InternetGateway(None)
        );
        r.del("::/0".parse().unwrap()).unwrap();
        assert_eq!(r.lookup(&to("2001:db8::1")), Err(DropReason::NoRoute));
        let d = r.dump_routes();
        assert_eq!(d.len(), 5);
        // Dumped in evaluation order: longest prefixes first.
        let lens: Vec<u8> = d.iter().map(|r| r.dst.prefix_len()).collect();
        assert_eq!(lens, vec![64, 24, 16, 8, 0]);
        assert_eq!(d[1].dst.to_string(), "10.1.2.0/24");
        assert_eq!(d[1].hits, 1);
    }

    #[test]
    fn refusals_name_the_value() {
        let mut r = Router::default();
        r.add("10.1.2.3/8".parse().unwrap(), RouteTarget::VpcSubnet, None)
            .unwrap();
        let e = r
            .add("10.0.0.0/8".parse().unwrap(), RouteTarget::Drop, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("10.0.0.0/8"), "{e}");
        let e = r
            .del("192.168.0.0/16".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("192.168.0.0/16"), "{e}");
        let e = r
            .add(
                "1.0.0.0/8".parse().unwrap(),
                RouteTarget::VpcSubnet,
                Some(500),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("500"), "{e}");
        assert_eq!(r.dump_routes().len(), 1);
    }

    #[test]
    fn next_hop_ip_targets_are_routes_of_their_family() {
        let mut r = Router::default();
        let a: IpAddr = "172.30.0.6".parse().unwrap();
        r.add("192.168.50.0/24".parse().unwrap(), RouteTarget::Ip(a), None)
            .unwrap();
        r.add("10.0.0.0/8".parse().unwrap(), RouteTarget::VpcSubnet, None)
            .unwrap();
        assert_eq!(
            r.lookup(&to("192.168.50.7")).unwrap().target,
            RouteTarget::Ip(a)
        );
        assert!(r.peek_target(&to("192.168.50.7")).unwrap().in_vpc());
        assert_eq!(RouteTarget::Ip(a).to_string(), "ip4=172.30.0.6");
        let v6: IpAddr = "fd00::6".parse().unwrap();
        assert_eq!(RouteTarget::Ip(v6).to_string(), "ip6=fd00::6");
        let e = r
            .add("fd00:1::/64".parse().unwrap(), RouteTarget::Ip(a), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ip4=172.30.0.6") && e.contains("fd00:1::/64"),
            "{e}"
        );
        let bad: IpAddr = "224.0.0.9".parse().unwrap();
        let e = r
            .add(
                "192.168.60.0/24".parse().unwrap(),
                RouteTarget::Ip(bad),
                None,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("224.0.0.9"), "{e}");
        assert_eq!(r.dump_routes()[0].target, RouteTarget::Ip(a));
    }

    #[test]
    fn a_custom_route_wins_a_tie_and_each_class_has_its_own() {
        let mut r = Router::default();
        let net: IpNet = "10.0.0.0/8".parse().unwrap();
        r.add(net, RouteTarget::VpcSubnet, None).unwrap();
        r.add("10.1.0.0/16".parse().unwrap(), RouteTarget::VpcSubnet, None)
            .unwrap();
        r.add_in(RouteClass::Custom, net, RouteTarget::Drop, None)
            .unwrap();
        // Custom wins the tie; a longer system prefix still wins over it.
        assert_eq!(r.lookup(&to("10.9.0.1")), Err(DropReason::RouteDrop));
        assert_eq!(
            r.lookup(&to("10.1.0.1")).unwrap().target,
            RouteTarget::VpcSubnet
        );
        let e = r
            .add_in(RouteClass::Custom, net, RouteTarget::VpcSubnet, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("custom") && e.contains("10.0.0.0/8"), "{e}");
        let classes: Vec<(String, RouteClass)> = r
            .dump_routes()
            .iter()
            .map(|d| (d.dst.to_string(), d.class))
            .collect();
        assert_eq!(
            classes,
            [
                ("10.1.0.0/16".to_string(), RouteClass::System),
                ("10.0.0.0/8".to_string(), RouteClass::Custom),
                ("10.0.0.0/8".to_string(), RouteClass::System),
            ]
        );
        r.del_in(RouteClass::Custom, net).unwrap();
        assert_eq!(
            r.lookup(&to("10.9.0.1")).unwrap().target,
            RouteTarget::VpcSubnet
        );
        let e = r.del_in(RouteClass::Custom, net).unwrap_err().to_string();
        assert!(e.contains("no custom route for 10.0.0.0/8"), "{e}");
        assert_eq!("Custom".parse::<RouteClass>(), Ok(RouteClass::Custom));
        assert!("user"
            .parse::<RouteClass>()
            .unwrap_err()
            .to_string()
            .contains("user"));
    }
}
