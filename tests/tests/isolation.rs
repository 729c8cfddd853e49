//! VPCs are isolated: a guest in VNI 20 cannot reach guests in VNI 10, not even when a
//! (wrong) V2P entry points its traffic at the other VPC's guest and sled: the
//! receiving sled dispatches by (VNI, MAC) and drops it.

use e2e::capture::Capture;
use e2e::guest::GuestSpec;
use e2e::standard::{self, A1, B1};
use e2e::{Error, Result};
use std::time::Duration;

const OTHER_VPC: &str = "c1";

#[test]
fn guests_in_different_vnis_cannot_talk() -> Result<()> {
    let mut rack = standard::rack("e2e", &[])?;
    rack.add_guest(GuestSpec::dual(OTHER_VPC, 1, 10).vni(20))?;
    rack.publish_v2p()?;
    let (a1, b1, c1) = (rack.guest(A1)?, rack.guest(B1)?, rack.guest(OTHER_VPC)?);
    let wait = Duration::from_secs(20);
    // Both VPCs work on their own: the failures below are isolation, not breakage.
    a1.ping(b1.ipv4()?, 56, wait)?;
    c1.ping(c1.spec.gateway_ipv4.into(), 56, wait)?;

    // Forge a mapping in VNI 20 for a1's address, MAC and sled: c1's frames now
    // reach sled 0 encapsulated with VNI 20 and a1's MAC.
    let a1_sled = rack.sled(a1.spec.sled)?;
    rack.sled(1)?.admin(&[
        "set-v2p",
        &a1.ipv4()?.to_string(),
        &a1.spec.mac,
        &a1_sled.addr.to_string(),
        "20",
    ])?;
    let seen_by_a1 = Capture::start(
        &a1.ns,
        a1.ifname(),
        &rack.dir().join("a1.pcap"),
        "icmp or icmp6",
    )?;
    let underlay = Capture::start(
        &rack.switch,
        &a1_sled.bridge_port,
        &rack.dir().join("vni20.pcap"),
        "udp port 6081",
    )?;
    for (from, to) in [
        (c1, a1.ipv4()?),
        (c1, a1.ipv6()?),
        (a1, c1.ipv4()?),
        (a1, c1.ipv6()?),
        (b1, c1.ipv4()?),
    ] {
        for _ in 0..2 {
            let o = from.ping_once(to, 56)?;
            if o.status.success() {
                return Err(Error::new(format!(
                    "{} (VNI {}) reached {to}: {}",
                    from.spec.name, from.spec.vni, o.stdout
                )));
            }
        }
    }
    // The forged traffic did reach a1's sled in VNI 20...
    underlay.wait_for(
        "VNI 20 frames toward a1's sled",
        Duration::from_secs(10),
        |frames| frames.iter().any(|f| f.vni == Some(20)),
    )?;
    drop(underlay);
    // ...and none of it was handed to a1.
    let leaked = seen_by_a1.stop()?;
    let (c1_v4, c1_v6) = (c1.ipv4()?, c1.ipv6()?);
    let from_c1: Vec<_> = leaked
        .iter()
        .filter(|f| f.has_src(c1_v4) || f.has_src(c1_v6))
        .collect();
    assert!(from_c1.is_empty(), "a1 received {from_c1:?}");
    let a1_stats = a1_sled.admin(&["stats", A1])?;
    eprintln!("sled 0 stats for a1:\n{a1_stats}");
    Ok(())
}
