//! Pipeline tests: guest frame in -> underlay frame out (checked with an independent
//! decoder) -> a second engine -> the original frame delivered to the other guest.

mod common;

use common::*;
use engine::{Direction, FwAction, Predicate, RouteTarget, Rule, TxBatch, TxDest, VnetHdr, Vni};
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The frames of a batch that refers to no received frame.
fn frames(out: &TxBatch) -> Vec<(TxDest, Vec<u8>)> {
    frames_of(out, &[])
}

/// Sends `f` from guest 1 on sled A and returns what sled B hands guest 2.
fn a_to_b(
    a: &mut engine::Engine,
    pa: engine::PortId,
    b: &mut engine::Engine,
    f: &[u8],
    now: u64,
) -> Vec<(TxDest, Vec<u8>)> {
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), f, now, &Fabric, &mut out);
    let wire: Vec<Vec<u8>> = frames(&out)
        .into_iter()
        .map(|(d, u)| {
            assert_eq!(d, TxDest::Underlay { ifindex: IFINDEX });
            u
        })
        .collect();
    receive(b, &wire, now)
}

fn expect_delivered(original: &[u8], got: &[(TxDest, Vec<u8>)], to: &Guest, port: engine::PortId) {
    assert_eq!(got.len(), 1, "one frame delivered");
    let (d, f) = &got[0];
    assert!(
        matches!(d, TxDest::Port { port: p, .. } if *p == port),
        "{d:?}"
    );
    assert_eq!(&f[0..6], &to.mac.0, "inner dst MAC is the guest's");
    assert_eq!(&f[6..12], &to.gw_mac.0, "inner src MAC is the gateway's");
    assert_eq!(&f[12..], &original[12..], "the rest is the original frame");
}

#[test]
fn icmp_v4_crosses_two_sleds_and_the_reply_comes_back() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let ping = frame(
        &g1,
        Some(g2.v4),
        None,
        L4::Icmp { id: 77, seq: 1 },
        b"hello",
    );
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &ping, 10, &Fabric, &mut out);
    assert_eq!(out.len(), 1);
    let (_, u) = out.frame(0).unwrap();
    let d = decode_underlay(u);
    assert_eq!(d.src, SLED_A.parse::<Ipv6Addr>().unwrap());
    assert_eq!(d.dst, SLED_B.parse::<Ipv6Addr>().unwrap());
    assert_eq!(d.vni, VNI);
    assert!(d.udp_src >= 49152);
    assert_eq!(&d.inner[0..6], &g2.mac.0, "inner dst MAC from V2P");
    assert_eq!(&d.inner[6..], &ping[6..]);
    // Same flow, same outer port and label.
    let mut out2 = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &ping, 11, &Fabric, &mut out2);
    let d2 = decode_underlay(out2.frame(0).unwrap().1);
    assert_eq!((d2.udp_src, d2.flow_label), (d.udp_src, d.flow_label));

    let got = a_to_b(&mut a, pa, &mut b, &ping, 12);
    expect_delivered(&ping, &got, &g2, pb);

    // The echo reply from guest 2 reaches guest 1 through A's stateful firewall
    // (A has an inbound VPC rule too, so also check an outside-like flow below).
    let mut reply = TxBatch::new();
    let pong = {
        let mut buf = Vec::new();
        etherparse::PacketBuilder::ethernet2(g2.mac.0, g2.gw_mac.0)
            .ipv4(g2.v4.octets(), g1.v4.octets(), 64)
            .icmpv4_echo_reply(77, 1)
            .write(&mut buf, b"hello")
            .unwrap();
        buf
    };
    b.process_guest(pb, VnetHdr::default(), &pong, 13, &Fabric, &mut reply);
    let back = receive(&mut a, &[reply.frame(0).unwrap().1.to_vec()], 13);
    expect_delivered(&pong, &back, &g1, pa);
    let s = a.stats();
    assert_eq!(s.ports[0].uft_out.hits, 2);
    assert_eq!(s.ports[0].in_packets, 1);
}

