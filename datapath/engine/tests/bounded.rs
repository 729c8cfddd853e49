//! What keeps the outbound path and the tables bounded: Packet Too Big decided from
//! the route before the next hop is known, frames held (boundedly) for a next hop,
//! the table budget, flow-table expiry in bounded steps, and `dump_uft` in pages.

mod common;

use common::*;
use engine::machinery::hold::{HOLD_PER_DST, HOLD_TIMEOUT_NS};
use engine::{Engine, EngineConfig, FlowKey, TableBudget, TxBatch, TxDest, VnetHdr, Vni};
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const BOUNDARY: &str = "fd00:99::b";
const NS_PER_S: u64 = 1_000_000_000;

/// Sled A with boundary services and guest 1 (default routes to the internet).
fn sled_with_boundary() -> (Engine, engine::PortId) {
    let mut cfg = EngineConfig::new(SLED_A.parse().unwrap());
    cfg.boundary_services = Some(BOUNDARY.parse().unwrap());
    let mut e = Engine::new(cfg).unwrap();
    let p = e.add_port(port_config_floating(&guest(1))).unwrap();
    (e, p)
}

fn drops(e: &Engine, reason: &str) -> u64 {
    e.stats().ports[0].drops.get_named(reason)
}

/// The underlay frames of `out`, decoded.
fn underlay(out: &TxBatch) -> Vec<Decoded> {
    frames_of(out, &[])
        .into_iter()
        .map(|(d, f)| {
            assert_eq!(d, TxDest::Underlay { ifindex: IFINDEX });
            decode_underlay(&f)
        })
        .collect()
}

/// An IPv4 frame with DF cleared (and its header checksum fixed).
fn without_df(mut f: Vec<u8>) -> Vec<u8> {
    f[14 + 6] &= !0x40;
    f[24..26].fill(0);
    let c = !fold(
        f[14..34]
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))),
    );
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f
}

