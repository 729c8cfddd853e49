//! The fast path allocates nothing: once a flow is cached and the output batch has
//! its capacity, encapsulating, decapsulating and coalescing a packet must not touch
//! the heap, NATed flows (rewritten both ways) included. A counting global allocator
//! checks it, per thread.

// A counting global allocator: implementing `GlobalAlloc` is `unsafe` by nature.
#![allow(unsafe_code)]

mod common;

use common::*;
use engine::OuterTemplate;
use engine::{Engine, EngineConfig, FrameBytes, MacAddr, RxFrame, TxBatch, TxDest, VnetHdr, Vni};
use engine::{ExternalIps, SnatRange};
use etherparse::PacketBuilder;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr};

struct Counting;

thread_local! {
    /// Allocations made by this thread: the tests run in threads of their own, and
    /// the harness allocates in others (starting a test, printing a result).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

fn count() {
    // `try_with`: nothing to count on a thread whose locals are being destroyed.
    let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: defers every operation to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Hands every underlay frame of `sent` to `b` as AF_XDP would: in pieces, the first
/// [`PIECE`] bytes long.
fn receive_all(b: &mut Engine, sent: &TxBatch, now: u64, out: &mut TxBatch) {
    for (i, (_, f)) in sent.iter().enumerate() {
        let FrameBytes::Own(u) = f else {
            panic!("the sending batch lends no space");
        };
        let (head, rest) = u.split_at(u.len().min(PIECE));
        let pieces = [head, rest];
        b.process_underlay(RxFrame::new(&pieces, i as u32), now, &Fabric, out);
    }
}

#[test]
fn cached_flows_allocate_nothing_per_packet() {
    let (mut a, pa, mut b, _pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let tcp = tcp_v4(&g1, g2.v4, 40000, 80, false, &[7u8; 1200]);
    let icmp6 = frame(&g1, None, Some(g2.v6), L4::Icmp { id: 9, seq: 1 }, b"ping");
    let mut out_a = TxBatch::new();
    let mut out_b = TxBatch::new();
    // Open the TCP connection first: sled B admits inbound TCP only from a SYN on.
    let syn = tcp_v4(&g1, g2.v4, 40000, 80, true, &[]);
    out_a.clear();
    a.process_guest(pa, VnetHdr::default(), &syn, 0, &Fabric, &mut out_a);
    receive_all(&mut b, &out_a, 0, &mut out_b);
    let mut round = |now: u64, out_a: &mut TxBatch, out_b: &mut TxBatch| {
        out_a.clear();
        out_b.clear();
        for f in [&tcp, &icmp6] {
            a.process_guest(pa, VnetHdr::default(), f, now, &Fabric, out_a);
        }
        receive_all(&mut b, out_a, now, out_b);
        b.end_of_batch(out_b);
        assert_eq!(out_b.len(), 2);
    };
    // Warm up: compile the flows, size the batches and the coalescer's buffers.
    for now in 0..4 {
        round(now, &mut out_a, &mut out_b);
    }
    let before = allocs();
    assert!(before > 0, "the counting allocator is in use");
    for now in 4..1004 {
        round(now, &mut out_a, &mut out_b);
    }
    let n = allocs() - before;
    assert_eq!(n, 0, "{n} allocations in 1000 rounds of 2 packets each way");
}

/// An established TCP flow through SNAT: the guest's segments leave rewritten, the
/// internet's come back translated, and neither allocates.
#[test]
fn nated_flows_allocate_nothing_per_packet() {
    let boundary = "fd00:99::ff";
    let mut cfg = EngineConfig::new(SLED_A.parse().unwrap());
    cfg.boundary_services = Some(boundary.parse().unwrap());
    let mut a = Engine::new(cfg).unwrap();
    let g1 = guest(1);
    let snat_ip = Ipv4Addr::new(198, 51, 100, 1);
    let mut pc = port_config(&g1);
    pc.external = ExternalIps {
        snat: Some(SnatRange {
            ip: IpAddr::V4(snat_ip),
            start: 1024,
            end: 65535,
        }),
        ..Default::default()
    };
    let pa = a.add_port(pc).unwrap();
    let remote = Ipv4Addr::new(8, 8, 8, 8);
    let syn = tcp_v4(&g1, remote, 40000, 443, true, &[]);
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &syn, 0, &Fabric, &mut out);
    let left = decode_underlay(out.frame(0).unwrap().1).inner;
    let port = u16::from_be_bytes([left[34], left[35]]);
    // From the internet through boundary services, External.
    let inbound = |seq: u32, syn: bool, payload: &[u8]| {
        let mut inner = Vec::new();
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 0x42], g1.mac.0)
            .ipv4(remote.octets(), snat_ip.octets(), 60)
            .tcp(443, port, seq, 65535);
        let b = if syn { b.syn().ack(1001) } else { b.ack(1001) };
        b.write(&mut inner, payload).unwrap();
        let t = OuterTemplate::new(
            MacAddr([2, 0, 0, 0, 0x99, 9]),
            MacAddr([2, 0, 0, 0, 0x99, 2]),
            boundary.parse().unwrap(),
            SLED_A.parse().unwrap(),
            50000,
            0,
            Vni::new(VNI).unwrap(),
            true,
            false,
        );
        let mut o = TxBatch::new();
        t.encapsulate(&inner, None, TxDest::Underlay { ifindex: 1 }, &mut o);
        o.frame(0).unwrap().1.to_vec()
    };
    let synack = inbound(5000, true, b"");
    let data_in = inbound(5001, false, &[9u8; 1200]);
    let data_out = tcp_v4(&g1, remote, 40000, 443, false, &[7u8; 1200]);
    let mut out_in = TxBatch::new();
    a.process_underlay(RxFrame::new(&[&synack[..]], 0), 0, &Fabric, &mut out_in);
    a.end_of_batch(&mut out_in);
    assert_eq!(out_in.len(), 1, "the SYN-ACK reaches the guest");
    let mut round = |now: u64, out: &mut TxBatch, out_in: &mut TxBatch| {
        out.clear();
        out_in.clear();
        a.process_guest(pa, VnetHdr::default(), &data_out, now, &Fabric, out);
        a.process_underlay(RxFrame::new(&[&data_in[..]], 0), now, &Fabric, out_in);
        a.end_of_batch(out_in);
        assert_eq!((out.len(), out_in.len()), (1, 1));
    };
    for now in 0..4 {
        round(now, &mut out, &mut out_in);
    }
    let before = allocs();
    for now in 4..1004 {
        round(now, &mut out, &mut out_in);
    }
    let n = allocs() - before;
    assert_eq!(
        n, 0,
        "{n} allocations in 1000 rounds of a NATed packet each way"
    );
}

