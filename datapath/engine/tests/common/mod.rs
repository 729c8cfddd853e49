//! Two in-memory sleds, their ports, and frame builders shared by the integration
//! tests. Frames are built with etherparse, an implementation independent of ours.
#![allow(dead_code)]

pub mod internet;

use engine::{
    Direction, Engine, EngineConfig, FwAction, MacAddr, NextHop, NextHopSet, PortConfig, PortId,
    Predicate, Rule, RxFrame, TxBatch, TxDest, UnderlayRoutes, Vni,
};
use etherparse::PacketBuilder;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const VNI: u32 = 1701;
pub const IFINDEX: u32 = 7;
pub const SLED_A: &str = "fd00:99::1";
pub const SLED_B: &str = "fd00:99::2";

/// Every underlay destination is reachable through one neighbour.
pub struct Fabric;

impl UnderlayRoutes for Fabric {
    fn next_hops(&self, _dst: Ipv6Addr) -> NextHopSet {
        NextHopSet::from(NextHop {
            ifindex: IFINDEX,
            src_mac: "02:00:00:00:99:01".parse().unwrap(),
            dst_mac: "02:00:00:00:99:02".parse().unwrap(),
        })
    }
}

/// No underlay neighbour is known.
pub struct NoFabric;

impl UnderlayRoutes for NoFabric {
    fn next_hops(&self, _dst: Ipv6Addr) -> NextHopSet {
        NextHopSet::default()
    }
}

pub struct Guest {
    pub name: &'static str,
    pub mac: MacAddr,
    pub gw_mac: MacAddr,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

pub fn guest(n: u8) -> Guest {
    Guest {
        name: ["", "ga", "gb", "gc"][n as usize],
        mac: MacAddr([0xa8, 0x40, 0x25, 0xff, 0x00, n]),
        gw_mac: MacAddr([0xa8, 0x40, 0x25, 0x00, 0x00, 0x01]),
        v4: Ipv4Addr::new(172, 30, 0, 4 + n),
        v6: format!("fd00:1122:3344:100::{}", 4 + n).parse().unwrap(),
    }
}

pub fn port_config(g: &Guest) -> PortConfig {
    PortConfig {
        name: g.name.into(),
        guest_mac: g.mac,
        gateway_mac: g.gw_mac,
        ipv4: Some(g.v4),
        ipv6: Some(g.v6),
        vpc_subnet4: Some("172.30.0.0/22".parse().unwrap()),
        vpc_subnet6: Some("fd00:1122:3344:100::/64".parse().unwrap()),
        gateway_ipv4: Some("172.30.0.1".parse().unwrap()),
        vni: Vni::new(VNI).unwrap(),
        mtu: 8500,
        external_jumbo: false,
        dns_servers4: vec![],
        dns_servers6: vec![],
        hostname: None,
        domain: None,
        domain_search: vec![],
        external: Default::default(),
        limits: Default::default(),
        cidrs: Default::default(),
    }
}

/// Guest `g`'s floating IPs (one per family), for tests of internet traffic: a port
/// reaches the internet only from an external address.
pub fn floating(g: &Guest) -> (Ipv4Addr, Ipv6Addr) {
    let n = g.mac.0[5];
    (
        Ipv4Addr::new(192, 0, 2, n),
        format!("2001:db8:f::{n}").parse().unwrap(),
    )
}

/// [`port_config`] with guest `g`'s [`floating`] IPs.
pub fn port_config_floating(g: &Guest) -> PortConfig {
    let (f4, f6) = floating(g);
    let mut c = port_config(g);
    c.external.floating = vec![IpAddr::V4(f4), IpAddr::V6(f6)];
    c
}

/// A sled with one port for guest `n`, allowing inbound traffic from the VPC (what
/// the control plane's default VPC rules do).
pub fn sled(addr: &str, n: u8) -> (Engine, PortId) {
    let mut e = Engine::new(EngineConfig::new(addr.parse().unwrap())).unwrap();
    let g = guest(n);
    let id = e.add_port(port_config(&g)).unwrap();
    for net in ["172.30.0.0/22", "fd00:1122:3344:100::/64"] {
        let r = Rule::new(100, FwAction::Allow)
            .matching(Predicate::SrcIp(net.parse().unwrap()))
            .finalize()
            .unwrap();
        e.add_fw_rule(g.name, Direction::In, r).unwrap();
    }
    (e, id)
}

/// Sled A with guest 1's port (default rules) and a connection table of
/// `fw_flow_limit`, knowing guest 2's IPv4 address on sled B: for tests of what
/// fills the table.
pub fn sled_a_with_conn_limit(fw_flow_limit: usize) -> (Engine, PortId) {
    let mut cfg = EngineConfig::new(SLED_A.parse().unwrap());
    cfg.flow.fw_flow_limit = fw_flow_limit;
    // A budget that holds the limit whatever an entry costs, so the table holds
    // exactly `fw_flow_limit` connections (tables grow with use: nothing is
    // allocated up front).
    cfg.tables.bytes = cfg.tables.bytes.saturating_mul(4);
    let mut a = Engine::new(cfg).unwrap();
    let pa = a.add_port(port_config(&guest(1))).unwrap();
    let g2 = guest(2);
    a.set_v2p(
        Vni::new(VNI).unwrap(),
        IpAddr::V4(g2.v4),
        SLED_B.parse().unwrap(),
        g2.mac,
    )
    .unwrap();
    (a, pa)
}

/// Sled A hosting guest 1 and sled B hosting guest 2, each knowing the other.
pub fn two_sleds() -> (Engine, PortId, Engine, PortId) {
    let (mut a, pa) = sled(SLED_A, 1);
    let (mut b, pb) = sled(SLED_B, 2);
    let vni = Vni::new(VNI).unwrap();
    for (e, n, sled) in [(&mut a, 2u8, SLED_B), (&mut b, 1u8, SLED_A)] {
        let g = guest(n);
        e.set_v2p(vni, IpAddr::V4(g.v4), sled.parse().unwrap(), g.mac)
            .unwrap();
        e.set_v2p(vni, IpAddr::V6(g.v6), sled.parse().unwrap(), g.mac)
            .unwrap();
    }
    (a, pa, b, pb)
}

#[derive(Clone, Copy, Debug)]
pub enum L4 {
    Tcp { sport: u16, dport: u16, syn: bool },
    Udp { sport: u16, dport: u16 },
    Icmp { id: u16, seq: u16 },
}

/// An IPv4 TCP segment from `from` to `to` (the most common frame in these tests).
pub fn tcp_v4(
    from: &Guest,
    to: Ipv4Addr,
    sport: u16,
    dport: u16,
    syn: bool,
    payload: &[u8],
) -> Vec<u8> {
    frame(from, Some(to), None, L4::Tcp { sport, dport, syn }, payload)
}

/// A guest frame from `from` (to its gateway MAC) to `to`, with valid checksums.
pub fn frame(
    from: &Guest,
    to_v4: Option<Ipv4Addr>,
    to_v6: Option<Ipv6Addr>,
    l4: L4,
    payload: &[u8],
) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(from.mac.0, from.gw_mac.0);
    let mut buf = Vec::new();
    macro_rules! finish {
        ($ip:expr) => {
            match l4 {
                L4::Tcp { sport, dport, syn } => {
                    let b = $ip.tcp(sport, dport, 1000, 65535);
                    let b = if syn { b.syn() } else { b.ack(1) };
                    b.write(&mut buf, payload).unwrap()
                }
                L4::Udp { sport, dport } => $ip.udp(sport, dport).write(&mut buf, payload).unwrap(),
                L4::Icmp { id, seq } => {
                    if to_v4.is_some() {
                        $ip.icmpv4_echo_request(id, seq)
                            .write(&mut buf, payload)
                            .unwrap()
                    } else {
                        $ip.icmpv6_echo_request(id, seq)
                            .write(&mut buf, payload)
                            .unwrap()
                    }
                }
            }
        };
    }
    match (to_v4, to_v6) {
        (Some(d), _) => finish!(eth.ipv4(from.v4.octets(), d.octets(), 64)),
        (None, Some(d)) => finish!(eth.ipv6(from.v6.octets(), d.octets(), 64)),
        (None, None) => panic!("no destination"),
    }
    buf
}

