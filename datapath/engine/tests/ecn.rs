//! DSCP and ECN across the tunnel: the outer traffic class a sled writes (the
//! guest's DSCP, or the sled's fixed class, and always the guest's ECN field) and
//! what the receiving sled makes of a switch's congestion mark (RFC 6040 §4.2),
//! read back with etherparse.

mod common;

use common::*;
use engine::{Engine, EngineConfig, OuterDscp, TxBatch, TxDest, VnetHdr, Vni};
use etherparse::{NetSlice, SlicedPacket};
use std::net::IpAddr;

const EF: u8 = 46;
const AF41: u8 = 34;
const NOT_ECT: u8 = 0;
const ECT1: u8 = 1;
const ECT0: u8 = 2;
const CE: u8 = 3;

/// `f` (a guest frame from `frame`) with its IPv4 TOS or IPv6 traffic class set to
/// `tclass`, the IPv4 header checksum made right again.
fn with_tclass(mut f: Vec<u8>, tclass: u8) -> Vec<u8> {
    match u16::from_be_bytes([f[12], f[13]]) {
        0x0800 => {
            f[15] = tclass;
            f[24..26].fill(0);
            let c = !fold(
                f[14..34]
                    .chunks(2)
                    .map(|w| u16::from_be_bytes([w[0], w[1]])),
            );
            f[24..26].copy_from_slice(&c.to_be_bytes());
        }
        _ => {
            f[14] = (f[14] & 0xf0) | (tclass >> 4);
            f[15] = (f[15] & 0x0f) | (tclass << 4);
        }
    }
    f
}

fn fold(words: impl Iterator<Item = u16>) -> u16 {
    let mut s: u32 = words.map(u32::from).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The traffic class of the outer IPv6 header, or of the inner IP packet, of `f`,
/// as etherparse reads it; and for IPv4 whether the header checksum is right.
fn tclass_of(f: &[u8]) -> (u8, bool) {
    let p = SlicedPacket::from_ethernet(f).expect("parses");
    match p.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header().to_header();
            let ok = h.header_checksum == h.calc_header_checksum();
            ((h.dscp.value() << 2) | h.ecn.value(), ok)
        }
        Some(NetSlice::Ipv6(ip)) => (ip.header().traffic_class(), true),
        _ => panic!("not IP"),
    }
}

/// Sends `f` from guest 1 on `a` and returns the underlay frames.
fn encapsulate(a: &mut Engine, pa: engine::PortId, f: &[u8]) -> Vec<Vec<u8>> {
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), f, 1, &Fabric, &mut out);
    frames_of(&out, &[])
        .into_iter()
        .map(|(d, u)| {
            assert_eq!(d, TxDest::Underlay { ifindex: IFINDEX });
            u
        })
        .collect()
}

/// `u` (an underlay frame) with the ECN field of its outer header set to `ecn`: what
/// a congested switch does.
fn outer_marked(mut u: Vec<u8>, ecn: u8) -> Vec<u8> {
    u[15] = (u[15] & 0xcf) | (ecn << 4);
    u
}

/// A UDP datagram from guest 1 to guest 2 over IPv4 (or IPv6) with traffic class
/// `tclass`.
fn udp(v6: bool, tclass: u8) -> Vec<u8> {
    let (g1, g2) = (guest(1), guest(2));
    let l4 = L4::Udp {
        sport: 4000,
        dport: 5000,
    };
    let f = match v6 {
        false => frame(&g1, Some(g2.v4), None, l4, b"datagram"),
        true => frame(&g1, None, Some(g2.v6), l4, b"datagram"),
    };
    with_tclass(f, tclass)
}

fn udp4(tclass: u8) -> Vec<u8> {
    udp(false, tclass)
}

fn udp6(tclass: u8) -> Vec<u8> {
    udp(true, tclass)
}

#[test]
fn the_outer_header_carries_the_guests_dscp_and_ecn() {
    let (mut a, pa, _, _) = two_sleds();
    for (f, tc) in [
        (udp4((EF << 2) | ECT0), (EF << 2) | ECT0),
        (udp6((AF41 << 2) | ECT1), (AF41 << 2) | ECT1),
        (udp4(CE), CE),
        (udp6(0), 0),
    ] {
        let u = encapsulate(&mut a, pa, &f);
        assert_eq!(u.len(), 1);
        assert_eq!(tclass_of(&u[0]).0, tc, "outer class");
        // The guest's packet itself is unchanged.
        assert_eq!(decode_underlay(&u[0]).inner[12..], f[12..]);
    }
}

#[test]
fn a_fixed_outer_dscp_replaces_the_guests_but_keeps_its_ecn() {
    let mut cfg = EngineConfig::new(SLED_A.parse().unwrap());
    cfg.outer_dscp = OuterDscp::Fixed(10);
    let mut a = Engine::new(cfg).unwrap();
    let pa = a.add_port(port_config(&guest(1))).unwrap();
    let g2 = guest(2);
    let vni = Vni::new(VNI).unwrap();
    for ip in [IpAddr::V4(g2.v4), IpAddr::V6(g2.v6)] {
        a.set_v2p(vni, ip, SLED_B.parse().unwrap(), g2.mac).unwrap();
    }
    for (f, ecn) in [(udp4((EF << 2) | ECT0), ECT0), (udp6(AF41 << 2), NOT_ECT)] {
        let u = encapsulate(&mut a, pa, &f);
        assert_eq!(tclass_of(&u[0]).0, (10 << 2) | ecn);
    }
}

