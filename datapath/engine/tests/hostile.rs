//! The engine against a hostile underlay and hostile guests: frames from senders the
//! overlay does not trust, TCP segments outside their connection's window, guests
//! that try to fill the connection table or lie in their `virtio_net_hdr`. Each test
//! checks the named drop counter and that the real traffic around the attack still
//! flows.

mod common;

use common::*;
use engine::machinery::conntrack::{TcpState, EXPIRE_SCAN};
use engine::OuterTemplate;
use engine::V2b;
use engine::{
    Direction, Engine, EngineConfig, FwAction, MacAddr, PortId, RouteTarget, Rule, RxFrame,
    TxBatch, TxDest, VnetHdr, Vni,
};
use etherparse::{PacketBuilder, TcpHeader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use wire::vnet::{F_NEEDS_CSUM, GSO_TCPV4, GSO_TCPV6};

const S: u64 = 1_000_000_000;
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
const MISMATCH: &str = "underlay_src_mismatch";
const OUT_OF_WINDOW: &str = "tcp_out_of_window";
/// Boundary services of the sleds built with [`sled_b_with_boundary`].
const BOUNDARY: &str = "fd00:99::ff";

/// An IPv4 TCP segment from guest `from` (to its gateway) to `to`, with these numbers
/// and flags and a 65535-byte window.
fn tcp(
    from: &Guest,
    to: Ipv4Addr,
    ports: (u16, u16),
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let macs = (from.mac, from.gw_mac);
    tcp_between(macs, (from.v4, to), ports, (seq, ack), flags, payload)
}

/// An IPv4 TCP segment with these MACs (source, destination), addresses, ports,
/// (sequence, acknowledgement) numbers and flags, and a 65535-byte window.
fn tcp_between(
    macs: (MacAddr, MacAddr),
    ips: (Ipv4Addr, Ipv4Addr),
    ports: (u16, u16),
    (seq, ack): (u32, u32),
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut h = TcpHeader::new(ports.0, ports.1, seq, 65535);
    h.acknowledgment_number = ack;
    h.fin = flags & FIN != 0;
    h.syn = flags & SYN != 0;
    h.rst = flags & RST != 0;
    h.psh = flags & PSH != 0;
    h.ack = flags & ACK != 0;
    let mut buf = Vec::new();
    PacketBuilder::ethernet2(macs.0 .0, macs.1 .0)
        .ipv4(ips.0.octets(), ips.1.octets(), 64)
        .tcp_header(h)
        .write(&mut buf, payload)
        .unwrap();
    buf
}

/// A guest frame as an underlay frame to sled B from outer source `src` in VPC `vni`,
/// addressed to guest `to`, with or without the External option: what any host that
/// reaches sled B's underlay address can send.
fn forged(src: &str, vni: u32, external: bool, to: &Guest, inner: &[u8]) -> Vec<u8> {
    let mut inner = inner.to_vec();
    inner[..6].copy_from_slice(&to.mac.0);
    let t = OuterTemplate::new(
        MacAddr([2, 0, 0, 0, 0x99, 9]),
        MacAddr([2, 0, 0, 0, 0x99, 2]),
        src.parse().unwrap(),
        SLED_B.parse().unwrap(),
        50000,
        0,
        Vni::new(vni).unwrap(),
        external,
        false,
    );
    let mut out = TxBatch::new();
    assert!(t.encapsulate(&inner, None, TxDest::Underlay { ifindex: 1 }, &mut out) > 0);
    out.frame(0).unwrap().1.to_vec()
}

/// Sends `f` from `port` of `e` and returns the underlay frames its engine made.
fn send(e: &mut Engine, port: PortId, f: &[u8], now: u64) -> Vec<Vec<u8>> {
    let mut out = TxBatch::new();
    e.process_guest(port, VnetHdr::default(), f, now, &Fabric, &mut out);
    frames_of(&out, &[])
        .into_iter()
        .filter(|(d, _)| matches!(d, TxDest::Underlay { .. }))
        .map(|(_, f)| f)
        .collect()
}

/// Drops counted under `reason` over all ports of `e`.
fn drops(e: &Engine, reason: &str) -> u64 {
    e.stats()
        .ports
        .iter()
        .map(|p| p.drops.get_named(reason))
        .sum()
}

/// Sends `forgery` to sled B before and after the real UDP flow from guest 1 is
/// cached there: refused both times (`underlay_src_mismatch`), without caching
/// anything and without disturbing the real flow. `forgery` makes the forged underlay
/// frame from the real guest frame.
fn refused_around_the_real_flow(forgery: impl Fn(&[u8]) -> Vec<u8>) {
    let (mut a, pa, mut b, _) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let udp = frame(
        &g1,
        Some(g2.v4),
        None,
        L4::Udp { sport: 5, dport: 6 },
        b"hi",
    );
    // As the first frame of the flow: nothing is cached, so it cannot pre-empt the
    // real flow.
    assert!(receive(&mut b, &[forgery(&udp)], 1).is_empty());
    assert_eq!(drops(&b, MISMATCH), 1);
    assert_eq!(b.stats().ports[0].uft_in.entries, 0);
    let real = send(&mut a, pa, &udp, 2);
    assert_eq!(receive(&mut b, &real, 2).len(), 1);
    // Once the real flow is cached, on the hit path; the real frames keep flowing.
    assert!(receive(&mut b, &[forgery(&udp)], 3).is_empty());
    assert_eq!(drops(&b, MISMATCH), 2);
    assert_eq!(receive(&mut b, &real, 4).len(), 1);
    assert_eq!(b.stats().ports[0].in_packets, 2);
}

#[test]
fn frames_from_a_sled_v2p_does_not_name_are_dropped() {
    let g2 = guest(2);
    refused_around_the_real_flow(|f| forged("fd00:99::66", VNI, false, &g2, f));
    // The forgery helper itself is sound: from the right sled, the same frame passes.
    let (_, _, mut b, _) = two_sleds();
    let udp = frame(
        &guest(1),
        Some(g2.v4),
        None,
        L4::Udp { sport: 5, dport: 6 },
        b"hi",
    );
    assert_eq!(
        receive(&mut b, &[forged(SLED_A, VNI, false, &g2, &udp)], 1).len(),
        1
    );
}

#[test]
fn a_source_mac_other_than_the_mapped_guests_is_dropped() {
    let g2 = guest(2);
    refused_around_the_real_flow(|f| {
        let mut f = f.to_vec();
        f[6..12].copy_from_slice(&[0xa8, 0x40, 0x25, 0xff, 0, 0x77]);
        forged(SLED_A, VNI, false, &g2, &f)
    });
}

#[test]
fn vpc_frames_marked_external_are_dropped() {
    // The right sled, but claiming to come from outside the VPC: not from boundary
    // services, so not trusted either way.
    let g2 = guest(2);
    refused_around_the_real_flow(|f| forged(SLED_A, VNI, true, &g2, f));
}

#[test]
fn frames_claiming_this_sled_as_source_are_dropped() {
    // V2P names sled B itself for an address (a guest of this sled, as a control plane
    // that publishes every mapping everywhere would have it): no frame from the
    // underlay can be that guest's.
    let (_, _, mut b, _) = two_sleds();
    let g2 = guest(2);
    let local = guest(3);
    b.set_v2p(
        Vni::new(VNI).unwrap(),
        IpAddr::V4(local.v4),
        SLED_B.parse().unwrap(),
        local.mac,
    )
    .unwrap();
    let udp = frame(
        &local,
        Some(g2.v4),
        None,
        L4::Udp { sport: 5, dport: 6 },
        b"x",
    );
    assert!(receive(&mut b, &[forged(SLED_B, VNI, false, &g2, &udp)], 1).is_empty());
    assert_eq!(drops(&b, MISMATCH), 1);
}

#[test]
fn a_source_address_of_another_vpc_is_dropped() {
    // Sled B hosts guest 3 in VPC 200; V2P maps guest 1's address to sled A in the
    // test VPC only. A VPC-200 frame from sled A with guest 1's address and MAC is
    // nobody V2P knows in VPC 200.
    let (_, _, mut b, _) = two_sleds();
    let (g1, g3) = (guest(1), guest(3));
    let mut c3 = port_config(&g3);
    c3.vni = Vni::new(200).unwrap();
    b.add_port(c3).unwrap();
    let allow = Rule::new(1, FwAction::Allow).finalize().unwrap();
    b.add_fw_rule("gc", Direction::In, allow).unwrap();
    let udp = frame(&g1, Some(g3.v4), None, L4::Udp { sport: 5, dport: 6 }, b"x");
    assert!(receive(&mut b, &[forged(SLED_A, 200, false, &g3, &udp)], 1).is_empty());
    assert_eq!(b.stats().ports[1].drops.get_named(MISMATCH), 1);
    // Mapped in VPC 200 as well, the same frame is delivered.
    b.set_v2p(
        Vni::new(200).unwrap(),
        IpAddr::V4(g1.v4),
        SLED_A.parse().unwrap(),
        g1.mac,
    )
    .unwrap();
    assert_eq!(
        receive(&mut b, &[forged(SLED_A, 200, false, &g3, &udp)], 2).len(),
        1
    );
}

/// Sled B with guest 2 (and its floating IPs), boundary services at [`BOUNDARY`] (so
/// default routes to the internet gateway), and guest 2's TCP connection to
/// 8.8.8.8:443 opened.
fn sled_b_with_boundary() -> (Engine, PortId) {
    let mut cfg = EngineConfig::new(SLED_B.parse().unwrap());
    cfg.boundary_services = Some(BOUNDARY.parse().unwrap());
    let mut b = Engine::new(cfg).unwrap();
    let g2 = guest(2);
    let pb = b.add_port(port_config_floating(&g2)).unwrap();
    let syn = tcp(
        &g2,
        Ipv4Addr::new(8, 8, 8, 8),
        (40000, 443),
        1000,
        0,
        SYN,
        b"",
    );
    let sent = send(&mut b, pb, &syn, 1);
    assert_eq!(decode_underlay(&sent[0]).dst.to_string(), BOUNDARY);
    (b, pb)
}

#[test]
fn external_frames_come_only_from_boundary_services() {
    let (mut b, _) = sled_b_with_boundary();
    let g2 = guest(2);
    // From 8.8.8.8:443 to guest 2's floating IP, port 40000, as the boundary switch
    // hands it over.
    let from_internet = |seq, flags, payload: &[u8]| {
        let macs = (MacAddr([2, 0, 0, 0, 0, 0x42]), g2.mac);
        let ips = (Ipv4Addr::new(8, 8, 8, 8), floating(&g2).0);
        tcp_between(macs, ips, (443, 40000), (seq, 1001), flags, payload)
    };
    let synack = from_internet(5000, SYN | ACK, b"");
    // From another host, with or without the option; from boundary services without
    // it: dropped, and nothing is cached. Without the option, a frame to an external
    // address is not for the guest (only External frames go through NAT).
    for (src, ext) in [
        ("fd00:99::66", true),
        ("fd00:99::66", false),
        (BOUNDARY, false),
    ] {
        assert!(receive(&mut b, &[forged(src, VNI, ext, &g2, &synack)], 2).is_empty());
    }
    assert_eq!(drops(&b, MISMATCH), 1);
    assert_eq!(drops(&b, "inbound_dst_not_guest"), 2);
    assert_eq!(b.stats().ports[0].uft_in.entries, 0);
    // From boundary services, marked External: the connection's reply is delivered.
    assert_eq!(
        receive(&mut b, &[forged(BOUNDARY, VNI, true, &g2, &synack)], 3).len(),
        1
    );
    let state = b.dump_tcp_flows("gb").unwrap()[0].tcp_state;
    assert_eq!(state, Some(TcpState::Established));
    // Its cached entry admits no one else.
    let data = from_internet(5001, ACK, b"data");
    assert!(receive(&mut b, &[forged("fd00:99::66", VNI, true, &g2, &data)], 4).is_empty());
    assert_eq!(drops(&b, MISMATCH), 2);
    assert_eq!(
        receive(&mut b, &[forged(BOUNDARY, VNI, true, &g2, &data)], 4).len(),
        1
    );
}

/// The V2B table of [`v2b_endpoints_choose_and_admit`]: two switches for everything,
/// a third for 8.8.0.0/16.
const V2B_ANY: [&str; 2] = ["fd00:99::b1", "fd00:99::b2"];
const V2B_GOOGLE: &str = "fd00:99::b3";

fn v2b_table(any: &[&str]) -> V2b {
    let mut t = V2b::default();
    let eps: Vec<Ipv6Addr> = any.iter().map(|a| a.parse().unwrap()).collect();
    t.set("0.0.0.0/0".parse().unwrap(), &eps).unwrap();
    t.set(
        "8.8.0.0/16".parse().unwrap(),
        &[V2B_GOOGLE.parse().unwrap()],
    )
    .unwrap();
    t
}

#[test]
fn v2b_endpoints_choose_and_admit() {
    let mut b = Engine::new(EngineConfig::new(SLED_B.parse().unwrap())).unwrap();
    let g2 = guest(2);
    let pb = b.add_port(port_config_floating(&g2)).unwrap();
    let igw = |b: &mut Engine| {
        b.add_route(
            "gb",
            "0.0.0.0/0".parse().unwrap(),
            RouteTarget::InternetGateway(None),
            None,
        )
        .unwrap();
    };
    igw(&mut b);
    let syn_to = |dst, sport| tcp(&g2, dst, (sport, 443), 1000, 0, SYN, b"");
    // No V2B entry yet: counted, not sent.
    assert!(send(&mut b, pb, &syn_to(Ipv4Addr::new(1, 1, 1, 1), 40000), 1).is_empty());
    assert_eq!(drops(&b, "no_boundary_services"), 1);
    b.set_v2b(&v2b_table(&V2B_ANY)).unwrap();
    // The longest prefix wins, in the boundary VNI.
    let d = decode_underlay(&send(&mut b, pb, &syn_to(Ipv4Addr::new(8, 8, 8, 8), 40000), 2)[0]);
    assert_eq!(d.dst.to_string(), V2B_GOOGLE);
    assert_eq!(d.vni, 99);
    // Flows to the rest spread over both switches of 0.0.0.0/0; each flow keeps its
    // switch, and another engine with the same table picks the same one.
    let mut c = Engine::new(EngineConfig::new(SLED_B.parse().unwrap())).unwrap();
    let pc = c.add_port(port_config_floating(&g2)).unwrap();
    igw(&mut c);
    c.set_v2b(&v2b_table(&V2B_ANY)).unwrap();
    let mut used = std::collections::BTreeMap::new();
    for sport in 41000..41032 {
        let syn = syn_to(Ipv4Addr::new(1, 1, 1, 1), sport);
        let first = decode_underlay(&send(&mut b, pb, &syn, 3)[0]).dst;
        assert_eq!(decode_underlay(&send(&mut b, pb, &syn, 3)[0]).dst, first);
        assert_eq!(decode_underlay(&send(&mut c, pc, &syn, 3)[0]).dst, first);
        *used.entry(first.to_string()).or_insert(0) += 1;
    }
    assert_eq!(
        used.keys().collect::<Vec<_>>(),
        V2B_ANY.iter().collect::<Vec<_>>()
    );
    assert!(used.values().all(|n| *n >= 4), "{used:?}");
    // From 1.1.1.1:443 back to guest 2's floating IP, port 41000, External, from each
    // candidate sender.
    let mut synack = tcp_between(
        (MacAddr([2, 0, 0, 0, 0, 0x42]), g2.mac),
        (Ipv4Addr::new(1, 1, 1, 1), floating(&g2).0),
        (443, 41000),
        (5000, 1001),
        SYN | ACK,
        b"",
    );
    assert!(receive(&mut b, &[forged("fd00:99::66", VNI, true, &g2, &synack)], 4).is_empty());
    assert_eq!(drops(&b, MISMATCH), 1);
    // Any endpoint of the table is a boundary switch, whichever one the flow left by.
    assert_eq!(
        receive(&mut b, &[forged(V2B_GOOGLE, VNI, true, &g2, &synack)], 4).len(),
        1
    );
    // Clearing an endpoint removes it from both directions, cached flows included.
    let mut cleared = v2b_table(&V2B_ANY);
    cleared
        .clear("0.0.0.0/0".parse().unwrap(), &[V2B_ANY[0].parse().unwrap()])
        .unwrap();
    b.set_v2b(&cleared).unwrap();
    assert_eq!(b.dump_v2b(), cleared.dump());
    for sport in 41000..41032 {
        let d = decode_underlay(&send(&mut b, pb, &syn_to(Ipv4Addr::new(1, 1, 1, 1), sport), 5)[0]);
        assert_eq!(d.dst.to_string(), V2B_ANY[1]);
    }
    synack = tcp_between(
        (MacAddr([2, 0, 0, 0, 0, 0x42]), g2.mac),
        (Ipv4Addr::new(1, 1, 1, 1), floating(&g2).0),
        (443, 41000),
        (5000, 1001),
        ACK,
        b"data",
    );
    assert!(receive(&mut b, &[forged(V2B_ANY[0], VNI, true, &g2, &synack)], 6).is_empty());
    assert_eq!(drops(&b, MISMATCH), 2);
}

#[test]
fn icmp_errors_from_boundary_services_still_reach_the_guest() {
    let (mut b, _) = sled_b_with_boundary();
    let g2 = guest(2);
    // A router on the way to 8.8.8.8 reports the guest's SYN as it left (from the
    // floating IP): time exceeded, quoting the SYN's IP header and the first 8
    // bytes of TCP. The guest gets it about its own SYN.
    let time_exceeded = |from: &Guest| {
        let syn = tcp(
            from,
            Ipv4Addr::new(8, 8, 8, 8),
            (40000, 443),
            1000,
            0,
            SYN,
            b"",
        );
        let mut err = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 0x42], g2.mac.0)
            .ipv4([203, 0, 113, 1], from.v4.octets(), 64)
            .icmpv4(etherparse::Icmpv4Type::TimeExceeded(
                etherparse::icmpv4::TimeExceededCode::TtlExceededInTransit,
            ))
            .write(&mut err, &syn[14..14 + 28])
            .unwrap();
        err
    };
    let external = Guest {
        v4: floating(&g2).0,
        ..guest(2)
    };
    let err = time_exceeded(&external);
    assert!(receive(&mut b, &[forged("fd00:99::66", VNI, true, &g2, &err)], 2).is_empty());
    assert_eq!(drops(&b, MISMATCH), 1);
    let got = receive(&mut b, &[forged(BOUNDARY, VNI, true, &g2, &err)], 3);
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].1[14..], &time_exceeded(&g2)[14..]);
}

