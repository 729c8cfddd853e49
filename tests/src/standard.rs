//! The standard rack of the tests and the demo: two sleds, two guests on each, every
//! port at MTU 8500, all in VPC VNI 10, V2P published on both sleds.
//!
//! | guest | sled | families | IPv4 | IPv6 |
//! |---|---|---|---|---|
//! | a1 | 0 | dual | 10.0.0.11 | fd00:1::b |
//! | a2 | 0 | IPv4 | 10.0.0.12 | - |
//! | b1 | 1 | dual | 10.0.0.13 | fd00:1::d |
//! | b2 | 1 | IPv6 | - | fd00:1::e |

use crate::guest::GuestSpec;
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