/// A flow to an address behind an appliance (a next-hop route, a prefix the
/// appliance's port allows both ways) and the appliance's answers from that
/// address allocate nothing either.
#[test]
fn appliance_flows_allocate_nothing_per_packet() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let subnet = "192.168.50.0/24".parse().unwrap();
    a.add_route(
        "ga",
        subnet,
        engine::RouteTarget::Ip(IpAddr::V4(g2.v4)),
        None,
    )
    .unwrap();
    let nets = vec!["10.9.0.0/16".parse().unwrap(), subnet];
    let cidrs = engine::PortCidrs {
        inbound: nets.clone(),
        outbound: nets,
        ..Default::default()
    };
    b.set_port_cidrs("gb", cidrs).unwrap();
    let behind = Ipv4Addr::new(192, 168, 50, 7);
    let udp = L4::Udp {
        sport: 4000,
        dport: 7,
    };
    let to = frame(&g1, Some(behind), None, udp, &[1u8; 600]);
    let from_behind = common::Guest {
        v4: behind,
        ..guest(2)
    };
    let back = frame(
        &from_behind,
        Some(g1.v4),
        None,
        L4::Udp {
            sport: 7,
            dport: 4000,
        },
        &[2u8; 600],
    );
    let mut out_a = TxBatch::new();
    let mut out_b = TxBatch::new();
    let mut round = |now: u64, out_a: &mut TxBatch, out_b: &mut TxBatch| {
        out_a.clear();
        out_b.clear();
        a.process_guest(pa, VnetHdr::default(), &to, now, &Fabric, out_a);
        receive_all(&mut b, out_a, now, out_b);
        b.end_of_batch(out_b);
        assert_eq!(out_b.len(), 1);
        out_b.clear();
        b.process_guest(pb, VnetHdr::default(), &back, now, &Fabric, out_b);
        assert_eq!(out_b.len(), 1);
    };
    for now in 0..4 {
        round(now, &mut out_a, &mut out_b);
    }
    let before = allocs();
    for now in 4..1004 {
        round(now, &mut out_a, &mut out_b);
    }
    let n = allocs() - before;
    assert_eq!(n, 0, "{n} allocations in 1000 rounds through the appliance");
}
