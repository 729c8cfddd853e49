//! Per-port epochs: a change to one port's configuration recompiles that port's
//! cached flows only; a change to what every port uses (V2P) recompiles them all.
//! Each recompilation of a cached flow counts as `stale` in the port's
//! `uft_in`/`uft_out` statistics.

mod common;

use common::*;
use engine::UftStats;
use engine::{Direction, Engine, FwAction, PortId, Predicate, Rule, TxBatch, TxDest, VnetHdr, Vni};
use std::net::IpAddr;

/// Port `name`'s (outbound, inbound) flow-table statistics.
fn uft(e: &Engine, name: &str) -> (UftStats, UftStats) {
    let s = e.stats();
    let p = s.ports.iter().find(|p| p.name == name).unwrap();
    (p.uft_out, p.uft_in)
}

fn drops(e: &Engine, name: &str, reason: &str) -> u64 {
    let s = e.stats();
    let p = s.ports.iter().find(|p| p.name == name).unwrap();
    p.drops.get_named(reason)
}

/// Guest `from`'s UDP frame to guest `to` (IPv4).
fn udp(from: u8, to: u8, sport: u16) -> Vec<u8> {
    let l4 = L4::Udp { sport, dport: 53 };
    frame(&guest(from), Some(guest(to).v4), None, l4, b"x")
}

/// Sends `f` from port `port`: where its frames went.
fn send(e: &mut Engine, port: PortId, f: &[u8], now: u64) -> Vec<TxDest> {
    let mut out = TxBatch::new();
    e.process_guest(port, VnetHdr::default(), f, now, &Fabric, &mut out);
    frames_of(&out, &[]).into_iter().map(|(d, _)| d).collect()
}

/// Sled A with guest 1 (`ga`) and guest 3 (`gc`), both admitting the VPC inbound,
/// knowing guest 2 on sled B.
fn sled_a_with_two_ports() -> (Engine, PortId, PortId) {
    let (mut a, pa) = sled(SLED_A, 1);
    let g3 = guest(3);
    let pc = a.add_port(port_config(&g3)).unwrap();
    let allow = Rule::new(100, FwAction::Allow)
        .matching(Predicate::SrcIp("172.30.0.0/22".parse().unwrap()))
        .finalize()
        .unwrap();
    a.add_fw_rule("gc", Direction::In, allow).unwrap();
    let g2 = guest(2);
    let vni = Vni::new(VNI).unwrap();
    a.set_v2p(vni, IpAddr::V4(g2.v4), SLED_B.parse().unwrap(), g2.mac)
        .unwrap();
    (a, pa, pc)
}

fn is_underlay(d: &[TxDest]) -> bool {
    matches!(d, [TxDest::Underlay { .. }])
}

