//! Configurations the API would refuse, fed to the engine anyway. The engine
//! trusts the API (`api::PortConfig::validate`) with what a configuration means,
//! never with its own memory or liveness (docs/engine.md, "Who checks what"):
//! whatever a `PortConfig`, its external addresses, limits or prefixes hold, a
//! management call may refuse it but does not panic, and frames through the port
//! (from its guest, from the underlay, to and from the gateway), timers and the
//! worker's rate-limit calls are dropped, answered or delivered, never a panic.
//! A wait the engine asks for is always enough: after it (on a clock that did not
//! go back), the port may send. The saved regressions are the three cases that
//! found the guards in `machinery/ratelimit.rs` and `vpc/nat.rs` needed: a zero
//! burst that left the worker spinning, the default burst of the largest rate
//! overflowing, a reversed SNAT range underflowing.

mod common;

use common::{frames_of, Fabric, IFINDEX, PIECE, SLED_A, SLED_B};
use engine::pipeline::layers::LAYERS;
use engine::{
    Direction, Engine, EngineConfig, ExternalIps, FwAction, MacAddr, OuterTemplate, PortCidrs,
    PortConfig, PortId, PortLimits, Rule, RxFrame, SnatRange, TxBatch, TxDest, VnetHdr, Vni,
};
use etherparse::PacketBuilder;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Boundary services: External frames from here pass the underlay source check.
const BOUNDARY: &str = "fd00:99::b";

fn v4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// Addresses that make the checks the API makes matter: a guest's, the gateway's,
/// unspecified, broadcast, multicast, loopback, link-local, the internet's, one
/// behind an appliance.
fn pool4() -> Vec<Ipv4Addr> {
    [
        "172.30.0.5",
        "172.30.0.6",
        "172.30.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "224.0.0.5",
        "127.0.0.1",
        "8.8.8.8",
        "198.51.100.1",
        "192.168.50.7",
    ]
    .map(v4)
    .to_vec()
}

fn pool6() -> Vec<Ipv6Addr> {
    [
        "fd00:1122:3344:100::5",
        "fd00:1122:3344:100::6",
        "fe80::aa40:25ff:fe00:1",
        "fe80::5",
        "ff02::1",
        "::",
        "::1",
        "2001:db8::7",
        "fd00:50::7",
    ]
    .map(v6)
    .to_vec()
}

fn arb_v4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![3 => select(pool4()), 1 => any::<u32>().prop_map(Ipv4Addr::from)]
}

fn arb_v6() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![3 => select(pool6()), 1 => any::<u128>().prop_map(Ipv6Addr::from)]
}

fn arb_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![arb_v4().prop_map(IpAddr::V4), arb_v6().prop_map(IpAddr::V6)]
}

/// Prefixes of any length, host bits and all.
fn arb_net4() -> impl Strategy<Value = Ipv4Net> {
    (arb_v4(), 0u8..=32).prop_map(|(a, l)| Ipv4Net::new(a, l).unwrap())
}

fn arb_net6() -> impl Strategy<Value = Ipv6Net> {
    (arb_v6(), 0u8..=128).prop_map(|(a, l)| Ipv6Net::new(a, l).unwrap())
}

fn arb_net() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        arb_net4().prop_map(IpNet::V4),
        arb_net6().prop_map(IpNet::V6)
    ]
}

/// The guest and gateway MACs the frames use, broadcast, zero, multicast, or any.
fn arb_mac() -> impl Strategy<Value = MacAddr> {
    let macs = [
        [0xa8, 0x40, 0x25, 0xff, 0x00, 0x05],
        [0xa8, 0x40, 0x25, 0x00, 0x00, 0x01],
        [0xff; 6],
        [0; 6],
        [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01],
        [0x33, 0x33, 0x00, 0x00, 0x00, 0x01],
    ];
    prop_oneof![
        3 => select(macs.to_vec()).prop_map(MacAddr),
        1 => any::<[u8; 6]>().prop_map(MacAddr),
    ]
}

