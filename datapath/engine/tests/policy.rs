//! VPC policy at the firewall: rules matching the packet's VPC (`Vni`), ICMP types
//! and codes, and protocol numbers, through the whole pipeline of two sleds.

mod common;

use common::*;
use engine::{
    Direction, Engine, FwAction, PortId, PortState, Predicate, Rule, TxBatch, TxDest, VnetHdr,
};
use etherparse::{icmpv4::DestUnreachableHeader, Icmpv4Type, Icmpv6Type, PacketBuilder};

fn drops(e: &Engine, reason: &str) -> u64 {
    e.stats().ports[0].drops.get_named(reason)
}

/// Guest 1's frame `f` from sled A to sled B: the frames guest 2 got.
fn a_to_b(a: &mut Engine, pa: PortId, b: &mut Engine, f: &[u8], now: u64) -> Vec<Vec<u8>> {
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), f, now, &Fabric, &mut out);
    let wire: Vec<Vec<u8>> = frames_of(&out, &[])
        .into_iter()
        .filter(|(d, _)| matches!(d, TxDest::Underlay { .. }))
        .map(|(_, f)| f)
        .collect();
    receive(b, &wire, now)
        .into_iter()
        .filter(|(d, _)| matches!(d, TxDest::Port { .. }))
        .map(|(_, f)| f)
        .collect()
}

fn rule(prio: u16, action: FwAction, preds: &[Predicate]) -> Rule<engine::Finalized, FwAction> {
    preds
        .iter()
        .fold(Rule::new(prio, action), |r, p| r.matching(*p))
        .finalize()
        .unwrap()
}

fn udp(sport: u16) -> Vec<u8> {
    let g2 = guest(2);
    frame(
        &guest(1),
        Some(g2.v4),
        None,
        L4::Udp { sport, dport: 53 },
        b"x",
    )
}

#[test]
fn vni_rules_match_the_vpc_the_frame_travels_in() {
    let (mut a, pa, mut b, _) = two_sleds();
    // Only traffic of VPC VNI may come in to guest 2.
    let only = |vni| {
        vec![(
            Direction::In,
            rule(10, FwAction::Allow, &[Predicate::Vni(vni)]),
        )]
    };
    b.set_fw_rules("gb", only(VNI)).unwrap();
    assert_eq!(a_to_b(&mut a, pa, &mut b, &udp(1000), 1).len(), 1);
    // Another VPC's filter does not admit this VPC's traffic.
    b.set_fw_rules("gb", only(VNI + 1)).unwrap();
    assert!(a_to_b(&mut a, pa, &mut b, &udp(1001), 2).is_empty());
    assert_eq!(drops(&b, "fw_deny_in"), 1);
    // Outbound: a destination in the VPC travels in the port's VNI.
    a.set_fw_rules(
        "ga",
        vec![(
            Direction::Out,
            rule(10, FwAction::Deny, &[Predicate::Vni(VNI)]),
        )],
    )
    .unwrap();
    b.set_fw_rules("gb", only(VNI)).unwrap();
    assert!(a_to_b(&mut a, pa, &mut b, &udp(1002), 3).is_empty());
    assert_eq!(drops(&a, "fw_deny_out"), 1);
    a.set_fw_rules(
        "ga",
        vec![(
            Direction::Out,
            rule(10, FwAction::Deny, &[Predicate::Vni(VNI + 1)]),
        )],
    )
    .unwrap();
    assert_eq!(a_to_b(&mut a, pa, &mut b, &udp(1003), 4).len(), 1);
    assert_eq!(drops(&a, "fw_deny_out"), 1);
}

/// A guest-1 ICMPv6 message of `t` to guest 2 (quoting a made-up packet).
fn icmp6(t: Icmpv6Type) -> Vec<u8> {
    let (g1, g2) = (guest(1), guest(2));
    let mut buf = Vec::new();
    let quoted = [0x60u8; 48];
    PacketBuilder::ethernet2(g1.mac.0, g1.gw_mac.0)
        .ipv6(g1.v6.octets(), g2.v6.octets(), 64)
        .icmpv6(t)
        .write(&mut buf, &quoted)
        .unwrap();
    buf
}

fn icmp4(t: Icmpv4Type) -> Vec<u8> {
    let (g1, g2) = (guest(1), guest(2));
    let mut buf = Vec::new();
    // A quoted IPv4 header (20 bytes) and 8 bytes of its payload.
    let mut quoted = vec![0u8; 28];
    quoted[0] = 0x45;
    PacketBuilder::ethernet2(g1.mac.0, g1.gw_mac.0)
        .ipv4(g1.v4.octets(), g2.v4.octets(), 64)
        .icmpv4(t)
        .write(&mut buf, &quoted)
        .unwrap();
    buf
}