#[test]
fn stateful_firewall_admits_replies_only() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    // Remove A's inbound VPC rules: A only admits replies now.
    a.set_fw_rules("ga", vec![]).unwrap();
    // B opens TCP to A: denied at A.
    let syn = tcp_v4(&g2, g1.v4, 5000, 22, true, b"");
    let got = a_to_b(&mut b, pb, &mut a, &syn, 1);
    assert!(got.is_empty());
    assert_eq!(a.stats().ports[0].drops.get_named("fw_deny_in"), 1);
    // A opens TCP to B; B's reply is admitted at A.
    let syn = tcp_v4(&g1, g2.v4, 40000, 80, true, b"");
    expect_delivered(&syn, &a_to_b(&mut a, pa, &mut b, &syn, 2), &g2, pb);
    let synack = tcp_v4(&g2, g1.v4, 80, 40000, true, b"");
    expect_delivered(&synack, &a_to_b(&mut b, pb, &mut a, &synack, 3), &g1, pa);
    let flows = a.dump_tcp_flows("ga").unwrap();
    assert_eq!(flows.len(), 1);
    assert_eq!(flows[0].initiator, Direction::Out);
    // Each way counted once, with its IP bytes (20 IPv4 + 20 TCP).
    assert_eq!((flows[0].out.packets, flows[0].out.bytes), (1, 40));
    assert_eq!((flows[0].inb.packets, flows[0].inb.bytes), (1, 40));
    // A second segment out is served from the flow table: a hit with its bytes on
    // the entry, and counted on the connection.
    let ack = tcp_v4(&g1, g2.v4, 40000, 80, false, b"abcd");
    a_to_b(&mut a, pa, &mut b, &ack, 4);
    let flows = a.dump_tcp_flows("ga").unwrap();
    assert_eq!((flows[0].out.packets, flows[0].out.bytes), (2, 84));
    let uft = a.dump_uft("ga", 0, 100).unwrap();
    let e = uft.outbound.iter().find(|e| e.key.dst_port == 80).unwrap();
    assert_eq!((e.hits, e.bytes), (1, 44));
    // Every layer list-layers names can be dumped; the firewall's flows are its
    // connections, and the rule counts match the dumps.
    let layers = a.list_layers("ga").unwrap();
    let names: Vec<&str> = layers.iter().map(|l| l.name).collect();
    assert_eq!(names, ["gateway", "firewall", "router", "overlay"]);
    for l in &layers {
        let d = a.dump_layer("ga", l.name).unwrap();
        assert_eq!(d.layer.outbound.rules.len(), l.rules_out, "{}", l.name);
        assert_eq!(d.layer.inbound.rules.len(), l.rules_in, "{}", l.name);
        assert_eq!(d.flows, l.flows, "{}", l.name);
    }
    assert_eq!(layers[1].flows, Some(1));
    assert!(layers[2].rules_out > 0, "the router's routes are its rules");
    let e = a.dump_layer("ga", "nat").unwrap_err().to_string();
    assert!(e.contains("\"nat\"") && e.contains("overlay"), "{e}");
    // clear-lft: layers without flows clear none; the firewall forgets the
    // connection, so B's next segment is unsolicited again and denied.
    assert_eq!(a.clear_lft("ga", "router").unwrap(), 0);
    assert_eq!(a.clear_lft("ga", "firewall").unwrap(), 1);
    assert_eq!(a.list_layers("ga").unwrap()[1].flows, Some(0));
    let e = a.clear_lft("ga", "nat").unwrap_err().to_string();
    assert!(e.contains("\"nat\"") && e.contains("firewall"), "{e}");
    let more = tcp_v4(&g2, g1.v4, 80, 40000, false, b"efgh");
    assert!(a_to_b(&mut b, pb, &mut a, &more, 5).is_empty());
    assert_eq!(a.stats().ports[0].drops.get_named("fw_deny_in"), 2);
}

#[test]
fn same_sled_guests_are_delivered_without_encapsulation() {
    let (mut a, pa) = sled(SLED_A, 1);
    let g3 = guest(3);
    let p3 = a.add_port(port_config(&g3)).unwrap();
    let r = Rule::new(1, FwAction::Allow).finalize().unwrap();
    a.add_fw_rule("gc", Direction::In, r).unwrap();
    let f = frame(
        &guest(1),
        None,
        Some(g3.v6),
        L4::Udp { sport: 1, dport: 2 },
        b"local",
    );
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &f, 1, &Fabric, &mut out);
    expect_delivered(&f, &frames(&out), &g3, p3);
    assert_eq!(a.stats().ports[1].local_delivered, 1);
}

