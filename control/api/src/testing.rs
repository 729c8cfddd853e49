//! Fixtures the tests of the API's users share (feature `testing`): a port as the
//! end-to-end tests create it.

use crate::{PortConfig, Vni};
use wire::MacAddr;

/// A dual-stack port in VNI 1701, its addresses ending in `last`.
pub fn sample_port(name: &str, last: u8) -> PortConfig {
    PortConfig {
        name: name.into(),
        guest_mac: MacAddr([0xa8, 0x40, 0x25, 0xff, 0x00, last]),
        gateway_mac: MacAddr([0xa8, 0x40, 0x25, 0x00, 0x00, 0x01]),
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
