//! A move's grace period (`vpc::moved`): the sled a guest left relays the frames
//! still sent to it for the guest to the sled the guest moved to, which admits
//! them into the moved port, for the connections it tracks; neither does so for a
//! frame its tables do not vouch for, nor after the grace period, and nothing
//! from outside the VPC is relayed. Frames are built and checked with etherparse.

mod common;

use common::internet::{boundary_frame, udp_reply};
use common::*;
use engine::{Engine, EngineError, TxBatch, TxDest, VnetHdr, Vni, MOVE_GRACE_NS};
use std::net::{IpAddr, Ipv6Addr};

const SLED_C: &str = "fd00:99::3";
const S: u64 = 1_000_000_000;

fn vni() -> Vni {
    Vni::new(VNI).unwrap()
}

fn addr(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// The source port of the connection guest 2 opened to guest 1 before the move.
const OPEN: u16 = 1000;

/// The racks of these tests: guest 1 moves from sled A to sled C (its port
/// exported, deleted with its frames relayed to C, imported on C) while sled B,
/// hosting guest 2, still maps guest 1 to A. Before the move guest 2 opened a
/// connection to guest 1 (from port [`OPEN`]), which moves with the port.
struct Moved {
    a: Engine,
    b: Engine,
    c: Engine,
    pb: engine::PortId,
    pc: engine::PortId,
}

fn moved() -> Moved {
    let (a, _, b, pb) = two_sleds();
    let mut m = Moved {
        a,
        b,
        c: sled(SLED_C, 1).0,
        pb,
        pc: engine::PortId(0),
    };
    let opened = from_b(&mut m, OPEN, 0);
    assert_eq!(receive(&mut m.a, &[opened], 0).len(), 1, "delivered on A");
    let g1 = guest(1);
    let live = m.a.export_live(g1.name).unwrap();
    assert_eq!(live.from_sled, Some(addr(SLED_A)));
    assert_eq!(live.connections.len(), 1);
    m.a.relay_departed_to(vni(), g1.mac, addr(SLED_C)).unwrap();
    m.a.remove_port(g1.name).unwrap();
    let (c, pc) = sled(SLED_C, 1);
    m.c = c;
    m.pc = pc;
    let g2 = guest(2);
    for ip in [IpAddr::V4(g2.v4), IpAddr::V6(g2.v6)] {
        m.c.set_v2p(vni(), ip, addr(SLED_B), g2.mac).unwrap();
    }
    m.c.import_live(g1.name, &live).unwrap();
    m
}

/// Guest 2's SYN to guest 1 from `sport` as sled B sends it (to sled A), at `now`
/// (for [`OPEN`], the connection's SYN again, as a retransmission).
fn from_b(m: &mut Moved, sport: u16, now: u64) -> Vec<u8> {
    let f = tcp_v4(&guest(2), guest(1).v4, sport, 80, true, b"moved");
    let mut out = TxBatch::new();
    m.b.process_guest(m.pb, VnetHdr::default(), &f, now, &Fabric, &mut out);
    let mut got = frames_of(&out, &[]);
    assert_eq!(got.len(), 1);
    let (_, frame) = got.remove(0);
    assert_eq!(decode_underlay(&frame).dst, addr(SLED_A));
    frame
}

fn datapath_drops(e: &Engine, reason: &str) -> u64 {
    e.stats().datapath_drops.get_named(reason)
}

#[test]
fn the_old_sled_relays_and_the_new_sled_delivers() {
    let mut m = moved();
    let sent = from_b(&mut m, OPEN, S);
    let got = receive(&mut m.a, std::slice::from_ref(&sent), S);
    assert_eq!(got.len(), 1, "one frame relayed: {got:?}");
    assert_eq!(got[0].0, TxDest::Underlay { ifindex: IFINDEX });
    let (before, relayed) = (decode_underlay(&sent), decode_underlay(&got[0].1));
    assert_eq!((relayed.src, relayed.dst), (addr(SLED_A), addr(SLED_C)));
    assert_eq!(relayed.vni, VNI);
    // The flow keeps its entropy, and the guest's frame is as B sent it.
    assert_eq!(relayed.udp_src, before.udp_src);
    assert_eq!(relayed.inner, before.inner);
    let stats = m.a.stats().relay;
    assert_eq!((stats.relayed_frames, stats.departures), (1, 1));
    assert_eq!(stats.relayed_bytes, before.inner.len() as u64);

    let delivered = receive(&mut m.c, &[got[0].1.clone()], S);
    assert_eq!(delivered.len(), 1, "{:?}", m.c.stats().ports[0].drops);
    assert!(matches!(delivered[0].0, TxDest::Port { port, .. } if port == m.pc));
    assert!(delivered[0].1.ends_with(b"moved"));
    // The flow's next frame, relayed too, finds the flow cached with guest 2's
    // own sled as its sender: the relay is admitted there as well.
    let f = tcp_v4(&guest(2), guest(1).v4, OPEN, 80, true, b"again");
    let mut out = TxBatch::new();
    m.b.process_guest(m.pb, VnetHdr::default(), &f, S, &Fabric, &mut out);
    let again = frames_of(&out, &[]).remove(0).1;
    let relayed = receive(&mut m.a, &[again], S).remove(0).1;
    let delivered = receive(&mut m.c, &[relayed], S);
    assert_eq!(delivered.len(), 1, "{:?}", m.c.stats().ports[0].drops);
    assert_eq!(m.c.stats().ports[0].uft_in.hits, 1);

    // B learns of the move: its frames of the same flow now come straight from
    // B, and C takes them without a relay.
    let g1 = guest(1);
    m.b.set_v2p(vni(), IpAddr::V4(g1.v4), addr(SLED_C), g1.mac)
        .unwrap();
    let f = tcp_v4(&guest(2), g1.v4, OPEN, 80, true, b"direct");
    let mut out = TxBatch::new();
    m.b.process_guest(m.pb, VnetHdr::default(), &f, 2 * S, &Fabric, &mut out);
    let direct = frames_of(&out, &[]).remove(0).1;
    assert_eq!(decode_underlay(&direct).dst, addr(SLED_C));
    let delivered = receive(&mut m.c, &[direct], 2 * S);
    assert_eq!(delivered.len(), 1, "{:?}", m.c.stats().ports[0].drops);
}

#[test]
fn a_jumbo_frame_in_pieces_is_relayed_whole() {
    let mut m = moved();
    let payload: Vec<u8> = (0..8000u32).map(|i| (i % 251) as u8).collect();
    let f = tcp_v4(&guest(2), guest(1).v4, OPEN, 80, true, &payload);
    let mut out = TxBatch::new();
    m.b.process_guest(m.pb, VnetHdr::default(), &f, S, &Fabric, &mut out);
    let sent = frames_of(&out, &[]).remove(0).1;
    assert!(sent.len() > PIECE, "{} bytes come in one piece", sent.len());
    let got = receive(&mut m.a, std::slice::from_ref(&sent), S);
    assert_eq!(got.len(), 1, "{:?}", m.a.stats().datapath_drops);
    assert_eq!(
        decode_underlay(&got[0].1).inner,
        decode_underlay(&sent).inner
    );
    let delivered = receive(&mut m.c, &[got[0].1.clone()], S);
    assert!(delivered[0].1.ends_with(&payload));
}

#[test]
fn a_frame_the_old_sled_does_not_trust_is_not_relayed() {
    let mut m = moved();
    let mut forged = from_b(&mut m, OPEN, S);
    // The same frame from an underlay host V2P does not name for guest 2.
    let src = 22; // outer IPv6 source: Ethernet 14 + 8
    forged[src..src + 16].copy_from_slice(&addr("fd00:99::66").octets());
    assert!(receive(&mut m.a, &[forged], S).is_empty());
    assert_eq!(datapath_drops(&m.a, "underlay_src_mismatch"), 1);
    assert_eq!(m.a.stats().relay.relayed_frames, 0);
}

#[test]
fn the_grace_period_ends_on_both_sleds() {
    let mut m = moved();
    let late = S + MOVE_GRACE_NS;
    let sent = from_b(&mut m, OPEN, S);
    let relayed = receive(&mut m.a, std::slice::from_ref(&sent), S)
        .remove(0)
        .1;
    // A relays no more: the frame is for no port here.
    assert!(receive(&mut m.a, &[sent], late).is_empty());
    assert_eq!(datapath_drops(&m.a, "no_port_for_vni_mac"), 1);
    // Nor does C admit a relay any more (one made in time, arriving late).
    assert!(receive(&mut m.c, &[relayed], late).is_empty());
    assert_eq!(
        m.c.stats().ports[0]
            .drops
            .get_named("underlay_src_mismatch"),
        1
    );
}

#[test]
fn the_new_port_admits_relays_from_the_sled_it_came_from_only() {
    let mut m = moved();
    let sent = from_b(&mut m, OPEN, S);
    let relayed = receive(&mut m.a, &[sent], S).remove(0).1;
    // The same frame relayed by another sled.
    let mut other = relayed.clone();
    let src = 22; // outer IPv6 source: Ethernet 14 + 8
    other[src..src + 16].copy_from_slice(&addr("fd00:99::66").octets());
    assert!(receive(&mut m.c, &[other], S).is_empty());
    // A port made here rather than imported admits no relay.
    let (mut fresh, _) = sled(SLED_C, 1);
    let g2 = guest(2);
    fresh
        .set_v2p(vni(), IpAddr::V4(g2.v4), addr(SLED_B), g2.mac)
        .unwrap();
    assert!(receive(&mut fresh, &[relayed], S).is_empty());
    assert_eq!(
        fresh.stats().ports[0]
            .drops
            .get_named("underlay_src_mismatch"),
        1
    );
}

#[test]
fn a_relay_without_a_next_hop_is_counted() {
    let mut m = moved();
    let sent = from_b(&mut m, OPEN, S);
    let mut out = TxBatch::new();
    let pieces = [&sent[..]];
    m.a.process_underlay(engine::RxFrame::new(&pieces, 0), S, &NoFabric, &mut out);
    assert!(frames_of(&out, &[&sent]).is_empty());
    assert_eq!(datapath_drops(&m.a, "moved_not_relayed"), 1);
}

#[test]
fn a_relay_is_refused_to_this_sled_or_a_non_unicast_address() {
    let (mut a, _, _, _) = two_sleds();
    let g1 = guest(1);
    let to_self = a.relay_departed_to(vni(), g1.mac, addr(SLED_A));
    assert!(
        matches!(to_self, Err(EngineError::MoveToThisSled { .. })),
        "{to_self:?}"
    );
    for bad in ["ff02::1", "::", "::1"] {
        let r = a.relay_departed_to(vni(), g1.mac, addr(bad));
        assert!(
            matches!(r, Err(EngineError::UnderlayAddrNotUnicast { .. })),
            "{bad}: {r:?}"
        );
    }
    assert_eq!(a.stats().relay.departures, 0);
}

#[test]
fn a_relay_asked_before_the_port_goes_starts_when_it_has_gone() {
    let (mut a, _, mut b, pb) = two_sleds();
    let g1 = guest(1);
    a.relay_departed_to(vni(), g1.mac, addr(SLED_C)).unwrap();
    let f = tcp_v4(&guest(2), g1.v4, OPEN, 80, true, b"x");
    let mut out = TxBatch::new();
    b.process_guest(pb, VnetHdr::default(), &f, S, &Fabric, &mut out);
    let sent = frames_of(&out, &[]).remove(0).1;
    // The port is still here: it gets the frame.
    let got = receive(&mut a, std::slice::from_ref(&sent), S);
    assert!(matches!(got[0].0, TxDest::Port { .. }), "{got:?}");
    a.remove_port(g1.name).unwrap();
    let got = receive(&mut a, &[sent], S);
    assert_eq!(got[0].0, TxDest::Underlay { ifindex: IFINDEX });
    assert_eq!(decode_underlay(&got[0].1).dst, addr(SLED_C));
}

#[test]
fn a_relay_opens_no_connection() {
    let mut m = moved();
    // A flow guest 1's port did not track before the move.
    let sent = from_b(&mut m, 2000, S);
    let relayed = receive(&mut m.a, &[sent], S).remove(0).1;
    assert!(receive(&mut m.c, std::slice::from_ref(&relayed), S).is_empty());
    let refused = |c: &Engine| c.stats().ports[0].drops.get_named("underlay_src_mismatch");
    assert_eq!(refused(&m.c), 1);
    assert_eq!(m.c.stats().ports[0].firewall.flows, 1, "only the moved one");
    // Sent by B itself (its V2P followed the move), the same flow opens.
    let direct = from_b(&mut m, 2000, S);
    let src = 22; // outer IPv6 source: Ethernet 14 + 8
    let mut direct = direct;
    direct[src..src + 16].copy_from_slice(&addr(SLED_B).octets());
    let dst = src + 16;
    direct[dst..dst + 16].copy_from_slice(&addr(SLED_C).octets());
    assert_eq!(receive(&mut m.c, &[direct], S).len(), 1);
    assert_eq!(refused(&m.c), 1);
}

#[test]
fn nothing_from_outside_the_vpc_is_relayed() {
    let mut m = moved();
    let g1 = guest(1);
    let inner = udp_reply("8.8.8.8".parse().unwrap(), IpAddr::V4(g1.v4), 5000);
    assert!(receive(&mut m.a, &[boundary_frame(&inner)], S).is_empty());
    assert_eq!(datapath_drops(&m.a, "no_port_for_vni_mac"), 1);
    assert_eq!(m.a.stats().relay.relayed_frames, 0);
}

#[test]
fn a_guest_back_on_the_old_sled_is_no_longer_relayed() {
    let mut m = moved();
    m.a.add_port(port_config(&guest(1))).unwrap();
    assert_eq!(m.a.stats().relay.departures, 0);
    let sent = from_b(&mut m, OPEN, S);
    let got = receive(&mut m.a, &[sent], S);
    assert!(
        got.iter()
            .all(|(d, _)| !matches!(d, TxDest::Underlay { .. })),
        "{got:?}"
    );
}