#[test]
fn a_port_rule_change_recompiles_only_that_ports_flows() {
    let (mut a, pa, pc) = sled_a_with_two_ports();
    let (fa, fc) = (udp(1, 2, 1000), udp(3, 2, 3000));
    // Compiled, then served from the cache.
    for now in [1, 2] {
        assert!(is_underlay(&send(&mut a, pa, &fa, now)));
        assert!(is_underlay(&send(&mut a, pc, &fc, now)));
    }
    let (a0, c0) = (uft(&a, "ga").0, uft(&a, "gc").0);
    assert_eq!((a0.hits, a0.misses, a0.stale), (1, 1, 0));
    assert_eq!((c0.hits, c0.misses, c0.stale), (1, 1, 0));

    // A rule of port ga (one that changes no outcome): only ga's epoch moves.
    let (engine_epoch, ea, ec) = (
        a.epoch(),
        a.port_epoch("ga").unwrap(),
        a.port_epoch("gc").unwrap(),
    );
    let rule = Rule::new(50, FwAction::Allow)
        .matching(Predicate::Proto(17))
        .finalize()
        .unwrap();
    a.add_fw_rule("ga", Direction::Out, rule).unwrap();
    assert_eq!(a.epoch(), engine_epoch);
    assert_eq!(a.port_epoch("ga").unwrap(), ea + 1);
    assert_eq!(a.port_epoch("gc").unwrap(), ec);
    let s = a.stats();
    assert_eq!((s.ports[0].epoch, s.ports[1].epoch), (ea + 1, ec));
    // dump-uft agrees: ga's flow is stale, gc's is not.
    let (da, dc) = (
        a.dump_uft("ga", 0, 100).unwrap(),
        a.dump_uft("gc", 0, 100).unwrap(),
    );
    assert_eq!((da.epoch, dc.epoch), (ea + 1, ec));
    assert!(da.outbound.len() == 1 && da.outbound[0].stale);
    assert!(dc.outbound.len() == 1 && !dc.outbound[0].stale);

    assert!(is_underlay(&send(&mut a, pa, &fa, 3)));
    assert!(is_underlay(&send(&mut a, pc, &fc, 3)));
    let (a1, c1) = (uft(&a, "ga").0, uft(&a, "gc").0);
    // ga's flow was recompiled; gc's was a hit.
    assert_eq!((a1.hits, a1.misses, a1.stale), (1, 2, 1));
    assert_eq!((c1.hits, c1.misses, c1.stale), (2, 1, 0));
    // Recompiled once: a hit again.
    assert!(is_underlay(&send(&mut a, pa, &fa, 4)));
    assert_eq!(uft(&a, "ga").0.hits, 2);
    assert!(!a.dump_uft("ga", 0, 100).unwrap().outbound[0].stale);

    // A route of port gc: only gc's epoch moves.
    a.add_route(
        "gc",
        "10.9.0.0/16".parse().unwrap(),
        engine::RouteTarget::VpcSubnet,
        None,
    )
    .unwrap();
    assert!(is_underlay(&send(&mut a, pa, &fa, 5)));
    assert!(is_underlay(&send(&mut a, pc, &fc, 5)));
    assert_eq!(uft(&a, "ga").0.stale, 1);
    assert_eq!(uft(&a, "gc").0.stale, 1);

    // A V2P change (even of an address neither flow uses) recompiles both.
    let vni = Vni::new(VNI).unwrap();
    let other: IpAddr = "172.30.0.99".parse().unwrap();
    a.set_v2p(vni, other, SLED_B.parse().unwrap(), guest(2).mac)
        .unwrap();
    assert_eq!(a.epoch(), engine_epoch + 1);
    assert!(is_underlay(&send(&mut a, pa, &fa, 6)));
    assert!(is_underlay(&send(&mut a, pc, &fc, 6)));
    assert_eq!(uft(&a, "ga").0.stale, 2);
    assert_eq!(uft(&a, "gc").0.stale, 2);
    // The connections survived every recompilation.
    assert_eq!(a.dump_tcp_flows("ga").unwrap().len(), 1);
    assert_eq!(a.dump_tcp_flows("gc").unwrap().len(), 1);
}

#[test]
fn a_local_flow_meets_the_receivers_changes() {
    let (mut a, pa, pc) = sled_a_with_two_ports();
    let local = |d: &[TxDest]| matches!(d, [TxDest::Port { port, .. }] if *port == pc);
    let f = udp(1, 3, 1000);
    for now in [1, 2] {
        assert!(local(&send(&mut a, pa, &f, now)));
    }
    let (out_a, in_c) = (uft(&a, "ga").0, uft(&a, "gc").1);
    assert_eq!((out_a.hits, out_a.stale), (1, 0));
    assert_eq!((in_c.hits, in_c.stale), (1, 0));

    // gc's inbound rules change: ga's cached decision holds (a hit), gc's inbound
    // flow is decided again, against gc's epoch.
    a.set_fw_rules("gc", vec![]).unwrap();
    assert!(local(&send(&mut a, pa, &f, 3)), "the connection admits it");
    let (out_a, in_c) = (uft(&a, "ga").0, uft(&a, "gc").1);
    assert_eq!((out_a.hits, out_a.stale), (2, 0));
    assert_eq!((in_c.hits, in_c.stale), (1, 1));
    // A new flow meets gc's new rules (none: inbound denied).
    assert!(send(&mut a, pa, &udp(1, 3, 1001), 3).is_empty());
    assert_eq!(drops(&a, "gc", "fw_deny_in"), 1);

    // gc's MTU bounds ga's flows to it: an MTU change recompiles the flows of
    // every port of the VPC.
    a.set_port_mtu("gc", 1500).unwrap();
    assert!(local(&send(&mut a, pa, &f, 4)));
    assert_eq!(uft(&a, "ga").0.stale, 1);
    let d = a.dump_uft("ga", 0, 100).unwrap();
    assert!(d
        .outbound
        .iter()
        .any(|e| e.key.src_port == 1000 && e.path_mtu == 1500));
}