fn fold(words: impl Iterator<Item = u32>) -> u16 {
    let mut s: u32 = words.sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[test]
fn too_big_for_the_route_gets_packet_too_big_before_the_next_hop_resolves() {
    let (mut a, pa) = sled_with_boundary();
    let g1 = guest(1);
    let udp = L4::Udp {
        sport: 5000,
        dport: 53,
    };
    let mut out = TxBatch::new();
    // IPv6, 4000 bytes, to the internet (path MTU 1500), no next hop known.
    let big6 = frame(
        &g1,
        None,
        Some("2001:db8::1".parse().unwrap()),
        udp,
        &[1; 3952],
    );
    a.process_guest(pa, VnetHdr::default(), &big6, 1, &NoFabric, &mut out);
    let got = frames_of(&out, &[]);
    assert_eq!(got.len(), 1, "the Packet Too Big, nothing else");
    let (dest, ptb) = &got[0];
    assert!(matches!(dest, TxDest::Port { port, .. } if *port == pa));
    assert_eq!(&ptb[12..14], &[0x86, 0xdd]);
    assert_eq!((ptb[54], ptb[55]), (2, 0), "ICMPv6 Packet Too Big");
    assert_eq!(&ptb[58..62], &1500u32.to_be_bytes(), "the route's path MTU");
    assert_eq!(drops(&a, "packet_too_big"), 1);
    // IPv4 with DF: Fragmentation Needed with next-hop MTU 1500.
    out.clear();
    let big4 = frame(&g1, Some("8.8.8.8".parse().unwrap()), None, udp, &[2; 3972]);
    assert_ne!(big4[14 + 6] & 0x40, 0, "etherparse sets DF");
    a.process_guest(pa, VnetHdr::default(), &big4, 2, &NoFabric, &mut out);
    let got = frames_of(&out, &[]);
    assert_eq!(got.len(), 1);
    let icmp = &got[0].1[34..];
    assert_eq!((icmp[0], icmp[1]), (3, 4), "Fragmentation Needed");
    assert_eq!(&icmp[6..8], &1500u16.to_be_bytes());
    assert_eq!(drops(&a, "packet_too_big"), 2);
    assert_eq!(a.stats().hold.held, 0, "nothing too big waits");

    // IPv4 without DF waits whole, and leaves as fragments once the next hop is known.
    out.clear();
    let nodf = without_df(big4.clone());
    a.process_guest(pa, VnetHdr::default(), &nodf, 3, &NoFabric, &mut out);
    assert!(out.is_empty());
    assert_eq!(a.stats().hold.frames, 1);
    a.retry_held(4, &Fabric, &mut out);
    let sent = underlay(&out);
    assert_eq!(sent.len(), 3, "4000 bytes in 1500-byte fragments");
    let mut payload = 0;
    for d in &sent {
        assert_eq!(d.dst, BOUNDARY.parse::<Ipv6Addr>().unwrap());
        assert_eq!(d.vni, 99);
        let ip = &d.inner[14..];
        let len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        assert!(len <= 1500, "{len}");
        payload += len - 20;
    }
    assert_eq!(payload, nodf.len() - 34);
    assert_eq!(drops(&a, "packet_too_big"), 2);
}

/// A UDP frame from guest 1 to guest 2 carrying `n`.
fn numbered(n: u8) -> Vec<u8> {
    let udp = L4::Udp {
        sport: 4000,
        dport: 53,
    };
    frame(&guest(1), Some(guest(2).v4), None, udp, &[n; 10])
}

#[test]
fn held_frames_leave_in_order_once_the_next_hop_resolves() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let mut out = TxBatch::new();
    for n in 1..=3 {
        a.process_guest(pa, VnetHdr::default(), &numbered(n), 1, &NoFabric, &mut out);
    }
    assert!(out.is_empty());
    let s = a.stats();
    assert_eq!((s.hold.frames, s.hold.destinations), (3, 1));
    assert_eq!(s.ports[0].drops.total(), 0, "waiting is not dropping");
    assert_eq!(
        s.ports[0].uft_out.entries, 0,
        "an unresolved flow is not cached"
    );
    // Still unresolved: nothing moves.
    a.retry_held(2, &NoFabric, &mut out);
    assert!(out.is_empty());
    a.retry_held(3, &Fabric, &mut out);
    let sent = underlay(&out);
    let order: Vec<u8> = sent.iter().map(|d| *d.inner.last().unwrap()).collect();
    assert_eq!(order, [1, 2, 3]);
    assert!(sent
        .iter()
        .all(|d| d.dst == SLED_B.parse::<Ipv6Addr>().unwrap()));
    let s = a.stats();
    assert_eq!((s.hold.frames, s.hold.sent, s.hold.bytes), (0, 3, 0));
    // They are the guest's frames, and they opened the connection the reply needs.
    let wire: Vec<Vec<u8>> = frames_of(&out, &[]).into_iter().map(|(_, f)| f).collect();
    let got = receive(&mut b, &wire, 3);
    assert_eq!(got.len(), 3);
    assert!(got
        .iter()
        .all(|(d, _)| matches!(d, TxDest::Port { port, .. } if *port == pb)));
    a.set_fw_rules("ga", vec![]).unwrap();
    let reply = frame(
        &guest(2),
        Some(guest(1).v4),
        None,
        L4::Udp {
            sport: 53,
            dport: 4000,
        },
        b"answer",
    );
    let mut back = TxBatch::new();
    b.process_guest(pb, VnetHdr::default(), &reply, 4, &Fabric, &mut back);
    let back: Vec<Vec<u8>> = frames_of(&back, &[]).into_iter().map(|(_, f)| f).collect();
    assert_eq!(receive(&mut a, &back, 4).len(), 1, "the reply is admitted");
}