#[test]
fn rule_changes_invalidate_cached_flows() {
    let (mut a, pa, _b, _) = two_sleds();
    let f = frame(
        &guest(1),
        Some(guest(2).v4),
        None,
        L4::Udp {
            sport: 9,
            dport: 53,
        },
        b"q",
    );
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &f, 1, &Fabric, &mut out);
    assert_eq!(out.len(), 1);
    let deny = Rule::new(1, FwAction::Deny)
        .matching(Predicate::DstIp("172.30.0.6/32".parse().unwrap()))
        .finalize()
        .unwrap();
    let id = a.add_fw_rule("ga", Direction::Out, deny).unwrap();
    // The established UDP flow survives (stateful), a new one is denied.
    out.clear();
    a.process_guest(pa, VnetHdr::default(), &f, 2, &Fabric, &mut out);
    assert_eq!(out.len(), 1);
    let f2 = frame(
        &guest(1),
        Some(guest(2).v4),
        None,
        L4::Udp {
            sport: 10,
            dport: 53,
        },
        b"q",
    );
    out.clear();
    a.process_guest(pa, VnetHdr::default(), &f2, 3, &Fabric, &mut out);
    assert!(out.is_empty());
    assert_eq!(a.stats().ports[0].drops.get_named("fw_deny_out"), 1);
    a.rm_fw_rule("ga", Direction::Out, id).unwrap();
    out.clear();
    a.process_guest(pa, VnetHdr::default(), &f2, 4, &Fabric, &mut out);
    assert_eq!(out.len(), 1, "recompiled after the rule went away");
    // V2P moves: the next packet goes to the new sled.
    let g2 = guest(2);
    a.set_v2p(
        Vni::new(VNI).unwrap(),
        IpAddr::V4(g2.v4),
        "fd00:99::9".parse().unwrap(),
        g2.mac,
    )
    .unwrap();
    out.clear();
    a.process_guest(pa, VnetHdr::default(), &f, 5, &Fabric, &mut out);
    assert_eq!(
        decode_underlay(out.frame(0).unwrap().1).dst,
        "fd00:99::9".parse::<Ipv6Addr>().unwrap()
    );
}

/// Sends one guest frame and returns the port's or datapath's counter for `reason`.
fn drop_count(e: &engine::Engine, reason: &str) -> u64 {
    let s = e.stats();
    s.ports
        .iter()
        .map(|p| p.drops.get_named(reason))
        .sum::<u64>()
        + s.datapath_drops.get_named(reason)
        + s.underlay_drops.get_named(reason)
}

