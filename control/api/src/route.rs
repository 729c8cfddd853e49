//! A port's routes as the API carries them, and their text forms: `xdeadm`'s targets
//! (`subnet`, `igw`, `igw=UUID`, `drop`, `ip4=ADDR`, `ip6=ADDR`) and opteadm's
//! (`sub4=CIDR`, `sub6=CIDR`, `ig`, `ig=UUID`), and router classes.

use core::fmt;
use core::str::FromStr;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use uuid::Uuid;

/// A route word that does not parse, naming it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteSyntaxError {
    #[error("invalid route target {word:?}: {why}")]
    Target { word: String, why: String },
    #[error("route target {word:?} is of another address family than the destination {dest}")]
    Family { word: String, dest: IpNet },
    #[error("route target {0:?}: not an internet gateway id (a UUID)")]
    GatewayId(String),
    #[error("invalid router class {0:?}: expected system or custom")]
    Class(String),
}

/// Where the router sends traffic matching a destination prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteTarget {
    /// Inside the VPC: the overlay layer looks the destination up in V2P.
    Subnet,
    /// Out of the rack through boundary services (the internet gateway; with
    /// several, the flow's source may be any of the port's external addresses).
    Igw,
    /// Out through the internet gateway with this id (`igw=UUID`, opteadm's
    /// `ig=UUID`): the flow leaves from an external address that serves it
    /// (`ExternalIps::gateways`).
    #[serde(rename = "igw_id")]
    IgwId(Uuid),
    /// Discarded (counted).
    Drop,
    /// To the VPC guest with this address (`ip4=ADDR`, `ip6=ADDR`): the packet goes,
    /// unchanged, to that guest (an appliance whose port admits the destination).
    Ip(IpAddr),
}

impl FromStr for RouteTarget {
    type Err = RouteSyntaxError;
    fn from_str(s: &str) -> Result<Self, RouteSyntaxError> {
        let bad = |why: String| RouteSyntaxError::Target {
            word: s.to_string(),
            why,
        };
        let ip = |v4: bool, a: &str| -> Result<RouteTarget, RouteSyntaxError> {
            let addr: IpAddr = a
                .parse()
                .map_err(|_| bad(format!("{a:?} is not an address")))?;
            if addr.is_ipv4() != v4 {
                return Err(bad(format!(
                    "{a:?} is not an IPv{} address",
                    if v4 { 4 } else { 6 }
                )));
            }
            Ok(RouteTarget::Ip(addr))
        };
        match s.split_once('=') {
            Some(("ip4", a)) => ip(true, a),
            Some(("ip6", a)) => ip(false, a),
            Some(("igw" | "ig", id)) => id
                .parse()
                .map(RouteTarget::IgwId)
                .map_err(|_| RouteSyntaxError::GatewayId(s.to_string())),
            _ => match s {
                "subnet" => Ok(RouteTarget::Subnet),
                "igw" => Ok(RouteTarget::Igw),
                "drop" => Ok(RouteTarget::Drop),
                _ => Err(bad(
                    "expected subnet, igw, igw=UUID, drop, ip4=ADDR or ip6=ADDR".into(),
                )),
            },
        }
    }
}

impl RouteTarget {
    /// A target for a route to `dest`, in `xdeadm`'s words or opteadm's:
    /// `sub4=CIDR`/`sub6=CIDR` (the VPC subnet: the overlay's V2P table then names
    /// the sled, so the CIDR is checked, not used), `ig`, `drop` (any case).
    /// `ip4=ADDR`/`ip6=ADDR` route to the VPC guest with that address (an
    /// appliance), of the destination's family. `ig=UUID`: one of the port's
    /// internet gateways.
    pub fn parse_for(dest: &IpNet, s: &str) -> Result<RouteTarget, RouteSyntaxError> {
        let lower = s.to_ascii_lowercase();
        let dest_v4 = matches!(dest, IpNet::V4(_));
        let other_family = || RouteSyntaxError::Family {
            word: s.to_string(),
            dest: *dest,
        };
        let subnet_of = |want_v4: bool, cidr: &str| -> Result<RouteTarget, RouteSyntaxError> {
            let bad = |why: String| RouteSyntaxError::Target {
                word: s.to_string(),
                why,
            };
            let net: IpNet = cidr
                .parse()
                .map_err(|_| bad(format!("{cidr:?} is not a prefix")))?;
            if matches!(net, IpNet::V4(_)) != want_v4 {
                return Err(bad(format!(
                    "{cidr:?} is not an IPv{} prefix",
                    if want_v4 { 4 } else { 6 }
                )));
            }
            if dest_v4 != want_v4 {
                return Err(other_family());
            }
            Ok(RouteTarget::Subnet)
        };
        match lower.split_once('=') {
            None if lower == "ig" => Ok(RouteTarget::Igw),
            None => lower.parse(),
            Some(("sub4", cidr)) => subnet_of(true, cidr),
            Some(("sub6", cidr)) => subnet_of(false, cidr),
            Some(("ip4" | "ip6", _)) => match lower.parse()? {
                RouteTarget::Ip(a) if a.is_ipv4() != dest_v4 => Err(other_family()),
                t => Ok(t),
            },
            Some(("ig" | "igw", _)) => lower.parse(),
            Some(_) => Err(RouteSyntaxError::Target {
                word: s.to_string(),
                why: "expected subnet, igw, drop, sub4=CIDR, sub6=CIDR, ip4=ADDR, ip6=ADDR, ig \
                      or ig=UUID"
                    .into(),
            }),
        }
    }
}