#[test]
fn overflow_drops_the_oldest_and_is_counted() {
    let (mut a, pa, _b, _) = two_sleds();
    let mut out = TxBatch::new();
    for n in 1..=5 {
        a.process_guest(pa, VnetHdr::default(), &numbered(n), 1, &NoFabric, &mut out);
    }
    assert_eq!(drops(&a, "underlay_hold_overflow"), 5 - HOLD_PER_DST as u64);
    assert_eq!(a.stats().hold.overflow, 2);
    a.retry_held(2, &Fabric, &mut out);
    let order: Vec<u8> = underlay(&out)
        .iter()
        .map(|d| *d.inner.last().unwrap())
        .collect();
    assert_eq!(order, [3, 4, 5], "the newest are kept, as the kernel does");
}

#[test]
fn frames_waiting_too_long_time_out_and_are_counted() {
    let (mut a, pa, _b, _) = two_sleds();
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &numbered(1), 0, &NoFabric, &mut out);
    a.process_guest(
        pa,
        VnetHdr::default(),
        &numbered(2),
        NS_PER_S / 2,
        &NoFabric,
        &mut out,
    );
    a.tick(HOLD_TIMEOUT_NS - 1, &mut out);
    assert_eq!(drops(&a, "underlay_hold_timeout"), 0);
    a.tick(HOLD_TIMEOUT_NS, &mut out);
    assert_eq!(drops(&a, "underlay_hold_timeout"), 1);
    // A retry also drops what timed out before it sends.
    out.clear();
    a.retry_held(2 * HOLD_TIMEOUT_NS, &Fabric, &mut out);
    assert_eq!(drops(&a, "underlay_hold_timeout"), 2);
    assert!(out.is_empty());
    assert_eq!(a.stats().hold.timeout, 2);
}

#[test]
fn a_removed_port_leaves_nothing_waiting() {
    let (mut a, pa, _b, _) = two_sleds();
    let mut out = TxBatch::new();
    a.process_guest(pa, VnetHdr::default(), &numbered(1), 0, &NoFabric, &mut out);
    a.remove_port("ga").unwrap();
    // The id is reused by a new port: the old port's frame must not leave as its.
    let g3 = guest(3);
    assert_eq!(a.add_port(port_config(&g3)).unwrap(), pa);
    a.retry_held(1, &Fabric, &mut out);
    assert!(out.is_empty());
    let h = a.stats().hold;
    assert_eq!((h.frames, h.port_removed), (0, 1));
}

/// An engine whose table budget gives each of 4 ports `uft` flow-table entries each
/// way (and, in the default proportions, 8 times as many connections).
fn small_budget(uft: usize) -> Engine {
    use engine::pipeline::budget::{CONN_BYTES, UFT_IN_ENTRY_BYTES, UFT_OUT_ENTRY_BYTES};
    let share = uft * (UFT_OUT_ENTRY_BYTES + UFT_IN_ENTRY_BYTES + 8 * CONN_BYTES);
    let mut cfg = EngineConfig::new(SLED_A.parse().unwrap());
    cfg.tables = TableBudget {
        bytes: 4 * share,
        ports: 4,
    };
    Engine::new(cfg).unwrap()
}

#[test]
fn a_table_at_its_budget_evicts_and_counts() {
    let mut a = small_budget(100);
    let pa = a.add_port(port_config(&guest(1))).unwrap();
    let limits = a.stats().ports[0].table_limits;
    assert_eq!((limits.uft, limits.conns), (100, 800));
    a.set_v2p(
        Vni::new(VNI).unwrap(),
        IpAddr::V4(guest(2).v4),
        SLED_B.parse().unwrap(),
        guest(2).mac,
    )
    .unwrap();
    let flows = limits.uft + 50;
    let mut out = TxBatch::new();
    for sport in 0..flows as u16 {
        let f = frame(
            &guest(1),
            Some(guest(2).v4),
            None,
            L4::Udp { sport, dport: 53 },
            b"x",
        );
        out.clear();
        a.process_guest(pa, VnetHdr::default(), &f, 1, &Fabric, &mut out);
        assert_eq!(out.len(), 1, "every flow still goes out");
    }
    let s = &a.stats().ports[0];
    assert_eq!(s.uft_out.entries as usize, limits.uft);
    assert_eq!(s.uft_out.evicted as usize, flows - limits.uft);
    assert_eq!(
        s.firewall.flows as usize, flows,
        "conns fit their own limit"
    );
    // The budget's ports: a fifth port is refused, naming the limit.
    for n in 2..=5 {
        let mut g = port_config(&guest(1));
        g.name = format!("p{n}");
        g.guest_mac.0[5] = 0x40 + n;
        g.ipv4 = Some(Ipv4Addr::new(172, 30, 1, n));
        g.ipv6 = Some(format!("fd00:1122:3344:100::1:{n}").parse().unwrap());
        if n < 5 {
            a.add_port(g).unwrap();
        } else {
            let e = a.add_port(g).unwrap_err().to_string();
            assert!(e.contains("tables.ports 4"), "{e}");
        }
    }
}