/// Guest 1's frame `f` through sled A, its outer ECN field set to `outer` on the
/// way, delivered by sled B: what guest 2 gets, and B's port counters.
fn marked_on_the_way(f: &[u8], outer: u8) -> (Vec<Vec<u8>>, engine::pipeline::stats::PortStats) {
    let (mut a, pa, mut b, _) = two_sleds();
    let u: Vec<Vec<u8>> = encapsulate(&mut a, pa, f)
        .into_iter()
        .map(|u| outer_marked(u, outer))
        .collect();
    let got = receive(&mut b, &u, 1)
        .into_iter()
        .map(|(d, f)| {
            assert!(matches!(d, TxDest::Port { .. }), "{d:?}");
            f
        })
        .collect();
    let stats = b.stats().ports.into_iter().next().unwrap();
    (got, stats)
}

#[test]
fn a_congestion_mark_reaches_an_ecn_capable_guest() {
    for f in [udp4((EF << 2) | ECT0), udp6((AF41 << 2) | ECT1)] {
        let (got, stats) = marked_on_the_way(&f, CE);
        assert_eq!(got.len(), 1);
        let (tc, csum_ok) = tclass_of(&got[0]);
        assert_eq!(
            tc,
            (tclass_of(&f).0 & !3) | CE,
            "inner marked CE, DSCP kept"
        );
        assert!(csum_ok, "IPv4 header checksum updated");
        // Nothing else changed.
        let unmarked = with_tclass(got[0].clone(), tclass_of(&f).0);
        assert_eq!(unmarked[12..], f[12..]);
        assert_eq!(stats.ecn_ce_marked, 1);
        assert_eq!(stats.in_packets, 1);
    }
}

#[test]
fn ect1_over_ect0_becomes_ect1_and_unmarked_frames_pass_as_they_are() {
    let f = udp4(ECT0);
    let (got, stats) = marked_on_the_way(&f, ECT1);
    assert_eq!(tclass_of(&got[0]), (ECT1, true));
    assert_eq!(stats.ecn_ce_marked, 0);
    // An outer ECT(0) over a Not-ECT packet (RFC 6040: "currently unused") leaves
    // it Not-ECT.
    let f = udp6(AF41 << 2);
    let (got, _) = marked_on_the_way(&f, ECT0);
    assert_eq!(got[0][12..], f[12..]);
}

#[test]
fn ce_over_a_packet_that_is_not_ecn_capable_is_dropped_and_counted() {
    for f in [udp4(EF << 2), udp6(0)] {
        let (got, stats) = marked_on_the_way(&f, CE);
        assert!(got.is_empty(), "dropped");
        assert_eq!(stats.drops.get_named("ecn_ce_not_ect"), 1);
        assert_eq!(stats.in_packets, 0);
        // Decided before the firewall: no connection was opened for it.
        assert_eq!(stats.firewall.flows_created, 0);
    }
}

/// An IPv4 TCP segment between guests `from` and `to` (ports 40000 and 5201, in
/// that direction from guest 1), ECT(0) unless it is a SYN, as a stack sends it.
fn tcp(from: u8, to: u8, seq: u32, ack: Option<u32>, syn: bool, payload: &[u8]) -> Vec<u8> {
    let (f, t) = (guest(from), guest(to));
    let ports = if from == 1 {
        (40000, 5201)
    } else {
        (5201, 40000)
    };
    let b = etherparse::PacketBuilder::ethernet2(f.mac.0, f.gw_mac.0)
        .ipv4(f.v4.octets(), t.v4.octets(), 64)
        .tcp(ports.0, ports.1, seq, 65535);
    let b = if syn { b.syn() } else { b };
    let b = match ack {
        Some(a) => b.ack(a),
        None => b,
    };
    let mut buf = Vec::new();
    b.write(&mut buf, payload).unwrap();
    if syn {
        buf
    } else {
        with_tclass(buf, ECT0)
    }
}

#[test]
fn a_marked_segment_is_not_merged_with_unmarked_ones_and_keeps_its_mark() {
    let (mut a, pa, mut b, pb) = two_sleds();
    // The handshake, so the segments are of an established connection.
    let syn = encapsulate(&mut a, pa, &tcp(1, 2, 999, None, true, b""));
    assert_eq!(receive(&mut b, &syn, 1).len(), 1);
    let mut out = TxBatch::new();
    let syn_ack = tcp(2, 1, 5000, Some(1000), true, b"");
    b.process_guest(pb, VnetHdr::default(), &syn_ack, 1, &Fabric, &mut out);
    let syn_ack: Vec<Vec<u8>> = frames_of(&out, &[]).into_iter().map(|(_, f)| f).collect();
    assert_eq!(receive(&mut a, &syn_ack, 1).len(), 1);
    let mut u: Vec<Vec<u8>> = (0..4u32)
        .flat_map(|i| {
            let seg = tcp(1, 2, 1000 + i * 1000, Some(5001), false, &[i as u8; 1000]);
            encapsulate(&mut a, pa, &seg)
        })
        .collect();
    // The switch marks the third.
    u[2] = outer_marked(u[2].clone(), CE);
    let got: Vec<Vec<u8>> = receive(&mut b, &u, 2).into_iter().map(|(_, f)| f).collect();
    let marks: Vec<u8> = got.iter().map(|f| tclass_of(f).0 & 3).collect();
    // The first two merged; the marked one apart; the fourth cannot join it.
    assert_eq!(marks, [ECT0, CE, ECT0], "{} frames", got.len());
    let payload: usize = got.iter().map(|f| f.len() - 54).sum();
    assert_eq!(payload, 4000, "every byte delivered once");
    assert!(got.iter().all(|f| tclass_of(f).1), "IPv4 checksums right");
    let stats = b.stats().ports.into_iter().next().unwrap();
    assert_eq!(stats.ecn_ce_marked, 1);
}
