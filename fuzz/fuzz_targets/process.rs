//! The whole engine, fed arbitrary frames from a guest port and from the underlay.
//!
//! One engine lives across inputs (like a daemon), so flow tables, the firewall's
//! connection table and the coalescer accumulate state between frames. Whatever comes
//! in, the engine must not panic, and what it emits must be well formed: every
//! underlay frame parses as our own Geneve and fits the underlay MTU, and every frame
//! to a guest fits a 64 KiB GSO buffer.
#![no_main]

use engine::{
    Direction, Engine, EngineConfig, FwAction, MacAddr, NextHop, NextHopSet, PortConfig, PortId,
    Predicate, Rule, RxFrame, TxBatch, TxDest, UnderlayRoutes, VnetHdr, Vni,
};
use libfuzzer_sys::fuzz_target;
use std::net::Ipv6Addr;
use std::sync::{Mutex, OnceLock};
use wire::meta::parse_underlay;

const UNDERLAY_MTU: usize = 9000;

struct Routes;

impl UnderlayRoutes for Routes {
    fn next_hops(&self, _dst: Ipv6Addr) -> NextHopSet {
        NextHopSet::from(NextHop {
            ifindex: 2,
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        })
    }
}

struct Sled {
    engine: Engine,
    ports: [PortId; 2],
    now: u64,
    out: TxBatch<'static>,
}