/// Guest 1 on sled A with `n` UDP flows to guest 2 cached (ports 0..n).
fn many_flows(n: u16) -> (Engine, engine::PortId) {
    let (mut a, pa, _b, _) = two_sleds();
    let mut out = TxBatch::new();
    for sport in 0..n {
        let f = frame(
            &guest(1),
            Some(guest(2).v4),
            None,
            L4::Udp { sport, dport: 53 },
            b"x",
        );
        out.clear();
        a.process_guest(pa, VnetHdr::default(), &f, 1, &Fabric, &mut out);
    }
    assert_eq!(a.stats().ports[0].uft_out.entries, u64::from(n));
    (a, pa)
}

#[test]
fn expiry_takes_bounded_steps() {
    let (mut a, _) = many_flows(3000);
    // A change makes every cached flow stale; the connections stay.
    a.invalidate_next_hops();
    let mut out = TxBatch::new();
    let mut left = Vec::new();
    for t in 2..6 {
        a.tick(t, &mut out);
        left.push(a.stats().ports[0].uft_out.entries);
    }
    // 1024 slots a tick, all of them in the one table that has any.
    assert_eq!(left, [1976, 952, 0, 0]);
    assert_eq!(a.stats().ports[0].uft_out.expired, 3000);
    assert_eq!(a.stats().ports[0].firewall.flows, 3000);
}