#[test]
fn resets_and_data_outside_the_window_are_dropped() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let ports = (40000, 80);
    let a_to_b = |a: &mut Engine, b: &mut Engine, f: &[u8], now| {
        let wire = send(a, pa, f, now);
        receive(b, &wire, now).len()
    };
    // The handshake: guest 1's ISN 1000, guest 2's 5000, 65535-byte windows, no
    // window scaling.
    assert_eq!(
        a_to_b(
            &mut a,
            &mut b,
            &tcp(&g1, g2.v4, ports, 1000, 0, SYN, b""),
            1
        ),
        1
    );
    let synack = tcp(&g2, g1.v4, (80, 40000), 5000, 1001, SYN | ACK, b"");
    assert_eq!(send(&mut b, pb, &synack, 1).len(), 1);
    let ack = tcp(&g1, g2.v4, ports, 1001, 5001, ACK, b"");
    assert_eq!(a_to_b(&mut a, &mut b, &ack, 2), 1);
    // Guest 2 acknowledged 1001 and offers 65535 bytes: its window is 1001..=66536.
    // Injected from sled A's own address (the source check passes).
    let inject = |seq, flags, payload: &[u8]| {
        let f = tcp(&g1, g2.v4, ports, seq, 5001, flags, payload);
        forged(SLED_A, VNI, false, &g2, &f)
    };
    let blind = [
        inject(900_000, RST, b""),
        inject(1000, RST, b""),
        inject(200_000, ACK | PSH, b"evil"),
        inject(1001u32.wrapping_sub(100_000), ACK, b"old"),
    ];
    for (i, f) in blind.iter().enumerate() {
        assert!(
            receive(&mut b, std::slice::from_ref(f), 3).is_empty(),
            "{i}"
        );
    }
    assert_eq!(drops(&b, OUT_OF_WINDOW), 4);
    let state = |b: &Engine| b.dump_tcp_flows("gb").unwrap()[0].tcp_state;
    assert_eq!(state(&b), Some(TcpState::Established));
    // Never cached: data in the window, then a reset in the window, pass.
    let data = tcp(&g1, g2.v4, ports, 1001, 5001, ACK | PSH, b"data");
    assert_eq!(a_to_b(&mut a, &mut b, &data, 4), 1);
    assert_eq!(receive(&mut b, &[inject(60_000, RST, b"")], 5).len(), 1);
    assert_eq!(state(&b), Some(TcpState::Closed));
}