/// MTUs at and around every bound: 0, IPv4's 68, IPv6's 1280, what an underlay of
/// 9000 carries (8922), 65535; half of them ones the engine takes, so that most
/// ports are created and carry frames.
fn arb_mtu() -> impl Strategy<Value = u16> {
    let edges = vec![0u16, 1, 68, 1279, 8923, 9000, 65535];
    prop_oneof![
        4 => select(vec![1280u16, 1500, 8500, 8922]),
        3 => select(edges),
        1 => any::<u16>(),
    ]
}

fn arb_limit() -> impl Strategy<Value = Option<u32>> {
    option::of(prop_oneof![
        Just(0u32),
        Just(1),
        Just(400_000),
        Just(u32::MAX),
        any::<u32>()
    ])
}

fn arb_limits() -> impl Strategy<Value = PortLimits> {
    (arb_limit(), arb_limit(), arb_limit(), arb_limit()).prop_map(|(e, i, b, p)| PortLimits {
        egress_mbps: e,
        ingress_mbps: i,
        burst_kib: b,
        pps: p,
    })
}

fn arb_l4_port() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(0u16),
        Just(1023),
        Just(1024),
        Just(65535),
        any::<u16>()
    ]
}

/// SNAT ranges reversed, empty of well-known ports or not, of either family.
fn arb_external() -> impl Strategy<Value = ExternalIps> {
    let snat = (arb_ip(), arb_l4_port(), arb_l4_port()).prop_map(|(ip, start, end)| SnatRange {
        ip,
        start,
        end,
    });
    (option::of(snat), option::of(arb_ip()), vec(arb_ip(), 0..4)).prop_map(
        |(snat, ephemeral, floating)| ExternalIps {
            snat,
            ephemeral,
            floating,
            gateways: Default::default(),
        },
    )
}

/// A few prefixes, or about as many as a port may have (64 a list) or more.
fn arb_cidrs() -> impl Strategy<Value = PortCidrs> {
    let nets = || prop_oneof![4 => vec(arb_net(), 0..6), 1 => vec(arb_net(), 60..70)];
    (nets(), nets(), nets()).prop_map(|(inbound, outbound, external)| PortCidrs {
        inbound,
        outbound,
        external,
    })
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("ga".to_string()),
        Just("a-name-of-16-byt".to_string()),
        "\\PC{0,40}",
    ]
}

/// Names for DHCP: empty, short, longer than an option holds.
fn arb_text() -> impl Strategy<Value = Option<String>> {
    option::of(prop_oneof![
        Just(String::new()),
        "[a-z.]{1,12}",
        Just("x".repeat(300)),
        Just("a.".repeat(200)),
    ])
}

fn arb_vni() -> impl Strategy<Value = Vni> {
    prop_oneof![Just(1701u32), any::<u32>().prop_map(|v| v & 0xff_ffff)]
        .prop_map(|v| Vni::new(v).unwrap())
}

fn arb_port_config() -> impl Strategy<Value = PortConfig> {
    let ids = (
        arb_name(),
        arb_mac(),
        arb_mac(),
        option::of(arb_v4()),
        option::of(arb_v6()),
        option::of(arb_net4()),
        option::of(arb_net6()),
        option::of(arb_v4()),
        arb_vni(),
    );
    let rest = (
        arb_mtu(),
        any::<bool>(),
        vec(arb_v4(), 0..70),
        vec(arb_v6(), 0..12),
        arb_text(),
        arb_text(),
        arb_external(),
        arb_limits(),
        arb_cidrs(),
    );
    (ids, rest).prop_map(
        |(
            (name, guest_mac, gateway_mac, ipv4, ipv6, vpc_subnet4, vpc_subnet6, gateway_ipv4, vni),
            (mtu, external_jumbo, dns4, dns6, hostname, domain, external, limits, cidrs),
        )| PortConfig {
            name,
            guest_mac,
            gateway_mac,
            ipv4,
            ipv6,
            vpc_subnet4,
            vpc_subnet6,
            gateway_ipv4,
            vni,
            mtu,
            external_jumbo,
            dns_servers4: dns4,
            dns_servers6: dns6,
            hostname,
            domain_search: domain.iter().cloned().collect(),
            domain,
            external,
            limits,
            cidrs,
        },
    )
}