#[test]
fn every_outbound_drop_reason_is_counted() {
    let g1 = guest(1);
    let g2 = guest(2);
    let udp = L4::Udp { sport: 1, dport: 2 };
    let good = frame(&g1, Some(g2.v4), None, udp, b"x");
    let mut spoof_mac = good.clone();
    spoof_mac[6..12].copy_from_slice(&[0xa8, 0x40, 0x25, 0xff, 0, 9]);
    let mut spoof_ip = frame(&guest(3), Some(g2.v4), None, udp, b"x");
    spoof_ip[6..12].copy_from_slice(&g1.mac.0);
    let mut not_gw = good.clone();
    not_gw[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    let hairpin = frame(&g1, Some(g1.v4), None, udp, b"x");
    let link_scoped = frame(&g1, None, Some("ff02::16".parse().unwrap()), udp, b"x");
    let no_v2p = frame(&g1, Some("172.30.0.99".parse().unwrap()), None, udp, b"x");
    let external = frame(&g1, Some("8.8.8.8".parse().unwrap()), None, udp, b"x");
    let big = frame(&g1, None, Some(g2.v6), udp, &vec![0u8; 8500]);
    let cases: Vec<(&str, Vec<u8>, &dyn engine::UnderlayRoutes)> = vec![
        ("guest_parse_error", good[..20].to_vec(), &Fabric),
        ("spoofed_src_mac", spoof_mac, &Fabric),
        ("spoofed_src_ip", spoof_ip, &Fabric),
        ("dst_mac_not_gateway", not_gw, &Fabric),
        ("link_local_only", link_scoped, &Fabric),
        ("hairpin", hairpin, &Fabric),
        ("no_v2p", no_v2p, &Fabric),
        ("no_route", external, &Fabric),
        ("packet_too_big", big, &Fabric),
    ];
    for (reason, f, routes) in cases {
        let (mut a, pa, _b, _) = two_sleds();
        let mut out = TxBatch::new();
        a.process_guest(pa, VnetHdr::default(), &f, 1, routes, &mut out);
        assert_eq!(drop_count(&a, reason), 1, "{reason}");
        let underlay = out
            .iter()
            .filter(|(d, _)| matches!(d, TxDest::Underlay { .. }))
            .count();
        assert_eq!(underlay, 0, "{reason}: nothing sent to the underlay");
    }
    // Route targets.
    let (mut a, pa, _b, _) = two_sleds();
    a.add_route("ga", "8.8.8.0/24".parse().unwrap(), RouteTarget::Drop, None)
        .unwrap();
    a.add_route(
        "ga",
        "9.9.9.0/24".parse().unwrap(),
        RouteTarget::InternetGateway(None),
        None,
    )
    .unwrap();
    let mut out = TxBatch::new();
    a.process_guest(
        pa,
        VnetHdr::default(),
        &frame(&g1, Some("8.8.8.8".parse().unwrap()), None, udp, b"x"),
        1,
        &Fabric,
        &mut out,
    );
    assert_eq!(drop_count(&a, "route_drop"), 1);
    a.process_guest(
        pa,
        VnetHdr::default(),
        &frame(&g1, Some("9.9.9.9".parse().unwrap()), None, udp, b"x"),
        1,
        &Fabric,
        &mut out,
    );
    // Through NAT first: a port without an external address may not reach the
    // internet; with one, the overlay finds no boundary services.
    assert_eq!(drop_count(&a, "no_external_ip"), 1);
    let float = IpAddr::V4(floating(&g1).0);
    let ext = engine::ExternalIps {
        floating: vec![float],
        ..Default::default()
    };
    a.set_external_ips("ga", ext).unwrap();
    a.process_guest(
        pa,
        VnetHdr::default(),
        &frame(&g1, Some("9.9.9.9".parse().unwrap()), None, udp, b"x"),
        1,
        &Fabric,
        &mut out,
    );
    assert_eq!(drop_count(&a, "no_boundary_services"), 1);
    a.process_guest(
        engine::PortId(42),
        VnetHdr::default(),
        &good,
        1,
        &Fabric,
        &mut out,
    );
    assert_eq!(drop_count(&a, "unknown_port"), 1);
    assert!(out.is_empty());
}

#[test]
fn every_inbound_drop_reason_is_counted() {
    let (g1, g2) = (guest(1), guest(2));
    let (mut a, pa, b, _) = two_sleds();
    let f = frame(&g1, Some(g2.v4), None, L4::Udp { sport: 1, dport: 2 }, b"x");
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &f, 1, &Fabric, &mut out);
    let good = out.frame(0).unwrap().1.to_vec();
    let inner_off = good.len() - f.len();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![("truncated", good[..40].to_vec())];
    let mut other_sled = good.clone();
    other_sled[14 + 24 + 15] ^= 1;
    cases.push(("not_our_underlay_addr", other_sled));
    let mut bcast = good.clone();
    bcast[inner_off..inner_off + 6].copy_from_slice(&[0xff; 6]);
    cases.push(("inner_multicast", bcast));
    let mut unknown_mac = good.clone();
    unknown_mac[inner_off + 5] = 0x33;
    cases.push(("no_port_for_vni_mac", unknown_mac));
    // Guest 2's MAC but another address (sled A maps .99 to guest 2's MAC on B).
    let stray: Ipv4Addr = "172.30.0.99".parse().unwrap();
    a.set_v2p(
        Vni::new(VNI).unwrap(),
        IpAddr::V4(stray),
        SLED_B.parse().unwrap(),
        g2.mac,
    )
    .unwrap();
    out.clear();
    a.process_guest(
        pa,
        VnetHdr::default(),
        &frame(&g1, Some(stray), None, L4::Udp { sport: 1, dport: 2 }, b"x"),
        2,
        &Fabric,
        &mut out,
    );
    cases.push(("inbound_dst_not_guest", out.frame(0).unwrap().1.to_vec()));
    let mut garbage_inner = good.clone();
    garbage_inner[inner_off + 14] = 0x47; // IPv4 with IHL 7 past the packet: unparsable
    garbage_inner[inner_off + 15..]
        .iter_mut()
        .for_each(|b| *b = 0xff);
    cases.push(("inner_parse_error", garbage_inner));
    for (reason, u) in cases {
        let mut b2 = engine::Engine::new(b.config().clone()).unwrap();
        let _ = b2.add_port(port_config(&g2)).unwrap();
        let out = receive(&mut b2, &[u], 1);
        assert!(out.is_empty(), "{reason}");
        assert_eq!(drop_count(&b2, reason), 1, "{reason}: {:?}", b2.stats());
    }
}