#[test]
fn flows_that_go_nowhere_open_no_connection() {
    let (mut a, pa) = sled_a_with_conn_limit(8);
    let g1 = guest(1);
    a.add_route("ga", "9.9.9.0/24".parse().unwrap(), RouteTarget::Drop, None)
        .unwrap();
    let udp = |to: &str, sport| {
        let to = Some(to.parse().unwrap());
        frame(&g1, to, None, L4::Udp { sport, dport: 53 }, b"q")
    };
    // Many flows per kind, more than the table holds: no route (no boundary
    // services), a Drop route, no V2P mapping, the guest itself; TCP too.
    for sport in 1..=20 {
        for to in ["8.8.8.8", "9.9.9.9", "172.30.0.99", "172.30.0.5"] {
            assert!(send(&mut a, pa, &udp(to, sport), 1).is_empty());
        }
        let syn = tcp(&g1, Ipv4Addr::new(8, 8, 8, 8), (sport, 443), 1, 0, SYN, b"");
        assert!(send(&mut a, pa, &syn, 1).is_empty());
    }
    let s = a.stats();
    let p = &s.ports[0];
    assert_eq!((p.firewall.flows, p.firewall.flows_created), (0, 0));
    for (reason, n) in [
        ("no_route", 40),
        ("route_drop", 20),
        ("no_v2p", 20),
        ("hairpin", 20),
    ] {
        assert_eq!(p.drops.get_named(reason), n, "{reason}");
    }
    assert_eq!(p.drops.get_named("fw_table_full"), 0);
    // A flow that goes somewhere opens its connection as before.
    assert_eq!(send(&mut a, pa, &udp("172.30.0.6", 1), 2).len(), 1);
    assert_eq!(a.stats().ports[0].firewall.flows_created, 1);
}