#[test]
fn each_change_moves_the_epochs_it_should() {
    let (mut a, _, _) = sled_a_with_two_ports();
    // (engine, ga, gc) epochs.
    let epochs = |a: &Engine| {
        (
            a.epoch(),
            a.port_epoch("ga").unwrap(),
            a.port_epoch("gc").unwrap(),
        )
    };
    let mut last = epochs(&a);
    let mut moved = |a: &Engine, want: (u64, u64, u64), what: &str| {
        let now = epochs(a);
        let d = (now.0 - last.0, now.1 - last.1, now.2 - last.2);
        assert_eq!(d, want, "{what}");
        last = now;
    };
    let allow = || {
        Rule::new(50, FwAction::Allow)
            .matching(Predicate::Proto(17))
            .finalize()
            .unwrap()
    };
    // The port's own changes.
    let id = a.add_fw_rule("gc", Direction::In, allow()).unwrap();
    moved(&a, (0, 0, 1), "add_fw_rule");
    a.rm_fw_rule("gc", Direction::In, id).unwrap();
    moved(&a, (0, 0, 1), "rm_fw_rule");
    a.set_fw_rules("ga", vec![(Direction::Out, allow())])
        .unwrap();
    moved(&a, (0, 1, 0), "set_fw_rules");
    let net = "10.9.0.0/16".parse().unwrap();
    a.add_route("ga", net, engine::RouteTarget::VpcSubnet, None)
        .unwrap();
    moved(&a, (0, 1, 0), "add_route");
    a.del_route("ga", net).unwrap();
    moved(&a, (0, 1, 0), "del_route");
    a.set_external_ips("gc", Default::default()).unwrap();
    moved(&a, (0, 0, 1), "set_external_ips");
    // Refused changes move nothing; nor do limits and pauses.
    assert!(a.del_route("ga", net).is_err());
    assert!(a.rm_fw_rule("gc", Direction::In, id).is_err());
    a.set_port_limits("ga", Default::default()).unwrap();
    a.set_port_paused("ga", true).unwrap();
    moved(&a, (0, 0, 0), "refused, limits, pause");
    // The VPC's: a port MTU.
    a.set_port_mtu("gc", 1500).unwrap();
    moved(&a, (0, 1, 1), "set_port_mtu");
    // Everyone's.
    let vni = Vni::new(VNI).unwrap();
    let ip: IpAddr = "172.30.0.99".parse().unwrap();
    a.set_v2p(vni, ip, SLED_B.parse().unwrap(), guest(2).mac)
        .unwrap();
    moved(&a, (1, 1, 1), "set_v2p");
    a.clear_v2p(vni, ip).unwrap();
    moved(&a, (1, 1, 1), "clear_v2p");
    a.set_v2b(&Default::default()).unwrap();
    moved(&a, (1, 1, 1), "set_v2b");
    a.invalidate_next_hops();
    moved(&a, (1, 1, 1), "invalidate_next_hops");
    a.set_underlay_mtu(9000).unwrap();
    moved(&a, (1, 1, 1), "set_underlay_mtu");
    let mac = "a8:40:25:ff:00:09".parse().unwrap();
    a.set_sibling_port(vni, mac, &[ip], 1500, 1).unwrap();
    moved(&a, (1, 1, 1), "set_sibling_port");
    a.clear_sibling_port(vni, mac, &[ip]);
    moved(&a, (1, 1, 1), "clear_sibling_port");
    a.add_port(port_config(&guest(2))).unwrap();
    moved(&a, (1, 1, 1), "add_port");
    a.remove_port("gb").unwrap();
    moved(&a, (1, 1, 1), "remove_port");
}
