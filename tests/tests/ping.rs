//! Guests reach each other through the datapath: both families, across sleds (Geneve
//! over the 9000-byte underlay) and within a sled, at full guest MTU.

use e2e::standard::{self, A1, A2, B1, B2};
use e2e::{Rack, Result};
use std::net::IpAddr;
use std::time::Duration;

/// The first packets of a pair may wait for underlay neighbour resolution.
const FIRST_REPLY: Duration = Duration::from_secs(20);

/// Largest ICMP echo payload that fits the 8500-byte guest MTU without fragmenting:
/// IPv4 20 + ICMP 8, IPv6 40 + ICMPv6 8.
fn full_size(target: IpAddr) -> usize {
    if target.is_ipv4() {
        8500 - 28
    } else {
        8500 - 48
    }
}

fn ping_pairs(rack: &Rack, pairs: &[(&str, &str, bool)]) -> Result<()> {
    for &(from, to, v6) in pairs {
        let src = rack.guest(from)?;
        let dst = rack.guest(to)?;
        let target = if v6 { dst.ipv6()? } else { dst.ipv4()? };
        src.ping(target, 56, FIRST_REPLY)?;
        src.ping(target, full_size(target), FIRST_REPLY)?;
        // One byte over the guest MTU must not be sent unfragmented: proves the
        // guest really runs at 8500, so the ping above was a jumbo one.
        let over = src.ping_once(target, full_size(target) + 1)?;
        assert!(
            !over.status.success(),
            "{from} -> {to}: a ping over the 8500 MTU went through: {}",
            over.stdout
        );
    }
    Ok(())
}

#[test]
fn guests_ping_across_sleds_in_both_families() -> Result<()> {
    let rack = standard::rack("e2e", &[])?;
    ping_pairs(
        &rack,
        &[
            (A1, B1, false),
            (A1, B1, true),
            (B1, A1, false),
            (B1, A1, true),
            (A2, B1, false),
            (B2, A1, true),
        ],
    )
}

#[test]
fn guests_ping_within_a_sled_and_their_gateway() -> Result<()> {
    let mut rack = standard::rack("e2e", &[])?;
    ping_pairs(&rack, &[(A1, A2, false), (A2, A1, false), (B1, B2, true)])?;
    for name in [A1, A2, B1] {
        let g = rack.guest(name)?;
        g.ping(g.spec.gateway_ipv4.into(), 56, FIRST_REPLY)?;
    }
    for name in [A1, B2] {
        let g = rack.guest(name)?;
        let gw = g.spec.gateway_ipv6()?;
        // A link-local target needs the interface named.
        g.ns.run(
            "ping",
            &["-6", "-c", "1", "-W", "5", &format!("{gw}%{}", g.ifname())],
        )?;
    }
    // SIGTERM is a clean shutdown, with traffic having flowed.
    for i in 0..rack.sleds.len() {
        let status = rack.sled_mut(i)?.daemon_mut()?.stop()?;
        assert!(
            status.success(),
            "overlayd on sled {i} exited with {status}"
        );
    }
    Ok(())
}
