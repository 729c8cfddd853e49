//! Sled A with boundary services and guest 1's port with external addresses:
//! frames to and from the internet, for the tests of the NAT layer and of what a
//! port takes along when it moves.

use super::*;
use engine::{Engine, EngineConfig, ExternalIps, MacAddr, OuterTemplate, PortId, SnatRange};
use engine::{TxBatch, TxDest, VnetHdr, Vni};
use etherparse::{NetHeaders, PacketBuilder, PacketHeaders, TransportHeader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const BOUNDARY: &str = "fd00:99::ff";
pub const S: u64 = 1_000_000_000;
/// The MAC boundary services' frames carry as inner source.
pub const SWITCH_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x42];

pub fn snat4() -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, 1)
}
pub fn snat6() -> Ipv6Addr {
    "2001:db8:5::1".parse().unwrap()
}
pub fn eph4() -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, 77)
}

pub fn snat(ip: IpAddr, start: u16, end: u16) -> ExternalIps {
    ExternalIps {
        snat: Some(SnatRange { ip, start, end }),
        ..Default::default()
    }
}

/// Sled A with boundary services, and guest 1 with external addresses `ext`.
pub fn internet_sled(ext: ExternalIps) -> (Engine, PortId) {
    let mut cfg = EngineConfig::new(SLED_A.parse().unwrap());
    cfg.boundary_services = Some(BOUNDARY.parse().unwrap());
    let mut e = Engine::new(cfg).unwrap();
    let mut pc = port_config(&guest(1));
    pc.external = ext;
    let p = e.add_port(pc).unwrap();
    (e, p)
}

pub fn drops(e: &Engine, reason: &str) -> u64 {
    e.stats().ports[0].drops.get_named(reason)
}

/// The inner frames guest 1's frame `f` became on the underlay (to boundary
/// services).
pub fn send_with(e: &mut Engine, p: PortId, vnet: VnetHdr, f: &[u8], now: u64) -> Vec<Vec<u8>> {
    let mut out = TxBatch::new();
    e.process_guest(p, vnet, f, now, &Fabric, &mut out);
    frames_of(&out, &[])
        .into_iter()
        .filter(|(d, _)| matches!(d, TxDest::Underlay { .. }))
        .map(|(_, f)| {
            let d = decode_underlay(&f);
            assert_eq!(d.dst.to_string(), BOUNDARY);
            d.inner
        })
        .collect()
}

pub fn send(e: &mut Engine, p: PortId, f: &[u8], now: u64) -> Vec<Vec<u8>> {
    send_with(e, p, VnetHdr::default(), f, now)
}

/// `inner` (an IP packet in Ethernet, for guest 1's MAC) as boundary services hand
/// it to sled A: from `BOUNDARY`, with the External option.
pub fn boundary_frame(inner: &[u8]) -> Vec<u8> {
    let t = OuterTemplate::new(
        MacAddr([2, 0, 0, 0, 0x99, 9]),
        MacAddr([2, 0, 0, 0, 0x99, 2]),
        BOUNDARY.parse().unwrap(),
        SLED_A.parse().unwrap(),
        50000,
        0,
        Vni::new(VNI).unwrap(),
        true,
        false,
    );
    let mut out = TxBatch::new();
    assert!(t.encapsulate(inner, None, TxDest::Underlay { ifindex: 1 }, &mut out) > 0);
    out.frame(0).unwrap().1.to_vec()
}

/// What reached the guest of `inners` sent by boundary services in one batch, with
/// the offload metadata each was handed over with.
pub fn from_internet_batch(
    e: &mut Engine,
    inners: &[Vec<u8>],
    now: u64,
) -> Vec<(VnetHdr, Vec<u8>)> {
    let wires: Vec<Vec<u8>> = inners.iter().map(|i| boundary_frame(i)).collect();
    receive(e, &wires, now)
        .into_iter()
        .map(|(d, f)| match d {
            TxDest::Port { vnet, .. } => (vnet, f),
            other => panic!("not to a port: {other:?}"),
        })
        .collect()
}

/// [`from_internet_batch`] of one frame, without the metadata.
pub fn from_internet(e: &mut Engine, inner: &[u8], now: u64) -> Vec<Vec<u8>> {
    let inners = [inner.to_vec()];
    from_internet_batch(e, &inners, now)
        .into_iter()
        .map(|(_, f)| f)
        .collect()
}

/// The packet's (source, destination) address and (source, destination) port (echo:
/// the identifier twice), after checking every checksum with etherparse.
pub fn checked(frame: &[u8]) -> ((IpAddr, IpAddr), (u16, u16)) {
    let h = PacketHeaders::from_ethernet_slice(frame).expect("parses");
    let payload = h.payload.slice();
    let mut t = h.transport.clone().expect("has L4");
    let ips = match h.net.as_ref().expect("IP") {
        NetHeaders::Ipv4(ip, _) => {
            assert_eq!(ip.header_checksum, ip.calc_header_checksum(), "IPv4 header");
            t.update_checksum_ipv4(ip, payload).unwrap();
            (ip.source.into(), ip.destination.into())
        }
        NetHeaders::Ipv6(ip, _) => {
            t.update_checksum_ipv6(ip, payload).unwrap();
            (ip.source.into(), ip.destination.into())
        }
        NetHeaders::Arp(_) => panic!("not IP"),
    };
    assert_eq!(Some(&t), h.transport.as_ref(), "L4 checksum");
    let ports = match t {
        TransportHeader::Tcp(t) => (t.source_port, t.destination_port),
        TransportHeader::Udp(u) => (u.source_port, u.destination_port),
        TransportHeader::Icmpv4(_) | TransportHeader::Icmpv6(_) => {
            // The echo identifier: bytes 4..6 of the 8-byte ICMP header.
            let l4 = frame.len() - payload.len() - 8;
            let id = u16::from_be_bytes([frame[l4 + 4], frame[l4 + 5]]);
            (id, id)
        }
        TransportHeader::Igmp(_) => panic!("IGMP"),
    };
    (ips, ports)
}

pub fn udp_to(to: IpAddr, sport: u16) -> Vec<u8> {
    let g = guest(1);
    let l4 = L4::Udp { sport, dport: 53 };
    match to {
        IpAddr::V4(a) => frame(&g, Some(a), None, l4, b"query"),
        IpAddr::V6(a) => frame(&g, None, Some(a), l4, b"query"),
    }
}

/// A UDP reply from `from`:53 to `to`:`dport`, as it arrives from the internet.
pub fn udp_reply(from: IpAddr, to: IpAddr, dport: u16) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(SWITCH_MAC, guest(1).mac.0);
    let mut buf = Vec::new();
    match (from, to) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 60)
            .udp(53, dport)
            .write(&mut buf, b"answer")
            .unwrap(),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 60)
            .udp(53, dport)
            .write(&mut buf, b"answer")
            .unwrap(),
        _ => panic!("mixed families"),
    }
    buf
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