/// What a frame is, as far as the checks it meets are concerned.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Tcp {
        syn: bool,
    },
    Udp,
    Echo,
    /// An ARP request for the address the frame is to.
    Arp,
    Dhcp4,
    Dhcp6,
    RouterSolicitation,
}

fn arb_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => any::<bool>().prop_map(|syn| Kind::Tcp { syn }),
        3 => Just(Kind::Udp),
        2 => Just(Kind::Echo),
        1 => Just(Kind::Arp),
        1 => Just(Kind::Dhcp4),
        1 => Just(Kind::Dhcp6),
        1 => Just(Kind::RouterSolicitation),
    ]
}

/// Where an underlay frame claims to come from.
#[derive(Clone, Copy, Debug)]
enum Sender {
    /// The sled V2P maps every pool address to.
    Peer,
    Boundary,
    /// This sled itself.
    Us,
    Any(Ipv6Addr),
}

#[derive(Clone, Debug)]
enum Event {
    /// A frame from port `port`'s guest (from its MAC to its gateway's), from its
    /// own address of `dst`'s family (`own`) or from `src`; with a TSO header of
    /// that segment size, if any.
    Guest {
        port: usize,
        own: bool,
        src: IpAddr,
        dst: IpAddr,
        kind: Kind,
        len: u16,
        gso: Option<u16>,
    },
    /// A frame from the underlay for port `port`'s guest MAC (or `mac`), in its
    /// VNI (or `vni`), to its own address (`own`) or `dst`, External or not.
    Underlay {
        port: usize,
        mac: Option<MacAddr>,
        vni: Option<Vni>,
        sender: Sender,
        external: bool,
        src: IpAddr,
        own: bool,
        dst: IpAddr,
        kind: Kind,
        len: u16,
    },
    /// The clock moves on by this much (or, `back`, back by it).
    Clock {
        ns: u64,
        back: bool,
    },
    External(usize, ExternalIps),
    Limits(usize, PortLimits),
    Cidrs(usize, PortCidrs),
    Mtu(usize, u16),
}

fn arb_len() -> impl Strategy<Value = u16> {
    prop_oneof![3 => 0u16..64, 2 => 1000u16..1500, 1 => 1500u16..9200, 1 => Just(60_000)]
}