#[test]
fn dump_pages_return_every_entry_exactly_once() {
    let (a, _) = many_flows(2500);
    // Pages are capped: 2500 entries fit one.
    let whole = a.dump_uft("ga", 0, usize::MAX).unwrap();
    assert_eq!((whole.outbound.len(), whole.next), (2500, None));
    let mut seen: Vec<FlowKey> = Vec::new();
    let mut cursor = 0;
    let mut pages = 0;
    loop {
        let page = a.dump_uft("ga", cursor, 1000).unwrap();
        assert!(page.inbound.len() + page.outbound.len() <= 1000);
        seen.extend(page.inbound.iter().chain(&page.outbound).map(|d| d.key));
        pages += 1;
        match page.next {
            Some(n) => cursor = n,
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let distinct: HashSet<FlowKey> = seen.iter().copied().collect();
    assert_eq!((seen.len(), distinct.len()), (2500, 2500));
    let e = a.dump_uft("ga", u64::MAX, 10).unwrap_err().to_string();
    assert!(e.contains(&u64::MAX.to_string()), "{e}");
    // A small table is one page, as it always was.
    let (b, _) = many_flows(3);
    let d = b.dump_uft("ga", 0, 1000).unwrap();
    assert_eq!((d.outbound.len(), d.next), (3, None));
}

/// A port's limits shape both ways, with the caller's help: egress, it asks
/// `egress_wait` before taking the guest's next frame; ingress, it asks
/// `ingress_take` before delivering one (holding it meanwhile) and reports a
/// frame it had no room to hold (`ingress_overflow`, counted `rate_limited`).
/// The engine itself drops nothing for a limit; each direction has its own
/// bucket, and lifting the limits lets everything through at once.
#[test]
fn rate_limits_shape_both_ways() {
    let (mut a, pa, mut b, pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let limits = engine::PortLimits {
        egress_mbps: Some(8), // 1 MB/s
        ingress_mbps: Some(8),
        burst_kib: Some(64),
        ..engine::PortLimits::default()
    };
    a.set_port_limits(g1.name, limits).unwrap();
    let payload = [0u8; 1000];
    let udp = |from: &Guest, to: Ipv4Addr, i: u16| {
        frame(
            from,
            Some(to),
            None,
            L4::Udp {
                sport: 4000,
                dport: 53 + i % 2,
            },
            &payload,
        )
    };
    // As a worker does: takes frames while the port may send.
    let send = |a: &mut Engine, now: u64| {
        let mut out = TxBatch::new();
        let mut taken = 0;
        while a.egress_wait(pa, now).is_none() {
            a.process_guest(
                pa,
                VnetHdr::default(),
                &udp(&g1, g2.v4, taken),
                now,
                &Fabric,
                &mut out,
            );
            taken += 1;
        }
        assert_eq!(
            frames_of(&out, &[]).len(),
            taken as usize,
            "every frame taken leaves"
        );
        taken
    };
    // 64 KiB of burst holds 62 frames of 1042 bytes, and the 63rd overdraws it.
    let t0 = NS_PER_S;
    assert_eq!(send(&mut a, t0), 63);
    // It owes 110 bytes (62 frames left 932 of the 65536): 110 us at 1 MB/s
    // before the next frame.
    let wait = a.egress_wait(pa, t0).unwrap();
    assert!((110_000..=110_001).contains(&wait), "{wait}");
    // 10 ms later, 10 KB more: 10 frames (the last one overdrawing again).
    assert_eq!(send(&mut a, t0 + 10_000_000), 10);
    let st = &a.stats().ports[0];
    assert!(st.egress_throttled >= 2, "{}", st.egress_throttled);
    assert_eq!(
        st.drops.get_named("rate_limited"),
        0,
        "egress drops nothing"
    );

    // Ingress: the engine delivers every frame; the caller takes the tokens.
    let mut out = TxBatch::new();
    for i in 0..100u16 {
        b.process_guest(
            pb,
            VnetHdr::default(),
            &udp(&g2, g1.v4, i),
            t0,
            &Fabric,
            &mut out,
        );
    }
    let encapsulated: Vec<Vec<u8>> = frames_of(&out, &[]).into_iter().map(|(_, f)| f).collect();
    let delivered = receive(&mut a, &encapsulated, t0);
    assert_eq!(delivered.len(), 100);
    // 1042-byte frames: 63 taken from the 64 KiB burst (the last overdrawing it),
    // then a wait of 110 us.
    let taken = delivered
        .iter()
        .take_while(|(_, f)| a.ingress_take(pa, f.len(), t0).is_ok())
        .count();
    assert_eq!(taken, 63);
    assert_eq!(a.ingress_take(pa, 1042, t0), Err(110_001));
    a.ingress_overflow(pa);
    assert_eq!(a.stats().ports[0].drops.get_named("rate_limited"), 1);

    // Lifted: everything passes, nothing waits.
    a.set_port_limits(g1.name, engine::PortLimits::default())
        .unwrap();
    assert_eq!(a.egress_wait(pa, t0 + 30_000_000), None);
    assert_eq!(a.ingress_take(pa, 65536, t0 + 30_000_000), Ok(()));
    // A zero rate, which the API refuses, is one byte a second here: once the
    // burst is spent, the next frame waits minutes (110 bytes owed), and the
    // caller is never told to retry at once.
    let zero = engine::PortLimits {
        egress_mbps: Some(0),
        ..limits
    };
    a.set_port_limits(g1.name, zero).unwrap();
    let t1 = t0 + 40_000_000;
    assert_eq!(send(&mut a, t1), 63);
    let wait = a.egress_wait(pa, t1).unwrap();
    assert_eq!(wait, 110 * NS_PER_S + 1);
    let e = a.set_port_limits("nope", zero).unwrap_err();
    assert_eq!(e.code(), "no-such-port");
}