#[test]
fn packet_too_big_passes_where_echo_is_denied() {
    let (mut a, pa, mut b, _) = two_sleds();
    // Guest 2 admits the VPC (the default rules, priority 100), but no ICMPv6 other
    // than Packet Too Big, and of ICMP only fragmentation-needed (3/4).
    for r in [
        rule(
            10,
            FwAction::Allow,
            &[Predicate::Proto(58), Predicate::IcmpType(2)],
        ),
        rule(20, FwAction::Deny, &[Predicate::Proto(58)]),
        rule(
            10,
            FwAction::Allow,
            &[
                Predicate::Proto(1),
                Predicate::IcmpType(3),
                Predicate::IcmpCode(4),
            ],
        ),
        rule(20, FwAction::Deny, &[Predicate::Proto(1)]),
    ] {
        b.add_fw_rule("gb", Direction::In, r).unwrap();
    }
    let (g2v4, g2v6) = (guest(2).v4, guest(2).v6);
    let echo6 = frame(
        &guest(1),
        None,
        Some(g2v6),
        L4::Icmp { id: 7, seq: 1 },
        b"p",
    );
    let echo4 = frame(
        &guest(1),
        Some(g2v4),
        None,
        L4::Icmp { id: 7, seq: 1 },
        b"p",
    );
    assert!(a_to_b(&mut a, pa, &mut b, &echo6, 1).is_empty());
    assert!(a_to_b(&mut a, pa, &mut b, &echo4, 1).is_empty());
    assert_eq!(drops(&b, "fw_deny_in"), 2);
    let ptb = icmp6(Icmpv6Type::PacketTooBig { mtu: 1400 });
    assert_eq!(a_to_b(&mut a, pa, &mut b, &ptb, 2).len(), 1);
    let frag = icmp4(Icmpv4Type::DestinationUnreachable(
        DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
    ));
    assert_eq!(a_to_b(&mut a, pa, &mut b, &frag, 2).len(), 1);
    // Another code of the same type is denied.
    let host = icmp4(Icmpv4Type::DestinationUnreachable(
        DestUnreachableHeader::Host,
    ));
    assert!(a_to_b(&mut a, pa, &mut b, &host, 3).is_empty());
    assert_eq!(drops(&b, "fw_deny_in"), 3);
}

#[test]
fn protocol_numbers_match_alone() {
    let (mut a, pa, mut b, _) = two_sleds();
    b.add_fw_rule(
        "gb",
        Direction::In,
        rule(10, FwAction::Deny, &[Predicate::Proto(17)]),
    )
    .unwrap();
    assert!(a_to_b(&mut a, pa, &mut b, &udp(2000), 1).is_empty());
    let tcp = tcp_v4(&guest(1), guest(2).v4, 2001, 80, true, b"");
    assert_eq!(a_to_b(&mut a, pa, &mut b, &tcp, 1).len(), 1);
    assert_eq!(drops(&b, "fw_deny_in"), 1);
}

fn udp_between(from: u8, to: u8, sport: u16, dport: u16) -> Vec<u8> {
    frame(
        &guest(from),
        Some(guest(to).v4),
        None,
        L4::Udp { sport, dport },
        b"x",
    )
}

#[test]
fn a_paused_port_drops_both_ways_and_resumes_its_connections() {
    let (mut a, pa, mut b, pb) = two_sleds();
    assert_eq!(a.port_state("ga").unwrap(), PortState::Ready);
    // Guest 1 admits nothing inbound but replies to what it opened.
    a.set_fw_rules("ga", vec![]).unwrap();
    let out = udp_between(1, 2, 1000, 53);
    let back = udp_between(2, 1, 53, 1000);
    assert_eq!(a_to_b(&mut a, pa, &mut b, &out, 1).len(), 1);
    assert_eq!(a_to_b(&mut b, pb, &mut a, &back, 1).len(), 1);
    assert_eq!(a.port_state("ga").unwrap(), PortState::Running);

    a.set_port_paused("ga", true).unwrap();
    assert_eq!(a.port_state("ga").unwrap(), PortState::Paused);
    assert!(a_to_b(&mut a, pa, &mut b, &out, 2).is_empty());
    assert!(a_to_b(&mut b, pb, &mut a, &back, 2).is_empty());
    assert_eq!(drops(&a, "port_paused"), 2);
    assert_eq!(drops(&a, "fw_deny_in"), 0, "dropped as paused, not denied");
    let flows = a.dump_tcp_flows("ga").unwrap();
    assert_eq!(flows.len(), 1, "the connection is kept");

    // Resumed: the connection still admits the reply; nothing else was dropped.
    a.set_port_paused("ga", false).unwrap();
    assert_eq!(a.port_state("ga").unwrap(), PortState::Running);
    assert_eq!(a_to_b(&mut b, pb, &mut a, &back, 3).len(), 1);
    assert_eq!(a_to_b(&mut a, pa, &mut b, &out, 3).len(), 1);
    assert_eq!(drops(&a, "port_paused"), 2);
    assert_eq!(a.dump_tcp_flows("ga").unwrap().len(), 1);
    // Unknown ports are refused by name.
    let e = a.set_port_paused("nope", true).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
    assert!(a.port_state("nope").is_err());
}