fn arb_sender() -> impl Strategy<Value = Sender> {
    prop_oneof![
        3 => Just(Sender::Peer),
        2 => Just(Sender::Boundary),
        1 => Just(Sender::Us),
        1 => arb_v6().prop_map(Sender::Any),
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    let guest = (
        0usize..2,
        prop::bool::weighted(0.8),
        arb_ip(),
        arb_ip(),
        arb_kind(),
        arb_len(),
        option::of(prop_oneof![Just(0u16), Just(1), Just(1400), Just(65535)]),
    )
        .prop_map(|(port, own, src, dst, kind, len, gso)| Event::Guest {
            port,
            own,
            src,
            dst,
            kind,
            len,
            gso,
        });
    let underlay = (
        (0usize..2, option::of(arb_mac()), option::of(arb_vni())),
        (
            arb_sender(),
            any::<bool>(),
            arb_ip(),
            prop::bool::weighted(0.8),
            arb_ip(),
        ),
        (arb_kind(), arb_len()),
    )
        .prop_map(
            |((port, mac, vni), (sender, external, src, own, dst), (kind, len))| Event::Underlay {
                port,
                mac,
                vni,
                sender,
                external,
                src,
                own,
                dst,
                kind,
                len,
            },
        );
    let ns = prop_oneof![
        Just(0u64),
        Just(1),
        Just(1_000_000),
        Just(1_000_000_000),
        Just(100_000_000_000),
        Just(u64::MAX / 4),
        any::<u64>(),
    ];
    prop_oneof![
        6 => guest,
        4 => underlay,
        2 => (ns, prop::bool::weighted(0.2)).prop_map(|(ns, back)| Event::Clock { ns, back }),
        1 => (0usize..2, arb_external()).prop_map(|(p, e)| Event::External(p, e)),
        1 => (0usize..2, arb_limits()).prop_map(|(p, l)| Event::Limits(p, l)),
        1 => (0usize..2, arb_cidrs()).prop_map(|(p, c)| Event::Cidrs(p, c)),
        1 => (0usize..2, arb_mtu()).prop_map(|(p, m)| Event::Mtu(p, m)),
    ]
}

/// An address of `dst`'s family: the port's own if it has one and `own`, else
/// `src` if of that family, else one of the pool's.
fn source_for(cfg: &PortConfig, own: bool, src: IpAddr, dst: IpAddr) -> IpAddr {
    let mine = match dst {
        IpAddr::V4(_) => cfg.ipv4.map(IpAddr::V4),
        IpAddr::V6(_) => cfg.ipv6.map(IpAddr::V6),
    };
    match (mine.filter(|_| own), src, dst) {
        (Some(a), _, _) => a,
        (None, IpAddr::V4(_), IpAddr::V4(_)) | (None, IpAddr::V6(_), IpAddr::V6(_)) => src,
        (None, _, IpAddr::V4(_)) => IpAddr::V4(pool4()[0]),
        (None, _, IpAddr::V6(_)) => IpAddr::V6(pool6()[0]),
    }
}

/// A DHCPv4 DISCOVER from `mac` (BOOTP header, magic cookie, option 53, end).
fn dhcp4_discover(mac: MacAddr) -> Vec<u8> {
    let mut b = vec![0u8; 240];
    b[..4].copy_from_slice(&[1, 1, 6, 0]);
    b[4..8].copy_from_slice(&[0x12, 0x34, 0x56, 0x78]);
    b[10] = 0x80;
    b[28..34].copy_from_slice(&mac.0);
    b[236..240].copy_from_slice(&[99, 130, 83, 99]);
    b.extend_from_slice(&[53, 1, 1, 255]);
    b
}

/// A DHCPv6 SOLICIT from `mac` (client id DUID-LL, an IA_NA).
fn dhcp6_solicit(mac: MacAddr) -> Vec<u8> {
    let mut b = vec![1, 0xab, 0xcd, 0xef];
    b.extend_from_slice(&[0, 1, 0, 10, 0, 3, 0, 1]);
    b.extend_from_slice(&mac.0);
    b.extend_from_slice(&[0, 3, 0, 12]);
    b.extend_from_slice(&[0; 12]);
    b
}

/// An Ethernet frame from `src_mac` to `dst_mac`, `kind` from `src` to `dst` (both
/// of one family, or the frame is a UDP datagram from `dst`'s family's first pool
/// address), with `len` bytes of payload.
fn build(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: IpAddr,
    dst: IpAddr,
    kind: Kind,
    len: u16,
) -> Vec<u8> {
    let payload = vec![0x5a; usize::from(len)];
    let eth = PacketBuilder::ethernet2(src_mac.0, dst_mac.0);
    let mut buf = Vec::new();
    match (kind, src, dst) {
        (Kind::Arp, IpAddr::V4(s), IpAddr::V4(d)) => {
            buf.extend_from_slice(&[0xff; 6]);
            buf.extend_from_slice(&src_mac.0);
            buf.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
            buf.extend_from_slice(&src_mac.0);
            buf.extend_from_slice(&s.octets());
            buf.extend_from_slice(&[0; 6]);
            buf.extend_from_slice(&d.octets());
        }
        (Kind::Dhcp4, _, _) => PacketBuilder::ethernet2(src_mac.0, [0xff; 6])
            .ipv4([0; 4], [255; 4], 64)
            .udp(68, 67)
            .write(&mut buf, &dhcp4_discover(src_mac))
            .unwrap(),
        (Kind::Dhcp6, _, _) => PacketBuilder::ethernet2(src_mac.0, [0x33, 0x33, 0, 1, 0, 2])
            .ipv6(v6("fe80::1").octets(), v6("ff02::1:2").octets(), 1)
            .udp(546, 547)
            .write(&mut buf, &dhcp6_solicit(src_mac))
            .unwrap(),
        (Kind::RouterSolicitation, _, _) => {
            PacketBuilder::ethernet2(src_mac.0, [0x33, 0x33, 0, 0, 0, 2])
                .ipv6(v6("fe80::1").octets(), v6("ff02::2").octets(), 255)
                .icmpv6_raw(133, 0, [0; 4])
                .write(&mut buf, &[1, 1, src_mac.0[0], 0, 0, 0, 0, 0])
                .unwrap();
        }
        (_, IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = eth.ipv4(s.octets(), d.octets(), 64);
            match kind {
                Kind::Tcp { syn } => {
                    let t = ip.tcp(40000, 80, 1000, 65535);
                    let t = if syn { t.syn() } else { t.ack(1) };
                    t.write(&mut buf, &payload).unwrap();
                }
                Kind::Echo => ip
                    .icmpv4_echo_request(7, 1)
                    .write(&mut buf, &payload)
                    .unwrap(),
                _ => ip.udp(40000, 53).write(&mut buf, &payload).unwrap(),
            }
        }
        (_, IpAddr::V6(s), IpAddr::V6(d)) => {
            let ip = eth.ipv6(s.octets(), d.octets(), 64);
            match kind {
                Kind::Tcp { syn } => {
                    let t = ip.tcp(40000, 80, 1000, 65535);
                    let t = if syn { t.syn() } else { t.ack(1) };
                    t.write(&mut buf, &payload).unwrap();
                }
                Kind::Echo => ip
                    .icmpv6_echo_request(7, 1)
                    .write(&mut buf, &payload)
                    .unwrap(),
                _ => ip.udp(40000, 53).write(&mut buf, &payload).unwrap(),
            }
        }
        (_, _, IpAddr::V4(d)) => eth
            .ipv4(pool4()[0].octets(), d.octets(), 64)
            .udp(1, 2)
            .write(&mut buf, &payload)
            .unwrap(),
        (_, _, IpAddr::V6(d)) => eth
            .ipv6(pool6()[0].octets(), d.octets(), 64)
            .udp(1, 2)
            .write(&mut buf, &payload)
            .unwrap(),
    }
    buf
}

/// A TSO header for a TCP frame of `buf` (Ethernet, IPv4 or IPv6, 20-byte TCP).
fn tso(buf: &[u8], gso_size: u16) -> VnetHdr {
    let v6 = buf.get(12..14) == Some(&[0x86, 0xdd][..]);
    let l4 = if v6 { 54 } else { 34 };
    VnetHdr {
        flags: wire::vnet::F_NEEDS_CSUM,
        gso_type: if v6 {
            wire::vnet::GSO_TCPV6
        } else {
            wire::vnet::GSO_TCPV4
        },
        hdr_len: l4 + 20,
        gso_size,
        csum_start: l4,
        csum_offset: 16,
    }
}

/// A sled with boundary services, V2P mapping every pool address of both VNIs the
/// ports may have to sled B.
struct Sled {
    e: Engine,
    ports: Vec<(String, PortId, PortConfig)>,
    now: u64,
    /// The latest `now` so far: buckets refill nothing from a clock that went
    /// back, so a wait is checked only while the clock is at its latest.
    latest: u64,
    out: TxBatch<'static>,
}

impl Sled {
    fn new(cfgs: &[PortConfig]) -> Sled {
        let mut cfg = EngineConfig::new(SLED_A.parse().unwrap());
        cfg.boundary_services = Some(BOUNDARY.parse().unwrap());
        let mut e = Engine::new(cfg).unwrap();
        let mut ports = Vec::new();
        for c in cfgs {
            // Refusals are fine: what is refused changes nothing.
            if let Ok(id) = e.add_port(c.clone()) {
                let any = Rule::new(1, FwAction::Allow).finalize().unwrap();
                e.add_fw_rule(&c.name, Direction::In, any).unwrap();
                ports.push((c.name.clone(), id, c.clone()));
            }
        }
        let peer: Ipv6Addr = SLED_B.parse().unwrap();
        let vnis: Vec<Vni> = cfgs.iter().map(|c| c.vni).collect();
        for vni in vnis {
            for ip in pool4().into_iter().map(IpAddr::V4) {
                let _ = e.set_v2p(vni, ip, peer, MacAddr([0xa8, 0x40, 0x25, 0xff, 0, 6]));
            }
            for ip in pool6().into_iter().map(IpAddr::V6) {
                let _ = e.set_v2p(vni, ip, peer, MacAddr([0xa8, 0x40, 0x25, 0xff, 0, 6]));
            }
        }
        Sled {
            e,
            ports,
            now: 1,
            latest: 1,
            out: TxBatch::new(),
        }
    }

    /// The port an event names, if any port was created.
    fn port(&self, i: usize) -> Option<(String, PortId, PortConfig)> {
        let n = self.ports.len();
        (n > 0).then(|| self.ports[i % n].clone())
    }

    /// What a worker does with the engine's output: asks the ingress limit for
    /// every frame to a port (reporting a full queue for those that must wait),
    /// and checks that a wait it is told is enough (with a clock that did not go
    /// back).
    fn drain(&mut self) -> Result<(), TestCaseError> {
        let frames = frames_of(&self.out, &[]);
        self.out.clear();
        for (dest, f) in frames {
            if let TxDest::Port { port, .. } = dest {
                if let Err(ns) = self.e.ingress_take(port, f.len(), self.now) {
                    prop_assert!(ns > 0);
                    self.e.ingress_overflow(port);
                }
            }
        }
        for (_, id, _) in self.ports.clone() {
            if let Some(ns) = self.e.egress_wait(id, self.now) {
                prop_assert!(ns > 0);
                let then = self.now.checked_add(ns).filter(|_| self.now == self.latest);
                if let Some(then) = then {
                    prop_assert_eq!(
                        self.e.egress_wait(id, then),
                        None,
                        "waited {} ns as told",
                        ns
                    );
                }
            }
        }
        Ok(())
    }

    fn run(&mut self, ev: &Event) -> Result<(), TestCaseError> {
        match ev.clone() {
            Event::Guest {
                port,
                own,
                src,
                dst,
                kind,
                len,
                gso,
            } => {
                let Some((_, id, cfg)) = self.port(port) else {
                    return Ok(());
                };
                let src = source_for(&cfg, own, src, dst);
                let f = build(cfg.guest_mac, cfg.gateway_mac, src, dst, kind, len);
                let vnet = match (kind, gso) {
                    (Kind::Tcp { .. }, Some(size)) => tso(&f, size),
                    _ => VnetHdr::default(),
                };
                self.e
                    .process_guest(id, vnet, &f, self.now, &Fabric, &mut self.out);
                // Its copy is still the frame's (held frames are copies).
                self.e.retry_held(self.now, &Fabric, &mut self.out);
            }
            Event::Underlay {
                port,
                mac,
                vni,
                sender,
                external,
                src,
                own,
                dst,
                kind,
                len,
            } => {
                let Some((_, _, cfg)) = self.port(port) else {
                    return Ok(());
                };
                let dst = source_for(&cfg, own, dst, dst);
                let src = source_for(&cfg, false, src, dst);
                let to = mac.unwrap_or(cfg.guest_mac);
                let inner = build(
                    MacAddr([0xa8, 0x40, 0x25, 0xff, 0, 6]),
                    to,
                    src,
                    dst,
                    kind,
                    len,
                );
                let from: Ipv6Addr = match sender {
                    Sender::Peer => SLED_B.parse().unwrap(),
                    Sender::Boundary => BOUNDARY.parse().unwrap(),
                    Sender::Us => SLED_A.parse().unwrap(),
                    Sender::Any(a) => a,
                };
                let t = OuterTemplate::new(
                    MacAddr([2, 0, 0, 0, 0x99, 2]),
                    MacAddr([2, 0, 0, 0, 0x99, 1]),
                    from,
                    SLED_A.parse().unwrap(),
                    50000,
                    0,
                    vni.unwrap_or(cfg.vni),
                    external,
                    false,
                );
                let mut wire = TxBatch::new();
                if t.encapsulate(
                    &inner,
                    None,
                    TxDest::Underlay { ifindex: IFINDEX },
                    &mut wire,
                ) > 0
                {
                    let f = wire.frame(0).unwrap().1.to_vec();
                    let pieces: Vec<&[u8]> = f.chunks(PIECE).collect();
                    let mut out = TxBatch::new();
                    self.e
                        .process_underlay(RxFrame::new(&pieces, 0), self.now, &Fabric, &mut out);
                    self.e.end_of_batch(&mut out);
                    let frames = out.to_vecs(&[&f]).expect("every frame resolves");
                    for (dest, g) in frames {
                        if let TxDest::Port { port, .. } = dest {
                            let _ = self.e.ingress_take(port, g.len(), self.now);
                        }
                    }
                }
            }
            Event::Clock { ns, back } => {
                self.now = match back {
                    true => self.now.saturating_sub(ns),
                    false => self.now.saturating_add(ns),
                };
                self.latest = self.latest.max(self.now);
                self.e.tick(self.now, &mut self.out);
            }
            Event::External(p, ext) => {
                if let Some((name, ..)) = self.port(p) {
                    self.e.set_external_ips(&name, ext).unwrap();
                }
            }
            Event::Limits(p, l) => {
                if let Some((name, ..)) = self.port(p) {
                    self.e.set_port_limits(&name, l).unwrap();
                }
            }
            Event::Cidrs(p, c) => {
                if let Some((name, ..)) = self.port(p) {
                    let longest = [&c.inbound, &c.outbound, &c.external].map(Vec::len);
                    let many = longest.into_iter().max() > Some(engine::MAX_PORT_CIDRS);
                    let r = self.e.set_port_cidrs(&name, c);
                    prop_assert_eq!(r.is_err(), many, "{:?}", r);
                }
            }
            Event::Mtu(p, m) => {
                if let Some((name, ..)) = self.port(p) {
                    let _ = self.e.set_port_mtu(&name, m);
                }
            }
        }
        self.drain()
    }

    /// Every inspection the admin tool makes, then the ports removed.
    fn inspect_and_remove(&mut self) {
        let _ = self.e.stats();
        let _ = self.e.list_ports();
        for (name, ..) in self.ports.clone() {
            let _ = self.e.port_config(&name).unwrap();
            let _ = self.e.port_state(&name).unwrap();
            let _ = self.e.mtu_budget(&name).unwrap();
            let _ = self.e.ra_info(&name).unwrap();
            let _ = self.e.dump_routes(&name).unwrap();
            let _ = self.e.dump_tcp_flows(&name).unwrap();
            let _ = self.e.dump_uft(&name, 0, 4096).unwrap();
            let _ = self.e.list_layers(&name).unwrap();
            for layer in LAYERS {
                let _ = self.e.dump_layer(&name, layer).unwrap();
            }
        }
        for (name, ..) in self.ports.clone() {
            self.e.remove_port(&name).unwrap();
        }
        self.e.tick(self.now.saturating_add(1), &mut self.out);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Two ports of arbitrary, unchecked configuration on one sled, then frames,
    /// timers and changes of their external addresses, limits, prefixes and MTU:
    /// nothing panics, and the only refusals of the setters that take a port's
    /// configuration whole are the engine's own (a port it has not, more prefixes
    /// than it scans).
    #[test]
    fn unchecked_configuration_never_panics_the_engine(
        cfgs in vec(arb_port_config(), 1..=2),
        events in vec(arb_event(), 1..32),
    ) {
        let mut s = Sled::new(&cfgs);
        for ev in &events {
            s.run(ev)?;
        }
        s.inspect_and_remove();
    }
}
