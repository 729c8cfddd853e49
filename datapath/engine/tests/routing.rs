//! Appliances: next-hop routes (`RouteTarget::Ip`) and the prefixes a port allows
//! besides its own addresses (`PortCidrs`: transit IPs, attached subnets), through
//! the whole pipeline of two sleds.

mod common;

use common::*;
use engine::{Engine, PortCidrs, PortId, RouteTarget, TxBatch, TxDest, VnetHdr, MAX_PORT_CIDRS};
use std::net::{IpAddr, Ipv4Addr};

const SUBNET: &str = "192.168.50.0/24";
const BEHIND: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 7);

/// A port's allowed prefixes, `inbound` and `outbound`.
fn cidrs(inbound: &[&str], outbound: &[&str]) -> PortCidrs {
    let nets = |l: &[&str]| l.iter().map(|n| n.parse().unwrap()).collect();
    PortCidrs {
        inbound: nets(inbound),
        outbound: nets(outbound),
        ..Default::default()
    }
}

fn drops(e: &Engine, reason: &str) -> u64 {
    e.stats().ports[0].drops.get_named(reason)
}

/// What the guest's frame `f` on `e` produced: underlay frames and local
/// deliveries.
fn send(e: &mut Engine, port: PortId, f: &[u8], now: u64) -> Vec<(TxDest, Vec<u8>)> {
    let mut out = TxBatch::new();
    e.process_guest(port, VnetHdr::default(), f, now, &Fabric, &mut out);
    frames_of(&out, &[])
}

fn underlay(frames: Vec<(TxDest, Vec<u8>)>) -> Vec<Vec<u8>> {
    frames
        .into_iter()
        .filter(|(d, _)| matches!(d, TxDest::Underlay { .. }))
        .map(|(_, f)| f)
        .collect()
}

fn delivered(frames: Vec<(TxDest, Vec<u8>)>) -> Vec<Vec<u8>> {
    frames
        .into_iter()
        .filter(|(d, _)| matches!(d, TxDest::Port { .. }))
        .map(|(_, f)| f)
        .collect()
}

/// Guest 1 to an address behind the appliance (guest 2), UDP from `sport`.
fn to_behind(sport: u16) -> Vec<u8> {
    frame(
        &guest(1),
        Some(BEHIND),
        None,
        L4::Udp { sport, dport: 7 },
        b"appliance",
    )
}

/// Guest 2 answering from the address behind it.
fn from_behind(sport: u16) -> Vec<u8> {
    let g = Guest {
        v4: BEHIND,
        ..guest(2)
    };
    frame(
        &g,
        Some(guest(1).v4),
        None,
        L4::Udp {
            sport: 7,
            dport: sport,
        },
        b"reply",
    )
}

#[test]
fn a_next_hop_route_reaches_an_appliance_that_allows_the_destination() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let g2 = guest(2);
    a.add_route(
        "ga",
        SUBNET.parse().unwrap(),
        RouteTarget::Ip(IpAddr::V4(g2.v4)),
        None,
    )
    .unwrap();
    // Sent to guest 2's sled and MAC, the packet unchanged.
    let wire = underlay(send(&mut a, pa, &to_behind(1000), 1));
    assert_eq!(wire.len(), 1);
    let d = decode_underlay(&wire[0]);
    assert_eq!(d.dst, SLED_B.parse::<std::net::Ipv6Addr>().unwrap());
    assert_eq!(d.vni, VNI);
    assert_eq!(&d.inner[0..6], &g2.mac.0);
    let inner = etherparse::SlicedPacket::from_ethernet(&d.inner).unwrap();
    let Some(etherparse::NetSlice::Ipv4(ip)) = inner.net else {
        panic!("inner is not IPv4")
    };
    assert_eq!(ip.header().destination_addr(), BEHIND);
    // The appliance's port refuses a destination that is not its own...
    assert!(delivered(receive(&mut b, &wire, 1)).is_empty());
    assert_eq!(drops(&b, "inbound_dst_not_guest"), 1);
    // ... until it allows the prefix inbound.
    b.set_port_cidrs("gb", cidrs(&[SUBNET], &[])).unwrap();
    let wire = underlay(send(&mut a, pa, &to_behind(1001), 2));
    let got = delivered(receive(&mut b, &wire, 2));
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0][0..6], &g2.mac.0);
    // Its answer from that address is spoofing until the prefix is allowed out.
    assert!(send(&mut b, pb, &from_behind(1001), 3).is_empty());
    assert_eq!(drops(&b, "spoofed_src_ip"), 1);
    b.set_port_cidrs("gb", cidrs(&[SUBNET], &[SUBNET])).unwrap();
    let back = underlay(send(&mut b, pb, &from_behind(1001), 4));
    assert_eq!(back.len(), 1);
    assert_eq!(drops(&b, "spoofed_src_ip"), 1);
    // Across sleds, the receiving sled trusts a source only as V2P maps it: no
    // mapping for the address behind the appliance, no delivery (docs/engine.md).
    assert!(delivered(receive(&mut a, &back, 4)).is_empty());
    assert_eq!(drops(&a, "underlay_src_mismatch"), 1);
    // Removed inbound: refused again at once (the check is ahead of the flow
    // tables), the outbound allowance kept.
    b.set_port_cidrs("gb", cidrs(&[], &[SUBNET])).unwrap();
    let wire = underlay(send(&mut a, pa, &to_behind(1001), 5));
    assert!(delivered(receive(&mut b, &wire, 5)).is_empty());
    assert_eq!(drops(&b, "inbound_dst_not_guest"), 2);
    assert_eq!(underlay(send(&mut b, pb, &from_behind(1001), 6)).len(), 1);
}

