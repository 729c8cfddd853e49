//! What a port's creator expects of the sled. opteadm's `create-xde` names the
//! sled's underlay address (`--src-underlay-addr`) and, in older lines, boundary
//! services (`--bsvc-addr`, `--bsvc-vni`) with every port; here they are the
//! daemon's, sled-wide (`overlayd --underlay-addr`, `--boundary-services`,
//! `--boundary-vni`). So such a line is not refused for naming them: the daemon
//! checks them against its own ([`Request::CheckSled`](crate::Request)) and a
//! line written for another sled is refused, naming both values, before the port
//! is made. opteadm's `set-xde-underlay U1 [U2]` names the underlay links, which
//! are the daemon's too (`overlayd --underlay`): it is the same check, of the links
//! as a set.

use crate::Vni;
use serde::{Deserialize, Serialize};
use std::net::Ipv6Addr;

/// The sled as a port's creator expects it; what is absent is not checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SledExpect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay_addr: Option<Ipv6Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary_services: Option<Ipv6Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary_vni: Option<Vni>,
    /// The underlay links by name, in any order (opteadm's `set-xde-underlay`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay_links: Option<Vec<String>>,
}

/// The sled as the daemon is configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SledFacts {
    pub underlay_addr: Ipv6Addr,
    pub boundary_services: Option<Ipv6Addr>,
    pub boundary_vni: Vni,
    pub underlay_links: Vec<String>,
}

/// Why the sled is not the one expected; each names both values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SledMismatch {
    #[error("--src-underlay-addr {given} is not this sled's underlay address {sled} (overlayd --underlay-addr)")]
    UnderlayAddr { given: Ipv6Addr, sled: Ipv6Addr },
    #[error("--bsvc-addr {given} is not this sled's boundary services {sled} (overlayd --boundary-services)")]
    BoundaryServices { given: Ipv6Addr, sled: Ipv6Addr },
    #[error("--bsvc-addr {0}: this sled has no boundary services address (overlayd --boundary-services)")]
    NoBoundaryServices(Ipv6Addr),
    #[error("--bsvc-vni {given} is not this sled's boundary services VNI {sled} (overlayd --boundary-vni)")]
    BoundaryVni { given: Vni, sled: Vni },
    #[error("set-xde-underlay {}: this sled's underlay links are {} (overlayd --underlay, fixed while it runs){}{}", given.join(" "), sled.join(" "), named(" not the daemon's: ", extra), named(" not named: ", missing))]
    UnderlayLinks {
        given: Vec<String>,
        sled: Vec<String>,
        /// Named but not the daemon's.
        extra: Vec<String>,
        /// The daemon's but not named.
        missing: Vec<String>,
    },
}

/// `; {what}a, b` for a non-empty list, nothing for an empty one.
fn named(what: &str, links: &[String]) -> String {
    if links.is_empty() {
        String::new()
    } else {
        format!(";{what}{}", links.join(", "))
    }
}

impl SledExpect {
    /// Whether nothing is expected (no check to ask for).
    pub fn is_empty(&self) -> bool {
        *self == SledExpect::default()
    }

    /// Checks the expectation against the sled; the first difference is named.
    pub fn check(&self, sled: &SledFacts) -> Result<(), SledMismatch> {
        if let Some(given) = self.underlay_addr.filter(|a| *a != sled.underlay_addr) {
            return Err(SledMismatch::UnderlayAddr {
                given,
                sled: sled.underlay_addr,
            });
        }
        match (self.boundary_services, sled.boundary_services) {
            (Some(given), None) => return Err(SledMismatch::NoBoundaryServices(given)),
            (Some(given), Some(sled)) if given != sled => {
                return Err(SledMismatch::BoundaryServices { given, sled })
            }
            _ => {}
        }
        match self.boundary_vni {
            Some(given) if given != sled.boundary_vni => {
                return Err(SledMismatch::BoundaryVni {
                    given,
                    sled: sled.boundary_vni,
                })
            }
            _ => {}
        }
        let Some(given) = &self.underlay_links else {
            return Ok(());
        };
        let not_in = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter().filter(|l| !b.contains(l)).cloned().collect()
        };
        let extra = not_in(given, &sled.underlay_links);
        let missing = not_in(&sled.underlay_links, given);
        if extra.is_empty() && missing.is_empty() {
            Ok(())
        } else {
            Err(SledMismatch::UnderlayLinks {
                given: given.clone(),
                sled: sled.underlay_links.clone(),
                extra,
                missing,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_name_both_values() {
        let sled = SledFacts {
            underlay_addr: "fd00:99::1".parse().unwrap(),
            boundary_services: Some("fd00:99::ff".parse().unwrap()),
            boundary_vni: Vni::new(99).unwrap(),
            underlay_links: vec!["eth1".into(), "eth2".into()],
        };
        let ok = SledExpect {
            underlay_addr: Some(sled.underlay_addr),
            boundary_services: sled.boundary_services,
            boundary_vni: Some(sled.boundary_vni),
            underlay_links: Some(vec!["eth2".into(), "eth1".into()]),
        };
        assert_eq!(ok.check(&sled), Ok(()));
        assert!(SledExpect::default().is_empty());
        assert_eq!(SledExpect::default().check(&sled), Ok(()));
        let e = SledExpect {
            underlay_addr: Some("fd00:99::2".parse().unwrap()),
            ..ok.clone()
        }
        .check(&sled)
        .unwrap_err()
        .to_string();
        assert!(e.contains("fd00:99::2") && e.contains("fd00:99::1"), "{e}");
        let e = SledExpect {
            boundary_services: Some("fd00:99::fe".parse().unwrap()),
            ..ok.clone()
        }
        .check(&sled)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("fd00:99::fe") && e.contains("fd00:99::ff"),
            "{e}"
        );
        let e = SledExpect {
            boundary_vni: Some(Vni::new(7).unwrap()),
            ..ok.clone()
        }
        .check(&sled)
        .unwrap_err()
        .to_string();
        assert!(e.contains("--bsvc-vni 7") && e.contains("99"), "{e}");
        let e = SledExpect {
            underlay_links: Some(vec!["eth1".into(), "eth3".into()]),
            ..ok.clone()
        }
        .check(&sled)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("set-xde-underlay eth1 eth3")
                && e.contains("are eth1 eth2")
                && e.contains("not the daemon's: eth3")
                && e.contains("not named: eth2"),
            "{e}"
        );
        let e = SledExpect {
            underlay_links: Some(vec!["eth1".into()]),
            ..ok.clone()
        }
        .check(&sled)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("not named: eth2") && !e.contains("daemon's:"),
            "{e}"
        );
        let none = SledFacts {
            boundary_services: None,
            ..sled
        };
        let e = ok.check(&none).unwrap_err().to_string();
        assert!(
            e.contains("fd00:99::ff") && e.contains("no boundary"),
            "{e}"
        );
    }
}