#[test]
fn mid_stream_tcp_from_the_guest_expires_quickly_until_answered() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let mut out = TxBatch::new();
    // Guest 1 sends into flows sled A has no connection for (as after a restart).
    let seg = |sport| tcp(&g1, g2.v4, (sport, 80), 1000, 1, ACK, b"x");
    assert_eq!(send(&mut a, pa, &seg(40000), 0).len(), 1);
    assert_eq!(send(&mut a, pa, &seg(40001), 0).len(), 1);
    // The peer answers one of them.
    let answer = tcp(&g2, g1.v4, (80, 40001), 1, 1001, ACK, b"y");
    let wire = send(&mut b, pb, &answer, 1);
    assert_eq!(receive(&mut a, &wire, 1).len(), 1);
    // Unanswered: gone after the half-open timeout (5 s), not the established one.
    a.tick(6 * S, &mut out);
    let flows = a.dump_tcp_flows("ga").unwrap();
    assert_eq!(flows.len(), 1);
    assert_eq!(flows[0].key.src_port, 40001);
    assert_eq!(a.stats().ports[0].firewall.flows_expired, 1);
    // Answered: held to the established timeout.
    a.tick(3600 * S, &mut out);
    assert_eq!(a.dump_tcp_flows("ga").unwrap().len(), 1);
}