#[test]
fn a_next_hop_without_v2p_or_to_the_port_itself_is_a_counted_drop() {
    let (mut a, pa, _, _) = two_sleds();
    a.add_route(
        "ga",
        SUBNET.parse().unwrap(),
        RouteTarget::Ip("172.30.0.99".parse().unwrap()),
        None,
    )
    .unwrap();
    assert!(send(&mut a, pa, &to_behind(1000), 1).is_empty());
    assert_eq!(drops(&a, "no_v2p"), 1);
    a.del_route("ga", SUBNET.parse().unwrap()).unwrap();
    a.add_route(
        "ga",
        SUBNET.parse().unwrap(),
        RouteTarget::Ip(IpAddr::V4(guest(1).v4)),
        None,
    )
    .unwrap();
    assert!(send(&mut a, pa, &to_behind(1001), 2).is_empty());
    assert_eq!(drops(&a, "hairpin"), 1);
    // A target of the other family than the destination is refused, naming both.
    let e = a
        .add_route(
            "ga",
            "fd00:50::/64".parse().unwrap(),
            RouteTarget::Ip(IpAddr::V4(guest(2).v4)),
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fd00:50::/64") && e.contains("ip4=172.30.0.6"),
        "{e}"
    );
}

#[test]
fn an_appliance_on_the_same_sled_gets_the_frame_without_encapsulation() {
    let (mut a, pa) = sled(SLED_A, 1);
    let g2 = guest(2);
    let pb = a.add_port(port_config(&g2)).unwrap();
    let any = engine::Rule::new(1, engine::FwAction::Allow)
        .finalize()
        .unwrap();
    a.add_fw_rule("gb", engine::Direction::In, any).unwrap();
    a.add_route(
        "ga",
        SUBNET.parse().unwrap(),
        RouteTarget::Ip(IpAddr::V4(g2.v4)),
        None,
    )
    .unwrap();
    a.set_port_cidrs("gb", cidrs(&[SUBNET], &[SUBNET])).unwrap();
    let out = send(&mut a, pa, &to_behind(1000), 1);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(matches!(out[0].0, TxDest::Port { port, .. } if port == pb));
    assert_eq!(&out[0].1[0..6], &g2.mac.0);
    // Guest 2 answers from the address behind it; guest 1 (same sled) gets it.
    let back = send(&mut a, pb, &from_behind(1000), 2);
    assert_eq!(back.len(), 1, "{back:?}");
    assert!(matches!(back[0].0, TxDest::Port { port, .. } if port == pa));
}

/// The engine refuses a set of prefixes only for what is its own: a port it does
/// not have, more prefixes a direction than it scans per frame. A refusal changes
/// nothing. What a prefix should be (no host bits, unicast, of a family the port
/// has, not twice) is the API's check (`api::PortCidrs`).
#[test]
fn allowed_prefix_sets_need_a_port_and_fit_the_per_frame_bound() {
    let (mut a, _) = sled(SLED_A, 1);
    a.set_port_cidrs("ga", cidrs(&[SUBNET], &[])).unwrap();
    let e = a.set_port_cidrs("nope", cidrs(&[], &[SUBNET])).unwrap_err();
    assert_eq!(e.code(), "no-such-port");
    assert!(e.to_string().contains("nope"), "{e}");
    let most: Vec<String> = (0..MAX_PORT_CIDRS)
        .map(|i| format!("10.{i}.0.0/16"))
        .collect();
    let most: Vec<&str> = most.iter().map(String::as_str).collect();
    let mut over = most.clone();
    over.push("10.200.0.0/16");
    let e = a.set_port_cidrs("ga", cidrs(&[], &over)).unwrap_err();
    assert_eq!(e.code(), "invalid");
    let e = e.to_string();
    assert!(e.contains("65 prefixes allowed out"), "{e}");
    assert_eq!(a.port_config("ga").unwrap().cidrs, cidrs(&[SUBNET], &[]));
    // A new port's set is bounded too.
    let mut c2 = port_config(&guest(2));
    c2.cidrs = cidrs(&over, &[]);
    let e = a.add_port(c2.clone()).unwrap_err().to_string();
    assert!(e.contains("65 prefixes allowed in"), "{e}");
    assert_eq!(a.port_id(&c2.name), None);
    c2.cidrs = cidrs(&most, &most);
    a.add_port(c2).unwrap();
    a.set_port_cidrs("ga", cidrs(&most, &most)).unwrap();
}