fn arb_l4() -> impl Strategy<Value = L4> {
    prop_oneof![
        (1024u16.., 1u16..1024, any::<bool>()).prop_map(|(sport, dport, syn)| L4::Tcp {
            sport,
            dport,
            syn
        }),
        (any::<u16>(), any::<u16>()).prop_map(|(sport, dport)| L4::Udp { sport, dport }),
        (any::<u16>(), any::<u16>()).prop_map(|(id, seq)| L4::Icmp { id, seq }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// decapsulate(encapsulate(frame)) delivers the original inner frame, v4 and v6.
    #[test]
    fn round_trip_between_two_sleds(
        l4 in arb_l4(),
        v6 in any::<bool>(),
        payload in proptest::collection::vec(any::<u8>(), 0..1400),
    ) {
        let (mut a, pa, mut b, pb) = two_sleds();
        let (g1, g2) = (guest(1), guest(2));
        let (d4, d6): (Option<Ipv4Addr>, Option<Ipv6Addr>) = if v6 { (None, Some(g2.v6)) } else { (Some(g2.v4), None) };
        if let L4::Tcp { sport, dport, syn: false } = l4 {
            // Sled B admits inbound TCP only from a SYN on.
            let syn = frame(&g1, d4, d6, L4::Tcp { sport, dport, syn: true }, &[]);
            prop_assert_eq!(a_to_b(&mut a, pa, &mut b, &syn, 1).len(), 1);
        }
        let f = frame(&g1, d4, d6, l4, &payload);
        let got = a_to_b(&mut a, pa, &mut b, &f, 1);
        prop_assert_eq!(got.len(), 1);
        let to_b = matches!(got[0].0, TxDest::Port { port, .. } if port == pb);
        prop_assert!(to_b);
        prop_assert_eq!(&got[0].1[0..6], &g2.mac.0[..]);
        prop_assert_eq!(&got[0].1[6..12], &g2.gw_mac.0[..]);
        prop_assert_eq!(&got[0].1[12..], &f[12..]);
    }
}

/// Underlay routes whose one neighbour's MAC the test can change.
struct MovableFabric(std::cell::Cell<[u8; 6]>);

impl engine::UnderlayRoutes for MovableFabric {
    fn next_hops(&self, _dst: Ipv6Addr) -> engine::NextHopSet {
        engine::NextHopSet::from(engine::NextHop {
            ifindex: IFINDEX,
            src_mac: "02:00:00:00:99:01".parse().unwrap(),
            dst_mac: engine::MacAddr(self.0.get()),
        })
    }
}

#[test]
fn invalidating_next_hops_recompiles_cached_outer_headers() {
    let (mut a, pa, _b, _) = two_sleds();
    let f = frame(
        &guest(1),
        Some(guest(2).v4),
        None,
        L4::Udp {
            sport: 9,
            dport: 53,
        },
        b"q",
    );
    let routes = MovableFabric(std::cell::Cell::new([2, 0, 0, 0, 0x99, 2]));
    let mut out = TxBatch::new();
    let mut send = |a: &mut engine::Engine, now| {
        out.clear();
        a.process_guest(pa, VnetHdr::default(), &f, now, &routes, &mut out);
        out.frame(0).unwrap().1[..6].to_vec()
    };
    assert_eq!(send(&mut a, 1), [2, 0, 0, 0, 0x99, 2]);
    routes.0.set([2, 0, 0, 0, 0x99, 3]);
    // The flow is cached with the old neighbour until the engine is told.
    assert_eq!(send(&mut a, 2), [2, 0, 0, 0, 0x99, 2]);
    let epoch = a.epoch();
    a.invalidate_next_hops();
    assert!(a.epoch() > epoch);
    assert_eq!(send(&mut a, 3), [2, 0, 0, 0, 0x99, 3]);
    // The connection survived: no new one was created.
    assert_eq!(a.stats().ports[0].firewall.flows_created, 1);
}

#[test]
fn inbound_tcp_without_syn_opens_nothing() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let ack = tcp_v4(&g1, g2.v4, 40000, 80, false, b"x");
    assert!(a_to_b(&mut a, pa, &mut b, &ack, 1).is_empty());
    assert_eq!(drop_count(&b, "fw_midstream_in"), 1);
    assert_eq!(b.stats().ports[0].firewall.flows, 0);
    // Not cached: the SYN of the same flow is admitted.
    let syn = tcp_v4(&g1, g2.v4, 40000, 80, true, b"");
    expect_delivered(&syn, &a_to_b(&mut a, pa, &mut b, &syn, 2), &g2, pb);
}

/// An ICMPv4 message from guest 2 to guest 1 with `quote` as its body.
fn icmp4_from_g2(t: u8, code: u8, quote: &[u8]) -> Vec<u8> {
    let (g1, g2) = (guest(1), guest(2));
    let mut buf = Vec::new();
    etherparse::PacketBuilder::ethernet2(g2.mac.0, g2.gw_mac.0)
        .ipv4(g2.v4.octets(), g1.v4.octets(), 64)
        .icmpv4(etherparse::Icmpv4Type::Unknown {
            type_u8: t,
            code_u8: code,
            bytes5to8: [0; 4],
        })
        .write(&mut buf, quote)
        .unwrap();
    buf
}

#[test]
fn icmp_types_are_decided_separately_and_errors_need_a_related_connection() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    a.set_fw_rules("ga", vec![]).unwrap();
    let ping = frame(&g1, Some(g2.v4), None, L4::Icmp { id: 77, seq: 1 }, b"ping");
    expect_delivered(&ping, &a_to_b(&mut a, pa, &mut b, &ping, 1), &g2, pb);
    // An unrelated error and another message type from the pinged host: denied.
    let mut udp = Vec::new();
    etherparse::PacketBuilder::ipv4(g1.v4.octets(), g2.v4.octets(), 64)
        .udp(5000, 53)
        .write(&mut udp, b"")
        .unwrap();
    for f in [icmp4_from_g2(3, 3, &udp), icmp4_from_g2(13, 0, &[0; 12])] {
        assert!(a_to_b(&mut b, pb, &mut a, &f, 2).is_empty());
    }
    assert_eq!(drop_count(&a, "fw_deny_in"), 2);
    // An error quoting the ping (IP header + 8 bytes of it) is related: delivered,
    // without opening anything.
    let quote = &ping[14..14 + 28];
    let err = icmp4_from_g2(11, 0, quote);
    expect_delivered(&err, &a_to_b(&mut b, pb, &mut a, &err, 3), &g1, pa);
    assert_eq!(a.stats().ports[0].firewall.flows, 1);
    // The same error type quoting something else is still denied (not cached).
    let other = icmp4_from_g2(11, 0, &udp);
    assert!(a_to_b(&mut b, pb, &mut a, &other, 4).is_empty());
}