#[test]
fn expiry_sweeps_a_large_table_in_bounded_steps() {
    let n = 2 * EXPIRE_SCAN + 500;
    let (mut a, pa) = sled_a_with_conn_limit(n);
    let (g1, g2) = (guest(1), guest(2));
    for sport in 0..n as u16 {
        let f = frame(&g1, Some(g2.v4), None, L4::Udp { sport, dport: 53 }, b"q");
        assert_eq!(send(&mut a, pa, &f, 0).len(), 1);
    }
    let fw = |a: &Engine| a.stats().ports[0].firewall;
    assert_eq!(fw(&a).flows, n as u64);
    // All idle past 60 s: each sweep (at most one a second) takes the next
    // EXPIRE_SCAN slots.
    let mut out = TxBatch::new();
    for (t, want) in [(61, EXPIRE_SCAN), (62, 2 * EXPIRE_SCAN), (63, n)] {
        a.tick(t * S, &mut out);
        assert_eq!(fw(&a).flows_expired, want as u64, "at {t} s");
    }
    assert_eq!(fw(&a).flows, 0);
}

/// Sled A with guests 1 and 3, guest 3 admitting everything inbound.
fn two_local_guests() -> (Engine, PortId, PortId) {
    let (mut a, p1) = sled(SLED_A, 1);
    let p3 = a.add_port(port_config(&guest(3))).unwrap();
    let allow = Rule::new(1, FwAction::Allow).finalize().unwrap();
    a.add_fw_rule("gc", Direction::In, allow).unwrap();
    (a, p1, p3)
}