impl fmt::Display for RouteTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteTarget::Subnet => "subnet",
            RouteTarget::Igw => "igw",
            RouteTarget::IgwId(id) => return write!(f, "igw={id}"),
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

impl FromStr for RouteClass {
    type Err = RouteSyntaxError;
    fn from_str(s: &str) -> Result<Self, RouteSyntaxError> {
        match s.to_ascii_lowercase().as_str() {
            "system" => Ok(RouteClass::System),
            "custom" => Ok(RouteClass::Custom),
            _ => Err(RouteSyntaxError::Class(s.to_string())),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_print_back() {
        for s in [
            "subnet",
            "igw",
            "igw=0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a",
            "drop",
            "ip4=10.0.0.5",
            "ip6=fd00::5",
        ] {
            assert_eq!(s.parse::<RouteTarget>().unwrap().to_string(), s);
        }
        let e = "router".parse::<RouteTarget>().unwrap_err().to_string();
        assert!(e.contains("router"), "{e}");
        let e = "ip4=fd00::5"
            .parse::<RouteTarget>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an IPv4 address"), "{e}");
    }

    #[test]
    fn router_targets_and_classes() {
        let v4: IpNet = "10.0.0.0/24".parse().unwrap();
        let v6: IpNet = "fd00::/64".parse().unwrap();
        assert_eq!(
            RouteTarget::parse_for(&v4, "sub4=10.0.0.0/24"),
            Ok(RouteTarget::Subnet)
        );
        assert_eq!(
            RouteTarget::parse_for(&v6, "SUB6=fd00::/64"),
            Ok(RouteTarget::Subnet)
        );
        assert_eq!(RouteTarget::parse_for(&v4, "IG"), Ok(RouteTarget::Igw));
        assert_eq!(RouteTarget::parse_for(&v4, "Drop"), Ok(RouteTarget::Drop));
        assert_eq!(RouteTarget::parse_for(&v4, "igw"), Ok(RouteTarget::Igw));
        let id: Uuid = "0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a".parse().unwrap();
        for s in [
            "ig=0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a",
            "IG=0B8B2F6E-8B44-4A8E-9F5C-0D1C1D0E5B1A",
        ] {
            assert_eq!(RouteTarget::parse_for(&v6, s), Ok(RouteTarget::IgwId(id)));
        }
        // Saved state names it apart from the plain internet gateway, which keeps
        // its old form.
        let json = serde_json::to_string(&[RouteTarget::Igw, RouteTarget::IgwId(id)]).unwrap();
        assert_eq!(
            json,
            r#"["igw",{"igw_id":"0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a"}]"#
        );
        assert_eq!(
            RouteTarget::parse_for(&v4, "ip4=10.0.0.5"),
            Ok(RouteTarget::Ip("10.0.0.5".parse().unwrap()))
        );
        assert_eq!(
            RouteTarget::parse_for(&v6, "IP6=fd00::5"),
            Ok(RouteTarget::Ip("fd00::5".parse().unwrap()))
        );
        for (dest, bad, named) in [
            (&v6, "ip4=10.0.0.1", "another address family"),
            (&v4, "ip6=fd00::1", "another address family"),
            (&v4, "ip4=fd00::1", "not an IPv4 address"),
            (&v4, "ip4=10.0.0", "not an address"),
            (&v4, "ig=0b8b2f6e", "not an internet gateway id"),
            (&v4, "sub6=fd00::/64", "another address family"),
            (&v4, "sub4=fd00::/64", "not an IPv4 prefix"),
            (&v4, "sub4=10.0.0.0/33", "not a prefix"),
            (&v4, "router", "expected subnet"),
        ] {
            let e = RouteTarget::parse_for(dest, bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains(named), "{bad}: {e}");
        }
    }
}