/// Clears the IPv4 DF bit of an Ethernet/IPv4 frame and fixes the header checksum.
fn clear_df(f: &mut [u8]) {
    f[20] &= !0x40;
    f[24..26].copy_from_slice(&[0, 0]);
    let mut sum: u32 = f[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

#[test]
fn fragmenting_completes_a_pending_checksum() {
    let (mut a, pa) = sled(SLED_A, 1);
    let g3 = guest(3);
    let mut c3 = port_config(&g3);
    c3.mtu = 1500;
    let p3 = a.add_port(c3).unwrap();
    let r = Rule::new(1, FwAction::Allow).finalize().unwrap();
    a.add_fw_rule("gc", Direction::In, r).unwrap();
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
    let g1 = guest(1);
    let good = frame(
        &g1,
        Some(g3.v4),
        None,
        L4::Udp { sport: 7, dport: 9 },
        &payload,
    );
    let mut f = good.clone();
    clear_df(&mut f);
    let mut reference = good.clone();
    clear_df(&mut reference);
    // What a guest with checksum offload sends: the folded pseudo-header sum.
    let udp_len = (f.len() - 34) as u32;
    let mut sum: u32 = f[26..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>()
        + 17
        + udp_len;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[40..42].copy_from_slice(&(sum as u16).to_be_bytes());
    let vnet = VnetHdr {
        flags: wire::vnet::F_NEEDS_CSUM,
        csum_start: 34,
        csum_offset: 6,
        ..VnetHdr::default()
    };
    let mut out = TxBatch::new();
    a.process_guest(pa, vnet, &f, 1, &Fabric, &mut out);
    let mut frags: Vec<(usize, Vec<u8>)> = frames(&out)
        .into_iter()
        .map(|(d, fr)| {
            assert!(
                matches!(d, TxDest::Port { port, .. } if port == p3),
                "{d:?}"
            );
            let off = usize::from(u16::from_be_bytes([fr[20], fr[21]]) & 0x1fff) * 8;
            let ihl = usize::from(fr[14] & 0x0f) * 4;
            (off, fr[14 + ihl..].to_vec())
        })
        .collect();
    assert!(frags.len() >= 3, "{} fragments", frags.len());
    frags.sort();
    let l4: Vec<u8> = frags.into_iter().flat_map(|(_, p)| p).collect();
    assert_eq!(
        l4,
        reference[34..],
        "reassembled datagram with a complete checksum"
    );
}

#[test]
fn route_mtus_only_lower_the_path_mtu() {
    let (mut a, pa) = sled(SLED_A, 1);
    let g3 = guest(3);
    let mut c3 = port_config(&g3);
    c3.mtu = 1500;
    a.add_port(c3).unwrap();
    // Above what the underlay carries: refused, naming the limit.
    let e = a
        .add_route(
            "ga",
            "172.30.0.0/24".parse().unwrap(),
            RouteTarget::VpcSubnet,
            Some(8923),
        )
        .unwrap_err();
    assert!(e.to_string().contains("8922"), "{e}");
    // A route MTU of 8000 does not raise the 1500 of the destination port.
    a.add_route(
        "ga",
        "172.30.0.0/24".parse().unwrap(),
        RouteTarget::VpcSubnet,
        Some(8000),
    )
    .unwrap();
    let f = frame(
        &guest(1),
        Some(g3.v4),
        None,
        L4::Udp { sport: 7, dport: 9 },
        &[0; 2000],
    );
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &f, 1, &Fabric, &mut out);
    assert_eq!(drop_count(&a, "packet_too_big"), 1);
}

#[test]
fn cached_drops_win_over_the_size_check() {
    let (mut a, pa, _b, _) = two_sleds();
    let deny = Rule::new(1, FwAction::Deny)
        .matching(Predicate::DstIp(
            "fd00:1122:3344:100::6/128".parse().unwrap(),
        ))
        .finalize()
        .unwrap();
    a.add_fw_rule("ga", Direction::Out, deny).unwrap();
    let big = frame(
        &guest(1),
        None,
        Some(guest(2).v6),
        L4::Udp { sport: 7, dport: 9 },
        &[0; 8600],
    );
    let mut out = TxBatch::new();
    for now in 1..3 {
        a.process_guest(pa, VnetHdr::default(), &big, now, &Fabric, &mut out);
    }
    assert!(out.is_empty(), "no Packet Too Big for a denied flow");
    assert_eq!(drop_count(&a, "fw_deny_out"), 2);
    assert_eq!(drop_count(&a, "packet_too_big"), 0);
}

/// A cached flow whose connection was evicted must not ride on whatever connection
/// took its slot: the flow-table entry keeps a handle to its connection (not the
/// key), and eviction must make that handle stale so the flow is decided again.
#[test]
fn cached_flows_outlive_no_evicted_connection() {
    let (mut a, pa) = sled_a_with_conn_limit(1);
    let (g1, g2) = (guest(1), guest(2));
    let udp = |sport| frame(&g1, Some(g2.v4), None, L4::Udp { sport, dport: 53 }, b"q");
    let send = |a: &mut engine::Engine, f: &[u8], now| {
        let mut out = TxBatch::new();
        a.process_guest(pa, VnetHdr::default(), f, now, &Fabric, &mut out);
        out.len()
    };
    let conn_ports = |a: &engine::Engine| -> Vec<u16> {
        a.dump_tcp_flows("ga")
            .unwrap()
            .iter()
            .map(|c| c.key.src_port)
            .collect()
    };
    // X, then Y: the one-entry table evicts X (unanswered) for Y.
    assert_eq!(send(&mut a, &udp(1111), 1), 1);
    assert_eq!(send(&mut a, &udp(2222), 2), 1);
    assert_eq!(conn_ports(&a), vec![2222]);
    // X again: its cached entry hits, its connection is gone, so it is decided again
    // (evicting Y) instead of being tracked on Y's connection.
    let s0 = a.stats().ports[0].uft_out;
    assert_eq!(send(&mut a, &udp(1111), 3), 1);
    let s1 = a.stats().ports[0].uft_out;
    assert_eq!((s1.hits, s1.misses), (s0.hits + 1, s0.misses));
    assert_eq!(conn_ports(&a), vec![1111]);
    let fw = a.stats().ports[0].firewall;
    assert_eq!((fw.flows_created, fw.flows_evicted), (3, 2));
    // And X's next packet is tracked on its new connection.
    assert_eq!(send(&mut a, &udp(1111), 4), 1);
    assert_eq!(a.stats().ports[0].firewall.flows_created, 3);
}

/// Two workers of one sled, each with its engine and one port, each told where the
/// other's port is. A guest frame to the other worker's port leaves as a frame for
/// that worker (not encapsulated toward this sled); the owner delivers it with the
/// gateway's MACs after its own inbound checks. An underlay frame received by the
/// wrong worker is handed to the owner whole, which decapsulates it.
#[test]
fn frames_for_another_workers_port_are_handed_to_it() {
    use engine::{FrameBytes, RxFrame, SiblingFrame};
    let (mut w0, p0) = sled(SLED_A, 1);
    let (mut w1, p1) = sled(SLED_A, 3);
    let (g1, g3) = (guest(1), guest(3));
    let vni = Vni::new(VNI).unwrap();
    let ips = |g: &Guest| [IpAddr::V4(g.v4), IpAddr::V6(g.v6)];
    w0.set_sibling_port(vni, g3.mac, &ips(&g3), 8500, 1)
        .unwrap();
    w1.set_sibling_port(vni, g1.mac, &ips(&g1), 8500, 0)
        .unwrap();
    // A worker's own port cannot be another worker's too.
    assert!(w0.set_sibling_port(vni, g1.mac, &[], 8500, 1).is_err());

    let f = tcp_v4(&g1, g3.v4, 40000, 80, true, &[7; 1000]);
    let mut out = TxBatch::new();
    w0.process_guest(p0, VnetHdr::default(), &f, 1, &Fabric, &mut out);
    let sent = frames(&out);
    assert_eq!(sent.len(), 1);
    let TxDest::Sibling {
        worker: 1,
        frame: SiblingFrame::Guest { vni: v, vnet },
    } = sent[0].0
    else {
        panic!("not handed to worker 1: {:?}", sent[0].0);
    };
    assert_eq!((v, vnet), (vni, VnetHdr::default()));
    assert_eq!(&sent[0].1[..6], &g3.mac.0, "addressed to the owner's guest");

    let mut delivered = TxBatch::new();
    let pieces = [&sent[0].1[..]];
    w1.process_sibling(vni, vnet, RxFrame::new(&pieces, 0), 1, &mut delivered);
    let got = frames_of(&delivered, &[&sent[0].1]);
    expect_delivered(&f, &got, &g3, p1);
    // Referred to, not copied (it is not short): the owner holds the handed-over
    // buffer until the batch is drained.
    assert!(matches!(
        delivered.iter().next(),
        Some((_, FrameBytes::Gather { .. }))
    ));
    assert_eq!(w1.stats().ports[0].local_delivered, 1);

    // The reply, through sled B's encapsulation, arrives at worker 1 (wrong one).
    let (mut b, pb) = sled(SLED_B, 2);
    b.set_v2p(vni, IpAddr::V4(g1.v4), SLED_A.parse().unwrap(), g1.mac)
        .unwrap();
    let g2 = guest(2);
    // Every worker knows the sled's V2P table: the owner checks the sender.
    w0.set_v2p(vni, IpAddr::V4(g2.v4), SLED_B.parse().unwrap(), g2.mac)
        .unwrap();
    let udp = frame(&g2, Some(g1.v4), None, L4::Udp { sport: 5, dport: 6 }, b"x");
    let mut wire = TxBatch::new();
    b.process_guest(pb, VnetHdr::default(), &udp, 2, &Fabric, &mut wire);
    let wire: Vec<Vec<u8>> = frames(&wire).into_iter().map(|(_, u)| u).collect();
    let handed = receive(&mut w1, &wire, 2);
    assert_eq!(handed.len(), 1);
    assert_eq!(
        handed[0],
        (
            TxDest::Sibling {
                worker: 0,
                frame: SiblingFrame::Underlay
            },
            wire[0].clone()
        ),
        "the whole underlay frame goes to the owner"
    );
    let got = receive(&mut w0, &wire, 3);
    expect_delivered(&udp, &got, &g1, p0);

    // Once the other worker's port is gone, its addresses route as any other.
    w0.clear_sibling_port(vni, g3.mac, &ips(&g3));
    let mut out = TxBatch::new();
    w0.process_guest(p0, VnetHdr::default(), &f, 4, &Fabric, &mut out);
    assert!(out.is_empty());
    assert_eq!(w0.stats().ports[0].drops.get_named("no_v2p"), 1);
}

/// A received frame whose headers do not lie in its first piece (not what copy-mode
/// AF_XDP hands over, but possible with other drivers) is made contiguous and
/// delivered all the same; what the guest gets still refers to the frame's own
/// pieces.
#[test]
fn headers_across_pieces_are_read_from_a_contiguous_copy() {
    use engine::RxFrame;
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let f = frame(
        &g1,
        Some(g2.v4),
        None,
        L4::Udp { sport: 7, dport: 9 },
        &[3; 3000],
    );
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &f, 1, &Fabric, &mut out);
    let u = frames(&out).remove(0).1;
    for cut in [1, 40, 60, 77, 100] {
        let pieces = [&u[..cut], &u[cut..cut + 500], &u[cut + 500..]];
        let mut got = TxBatch::new();
        b.process_underlay(RxFrame::new(&pieces, 0), 1, &Fabric, &mut got);
        b.end_of_batch(&mut got);
        expect_delivered(&f, &frames_of(&got, &[&u]), &g2, pb);
    }
}

/// When the underlay's MTU goes down under a port's, the port's large packets get
/// Packet Too Big for what the underlay still carries instead of being sent too big
/// (TSO segments are sized from the underlay MTU on every buffer anyway); an MTU no
/// port could use is refused.
#[test]
fn a_lowered_underlay_mtu_bounds_paths_and_segments() {
    let (mut a, pa, _b, _) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let big = frame(
        &g1,
        None,
        Some(g2.v6),
        L4::Udp { sport: 1, dport: 2 },
        &[0; 4000],
    );
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &big, 1, &Fabric, &mut out);
    assert_eq!(frames(&out)[0].0, TxDest::Underlay { ifindex: IFINDEX });

    assert!(a.set_underlay_mtu(1000).is_err(), "below a minimum port");
    assert_eq!(
        a.set_underlay_mtu(1600).unwrap(),
        ["ga"],
        "port MTU 8500 no longer fits"
    );
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &big, 2, &Fabric, &mut out);
    let got = frames(&out);
    assert_eq!(got.len(), 1);
    assert!(
        matches!(got[0].0, TxDest::Port { .. }),
        "Packet Too Big to the guest"
    );
    // ICMPv6 type 2, MTU = 1600 - 78.
    assert_eq!(got[0].1[54], 2);
    assert_eq!(&got[0].1[58..62], &1522u32.to_be_bytes());
    assert_eq!(a.stats().ports[0].drops.get_named("packet_too_big"), 1);
}
