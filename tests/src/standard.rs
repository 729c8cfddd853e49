//! The standard rack of the tests and the demo: two sleds, two guests on each, every
//! port at MTU 8500, all in VPC VNI 10, V2P published on both sleds.
//!
//! | guest | sled | families | IPv4 | IPv6 |
//! |---|---|---|---|---|
//! | a1 | 0 | dual | 10.0.0.11 | fd00:1::b |
//! | a2 | 0 | IPv4 | 10.0.0.12 | - |
//! | b1 | 1 | dual | 10.0.0.13 | fd00:1::d |
//! | b2 | 1 | IPv6 | - | fd00:1::e |

use crate::guest::{Guest, GuestSpec};
use crate::netns::Netns;
use crate::rack::{Rack, RackSpec};
use crate::Result;

pub const A1: &str = "a1";
pub const A2: &str = "a2";
pub const B1: &str = "b1";
pub const B2: &str = "b2";

/// The four guests' specs.
pub fn guests() -> [GuestSpec; 4] {
    [
        GuestSpec::dual(A1, 0, 1),
        GuestSpec::v4(A2, 0, 2),
        GuestSpec::dual(B1, 1, 3),
        GuestSpec::v6(B2, 1, 4),
    ]
}

/// Builds the standard rack: sleds, daemons (with `daemon_flags` added), the four
/// guests and V2P on both sleds.
pub fn rack(prefix: &str, daemon_flags: &[&str]) -> Result<Rack> {
    let mut rack = Rack::build(&RackSpec::new(prefix, 2))?;
    rack.start_daemons(daemon_flags)?;
    for spec in guests() {
        rack.add_guest(spec)?;
    }
    rack.publish_v2p()?;
    Ok(rack)
}

/// The standard rack and a fifth guest `vm` on sled 0 (dual-stack, number 9) that
/// stands in for a VM a hypervisor attaches: its spec and its namespace, still
/// empty. The test makes the VM's link and its port (without `--netns`), puts the
/// guest in `rack.guests`, and publishes V2P again.
pub fn rack_with_vm(prefix: &str, vm: &str) -> Result<(Rack, GuestSpec, Netns)> {
    let rack = rack(prefix, &[])?;
    let ns = Guest::namespace(&format!("{}-{vm}", rack.id))?;
    Ok((rack, GuestSpec::dual(vm, 0, 9), ns))
}