/// Decodes an underlay frame with etherparse and a hand-written Geneve reader:
/// (outer IPv6 src, dst, UDP src port, flow label, VNI, options bytes, inner frame).
pub struct Decoded {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub udp_src: u16,
    pub flow_label: u32,
    pub vni: u32,
    pub options: Vec<u8>,
    pub inner: Vec<u8>,
}

pub fn decode_underlay(f: &[u8]) -> Decoded {
    let p = etherparse::SlicedPacket::from_ethernet(f).expect("outer parses");
    let Some(etherparse::NetSlice::Ipv6(ip)) = p.net else {
        panic!("outer is not IPv6")
    };
    let h = ip.header();
    let Some(etherparse::TransportSlice::Udp(udp)) = p.transport else {
        panic!("outer is not UDP")
    };
    assert_eq!(udp.destination_port(), 6081);
    let g = udp.payload();
    assert_eq!(g[0] >> 6, 0, "Geneve version");
    let opt_len = usize::from(g[0] & 0x3f) * 4;
    assert_eq!(u16::from_be_bytes([g[2], g[3]]), 0x6558);
    Decoded {
        src: h.source_addr(),
        dst: h.destination_addr(),
        udp_src: udp.source_port(),
        flow_label: h.flow_label().value(),
        vni: u32::from_be_bytes([0, g[4], g[5], g[6]]),
        options: g[8..8 + opt_len].to_vec(),
        inner: g[8 + opt_len..].to_vec(),
    }
}

/// Bytes of the first piece a received underlay frame is cut into before it is fed
/// to an engine: what the first buffer of a copy-mode AF_XDP chain holds.
pub const PIECE: usize = 3840;

/// Every frame of `out`, references to received frames resolved against `inputs`
/// (input `n` is `inputs[n]`).
pub fn frames_of(out: &TxBatch, inputs: &[&[u8]]) -> Vec<(TxDest, Vec<u8>)> {
    out.to_vecs(inputs).expect("every frame resolves")
}

/// Feeds `frames` to `engine` as received underlay frames (input `i` is
/// `frames[i]`, in pieces of [`PIECE`] bytes as AF_XDP hands them over), ends the
/// batch and returns what it produced.
pub fn receive(engine: &mut Engine, frames: &[Vec<u8>], now: u64) -> Vec<(TxDest, Vec<u8>)> {
    let mut out = TxBatch::new();
    for (i, f) in frames.iter().enumerate() {
        let pieces: Vec<&[u8]> = f.chunks(PIECE).collect();
        engine.process_underlay(RxFrame::new(&pieces, i as u32), now, &Fabric, &mut out);
    }
    engine.end_of_batch(&mut out);
    let inputs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    frames_of(&out, &inputs)
}