/// A GSO header that tells the truth about a TCP/IPv4 frame from guest 1 (payload
/// 3000 bytes, headers 54): NEEDS_CSUM at the TCP checksum, 1448-byte segments.
fn honest_gso() -> VnetHdr {
    VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 54,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
    }
}

/// Headers that lie about the frame, each with the counter it must be dropped under.
fn lies() -> Vec<(VnetHdr, &'static str)> {
    let good = honest_gso();
    vec![
        (
            VnetHdr {
                gso_type: GSO_TCPV6,
                ..good
            },
            "tso_gso_ip_mismatch",
        ),
        (
            VnetHdr {
                gso_type: 0x7f,
                ..good
            },
            "tso_bad_gso_type",
        ),
        (
            VnetHdr {
                gso_size: 0,
                ..good
            },
            "tso_gso_size_zero",
        ),
        (
            VnetHdr {
                gso_size: 1,
                ..good
            },
            "tso_too_many_segments",
        ),
        (
            VnetHdr {
                csum_offset: 6,
                ..good
            },
            "tso_csum_offset_out_of_range",
        ),
        (
            VnetHdr {
                csum_start: 14,
                ..good
            },
            "tso_csum_start_mismatch",
        ),
        (
            VnetHdr {
                hdr_len: 60_000,
                ..good
            },
            "tso_hdr_len_mismatch",
        ),
    ]
}