/// A guest port in VPC `vni`: guest MAC `a8:40:25:00:00:<mac>`, addresses
/// 172.30.0.<host> and fd00:1122::<host>.
fn port(name: &str, vni: u32, mac: u8, gateway_mac: u8, host: u8) -> PortConfig {
    PortConfig {
        name: name.into(),
        guest_mac: MacAddr([0xa8, 0x40, 0x25, 0, 0, mac]),
        gateway_mac: MacAddr([0xa8, 0x40, 0x25, 0, 0, gateway_mac]),
        ipv4: Some([172, 30, 0, host].into()),
        ipv6: Some(format!("fd00:1122::{host}").parse().unwrap()),
        vpc_subnet4: Some("172.30.0.0/22".parse().unwrap()),
        vpc_subnet6: Some("fd00:1122::/64".parse().unwrap()),
        gateway_ipv4: Some([172, 30, 0, 1].into()),
        vni: Vni::new(vni).unwrap(),
        mtu: 8500,
        external_jumbo: host % 2 == 0,
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

/// The VPCs of the seed vectors' underlay frames (datapath/wire/testdata/vectors.txt).
const VNIS: [u32; 3] = [1193046, 77, 16777215];

/// Sled fd00:99::2, laid out so that the seed vectors reach every check: guest frames
/// (from a8:40:25:00:00:01, 172.30.0.5 / fd00:1122::5, to the gateway
/// a8:40:25:00:00:02) come from port `opte0`, and go to `opte1` on this sled (same-sled
/// delivery, with the fuzzed virtio_net_hdr) or through V2P to sled fd00:99::1;
/// underlay frames (from fd00:99::1, to guest MAC a8:40:25:00:00:02 in each vector's
/// VNI) find a port, and their inner source (172.30.0.5 / fd00:1122::5,
/// a8:40:25:00:00:01) is what V2P maps to fd00:99::1, so they pass the underlay source
/// check unless the fuzzer changes a byte of it; fd00:99::1 is boundary services too,
/// so External frames pass it as well. With `tunnel_gso` guest TSO buffers leave as
/// UDP-tunnel GSO super-frames instead of segments.
fn sled(tunnel_gso: bool) -> Sled {
    let mut cfg = EngineConfig::new("fd00:99::2".parse().unwrap());
    cfg.boundary_services = Some("fd00:99::1".parse().unwrap());
    cfg.underlay_tunnel_gso = tunnel_gso;
    let mut engine = Engine::new(cfg).unwrap();
    let a = engine.add_port(port("opte0", VNIS[0], 1, 2, 5)).unwrap();
    let b = engine.add_port(port("opte1", VNIS[0], 2, 0xfe, 6)).unwrap();
    engine.add_port(port("opte2", VNIS[1], 2, 0xfe, 6)).unwrap();
    engine.add_port(port("opte3", VNIS[2], 2, 0xfe, 6)).unwrap();
    for name in ["opte0", "opte1", "opte2", "opte3"] {
        for net in ["172.30.0.0/22", "fd00:1122::/64"] {
            let r = Rule::new(100, FwAction::Allow)
                .matching(Predicate::SrcIp(net.parse().unwrap()))
                .finalize()
                .unwrap();
            engine.add_fw_rule(name, Direction::In, r).unwrap();
        }
    }
    let remote: Ipv6Addr = "fd00:99::1".parse().unwrap();
    let mac = MacAddr([0xa8, 0x40, 0x25, 0, 0, 1]);
    for vni in VNIS {
        let vni = Vni::new(vni).unwrap();
        for ip in ["172.30.0.5", "fd00:1122::5", "172.30.0.7", "fd00:1122::7"] {
            engine
                .set_v2p(vni, ip.parse().unwrap(), remote, mac)
                .unwrap();
        }
    }
    Sled {
        engine,
        ports: [a, b],
        now: 1,
        out: TxBatch::new(),
    }
}

fuzz_target!(|data: &[u8]| {
    static SLED: OnceLock<Mutex<Sled>> = OnceLock::new();
    static SLED_GSO: OnceLock<Mutex<Sled>> = OnceLock::new();
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    // The selector's top bit picks the sled that hands the kernel super-frames.
    let (cell, gso) = if sel & 0x80 != 0 {
        (&SLED_GSO, true)
    } else {
        (&SLED, false)
    };
    let mut s = cell.get_or_init(|| Mutex::new(sled(gso))).lock().unwrap();
    let s = &mut *s;
    s.now += u64::from(sel) * 10_000_000;
    s.out.clear();
    match sel % 3 {
        0 | 1 => {
            let Some(vnet) = VnetHdr::from_bytes(rest) else {
                return;
            };
            let port = s.ports[usize::from(sel % 2)];
            s.engine
                .process_guest(port, vnet, &rest[10..], s.now, &Routes, &mut s.out);
        }
        _ => {
            // As a chain of AF_XDP buffers, cut where the selector says.
            let cut = (usize::from(sel) * 37) % (rest.len() + 1);
            let pieces = [&rest[..cut], &rest[cut..]];
            s.engine
                .process_underlay(RxFrame::new(&pieces, 0), s.now, &Routes, &mut s.out)
        }
    }
    s.engine.end_of_batch(&mut s.out);
    s.engine.tick(s.now, &mut s.out);
    // Input 0 is the underlay frame: every reference must resolve inside it.
    let frames = s.out.to_vecs(&[rest]).expect("every frame resolves");
    for (dest, frame) in frames {
        match dest {
            TxDest::Underlay { .. } => {
                assert!(frame.len() <= 14 + UNDERLAY_MTU, "{} bytes", frame.len());
                if let Err(e) = parse_underlay(&frame) {
                    panic!("we emitted an underlay frame we refuse: {e}");
                }
            }
            TxDest::UnderlayGso { gso, .. } => {
                // One outer IPv6 payload length's worth, and every segment the
                // kernel cuts fits the underlay.
                assert!(frame.len() <= 14 + 40 + 65535, "{} bytes", frame.len());
                let seg = usize::from(gso.hdr_len) + usize::from(gso.gso_size);
                assert!(seg <= 14 + UNDERLAY_MTU, "{seg}-byte segments");
                assert!(usize::from(gso.hdr_len) < frame.len());
                if let Err(e) = parse_underlay(&frame) {
                    panic!("we emitted a super-frame we refuse: {e}");
                }
            }
            TxDest::Port { .. } => assert!(frame.len() <= 14 + 65535),
            TxDest::Sibling { .. } => panic!("no sibling workers here"),
        }
    }
});