#[test]
fn lying_vnet_headers_are_dropped_on_same_sled_delivery() {
    let (mut a, p1, p3) = two_local_guests();
    let (g1, g3) = (guest(1), guest(3));
    let f = tcp(&g1, g3.v4, (40000, 80), 1, 0, SYN, &[7; 3000]);
    for (i, (vnet, reason)) in lies().into_iter().enumerate() {
        let mut out = TxBatch::new();
        a.process_guest(p1, vnet, &f, i as u64, &Fabric, &mut out);
        assert!(out.is_empty(), "{reason}");
        assert_eq!(a.stats().ports[1].drops.get_named(reason), 1, "{reason}");
    }
    // A GSO header on a UDP datagram.
    let udp = frame(
        &g1,
        Some(g3.v4),
        None,
        L4::Udp { sport: 1, dport: 2 },
        &[1; 3000],
    );
    let mut out = TxBatch::new();
    a.process_guest(p1, honest_gso(), &udp, 10, &Fabric, &mut out);
    assert!(out.is_empty());
    assert_eq!(a.stats().ports[1].drops.get_named("tso_gso_not_tcp"), 1);
    // The honest header passes, to guest 3 as it is.
    a.process_guest(p1, honest_gso(), &f, 11, &Fabric, &mut out);
    let got = frames_of(&out, &[]);
    assert_eq!(got.len(), 1);
    assert!(matches!(got[0].0, TxDest::Port { port, vnet } if port == p3 && vnet == honest_gso()));
}

#[test]
fn lying_vnet_headers_are_dropped_when_handed_over_by_another_worker() {
    // Guest 1's worker hands the frame over unchecked; guest 3's worker checks it.
    let (mut w1, p3) = sled(SLED_A, 3);
    let allow = Rule::new(1, FwAction::Allow).finalize().unwrap();
    w1.add_fw_rule("gc", Direction::In, allow).unwrap();
    let (g1, g3) = (guest(1), guest(3));
    let vni = Vni::new(VNI).unwrap();
    let mut f = tcp(&g1, g3.v4, (40000, 80), 1, 0, SYN, &[7; 3000]);
    f[..6].copy_from_slice(&g3.mac.0);
    let pieces = [&f[..]];
    for (vnet, reason) in lies() {
        let mut out = TxBatch::new();
        w1.process_sibling(vni, vnet, RxFrame::new(&pieces, 0), 1, &mut out);
        assert!(out.is_empty(), "{reason}");
        assert_eq!(w1.stats().ports[0].drops.get_named(reason), 1, "{reason}");
    }
    let mut out = TxBatch::new();
    w1.process_sibling(vni, honest_gso(), RxFrame::new(&pieces, 0), 2, &mut out);
    let got = frames_of(&out, &[&f]);
    assert_eq!(got.len(), 1);
    assert!(matches!(got[0].0, TxDest::Port { port, .. } if port == p3));
}
